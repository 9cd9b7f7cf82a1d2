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
//! Each line is redacted ([`bridge::secret`]: no secret the process knows reaches the file),
//! written with one `write_all` and flushed, so a run killed at any point leaves complete
//! lines. A transcript that cannot be written stops the run before its next model call
//! ([`LoopErrorKind::StoppedByHook`] with the I/O error): a user who asked for a record gets
//! one or a clear failure.

use std::fmt;
use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use bridge::{ChatRequest, ChatResponse, Message};
use serde::Serialize;
use serde_json::json;

use super::error::LoopError;
use super::hooks::{AgentHook, HookAction};
use super::outcome::LoopOutcome;

/// Writes a run's transcript as JSONL, one flushed line per message.
pub struct TranscriptWriter {
    path: Option<PathBuf>,
    inner: Mutex<Inner>,
}

struct Inner {
    out: Box<dyn Write + Send>,
    lines: u64,
    failure: Option<String>,
}

impl fmt::Debug for TranscriptWriter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = self.lock();
        f.debug_struct("TranscriptWriter")
            .field("path", &self.path)
            .field("lines", &inner.lines)
            .field("failure", &inner.failure)
            .finish_non_exhaustive()
    }
}

impl TranscriptWriter {
    /// Creates (or truncates) the file at `path`.
    pub fn create(path: &Path) -> io::Result<Self> {
        let mut writer = Self::new(File::create(path)?);
        writer.path = Some(path.to_owned());
        Ok(writer)
    }

    /// Writes to `out`; give it an unbuffered writer (a `File`) so each line reaches the OS
    /// in one write.
    pub fn new(out: impl Write + Send + 'static) -> Self {
        Self {
            path: None,
            inner: Mutex::new(Inner {
                out: Box::new(out),
                lines: 0,
                failure: None,
            }),
        }
    }

    /// Lines written so far.
    pub fn lines(&self) -> u64 {
        self.lock().lines
    }

    /// The first write error, if any.
    pub fn failure(&self) -> Option<String> {
        self.lock().failure.clone()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
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
        let written = serde_json::to_string(value)
            .map_err(io::Error::other)
            .and_then(|line| {
                let mut line = bridge::secret::redactor().redact(&line).into_owned();
                line.push('\n');
                inner.out.write_all(line.as_bytes())?;
                inner.out.flush()
            });
        match written {
            Ok(()) => inner.lines += 1,
            Err(e) => {
                let file = match &self.path {
                    Some(path) => format!(" `{}`", path.display()),
                    None => String::new(),
                };
                inner.failure = Some(format!(
                    "Could not write the transcript{file} ({e}); check the disk and the path"
                ));
            }
        }
    }
}

impl AgentHook for TranscriptWriter {
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
