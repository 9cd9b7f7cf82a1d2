//! Limits: the run timeout, cancellation and ledger budgets stop a run and keep its state
//! and event log.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bridge::{Budget, BudgetLimit, Ledger};
use engine::flow::{
    Agent, Control, EndStatus, EventLog, FlowError, Graph, Invocation, InvocationContext, RunStatus,
};
use engine::{SharedState, State};
use serde_json::json;

use crate::support::{ends, iters, run_with, step, traced};

/// Never finishes on its own (and never looks at its cancellation token).
struct Hang;

#[async_trait]
impl Agent for Hang {
    fn name(&self) -> &str {
        "hang"
    }
    fn class(&self) -> &str {
        "Hang"
    }
    async fn run(&self, ctx: &InvocationContext) -> Result<Control, FlowError> {
        ctx.set_state("hang_started", json!(true));
        tokio::time::sleep(Duration::from_secs(3600)).await;
        Ok(Control::Continue)
    }
}

fn hanging_flow() -> Graph {
    Graph::sequential("root", vec![step("first"), Arc::new(Hang), step("never")])
        .expect("valid graph")
}

#[tokio::test]
async fn the_run_timeout_stops_the_run_and_keeps_the_state() {
    let invocation = Invocation::new(SharedState::new(State::default()))
        .with_timeout(Duration::from_millis(100));
    let (report, events) = run_with(&hanging_flow(), invocation).await;
    assert_eq!(report.status(), RunStatus::TimedOut);
    assert_eq!(
        report.result,
        Err(FlowError::TimedOut(Duration::from_millis(100)))
    );
    assert_eq!(traced(&report.state), ["first"]);
    assert_eq!(report.state.get("hang_started"), Some(&json!(true)));
    assert_eq!(ends(&events, "hang"), [EndStatus::Cancelled]);
    assert_eq!(ends(&events, "root"), [EndStatus::Cancelled]);
}

#[tokio::test]
async fn cancelling_keeps_the_state_and_a_readable_event_log() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = dir.path().join("events.jsonl");
    let log = Arc::new(EventLog::create(&path).expect("the log"));
    let invocation = Invocation::new(SharedState::new(State::default())).with_sink(log);
    let cancel = invocation.cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        cancel.cancel();
    });
    let (report, events) = run_with(&hanging_flow(), invocation).await;
    assert_eq!(report.status(), RunStatus::Cancelled);
    assert_eq!(traced(&report.state), ["first"]);
    let logged = EventLog::read(&path).expect("a readable log");
    assert_eq!(logged, events, "every event was flushed to the log");
    assert_eq!(
        logged.last().and_then(|e| e.end_status()),
        Some(EndStatus::Cancelled)
    );
}

#[tokio::test]
async fn a_spent_budget_stops_the_run_before_the_next_step() {
    let ledger = Arc::new(Ledger::new(Budget {
        max_calls: Some(0),
        ..Budget::default()
    }));
    let lp = Graph::looping("lp", vec![step("a")], iters(3)).expect("valid graph");
    let invocation = Invocation::new(SharedState::new(State::default())).with_ledger(ledger);
    let (report, _) = run_with(&lp, invocation).await;
    assert_eq!(report.status(), RunStatus::BudgetExceeded);
    let Err(FlowError::Budget(exceeded)) = report.result else {
        panic!("expected a budget stop, got {:?}", report.result);
    };
    assert_eq!(exceeded.limit, BudgetLimit::Calls);
    assert_eq!(traced(&report.state), Vec::<String>::new());
}
