//! The routing control plane: a Scrum-Master router that decides where a graph goes next.
//!
//! The pieces, bottom up (each module imports only those above it):
//!
//! - [`Condition`] (the crate's [`condition`](crate::condition) module): the state tests of
//!   conditional successors and gates, shared with graph edges.
//! - `config`: the [`RouterConfig`] — nodes, natural successors (plain or conditional),
//!   recovery nodes per gate, the topic field, the exchange limit, passive or active mode.
//! - `exchange`: the trailing exchange between two agents on one topic, from `messages`.
//! - `record`: [`DecisionRecord`]s and the JSONL [`DecisionLog`].
//! - [`decide`](mod@decide): [`decide()`], the pure decision (state + config → route +
//!   updates), by priority: escalation / agent failure, circular logic (more than
//!   `max_exchanges`), a blocked gate's recovery node, the natural successor or the end.
//! - `gate`: quality gates (a state test or a pluggable [`QualityCheck`]), blocking or
//!   advisory.
//! - `retry`: capped exponential [`Backoff`] for transiently failing nodes
//!   ([`Retrying`] wraps a node), and the failure flag of a node that failed for good.
//! - `health`: exchange counts per pair, time per node, idle nodes, cycle time.
//! - `plane`: the [`ControlPlane`] in a graph — the router on every edge, gates checked
//!   after each node, decisions logged and handed to observers (the checkpointer).
//! - [`file`](mod@file): `agent_class: RouterAgent` in workflow files, mapped onto the
//!   pieces above ([`RouterAgent`], `build_router`).
//!
//! The router only ever returns updates; the executor merges them with the per-key reducers
//! of [`crate::reducer`] (`decisions` and `messages` append).
//!
//! ```
//! use engine::route::{decide, RouterConfig, Route};
//! use engine::State;
//! use serde_json::json;
//! use std::time::SystemTime;
//!
//! let config = RouterConfig::new(["dev", "tea"], [("dev", "tea")]);
//! let mut state = State::default();
//! let routing = decide(&state, &config, "dev", SystemTime::now());
//! assert_eq!(routing.route, Route::Node("tea".into()));
//! state.set("escalate_to_human", json!("Which database?"));
//! let routing = decide(&state, &config, "dev", SystemTime::now());
//! assert_eq!(routing.route, Route::Escalate);
//! state.apply(&routing.updates);
//! assert_eq!(state.get("escalation_triggered"), Some(&json!(true)));
//! ```

pub(crate) mod config;
pub mod decide;
pub(crate) mod exchange;
pub mod file;
pub(crate) mod gate;
pub(crate) mod health;
pub(crate) mod plane;
pub(crate) mod record;
pub(crate) mod retry;
#[cfg(test)]
mod tests;

pub use crate::condition::Condition;
pub use crate::decisions::DecisionRecord;
pub use config::{Branch, END, ESCALATE, RouterConfig, RouterMode};
pub use decide::{Route, Routing, decide, successor};
pub use exchange::Exchange;
pub use file::RouterAgent;
pub use gate::{Gate, GateCheck, QualityCheck};
pub(crate) use health::HealthObserver;
pub use health::{HEALTH_TOPIC, HealthReport, PairCount};
pub use plane::{ControlPlane, Observing, RoutingObserver};
pub use record::{DecisionLog, DecisionLogError, rfc3339};
pub use retry::{Backoff, Exhausted, Retrying, retry};
