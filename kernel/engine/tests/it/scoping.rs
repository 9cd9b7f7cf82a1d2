//! The three actions and their scopes: `exit_loop` ends the nearest loop only, `escalate`
//! stops the invocation, `end_turn` ends the agent's turn.

use engine::State;
use engine::flow::{Control, EndStatus, EventKind, Graph, RunOutcome};

use crate::support::{counted, ends, iters, run, step, traced};

/// The case ADK gets wrong: an inner loop's `exit_loop` must not end the outer loop.
#[tokio::test]
async fn exit_loop_ends_the_nearest_loop_only() {
    let inner = Graph::looping(
        "inner",
        vec![counted("worker", |n| {
            // Leave the inner loop on every second run of the worker.
            if n % 2 == 0 {
                Control::ExitLoop
            } else {
                Control::Continue
            }
        })],
        iters(10),
    )
    .expect("valid graph");
    let outer = Graph::looping(
        "outer",
        vec![
            step("planner"),
            std::sync::Arc::new(inner),
            step("after_inner"),
        ],
        iters(3),
    )
    .expect("valid graph");
    let (report, events) = run(&outer, State::default()).await;
    assert_eq!(report.result, Ok(Control::Continue));
    assert_eq!(
        traced(&report.state),
        [
            "planner",
            "worker",
            "worker",
            "after_inner", // iteration 1
            "planner",
            "worker",
            "worker",
            "after_inner", // iteration 2
            "planner",
            "worker",
            "worker",
            "after_inner", // iteration 3
        ]
    );
    assert_eq!(ends(&events, "inner"), [EndStatus::ExitedLoop; 3]);
    assert_eq!(ends(&events, "outer"), [EndStatus::IterationLimit]);
    let outer_iterations: Vec<u32> = events
        .iter()
        .filter(|e| e.author == "outer")
        .filter_map(|e| match e.kind {
            EventKind::Iteration { iteration } => Some(iteration),
            _ => None,
        })
        .collect();
    assert_eq!(outer_iterations, [1, 2, 3]);
}

#[tokio::test]
async fn exit_loop_travels_up_through_a_sequence_to_its_loop() {
    let body = Graph::sequential(
        "body",
        vec![
            counted("check", |n| {
                if n == 2 {
                    Control::ExitLoop
                } else {
                    Control::Continue
                }
            }),
            step("skipped_on_exit"),
        ],
    )
    .expect("valid graph");
    let lp =
        Graph::looping("refine", vec![std::sync::Arc::new(body)], iters(5)).expect("valid graph");
    let root = Graph::sequential("root", vec![std::sync::Arc::new(lp), step("finish")])
        .expect("valid graph");
    let (report, events) = run(&root, State::default()).await;
    assert_eq!(report.outcome(), RunOutcome::Completed);
    assert_eq!(
        traced(&report.state),
        ["check", "skipped_on_exit", "check", "finish"]
    );
    assert_eq!(ends(&events, "refine"), [EndStatus::ExitedLoop]);
    assert_eq!(ends(&events, "body"), [EndStatus::Completed; 2]);
}

#[tokio::test]
async fn exit_loop_outside_any_loop_ends_only_the_enclosing_sequences() {
    let root = Graph::sequential(
        "root",
        vec![counted("stop", |_| Control::ExitLoop), step("never")],
    )
    .expect("valid graph");
    let (report, _) = run(&root, State::default()).await;
    assert_eq!(report.result, Ok(Control::ExitLoop));
    assert_eq!(report.outcome(), RunOutcome::Completed);
    assert_eq!(traced(&report.state), ["stop"]);
}

#[tokio::test]
async fn escalate_stops_every_enclosing_loop_and_the_run() {
    let inner = Graph::looping(
        "inner",
        vec![counted("worker", |n| {
            if n == 2 {
                Control::Escalate
            } else {
                Control::Continue
            }
        })],
        iters(10),
    )
    .expect("valid graph");
    let outer = Graph::looping(
        "outer",
        vec![
            step("planner"),
            std::sync::Arc::new(inner),
            step("after_inner"),
        ],
        iters(3),
    )
    .expect("valid graph");
    let root = Graph::sequential("root", vec![std::sync::Arc::new(outer), step("finish")])
        .expect("valid graph");
    let (report, events) = run(&root, State::default()).await;
    assert_eq!(report.outcome(), RunOutcome::Escalated);
    assert_eq!(traced(&report.state), ["planner", "worker", "worker"]);
    for agent in ["worker", "inner", "outer", "root"] {
        assert_eq!(
            ends(&events, agent).last(),
            Some(&EndStatus::Escalated),
            "{agent}"
        );
    }
}

/// `end_turn` ends the agent's own turn: it is not a loop exit, so the loop and the
/// sequence go on with the next sub-agent.
#[tokio::test]
async fn end_turn_moves_on_to_the_next_sub_agent() {
    use engine::flow::{Event, FnAgent};
    use engine::tool::Actions;
    let ends_turn = FnAgent::new("talker", |ctx| {
        crate::support::trace(ctx, "talker");
        let actions = Actions {
            end_turn: true,
            ..Actions::default()
        };
        ctx.emit(Event::message("over to you").with_actions(actions))?;
        Ok(Control::from_actions(actions))
    });
    let lp = Graph::looping(
        "lp",
        vec![std::sync::Arc::new(ends_turn), step("next")],
        iters(2),
    )
    .expect("valid graph");
    let (report, events) = run(&lp, State::default()).await;
    assert_eq!(traced(&report.state), ["talker", "next", "talker", "next"]);
    assert_eq!(ends(&events, "lp"), [EndStatus::IterationLimit]);
    let talker_actions = events
        .iter()
        .filter(|e| e.author == "talker" && e.kind == EventKind::Message)
        .map(|e| e.actions.end_turn)
        .collect::<Vec<_>>();
    assert_eq!(talker_actions, [true, true]);
}

#[tokio::test]
async fn a_loop_stops_at_max_iterations() {
    let lp = Graph::looping("lp", vec![step("a"), step("b")], iters(4)).expect("valid graph");
    let (report, events) = run(&lp, State::default()).await;
    assert_eq!(traced(&report.state).len(), 8);
    assert_eq!(ends(&events, "lp"), [EndStatus::IterationLimit]);
}
