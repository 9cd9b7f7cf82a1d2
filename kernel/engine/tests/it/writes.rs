//! Writes, the one unit of state change: what parallel branches append is all kept at the
//! join, a delete is a delete (not a `null`) through the event, the checkpoint and a resume,
//! and a routed run's event log grows with its steps, not with their square.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bridge::mock::{Latency, MockConfig, MockServer, Script};
use bridge::{Endpoint, EndpointConfig, Ledger};
use engine::durable::{RunStatus as Stored, SqliteStore, Start, Store, run_durable};
use engine::flow::{
    Agent, BranchPolicy, Control, Event, EventSink, FlowError, FnAgent, Graph, Invocation,
    InvocationContext, LlmAgent, MessageRecord, Router, RunOutcome, Target, run_workflow,
};
use engine::route::{Branch, Condition, ControlPlane, END, RouterConfig, RouterMode};
use engine::{SharedState, State, StateWrite};
use serde_json::{Value, json};

use crate::support::run;

/// A mock server answering every request with `reply` after `delay`.
async fn server(reply: &str, delay: Duration) -> MockServer {
    let script = Script::from_json_value(json!({"models": {"*": {"replies": [reply]}}}))
        .expect("valid script");
    MockServer::start(MockConfig {
        script,
        latency: Latency::fixed(delay),
        ..MockConfig::default()
    })
    .await
    .expect("mock server starts")
}

/// An LLM agent on `server` that puts its reply on record in `messages`.
fn recording_agent(name: &str, server: &MockServer) -> Arc<dyn Agent> {
    let config = EndpointConfig::openai(name, server.openai_base_url(), "mock");
    let endpoint = Arc::new(Endpoint::new(config, Arc::new(Ledger::default())).expect("endpoint"));
    let agent = LlmAgent::builder(name, endpoint)
        .instruction("Say something.")
        .record_messages(MessageRecord::default())
        .build()
        .expect("valid agent");
    Arc::new(agent)
}

/// The authors of the `messages` of `state`, in order.
fn authors(state: &State) -> Vec<String> {
    state
        .get("messages")
        .and_then(Value::as_array)
        .map(|list| {
            list.iter()
                .filter_map(|m| m.get("author").and_then(Value::as_str).map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Two branches append a message each; the one declared first answers last. Both messages
/// are kept, in the order they were appended, and the events replay to that state.
#[tokio::test]
async fn parallel_branches_keep_every_append_at_the_join() {
    let slow = server("slow reply", Duration::from_millis(150)).await;
    let fast = server("fast reply", Duration::ZERO).await;
    let group = Graph::parallel(
        "fan",
        vec![
            recording_agent("slow", &slow),
            recording_agent("fast", &fast),
        ],
        BranchPolicy::FailFast,
    )
    .expect("valid graph");
    let (report, events) = run(&group, State::default()).await;
    assert_eq!(report.outcome(), RunOutcome::Completed);
    assert_eq!(authors(&report.state), ["fast", "slow"]);
    let mut replayed = State::default();
    for event in &events {
        replayed.apply(&event.delta);
    }
    assert_eq!(replayed, report.state);
}

/// Counts the bytes of every event as the JSONL log would write it.
#[derive(Default)]
struct EventBytes(AtomicU64);

impl EventSink for EventBytes {
    fn emit(&self, event: &Event) -> Result<(), FlowError> {
        let bytes = serde_json::to_vec(event).map_err(|e| FlowError::Sink(e.to_string()))?;
        self.0.fetch_add(bytes.len() as u64 + 1, Ordering::Relaxed);
        Ok(())
    }
}

/// A node that counts the steps of the run and sets `done` once `limit` steps ran.
fn counting(name: &str) -> Arc<dyn Agent> {
    Arc::new(FnAgent::new(name, |ctx: &InvocationContext| {
        let steps = ctx.get_state("steps").and_then(|v| v.as_u64()).unwrap_or(0) + 1;
        ctx.set_state("steps", json!(steps));
        let limit = ctx.get_state("limit").and_then(|v| v.as_u64()).unwrap_or(0);
        if steps >= limit {
            ctx.set_state("done", json!(true));
        }
        Ok(Control::Continue)
    }))
}

/// `b` goes back to `a` until `done`, then to the end.
struct UntilDone;

#[async_trait]
impl Router for UntilDone {
    async fn route(&self, ctx: &InvocationContext, _from: &str) -> Result<Target, FlowError> {
        Ok(match ctx.get_state("done") {
            Some(Value::Bool(true)) => Target::End,
            _ => Target::node("a"),
        })
    }
}

/// `a → b → a …` until `limit` node steps ran (the state's `limit`), left through an active
/// router (returned with the graph) or by plain edges.
fn team(steps: u64, routed: bool) -> (Graph, Option<Arc<ControlPlane>>) {
    team_of(vec![counting("a"), counting("b")], steps, routed)
}

/// [`team`] of `nodes` (named `a` and `b`).
fn team_of(
    nodes: Vec<Arc<dyn Agent>>,
    steps: u64,
    routed: bool,
) -> (Graph, Option<Arc<ControlPlane>>) {
    if routed {
        let config = RouterConfig::new(["a", "b"], [("a", "b")])
            .with_branches(
                "b",
                vec![
                    Branch::when(Condition::truthy("done"), END),
                    Branch::otherwise("a"),
                ],
            )
            .with_mode(RouterMode::Active);
        let plane = Arc::new(ControlPlane::new(config));
        let graph = plane
            .builder("team", nodes, "a")
            .max_steps(steps + 1)
            .build()
            .expect("valid graph");
        return (graph, Some(plane));
    }
    let mut builder = Graph::builder("team").start("a").max_steps(steps + 1);
    for node in nodes {
        builder = builder.node(node);
    }
    let graph = builder
        .edge("a", Target::node("b"))
        .route("b", Arc::new(UntilDone))
        .build()
        .expect("valid graph");
    (graph, None)
}

/// `team` for `steps` node steps; returns the bytes of its events.
async fn event_bytes(steps: u64, routed: bool) -> u64 {
    let (graph, _plane) = team(steps, routed);
    let mut state = State::default();
    state.set("limit", json!(steps));
    let sink = Arc::new(EventBytes::default());
    let invocation = Invocation::new(SharedState::new(state)).with_sink(sink.clone());
    let report = run_workflow(&graph, invocation, None).await;
    assert_eq!(report.result, Ok(Control::Continue));
    assert_eq!(report.state.get("steps"), Some(&json!(steps)));
    sink.0.load(Ordering::Relaxed)
}

/// [`counting`] that also puts a message on record in `messages` each step, as an LLM agent
/// does under a router (`{author, content, topic}`, as the routed bench's).
fn speaking(name: &'static str) -> Arc<dyn Agent> {
    Arc::new(FnAgent::new(name, move |ctx: &InvocationContext| {
        let step = ctx.get_state("steps").and_then(|v| v.as_u64()).unwrap_or(0) + 1;
        let message = json!({
            "author": name,
            "content": format!("Step {step}: reviewed the previous work and handed it on."),
            "topic": format!("story-{step}"),
        });
        ctx.append_state("messages", vec![message]);
        ctx.set_state("steps", json!(step));
        let limit = ctx.get_state("limit").and_then(|v| v.as_u64()).unwrap_or(0);
        if step >= limit {
            ctx.set_state("done", json!(true));
        }
        Ok(Control::Continue)
    }))
}

/// The peak heap of a routed run in memory is well within 2× a plain graph's of the same
/// steps (1.29× at 400 steps; asserted ≤ 1.5×): a decision record kept in the state costs
/// what its fields do, less than the message each step puts on record (as a JSON object it
/// cost more — a 632-byte B-tree node however few its keys, 744 bytes in all against the
/// message's 713 — and this was 2.04×).
#[tokio::test]
async fn a_routed_runs_heap_is_within_twice_a_plain_graphs() {
    let steps = 400;
    let run = |routed: bool| async move {
        let (graph, _plane) = team_of(vec![speaking("a"), speaking("b")], steps, routed);
        let mut state = State::default();
        state.set("limit", json!(steps));
        let invocation = Invocation::new(SharedState::new(state));
        let (report, bytes) = crate::heap::peak(run_workflow(&graph, invocation, None)).await;
        assert_eq!(report.result, Ok(Control::Continue));
        let state = &report.state;
        assert_eq!(state.get("steps"), Some(&json!(steps)));
        let listed = |key: &str| state.get(key).and_then(Value::as_array).map(Vec::len);
        assert_eq!(listed("messages"), Some(steps as usize));
        assert_eq!(listed("decisions"), routed.then_some(steps as usize));
        bytes
    };
    let plain = run(false).await;
    let routed = run(true).await;
    assert!(
        routed * 10 <= plain * 15,
        "routed {routed} bytes at its peak, plain {plain}: {:.2}×",
        routed as f64 / plain as f64
    );
}

/// Every routing decision appends one record to `decisions`: the event that reports it
/// carries that record, not the whole list, so the log grows linearly with the steps — a
/// 1 000-step routed run writes per step what a 100-step one does, and a small multiple of
/// what the same graph writes without a router.
#[tokio::test]
async fn a_routed_runs_event_log_grows_linearly_with_its_steps() {
    let short = event_bytes(100, true).await;
    let long = event_bytes(1_000, true).await;
    let plain = event_bytes(1_000, false).await;
    let (per_step_short, per_step_long) = (short / 100, long / 1_000);
    assert!(
        per_step_long <= per_step_short * 3 / 2,
        "{per_step_long} bytes per step over 1 000 steps, {per_step_short} over 100"
    );
    assert!(
        long <= plain * 6,
        "routed {long} bytes, plain {plain} bytes for the same 1 000 steps"
    );
}

/// A node deletes one key and sets another to `null`: the event, the checkpoint and the
/// state a resumed run starts from all tell the two apart.
#[tokio::test]
async fn a_delete_is_its_own_write_through_the_event_the_checkpoint_and_a_resume() {
    let clear: Arc<dyn Agent> = Arc::new(FnAgent::new("clear", |ctx: &InvocationContext| {
        ctx.delete_state("gone");
        ctx.set_state("nothing", Value::Null);
        Ok(Control::Continue)
    }));
    let fail_once = Arc::new(AtomicU64::new(0));
    let failures = fail_once.clone();
    let after: Arc<dyn Agent> = Arc::new(FnAgent::new("after", move |ctx: &InvocationContext| {
        if failures.fetch_add(1, Ordering::Relaxed) == 0 {
            return Err(FlowError::Agent {
                agent: "after".into(),
                message: "not yet".into(),
            });
        }
        ctx.set_state("saw_gone", json!(ctx.get_state("gone").is_some()));
        ctx.set_state("saw_nothing", json!(ctx.get_state("nothing")));
        Ok(Control::Continue)
    }));
    let graph = Graph::sequential("flow", vec![clear, after]).expect("valid graph");
    let dir = tempfile::tempdir().expect("a temporary folder");
    let db = dir.path().join("runs.db");
    let store = {
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&db).expect("the store opens"));
        store
    };
    let mut state = State::default();
    state.set("gone", json!("x"));
    state.set("nothing", json!(1));
    let sink = engine::flow::MemorySink::new();
    let invocation = Invocation::new(SharedState::new(state)).with_sink(Arc::new(sink.clone()));
    let start = Start::New {
        workflow: "flow".into(),
        input: json!({}),
    };
    let first = run_durable(&graph, None, &store, "r", start, invocation)
        .await
        .expect("the run starts");
    assert!(matches!(first.status, Stored::Failed { .. }));

    // The event of `clear` carries a delete and a replace with `null`.
    let delete = StateWrite::Delete { key: "gone".into() };
    let null = StateWrite::Replace {
        key: "nothing".into(),
        value: Value::Null,
    };
    let end = sink
        .events()
        .into_iter()
        .find(|e| e.author == "clear" && !e.delta.is_empty())
        .expect("an event of `clear` with its writes");
    assert_eq!(
        end.delta.iter().cloned().collect::<Vec<_>>(),
        [delete.clone(), null.clone()]
    );
    assert_eq!(first.run.state.get("gone"), None);
    assert_eq!(first.run.state.get("nothing"), Some(&Value::Null));

    // So does its checkpoint, read back from the file by another store.
    drop(store);
    let store = {
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&db).expect("the store reopens"));
        store
    };
    let history = store.history("r").await.expect("the run's history");
    let checkpoint = history
        .iter()
        .find(|c| c.node == "clear")
        .expect("a checkpoint of `clear`");
    let writes = store.writes(checkpoint.id).await.expect("its writes");
    assert_eq!(writes.iter().cloned().collect::<Vec<_>>(), [delete, null]);
    let at = store.state_at(checkpoint.id).await.expect("its state");
    assert_eq!(at.state.get("gone"), None);
    assert_eq!(at.state.get("nothing"), Some(&Value::Null));

    // A resumed run starts from that state: `gone` is gone, `nothing` is `null`.
    let resume = Start::Resume {
        from: None,
        answer: None,
        take_over: false,
    };
    let invocation = Invocation::new(SharedState::new(State::default()));
    let resumed = run_durable(&graph, None, &store, "r", resume, invocation)
        .await
        .expect("the run resumes");
    assert_eq!(resumed.status, Stored::Completed);
    assert_eq!(resumed.run.state.get("saw_gone"), Some(&json!(false)));
    assert_eq!(resumed.run.state.get("saw_nothing"), Some(&Value::Null));
    assert_eq!(resumed.run.state.get("gone"), None);
}

/// `text` (JSON as written) with the value of every `field` in it replaced by `by`, each
/// checked by `shape` first.
fn masked(text: &str, field: &str, shape: impl Fn(&str) -> bool, by: &str) -> String {
    let name = format!("\"{field}\":");
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find(&name) {
        let (head, tail) = rest.split_at(at + name.len());
        out.push_str(head);
        let end = tail
            .find([',', '}'])
            .expect("a value ends with a comma or a brace");
        assert!(shape(&tail[..end]), "`{}` is not a {field}", &tail[..end]);
        out.push_str(by);
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

/// `text` with every decision's `timestamp` (an RFC 3339 time in UTC, to the millisecond)
/// written `"T"` and every event's `at_ms` written `0`.
fn untimed(text: &str) -> String {
    let rfc3339 = |value: &str| {
        let time = value.trim_matches('"');
        value.len() == 26
            && time.char_indices().all(|(i, c)| match i {
                4 | 7 => c == '-',
                10 => c == 'T',
                13 | 16 => c == ':',
                19 => c == '.',
                23 => c == 'Z',
                _ => c.is_ascii_digit(),
            })
    };
    let text = masked(text, "timestamp", rfc3339, "\"T\"");
    let millis = |value: &str| value.parse::<u64>().is_ok();
    masked(&text, "at_ms", millis, "0")
}

/// The JSON of a decision record of [`team`]'s router, but for its time (`"T"`).
fn decision(summary: &str, from: &str) -> String {
    format!(
        r#"{{"agent":"router","rationale":"{from}","related_artifacts":[],"summary":"{summary}","timestamp":"T"}}"#
    )
}

/// What `node`'s decisions give as their reason.
fn successor(node: &str) -> String {
    format!("The natural successor of `{node}`")
}

/// The state a routed [`team`] of 4 steps ends with, as JSON (written so since before the
/// state kept decisions as records), but for the decisions' times.
fn routed_state_text() -> String {
    let decisions = [
        decision("a → b", &successor("a")),
        decision("b → a", &successor("b")),
        decision("a → b", &successor("a")),
        decision("b → end", &successor("b")),
    ]
    .join(",");
    format!(
        r#"{{"circular_logic_detected":false,"decisions":[{decisions}],"done":true,"escalation_triggered":false,"exchange_count":0,"limit":4,"routing_decision":"END","routing_rationale":"The natural successor of `b`","steps":4}}"#
    )
}

/// What a user sees of a routed run's decisions — its state (`--json`), the router's events
/// (the event log), its checkpoints (`flow decisions`, a resume) — is the same whether or
/// not anything records the run, and is pinned here byte for byte, but for each decision's
/// time.
#[tokio::test]
async fn a_routed_runs_decisions_read_the_same_in_its_state_events_and_checkpoints() {
    let limit = 4;
    let (graph, plane) = team(limit, true);
    let invocation = || {
        let mut state = State::default();
        state.set("limit", json!(limit));
        Invocation::new(SharedState::new(state))
    };
    let state_text = |state: &State| untimed(&serde_json::to_string(state).expect("a state"));

    // In memory: nothing records the run, so the router makes no frame and no event.
    let quiet = run_workflow(&graph, invocation(), None).await;
    assert_eq!(quiet.result, Ok(Control::Continue));
    // With an event log.
    let sink = engine::flow::MemorySink::new();
    let logged = run_workflow(&graph, invocation().with_sink(Arc::new(sink.clone())), None).await;
    assert_eq!(logged.result, Ok(Control::Continue));
    // Durable: an event log and checkpoints in an SQLite file.
    let dir = tempfile::tempdir().expect("a temporary folder");
    let store: Arc<dyn Store> =
        Arc::new(SqliteStore::open(dir.path().join("runs.db")).expect("the store opens"));
    let durable_sink = engine::flow::MemorySink::new();
    let start = Start::New {
        workflow: "team".into(),
        input: json!({}),
    };
    let durable = run_durable(
        &graph,
        plane.as_ref(),
        &store,
        "r",
        start,
        invocation().with_sink(Arc::new(durable_sink.clone())),
    )
    .await
    .expect("the run starts");
    assert_eq!(durable.status, Stored::Completed);

    let expected = routed_state_text();
    assert_eq!(state_text(&quiet.state), expected);
    assert_eq!(state_text(&logged.state), expected);
    assert_eq!(state_text(&durable.run.state), expected);
    // A parallel branch records its writes for the join: with no event log, the router's
    // writes still reach the state through it.
    let other: Arc<dyn Agent> = Arc::new(FnAgent::new("other", |_: &InvocationContext| {
        Ok(Control::Continue)
    }));
    let fan = Graph::parallel(
        "fan",
        vec![Arc::new(team(limit, true).0), other],
        BranchPolicy::FailFast,
    )
    .expect("valid graph");
    let joined = run_workflow(&fan, invocation(), None).await;
    assert_eq!(joined.result, Ok(Control::Continue));
    assert_eq!(state_text(&joined.state), expected);

    // The router's event after `a`'s first step: its summary and its writes, the record
    // appended (not the whole list).
    let router_event = |events: Vec<Event>| {
        let event = events
            .into_iter()
            .find(|e| e.author == "router")
            .expect("an event of the router");
        untimed(&serde_json::to_string(&event).expect("an event"))
    };
    let writes = format!(
        r#"[{{"op":"replace","key":"routing_decision","value":"b"}},{{"op":"replace","key":"routing_rationale","value":"{}"}},{{"op":"replace","key":"exchange_count","value":0}},{{"op":"replace","key":"circular_logic_detected","value":false}},{{"op":"replace","key":"escalation_triggered","value":false}},{{"op":"append","key":"decisions","items":[{}]}}]"#,
        successor("a"),
        decision("a → b", &successor("a")),
    );
    let expected = format!(
        r#"{{"seq":3,"author":"router","branch":"team/router","kind":"state_update","content":"a → b","delta":{writes},"at_ms":0}}"#
    );
    assert_eq!(router_event(sink.events()), expected);
    assert_eq!(router_event(durable_sink.events()), expected);

    // The checkpoint of that decision stores the same writes; the head's state is the run's.
    let history = store.history("r").await.expect("the run's history");
    let mut stored = Vec::new();
    for checkpoint in &history {
        let written = store.writes(checkpoint.id).await.expect("its writes");
        if written.keys().contains(&"decisions") {
            stored.push(untimed(&serde_json::to_string(&written).expect("writes")));
        }
    }
    assert_eq!(stored.len(), 4, "one checkpoint per decision");
    assert_eq!(stored[0], writes);
    let head = durable.head.expect("a head checkpoint");
    let at = store.state_at(head).await.expect("the head's state");
    assert_eq!(state_text(&at.state), state_text(&durable.run.state));
}

/// A routed run that stopped with a failed node resumes from its checkpoint in the SQLite
/// file: the decisions read back from it (the JSON the state was written as, read by a
/// store opened afresh) and the ones the resumed run appends end as the state of a run that
/// never stopped, byte for byte, and a state read from that JSON writes it back unchanged.
#[tokio::test]
async fn a_routed_run_resumed_from_its_checkpoint_ends_as_an_unbroken_one() {
    let limit = 4;
    let failed = Arc::new(AtomicU64::new(0));
    let fails = failed.clone();
    let b: Arc<dyn Agent> = Arc::new(FnAgent::new("b", move |ctx: &InvocationContext| {
        let steps = ctx.get_state("steps").and_then(|v| v.as_u64()).unwrap_or(0) + 1;
        // Its second step fails, once: after three decisions on record.
        if steps == 4 && fails.fetch_add(1, Ordering::Relaxed) == 0 {
            return Err(FlowError::Agent {
                agent: "b".into(),
                message: "not yet".into(),
            });
        }
        ctx.set_state("steps", json!(steps));
        if steps >= limit {
            ctx.set_state("done", json!(true));
        }
        Ok(Control::Continue)
    }));
    let (graph, plane) = team_of(vec![counting("a"), b], limit, true);
    let dir = tempfile::tempdir().expect("a temporary folder");
    let db = dir.path().join("runs.db");
    let invocation = || {
        let mut state = State::default();
        state.set("limit", json!(limit));
        Invocation::new(SharedState::new(state))
    };
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&db).expect("the store opens"));
    let start = Start::New {
        workflow: "team".into(),
        input: json!({}),
    };
    let first = run_durable(&graph, plane.as_ref(), &store, "r", start, invocation())
        .await
        .expect("the run starts");
    assert!(
        matches!(first.status, Stored::Failed { .. }),
        "{:?}",
        first.status
    );
    assert_eq!(failed.load(Ordering::Relaxed), 1);
    drop(store);

    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&db).expect("the store reopens"));
    let head = store
        .run("r")
        .await
        .expect("the run's record")
        .and_then(|run| run.head)
        .expect("a head checkpoint");
    let at = store.state_at(head).await.expect("the head's state");
    let text = serde_json::to_string(&at.state).expect("a state");
    let decisions = at.state.get("decisions").and_then(Value::as_array);
    assert_eq!(decisions.map(Vec::len), Some(3), "{text}");
    let read: State = serde_json::from_str(&text).expect("a state reads back");
    assert_eq!(serde_json::to_string(&read).expect("a state"), text);
    assert_eq!(read, at.state);

    let resume = Start::Resume {
        from: None,
        answer: None,
        take_over: false,
    };
    let resumed = run_durable(&graph, plane.as_ref(), &store, "r", resume, invocation())
        .await
        .expect("the run resumes");
    assert_eq!(resumed.status, Stored::Completed);
    let state_text = |state: &State| untimed(&serde_json::to_string(state).expect("a state"));
    assert_eq!(state_text(&resumed.run.state), routed_state_text());
    let head = resumed.head.expect("a head checkpoint");
    let at = store.state_at(head).await.expect("the head's state");
    assert_eq!(state_text(&at.state), routed_state_text());
}
