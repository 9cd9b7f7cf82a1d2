#![allow(clippy::unwrap_used)] // In tests an unwrap is an assertion.

//! The router's decisions, priority by priority.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use super::decide::{NameRole, Reason, consults};
use super::gate::check_gates;
use super::*;
use crate::reducer::Reducers;
use crate::state::{State, StateDelta, StateWrite};

/// The values `updates` leave when applied to an empty state.
fn applied(updates: &StateDelta) -> State {
    let mut state = State::default();
    state.apply(updates);
    state
}

fn team() -> RouterConfig {
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
    .with_recovery("tests_pass", "dev")
}

fn state(value: Value) -> State {
    match value {
        Value::Object(map) => State::from_map(map),
        _ => State::default(),
    }
}

fn at() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_795_698_300)
}

/// `n` alternating dev/tea messages on one topic, ending with `dev` when `n` is odd.
fn ping_pong(n: usize) -> Value {
    let messages: Vec<Value> = (0..n)
        .map(|i| {
            let author = if i % 2 == 0 { "dev" } else { "tea" };
            json!({"author": author, "topic": "story-7", "content": "..."})
        })
        .collect();
    Value::Array(messages)
}

#[test]
fn the_natural_successor_or_a_conditional_branch_or_the_end() {
    let config = team();
    let s = state(json!({}));
    assert_eq!(
        decide(&s, &config, "analyst", at()).route,
        Route::Node("pm".into())
    );
    let rejected = state(json!({"verdict": "rejected"}));
    assert_eq!(
        decide(&rejected, &config, "tea", at()).route,
        Route::Node("dev".into())
    );
    let approved = decide(&state(json!({"verdict": "ok"})), &config, "tea", at());
    assert_eq!(approved.route, Route::End);
    assert_eq!(approved.decision(), "END");
    let last = decide(
        &s,
        &config.clone().with_mode(RouterMode::Passive),
        "pm",
        at(),
    );
    assert_eq!(last.route, Route::Node("dev".into()));
    let mut no_successor = config;
    no_successor.successors.remove("tea");
    let routing = decide(&s, &no_successor, "tea", at());
    assert_eq!(
        (routing.route, routing.reason),
        (Route::End, Reason::NoSuccessor)
    );
}

#[test]
fn the_router_writes_its_output_keys_and_one_decision_record() {
    let s = state(json!({
        "messages": [{"author": "analyst", "content": "brief", "artifacts": ["brief.md"]}],
    }));
    let routing = decide(&s, &team(), "analyst", at());
    let out = applied(&routing.updates);
    assert_eq!(out.get("routing_decision"), Some(&json!("pm")));
    assert_eq!(
        out.get("routing_rationale"),
        Some(&json!("The natural successor of `analyst`"))
    );
    assert_eq!(out.get("exchange_count"), Some(&json!(0)));
    assert_eq!(out.get("circular_logic_detected"), Some(&json!(false)));
    assert_eq!(out.get("escalation_triggered"), Some(&json!(false)));
    assert_eq!(
        out.get("decisions"),
        Some(&json!([{
            "agent": "router",
            "summary": "analyst → pm",
            "rationale": "The natural successor of `analyst`",
            "timestamp": "2026-11-26T13:05:00.000Z",
            "related_artifacts": ["brief.md"],
        }]))
    );
    let record = routing.record().expect("the updates hold the record");
    assert_eq!(
        (record.summary.as_str(), record.related_artifacts.as_slice()),
        ("analyst → pm", ["brief.md".to_owned()].as_slice())
    );
    // Merged with the default reducers, decisions accumulate and the state is untouched.
    let mut merged = s.clone();
    let writes = Reducers::default().reduce(&routing.updates);
    // As the control plane hands it to its observers: the updates as merged, the same record.
    let observed = Routing {
        updates: writes.clone(),
        ..routing.clone()
    };
    assert_eq!(observed.record(), Some(record));
    merged.apply(&writes);
    merged.apply(&writes);
    assert_eq!(
        merged
            .get("decisions")
            .and_then(Value::as_array)
            .map(Vec::len),
        Some(2)
    );
    assert_eq!(
        s.get("decisions"),
        None,
        "decide never changes the state it reads"
    );
}

#[test]
fn three_exchanges_do_not_trigger_and_four_escalate() {
    let config = team();
    let three = state(json!({"messages": ping_pong(4), "verdict": "rejected"}));
    let routing = decide(&three, &config, "tea", at());
    assert_eq!(routing.route, Route::Node("dev".into()));
    assert_eq!(
        applied(&routing.updates).get("exchange_count"),
        Some(&json!(3))
    );

    let four = state(json!({"messages": ping_pong(5)}));
    let routing = decide(&four, &config, "dev", at());
    assert_eq!(routing.route, Route::Escalate);
    assert_eq!(routing.decision(), "ESCALATE");
    let out = applied(&routing.updates);
    assert_eq!(out.get("exchange_count"), Some(&json!(4)));
    assert_eq!(out.get("circular_logic_detected"), Some(&json!(true)));
    assert_eq!(out.get("escalation_triggered"), Some(&json!(true)));
    assert_eq!(
        routing.rationale().unwrap_or_default(),
        "Circular logic: `dev` and `tea` exchanged work 4 times on `story-7` (more than 3); a \
         human must decide"
    );
}

#[test]
fn escalation_and_failure_flags_come_first() {
    let config = team();
    // The flag wins over a blocked gate and over circular logic.
    let s = state(json!({
        "escalate_to_human": "Pick a database",
        "gate_blocked": {"gate": "tests_pass", "node": "dev", "reason": "2 failing"},
        "messages": ping_pong(6),
    }));
    let routing = decide(&s, &config, "dev", at());
    assert_eq!(routing.route, Route::Escalate);
    assert!(matches!(routing.reason, Reason::HumanRequested { .. }));
    assert_eq!(
        routing.rationale().unwrap_or_default(),
        "`dev` asked for a human: Pick a database"
    );
    assert_eq!(
        applied(&routing.updates).get("circular_logic_detected"),
        Some(&json!(false))
    );

    let failed = state(json!({
        "agent_failure": {"node": "tea", "error": "model unavailable", "attempts": 3},
        "gate_blocked": {"gate": "tests_pass", "node": "dev", "reason": "2 failing"},
    }));
    let routing = decide(&failed, &config, "tea", at());
    assert!(matches!(routing.reason, Reason::AgentFailed { .. }));
    assert_eq!(
        routing.rationale().unwrap_or_default(),
        "`tea` failed for good: model unavailable"
    );
    // A cleared (false / null) flag does not escalate.
    let cleared = state(json!({"escalate_to_human": false, "agent_failure": null}));
    assert_eq!(
        decide(&cleared, &config, "pm", at()).route,
        Route::Node("dev".into())
    );
}

#[test]
fn circular_logic_comes_before_a_blocked_gate() {
    let s = state(json!({
        "gate_blocked": {"gate": "tests_pass", "node": "dev", "reason": "2 failing"},
        "messages": ping_pong(5),
    }));
    let routing = decide(&s, &team(), "dev", at());
    assert!(matches!(routing.reason, Reason::CircularLogic { .. }));
}

#[test]
fn a_blocked_gate_goes_to_its_recovery_node_and_is_cleared() {
    let s = state(json!({
        "gate_blocked": {"gate": "tests_pass", "node": "tea", "reason": "2 failing"},
    }));
    let routing = decide(&s, &team(), "tea", at());
    assert_eq!(routing.route, Route::Node("dev".into()));
    assert_eq!(
        routing.reason,
        Reason::GateBlocked {
            gate: "tests_pass".into(),
            reason: "2 failing".into()
        }
    );
    assert_eq!(
        routing.updates.last("gate_blocked"),
        Some(&StateWrite::Delete {
            key: "gate_blocked".into()
        })
    );
    assert_eq!(
        routing.record().map(|record| record.related_artifacts),
        Some(vec!["tests_pass".to_owned()])
    );
    let other = state(json!({"gate_blocked": {"gate": "lint", "node": "dev", "reason": "x"}}));
    let routing = decide(&other, &team(), "dev", at());
    assert_eq!(routing.route, Route::Escalate);
    assert_eq!(
        routing.reason,
        Reason::NoRecovery {
            gate: "lint".into()
        }
    );
}

#[test]
fn unknown_node_names_escalate_instead_of_crashing() {
    let s = state(json!({}));
    let routing = decide(&s, &team(), "ghost", at());
    assert_eq!(routing.route, Route::Escalate);
    assert_eq!(
        routing.reason,
        Reason::UnknownNode {
            name: "ghost".into(),
            role: NameRole::Current
        }
    );
    let typo = RouterConfig::new(["dev", "tea"], [("dev", "taa")]);
    let routing = decide(&s, &typo, "dev", at());
    assert_eq!(
        routing.reason,
        Reason::UnknownNode {
            name: "taa".into(),
            role: NameRole::Successor
        }
    );
    assert_eq!(
        routing.rationale().unwrap_or_default(),
        "`taa`, the successor of the node that ran, is not a node of this graph; a human must look"
    );
    let bad_recovery = team().with_recovery("lint", "nobody");
    let blocked = state(json!({"gate_blocked": {"gate": "lint", "node": "dev", "reason": "x"}}));
    let routing = decide(&blocked, &bad_recovery, "dev", at());
    assert_eq!(
        routing.reason,
        Reason::UnknownNode {
            name: "nobody".into(),
            role: NameRole::Recovery
        }
    );
}

#[test]
fn passive_mode_consults_the_router_only_when_something_is_wrong() {
    let passive = team().with_mode(RouterMode::Passive);
    assert!(
        consults(&team(), &state(json!({}))),
        "active: every transition"
    );
    assert!(!consults(
        &passive,
        &state(json!({"messages": ping_pong(4)}))
    ));
    assert!(consults(
        &passive,
        &state(json!({"messages": ping_pong(5)}))
    ));
    assert!(consults(
        &passive,
        &state(json!({"escalate_to_human": true}))
    ));
    assert!(consults(
        &passive,
        &state(json!({"agent_failure": {"node": "dev"}}))
    ));
    assert!(consults(
        &passive,
        &state(json!({"gate_blocked": {"gate": "g"}}))
    ));
    assert!(!consults(&passive, &state(json!({"gate_blocked": null}))));
}

#[derive(Debug)]
struct CoverageAtLeast(f64);

impl QualityCheck for CoverageAtLeast {
    fn check(&self, state: &State) -> Result<(), String> {
        let coverage = state.get("coverage").and_then(Value::as_f64).unwrap_or(0.0);
        if coverage >= self.0 {
            Ok(())
        } else {
            Err(format!("coverage {coverage} is below {}", self.0))
        }
    }
}

#[test]
fn gates_block_or_warn_and_a_passing_rerun_clears_the_block() {
    let gates = vec![
        Gate {
            name: "tests_pass".into(),
            check: GateCheck::State(Box::new(Condition::equals("failing_tests", json!(0)))),
            blocking: true,
        },
        Gate {
            name: "coverage".into(),
            check: GateCheck::Custom(std::sync::Arc::new(CoverageAtLeast(0.8))),
            blocking: false,
        },
    ];
    let failing = state(json!({"failing_tests": 2, "coverage": 0.5}));
    let outcome = check_gates("dev", &gates, &failing);
    assert_eq!(outcome.failures.len(), 2);
    assert_eq!(
        outcome.blocked().map(|f| f.gate.as_str()),
        Some("tests_pass")
    );
    let blocked = applied(&outcome.updates)
        .get("gate_blocked")
        .cloned()
        .unwrap();
    assert_eq!(blocked["gate"], json!("tests_pass"));
    assert_eq!(blocked["node"], json!("dev"));
    assert_eq!(
        applied(&outcome.updates).get("gate_warnings"),
        Some(&json!([{"gate": "coverage", "node": "dev", "reason": "coverage 0.5 is below 0.8"}]))
    );
    // The router sends the blocked work to the gate's recovery node.
    let mut s = failing.clone();
    s.apply(&outcome.updates);
    assert_eq!(
        decide(&s, &team(), "dev", at()).route,
        Route::Node("dev".into())
    );

    // Advisory failures alone never block; a passing rerun clears its own block.
    let passing = state(json!({"failing_tests": 0, "coverage": 0.5, "gate_blocked": blocked}));
    let outcome = check_gates("dev", &gates, &passing);
    assert!(outcome.blocked().is_none());
    assert_eq!(
        outcome.updates.last("gate_blocked"),
        Some(&StateWrite::Delete {
            key: "gate_blocked".into()
        })
    );
}
