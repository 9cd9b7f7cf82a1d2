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

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::decisions::{DECISIONS, Records};

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
    pub(crate) fn of(key: &str) -> Self {
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

/// The key a [`StateWrite`] writes: a text of its own, or one fixed in the program (the
/// router's output keys), which its writes share instead of each carrying a copy.
pub type Key = Cow<'static, str>;

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
        key: Key,
        /// Its new value.
        value: Value,
    },
    /// `items` go on the end of the list under `key` (a key that holds no list starts one).
    Append {
        /// The key.
        key: Key,
        /// The new items.
        items: Vec<Value>,
    },
    /// `key` is removed.
    Delete {
        /// The key.
        key: Key,
    },
}

impl StateWrite {
    /// The key written.
    pub(crate) fn key(&self) -> &str {
        match self {
            Self::Replace { key, .. } | Self::Append { key, .. } | Self::Delete { key } => key,
        }
    }
}

/// State values by key.
///
/// Each key's value is JSON, but for the `decisions` channel while every item of it is a
/// decision record: that list is kept as typed records, which take a quarter of their JSON
/// objects' heap. Nothing outside can tell: [`get`](Self::get) hands out the list as JSON
/// (made at its first read, then kept in step), and the state writes, copies and compares as
/// the JSON it stands for.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct State {
    slots: BTreeMap<String, Slot>,
}

/// How the state keeps one key's value.
#[derive(Debug, Clone, PartialEq)]
enum Slot {
    /// As JSON.
    Json(Value),
    /// The `decisions` list, every item a decision record.
    Records(Box<Records>),
}

impl Slot {
    /// The slot for `value` under `key`: the `decisions` list as records when every item is
    /// one, anything else as JSON.
    fn new(key: &str, value: Value) -> Self {
        match value {
            Value::Array(items) if key == DECISIONS => match Records::from_items(items) {
                Ok(records) => Self::Records(Box::new(records)),
                Err(items) => Self::Json(Value::Array(items)),
            },
            value => Self::Json(value),
        }
    }

    /// The value as JSON (the records' is made at the first read, then kept).
    fn json(&self) -> &Value {
        match self {
            Self::Json(value) => value,
            Self::Records(records) => records.json(),
        }
    }

    /// A JSON copy of the value.
    fn to_json(&self) -> Value {
        match self {
            Self::Json(value) => value.clone(),
            Self::Records(records) => records.to_json(),
        }
    }

    /// The value as JSON, taking it.
    fn into_json(self) -> Value {
        match self {
            Self::Json(value) => value,
            Self::Records(records) => records.into_json(),
        }
    }

    /// Appends `items` (a slot that holds no list becomes a list of them).
    fn append(&mut self, key: &str, items: Cow<'_, [Value]>) {
        match self {
            Self::Json(Value::Array(list)) => match items {
                Cow::Borrowed(items) => list.extend_from_slice(items),
                Cow::Owned(mut items) => list.append(&mut items),
            },
            Self::Records(records) => {
                if let Err(items) = records.append(items) {
                    // An item that is not a record: the list is JSON from now on.
                    let mut list = match std::mem::take(records.as_mut()).into_json() {
                        Value::Array(list) => list,
                        other => vec![other],
                    };
                    list.extend_from_slice(&items);
                    *self = Self::Json(Value::Array(list));
                }
            }
            Self::Json(_) => *self = Self::new(key, Value::Array(items.into_owned())),
        }
    }
}

impl Serialize for Slot {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Json(value) => value.serialize(serializer),
            Self::Records(records) => records.serialize(serializer),
        }
    }
}

impl State {
    /// A state holding `values`.
    pub fn from_map(values: Map<String, Value>) -> Self {
        let slots = values
            .into_iter()
            .map(|(key, value)| {
                let slot = Slot::new(&key, value);
                (key, slot)
            })
            .collect();
        Self { slots }
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.slots.get(key).map(Slot::json)
    }

    /// A copy of the value of `key` (the `decisions` records' JSON is made for the copy, not
    /// kept).
    pub(crate) fn get_cloned(&self, key: &str) -> Option<Value> {
        self.slots.get(key).map(Slot::to_json)
    }

    /// Sets `key` to `value`.
    pub fn set(&mut self, key: impl Into<String>, value: Value) {
        let key = key.into();
        let slot = Slot::new(&key, value);
        self.slots.insert(key, slot);
    }

    /// Removes `key`, returning its value.
    pub(crate) fn remove(&mut self, key: &str) -> Option<Value> {
        self.slots.remove(key).map(Slot::into_json)
    }

    /// Applies `write`: a replace sets the key's value, an append extends the list under
    /// the key (a key that holds no list, or none, gets a list of the items), a delete
    /// removes the key. A key already present is written in place (its name is not copied
    /// again, a list is not moved).
    pub(crate) fn write(&mut self, write: &StateWrite) {
        match write {
            StateWrite::Replace { key, value } => self.replace(key, value.clone()),
            StateWrite::Append { key, items } => self.append(key, Cow::Borrowed(items)),
            StateWrite::Delete { key } => {
                self.slots.remove(key.as_ref());
            }
        }
    }

    fn replace(&mut self, key: &Key, value: Value) {
        let slot = Slot::new(key, value);
        match self.slots.get_mut(key.as_ref()) {
            Some(old) => *old = slot,
            None => {
                self.slots.insert(key.to_string(), slot);
            }
        }
    }

    fn append(&mut self, key: &Key, items: Cow<'_, [Value]>) {
        match self.slots.get_mut(key.as_ref()) {
            Some(slot) => slot.append(key, items),
            None => {
                let slot = Slot::new(key, Value::Array(items.into_owned()));
                self.slots.insert(key.to_string(), slot);
            }
        }
    }

    /// Applies every write of `delta`, in order.
    pub fn apply(&mut self, delta: &StateDelta) {
        for write in delta.iter() {
            self.write(write);
        }
    }

    /// [`write`](Self::write) of a write no one else needs: its value moves into the state.
    fn write_owned(&mut self, write: StateWrite) {
        match write {
            StateWrite::Replace { key, value } => self.replace(&key, value),
            StateWrite::Append { key, items } => self.append(&key, Cow::Owned(items)),
            StateWrite::Delete { key } => {
                self.slots.remove(key.as_ref());
            }
        }
    }

    /// [`apply`](Self::apply) of writes no one else needs: the values of the runs of writes
    /// `delta` alone holds move into the state; shared ones are copied.
    pub fn apply_owned(&mut self, delta: StateDelta) {
        for run in delta.runs {
            match Arc::try_unwrap(run) {
                Ok(writes) => writes.into_iter().for_each(|w| self.write_owned(w)),
                Err(shared) => shared.iter().for_each(|w| self.write(w)),
            }
        }
    }

    /// Drops every `temp:` key (the end of an invocation).
    pub(crate) fn clear_temp(&mut self) {
        self.slots.retain(|key, _| Scope::of(key) != Scope::Temp);
    }

    /// The keys, in order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.slots.keys().map(String::as_str)
    }

    /// A JSON copy of all values, in key order (what a Python step is given).
    pub fn to_map(&self) -> Map<String, Value> {
        self.slots
            .iter()
            .map(|(key, slot)| (key.clone(), slot.to_json()))
            .collect()
    }

    /// Replace writes that build this state from nothing, in key order.
    pub fn to_writes(&self) -> StateDelta {
        self.slots
            .iter()
            .map(|(key, slot)| StateWrite::Replace {
                key: Key::Owned(key.clone()),
                value: slot.to_json(),
            })
            .collect()
    }
}

impl Serialize for State {
    /// The JSON object of the values, in key order.
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(&self.slots)
    }
}

impl<'de> Deserialize<'de> for State {
    /// A JSON object of values.
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Map::deserialize(deserializer).map(Self::from_map)
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
    pub(crate) fn push(&mut self, write: StateWrite) {
        if let Some(last) = self.runs.last_mut().and_then(Arc::get_mut) {
            last.push(write);
        } else {
            self.runs.push(Arc::new(vec![write]));
        }
    }

    /// Records that `key` now holds `value`.
    pub fn set(&mut self, key: impl Into<String>, value: Value) {
        self.push(StateWrite::Replace {
            key: Key::Owned(key.into()),
            value,
        });
    }

    /// Records that `items` go on the end of the list under `key`.
    pub fn append(&mut self, key: impl Into<String>, items: Vec<Value>) {
        self.push(StateWrite::Append {
            key: Key::Owned(key.into()),
            items,
        });
    }

    /// Records that `key` is removed.
    pub(crate) fn delete(&mut self, key: impl Into<String>) {
        self.push(StateWrite::Delete {
            key: Key::Owned(key.into()),
        });
    }

    /// Adds the writes of `later` after these (sharing them).
    pub fn extend(&mut self, later: StateDelta) {
        self.runs.extend(later.runs);
    }

    /// Whether nothing was written.
    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
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

    /// How many writes there are.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.runs.iter().map(|run| run.len()).sum()
    }

    /// The last write of `key`, if any.
    #[cfg(test)]
    pub(crate) fn last(&self, key: &str) -> Option<&StateWrite> {
        self.iter().rev().find(|w| w.key() == key)
    }

    /// Rewrites, by `rewrite`, each write that `needs` picks. A run of writes shared with
    /// another delta is copied first (the other keeps its writes); one this delta alone holds
    /// is rewritten where it is, and a run with nothing to rewrite stays shared.
    pub(crate) fn rewrite(
        &mut self,
        needs: impl Fn(&StateWrite) -> bool,
        mut rewrite: impl FnMut(&mut StateWrite),
    ) {
        for run in &mut self.runs {
            if run.iter().any(&needs) {
                for write in Arc::make_mut(run).iter_mut().filter(|w| needs(w)) {
                    rewrite(write);
                }
            }
        }
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
        Self::from(iter.into_iter().collect::<Vec<_>>())
    }
}

impl From<Vec<StateWrite>> for StateDelta {
    /// The writes of `writes`, in order, as one run (the list itself, not a copy).
    fn from(writes: Vec<StateWrite>) -> Self {
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
/// Every change goes through `apply` as writes. While a journal is kept
/// (`start_journal`), the writes are also recorded in the order they
/// were applied, whoever made them, for `take_journal`: that is how the
/// executor hands each checkpoint exactly the writes since the last one, with no copy of the
/// state to compare against. The same writes feed a copy of the state kept elsewhere (a
/// Python session's, [`catch_up`](Self::catch_up)): the copy gets the whole state once, then
/// only the writes made since it last caught up. The lock is never held across an `.await`;
/// every method takes it for one read or one batch of writes.
#[derive(Debug, Clone)]
pub struct SharedState {
    inner: Arc<Mutex<Inner>>,
}

impl Default for SharedState {
    fn default() -> Self {
        Self::new(State::default())
    }
}

#[derive(Debug)]
struct Inner {
    state: State,
    journal: Option<StateDelta>,
    /// This state's number, unique in the process (a kept copy names the state it follows).
    id: u64,
    /// Counts catch-ups: a copy caught up at generation `g` follows the writes of `feed`.
    generation: u64,
    /// The writes applied since the last catch-up, while a copy is kept; `None` when the
    /// next catch-up must send the whole state (none yet, a reset, or a feed grown too long).
    feed: Option<StateDelta>,
    /// How many writes `feed` holds.
    fed: usize,
}

/// How many writes a copy may fall behind before the feed is dropped and the next catch-up
/// sends the whole state instead (so a run whose kept copy is never read again does not
/// hold every write it made).
const FEED_LIMIT: usize = 10_000;

/// What a copy of the state kept elsewhere needs to be the state now (see
/// [`SharedState::catch_up`]).
#[derive(Debug, Clone, PartialEq)]
pub enum CatchUp {
    /// The whole state: the copy starts afresh.
    Full(State),
    /// The writes applied since generation `from`, in order, for a copy that is at `from`.
    Writes {
        /// The generation the copy must be at for these writes to apply.
        from: u64,
        /// The writes.
        writes: StateDelta,
    },
}

/// A catch-up of a kept copy of the state: which state, to which generation, and how.
#[derive(Debug, Clone, PartialEq)]
pub struct Mirror {
    /// The state's number, unique in the process.
    pub id: u64,
    /// The generation the copy is at once it applied `catch_up`.
    pub to: u64,
    /// The whole state or the writes since the copy's generation.
    pub catch_up: CatchUp,
}

/// Numbers the states of the process.
static NEXT_STATE_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl SharedState {
    /// Shares `state`.
    pub fn new(state: State) -> Self {
        Self {
            inner: Arc::new(Mutex::new(Inner {
                state,
                journal: None,
                id: NEXT_STATE_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                generation: 0,
                feed: None,
                fed: 0,
            })),
        }
    }

    /// What a copy of this state kept elsewhere needs to be the state now: the writes
    /// applied since the last catch-up (for a copy at that generation), or the whole state
    /// when there is no such feed yet (the first catch-up, after a reset (a resumed run), or
    /// after ten thousand writes); from now on, the writes applied are kept for the next
    /// one. The copy checks the generation: a copy that is not at `from` (a new or restarted
    /// session, or another copy caught up since) asks for [`catch_up_full`](Self::catch_up_full).
    pub fn catch_up(&self) -> Mirror {
        let mut inner = self.lock();
        let from = inner.generation;
        inner.generation += 1;
        inner.fed = 0;
        let catch_up = match inner.feed.replace(StateDelta::new()) {
            Some(writes) => CatchUp::Writes { from, writes },
            None => CatchUp::Full(inner.state.clone()),
        };
        Mirror {
            id: inner.id,
            to: inner.generation,
            catch_up,
        }
    }

    /// [`catch_up`](Self::catch_up) with the whole state, for a copy that starts afresh.
    pub fn catch_up_full(&self) -> Mirror {
        let mut inner = self.lock();
        inner.feed = None;
        drop(inner);
        self.catch_up()
    }

    /// Adds `delta` to the feed of a kept copy, if there is one.
    fn feed(inner: &mut Inner, delta: &StateDelta) {
        if let Some(feed) = &mut inner.feed {
            inner.fed += delta.runs.iter().map(|run| run.len()).sum::<usize>();
            if inner.fed > FEED_LIMIT {
                inner.feed = None;
            } else {
                feed.extend(delta.clone());
            }
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
        self.lock().state.get_cloned(key)
    }

    /// Sets `key` to `value`; returns the write.
    #[cfg(test)]
    pub(crate) fn set(&self, key: impl Into<String>, value: Value) -> StateDelta {
        let mut delta = StateDelta::new();
        delta.set(key, value);
        self.apply(&delta);
        delta
    }

    /// Applies `delta` (and journals it, while a journal is kept).
    pub(crate) fn apply(&self, delta: &StateDelta) {
        if delta.is_empty() {
            return;
        }
        let mut inner = self.lock();
        inner.state.apply(delta);
        if let Some(journal) = &mut inner.journal {
            journal.extend(delta.clone());
        }
        Self::feed(&mut inner, delta);
    }

    /// [`apply`](Self::apply) of writes no one else needs: while no journal and no feed of a
    /// kept copy is kept, their values move into the state ([`State::apply_owned`]).
    pub(crate) fn apply_owned(&self, delta: StateDelta) {
        if delta.is_empty() {
            return;
        }
        let mut inner = self.lock();
        if inner.journal.is_some() || inner.feed.is_some() {
            inner.state.apply(&delta);
            Self::feed(&mut inner, &delta);
            if let Some(journal) = &mut inner.journal {
                journal.extend(delta);
            }
        } else {
            inner.state.apply_owned(delta);
        }
    }

    /// A copy of the whole state.
    pub(crate) fn snapshot(&self) -> State {
        self.lock().state.clone()
    }

    /// The state itself when this is its last holder (a finished run's), else a copy.
    pub fn into_state(self) -> State {
        match Arc::try_unwrap(self.inner) {
            Ok(inner) => {
                let inner = inner
                    .into_inner()
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
                inner.state
            }
            Err(shared) => SharedState { inner: shared }.snapshot(),
        }
    }

    /// Runs `f` on the state under one lock (for reads that must see one moment).
    pub fn with<R>(&self, f: impl FnOnce(&State) -> R) -> R {
        f(&self.lock().state)
    }

    /// Replaces the whole state with `state` (a resumed run's checkpoint), outside the
    /// journal, which starts again empty if one is kept; a kept copy gets the whole state
    /// at its next catch-up.
    pub(crate) fn reset(&self, state: State) {
        let mut inner = self.lock();
        inner.state = state;
        if let Some(journal) = &mut inner.journal {
            *journal = StateDelta::new();
        }
        inner.feed = None;
    }

    /// Drops every `temp:` key (the end of an invocation; not journaled, but a kept copy
    /// gets their deletes).
    pub(crate) fn clear_temp(&self) {
        let mut inner = self.lock();
        if inner.feed.is_some() {
            let deletes: StateDelta = inner
                .state
                .keys()
                .filter(|key| Scope::of(key) == Scope::Temp)
                .map(|key| StateWrite::Delete {
                    key: Key::Owned(key.to_owned()),
                })
                .collect();
            Self::feed(&mut inner, &deletes);
        }
        inner.state.clear_temp();
    }

    /// Starts (or restarts, empty) the journal of writes.
    pub(crate) fn start_journal(&self) {
        self.lock().journal = Some(StateDelta::new());
    }

    /// The writes applied since the journal started or was last taken, in order (none when
    /// no journal is kept).
    pub(crate) fn take_journal(&self) -> StateDelta {
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
        state.set("note", json!("not a list"));
        state.set("plan", json!("old"));
        let mut delta = StateDelta::new();
        delta.append("log", vec![json!(2), json!(3)]);
        delta.append("fresh", vec![json!("a")]);
        delta.append("note", vec![json!("b")]);
        delta.set("plan", json!("new"));
        delta.delete("flag");
        delta.set("empty", Value::Null);
        state.apply(&delta);
        assert_eq!(state.get("log"), Some(&json!([1, 2, 3])));
        assert_eq!(state.get("fresh"), Some(&json!(["a"])));
        // A key that holds no list starts one: the old value is not kept.
        assert_eq!(state.get("note"), Some(&json!(["b"])));
        assert_eq!(state.get("plan"), Some(&json!("new")));
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
        assert_eq!(shared.iter().count(), 1);
        let mut all = StateDelta::new();
        all.extend(shared);
        all.extend(first);
        let keys: Vec<&str> = all.iter().map(StateWrite::key).collect();
        assert_eq!(keys, ["a", "a", "b"]);
        assert_eq!(all.keys(), ["a", "b"]);
    }

    #[test]
    fn a_rewrite_copies_only_runs_it_changes_and_shared_ones_stay_as_they_were() {
        let mut shared = StateDelta::new();
        shared.set("a", json!(1));
        let mut other = StateDelta::new();
        other.set("b", json!(2));
        let mut delta = shared.clone();
        delta.extend(other.clone());
        let is_b = |w: &StateWrite| w.key() == "b";
        delta.rewrite(is_b, |w| *w = StateWrite::Delete { key: "b".into() });
        assert_eq!(
            delta.iter().cloned().collect::<Vec<_>>(),
            [
                StateWrite::Replace {
                    key: "a".into(),
                    value: json!(1)
                },
                StateWrite::Delete { key: "b".into() },
            ]
        );
        // The delta `b`'s run came from keeps its write; the untouched run is still shared.
        assert_eq!(
            other.last("b"),
            Some(&StateWrite::Replace {
                key: "b".into(),
                value: json!(2)
            })
        );
        assert!(Arc::ptr_eq(&shared.runs[0], &delta.runs[0]));
        assert!(!Arc::ptr_eq(&other.runs[0], &delta.runs[1]));
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
    fn owned_writes_leave_the_state_that_applied_ones_do_and_shared_ones_intact() {
        let start = || {
            let mut state = State::default();
            state.set("log", json!([1]));
            state.set("note", json!("not a list"));
            state.set("gone", json!(true));
            state
        };
        let mut shared = StateDelta::new();
        shared.append("log", vec![json!(2)]);
        let mut delta = shared.clone();
        let mut own = StateDelta::new();
        own.append("log", vec![json!(3)]);
        own.append("note", vec![json!("b")]);
        own.append("fresh", vec![json!("c")]);
        own.set("plan", json!("new"));
        own.delete("gone");
        delta.extend(own);
        let mut applied = start();
        applied.apply(&delta);
        let mut owned = start();
        owned.apply_owned(delta);
        assert_eq!(owned, applied);
        assert_eq!(owned.get("log"), Some(&json!([1, 2, 3])));
        assert_eq!(owned.get("note"), Some(&json!(["b"])));
        assert_eq!(owned.get("gone"), None);
        assert_eq!(shared.len(), 1, "the shared run was copied, not taken");
        // With a journal kept, the writes are journaled as they are.
        let state = SharedState::new(State::default());
        state.start_journal();
        state.apply_owned(shared.clone());
        assert_eq!(state.take_journal(), shared);
        assert_eq!(state.get("log"), Some(json!([2])));
    }

    #[test]
    fn the_last_holder_takes_the_state_and_a_shared_one_is_copied() {
        let state = SharedState::new(State::default());
        state.set("a", json!(1));
        let other = state.clone();
        let copy = state.into_state();
        assert_eq!(copy.get("a"), Some(&json!(1)));
        other.set("a", json!(2));
        assert_eq!(
            copy.get("a"),
            Some(&json!(1)),
            "a copy, not the shared state"
        );
        assert_eq!(other.into_state().get("a"), Some(&json!(2)));
    }

    /// The `decisions` list is kept as records while every item is one; whichever way it is
    /// kept, the state reads, writes, copies and compares as the same JSON.
    #[test]
    fn decisions_kept_as_records_read_as_the_json_they_stand_for() {
        let record = |summary: &str| {
            json!({"agent": "router", "summary": summary, "rationale": "why",
                   "timestamp": "2026-11-28T18:30:00.000Z", "related_artifacts": ["spec.md"]})
        };
        let json_state = |value: Value| match value {
            Value::Object(map) => State::from_map(map),
            _ => State::default(),
        };
        let is_records =
            |state: &State| matches!(state.slots.get(DECISIONS), Some(Slot::Records(_)));
        let mut state = State::default();
        state.set("plan", json!("a"));
        let mut delta = StateDelta::new();
        delta.append(DECISIONS, vec![record("a → b")]);
        state.apply(&delta);
        let mut owned = StateDelta::new();
        owned.append(DECISIONS, vec![record("b → a")]);
        state.apply_owned(owned);
        assert!(is_records(&state));
        let expected = json!({"decisions": [record("a → b"), record("b → a")], "plan": "a"});
        let text = serde_json::to_string(&state).expect("serialises");
        assert_eq!(text, serde_json::to_string(&expected).expect("serialises"));
        // As `--json` writes it, too.
        assert_eq!(
            serde_json::to_string_pretty(&state).expect("serialises"),
            serde_json::to_string_pretty(&expected).expect("serialises")
        );
        let mut empty = State::default();
        empty.set(DECISIONS, json!([]));
        assert!(is_records(&empty));
        assert_eq!(
            serde_json::to_string_pretty(&empty).expect("serialises"),
            serde_json::to_string_pretty(&json!({"decisions": []})).expect("serialises")
        );
        let back: State = serde_json::from_str(&text).expect("parses");
        assert!(is_records(&back));
        assert_eq!(back, state);
        assert_eq!(state, json_state(expected.clone()));
        assert_eq!(state.get(DECISIONS), expected.get(DECISIONS));
        assert_eq!(
            state.get_cloned(DECISIONS).as_ref(),
            expected.get(DECISIONS)
        );
        assert_eq!(Value::Object(state.to_map()), expected);
        let mut rebuilt = State::default();
        rebuilt.apply(&state.to_writes());
        assert_eq!(rebuilt, state);
        assert_eq!(state.keys().collect::<Vec<_>>(), ["decisions", "plan"]);

        // A JSON read is kept in step with appends made after it.
        let mut more = StateDelta::new();
        more.append(DECISIONS, vec![record("a → end")]);
        state.apply(&more);
        let three = json!([record("a → b"), record("b → a"), record("a → end")]);
        assert_eq!(state.get(DECISIONS), Some(&three));

        // An item that is not a record: the list is JSON from then on, nothing lost.
        let mut note = StateDelta::new();
        note.append(DECISIONS, vec![json!("a note")]);
        state.apply(&note);
        assert!(!is_records(&state));
        let mut four = three.as_array().cloned().unwrap_or_default();
        four.push(json!("a note"));
        assert_eq!(state.get(DECISIONS), Some(&Value::Array(four.clone())));
        four.push(record("b → end"));
        let mut after = StateDelta::new();
        after.append(DECISIONS, vec![record("b → end")]);
        state.apply_owned(after);
        assert_eq!(state.remove(DECISIONS), Some(Value::Array(four)));

        // Replaced by records, or by something else, the key holds what it was given.
        state.set(DECISIONS, json!([record("x")]));
        assert!(is_records(&state));
        state.set(DECISIONS, json!({"not": "a list"}));
        assert_eq!(state.get(DECISIONS), Some(&json!({"not": "a list"})));
        let mut onto = StateDelta::new();
        onto.append(DECISIONS, vec![record("y")]);
        state.apply(&onto);
        assert!(is_records(&state));
        assert_eq!(state.get(DECISIONS), Some(&json!([record("y")])));
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

    #[test]
    fn a_kept_copy_gets_the_whole_state_once_then_only_the_writes_made_since() {
        let state = SharedState::new(State::default());
        state.set("log", json!([1]));
        state.set("temp:q", json!("x"));
        let first = state.catch_up();
        let CatchUp::Full(whole) = &first.catch_up else {
            panic!("the first catch-up sends the whole state: {first:?}")
        };
        assert_eq!(whole.get("log"), Some(&json!([1])));
        let mut copy = whole.clone();
        // Writes of every kind, made by anyone, and the end of an invocation's `temp:` keys.
        let mut delta = StateDelta::new();
        delta.append("log", vec![json!(2)]);
        delta.set("plan", json!("p"));
        state.apply(&delta);
        state.apply_owned(StateDelta::from(vec![StateWrite::Delete {
            key: "plan".into(),
        }]));
        state.clear_temp();
        let next = state.catch_up();
        assert_eq!(next.id, first.id);
        assert_eq!(next.to, first.to + 1);
        let CatchUp::Writes { from, writes } = &next.catch_up else {
            panic!("then only the writes: {next:?}")
        };
        assert_eq!(*from, first.to);
        assert_eq!(writes.len(), 4, "{writes:?}");
        copy.apply(writes);
        assert_eq!(copy, state.snapshot());
        // Nothing written since: nothing to send.
        let idle = state.catch_up();
        assert!(matches!(&idle.catch_up, CatchUp::Writes { writes, .. } if writes.is_empty()));
        // A reset (a resumed run) and a forced catch-up send the whole state again.
        state.reset(State::default());
        assert!(matches!(state.catch_up().catch_up, CatchUp::Full(s) if s == State::default()));
        assert!(matches!(state.catch_up_full().catch_up, CatchUp::Full(_)));
        // Another state is another copy.
        assert_ne!(SharedState::default().catch_up().id, first.id);
    }

    #[test]
    fn a_copy_that_falls_too_far_behind_gets_the_whole_state_and_the_feed_is_dropped() {
        let state = SharedState::new(State::default());
        state.catch_up();
        for i in 0..=FEED_LIMIT {
            state.set("n", json!(i));
        }
        assert!(
            state.lock().feed.is_none(),
            "the writes are not kept past the limit"
        );
        assert!(
            matches!(state.catch_up().catch_up, CatchUp::Full(s) if s.get("n") == Some(&json!(FEED_LIMIT)))
        );
    }
}
