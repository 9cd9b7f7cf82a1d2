//! The control plane in a graph: the router on every edge.
//!
//! A [`ControlPlane`] holds the router's configuration, the quality gates of each node, the
//! reducers and the decision log. [`ControlPlane::graph`] builds a graph whose every node
//! leaves through the plane ([`RoutedEdge`]): after a node finishes, the edge checks the
//! node's gates, then — in active mode always, in passive mode only when [`consults`] says
//! something is wrong — runs [`decide`] and merges its updates through the reducers as the
//! router's own step (an event authored by the router, a line in the decision log, a call to
//! each [`RoutingObserver`] such as the checkpointer). In passive mode an untroubled
//! transition follows the natural successor without a decision record. When nothing would
//! see the router's step as one — no event sink, no parallel branch recording its writes, no
//! observer — the router makes no frame and no event: its writes go straight into the state,
//! which ends the same.
//!
//! An escalation ends the graph with `escalation_triggered` set; the durable runner turns
//! that into the `awaiting_human` interrupt. A node's own `escalate` action would end the
//! graph past the router, off the record: each node is wrapped to turn it into the escalation flag,
//! which the router escalates like any other.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use async_trait::async_trait;
use serde_json::Value;

use super::config::RouterConfig;
use super::decide::{ESCALATE_FLAG, Route, Routing, consults, decide, successor};
use super::gate::{Gate, check_gates};
use super::record::DecisionLog;
use crate::flow::{
    Agent, Callbacks, Control, Edge, Event, EventKind, FlowError, Graph, GraphBuilder, GraphError,
    InvocationContext, Router, Target,
};
use crate::reducer::Reducers;
use crate::state::StateDelta;

/// Sees every routing decision (the checkpointer stores one after each); awaited before the
/// run goes on.
#[async_trait]
pub trait RoutingObserver: Send + Sync {
    /// The router decided `routing` after node `from` (its `updates` as the reducers
    /// merged them: the writes the decision made); `writes` are the state writes applied
    /// since the node's record (the gates' and the decision's, as the run's node observers
    /// are handed them: empty when the run has none). An error stops the run.
    async fn routed(
        &self,
        ctx: &InvocationContext,
        from: &str,
        routing: &Routing,
        writes: StateDelta,
    ) -> Result<(), FlowError>;

    /// The router let the run follow node `from`'s natural successor without a decision
    /// (passive mode, nothing wrong); awaited before the run goes on, as
    /// [`routed`](Self::routed) is. An error stops the run.
    async fn passed(&self, _ctx: &InvocationContext, _from: &str) -> Result<(), FlowError> {
        Ok(())
    }
}

/// The router, gates, reducers and decision log of one graph; see the module docs.
pub struct ControlPlane {
    config: RouterConfig,
    gates: BTreeMap<String, Vec<Gate>>,
    reducers: Reducers,
    log: Option<DecisionLog>,
    observers: Mutex<Vec<Arc<dyn RoutingObserver>>>,
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("config", &self.config)
            .field("gates", &self.gates)
            .field("log", &self.log)
            .finish_non_exhaustive()
    }
}

impl ControlPlane {
    /// A plane routing by `config`, with the default reducers and no gates or log.
    pub fn new(config: RouterConfig) -> Self {
        Self {
            config,
            gates: BTreeMap::new(),
            reducers: Reducers::default(),
            log: None,
            observers: Mutex::new(Vec::new()),
        }
    }

    /// With `gates` checked after node `node`.
    pub fn with_gates(mut self, node: impl Into<String>, gates: Vec<Gate>) -> Self {
        self.gates.insert(node.into(), gates);
        self
    }

    /// Writing each decision to `log`.
    pub fn with_log(mut self, log: DecisionLog) -> Self {
        self.log = Some(log);
        self
    }

    /// The router's configuration.
    pub(crate) fn config(&self) -> &RouterConfig {
        &self.config
    }

    /// The reducers updates are merged with.
    pub(crate) fn reducers(&self) -> &Reducers {
        &self.reducers
    }

    /// Adds `observer` of every decision until the returned guard is dropped (a plane
    /// outlives the runs that observe it).
    pub fn observe(&self, observer: Arc<dyn RoutingObserver>) -> Observing<'_> {
        self.observers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(observer.clone());
        Observing {
            plane: self,
            observer,
        }
    }

    /// The observers of its decisions now.
    fn observers(&self) -> Vec<Arc<dyn RoutingObserver>> {
        self.observers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The nodes of `graph` that leave through this plane (each of them, for a graph built by
    /// [`ControlPlane::graph`]).
    pub(crate) fn routed_nodes(&self, graph: &Graph) -> Vec<String> {
        graph
            .edges()
            .into_iter()
            .filter(|(_, edge)| match edge {
                Some(Edge::When(router)) => router
                    .as_any()
                    .and_then(|any| any.downcast_ref::<RoutedEdge>())
                    .is_some_and(|routed| std::ptr::eq(routed.plane.as_ref(), self)),
                _ => false,
            })
            .map(|(node, _)| node.to_owned())
            .collect()
    }

    /// A graph `name` of `nodes` starting at `start`, every node leaving through this plane.
    pub fn graph(
        self: &Arc<Self>,
        name: impl Into<String>,
        nodes: Vec<Arc<dyn Agent>>,
        start: &str,
    ) -> Result<Graph, GraphError> {
        self.builder(name, nodes, start).build()
    }

    /// [`ControlPlane::graph`] still to be finished (its step limit, say).
    pub fn builder(
        self: &Arc<Self>,
        name: impl Into<String>,
        nodes: Vec<Arc<dyn Agent>>,
        start: &str,
    ) -> GraphBuilder {
        let mut builder = Graph::builder(name).start(start);
        for node in nodes {
            let from = node.name().to_owned();
            builder = builder.node(Arc::new(RoutedNode(node))).route(
                from,
                Arc::new(RoutedEdge {
                    plane: self.clone(),
                }),
            );
        }
        builder
    }

    /// The plane whose edges leave `graph`'s nodes (a graph built by [`ControlPlane::graph`]).
    pub(crate) fn of(graph: &Graph) -> Option<Arc<ControlPlane>> {
        graph.edges().into_iter().find_map(|(_, edge)| match edge {
            Some(Edge::When(router)) => router
                .as_any()
                .and_then(|any| any.downcast_ref::<RoutedEdge>())
                .map(|routed| routed.plane.clone()),
            _ => None,
        })
    }

    /// Merges `updates` into the run's state through the reducers, as writes of `ctx` (their
    /// values move into the writes); returns the writes.
    fn merge(&self, ctx: &InvocationContext, updates: StateDelta) -> StateDelta {
        let writes = self.reducers.into_writes(updates);
        ctx.apply(&writes);
        writes
    }

    /// The router's frame under `ctx`, made in `slot` the first time it is needed.
    fn frame<'f>(
        &self,
        ctx: &InvocationContext,
        slot: &'f mut Option<InvocationContext>,
    ) -> &'f InvocationContext {
        slot.get_or_insert_with(|| ctx.child(&self.config.name, &Callbacks::new()))
    }

    /// Where the run goes after node `from` finished; see the module docs.
    pub(crate) async fn route_after(
        &self,
        ctx: &InvocationContext,
        from: &str,
    ) -> Result<Target, FlowError> {
        let observers = self.observers();
        let seen = !observers.is_empty() || !ctx.writes_unseen();
        let mut frame = None;
        if let Some(gates) = self.gates.get(from) {
            let outcome = ctx.state().with(|s| check_gates(from, gates, s));
            if !outcome.updates.is_empty() {
                let writes = self.reducers.into_writes(outcome.updates);
                if seen {
                    let router = self.frame(ctx, &mut frame);
                    router.write(writes);
                    let failed: Vec<&str> =
                        outcome.failures.iter().map(|f| f.gate.as_str()).collect();
                    let note = format!("gates of `{from}` failed: {}", failed.join(", "));
                    router.emit(Event::new(EventKind::StateUpdate).with_content(note))?;
                } else {
                    ctx.state().apply_owned(writes);
                }
            }
        }
        // The natural successor when the router is not consulted and nothing escalates.
        let natural = ctx.state().with(|s| {
            if consults(&self.config, s) {
                return None;
            }
            Some(successor(s, &self.config, from).0).filter(|route| *route != Route::Escalate)
        });
        if let Some(natural) = natural {
            for observer in &observers {
                observer.passed(ctx, from).await?;
            }
            return Ok(target(natural));
        }
        let mut routing = ctx
            .state()
            .with(|s| decide(s, &self.config, from, SystemTime::now()));
        let logged = self.log.as_ref().map(|log| (log, routing.record()));
        // The event's text, when there is an event.
        let summary = seen.then(|| {
            routing
                .record_value()
                .and_then(|record| record.get("summary"))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        });
        // The updates move into the writes (no copy): into the state too when no observer
        // will see them; observers see them as merged.
        let updates = std::mem::take(&mut routing.updates);
        match summary {
            None => ctx.state().apply_owned(self.reducers.into_writes(updates)),
            Some(summary) => {
                let router = self.frame(ctx, &mut frame);
                if observers.is_empty() {
                    router.write(self.reducers.into_writes(updates));
                } else {
                    routing.updates = self.merge(router, updates);
                }
                router.emit(Event::new(EventKind::StateUpdate).with_content(summary))?;
            }
        }
        if let Some((log, record)) = logged {
            let record = record.ok_or_else(|| {
                FlowError::Sink("The router's decision has no record to log".to_owned())
            })?;
            log.append(&record)
                .map_err(|e| FlowError::Sink(e.to_string()))?;
        }
        if !observers.is_empty() {
            let router = self.frame(ctx, &mut frame);
            let writes = ctx.state().take_journal();
            for observer in observers {
                observer
                    .routed(router, from, &routing, writes.clone())
                    .await?;
            }
        }
        Ok(target(routing.route))
    }
}

/// Keeps an observer registered with a [`ControlPlane`]; dropping it unregisters it.
pub struct Observing<'p> {
    plane: &'p ControlPlane,
    observer: Arc<dyn RoutingObserver>,
}

impl std::fmt::Debug for Observing<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Observing")
    }
}

impl Drop for Observing<'_> {
    fn drop(&mut self) {
        self.plane
            .observers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|o| !Arc::ptr_eq(o, &self.observer));
    }
}

fn target(route: Route) -> Target {
    match route {
        Route::Node(node) => Target::Node(node),
        Route::End | Route::Escalate => Target::End,
    }
}

/// The edge out of every node of a plane's graph.
#[derive(Debug)]
pub(crate) struct RoutedEdge {
    plane: Arc<ControlPlane>,
}

#[async_trait]
impl Router for RoutedEdge {
    async fn route(&self, ctx: &InvocationContext, from: &str) -> Result<Target, FlowError> {
        self.plane.route_after(ctx, from).await
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }
}

/// A node of a plane's graph: its `escalate` action becomes the escalation flag, so the
/// router decides the escalation (a decision record, `escalation_triggered`) instead of the
/// action ending the graph past it.
#[derive(Debug)]
struct RoutedNode(Arc<dyn Agent>);

#[async_trait]
impl Agent for RoutedNode {
    fn name(&self) -> &str {
        self.0.name()
    }

    fn description(&self) -> &str {
        self.0.description()
    }

    fn class(&self) -> &str {
        self.0.class()
    }

    fn sub_agents(&self) -> Vec<Arc<dyn Agent>> {
        self.0.sub_agents()
    }

    fn callbacks(&self) -> &Callbacks {
        self.0.callbacks()
    }

    async fn run(&self, ctx: &InvocationContext) -> Result<Control, FlowError> {
        match self.0.run(ctx).await? {
            Control::Escalate => {
                ctx.set_state(ESCALATE_FLAG, serde_json::Value::Bool(true));
                Ok(Control::Continue)
            }
            control => Ok(control),
        }
    }
}
