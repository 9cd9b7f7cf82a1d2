//! The `decisions` channel: the router's decision records, as the state keeps them.
//!
//! Every routing decision appends one [`DecisionRecord`] to the state's `decisions` list, and
//! the record stays there as long as the run. Kept as a JSON object it cost more than a
//! message: serde_json's object is a B-tree whose node takes 632 bytes however few its keys,
//! so the record's five fields (47 bytes of keys, about 65 of text) took 744 bytes, and a
//! routed run's state held twice a plain graph's. So the state keeps the channel as
//! [`Records`] while every item of it is a decision record: five fields, 120 bytes and its
//! texts.
//!
//! Nothing outside the state can tell. A list is kept as records only when each item is
//! exactly a record's JSON — an object of these five keys and no other, texts where the
//! record has texts — so that a record and its JSON make each other back unchanged; a list
//! with any other item stays JSON (an append of such an item turns the records back into
//! JSON first). The state writes the records as the JSON it would have written (keys in
//! the order of a JSON object's, [`Sorted`]); a reader that asks for the channel as a JSON
//! value gets it made once, at its first read, and kept in step with later appends, so a
//! condition that reads `decisions` at every step pays for each record once.

use std::borrow::Cow;
use std::sync::OnceLock;

use serde::ser::SerializeMap;
use serde::{Deserialize, Serialize, Serializer};
use serde_json::{Map, Value};

/// The decision records channel (append).
pub const DECISIONS: &str = "decisions";

/// One routing decision, on record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DecisionRecord {
    /// Who decided (the router's name).
    pub agent: String,
    /// What was decided, in one line (`dev → tea`, `escalate to a human`).
    pub summary: String,
    /// Why.
    pub rationale: String,
    /// When (RFC 3339, UTC).
    pub timestamp: String,
    /// The artifacts (state keys, files, gates) the decision concerns.
    pub related_artifacts: Vec<String>,
}

/// The keys of a record's JSON object, in the order a JSON object keeps them (sorted).
const KEYS: [&str; 5] = [
    "agent",
    "rationale",
    "related_artifacts",
    "summary",
    "timestamp",
];

impl DecisionRecord {
    /// Whether `value` is exactly a record's JSON: an object of the five keys and no other,
    /// `related_artifacts` a list of texts and the other four texts.
    fn is_json(value: &Value) -> bool {
        let Value::Object(object) = value else {
            return false;
        };
        object.len() == KEYS.len()
            && KEYS.iter().all(|&key| match (key, object.get(key)) {
                ("related_artifacts", Some(Value::Array(items))) => {
                    items.iter().all(Value::is_string)
                }
                ("related_artifacts", _) => false,
                (_, field) => field.is_some_and(Value::is_string),
            })
    }

    /// The record `value` is, its texts moved out of it, or `value` back when it is not
    /// exactly a record's JSON.
    fn from_json(value: Value) -> Result<Self, Value> {
        if !Self::is_json(&value) {
            return Err(value);
        }
        let Value::Object(object) = value else {
            return Err(value);
        };
        let mut record = Self {
            agent: String::new(),
            summary: String::new(),
            rationale: String::new(),
            timestamp: String::new(),
            related_artifacts: Vec::new(),
        };
        for (key, field) in object {
            match (key.as_str(), field) {
                ("agent", Value::String(text)) => record.agent = text,
                ("summary", Value::String(text)) => record.summary = text,
                ("rationale", Value::String(text)) => record.rationale = text,
                ("timestamp", Value::String(text)) => record.timestamp = text,
                ("related_artifacts", Value::Array(items)) => {
                    record.related_artifacts = items
                        .into_iter()
                        .filter_map(|item| match item {
                            Value::String(text) => Some(text),
                            _ => None,
                        })
                        .collect();
                }
                _ => {}
            }
        }
        Ok(record)
    }

    /// The record `value` is, its texts copied, when it is exactly a record's JSON.
    fn from_json_ref(value: &Value) -> Option<Self> {
        if !Self::is_json(value) {
            return None;
        }
        let text = |key: &str| value.get(key).and_then(Value::as_str).unwrap_or_default();
        let artifacts = value.get("related_artifacts").and_then(Value::as_array);
        Some(Self {
            agent: text("agent").to_owned(),
            summary: text("summary").to_owned(),
            rationale: text("rationale").to_owned(),
            timestamp: text("timestamp").to_owned(),
            related_artifacts: artifacts
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect(),
        })
    }

    /// The record as the JSON object the `decisions` channel holds: its serde form (the
    /// decision log's line), its texts moved, not copied.
    pub(crate) fn into_json(self) -> Value {
        let mut object = Map::new();
        object.insert("agent".to_owned(), Value::String(self.agent));
        object.insert("summary".to_owned(), Value::String(self.summary));
        object.insert("rationale".to_owned(), Value::String(self.rationale));
        object.insert("timestamp".to_owned(), Value::String(self.timestamp));
        let artifacts = self.related_artifacts.into_iter().map(Value::String);
        object.insert(
            "related_artifacts".to_owned(),
            Value::Array(artifacts.collect()),
        );
        Value::Object(object)
    }
}

/// A record written as the state writes a JSON object: its keys in [`KEYS`] order.
struct Sorted<'a>(&'a DecisionRecord);

impl Serialize for Sorted<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let record = self.0;
        let mut map = serializer.serialize_map(Some(KEYS.len()))?;
        map.serialize_entry("agent", &record.agent)?;
        map.serialize_entry("rationale", &record.rationale)?;
        map.serialize_entry("related_artifacts", &record.related_artifacts)?;
        map.serialize_entry("summary", &record.summary)?;
        map.serialize_entry("timestamp", &record.timestamp)?;
        map.end()
    }
}

/// The `decisions` list while every item of it is a decision record.
#[derive(Debug, Default)]
pub(crate) struct Records {
    items: Vec<DecisionRecord>,
    /// The list as a JSON value, made at its first read and kept in step with appends.
    json: OnceLock<Value>,
}

impl Records {
    /// `items` as records, or `items` back when any is not exactly a record's JSON.
    pub(crate) fn from_items(items: Vec<Value>) -> Result<Self, Vec<Value>> {
        if !items.iter().all(DecisionRecord::is_json) {
            return Err(items);
        }
        let items = items
            .into_iter()
            .filter_map(|item| DecisionRecord::from_json(item).ok())
            .collect();
        Ok(Self {
            items,
            json: OnceLock::new(),
        })
    }

    /// Appends `items` when each is exactly a record's JSON (their texts moved when they
    /// are owned, else copied); else gives them back, nothing appended.
    pub(crate) fn append<'a>(&mut self, items: Cow<'a, [Value]>) -> Result<(), Cow<'a, [Value]>> {
        if !items.iter().all(DecisionRecord::is_json) {
            return Err(items);
        }
        if let Some(Value::Array(json)) = self.json.get_mut() {
            json.extend_from_slice(&items);
        }
        match items {
            Cow::Borrowed(items) => self
                .items
                .extend(items.iter().filter_map(DecisionRecord::from_json_ref)),
            Cow::Owned(items) => self.items.extend(
                items
                    .into_iter()
                    .filter_map(|item| DecisionRecord::from_json(item).ok()),
            ),
        }
        Ok(())
    }

    /// The list as a JSON value (made at the first call, then kept).
    pub(crate) fn json(&self) -> &Value {
        self.json.get_or_init(|| self.to_json())
    }

    /// A JSON copy of the list (the one [`json`](Self::json) keeps, if made; else made
    /// without keeping it).
    pub(crate) fn to_json(&self) -> Value {
        match self.json.get() {
            Some(json) => json.clone(),
            None => Value::Array(
                self.items
                    .iter()
                    .map(|record| record.clone().into_json())
                    .collect(),
            ),
        }
    }

    /// The list as a JSON value, taking the records.
    pub(crate) fn into_json(self) -> Value {
        match self.json.into_inner() {
            Some(json) => json,
            None => Value::Array(
                self.items
                    .into_iter()
                    .map(DecisionRecord::into_json)
                    .collect(),
            ),
        }
    }
}

impl Clone for Records {
    /// The records (a copy's JSON is made again if it is read).
    fn clone(&self) -> Self {
        Self {
            items: self.items.clone(),
            json: OnceLock::new(),
        }
    }
}

impl PartialEq for Records {
    fn eq(&self, other: &Self) -> bool {
        self.items == other.items
    }
}

impl Serialize for Records {
    /// The list as the JSON it stands for.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.items.iter().map(Sorted))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // In tests an unwrap is an assertion.
mod tests {
    use super::*;
    use serde_json::json;

    fn record(summary: &str, artifacts: &[&str]) -> DecisionRecord {
        DecisionRecord {
            agent: "router".into(),
            summary: summary.into(),
            rationale: "The natural successor of `a` — \"quoted\"".into(),
            timestamp: "2026-11-28T18:30:00.000Z".into(),
            related_artifacts: artifacts.iter().map(|&a| a.to_owned()).collect(),
        }
    }

    #[test]
    fn a_records_json_is_its_serde_form_and_reads_back_as_the_record() {
        for record in [
            record("a → b", &[]),
            record("b → end", &["spec.md", "gate"]),
        ] {
            let serde = serde_json::to_value(&record).unwrap();
            assert_eq!(record.clone().into_json(), serde);
            assert!(DecisionRecord::is_json(&serde));
            // Written by the state, a record reads as its JSON object did, byte for byte.
            assert_eq!(
                serde_json::to_string(&Sorted(&record)).unwrap(),
                serde_json::to_string(&serde).unwrap()
            );
            assert_eq!(
                DecisionRecord::from_json_ref(&serde).as_ref(),
                Some(&record)
            );
            assert_eq!(DecisionRecord::from_json(serde).unwrap(), record);
        }
    }

    #[test]
    fn only_exactly_a_records_json_is_kept_as_a_record() {
        let good = record("a → b", &["x"]).into_json();
        let with = |key: &str, value: Value| {
            let mut object = good.as_object().unwrap().clone();
            object.insert(key.to_owned(), value);
            Value::Object(object)
        };
        let without = |key: &str| {
            let mut object = good.as_object().unwrap().clone();
            object.remove(key);
            Value::Object(object)
        };
        for other in [
            json!("a → b"),
            json!([good.clone()]),
            with("extra", json!(1)),
            with("agent", json!(7)),
            with("summary", Value::Null),
            with("related_artifacts", json!("x")),
            with("related_artifacts", json!([1])),
            without("timestamp"),
        ] {
            assert!(!DecisionRecord::is_json(&other), "{other}");
            assert_eq!(DecisionRecord::from_json_ref(&other), None);
            assert_eq!(DecisionRecord::from_json(other.clone()), Err(other));
        }
        // A list with one such item stays JSON; an append of one is refused as a whole.
        let mixed = vec![good.clone(), json!("note")];
        assert_eq!(
            Records::from_items(mixed.clone()).err(),
            Some(mixed.clone())
        );
        let mut records = Records::from_items(vec![good.clone()]).unwrap();
        assert_eq!(
            records.append(Cow::Borrowed(&mixed)),
            Err(Cow::Borrowed(&mixed[..]))
        );
        assert_eq!(records.to_json(), json!([good]));
    }

    #[test]
    fn the_json_read_is_kept_in_step_with_appends() {
        let one = record("a → b", &[]).into_json();
        let two = record("b → a", &["spec.md"]).into_json();
        let mut records = Records::from_items(vec![one.clone()]).unwrap();
        assert_eq!(records.json(), &json!([one]));
        records.append(Cow::Owned(vec![two.clone()])).unwrap();
        assert_eq!(records.json(), &json!([one, two]));
        assert_eq!(records.clone().into_json(), json!([one, two]));
        assert_eq!(
            serde_json::to_string(&records).unwrap(),
            serde_json::to_string(&json!([one, two])).unwrap()
        );
    }
}
