//! [`AgentLoop`]: model with tools → tool calls → results → model … → answer.

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bridge::{
    CallOptions, CancellationToken, ChatRequest, ChatResponse, Endpoint, Message, Role, ToolCall,
};
use serde_json::{Value, json};
use tokio::sync::Semaphore;

use super::config::LoopConfig;
use super::dispatch::{Dispatcher, PendingCall};
use super::error::{LoopError, LoopErrorKind};
use super::failure::ToolCallError;
use super::hooks::{AgentHook, Hooks, ToolCallRecord};
use super::metrics::{ModelCallMetrics, ToolCallMetrics};
use super::outcome::{AgentRun, LoopOutcome, Termination};
use super::toolbox::Toolbox;
use crate::hook::HookAction;
use crate::state::SharedState;
use crate::text::group_digits;

/// Receives the text of streamed replies as it arrives.
type TextSink = Arc<dyn Fn(&str) + Send + Sync>;

/// A function-calling agent: a model endpoint, its tools, limits and hooks. Cheap to clone;
/// one loop may serve several runs at once.
#[derive(Clone)]
pub struct AgentLoop {
    endpoint: Arc<Endpoint>,
    tools: Arc<Toolbox>,
    config: LoopConfig,
    hooks: Hooks,
    text_sink: Option<TextSink>,
}

impl fmt::Debug for AgentLoop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AgentLoop")
            .field("endpoint", &self.endpoint.name())
            .field("tools", &self.tools)
            .field("config", &self.config)
            .field("hooks", &self.hooks)
            .field("text_sink", &self.text_sink.is_some())
            .finish()
    }
}

impl AgentLoop {
    /// A loop asking `endpoint`, with `tools`.
    pub fn new(endpoint: Arc<Endpoint>, tools: Toolbox, config: LoopConfig) -> Self {
        Self {
            endpoint,
            tools: Arc::new(tools),
            config,
            hooks: Hooks::default(),
            text_sink: None,
        }
    }

    /// Adds a hook after the existing ones.
    pub fn with_hook(mut self, hook: Arc<dyn AgentHook>) -> Self {
        self.hooks.push(hook);
        self
    }

    /// Streams every reply, passing its text to `sink` as it arrives (a retried attempt
    /// streams again from the start).
    pub fn with_text_sink(mut self, sink: impl Fn(&str) + Send + Sync + 'static) -> Self {
        self.text_sink = Some(Arc::new(sink));
        self
    }

    /// The endpoint it asks.
    pub(crate) fn endpoint(&self) -> &Arc<Endpoint> {
        &self.endpoint
    }

    /// Its tools.
    pub(crate) fn tools(&self) -> &Toolbox {
        &self.tools
    }

    /// Its settings.
    pub(crate) fn config(&self) -> &LoopConfig {
        &self.config
    }

    /// Runs from `messages` until the model answers without tool calls or a tool raises an
    /// action. Tools see and write `state`; cancelling `cancel` (Ctrl-C) ends the run with
    /// [`LoopErrorKind::Cancelled`]. An error keeps the transcript: a reply whose tool calls
    /// were cut short gets a "cancelled" result for each, so the transcript can be sent again.
    pub async fn run(
        &self,
        messages: Vec<Message>,
        state: SharedState,
        cancel: CancellationToken,
    ) -> Result<LoopOutcome, LoopError> {
        let started = Instant::now();
        let mut run = Run {
            record: AgentRun::default(),
            iteration: 0,
            hooks: &self.hooks,
        };
        run.record.transcript.reserve(messages.len() + 8);
        for message in messages {
            run.push(message);
        }
        // A token of the run's own, so a timeout stops the tools without cancelling the
        // caller's token.
        let token = cancel.child_token();
        let result = {
            let run_timeout = self.config.run_timeout;
            let deadline = async move {
                match run_timeout {
                    Some(t) => tokio::time::sleep(t).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                () = token.cancelled() => Err(LoopErrorKind::Cancelled),
                () = deadline => Err(LoopErrorKind::RunTimeout {
                    timeout: run_timeout.unwrap_or_default(),
                }),
                result = self.drive(&mut run, &state, &token) => result,
            }
        };
        token.cancel();
        run.record.metrics.wall_ms = ms(started.elapsed());
        let result = match result {
            Ok((termination, answer)) => Ok(LoopOutcome {
                answer,
                termination,
                run: run.record,
            }),
            Err(kind) => {
                run.close_open_calls();
                Err(LoopError::new(kind, run.record))
            }
        };
        self.hooks.on_finish(result.as_ref());
        result
    }

    /// The iterations; returns how the run ended and the last reply's text.
    async fn drive(
        &self,
        run: &mut Run<'_>,
        state: &SharedState,
        cancel: &CancellationToken,
    ) -> Result<(Termination, String), LoopErrorKind> {
        let definitions = self.tools.definitions();
        let dispatcher = Dispatcher {
            toolbox: &self.tools,
            tool_timeout: self.config.tool_timeout,
            slots: Arc::new(Semaphore::new(self.config.max_concurrent_tools.max(1))),
            state,
            cancel,
        };
        for iteration in 1..=self.config.max_iterations {
            run.iteration = iteration;
            run.record.metrics.iterations = iteration;
            let mut request = ChatRequest {
                model: self.config.model.clone(),
                messages: run.record.transcript.clone(),
                params: self.config.params.clone(),
                tools: definitions.clone(),
                tool_choice: self.config.tool_choice.clone(),
                parallel_tool_calls: self.config.parallel_tool_calls,
            };
            let sent = Instant::now();
            let (mut response, replaced) =
                match self.hooks.before_model_call(iteration, &mut request) {
                    HookAction::Continue => (self.call_model(request, cancel).await?, false),
                    HookAction::Replace(response) => (response, true),
                    HookAction::Stop(reason) => return Err(LoopErrorKind::StoppedByHook(reason)),
                };
            let latency = sent.elapsed();
            self.hooks.after_model_call(iteration, &mut response);
            let ChatResponse {
                content,
                tool_calls,
                usage,
                ..
            } = response;
            run.record.metrics.model_calls.push(ModelCallMetrics {
                iteration,
                prompt_tokens: usage.prompt_tokens,
                completion_tokens: usage.completion_tokens,
                tokens_estimated: usage.estimated,
                latency_ms: if replaced { 0.0 } else { ms(latency) },
                tool_calls: tool_calls.len(),
                replaced,
            });
            run.push(Message {
                role: Role::Assistant,
                content: content.clone(),
                tool_calls: tool_calls.clone(),
                tool_call_id: None,
            });
            if tool_calls.is_empty() {
                return Ok((Termination::Answered, content));
            }
            self.run_tools(run, &dispatcher, iteration, tool_calls)
                .await?;
            if run.record.actions.any() {
                return Ok((Termination::Action, content));
            }
        }
        Err(LoopErrorKind::MaxIterations {
            max: self.config.max_iterations,
        })
    }

    async fn call_model(
        &self,
        request: ChatRequest,
        cancel: &CancellationToken,
    ) -> Result<ChatResponse, LoopErrorKind> {
        let opts = CallOptions {
            cancel: cancel.clone(),
            stream: self.config.stream,
            ..CallOptions::default()
        };
        let result = match &self.text_sink {
            Some(sink) => {
                let mut on_delta = |text: &str| sink(text);
                self.endpoint
                    .call_streaming(request, &opts, &mut on_delta)
                    .await
            }
            None => self.endpoint.call(request, &opts).await,
        };
        result.map_err(LoopErrorKind::from)
    }

    /// Starts every call of one reply, then appends their results in call order.
    async fn run_tools(
        &self,
        run: &mut Run<'_>,
        dispatcher: &Dispatcher<'_>,
        iteration: u32,
        calls: Vec<ToolCall>,
    ) -> Result<(), LoopErrorKind> {
        let mut pending = Vec::with_capacity(calls.len());
        for mut call in calls {
            // The result answers the id the transcript holds, whatever a hook does to the call.
            let id = call.id.clone();
            let started = match self.hooks.before_tool_call(iteration, &mut call) {
                HookAction::Continue => dispatcher.start(call),
                HookAction::Replace(output) => {
                    PendingCall::settled(call, output.map_err(ToolCallError::from))
                }
                HookAction::Stop(reason) => return Err(LoopErrorKind::StoppedByHook(reason)),
            };
            pending.push((id, started));
        }
        for (id, call) in pending {
            let done = call.finish().await;
            run.record.delta.extend(done.delta);
            run.record.actions = run.record.actions.union(done.actions);
            let mut record = ToolCallRecord {
                iteration,
                call: done.call,
                output: done.output,
                duration: done.duration,
            };
            self.hooks.after_tool_call(&mut record);
            let hint = self.tools.get(&record.call.name).and_then(|t| t.when_cut());
            let text = capped(
                tool_result_text(&record.output),
                self.config.max_tool_result_chars,
                &record.call.name,
                hint,
            );
            run.record.metrics.record_tool(ToolCallMetrics {
                iteration,
                call_id: id.clone(),
                name: record.call.name,
                failure: record.output.as_ref().err().map(ToolCallError::kind),
                duration_ms: ms(record.duration),
                result_bytes: text.len(),
            });
            run.push(Message::tool_result(id, text));
        }
        Ok(())
    }
}

/// A run in progress: its record, and the hooks that see each message joining it.
struct Run<'h> {
    record: AgentRun,
    iteration: u32,
    hooks: &'h Hooks,
}

impl Run<'_> {
    fn push(&mut self, message: Message) {
        self.hooks.on_message(self.iteration, &message);
        self.record.transcript.push(message);
    }

    /// Gives every call of the last reply that has no result a "cancelled" one.
    fn close_open_calls(&mut self) {
        let transcript = &self.record.transcript;
        let Some(last) = transcript.iter().rposition(|m| m.role == Role::Assistant) else {
            return;
        };
        let answered: HashSet<&str> = transcript[last + 1..]
            .iter()
            .filter_map(|m| m.tool_call_id.as_deref())
            .collect();
        let open: Vec<String> = transcript[last]
            .tool_calls
            .iter()
            .filter(|c| !answered.contains(c.id.as_str()))
            .map(|c| c.id.clone())
            .collect();
        let text = tool_result_text(&Err(ToolCallError::Cancelled));
        for id in open {
            self.push(Message::tool_result(id, text.clone()));
        }
    }
}

/// What the model is told of a call: the value (a string as it is, anything else as JSON),
/// or `{"success": false, "error": "..."}`.
fn tool_result_text(output: &Result<Value, ToolCallError>) -> String {
    match output {
        Ok(Value::String(text)) => text.clone(),
        Ok(value) => value.to_string(),
        Err(e) => json!({"success": false, "error": e.to_string()}).to_string(),
    }
}

/// `text` cut to `limit` characters, its head and tail kept around a note that says how
/// much was cut and how the model can see it (`hint`, from the tool).
fn capped(text: String, limit: usize, tool: &str, hint: Option<&str>) -> String {
    let Some(cut) = crate::text::cut_middle(&text, limit) else {
        return text;
    };
    let how = hint.map_or_else(
        || format!("To see it, call `{tool}` again asking for less at a time"),
        str::to_owned,
    );
    format!(
        "{}\n[... {} of the {} characters of this result were cut here: a tool result holds at \
         most {} characters. {how} ...]\n{}",
        cut.head,
        group_digits(cut.omitted as u64),
        group_digits(cut.total as u64),
        group_digits(limit as u64),
        cut.tail
    )
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
