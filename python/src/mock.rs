//! `MockServer`: the project's mock LM server (`bridge::mock`), started from Python for
//! tests, examples and demos without an API key. It serves on 127.0.0.1 on the kernel's
//! shared runtime, in the same process.

use std::sync::Mutex;
use std::time::Duration;

use bridge::mock::{Latency, MockConfig, Script};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

/// `MockServer(script_json=None, latency_ms=None)`: a scripted OpenAI/Anthropic-compatible
/// server on 127.0.0.1 (a free port). The script format: `kernel/cli/docs/mock-server.md`.
#[pyclass(module = "rlm_kernel._native")]
#[derive(Debug)]
pub(crate) struct MockServer {
    server: Mutex<Option<bridge::mock::MockServer>>,
    base_url: String,
}

#[pymethods]
impl MockServer {
    #[new]
    #[pyo3(signature = (script_json=None, latency_ms=None))]
    fn new(py: Python<'_>, script_json: Option<&str>, latency_ms: Option<f64>) -> PyResult<Self> {
        let script = match script_json {
            Some(text) => Script::from_json_str(text)
                .map_err(|e| PyValueError::new_err(format!("Invalid mock script: {e}")))?,
            None => Script::default(),
        };
        let latency = match latency_ms {
            None => Latency::None,
            Some(ms) => Latency::Fixed {
                delay: Duration::try_from_secs_f64(ms / 1e3).map_err(|_| {
                    PyValueError::new_err(format!(
                        "`latency_ms` must be a non-negative number, got {ms}"
                    ))
                })?,
            },
        };
        let config = MockConfig {
            script,
            latency,
            ..MockConfig::default()
        };
        let server = py
            .detach(|| kernel::runtime::shared().block_on(bridge::mock::MockServer::start(config)))
            .map_err(|e| {
                PyRuntimeError::new_err(format!("Could not start the mock server: {e}"))
            })?;
        let base_url = server.openai_base_url();
        Ok(Self {
            server: Mutex::new(Some(server)),
            base_url,
        })
    }

    /// The OpenAI-compatible base URL, e.g. `http://127.0.0.1:40123/v1`.
    #[getter]
    fn base_url(&self) -> String {
        self.base_url.clone()
    }

    /// Requests served so far.
    #[getter]
    fn requests(&self) -> usize {
        self.lock().as_ref().map_or(0, |s| s.log().len())
    }

    /// Requests arrived so far, answered or not (`requests` counts finished ones only).
    #[getter]
    fn arrived(&self) -> u64 {
        self.lock()
            .as_ref()
            .map_or(0, bridge::mock::MockServer::arrived)
    }

    /// The most requests that were in flight at once, from the log.
    fn max_concurrency(&self) -> usize {
        self.lock()
            .as_ref()
            .map_or(0, |s| s.log().max_concurrency())
    }

    /// The model names of the requests served so far, in arrival order, with the last user
    /// message of each: `[(model, last_user), ...]`.
    fn request_log(&self) -> Vec<(String, String)> {
        self.lock().as_ref().map_or_else(Vec::new, |s| {
            s.log()
                .entries()
                .into_iter()
                .map(|r| (r.model, r.last_user))
                .collect()
        })
    }

    /// Stops serving (idempotent).
    fn close(&self, py: Python<'_>) {
        let server = self.lock().take();
        if let Some(server) = server {
            py.detach(|| kernel::runtime::shared().block_on(server.shutdown()));
        }
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        &self,
        py: Python<'_>,
        _kind: Py<PyAny>,
        _value: Py<PyAny>,
        _traceback: Py<PyAny>,
    ) -> bool {
        self.close(py);
        false
    }
}

impl MockServer {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<bridge::mock::MockServer>> {
        self.server
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
