//! Running one block on the session thread: compile, run under the watchdog, show the value
//! of a final bare expression, describe an exception, then tidy the namespace.
//!
//! The block is compiled as `<repl-block-N>` (the source goes into `linecache`, so tracebacks
//! show the user's lines): from its source when it is [plain](super::plain) (nothing in it for
//! the support module's `compile_block` to change or record), else by `compile_block` from its
//! tree. As in IPython, when the last statement is a bare expression it is
//! evaluated separately and, unless it is `None`, its `repr()` is printed to the block's
//! stdout: `x = 2` then `x * 21` shows `42`. User code runs directly in the session's globals
//! (no wrapper frames), so variables assigned before an exception stay, and the traceback
//! holds only the user's frames (the support module's frames are dropped).
//!
//! After the block: `answer` rebound to a mapping becomes the answer slot (rebound to anything
//! else, it is reset, with a note on stderr), other reserved names that were rebound or deleted
//! are restored (with a note), a ready `answer` that bypassed the dict hooks is recorded, and
//! the result collects the captured output, sub-calls (ledger records since the block started),
//! variables and the final answer recorded during the block. A block's start and its end are
//! one Python call each (`begin_block`, `finish_block`): in a worker that waited idle for its
//! child's model, every distinct call and lookup is paid in cold caches (in the bench guide).

use std::borrow::Cow;
use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use pyo3::prelude::*;
use pyo3::types::{PyCode, PyCodeMethods, PyDict, PyFrozenSet, PyList, PyModule};
use tokio_util::sync::CancellationToken;

use super::capture::{OutputCapture, Stream};
use super::error::ReplError;
use super::interpreter::interpreter;
use super::interrupt::{ArmRequest, InterruptReason};
use super::local::SessionState;
use super::metadata::{
    ExecError, ExecutionResult, FinalAnswer, FinalSource, VariableInfo, VariableRow,
};
use super::plain::is_plain;

/// The block [`SessionState::warm_up`] runs: statements of the kinds a model's blocks are
/// made of (assignments, subscripts, calls), under a name it deletes again. It is
/// [plain](super::plain).
pub(crate) const WARM_UP: &str =
    "_rlm_warm_up = {'a': [1, 2]}\n_rlm_warm_up['b'] = str(len(_rlm_warm_up))\ndel _rlm_warm_up\n";

/// What [`SessionState::warm_up`] also compiles, not run, the way of blocks that are not
/// plain: one that ends with a bare expression, whose value is shown.
const WARM_UP_SHOWN: &str = "len(_rlm_warm_up)\n";

impl SessionState {
    /// Run one block; `Err` only when the kernel's own support code failed.
    pub(crate) fn exec(
        &mut self,
        py: Python<'_>,
        code: &str,
        stop: Option<CancellationToken>,
    ) -> Result<ExecutionResult, ReplError> {
        let started = Instant::now();
        let fail = |e: PyErr| ReplError::internal("running a block", e);
        self.blocks += 1;
        // Until the block's end says otherwise, it may have started processes.
        self.processes.store(true, Ordering::Relaxed);
        let filename = format!("{}{}>", self.block_filename_prefix(), self.blocks);
        let (stdout, stderr) = match &self.embedding.output {
            Some(sink) => (
                OutputCapture::forwarding(Stream::Stdout, sink.clone()),
                OutputCapture::forwarding(Stream::Stderr, sink.clone()),
            ),
            None => {
                let max = self.config.max_output_chars;
                let redactor = bridge::secret::redactor();
                (
                    OutputCapture::new(max, redactor.clone()),
                    OutputCapture::new(max, redactor),
                )
            }
        };
        let stdout = Bound::new(py, stdout).map_err(fail)?;
        let stderr = Bound::new(py, stderr).map_err(fail)?;
        let session = self.py_session.bind(py).clone();
        // From here every exit, `?` included, ends the block: output is never left routed to
        // a capture nobody reads.
        let globals = self.globals.bind(py).clone();
        // The next block's stop event, made between blocks, is this one's now.
        self.prepared = false;
        let (scope, names_before, answer_before) = BlockScope::begin(
            &session,
            (&stdout, &stderr),
            &globals,
            self.reserved_set.bind(py),
            self.answer_slot(py),
        )
        .map_err(fail)?;
        let names_before: HashSet<String> = names_before.into_iter().collect();
        let ledger_start = self.bridge.ledger().map(|l| l.next_call_index());

        let (error, interrupt) =
            self.run_block(py, code, &filename, &globals, stdout.get(), stop)?;
        if let Some(error) = &error {
            stderr.get().push(&error.traceback);
        }
        // The block's end in one Python call: `answer` settled (a rebound mapping becomes the
        // answer slot), the final answers it recorded, its output routing ended, the processes
        // it started joined to the session's (an interrupted block's stopped), the variables.
        let (slot, note, finals, held, rows) = scope
            .finish(
                self.answer.bind(py),
                &globals,
                self.reserved_set.bind(py),
                answer_before,
                interrupt.is_some(),
            )
            .map_err(fail)?;
        if let Some(note) = note {
            stderr.get().push(&format!("{note}\n"));
        }
        self.set_answer_slot(slot.unbind());
        self.restore_reserved(&globals, stderr.get())
            .map_err(fail)?;
        self.processes.store(held, Ordering::Relaxed);
        let final_answers = finals.into_iter().map(final_answer).collect();
        let variables: Vec<_> = rows.into_iter().map(VariableInfo::from_row).collect();
        // Listed are the user's names, those `begin_block` read before the block.
        let new_variables = variables
            .iter()
            .filter(|v| !names_before.contains(&v.name))
            .map(|v| v.name.clone())
            .collect();
        let (llm_query_calls, llm_query_batched_calls, sub_call_errors) = self.bridge.counters();
        let out = stdout.get().take();
        let err = stderr.get().take();
        Ok(ExecutionResult {
            stdout: out.text,
            stderr: err.text,
            stdout_omitted_chars: out.omitted_chars,
            stderr_omitted_chars: err.omitted_chars,
            error,
            timed_out: interrupt == Some(InterruptReason::Timeout),
            duration: started.elapsed(),
            sub_calls: self.bridge.own_records(ledger_start),
            sub_call_texts: self.bridge.take_texts(),
            llm_query_calls,
            llm_query_batched_calls,
            sub_call_errors,
            final_answers,
            variables,
            new_variables,
            restart: None,
        })
    }

    /// Runs [`WARM_UP`] as a block and compiles [`WARM_UP_SHOWN`] (so both ways a block is
    /// compiled have run once), then puts back what a block changes that it must not: the
    /// block count (the session's first block is still `1`, with its file name) and the line
    /// cache's entries of their sources, and whether the session's close collects garbage.
    ///
    /// A worker confined ahead of need is a fresh fork of the template: its first block
    /// would write, for the first time in this process, to the pages of every object that
    /// parsing, compiling and running a block touch (a copy-on-write fault each), which took
    /// a child's two-line block ~1 ms, ~0.7 of it in `compile_block` alone (in the bench
    /// guide). Run here, while the worker waits for a session, that cost is off the path of
    /// the child that takes it. The block binds one name and deletes it: the namespace, the
    /// answer, the session's definitions and processes are as they were.
    pub(crate) fn warm_up(&mut self, py: Python<'_>) {
        let blocks = self.blocks;
        let session = self.py_session.bind(py).clone();
        let collect = session.getattr("collect_on_close").ok();
        match self.exec(py, WARM_UP, None) {
            Ok(result) => {
                if let Some(error) = result.error {
                    tracing::debug!("the warm-up block raised: {}", error.message);
                }
            }
            Err(e) => tracing::debug!("the warm-up block failed: {e}"),
        }
        let filename = format!("{}{}>", self.block_filename_prefix(), self.blocks);
        self.blocks = blocks;
        let shown = interpreter(py).map(|i| {
            i.support(py)
                .call_method1("compile_block", (&session, WARM_UP_SHOWN, &filename))
                .map(drop)
        });
        if let Ok(Err(e)) = shown {
            tracing::debug!("could not compile the warm-up expression: {e}");
        }
        let restored = py
            .import("linecache")
            .and_then(|linecache| linecache.getattr("cache"))
            .and_then(|cache| cache.call_method1("pop", (filename, py.None())))
            .and_then(|_| match collect {
                Some(collect) => session.setattr("collect_on_close", collect),
                None => Ok(()),
            });
        if let Err(e) = restored {
            tracing::debug!("could not tidy after the warm-up block: {e}");
        }
        self.prepare_block(py);
    }

    /// Makes, between blocks, what the next block starts with (its stop event), unless it is
    /// made already: off the path of the block, which may come after an idle spell in which
    /// the caches went cold. The session thread calls it once a block's answer is given.
    pub(crate) fn prepare_block(&mut self, py: Python<'_>) {
        if self.prepared {
            return;
        }
        match self.py_session.bind(py).call_method0("prepare_block") {
            Ok(_) => self.prepared = true,
            Err(e) => tracing::debug!("could not prepare the next block: {e}"),
        }
    }

    /// Compiles and runs `code` under the watchdog; returns the error the block raised (or
    /// the interrupt that stopped it) and the reason it was interrupted, if it was.
    fn run_block(
        &mut self,
        py: Python<'_>,
        code: &str,
        filename: &str,
        globals: &Bound<'_, PyDict>,
        stdout: &OutputCapture,
        stop: Option<CancellationToken>,
    ) -> Result<(Option<ExecError>, Option<InterruptReason>), ReplError> {
        let fail = |e: PyErr| ReplError::internal("running a block", e);
        let support = interpreter(py)?.support(py);
        let session = self.py_session.bind(py);
        let compiled = if is_plain(code) {
            compile_plain(py, support, code, filename).map(|body| (body, None))
        } else {
            support
                .call_method1("compile_block", (session, code, filename))
                .and_then(|compiled| compiled.extract())
        };
        let (body, expr): (Bound<'_, PyCode>, Option<Bound<'_, PyCode>>) = match compiled {
            Err(e) => return Ok((Some(self.describe(py, e, filename, None)?), None)),
            Ok(compiled) => compiled,
        };
        self.watchdog.arm(
            py,
            ArmRequest {
                block: self.blocks,
                timeout: self.config.cell_timeout,
                thread_id: self.thread_id,
                session: self.py_session.clone_ref(py),
                timeout_class: support.getattr("CellTimeout").map_err(fail)?.unbind(),
                cancelled_class: support.getattr("CellCancelled").map_err(fail)?.unbind(),
                cell_token: self.bridge.begin_block(),
                session_token: self.bridge.session_token(),
                stop,
            },
        );
        let outcome = run_user_code(&body, expr.as_ref(), globals, stdout);
        if std::process::id() != self.pid {
            exit_forked_child(py, outcome);
        }
        let fired = self.watchdog.disarm(py);
        if let (Some(_), Some(events)) = (fired, &self.embedding.events) {
            events.interrupted_code_returned();
        }
        let Some(reason) = fired else {
            return match outcome {
                Err(e) => Ok((Some(self.describe(py, e, filename, None)?), None)),
                Ok(()) => Ok((None, None)),
            };
        };
        let (type_name, message) = interrupt_text(
            reason,
            self.config.cell_timeout,
            &self.config.cell_timeout_setting,
        );
        let mut described = match outcome {
            Err(e) => self.describe(py, e, filename, Some(message.clone()))?,
            Ok(()) => ExecError {
                type_name: String::new(),
                traceback: format!("{type_name}: {message}\n"),
                message,
                line: None,
            },
        };
        described.type_name = type_name;
        Ok((Some(described), Some(reason)))
    }

    /// Puts back reserved names the block rebound or deleted, with a note on its stderr.
    fn restore_reserved(
        &self,
        globals: &Bound<'_, PyDict>,
        stderr: &OutputCapture,
    ) -> PyResult<()> {
        for (name, value) in &self.reserved {
            let current = globals.get_item(name)?;
            if current.as_ref().is_some_and(|c| c.is(value)) {
                continue;
            }
            globals.set_item(name, value)?;
            stderr.push(&format!(
                "Note: `{name}` is reserved by the REPL and was restored; keep your value under another name.\n"
            ));
        }
        Ok(())
    }

    /// Runs `f` — user code outside a block, such as a variable's `__str__` — under the
    /// watchdog, so code that never returns is interrupted after `limit` like a block.
    pub(crate) fn guarded<T>(
        &mut self,
        py: Python<'_>,
        limit: std::time::Duration,
        f: impl FnOnce() -> T,
    ) -> Result<T, ReplError> {
        let fail = |e: PyErr| ReplError::internal("running user code", e);
        let support = interpreter(py)?.support(py);
        self.guards += 1;
        self.watchdog.arm(
            py,
            ArmRequest {
                // Its own id space: a stale interrupt of a block can never match a guard.
                block: (1 << 63) | self.guards,
                timeout: limit,
                thread_id: self.thread_id,
                session: self.py_session.clone_ref(py),
                timeout_class: support.getattr("CellTimeout").map_err(fail)?.unbind(),
                cancelled_class: support.getattr("CellCancelled").map_err(fail)?.unbind(),
                cell_token: CancellationToken::new(),
                session_token: self.bridge.session_token(),
                stop: None,
            },
        );
        let out = f();
        self.watchdog.disarm(py);
        Ok(out)
    }

    /// Describe an exception raised by the block (support frames removed).
    fn describe(
        &self,
        py: Python<'_>,
        err: PyErr,
        filename: &str,
        message: Option<String>,
    ) -> Result<ExecError, ReplError> {
        let support = interpreter(py)?.support(py);
        let value = err.into_value(py);
        let (type_name, message, traceback, line) = support
            .call_method1("describe_exception", (value, filename, message))
            .and_then(|d| d.extract::<(String, String, String, Option<u32>)>())
            .map_err(|e| ReplError::internal("formatting a traceback", e))?;
        Ok(ExecError {
            type_name,
            message,
            traceback,
            line,
        })
    }
}

/// A forked child's copy of a block has ended (`outcome`): the child exits at once with the
/// status Python's own exit would give it, never returning into the runtime, whose threads,
/// channels and sockets belong to the parent. `_exit` runs no exit handlers and flushes no
/// buffers, so nothing of the child reaches the parent's terminal or trajectory.
fn exit_forked_child(py: Python<'_>, outcome: PyResult<()>) -> ! {
    let error = outcome.err().map(|e| e.into_value(py));
    let status = interpreter(py)
        .and_then(|i| {
            i.support(py)
                .call_method1("forked_child_status", (error,))
                .and_then(|s| s.extract::<i32>())
                .map_err(|e| ReplError::internal("ending a forked child", e))
        })
        .unwrap_or(1);
    // SAFETY: `_exit` ends the process without touching any state of it.
    unsafe { libc::_exit(status) }
}

/// Compiles a [plain](is_plain) block from its source, as `compile_block` would compile its
/// tree: the same code, its lines in `linecache` for tracebacks, nothing recorded.
///
/// The lines go into the support module's own `linecache` and `compile` is read from the
/// builtins: no module is looked up by name on the path of a block whose worker waited idle,
/// where importing `linecache` took most of the ~35 µs of its lines, cold (in the bench guide).
fn compile_plain<'py>(
    py: Python<'py>,
    support: &Bound<'py, PyModule>,
    code: &str,
    filename: &str,
) -> PyResult<Bound<'py, PyCode>> {
    // As `str.splitlines(True)` splits a plain (ASCII, no `\r` or `\x0c`) source.
    let mut lines: Vec<Cow<'_, str>> = code
        .split_inclusive(['\n', '\x0b', '\x1c', '\x1d', '\x1e'])
        .map(Cow::Borrowed)
        .collect();
    if let Some(last) = lines.last_mut()
        && !code.ends_with('\n')
    {
        last.to_mut().push('\n');
    }
    support.getattr("linecache")?.getattr("cache")?.set_item(
        filename,
        (code.len(), py.None(), PyList::new(py, lines)?, filename),
    )?;
    // SAFETY: with the GIL held, a borrowed reference to the builtins dict (of the running
    // frame, or the interpreter's when none runs).
    let builtins = unsafe { Bound::from_borrowed_ptr_or_err(py, pyo3::ffi::PyEval_GetBuiltins())? };
    let compile = builtins.get_item("compile")?;
    Ok(compile
        .call1((code, filename, "exec", 0, true))?
        .cast_into::<PyCode>()?)
}

/// The user's code: the body, then the final bare expression whose repr is shown.
fn run_user_code(
    body: &Bound<'_, PyCode>,
    expr: Option<&Bound<'_, PyCode>>,
    globals: &Bound<'_, PyDict>,
    stdout: &OutputCapture,
) -> PyResult<()> {
    body.run(Some(globals), None)?;
    if let Some(expr) = expr {
        let value = expr.run(Some(globals), None)?;
        if !value.is_none() {
            let text = value.repr()?;
            stdout.push(&text.to_string_lossy());
            stdout.push("\n");
        }
    }
    Ok(())
}

/// The exception a stopped block raises; `setting` names what sets the time limit.
fn interrupt_text(reason: InterruptReason, limit: Duration, setting: &str) -> (String, String) {
    match reason {
        InterruptReason::Timeout => (
            "CellTimeout".to_owned(),
            format!(
                "The block exceeded its time limit of {:.3}s and was stopped; the session kept its variables. Do less per block (work in smaller steps, use llm_query_batched for many prompts), or raise {setting}",
                limit.as_secs_f64()
            ),
        ),
        InterruptReason::Cancelled => (
            "CellCancelled".to_owned(),
            "The block was stopped because the session's run was cancelled (a run time limit or budget stop); the session kept its variables".to_owned(),
        ),
    }
}

/// What `finish_block` returns: the answer slot from now on, a note for the block's stderr,
/// the final answers the block recorded, whether the session holds processes, the variables.
type Finished<'py> = (
    Bound<'py, PyAny>,
    Option<String>,
    Vec<(String, String)>,
    bool,
    Vec<VariableRow>,
);

/// A final answer `finish_block` read: (convention, text).
fn final_answer((source, value): (String, String)) -> FinalAnswer {
    FinalAnswer {
        value,
        source: if source == "answer" {
            FinalSource::AnswerDict
        } else {
            FinalSource::FinalVar
        },
    }
}

/// A block's output routing in the support module's `Session`: begun with the block's
/// captures, ended on every exit path (on drop if [`BlockScope::end`] was not reached).
struct BlockScope<'a, 'py> {
    session: &'a Bound<'py, PyAny>,
    ended: bool,
}

impl<'a, 'py> BlockScope<'a, 'py> {
    /// Begins the block with its captures; returns, with the scope, what its end compares
    /// against: the user's names in `globals` and the state of the answer `slot`.
    fn begin(
        session: &'a Bound<'py, PyAny>,
        (stdout, stderr): (&Bound<'py, OutputCapture>, &Bound<'py, OutputCapture>),
        globals: &Bound<'py, PyDict>,
        reserved: &Bound<'py, PyFrozenSet>,
        slot: Bound<'py, PyAny>,
    ) -> PyResult<(Self, Vec<String>, Bound<'py, PyAny>)> {
        let begun =
            session.call_method1("begin_block", (stdout, stderr, globals, reserved, slot))?;
        let scope = Self {
            session,
            ended: false,
        };
        let (names, answer_before) = begun.extract()?;
        Ok((scope, names, answer_before))
    }

    /// Ends the block with its end's work (the support module's `finish_block`).
    fn finish(
        mut self,
        own: &Bound<'py, PyAny>,
        globals: &Bound<'py, PyDict>,
        reserved: &Bound<'py, PyFrozenSet>,
        answer_before: Bound<'py, PyAny>,
        interrupted: bool,
    ) -> PyResult<Finished<'py>> {
        let finished = self.session.call_method1(
            "finish_block",
            (own, globals, reserved, answer_before, interrupted),
        )?;
        self.ended = true;
        finished.extract()
    }
}

impl Drop for BlockScope<'_, '_> {
    fn drop(&mut self) {
        if !self.ended
            && let Err(e) = self.session.call_method0("end_block")
        {
            tracing::warn!("could not end a block after an internal error: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::repl::interpreter;

    #[test]
    fn a_plain_block_compiles_to_the_code_and_lines_compile_block_makes() {
        interpreter::start().expect("the interpreter");
        Python::attach(|py| -> PyResult<()> {
            let support = interpreter(py).expect("support").support(py);
            let session = support.getattr("Session")?.call1((u64::MAX,))?;
            let cache = py.import("linecache")?.getattr("cache")?;
            let name = "<repl-test-plain>";
            for source in [
                "answer['content'] = 'ok'\nanswer['ready'] = True",
                "x = 1\n",
                "for i in range(3):\n    total = i * 2\n",
                "s = f'{x!r:>{w}}' + '''a\nb''' + r'\\d'\n# done",
                "if x:\n    y = [1,\n         2]\nelse:\n    del x",
                "",
                "x: int = 3\ny = 1 if x else 2",
                "s = 'a\x0bb\x1cc\x1dd\x1ee'\nt = 1",
            ] {
                assert!(is_plain(source), "{source:?}");
                let (tree_body, expr): (Bound<'_, PyCode>, Option<Bound<'_, PyCode>>) = support
                    .call_method1("compile_block", (&session, source, name))?
                    .extract()?;
                assert!(expr.is_none(), "{source:?}");
                let tree_lines = cache.call_method1("pop", (name,))?;
                let plain_body = compile_plain(py, support, source, name)?;
                let plain_lines = cache.call_method1("pop", (name,))?;
                // Code objects compare their bytecode, constants, names and line tables.
                assert!(plain_body.eq(&tree_body)?, "{source:?}");
                assert!(plain_lines.eq(&tree_lines)?, "{source:?}");
            }
            assert!(session.getattr("definitions")?.is_empty()?);
            session.call_method0("close").map(drop)
        })
        .expect("compiled");
    }
}
