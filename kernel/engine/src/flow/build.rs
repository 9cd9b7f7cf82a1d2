//! From workflow files to agents: the [`Registry`] of what names mean.
//!
//! A file names models, tools, callbacks and classes; the registry says what each name is.
//! Models are the endpoints of a [`bridge::Endpoints`] (absent `model`: the default one).
//! Tools are the built-ins (`exit_loop`, `end_turn`, `escalate`), `AgentTool` (another agent
//! read from its file), tool factories registered by name, then a fallback (the kernel's, for
//! Python functions by reference). Callbacks are factories
//! registered by name, then a fallback (the kernel's, for Python callables by dotted name);
//! a callback named under one point (`before_tool_callbacks`) acts only there. The engine
//! builds `LlmAgent`, `LoopAgent`, `SequentialAgent`, `ParallelAgent` and `GraphAgent` itself;
//! `RouterAgent` comes from the factory of the routing control plane
//! (`engine::route::file::register`, which sits above this module), `RlmAgent` and
//! `PythonAgent` from factories the kernel registers. An `LlmAgent` with `persona: NAME`
//! plays that agent of the registry's [`PersonaBundle`]: the persona goes before its
//! instruction and it may name the bundle's tools (`load_workflow_file`, ...). A `python`
//! test in a condition or gate is bound through the Python-function factory the kernel
//! registers ([`Registry::with_python_functions`]). Every unknown name is a [`ConfigError`]
//! pointing at its line, listing what is known.
//!
//! **An LLM router** needs no class of its own: an `LlmAgent` node with an `output_key`
//! (say `route`, instructed to answer with one word) followed by conditional edges on that
//! key (`when: {key: route, equals: billing}`) routes by what the model says.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use async_trait::async_trait;
use bridge::{BridgeError, ChatRequest, ChatResponse, Endpoint, Endpoints};
use serde_json::Value;

use super::agent::Agent;
use super::callbacks::{Callback, CallbackContext, Callbacks, ToolInvocation};
use super::context::InvocationContext;
use super::error::FlowError;
use super::file::load::listed;
use super::file::{
    AGENT_TOOL, AgentClass, AgentConfig, AgentSpec, CodeRef, ConfigError, ConfigErrorKind, END,
    EdgeConfig, LlmAgentConfig, ToolRef,
};
use super::graph::{DEFAULT_MAX_STEPS, Graph, GraphError, Router, Target};
use super::llm::{LlmAgent, MessageRecord, builtin_tool};
use crate::agent::{LoopConfig, ToolCallError};
use crate::bundle::{BundleError, PERSONA_TOOLS, PersonaAgent, PersonaBundle};
use crate::condition::{Condition, StateFunction};
use crate::hook::HookAction;
use crate::tool::Tool;

/// Makes a tool from its `{name, args}` entry; the error says what is wrong with the args.
pub(crate) type ToolFactory = Arc<dyn Fn(&Value) -> Result<Arc<dyn Tool>, String> + Send + Sync>;

/// Makes a tool from an entry no registered name matches: `None` when the name is not one it
/// knows (the name is then an unknown tool), else the tool or what is wrong with the entry.
pub(crate) type ToolFallback =
    Arc<dyn Fn(&ToolRef) -> Option<Result<Arc<dyn Tool>, String>> + Send + Sync>;

/// Makes a callback from its `{name, args}` entry.
pub(crate) type CallbackFactory =
    Arc<dyn Fn(&CodeRef) -> Result<Arc<dyn Callback>, String> + Send + Sync>;

/// Builds an agent of a class the engine does not build itself (`RlmAgent`, `PythonAgent`).
pub(crate) type AgentFactory =
    Arc<dyn Fn(&AgentSpec, &Registry) -> Result<Arc<dyn Agent>, ConfigError> + Send + Sync>;

/// Makes the function a `python` test names (`module.function` or `file.py:function`,
/// relative to `spec`'s file); the error says what is wrong with the name.
pub(crate) type PythonFunctionFactory =
    Arc<dyn Fn(&AgentSpec, &str) -> Result<Arc<dyn StateFunction>, String> + Send + Sync>;

/// What the names in workflow files mean; see the module docs.
#[derive(Clone)]
pub struct Registry {
    endpoints: Arc<Endpoints>,
    default_model: String,
    loop_config: LoopConfig,
    tools: BTreeMap<String, ToolFactory>,
    tool_fallback: Option<ToolFallback>,
    callbacks: BTreeMap<String, CallbackFactory>,
    callback_fallback: Option<CallbackFactory>,
    classes: HashMap<AgentClass, AgentFactory>,
    bundle: Option<Arc<PersonaBundle>>,
    python_functions: Option<PythonFunctionFactory>,
    messages: Option<MessageRecord>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("models", &self.endpoints.names())
            .field("default_model", &self.default_model)
            .field("tools", &self.tools.keys().collect::<Vec<_>>())
            .field("callbacks", &self.callbacks.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl Registry {
    /// Models from `endpoints`; `default_model` for agents that name none.
    pub fn new(endpoints: Arc<Endpoints>, default_model: impl Into<String>) -> Self {
        Self {
            endpoints,
            default_model: default_model.into(),
            loop_config: LoopConfig::default(),
            tools: BTreeMap::new(),
            tool_fallback: None,
            callbacks: BTreeMap::new(),
            callback_fallback: None,
            classes: HashMap::new(),
            bundle: None,
            python_functions: None,
            messages: None,
        }
    }

    /// Where the personas that `persona:` names come from.
    pub fn with_bundle(mut self, bundle: PersonaBundle) -> Self {
        self.bundle = Some(Arc::new(bundle));
        self
    }

    /// Makes the functions `python` tests name (the kernel: Python in the embedded REPL).
    pub fn with_python_functions(
        mut self,
        factory: impl Fn(&AgentSpec, &str) -> Result<Arc<dyn StateFunction>, String>
        + Send
        + Sync
        + 'static,
    ) -> Self {
        self.python_functions = Some(Arc::new(factory));
        self
    }

    /// LLM agents built from here on put each final reply on record in `messages` (what a
    /// router does for the agents below it, so it can see their exchanges).
    pub(crate) fn recording_messages(mut self, record: MessageRecord) -> Self {
        self.messages = Some(record);
        self
    }

    /// The function the `python` test `name` of `spec`'s file names, or an error at that
    /// line.
    pub(crate) fn python_function(
        &self,
        spec: &AgentSpec,
        name: &str,
    ) -> Result<Arc<dyn StateFunction>, ConfigError> {
        let factory = self.python_functions.as_ref().ok_or_else(|| {
            spec.error_at(
                "python",
                Some(name),
                ConfigErrorKind::Unknown,
                format!(
                    "`python: {name}` runs in the kernel's embedded Python; run this workflow \
                     with `rlm flow run`, which provides it"
                ),
            )
        })?;
        factory(spec, name).map_err(|message| {
            spec.error_at("python", Some(name), ConfigErrorKind::Invalid, message)
        })
    }

    /// `condition` of `spec`'s file with its `python` tests bound.
    pub(crate) fn bind_condition(
        &self,
        spec: &AgentSpec,
        condition: &Condition,
    ) -> Result<Condition, ConfigError> {
        let mut bound = condition.clone();
        bound.bind(&mut |name| self.python_function(spec, name))?;
        Ok(bound)
    }

    /// Tool `name`, made from its `args` by `factory`.
    pub(crate) fn with_tool_factory(
        mut self,
        name: impl Into<String>,
        factory: impl Fn(&Value) -> Result<Arc<dyn Tool>, String> + Send + Sync + 'static,
    ) -> Self {
        self.tools.insert(name.into(), Arc::new(factory));
        self
    }

    /// `tool`, under its own name (its entry takes no `args`).
    pub(crate) fn with_tool(self, tool: Arc<dyn Tool>) -> Self {
        let name = tool.name().to_owned();
        self.with_tool_factory(name, move |_| Ok(tool.clone()))
    }

    /// Makes the tools no registered name matches (the kernel: Python functions); see
    /// `ToolFallback`.
    pub fn with_tool_fallback(
        mut self,
        factory: impl Fn(&ToolRef) -> Option<Result<Arc<dyn Tool>, String>> + Send + Sync + 'static,
    ) -> Self {
        self.tool_fallback = Some(Arc::new(factory));
        self
    }

    /// Callback `name`, made by `factory`.
    pub(crate) fn with_callback_factory(
        mut self,
        name: impl Into<String>,
        factory: impl Fn(&CodeRef) -> Result<Arc<dyn Callback>, String> + Send + Sync + 'static,
    ) -> Self {
        self.callbacks.insert(name.into(), Arc::new(factory));
        self
    }

    /// `callback` under `name`.
    pub fn with_callback(self, name: impl Into<String>, callback: Arc<dyn Callback>) -> Self {
        self.with_callback_factory(name, move |_| Ok(callback.clone()))
    }

    /// Makes every callback no registered name matches (the kernel: Python callables).
    pub fn with_callback_fallback(
        mut self,
        factory: impl Fn(&CodeRef) -> Result<Arc<dyn Callback>, String> + Send + Sync + 'static,
    ) -> Self {
        self.callback_fallback = Some(Arc::new(factory));
        self
    }

    /// Builds agents of `class` with `factory`.
    pub fn with_class(
        mut self,
        class: AgentClass,
        factory: impl Fn(&AgentSpec, &Registry) -> Result<Arc<dyn Agent>, ConfigError>
        + Send
        + Sync
        + 'static,
    ) -> Self {
        self.classes.insert(class, Arc::new(factory));
        self
    }

    /// The endpoint `model` names (absent: the default), or an error at `spec`'s `model` line.
    pub fn endpoint(
        &self,
        spec: &AgentSpec,
        model: Option<&str>,
    ) -> Result<Arc<Endpoint>, ConfigError> {
        let name = model.unwrap_or(&self.default_model);
        self.endpoints.get(name).map_err(|_| {
            let known = self
                .endpoints
                .names()
                .iter()
                .map(|n| format!("`{n}`"))
                .collect::<Vec<_>>()
                .join(", ");
            let what = if model.is_some() {
                format!("There is no model `{name}`")
            } else {
                format!("No `model` is set and the default model `{name}` is not configured")
            };
            spec.error_at(
                "model",
                model,
                ConfigErrorKind::Unknown,
                format!("{what}; configured models: {known}"),
            )
        })
    }

    /// The callbacks `spec` names, each acting only at the point it is named for.
    pub fn callbacks_for(&self, spec: &AgentSpec) -> Result<Callbacks, ConfigError> {
        spec.config
            .callbacks()
            .all()
            .map(|(point, code)| {
                let factory = self
                    .callbacks
                    .get(&code.name)
                    .or(self.callback_fallback.as_ref())
                    .ok_or_else(|| {
                        spec.error_at(
                            "name",
                            Some(&code.name),
                            ConfigErrorKind::Unknown,
                            format!(
                                "There is no callback `{}`; registered callbacks: {}",
                                code.name,
                                listed(self.callbacks.keys())
                            ),
                        )
                    })?;
                let inner = factory(code).map_err(|message| {
                    spec.error_at("name", Some(&code.name), ConfigErrorKind::Invalid, message)
                })?;
                Ok(Arc::new(AtPoint { point, inner }) as Arc<dyn Callback>)
            })
            .collect()
    }

    /// The agent tree `spec` describes.
    pub fn build(&self, spec: &AgentSpec) -> Result<Arc<dyn Agent>, ConfigError> {
        let class = spec.config.class();
        if let Some(factory) = self.classes.get(&class) {
            return factory(spec, self);
        }
        let callbacks = self.callbacks_for(spec)?;
        let subs = || -> Result<Vec<Arc<dyn Agent>>, ConfigError> {
            spec.sub_agents.iter().map(|s| self.build(s)).collect()
        };
        let graph_error = |e: GraphError| {
            spec.error_at(
                "name",
                Some(spec.config.name()),
                ConfigErrorKind::Invalid,
                e.to_string(),
            )
        };
        let graph = match &spec.config {
            AgentConfig::Llm(c) => return self.build_llm(spec, c, callbacks),
            AgentConfig::Sequential(c) => Graph::sequential(c.name.as_str(), subs()?),
            AgentConfig::Loop(c) => Graph::looping(c.name.as_str(), subs()?, c.max_iterations),
            AgentConfig::Parallel(c) => {
                Graph::parallel(c.name.as_str(), subs()?, c.on_branch_failure)
            }
            AgentConfig::Graph(c) => {
                let mut builder = Graph::builder(c.name.as_str())
                    .start(c.start.clone())
                    .max_steps(c.max_steps.unwrap_or(DEFAULT_MAX_STEPS));
                for node in subs()? {
                    builder = builder.node(node);
                }
                for (from, edges) in group_edges(&c.edges) {
                    builder = match edges.as_slice() {
                        [only] if only.when.is_none() => builder.edge(from, target(&only.to)),
                        _ => builder.route(from, Arc::new(self.declared_router(spec, &edges)?)),
                    };
                }
                builder.build()
            }
            AgentConfig::Router(_) => {
                return Err(spec.error_at(
                    "agent_class",
                    Some(class.as_str()),
                    ConfigErrorKind::Unknown,
                    "A `RouterAgent` is built by the routing control plane; build this workflow \
                     with a registry passed through `engine::route::file::register` (as \
                     `rlm flow run` does)",
                ));
            }
            AgentConfig::Rlm(_) | AgentConfig::Python(_) => {
                return Err(spec.error_at(
                    "agent_class",
                    Some(class.as_str()),
                    ConfigErrorKind::Unknown,
                    format!(
                        "A `{}` runs in the kernel's embedded Python; run this workflow with \
                         `rlm flow run`, which provides it",
                        class.as_str()
                    ),
                ));
            }
        };
        let graph = graph.map_err(graph_error)?;
        Ok(Arc::new(
            graph
                .with_description(spec.config.description())
                .with_callbacks(callbacks),
        ))
    }

    fn build_llm(
        &self,
        spec: &AgentSpec,
        c: &LlmAgentConfig,
        callbacks: Callbacks,
    ) -> Result<Arc<dyn Agent>, ConfigError> {
        let endpoint = self.endpoint(spec, c.model.as_deref())?;
        let mut config = self.loop_config.clone();
        config.params = c.generate_content_config.sampling();
        if let Some(max) = c.max_iterations {
            config.max_iterations = max.get();
        }
        let persona = self.persona(spec, c)?;
        let mut builder = LlmAgent::builder(c.name.as_str(), endpoint)
            .preamble(
                persona
                    .as_ref()
                    .map(PersonaAgent::preamble)
                    .unwrap_or_default(),
            )
            .description(c.description.clone())
            .instruction(c.instruction.clone())
            .include_contents(c.include_contents)
            .callbacks(callbacks)
            .loop_config(config);
        if let Some(key) = &c.output_key {
            builder = builder.output_key(key.clone());
        }
        if let Some(record) = &self.messages {
            builder = builder.record_messages(record.clone());
        }
        let mut tool_agents = spec.tool_agents.iter();
        for tool in &c.tools {
            if tool.name == AGENT_TOOL {
                if let Some(agent) = tool_agents.next() {
                    builder = builder.agent_tool(self.build(agent)?);
                }
                continue;
            }
            let bundle_tool = persona.as_ref().and_then(|p| p.tool(&tool.name));
            let made = match (
                builtin_tool(&tool.name),
                bundle_tool,
                self.tools.get(&tool.name),
            ) {
                (Some(builtin), _, _) => Ok(builtin),
                (None, Some(made), _) => made.map_err(|e| e.to_string()),
                (None, None, _) if PERSONA_TOOLS.contains(&tool.name.as_str()) => {
                    return Err(spec.error_at(
                        "name",
                        Some(&tool.name),
                        ConfigErrorKind::Invalid,
                        format!(
                            "`{}` is a tool of a bundle persona; give this agent `persona: NAME`",
                            tool.name
                        ),
                    ));
                }
                (None, None, Some(factory)) => factory(&Value::Object(tool.args.clone())),
                (None, None, None) => match self.tool_fallback.as_ref().and_then(|f| f(tool)) {
                    Some(made) => made,
                    None => {
                        return Err(spec.error_at(
                            "name",
                            Some(&tool.name),
                            ConfigErrorKind::Unknown,
                            format!(
                                "There is no tool `{}`; known tools: `exit_loop`, `end_turn`, \
                                 `escalate`, `{AGENT_TOOL}`{}{}",
                                tool.name,
                                if self.tools.is_empty() {
                                    String::new()
                                } else {
                                    format!(", {}", listed(self.tools.keys()))
                                },
                                if self.tool_fallback.is_some() {
                                    ", or a Python function (`module:function`, \
                                     `file.py:function`)"
                                } else {
                                    ""
                                }
                            ),
                        ));
                    }
                },
            };
            let made = made.map_err(|message| {
                spec.error_at("name", Some(&tool.name), ConfigErrorKind::Invalid, message)
            })?;
            builder = builder.tool(made);
        }
        builder
            .build()
            .map(|a| Arc::new(a) as Arc<dyn Agent>)
            .map_err(|e| spec.error_at("tools", None, ConfigErrorKind::Invalid, e.to_string()))
    }
}

impl Registry {
    /// The persona `c` plays, started, or an error at its `persona` line.
    fn persona(
        &self,
        spec: &AgentSpec,
        c: &LlmAgentConfig,
    ) -> Result<Option<PersonaAgent>, ConfigError> {
        let Some(name) = &c.persona else {
            return Ok(None);
        };
        let at = |kind, message: String| spec.error_at("persona", Some(name), kind, message);
        let Some(bundle) = &self.bundle else {
            return Err(at(
                ConfigErrorKind::Unknown,
                format!(
                    "`persona: {name}` needs an agent bundle and this run has none; name one \
                     with `--bundle PATH`"
                ),
            ));
        };
        bundle.start(name).map(Some).map_err(|e| {
            let kind = match e {
                BundleError::NoPersona { .. } => ConfigErrorKind::Unknown,
                _ => ConfigErrorKind::Invalid,
            };
            at(
                kind,
                format!(
                    "Persona `{name}` of the bundle `{}`: {e}",
                    bundle.path().display()
                ),
            )
        })
    }
}

fn target(to: &str) -> Target {
    if to == END {
        Target::End
    } else {
        Target::node(to)
    }
}

/// The edges of each node, nodes in order of their first edge.
fn group_edges(edges: &[EdgeConfig]) -> Vec<(String, Vec<EdgeConfig>)> {
    let mut groups: Vec<(String, Vec<EdgeConfig>)> = Vec::new();
    for edge in edges {
        match groups.iter_mut().find(|(from, _)| *from == edge.from) {
            Some((_, list)) => list.push(edge.clone()),
            None => groups.push((edge.from.clone(), vec![edge.clone()])),
        }
    }
    groups
}

/// A node's declared edges: the first whose test holds (or that has none) is taken; when
/// none is, the graph ends.
struct DeclaredRouter {
    edges: Vec<(Option<Condition>, Target)>,
}

impl Registry {
    /// The router of `edges` of `spec`'s graph, their `python` tests bound.
    fn declared_router(
        &self,
        spec: &AgentSpec,
        edges: &[EdgeConfig],
    ) -> Result<DeclaredRouter, ConfigError> {
        let edges = edges
            .iter()
            .map(|e| {
                let when = e
                    .when
                    .as_ref()
                    .map(|c| self.bind_condition(spec, c))
                    .transpose()?;
                Ok((when, target(&e.to)))
            })
            .collect::<Result<_, ConfigError>>()?;
        Ok(DeclaredRouter { edges })
    }
}

#[async_trait]
impl Router for DeclaredRouter {
    async fn route(&self, ctx: &InvocationContext, _from: &str) -> Result<Target, FlowError> {
        Ok(ctx.state().with(|state| {
            self.edges
                .iter()
                .find(|(test, _)| test.as_ref().is_none_or(|t| t.holds(state)))
                .map_or(Target::End, |(_, to)| to.clone())
        }))
    }
}

/// A callback named under one point of a file: it acts only there.
struct AtPoint {
    point: &'static str,
    inner: Arc<dyn Callback>,
}

impl Callback for AtPoint {
    fn before_agent(&self, ctx: &CallbackContext) -> HookAction<String> {
        if self.point == "before_agent_callbacks" {
            return self.inner.before_agent(ctx);
        }
        HookAction::Continue
    }

    fn after_agent(&self, ctx: &CallbackContext) -> HookAction<String> {
        if self.point == "after_agent_callbacks" {
            return self.inner.after_agent(ctx);
        }
        HookAction::Continue
    }

    fn before_model(
        &self,
        ctx: &CallbackContext,
        request: &mut ChatRequest,
    ) -> HookAction<ChatResponse> {
        if self.point == "before_model_callbacks" {
            return self.inner.before_model(ctx, request);
        }
        HookAction::Continue
    }

    fn after_model(&self, ctx: &CallbackContext, response: &mut ChatResponse) {
        if self.point == "after_model_callbacks" {
            self.inner.after_model(ctx, response);
        }
    }

    fn on_model_error(
        &self,
        ctx: &CallbackContext,
        error: &BridgeError,
    ) -> HookAction<ChatResponse> {
        if self.point == "on_model_error_callbacks" {
            return self.inner.on_model_error(ctx, error);
        }
        HookAction::Continue
    }

    fn before_tool(&self, ctx: &CallbackContext, call: &mut ToolInvocation) -> HookAction<Value> {
        if self.point == "before_tool_callbacks" {
            return self.inner.before_tool(ctx, call);
        }
        HookAction::Continue
    }

    fn after_tool(&self, ctx: &CallbackContext, call: &ToolInvocation, result: &mut Value) {
        if self.point == "after_tool_callbacks" {
            self.inner.after_tool(ctx, call, result);
        }
    }

    fn on_tool_error(
        &self,
        ctx: &CallbackContext,
        call: &ToolInvocation,
        error: &ToolCallError,
    ) -> HookAction<Value> {
        if self.point == "on_tool_error_callbacks" {
            return self.inner.on_tool_error(ctx, call, error);
        }
        HookAction::Continue
    }
}
