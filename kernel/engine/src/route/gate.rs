//! Quality gates: checks a node's output must pass.
//!
//! A node declares gates; each is a declarative state test ([`Condition`]) or a pluggable
//! [`QualityCheck`] (a Python check in the kernel), and is **blocking** (a failure sets
//! `gate_blocked = {gate, node, reason}`, which the router sends to the gate's recovery node)
//! or **advisory** (a failure is recorded under `gate_warnings` and the run goes on).
//! [`check_gates`] runs a node's gates over the state and returns the updates; a node whose
//! blocking gates all pass deletes a `gate_blocked` it had set before.

use std::sync::Arc;

use serde::Serialize;
use serde_json::{Value, json};

use super::decide::GATE_BLOCKED;
use crate::condition::Condition;
use crate::state::{State, StateDelta};

/// Advisory gate failures of the last node checked: `[{gate, node, reason}]`.
pub(crate) const GATE_WARNINGS: &str = "gate_warnings";

/// A check written in code: `Err(reason)` fails the gate.
pub trait QualityCheck: Send + Sync + std::fmt::Debug {
    /// Checks `state`.
    fn check(&self, state: &State) -> Result<(), String>;
}

/// What a gate checks.
#[derive(Debug, Clone)]
pub enum GateCheck {
    /// The state passes this test.
    State(Box<Condition>),
    /// This check passes.
    Custom(Arc<dyn QualityCheck>),
}

/// One quality gate of a node.
#[derive(Debug, Clone)]
pub struct Gate {
    /// Its name (recovery nodes are declared per gate name).
    pub name: String,
    /// What it checks.
    pub check: GateCheck,
    /// Whether a failure blocks the run (or is only recorded).
    pub blocking: bool,
}

/// A failed gate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct GateFailure {
    /// The gate.
    pub(crate) gate: String,
    /// The node it guards.
    pub(crate) node: String,
    /// Why it failed.
    pub(crate) reason: String,
    /// Whether it blocks.
    pub(crate) blocking: bool,
}

/// The failed gates of a node and the updates that record them.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct GateOutcome {
    /// Every failed gate, in declaration order.
    pub(crate) failures: Vec<GateFailure>,
    /// `gate_blocked` (the first blocking failure, or cleared) and `gate_warnings`.
    pub(crate) updates: StateDelta,
}

impl GateOutcome {
    /// The first blocking failure.
    pub(crate) fn blocked(&self) -> Option<&GateFailure> {
        self.failures.iter().find(|f| f.blocking)
    }
}

/// Runs the `gates` of `node` over `state`; see the module docs.
pub(crate) fn check_gates(node: &str, gates: &[Gate], state: &State) -> GateOutcome {
    let failures: Vec<GateFailure> = gates
        .iter()
        .filter_map(|gate| {
            let result = match &gate.check {
                GateCheck::State(condition) if condition.holds(state) => Ok(()),
                GateCheck::State(condition) => Err(format!(
                    "the state does not pass {}",
                    serde_json::to_string(condition).unwrap_or_default()
                )),
                GateCheck::Custom(check) => check.check(state),
            };
            result.err().map(|reason| GateFailure {
                gate: gate.name.clone(),
                node: node.to_owned(),
                reason,
                blocking: gate.blocking,
            })
        })
        .collect();
    let mut outcome = GateOutcome {
        failures,
        updates: StateDelta::default(),
    };
    let record = |f: &GateFailure| json!({"gate": f.gate, "node": f.node, "reason": f.reason});
    match outcome.blocked() {
        Some(failure) => outcome.updates.set(GATE_BLOCKED, record(failure)),
        None => {
            let set_here = state
                .get(GATE_BLOCKED)
                .and_then(|b| b.get("node"))
                .is_some_and(|n| n == node);
            if set_here {
                outcome.updates.delete(GATE_BLOCKED);
            }
        }
    }
    let warnings: Vec<Value> = outcome
        .failures
        .iter()
        .filter(|f| !f.blocking)
        .map(record)
        .collect();
    if !warnings.is_empty() {
        outcome.updates.set(GATE_WARNINGS, Value::Array(warnings));
    }
    outcome
}
