//! `Client`: what one `RLM(...)` object holds — its options, resolved once when it is made,
//! and, from its first call on, its endpoints with their one budget ledger, connection pools
//! and concurrency limits. Every completion and every direct `llm_query` of the object goes
//! through them, so its budget covers all it does (as `rlm chat`'s covers a session).

use std::sync::{Arc, OnceLock};

use bridge::Endpoints;
use kernel::options::{Keys, RunOptions, Spelling};
use pyo3::prelude::*;

use crate::completion::{ContextArg, run_completion};
use crate::options::{invalid, resolve};
use crate::query;

/// `Client(explicit_json, defaults_json, where)`: the options of one `RLM` object (keywords
/// over session defaults over `RLM_*` over `rlm.toml`); raises for an unknown or bad one.
#[pyclass(module = "rlm_kernel._native", frozen)]
#[derive(Debug)]
pub(crate) struct Client {
    options: RunOptions,
    endpoints: OnceLock<Arc<Endpoints>>,
}

impl Client {
    /// The endpoints, built on first use and kept.
    fn endpoints(&self) -> PyResult<Arc<Endpoints>> {
        if let Some(endpoints) = self.endpoints.get() {
            return Ok(Arc::clone(endpoints));
        }
        let built = self
            .options
            .endpoints(Spelling::Keyword, Keys::Required)
            .map_err(invalid)?;
        // Another thread may have built them meanwhile: everyone uses the first.
        Ok(Arc::clone(self.endpoints.get_or_init(|| built)))
    }
}

#[pymethods]
impl Client {
    #[new]
    #[pyo3(signature = (explicit_json, defaults_json, r#where = "RLM()"))]
    fn new(explicit_json: &str, defaults_json: &str, r#where: &str) -> PyResult<Self> {
        let options = resolve(explicit_json, defaults_json, r#where)?;
        options
            .register_secrets(Spelling::Keyword)
            .map_err(invalid)?;
        Ok(Self {
            options,
            endpoints: OnceLock::new(),
        })
    }

    /// The effective options as JSON, by keyword, in canonical form.
    fn options_json(&self) -> String {
        serde_json::Value::Object(self.options.to_map()).to_string()
    }

    /// `completion(query, contexts, on_progress)`: runs the loop; see
    /// [`run_completion`].
    #[pyo3(signature = (query, contexts, on_progress=None))]
    fn completion(
        &self,
        py: Python<'_>,
        query: String,
        contexts: Vec<ContextArg>,
        on_progress: Option<Py<PyAny>>,
    ) -> PyResult<(String, String, Option<Py<PyAny>>)> {
        let endpoints = self.endpoints()?;
        run_completion(py, &self.options, endpoints, query, contexts, on_progress)
    }

    /// `llm_query(prompt, model=None) -> str`: one call to the sub-model (or the endpoint
    /// `model` names); a failure raises `RuntimeError`.
    #[pyo3(signature = (prompt, model=None))]
    fn llm_query(&self, py: Python<'_>, prompt: String, model: Option<String>) -> PyResult<String> {
        let endpoints = self.endpoints()?;
        query::single(py, &self.options, &endpoints, prompt, model)
    }

    /// `llm_query_batched(prompts, model=None) -> list[str]`: many calls at once (up to
    /// `batch_concurrency` in flight), answers in input order; a failed slot holds
    /// `"Error: <reason>"` as inside the REPL.
    #[pyo3(signature = (prompts, model=None))]
    fn llm_query_batched(
        &self,
        py: Python<'_>,
        prompts: Vec<String>,
        model: Option<String>,
    ) -> PyResult<Vec<String>> {
        let endpoints = self.endpoints()?;
        query::batched(py, &self.options, &endpoints, prompts, model)
    }
}
