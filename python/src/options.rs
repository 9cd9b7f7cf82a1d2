//! The keyword options of `RLM(...)`, `llm_query(...)`, `configure(...)` and `%%rlm`: the
//! kernel's one schema (`kernel::options`), spelled as keywords (`max_iterations`).
//!
//! The Python layer holds no list of options: it asks [`option_specs`] for them (to check
//! names, build the magics' flags, document them) and sends what it was given as JSON. The
//! layers are merged here with the kernel's own readers: keywords > session defaults
//! (`%rlm_config`, `configure`) > `RLM_*` variables > the `[run]` table of `rlm.toml` (the file
//! `RLM_CONFIG` names, else `./rlm.toml`). Options of the `rlm` command's own output (`json`,
//! `quiet`, `force`, `answer_file`) and of `rlm agent`'s sandbox (`project_root`,
//! `allow_broad_root`, `allow_hard_links`) and of `rlm flow`'s run database (`db`,
//! `lease_expiry`) are ignored from the environment and the file and refused as keywords.

use std::error::Error as _;

use kernel::options::{
    ALL_GROUPS, Group, Groups, Kind, OPTIONS, OptionError, OptionSpec, RunOptions, Source,
};
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use serde_json::{Map, Value};

/// The groups of options the Python package has a use for: not the `rlm` command's own
/// output, nor the sandbox of agent bundles, nor the run database of workflows (it runs
/// neither).
pub(crate) const PYTHON: Groups = ALL_GROUPS
    & !Group::Answer.bit()
    & !Group::Output.bit()
    & !Group::Agent.bit()
    & !Group::Database.bit()
    & !Group::Lease.bit();

/// `error` and its causes as one Python exception: `TypeError` for an unknown name,
/// `RuntimeError` for a configuration file that cannot be read, else `ValueError`.
pub(crate) fn invalid(error: OptionError) -> PyErr {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    match error {
        OptionError::Unknown { .. } => PyTypeError::new_err(message),
        OptionError::File { .. } | OptionError::PromptFile { .. } | OptionError::Endpoints(_) => {
            PyRuntimeError::new_err(message)
        }
        _ => PyValueError::new_err(message),
    }
}

/// `json` (an object of keyword arguments) read as options, `where_` naming the call in
/// errors; an option the package has no use for is refused.
pub(crate) fn keywords(json: &str, where_: &str) -> PyResult<RunOptions> {
    let map: Map<String, Value> = serde_json::from_str(json)
        .map_err(|e| PyValueError::new_err(format!("{where_}: invalid options: {e}")))?;
    let options = RunOptions::from_json(&Source::Keyword, &map).map_err(|e| match e {
        OptionError::Unknown { given, known, .. } => PyTypeError::new_err(format!(
            "{where_} got an unknown option {given}; the options are {known}"
        )),
        other => invalid(other),
    })?;
    let unused = options
        .to_map()
        .keys()
        .find_map(|name| kernel::options::spec(name).filter(|spec| PYTHON & spec.group.bit() == 0));
    if let Some(spec) = unused {
        let why = match spec.group {
            Group::Agent => {
                "of the sandbox of `rlm agent`'s bundle tools; the package runs no agent bundles"
            }
            Group::Database | Group::Lease => {
                "of `rlm flow`'s run database; the package runs no workflows"
            }
            _ => {
                "of the `rlm` command's output; a result object has no use for it (read \
                 `result.answer` or `result.to_dict()`)"
            }
        };
        return Err(PyTypeError::new_err(format!(
            "{where_}: `{}` is an option {why}",
            spec.name
        )));
    }
    Ok(options)
}

/// The options of a call: `explicit` keywords over the session `defaults` (both JSON
/// objects) over the environment over `rlm.toml`, with what the package has no use for left
/// out.
pub(crate) fn resolve(explicit: &str, defaults: &str, where_: &str) -> PyResult<RunOptions> {
    let explicit = keywords(explicit, where_)?;
    let defaults = keywords(
        defaults,
        "The session defaults (`%rlm_config`, `configure()`)",
    )?;
    let (merged, _file) = explicit.combine(defaults).layered(None).map_err(invalid)?;
    Ok(merged.only(PYTHON))
}

/// `check_options(options_json, where) -> str`: the options checked and in their canonical
/// form (JSON), as `configure()` and `%rlm_config` store them; raises as `RLM()` would.
#[pyfunction]
pub(crate) fn check_options(options_json: &str, r#where: &str) -> PyResult<String> {
    let options = keywords(options_json, r#where)?;
    Ok(Value::Object(options.to_map()).to_string())
}

/// `option_specs(every=False) -> list[dict]`: every option the package takes (with
/// `every`, also those of the `rlm` command's output it ignores from `rlm.toml`), in the
/// schema's order: `name`, `key` (in `rlm.toml`), `flag` (for `%%rlm`), `help`, `kind`,
/// `choices`, `repeated`, `env`, `example`, `used` (whether the package uses it).
#[pyfunction]
#[pyo3(signature = (every=false))]
pub(crate) fn option_specs(py: Python<'_>, every: bool) -> PyResult<Vec<Bound<'_, PyDict>>> {
    OPTIONS
        .iter()
        .filter(|spec| every || PYTHON & spec.group.bit() != 0)
        .map(|spec| spec_dict(py, spec))
        .collect()
}

fn spec_dict<'py>(py: Python<'py>, spec: &OptionSpec) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    dict.set_item("name", spec.name)?;
    dict.set_item("key", spec.file_key())?;
    dict.set_item("flag", spec.flag_name())?;
    dict.set_item("help", spec.help_text())?;
    let (kind, choices): (&str, Vec<&str>) = match spec.kind {
        Kind::Text | Kind::Variable | Kind::Price | Kind::Character | Kind::Database => {
            ("text", Vec::new())
        }
        Kind::Url => ("url", Vec::new()),
        Kind::Path => ("path", Vec::new()),
        Kind::Whole { .. } => ("integer", Vec::new()),
        Kind::Number | Kind::Seconds | Kind::Usd => ("number", Vec::new()),
        Kind::Choice(choices) => ("choice", choices.iter().map(|c| c.name).collect()),
        Kind::Width => ("width", Vec::new()),
        Kind::Switch => ("switch", Vec::new()),
        Kind::Size { .. } => ("size", Vec::new()),
    };
    dict.set_item("kind", kind)?;
    dict.set_item("choices", choices)?;
    dict.set_item("repeated", spec.repeated)?;
    dict.set_item("env", spec.env)?;
    dict.set_item("example", spec.example)?;
    dict.set_item("used", PYTHON & spec.group.bit() != 0)?;
    Ok(dict)
}
