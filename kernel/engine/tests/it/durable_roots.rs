#![allow(clippy::unwrap_used)] // In tests an unwrap is an assertion.

//! Durable runs of roots that are not a router's graph: a loop resumed between two
//! iterations counts them as an unbroken run would, and roots that are not graphs (one
//! agent, a parallel group) run as the one node of a sequence. A root's own callbacks run
//! once per run, whatever the root.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use crate::support::store_in_memory;
use engine::HookAction;
use engine::durable::{DurableRoot, RunStatus, Start, Store, run_durable};
use engine::flow::{
    Agent, BranchPolicy, Callback, CallbackContext, Callbacks, Control, FlowError, FnAgent, Graph,
    Invocation, InvocationContext, Target,
};
use engine::route::{ControlPlane, RouterConfig};
use engine::{SharedState, State};
use serde_json::json;

fn counter(name: &str, key: &'static str) -> Arc<dyn Agent> {
    Arc::new(FnAgent::new(name, move |ctx: &InvocationContext| {
        let n = ctx.get_state(key).and_then(|v| v.as_u64()).unwrap_or(0);
        ctx.set_state(key, json!(n + 1));
        Ok(Control::Continue)
    }))
}

fn new_run() -> Start {
    Start::New {
        workflow: "w".into(),
        input: json!({}),
    }
}

fn resume() -> Start {
    Start::Resume {
        from: None,
        answer: None,
        take_over: false,
    }
}

async fn run(root: &DurableRoot, store: &Arc<dyn Store>, id: &str, start: Start) -> State {
    let invocation = Invocation::new(SharedState::new(State::default()));
    let report = run_durable(root.graph(), root.plane(), store, id, start, invocation)
        .await
        .unwrap();
    assert_eq!(
        store.run(id).await.unwrap().unwrap().lease,
        None,
        "released"
    );
    report.run.state
}

#[tokio::test]
async fn a_loop_resumed_between_iterations_runs_as_many_as_an_unbroken_one() {
    // `a` fails once, at the start of the second iteration: the head is then `b`'s
    // checkpoint of the first, and resuming follows `b`'s edge back into the loop.
    let failed = Arc::new(AtomicBool::new(false));
    let flag = failed.clone();
    let a: Arc<dyn Agent> = Arc::new(FnAgent::new("a", move |ctx: &InvocationContext| {
        let n = ctx.get_state("a").and_then(|v| v.as_u64()).unwrap_or(0);
        if n == 1 && !flag.swap(true, Ordering::SeqCst) {
            return Err(FlowError::Sink("the process died here".into()));
        }
        ctx.set_state("a", json!(n + 1));
        Ok(Control::Continue)
    }));
    let three = NonZeroU32::new(3).unwrap();
    let graph = Graph::looping("loop", vec![a, counter("b", "b")], three).unwrap();
    let root = DurableRoot::new(Arc::new(graph)).unwrap();
    let store = store_in_memory();
    let state = run(&root, &store, "l", new_run()).await;
    assert_eq!(state.get("b"), Some(&json!(1)));
    assert!(matches!(
        store.run("l").await.unwrap().unwrap().status,
        RunStatus::Failed { .. }
    ));
    let state = run(&root, &store, "l", resume()).await;
    assert_eq!(
        store.run("l").await.unwrap().unwrap().status,
        RunStatus::Completed,
        "the loop ends at its limit, not at the graph's step limit"
    );
    assert_eq!(state.get("a"), Some(&json!(3)), "three iterations in all");
    assert_eq!(state.get("b"), Some(&json!(3)));
    let nodes: Vec<String> = store
        .history("l")
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.node)
        .collect();
    assert_eq!(nodes, ["__start__", "a", "b", "a", "b", "a", "b"]);
}

#[tokio::test]
async fn roots_that_are_not_graphs_run_as_the_one_node_of_a_sequence() {
    let store = store_in_memory();
    let single = DurableRoot::new(counter("solo", "n")).unwrap();
    assert_eq!(single.graph().name(), "solo");
    let state = run(&single, &store, "s", new_run()).await;
    assert_eq!(state.get("n"), Some(&json!(1)));
    let parallel = Graph::parallel(
        "both",
        vec![counter("x", "x"), counter("y", "y")],
        BranchPolicy::FailFast,
    )
    .unwrap();
    let parallel = DurableRoot::new(Arc::new(parallel)).unwrap();
    let state = run(&parallel, &store, "p", new_run()).await;
    assert_eq!(
        (state.get("x"), state.get("y")),
        (Some(&json!(1)), Some(&json!(1)))
    );
    for (id, node) in [("s", "solo"), ("p", "both")] {
        let nodes: Vec<String> = store
            .history(id)
            .await
            .unwrap()
            .into_iter()
            .map(|c| c.node)
            .collect();
        assert_eq!(nodes, ["__start__", node]);
        assert_eq!(
            store.run(id).await.unwrap().unwrap().status,
            RunStatus::Completed
        );
    }
}

#[test]
fn a_routed_graph_brings_its_control_plane_and_a_plain_one_none() {
    let plane = Arc::new(ControlPlane::new(RouterConfig::new(
        ["a", "b"],
        [("a", "b")],
    )));
    let routed = plane
        .graph("team", vec![counter("a", "a"), counter("b", "b")], "a")
        .unwrap();
    let found = DurableRoot::new(Arc::new(routed)).unwrap();
    assert!(found.plane().is_some_and(|p| Arc::ptr_eq(p, &plane)));
    let plain = Graph::sequential("seq", vec![counter("a", "a")]).unwrap();
    assert!(DurableRoot::new(Arc::new(plain)).unwrap().plane().is_none());
}

/// Sleeps an hour (a node a timeout cuts short).
struct Sleepy;

#[async_trait::async_trait]
impl Agent for Sleepy {
    fn name(&self) -> &str {
        "sleepy"
    }
    fn description(&self) -> &str {
        "sleeps an hour"
    }
    fn class(&self) -> &str {
        "Sleepy"
    }
    async fn run(&self, _ctx: &InvocationContext) -> Result<Control, FlowError> {
        tokio::time::sleep(std::time::Duration::from_secs(3600)).await;
        Ok(Control::Continue)
    }
}

#[tokio::test(start_paused = true)]
async fn a_run_stopped_by_ctrl_c_or_a_timeout_is_released_and_resumable() {
    let store = store_in_memory();
    // Ctrl-C: the first node cancels the run, which stops before the next one.
    let interrupt: Arc<dyn Agent> = Arc::new(FnAgent::new("stop", |ctx: &InvocationContext| {
        ctx.cancel_token().cancel();
        Ok(Control::Continue)
    }));
    let graph = Graph::sequential("g", vec![interrupt, counter("after", "n")]).unwrap();
    let root = DurableRoot::new(Arc::new(graph)).unwrap();
    let state = run(&root, &store, "c", new_run()).await;
    assert_eq!(state.get("n"), None);
    // A timeout.
    let graph = Graph::sequential("t", vec![counter("first", "n"), Arc::new(Sleepy)]).unwrap();
    let root = DurableRoot::new(Arc::new(graph)).unwrap();
    let invocation = Invocation::new(SharedState::new(State::default()))
        .with_timeout(std::time::Duration::from_millis(100));
    let report = run_durable(
        root.graph(),
        root.plane(),
        &store,
        "t",
        new_run(),
        invocation,
    )
    .await
    .unwrap();
    assert!(report.run.result.is_err());
    for id in ["c", "t"] {
        let record = store.run(id).await.unwrap().unwrap();
        assert_eq!(record.lease, None, "{id}");
        // Free for the next process, which finds no owner to take it from.
        let claim = store
            .claim(id, &engine::durable::Owner::current(), false)
            .await
            .unwrap();
        assert_eq!(claim.replaced, None);
        store.release(&claim.lease).await.unwrap();
    }
}

/// Counts the before- and after-agent calls it gets.
#[derive(Default)]
struct Count {
    before: AtomicU32,
    after: AtomicU32,
}

impl Callback for Count {
    fn before_agent(&self, _ctx: &CallbackContext) -> HookAction<String> {
        self.before.fetch_add(1, Ordering::SeqCst);
        HookAction::Continue
    }

    fn after_agent(&self, _ctx: &CallbackContext) -> HookAction<String> {
        self.after.fetch_add(1, Ordering::SeqCst);
        HookAction::Continue
    }
}

impl Count {
    fn calls(&self) -> (u32, u32) {
        (
            self.before.load(Ordering::SeqCst),
            self.after.load(Ordering::SeqCst),
        )
    }
}

fn counted(count: &Arc<Count>) -> Callbacks {
    [count.clone() as Arc<dyn Callback>].into_iter().collect()
}

/// A root's own before/after-agent callbacks run exactly once per run, whatever the root:
/// a graph, a sequence, a loop, a routed graph, a wrapped single agent.
#[tokio::test]
async fn a_roots_callbacks_run_once_per_run_for_every_root_kind() {
    let store = store_in_memory();
    let two = NonZeroU32::new(2).unwrap();
    let plane = Arc::new(ControlPlane::new(RouterConfig::new(
        ["a", "b"],
        [("a", "b")],
    )));
    type Build = Box<dyn Fn(Callbacks) -> Arc<dyn Agent>>;
    let roots: Vec<(&str, Build)> = vec![
        (
            "sequence",
            Box::new(|c| {
                let seq = Graph::sequential("seq", vec![counter("a", "a"), counter("b", "b")]);
                Arc::new(seq.unwrap().with_callbacks(c))
            }),
        ),
        (
            "loop",
            Box::new(move |c| {
                let lp = Graph::looping("lp", vec![counter("a", "a"), counter("b", "b")], two);
                Arc::new(lp.unwrap().with_callbacks(c))
            }),
        ),
        (
            "graph",
            Box::new(|c| {
                let graph = Graph::builder("g")
                    .node(counter("a", "a"))
                    .node(counter("b", "b"))
                    .start("a")
                    .edge("a", Target::node("b"))
                    .build();
                Arc::new(graph.unwrap().with_callbacks(c))
            }),
        ),
        (
            "routed",
            Box::new(move |c| {
                let routed = plane.graph("team", vec![counter("a", "a"), counter("b", "b")], "a");
                Arc::new(routed.unwrap().with_callbacks(c))
            }),
        ),
        (
            "single",
            Box::new(|c| {
                let solo = FnAgent::new("solo", |ctx: &InvocationContext| {
                    ctx.set_state("a", json!(1));
                    Ok(Control::Continue)
                });
                Arc::new(solo.with_callbacks(c))
            }),
        ),
    ];
    for (kind, build) in roots {
        let count = Arc::new(Count::default());
        let root = DurableRoot::new(build(counted(&count))).unwrap();
        run(&root, &store, kind, new_run()).await;
        assert_eq!(
            store.run(kind).await.unwrap().unwrap().status,
            RunStatus::Completed
        );
        assert_eq!(count.calls(), (1, 1), "{kind}: once before, once after");
    }
}

/// A routed run that stops for a human has started but not ended: its root's `before_agent`
/// ran and its `after_agent` waits; resuming with the answer runs `after_agent` once, and
/// `before_agent` not again.
#[tokio::test]
async fn a_run_resumed_after_a_human_runs_its_roots_callbacks_once_in_all() {
    let ask: Arc<dyn Agent> = Arc::new(FnAgent::new("ask", |ctx: &InvocationContext| {
        if ctx.get_state("human_input").is_none() {
            ctx.set_state("escalate_to_human", json!("Ship it?"));
        }
        Ok(Control::Continue)
    }));
    let plane = Arc::new(ControlPlane::new(RouterConfig::new(
        ["ask", "b"],
        [("ask", "b")],
    )));
    let count = Arc::new(Count::default());
    let graph = plane
        .graph("team", vec![ask, counter("b", "b")], "ask")
        .unwrap()
        .with_callbacks(counted(&count));
    let root = DurableRoot::new(Arc::new(graph)).unwrap();
    let store = store_in_memory();
    run(&root, &store, "h", new_run()).await;
    assert!(matches!(
        store.run("h").await.unwrap().unwrap().status,
        RunStatus::AwaitingHuman { .. }
    ));
    assert_eq!(count.calls(), (1, 0), "stopped for a human: not ended yet");
    let answer = Start::Resume {
        from: None,
        answer: Some("Yes.".into()),
        take_over: false,
    };
    let state = run(&root, &store, "h", answer).await;
    assert_eq!(state.get("b"), Some(&json!(1)));
    assert_eq!(
        store.run("h").await.unwrap().unwrap().status,
        RunStatus::Completed
    );
    assert_eq!(count.calls(), (1, 1), "before once, after once, in all");
}
