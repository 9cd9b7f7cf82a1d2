//! `rlm_kernel._native`: the kernel library as a Python extension module (built by maturin
//! for the stable ABI), under the pure-Python package `rlm_kernel` (the API, the `%%rlm`
//! magic, rich display).
//!
//! Inside a user's interpreter the kernel attaches to the running interpreter (it never
//! initialises one), keeps its signal handlers and starts no event loop: waits happen on the
//! calling thread in short slices with the GIL released, checking for signals in between
//! (module `completion`; a hook in front of the interpreter's SIGINT handler only counts
//! presses and calls it, so that none is lost: module `interrupt`). The REPL session of a run lives in a confined worker process by
//! default (`isolation="process"`): this interpreter again, `python -m rlm_kernel._worker`,
//! which serves it with `worker_main`; live contexts are handed over once through shared
//! memory. With `isolation="none"` the session is a fresh namespace of this interpreter and
//! live contexts are bound into it by reference.
//!
//! An `RLM` object is a `Client` (module `client`): its options resolved once by the kernel's one
//! schema, spelled as keywords (module `options`), its endpoints and budget ledger built on
//! first use and kept for every call it makes.

mod client;
mod completion;
mod interrupt;
mod mock;
mod options;
mod query;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// `render_trajectory(jsonl, collapsed=False) -> str`: the HTML trajectory view of `rlm view`.
#[pyfunction]
#[pyo3(signature = (jsonl, collapsed=false))]
fn render_trajectory(jsonl: &str, collapsed: bool) -> PyResult<String> {
    kernel::rlm::render_trajectory_html(jsonl, collapsed)
        .map_err(|e| PyValueError::new_err(e.to_string()))
}

/// `eval_task(task, size_tokens, seed, needles=1) -> (query, context)`: the `rlm eval` task of
/// that family, size and instance seed (`kernel::eval`), for runs of the grid elsewhere (the
/// actors of `rlm eval --ray` make each context where it runs, the same as the CLI would).
#[pyfunction]
#[pyo3(signature = (task, size_tokens, seed, needles=1))]
fn eval_task(
    py: Python<'_>,
    task: &str,
    size_tokens: u64,
    seed: u64,
    needles: usize,
) -> PyResult<(String, String)> {
    let kind: kernel::eval::TaskKind = task
        .parse()
        .map_err(|e: kernel::eval::EvalError| PyValueError::new_err(e.to_string()))?;
    let instance = py.detach(|| {
        kernel::eval::TaskInstance::generate_with_needles(kind, size_tokens, seed, needles.max(1))
    });
    Ok((instance.query, instance.context))
}

/// `worker_main()`: serves an isolated session's worker (`python -m rlm_kernel._worker`) and
/// ends the process with its status; never returns into Python.
#[pyfunction]
fn worker_main(py: Python<'_>) -> PyResult<()> {
    let status = py.detach(kernel::repl::worker_main);
    // SAFETY: `_exit` ends the process without running anything of it (no interpreter
    // shutdown, which a thread of the model's code could hang).
    unsafe { libc::_exit(i32::from(status)) }
}

/// Isolated sessions start this interpreter again as their worker, with the module path it
/// has now (its working directory left out: the worker reads only what it must).
fn register_worker_program(py: Python<'_>) -> PyResult<()> {
    let sys = py.import("sys")?;
    let executable: String = sys.getattr("executable")?.extract()?;
    if executable.is_empty() {
        // An embedded interpreter with no executable: sessions must use `isolation="none"`.
        return Ok(());
    }
    let cwd = std::env::current_dir().ok();
    let path: Vec<String> = sys
        .getattr("path")?
        .extract::<Vec<String>>()?
        .into_iter()
        .filter(|p| !p.is_empty() && cwd.as_deref() != Some(std::path::Path::new(p)))
        .collect();
    kernel::repl::set_worker_program(kernel::repl::WorkerProgram {
        program: executable.into(),
        args: vec!["-m".into(), "rlm_kernel._worker".into()],
        env: vec![("PYTHONPATH".into(), path.join(":").into())],
    });
    Ok(())
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    register_worker_program(m.py())?;
    m.add_function(wrap_pyfunction!(worker_main, m)?)?;
    m.add_class::<client::Client>()?;
    m.add_function(wrap_pyfunction!(options::option_specs, m)?)?;
    m.add_function(wrap_pyfunction!(options::check_options, m)?)?;
    m.add_function(wrap_pyfunction!(render_trajectory, m)?)?;
    m.add_function(wrap_pyfunction!(eval_task, m)?)?;
    m.add_class::<mock::MockServer>()?;
    Ok(())
}
