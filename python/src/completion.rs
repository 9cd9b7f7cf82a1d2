//! One RLM run from Python: the loop runs on a thread of its own while the calling (main)
//! thread waits in short slices with the GIL released, checking for signals between slices.
//!
//! That is what makes Jupyter's interrupt button work: SIGINT only sets a flag that
//! `Python::check_signals` reads on the main thread (with a count of our own beside it, so
//! that a Ctrl-C whose flag other code consumed is not lost: module `interrupt`); when it
//! raises, the run is stopped through its [`StopHandle`] (root call cancelled, running block
//! interrupted with its sub-calls) and the partial result comes back with the exception. No tokio signal handler and no asyncio
//! loop are involved. Progress is read between slices too, so the callback runs on the
//! calling thread, where the notebook's display machinery expects it. The run's session is
//! closed (its worker ended, its scratch directory removed) before the result is sent, so a
//! call returns with nothing of its run still closing; an interrupted run whose block does
//! not wind down within `WIND_DOWN` is the exception: the call raises, and the run thread
//! closes the session when the block ends.

use std::io::Write;
use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bridge::Endpoints;
use kernel::options::{RunOptions, Spelling};
use kernel::repl::{ContextSource, LiveObject, ReplError, ReplSession};
use kernel::rlm::trace::TraceHook;
use kernel::rlm::{
    BlockRun, Hook, Progress, ProgressSnapshot, Rlm, RlmResult, StopHandle, TrajectoryWriter,
};
use pyo3::exceptions::{PyKeyboardInterrupt, PyRuntimeError};
use pyo3::prelude::*;

use crate::interrupt::Interrupts;
use crate::options::invalid;

/// How long the calling thread waits between two signal checks.
pub(crate) const SLICE: Duration = Duration::from_millis(50);

/// How long an interrupted run may take to wind down before its partial result is given up.
const WIND_DOWN: Duration = Duration::from_millis(1_500);

/// A context as the Python layer hands it over: a live object, or a path to load.
#[derive(Debug, FromPyObject)]
pub(crate) enum ContextArg {
    /// `(object, label)`.
    Object(Py<PyAny>, String),
    /// `(path,)`.
    Path((PathBuf,)),
}

/// Runs the loop over `contexts` with `options` through `endpoints` and returns
/// `(result_json, trajectory_jsonl, exception_or_None)`; the exception is the interrupt (or
/// the error of a signal handler) that stopped the run, to be raised by the caller with the
/// partial result attached.
pub(crate) fn run_completion(
    py: Python<'_>,
    options: &RunOptions,
    endpoints: Arc<Endpoints>,
    query: String,
    contexts: Vec<ContextArg>,
    on_progress: Option<Py<PyAny>>,
) -> PyResult<(String, String, Option<Py<PyAny>>)> {
    // Before the set-up, whose Python code could consume a Ctrl-C pressed meanwhile.
    let interrupts = Interrupts::watch();
    let config = options.rlm_config(Spelling::Keyword).map_err(invalid)?;
    let session_config = options.session_config(Spelling::Keyword).map_err(invalid)?;
    let sources: Vec<ContextSource> = contexts
        .into_iter()
        .map(|c| match c {
            ContextArg::Object(object, label) => {
                ContextSource::Object(LiveObject::new(object, label))
            }
            ContextArg::Path((path,)) => ContextSource::Path(path),
        })
        .collect();
    let session = {
        let endpoints = Arc::clone(&endpoints);
        py.detach(move || ReplSession::new(session_config, endpoints, &sources))
            .map_err(|e| match e {
                // Python's convention for a Ctrl-C; the caller's object stays usable.
                ReplError::Interrupted { .. } => PyKeyboardInterrupt::new_err(e.to_string()),
                e => PyRuntimeError::new_err(e.to_string()),
            })?
    };
    let mut rlm = Rlm::new(config, endpoints, Arc::new(session));
    let trajectory = SharedBuffer::default();
    rlm.add_hook(TrajectoryWriter::new(trajectory.clone()));
    if let Some(path) = &options.trajectory {
        // The error names the file.
        let writer =
            TrajectoryWriter::create(path).map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        rlm.add_hook(writer);
    }
    let progress = Progress::new();
    rlm.add_hook(progress.hook());
    let last_code = LastCode::default();
    rlm.add_hook(last_code.clone());
    let trace = options.trace.unwrap_or(false).then(|| {
        let text = Arc::new(Mutex::new(String::new()));
        let sink = Arc::clone(&text);
        rlm.add_hook(TraceHook::new(
            Box::new(move |part| {
                sink.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push_str(part);
            }),
            "`cell_timeout`",
        ));
        text
    });
    let stop = rlm.stop_handle();

    let (done, finished) = mpsc::channel();
    std::thread::Builder::new()
        .name("rlm-run".to_owned())
        .spawn(move || {
            let outcome = rlm.run(&query);
            // Closed before the call returns: its worker ended, its scratch directory
            // removed, so that the caller's next line (a notebook's next cell) finds none of
            // it still going.
            drop(rlm);
            let _ = done.send(outcome);
        })
        .map_err(|e| PyRuntimeError::new_err(format!("Could not start the run thread: {e}")))?;

    let mut reporter = Reporter {
        progress,
        last_code,
        callback: on_progress,
        last_sent: None,
        trace,
    };
    let (outcome, interrupt) =
        wait_for_run(py, &Mutex::new(finished), &stop, &mut reporter, interrupts)?;
    reporter.report(py)?;
    let result = outcome.map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
    let json = result_json(&result)?;
    Ok((json, trajectory.text(), interrupt))
}

type RunOutcome = Result<RlmResult, kernel::rlm::RlmError>;

/// Waits up to `timeout` for a message with the GIL released (the lock only makes the
/// receiver shareable with the detached closure; nobody else takes it).
pub(crate) fn recv_detached<T: Send>(
    py: Python<'_>,
    rx: &Mutex<Receiver<T>>,
    timeout: Duration,
) -> Result<T, RecvTimeoutError> {
    py.detach(|| {
        rx.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .recv_timeout(timeout)
    })
}

/// Waits for the run; on a signal stops it and waits (bounded) for its partial result.
fn wait_for_run(
    py: Python<'_>,
    finished: &Mutex<Receiver<RunOutcome>>,
    stop: &StopHandle,
    reporter: &mut Reporter,
    mut interrupts: Interrupts,
) -> PyResult<(RunOutcome, Option<Py<PyAny>>)> {
    loop {
        match recv_detached(py, finished, SLICE) {
            Ok(outcome) => return Ok((outcome, None)),
            Err(RecvTimeoutError::Disconnected) => {
                return Err(PyRuntimeError::new_err(
                    "The run thread ended without a result; please report this as a bug",
                ));
            }
            Err(RecvTimeoutError::Timeout) => {}
        }
        if let Err(signal) = interrupts.check(py).and_then(|()| reporter.report(py)) {
            stop.stop();
            let outcome = recv_detached(py, finished, WIND_DOWN);
            let signal = Interrupts::settle(py, signal);
            return match outcome {
                Ok(outcome) => Ok((outcome, Some(signal.into_value(py).into_any()))),
                // A block stuck in native code: give up the partial result, not the interrupt.
                Err(_) => Err(signal),
            };
        }
    }
}

/// Sends progress snapshots (as JSON) to the Python callback when they change, and the
/// trace written since the last call to `sys.stderr` (on the calling thread, where a
/// notebook shows it).
struct Reporter {
    progress: Progress,
    last_code: LastCode,
    callback: Option<Py<PyAny>>,
    last_sent: Option<(ProgressSnapshot, Option<String>)>,
    trace: Option<Arc<Mutex<String>>>,
}

impl Reporter {
    fn report(&mut self, py: Python<'_>) -> PyResult<()> {
        self.write_trace(py)?;
        let Some(callback) = &self.callback else {
            return Ok(());
        };
        let snapshot = self.progress.snapshot();
        let code = self.last_code.get();
        let unchanged = self.last_sent.as_ref().is_some_and(|(s, c)| {
            s.iteration == snapshot.iteration
                && s.phase == snapshot.phase
                && s.sub_calls_done == snapshot.sub_calls_done
                && s.calls_in_flight == snapshot.calls_in_flight
                && s.tokens == snapshot.tokens
                && *c == code
        });
        if unchanged {
            return Ok(());
        }
        let event = serde_json::json!({
            "iteration": snapshot.iteration,
            "max_iterations": snapshot.max_iterations,
            "phase": snapshot.phase,
            "sub_calls_done": snapshot.sub_calls_done,
            "calls_in_flight": snapshot.calls_in_flight,
            "tokens": snapshot.tokens,
            "cost_usd": snapshot.cost_usd,
            "elapsed_s": snapshot.elapsed.as_secs_f64(),
            "last_code": code,
        });
        callback.call1(py, (event.to_string(),))?;
        self.last_sent = Some((snapshot, code));
        Ok(())
    }

    /// The trace so far, with known secrets redacted, to `sys.stderr`.
    fn write_trace(&self, py: Python<'_>) -> PyResult<()> {
        let Some(trace) = &self.trace else {
            return Ok(());
        };
        let text = std::mem::take(&mut *trace.lock().unwrap_or_else(PoisonError::into_inner));
        if text.is_empty() {
            return Ok(());
        }
        let stderr = py.import("sys")?.getattr("stderr")?;
        stderr.call_method1("write", (bridge::secret::redactor().redact(&text),))?;
        stderr.call_method0("flush")?;
        Ok(())
    }
}

/// A hook that keeps the code of the last block run, for the progress display.
#[derive(Debug, Clone, Default)]
struct LastCode(Arc<Mutex<Option<String>>>);

impl LastCode {
    fn get(&self) -> Option<String> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Hook for LastCode {
    fn after_block(&mut self, _iteration: u32, run: &mut BlockRun) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(run.block.code.clone());
    }
}

/// The in-memory trajectory (JSONL) of a run, for the result's HTML view.
#[derive(Debug, Clone, Default)]
struct SharedBuffer(Arc<Mutex<Vec<u8>>>);

impl SharedBuffer {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(PoisonError::into_inner)).into_owned()
    }
}

impl Write for SharedBuffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn result_json(result: &RlmResult) -> PyResult<String> {
    serde_json::to_string(result)
        .map_err(|e| PyRuntimeError::new_err(format!("Could not encode the result: {e}")))
}
