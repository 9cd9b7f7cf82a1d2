//! Decision records and the JSONL decision log.
//!
//! Every routing decision is one [`DecisionRecord`]: who decided, a one-line summary, the
//! rationale, when, and the artifacts it concerns. The router appends it to the `decisions`
//! channel of the state (so checkpoints keep it) and a [`DecisionLog`] writes it as one
//! redacted JSON line to a file through the shared [`JsonlWriter`], flushed per record, so a
//! crash loses no decision already made.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::jsonl::{JsonlError, JsonlWriter};

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
            out: Mutex::new(JsonlWriter::append("decision log", path)?),
        })
    }

    /// Appends `record` as one line and flushes it.
    pub fn append(&self, record: &DecisionRecord) -> Result<(), DecisionLogError> {
        Ok(self
            .out
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .write(record)?)
    }

    /// Every record of the log at `path`, in order.
    pub fn read(path: impl AsRef<Path>) -> Result<Vec<DecisionRecord>, DecisionLogError> {
        let path = path.as_ref();
        let io = |source| DecisionLogError::Io {
            path: path.to_path_buf(),
            source,
        };
        let reader = BufReader::new(File::open(path).map_err(io)?);
        let mut records = Vec::new();
        for (i, line) in reader.lines().enumerate() {
            let line = line.map_err(io)?;
            if line.trim().is_empty() {
                continue;
            }
            let record =
                serde_json::from_str(&line).map_err(|source| DecisionLogError::Malformed {
                    path: path.to_path_buf(),
                    line: i + 1,
                    source,
                })?;
            records.push(record);
        }
        Ok(records)
    }
}

/// `time` as RFC 3339 in UTC with milliseconds (`2026-11-26T13:05:00.250Z`).
pub fn rfc3339(time: SystemTime) -> String {
    let ms = time.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis());
    let secs = (ms / 1000) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3_600,
        rem % 3_600 / 60,
        rem % 60,
        ms % 1000
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // In tests an unwrap is an assertion.
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn timestamps_are_rfc3339_utc() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let t = UNIX_EPOCH + Duration::from_millis(1_795_698_300_250);
        assert_eq!(rfc3339(t), "2026-11-26T13:05:00.250Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(rfc3339(leap), "2000-02-29T00:00:00.000Z");
    }

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
