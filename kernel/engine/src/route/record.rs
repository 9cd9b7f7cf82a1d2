//! Decision records and the JSONL decision log.
//!
//! Every routing decision is one [`DecisionRecord`]: who decided, a one-line summary, the
//! rationale, when, and the artifacts it concerns. The router appends it to the `decisions`
//! channel of the state (so checkpoints keep it; the state keeps it as a record, not as a
//! JSON object: see `crate::decisions`) and a [`DecisionLog`] writes it as one
//! redacted JSON line to a file through the shared [`JsonlWriter`], flushed per record, so a
//! crash loses no decision already made (off the tokio worker's other tasks, see
//! `crate::blocking`).

use std::path::{Path, PathBuf};
use std::sync::Mutex;

pub use crate::date::rfc3339;
use crate::decisions::DecisionRecord;
use crate::jsonl::{self, JsonlError, JsonlReadError, JsonlWriter};

/// What the decision log is called in its errors.
const LOG: &str = "decision log";

/// Why the decision log failed.
#[derive(Debug, thiserror::Error)]
pub enum DecisionLogError {
    /// The file could not be opened or read.
    #[error("Decision log `{path}`: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// A record could not be written (the error names the file).
    #[error(transparent)]
    Write(#[from] JsonlError),
    /// A line is not a decision record.
    #[error("Decision log `{path}` line {line} is not a decision record: {source}")]
    Malformed {
        /// The file.
        path: PathBuf,
        /// The 1-based line.
        line: usize,
        /// The error.
        #[source]
        source: serde_json::Error,
    },
}

/// An append-only JSONL file of decision records.
#[derive(Debug)]
pub struct DecisionLog {
    out: Mutex<JsonlWriter>,
}

impl DecisionLog {
    /// Opens `path` for appending (created if missing; a resumed run adds to its log).
    pub fn open(path: impl AsRef<Path>) -> Result<Self, DecisionLogError> {
        Ok(Self {
            out: Mutex::new(JsonlWriter::append(LOG, path)?),
        })
    }

    /// Appends `record` as one line and flushes it (from async code, the worker's other
    /// tasks go on meanwhile).
    pub(crate) fn append(&self, record: &DecisionRecord) -> Result<(), DecisionLogError> {
        let mut out = self
            .out
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Ok(crate::blocking::off_worker(|| out.write(record))?)
    }

    /// Every record of the log at `path`, in order (a torn last line, from a killed run, is
    /// skipped).
    pub fn read(path: impl AsRef<Path>) -> Result<Vec<DecisionRecord>, DecisionLogError> {
        jsonl::read(LOG, path).map_err(|e| match e {
            JsonlReadError::Io { path, source, .. } => DecisionLogError::Io { path, source },
            JsonlReadError::Malformed {
                path, line, source, ..
            } => DecisionLogError::Malformed { path, line, source },
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // In tests an unwrap is an assertion.
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    #[test]
    fn the_log_appends_one_line_per_record_and_reads_them_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("decisions.jsonl");
        let record = |summary: &str| DecisionRecord {
            agent: "router".into(),
            summary: summary.into(),
            rationale: "because".into(),
            timestamp: rfc3339(UNIX_EPOCH),
            related_artifacts: vec!["spec.md".into()],
        };
        DecisionLog::open(&path)
            .unwrap()
            .append(&record("a → b"))
            .unwrap();
        // Reopening appends (a resumed run).
        DecisionLog::open(&path)
            .unwrap()
            .append(&record("b → c"))
            .unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 2);
        let records = DecisionLog::read(&path).unwrap();
        assert_eq!(records, vec![record("a → b"), record("b → c")]);
        std::fs::write(&path, "{\"agent\": 1}\n").unwrap();
        let err = DecisionLog::read(&path).unwrap_err();
        assert!(
            err.to_string().contains("line 1 is not a decision record"),
            "{err}"
        );
    }
}
