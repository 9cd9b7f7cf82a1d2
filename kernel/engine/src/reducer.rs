//! Per-key reducers: how an update of a key becomes a write.
//!
//! A state key is a *channel*. Most keys take the value they are given; a few are lists
//! that only grow — `messages` (the conversation on record) and `decisions` (the router's
//! records) — and an update of those is **appended** (the update is a list of new items, or
//! one item), as in LangGraph. `Reducers::reduce` turns updates (replace writes, as a
//! Python step's dict of updates or the router's decision arrive) into the writes that are
//! applied, carried by events and stored by checkpoints: appending one message to a long
//! history costs the size of that message, not of the history.
//!
//! ```
//! use engine::reducer::Reducers;
//! use engine::{State, StateDelta};
//! use serde_json::json;
//!
//! let mut state = State::default();
//! let mut updates = StateDelta::default();
//! updates.set("messages", json!({"author": "dev", "content": "done"}));
//! updates.set("status", json!("review"));
//! let writes = Reducers::default().reduce(&updates);
//! state.apply(&writes);
//! state.apply(&writes);
//! assert_eq!(state.get("messages").map(|m| m.as_array().map(Vec::len)), Some(Some(2)));
//! assert_eq!(state.get("status"), Some(&json!("review")));
//! ```

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::state::{StateDelta, StateWrite};

/// The conversation channel (append): `{author, content, ...}` per message.
pub const MESSAGES: &str = "messages";
pub use crate::decisions::DECISIONS;

/// How an update of a key merges into its current value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Reducer {
    /// The update becomes the value.
    Replace,
    /// The update's items (a list, or one value) are added to the end of the list.
    Append,
}

/// The reducer of each key: `Reducer::Replace` unless named otherwise.
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
    #[cfg(test)]
    pub(crate) fn set(&mut self, key: impl Into<String>, reducer: Reducer) {
        self.by_key.insert(key.into(), reducer);
    }

    /// The reducer of `key`.
    pub(crate) fn of(&self, key: &str) -> Reducer {
        self.by_key.get(key).copied().unwrap_or(Reducer::Replace)
    }

    /// The writes that merge `updates` into a state: a replace of an append key becomes an
    /// append of its items; appends and deletes stay as they are.
    pub fn reduce(&self, updates: &StateDelta) -> StateDelta {
        self.into_writes(updates.clone())
    }

    /// [`reduce`](Self::reduce) of updates no one else needs: their values move into the
    /// writes instead of being copied (writes shared with another delta are copied).
    pub fn into_writes(&self, mut updates: StateDelta) -> StateDelta {
        let appends = |write: &StateWrite| matches!(write, StateWrite::Replace { key, .. } if self.of(key) == Reducer::Append);
        updates.rewrite(appends, |write| {
            if let StateWrite::Replace { key, value } = write {
                let items = match value.take() {
                    Value::Array(items) => items,
                    one => vec![one],
                };
                let key = std::mem::take(key);
                *write = StateWrite::Append { key, items };
            }
        });
        updates
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::State;
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
        updates.delete("gone");
        let mut s = state(json!({"messages": [{"author": "analyst"}], "plan": ["old"], "gone": 1}));
        let writes = reducers.reduce(&updates);
        // The updates are left as they were; owned, they become the same writes.
        assert_eq!(updates.len(), 5);
        assert_eq!(
            updates.last("decisions"),
            Some(&StateWrite::Replace {
                key: "decisions".into(),
                value: json!({"agent": "router"})
            })
        );
        assert_eq!(reducers.into_writes(updates.clone()), writes);
        s.apply(&writes);
        assert_eq!(
            s,
            state(json!({
                "messages": [{"author": "analyst"}, {"author": "pm"}, {"author": "dev"}],
                "decisions": [{"agent": "router"}],
                "notes": ["one"],
                "plan": ["a"],
            }))
        );
    }
}
