//! The keyword options of `RLM(...)`, `llm_query(...)` and `%%rlm`: the `rlm run` flags with
//! `_` for `-` (`max_iterations` is `--max-iterations`) and their command-line values (the
//! library's enums read them), resolved to the kernel's endpoints, session and loop settings
//! by [`kernel::options`] — the mapping `rlm run` uses — with errors naming the keywords.
//!
//! The Python layer merges `%rlm_config` defaults, `RLM_*` variables and `rlm.toml` first and
//! sends the result as JSON; unknown names are refused here with the list of known ones.

use std::error::Error as _;
use std::path::Path;
use std::sync::Arc;

use bridge::Endpoints;
use kernel::options::{OptionError, RunOptions, Spelling};
use kernel::repl::SessionConfig;
use kernel::rlm::RlmConfig;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// Options by their `rlm run` flag names (snake case).
#[derive(Debug)]
pub(crate) struct Options(RunOptions);

/// `error` and its causes as one `ValueError` message.
fn invalid(error: OptionError) -> PyErr {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    PyValueError::new_err(message)
}

impl Options {
    /// Parses the JSON the Python layer sends.
    pub(crate) fn from_json(json: &str) -> PyResult<Self> {
        serde_json::from_str(json)
            .map(Self)
            .map_err(|e| PyValueError::new_err(format!("Invalid RLM option: {e}")))
    }

    /// `root`, `sub` and the `extra_models`, sharing one ledger with the budget.
    pub(crate) fn endpoints(&self) -> PyResult<Arc<Endpoints>> {
        self.0.endpoints(Spelling::Keyword).map_err(invalid)
    }

    /// The fan-out width of a batch (`None`: all at once, capped by the endpoint's limiter,
    /// adaptive with `batch_concurrency="auto"`).
    pub(crate) fn batch_concurrency(&self) -> Option<usize> {
        self.0.batch_width()
    }

    /// The REPL session's settings.
    pub(crate) fn session_config(&self) -> PyResult<SessionConfig> {
        self.0.session_config(Spelling::Keyword).map_err(invalid)
    }

    /// The loop's settings.
    pub(crate) fn rlm_config(&self) -> PyResult<RlmConfig> {
        self.0.rlm_config(Spelling::Keyword).map_err(invalid)
    }

    /// Where the trajectory goes, if anywhere.
    pub(crate) fn trajectory(&self) -> Option<&Path> {
        self.0.trajectory.as_deref()
    }
}
