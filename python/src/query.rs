//! `llm_query` / `llm_query_batched` for direct use from Python (outside any RLM run): one
//! sub-model call, or many in parallel in input order, on the kernel's shared runtime.
//!
//! The calling thread waits in short slices with the GIL released and checks for signals in
//! between; an interrupt cancels the calls in flight and is raised at once.

use std::sync::mpsc;

use bridge::{BatchPolicy, CallOptions, ChatRequest, ChatResponse};
use kernel::options::SUB;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use tokio_util::sync::CancellationToken;

use crate::completion::{SLICE, recv_detached};
use crate::options::Options;

/// `llm_query(prompt, options_json, model=None) -> str`: ask the sub-model (or the endpoint
/// `model` names) one question; a failure raises `RuntimeError`.
#[pyfunction]
#[pyo3(signature = (prompt, options_json, model=None))]
pub(crate) fn llm_query(
    py: Python<'_>,
    prompt: String,
    options_json: &str,
    model: Option<String>,
) -> PyResult<String> {
    let mut answers = llm_query_batched(py, vec![prompt], options_json, model)?;
    answers
        .pop()
        .ok_or_else(|| PyRuntimeError::new_err("The sub-model call returned nothing"))
}

/// `llm_query_batched(prompts, options_json, model=None) -> list[str]`: many questions at
/// once (up to `batch_concurrency` in flight), answers in input order; a failed slot holds
/// `"Error: <reason>"` as inside the REPL.
#[pyfunction]
#[pyo3(signature = (prompts, options_json, model=None))]
pub(crate) fn llm_query_batched(
    py: Python<'_>,
    prompts: Vec<String>,
    options_json: &str,
    model: Option<String>,
) -> PyResult<Vec<String>> {
    let options = Options::from_json(options_json)?;
    let endpoints = options.endpoints()?;
    let endpoint = endpoints
        .get(model.as_deref().unwrap_or(SUB))
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    let policy = BatchPolicy {
        concurrency: options.batch_concurrency(),
    };
    let cancel = CancellationToken::new();
    let (done, finished) = mpsc::channel::<Vec<Result<ChatResponse, bridge::BridgeError>>>();
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
    let outcomes = loop {
        match recv_detached(py, &finished, SLICE) {
            Ok(outcomes) => break outcomes,
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(PyRuntimeError::new_err(
                    "The sub-model calls ended without a result; please report this as a bug",
                ));
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        if let Err(signal) = py.check_signals() {
            cancel.cancel();
            return Err(signal);
        }
    };
    if single {
        return match outcomes.into_iter().next() {
            Some(Ok(response)) => Ok(vec![response.content]),
            Some(Err(e)) => Err(PyRuntimeError::new_err(format!(
                "The sub-model call failed: {e}"
            ))),
            None => Err(PyRuntimeError::new_err(
                "The sub-model call returned nothing",
            )),
        };
    }
    Ok(outcomes
        .into_iter()
        .map(|outcome| match outcome {
            Ok(response) => response.content,
            Err(e) => format!("Error: {e}"),
        })
        .collect())
}
