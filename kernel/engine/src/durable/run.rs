//! Durable runs of a graph: a checkpoint after every node, resume, time travel, and the
//! human interrupt.
//!
//! [`run_durable`] runs a graph with a [`Checkpointer`] watching it: a checkpoint of the
//! initial state (`__start__`), one after every node **at every depth** of nested sequences,
//! loops and graphs (the node's writes, and its path: per level from the root down the
//! graph, the node, the graph's steps so far and its loop iteration, in the checkpoint's
//! metadata as `path`, with the node's `control` when it was not `continue`), one after
//! every routing decision of the root's router (the router's writes, naming the node that
//! runs next), and one for a human's answer. A top-level node that leaves through the router
//! and the decision after it are one step, written as one chain of their two checkpoints in
//! one transaction ([`Store::put_chain`]): the node's checkpoint is held until its router
//! has decided (or let it pass without a decision, or the run stopped first), so a routed
//! step costs one transaction, as a plain one does. Inside a parallel group there is no
//! checkpoint: its branches run concurrently, so the group is checkpointed as one node of its
//! enclosing graph, and a crash inside it runs the whole group again. An escalation travelling up
//! through the enclosing containers is checkpointed once, at the node that escalated.
//!
//! Where a run continues ([`Start`]):
//!
//! - a new run starts at the graph's start node;
//! - a resumed run continues from its head checkpoint: its path becomes the run's
//!   [`ResumePoint`], so each enclosing container is re-entered at its own step and
//!   iteration (counts and limits as in an unbroken run) and, at the deepest level, the
//!   finished node's edge is followed — only the node that was running when the process
//!   died **re-executes** (side effects belong in idempotent tools); after a router
//!   checkpoint, the node it chose runs. A routed node counts as running until its step's
//!   transaction commits: killed between its end and its router's decision (a pure function
//!   of the state, taken at once), it runs again. Re-entered containers run their
//!   before-agent callbacks again (over the checkpoint's state);
//! - time travel resumes from an earlier checkpoint, and the new checkpoints branch from it;
//! - a run that stopped for a human (`awaiting_human`) resumes with the answer: it is recorded
//!   (`human_input`, a `human` message; the escalation flags cleared) in a `human` checkpoint,
//!   and **the node it escalated from runs again** (at its own step: redone, not added) with
//!   the answer in the state — the agent whose work was in question (or that asked, or failed)
//!   acts on the decision, then the router decides as usual. (Deciding again *after* that node
//!   would let its successor judge work done before the decision.) The `human` message also
//!   ends the exchange the router counted, so the same disagreement is not circular logic
//!   again at once.
//!
//! The run's status follows: `running` while it runs, then `completed`, `failed`,
//! `interrupted` when its caller cancelled it (Ctrl-C), or `awaiting_human` when the router
//! escalated (the question is its rationale). The run is
//! leased to this process from before its first write until it stops, however it stops.
//!
//! The root's own callbacks (a router's, a graph's, a sequence's or a loop's
//! `before_agent_callbacks` / `after_agent_callbacks`) run once per **run**, not once per
//! invocation: `before_agent` when the run starts (a resume — after a crash, a human's answer
//! or from an earlier checkpoint — continues a run that has started), `after_agent` when the
//! run completes — not when it stops for a human, fails or is cancelled, since it goes on
//! later. (Containers below the root, re-entered on resume, run theirs again, as above.) A
//! root that is wrapped (one agent, a parallel group) runs its callbacks as a node.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;
use bridge::CancellationToken;
use serde_json::{Value, json};

use super::StoreError;
use super::lease::{Lease, Owner};
use super::record::{CheckpointId, CheckpointRecord, NewCheckpoint, NewRun, RunStatus};
use super::store::Store;
use crate::flow::{
    Agent, Callback, CallbackContext, Callbacks, Control, FlowError, Graph, GraphError, Invocation,
    InvocationContext, NodeObserver, NodeRecord, Position, ResumeAction, ResumePoint, RunReport,
    run_workflow,
};
use crate::hook::HookAction;
use crate::route::decide::{ESCALATE_FLAG, FAILURE_FLAG, MESSAGES, keys};
use crate::route::file::RouterAgent;
use crate::route::{ControlPlane, HealthObserver, HealthReport, Route, Routing, RoutingObserver};
use crate::state::{State, StateDelta};

/// The node name of a run's first checkpoint (its initial state).
pub(crate) const START_NODE: &str = "__start__";
/// The node name of the checkpoint that records a human's answer.
pub(crate) const HUMAN_NODE: &str = "human";
/// The state key a human's answer is recorded under.
pub(crate) const HUMAN_INPUT: &str = "human_input";

/// A workflow's root as the graph a durable run drives, with the graph's control plane.
///
/// A router (`RouterAgent`) is driven through its graph and plane; a graph with a start node
/// (a graph, a sequence, a loop) as it is, so a checkpoint follows each of its top-level
/// nodes. Any other root (an LLM agent, a Python step, a parallel group) runs as the one node
/// of a sequence named like it: the run then has a checkpoint before and after it, and a
/// crash re-runs it whole.
pub struct DurableRoot {
    root: Arc<dyn Agent>,
    driven: Driven,
    plane: Option<Arc<ControlPlane>>,
}

/// How a [`DurableRoot`] reaches its graph.
enum Driven {
    Router,
    Graph,
    Wrapped(Box<Graph>),
}

impl std::fmt::Debug for DurableRoot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DurableRoot")
            .field("root", &self.root)
            .field("wrapped", &matches!(self.driven, Driven::Wrapped(_)))
            .field("routed", &self.plane.is_some())
            .finish()
    }
}

impl DurableRoot {
    /// The graph that drives `root`; see the type docs.
    pub fn new(root: Arc<dyn Agent>) -> Result<Self, GraphError> {
        let any = root.as_any();
        let (driven, plane) =
            if let Some(router) = any.and_then(|a| a.downcast_ref::<RouterAgent>()) {
                (Driven::Router, Some(router.plane().clone()))
            } else if let Some(graph) = any
                .and_then(|a| a.downcast_ref::<Graph>())
                .filter(|graph| graph.start_node().is_some())
            {
                (Driven::Graph, ControlPlane::of(graph))
            } else {
                let wrapper = Graph::sequential(root.name(), vec![root.clone()])?;
                (Driven::Wrapped(Box::new(wrapper)), None)
            };
        Ok(Self {
            root,
            driven,
            plane,
        })
    }

    /// The graph to hand [`run_durable`].
    pub fn graph(&self) -> &Graph {
        let any = self.root.as_any();
        let found = match &self.driven {
            Driven::Wrapped(wrapper) => Some(wrapper.as_ref()),
            Driven::Router => any
                .and_then(|a| a.downcast_ref::<RouterAgent>())
                .map(RouterAgent::graph),
            Driven::Graph => any.and_then(|a| a.downcast_ref::<Graph>()),
        };
        found.unwrap_or_else(|| unreachable!("`new` saw the root's type"))
    }

    /// Its control plane, when a router decides its edges.
    pub fn plane(&self) -> Option<&Arc<ControlPlane>> {
        self.plane.as_ref()
    }
}

/// Writes a checkpoint after every node (at every depth) and routing decision of one run.
///
/// The checkpoint of a top-level node that leaves through the router waits for the decision
/// after it, and the two go into the store as one chain in one transaction
/// ([`Store::put_chain`]): a routed step costs one transaction, as a plain one does.
pub(crate) struct Checkpointer {
    store: Arc<dyn Store>,
    lease: Lease,
    graph: String,
    cursor: Mutex<Cursor>,
    /// The top-level nodes whose checkpoint waits for the routing decision after them.
    routed: Vec<String>,
    /// Such a node's checkpoint, until the decision (or, when none comes, the next write).
    pending: Mutex<Option<Pending>>,
    /// Held through a write: checkpoints go in one at a time, each naming the one before.
    writing: tokio::sync::Mutex<()>,
}

/// A checkpoint still to write, owned.
struct Pending {
    node: String,
    writes: StateDelta,
    next: Vec<String>,
    metadata: Value,
}

impl Pending {
    fn checkpoint(&self) -> NewCheckpoint<'_> {
        NewCheckpoint::new(self.node.clone(), &self.writes)
            .next(self.next.clone())
            .metadata(self.metadata.clone())
    }
}

impl std::fmt::Debug for Checkpointer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkpointer")
            .field("run_id", &self.lease.run_id())
            .field("graph", &self.graph)
            .finish_non_exhaustive()
    }
}

/// Where the chain stands: the last checkpoint and the top-level step.
struct Cursor {
    parent: Option<CheckpointId>,
    graph_step: u64,
    iteration: u32,
    /// The last checkpoint was of a node that escalated.
    escalated: bool,
}

impl Checkpointer {
    /// Checkpoints of the run of `lease` for the nodes of graph `graph` and below, continuing
    /// from `parent`.
    pub(crate) fn new(
        store: Arc<dyn Store>,
        lease: Lease,
        graph: impl Into<String>,
        parent: Option<CheckpointId>,
    ) -> Self {
        Self {
            store,
            lease,
            graph: graph.into(),
            cursor: Mutex::new(Cursor {
                parent,
                graph_step: 0,
                iteration: 1,
                escalated: false,
            }),
            routed: Vec::new(),
            pending: Mutex::new(None),
            writing: tokio::sync::Mutex::new(()),
        }
    }

    /// Holding the checkpoint of each top-level node of `graph` that leaves through `plane`
    /// until the routing decision after it, to write both in one transaction. The plane
    /// must tell this checkpointer of every decision, or of none taken
    /// ([`RoutingObserver`]); whatever is still held when the run stops goes in with
    /// [`flush`](Self::flush).
    pub(crate) fn routed_by(mut self, graph: &Graph, plane: &Arc<ControlPlane>) -> Self {
        self.routed = plane.routed_nodes(graph);
        self
    }

    fn cursor(&self) -> MutexGuard<'_, Cursor> {
        self.cursor.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The last checkpoint written.
    pub(crate) fn head(&self) -> Option<CheckpointId> {
        self.cursor().parent
    }

    /// Writes a checkpoint after `node` that ran and wrote `writes` (after the one held for
    /// a routing decision, if any, in the same transaction).
    async fn write(
        &self,
        node: &str,
        writes: &StateDelta,
        next: Vec<String>,
        metadata: Value,
    ) -> Result<(), StoreError> {
        let checkpoint = NewCheckpoint::new(node, writes)
            .next(next)
            .metadata(metadata);
        self.write_after_pending(Some(checkpoint)).await
    }

    /// Writes the checkpoint held for a routing decision, if any, then `then`, as one chain.
    async fn write_after_pending(&self, then: Option<NewCheckpoint<'_>>) -> Result<(), StoreError> {
        let _turn = self.writing.lock().await;
        let pending = self
            .pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let chain: Vec<NewCheckpoint<'_>> = pending
            .as_ref()
            .map(Pending::checkpoint)
            .into_iter()
            .chain(then)
            .collect();
        if chain.is_empty() {
            return Ok(());
        }
        let parent = self.cursor().parent;
        let chain = chain
            .into_iter()
            .enumerate()
            .map(|(i, checkpoint)| {
                if i == 0 {
                    checkpoint.parent(parent)
                } else {
                    checkpoint
                }
            })
            .collect();
        let ids = self.store.put_chain(&self.lease, chain).await?;
        if let Some(head) = ids.last() {
            self.cursor().parent = Some(*head);
        }
        Ok(())
    }

    /// Writes the checkpoint still held for a routing decision that never came (the run
    /// stopped before its router decided); nothing when none is held.
    pub(crate) async fn flush(&self) -> Result<(), StoreError> {
        self.write_after_pending(None).await
    }

    /// Holds `checkpoint` for the routing decision after it (written first, should anything
    /// else be written before it), after writing any held before.
    async fn hold(&self, checkpoint: Pending) -> Result<(), StoreError> {
        self.flush().await?;
        *self.pending.lock().unwrap_or_else(PoisonError::into_inner) = Some(checkpoint);
        Ok(())
    }

    fn steps(&self) -> (u64, u32) {
        let cursor = self.cursor();
        (cursor.graph_step, cursor.iteration)
    }
}

fn sink_error(e: StoreError) -> FlowError {
    FlowError::Sink(e.to_string())
}

#[async_trait]
impl NodeObserver for Checkpointer {
    async fn node_finished(
        &self,
        _ctx: &InvocationContext,
        record: &NodeRecord,
    ) -> Result<(), FlowError> {
        let Some(path) = record.path.as_ref() else {
            return Ok(());
        };
        let Some(top) = path.first().filter(|top| top.graph == self.graph) else {
            return Ok(());
        };
        {
            let mut cursor = self.cursor();
            let escalated = record.control == Control::Escalate;
            if escalated && cursor.escalated {
                // The escalation of a node below, travelling up: resume after that node.
                return Ok(());
            }
            cursor.escalated = escalated;
            if path.len() == 1 {
                cursor.graph_step = record.step;
                cursor.iteration = record.iteration;
            }
        }
        let mut metadata = json!({
            "graph_step": top.step,
            "iteration": top.iteration.unwrap_or(1),
            "path": path,
        });
        if record.control != Control::Continue {
            metadata["control"] = json!(record.control);
        } else if path.len() == 1 && self.routed.contains(&record.node) {
            // Its router decides next: this checkpoint goes in with the decision's.
            let held = Pending {
                node: record.node.clone(),
                writes: record.writes.clone(),
                next: Vec::new(),
                metadata,
            };
            return self.hold(held).await.map_err(sink_error);
        }
        self.write(&record.node, &record.writes, Vec::new(), metadata)
            .await
            .map_err(sink_error)
    }
}

#[async_trait]
impl RoutingObserver for Checkpointer {
    async fn routed(
        &self,
        ctx: &InvocationContext,
        from: &str,
        routing: &Routing,
        writes: StateDelta,
    ) -> Result<(), FlowError> {
        let next = match &routing.route {
            Route::Node(node) => vec![node.clone()],
            Route::End | Route::Escalate => Vec::new(),
        };
        let (graph_step, iteration) = self.steps();
        let metadata = json!({
            "from": from,
            "decision": routing.decision(),
            "graph_step": graph_step,
            "iteration": iteration,
        });
        self.write(ctx.agent(), &writes, next, metadata)
            .await
            .map_err(sink_error)
    }

    async fn passed(&self, _ctx: &InvocationContext, _from: &str) -> Result<(), FlowError> {
        self.flush().await.map_err(sink_error)
    }
}

/// Where a durable run begins.
#[derive(Debug, Clone, PartialEq)]
pub enum Start {
    /// A new run of `workflow` (its state is the invocation's), recording `input`.
    New {
        /// The workflow's name or path, for `rlm flow runs`.
        workflow: String,
        /// The run's inputs, for the record.
        input: Value,
    },
    /// Continue an existing run.
    Resume {
        /// From this checkpoint instead of the run's head (time travel).
        from: Option<CheckpointId>,
        /// A human's answer to the question the run stopped on.
        answer: Option<String>,
        /// Take the run over from a holder that cannot be checked (another host).
        take_over: bool,
    },
}

/// Why a durable run could not start.
#[derive(Debug, thiserror::Error)]
pub enum DurableError {
    /// The checkpoint store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The run finished; nothing to resume.
    #[error(
        "Run `{0}` is completed; pass `--from-checkpoint ID` to run again from an earlier checkpoint"
    )]
    Completed(String),
    /// The run waits for a human and no answer was given.
    #[error("Run `{run}` is waiting for a human: {question}\nResume it with `--input \"...\"`")]
    NeedsInput {
        /// The run.
        run: String,
        /// The question.
        question: String,
    },
    /// An answer was given to a run that asked nothing.
    #[error("Run `{0}` is not waiting for a human; resume it without `--input`")]
    UnexpectedInput(String),
    /// An answer was given with a checkpoint to resume from at which nobody was asked.
    #[error(
        "Checkpoint {checkpoint} of run `{run}` (after `{node}`) asked no question; resume from \
         it without `--input`, or pick the checkpoint where the run stopped for a human \
         (`rlm flow history {run}`)"
    )]
    NothingAsked {
        /// The run.
        run: String,
        /// The checkpoint.
        checkpoint: CheckpointId,
        /// Its node.
        node: String,
    },
    /// The run has no checkpoint to continue from.
    #[error("Run `{0}` has no checkpoint to resume from")]
    NoCheckpoint(String),
}

/// What a durable run did.
#[derive(Debug)]
pub struct DurableReport {
    /// The workflow run's own report (its result and final state).
    pub run: RunReport,
    /// The status recorded for the run.
    pub status: RunStatus,
    /// The last checkpoint written.
    pub head: Option<CheckpointId>,
    /// Exchanges per pair, time per node, idle nodes and cycle time of this invocation.
    pub health: HealthReport,
}

/// Runs `graph` (whose routing goes through `plane`, if it has one) as run `run_id`, with a
/// checkpoint after every node; see the module docs. `invocation.state` is the new run's
/// initial state, or is replaced by the checkpoint's state when resuming.
///
/// The run is leased to this process from before its first write until it stops. When the
/// store's leases expire (PostgreSQL), the lease is renewed every third of its expiry while
/// the run goes on; should it be lost all the same (taken over after renewals failed for
/// longer than the expiry), the run is cancelled at once and ends with the store's
/// [`StoreError::LeaseLost`] or [`StoreError::LeaseExpired`], having written nothing more.
pub async fn run_durable(
    graph: &Graph,
    plane: Option<&Arc<ControlPlane>>,
    store: &Arc<dyn Store>,
    run_id: &str,
    start: Start,
    invocation: Invocation,
) -> Result<DurableReport, DurableError> {
    let owner = Owner::current();
    // A run of this process dropped before it finished may still be giving its lease up.
    settle_releases().await;
    let lease = match &start {
        Start::New { workflow, input } => {
            let run = NewRun::new(run_id, workflow.clone()).input(input.clone());
            store.create_run(&run, &owner).await?
        }
        Start::Resume { take_over, .. } => store.claim(run_id, &owner, *take_over).await?.lease,
    };
    let held = Held {
        store: store.clone(),
        lease: Some(lease.clone()),
    };
    let cancel = invocation.cancel.clone();
    let driving = drive(graph, plane, store, &lease, start, invocation);
    let result = match store.lease_expiry() {
        Some(expiry) => {
            // A task of its own: a node that keeps the run's task busy does not stop it.
            let heartbeat = tokio::spawn(keep_alive(store.clone(), lease.clone(), expiry, cancel));
            let _stop = AbortOnDrop(heartbeat);
            driving.await
        }
        None => driving.await,
    };
    match result {
        // A finished run released its lease with its final status.
        Ok(report) => {
            held.disarm();
            Ok(report)
        }
        // Otherwise the run is free for the next claimer at once, not only once this process
        // is gone (or its lease expired).
        Err(e) => {
            held.release().await;
            Err(e)
        }
    }
}

/// Everything [`run_durable`] does under the lease.
async fn drive(
    graph: &Graph,
    plane: Option<&Arc<ControlPlane>>,
    store: &Arc<dyn Store>,
    lease: &Lease,
    start: Start,
    invocation: Invocation,
) -> Result<DurableReport, DurableError> {
    let run_id = lease.run_id();
    let state = invocation.state.clone();
    let starts = matches!(start, Start::New { .. });
    let (checkpointer, resume) = match start {
        Start::New { .. } => {
            let checkpointer = Checkpointer::new(store.clone(), lease.clone(), graph.name(), None);
            let initial = state.with(State::to_writes);
            let next: Vec<String> = graph.start_node().map(str::to_owned).into_iter().collect();
            checkpointer
                .write(START_NODE, &initial, next, json!({}))
                .await?;
            (checkpointer, None)
        }
        Start::Resume { from, answer, .. } => {
            let head = resume_point(store.as_ref(), run_id, from, answer.is_some()).await?;
            let record = store.checkpoint(head).await?;
            state.reset(store.state_at(head).await?.state);
            let checkpointer =
                Checkpointer::new(store.clone(), lease.clone(), graph.name(), Some(head));
            let at = Resumed::read(store.as_ref(), graph, &record)?;
            {
                let mut cursor = checkpointer.cursor();
                cursor.graph_step = at.steps_done;
                cursor.iteration = at.iteration;
            }
            let resume = match answer {
                Some(answer) => {
                    let writes = record_answer(&state, plane, &answer);
                    let path = at.answered_path(graph.name());
                    let metadata = json!({
                        "from": at.from,
                        "graph_step": at.steps_done,
                        "iteration": at.iteration,
                        "path": path,
                    });
                    checkpointer
                        .write(HUMAN_NODE, &writes, Vec::new(), metadata)
                        .await?;
                    // The node it escalated from runs again, at its own step: redone, not added.
                    Some(ResumePoint {
                        path,
                        action: ResumeAction::Run,
                    })
                }
                None => at.point(graph, plane),
            };
            (checkpointer, resume)
        }
    };
    store.set_status(lease, &RunStatus::Running).await?;
    let checkpointer = Arc::new(match plane {
        Some(plane) => checkpointer.routed_by(graph, plane),
        None => checkpointer,
    });
    let _observing = plane.map(|plane| plane.observe(checkpointer.clone()));
    let node_names: Vec<String> = graph.nodes().iter().map(|n| n.name().to_owned()).collect();
    let health = Arc::new(HealthObserver::new(graph.name(), node_names));
    let mut invocation = invocation
        .with_observer(checkpointer.clone())
        .with_observer(health.clone());
    invocation.resume = resume;
    let callbacks = graph
        .callbacks()
        .iter()
        .map(|inner| {
            Arc::new(OncePerRun {
                inner: inner.clone(),
                starts,
            }) as Arc<dyn Callback>
        })
        .collect();
    let root = Root {
        graph,
        callbacks,
        // A routed run's health also goes in its event log; a plain graph's only in the report.
        health: plane.map(|_| health.clone()),
    };
    let report = run_workflow(&root, invocation, None).await;
    // A node whose router failed to decide (or was cancelled) is checkpointed all the same.
    checkpointer.flush().await?;
    let status = status_of(&report);
    store.finish_run(lease, &status).await?;
    Ok(DurableReport {
        run: report,
        status,
        head: checkpointer.head(),
        health: health.report(),
    })
}

/// Renews `lease` every third of `expiry` until aborted. A failed renewal is
/// tried again at the next turn (the lease still has two thirds of its time); a lease that
/// is no longer the run's cancels the run through `cancel`, so it stops now rather than at
/// its next checkpoint, which would be refused anyway.
async fn keep_alive(
    store: Arc<dyn Store>,
    lease: Lease,
    expiry: std::time::Duration,
    cancel: CancellationToken,
) {
    let every = expiry / 3;
    loop {
        tokio::time::sleep(every).await;
        match store.heartbeat(&lease).await {
            Ok(()) => {}
            Err(
                e @ (StoreError::LeaseLost { .. }
                | StoreError::LeaseExpired { .. }
                | StoreError::UnknownRun(_)),
            ) => {
                tracing::warn!("{e}");
                cancel.cancel();
                return;
            }
            Err(e) => tracing::warn!(
                "could not renew the lease on run `{}` (trying again in {} s): {e}",
                lease.run_id(),
                every.as_secs_f64()
            ),
        }
    }
}

/// Stops the heartbeat task when the run stops, however it stops (dropped included).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Releases a run's lease if [`run_durable`] is dropped before it returns (it releases the
/// lease itself when it returns).
struct Held {
    store: Arc<dyn Store>,
    lease: Option<Lease>,
}

impl Held {
    /// Gives the lease up now.
    async fn release(mut self) {
        if let Some(lease) = self.lease.take() {
            release(self.store.as_ref(), &lease).await;
        }
    }

    /// The lease was released with the run's final status.
    fn disarm(mut self) {
        self.lease = None;
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let Some(lease) = self.lease.take() else {
            return;
        };
        // Dropped mid-run (the caller gave up on it): release from a task of its own, which
        // the next run of this process waits for before it claims. Failing that, the lease
        // names this process, so once it exits the next claimer finds its owner dead (or its
        // lease expired).
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let store = self.store.clone();
            let task = runtime.spawn(async move { release(store.as_ref(), &lease).await });
            RELEASES
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(task);
        }
    }
}

/// The releases of dropped runs still going on.
static RELEASES: Mutex<Vec<tokio::task::JoinHandle<()>>> = Mutex::new(Vec::new());

/// Waits (at most 30 s) for the releases of runs this process dropped.
async fn settle_releases() {
    let pending = std::mem::take(&mut *RELEASES.lock().unwrap_or_else(PoisonError::into_inner));
    let all = futures::future::join_all(pending);
    let _ = tokio::time::timeout(std::time::Duration::from_secs(30), all).await;
}

async fn release(store: &dyn Store, lease: &Lease) {
    if let Err(e) = store.release(lease).await {
        tracing::warn!("could not release the lease on `{}`: {e}", lease.run_id());
    }
}

/// The checkpoint a resumed run `run_id` continues from: `from` (time travel) or its head.
/// Refuses what cannot go on: an unknown run or checkpoint, one of another run, a completed
/// run without `from`, a run waiting for a human without an answer (`answered`), an answer
/// to a run — or to a checkpoint `from` — that asked nothing. Reads only; [`run_durable`]
/// checks the same before it writes.
pub async fn resume_point(
    store: &dyn Store,
    run_id: &str,
    from: Option<CheckpointId>,
    answered: bool,
) -> Result<CheckpointId, DurableError> {
    let run = store
        .run(run_id)
        .await?
        .ok_or_else(|| StoreError::UnknownRun(run_id.to_owned()))?;
    if let Some(id) = from {
        let record = store.checkpoint(id).await?;
        if record.run_id != run_id {
            return Err(StoreError::WrongRun {
                checkpoint: id,
                expected: run_id.to_owned(),
                actual: record.run_id,
            }
            .into());
        }
        if answered && !asked_at(store, &record).await? {
            return Err(DurableError::NothingAsked {
                run: run_id.to_owned(),
                checkpoint: id,
                node: record.node,
            });
        }
        return Ok(id);
    }
    match (&run.status, answered) {
        (RunStatus::Completed, _) => return Err(DurableError::Completed(run_id.to_owned())),
        (RunStatus::AwaitingHuman { question }, false) => {
            return Err(DurableError::NeedsInput {
                run: run_id.to_owned(),
                question: question.clone(),
            });
        }
        (RunStatus::Running | RunStatus::Interrupted | RunStatus::Failed { .. }, true) => {
            return Err(DurableError::UnexpectedInput(run_id.to_owned()));
        }
        _ => {}
    }
    run.head
        .ok_or_else(|| DurableError::NoCheckpoint(run_id.to_owned()))
}

/// Whether the run stopped for a human at checkpoint `record`: a node escalated there, or the
/// router's escalation flag is set in its state.
async fn asked_at(store: &dyn Store, record: &CheckpointRecord) -> Result<bool, StoreError> {
    if record.metadata.get("control") == Some(&json!(Control::Escalate)) {
        return Ok(true);
    }
    let state = store.state_at(record.id).await?.state;
    Ok(state.get(keys::ESCALATION_TRIGGERED) == Some(&Value::Bool(true)))
}

/// Records a human's answer in `state`; returns the writes.
fn record_answer(
    state: &crate::state::SharedState,
    plane: Option<&Arc<ControlPlane>>,
    answer: &str,
) -> StateDelta {
    let mut updates = StateDelta::default();
    updates.set(HUMAN_INPUT, json!(answer));
    updates.set(MESSAGES, json!([{"author": HUMAN_NODE, "content": answer}]));
    updates.set(keys::ESCALATION_TRIGGERED, json!(false));
    updates.set(ESCALATE_FLAG, json!(false));
    updates.delete(FAILURE_FLAG);
    let reducers = plane.map(|p| p.reducers().clone()).unwrap_or_default();
    let writes = reducers.reduce(&updates);
    state.apply(&writes);
    writes
}

fn status_of(report: &RunReport) -> RunStatus {
    let escalated = report
        .state
        .get(keys::ESCALATION_TRIGGERED)
        .is_some_and(|v| v == &Value::Bool(true));
    match &report.result {
        Ok(_) if escalated => RunStatus::AwaitingHuman {
            question: report
                .state
                .get(keys::ROUTING_RATIONALE)
                .and_then(Value::as_str)
                .unwrap_or("The router escalated to a human")
                .to_owned(),
        },
        // An agent's own `escalate`: its question is the escalation flag when it set one.
        Ok(Control::Escalate) => RunStatus::AwaitingHuman {
            question: report
                .state
                .get(ESCALATE_FLAG)
                .and_then(Value::as_str)
                .unwrap_or("An agent escalated to a human")
                .to_owned(),
        },
        Ok(_) => RunStatus::Completed,
        // Stopped on purpose, not broken: resume continues it.
        Err(FlowError::Cancelled) => RunStatus::Interrupted,
        Err(e) => RunStatus::Failed {
            error: e.to_string(),
        },
    }
}

/// The graph as the root of a durable run: named like it, so its nodes' positions match, its
/// own callbacks [`OncePerRun`], and (routed) its health logged however it ends.
struct Root<'g> {
    graph: &'g Graph,
    callbacks: Callbacks,
    /// Whose report ends the invocation as a `health` event, however it ends.
    health: Option<Arc<HealthObserver>>,
}

#[async_trait]
impl Agent for Root<'_> {
    fn name(&self) -> &str {
        self.graph.name()
    }

    fn description(&self) -> &str {
        self.graph.description()
    }

    fn class(&self) -> &str {
        self.graph.class()
    }

    fn callbacks(&self) -> &Callbacks {
        &self.callbacks
    }

    async fn run(&self, ctx: &InvocationContext) -> Result<Control, FlowError> {
        let result = self.graph.run(ctx).await;
        match &self.health {
            // On failure the run's own error is what counts, not a failed health event.
            Some(health) => match (result, health.emit(ctx)) {
                (Ok(_), Err(e)) => Err(e),
                (result, _) => result,
            },
            None => result,
        }
    }
}

/// A root callback that runs once per run: `before_agent` only when the run starts,
/// `after_agent` only when it completes (not when the router stops it for a human).
struct OncePerRun {
    inner: Arc<dyn Callback>,
    starts: bool,
}

impl Callback for OncePerRun {
    fn before_agent(&self, ctx: &CallbackContext) -> HookAction<String> {
        if self.starts {
            self.inner.before_agent(ctx)
        } else {
            HookAction::Continue
        }
    }

    fn after_agent(&self, ctx: &CallbackContext) -> HookAction<String> {
        if ctx.get_state(keys::ESCALATION_TRIGGERED) == Some(Value::Bool(true)) {
            HookAction::Continue
        } else {
            self.inner.after_agent(ctx)
        }
    }
}

/// A checkpoint read back as where its run stands.
#[derive(Debug)]
struct Resumed {
    node: String,
    next: Vec<String>,
    /// The node the checkpoint follows (a router's `from`, else its own node).
    from: String,
    steps_done: u64,
    iteration: u32,
    /// The nested position of a node checkpoint.
    path: Option<Vec<Position>>,
    control: Control,
}

impl Resumed {
    fn read(
        store: &dyn Store,
        graph: &Graph,
        record: &CheckpointRecord,
    ) -> Result<Self, StoreError> {
        let meta = &record.metadata;
        let meta_u64 = |key: &str| meta.get(key).and_then(Value::as_u64);
        let damaged = |what: String| StoreError::Damaged {
            db: store.location().to_string(),
            what: format!("checkpoint {}: {what}", record.id),
        };
        let path: Option<Vec<Position>> = meta
            .get("path")
            .map(|path| serde_json::from_value(path.clone()))
            .transpose()
            .map_err(|e| damaged(format!("its `path` is not a list of positions ({e})")))?;
        if let Some(top) = path.as_ref().and_then(|p| p.first())
            && top.graph != graph.name()
        {
            return Err(damaged(format!(
                "its `path` starts in graph `{}`, not in the run's `{}`",
                top.graph,
                graph.name()
            )));
        }
        let control = meta
            .get("control")
            .map(|control| serde_json::from_value(control.clone()))
            .transpose()
            .map_err(|e| damaged(format!("its `control` is unknown ({e})")))?
            .unwrap_or(Control::Continue);
        Ok(Self {
            node: record.node.clone(),
            next: record.next.clone(),
            from: meta
                .get("from")
                .and_then(Value::as_str)
                .unwrap_or(&record.node)
                .to_owned(),
            steps_done: meta_u64("graph_step").unwrap_or(0),
            iteration: meta_u64("iteration")
                .and_then(|i| u32::try_from(i).ok())
                .unwrap_or(1),
            path: path.filter(|p| !p.is_empty()),
            control,
        })
    }

    /// The top-level position of node `node` of `graph` (a checkpoint without a path: a
    /// router's, a human's answer to one, or one written before paths were recorded).
    fn top(&self, graph: &str, node: &str, step: u64) -> Vec<Position> {
        vec![Position {
            graph: graph.to_owned(),
            node: node.to_owned(),
            step,
            iteration: Some(self.iteration),
        }]
    }

    /// The path a human's answer to this checkpoint continues after.
    fn answered_path(&self, graph: &str) -> Vec<Position> {
        self.path
            .clone()
            .unwrap_or_else(|| self.top(graph, &self.from, self.steps_done))
    }

    /// Where a resumed run picks up after this checkpoint (`None`: the graph starts afresh).
    fn point(self, graph: &Graph, plane: Option<&Arc<ControlPlane>>) -> Option<ResumePoint> {
        let name = graph.name();
        let (path, action) = if self.node == START_NODE {
            // Nothing ran yet: the graph starts as a new run does (or has nothing to run).
            if !self.next.is_empty() {
                return None;
            }
            (self.top(name, &self.node, 0), ResumeAction::End)
        } else if let Some(next) = self.next.first() {
            // A router chose the next node: it runs.
            let at = self.top(name, next, self.steps_done + 1);
            (at, ResumeAction::Run)
        } else if plane.is_some_and(|p| p.config().name == self.node) {
            // A router checkpoint that chose no node: the run ended or escalated.
            (
                self.top(name, &self.from, self.steps_done),
                ResumeAction::End,
            )
        } else {
            // A node's checkpoint: its edge is followed again. A human's answer: the node it
            // answers runs again (the process died before it finished).
            let action = if self.node == HUMAN_NODE {
                ResumeAction::Run
            } else {
                ResumeAction::After(self.control)
            };
            let path = match self.path {
                Some(path) => path,
                None => self.top(name, &self.from, self.steps_done),
            };
            (path, action)
        };
        Some(ResumePoint { path, action })
    }
}

/// The path of the node that checkpoint `record` follows, from the root graph down (`None`
/// for the initial state, a router's decision, a human's answer, or a checkpoint written
/// before paths were recorded).
pub fn checkpoint_path(record: &CheckpointRecord) -> Option<Vec<Position>> {
    record
        .metadata
        .get("path")
        .and_then(|path| serde_json::from_value(path.clone()).ok())
        .filter(|path: &Vec<Position>| path.last().is_some_and(|last| last.node == record.node))
}
