//! Running the tool calls of one reply: each on a task of its own, at most
//! `max_concurrent_tools` at once, each under its timeout, a panic caught as a failure.
//!
//! [`Dispatcher::start`] checks a call (known tool, JSON object, schema) and spawns it; the
//! caller then [`finish`](PendingCall::finish)es the pending calls in call order, so results
//! join the transcript in the order the model asked for them while the calls overlap. A
//! pending call that is dropped (the run was cancelled or timed out) aborts its task, and its
//! context's token is cancelled for tools that started work of their own.

use std::any::Any;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bridge::{CancellationToken, ToolCall};
use serde_json::Value;
use tokio::sync::Semaphore;
use tokio_util::task::AbortOnDropHandle;

use super::failure::ToolCallError;
use super::toolbox::Toolbox;
use crate::state::{SharedState, StateDelta};
use crate::tool::{Actions, ToolContext, ToolError};

/// Starts the tool calls of one run.
pub(crate) struct Dispatcher<'a> {
    pub(crate) toolbox: &'a Toolbox,
    pub(crate) tool_timeout: Duration,
    pub(crate) slots: Arc<Semaphore>,
    pub(crate) state: &'a SharedState,
    pub(crate) cancel: &'a CancellationToken,
}

/// A call started (or settled without running).
pub(crate) struct PendingCall {
    call: ToolCall,
    pending: Pending,
}

enum Pending {
    Settled(Result<Value, ToolCallError>),
    Running {
        ctx: Arc<ToolContext>,
        task: AbortOnDropHandle<(Result<Value, ToolCallError>, Duration)>,
        // Cancels the call's own token when the call is dropped unfinished.
        _guard: tokio_util::sync::DropGuard,
    },
}

/// A call that ended, with what it wrote and raised.
pub(crate) struct FinishedCall {
    pub(crate) call: ToolCall,
    pub(crate) output: Result<Value, ToolCallError>,
    pub(crate) duration: Duration,
    pub(crate) delta: StateDelta,
    pub(crate) actions: Actions,
}

impl Dispatcher<'_> {
    /// Checks `call` and spawns it; a call that fails its checks settles at once.
    pub(crate) fn start(&self, call: ToolCall) -> PendingCall {
        let (tool, args) = match self.toolbox.prepare(&call) {
            Ok(ready) => ready,
            Err(e) => return PendingCall::settled(call, Err(e)),
        };
        let token = self.cancel.child_token();
        let ctx = Arc::new(ToolContext::with_cancel(
            call.id.clone(),
            self.state.clone(),
            token.clone(),
        ));
        let timeout = tool.timeout().unwrap_or(self.tool_timeout);
        let slots = Arc::clone(&self.slots);
        let task_ctx = Arc::clone(&ctx);
        let task = tokio::spawn(async move {
            // The semaphore is never closed; without a permit the call still runs.
            let _permit = slots.acquire_owned().await.ok();
            let started = Instant::now();
            let output = match tokio::time::timeout(timeout, tool.call(args, &task_ctx)).await {
                Ok(result) => result.map_err(ToolCallError::from),
                Err(_) => {
                    task_ctx.cancel().cancel();
                    Err(ToolCallError::TimedOut {
                        tool: tool.name().to_owned(),
                        timeout,
                    })
                }
            };
            (output, started.elapsed())
        });
        PendingCall {
            call,
            pending: Pending::Running {
                ctx,
                task: AbortOnDropHandle::new(task),
                _guard: token.drop_guard(),
            },
        }
    }
}

impl PendingCall {
    /// A call that does not run (refused by its checks, or replaced by a hook).
    pub(crate) fn settled(call: ToolCall, output: Result<Value, ToolCallError>) -> Self {
        Self {
            call,
            pending: Pending::Settled(output),
        }
    }

    /// Waits for the call to end.
    pub(crate) async fn finish(self) -> FinishedCall {
        let Self { call, pending } = self;
        match pending {
            Pending::Settled(output) => FinishedCall {
                call,
                output,
                duration: Duration::ZERO,
                delta: StateDelta::default(),
                actions: Actions::default(),
            },
            Pending::Running { ctx, task, _guard } => {
                let (output, duration) = match task.await {
                    Ok(done) => done,
                    Err(e) if e.is_panic() => (
                        Err(ToolCallError::Panicked {
                            tool: call.name.clone(),
                            detail: panic_message(e.into_panic()),
                        }),
                        Duration::ZERO,
                    ),
                    Err(_) => (Err(ToolError::Cancelled.into()), Duration::ZERO),
                };
                // A panicking tool's writes up to the panic are in the shared state already,
                // so they are reported too.
                let (delta, actions) = ctx.take_effects();
                FinishedCall {
                    call,
                    output,
                    duration,
                    delta,
                    actions,
                }
            }
        }
    }
}

fn panic_message(payload: Box<dyn Any + Send>) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        format!("panic: {s}")
    } else if let Some(s) = payload.downcast_ref::<String>() {
        format!("panic: {s}")
    } else {
        "panic".to_owned()
    }
}
