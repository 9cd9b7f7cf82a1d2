//! Session state: JSON values under scoped keys, shared by every step of an invocation.
//!
//! A key's prefix is its [`Scope`]: `temp:` keys live for one invocation and are dropped at
//! its end; every other key is the run's state, kept by its checkpoints (`user:` and `app:`,
//! ADK's prefixes for state shared across sessions, are kept like the others: a front end
//! carries state from one run to the next, as `rlm flow run --state FILE` does).
//! [`SharedState`] is the one copy an invocation works on.
//!
//! Every change is a [`StateWrite`] — replace a key's value, append items to the list under
//! a key, delete a key — and one form carries it from where it is made to where it is
//! stored: a tool, callback or agent applies its writes to the shared state at once (so the
//! next tool, callback, sibling, branch or loop iteration sees them) and collects them as
//! its [`StateDelta`]; the event that reports the step carries those writes; a parallel join
//! settles conflicting branch writes with writes of its own; the checkpoint of a step stores
//! the writes applied since the last one. Appending a message to a long `messages` list is
//! an append of that message everywhere, never a copy of the list, and a deleted key is a
//! delete, never a `null`.

use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// How long a state key lives, from its prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// `temp:` — one invocation; dropped at its end.
    Temp,
    /// No prefix — the run.
    Session,
    /// `user:` — ADK's prefix for a user's state (kept like the run's).
    User,
    /// `app:` — ADK's prefix for the application's state (kept like the run's).
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

/// One change of one state key: what a step writes, an event carries, a parallel join
/// settles and a checkpoint stores.
///
/// As JSON (events, checkpoints, Python steps): `{"op": "replace", "key": ..., "value": ...}`,
/// `{"op": "append", "key": ..., "items": [...]}`, `{"op": "delete", "key": ...}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum StateWrite {
    /// `key` now holds `value` (`null` included: a key set to `null` still exists).
    Replace {
        /// The key.
        key: String,
        /// Its new value.
        value: Value,
    },
    /// `items` go on the end of the list under `key` (a key that holds no list starts one).
    Append {
        /// The key.
        key: String,
        /// The new items.
        items: Vec<Value>,
    },
    /// `key` is removed.
    Delete {
        /// The key.
        key: String,
    },
}

impl StateWrite {
    /// The key written.
    pub fn key(&self) -> &str {
        match self {
            Self::Replace { key, .. } | Self::Append { key, .. } | Self::Delete { key } => key,
        }
    }

    /// The value this write leaves under its key when the key held `old`.
    fn after(&self, old: Option<Value>) -> Option<Value> {
        match self {
            Self::Replace { value, .. } => Some(value.clone()),
            Self::Append { items, .. } => {
                let mut list = match old {
                    Some(Value::Array(list)) => list,
                    _ => Vec::with_capacity(items.len()),
                };
                list.extend(items.iter().cloned());
                Some(Value::Array(list))
            }
            Self::Delete { .. } => None,
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

    /// Applies `write`.
    pub fn write(&mut self, write: &StateWrite) {
        let key = write.key();
        let old = match write {
            // Only an append builds on the old value; the others never clone it.
            StateWrite::Append { .. } => self.values.remove(key),
            _ => None,
        };
        match write.after(old) {
            Some(value) => self.values.insert(key.to_owned(), value),
            None => self.values.remove(key),
        };
    }

    /// Applies every write of `delta`, in order.
    pub fn apply(&mut self, delta: &StateDelta) {
        for write in delta.iter() {
            self.write(write);
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

    /// Replace writes that build this state from nothing, in key order.
    pub fn to_writes(&self) -> StateDelta {
        self.values
            .iter()
            .map(|(key, value)| StateWrite::Replace {
                key: key.clone(),
                value: value.clone(),
            })
            .collect()
    }
}

/// The writes of a step, in the order they were made; cheap to clone and to join.
///
/// A delta is a list of shared runs of writes: cloning one, or adding one to the end of
/// another ([`extend`](Self::extend)), copies pointers, never the values written, so an
/// event's writes are shared by its enclosing frames, a parallel join and the checkpoint
/// journal instead of being copied into each.
#[derive(Clone, Default)]
pub struct StateDelta {
    /// Never holds an empty run.
    runs: Vec<Arc<Vec<StateWrite>>>,
}

impl StateDelta {
    /// No writes.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `write` at the end.
    pub fn push(&mut self, write: StateWrite) {
        if let Some(last) = self.runs.last_mut().and_then(Arc::get_mut) {
            last.push(write);
        } else {
            self.runs.push(Arc::new(vec![write]));
        }
    }

    /// Records that `key` now holds `value`.
    pub fn set(&mut self, key: impl Into<String>, value: Value) {
        self.push(StateWrite::Replace {
            key: key.into(),
            value,
        });
    }

    /// Records that `items` go on the end of the list under `key`.
    pub fn append(&mut self, key: impl Into<String>, items: Vec<Value>) {
        self.push(StateWrite::Append {
            key: key.into(),
            items,
        });
    }

    /// Records that `key` is removed.
    pub fn delete(&mut self, key: impl Into<String>) {
        self.push(StateWrite::Delete { key: key.into() });
    }

    /// Adds the writes of `later` after these (sharing them).
    pub fn extend(&mut self, later: StateDelta) {
        self.runs.extend(later.runs);
    }

    /// Whether nothing was written.
    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// How many writes there are.
    pub fn len(&self) -> usize {
        self.runs.iter().map(|run| run.len()).sum()
    }

    /// The writes, in order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &StateWrite> {
        self.runs.iter().flat_map(|run| run.iter())
    }

    /// The keys written, each once, in the order they were first written.
    pub fn keys(&self) -> Vec<&str> {
        let mut keys: Vec<&str> = Vec::new();
        for write in self.iter() {
            if !keys.contains(&write.key()) {
                keys.push(write.key());
            }
        }
        keys
    }

    /// The last write of `key`, if any.
    pub fn last(&self, key: &str) -> Option<&StateWrite> {
        self.iter().rev().find(|w| w.key() == key)
    }
}

impl std::fmt::Debug for StateDelta {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl PartialEq for StateDelta {
    fn eq(&self, other: &Self) -> bool {
        self.iter().eq(other.iter())
    }
}

impl FromIterator<StateWrite> for StateDelta {
    fn from_iter<I: IntoIterator<Item = StateWrite>>(iter: I) -> Self {
        let writes: Vec<StateWrite> = iter.into_iter().collect();
        Self {
            runs: if writes.is_empty() {
                Vec::new()
            } else {
                vec![Arc::new(writes)]
            },
        }
    }
}

impl Serialize for StateDelta {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.iter())
    }
}

impl<'de> Deserialize<'de> for StateDelta {
    /// A list of writes; an object of values (the form of event logs written before writes
    /// had their own form) reads as one replace per key.
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Form {
            Writes(Vec<StateWrite>),
            Values(Map<String, Value>),
        }
        Ok(match Form::deserialize(deserializer)? {
            Form::Writes(writes) => writes.into_iter().collect(),
            Form::Values(values) => State::from_map(values).to_writes(),
        })
    }
}

/// The state of one invocation, shared by all its steps (cheap to clone).
///
/// Every change goes through [`apply`](Self::apply) as writes. While a journal is kept
/// ([`start_journal`](Self::start_journal)), the writes are also recorded in the order they
/// were applied, whoever made them, for [`take_journal`](Self::take_journal): that is how the
/// executor hands each checkpoint exactly the writes since the last one, with no copy of the
/// state to compare against. The lock is never held across an `.await`; every method takes
/// it for one read or one batch of writes.
#[derive(Debug, Clone, Default)]
pub struct SharedState {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Debug, Default)]
struct Inner {
    state: State,
    journal: Option<StateDelta>,
}

impl SharedState {
    /// Shares `state`.
    pub fn new(state: State) -> Self {
        Self {
            inner: Arc::new(Mutex::new(Inner {
                state,
                journal: None,
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves whole writes applied (each is one insert or
        // removal), so a poisoned lock is still consistent.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A copy of the value of `key`.
    pub fn get(&self, key: &str) -> Option<Value> {
        self.lock().state.get(key).cloned()
    }

    /// Sets `key` to `value`; returns the write.
    pub fn set(&self, key: impl Into<String>, value: Value) -> StateDelta {
        let mut delta = StateDelta::new();
        delta.set(key, value);
        self.apply(&delta);
        delta
    }

    /// Applies `delta` (and journals it, while a journal is kept).
    pub fn apply(&self, delta: &StateDelta) {
        if delta.is_empty() {
            return;
        }
        let mut inner = self.lock();
        inner.state.apply(delta);
        if let Some(journal) = &mut inner.journal {
            journal.extend(delta.clone());
        }
    }

    /// A copy of the whole state.
    pub fn snapshot(&self) -> State {
        self.lock().state.clone()
    }

    /// Runs `f` on the state under one lock (for reads that must see one moment).
    pub fn with<R>(&self, f: impl FnOnce(&State) -> R) -> R {
        f(&self.lock().state)
    }

    /// Replaces the whole state with `state` (a resumed run's checkpoint), outside the
    /// journal, which starts again empty if one is kept.
    pub fn reset(&self, state: State) {
        let mut inner = self.lock();
        inner.state = state;
        if let Some(journal) = &mut inner.journal {
            *journal = StateDelta::new();
        }
    }

    /// Drops every `temp:` key (the end of an invocation; not journaled).
    pub fn clear_temp(&self) {
        self.lock().state.clear_temp();
    }

    /// Starts (or restarts, empty) the journal of writes.
    pub fn start_journal(&self) {
        self.lock().journal = Some(StateDelta::new());
    }

    /// The writes applied since the journal started or was last taken, in order (none when
    /// no journal is kept).
    pub fn take_journal(&self) -> StateDelta {
        self.lock()
            .journal
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
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

    #[test]
    fn appends_extend_a_list_and_a_delete_is_not_a_null() {
        let mut state = State::default();
        state.set("log", json!([1]));
        state.set("flag", json!(true));
        let mut delta = StateDelta::new();
        delta.append("log", vec![json!(2), json!(3)]);
        delta.append("fresh", vec![json!("a")]);
        delta.delete("flag");
        delta.set("empty", Value::Null);
        state.apply(&delta);
        assert_eq!(state.get("log"), Some(&json!([1, 2, 3])));
        assert_eq!(state.get("fresh"), Some(&json!(["a"])));
        assert_eq!(state.get("flag"), None);
        assert_eq!(state.get("empty"), Some(&Value::Null));
        let text = serde_json::to_string(&delta).expect("serialises");
        assert!(text.contains(r#"{"op":"delete","key":"flag"}"#), "{text}");
        let back: StateDelta = serde_json::from_str(&text).expect("parses");
        assert_eq!(back, delta);
    }

    #[test]
    fn a_delta_shares_its_writes_and_stays_in_order() {
        let mut first = StateDelta::new();
        first.set("a", json!(1));
        let shared = first.clone();
        first.set("b", json!(2));
        // The clone was taken before `b`: copy-on-write kept it as it was.
        assert_eq!(shared.len(), 1);
        let mut all = StateDelta::new();
        all.extend(shared);
        all.extend(first);
        let keys: Vec<&str> = all.iter().map(StateWrite::key).collect();
        assert_eq!(keys, ["a", "a", "b"]);
        assert_eq!(all.keys(), ["a", "b"]);
    }

    #[test]
    fn an_old_event_logs_object_of_values_reads_as_replaces() {
        let delta: StateDelta =
            serde_json::from_str(r#"{"plan": "a", "gone": null}"#).expect("the old form parses");
        assert_eq!(
            delta.last("gone"),
            Some(&StateWrite::Replace {
                key: "gone".into(),
                value: Value::Null
            })
        );
    }

    #[test]
    fn the_journal_keeps_every_write_in_order_until_taken() {
        let state = SharedState::new(State::default());
        state.set("before", json!(0));
        state.start_journal();
        state.set("a", json!(1));
        let mut delta = StateDelta::new();
        delta.append("log", vec![json!("x")]);
        delta.delete("a");
        state.apply(&delta);
        let journal = state.take_journal();
        let keys: Vec<&str> = journal.iter().map(StateWrite::key).collect();
        assert_eq!(keys, ["a", "log", "a"]);
        assert!(state.take_journal().is_empty());
        assert_eq!(state.get("a"), None);
    }
}
