//! The messages between a session and its worker, and their framing.
//!
//! A frame is a 4-byte big-endian length and a MessagePack body (`rmp-serde`, structs as maps,
//! so the kernel's own serde types — results, metadata, errors — cross as they are). The
//! parent reads a frame into a buffer before decoding it, so a frame's length, not what it
//! claims inside, bounds what a misbehaving worker can make the parent hold; MessagePack's
//! decoder also bounds nesting.

use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::repl::capture::Stream;
use crate::repl::config::SessionConfig;
use crate::repl::error::ReplError;
use crate::repl::metadata::{ContextMetadata, ExecutionResult, VariableInfo};
use crate::repl::natives::{SubAnswer, SubFailure, WireChild};
use crate::repl::source::EncodedFormat;

/// The file descriptor of the worker's end of the socket.
pub(crate) const LINK_FD: i32 = 3;

/// Set in the environment of the worker process started as the worker template
/// (`template.rs`): to `1`, or to `plain` when it is to leave its code where it is
/// (`huge_code`).
pub(crate) const TEMPLATE_VAR: &str = "RLM_WORKER_TEMPLATE";

/// The most context memfds one worker is handed.
pub(crate) const MAX_MEMFDS: usize = 64;

/// How the worker is confined: the first frame it reads. A worker of the pool (`pool.rs`)
/// is confined ahead of need and then waits for its [`Start`]; any other worker gets both
/// at once.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Confine {
    /// The worker's working directory (the parent's: relative context paths mean the same).
    pub(crate) cwd: PathBuf,
    /// How the worker is confined (the worker adds its Python's own paths); its environment
    /// is the policy's.
    pub(crate) policy: sandbox::Policy,
    /// Whether every layer must be in force.
    pub(crate) level: sandbox::Level,
    /// The settings its session is expected to start with ([`worker_settings`] of the
    /// session's, or of its run's children's for a worker of the pool): the worker builds
    /// that session's namespace as soon as it is confined, and its [`Start`] only adds the
    /// contexts (a `Start` with other settings has the session built again).
    pub(crate) session: SessionConfig,
}

/// A session's settings as its worker gets them: the parent keeps the sub-calls' texts for
/// the block's record, where the secrets are known.
pub(crate) fn worker_settings(config: &SessionConfig) -> SessionConfig {
    SessionConfig {
        sub_call_text_chars: 0,
        ..config.clone()
    }
}

/// What the confined worker needs to start its session: the frame after
/// [`FromWorker::Confined`] (after one byte that carries the context memfds, `SCM_RIGHTS`, in
/// the same `sendmsg`).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Start {
    /// The session's settings ([`worker_settings`]) when they are not those its [`Confine`]
    /// frame said ([`Confine::session`]: a worker of the pool, taken by a session of other
    /// settings); `None`: those, as the namespace built ahead has them.
    pub(crate) settings: Option<SessionConfig>,
    /// The contexts, in order.
    pub(crate) contexts: Vec<WireContext>,
}

/// One context as the worker loads it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct WireContext {
    /// The variable name besides `context_N`.
    pub(crate) name: Option<String>,
    /// Where it comes from.
    pub(crate) source: WireSource,
}

/// Where a worker's context comes from: a file it reads itself, or a sealed memfd the parent
/// filled (text given directly, standard input, a value a parent's worker handed to an
/// `rlm_query` child, a live object of the Python package).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) enum WireSource {
    /// A file or directory (absolute).
    Path(PathBuf),
    /// A memfd handed over with the start frame.
    Memfd {
        /// Its position among the memfds handed over.
        index: usize,
        /// What it holds.
        content: MemfdContent,
    },
}

/// What a context memfd holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) enum MemfdContent {
    /// UTF-8 text (checked by the worker), described as coming from `source` (`-`, `<text>`).
    Text {
        /// How the metadata names it.
        source: String,
    },
    /// A value a worker serialised for an `rlm_query` child, loaded as a file of `format`
    /// named `source` would be ([`EncodedContext`](crate::repl::source::EncodedContext)).
    Encoded {
        /// How the metadata and errors name it.
        source: String,
        /// How it was written.
        format: EncodedFormat,
    },
    /// A live object of the Python package, serialised by the host.
    Object {
        /// The name it had in the host (`df`), for the prompt and errors.
        label: String,
        /// How it was written.
        format: ObjectFormat,
    },
}

/// How a live object was written into its memfd.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ObjectFormat {
    /// A `str`, as UTF-8.
    Text,
    /// A `bytes` object (becomes `str` if it is UTF-8, else stays `bytes`).
    Bytes,
    /// A polars frame (or any Arrow table) as an Arrow IPC file.
    ArrowIpc,
    /// A pickle, protocol 5, its large buffers out of band after it (a pandas frame's
    /// columns, numpy arrays): `[u64 pickle length][pickle][u64 count]([u64 length][buffer])*`.
    Pickle,
}

/// Parent → worker.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum ToWorker {
    /// The first frame.
    Confine(Box<Confine>),
    /// The second frame.
    Start(Box<Start>),
    /// A request, answered by one [`FromWorker::Reply`] with the same id.
    Request {
        /// The request's id.
        id: u64,
        /// What is asked.
        request: Request,
    },
    /// Stop exec `id` if it is running (latched: an exec that has not started yet starts
    /// stopped).
    Interrupt {
        /// The exec request's id.
        id: u64,
    },
    /// The answer to [`FromWorker::Call`] `call`.
    Answer {
        /// The call's id.
        call: u64,
        /// The answer.
        answer: SubAnswer,
    },
    /// The answers to [`FromWorker::Batch`] `call`, in input order.
    Answers {
        /// The call's id.
        call: u64,
        /// The answers, or why the batch could not be sent at all.
        answers: Result<Vec<SubAnswer>, SubFailure>,
    },
    /// The answers to [`FromWorker::Children`] `call`, in input order; `None` when the parent
    /// runs no children (the depth limit): the code runs `rlm_query` as `llm_query`.
    ChildAnswers {
        /// The call's id.
        call: u64,
        /// The answers.
        answers: Option<Vec<SubAnswer>>,
    },
    /// End the worker.
    Shutdown,
}

/// What the parent asks of the worker's session.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Request {
    /// Run a block.
    Exec {
        /// The code.
        code: String,
        /// The block's stop was cancelled before it was sent.
        stopped: bool,
    },
    /// The user's variables.
    Variables,
    /// `str()` of a variable.
    VariableString {
        /// Its name.
        name: String,
    },
    /// Empty the `answer` dict.
    ResetAnswer,
    /// `answer["content"]`.
    AnswerContent,
    /// End the processes the session's code started.
    EndProcesses,
    /// Load a support module into the worker's interpreter unless it is there.
    EnsureModule {
        /// Its name in `sys.modules`.
        name: String,
        /// Its source.
        source: String,
    },
    /// Pop `results[token]` of a support module.
    PopResult {
        /// The module's name.
        module: String,
        /// The key.
        token: u64,
    },
}

/// Worker → parent.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum FromWorker {
    /// The worker is confined (the answer to [`ToWorker::Confine`]).
    Confined(sandbox::Report),
    /// The session is ready (the answer to [`ToWorker::Start`]).
    Ready {
        /// The loaded contexts.
        contexts: Vec<ContextMetadata>,
    },
    /// The worker could not be confined, or its session could not start (the answer to
    /// [`ToWorker::Confine`] or [`ToWorker::Start`]).
    Failed(ReplError),
    /// Output of the running block, as written.
    Output {
        /// Which stream.
        stream: Stream,
        /// The text.
        text: String,
    },
    /// `llm_query`.
    Call {
        /// The call's id.
        call: u64,
        /// The endpoint (`None`: the session's sub endpoint).
        endpoint: Option<String>,
        /// The prompt.
        prompt: String,
    },
    /// `llm_query_batched`.
    Batch {
        /// The call's id.
        call: u64,
        /// The endpoint (`None`: the session's sub endpoint).
        endpoint: Option<String>,
        /// The prompts.
        prompts: Vec<String>,
    },
    /// `rlm_query` / `rlm_query_batched`: children for the parent to run.
    Children {
        /// The call's id.
        call: u64,
        /// The children, in input order.
        children: Vec<WireChild>,
    },
    /// The user code of interrupted exec `id` has returned; the block is winding down.
    Returned {
        /// The exec request's id.
        id: u64,
    },
    /// The answer to request `id`.
    Reply {
        /// The request's id.
        id: u64,
        /// The answer.
        reply: Reply,
    },
}

/// The answer to a [`Request`].
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Reply {
    /// To [`Request::Exec`].
    Exec {
        /// The block's result.
        result: Result<Box<ExecutionResult>, ReplError>,
        /// Whether the session holds processes its blocks started, after this one: if not,
        /// ending them ([`Request::EndProcesses`]) has nothing to do and is not asked.
        processes: bool,
    },
    /// To [`Request::Variables`].
    Variables(Result<Vec<VariableInfo>, ReplError>),
    /// To requests that answer a text or nothing.
    Text(Result<Option<String>, ReplError>),
}

/// A frame that could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FrameError {
    /// The other end closed the link.
    #[error("closed its link")]
    Closed,
    /// Reading failed.
    #[error("link failed: {0}")]
    Io(#[from] io::Error),
    /// The frame is not a message of the protocol.
    #[error("sent a frame that is not a message of the protocol ({0})")]
    Malformed(String),
}

/// Writes `message` as one frame (one `write_all`, so frames of several writers serialised by
/// a lock never interleave).
pub(crate) fn write_frame(out: &mut impl Write, message: &impl Serialize) -> io::Result<()> {
    let mut frame = vec![0u8; 4];
    rmp_serde::encode::write_named(&mut frame, message).map_err(io::Error::other)?;
    let length = u32::try_from(frame.len() - 4).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "a message of more than 4 GiB cannot cross the worker link; pass less data per call",
        )
    })?;
    frame[..4].copy_from_slice(&length.to_be_bytes());
    out.write_all(&frame)
}

/// Writes with `MSG_NOSIGNAL`: a worker that died makes a write fail, never raises SIGPIPE in
/// the parent (a host's own SIGPIPE handling is not ours to rely on).
pub(crate) struct NoSigPipe<'a>(pub(crate) &'a UnixStream);

impl Write for NoSigPipe<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        // SAFETY: sends initialised bytes on an open socket.
        let sent = unsafe {
            libc::send(
                self.0.as_raw_fd(),
                buf.as_ptr().cast(),
                buf.len(),
                libc::MSG_NOSIGNAL,
            )
        };
        usize::try_from(sent).map_err(|_| io::Error::last_os_error())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Reads one frame into `buffer` and decodes it; [`FrameError::Closed`] at a clean end.
pub(crate) fn read_frame<T: DeserializeOwned>(
    input: &mut impl Read,
    buffer: &mut Vec<u8>,
) -> Result<T, FrameError> {
    let mut header = [0u8; 4];
    match input.read_exact(&mut header) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Err(FrameError::Closed),
        Err(e) => return Err(FrameError::Io(e)),
    }
    let length = u64::from(u32::from_be_bytes(header));
    buffer.clear();
    // Grows as bytes arrive: a length claimed but never sent costs nothing.
    input.take(length).read_to_end(buffer)?;
    if buffer.len() as u64 != length {
        return Err(FrameError::Closed);
    }
    rmp_serde::from_slice(buffer).map_err(|e| FrameError::Malformed(e.to_string()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // In tests an unwrap is an assertion.
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_a_cut_frame_is_a_closed_link() {
        let mut wire = Vec::new();
        let message = FromWorker::Call {
            call: 7,
            endpoint: None,
            prompt: "ünïcode \"quoted\"\n".repeat(3),
        };
        write_frame(&mut wire, &message).unwrap();
        write_frame(&mut wire, &ToWorker::Shutdown).unwrap();
        let mut input = wire.as_slice();
        let mut buffer = Vec::new();
        match read_frame(&mut input, &mut buffer).unwrap() {
            FromWorker::Call { call, prompt, .. } => {
                assert_eq!(call, 7);
                assert!(prompt.starts_with("ünïcode"));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            read_frame(&mut input, &mut buffer).unwrap(),
            ToWorker::Shutdown
        ));
        assert!(matches!(
            read_frame::<ToWorker>(&mut input, &mut buffer),
            Err(FrameError::Closed)
        ));
        let cut = &wire[..wire.len() - 2];
        let mut input = &cut[cut.len() - 3..];
        assert!(matches!(
            read_frame::<ToWorker>(&mut input, &mut buffer),
            Err(FrameError::Closed)
        ));
    }

    #[test]
    fn garbage_is_malformed_not_a_panic() {
        let mut wire = 5u32.to_be_bytes().to_vec();
        wire.extend_from_slice(&[0xc1, 0xc1, 0xff, 0x00, 0x13]);
        let mut buffer = Vec::new();
        assert!(matches!(
            read_frame::<FromWorker>(&mut wire.as_slice(), &mut buffer),
            Err(FrameError::Malformed(_))
        ));
    }

    #[test]
    fn errors_and_results_cross_as_they_are() {
        let error = ReplError::ContextRead {
            path: "/no/such".into(),
            error: io::Error::from_raw_os_error(2),
        };
        let text = error.to_string();
        let mut wire = Vec::new();
        write_frame(&mut wire, &FromWorker::Failed(error)).unwrap();
        let back: FromWorker = read_frame(&mut wire.as_slice(), &mut Vec::new()).unwrap();
        match back {
            FromWorker::Failed(e @ ReplError::ContextRead { .. }) => {
                assert_eq!(e.to_string(), text)
            }
            other => panic!("{other:?}"),
        }
    }
}
