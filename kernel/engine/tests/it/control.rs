#![allow(clippy::unwrap_used)] // In tests an unwrap is an assertion.

//! The routing control plane in a running graph, with durable checkpoints: active and
//! passive routing, circular logic escalating to a human and an answer resuming the run,
//! gate recovery, retries, time travel, and a run killed with SIGKILL that resumes to the
//! same final state.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::support::store_in_memory;
use engine::durable::{DurableReport, RunStatus, SqliteStore, Start, Store, run_durable};
use engine::flow::{Agent, Control, FlowError, FnAgent, Invocation, InvocationContext};
use engine::route::{
    Backoff, Branch, Condition, ControlPlane, DecisionLog, END, Gate, GateCheck, Retrying,
    RouterConfig, RouterMode, Routing, RoutingObserver,
};
use engine::{SharedState, State, StateDelta};
use serde_json::{Value, json};

/// Appends a message by `author` on `topic` to `messages`.
fn say(ctx: &InvocationContext, author: &str, topic: &str, content: &str) {
    let mut messages = match ctx.get_state("messages") {
        Some(Value::Array(list)) => list,
        _ => Vec::new(),
    };
    messages.push(json!({"author": author, "topic": topic, "content": content}));
    ctx.set_state("messages", Value::Array(messages));
}

fn agent(
    name: &str,
    step: impl Fn(&InvocationContext) -> Result<Control, FlowError> + Send + Sync + 'static,
) -> Arc<dyn Agent> {
    Arc::new(FnAgent::new(name, step))
}

/// The software team: analyst → pm → dev → tea; tea rejects the work until a human has
/// answered, and dev reworks it each time.
fn team_nodes() -> Vec<Arc<dyn Agent>> {
    vec![
        agent("analyst", |ctx| {
            say(ctx, "analyst", "brief", "Users want CSV export.");
            ctx.set_state("brief", json!("CSV export"));
            Ok(Control::Continue)
        }),
        agent("pm", |ctx| {
            say(ctx, "pm", "story-1", "Story 1: export the table as CSV.");
            Ok(Control::Continue)
        }),
        agent("dev", |ctx| {
            let answered = ctx.get_state("human_input").is_some();
            let note = if answered {
                "Quoted every field, as decided."
            } else {
                "Done."
            };
            say(ctx, "dev", "story-1", note);
            let builds = ctx
                .get_state("builds")
                .and_then(|v| v.as_u64())
                .unwrap_or(0);
            ctx.set_state("builds", json!(builds + 1));
            Ok(Control::Continue)
        }),
        agent("tea", |ctx| {
            let verdict = if ctx.get_state("human_input").is_some() {
                "approved"
            } else {
                "rejected"
            };
            say(ctx, "tea", "story-1", &format!("Verdict: {verdict}."));
            ctx.set_state("verdict", json!(verdict));
            Ok(Control::Continue)
        }),
    ]
}

fn team_config() -> RouterConfig {
    RouterConfig::new(
        ["analyst", "pm", "dev", "tea"],
        [("analyst", "pm"), ("pm", "dev"), ("dev", "tea")],
    )
    .with_branches(
        "tea",
        vec![
            Branch::when(Condition::equals("verdict", json!("rejected")), "dev"),
            Branch::otherwise(END),
        ],
    )
}

async fn run(
    plane: &Arc<ControlPlane>,
    nodes: Vec<Arc<dyn Agent>>,
    store: &Arc<dyn Store>,
    run_id: &str,
    start: Start,
) -> DurableReport {
    let graph = plane.graph("team", nodes, "analyst").unwrap();
    let invocation = Invocation::new(SharedState::new(State::default()));
    let report = run_durable(&graph, Some(plane), store, run_id, start, invocation)
        .await
        .unwrap();
    // However the run stopped (completed, failed, waiting for a human), nobody holds it.
    assert_eq!(store.run(run_id).await.unwrap().unwrap().lease, None);
    report
}

fn new_run() -> Start {
    Start::New {
        workflow: "team".into(),
        input: json!({}),
    }
}

/// The state without the decision records' timestamps (the only part that differs between
/// two runs of the same scripted graph).
fn timeless(state: &State) -> State {
    let mut state = state.clone();
    if let Some(Value::Array(decisions)) = state.get("decisions").cloned() {
        let stripped: Vec<Value> = decisions
            .into_iter()
            .map(|mut d| {
                if let Some(map) = d.as_object_mut() {
                    map.remove("timestamp");
                }
                d
            })
            .collect();
        state.set("decisions", Value::Array(stripped));
    }
    state
}

pub(crate) fn summaries(state: &State) -> Vec<String> {
    state
        .get("decisions")
        .and_then(Value::as_array)
        .map(|d| {
            d.iter()
                .filter_map(|r| r["summary"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn circular_logic_escalates_to_a_human_and_the_answer_completes_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("decisions.jsonl");
    let store = {
        let store: Arc<dyn Store> =
            Arc::new(SqliteStore::open(dir.path().join("runs.db")).unwrap());
        store
    };
    let plane =
        Arc::new(ControlPlane::new(team_config()).with_log(DecisionLog::open(&log_path).unwrap()));

    let report = run(&plane, team_nodes(), &store, "t1", new_run()).await;
    let question = match &report.status {
        RunStatus::AwaitingHuman { question } => question.clone(),
        other => panic!("expected awaiting_human, got {other:?}"),
    };
    assert!(question.starts_with("Circular logic: `dev` and `tea` exchanged work 4 times"));
    let state = &report.run.state;
    assert_eq!(state.get("exchange_count"), Some(&json!(4)));
    assert_eq!(state.get("circular_logic_detected"), Some(&json!(true)));
    assert_eq!(state.get("routing_decision"), Some(&json!("ESCALATE")));
    assert_eq!(
        summaries(state),
        [
            "analyst → pm",
            "pm → dev",
            "dev → tea",
            "tea → dev",
            "dev → tea",
            "tea → dev",
            "dev → escalate to a human",
        ]
    );
    assert_eq!(
        store.run("t1").await.unwrap().unwrap().status,
        report.status
    );
    let health = &report.health;
    assert_eq!(
        health.exchanges[0].pair,
        ("dev".to_owned(), "tea".to_owned())
    );
    assert_eq!(health.exchanges[0].exchanges, 4);
    assert_eq!(health.visits.get("dev"), Some(&3));
    assert!(health.idle_nodes.is_empty());

    // Resuming without an answer is refused; with one, `dev` (escalated from) runs again
    // with the decision, then the router goes on.
    let graph = plane.graph("team", team_nodes(), "analyst").unwrap();
    let refused = run_durable(
        &graph,
        Some(&plane),
        &store,
        "t1",
        Start::Resume {
            from: None,
            answer: None,
            take_over: false,
        },
        Invocation::new(SharedState::new(State::default())),
    )
    .await
    .unwrap_err();
    assert!(refused.to_string().contains("--input"), "{refused}");
    assert_eq!(store.run("t1").await.unwrap().unwrap().lease, None);

    let answer = Start::Resume {
        from: None,
        answer: Some("Quote every field; tea accepts that.".into()),
        take_over: false,
    };
    let report = run(&plane, team_nodes(), &store, "t1", answer).await;
    assert_eq!(report.status, RunStatus::Completed);
    let state = &report.run.state;
    assert_eq!(state.get("verdict"), Some(&json!("approved")));
    assert_eq!(
        state.get("human_input"),
        Some(&json!("Quote every field; tea accepts that."))
    );
    assert_eq!(state.get("escalation_triggered"), Some(&json!(false)));
    assert_eq!(summaries(state)[7..], ["dev → tea", "tea → end"]);
    let authors: Vec<&str> = state
        .get("messages")
        .and_then(Value::as_array)
        .unwrap()
        .iter()
        .filter_map(|m| m["author"].as_str())
        .collect();
    assert_eq!(authors[authors.len() - 4..], ["dev", "human", "dev", "tea"]);
    let last_dev = state
        .get("messages")
        .and_then(Value::as_array)
        .and_then(|m| m.iter().rev().find(|m| m["author"] == "dev"))
        .unwrap();
    assert_eq!(
        last_dev["content"],
        json!("Quoted every field, as decided.")
    );
    assert_eq!(state.get("builds"), Some(&json!(4)));

    // Every decision is on record in the JSONL log too, and the history has a checkpoint
    // after every node and every decision.
    let logged = DecisionLog::read(&log_path).unwrap();
    assert_eq!(logged.len(), 9);
    assert_eq!(logged[6].summary, "dev → escalate to a human");
    let nodes: Vec<String> = store
        .history("t1")
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.node)
        .collect();
    assert_eq!(
        nodes[..7],
        [
            "__start__",
            "analyst",
            "router",
            "pm",
            "router",
            "dev",
            "router"
        ]
    );
    assert_eq!(
        nodes[nodes.len() - 6..],
        ["router", "human", "dev", "router", "tea", "router"]
    );
}

#[tokio::test]
async fn passive_mode_routes_silently_until_a_gate_blocks() {
    let config = RouterConfig::new(["dev", "fixer", "tea"], [("dev", "tea"), ("fixer", "dev")])
        .with_recovery("tests_pass", "fixer")
        .with_mode(RouterMode::Passive);
    let gate = Gate {
        name: "tests_pass".into(),
        check: GateCheck::State(Box::new(Condition::equals("failing", json!(0)))),
        blocking: true,
    };
    let plane = Arc::new(ControlPlane::new(config).with_gates("dev", vec![gate]));
    let nodes = vec![
        agent("dev", |ctx| {
            let runs = ctx
                .get_state("dev_runs")
                .and_then(|v| v.as_u64())
                .unwrap_or(0)
                + 1;
            ctx.set_state("dev_runs", json!(runs));
            // The first build has two failing tests; the fixer's work makes the next pass.
            let failing = if ctx.get_state("fixed").is_some() {
                0
            } else {
                2
            };
            ctx.set_state("failing", json!(failing));
            Ok(Control::Continue)
        }),
        agent("fixer", |ctx| {
            ctx.set_state("fixed", json!(true));
            Ok(Control::Continue)
        }),
        agent("tea", |ctx| {
            ctx.set_state("verdict", json!("approved"));
            Ok(Control::Continue)
        }),
    ];
    let store = store_in_memory();
    let graph = plane.graph("team", nodes, "dev").unwrap();
    let invocation = Invocation::new(SharedState::new(State::default()));
    let report = run_durable(&graph, Some(&plane), &store, "p", new_run(), invocation)
        .await
        .unwrap();
    assert_eq!(report.status, RunStatus::Completed);
    let state = &report.run.state;
    assert_eq!(state.get("dev_runs"), Some(&json!(2)));
    assert_eq!(state.get("verdict"), Some(&json!("approved")));
    // Cleared by a delete, not set to `null`.
    assert_eq!(state.get("gate_blocked"), None);
    // Only the blocked gate reached the router; the normal transitions left no record.
    assert_eq!(summaries(state), ["dev → fixer"]);
    assert_eq!(report.health.visits.get("dev"), Some(&2));
    let nodes: Vec<String> = store
        .history("p")
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.node)
        .collect();
    assert_eq!(nodes, ["__start__", "dev", "router", "fixer", "dev", "tea"]);
}

#[tokio::test(start_paused = true)]
async fn transient_failures_are_retried_and_a_lasting_one_escalates() {
    let flaky_calls = Arc::new(AtomicU32::new(0));
    let calls = flaky_calls.clone();
    let flaky = agent("dev", move |ctx| {
        if calls.fetch_add(1, Ordering::SeqCst) < 2 {
            return Err(FlowError::Agent {
                agent: "dev".into(),
                message: "the build server is busy".into(),
            });
        }
        ctx.set_state("built", json!(true));
        Ok(Control::Continue)
    });
    let broken = agent("tea", |_| {
        Err(FlowError::Agent {
            agent: "tea".into(),
            message: "the test runner is gone".into(),
        })
    });
    let nodes: Vec<Arc<dyn Agent>> = vec![
        Arc::new(Retrying::new(flaky, Backoff::default())),
        Arc::new(Retrying::new(broken, Backoff::default())),
    ];
    let plane = Arc::new(ControlPlane::new(RouterConfig::new(
        ["dev", "tea"],
        [("dev", "tea")],
    )));
    let store = store_in_memory();
    let graph = plane.graph("team", nodes, "dev").unwrap();
    let started = tokio::time::Instant::now();
    let invocation = Invocation::new(SharedState::new(State::default()));
    let report = run_durable(&graph, Some(&plane), &store, "r", new_run(), invocation)
        .await
        .unwrap();
    // dev: two failures, waits of 1 s and 2 s; tea: three failures, the same waits.
    assert_eq!(started.elapsed(), std::time::Duration::from_secs(6));
    assert_eq!(flaky_calls.load(Ordering::SeqCst), 3);
    let state = &report.run.state;
    assert_eq!(state.get("built"), Some(&json!(true)));
    assert_eq!(
        state.get("agent_failure"),
        Some(
            &json!({"node": "tea", "error": "Agent `tea` failed: the test runner is gone", "attempts": 3})
        )
    );
    match &report.status {
        RunStatus::AwaitingHuman { question } => {
            assert_eq!(
                question,
                "`tea` failed for good: Agent `tea` failed: the test runner is gone"
            );
        }
        other => panic!("expected awaiting_human, got {other:?}"),
    }
}

/// A node a hook or callback stopped on purpose is not retried: it would stop again. It
/// fails for good at once and the router escalates it.
#[tokio::test(start_paused = true)]
async fn a_node_stopped_by_a_hook_is_not_retried() {
    let calls = Arc::new(AtomicU32::new(0));
    let counted = calls.clone();
    let blocked = agent("dev", move |_| {
        counted.fetch_add(1, Ordering::SeqCst);
        Err(FlowError::StoppedByHook {
            agent: "dev".into(),
            reason: "a callback refused the deploy".into(),
        })
    });
    let plane = Arc::new(ControlPlane::new(RouterConfig::new(["dev"], [])));
    let nodes: Vec<Arc<dyn Agent>> = vec![Arc::new(Retrying::new(blocked, Backoff::default()))];
    let store = store_in_memory();
    let started = tokio::time::Instant::now();
    let graph = plane.graph("team", nodes, "dev").unwrap();
    let invocation = Invocation::new(SharedState::new(State::default()));
    let report = run_durable(&graph, Some(&plane), &store, "s", new_run(), invocation)
        .await
        .unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 1, "one attempt, no retry");
    assert_eq!(
        started.elapsed(),
        std::time::Duration::ZERO,
        "no backoff wait"
    );
    assert_eq!(
        report.run.state.get("agent_failure"),
        Some(&json!({
            "node": "dev",
            "error": "Agent `dev` was stopped by a hook: a callback refused the deploy",
            "attempts": 1
        }))
    );
    assert!(matches!(report.status, RunStatus::AwaitingHuman { .. }));
}

#[tokio::test]
async fn time_travel_reruns_from_an_earlier_checkpoint_on_a_branch() {
    let store = store_in_memory();
    let plane = Arc::new(ControlPlane::new(team_config()));
    let first = run(&plane, team_nodes(), &store, "tt", new_run()).await;
    let history = store.history("tt").await.unwrap();
    let after_pm = history.iter().find(|c| c.node == "pm").unwrap().id;
    let again = Start::Resume {
        from: Some(after_pm),
        answer: None,
        take_over: false,
    };
    let second = run(&plane, team_nodes(), &store, "tt", again).await;
    assert_eq!(timeless(&second.run.state), timeless(&first.run.state));
    let history = store.history("tt").await.unwrap();
    let branch = history.iter().find(|c| c.id > first.head.unwrap()).unwrap();
    assert_eq!(
        branch.parent,
        Some(after_pm),
        "the re-run branches from the chosen checkpoint"
    );
    assert_eq!(branch.node, "router");
}

/// The database the child of `a_run_killed_during_a_node_resumes_to_the_same_final_state`
/// writes to.
const CRASH_DB: &str = "RLM_TEST_CRASH_RUN_DB";

/// The team graph, with a `dev` that hangs on its third run when `hang` is set (the child
/// process waits there to be killed) after writing a marker file.
fn crashable_nodes(hang: Option<std::path::PathBuf>) -> Vec<Arc<dyn Agent>> {
    let mut nodes = team_nodes();
    let dev = nodes.remove(2);
    let hanging: Arc<dyn Agent> = Arc::new(HangOnThirdRun { inner: dev, hang });
    nodes.insert(2, hanging);
    nodes
}

struct HangOnThirdRun {
    inner: Arc<dyn Agent>,
    hang: Option<std::path::PathBuf>,
}

#[async_trait::async_trait]
impl Agent for HangOnThirdRun {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn class(&self) -> &str {
        self.inner.class()
    }
    async fn run(&self, ctx: &InvocationContext) -> Result<Control, FlowError> {
        let control = self.inner.run(ctx).await?;
        let builds = ctx
            .get_state("builds")
            .and_then(|v| v.as_u64())
            .unwrap_or(0);
        if let (Some(marker), 3) = (&self.hang, builds) {
            // Half-way through the node: its writes are applied but not checkpointed.
            std::fs::write(marker, b"in dev").unwrap();
            tokio::time::sleep(std::time::Duration::from_secs(600)).await;
        }
        Ok(control)
    }
}

/// Not a test on its own: the child process of the crash test (does nothing unless that
/// test sets `RLM_TEST_CRASH_RUN_DB`).
#[tokio::test]
async fn crash_child_runs_until_killed() {
    let Some(db) = std::env::var_os(CRASH_DB) else {
        return;
    };
    let db = std::path::PathBuf::from(db);
    let store = {
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&db).unwrap());
        store
    };
    let plane = Arc::new(ControlPlane::new(team_config()));
    run(
        &plane,
        crashable_nodes(Some(db.with_extension("marker"))),
        &store,
        "crash",
        new_run(),
    )
    .await;
}

#[tokio::test]
async fn a_run_killed_during_a_node_resumes_to_the_same_final_state() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("crash.db");
    let marker = db.with_extension("marker");
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "control::crash_child_runs_until_killed",
            "--nocapture",
        ])
        .env(CRASH_DB, &db)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    for _ in 0..1200 {
        if marker.exists() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(
        marker.exists(),
        "the child never reached the third `dev` run"
    );
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();

    let store = {
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&db).unwrap());
        store
    };
    assert_eq!(integrity(&db), "ok");
    let killed = store.run("crash").await.unwrap().unwrap();
    assert_eq!(
        killed.status,
        RunStatus::Running,
        "a killed run stays `running`"
    );
    let head = store.checkpoint(killed.head.unwrap()).await.unwrap();
    assert_eq!(
        (head.node.as_str(), head.next.as_slice()),
        ("router", &["dev".to_owned()][..])
    );

    let plane = Arc::new(ControlPlane::new(team_config()));
    let resume = Start::Resume {
        from: None,
        answer: None,
        take_over: false,
    };
    let resumed = run(&plane, crashable_nodes(None), &store, "crash", resume).await;

    let reference_store = store_in_memory();
    let reference = run(&plane, team_nodes(), &reference_store, "ref", new_run()).await;
    assert_eq!(resumed.status, reference.status);
    assert_eq!(timeless(&resumed.run.state), timeless(&reference.run.state));
    // `dev` re-executed from the last checkpoint: three builds, as in the uninterrupted run.
    assert_eq!(resumed.run.state.get("builds"), Some(&json!(3)));
    assert_eq!(integrity(&db), "ok");
}

/// The database the child of
/// `a_run_killed_between_a_nodes_end_and_its_routing_decision_runs_that_node_again` writes to.
const DECISION_CRASH_DB: &str = "RLM_TEST_CRASH_DECISION_DB";

/// A decision observer registered before the checkpointer: after `dev`'s second build it
/// writes a marker file and waits there to be killed — the node has finished and the router
/// has decided, but the step's checkpoints are not committed.
struct HangInDecision {
    marker: std::path::PathBuf,
}

#[async_trait::async_trait]
impl RoutingObserver for HangInDecision {
    async fn routed(
        &self,
        ctx: &InvocationContext,
        from: &str,
        _routing: &Routing,
        _writes: StateDelta,
    ) -> Result<(), FlowError> {
        if from == "dev" && ctx.get_state("builds") == Some(json!(2)) {
            std::fs::write(&self.marker, b"deciding after dev").unwrap();
            tokio::time::sleep(std::time::Duration::from_secs(600)).await;
        }
        Ok(())
    }
}

/// Not a test on its own: the child process of the decision crash test (does nothing unless
/// that test sets `RLM_TEST_CRASH_DECISION_DB`).
#[tokio::test]
async fn crash_child_hangs_in_a_routing_decision() {
    let Some(db) = std::env::var_os(DECISION_CRASH_DB) else {
        return;
    };
    let db = std::path::PathBuf::from(db);
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&db).unwrap());
    let plane = Arc::new(ControlPlane::new(team_config()));
    let hang = Arc::new(HangInDecision {
        marker: db.with_extension("marker"),
    });
    let _observing = plane.observe(hang);
    run(&plane, team_nodes(), &store, "crash", new_run()).await;
}

/// A routed step's node checkpoint and its decision's are one transaction: a process killed
/// after the node finished but before the step committed leaves the previous step's
/// decision as the head (never a node without the decision after it), and the resumed run
/// runs that node again and ends as an unbroken run does.
#[tokio::test]
async fn a_run_killed_between_a_nodes_end_and_its_routing_decision_runs_that_node_again() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("crash.db");
    let marker = db.with_extension("marker");
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "control::crash_child_hangs_in_a_routing_decision",
            "--nocapture",
        ])
        .env(DECISION_CRASH_DB, &db)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    for _ in 0..1200 {
        if marker.exists() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(
        marker.exists(),
        "the child never reached the decision after `dev`'s second build"
    );
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();

    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&db).unwrap());
    assert_eq!(integrity(&db), "ok");
    let killed = store.run("crash").await.unwrap().unwrap();
    let head = store.checkpoint(killed.head.unwrap()).await.unwrap();
    assert_eq!(
        (head.node.as_str(), head.next.as_slice()),
        ("router", &["dev".to_owned()][..]),
        "the head is the decision after `tea`, not `dev`'s uncommitted step"
    );
    let at_head = store.state_at(head.id).await.unwrap().state;
    assert_eq!(at_head.get("builds"), Some(&json!(1)));
    let history = store.history("crash").await.unwrap();
    let nodes: Vec<&str> = history.iter().map(|c| c.node.as_str()).collect();
    assert_eq!(
        nodes,
        [
            "__start__",
            "analyst",
            "router",
            "pm",
            "router",
            "dev",
            "router",
            "tea",
            "router"
        ]
    );

    let plane = Arc::new(ControlPlane::new(team_config()));
    let resume = Start::Resume {
        from: None,
        answer: None,
        take_over: false,
    };
    let resumed = run(&plane, team_nodes(), &store, "crash", resume).await;
    let reference_store = store_in_memory();
    let reference = run(&plane, team_nodes(), &reference_store, "ref", new_run()).await;
    assert_eq!(resumed.status, reference.status);
    assert_eq!(timeless(&resumed.run.state), timeless(&reference.run.state));
    assert_eq!(resumed.run.state.get("builds"), Some(&json!(3)));
    // Each node's checkpoint is followed by its decision's, in the resumed part too.
    let history = store.history("crash").await.unwrap();
    let nodes: Vec<&str> = history.iter().map(|c| c.node.as_str()).collect();
    assert_eq!(
        nodes[9..],
        ["dev", "router", "tea", "router", "dev", "router"]
    );
    assert_eq!(integrity(&db), "ok");
}

/// SQLite's own integrity check of the database at `path`.
fn integrity(path: &std::path::Path) -> String {
    let store = SqliteStore::open(path).unwrap();
    store.integrity_check().unwrap()
}

/// The run's health (exchanges per pair, time and visits per node, idle nodes, cycle time)
/// reaches the JSONL event log as one `health` event of the graph at its end, not only the
/// durable report.
#[tokio::test]
async fn the_health_report_is_an_event_in_the_log() {
    use engine::flow::{EventKind, EventLog};
    use engine::route::HEALTH_TOPIC;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.jsonl");
    let log = Arc::new(EventLog::create(&path).unwrap());
    let store = store_in_memory();
    let plane = Arc::new(ControlPlane::new(team_config()));
    let graph = plane.graph("team", team_nodes(), "analyst").unwrap();
    let invocation = Invocation::new(SharedState::new(State::default())).with_sink(log);
    let report = run_durable(&graph, Some(&plane), &store, "h", new_run(), invocation)
        .await
        .unwrap();
    let events = EventLog::read(&path).unwrap();
    let health: Vec<&engine::flow::Event> = events
        .iter()
        .filter(|e| matches!(&e.kind, EventKind::Metadata { topic } if topic == HEALTH_TOPIC))
        .collect();
    assert_eq!(health.len(), 1, "one health event per run");
    assert_eq!(health[0].author, "team");
    let expected = serde_json::to_value(&report.health).unwrap();
    for field in ["exchanges", "visits", "idle_nodes"] {
        assert_eq!(health[0].metadata[field], expected[field], "{field}");
    }
    assert!(health[0].metadata["time_in_node_ms"].is_object());
    assert!(health[0].metadata["cycle_time_ms"].is_u64());
    assert!(report.health.visits.get("dev").is_some_and(|&n| n >= 2));
}

/// A run that dies after the human's answer was recorded but before the node it answers
/// finished resumes at that node again (the answer stays, nothing is asked twice).
#[tokio::test]
async fn a_run_that_dies_after_the_answer_runs_the_answered_node_again() {
    let attempts = Arc::new(AtomicU32::new(0));
    let seen = attempts.clone();
    let dev = agent("dev", move |ctx| {
        if ctx.get_state("human_input").is_none() {
            ctx.set_state("escalate_to_human", json!("Which format?"));
            return Ok(Control::Continue);
        }
        if seen.fetch_add(1, Ordering::SeqCst) == 0 {
            return Err(FlowError::Sink("the process died here".into()));
        }
        ctx.set_state("built", json!(true));
        Ok(Control::Continue)
    });
    let plane = Arc::new(ControlPlane::new(RouterConfig::new(["dev"], [])));
    let store = store_in_memory();
    let graph = plane.graph("team", vec![dev], "dev").unwrap();
    let go = |start| {
        let invocation = Invocation::new(SharedState::new(State::default()));
        run_durable(&graph, Some(&plane), &store, "d", start, invocation)
    };
    assert!(matches!(
        go(new_run()).await.unwrap().status,
        RunStatus::AwaitingHuman { .. }
    ));
    let answer = Start::Resume {
        from: None,
        answer: Some("CSV".into()),
        take_over: false,
    };
    assert!(matches!(
        go(answer).await.unwrap().status,
        RunStatus::Failed { .. }
    ));
    let again = Start::Resume {
        from: None,
        answer: None,
        take_over: false,
    };
    let done = go(again).await.unwrap();
    assert_eq!(done.status, RunStatus::Completed);
    assert_eq!(done.run.state.get("built"), Some(&json!(true)));
    assert_eq!(done.run.state.get("human_input"), Some(&json!("CSV")));
    assert_eq!(attempts.load(Ordering::SeqCst), 2);
}

/// A node that stops the run as Ctrl-C would, while it runs.
struct Interrupted;

#[async_trait::async_trait]
impl Agent for Interrupted {
    fn name(&self) -> &str {
        "dev"
    }

    fn class(&self) -> &str {
        "Interrupted"
    }

    async fn run(&self, ctx: &InvocationContext) -> Result<Control, FlowError> {
        ctx.cancel_token().cancel();
        std::future::pending().await
    }
}

/// Every routed run's event log carries its health — one `health` event per invocation,
/// however it ends: completed, failed, stopped at its step limit, cancelled mid-node, or
/// stopped for a human (and the resumed invocation logs its own). A node the run stopped
/// in counts as visited.
#[tokio::test]
async fn every_ending_of_a_routed_run_logs_its_health_once() {
    use engine::flow::{EventKind, EventLog};
    use engine::route::HEALTH_TOPIC;
    let tea = || {
        agent("tea", |ctx| {
            ctx.set_state("verdict", json!("approved"));
            Ok(Control::Continue)
        })
    };
    let dev = |ending: &str| -> Arc<dyn Agent> {
        match ending {
            "failed" => agent("dev", |_| Err(FlowError::Sink("the disk is full".into()))),
            "cancelled" => Arc::new(Interrupted),
            "awaiting_human" => agent("dev", |ctx| {
                if ctx.get_state("human_input").is_none() {
                    ctx.set_state("escalate_to_human", json!("Which format?"));
                }
                Ok(Control::Continue)
            }),
            _ => agent("dev", |_| Ok(Control::Continue)),
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let store = store_in_memory();
    let plane = Arc::new(ControlPlane::new(RouterConfig::new(
        ["dev", "tea"],
        [("dev", "tea")],
    )));
    let health_of = |path: &std::path::Path| -> Vec<Value> {
        EventLog::read(path)
            .unwrap()
            .into_iter()
            .filter(|e| matches!(&e.kind, EventKind::Metadata { topic } if topic == HEALTH_TOPIC))
            .map(|e| {
                assert_eq!(e.author, "team");
                e.metadata
            })
            .collect()
    };
    for (ending, status) in [
        ("completed", "completed"),
        ("failed", "failed"),
        ("limit", "failed"),
        ("cancelled", "interrupted"),
        ("awaiting_human", "awaiting_human"),
    ] {
        let max_steps = if ending == "limit" { 1 } else { 10 };
        let graph = plane
            .builder("team", vec![dev(ending), tea()], "dev")
            .max_steps(max_steps)
            .build()
            .unwrap();
        let path = dir.path().join(format!("{ending}.jsonl"));
        let log = Arc::new(EventLog::create(&path).unwrap());
        let invocation = Invocation::new(SharedState::new(State::default())).with_sink(log);
        let report = run_durable(&graph, Some(&plane), &store, ending, new_run(), invocation)
            .await
            .unwrap();
        assert_eq!(report.status.name(), status, "{ending}");
        let health = health_of(&path);
        assert_eq!(health.len(), 1, "{ending}: one health event");
        assert_eq!(health[0]["visits"]["dev"], json!(1), "{ending}");
        assert_eq!(
            health[0]["visits"],
            serde_json::to_value(&report.health.visits).unwrap(),
            "{ending}: the event is the report"
        );
        if ending == "awaiting_human" {
            let path = dir.path().join("resumed.jsonl");
            let log = Arc::new(EventLog::create(&path).unwrap());
            let invocation = Invocation::new(SharedState::new(State::default())).with_sink(log);
            let answer = Start::Resume {
                from: None,
                answer: Some("CSV".into()),
                take_over: false,
            };
            let done = run_durable(&graph, Some(&plane), &store, ending, answer, invocation)
                .await
                .unwrap();
            assert_eq!(done.status, RunStatus::Completed);
            let health = health_of(&path);
            assert_eq!(health.len(), 1, "the resumed invocation logs its own");
            assert_eq!(health[0]["visits"], json!({"dev": 1, "tea": 1}));
        }
    }
}

/// A node's own `escalate` action (the built-in tool) goes through the router like the
/// escalation flag: on record as a decision, `escalation_triggered` set, the run awaiting a
/// human with the router's rationale — even in passive mode — and the answer resumes it.
#[tokio::test]
async fn an_agents_escalate_action_is_a_routing_decision_on_record() {
    let dev = agent("dev", |ctx| {
        if ctx.get_state("human_input").is_some() {
            ctx.set_state("built", json!(true));
            return Ok(Control::Continue);
        }
        Ok(Control::Escalate)
    });
    let tea = agent("tea", |ctx| {
        ctx.set_state("verdict", json!("approved"));
        Ok(Control::Continue)
    });
    let plane = Arc::new(ControlPlane::new(
        RouterConfig::new(["dev", "tea"], [("dev", "tea")]).with_mode(RouterMode::Passive),
    ));
    let store = store_in_memory();
    let graph = plane.graph("team", vec![dev, tea], "dev").unwrap();
    let invocation = Invocation::new(SharedState::new(State::default()));
    let report = run_durable(&graph, Some(&plane), &store, "e", new_run(), invocation)
        .await
        .unwrap();
    assert_eq!(
        report.status,
        RunStatus::AwaitingHuman {
            question: "`dev` asked for a human".into()
        }
    );
    let state = &report.run.state;
    assert_eq!(state.get("escalation_triggered"), Some(&json!(true)));
    assert_eq!(summaries(state), ["dev → escalate to a human"]);
    let again = Start::Resume {
        from: None,
        answer: Some("Go on.".into()),
        take_over: false,
    };
    let invocation = Invocation::new(SharedState::new(State::default()));
    let done = run_durable(&graph, Some(&plane), &store, "e", again, invocation)
        .await
        .unwrap();
    assert_eq!(done.status, RunStatus::Completed);
    assert_eq!(done.run.state.get("verdict"), Some(&json!("approved")));
    // `dev`, which asked, ran again with the answer before `tea`.
    assert_eq!(done.run.state.get("built"), Some(&json!(true)));
}
