//! The trajectory: a JSONL log of a run that a person or a program can replay.
//!
//! Lines, each one JSON object with a `type`:
//!
//! - `header`: format version, start time, the query, the loop configuration, the endpoints
//!   (name, provider, model, base URL: never keys or headers), the contexts' metadata and the
//!   system prompt;
//! - `reply`: the root model's reply, as soon as it arrived (`iteration`, `reply`);
//! - `block`: a block's code just before it runs (`iteration`, `index`, `code`), so that after
//!   a crash that no handler can report (`SIGKILL` from the OOM killer) the last line on disk
//!   still names the block that was running;
//! - `iteration`: one per iteration, the [`IterationRecord`] (the reply, blocks with outputs cut
//!   to the feedback limit, sub-call records, timings, metadata);
//! - `error`: a failed step (root model unreachable, budget spent, ...);
//! - `result`: the answer (head and tail of an answer over 100 000 characters, with its full
//!   length in `answer_chars`), the termination reason and the metrics.
//!
//! The context itself is never written, block outputs are capped, and each sub-call's prompt
//! and reply are kept to their head and tail (`SessionConfig::sub_call_text_chars`, 600
//! characters each by default, `0` for none), so the size of a trajectory does not grow with
//! the size of the context: an iteration line is at most about the reply, plus per block
//! twice the feedback limit of output, plus per sub-call twice the text limit and its
//! metadata. Lines go through the shared [`JsonlWriter`]: each is redacted as written (no
//! secret the process knows, [`bridge::secret`], reaches the file, wherever it came from),
//! written with one `write_all` and flushed at once, so a run killed at any point leaves a
//! file whose complete lines are valid JSON. Give [`TrajectoryWriter::new`] an unbuffered
//! writer (a `File`) for that.
//!
//! A trajectory that cannot be written stops the run at the next iteration (`stopped_by_hook`
//! with the I/O error): a user who asked for a record gets one or a clear failure.

use std::borrow::Cow;
use std::fmt;
use std::fs::File;
use std::io::Write;
use std::path::Path;

use engine::jsonl::{JsonlError, JsonlWriter};
use serde::Serialize;

use super::blocks::CodeBlock;
use super::feedback::truncate_middle;
use super::final_answer::FinalKind;
use super::hooks::{Hook, HookAction, ModelCall, RunError, RunInfo};
use super::metadata::RlmResult;
use super::metadata::{IterationRecord, SessionMetrics, TerminationReason};
use crate::repl::ExecutionResult;
use bridge::Message;

/// The format version in the header line.
pub const TRAJECTORY_VERSION: u32 = 1;

/// Characters of the answer written in the `result` line (head and tail of a longer one; the
/// result itself always carries the whole answer).
const ANSWER_LIMIT: usize = 100_000;

/// What the trajectory is called in its errors.
const LOG: &str = "trajectory";

/// Writes a run's trajectory as JSONL, one flushed line per event.
pub struct TrajectoryWriter<W: Write + Send> {
    out: JsonlWriter<W>,
    failure: Option<String>,
}

impl<W: Write + Send> fmt::Debug for TrajectoryWriter<W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TrajectoryWriter")
            .field("out", &self.out)
            .field("failure", &self.failure)
            .finish()
    }
}

impl TrajectoryWriter<File> {
    /// Creates (or truncates) the file at `path`.
    pub fn create(path: &Path) -> Result<Self, JsonlError> {
        Ok(Self::from_writer(JsonlWriter::create(LOG, path)?))
    }

    /// Writes to `file`, which the caller opened (the `rlm` binary opens its outputs through
    /// its output guard); `path` names it in errors.
    pub fn from_file(file: File, path: &Path) -> Self {
        Self::from_writer(JsonlWriter::from_file(LOG, file, path))
    }
}

impl<W: Write + Send> TrajectoryWriter<W> {
    /// Writes to `out`; use an unbuffered writer so each line reaches the OS in one write.
    pub fn new(out: W) -> Self {
        Self::from_writer(JsonlWriter::new(LOG, out))
    }

    fn from_writer(out: JsonlWriter<W>) -> Self {
        Self { out, failure: None }
    }

    /// Lines written so far.
    pub fn lines(&self) -> u64 {
        self.out.lines()
    }

    /// The first write error, if any.
    pub fn failure(&self) -> Option<&str> {
        self.failure.as_deref()
    }

    fn write_line(&mut self, value: &impl Serialize) {
        if self.failure.is_some() {
            return;
        }
        if let Err(e) = self.out.write(value) {
            let message = failure_message(&e);
            tracing::warn!("{message}");
            self.failure = Some(message);
        }
    }

    fn stop_if_failed(&self) -> HookAction<String> {
        match &self.failure {
            Some(message) => HookAction::Stop(message.clone()),
            None => HookAction::Continue,
        }
    }
}

/// The trajectory's own wording for a failed write (`Could not write the trajectory: <why>`,
/// the file named when there is one), which runs and scripts already report; other failures
/// keep the shared writer's message.
fn failure_message(error: &JsonlError) -> String {
    match error {
        JsonlError::Write { path, source, .. } => match path {
            Some(path) => format!(
                "Could not write the trajectory `{}`: {source}",
                path.display()
            ),
            None => format!("Could not write the trajectory: {source}"),
        },
        other => other.to_string(),
    }
}

#[derive(Serialize)]
struct Header<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    version: u32,
    #[serde(flatten)]
    run: &'a RunInfo<'a>,
}

#[derive(Serialize)]
struct Line<'a, T: Serialize> {
    #[serde(rename = "type")]
    kind: &'static str,
    #[serde(flatten)]
    body: &'a T,
}

#[derive(Serialize)]
struct ReplyLine<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    iteration: u32,
    reply: &'a str,
}

#[derive(Serialize)]
struct BlockLine<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    iteration: u32,
    index: usize,
    code: &'a str,
}

#[derive(Serialize)]
struct Closing<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    answer: Option<Cow<'a, str>>,
    answer_chars: Option<usize>,
    answer_kind: Option<FinalKind>,
    termination_reason: TerminationReason,
    error: Option<&'a str>,
    metrics: &'a SessionMetrics,
}

impl<W: Write + Send> Hook for TrajectoryWriter<W> {
    fn before_run(&mut self, run: &RunInfo<'_>) -> HookAction<String> {
        self.write_line(&Header {
            kind: "header",
            version: TRAJECTORY_VERSION,
            run,
        });
        self.stop_if_failed()
    }

    fn before_iteration(&mut self, _iteration: u32, _messages: &[Message]) -> HookAction<String> {
        self.stop_if_failed()
    }

    fn after_model_call(&mut self, call: &mut ModelCall) {
        self.write_line(&ReplyLine {
            kind: "reply",
            iteration: call.iteration,
            reply: &call.reply,
        });
    }

    fn before_block(
        &mut self,
        iteration: u32,
        block: &mut CodeBlock,
    ) -> HookAction<ExecutionResult> {
        self.write_line(&BlockLine {
            kind: "block",
            iteration,
            index: block.index,
            code: &block.code,
        });
        HookAction::Continue
    }

    fn after_iteration(&mut self, record: &mut IterationRecord) {
        self.write_line(&Line {
            kind: "iteration",
            body: record,
        });
    }

    fn on_error(&mut self, error: &RunError) {
        self.write_line(&Line {
            kind: "error",
            body: error,
        });
    }

    fn after_run(&mut self, result: &mut RlmResult) {
        self.write_line(&Closing {
            kind: "result",
            answer: result
                .answer
                .as_deref()
                .map(|a| truncate_middle(a, ANSWER_LIMIT)),
            answer_chars: result.answer.as_deref().map(|a| a.chars().count()),
            answer_kind: result.answer_kind,
            termination_reason: result.termination_reason,
            error: result.error.as_deref(),
            metrics: &result.metrics,
        });
    }
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::rlm::config::RlmConfig;
    use crate::rlm::metadata::{ExecutionMetadata, IterationMetadata};

    /// A writer tests can read back after the hook took ownership.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().expect("buffer").extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    struct Broken;

    impl Write for Broken {
        fn write(&mut self, _buf: &[u8]) -> io::Result<usize> {
            Err(io::Error::other("disk full"))
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn run_info(config: &RlmConfig) -> RunInfo<'_> {
        RunInfo {
            query: "How many errors?",
            config,
            endpoints: &[],
            contexts: &[],
            system_prompt: "system",
            started_at_ms: 1,
            ledger: None,
        }
    }

    fn record() -> IterationRecord {
        IterationRecord {
            metadata: IterationMetadata {
                iteration: 1,
                ..Default::default()
            },
            execution: ExecutionMetadata::from_runs(&[]),
            reply: "FINAL(3)".into(),
            blocks: vec![],
            root_call: None,
            sub_calls: vec![],
            notes: vec![],
            started_ms: 0.0,
            model_ms: 1.0,
            execution_ms: 0.0,
        }
    }

    #[test]
    fn writes_header_iterations_and_result_as_json_lines() {
        let buffer = Shared::default();
        let mut writer = TrajectoryWriter::new(buffer.clone());
        let config = RlmConfig::default();
        assert_eq!(writer.before_run(&run_info(&config)), HookAction::Continue);
        writer.after_iteration(&mut record());
        let mut result = RlmResult {
            answer: Some("3".into()),
            answer_kind: Some(FinalKind::FinalLine),
            termination_reason: TerminationReason::FinalAnswer,
            error: None,
            metrics: SessionMetrics::default(),
            iterations: vec![],
            sub_calls: vec![],
            contexts: vec![],
        };
        writer.after_run(&mut result);
        assert_eq!(writer.lines(), 3);

        let text = String::from_utf8(buffer.0.lock().expect("buffer").clone()).expect("utf-8");
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("every line is JSON"))
            .collect();
        assert_eq!(lines[0]["type"], "header");
        assert_eq!(lines[0]["version"], TRAJECTORY_VERSION);
        assert_eq!(lines[0]["query"], "How many errors?");
        assert_eq!(lines[0]["config"]["max_iterations"], 30);
        assert_eq!(lines[1]["type"], "iteration");
        assert_eq!(lines[1]["iteration"], 1);
        assert_eq!(lines[1]["reply"], "FINAL(3)");
        assert_eq!(lines[1]["execution"]["status"], "no_code");
        assert_eq!(lines[2]["type"], "result");
        assert_eq!(lines[2]["answer"], "3");
        assert_eq!(lines[2]["answer_chars"], 1);
        assert_eq!(lines[2]["answer_kind"], "final_line");
        assert_eq!(lines[2]["termination_reason"], "final_answer");
    }

    #[test]
    fn the_reply_and_each_blocks_code_are_on_disk_before_the_block_runs() {
        let buffer = Shared::default();
        let mut writer = TrajectoryWriter::new(buffer.clone());
        let reply = "```repl\nimport ctypes\nctypes.string_at(0)\n```";
        writer.after_model_call(&mut ModelCall {
            iteration: 2,
            answer_now: false,
            reply: reply.into(),
            response: None,
            record: None,
        });
        let mut block = CodeBlock {
            index: 0,
            code: "import ctypes\nctypes.string_at(0)".into(),
        };
        assert_eq!(writer.before_block(2, &mut block), HookAction::Continue);
        let text = String::from_utf8(buffer.0.lock().expect("buffer").clone()).expect("utf-8");
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("every line is JSON"))
            .collect();
        assert_eq!(
            lines,
            [
                serde_json::json!({"type": "reply", "iteration": 2, "reply": reply}),
                serde_json::json!({
                    "type": "block",
                    "iteration": 2,
                    "index": 0,
                    "code": "import ctypes\nctypes.string_at(0)",
                }),
            ]
        );
    }

    #[test]
    fn no_line_carries_a_known_secret() {
        let secret = "trajectory-secret-0123456789";
        bridge::secret::register(&bridge::Secret::new(secret));
        let buffer = Shared::default();
        let mut writer = TrajectoryWriter::new(buffer.clone());
        let config = RlmConfig::default();
        let mut info = run_info(&config);
        let query = format!("what is \"{secret}\"?");
        info.query = &query;
        writer.before_run(&info);
        let mut record = record();
        record.reply = format!("FINAL({secret})");
        writer.after_iteration(&mut record);
        let text = String::from_utf8(buffer.0.lock().expect("buffer").clone()).expect("utf-8");
        assert!(!text.contains(secret), "{text}");
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("every line is JSON"))
            .collect();
        assert_eq!(lines[0]["query"], "what is \"[redacted]\"?");
        assert_eq!(lines[1]["reply"], "FINAL([redacted])");
    }

    #[test]
    fn a_write_failure_stops_the_run() {
        let mut writer = TrajectoryWriter::new(Broken);
        let config = RlmConfig::default();
        let HookAction::Stop(message) = writer.before_run(&run_info(&config)) else {
            panic!("a trajectory that cannot be written must stop the run");
        };
        assert_eq!(message, "Could not write the trajectory: disk full");
        assert!(matches!(
            writer.before_iteration(1, &[]),
            HookAction::Stop(_)
        ));
        assert_eq!(writer.lines(), 0);
    }
}
