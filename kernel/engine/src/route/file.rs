//! `agent_class: RouterAgent` in workflow files: the control plane built from a router's file.
//!
//! A router's file maps onto the pieces above, not a router of its own:
//!
//! - `sub_agents` are the nodes, each wrapped in [`Retrying`] (its `retry`, by default 3
//!   attempts waiting 1 s, doubling, at most 10 s). They are built with a registry that puts
//!   every LLM agent's final reply on record in `messages` (`{author, content, topic}`, the
//!   topic from `topic: {state_key: K}` or `topic: {reply_field: F}`), so circular logic
//!   between LLM agents is seen.
//! - `name`, `mode`, `successors`, `recovery` and `max_exchanges` (default 3) are the
//!   [`RouterConfig`]; `start` and `max_steps` (default 1000) the graph's.
//! - Each node's `gates` are [`Gate`]s: `when` a state test, `python` a check function
//!   `(state) -> bool | {"passed": bool, "reason": str}` (bound through the registry's Python
//!   functions; one that raises fails the gate with the error as its reason).
//!
//! [`register`] teaches a [`Registry`] the class; `build_router` builds one router (with a
//! decision log, for callers that keep one) and keeps its graph and plane reachable, which
//! durable runs need.
//!
//! ```yaml
//! agent_class: RouterAgent
//! name: team
//! mode: active
//! start: dev
//! topic: {state_key: story}
//! sub_agents:
//!   - config_path: dev.yaml
//!     retry: {attempts: 2, initial: 0.5, max: 4}
//!   - config_path: tea.yaml
//!     gates:
//!       - {name: reviewed, when: {key: review, exists: true}}
//! successors:
//!   dev: tea
//!   tea:
//!     - {when: {key: review, contains: REJECTED}, to: dev}
//!     - {to: END}
//! recovery: {reviewed: tea}
//! ```

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;

use super::config::{Branch, RouterConfig, RouterMode, Successor};
use super::gate::{Gate, GateCheck, QualityCheck};
use super::plane::ControlPlane;
use super::record::DecisionLog;
use super::retry::{Backoff, Retrying};
use crate::condition::StateFunction;
use crate::flow::file::{
    AgentClass, AgentConfig, AgentSpec, ConfigError, ConfigErrorKind, RetryConfig,
    RouterAgentConfig, RoutingMode, SuccessorConfig,
};
use crate::flow::{
    Agent, Callbacks, Control, DEFAULT_MAX_STEPS, FlowError, Graph, InvocationContext,
    MessageRecord, Registry, class,
};
use crate::state::State;

/// `registry`, able to build `RouterAgent`s.
pub fn register(registry: Registry) -> Registry {
    registry.with_class(AgentClass::RouterAgent, |spec, registry| {
        Ok(Arc::new(build_router(spec, registry, None)?) as Arc<dyn Agent>)
    })
}

/// A router built from its file: a graph whose every node leaves through its control plane.
pub struct RouterAgent {
    graph: Graph,
    plane: Arc<ControlPlane>,
    description: String,
}

impl std::fmt::Debug for RouterAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouterAgent")
            .field("graph", &self.graph)
            .field("plane", &self.plane)
            .finish_non_exhaustive()
    }
}

impl RouterAgent {
    /// The graph of its nodes, carrying the router's own callbacks (what a durable run
    /// executes).
    pub(crate) fn graph(&self) -> &Graph {
        &self.graph
    }

    /// Its control plane (what a durable run observes).
    pub(crate) fn plane(&self) -> &Arc<ControlPlane> {
        &self.plane
    }
}

#[async_trait]
impl Agent for RouterAgent {
    fn name(&self) -> &str {
        self.graph.name()
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn class(&self) -> &str {
        class::ROUTER
    }

    fn sub_agents(&self) -> Vec<Arc<dyn Agent>> {
        self.graph.nodes().to_vec()
    }

    fn callbacks(&self) -> &Callbacks {
        self.graph.callbacks()
    }

    async fn run(&self, ctx: &InvocationContext) -> Result<Control, FlowError> {
        self.graph.run(ctx).await
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }
}

/// The router `spec` describes, its decisions also written to `log`; see the module docs.
pub(crate) fn build_router(
    spec: &AgentSpec,
    registry: &Registry,
    log: Option<DecisionLog>,
) -> Result<RouterAgent, ConfigError> {
    let AgentConfig::Router(file) = &spec.config else {
        return Err(spec.error_at(
            "agent_class",
            None,
            ConfigErrorKind::Invalid,
            "Expected a `RouterAgent` here",
        ));
    };
    let callbacks = registry.callbacks_for(spec)?;
    let nodes_registry = registry.clone().recording_messages(MessageRecord {
        topic: file.topic.clone(),
    });
    let mut plane = ControlPlane::new(router_config(spec, file, registry)?);
    let mut nodes = Vec::with_capacity(spec.sub_agents.len());
    for (node, sub) in file.sub_agents.iter().zip(&spec.sub_agents) {
        let agent = nodes_registry.build(sub)?;
        let name = agent.name().to_owned();
        let gates = node
            .gates
            .iter()
            .map(|gate| {
                let check = match (&gate.when, &gate.python) {
                    (Some(when), _) => {
                        GateCheck::State(Box::new(registry.bind_condition(spec, when)?))
                    }
                    (None, Some(function)) => GateCheck::Custom(Arc::new(PythonGate {
                        function: function.clone(),
                        call: registry.python_function(spec, function)?,
                    })),
                    (None, None) => {
                        return Err(spec.error_at(
                            "name",
                            Some(&gate.name),
                            ConfigErrorKind::Invalid,
                            format!(
                                "Gate `{}` names no check; give `when` or `python`",
                                gate.name
                            ),
                        ));
                    }
                };
                Ok(Gate {
                    name: gate.name.clone(),
                    check,
                    blocking: gate.blocking,
                })
            })
            .collect::<Result<Vec<_>, ConfigError>>()?;
        if !gates.is_empty() {
            plane = plane.with_gates(name, gates);
        }
        nodes.push(Arc::new(Retrying::new(agent, backoff(&node.retry))) as Arc<dyn Agent>);
    }
    if let Some(log) = log {
        plane = plane.with_log(log);
    }
    let plane = Arc::new(plane);
    let graph = plane
        .builder(file.name.as_str(), nodes, &file.start)
        .max_steps(file.max_steps.unwrap_or(DEFAULT_MAX_STEPS))
        .build()
        .map_err(|e| {
            spec.error_at(
                "name",
                Some(file.name.as_str()),
                ConfigErrorKind::Invalid,
                e.to_string(),
            )
        })?
        // On the graph, so a durable run (which drives the graph) runs them too.
        .with_callbacks(callbacks);
    Ok(RouterAgent {
        graph,
        plane,
        description: file.description.clone(),
    })
}

/// The [`RouterConfig`] of a router's file, `python` tests bound.
fn router_config(
    spec: &AgentSpec,
    file: &RouterAgentConfig,
    registry: &Registry,
) -> Result<RouterConfig, ConfigError> {
    let mut config = RouterConfig {
        name: file.name.as_str().to_owned(),
        mode: match file.mode {
            RoutingMode::Active => RouterMode::Active,
            RoutingMode::Passive => RouterMode::Passive,
        },
        nodes: spec
            .sub_agents
            .iter()
            .map(|s| s.config.name().to_owned())
            .collect(),
        recovery: file.recovery.clone(),
        ..RouterConfig::default()
    };
    if let Some(max) = file.max_exchanges {
        config.max_exchanges = max;
    }
    for (from, next) in &file.successors {
        let successor = match next {
            SuccessorConfig::Node(to) => Successor::Node(to.clone()),
            SuccessorConfig::Branches(branches) => Successor::Branches(
                branches
                    .iter()
                    .map(|b| {
                        let when = b
                            .when
                            .as_ref()
                            .map(|c| registry.bind_condition(spec, c))
                            .transpose()?;
                        Ok(Branch {
                            when,
                            to: b.to.clone(),
                        })
                    })
                    .collect::<Result<_, ConfigError>>()?,
            ),
        };
        config.successors.insert(from.clone(), successor);
    }
    Ok(config)
}

/// The backoff `retry` asks for; unset parts keep [`Backoff::default`].
fn backoff(retry: &RetryConfig) -> Backoff {
    let default = Backoff::default();
    // The loader refused negative and non-finite seconds.
    let secs = |s: Option<f64>, or: Duration| {
        s.and_then(|s| Duration::try_from_secs_f64(s).ok())
            .unwrap_or(or)
    };
    Backoff {
        attempts: retry.attempts.map_or(default.attempts, |n| n.get()),
        initial: secs(retry.initial, default.initial),
        max: secs(retry.max, default.max),
        ..default
    }
}

/// A gate checked by a Python function; see the module docs for what it may return.
#[derive(Debug)]
struct PythonGate {
    function: String,
    call: Arc<dyn StateFunction>,
}

impl QualityCheck for PythonGate {
    fn check(&self, state: &State) -> Result<(), String> {
        let name = &self.function;
        let passed = |result: &serde_json::Map<String, Value>| result.get("passed").cloned();
        match self.call.call(state) {
            Ok(Value::Bool(true)) => Ok(()),
            Ok(Value::Bool(false)) => Err(format!("`{name}` returned False")),
            Ok(Value::Object(result)) => match passed(&result) {
                Some(Value::Bool(true)) => Ok(()),
                Some(Value::Bool(false)) => Err(result
                    .get("reason")
                    .and_then(Value::as_str)
                    .map_or_else(|| format!("`{name}` did not pass"), str::to_owned)),
                _ => Err(format!(
                    "`{name}` returned a dict without a bool `passed`; a gate check returns a \
                     bool or {{\"passed\": bool, \"reason\": str}}"
                )),
            },
            Ok(other) => Err(format!(
                "`{name}` returned {other}; a gate check returns a bool or {{\"passed\": bool, \
                 \"reason\": str}}"
            )),
            Err(error) => Err(format!("`{name}` failed: {error}")),
        }
    }
}
