//! Where events go: the JSONL event log, a test's memory, a live display.
//!
//! A sink gets every event of an invocation in emission order, one call at a time, and a
//! [`flush`](EventSink::flush) when the run ends. The [`EventLog`] writes one redacted JSON
//! object per line through the shared [`JsonlWriter`], on a thread of its own
//! (`jsonl::Background`) so that no tokio worker waits on the disk: each line is written
//! and flushed as soon as it is handed over, so a run killed at any point leaves a log of
//! everything up to its last step, and the run's end waits until every line is in the file.
//! Events carry no context payloads (contexts live in the kernel's REPL, never in events),
//! so the log stays small.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use super::error::FlowError;
use super::event::Event;
use crate::jsonl::{self, Background, JsonlError, JsonlReadError, JsonlWriter};

/// What the event log is called in its errors.
const LOG: &str = "event log";

/// Receives the events of an invocation, in order.
pub trait EventSink: Send + Sync {
    /// Records `event`; an error stops the run (its state is kept).
    fn emit(&self, event: &Event) -> Result<(), FlowError>;

    /// Makes sure every event recorded so far is where it goes (the run's end calls it).
    fn flush(&self) -> Result<(), FlowError> {
        Ok(())
    }
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

/// The JSONL event log: one event per line, written and flushed per event on a thread of
/// its own.
#[derive(Debug)]
pub struct EventLog {
    out: Background,
}

impl EventLog {
    /// Creates (or truncates) the log at `path`.
    pub fn create(path: impl AsRef<Path>) -> Result<Self, FlowError> {
        let out = JsonlWriter::create(LOG, path).map_err(sink_error)?;
        Self::start(out)
    }

    /// Writes to `file`, which the caller opened (for appending, when a resumed run continues
    /// its log); `path` names it in errors.
    pub fn from_file(file: File, path: impl Into<PathBuf>) -> Result<Self, FlowError> {
        Self::start(JsonlWriter::from_file(LOG, file, path))
    }

    fn start(out: JsonlWriter) -> Result<Self, FlowError> {
        Ok(Self {
            out: Background::spawn(out).map_err(sink_error)?,
        })
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
        self.out.write(event).map_err(sink_error)
    }

    fn flush(&self) -> Result<(), FlowError> {
        self.out.flush().map_err(sink_error)
    }
}

fn sink_error(e: JsonlError) -> FlowError {
    FlowError::Sink(e.to_string())
}
