//! Redacted JSONL logs: the one writer under the agent transcript, the RLM trajectory, the
//! workflow event log and the decision log.
//!
//! A [`JsonlWriter`] serialises each value to one line, replaces every secret the process
//! knows ([`bridge::secret`]) with `[redacted]`, and hands the line to the OS in one
//! `write_all` followed by a flush. Nothing is buffered in between, so a process killed at
//! any point leaves a file whose complete lines are all valid JSON, and writers appending to
//! one file (`JsonlWriter::append`) never interleave inside a line. Every error names the
//! log and its file. A `Background` writer does the same on a thread of its own, for logs
//! written from async code. [`read`] reads such a log back, passing over a torn last line (a
//! writer killed mid-line) and naming the number of any other line that does not parse.
//!
//! ```
//! use engine::jsonl::JsonlWriter;
//! use serde_json::json;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = tempfile::tempdir()?;
//! let path = dir.path().join("events.jsonl");
//! let mut log = JsonlWriter::create("event log", &path)?;
//! log.write(&json!({"type": "start"}))?;
//! assert_eq!(std::fs::read_to_string(&path)?, "{\"type\":\"start\"}\n");
//! # Ok(()) }
//! ```

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, mpsc};

use serde::Serialize;
use serde::de::DeserializeOwned;

/// Why a JSONL log could not be opened or written.
#[derive(Debug, thiserror::Error)]
pub enum JsonlError {
    /// The file could not be created or opened.
    #[error(
        "Could not open the {log} `{}`: {source}; check that its folder exists and is writable",
        path.display()
    )]
    Open {
        /// What the log is (`trajectory`, `event log`, ...).
        log: &'static str,
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// A line could not be written or flushed.
    #[error(
        "Could not write the {log}{} ({source}); check the disk and the path",
        InFile(path)
    )]
    Write {
        /// What the log is.
        log: &'static str,
        /// The file, when the writer was opened from one.
        path: Option<PathBuf>,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// A value could not be serialised as JSON (nothing was written).
    #[error(
        "Could not write a line of the {log}{} as JSON: {source}",
        InFile(path)
    )]
    Encode {
        /// What the log is.
        log: &'static str,
        /// The file, when the writer was opened from one.
        path: Option<PathBuf>,
        /// The error.
        #[source]
        source: serde_json::Error,
    },
}

/// Why a JSONL log could not be read back.
#[derive(Debug, thiserror::Error)]
pub enum JsonlReadError {
    /// The file could not be read.
    #[error("Could not read the {log} `{}`: {source}", path.display())]
    Io {
        /// What the log is.
        log: &'static str,
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// A line (not the torn last one) is not what the log holds.
    #[error("Line {line} of the {log} `{}` does not parse: {source}", path.display())]
    Malformed {
        /// What the log is.
        log: &'static str,
        /// The file.
        path: PathBuf,
        /// The 1-based line.
        line: usize,
        /// The error.
        #[source]
        source: serde_json::Error,
    },
}

/// Every line of the log at `path` as a `T`, in order; `log` names it in errors. Blank lines
/// are passed over, and so is a last line without its newline that does not parse (torn by
/// a killed writer).
pub fn read<T: DeserializeOwned>(
    log: &'static str,
    path: impl AsRef<Path>,
) -> Result<Vec<T>, JsonlReadError> {
    let path = path.as_ref();
    let text = std::fs::read_to_string(path).map_err(|source| JsonlReadError::Io {
        log,
        path: path.to_owned(),
        source,
    })?;
    let complete = text.ends_with('\n');
    let count = text.lines().count();
    let mut values = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str(line) {
            Ok(value) => values.push(value),
            Err(_) if i + 1 == count && !complete => break,
            Err(source) => {
                return Err(JsonlReadError::Malformed {
                    log,
                    path: path.to_owned(),
                    line: i + 1,
                    source,
                });
            }
        }
    }
    Ok(values)
}

/// ` `path`` when there is a path, nothing otherwise.
struct InFile<'a>(&'a Option<PathBuf>);

impl fmt::Display for InFile<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(path) => write!(f, " `{}`", path.display()),
            None => Ok(()),
        }
    }
}

/// Writes one redacted JSON value per line, each flushed as it is written.
pub struct JsonlWriter<W: Write = File> {
    log: &'static str,
    path: Option<PathBuf>,
    out: W,
    lines: u64,
}

impl<W: Write> fmt::Debug for JsonlWriter<W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JsonlWriter")
            .field("log", &self.log)
            .field("path", &self.path)
            .field("lines", &self.lines)
            .finish_non_exhaustive()
    }
}

impl JsonlWriter<File> {
    /// Creates (or truncates) the file at `path`; `log` names it in errors (`trajectory`).
    pub fn create(log: &'static str, path: impl AsRef<Path>) -> Result<Self, JsonlError> {
        Self::open(
            log,
            path.as_ref(),
            OpenOptions::new().write(true).create(true).truncate(true),
        )
    }

    /// Opens the file at `path` for appending, creating it if missing (a resumed run adds
    /// to its log).
    pub(crate) fn append(log: &'static str, path: impl AsRef<Path>) -> Result<Self, JsonlError> {
        Self::open(
            log,
            path.as_ref(),
            OpenOptions::new().create(true).append(true),
        )
    }

    /// Writes to `file`, which the caller opened (the `rlm` binary opens its outputs through
    /// its output guard); `path` names it in errors.
    pub fn from_file(log: &'static str, file: File, path: impl Into<PathBuf>) -> Self {
        let mut writer = Self::new(log, file);
        writer.path = Some(path.into());
        writer
    }

    fn open(log: &'static str, path: &Path, options: &OpenOptions) -> Result<Self, JsonlError> {
        let file = options.open(path).map_err(|source| JsonlError::Open {
            log,
            path: path.to_owned(),
            source,
        })?;
        Ok(Self::from_file(log, file, path))
    }
}

impl<W: Write> JsonlWriter<W> {
    /// Writes to `out`; give it an unbuffered writer (a `File`) so each line reaches the OS
    /// in one write.
    pub fn new(log: &'static str, out: W) -> Self {
        Self {
            log,
            path: None,
            out,
            lines: 0,
        }
    }

    /// Lines written so far.
    pub fn lines(&self) -> u64 {
        self.lines
    }

    /// Writes `value` as one redacted line and flushes it.
    pub fn write(&mut self, value: &impl Serialize) -> Result<(), JsonlError> {
        let line = encode(self.log, self.path.as_ref(), value)?;
        self.write_line(&line)
    }

    /// Writes `line` (encoded, redacted, ending in a newline) in one write and flushes it.
    fn write_line(&mut self, line: &str) -> Result<(), JsonlError> {
        self.out
            .write_all(line.as_bytes())
            .and_then(|()| self.out.flush())
            .map_err(|source| JsonlError::Write {
                log: self.log,
                path: self.path.clone(),
                source,
            })?;
        self.lines += 1;
        Ok(())
    }
}

/// `value` as one redacted JSON line, newline included.
fn encode(
    log: &'static str,
    path: Option<&PathBuf>,
    value: &impl Serialize,
) -> Result<String, JsonlError> {
    let line = serde_json::to_string(value).map_err(|source| JsonlError::Encode {
        log,
        path: path.cloned(),
        source,
    })?;
    let mut line = bridge::secret::redactor().redact(&line).into_owned();
    line.push('\n');
    Ok(line)
}

/// A [`JsonlWriter`] on a thread of its own, for logs written from async code (the workflow
/// event log, the decision log): a tokio worker never waits on the disk.
///
/// [`write`](Self::write) encodes and redacts the line on the caller's thread (an encoding
/// error is the caller's at once) and hands it over; the thread writes and flushes each line
/// in the order handed over, one `write_all` a line as [`JsonlWriter`] does. The first
/// write error is kept: the next [`write`](Self::write) and [`flush`](Self::flush) return it
/// and nothing more is written. [`flush`](Self::flush) waits until every line handed over is
/// in the file; dropping the writer does too.
pub(crate) struct Background {
    log: &'static str,
    path: Option<PathBuf>,
    /// `None` only while dropping.
    lines: Option<mpsc::Sender<Message>>,
    failed: Arc<Mutex<Option<(io::ErrorKind, String)>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

enum Message {
    Line(String),
    /// Answered once every earlier line is written.
    Flush(mpsc::SyncSender<()>),
}

impl fmt::Debug for Background {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Background")
            .field("log", &self.log)
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl Background {
    /// Starts the thread that writes to `writer`.
    pub(crate) fn spawn(mut writer: JsonlWriter<File>) -> Result<Self, JsonlError> {
        let (log, path) = (writer.log, writer.path.clone());
        let (tx, rx) = mpsc::channel::<Message>();
        let failed = Arc::new(Mutex::new(None));
        let kept = Arc::clone(&failed);
        let thread = std::thread::Builder::new()
            .name("rlm-log-writer".to_owned())
            .spawn(move || {
                for message in rx {
                    match message {
                        Message::Line(line) => {
                            let mut failed = lock(&kept);
                            if failed.is_none()
                                && let Err(JsonlError::Write { source, .. }) =
                                    writer.write_line(&line)
                            {
                                *failed = Some((source.kind(), source.to_string()));
                            }
                        }
                        Message::Flush(done) => {
                            let _ = done.send(());
                        }
                    }
                }
            })
            .map_err(|source| JsonlError::Write {
                log,
                path: path.clone(),
                source,
            })?;
        Ok(Self {
            log,
            path,
            lines: Some(tx),
            failed,
            thread: Some(thread),
        })
    }

    /// Hands `value` over as one redacted line; an error is this line's encoding or an
    /// earlier line's write.
    pub(crate) fn write(&self, value: &impl Serialize) -> Result<(), JsonlError> {
        self.check()?;
        let line = encode(self.log, self.path.as_ref(), value)?;
        let sent = (self.lines.as_ref()).is_some_and(|tx| tx.send(Message::Line(line)).is_ok());
        if sent { Ok(()) } else { Err(self.gone()) }
    }

    /// Waits until every line handed over so far is written; the first write error, if any.
    pub(crate) fn flush(&self) -> Result<(), JsonlError> {
        let (done, wait) = mpsc::sync_channel(1);
        let sent = (self.lines.as_ref()).is_some_and(|tx| tx.send(Message::Flush(done)).is_ok());
        if !sent || wait.recv().is_err() {
            return Err(self.gone());
        }
        self.check()
    }

    fn check(&self) -> Result<(), JsonlError> {
        match &*lock(&self.failed) {
            Some((kind, message)) => Err(JsonlError::Write {
                log: self.log,
                path: self.path.clone(),
                source: io::Error::new(*kind, message.clone()),
            }),
            None => Ok(()),
        }
    }

    /// The writing thread is gone (it cannot panic; only a process in trouble gets here).
    fn gone(&self) -> JsonlError {
        JsonlError::Write {
            log: self.log,
            path: self.path.clone(),
            source: io::Error::other("the thread writing it has stopped"),
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        self.lines.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // In tests an unwrap is an assertion.
mod tests {
    use std::sync::{Arc, Mutex};

    use serde_json::{Value, json};

    use super::*;

    /// Records each call it gets, so a test sees how lines reach the OS.
    #[derive(Clone, Default)]
    struct Calls(Arc<Mutex<Vec<String>>>);

    impl Write for Calls {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let text = String::from_utf8_lossy(buf).into_owned();
            self.0.lock().unwrap().push(format!("write {text:?}"));
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            self.0.lock().unwrap().push("flush".into());
            Ok(())
        }
    }

    #[test]
    fn each_line_is_one_write_then_a_flush() {
        let calls = Calls::default();
        let mut writer = JsonlWriter::new("test log", calls.clone());
        writer.write(&json!({"a": 1})).unwrap();
        writer.write(&json!("two")).unwrap();
        assert_eq!(writer.lines(), 2);
        assert_eq!(
            *calls.0.lock().unwrap(),
            [
                r#"write "{\"a\":1}\n""#,
                "flush",
                r#"write "\"two\"\n""#,
                "flush"
            ]
        );
    }

    #[test]
    fn a_crash_keeps_every_line_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.jsonl");
        let mut writer = JsonlWriter::create("test log", &path).unwrap();
        for i in 0..3 {
            writer.write(&json!({"step": i})).unwrap();
        }
        // No drop, no final flush: what is on disk is what a killed process leaves.
        std::mem::forget(writer);
        let text = std::fs::read_to_string(&path).unwrap();
        let steps: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap()["step"].clone())
            .collect();
        assert_eq!(steps, [json!(0), json!(1), json!(2)]);
    }

    #[test]
    fn no_line_carries_a_known_secret() {
        let secret = "jsonl-secret-\"quoted\"-4c1e9a";
        bridge::secret::register(&bridge::Secret::new(secret));
        let calls = Calls::default();
        let mut writer = JsonlWriter::new("test log", calls.clone());
        writer
            .write(&json!({"prompt": format!("my key is {secret}")}))
            .unwrap();
        let written = calls.0.lock().unwrap().join("");
        assert!(!written.contains("4c1e9a"), "{written}");
        assert!(written.contains(r#"my key is [redacted]"#), "{written}");
    }

    #[test]
    fn create_and_append_name_the_file_they_cannot_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing").join("log.jsonl");
        let expected = format!(
            "Could not open the event log `{}`: No such file or directory (os error 2); check \
             that its folder exists and is writable",
            path.display()
        );
        let err = JsonlWriter::create("event log", &path).unwrap_err();
        assert_eq!(err.to_string(), expected);
        let err = JsonlWriter::append("event log", &path).unwrap_err();
        assert_eq!(err.to_string(), expected);
    }

    #[test]
    fn a_failed_write_names_the_file() {
        // Every write to `/dev/full` fails with "no space left on device".
        let mut writer = JsonlWriter::append("decision log", "/dev/full").unwrap();
        let err = writer.write(&json!({"a": 1})).unwrap_err();
        assert_eq!(
            err.to_string(),
            "Could not write the decision log `/dev/full` (No space left on device (os error \
             28)); check the disk and the path"
        );
        assert_eq!(writer.lines(), 0);
    }

    #[test]
    fn a_background_writer_writes_every_line_in_order_and_flush_waits_for_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.jsonl");
        let log = Background::spawn(JsonlWriter::create("test log", &path).unwrap()).unwrap();
        for i in 0..500 {
            log.write(&json!({"n": i})).unwrap();
        }
        log.flush().unwrap();
        let lines: Vec<Value> = read("test log", &path).unwrap();
        assert_eq!(lines, (0..500).map(|i| json!({"n": i})).collect::<Vec<_>>());
        // Dropping it writes what is still queued.
        log.write(&json!("last")).unwrap();
        drop(log);
        let lines: Vec<Value> = read("test log", &path).unwrap();
        assert_eq!(lines.last(), Some(&json!("last")));
        assert_eq!(lines.len(), 501);
    }

    #[test]
    fn a_background_writer_reports_a_failed_write_to_the_next_call() {
        let log =
            Background::spawn(JsonlWriter::append("event log", "/dev/full").unwrap()).unwrap();
        log.write(&json!({"a": 1})).unwrap();
        let expected = "Could not write the event log `/dev/full` (No space left on device (os \
                        error 28)); check the disk and the path";
        assert_eq!(log.flush().unwrap_err().to_string(), expected);
        assert_eq!(log.write(&json!(2)).unwrap_err().to_string(), expected);
        // An encoding error is the caller's at once.
        let dir = tempfile::tempdir().unwrap();
        let log = JsonlWriter::create("test log", dir.path().join("log.jsonl")).unwrap();
        let log = Background::spawn(log).unwrap();
        let map: std::collections::HashMap<(u8, u8), u8> = [((1, 2), 3)].into();
        assert!(matches!(log.write(&map), Err(JsonlError::Encode { .. })));
        log.flush().unwrap();
    }

    #[test]
    fn append_keeps_what_the_file_holds() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.jsonl");
        JsonlWriter::create("test log", &path)
            .unwrap()
            .write(&1)
            .unwrap();
        JsonlWriter::append("test log", &path)
            .unwrap()
            .write(&2)
            .unwrap();
        JsonlWriter::append("test log", &path)
            .unwrap()
            .write(&3)
            .unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "1\n2\n3\n");
        JsonlWriter::create("test log", &path)
            .unwrap()
            .write(&4)
            .unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "4\n");
    }

    #[test]
    fn a_value_that_is_not_json_writes_nothing() {
        let calls = Calls::default();
        let mut writer = JsonlWriter::new("test log", calls.clone());
        let map: std::collections::HashMap<(u8, u8), u8> = [((1, 2), 3)].into();
        let err = writer.write(&map).unwrap_err();
        assert!(matches!(err, JsonlError::Encode { .. }));
        assert!(
            err.to_string()
                .starts_with("Could not write a line of the test log as JSON: "),
            "{err}"
        );
        assert!(calls.0.lock().unwrap().is_empty());
    }

    #[test]
    fn read_gives_back_what_was_written_and_passes_over_a_torn_last_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.jsonl");
        let mut writer = JsonlWriter::create("test log", &path).unwrap();
        writer.write(&json!({"n": 1})).unwrap();
        writer.write(&json!({"n": 2})).unwrap();
        let whole: Vec<Value> = read("test log", &path).unwrap();
        assert_eq!(whole, [json!({"n": 1}), json!({"n": 2})]);
        // A blank line, then a line cut short by a killed writer.
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str("\n{\"n\": 3, \"te");
        std::fs::write(&path, &text).unwrap();
        let torn: Vec<Value> = read("test log", &path).unwrap();
        assert_eq!(torn, whole);
    }

    #[test]
    fn read_names_the_file_and_the_line_that_does_not_parse() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.jsonl");
        std::fs::write(&path, "{\"n\": 1}\n\nnot json\n{\"n\": 2}\n").unwrap();
        let err = read::<Value>("test log", &path).unwrap_err();
        assert!(
            matches!(err, JsonlReadError::Malformed { line: 3, .. }),
            "{err:?}"
        );
        assert!(
            err.to_string().starts_with(&format!(
                "Line 3 of the test log `{}` does not parse: ",
                path.display()
            )),
            "{err}"
        );
        // A last line with its newline is complete, so it must parse.
        std::fs::write(&path, "{\"n\": 1}\nnot json\n").unwrap();
        let err = read::<Value>("test log", &path).unwrap_err();
        assert!(
            matches!(err, JsonlReadError::Malformed { line: 2, .. }),
            "{err:?}"
        );
        let missing = dir.path().join("missing.jsonl");
        let err = read::<Value>("test log", &missing).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "Could not read the test log `{}`: No such file or directory (os error 2)",
                missing.display()
            )
        );
    }
}
