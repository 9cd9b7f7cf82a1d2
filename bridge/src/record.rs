//! The run's record of sub-call answers, keyed by what was asked: the model, the messages and
//! the generation settings ([`RecordKey`]). It is both the sub-call cache and what an isolated
//! session's crash restore replays from.
//!
//! - [`SubCallRecord`]: one per [`Endpoints`](crate::Endpoints) (a run, and every `rlm_query`
//!   child of it). A sub-call ([`CallOptions::sub_call`](crate::CallOptions::sub_call)) goes
//!   through it: every answer it gets is kept, in the order given, under its key. With
//!   caching on (the default) a call whose key already has a successful answer gets that
//!   answer without a request (a *hit*), and one whose key is being asked right now waits for
//!   that call (*joined*) instead of asking again; a failure is never handed to a new caller
//!   (the next one asks again). Hits and joins take no budget and leave a ledger record that
//!   says so ([`SubCallMetadata::cache`](crate::SubCallMetadata::cache)).
//! - [`AnswerRef`]: which of the record's answers a call got (returned with the call,
//!   [`RecordedCall::answer`](crate::RecordedCall::answer)); [`SubCallRecord::answer`] looks
//!   it up again. A crashed worker's blocks are replayed with every sub-call answered from the
//!   refs its first run got — the same answers, cache on or off, and no model call.
//! - [`AnswerRecord`]: refs (or any answers) per key, handed back in the order given
//!   ([`AnswerRecord::take`]): asking the same question twice in a replayed block gets the
//!   first answer, then the second, as the calls did the first time.
//!
//! A key is a 128-bit digest of the request's JSON (two SipHash passes with different
//! prefixes), so the record does not keep a second copy of every prompt. It keeps every
//! answer of the run (the texts a replay needs); they are what the models sent back, small
//! beside the contexts a run works on.
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
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::chat::{ChatRequest, ChatResponse, Message, SamplingParams, ToolChoice, ToolDefinition};
use crate::config::EndpointConfig;
use crate::error::BridgeError;

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
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    tools: &'a [ToolDefinition],
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: &'a Option<ToolChoice>,
}

impl RecordKey {
    /// The key of `request` sent to the endpoint configured by `endpoint` (its URL, model and
    /// default settings, then the request's own model, settings and tools).
    pub fn for_call(endpoint: &EndpointConfig, request: &ChatRequest) -> Self {
        let asked = Asked {
            base_url: &endpoint.base_url,
            model: request.model.as_deref().unwrap_or(&endpoint.model),
            messages: &request.messages,
            params: &endpoint.params,
            request_params: &request.params,
            tools: &request.tools,
            tool_choice: &request.tool_choice,
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

/// One sub-call's outcome as the record keeps it.
pub type Answer = Result<ChatResponse, BridgeError>;

/// Which answer of the [`SubCallRecord`] a call got: the `ordinal`-th answer to `key`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AnswerRef {
    /// What was asked.
    pub key: RecordKey,
    /// The answer's position among the answers to `key`, from 0.
    pub ordinal: u32,
}

/// How a sub-call that was not sent got its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheUse {
    /// The record already held an answer to the same call.
    Hit,
    /// The same call was in flight; this one waited for its answer.
    Joined,
}

/// How a call is to be answered, as [`SubCallRecord::begin`] decides.
#[derive(Debug)]
pub(crate) enum Turn {
    /// From the record (the answer and its ref).
    Cached(Arc<Answer>, AnswerRef),
    /// The same call is in flight: wait for it ([`Flight::wait`]), then ask again.
    Wait(Flight),
    /// Send it; [`Lead::finish`] keeps the answer (and tells whoever waits).
    Send(Lead),
}

/// A call in flight that others wait for.
#[derive(Debug)]
pub(crate) struct Flight(watch::Receiver<bool>);

impl Flight {
    /// Waits until the call in flight ended (answered, failed or dropped).
    pub(crate) async fn wait(mut self) {
        // An error means the leading call was dropped: it ended too.
        let _ = self.0.wait_for(|done| *done).await;
    }
}

/// The right and duty to send a call and keep its answer.
#[derive(Debug)]
#[must_use = "a lead must finish (or be dropped, which frees its waiters)"]
pub(crate) struct Lead {
    key: RecordKey,
    /// Set when others may wait for this call (caching on).
    done: Option<watch::Sender<bool>>,
}

/// The run's record of sub-call answers, and the sub-call cache (see the [module docs](self)).
#[derive(Debug)]
pub struct SubCallRecord {
    caching: AtomicBool,
    keys: Mutex<HashMap<RecordKey, Entry>>,
    hits: AtomicU64,
    joined: AtomicU64,
}

/// Everything the record holds for one key.
#[derive(Debug, Default)]
struct Entry {
    /// Every answer given, in order.
    answers: Vec<Arc<Answer>>,
    /// The first successful one: what later callers get.
    served: Option<u32>,
    /// The call in flight that later callers wait for (caching on).
    flight: Option<watch::Receiver<bool>>,
}

impl Default for SubCallRecord {
    fn default() -> Self {
        Self::new(true)
    }
}

impl SubCallRecord {
    /// An empty record; `caching` serves recorded answers to repeated calls.
    pub fn new(caching: bool) -> Self {
        Self {
            caching: AtomicBool::new(caching),
            keys: Mutex::new(HashMap::new()),
            hits: AtomicU64::new(0),
            joined: AtomicU64::new(0),
        }
    }

    /// Whether repeated calls are answered from the record.
    pub fn caching(&self) -> bool {
        self.caching.load(Ordering::Relaxed)
    }

    /// Turns caching on or off (answers are recorded either way).
    pub fn set_caching(&self, caching: bool) {
        self.caching.store(caching, Ordering::Relaxed);
    }

    /// The answer `answer` refers to, if this record gave it.
    pub fn answer(&self, answer: &AnswerRef) -> Option<Arc<Answer>> {
        let keys = self.keys();
        let entry = keys.get(&answer.key)?;
        entry.answers.get(answer.ordinal as usize).cloned()
    }

    /// Calls answered from the record without waiting (hits) and after waiting for the same
    /// call in flight (joined).
    pub fn cache_uses(&self) -> (u64, u64) {
        (
            self.hits.load(Ordering::Relaxed),
            self.joined.load(Ordering::Relaxed),
        )
    }

    /// How many answers the record holds.
    pub fn len(&self) -> usize {
        self.keys().values().map(|e| e.answers.len()).sum()
    }

    /// Whether the record holds no answer.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn keys(&self) -> MutexGuard<'_, HashMap<RecordKey, Entry>> {
        // Every critical section leaves the map consistent, so a poisoned lock is usable.
        self.keys.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Decides how a call of `key` is answered. `waited`: this caller already waited for the
    /// same call once (a hit then counts as joined).
    pub(crate) fn begin(&self, key: RecordKey, waited: bool) -> Turn {
        let caching = self.caching();
        let mut keys = self.keys();
        let entry = keys.entry(key).or_default();
        if caching {
            if let Some(ordinal) = entry.served
                && let Some(answer) = entry.answers.get(ordinal as usize)
            {
                let counter = if waited { &self.joined } else { &self.hits };
                counter.fetch_add(1, Ordering::Relaxed);
                return Turn::Cached(Arc::clone(answer), AnswerRef { key, ordinal });
            }
            if let Some(flight) = &entry.flight
                && !*flight.borrow()
            {
                return Turn::Wait(Flight(flight.clone()));
            }
            let (done, flight) = watch::channel(false);
            entry.flight = Some(flight);
            return Turn::Send(Lead {
                key,
                done: Some(done),
            });
        }
        Turn::Send(Lead { key, done: None })
    }

    /// Keeps the answer of a sent call and frees whoever waits for it; returns its ref.
    pub(crate) fn finish(&self, mut lead: Lead, answer: Answer) -> AnswerRef {
        let (key, done) = (lead.key, lead.done.take());
        let mut keys = self.keys();
        let entry = keys.entry(key).or_default();
        let ordinal = u32::try_from(entry.answers.len()).unwrap_or(u32::MAX);
        if answer.is_ok() && entry.served.is_none() {
            entry.served = Some(ordinal);
        }
        entry.answers.push(Arc::new(answer));
        if done.is_some() {
            entry.flight = None;
        }
        drop(keys);
        if let Some(done) = done {
            done.send_replace(true);
        }
        AnswerRef { key, ordinal }
    }
}

impl Drop for Lead {
    fn drop(&mut self) {
        // A lead dropped unfinished (its call's future was dropped): its sender goes with it,
        // which wakes the waiters; one of them then asks again.
        if let Some(done) = &self.done {
            done.send_replace(true);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // In tests an unwrap is an assertion.
mod tests {
    use super::*;

    fn sub() -> EndpointConfig {
        EndpointConfig::openai("sub", "http://127.0.0.1:8000/v1", "small")
    }

    fn ok(text: &str) -> Answer {
        Ok(ChatResponse {
            content: text.into(),
            ..ChatResponse::default()
        })
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

    #[test]
    fn a_repeated_call_gets_the_first_success_and_never_a_failure() {
        let record = SubCallRecord::new(true);
        let key = RecordKey::for_call(&sub(), &ChatRequest::from_prompt("q"));
        let Turn::Send(lead) = record.begin(key, false) else {
            panic!("the first call is sent");
        };
        let Turn::Wait(_) = record.begin(key, false) else {
            panic!("a second caller waits for the one in flight");
        };
        let failed = record.finish(lead, Err(BridgeError::Cancelled));
        let Turn::Send(lead) = record.begin(key, true) else {
            panic!("a failure is not served: the next caller asks again");
        };
        let answered = record.finish(lead, ok("yes"));
        assert_eq!((failed.ordinal, answered.ordinal), (0, 1));
        let Turn::Cached(answer, at) = record.begin(key, false) else {
            panic!("a later call is a hit");
        };
        assert_eq!(at, answered);
        assert_eq!(answer.as_ref().as_ref().unwrap().content, "yes");
        assert_eq!(record.cache_uses(), (1, 0));
        assert!(
            record.answer(&failed).unwrap().is_err(),
            "failures are kept for replay"
        );
        assert_eq!(record.len(), 2);
    }

    #[test]
    fn without_caching_every_call_is_sent_and_every_answer_kept() {
        let record = SubCallRecord::new(false);
        let key = RecordKey::for_call(&sub(), &ChatRequest::from_prompt("q"));
        let mut refs = Vec::new();
        for text in ["one", "two"] {
            let Turn::Send(lead) = record.begin(key, false) else {
                panic!("sent");
            };
            refs.push(record.finish(lead, ok(text)));
        }
        let texts: Vec<String> = refs
            .iter()
            .map(|r| {
                record
                    .answer(r)
                    .unwrap()
                    .as_ref()
                    .as_ref()
                    .unwrap()
                    .content
                    .clone()
            })
            .collect();
        assert_eq!(texts, ["one", "two"]);
        assert_eq!(record.cache_uses(), (0, 0));
    }

    #[tokio::test]
    async fn waiters_wake_when_the_leading_call_is_dropped() {
        let record = SubCallRecord::new(true);
        let key = RecordKey::for_call(&sub(), &ChatRequest::from_prompt("q"));
        let Turn::Send(lead) = record.begin(key, false) else {
            panic!("sent");
        };
        let Turn::Wait(flight) = record.begin(key, false) else {
            panic!("waits");
        };
        drop(lead);
        tokio::time::timeout(std::time::Duration::from_secs(5), flight.wait())
            .await
            .expect("a dropped lead frees its waiters");
        assert!(matches!(record.begin(key, true), Turn::Send(_)));
    }
}
