//! Kernel agents from workflow files: `RlmAgent` and `PythonAgent` specs, and Python
//! callables named in any agent's `*_callbacks` lists.
//!
//! The engine reads the files ([`engine::flow::file`]) and builds the agents it knows; the
//! classes that need Python come here. Every error points at the file, line and column of
//! the key that is wrong.
//!
//! - `PythonAgent`: `function` is `module:function`, `module.function` or
//!   `file.py:function` (relative to the workflow file); `args` are keyword arguments. The
//!   built-in `rlm:load_contexts` is the [`ContextLoader`] (`args`: `paths_key`,
//!   `output_key`).
//! - `RlmAgent`: `model` names the root endpoint (default `root`), `max_iterations` the
//!   loop's limit; `args` may set `run_timeout` (seconds), `max_consecutive_failures` and
//!   `max_history_chars`. The sub-model is the run's (`llm_query(model=...)` picks others).
//! - Callbacks: `{name, args}` with `name` a Python function reference as above.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use engine::flow::Callbacks;
use engine::flow::file::{
    AgentConfig, AgentSpec, ConfigError, ConfigErrorKind, PythonAgentConfig, RlmAgentConfig,
};
use serde::Deserialize;
use serde_json::{Map, Value};

use super::callbacks::{CallbackPoint, PythonCallback};
use super::contexts::ContextLoader;
use super::python::PyFunction;
use super::python_agent::PythonAgent;
use super::rlm_agent::RlmAgent;
use super::services::FlowKernel;
use crate::rlm::RlmConfig;
use engine::flow::Agent;

/// The `function` of a `PythonAgent` that is the built-in context loader.
pub const LOAD_CONTEXTS: &str = "rlm:load_contexts";

/// The folder relative paths of `spec`'s file start from.
fn base_of(spec: &AgentSpec) -> &Path {
    spec.file.parent().unwrap_or_else(|| Path::new(""))
}

fn function_of(spec: &AgentSpec, key: &str, reference: &str) -> Result<PyFunction, ConfigError> {
    PyFunction::parse(reference, base_of(spec)).map_err(|e| {
        spec.error_at(
            key,
            Some(reference),
            ConfigErrorKind::Invalid,
            e.to_string(),
        )
    })
}

/// The Python callables `spec` names in its `*_callbacks` lists, each at its point.
pub fn python_callbacks(
    spec: &AgentSpec,
    kernel: &Arc<FlowKernel>,
) -> Result<Callbacks, ConfigError> {
    let mut callbacks = Callbacks::new();
    for (list, code) in spec.config.callbacks().all() {
        let point = CallbackPoint::from_list(list).ok_or_else(|| {
            spec.error_at(
                list,
                None,
                ConfigErrorKind::Unknown,
                format!("`{list}` is not a callback point"),
            )
        })?;
        let function = function_of(spec, "name", &code.name)?;
        callbacks.push(Arc::new(PythonCallback::new(
            point,
            function,
            code.args.clone(),
            Arc::clone(kernel),
        )));
    }
    Ok(callbacks)
}

/// The agent for a `PythonAgent` or `RlmAgent` spec; `None` for the classes the engine
/// builds.
pub fn build_kernel_agent(
    spec: &AgentSpec,
    kernel: &Arc<FlowKernel>,
) -> Result<Option<Arc<dyn Agent>>, ConfigError> {
    let callbacks = python_callbacks(spec, kernel)?;
    Ok(match &spec.config {
        AgentConfig::Python(config) => Some(python_agent(spec, config, kernel, callbacks)?),
        AgentConfig::Rlm(config) => Some(Arc::new(rlm_agent(spec, config, kernel, callbacks)?)),
        _ => None,
    })
}

/// What `args` of `rlm:load_contexts` may set.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LoaderArgs {
    paths_key: Option<String>,
    output_key: Option<String>,
}

/// What `args` of an `RlmAgent` may set.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RlmArgs {
    run_timeout: Option<f64>,
    max_consecutive_failures: Option<u32>,
    max_history_chars: Option<usize>,
}

fn args_of<T: for<'de> Deserialize<'de>>(
    spec: &AgentSpec,
    args: &Map<String, Value>,
    expected: &str,
) -> Result<T, ConfigError> {
    serde_json::from_value(Value::Object(args.clone())).map_err(|e| {
        spec.error_at(
            "args",
            None,
            ConfigErrorKind::Invalid,
            format!("{e}; `args` here may set {expected}"),
        )
    })
}

fn python_agent(
    spec: &AgentSpec,
    config: &PythonAgentConfig,
    kernel: &Arc<FlowKernel>,
    callbacks: Callbacks,
) -> Result<Arc<dyn Agent>, ConfigError> {
    let name = config.name.as_str();
    if config.function == LOAD_CONTEXTS {
        let args: LoaderArgs = args_of(spec, &config.args, "`paths_key` and `output_key`")?;
        let mut loader = ContextLoader::new(name, Arc::clone(kernel)).with_callbacks(callbacks);
        if let Some(key) = args.paths_key {
            loader = loader.with_paths_key(key);
        }
        if let Some(key) = args.output_key {
            loader = loader.with_output_key(key);
        }
        return Ok(Arc::new(loader));
    }
    let function = function_of(spec, "function", &config.function)?;
    Ok(Arc::new(
        PythonAgent::new(name, function, config.args.clone(), Arc::clone(kernel))
            .with_description(config.description.clone())
            .with_callbacks(callbacks),
    ))
}

fn rlm_agent(
    spec: &AgentSpec,
    config: &RlmAgentConfig,
    kernel: &Arc<FlowKernel>,
    callbacks: Callbacks,
) -> Result<RlmAgent, ConfigError> {
    let args: RlmArgs = args_of(
        spec,
        &config.args,
        "`run_timeout`, `max_consecutive_failures` and `max_history_chars`",
    )?;
    let mut rlm = RlmConfig::default();
    if let Some(model) = &config.model {
        if kernel.endpoints().get(model).is_err() {
            return Err(spec.error_at(
                "model",
                Some(model),
                ConfigErrorKind::Unknown,
                format!(
                    "No model endpoint is named `{model}`; the run has {}",
                    kernel
                        .endpoints()
                        .names()
                        .iter()
                        .map(|n| format!("`{n}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
        rlm.root_endpoint = model.clone();
    }
    if let Some(sub) = &config.sub_model
        && kernel.endpoints().get(sub).is_err()
    {
        return Err(spec.error_at(
            "sub_model",
            Some(sub),
            ConfigErrorKind::Unknown,
            format!("No model endpoint is named `{sub}`"),
        ));
    }
    if let Some(max) = config.max_iterations {
        rlm.max_iterations = max.get();
    }
    if let Some(secs) = args.run_timeout {
        rlm.run_timeout = Some(Duration::try_from_secs_f64(secs).map_err(|e| {
            spec.error_at(
                "run_timeout",
                None,
                ConfigErrorKind::Invalid,
                format!("`run_timeout` must be a positive number of seconds: {e}"),
            )
        })?);
    }
    if let Some(n) = args.max_consecutive_failures {
        rlm.max_consecutive_failures = Some(n);
    }
    rlm.max_history_chars = args.max_history_chars.or(rlm.max_history_chars);
    let mut agent = RlmAgent::new(
        config.name.as_str(),
        config.instruction.clone(),
        rlm,
        Arc::clone(kernel),
    )
    .with_description(config.description.clone())
    .with_callbacks(callbacks);
    if let Some(key) = &config.output_key {
        agent = agent.with_output_key(key.clone());
    }
    Ok(agent)
}
