//! The routing decision: a pure function of the state and the router's configuration.
//!
//! [`decide`] never changes the state; it returns the [`Routing`]: where to go, why, and the
//! updates to merge (the output keys, one decision record for `decisions`, and `gate_blocked`
//! deleted when the decision sends work to a gate's recovery node). Priorities, first match
//! wins:
//!
//! 1. `escalate_to_human` is truthy, or `agent_failure` is set → escalate;
//! 2. circular logic: the trailing exchange (`trailing_exchange`) counts more than
//!    `max_exchanges` hand-overs → escalate;
//! 3. `gate_blocked` names a gate → that gate's recovery node;
//! 4. otherwise the natural successor of the node that just ran, or the end.
//!
//! A node name that is not one of the router's nodes (the node that ran, a successor, a
//! recovery node) is logged and routes to escalation — a misconfigured graph stops for a
//! human instead of crashing or wandering.

use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::config::{END, ESCALATE, RouterConfig, RouterMode, Successor};
use super::exchange::{Exchange, trailing_exchange};
use super::record::rfc3339;
use crate::condition::{Condition, is_truthy};
use crate::decisions::DecisionRecord;
use crate::state::{Key, State, StateDelta, StateWrite};

/// The flag an agent sets to ask for a human.
pub(crate) const ESCALATE_FLAG: &str = "escalate_to_human";
/// The flag set when an agent failed for good (`{node, error, attempts}`).
pub(crate) const FAILURE_FLAG: &str = "agent_failure";
/// Set by a failed blocking gate: `{gate, node, reason}`.
pub(crate) const GATE_BLOCKED: &str = "gate_blocked";
pub(crate) use crate::reducer::{DECISIONS, MESSAGES};

/// The router's output keys.
pub mod keys {
    /// The next node, [`END`](super::END) or [`ESCALATE`](super::ESCALATE).
    pub(crate) const ROUTING_DECISION: &str = "routing_decision";
    /// Why.
    pub(crate) const ROUTING_RATIONALE: &str = "routing_rationale";
    /// Hand-overs in the trailing exchange.
    pub(crate) const EXCHANGE_COUNT: &str = "exchange_count";
    /// Whether the trailing exchange is circular.
    pub(crate) const CIRCULAR_LOGIC_DETECTED: &str = "circular_logic_detected";
    /// Whether the decision escalates.
    pub(crate) const ESCALATION_TRIGGERED: &str = "escalation_triggered";
}

/// Where the run goes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "to", content = "node", rename_all = "snake_case")]
pub enum Route {
    /// To this node.
    Node(String),
    /// The run ends.
    End,
    /// Stop for a human.
    Escalate,
}

/// Which name in the configuration was not a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NameRole {
    /// The node that just ran.
    Current,
    /// A natural successor.
    Successor,
    /// A gate's recovery node.
    Recovery,
}

/// Why the router decided as it did.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Reason {
    /// `escalate_to_human` was set (its value, when it is a text, says why).
    HumanRequested {
        /// The flag's value.
        flag: Value,
    },
    /// An agent failed for good.
    AgentFailed {
        /// The `agent_failure` value.
        failure: Value,
    },
    /// Two agents handed work back and forth too often.
    CircularLogic {
        /// The exchange.
        exchange: Exchange,
    },
    /// A blocking gate failed; its recovery node takes over.
    GateBlocked {
        /// The gate.
        gate: String,
        /// Why it failed.
        reason: String,
    },
    /// A blocked gate has no recovery node.
    NoRecovery {
        /// The gate.
        gate: String,
    },
    /// The natural successor of the node that ran.
    Successor,
    /// The node that ran has no successor: the end.
    NoSuccessor,
    /// A name in the configuration is not a node.
    UnknownNode {
        /// The name.
        name: String,
        /// Where it was found.
        role: NameRole,
    },
}

/// A decision and the updates that record it.
#[derive(Debug, Clone, PartialEq)]
pub struct Routing {
    /// Where the run goes.
    pub route: Route,
    /// Why.
    pub(crate) reason: Reason,
    /// The trailing exchange, if any.
    pub(crate) exchange: Option<Exchange>,
    /// The updates to merge (per-key reducers: `decisions` appends): the output keys and
    /// the decision record, in the one form the state keeps it ([`record`](Self::record)).
    pub updates: StateDelta,
}

impl Routing {
    /// The `routing_decision` value: the node, `END` or `ESCALATE`.
    pub(crate) fn decision(&self) -> &str {
        match &self.route {
            Route::Node(node) => node,
            Route::End => END,
            Route::Escalate => ESCALATE,
        }
    }

    /// The rationale in words: the `routing_rationale` the updates write (`None` when they
    /// were taken).
    #[cfg(test)]
    pub(crate) fn rationale(&self) -> Option<&str> {
        self.updates.iter().rev().find_map(|write| match write {
            StateWrite::Replace { key, value } if key == keys::ROUTING_RATIONALE => value.as_str(),
            _ => None,
        })
    }

    /// The decision record the updates append to `decisions` (`None` when they hold none:
    /// they were taken).
    pub fn record(&self) -> Option<DecisionRecord> {
        DecisionRecord::deserialize(self.record_value()?).ok()
    }

    /// The decision record's JSON object in the updates.
    pub(crate) fn record_value(&self) -> Option<&Value> {
        self.updates.iter().rev().find_map(|write| match write {
            StateWrite::Replace { key, value } if key == DECISIONS => match value {
                Value::Array(items) => items.last(),
                one => Some(one),
            },
            StateWrite::Append { key, items } if key == DECISIONS => items.last(),
            _ => None,
        })
    }
}

/// Whether the router is consulted after a node: always in active mode; in passive mode only
/// when a flag is set, a gate is blocked or the trailing exchange is circular.
pub(crate) fn consults(config: &RouterConfig, state: &State) -> bool {
    config.mode == RouterMode::Active
        || state.get(ESCALATE_FLAG).is_some_and(is_truthy)
        || state.get(FAILURE_FLAG).is_some_and(is_truthy)
        || state.get(GATE_BLOCKED).is_some_and(is_truthy)
        || exchange(config, state).is_some_and(|e| e.count > config.max_exchanges)
}

fn exchange(config: &RouterConfig, state: &State) -> Option<Exchange> {
    let messages = state.get(MESSAGES)?.as_array()?;
    trailing_exchange(messages, &config.topic_field)
}

/// Decides where the run goes after node `current` ran; see the module docs.
pub fn decide(state: &State, config: &RouterConfig, current: &str, now: SystemTime) -> Routing {
    let exchange = exchange(config, state);
    let (route, reason) = choose(state, config, current, exchange.as_ref());
    if let Reason::UnknownNode { name, role } = &reason {
        tracing::warn!(router = %config.name, %name, ?role, "routing to an unknown node; escalating");
    }
    let rationale = rationale(&reason, current, config);
    let summary = match &route {
        Route::Node(node) => format!("{current} → {node}"),
        Route::End => format!("{current} → end"),
        Route::Escalate => format!("{current} → escalate to a human"),
    };
    let mut related_artifacts = latest_artifacts(state);
    if let Reason::GateBlocked { gate, .. } | Reason::NoRecovery { gate } = &reason {
        related_artifacts.push(gate.clone());
    }
    // The record keeps a copy of the rationale (of its length: it stays in the state as
    // long as the run); `routing_rationale` takes the text itself (the next decision
    // replaces it).
    let record = DecisionRecord {
        agent: config.name.clone(),
        summary,
        rationale: rationale.clone(),
        timestamp: rfc3339(now),
        related_artifacts,
    };
    let circular = matches!(reason, Reason::CircularLogic { .. });
    let decision = match &route {
        Route::Node(node) => node.as_str(),
        Route::End => END,
        Route::Escalate => ESCALATE,
    };
    let count = exchange.as_ref().map_or(0, |e| e.count);
    let mut updates = Vec::with_capacity(7);
    updates.extend([
        replace(keys::ROUTING_DECISION, Value::String(decision.to_owned())),
        replace(keys::ROUTING_RATIONALE, Value::String(rationale)),
        replace(keys::EXCHANGE_COUNT, Value::from(count)),
        replace(keys::CIRCULAR_LOGIC_DETECTED, Value::Bool(circular)),
        replace(
            keys::ESCALATION_TRIGGERED,
            Value::Bool(route == Route::Escalate),
        ),
    ]);
    if matches!(reason, Reason::GateBlocked { .. }) {
        // The recovery node takes the work; the gate is checked again when its node reruns.
        updates.push(StateWrite::Delete {
            key: Key::Borrowed(GATE_BLOCKED),
        });
    }
    updates.push(replace(DECISIONS, Value::Array(vec![record.into_json()])));
    Routing {
        route,
        reason,
        exchange,
        updates: StateDelta::from(updates),
    }
}

/// A replace of one of the router's keys (fixed in the program: the write shares the text).
fn replace(key: &'static str, value: Value) -> StateWrite {
    StateWrite::Replace {
        key: Key::Borrowed(key),
        value,
    }
}

fn choose(
    state: &State,
    config: &RouterConfig,
    current: &str,
    exchange: Option<&Exchange>,
) -> (Route, Reason) {
    if let Some(flag) = state.get(ESCALATE_FLAG).filter(|v| is_truthy(v)) {
        return (
            Route::Escalate,
            Reason::HumanRequested { flag: flag.clone() },
        );
    }
    if let Some(failure) = state.get(FAILURE_FLAG).filter(|v| is_truthy(v)) {
        let failure = failure.clone();
        return (Route::Escalate, Reason::AgentFailed { failure });
    }
    if let Some(exchange) = exchange.filter(|e| e.count > config.max_exchanges) {
        let exchange = exchange.clone();
        return (Route::Escalate, Reason::CircularLogic { exchange });
    }
    if let Some(blocked) = state.get(GATE_BLOCKED).filter(|v| is_truthy(v)) {
        let gate = blocked
            .get("gate")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let reason = blocked
            .get("reason")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        return match config.recovery.get(&gate) {
            None => (Route::Escalate, Reason::NoRecovery { gate }),
            Some(node) => to_node(
                config,
                node,
                NameRole::Recovery,
                Reason::GateBlocked { gate, reason },
            ),
        };
    }
    successor(state, config, current)
}

/// Priority 4 alone: the natural successor of `current` (a conditional one tested on
/// `state`), the end, or escalation when a name is not a node. Passive mode routes by it.
pub fn successor(state: &State, config: &RouterConfig, current: &str) -> (Route, Reason) {
    if !config.knows(current) {
        let name = current.to_owned();
        let role = NameRole::Current;
        return (Route::Escalate, Reason::UnknownNode { name, role });
    }
    let next = match config.successors.get(current) {
        None => None,
        Some(Successor::Node(node)) => Some(node.as_str()),
        Some(Successor::Branches(branches)) => branches
            .iter()
            .find(|b| b.when.as_ref().is_none_or(|c: &Condition| c.holds(state)))
            .map(|b| b.to.as_str()),
    };
    match next {
        None => (Route::End, Reason::NoSuccessor),
        Some(END) => (Route::End, Reason::Successor),
        Some(node) => to_node(config, node, NameRole::Successor, Reason::Successor),
    }
}

fn to_node(config: &RouterConfig, node: &str, role: NameRole, reason: Reason) -> (Route, Reason) {
    if config.knows(node) {
        (Route::Node(node.to_owned()), reason)
    } else {
        let name = node.to_owned();
        (Route::Escalate, Reason::UnknownNode { name, role })
    }
}

fn rationale(reason: &Reason, current: &str, config: &RouterConfig) -> String {
    match reason {
        Reason::HumanRequested {
            flag: Value::String(why),
        } => {
            format!("`{current}` asked for a human: {why}")
        }
        Reason::HumanRequested { .. } => format!("`{current}` asked for a human"),
        Reason::AgentFailed { failure } => {
            let node = failure
                .get("node")
                .and_then(Value::as_str)
                .unwrap_or(current);
            match failure.get("error").and_then(Value::as_str) {
                Some(error) => format!("`{node}` failed for good: {error}"),
                None => format!("`{node}` failed for good"),
            }
        }
        Reason::CircularLogic { exchange } => {
            let topic = match &exchange.topic {
                Value::Null => String::new(),
                Value::String(topic) => format!(" on `{topic}`"),
                other => format!(" on {other}"),
            };
            format!(
                "Circular logic: `{}` and `{}` exchanged work {} times{topic} (more than {}); a \
                 human must decide",
                exchange.pair.0, exchange.pair.1, exchange.count, config.max_exchanges
            )
        }
        Reason::GateBlocked { gate, reason } => {
            format!("Gate `{gate}` is blocked ({reason}); its recovery node takes over")
        }
        Reason::NoRecovery { gate } => {
            format!("Gate `{gate}` is blocked and declares no recovery node")
        }
        Reason::Successor => format!("The natural successor of `{current}`"),
        Reason::NoSuccessor => format!("`{current}` has no successor: the work is done"),
        Reason::UnknownNode { name, role } => {
            let role = match role {
                NameRole::Current => "the node that ran",
                NameRole::Successor => "the successor of the node that ran",
                NameRole::Recovery => "the recovery node",
            };
            format!("`{name}`, {role}, is not a node of this graph; a human must look")
        }
    }
}

/// The `artifacts` named by the latest message, if it names any.
fn latest_artifacts(state: &State) -> Vec<String> {
    state
        .get(MESSAGES)
        .and_then(Value::as_array)
        .and_then(|messages| messages.last())
        .and_then(|message| message.get("artifacts"))
        .and_then(Value::as_array)
        .map(|items| {
            items
                .iter()
                .filter_map(|item| item.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}
