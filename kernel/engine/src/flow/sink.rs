//! Where events go: the JSONL event log, a test's memory, a live display.
//!
//! A sink gets every event of an invocation in emission order, one call at a time. The
//! [`EventLog`] writes one redacted JSON object per line through the shared [`JsonlWriter`]
//! and flushes after each, so a run killed at any point leaves a log of everything up to its
//! last step. Events carry no context
//! payloads (contexts live in the kernel's REPL, never in events), so the log stays small.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use super::error::FlowError;
use super::event::Event;
use crate::jsonl::{self, JsonlReadError, JsonlWriter};

/// What the event log is called in its errors.
const LOG: &str = "event log";

/// Receives the events of an invocation, in order.
pub trait EventSink: Send + Sync {
    /// Records `event`; an error stops the run (its state is kept).
    fn emit(&self, event: &Event) -> Result<(), FlowError>;
}

/// Keeps every event in memory (tests, the CLI's summary).
#[derive(Debug, Clone, Default)]
pub struct MemorySink {
    events: Arc<Mutex<Vec<Event>>>,
}

impl MemorySink {
    /// An empty sink.
    pub fn new() -> Self {
        Self::default()
    }

    /// A copy of the events so far.
    pub fn events(&self) -> Vec<Event> {
        self.events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl EventSink for MemorySink {
    fn emit(&self, event: &Event) -> Result<(), FlowError> {
        self.events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(event.clone());
        Ok(())
    }
}

/// The JSONL event log: one event per line, flushed per event.
#[derive(Debug)]
pub struct EventLog {
    path: PathBuf,
    out: Mutex<JsonlWriter>,
}

impl EventLog {
    /// Creates (or truncates) the log at `path`.
    pub fn create(path: impl AsRef<Path>) -> Result<Self, FlowError> {
        let path = path.as_ref().to_path_buf();
        let out = JsonlWriter::create(LOG, &path).map_err(|e| FlowError::Sink(e.to_string()))?;
        Ok(Self {
            path,
            out: Mutex::new(out),
        })
    }

    /// Writes to `file`, which the caller opened (for appending, when a resumed run continues
    /// its log); `path` names it in errors.
    pub fn from_file(file: File, path: impl Into<PathBuf>) -> Self {
        let path = path.into();
        Self {
            out: Mutex::new(JsonlWriter::from_file(LOG, file, path.clone())),
            path,
        }
    }

    /// Where it writes.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the events of the log at `path` (a torn last line, from a killed run, is
    /// skipped).
    pub fn read(path: impl AsRef<Path>) -> Result<Vec<Event>, FlowError> {
        jsonl::read(LOG, path).map_err(|e| {
            FlowError::Sink(match e {
                JsonlReadError::Malformed {
                    path, line, source, ..
                } => format!(
                    "Line {line} of the event log `{}` is not an event: {source}",
                    path.display()
                ),
                io => io.to_string(),
            })
        })
    }
}

impl EventSink for EventLog {
    fn emit(&self, event: &Event) -> Result<(), FlowError> {
        self.out
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .write(event)
            .map_err(|e| FlowError::Sink(e.to_string()))
    }
}
