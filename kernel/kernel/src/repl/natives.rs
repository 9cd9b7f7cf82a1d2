//! `llm_query` and `llm_query_batched`: sub-model calls from Python, implemented in Rust on
//! the bridge.
//!
//! A call converts its arguments under the GIL, releases the GIL (`py.detach`) and blocks
//! until its answer is there; other Python threads run meanwhile, so threads calling
//! `llm_query` at once all have requests in flight (no hidden global lock: only the endpoint's
//! own `max_in_flight` limiter applies). Where the answer comes from is the session's
//! [`SubCallRoute`]: the bridge on the shared tokio runtime of this process, or — in a worker
//! process — the parent, which holds the endpoints, keys and budget and answers over the
//! worker's link. Every call carries the current block's cancellation token, which the
//! watchdog cancels on a timeout and which is a child of the session token
//! ([`ReplSession::cancel_token`](super::ReplSession::cancel_token)). Failures become
//! `"Error: <reason>"` strings or `LlmQueryError`, per [`SubCallErrorMode`]. In a forked child,
//! whose copy of the runtime has no threads (and whose writes would garble the worker's link),
//! a call raises `LlmQueryError` (kind `forked_child`) in either mode instead of waiting forever.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyString};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use super::metadata::{SubCallText, kept_text};
use super::source::EncodedContext;
use crate::runtime;
use bridge::{BatchPolicy, BridgeError, CallOptions, ChatRequest, Endpoints, Ledger};

/// What a failed sub-call does in Python.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SubCallErrorMode {
    /// Return `"Error: <reason>"` in place of the answer (what RLM prompts expect).
    #[default]
    #[serde(alias = "string")]
    ReturnString,
    /// Raise `LlmQueryError` (for a batch: after all calls finished, with `.results`).
    Raise,
}

impl SubCallErrorMode {
    /// The name used on the command line and in `rlm.toml`.
    pub fn as_str(self) -> &'static str {
        match self {
            SubCallErrorMode::ReturnString => "string",
            SubCallErrorMode::Raise => "raise",
        }
    }
}

/// The error for an unknown [`SubCallErrorMode`] name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Unknown sub-call error mode `{0}`; use `string` or `raise`")]
pub struct UnknownSubCallErrorMode(pub String);

impl std::str::FromStr for SubCallErrorMode {
    type Err = UnknownSubCallErrorMode;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "string" | "return_string" => Ok(SubCallErrorMode::ReturnString),
            "raise" => Ok(SubCallErrorMode::Raise),
            _ => Err(UnknownSubCallErrorMode(s.to_owned())),
        }
    }
}

/// A failed sub-call as the code sees it: the failure's kind (`timeout`, `http_429`,
/// `budget_max_calls`, ...) and its message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SubFailure {
    /// [`bridge::FailureKind::name`], or `forked_child` / `replay_miss` of the kernel.
    pub(crate) kind: String,
    /// What went wrong (without the `Error: ` prefix).
    pub(crate) message: String,
}

impl From<&BridgeError> for SubFailure {
    fn from(error: &BridgeError) -> Self {
        Self {
            kind: error.kind().name().to_owned(),
            message: error.to_string(),
        }
    }
}

/// One sub-call's outcome: the answer's text or the failure.
pub(crate) type SubAnswer = Result<String, SubFailure>;

/// How many of a batch's `prompts` get an error instead of an answer: those of `answers` that
/// are errors, or all of them when the batch failed as a whole (an endpoint that does not
/// exist).
pub(crate) fn failed_answers(answers: Result<&[SubAnswer], &SubFailure>, prompts: usize) -> usize {
    match answers {
        Ok(answers) => answers.iter().filter(|a| a.is_err()).count(),
        Err(_) => prompts,
    }
}

/// One child as an isolated session's worker hands it to the parent, which runs it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct WireChild {
    /// The child's query.
    pub(crate) prompt: String,
    /// Its context: text, or a value the worker serialised.
    pub(crate) context: Option<WireContext>,
    /// The endpoint of its root model.
    pub(crate) model: Option<String>,
    /// Its iteration limit.
    pub(crate) max_iterations: Option<u32>,
}

/// A child's context as the worker hands it over.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) enum WireContext {
    /// A `str` (or UTF-8 `bytes`).
    Text(String),
    /// A dict or list (JSON), a polars frame (Parquet) or a pandas frame (CSV), serialised by
    /// the worker.
    Encoded(EncodedContext),
}

/// Sub-calls answered by another process (a worker's parent).
pub(crate) trait RemoteCalls: Send + Sync + std::fmt::Debug {
    /// One prompt to `endpoint` (`None`: the session's sub endpoint); returns early with a
    /// cancellation failure once `cancel` is cancelled.
    fn call(
        &self,
        endpoint: Option<String>,
        prompt: String,
        cancel: &CancellationToken,
    ) -> SubAnswer;

    /// Many prompts, answered in input order with the session's fan-out width; `Err` when
    /// the endpoint does not exist.
    fn batch(
        &self,
        endpoint: Option<String>,
        prompts: Vec<String>,
        cancel: &CancellationToken,
    ) -> Result<Vec<SubAnswer>, SubFailure>;

    /// `rlm_query` children, run by the other process; `None` when it runs none (the depth
    /// limit: the code then runs `rlm_query` as `llm_query`).
    fn children(
        &self,
        children: Vec<WireChild>,
        cancel: &CancellationToken,
    ) -> Option<Vec<SubAnswer>>;
}

/// Where a session's sub-calls go.
#[derive(Debug, Clone)]
pub(crate) enum SubCallRoute {
    /// To the bridge's endpoints in this process.
    Local(Arc<Endpoints>),
    /// To another process (a worker's parent), which holds the endpoints.
    Remote(Arc<dyn RemoteCalls>),
}

/// The session's link to the bridge, shared by its natives.
#[derive(Debug)]
pub(crate) struct SubModelBridge {
    route: SubCallRoute,
    /// The session's id, in the ledger record of each of its calls.
    session: u64,
    default_endpoint: String,
    batch_concurrency: Option<usize>,
    errors: SubCallErrorMode,
    session_token: CancellationToken,
    cell_token: Mutex<CancellationToken>,
    llm_query_calls: AtomicU32,
    llm_query_batched_calls: AtomicU32,
    /// Answers the code got as an error instead of a sub-model's (see [`Self::counted`]).
    sub_call_errors: AtomicU32,
    /// Characters kept of each prompt and reply in `texts` (0: none kept).
    text_chars: usize,
    texts: Mutex<Vec<SubCallText>>,
    error_class: Py<PyAny>,
    /// The process whose runtime serves the calls: a forked child has none.
    pid: u32,
}

impl SubModelBridge {
    #[allow(clippy::too_many_arguments)] // One per field the session configures.
    pub(crate) fn new(
        route: SubCallRoute,
        session: u64,
        default_endpoint: String,
        batch_concurrency: Option<usize>,
        errors: SubCallErrorMode,
        text_chars: usize,
        session_token: CancellationToken,
        error_class: Py<PyAny>,
    ) -> Self {
        let cell_token = session_token.child_token();
        Self {
            route,
            session,
            default_endpoint,
            batch_concurrency,
            errors,
            session_token,
            cell_token: Mutex::new(cell_token),
            llm_query_calls: AtomicU32::new(0),
            llm_query_batched_calls: AtomicU32::new(0),
            sub_call_errors: AtomicU32::new(0),
            text_chars,
            texts: Mutex::new(Vec::new()),
            error_class,
            pid: std::process::id(),
        }
    }

    /// The ledger of this process's endpoints (none when the sub-calls go to a parent,
    /// whose ledger records them).
    pub(crate) fn ledger(&self) -> Option<&Arc<Ledger>> {
        match &self.route {
            SubCallRoute::Local(endpoints) => Some(endpoints.ledger()),
            SubCallRoute::Remote(_) => None,
        }
    }

    /// The ledger records of this session's calls since `call_index` (not those of other
    /// sessions sharing the ledger meanwhile, such as `rlm_query` children); none when the
    /// calls go to a parent, whose ledger records them (and which fills them in).
    pub(crate) fn own_records(&self, call_index: Option<u64>) -> Vec<bridge::SubCallMetadata> {
        match (self.ledger(), call_index) {
            (Some(ledger), Some(start)) => ledger.records_of(self.session, start),
            _ => Vec::new(),
        }
    }

    /// The options of a sub-call made now: the current block's cancellation, this session,
    /// through the run's record of sub-call answers.
    fn call_options(&self) -> CallOptions {
        CallOptions {
            cancel: self.cell_token(),
            session: Some(self.session),
            sub_call: true,
            ..CallOptions::default()
        }
    }

    pub(crate) fn session_token(&self) -> CancellationToken {
        self.session_token.clone()
    }

    /// A new block starts: fresh cancellation token, counters at zero.
    pub(crate) fn begin_block(&self) -> CancellationToken {
        let token = self.session_token.child_token();
        match self.cell_token.lock() {
            Ok(mut guard) => *guard = token.clone(),
            Err(poisoned) => *poisoned.into_inner() = token.clone(),
        }
        self.llm_query_calls.store(0, Ordering::Relaxed);
        self.llm_query_batched_calls.store(0, Ordering::Relaxed);
        self.sub_call_errors.store(0, Ordering::Relaxed);
        self.texts().clear();
        token
    }

    fn texts(&self) -> std::sync::MutexGuard<'_, Vec<SubCallText>> {
        self.texts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The prompt as kept for the record (cut before the call: the call takes the prompt),
    /// `None` when the session keeps no texts. Known secrets are redacted before the cut, so
    /// the cut never keeps half of one.
    fn kept_prompt(&self, prompt: &str) -> Option<String> {
        (self.text_chars > 0).then(|| kept_text(prompt, self.text_chars))
    }

    /// Keeps what a call asked (already cut) and received.
    fn record_text(&self, prompt: Option<String>, reply: &str) {
        if let Some(prompt) = prompt {
            let reply = kept_text(reply, self.text_chars);
            self.texts().push(SubCallText { prompt, reply });
        }
    }

    /// The texts recorded since the block started.
    pub(crate) fn take_texts(&self) -> Vec<SubCallText> {
        std::mem::take(&mut *self.texts())
    }

    /// `(llm_query calls, llm_query_batched calls, sub-call errors)` since the block started.
    pub(crate) fn counters(&self) -> (u32, u32, u32) {
        (
            self.llm_query_calls.load(Ordering::Relaxed),
            self.llm_query_batched_calls.load(Ordering::Relaxed),
            self.sub_call_errors.load(Ordering::Relaxed),
        )
    }

    /// The other process that answers this session's calls, if one does (a worker's parent).
    pub(crate) fn remote(&self) -> Option<&Arc<dyn RemoteCalls>> {
        match &self.route {
            SubCallRoute::Local(_) => None,
            SubCallRoute::Remote(remote) => Some(remote),
        }
    }

    /// The running block's cancellation token (children stop with the block).
    pub(crate) fn current_cell_token(&self) -> CancellationToken {
        self.cell_token()
    }

    /// The answers of `n` `rlm_query` children as their runner gave them, one for each child
    /// (a child the runner gave none failed), counted as [`call`](Self::call)'s and
    /// [`batch`](Self::batch)'s answers are; `None` when nobody runs children here (the code
    /// then asks the sub-model instead, through those two).
    pub(crate) fn children_answered(
        &self,
        answers: Option<Vec<SubAnswer>>,
        n: usize,
    ) -> Option<Vec<SubAnswer>> {
        let mut answers = answers?;
        answers.resize_with(n, || {
            Err(SubFailure {
                kind: "child_error".to_owned(),
                message: "the rlm_query child run gave no result".to_owned(),
            })
        });
        self.counted(failed_answers(Ok(&answers), n));
        Some(answers)
    }

    /// The answers of `rlm_query_batched`'s children as the code gets them: a list in input
    /// order with `"Error: ..."` for failed children, or `LlmQueryError` (with the list) when
    /// the session raises and one failed.
    pub(crate) fn child_answers<'py>(
        &self,
        py: Python<'py>,
        answers: Vec<SubAnswer>,
    ) -> PyResult<Bound<'py, PyList>> {
        self.batch_answers(py, answers, "child runs", |_| {})
    }

    /// A batch's answers as the code gets them: a list in input order with `"Error: ..."`
    /// for failed items (each text handed to `each` in order as it is placed), or
    /// `LlmQueryError` (with the list) when the session raises and one failed; `what` names
    /// the items in that error ("sub-calls", "child runs").
    fn batch_answers<'py>(
        &self,
        py: Python<'py>,
        answers: Vec<SubAnswer>,
        what: &str,
        mut each: impl FnMut(&str),
    ) -> PyResult<Bound<'py, PyList>> {
        let n = answers.len();
        let mut first_error: Option<(usize, SubFailure)> = None;
        let mut failed = 0usize;
        let mut texts = Vec::with_capacity(n);
        for (i, answer) in answers.into_iter().enumerate() {
            let text = match answer {
                Ok(text) => text,
                Err(failure) => {
                    failed += 1;
                    let text = format!("Error: {}", failure.message);
                    if first_error.is_none() {
                        first_error = Some((i, failure));
                    }
                    text
                }
            };
            each(&text);
            texts.push(text);
        }
        let list = PyList::new(py, texts)?;
        match (self.errors, first_error) {
            (SubCallErrorMode::Raise, Some((i, failure))) => Err(self.error(
                py,
                format!(
                    "{failed} of {n} {what} failed; the first (prompts[{i}]): {}",
                    failure.message
                ),
                &failure.kind,
                Some(list),
            )),
            _ => Ok(list),
        }
    }

    fn cell_token(&self) -> CancellationToken {
        match self.cell_token.lock() {
            Ok(guard) => guard.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// The endpoint `model` names in `endpoints` (default: the session's sub endpoint).
    fn endpoint(
        &self,
        endpoints: &Endpoints,
        model: Option<String>,
    ) -> Result<Arc<bridge::Endpoint>, SubFailure> {
        let name = model.unwrap_or_else(|| self.default_endpoint.clone());
        endpoints.get(&name).map_err(|e| SubFailure::from(&e))
    }

    /// In a forked child the runtime's threads do not exist: a call would wait forever.
    pub(crate) fn refuse_in_forked_child(&self, py: Python<'_>, function: &str) -> PyResult<()> {
        if std::process::id() == self.pid {
            return Ok(());
        }
        Err(self.error(
            py,
            format!(
                "{function}() cannot run in a forked child process: sub-model calls belong to the REPL's own process. Call it there and hand the results to the workers (llm_query_batched runs many calls in parallel)"
            ),
            "forked_child",
            None,
        ))
    }

    /// What a failed sub-call (or `rlm_query` child) gives the code, per the error mode.
    pub(crate) fn failure(&self, py: Python<'_>, failure: &SubFailure) -> PyResult<String> {
        match self.errors {
            SubCallErrorMode::ReturnString => Ok(format!("Error: {}", failure.message)),
            SubCallErrorMode::Raise => {
                Err(self.error(py, failure.message.clone(), &failure.kind, None))
            }
        }
    }

    /// `failed` answers of sub-calls are about to reach the code as errors. Every sub-call's
    /// answer comes through [`call`](Self::call) or [`batch`](Self::batch), whichever route
    /// it took and whatever failed (the model, a refusal, a name with no endpoint, a replay
    /// with no recorded answer), and every `rlm_query` child's through
    /// [`children_answered`](Self::children_answered), whatever ended it without an answer
    /// (its model, a budget, its time, its blocks failing, a child refused or that could not
    /// start): a failed child is a slot the code gets as an error just as a failed
    /// `llm_query`'s, so it is one more of the same count, not a count of its own. So
    /// `sub_call_errors` is counted here and nowhere else, with one exception: a block whose
    /// worker process ended with it, this count lost, reports its parent's count of the
    /// answers it sent the block as errors instead (`worker::parent`).
    fn counted(&self, failed: usize) {
        let failed = u32::try_from(failed).unwrap_or(u32::MAX);
        self.sub_call_errors.fetch_add(failed, Ordering::Relaxed);
    }

    /// One sub-call, waited for without the GIL.
    fn call(&self, model: Option<String>, prompt: String) -> SubAnswer {
        let options = self.call_options();
        let answer = match &self.route {
            SubCallRoute::Local(endpoints) => {
                self.endpoint(endpoints, model).and_then(|endpoint| {
                    let request = ChatRequest::from_prompt(prompt);
                    runtime::shared()
                        .block_on(endpoint.call(request, &options))
                        .map(|response| response.content)
                        .map_err(|e| SubFailure::from(&e))
                })
            }
            SubCallRoute::Remote(remote) => remote.call(model, prompt, &options.cancel),
        };
        self.counted(usize::from(answer.is_err()));
        answer
    }

    /// Many sub-calls in input order, waited for without the GIL; `Err` when the endpoint
    /// does not exist (each prompt's answer is then that error).
    fn batch(
        &self,
        model: Option<String>,
        prompts: Vec<String>,
    ) -> Result<Vec<SubAnswer>, SubFailure> {
        let options = self.call_options();
        let n = prompts.len();
        let answers = match &self.route {
            SubCallRoute::Local(endpoints) => self.endpoint(endpoints, model).map(|endpoint| {
                let policy = BatchPolicy {
                    concurrency: self.batch_concurrency,
                };
                let requests = prompts.into_iter().map(ChatRequest::from_prompt).collect();
                let outcomes =
                    runtime::shared().block_on(endpoint.batch_recorded(requests, policy, &options));
                outcomes
                    .into_iter()
                    .map(|o| {
                        o.result
                            .map(|r| r.content)
                            .map_err(|e| SubFailure::from(&e))
                    })
                    .collect()
            }),
            SubCallRoute::Remote(remote) => remote.batch(model, prompts, &options.cancel),
        };
        self.counted(failed_answers(answers.as_deref(), n));
        answers
    }

    fn error(
        &self,
        py: Python<'_>,
        message: String,
        kind: &str,
        results: Option<Bound<'_, PyList>>,
    ) -> PyErr {
        match self.error_class.bind(py).call1((message, kind, results)) {
            Ok(value) => PyErr::from_value(value),
            Err(e) => e,
        }
    }
}

pub(crate) fn extract_model(
    model: Option<&Bound<'_, PyAny>>,
    function: &str,
) -> PyResult<Option<String>> {
    match model {
        None => Ok(None),
        Some(m) if m.is_none() => Ok(None),
        Some(m) => match m.cast::<PyString>() {
            Ok(s) => Ok(Some(s.to_cow()?.into_owned())),
            Err(_) => Err(PyTypeError::new_err(format!(
                "{function}() `model` must be an endpoint name (str) or None, not {}",
                m.get_type().name()?
            ))),
        },
    }
}

fn extract_prompt(prompt: &Bound<'_, PyAny>, what: impl FnOnce() -> String) -> PyResult<String> {
    match prompt.cast::<PyString>() {
        Ok(s) => Ok(s.to_cow()?.into_owned()),
        Err(_) => Err(PyTypeError::new_err(format!(
            "{} must be a str, not {}; build the prompt text with an f-string or str.join",
            what(),
            prompt.get_type().name()?
        ))),
    }
}

/// `llm_query(prompt, model=None) -> str`: ask a sub-model one question.
///
/// `model` names an endpoint (default: the session's sub endpoint). A failed call returns
/// "Error: <reason>" (or raises LlmQueryError when the session is configured to).
#[pyclass(frozen, name = "llm_query", module = "rlm")]
#[derive(Debug)]
pub(crate) struct LlmQuery {
    pub(crate) bridge: Arc<SubModelBridge>,
}

#[pymethods]
impl LlmQuery {
    #[pyo3(signature = (prompt, model=None))]
    pub(crate) fn __call__(
        &self,
        py: Python<'_>,
        prompt: &Bound<'_, PyAny>,
        model: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<String> {
        self.bridge.refuse_in_forked_child(py, "llm_query")?;
        let prompt = extract_prompt(prompt, || "llm_query() `prompt`".to_owned())?;
        let model = extract_model(model, "llm_query")?;
        let bridge = &self.bridge;
        bridge.llm_query_calls.fetch_add(1, Ordering::Relaxed);
        let kept = bridge.kept_prompt(&prompt);
        match py.detach(|| bridge.call(model, prompt)) {
            Ok(content) => {
                bridge.record_text(kept, &content);
                Ok(content)
            }
            Err(failure) => {
                bridge.record_text(kept, &format!("Error: {}", failure.message));
                bridge.failure(py, &failure)
            }
        }
    }

    fn __repr__(&self) -> String {
        "<native function llm_query(prompt, model=None) -> str>".to_owned()
    }
}

/// `llm_query_batched(prompts, model=None) -> list[str]`: ask many questions concurrently.
///
/// Answers come back in input order; the fan-out width comes from the session's
/// configuration. A failed slot holds "Error: <reason>" (or, when configured, LlmQueryError is
/// raised after all calls finished, with every slot in its `results`).
#[pyclass(frozen, name = "llm_query_batched", module = "rlm")]
#[derive(Debug)]
pub(crate) struct LlmQueryBatched {
    pub(crate) bridge: Arc<SubModelBridge>,
}

#[pymethods]
impl LlmQueryBatched {
    #[pyo3(signature = (prompts, model=None))]
    pub(crate) fn __call__<'py>(
        &self,
        py: Python<'py>,
        prompts: &Bound<'py, PyAny>,
        model: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyList>> {
        self.bridge
            .refuse_in_forked_child(py, "llm_query_batched")?;
        if prompts.is_instance_of::<PyString>() {
            return Err(PyTypeError::new_err(
                "llm_query_batched() `prompts` must be a list of str, not a single str; use llm_query() for one prompt",
            ));
        }
        let mut texts_in = Vec::new();
        let mut kept = Vec::new();
        for (i, item) in prompts.try_iter()?.enumerate() {
            let text = extract_prompt(&item?, || format!("llm_query_batched() `prompts[{i}]`"))?;
            kept.push(self.bridge.kept_prompt(&text));
            texts_in.push(text);
        }
        let model = extract_model(model, "llm_query_batched")?;
        let bridge = &self.bridge;
        bridge
            .llm_query_batched_calls
            .fetch_add(1, Ordering::Relaxed);
        let n = texts_in.len();
        if n == 0 {
            return Ok(PyList::empty(py));
        }
        let outcomes = match py.detach(|| bridge.batch(model, texts_in)) {
            Ok(outcomes) => outcomes,
            Err(failure) => {
                let reply = format!("Error: {}", failure.message);
                for prompt in kept {
                    bridge.record_text(prompt, &reply);
                }
                return match bridge.errors {
                    SubCallErrorMode::ReturnString => PyList::new(py, vec![reply; n]),
                    SubCallErrorMode::Raise => {
                        Err(bridge.error(py, failure.message, &failure.kind, None))
                    }
                };
            }
        };
        let mut kept = kept.into_iter();
        bridge.batch_answers(py, outcomes, "sub-calls", |reply| {
            if let Some(prompt) = kept.next() {
                bridge.record_text(prompt, reply);
            }
        })
    }

    fn __repr__(&self) -> String {
        "<native function llm_query_batched(prompts, model=None) -> list[str]>".to_owned()
    }
}
