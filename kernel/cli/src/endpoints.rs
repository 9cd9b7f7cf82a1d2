//! From settings to the kernel: the `root`, `sub` and `--extra-model` endpoints with their
//! shared budget ledger, the REPL session's and the loop's configurations, through
//! `kernel::options` (the resolution the Python package uses too), with errors naming the
//! flags. Option errors are usage errors (exit 2).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use bridge::Endpoints;
use kernel::options::{Keys, RunOptions, Spelling};
use kernel::repl::SessionConfig;
use kernel::rlm::RlmConfig;
use serde_json::{Map, Value};

use crate::settings::{offers, option_error};

/// The model and loop options as the Python package's keywords, for runs made through it
/// (`rlm eval --ray`): `rlm eval`'s options of the schema that the package takes, paths made
/// absolute (the runs happen in other folders). `--trajectory` is left out: each command
/// names its own files.
pub(crate) fn keyword_options(opts: &RunOptions) -> Result<Map<String, Value>> {
    let mut kept = opts.clone();
    kept.trajectory = None;
    for path in [&mut kept.prompt_extension, &mut kept.system_prompt]
        .into_iter()
        .flatten()
    {
        *path = std::path::absolute(&*path)?;
    }
    Ok(kept.only(offers::RAY).to_map())
}

/// The `root`, `sub` and `--extra-model` endpoints, sharing one ledger with the run's
/// budget; a server off this machine must have an API key.
pub(crate) fn build_endpoints(opts: &RunOptions) -> Result<Arc<Endpoints>> {
    endpoints(opts, Keys::Required)
}

/// The endpoints of a run that may call no model (a workflow of Python steps): those of
/// [`build_endpoints`] when `needed` or a root model is named, else none — a sub-call the
/// code makes then fails, saying to give `--model` ([`RunOptions::endpoints_if_needed`]).
pub(crate) fn endpoints_if_needed(opts: &RunOptions, needed: bool) -> Result<Arc<Endpoints>> {
    opts.endpoints_if_needed(Spelling::Flag, Keys::Required, needed)
        .map_err(option_error)
}

/// The endpoints of `opts`; with [`Keys::Optional`] a server off this machine needs no key
/// (nothing will be sent).
pub(crate) fn endpoints(opts: &RunOptions, keys: Keys) -> Result<Arc<Endpoints>> {
    opts.endpoints(Spelling::Flag, keys).map_err(option_error)
}

/// The REPL session's settings.
pub(crate) fn session_config(opts: &RunOptions) -> Result<SessionConfig> {
    opts.session_config(Spelling::Flag).map_err(option_error)
}

/// The RLM loop's settings (reads the prompt files).
pub(crate) fn rlm_config(opts: &RunOptions) -> Result<RlmConfig> {
    opts.rlm_config(Spelling::Flag).map_err(option_error)
}

/// The whole run's wall-clock limit.
pub(crate) fn run_timeout(opts: &RunOptions) -> Result<Option<Duration>> {
    opts.run_timeout(Spelling::Flag).map_err(option_error)
}
