//! State semantics: every write is applied before the next step, and the events carry every
//! write so the log replays to the same state.

use std::sync::Arc;

use engine::flow::{BranchPolicy, Control, Event, FnAgent, Graph, RunOutcome};
use engine::{State, StateDelta};
use serde_json::json;

use crate::support::{iters, run};

/// Reads `from`, writes it (plus one) to `to`.
fn relay(name: &str, from: &'static str, to: &'static str) -> Arc<FnAgent> {
    Arc::new(FnAgent::new(name, move |ctx| {
        let seen = ctx.get_state(from).and_then(|v| v.as_i64()).unwrap_or(-100);
        ctx.set_state(to, json!(seen + 1));
        Ok(Control::Continue)
    }))
}

#[tokio::test]
async fn a_write_is_visible_to_the_next_sibling_and_the_next_iteration() {
    let seed = Arc::new(FnAgent::new("seed", |ctx| {
        if ctx.get_state("temp:b").is_none() {
            ctx.set_state("temp:a", json!(0));
        }
        Ok(Control::Continue)
    }));
    // Iteration 1: a=0 → b=1 → a=2; iteration 2: a=2 → b=3 → a=4.
    let lp = Graph::looping(
        "lp",
        vec![
            seed,
            relay("ab", "temp:a", "temp:b"),
            relay("ba", "temp:b", "temp:a"),
        ],
        iters(2),
    )
    .expect("valid graph");
    let keep = relay("keep", "temp:a", "result");
    let root = Graph::sequential("root", vec![Arc::new(lp), keep]).expect("valid graph");
    let (report, events) = run(&root, State::default()).await;
    assert_eq!(report.outcome(), RunOutcome::Completed);
    assert_eq!(report.state.get("result"), Some(&json!(5)));
    // `temp:` keys lived through the invocation and are gone after it.
    assert_eq!(report.state.get("temp:a"), None);
    let temp_writes = events
        .iter()
        .filter(|e| e.delta.keys().contains(&"temp:a"))
        .count();
    assert_eq!(temp_writes, 3);
}

/// Applying every event's delta in order gives the final state: nothing is written that an
/// event does not carry, parallel conflicts included.
#[tokio::test]
async fn the_event_deltas_replay_to_the_final_state() {
    let writer = |name: &str, value: i64| {
        Arc::new(FnAgent::new(name, move |ctx| {
            ctx.set_state("shared", json!(value));
            ctx.set_state(format!("by_{value}"), json!(true));
            ctx.emit(Event::message(format!("wrote {value}")))?;
            ctx.set_state("late", json!(value));
            Ok(Control::Continue)
        }))
    };
    let fan = Graph::parallel(
        "fan",
        vec![writer("w1", 1), writer("w2", 2), writer("w3", 3)],
        BranchPolicy::FailFast,
    )
    .expect("valid graph");
    let after = relay("after", "shared", "after");
    let root = Graph::sequential("root", vec![Arc::new(fan), after]).expect("valid graph");
    let (report, events) = run(&root, State::default()).await;
    assert_eq!(report.state.get("shared"), Some(&json!(3)));
    assert_eq!(report.state.get("after"), Some(&json!(4)));
    let mut replayed = State::default();
    let mut all = StateDelta::default();
    for event in &events {
        replayed.apply(&event.delta);
        all.extend(event.delta.clone());
    }
    assert_eq!(replayed, report.state);
    assert!(events.windows(2).all(|w| w[0].seq + 1 == w[1].seq));
}

#[tokio::test]
async fn a_write_before_a_failure_is_kept() {
    let root = Graph::sequential(
        "root",
        vec![
            relay("first", "nothing", "kept"),
            crate::support::failing("second", "broken"),
        ],
    )
    .expect("valid graph");
    let (report, events) = run(&root, State::default()).await;
    assert_eq!(report.outcome(), RunOutcome::Failed);
    assert_eq!(report.state.get("kept"), Some(&json!(-99)));
    let end = events.last().expect("events");
    assert_eq!(end.author, "root");
    assert_eq!(
        end.content.as_deref(),
        Some("Agent `second` failed: broken")
    );
}
