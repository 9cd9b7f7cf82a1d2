//! [`RlmAgent`]: the RLM loop as a workflow agent.
//!
//! Its query is an instruction template over the state (`{key}`, `{key?}`); it runs the
//! loop in the run's REPL session (the contexts loaded there, see
//! [`FlowKernel`](super::FlowKernel)) on a thread of its own, since the loop blocks; the
//! final answer is its message and goes to `output_key`. Each iteration, sub-call and the
//! loop's end are `metadata` events (`rlm_iteration`, `rlm_sub_call`, `rlm_result`): counts,
//! timings, tokens, termination, and each iteration's code blocks with what they printed,
//! capped as the trajectory caps them — never the contexts themselves. Its model callbacks see each root
//! call (a `before_model` answer replaces the call's reply; an `after_model` change is what
//! the loop reads). Ctrl-C, the run's timeout or a spent budget stop the loop at its next
//! step; a limit of the loop itself (iterations, its own timeout) still gives the best
//! answer it has. Two RLM agents must not run at once on one session (parallel branches):
//! they would share its `answer` slot.

use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use bridge::{ChatRequest, ChatResponse, SubCallMetadata, Usage};
use engine::flow::{
    Agent, Callbacks, Control, Event, FlowError, InvocationContext, render_template,
};
use serde_json::{Value, json};

use super::services::{FlowKernel, off_runtime};
use crate::rlm::{
    Hook, HookAction, IterationRecord, ModelCall, Rlm, RlmConfig, RlmResult, TerminationReason,
};

/// The RLM loop as an agent; see the module docs.
pub struct RlmAgent {
    name: String,
    description: String,
    instruction: String,
    output_key: Option<String>,
    config: RlmConfig,
    kernel: Arc<FlowKernel>,
    callbacks: Callbacks,
}

impl std::fmt::Debug for RlmAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RlmAgent({})", self.name)
    }
}

impl RlmAgent {
    /// The agent `name` answering `instruction` (a template over the state) with the loop
    /// configured by `config`, in `kernel`'s session.
    pub fn new(
        name: impl Into<String>,
        instruction: impl Into<String>,
        config: RlmConfig,
        kernel: Arc<FlowKernel>,
    ) -> Self {
        Self {
            name: name.into(),
            description: String::new(),
            instruction: instruction.into(),
            output_key: None,
            config,
            kernel,
            callbacks: Callbacks::new(),
        }
    }

    /// This agent described as `description`.
    pub fn with_description(mut self, description: impl Into<String>) -> Self {
        self.description = description.into();
        self
    }

    /// Writes the final answer to state key `key`.
    pub fn with_output_key(mut self, key: impl Into<String>) -> Self {
        self.output_key = Some(key.into());
        self
    }

    /// This agent with its own `callbacks`.
    pub fn with_callbacks(mut self, callbacks: Callbacks) -> Self {
        self.callbacks = callbacks;
        self
    }

    fn fail(&self, message: impl Into<String>) -> FlowError {
        FlowError::Agent {
            agent: self.name.clone(),
            message: message.into(),
        }
    }
}

#[async_trait]
impl Agent for RlmAgent {
    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn class(&self) -> &str {
        engine::flow::class::RLM
    }

    fn callbacks(&self) -> &Callbacks {
        &self.callbacks
    }

    async fn run(&self, ctx: &InvocationContext) -> Result<Control, FlowError> {
        let query = ctx
            .state()
            .with(|state| render_template(&self.instruction, state))
            .map_err(|e| self.fail(e.to_string()))?;
        let session = {
            let kernel = Arc::clone(&self.kernel);
            off_runtime(ctx, &self.name, move || kernel.session(), None)
                .await?
                .map_err(|e| self.fail(format!("Cannot start the Python session: {e}")))?
        };
        let mut rlm = Rlm::new(
            self.config.clone(),
            Arc::clone(self.kernel.endpoints()),
            session,
        );
        let relay = Relay::new(ctx.clone());
        rlm.add_hook(relay.clone());
        let handle = rlm.stop_handle();
        let stop = move || handle.stop();
        // Cancelling the run stops the loop at its next step; the step waits (a bounded
        // moment) for it to record how it ended.
        let result = off_runtime(ctx, &self.name, move || rlm.run(&query), Some(&stop))
            .await?
            .map_err(|e| self.fail(e.to_string()))?;
        relay.finish()?;
        let actions = relay.actions();
        self.report(ctx, &result)?;
        match result.termination_reason {
            TerminationReason::Interrupted
            | TerminationReason::CallBudget
            | TerminationReason::TokenBudget
            | TerminationReason::CostBudget
            | TerminationReason::IterationBudget => ctx.check()?,
            TerminationReason::RootModelError | TerminationReason::KernelError => {
                return Err(self.fail(format!(
                    "The RLM loop stopped ({}): {}",
                    reason_name(result.termination_reason),
                    result.error.as_deref().unwrap_or("no detail")
                )));
            }
            _ => {}
        }
        Ok(Control::from_actions(actions))
    }
}

impl RlmAgent {
    /// The answer as the agent's message and output.
    fn report(&self, ctx: &InvocationContext, result: &RlmResult) -> Result<(), FlowError> {
        if let Some(answer) = &result.answer {
            if let Some(key) = &self.output_key {
                ctx.set_state(key.clone(), Value::String(answer.clone()));
            }
            ctx.emit(Event::message(answer.clone()))?;
        }
        Ok(())
    }
}

fn reason_name(reason: TerminationReason) -> String {
    serde_json::to_value(reason)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| format!("{reason:?}"))
}

/// The loop's hook that turns its steps into events and runs the agent's model callbacks.
#[derive(Clone)]
struct Relay {
    ctx: InvocationContext,
    /// The first error an event sink reported (hooks cannot fail; the agent reports it).
    failed: Arc<Mutex<Option<FlowError>>>,
    actions: Arc<Mutex<engine::Actions>>,
}

impl Relay {
    fn new(ctx: InvocationContext) -> Self {
        Self {
            ctx,
            failed: Arc::default(),
            actions: Arc::default(),
        }
    }

    fn emit(&self, event: Event) {
        if let Err(e) = self.ctx.emit(event) {
            self.failed
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get_or_insert(e);
        }
    }

    fn absorb(&self, cb: &engine::flow::CallbackContext) {
        let actions = self.ctx.absorb_callback(cb);
        let mut all = self.actions.lock().unwrap_or_else(PoisonError::into_inner);
        *all = all.union(actions);
    }

    fn finish(&self) -> Result<(), FlowError> {
        match self
            .failed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn actions(&self) -> engine::Actions {
        *self.actions.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Hook for Relay {
    fn before_model_call(
        &mut self,
        _iteration: u32,
        request: &mut ChatRequest,
    ) -> HookAction<String> {
        let callbacks = self.ctx.callbacks();
        if callbacks.is_empty() {
            return HookAction::Continue;
        }
        let cb = self.ctx.callback_context();
        let answer = callbacks.first(|c| c.before_model(&cb, request));
        self.absorb(&cb);
        answer.map(|response| response.content)
    }

    fn after_model_call(&mut self, call: &mut ModelCall) {
        let callbacks = self.ctx.callbacks();
        if callbacks.is_empty() {
            return;
        }
        let cb = self.ctx.callback_context();
        let mut response = call.response.clone().unwrap_or_else(|| ChatResponse {
            content: call.reply.clone(),
            tool_calls: Vec::new(),
            usage: Usage::default(),
            finish_reason: None,
            model: String::new(),
            latency: std::time::Duration::ZERO,
            attempts: 0,
        });
        callbacks.each(|c| c.after_model(&cb, &mut response));
        self.absorb(&cb);
        if response.content != call.reply {
            call.reply = response.content.clone();
        }
        if call.response.is_some() {
            call.response = Some(response);
        }
    }

    fn on_sub_call(&mut self, iteration: u32, call: &SubCallMetadata) {
        self.emit(Event::metadata(
            "rlm_sub_call",
            json!({"iteration": iteration, "call": call}),
        ));
    }

    /// Also when the run was cancelled: the step waits for this record before its `End`.
    fn after_run(&mut self, result: &mut RlmResult) {
        self.emit(Event::metadata(
            "rlm_result",
            json!({
                "termination_reason": result.termination_reason,
                "answer_kind": result.answer_kind,
                "metrics": result.metrics,
            }),
        ));
    }

    /// The iteration's code blocks and their outputs go in too, capped as the trajectory
    /// caps them (head and tail of each output, of each sub-call's prompt and reply).
    fn after_iteration(&mut self, record: &mut IterationRecord) {
        self.emit(Event::metadata(
            "rlm_iteration",
            json!({
                "iteration": record.metadata,
                "execution": record.execution,
                "blocks": record.blocks,
                "root_call": record.root_call,
                "model_ms": record.model_ms,
                "execution_ms": record.execution_ms,
            }),
        ));
    }
}
