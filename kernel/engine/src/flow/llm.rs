//! [`LlmAgent`]: the function-calling loop of [`crate::agent`] as a workflow agent.
//!
//! A turn: the instruction is filled from the state (`{key}`, `{key?}`) and sent as the
//! system message (after a fixed preamble, e.g. a bundle persona, if it has one), followed
//! by the conversation the agent may see ([`IncludeContents::Default`]: the run's input and every agent's messages so far, other
//! agents' as `[name] said: ...`; [`IncludeContents::None`]: only the latest input). The
//! loop then calls the model and its tools until the model answers or a tool raises an
//! action. Tool writes go straight into the shared state (the next tool sees them), the
//! answer goes to `output_key`, and every model call (a `model_call` metadata event: model,
//! usage, whether a callback answered in its place), every model reply with tool calls,
//! every tool result and the answer are events of the agent.
//!
//! Actions end the turn after the tool results of their reply: `end_turn` gives control
//! back to the parent, `exit_loop` ends the nearest loop, `escalate` the invocation. The
//! built-in tools [`ExitLoop`], [`EndTurn`] and [`Escalate`] raise them; an agent tool
//! ([`LlmAgentBuilder::agent_tool`]) lets the model call another agent.
//!
//! Under a router ([`LlmAgentBuilder::record_messages`]) each final reply also goes on record
//! in the `messages` channel — `{author, content, topic}`, appended as one write — so
//! the router's circular-logic detection sees the exchanges of LLM agents. Other workflows'
//! state is left as it was.
//!
//! Callbacks hook in around each model call and tool call. An `on_model_error` callback
//! that answers ends the turn with that answer (the failed call is not retried); an
//! `on_tool_error` callback's answer becomes the failed call's result.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use bridge::{ChatRequest, ChatResponse, Endpoint, Message, Role, ToolCall};
use serde_json::{Value, json};

use super::agent::{Agent, Control, class, run_in};
use super::callbacks::{CallbackContext, Callbacks, ToolInvocation};
use super::context::InvocationContext;
use super::error::FlowError;
use super::event::{Event, EventKind, ToolResult};
use super::file::{IncludeContents, TopicSource};
use super::template::render_template;
use crate::agent::{
    AgentHook, AgentLoop, LoopConfig, LoopErrorKind, ToolCallError, ToolCallRecord, Toolbox,
    ToolboxError,
};
use crate::hook::HookAction;
use crate::reducer::MESSAGES;
use crate::tool::{Actions, Tool, ToolContext, ToolError};

/// The user message sent when the agent sees no input (providers need one).
const CONTINUE: &str = "Continue.";

/// How an agent's final reply goes on record in `messages`: `{author, content, topic}`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MessageRecord {
    /// Where the `topic` comes from (none: the message names no topic).
    pub(crate) topic: Option<TopicSource>,
}

impl MessageRecord {
    /// The message `author` wrote when answering `content` with the state as in `ctx`.
    fn message(&self, author: &str, content: &str, ctx: &InvocationContext) -> Value {
        let topic = match self.topic.as_ref().map(|t| (&t.state_key, &t.reply_field)) {
            Some((Some(key), _)) => ctx.get_state(key),
            Some((None, Some(field))) => serde_json::from_str::<Value>(content)
                .ok()
                .and_then(|reply| reply.get(field).cloned()),
            _ => None,
        };
        let topic = topic.unwrap_or(Value::Null);
        json!({"author": author, "content": content, "topic": topic})
    }
}

/// An LLM agent: a model endpoint, an instruction template, tools and an output key.
pub struct LlmAgent {
    name: String,
    description: String,
    preamble: String,
    instruction: String,
    output_key: Option<String>,
    include_contents: IncludeContents,
    tools: Vec<Arc<dyn Tool>>,
    agent_tools: Vec<Arc<dyn Agent>>,
    callbacks: Callbacks,
    record: Option<MessageRecord>,
    /// The loop with the plain tools, built once (tool schemas compile once).
    prebuilt: AgentLoop,
}

impl std::fmt::Debug for LlmAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlmAgent")
            .field("name", &self.name)
            .field("endpoint", &self.prebuilt.endpoint().name())
            .field("tools", &self.prebuilt.tools().names())
            .field("agent_tools", &self.agent_tools)
            .finish_non_exhaustive()
    }
}

/// Builds an [`LlmAgent`].
pub struct LlmAgentBuilder {
    name: String,
    description: String,
    endpoint: Arc<Endpoint>,
    preamble: String,
    instruction: String,
    output_key: Option<String>,
    include_contents: IncludeContents,
    tools: Vec<Arc<dyn Tool>>,
    agent_tools: Vec<Arc<dyn Agent>>,
    callbacks: Callbacks,
    config: LoopConfig,
    record: Option<MessageRecord>,
}

impl std::fmt::Debug for LlmAgentBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlmAgentBuilder")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl LlmAgentBuilder {
    /// What the agent does.
    pub fn description(mut self, description: impl Into<String>) -> Self {
        self.description = description.into();
        self
    }

    /// Fixed text before the instruction, not a template (a bundle persona, whose text
    /// may hold braces of its own).
    pub(crate) fn preamble(mut self, preamble: impl Into<String>) -> Self {
        self.preamble = preamble.into();
        self
    }

    /// The instruction template (`{key}`, `{key?}` from the state).
    pub fn instruction(mut self, instruction: impl Into<String>) -> Self {
        self.instruction = instruction.into();
        self
    }

    /// The state key the answer is written to.
    pub fn output_key(mut self, key: impl Into<String>) -> Self {
        self.output_key = Some(key.into());
        self
    }

    /// Which conversation the agent sees.
    pub fn include_contents(mut self, include: IncludeContents) -> Self {
        self.include_contents = include;
        self
    }

    /// Adds a tool.
    pub fn tool(mut self, tool: Arc<dyn Tool>) -> Self {
        self.tools.push(tool);
        self
    }

    /// Adds another agent as a tool (called with `{"request": "..."}`).
    pub fn agent_tool(mut self, agent: Arc<dyn Agent>) -> Self {
        self.agent_tools.push(agent);
        self
    }

    /// The agent's own callbacks.
    pub fn callbacks(mut self, callbacks: Callbacks) -> Self {
        self.callbacks = callbacks;
        self
    }

    /// Puts each final reply on record in `messages` as `record` says.
    pub fn record_messages(mut self, record: MessageRecord) -> Self {
        self.record = Some(record);
        self
    }

    /// The loop's settings (iteration cap, timeouts, sampling parameters).
    pub(crate) fn loop_config(mut self, config: LoopConfig) -> Self {
        self.config = config;
        self
    }

    /// The agent, or why its tools do not fit together (two of one name, a bad schema).
    pub fn build(self) -> Result<LlmAgent, ToolboxError> {
        let mut toolbox = Toolbox::new();
        for tool in &self.tools {
            toolbox.add(tool.clone())?;
        }
        Ok(LlmAgent {
            prebuilt: AgentLoop::new(self.endpoint, toolbox, self.config),
            name: self.name,
            description: self.description,
            preamble: self.preamble,
            instruction: self.instruction,
            output_key: self.output_key,
            include_contents: self.include_contents,
            tools: self.tools,
            agent_tools: self.agent_tools,
            callbacks: self.callbacks,
            record: self.record,
        })
    }
}

impl LlmAgent {
    /// An agent `name` asking `endpoint`; the rest is set on the builder.
    pub fn builder(name: impl Into<String>, endpoint: Arc<Endpoint>) -> LlmAgentBuilder {
        LlmAgentBuilder {
            name: name.into(),
            description: String::new(),
            endpoint,
            preamble: String::new(),
            instruction: String::new(),
            output_key: None,
            include_contents: IncludeContents::Default,
            tools: Vec::new(),
            agent_tools: Vec::new(),
            callbacks: Callbacks::new(),
            config: LoopConfig::default(),
            record: None,
        }
    }

    /// The messages of a turn: the instruction, then the conversation it may see.
    fn messages(&self, ctx: &InvocationContext) -> Result<Vec<Message>, FlowError> {
        let instruction = ctx
            .state()
            .with(|state| render_template(&self.instruction, state))
            .map_err(|e| FlowError::Setup {
                agent: self.name.clone(),
                message: e.to_string(),
            })?;
        let system = match (self.preamble.is_empty(), instruction.is_empty()) {
            (true, _) => instruction,
            (false, true) => self.preamble.clone(),
            (false, false) => format!("{}\n\n{instruction}", self.preamble),
        };
        let mut messages = Vec::new();
        if !system.is_empty() {
            messages.push(Message::system(system));
        }
        let history = ctx.history();
        match self.include_contents {
            IncludeContents::Default => {
                for turn in history {
                    messages.push(if turn.author == "user" {
                        Message::user(turn.content)
                    } else if turn.author == self.name {
                        Message::assistant(turn.content)
                    } else {
                        Message::user(format!("[{}] said: {}", turn.author, turn.content))
                    });
                }
            }
            IncludeContents::None => {
                if let Some(input) = history.into_iter().rev().find(|t| t.author == "user") {
                    messages.push(Message::user(input.content));
                }
            }
        }
        if messages.last().is_none_or(|m| m.role != Role::User) {
            messages.push(Message::user(CONTINUE));
        }
        Ok(messages)
    }

    /// The loop for this turn: the prebuilt one, plus the agent tools bound to `ctx`.
    fn turn_loop(&self, ctx: &InvocationContext) -> Result<AgentLoop, FlowError> {
        if self.agent_tools.is_empty() {
            return Ok(self.prebuilt.clone());
        }
        let mut toolbox = Toolbox::new();
        let tools = self
            .tools
            .iter()
            .cloned()
            .chain(self.agent_tools.iter().map(|agent| {
                Arc::new(AgentTool {
                    agent: agent.clone(),
                    ctx: ctx.clone(),
                }) as Arc<dyn Tool>
            }));
        for tool in tools {
            toolbox.add(tool).map_err(|e| FlowError::Setup {
                agent: self.name.clone(),
                message: e.to_string(),
            })?;
        }
        Ok(AgentLoop::new(
            self.prebuilt.endpoint().clone(),
            toolbox,
            self.prebuilt.config().clone(),
        ))
    }
}

#[async_trait]
impl Agent for LlmAgent {
    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn class(&self) -> &str {
        class::LLM
    }

    fn sub_agents(&self) -> Vec<Arc<dyn Agent>> {
        self.agent_tools.clone()
    }

    fn callbacks(&self) -> &Callbacks {
        &self.callbacks
    }

    async fn run(&self, ctx: &InvocationContext) -> Result<Control, FlowError> {
        let messages = self.messages(ctx)?;
        let hook = Arc::new(TurnHook {
            ctx: ctx.clone(),
            callbacks: ctx.callbacks(),
            names: Mutex::default(),
            actions: Mutex::default(),
            failure: Mutex::default(),
            replaced: AtomicBool::new(false),
            stop: Mutex::default(),
        });
        let turn = self.turn_loop(ctx)?.with_hook(hook.clone());
        let result = turn
            .run(messages, ctx.state().clone(), ctx.cancel_token().clone())
            .await;
        if let Some(failure) = lock(&hook.failure).take() {
            return Err(failure);
        }
        let (answer, run_delta, mut actions) = match result {
            Ok(outcome) => (outcome.answer, outcome.run.delta, outcome.run.actions),
            Err(error) => {
                // What the turn wrote stays written, and is reported.
                ctx.record(error.run().delta.clone());
                let escalated = lock(&hook.actions).escalate;
                match error.kind() {
                    LoopErrorKind::StoppedByHook(_) if escalated => {
                        let actions = *lock(&hook.actions);
                        ctx.emit(Event::new(EventKind::StateUpdate).with_actions(actions))?;
                        return Ok(Control::Escalate);
                    }
                    LoopErrorKind::Model(model_error) => {
                        let cb = ctx.callback_context();
                        let recovered =
                            hook.callbacks.first(|c| c.on_model_error(&cb, model_error));
                        let callback_actions = ctx.absorb_callback(&cb);
                        match recovered {
                            HookAction::Replace(response) => (
                                response.content,
                                Default::default(),
                                error.run().actions.union(callback_actions),
                            ),
                            HookAction::Stop(reason) => {
                                return Err(FlowError::StoppedByHook {
                                    agent: self.name.clone(),
                                    reason,
                                });
                            }
                            HookAction::Continue => {
                                return Err(FlowError::from_model(&self.name, model_error.clone()));
                            }
                        }
                    }
                    kind => return Err(loop_failure(&self.name, kind)),
                }
            }
        };
        ctx.record(run_delta);
        actions = actions.union(*lock(&hook.actions));
        if let Some(key) = &self.output_key
            && !(answer.is_empty() && actions.any())
        {
            ctx.set_state(key.clone(), Value::String(answer.clone()));
        }
        if let Some(record) = &self.record
            && !answer.is_empty()
        {
            ctx.append_state(MESSAGES, vec![record.message(&self.name, &answer, ctx)]);
        }
        let event = if answer.is_empty() {
            Event::new(EventKind::StateUpdate)
        } else {
            Event::message(answer)
        };
        ctx.emit(event.with_actions(actions))?;
        Ok(Control::from_actions(actions))
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A loop that ended without an answer, as the workflow reports it.
fn loop_failure(agent: &str, kind: &LoopErrorKind) -> FlowError {
    match kind {
        LoopErrorKind::Budget(exceeded) => FlowError::Budget(exceeded.clone()),
        LoopErrorKind::Cancelled => FlowError::Cancelled,
        LoopErrorKind::Model(error) => FlowError::from_model(agent, error.clone()),
        LoopErrorKind::StoppedByHook(reason) => FlowError::StoppedByHook {
            agent: agent.to_owned(),
            reason: reason.clone(),
        },
        limit @ (LoopErrorKind::MaxIterations { .. } | LoopErrorKind::RunTimeout { .. }) => {
            FlowError::Limit {
                agent: agent.to_owned(),
                message: limit.to_string(),
            }
        }
    }
}

/// One turn's view of the loop: events for each message, callbacks around each call.
struct TurnHook {
    ctx: InvocationContext,
    callbacks: Callbacks,
    /// Tool names by call id, to label results.
    names: Mutex<HashMap<String, String>>,
    /// Actions raised by callbacks.
    actions: Mutex<Actions>,
    /// The first event that could not be recorded.
    failure: Mutex<Option<FlowError>>,
    /// Whether a `before_model` callback answered the current call in the model's place.
    replaced: AtomicBool,
    /// Why an `on_tool_error` callback stopped the turn (at its next model call).
    stop: Mutex<Option<String>>,
}

impl TurnHook {
    fn emit(&self, event: Event) {
        if let Err(e) = self.ctx.emit(event) {
            lock(&self.failure).get_or_insert(e);
        }
    }

    /// Runs `f` with a callback context, keeping its writes and actions.
    fn with_callbacks<R>(&self, f: impl FnOnce(&CallbackContext) -> R) -> R {
        let cb = self.ctx.callback_context();
        let out = f(&cb);
        let actions = self.ctx.absorb_callback(&cb);
        let mut all = lock(&self.actions);
        *all = all.union(actions);
        out
    }

    fn escalated(&self) -> bool {
        lock(&self.actions).escalate
    }
}

fn invocation(call: &ToolCall) -> ToolInvocation {
    ToolInvocation {
        call_id: call.id.clone(),
        name: call.name.clone(),
        args: serde_json::from_str(&call.arguments)
            .unwrap_or_else(|_| Value::String(call.arguments.clone())),
    }
}

impl AgentHook for TurnHook {
    fn before_model_call(
        &self,
        _iteration: u32,
        request: &mut ChatRequest,
    ) -> HookAction<ChatResponse> {
        if let Some(reason) = lock(&self.stop).take() {
            return HookAction::Stop(reason);
        }
        if self.callbacks.is_empty() {
            return HookAction::Continue;
        }
        let answer =
            self.with_callbacks(|cb| self.callbacks.first(|c| c.before_model(cb, request)));
        match answer {
            HookAction::Stop(reason) => HookAction::Stop(reason),
            _ if self.escalated() => HookAction::Stop("a callback escalated".into()),
            HookAction::Replace(response) => {
                self.replaced.store(true, Ordering::Relaxed);
                HookAction::Replace(response)
            }
            HookAction::Continue => HookAction::Continue,
        }
    }

    fn after_model_call(&self, iteration: u32, response: &mut ChatResponse) {
        self.emit(Event::metadata(
            "model_call",
            json!({
                "iteration": iteration,
                "model": response.model,
                "usage": response.usage,
                "tool_calls": response.tool_calls.len(),
                "replaced": self.replaced.swap(false, Ordering::Relaxed),
            }),
        ));
        if !self.callbacks.is_empty() {
            self.with_callbacks(|cb| self.callbacks.each(|c| c.after_model(cb, response)));
        }
    }

    fn before_tool_call(
        &self,
        _iteration: u32,
        call: &mut ToolCall,
    ) -> HookAction<Result<Value, ToolError>> {
        if self.callbacks.is_empty() {
            return HookAction::Continue;
        }
        let mut inv = invocation(call);
        let before = inv.args.clone();
        let answer =
            self.with_callbacks(|cb| self.callbacks.first(|c| c.before_tool(cb, &mut inv)));
        if inv.args != before {
            call.arguments = inv.args.to_string();
        }
        match answer {
            HookAction::Stop(reason) => HookAction::Stop(reason),
            _ if self.escalated() => HookAction::Stop("a callback escalated".into()),
            answer => answer.map(Ok),
        }
    }

    /// As ADK does: `on_tool_error` may recover a failed call, then `after_tool` sees the
    /// result however it came (the tool, a `before_tool` answer, the recovery) — except for
    /// a tool that does not exist, which never ran.
    fn after_tool_call(&self, record: &mut ToolCallRecord) {
        if self.callbacks.is_empty() {
            return;
        }
        let inv = invocation(&record.call);
        self.with_callbacks(|cb| {
            if let Err(error) = &record.output {
                let never_ran = matches!(error, ToolCallError::UnknownTool { .. });
                match self.callbacks.first(|c| c.on_tool_error(cb, &inv, error)) {
                    HookAction::Replace(result) => record.output = Ok(result),
                    HookAction::Stop(reason) => {
                        // The error stands; the turn stops before its next model call.
                        lock(&self.stop).get_or_insert(reason);
                        return;
                    }
                    HookAction::Continue => return,
                }
                if never_ran {
                    return;
                }
            }
            if let Ok(result) = &mut record.output {
                self.callbacks.each(|c| c.after_tool(cb, &inv, result));
            }
        });
    }

    fn on_message(&self, iteration: u32, message: &Message) {
        if iteration == 0 {
            return;
        }
        match message.role {
            Role::Assistant if !message.tool_calls.is_empty() => {
                let mut names = lock(&self.names);
                for call in &message.tool_calls {
                    names.insert(call.id.clone(), call.name.clone());
                }
                drop(names);
                let mut event = Event::new(EventKind::ToolCalls);
                if !message.content.is_empty() {
                    event.content = Some(message.content.clone());
                }
                event.tool_calls = message.tool_calls.clone();
                self.emit(event);
            }
            Role::Tool => {
                let call_id = message.tool_call_id.clone().unwrap_or_default();
                let name = lock(&self.names).get(&call_id).cloned().unwrap_or_default();
                let result = serde_json::from_str(&message.content)
                    .unwrap_or_else(|_| Value::String(message.content.clone()));
                let is_error = result.get("success") == Some(&Value::Bool(false));
                let mut event = Event::new(EventKind::ToolResults);
                event.tool_results.push(ToolResult {
                    call_id,
                    name,
                    result,
                    is_error,
                });
                self.emit(event);
            }
            _ => {}
        }
    }
}

/// A built-in tool that raises one action.
macro_rules! action_tool {
    ($(#[$doc:meta])* $ty:ident, $name:literal, $what:literal, $raise:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, Default)]
        pub struct $ty;

        #[async_trait]
        impl Tool for $ty {
            fn name(&self) -> &str {
                $name
            }
            fn description(&self) -> &str {
                $what
            }
            fn parameters(&self) -> Value {
                json!({"type": "object", "properties": {}})
            }
            async fn call(&self, _args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
                ctx.$raise();
                Ok(json!({"success": true}))
            }
        }
    };
}

action_tool!(
    /// `exit_loop`: ends the nearest enclosing loop.
    ExitLoop,
    "exit_loop",
    "Ends the loop this agent runs in (only the nearest one). Call it when the loop's work is done.",
    exit_loop
);
action_tool!(
    /// `end_turn`: ends this agent's turn; the workflow moves on to the next agent.
    EndTurn,
    "end_turn",
    "Ends your turn now; the workflow goes on with the next agent.",
    end_turn
);
action_tool!(
    /// `escalate`: stops the whole workflow run.
    Escalate,
    "escalate",
    "Stops the whole workflow run. Call it only when the run cannot go on (a human must decide).",
    escalate
);

/// The built-in tool called `name`, if there is one.
pub fn builtin_tool(name: &str) -> Option<Arc<dyn Tool>> {
    match name {
        "exit_loop" => Some(Arc::new(ExitLoop)),
        "end_turn" => Some(Arc::new(EndTurn)),
        "escalate" => Some(Arc::new(Escalate)),
        _ => None,
    }
}

/// Another agent as a tool: the model sends a request, the agent runs with it as its input
/// (sharing the state, with a conversation of its own) and its last message is the result.
/// Its `escalate` stops the caller's run too; its `exit_loop` and `end_turn` stay inside it.
struct AgentTool {
    agent: Arc<dyn Agent>,
    ctx: InvocationContext,
}

#[async_trait]
impl Tool for AgentTool {
    fn name(&self) -> &str {
        self.agent.name()
    }

    fn description(&self) -> &str {
        self.agent.description()
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "required": ["request"],
            "properties": {"request": {"type": "string", "description": "What to ask the agent."}}
        })
    }

    async fn call(&self, args: Value, tool_ctx: &ToolContext) -> Result<Value, ToolError> {
        let request = args
            .get("request")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let sub = self.ctx.sub_run(
            self.agent.name(),
            self.agent.callbacks(),
            request,
            tool_ctx.cancel().clone(),
        );
        let outcome = run_in(self.agent.as_ref(), &sub)
            .await
            .map_err(|e| ToolError::Failed(e.to_string()))?;
        if outcome.control == Control::Escalate {
            tool_ctx.escalate();
        }
        let answer = sub
            .history()
            .into_iter()
            .rev()
            .find(|t| t.author != "user")
            .map(|t| t.content)
            .unwrap_or_default();
        Ok(Value::String(answer))
    }
}
