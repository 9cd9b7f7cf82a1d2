//! The graph executor: conditional edges, node observers, resuming at a node, and parallel
//! groups (deterministic merge, branch failure policy).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use engine::flow::{
    Agent, BranchPolicy, Control, EndStatus, FlowError, Graph, GraphError, Invocation,
    InvocationContext, NodeObserver, NodeRecord, Position, ResumeAction, ResumePoint, RunOutcome,
    StateRouter, Target,
};
use engine::{SharedState, State};
use serde_json::json;

use crate::support::{counted, ends, failing, run, run_with, step, trace, traced, written};

/// Records every finished node.
#[derive(Default)]
struct Recorder(Mutex<Vec<NodeRecord>>);

#[async_trait::async_trait]
impl NodeObserver for Recorder {
    async fn node_finished(
        &self,
        _: &InvocationContext,
        record: &NodeRecord,
    ) -> Result<(), FlowError> {
        self.0.lock().expect("not poisoned").push(record.clone());
        Ok(())
    }
}

fn review_graph() -> Graph {
    // draft → review → (approved? publish : draft)
    Graph::builder("review")
        .node(counted("draft", |_| Control::Continue))
        .node(Arc::new(engine::flow::FnAgent::new("review", |ctx| {
            trace(ctx, "review");
            let drafts = ctx.get_state("draft").and_then(|v| v.as_u64()).unwrap_or(0);
            ctx.set_state("approved", json!(drafts >= 2));
            Ok(Control::Continue)
        })))
        .node(step("publish"))
        .start("draft")
        .edge("draft", Target::node("review"))
        .route(
            "review",
            Arc::new(StateRouter(|state: &State| {
                if state.get("approved") == Some(&json!(true)) {
                    Target::node("publish")
                } else {
                    Target::node("draft")
                }
            })),
        )
        .edge("publish", Target::End)
        .build()
        .expect("valid graph")
}

#[tokio::test]
async fn conditional_edges_route_on_the_state_the_last_node_wrote() {
    let recorder = Arc::new(Recorder::default());
    let invocation =
        Invocation::new(SharedState::new(State::default())).with_observer(recorder.clone());
    let (report, _) = run_with(&review_graph(), invocation).await;
    assert_eq!(report.outcome(), RunOutcome::Completed);
    assert_eq!(
        traced(&report.state),
        ["draft", "review", "draft", "review", "publish"]
    );
    let records = recorder.0.lock().expect("not poisoned").clone();
    let nodes: Vec<(&str, u64)> = records.iter().map(|r| (r.node.as_str(), r.step)).collect();
    assert_eq!(
        nodes,
        [
            ("draft", 1),
            ("review", 2),
            ("draft", 3),
            ("review", 4),
            ("publish", 5)
        ]
    );
    // Each record holds exactly the writes of its node.
    assert_eq!(
        written(&records[1].writes, "approved").as_ref(),
        Some(&json!(false))
    );
    assert_eq!(written(&records[1].writes, "draft").as_ref(), None);
    assert_eq!(
        written(&records[3].writes, "approved").as_ref(),
        Some(&json!(true))
    );
    assert_eq!(
        written(&records[2].writes, "draft").as_ref(),
        Some(&json!(2))
    );
    assert!(records.iter().all(|r| r.graph == "review"));
}

#[tokio::test]
async fn a_run_can_start_at_a_node_with_a_given_state() {
    let graph = review_graph();
    let mut state = State::default();
    state.set("draft", json!(1));
    let at = |node: &str| ResumePoint {
        path: vec![Position {
            graph: "review".into(),
            node: node.into(),
            step: 3,
            iteration: None,
        }],
        action: ResumeAction::Run,
    };
    let invocation = Invocation::new(SharedState::new(state.clone())).with_resume(at("draft"));
    let (report, _) = run_with(&graph, invocation).await;
    assert_eq!(report.result, Ok(Control::Continue));
    assert_eq!(report.state.get("draft"), Some(&json!(2)));
    assert_eq!(traced(&report.state), ["draft", "review", "publish"]);
    let invocation = Invocation::new(SharedState::new(state)).with_resume(at("nope"));
    let (report, _) = run_with(&graph, invocation).await;
    assert!(matches!(report.result, Err(FlowError::UnknownNode { .. })));
}

#[tokio::test]
async fn a_cyclic_graph_stops_at_its_step_limit() {
    let graph = Graph::builder("spin")
        .node(step("a"))
        .node(step("b"))
        .start("a")
        .edge("a", Target::node("b"))
        .edge("b", Target::node("a"))
        .max_steps(5)
        .build()
        .expect("valid graph");
    let (report, _) = run(&graph, State::default()).await;
    assert_eq!(
        report.result,
        Err(FlowError::StepLimit {
            graph: "spin".into(),
            max_steps: 5
        })
    );
    assert_eq!(report.outcome(), RunOutcome::Failed);
    assert_eq!(traced(&report.state).len(), 5, "the state so far is kept");
}

#[tokio::test]
async fn graphs_refuse_unknown_and_duplicate_nodes() {
    let unknown = Graph::builder("g")
        .node(step("a"))
        .start("a")
        .edge("a", Target::node("b"))
        .build();
    let Err(GraphError::UnknownNode { name, known, .. }) = unknown else {
        panic!("expected an unknown-node error, got {unknown:?}");
    };
    assert_eq!((name.as_str(), known.as_str()), ("b", "`a`"));
    let duplicate = Graph::sequential("s", vec![step("a"), step("a")]);
    assert!(matches!(duplicate, Err(GraphError::DuplicateNode { .. })));
    let no_start = Graph::builder("g").node(step("a")).build();
    assert!(matches!(no_start, Err(GraphError::NoStart { .. })));
}

/// Writes `key = value` after `delay`, and records it saw `peek` if another branch wrote it.
struct Slow {
    name: String,
    delay: Duration,
    key: &'static str,
    peek: Option<&'static str>,
}

#[async_trait]
impl Agent for Slow {
    fn name(&self) -> &str {
        &self.name
    }
    fn class(&self) -> &str {
        "Slow"
    }
    async fn run(&self, ctx: &InvocationContext) -> Result<Control, FlowError> {
        tokio::time::sleep(self.delay).await;
        ctx.set_state(self.key, json!(self.name));
        ctx.set_state(format!("{}_done", self.name), json!(true));
        if let Some(peek) = self.peek {
            ctx.set_state(format!("{}_saw", self.name), json!(ctx.get_state(peek)));
        }
        ctx.emit(engine::flow::Event::message(format!("{} done", self.name)))?;
        Ok(Control::Continue)
    }
}

fn slow(name: &str, ms: u64, peek: Option<&'static str>) -> Arc<dyn Agent> {
    Arc::new(Slow {
        name: name.into(),
        delay: Duration::from_millis(ms),
        key: "winner",
        peek,
    })
}

#[tokio::test]
async fn parallel_branches_merge_in_declaration_order_whatever_the_timing() {
    // `first` finishes last and `last` first; the declared-last branch still wins.
    for (first_ms, last_ms) in [(40, 0), (0, 40)] {
        let group = Graph::parallel(
            "fan",
            vec![
                slow("first", first_ms, Some("last_done")),
                slow("last", last_ms, None),
            ],
            BranchPolicy::FailFast,
        )
        .expect("valid graph");
        let root = Graph::sequential(
            "root",
            vec![Arc::new(group), counted("after", |_| Control::Continue)],
        )
        .expect("valid graph");
        let (report, events) = run(&root, State::default()).await;
        assert_eq!(report.outcome(), RunOutcome::Completed);
        assert_eq!(report.state.get("winner"), Some(&json!("last")));
        // Shared state: a branch sees a sibling's write at once.
        let saw = report.state.get("first_saw");
        let expected = if first_ms > last_ms {
            json!(true)
        } else {
            json!(null)
        };
        assert_eq!(saw, Some(&expected));
        // The merge is reported as one event of the group, in declaration order.
        let merge = events
            .iter()
            .rfind(|e| e.author == "fan" && !e.delta.is_empty())
            .expect("a merge event");
        assert!(merge.delta.keys().contains(&"winner"));
        assert_eq!(written(&merge.delta, "winner"), Some(json!("last")));
        assert_eq!(traced(&report.state), ["after"]);
    }
}

#[tokio::test]
async fn parallel_branches_keep_their_own_history_and_join_it_in_order() {
    let group = Graph::parallel(
        "fan",
        vec![slow("a", 30, None), slow("b", 0, None)],
        BranchPolicy::FailFast,
    )
    .expect("valid graph");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen_in = seen.clone();
    let after = engine::flow::FnAgent::new("after", move |ctx| {
        *seen_in.lock().expect("not poisoned") = ctx.history();
        Ok(Control::Continue)
    });
    let root =
        Graph::sequential("root", vec![Arc::new(group), Arc::new(after)]).expect("valid graph");
    let (report, _) = run(&root, State::default()).await;
    assert_eq!(report.outcome(), RunOutcome::Completed);
    let turns: Vec<String> = seen
        .lock()
        .expect("not poisoned")
        .iter()
        .map(|t| format!("{}: {}", t.author, t.content))
        .collect();
    assert_eq!(turns, ["a: a done", "b: b done"]);
}

#[tokio::test]
async fn a_failing_branch_fails_the_group_or_is_left_out_by_policy() {
    let branches = || vec![slow("slow", 200, None), failing("broken", "no data")];
    let group = Graph::parallel("fan", branches(), BranchPolicy::FailFast).expect("valid graph");
    let (report, events) = run(&group, State::default()).await;
    assert_eq!(
        report.result,
        Err(FlowError::Agent {
            agent: "broken".into(),
            message: "no data".into()
        })
    );
    // The sibling was cancelled, not left to finish.
    assert_eq!(ends(&events, "slow"), [EndStatus::Cancelled]);
    assert_eq!(report.state.get("winner"), None);

    let group = Graph::parallel("fan", branches(), BranchPolicy::Continue).expect("valid graph");
    let (report, events) = run(&group, State::default()).await;
    assert_eq!(report.outcome(), RunOutcome::Completed);
    assert_eq!(ends(&events, "broken"), [EndStatus::Failed]);
    assert_eq!(report.state.get("winner"), Some(&json!("slow")));
}

/// A run resumed at a node after a "crash" (the records up to it kept) ends with the same
/// state and the same node records as an uninterrupted run.
#[tokio::test]
async fn a_resumed_run_matches_an_uninterrupted_one() {
    let graph = review_graph();
    let whole = Arc::new(Recorder::default());
    let invocation =
        Invocation::new(SharedState::new(State::default())).with_observer(whole.clone());
    let (uninterrupted, _) = run_with(&graph, invocation).await;
    let records = whole.0.lock().expect("not poisoned").clone();

    // Replay the checkpoints of the first two nodes, then resume at the third.
    let mut state = State::default();
    for record in &records[..2] {
        state.apply(&record.writes);
    }
    let resumed = Arc::new(Recorder::default());
    let invocation = Invocation::new(SharedState::new(state)).with_observer(resumed.clone());
    let at = ResumePoint {
        path: records[1].path.clone().expect("a path"),
        action: ResumeAction::After(Control::Continue),
    };
    let (report, _) = run_with(&graph, invocation.with_resume(at)).await;
    assert_eq!(report.state, uninterrupted.state);
    assert_eq!(*resumed.0.lock().expect("not poisoned"), records[2..]);
}
