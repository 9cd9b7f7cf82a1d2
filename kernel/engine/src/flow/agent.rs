//! The [`Agent`] trait and [`run_agent`], the one way an agent is run.
//!
//! An agent does its work in [`Agent::run`], reporting each step as an event through its
//! context, and says how control goes on with a [`Control`]. [`run_agent`] wraps every run
//! the same way — a child context, the `Start` event, the before-agent callbacks (which may
//! answer in the agent's place), the run, the after-agent callbacks and the `End` event — so
//! composite agents (graphs, loops, sequences, parallel groups) call it for each child and
//! never repeat that protocol.
//!
//! `End` is the last event of every agent run. A cancelled agent ends at once, even if its
//! run never looks at its token — unless work of the run that reports how it ended when
//! stopped holds a [`WindingDown`](super::WindingDown) guard (an RLM loop on a thread of its
//! own): then it waits up to two seconds for its run to return, so the record of how the
//! work ended comes first. An event of work that outlives its agent's `End` is not logged.
//!
//! The three actions and where they stop:
//!
//! - `end_turn` ends the current agent's turn; the agent consumes it and its parent moves
//!   on to the next sub-agent ([`Control::Continue`]).
//! - `exit_loop` ends the **nearest** enclosing loop only ([`Control::ExitLoop`] travels up
//!   through sequences and graphs until a loop consumes it); enclosing loops go on.
//! - `escalate` stops the whole invocation ([`Control::Escalate`] travels to the root).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::callbacks::Callbacks;
use super::context::InvocationContext;
pub use super::control::Control;
use super::error::FlowError;
use super::event::{EndStatus, Event, EventKind};
use crate::hook::HookAction;
use crate::tool::Actions;

/// How long a cancelled agent waits for its run to return while work of the run winds down
/// ([`InvocationContext::winding_down`]); while none does, a cancelled agent ends at once.
const STEP_WIND_DOWN: Duration = Duration::from_secs(2);

/// The agent classes a workflow knows, as files and graphs name them.
pub mod class {
    /// An LLM agent on the function-calling loop.
    pub const LLM: &str = "LlmAgent";
    /// Sub-agents in order, repeated up to `max_iterations`.
    pub(crate) const LOOP: &str = "LoopAgent";
    /// Sub-agents in order, once.
    pub(crate) const SEQUENTIAL: &str = "SequentialAgent";
    /// Sub-agents concurrently.
    pub(crate) const PARALLEL: &str = "ParallelAgent";
    /// Nodes with plain and conditional edges.
    pub(crate) const GRAPH: &str = "GraphAgent";
    /// Nodes routed by the control plane (the Scrum-Master router).
    pub(crate) const ROUTER: &str = "RouterAgent";
    /// The RLM loop as an agent (the kernel provides it).
    pub const RLM: &str = "RlmAgent";
    /// A Python function `(state) -> dict of updates` (the kernel provides it).
    pub const PYTHON: &str = "PythonAgent";
}

/// An agent: a named step of a workflow.
#[async_trait]
pub trait Agent: Send + Sync {
    /// Its name, unique among its siblings (authors its events, keys its branch).
    fn name(&self) -> &str;

    /// What it does (shown in graphs, and to a model when it is used as a tool).
    fn description(&self) -> &str {
        ""
    }

    /// Its class ([`class`]), for graphs and logs.
    fn class(&self) -> &str;

    /// Its sub-agents, in order (for rendering the tree).
    fn sub_agents(&self) -> Vec<Arc<dyn Agent>> {
        Vec::new()
    }

    /// Its own callbacks (run after the invocation's).
    fn callbacks(&self) -> &Callbacks {
        static NONE: std::sync::OnceLock<Callbacks> = std::sync::OnceLock::new();
        NONE.get_or_init(Callbacks::new)
    }

    /// Runs the agent in `ctx` (its own child context), emitting its steps as events.
    async fn run(&self, ctx: &InvocationContext) -> Result<Control, FlowError>;

    /// The agent as [`Any`](std::any::Any), for callers that need its concrete type (the
    /// durable runner takes a graph root as it is); `None` unless the type opts in.
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        None
    }
}

impl std::fmt::Debug for dyn Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}({})", self.class(), self.name())
    }
}

/// What one agent run did: how control goes on and the actions it raised (its writes went
/// into the state as it made them, and out with its events).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AgentOutcome {
    /// How control goes on.
    pub(crate) control: Control,
    /// The actions its events raised.
    pub(crate) actions: Actions,
}

/// Runs `agent` as a child of `parent`: `Start` event, before-agent callbacks, the run,
/// after-agent callbacks, `End` event. Returns how control goes on.
pub(crate) async fn run_agent(
    agent: &dyn Agent,
    parent: &InvocationContext,
) -> Result<Control, FlowError> {
    run_in(agent, &parent.child(agent.name(), agent.callbacks()))
        .await
        .map(|run| run.control)
}

/// `run_agent` in an already made child context `ctx`, reporting the whole [`AgentOutcome`].
pub async fn run_in(agent: &dyn Agent, ctx: &InvocationContext) -> Result<AgentOutcome, FlowError> {
    ctx.emit(Event::new(EventKind::Start))?;
    let callbacks = ctx.callbacks();
    let stopped = || ctx.stop_reason().unwrap_or(FlowError::Cancelled);
    let (result, abandoned) = {
        let mut run = std::pin::pin!(async {
            if callbacks.is_empty() {
                agent.run(ctx).await
            } else {
                run_with_callbacks(agent, ctx, &callbacks).await
            }
        });
        // A cancelled run ends here even if the agent never looks at its token; the agent
        // is polled first so that nested agents report their own ends, innermost first.
        let finished = tokio::select! {
            biased;
            result = &mut run => Some(result),
            () = ctx.cancel_token().cancelled() => None,
        };
        match finished {
            Some(result) => (result, false),
            // Work that reports how it ended when stopped (an RLM loop on its own thread)
            // gets a bounded moment, so that its record comes before this `End`. An
            // enclosing agent starts its moment after this one's, so it ends later.
            None if ctx.is_winding_down() => {
                match tokio::time::timeout(STEP_WIND_DOWN, &mut run).await {
                    Ok(result) => (result, false),
                    Err(_) => (Err(stopped()), true),
                }
            }
            None => (Err(stopped()), false),
        }
    };
    let (status, control) = match &result {
        Ok(control) => (
            ctx.end_status().unwrap_or(match control {
                Control::Escalate => EndStatus::Escalated,
                _ => EndStatus::Completed,
            }),
            *control,
        ),
        Err(e) if e.is_stop() => (EndStatus::Cancelled, Control::Continue),
        Err(_) => (EndStatus::Failed, Control::Continue),
    };
    let mut end = Event::new(EventKind::End { status });
    if let Err(e) = &result {
        end.content = Some(if abandoned {
            format!(
                "{e} (it did not stop within {} s and was left behind; what it reports later is not logged)",
                STEP_WIND_DOWN.as_secs()
            )
        } else {
            e.to_string()
        });
    }
    ctx.emit(end)?;
    let control = result.map(|_| control)?;
    Ok(AgentOutcome {
        control,
        actions: ctx.actions(),
    })
}

async fn run_with_callbacks(
    agent: &dyn Agent,
    ctx: &InvocationContext,
    callbacks: &Callbacks,
) -> Result<Control, FlowError> {
    let cb = ctx.callback_context();
    let answer = callbacks.first(|c| c.before_agent(&cb));
    let actions = ctx.absorb_callback(&cb);
    let control = match answer {
        HookAction::Replace(text) => {
            ctx.emit(Event::message(text).with_actions(actions))?;
            ctx.set_end_status(EndStatus::Skipped);
            return Ok(Control::from_actions(actions));
        }
        HookAction::Stop(reason) => return Err(stopped(ctx, reason)),
        HookAction::Continue if actions.any() => {
            ctx.emit(Event::new(EventKind::StateUpdate).with_actions(actions))?;
            Control::from_actions(actions)
        }
        HookAction::Continue => agent.run(ctx).await?,
    };
    if control == Control::Escalate {
        return Ok(control);
    }
    let answer = callbacks.first(|c| c.after_agent(&cb));
    let actions = ctx.absorb_callback(&cb);
    match answer {
        HookAction::Replace(text) => ctx.emit(Event::message(text).with_actions(actions))?,
        HookAction::Stop(reason) => return Err(stopped(ctx, reason)),
        HookAction::Continue if actions.any() => {
            ctx.emit(Event::new(EventKind::StateUpdate).with_actions(actions))?;
        }
        HookAction::Continue => {}
    }
    // Writes without an event of their own ride on the `End` event.
    Ok(control.max(Control::from_actions(actions)))
}

/// The failure of the agent of `ctx` that a callback stopped for `reason`.
fn stopped(ctx: &InvocationContext, reason: String) -> FlowError {
    FlowError::StoppedByHook {
        agent: ctx.agent().to_owned(),
        reason,
    }
}
