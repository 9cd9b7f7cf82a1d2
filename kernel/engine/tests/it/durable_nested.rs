#![allow(clippy::unwrap_used)] // In tests an unwrap is an assertion.

//! Checkpoints at every depth: a loop inside a sequence inside a loop, stopped at every leaf
//! node in turn (an injected error, or the run's future dropped mid-node as `kill -9` would),
//! resumes so that only the node that was running runs again, to the state, the checkpoint
//! chain and the loop events of an unbroken run; time travel to a nested checkpoint; a
//! nested escalation answered; a parallel group checkpointed at its boundary; a routed graph
//! resumed inside its nested loop.

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use engine::durable::{
    CheckpointId, DurableRoot, RunStatus, SqliteStore, Start, Store, checkpoint_path, run_durable,
};
use engine::flow::{
    Agent, Control, Event, EventKind, FlowError, Graph, Invocation, InvocationContext, MemorySink,
    RunReport, path_text,
};
use engine::route::{ControlPlane, RouterConfig};
use engine::{SharedState, State};
use serde_json::{Value, json};
use tokio::sync::Notify;

use crate::control::summaries;

/// How a run is stopped at its `at`-th leaf execution.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Stop {
    /// The node fails (the run records `failed`).
    Error,
    /// The node never returns and the run's future is dropped (the run stays `running`).
    Drop,
}

/// Counts every leaf execution and stops the run at one of them.
#[derive(Default)]
struct Probe {
    executed: AtomicUsize,
    counts: Mutex<BTreeMap<String, u32>>,
    stop_at: Mutex<Option<(usize, Stop)>>,
    stopped: Notify,
}

impl Probe {
    fn counts(&self) -> BTreeMap<String, u32> {
        self.counts.lock().unwrap().clone()
    }

    /// Counts an execution of `node`; whether (and how) this one stops the run.
    fn enter(&self, node: &str) -> Option<Stop> {
        *self
            .counts
            .lock()
            .unwrap()
            .entry(node.to_owned())
            .or_default() += 1;
        let n = self.executed.fetch_add(1, Ordering::SeqCst) + 1;
        let mut stop_at = self.stop_at.lock().unwrap();
        match *stop_at {
            Some((at, how)) if at == n => {
                *stop_at = None;
                Some(how)
            }
            _ => None,
        }
    }
}

fn int(ctx: &InvocationContext, key: &str) -> u64 {
    ctx.get_state(key).and_then(|v| v.as_u64()).unwrap_or(0)
}

fn trace(ctx: &InvocationContext, entry: String) {
    let mut list = ctx.get_state("trace").unwrap_or_else(|| json!([]));
    if let Some(items) = list.as_array_mut() {
        items.push(json!(entry));
    }
    ctx.set_state("trace", list);
}

/// A leaf node: counts itself, may stop the run, then does `work`.
struct Leaf {
    name: &'static str,
    probe: Arc<Probe>,
    work: fn(&InvocationContext) -> Result<Control, FlowError>,
}

#[async_trait]
impl Agent for Leaf {
    fn name(&self) -> &str {
        self.name
    }

    fn class(&self) -> &str {
        "Leaf"
    }

    async fn run(&self, ctx: &InvocationContext) -> Result<Control, FlowError> {
        match self.probe.enter(self.name) {
            Some(Stop::Error) => return Err(FlowError::Sink("the process died here".into())),
            Some(Stop::Drop) => {
                self.probe.stopped.notify_one();
                std::future::pending::<()>().await;
            }
            None => {}
        }
        (self.work)(ctx)
    }
}

/// `outer` (a loop of at most 5) runs `plan`, then `steps` (a sequence): `prep`, `inner` (a
/// loop of at most 2 iterations of `work`, `check`; it ends at its limit), `wrap`. `wrap`
/// exits the outer loop in its third round. The nodes talk through `temp:` keys, which a
/// resume needs restored.
fn workflow(probe: &Arc<Probe>) -> DurableRoot {
    let leaf = |name, work| -> Arc<dyn Agent> {
        Arc::new(Leaf {
            name,
            probe: probe.clone(),
            work,
        })
    };
    let plan = leaf("plan", |ctx| {
        let round = int(ctx, "round") + 1;
        ctx.set_state("round", json!(round));
        ctx.set_state("temp:round", json!(round));
        trace(ctx, format!("plan{round}"));
        Ok(Control::Continue)
    });
    let prep = leaf("prep", |ctx| {
        let round = int(ctx, "temp:round");
        ctx.set_state("temp:prepared", json!(format!("p{round}")));
        trace(ctx, format!("prep{round}"));
        Ok(Control::Continue)
    });
    let work = leaf("work", |ctx| {
        let prepared = ctx
            .get_state("temp:prepared")
            .ok_or_else(|| FlowError::Sink("`temp:prepared` is missing".into()))?;
        let n = int(ctx, "temp:work") + 1;
        ctx.set_state("temp:work", json!(n));
        trace(
            ctx,
            format!("work{}.{n}", prepared.as_str().unwrap_or_default()),
        );
        Ok(Control::Continue)
    });
    let check = leaf("check", |ctx| {
        trace(ctx, format!("check{}", int(ctx, "temp:work")));
        Ok(Control::Continue)
    });
    let wrap = leaf("wrap", |ctx| {
        let round = int(ctx, "temp:round");
        ctx.set_state("temp:work", json!(0));
        trace(ctx, format!("wrap{round}"));
        Ok(if round == 3 {
            Control::ExitLoop
        } else {
            Control::Continue
        })
    });
    let max = |n| NonZeroU32::new(n).unwrap();
    let inner = Graph::looping("inner", vec![work, check], max(2)).unwrap();
    let steps = Graph::sequential("steps", vec![prep, Arc::new(inner), wrap]).unwrap();
    let outer = Graph::looping("outer", vec![plan, Arc::new(steps)], max(5)).unwrap();
    DurableRoot::new(Arc::new(outer)).unwrap()
}

const LEAVES: usize = 21; // 3 rounds of plan, prep, 2 × (work, check), wrap

fn new_run() -> Start {
    Start::New {
        workflow: "nested".into(),
        input: json!({}),
    }
}

fn resume(from: Option<CheckpointId>) -> Start {
    Start::Resume {
        from,
        answer: None,
        take_over: false,
    }
}

/// Runs `root` as run `id`; the report and the loop iterations its events counted.
async fn run(
    root: &DurableRoot,
    store: &Arc<dyn Store>,
    id: &str,
    start: Start,
) -> (RunReport, Vec<(String, u32)>) {
    let sink = MemorySink::new();
    let invocation =
        Invocation::new(SharedState::new(State::default())).with_sink(Arc::new(sink.clone()));
    let report = run_durable(root.graph(), root.plane(), store, id, start, invocation)
        .await
        .unwrap();
    (report.run, iterations(&sink.events()))
}

fn iterations(events: &[Event]) -> Vec<(String, u32)> {
    events
        .iter()
        .filter_map(|e| match e.kind {
            EventKind::Iteration { iteration } => Some((e.author.clone(), iteration)),
            _ => None,
        })
        .collect()
}

/// Each checkpoint's node and path (`-` for one without a path).
async fn chain(store: &dyn Store, id: &str) -> Vec<String> {
    store
        .history(id)
        .await
        .unwrap()
        .iter()
        .map(|c| match checkpoint_path(c) {
            Some(path) => path_text(&path),
            None => c.node.clone(),
        })
        .collect()
}

fn open(dir: &Path) -> Arc<dyn Store> {
    Arc::new(SqliteStore::open(dir.join("runs.db")).unwrap())
}

/// The unbroken run: its final state, leaf counts, checkpoint chain and loop iterations.
struct Unbroken {
    state: State,
    counts: BTreeMap<String, u32>,
    chain: Vec<String>,
    iterations: Vec<(String, u32)>,
}

async fn unbroken(store: &Arc<dyn Store>) -> Unbroken {
    let probe = Arc::new(Probe::default());
    let (report, iterations) = run(&workflow(&probe), store, "whole", new_run()).await;
    assert_eq!(report.result, Ok(Control::Continue));
    Unbroken {
        state: report.state,
        counts: probe.counts(),
        chain: chain(store.as_ref(), "whole").await,
        iterations,
    }
}

#[tokio::test]
async fn a_run_stopped_at_any_nested_node_resumes_rerunning_only_that_node() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let whole = unbroken(&store).await;
    let trace: Vec<&str> = whole.state.get("trace").unwrap().as_array().unwrap()[..7]
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(
        trace,
        [
            "plan1", "prep1", "workp1.1", "check1", "workp1.2", "check2", "wrap1"
        ]
    );
    assert_eq!(whole.state.get("round"), Some(&json!(3)));
    assert!(whole.state.keys().all(|k| !k.starts_with("temp:")));
    let leaves: u32 = whole.counts.values().sum();
    assert_eq!(leaves as usize, LEAVES);
    assert_eq!(
        whole.chain[..9],
        [
            "__start__",
            "outer[1]/plan",
            "outer[1]/steps/prep",
            "outer[1]/steps/inner[1]/work",
            "outer[1]/steps/inner[1]/check",
            "outer[1]/steps/inner[2]/work",
            "outer[1]/steps/inner[2]/check",
            "outer[1]/steps/inner",
            "outer[1]/steps/wrap",
        ]
    );

    for at in 1..=LEAVES {
        let id = format!("stopped-at-{at}");
        let probe = Arc::new(Probe::default());
        *probe.stop_at.lock().unwrap() = Some((at, Stop::Error));
        let root = workflow(&probe);
        let (failed, before) = run(&root, &store, &id, new_run()).await;
        assert!(failed.result.is_err(), "stopped at leaf {at}");
        assert!(matches!(
            store.run(&id).await.unwrap().unwrap().status,
            RunStatus::Failed { .. }
        ));
        let stopped: Vec<String> = probe.counts().into_keys().collect();
        let (resumed, after) = run(&root, &store, &id, resume(None)).await;
        assert_eq!(
            resumed.result,
            Ok(Control::Continue),
            "stopped at leaf {at}"
        );
        assert_eq!(resumed.state, whole.state, "stopped at leaf {at}");
        // Only the node that was running ran twice.
        let mut extra: BTreeMap<String, u32> = probe.counts();
        for (node, n) in &whole.counts {
            let count = extra.entry(node.clone()).or_default();
            *count -= n;
        }
        extra.retain(|_, n| *n > 0);
        assert_eq!(
            extra.values().sum::<u32>(),
            1,
            "stopped at leaf {at}: {extra:?}"
        );
        assert!(stopped.iter().any(|n| extra.contains_key(n)));
        // The checkpoints are those of an unbroken run; the loops count on from where they
        // were (an iteration entered after the last checkpoint is entered again).
        assert_eq!(
            chain(store.as_ref(), &id).await,
            whole.chain,
            "stopped at leaf {at}"
        );
        assert!(
            whole.iterations.starts_with(&before),
            "stopped at leaf {at}"
        );
        assert!(whole.iterations.ends_with(&after), "stopped at leaf {at}");
        assert!(before.len() + after.len() <= whole.iterations.len() + 1);
        assert_eq!(
            store.run(&id).await.unwrap().unwrap().status,
            RunStatus::Completed
        );
    }
    let file = SqliteStore::open(dir.path().join("runs.db")).unwrap();
    assert_eq!(file.integrity_check().unwrap(), "ok");
}

#[tokio::test]
async fn a_run_dropped_mid_node_at_each_depth_resumes_there() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let whole = unbroken(&store).await;
    // Leaf 1 is `plan` (depth 1), 2 is `prep` (depth 2), 10 is `work` of round 2 (depth 3).
    for (at, node) in [(1, "plan"), (2, "prep"), (10, "work")] {
        let id = format!("dropped-at-{at}");
        let probe = Arc::new(Probe::default());
        *probe.stop_at.lock().unwrap() = Some((at, Stop::Drop));
        let root = workflow(&probe);
        tokio::select! {
            _ = run(&root, &store, &id, new_run()) => panic!("the run was to hang at leaf {at}"),
            () = probe.stopped.notified() => {}
        }
        assert_eq!(
            store.run(&id).await.unwrap().unwrap().status,
            RunStatus::Running
        );
        let (resumed, _) = run(&root, &store, &id, resume(None)).await;
        assert_eq!(resumed.state, whole.state, "dropped at `{node}`");
        let mut expected = whole.counts.clone();
        *expected.get_mut(node).unwrap() += 1;
        assert_eq!(probe.counts(), expected, "only `{node}` ran twice");
        assert_eq!(chain(store.as_ref(), &id).await, whole.chain);
    }
}

#[tokio::test]
async fn time_travel_to_a_nested_checkpoint_runs_only_what_follows_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let whole = unbroken(&store).await;
    let history = store.history("whole").await.unwrap();
    let target = "outer[2]/steps/inner[1]/work";
    let (index, from) = history
        .iter()
        .enumerate()
        .find(|(_, c)| checkpoint_path(c).is_some_and(|p| path_text(&p) == target))
        .unwrap();
    let probe = Arc::new(Probe::default());
    let root = workflow(&probe);
    let (report, iterations) = run(&root, &store, "whole", resume(Some(from.id))).await;
    assert_eq!(report.state, whole.state);
    // What runs is what followed the checkpoint: the rest of round 2's inner loop, and on.
    let leaves_after = whole.chain[index + 1..]
        .iter()
        .filter(|c| {
            let leaf = c.rsplit('/').next().unwrap_or_default();
            whole.counts.contains_key(leaf)
        })
        .count();
    assert_eq!(probe.counts().values().sum::<u32>() as usize, leaves_after);
    assert_eq!(probe.counts()["plan"], 1, "only round 3 plans again");
    assert_eq!(
        iterations,
        [
            ("inner".to_owned(), 2),
            ("outer".to_owned(), 3),
            ("inner".to_owned(), 1),
            ("inner".to_owned(), 2)
        ]
    );
    // The new checkpoints branch from the nested one.
    let branch = store.history("whole").await.unwrap();
    let first_new = &branch[history.len()];
    assert_eq!(first_new.parent, Some(from.id));
    assert_eq!(
        checkpoint_path(first_new).map(|p| path_text(&p)).as_deref(),
        Some("outer[2]/steps/inner[1]/check")
    );
}

#[tokio::test]
async fn time_travel_to_a_nested_exit_acts_on_it() {
    // `wrap` of round 3 exits the outer loop from inside `steps`: resumed after it, the exit
    // travels up again and nothing runs.
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let whole = unbroken(&store).await;
    let history = store.history("whole").await.unwrap();
    let exit = history
        .iter()
        .find(|c| checkpoint_path(c).is_some_and(|p| path_text(&p) == "outer[3]/steps/wrap"))
        .unwrap();
    assert_eq!(exit.metadata["control"], json!("exit_loop"));
    let probe = Arc::new(Probe::default());
    let (report, iterations) = run(&workflow(&probe), &store, "whole", resume(Some(exit.id))).await;
    assert_eq!(report.state, whole.state);
    assert!(probe.counts().is_empty() && iterations.is_empty());
}

#[tokio::test]
async fn a_nested_escalation_waits_for_a_human_and_goes_on_inside_its_container() {
    // `outer` (a loop of 2) runs `steps`: `ask` escalates in round 1 until a human answered,
    // then `after` runs. The answer resumes at `ask`, inside `steps`: it runs again with it.
    let probe = Arc::new(Probe::default());
    let ask: Arc<dyn Agent> = Arc::new(Leaf {
        name: "ask",
        probe: probe.clone(),
        work: |ctx| {
            trace(ctx, "ask".into());
            if ctx.get_state("human_input").is_some() {
                return Ok(Control::Continue);
            }
            ctx.set_state("escalate_to_human", json!("Which region first?"));
            Ok(Control::Escalate)
        },
    });
    let after: Arc<dyn Agent> = Arc::new(Leaf {
        name: "after",
        probe: probe.clone(),
        work: |ctx| {
            let answer = ctx.get_state("human_input").unwrap_or_default();
            trace(
                ctx,
                format!("after {}", answer.as_str().unwrap_or_default()),
            );
            Ok(Control::Continue)
        },
    });
    let steps = Graph::sequential("steps", vec![ask, after]).unwrap();
    let two = NonZeroU32::new(2).unwrap();
    let outer = Graph::looping("outer", vec![Arc::new(steps)], two).unwrap();
    let root = DurableRoot::new(Arc::new(outer)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    run(&root, &store, "ask", new_run()).await;
    assert_eq!(
        store.run("ask").await.unwrap().unwrap().status,
        RunStatus::AwaitingHuman {
            question: "Which region first?".into()
        }
    );
    // One checkpoint for the escalation, at the node that escalated.
    assert_eq!(
        chain(store.as_ref(), "ask").await,
        ["__start__", "outer[1]/steps/ask"]
    );
    let answer = Start::Resume {
        from: None,
        answer: Some("north".into()),
        take_over: false,
    };
    let (report, _) = run(&root, &store, "ask", answer).await;
    assert_eq!(
        report.state.get("trace"),
        Some(&json!(["ask", "ask", "after north", "ask", "after north"]))
    );
    assert_eq!(
        chain(store.as_ref(), "ask").await[2..],
        [
            "human",
            "outer[1]/steps/ask",
            "outer[1]/steps/after",
            "outer[1]/steps",
            "outer[2]/steps/ask",
            "outer[2]/steps/after",
            "outer[2]/steps"
        ]
    );
    let answered = &store.history("ask").await.unwrap()[2];
    assert_eq!(answered.metadata["path"][1]["node"], json!("ask"));
}

/// A leaf that appends its name to `trace`.
fn tracer(name: &'static str, probe: &Arc<Probe>) -> Arc<dyn Agent> {
    Arc::new(Leaf {
        name,
        probe: probe.clone(),
        work: |ctx| {
            let n = ctx
                .get_state("trace")
                .map_or(0, |t| t.as_array().map_or(0, Vec::len));
            trace(ctx, format!("step{n}"));
            Ok(Control::Continue)
        },
    })
}

#[tokio::test]
async fn a_parallel_group_is_checkpointed_at_its_boundary_only() {
    let probe = Arc::new(Probe::default());
    let group = Graph::parallel(
        "both",
        vec![tracer("x", &probe), tracer("y", &probe)],
        engine::flow::BranchPolicy::FailFast,
    )
    .unwrap();
    let seq = Graph::sequential(
        "seq",
        vec![tracer("a", &probe), Arc::new(group), tracer("b", &probe)],
    )
    .unwrap();
    let root = DurableRoot::new(Arc::new(seq)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    run(&root, &store, "p", new_run()).await;
    assert_eq!(
        chain(store.as_ref(), "p").await,
        ["__start__", "seq/a", "seq/both", "seq/b"]
    );
}

#[tokio::test]
async fn a_routed_graph_resumes_inside_its_nested_loop_and_its_router_goes_on() {
    // The router's graph runs `a`, then `b`: a loop of `w1`, `w2` (2 iterations).
    let build = |probe: &Arc<Probe>| {
        let plane = Arc::new(ControlPlane::new(RouterConfig::new(
            ["a", "b"],
            [("a", "b")],
        )));
        let two = NonZeroU32::new(2).unwrap();
        let b = Graph::looping("b", vec![tracer("w1", probe), tracer("w2", probe)], two).unwrap();
        let graph = plane
            .graph("team", vec![tracer("a", probe), Arc::new(b)], "a")
            .unwrap();
        DurableRoot::new(Arc::new(graph)).unwrap()
    };
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let probe = Arc::new(Probe::default());
    let (whole, _) = run(&build(&probe), &store, "whole", new_run()).await;
    let whole_counts = probe.counts();
    let whole_chain = chain(store.as_ref(), "whole").await;
    assert!(
        whole_chain.contains(&"team/b[2]/w1".to_owned()),
        "{whole_chain:?}"
    );

    // Stopped at `w2` of the loop's second iteration (the 5th leaf).
    let probe = Arc::new(Probe::default());
    *probe.stop_at.lock().unwrap() = Some((5, Stop::Error));
    let root = build(&probe);
    run(&root, &store, "r", new_run()).await;
    let (resumed, _) = run(&root, &store, "r", resume(None)).await;
    assert_eq!(resumed.state.get("trace"), whole.state.get("trace"));
    // The router decided as often as in the unbroken run: nothing before the stop again.
    assert_eq!(summaries(&resumed.state), summaries(&whole.state));
    let mut expected = whole_counts;
    *expected.get_mut("w2").unwrap() += 1;
    assert_eq!(probe.counts(), expected);
    assert_eq!(chain(store.as_ref(), "r").await, whole_chain);
    assert_eq!(
        store.run("r").await.unwrap().unwrap().status,
        RunStatus::Completed
    );
}

#[tokio::test]
async fn a_run_checkpointed_before_paths_were_recorded_resumes_at_its_top_level() {
    // Such a run has top-level checkpoints whose metadata holds only the step and iteration.
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let whole = unbroken(&store).await;
    let owner = engine::durable::Owner::current();
    let lease = store
        .create_run(&engine::durable::NewRun::new("old", "nested"), &owner)
        .await
        .unwrap();
    let nothing = engine::StateDelta::new();
    let start =
        engine::durable::NewCheckpoint::new("__start__", &nothing).next(vec!["plan".into()]);
    let start = store.put(&lease, start).await.unwrap();
    let writes: engine::StateDelta = [
        ("round", json!(1)),
        ("temp:round", json!(1)),
        ("trace", json!(["plan1"])),
    ]
    .into_iter()
    .map(|(key, value)| engine::StateWrite::Replace {
        key: key.into(),
        value,
    })
    .collect();
    let plan = engine::durable::NewCheckpoint::new("plan", &writes)
        .parent(Some(start))
        .metadata(json!({"graph_step": 1, "iteration": 1}));
    store.put(&lease, plan).await.unwrap();
    // The process that wrote them stopped.
    store.release(&lease).await.unwrap();
    let probe = Arc::new(Probe::default());
    let (report, _) = run(&workflow(&probe), &store, "old", resume(None)).await;
    assert_eq!(report.state, whole.state);
    assert_eq!(probe.counts()["plan"], 2, "rounds 2 and 3");
    assert_eq!(chain(store.as_ref(), "old").await[2..], whole.chain[2..]);
}
