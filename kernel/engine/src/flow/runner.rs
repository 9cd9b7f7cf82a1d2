//! Running a workflow: one invocation of a root agent, bounded in time, with a report.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::agent::{Agent, Control, run_agent};
use super::context::{Invocation, InvocationContext};
use super::error::FlowError;
use crate::state::State;

/// How long a stopped run may take to wind down (agents see the cancellation at their next
/// await) before it is abandoned.
const WIND_DOWN: Duration = Duration::from_secs(5);

/// How an invocation ended (what the front end's exit code says); a durable run's stored
/// status is [`durable::RunStatus`](crate::durable::RunStatus).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunOutcome {
    /// The root agent ran to its end.
    Completed,
    /// A step escalated: the run stopped on purpose.
    Escalated,
    /// Cancelled (Ctrl-C).
    Cancelled,
    /// The run timeout expired.
    TimedOut,
    /// A budget of the ledger was spent.
    BudgetExceeded,
    /// An agent failed.
    Failed,
}

/// What a run did.
#[derive(Debug, Clone)]
pub struct RunReport {
    /// The root agent's control, or why the run stopped.
    pub result: Result<Control, FlowError>,
    /// The state at the end (`temp:` keys dropped).
    pub state: State,
}

impl RunReport {
    /// How the run ended.
    pub fn outcome(&self) -> RunOutcome {
        match &self.result {
            Ok(Control::Escalate) => RunOutcome::Escalated,
            Ok(_) => RunOutcome::Completed,
            Err(FlowError::Cancelled) => RunOutcome::Cancelled,
            Err(FlowError::TimedOut(_)) => RunOutcome::TimedOut,
            Err(FlowError::Budget(_)) => RunOutcome::BudgetExceeded,
            Err(_) => RunOutcome::Failed,
        }
    }
}

/// Runs `root` once over `invocation`'s state, with `input` as the user's first turn.
///
/// The run stops at its timeout or when its token is cancelled; either way the state and
/// the events written so far are kept, and `temp:` keys are dropped at the end.
pub async fn run_workflow(
    root: &dyn Agent,
    invocation: Invocation,
    input: Option<&str>,
) -> RunReport {
    let state = invocation.state.clone();
    let ctx = InvocationContext::new(invocation);
    if let Some(input) = input {
        ctx.add_turn("user", input);
    }
    let result = {
        let run = run_agent(root, &ctx);
        let mut run = std::pin::pin!(run);
        match ctx.deadline() {
            None => run.await,
            Some(deadline) => {
                tokio::select! {
                    result = &mut run => result,
                    () = tokio::time::sleep_until(deadline.into()) => {
                        ctx.stop(FlowError::TimedOut(ctx.timeout().unwrap_or_default()));
                        match tokio::time::timeout(WIND_DOWN, &mut run).await {
                            Ok(result) => result,
                            Err(_) => Err(ctx.stop_reason().unwrap_or(FlowError::Cancelled)),
                        }
                    }
                }
            }
        }
    };
    // An agent that saw only the cancellation reports `Cancelled`; the run knows why.
    let result = match (result, ctx.stop_reason()) {
        (Err(FlowError::Cancelled), Some(reason)) => Err(reason),
        (result, _) => result,
    };
    // The event log is complete when the run returns; a line that could not be written
    // fails a run that would have succeeded.
    let flushed = crate::blocking::off_worker(|| ctx.flush_sinks());
    let result = match (result, flushed) {
        (Ok(_), Err(e)) => Err(e),
        (result, _) => result,
    };
    state.clear_temp();
    // The run's own state, not a copy of it, unless a caller (or work left behind) still
    // shares it.
    drop(ctx);
    RunReport {
        result,
        state: state.into_state(),
    }
}
