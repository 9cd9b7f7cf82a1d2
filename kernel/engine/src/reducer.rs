//! Channel writes and per-key reducers: how a step's updates become state.
//!
//! A state key is a *channel*. A step's output is a map of updates; each key's [`Reducer`]
//! turns its update into a [`ChannelWrite`]: `messages` and `decisions` **append** (the update
//! is a list of new items, or one item), every other key is **replaced** (as in LangGraph).
//! Writes are what checkpoints store: appending one message to a long history costs the size
//! of that message, not of the history. [`ChannelWrite::diff`] recovers the writes of a step
//! whose updates were applied in place (a prefix-extended list becomes an append).
//!
//! ```
//! use engine::reducer::{apply_writes, Reducers};
//! use engine::{State, StateDelta};
//! use serde_json::json;
//!
//! let mut state = State::default();
//! let mut updates = StateDelta::default();
//! updates.set("messages", json!({"author": "dev", "content": "done"}));
//! updates.set("status", json!("review"));
//! let writes = Reducers::default().reduce(&updates);
//! apply_writes(&mut state, &writes);
//! apply_writes(&mut state, &writes);
//! assert_eq!(state.get("messages").map(|m| m.as_array().map(Vec::len)), Some(Some(2)));
//! assert_eq!(state.get("status"), Some(&json!("review")));
//! ```

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::state::{State, StateDelta};

/// The conversation channel (append): `{author, content, ...}` per message.
pub const MESSAGES: &str = "messages";
/// The decision records channel (append).
pub const DECISIONS: &str = "decisions";

/// How an update of a key merges into its current value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reducer {
    /// The update becomes the value.
    Replace,
    /// The update's items (a list, or one value) are added to the end of the list.
    Append,
}

/// The reducer of each key: [`Reducer::Replace`] unless named otherwise.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Reducers {
    by_key: BTreeMap<String, Reducer>,
}

impl Default for Reducers {
    /// `messages` and `decisions` append; everything else replaces.
    fn default() -> Self {
        let by_key = [
            (MESSAGES.to_owned(), Reducer::Append),
            (DECISIONS.to_owned(), Reducer::Append),
        ]
        .into();
        Self { by_key }
    }
}

impl Reducers {
    /// Sets the reducer of `key`.
    pub fn set(&mut self, key: impl Into<String>, reducer: Reducer) {
        self.by_key.insert(key.into(), reducer);
    }

    /// The reducer of `key`.
    pub fn of(&self, key: &str) -> Reducer {
        self.by_key.get(key).copied().unwrap_or(Reducer::Replace)
    }

    /// The values `updates` leave in `state` once merged (an appended list in full), as a
    /// delta to apply: how a step that writes through a shared state honours the reducers.
    pub fn resolve(&self, state: &State, updates: &StateDelta) -> StateDelta {
        let mut resolved = StateDelta::default();
        for write in self.reduce(updates) {
            match write {
                ChannelWrite::Replace { key, value } => resolved.set(key, value),
                ChannelWrite::Append { key, items } => {
                    let earlier = resolved.values().get(&key).or_else(|| state.get(&key));
                    let mut list = match earlier {
                        Some(Value::Array(list)) => list.clone(),
                        _ => Vec::with_capacity(items.len()),
                    };
                    list.extend(items);
                    resolved.set(key, Value::Array(list));
                }
                ChannelWrite::Delete { key } => resolved.set(key, Value::Null),
            }
        }
        resolved
    }

    /// The writes that merge `updates` into a state.
    pub fn reduce(&self, updates: &StateDelta) -> Vec<ChannelWrite> {
        updates
            .values()
            .iter()
            .map(|(key, value)| match self.of(key) {
                Reducer::Replace => ChannelWrite::Replace {
                    key: key.clone(),
                    value: value.clone(),
                },
                Reducer::Append => ChannelWrite::Append {
                    key: key.clone(),
                    items: match value {
                        Value::Array(items) => items.clone(),
                        one => vec![one.clone()],
                    },
                },
            })
            .collect()
    }
}

/// One change of one channel (state key).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum ChannelWrite {
    /// `key` now holds `value`.
    Replace {
        /// The channel.
        key: String,
        /// Its new value.
        value: Value,
    },
    /// `items` were added to the end of the list under `key`.
    Append {
        /// The channel.
        key: String,
        /// The new items.
        items: Vec<Value>,
    },
    /// `key` was removed.
    Delete {
        /// The channel.
        key: String,
    },
}

impl ChannelWrite {
    /// The channel written.
    pub fn key(&self) -> &str {
        match self {
            Self::Replace { key, .. } | Self::Append { key, .. } | Self::Delete { key } => key,
        }
    }

    /// The writes that turn `before` into `after`, in key order: a list that only grew at its
    /// end is an append of the new items, any other change a replace, a vanished key a delete.
    pub fn diff(before: &State, after: &State) -> Vec<ChannelWrite> {
        let changed = after
            .values()
            .iter()
            .filter_map(|(key, new)| Self::change(key, before.get(key), Some(new)));
        let deleted = before
            .values()
            .keys()
            .filter(|key| after.get(key).is_none())
            .map(|key| ChannelWrite::Delete { key: key.clone() });
        changed.chain(deleted).collect()
    }

    /// The write that turns `old` into `new` under `key` (none when they are equal); see
    /// [`diff`](Self::diff).
    pub fn change(key: &str, old: Option<&Value>, new: Option<&Value>) -> Option<ChannelWrite> {
        let key = key.to_owned();
        Some(match (old, new) {
            (Some(old), Some(new)) if old == new => return None,
            (None, None) => return None,
            (_, None) => ChannelWrite::Delete { key },
            (Some(Value::Array(old)), Some(Value::Array(new)))
                if new.len() > old.len() && new[..old.len()] == old[..] =>
            {
                ChannelWrite::Append {
                    key,
                    items: new[old.len()..].to_vec(),
                }
            }
            (_, Some(new)) => ChannelWrite::Replace {
                key,
                value: new.clone(),
            },
        })
    }
}

/// Applies `writes` to `state`, in order. An append to a key that holds no list starts a new
/// list (a non-list value there is replaced: the reducer says the key is a list).
pub fn apply_writes(state: &mut State, writes: &[ChannelWrite]) {
    for write in writes {
        match write {
            ChannelWrite::Replace { key, value } => state.set(key.clone(), value.clone()),
            ChannelWrite::Append { key, items } => {
                let mut list = match state.remove(key) {
                    Some(Value::Array(list)) => list,
                    _ => Vec::with_capacity(items.len()),
                };
                list.extend(items.iter().cloned());
                state.set(key.clone(), Value::Array(list));
            }
            ChannelWrite::Delete { key } => {
                state.remove(key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn state(value: Value) -> State {
        match value {
            Value::Object(map) => State::from_map(map),
            _ => State::default(),
        }
    }

    #[test]
    fn messages_and_decisions_append_other_keys_replace() {
        let mut reducers = Reducers::default();
        reducers.set("notes", Reducer::Append);
        let mut updates = StateDelta::default();
        updates.set("messages", json!([{"author": "pm"}, {"author": "dev"}]));
        updates.set("decisions", json!({"agent": "router"}));
        updates.set("notes", json!("one"));
        updates.set("plan", json!(["a"]));
        let mut s = state(json!({"messages": [{"author": "analyst"}], "plan": ["old"]}));
        apply_writes(&mut s, &reducers.reduce(&updates));
        assert_eq!(
            s.values(),
            state(json!({
                "messages": [{"author": "analyst"}, {"author": "pm"}, {"author": "dev"}],
                "decisions": [{"agent": "router"}],
                "notes": ["one"],
                "plan": ["a"],
            }))
            .values()
        );
    }

    #[test]
    fn diff_finds_appends_replaces_and_deletes_and_replays_to_the_same_state() {
        let before =
            state(json!({"log": [1, 2], "doc": "a", "gone": 1, "same": [1], "cut": [1, 2]}));
        let after = state(json!({"log": [1, 2, 3], "doc": "b", "same": [1], "cut": [1], "new": 0}));
        let writes = ChannelWrite::diff(&before, &after);
        assert_eq!(
            writes,
            vec![
                ChannelWrite::Replace {
                    key: "cut".into(),
                    value: json!([1])
                },
                ChannelWrite::Replace {
                    key: "doc".into(),
                    value: json!("b")
                },
                ChannelWrite::Append {
                    key: "log".into(),
                    items: vec![json!(3)]
                },
                ChannelWrite::Replace {
                    key: "new".into(),
                    value: json!(0)
                },
                ChannelWrite::Delete { key: "gone".into() },
            ]
        );
        let mut replayed = before.clone();
        apply_writes(&mut replayed, &writes);
        assert_eq!(replayed, after);
    }
}
