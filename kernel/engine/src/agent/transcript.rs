//! The JSONL transcript of a run: a hook that writes each message as it joins the
//! transcript, and how the run ended.
//!
//! Lines, each one JSON object with a `type`:
//!
//! - `message`: `iteration` (0 for the caller's messages) and the `message` as the bridge
//!   serialises it (`role`, `content`, `tool_calls`, `tool_call_id`);
//! - `result`: the `answer`, the `termination`, the `actions` and the `metrics`;
//! - `error`: the error `kind` ([`LoopErrorKind::name`]), its `message`, the `actions` and
//!   the `metrics`.
//!
//! Lines go through the shared [`JsonlWriter`]: each is redacted ([`bridge::secret`]: no
//! secret the process knows reaches the file), written with one `write_all` and flushed, so a
//! run killed at any point leaves complete lines. A transcript that cannot be written stops the run before its next model call
//! ([`LoopErrorKind::StoppedByHook`] with the I/O error): a user who asked for a record gets
//! one or a clear failure.

use std::fmt;
use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use bridge::{ChatRequest, ChatResponse, Message};
use serde::Serialize;
use serde_json::json;

use super::error::LoopError;
use super::hooks::AgentHook;
use super::outcome::LoopOutcome;
use crate::hook::HookAction;
use crate::jsonl::{JsonlError, JsonlWriter};

/// What the transcript is called in its errors.
const LOG: &str = "transcript";

/// Writes a run's transcript as JSONL, one flushed line per message.
pub struct TranscriptWriter<W: Write + Send = File> {
    inner: Mutex<Inner<W>>,
}

struct Inner<W: Write> {
    out: JsonlWriter<W>,
    failure: Option<String>,
}

impl<W: Write + Send> fmt::Debug for TranscriptWriter<W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = self.lock();
        f.debug_struct("TranscriptWriter")
            .field("out", &inner.out)
            .field("failure", &inner.failure)
            .finish()
    }
}

impl TranscriptWriter<File> {
    /// Creates (or truncates) the file at `path`.
    pub fn create(path: &Path) -> Result<Self, JsonlError> {
        Ok(Self::from_writer(JsonlWriter::create(LOG, path)?))
    }
}

impl<W: Write + Send> TranscriptWriter<W> {
    /// Writes to `out`; give it an unbuffered writer (a `File`) so each line reaches the OS
    /// in one write.
    pub fn new(out: W) -> Self {
        Self::from_writer(JsonlWriter::new(LOG, out))
    }

    fn from_writer(out: JsonlWriter<W>) -> Self {
        Self {
            inner: Mutex::new(Inner { out, failure: None }),
        }
    }

    /// Lines written so far.
    pub fn lines(&self) -> u64 {
        self.lock().out.lines()
    }

    /// The first write error, if any.
    pub(crate) fn failure(&self) -> Option<String> {
        self.lock().failure.clone()
    }

    fn lock(&self) -> MutexGuard<'_, Inner<W>> {
        // Every write either completes a line or records the failure, so a poisoned lock
        // still holds a consistent writer.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn write_line(&self, value: &impl Serialize) {
        let mut inner = self.lock();
        if inner.failure.is_some() {
            return;
        }
        if let Err(e) = inner.out.write(value) {
            inner.failure = Some(e.to_string());
        }
    }
}

impl<W: Write + Send> AgentHook for TranscriptWriter<W> {
    fn before_model_call(
        &self,
        _iteration: u32,
        _request: &mut ChatRequest,
    ) -> HookAction<ChatResponse> {
        match self.failure() {
            Some(message) => HookAction::Stop(message),
            None => HookAction::Continue,
        }
    }

    fn on_message(&self, iteration: u32, message: &Message) {
        self.write_line(&json!({"type": "message", "iteration": iteration, "message": message}));
    }

    fn on_finish(&self, result: Result<&LoopOutcome, &LoopError>) {
        let line = match result {
            Ok(outcome) => json!({
                "type": "result",
                "answer": outcome.answer,
                "termination": outcome.termination,
                "actions": outcome.run.actions,
                "metrics": outcome.run.metrics,
            }),
            Err(error) => json!({
                "type": "error",
                "kind": error.kind().name(),
                "message": error.to_string(),
                "actions": error.run().actions,
                "metrics": error.run().metrics,
            }),
        };
        self.write_line(&line);
    }
}
