//! Session state: JSON values under scoped keys, shared by every step of an invocation.
//!
//! A key's prefix is its [`Scope`]: `temp:` keys live for one invocation, unprefixed keys for
//! the session, `user:` and `app:` keys outlive the session (a session store persists them).
//! [`SharedState`] is the one copy an invocation works on; a step's writes go straight into
//! it (so the next tool, callback, sibling, branch or loop iteration sees them) and are also
//! collected as the step's [`StateDelta`], which events and checkpoints carry.

use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// How long a state key lives, from its prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// `temp:` — one invocation; never persisted.
    Temp,
    /// No prefix — the session.
    Session,
    /// `user:` — every session of the same user.
    User,
    /// `app:` — every session of the application.
    App,
}

impl Scope {
    /// The scope of `key`.
    pub fn of(key: &str) -> Self {
        if key.starts_with("temp:") {
            Self::Temp
        } else if key.starts_with("user:") {
            Self::User
        } else if key.starts_with("app:") {
            Self::App
        } else {
            Self::Session
        }
    }
}

/// State values by key.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct State {
    values: Map<String, Value>,
}

impl State {
    /// A state holding `values`.
    pub fn from_map(values: Map<String, Value>) -> Self {
        Self { values }
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.values.get(key)
    }

    /// Sets `key` to `value`.
    pub fn set(&mut self, key: impl Into<String>, value: Value) {
        self.values.insert(key.into(), value);
    }

    /// Removes `key`, returning its value.
    pub fn remove(&mut self, key: &str) -> Option<Value> {
        self.values.remove(key)
    }

    /// Applies every write of `delta`, in order.
    pub fn apply(&mut self, delta: &StateDelta) {
        for (key, value) in &delta.values {
            self.values.insert(key.clone(), value.clone());
        }
    }

    /// Drops every `temp:` key (the end of an invocation).
    pub fn clear_temp(&mut self) {
        self.values.retain(|key, _| Scope::of(key) != Scope::Temp);
    }

    /// All values, in key order.
    pub fn values(&self) -> &Map<String, Value> {
        &self.values
    }
}

/// The writes of one step, in the order they were made (a later write of a key wins).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct StateDelta {
    values: Map<String, Value>,
}

impl StateDelta {
    /// Records a write of `key`.
    pub fn set(&mut self, key: impl Into<String>, value: Value) {
        self.values.insert(key.into(), value);
    }

    /// Adds the writes of `later` after these.
    pub fn merge(&mut self, later: StateDelta) {
        self.values.extend(later.values);
    }

    /// Whether nothing was written.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// The writes by key.
    pub fn values(&self) -> &Map<String, Value> {
        &self.values
    }
}

/// The state of one invocation, shared by all its steps (cheap to clone).
///
/// The lock is never held across an `.await`; every method takes it for one read or write.
#[derive(Debug, Clone, Default)]
pub struct SharedState {
    inner: Arc<Mutex<State>>,
}

impl SharedState {
    /// Shares `state`.
    pub fn new(state: State) -> Self {
        Self {
            inner: Arc::new(Mutex::new(state)),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave a half-written map (every write is one
        // insert), so a poisoned lock is still consistent.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A copy of the value of `key`.
    pub fn get(&self, key: &str) -> Option<Value> {
        self.lock().get(key).cloned()
    }

    /// Sets `key` to `value`.
    pub fn set(&self, key: impl Into<String>, value: Value) {
        self.lock().set(key, value);
    }

    /// Applies `delta`.
    pub fn apply(&self, delta: &StateDelta) {
        self.lock().apply(delta);
    }

    /// A copy of the whole state.
    pub fn snapshot(&self) -> State {
        self.lock().clone()
    }

    /// Runs `f` on the state under one lock (for reads that must see one moment).
    pub fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        f(&mut self.lock())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn scopes_follow_prefixes() {
        assert_eq!(Scope::of("temp:query"), Scope::Temp);
        assert_eq!(Scope::of("user:name"), Scope::User);
        assert_eq!(Scope::of("app:version"), Scope::App);
        assert_eq!(Scope::of("plan"), Scope::Session);
        assert_eq!(Scope::of("tempo"), Scope::Session);
    }

    #[test]
    fn deltas_apply_in_order_and_temp_keys_clear() {
        let mut state = State::default();
        let mut delta = StateDelta::default();
        delta.set("temp:x", json!(1));
        delta.set("plan", json!("a"));
        delta.set("temp:x", json!(2));
        state.apply(&delta);
        assert_eq!(state.get("temp:x"), Some(&json!(2)));
        state.clear_temp();
        assert_eq!(state.get("temp:x"), None);
        assert_eq!(state.get("plan"), Some(&json!("a")));
    }
}
