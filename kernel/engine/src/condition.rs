//! Conditions: the one test language of graph edges, router successors and quality gates.
//!
//! A [`Condition`] names a state key and the tests its value must pass, or combines other
//! conditions, or names a Python function; every test given must hold. In a workflow file:
//!
//! ```yaml
//! when: {key: review.verdict, equals: approved}
//! when: {all: [{key: tests_failed, equals: 0}, {not: {key: blocked, truthy: true}}]}
//! when: {python: checks.py:ready}
//! ```
//!
//! A key is looked up as written first, then as a dotted path into objects
//! (`review.verdict` is `state["review"]["verdict"]`), so scoped keys like `temp:x` work too.
//!
//! A `python` test names a function `(state) -> bool` (`module.function` or
//! `file.py:function`). The engine has no Python: the registry that builds a workflow binds
//! each such name to a [`StateFunction`] the kernel provides (`Condition::bind`), and the
//! test holds when the function returns a truthy value. An unbound function, or one that
//! fails, does not hold (and is logged): a routing test never crashes a run.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::state::State;

/// A test of the state; see the module docs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Condition {
    /// The state key (or dotted path) the value tests apply to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) key: Option<String>,
    /// The value equals this.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) equals: Option<Value>,
    /// The value differs from this (a missing key differs from everything).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) not_equals: Option<Value>,
    /// The key is present (`true`) or absent (`false`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) exists: Option<bool>,
    /// The value is truthy (not null, false, 0, "", [] or {}) or, with `false`, falsy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) truthy: Option<bool>,
    /// The value is one of these.
    #[serde(rename = "in", skip_serializing_if = "Option::is_none")]
    pub(crate) one_of: Option<Vec<Value>>,
    /// The value is a list holding this item, or a string holding this text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) contains: Option<Value>,
    /// The value is a number greater than this.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) gt: Option<f64>,
    /// The value is a number at least this.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) gte: Option<f64>,
    /// The value is a number less than this.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) lt: Option<f64>,
    /// The value is a number at most this.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) lte: Option<f64>,
    /// Every one of these holds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) all: Option<Vec<Condition>>,
    /// At least one of these holds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) any: Option<Vec<Condition>>,
    /// This does not hold.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) not: Option<Box<Condition>>,
    /// A Python function `(state) -> bool` returns a truthy value.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) python: Option<String>,
    /// The function `python` names, once bound.
    #[serde(skip)]
    pub(crate) bound: Option<BoundFunction>,
}

/// A function of the state written outside the engine (a Python function in the kernel).
pub trait StateFunction: Send + Sync + std::fmt::Debug {
    /// Calls it with `state`; `Err` says why it failed.
    fn call(&self, state: &State) -> Result<Value, String>;
}

/// A [`StateFunction`] bound to a condition (equal only to itself).
#[derive(Debug, Clone)]
pub(crate) struct BoundFunction(pub Arc<dyn StateFunction>);

impl PartialEq for BoundFunction {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// Why a condition cannot be evaluated as written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ConditionError {
    /// A value test without a `key`.
    #[error("The condition tests a value (`{test}`) but names no `key`; add `key: NAME`")]
    MissingKey {
        /// The first value test found.
        test: &'static str,
    },
    /// A `key` without a test, or nothing at all.
    #[error(
        "The condition tests nothing; give a `key` with a test (`equals`, `exists`, `truthy`, \
         `in`, `contains`, `gt`, `gte`, `lt`, `lte`, `not_equals`), `all` / `any` / `not`, or \
         `python`"
    )]
    Empty,
}

impl Condition {
    /// The key `key` equals `value`.
    pub fn equals(key: impl Into<String>, value: Value) -> Self {
        Self {
            key: Some(key.into()),
            equals: Some(value),
            ..Self::default()
        }
    }

    /// The key `key` is truthy.
    pub fn truthy(key: impl Into<String>) -> Self {
        Self {
            key: Some(key.into()),
            truthy: Some(true),
            ..Self::default()
        }
    }

    fn value_tests(&self) -> impl Iterator<Item = &'static str> + '_ {
        [
            ("equals", self.equals.is_some()),
            ("not_equals", self.not_equals.is_some()),
            ("exists", self.exists.is_some()),
            ("truthy", self.truthy.is_some()),
            ("in", self.one_of.is_some()),
            ("contains", self.contains.is_some()),
            ("gt", self.gt.is_some()),
            ("gte", self.gte.is_some()),
            ("lt", self.lt.is_some()),
            ("lte", self.lte.is_some()),
        ]
        .into_iter()
        .filter_map(|(name, given)| given.then_some(name))
    }

    /// Checks that every part tests something (run once, when a workflow is loaded).
    pub(crate) fn validate(&self) -> Result<(), ConditionError> {
        let value_test = self.value_tests().next();
        if let (Some(test), None) = (value_test, &self.key) {
            return Err(ConditionError::MissingKey { test });
        }
        let combined =
            self.all.is_some() || self.any.is_some() || self.not.is_some() || self.python.is_some();
        if value_test.is_none() && !combined {
            return Err(ConditionError::Empty);
        }
        let nested = self.all.iter().chain(&self.any).flatten();
        nested
            .chain(self.not.as_deref())
            .try_for_each(Condition::validate)
    }

    /// Binds every `python` function (nested ones too) with `resolve`; stops at its first
    /// error.
    pub(crate) fn bind<E>(
        &mut self,
        resolve: &mut impl FnMut(&str) -> Result<Arc<dyn StateFunction>, E>,
    ) -> Result<(), E> {
        if let Some(name) = &self.python {
            self.bound = Some(BoundFunction(resolve(name)?));
        }
        let nested = self.all.iter_mut().chain(&mut self.any).flatten();
        for condition in nested.chain(self.not.as_deref_mut()) {
            condition.bind(resolve)?;
        }
        Ok(())
    }

    /// Whether `state` passes every test.
    pub(crate) fn holds(&self, state: &State) -> bool {
        let value = self.key.as_deref().and_then(|key| lookup(state, key));
        let number = value.and_then(Value::as_f64);
        let compare = |bound: Option<f64>, ok: fn(f64, f64) -> bool| {
            bound.is_none_or(|b| number.is_some_and(|n| ok(n, b)))
        };
        self.equals.as_ref().is_none_or(|v| value == Some(v))
            && self.not_equals.as_ref().is_none_or(|v| value != Some(v))
            && self.exists.is_none_or(|e| value.is_some() == e)
            && self
                .truthy
                .is_none_or(|t| value.is_some_and(is_truthy) == t)
            && self
                .one_of
                .as_ref()
                .is_none_or(|options| value.is_some_and(|v| options.contains(v)))
            && self
                .contains
                .as_ref()
                .is_none_or(|item| value.is_some_and(|v| contains(v, item)))
            && compare(self.gt, |n, b| n > b)
            && compare(self.gte, |n, b| n >= b)
            && compare(self.lt, |n, b| n < b)
            && compare(self.lte, |n, b| n <= b)
            && self
                .all
                .as_ref()
                .is_none_or(|all| all.iter().all(|c| c.holds(state)))
            && self
                .any
                .as_ref()
                .is_none_or(|any| any.iter().any(|c| c.holds(state)))
            && self.not.as_ref().is_none_or(|c| !c.holds(state))
            && self
                .python
                .as_ref()
                .is_none_or(|name| self.python_holds(name, state))
    }

    fn python_holds(&self, name: &str, state: &State) -> bool {
        let Some(BoundFunction(function)) = &self.bound else {
            tracing::warn!(function = %name, "a Python condition was never bound; it does not hold");
            return false;
        };
        match function.call(state) {
            Ok(value) => is_truthy(&value),
            Err(error) => {
                tracing::warn!(function = %name, %error, "a Python condition failed; it does not hold");
                false
            }
        }
    }
}

/// The value at `key`: the key as written, else a dotted path into objects.
pub fn lookup<'s>(state: &'s State, key: &str) -> Option<&'s Value> {
    if let Some(value) = state.get(key) {
        return Some(value);
    }
    let mut parts = key.split('.');
    let mut value = state.get(parts.next()?)?;
    for part in parts {
        value = match value {
            Value::Object(map) => map.get(part)?,
            Value::Array(items) => items.get(part.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(value)
}

/// JSON truthiness: everything but null, false, 0, "", [] and {}.
pub fn is_truthy(value: &Value) -> bool {
    match value {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|n| n != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

fn contains(value: &Value, item: &Value) -> bool {
    match (value, item) {
        (Value::Array(items), item) => items.contains(item),
        (Value::String(text), Value::String(part)) => text.contains(part.as_str()),
        _ => false,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // In tests an unwrap is an assertion.
mod tests {
    use super::*;
    use serde_json::json;

    fn state(value: Value) -> State {
        match value {
            Value::Object(map) => State::from_map(map),
            _ => State::default(),
        }
    }

    fn parse(value: Value) -> Condition {
        let condition: Condition = serde_json::from_value(value).unwrap();
        condition.validate().unwrap();
        condition
    }

    #[test]
    fn value_tests_hold_together() {
        let s = state(json!({
            "review": {"verdict": "approved", "score": 7},
            "temp:tags": ["a", "b"],
            "note": "all green",
            "zero": 0,
        }));
        let holds = |c: Value| parse(c).holds(&s);
        assert!(holds(
            json!({"key": "review.verdict", "equals": "approved"})
        ));
        assert!(holds(json!({"key": "review.score", "gte": 7, "lt": 8})));
        assert!(!holds(json!({"key": "review.score", "gt": 7})));
        assert!(holds(json!({"key": "temp:tags", "contains": "b"})));
        assert!(holds(
            json!({"key": "note", "contains": "green", "truthy": true})
        ));
        assert!(holds(
            json!({"key": "zero", "truthy": false, "exists": true})
        ));
        assert!(holds(
            json!({"key": "missing", "exists": false, "not_equals": 1})
        ));
        assert!(!holds(json!({"key": "missing", "truthy": true})));
        assert!(holds(
            json!({"key": "review.verdict", "in": ["approved", "waived"]})
        ));
        assert!(holds(json!({"all": [
            {"key": "zero", "equals": 0},
            {"any": [{"key": "x", "exists": true}, {"not": {"key": "note", "equals": "red"}}]}
        ]})));
    }

    /// Holds when `ready` is set; fails when `broken` is.
    #[derive(Debug)]
    struct Ready;

    impl StateFunction for Ready {
        fn call(&self, state: &State) -> Result<Value, String> {
            if state.get("broken").is_some() {
                return Err("RuntimeError: boom".into());
            }
            Ok(json!(state.get("ready").is_some()))
        }
    }

    #[test]
    fn python_tests_hold_through_their_bound_function_and_fail_closed() {
        let mut c = parse(
            json!({"all": [{"key": "n", "gt": 1}, {"not": {"python": "m.blocked"}}],
                                 "python": "m.ready"}),
        );
        let s = state(json!({"n": 2, "ready": true}));
        assert!(!c.holds(&s), "unbound: does not hold");
        let mut names = Vec::new();
        c.bind(&mut |name: &str| {
            names.push(name.to_owned());
            Ok::<_, String>(Arc::new(Ready) as Arc<dyn StateFunction>)
        })
        .unwrap();
        assert_eq!(names, ["m.ready", "m.blocked"]);
        // `m.blocked` is bound to the same function: `ready` makes it hold, so `not` fails.
        assert!(!c.holds(&s));
        let only = {
            let mut c = parse(json!({"python": "m.ready"}));
            c.bind(&mut |_: &str| Ok::<_, String>(Arc::new(Ready) as Arc<dyn StateFunction>))
                .unwrap();
            c
        };
        assert!(only.holds(&s));
        assert!(!only.holds(&state(json!({"n": 2}))));
        assert!(
            !only.holds(&state(json!({"ready": 1, "broken": 1}))),
            "an error does not hold"
        );
        let refused = c.bind(&mut |name: &str| Err::<Arc<dyn StateFunction>, _>(name.to_owned()));
        assert_eq!(refused, Err("m.ready".to_owned()));
    }

    #[test]
    fn malformed_conditions_are_refused() {
        let missing: Condition = serde_json::from_value(json!({"equals": 1})).unwrap();
        assert_eq!(
            missing.validate(),
            Err(ConditionError::MissingKey { test: "equals" })
        );
        let empty: Condition = serde_json::from_value(json!({"key": "x"})).unwrap();
        assert_eq!(empty.validate(), Err(ConditionError::Empty));
        let nested: Condition =
            serde_json::from_value(json!({"not": {"all": [{"gt": 1}]}})).unwrap();
        assert!(nested.validate().is_err());
        assert!(serde_json::from_value::<Condition>(json!({"key": "x", "equal": 1})).is_err());
    }
}
