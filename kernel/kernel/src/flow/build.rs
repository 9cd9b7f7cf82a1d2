//! The kernel's part of building workflow files: [`register`] adds to the engine's
//! [`Registry`] the classes that need Python (`RlmAgent`, `PythonAgent`) and Python
//! callables as callbacks. Every error points at the file, line and column of the key that
//! is wrong.
//!
//! - `PythonAgent`: `function` is `module:function`, `module.function` or
//!   `file.py:function` (relative to the agent's file); `args` are keyword arguments. The
//!   built-in `rlm:load_contexts` is the [`ContextLoader`] (`args`: `paths_key`,
//!   `output_key`).
//! - `RlmAgent`: `model` names the root endpoint (absent: the registry's default model),
//!   `max_iterations` the loop's limit; `args` may set `run_timeout` (seconds),
//!   `max_consecutive_failures` and `max_history_chars`. The sub-model is the run's
//!   (`llm_query(model=...)` picks others).
//! - Tools: a `name` no registered tool has that is a Python function reference as above
//!   (relative to the workflow's root folder) is a [`PythonFunctionTool`](crate::tools::PythonFunctionTool),
//!   described when the file is built (see `flow_tool.rs`).
//! - Callbacks: a `name` no registered callback has is a Python function reference as
//!   above; a file path is relative to the workflow's root folder (the registry hands the
//!   callback factory only the `{name, args}` entry).
//! - `python` tests of conditions and gates: a function reference as above, relative to the
//!   file that names it ([`PythonStateFunction`]).
//! - `RouterAgent`: the engine's ([`engine::route::file`]), registered here too so every
//!   workflow `rlm flow run` builds can use it.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use engine::flow::file::{
    AgentClass, AgentConfig, AgentSpec, ConfigError, ConfigErrorKind, PythonAgentConfig,
    RlmAgentConfig,
};
use engine::flow::{Agent, Callbacks, Registry};
use serde::Deserialize;
use serde_json::{Map, Value};

use super::callbacks::PythonCallback;
use super::contexts::{CONTEXTS_KEY, ContextLoader};
use super::flow_tool::python_flow_tool;
use super::python::PyFunction;
use super::python_agent::PythonAgent;
use super::rlm_agent::RlmAgent;
use super::services::FlowKernel;
use super::state_fn::PythonStateFunction;
use crate::rlm::RlmConfig;

/// The `function` of a `PythonAgent` that is the built-in context loader.
pub const LOAD_CONTEXTS: &str = "rlm:load_contexts";

/// The keys a step of the kernel's own writes, for the check of a run's inputs
/// (`engine::inputs`): the context loader writes its `args.output_key` (default
/// [`CONTEXTS_KEY`]); `None` for any other function.
pub fn step_writes(function: &str, args: &Map<String, Value>) -> Option<Vec<String>> {
    (function == LOAD_CONTEXTS).then(|| {
        let key = args.get("output_key").and_then(Value::as_str);
        vec![key.unwrap_or(CONTEXTS_KEY).to_owned()]
    })
}

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

/// `registry` with the kernel's classes and Python callbacks, all working in `kernel`'s
/// session; Python callback files are relative to `root_dir` (the root workflow file's
/// folder).
pub fn register(registry: Registry, kernel: &Arc<FlowKernel>, root_dir: &Path) -> Registry {
    let (python, rlm, callbacks) = (Arc::clone(kernel), Arc::clone(kernel), Arc::clone(kernel));
    let tests = Arc::clone(kernel);
    let tools = Arc::clone(kernel);
    let root_dir = root_dir.to_owned();
    let tools_dir = root_dir.clone();
    engine::route::file::register(registry)
        .with_python_functions(move |spec, name| {
            let function = PyFunction::parse(name, base_of(spec)).map_err(|e| e.to_string())?;
            tests.allow_read(function.folder());
            Ok(Arc::new(PythonStateFunction::new(
                function,
                Arc::clone(&tests),
            )))
        })
        .with_class(AgentClass::PythonAgent, move |spec, registry| {
            let AgentConfig::Python(config) = &spec.config else {
                return Err(not_class(spec, AgentClass::PythonAgent));
            };
            python_agent(spec, config, &python, registry.callbacks_for(spec)?)
        })
        .with_class(AgentClass::RlmAgent, move |spec, registry| {
            let AgentConfig::Rlm(config) = &spec.config else {
                return Err(not_class(spec, AgentClass::RlmAgent));
            };
            let callbacks = registry.callbacks_for(spec)?;
            let endpoint = registry.endpoint(spec, config.model.as_deref())?;
            let agent = rlm_agent(spec, config, endpoint.name(), &rlm, callbacks)?;
            Ok(Arc::new(agent) as Arc<dyn Agent>)
        })
        .with_tool_fallback(move |tool| {
            // A plain name that is no Python reference stays an unknown tool.
            let function = PyFunction::parse(&tool.name, &tools_dir).ok()?;
            tools.allow_read(function.folder());
            Some(
                python_flow_tool(function, &tool.args, Arc::clone(&tools))
                    .map(|t| Arc::new(t) as Arc<dyn engine::Tool>)
                    .map_err(|e| e.to_string()),
            )
        })
        .with_callback_fallback(move |code| {
            let function = PyFunction::parse(&code.name, &root_dir).map_err(|e| e.to_string())?;
            callbacks.allow_read(function.folder());
            Ok(Arc::new(PythonCallback::new(
                function,
                code.args.clone(),
                Arc::clone(&callbacks),
            )))
        })
}

fn not_class(spec: &AgentSpec, class: AgentClass) -> ConfigError {
    spec.error_at(
        "agent_class",
        None,
        ConfigErrorKind::Invalid,
        format!("Expected a `{}` here", class.as_str()),
    )
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
    kernel.allow_read(function.folder());
    Ok(Arc::new(
        PythonAgent::new(name, function, config.args.clone(), Arc::clone(kernel))
            .with_description(config.description.clone())
            .with_callbacks(callbacks),
    ))
}

fn rlm_agent(
    spec: &AgentSpec,
    config: &RlmAgentConfig,
    root: &str,
    kernel: &Arc<FlowKernel>,
    callbacks: Callbacks,
) -> Result<RlmAgent, ConfigError> {
    let args: RlmArgs = args_of(
        spec,
        &config.args,
        "`run_timeout`, `max_consecutive_failures` and `max_history_chars`",
    )?;
    let mut rlm = RlmConfig {
        root_endpoint: root.to_owned(),
        ..RlmConfig::default()
    };
    if let Some(sub) = &config.sub_model
        && kernel.endpoints().get(sub).is_err()
    {
        return Err(spec.error_at(
            "sub_model",
            Some(sub),
            ConfigErrorKind::Unknown,
            format!(
                "There is no model `{sub}`; configured models: {}",
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
