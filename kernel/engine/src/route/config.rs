//! What a router knows about its graph: the nodes, the natural successors, the gates'
//! recovery nodes, the topic of an exchange and its mode.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::condition::Condition;

/// When the router is consulted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RouterMode {
    /// Every transition goes through the router.
    #[default]
    Active,
    /// Normal edges route; the router is consulted only on escalation, agent failure, a
    /// blocked gate or a conflict (circular logic).
    Passive,
}

/// The `routing_decision` of a run that ends.
pub const END: &str = "END";
/// The `routing_decision` of a run that escalates to a human.
pub const ESCALATE: &str = "ESCALATE";

/// A router's configuration (the `router:` section of a workflow file).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RouterConfig {
    /// The router's own name (the `agent` of its decision records).
    pub(crate) name: String,
    /// When it is consulted.
    pub(crate) mode: RouterMode,
    /// Every node it may route to.
    pub(crate) nodes: BTreeSet<String>,
    /// The natural successor of each node; a node without one ends the run.
    pub(crate) successors: BTreeMap<String, Successor>,
    /// The recovery node of each quality gate, by gate name.
    pub(crate) recovery: BTreeMap<String, String>,
    /// The message field that names an exchange's topic.
    pub(crate) topic_field: String,
    /// Exchanges between the same pair on the same topic allowed before it is circular
    /// (more than this escalates).
    pub(crate) max_exchanges: u32,
}

impl Default for RouterConfig {
    fn default() -> Self {
        Self {
            name: "router".to_owned(),
            mode: RouterMode::Active,
            nodes: BTreeSet::new(),
            successors: BTreeMap::new(),
            recovery: BTreeMap::new(),
            topic_field: "topic".to_owned(),
            max_exchanges: 3,
        }
    }
}

impl RouterConfig {
    /// A router over `nodes` with the successor map `successors` (pairs `from → to`).
    pub fn new<'a>(
        nodes: impl IntoIterator<Item = &'a str>,
        successors: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Self {
        Self {
            nodes: nodes.into_iter().map(str::to_owned).collect(),
            successors: successors
                .into_iter()
                .map(|(from, to)| (from.to_owned(), Successor::Node(to.to_owned())))
                .collect(),
            ..Self::default()
        }
    }

    /// This router with recovery node `node` for gate `gate`.
    pub fn with_recovery(mut self, gate: impl Into<String>, node: impl Into<String>) -> Self {
        self.recovery.insert(gate.into(), node.into());
        self
    }

    /// This router with the conditional successor `branches` after node `from`.
    pub fn with_branches(mut self, from: impl Into<String>, branches: Vec<Branch>) -> Self {
        self.successors
            .insert(from.into(), Successor::Branches(branches));
        self
    }

    /// This router in `mode`.
    pub fn with_mode(mut self, mode: RouterMode) -> Self {
        self.mode = mode;
        self
    }

    /// Whether `name` is a node it may route to.
    pub(crate) fn knows(&self, name: &str) -> bool {
        self.nodes.contains(name)
    }
}

/// Where a node's work goes next when nothing else decides.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub(crate) enum Successor {
    /// Always this node (or [`END`]).
    Node(String),
    /// The first branch whose condition holds (a branch without one always does); the end
    /// when none does.
    Branches(Vec<Branch>),
}

/// One conditional branch of a `Successor`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Branch {
    /// The state test (none: always).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) when: Option<Condition>,
    /// The node (or [`END`]).
    pub(crate) to: String,
}

impl Branch {
    /// To `to` when `when` holds.
    pub fn when(when: Condition, to: impl Into<String>) -> Self {
        Self {
            when: Some(when),
            to: to.into(),
        }
    }

    /// To `to` always.
    pub fn otherwise(to: impl Into<String>) -> Self {
        Self {
            when: None,
            to: to.into(),
        }
    }
}
