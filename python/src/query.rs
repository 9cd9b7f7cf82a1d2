//! `llm_query` / `llm_query_batched` for direct use from Python (outside any RLM run): one
//! sub-model call, or many in parallel in input order, on the kernel's shared runtime,
//! through the endpoints of an `RLM` object (`Client`).
//!
//! The calling thread waits in short slices with the GIL released and checks for signals in
//! between (module `interrupt`); an interrupt cancels the calls in flight and is raised at
//! once.

use std::sync::mpsc;

use bridge::{BatchPolicy, BridgeError, CallOptions, ChatRequest, ChatResponse, Endpoints};
use kernel::options::{RunOptions, SUB};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use tokio_util::sync::CancellationToken;

use crate::completion::{SLICE, recv_detached};
use crate::interrupt::Interrupts;

/// One question to the sub-model (or the endpoint `model` names); a failure raises
/// `RuntimeError`.
pub(crate) fn single(
    py: Python<'_>,
    options: &RunOptions,
    endpoints: &Endpoints,
    prompt: String,
    model: Option<String>,
) -> PyResult<String> {
    match call(py, options, endpoints, vec![prompt], model)?.pop() {
        Some(Ok(response)) => Ok(response.content),
        Some(Err(e)) => Err(PyRuntimeError::new_err(format!(
            "The sub-model call failed: {e}"
        ))),
        None => Err(PyRuntimeError::new_err(
            "The sub-model call returned nothing",
        )),
    }
}

/// Many questions at once (up to `batch_concurrency` in flight), answers in input order; a
/// failed slot holds `"Error: <reason>"` as inside the REPL.
pub(crate) fn batched(
    py: Python<'_>,
    options: &RunOptions,
    endpoints: &Endpoints,
    prompts: Vec<String>,
    model: Option<String>,
) -> PyResult<Vec<String>> {
    Ok(call(py, options, endpoints, prompts, model)?
        .into_iter()
        .map(|outcome| match outcome {
            Ok(response) => response.content,
            Err(e) => format!("Error: {e}"),
        })
        .collect())
}

/// Sends `prompts` to the endpoint `model` (default: `sub`) and waits for every outcome.
fn call(
    py: Python<'_>,
    options: &RunOptions,
    endpoints: &Endpoints,
    prompts: Vec<String>,
    model: Option<String>,
) -> PyResult<Vec<Result<ChatResponse, BridgeError>>> {
    let mut interrupts = Interrupts::watch();
    let endpoint = endpoints
        .get(model.as_deref().unwrap_or(SUB))
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    let policy = BatchPolicy {
        concurrency: options.batch_width(),
    };
    let cancel = CancellationToken::new();
    let (done, finished) = mpsc::channel::<Vec<Result<ChatResponse, BridgeError>>>();
    let requests: Vec<ChatRequest> = prompts.into_iter().map(ChatRequest::from_prompt).collect();
    let single = requests.len() == 1;
    {
        let cancel = cancel.clone();
        kernel::runtime::shared().spawn(async move {
            let outcomes = if single {
                let options = CallOptions {
                    cancel,
                    ..CallOptions::default()
                };
                let mut requests = requests;
                match requests.pop() {
                    Some(request) => vec![endpoint.call(request, &options).await],
                    None => Vec::new(),
                }
            } else {
                endpoint.batch(requests, policy, &cancel).await
            };
            let _ = done.send(outcomes);
        });
    }
    let finished = std::sync::Mutex::new(finished);
    loop {
        match recv_detached(py, &finished, SLICE) {
            Ok(outcomes) => return Ok(outcomes),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(PyRuntimeError::new_err(
                    "The sub-model calls ended without a result; please report this as a bug",
                ));
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        if let Err(signal) = interrupts.check(py) {
            cancel.cancel();
            return Err(Interrupts::settle(py, signal));
        }
    }
}
