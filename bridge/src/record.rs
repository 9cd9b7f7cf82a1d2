//! A record of sub-call answers keyed by what was asked: the model, the messages and the
//! generation settings ([`RecordKey`]).
//!
//! [`AnswerRecord`] keeps, per key, the answers in the order they were given, and hands them
//! back in that order ([`AnswerRecord::take`]): asking the same question twice gets the first
//! answer, then the second — as the calls did the first time, even when sampling made the two
//! answers differ. The kernel keeps one per block of an isolated session, so replaying the
//! block after a worker crash gets every sub-call answered exactly as before without a model
//! call; a run-wide cache of sub-calls is the same record shared by a run.
//!
//! A key is a 128-bit digest of the request's JSON (two SipHash passes with different
//! prefixes), so the record does not keep a second copy of every prompt.
//!
//! ```
//! use bridge::record::{AnswerRecord, RecordKey};
//! use bridge::{ChatRequest, EndpointConfig};
//!
//! let sub = EndpointConfig::openai("sub", "http://127.0.0.1:8000/v1", "qwen3");
//! let key = RecordKey::for_call(&sub, &ChatRequest::from_prompt("Summarise part 1"));
//! let mut record = AnswerRecord::default();
//! record.push(key, "first".to_owned());
//! record.push(key, "second".to_owned());
//! assert_eq!(record.take(&key).as_deref(), Some("first"));
//! assert_eq!(record.take(&key).as_deref(), Some("second"));
//! assert_eq!(record.take(&key), None);
//! ```

use std::collections::{HashMap, VecDeque};
use std::hash::{DefaultHasher, Hasher};

use serde::Serialize;

use crate::chat::{ChatRequest, Message, SamplingParams};
use crate::config::EndpointConfig;

/// What a sub-call asked: model, messages and generation settings, as a 128-bit digest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RecordKey([u64; 2]);

/// The parts of a call that decide its answer.
#[derive(Serialize)]
struct Asked<'a> {
    base_url: &'a str,
    model: &'a str,
    messages: &'a [Message],
    params: &'a SamplingParams,
    request_params: &'a SamplingParams,
}

impl RecordKey {
    /// The key of `request` sent to the endpoint configured by `endpoint` (its URL, model and
    /// default settings, then the request's own model and settings).
    pub fn for_call(endpoint: &EndpointConfig, request: &ChatRequest) -> Self {
        let asked = Asked {
            base_url: &endpoint.base_url,
            model: request.model.as_deref().unwrap_or(&endpoint.model),
            messages: &request.messages,
            params: &endpoint.params,
            request_params: &request.params,
        };
        // Serialising plain strings and numbers cannot fail; an empty text would only make
        // every key equal, so fall back to the debug form rather than to nothing.
        let text = serde_json::to_vec(&asked).unwrap_or_else(|_| {
            format!("{:?}|{:?}", request.messages, request.params).into_bytes()
        });
        let digest = |salt: u64| {
            let mut hasher = DefaultHasher::new();
            hasher.write_u64(salt);
            hasher.write(&text);
            hasher.finish()
        };
        Self([digest(0x5eed_0001), digest(0x5eed_0002)])
    }
}

/// Answers by [`RecordKey`], each key's in the order they were given.
#[derive(Debug, Clone)]
pub struct AnswerRecord<A> {
    answers: HashMap<RecordKey, VecDeque<A>>,
    len: usize,
}

impl<A> Default for AnswerRecord<A> {
    fn default() -> Self {
        Self {
            answers: HashMap::new(),
            len: 0,
        }
    }
}

impl<A> AnswerRecord<A> {
    /// Keeps `answer` as the next answer to `key`.
    pub fn push(&mut self, key: RecordKey, answer: A) {
        self.answers.entry(key).or_default().push_back(answer);
        self.len += 1;
    }

    /// The earliest answer to `key` not taken yet.
    pub fn take(&mut self, key: &RecordKey) -> Option<A> {
        let answers = self.answers.get_mut(key)?;
        let answer = answers.pop_front()?;
        if answers.is_empty() {
            self.answers.remove(key);
        }
        self.len -= 1;
        Some(answer)
    }

    /// How many answers the record holds.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the record holds no answer.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // In tests an unwrap is an assertion.
mod tests {
    use super::*;

    fn sub() -> EndpointConfig {
        EndpointConfig::openai("sub", "http://127.0.0.1:8000/v1", "small")
    }

    #[test]
    fn the_key_depends_on_model_messages_and_settings() {
        let base = RecordKey::for_call(&sub(), &ChatRequest::from_prompt("q"));
        assert_eq!(
            base,
            RecordKey::for_call(&sub(), &ChatRequest::from_prompt("q"))
        );
        assert_ne!(
            base,
            RecordKey::for_call(&sub(), &ChatRequest::from_prompt("q2"))
        );
        let mut other_model = sub();
        other_model.model = "big".into();
        assert_ne!(
            base,
            RecordKey::for_call(&other_model, &ChatRequest::from_prompt("q"))
        );
        let mut hotter = sub();
        hotter.params.temperature = Some(0.9);
        assert_ne!(
            base,
            RecordKey::for_call(&hotter, &ChatRequest::from_prompt("q"))
        );
    }

    #[test]
    fn answers_come_back_per_key_in_the_order_given() {
        let (a, b) = (
            RecordKey::for_call(&sub(), &ChatRequest::from_prompt("a")),
            RecordKey::for_call(&sub(), &ChatRequest::from_prompt("b")),
        );
        let mut record = AnswerRecord::default();
        record.push(a, 1);
        record.push(b, 10);
        record.push(a, 2);
        assert_eq!(record.len(), 3);
        assert_eq!(record.take(&b), Some(10));
        assert_eq!(record.take(&a), Some(1));
        assert_eq!(record.take(&a), Some(2));
        assert_eq!(record.take(&a), None);
        assert!(record.is_empty());
    }
}
