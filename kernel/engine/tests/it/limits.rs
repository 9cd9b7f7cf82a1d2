//! Limits: the run timeout, cancellation and ledger budgets stop a run and keep its state
//! and event log.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bridge::{Budget, BudgetLimit, Ledger};
use engine::flow::{
    Agent, Control, EndStatus, Event, EventKind, EventLog, FlowError, Graph, Invocation,
    InvocationContext, MemorySink, RunOutcome, run_workflow,
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
    assert_eq!(report.outcome(), RunOutcome::TimedOut);
    assert_eq!(
        report.result,
        Err(FlowError::TimedOut(Duration::from_millis(100)))
    );
    assert_eq!(traced(&report.state), ["first"]);
    assert_eq!(report.state.get("hang_started"), Some(&json!(true)));
    assert_eq!(ends(&events, "hang"), [EndStatus::Cancelled]);
    assert_eq!(ends(&events, "root"), [EndStatus::Cancelled]);
}

/// Stands for an RLM loop on a thread of its own: work that, once the run is cancelled,
/// takes `wind_down` to stop and then records how it ended. The agent waits for it.
struct Winding {
    wind_down: Duration,
}

#[async_trait]
impl Agent for Winding {
    fn name(&self) -> &str {
        "loop"
    }
    fn class(&self) -> &str {
        "Winding"
    }
    async fn run(&self, ctx: &InvocationContext) -> Result<Control, FlowError> {
        let (done, ended) = tokio::sync::oneshot::channel();
        let (work, guard, wind_down) = (ctx.clone(), ctx.winding_down(), self.wind_down);
        tokio::spawn(async move {
            let _guard = guard;
            work.cancel_token().cancelled().await;
            tokio::time::sleep(wind_down).await;
            let _ = work.emit(Event::metadata("loop_result", json!("interrupted")));
            let _ = done.send(());
        });
        let _ = ended.await;
        Err(FlowError::Cancelled)
    }
}

/// A cancelled agent waits (at most two seconds) for work that winds down, so the work's
/// record comes before the agent's `End`; work slower than that is left behind and what it
/// reports later is not logged: `End` stays the last event either way. Without such work a
/// cancelled agent ends at once, even one that never looks at its token.
#[tokio::test(start_paused = true)]
async fn a_cancelled_agent_ends_after_the_work_winding_down_and_end_stays_last() {
    let run = |agent: Arc<dyn Agent>| async move {
        let root = Graph::sequential("root", vec![step("first"), agent, step("never")])
            .expect("valid graph");
        let invocation = Invocation::new(SharedState::new(State::default()));
        let cancel = invocation.cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            cancel.cancel();
        });
        let started = tokio::time::Instant::now();
        let sink = MemorySink::new();
        let report = run_workflow(&root, invocation.with_sink(Arc::new(sink.clone())), None).await;
        let took = started.elapsed();
        assert_eq!(report.outcome(), RunOutcome::Cancelled);
        assert_eq!(traced(&report.state), ["first"]);
        (took, sink)
    };
    let topics = |events: &[Event]| -> Vec<String> {
        events
            .iter()
            .map(|e| match (&e.kind, e.end_status()) {
                (EventKind::Metadata { topic }, _) => topic.clone(),
                (_, Some(status)) => format!("{}:{status:?}", e.author),
                _ => format!("{}:{:?}", e.author, e.kind),
            })
            .filter(|t| !t.starts_with("first"))
            .collect()
    };

    let (took, sink) = run(Arc::new(Winding {
        wind_down: Duration::from_millis(300),
    }))
    .await;
    assert_eq!(
        took,
        Duration::from_millis(350),
        "waited for the work, no longer"
    );
    assert_eq!(
        topics(&sink.events()),
        [
            "root:Start",
            "loop:Start",
            "loop_result",
            "loop:Cancelled",
            "root:Cancelled"
        ]
    );

    let (took, sink) = run(Arc::new(Winding {
        wind_down: Duration::from_secs(3),
    }))
    .await;
    assert_eq!(
        took,
        Duration::from_millis(2050),
        "the work was left behind"
    );
    let end = sink
        .events()
        .into_iter()
        .find(|e| e.author == "loop" && e.end_status().is_some());
    let content = end.and_then(|e| e.content).unwrap_or_default();
    assert!(content.contains("did not stop within 2 s"), "{content}");
    // The work reports a second later, after the ends: not logged.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        topics(&sink.events()),
        [
            "root:Start",
            "loop:Start",
            "loop:Cancelled",
            "root:Cancelled"
        ]
    );

    let (took, sink) = run(Arc::new(Hang)).await;
    assert_eq!(
        took,
        Duration::from_millis(50),
        "nothing winds down: at once"
    );
    assert_eq!(
        topics(&sink.events()),
        [
            "root:Start",
            "hang:Start",
            "hang:Cancelled",
            "root:Cancelled"
        ]
    );
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
    assert_eq!(report.outcome(), RunOutcome::Cancelled);
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
    assert_eq!(report.outcome(), RunOutcome::BudgetExceeded);
    let Err(FlowError::Budget(exceeded)) = report.result else {
        panic!("expected a budget stop, got {:?}", report.result);
    };
    assert_eq!(exceeded.limit, BudgetLimit::Calls);
    assert_eq!(traced(&report.state), Vec::<String>::new());
}
