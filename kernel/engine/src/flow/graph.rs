//! The graph executor: one engine for graphs, loops, sequences and parallel groups.
//!
//! A [`Graph`] is a set of nodes (agents) and, per node, an outgoing edge: a plain edge to a
//! node or to the end, a conditional edge (a [`Router`] that looks at the state and picks
//! the next node), or a fan-out that runs several nodes concurrently and then goes on. The
//! executor runs one node at a time: check the run's limits, run the node through
//! [`run_in`], tell the node observers (checkpointers) what it wrote, act on its control,
//! follow its edge. Every write a node makes is applied to the shared state before the next
//! node starts.
//!
//! The workflow agents are thin layers over it:
//!
//! - **Sequential**: `a → b → c → end`.
//! - **Loop**: `a → b → c → a …`; entering the first node starts an iteration; at most
//!   `max_iterations` (required, never "forever"). A node's `exit_loop` ends this loop — the
//!   nearest one — and nothing above it. Inside a sequence or a plain graph `exit_loop`
//!   travels up to the nearest enclosing loop.
//! - **Parallel**: a fan-out of every node, then the end. Branches run concurrently, share
//!   the state (a write is visible to the others at once) and keep their own conversation
//!   history. At the join, each branch's writes are applied again **in declaration order**,
//!   so a key written by several branches ends with the value of the last-declared branch
//!   that wrote it, whatever the timing; their histories are appended in the same order.
//!   [`BranchPolicy`] says what a failing branch does.
//!
//! `escalate` from any node ends the graph and travels to the root. A run can start at a
//! given node ([`Graph::run_from`]), which is how a resumed run continues after the last
//! checkpointed node.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::Arc;

use async_trait::async_trait;
use futures::future::join_all;

use super::agent::{Agent, AgentOutcome, Control, class, run_in};
use super::callbacks::Callbacks;
use super::context::{InvocationContext, NodeRecord};
use super::error::FlowError;
use super::event::{EndStatus, Event, EventKind};
use crate::state::{State, StateDelta};
use crate::tool::Actions;

/// Where an edge leads.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Target {
    /// The node of that name.
    Node(String),
    /// The end of the graph.
    End,
}

impl Target {
    /// The node `name`.
    pub fn node(name: impl Into<String>) -> Self {
        Self::Node(name.into())
    }
}

/// Picks the next node of a conditional edge.
#[async_trait]
pub trait Router: Send + Sync {
    /// The target after node `from` finished (the state already holds its writes).
    async fn route(&self, ctx: &InvocationContext, from: &str) -> Result<Target, FlowError>;

    /// The router as [`Any`](std::any::Any), for callers that need its concrete type (the
    /// durable runner finds a graph's control plane this way); `None` unless it opts in.
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        None
    }
}

/// A [`Router`] from a function of the state.
pub struct StateRouter<F>(pub F);

impl<F> std::fmt::Debug for StateRouter<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StateRouter")
    }
}

#[async_trait]
impl<F> Router for StateRouter<F>
where
    F: Fn(&State) -> Target + Send + Sync,
{
    async fn route(&self, ctx: &InvocationContext, _from: &str) -> Result<Target, FlowError> {
        Ok(ctx.state().with(|state| (self.0)(state)))
    }
}

/// What a parallel group does when a branch fails.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BranchPolicy {
    /// The first failure cancels the other branches and fails the group.
    #[default]
    FailFast,
    /// A failed branch is reported (its `End` event says `failed`) and left out; the
    /// others run to their end and their writes merge.
    Continue,
}

/// What kind of graph this is (and so which class it reports).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GraphKind {
    /// Nodes in order, once.
    Sequential,
    /// Nodes in order, repeated.
    Loop {
        /// Iterations at most.
        max_iterations: NonZeroU32,
    },
    /// Nodes concurrently.
    Parallel {
        /// What a failing branch does.
        policy: BranchPolicy,
    },
    /// Nodes with plain and conditional edges.
    Graph {
        /// Node steps at most.
        max_steps: u64,
    },
}

/// A node's step: one node, several at once then another step, or the end.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    Node(usize),
    Fan(Vec<usize>, Box<Step>),
    End,
}

/// A node's outgoing edge.
#[derive(Clone)]
pub enum Edge {
    /// Always to the target.
    To(Target),
    /// Where the router says.
    When(Arc<dyn Router>),
}

impl std::fmt::Debug for Edge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::To(target) => write!(f, "To({target:?})"),
            Self::When(_) => f.write_str("When(..)"),
        }
    }
}

/// Why a graph cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GraphError {
    /// Two nodes share a name.
    #[error("`{graph}` has two sub-agents named `{name}`; give each a unique name")]
    DuplicateNode {
        /// The graph.
        graph: String,
        /// The name.
        name: String,
    },
    /// An edge names a node the graph does not have.
    #[error("`{graph}` has an edge {place} `{name}`, which is not one of its nodes ({known})")]
    UnknownNode {
        /// The graph.
        graph: String,
        /// `from` or `to`.
        place: &'static str,
        /// The name.
        name: String,
        /// The nodes it has.
        known: String,
    },
    /// A graph of nodes has no start.
    #[error("`{graph}` has nodes but no start node; name one with `start`")]
    NoStart {
        /// The graph.
        graph: String,
    },
}

/// Where [`Graph::run_from`] picks up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResumeAt {
    /// The node to run first.
    pub node: String,
    /// Node steps already run before it.
    pub steps_done: u64,
    /// The loop iteration it belongs to (1-based; ignored by graphs that are not loops).
    pub iteration: u32,
}

/// Agents joined by edges; see the module docs.
pub struct Graph {
    name: String,
    description: String,
    kind: GraphKind,
    nodes: Vec<Arc<dyn Agent>>,
    index: HashMap<String, usize>,
    edges: Vec<Option<Edge>>,
    start: Step,
    callbacks: Callbacks,
}

impl std::fmt::Debug for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Graph")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .field("nodes", &self.nodes)
            .finish_non_exhaustive()
    }
}

impl Graph {
    fn with_nodes(
        name: String,
        kind: GraphKind,
        nodes: Vec<Arc<dyn Agent>>,
    ) -> Result<Self, GraphError> {
        let mut index = HashMap::with_capacity(nodes.len());
        for (i, node) in nodes.iter().enumerate() {
            if index.insert(node.name().to_owned(), i).is_some() {
                return Err(GraphError::DuplicateNode {
                    graph: name,
                    name: node.name().to_owned(),
                });
            }
        }
        Ok(Self {
            name,
            description: String::new(),
            kind,
            edges: vec![None; nodes.len()],
            nodes,
            index,
            start: Step::End,
            callbacks: Callbacks::new(),
        })
    }

    /// `agents` in order, once.
    pub fn sequential(
        name: impl Into<String>,
        agents: Vec<Arc<dyn Agent>>,
    ) -> Result<Self, GraphError> {
        let mut graph = Self::with_nodes(name.into(), GraphKind::Sequential, agents)?;
        graph.chain(false);
        Ok(graph)
    }

    /// `agents` in order, repeated until one exits the loop or `max_iterations` ran.
    pub fn looping(
        name: impl Into<String>,
        agents: Vec<Arc<dyn Agent>>,
        max_iterations: NonZeroU32,
    ) -> Result<Self, GraphError> {
        let kind = GraphKind::Loop { max_iterations };
        let mut graph = Self::with_nodes(name.into(), kind, agents)?;
        graph.chain(true);
        Ok(graph)
    }

    /// `agents` concurrently; `policy` says what a failing branch does.
    pub fn parallel(
        name: impl Into<String>,
        agents: Vec<Arc<dyn Agent>>,
        policy: BranchPolicy,
    ) -> Result<Self, GraphError> {
        let mut graph = Self::with_nodes(name.into(), GraphKind::Parallel { policy }, agents)?;
        if !graph.nodes.is_empty() {
            graph.start = Step::Fan((0..graph.nodes.len()).collect(), Box::new(Step::End));
        }
        Ok(graph)
    }

    /// A graph of nodes and edges, built step by step.
    pub fn builder(name: impl Into<String>) -> GraphBuilder {
        GraphBuilder {
            name: name.into(),
            nodes: Vec::new(),
            edges: Vec::new(),
            start: None,
            max_steps: DEFAULT_MAX_STEPS,
        }
    }

    fn chain(&mut self, cyclic: bool) {
        let n = self.nodes.len();
        for i in 0..n {
            let next = if i + 1 < n {
                Target::Node(self.nodes[i + 1].name().to_owned())
            } else if cyclic {
                Target::Node(self.nodes[0].name().to_owned())
            } else {
                Target::End
            };
            self.edges[i] = Some(Edge::To(next));
        }
        if n > 0 {
            self.start = Step::Node(0);
        }
    }

    /// This graph described as `description`.
    pub fn with_description(mut self, description: impl Into<String>) -> Self {
        self.description = description.into();
        self
    }

    /// This graph with its own `callbacks`.
    pub fn with_callbacks(mut self, callbacks: Callbacks) -> Self {
        self.callbacks = callbacks;
        self
    }

    /// What kind of graph it is.
    pub fn kind(&self) -> GraphKind {
        self.kind
    }

    /// Its nodes, in declaration order.
    pub fn nodes(&self) -> &[Arc<dyn Agent>] {
        &self.nodes
    }

    /// The outgoing edge of each node, by node name (a node without one ends the graph).
    pub fn edges(&self) -> Vec<(&str, Option<&Edge>)> {
        self.nodes
            .iter()
            .zip(&self.edges)
            .map(|(node, edge)| (node.name(), edge.as_ref()))
            .collect()
    }

    /// The first node (`None` for an empty graph or a parallel group).
    pub fn start_node(&self) -> Option<&str> {
        match self.start {
            Step::Node(i) => Some(self.nodes[i].name()),
            _ => None,
        }
    }

    /// Runs the graph in `ctx` starting at `at` instead of its start (a resumed run).
    pub async fn run_from(
        &self,
        ctx: &InvocationContext,
        at: &ResumeAt,
    ) -> Result<Control, FlowError> {
        let id = self.node_id(&at.node, &at.node)?;
        self.execute(
            ctx,
            Step::Node(id),
            at.steps_done,
            at.iteration.max(1),
            true,
        )
        .await
    }

    /// This graph as an agent that starts at `at` (for [`run_workflow`](super::run_workflow)
    /// when resuming: events, branches and node records are those of an uninterrupted run).
    pub fn resumed(&self, at: ResumeAt) -> Resumed<'_> {
        Resumed { graph: self, at }
    }

    fn node_id(&self, from: &str, name: &str) -> Result<usize, FlowError> {
        self.index
            .get(name)
            .copied()
            .ok_or_else(|| FlowError::UnknownNode {
                graph: self.name.clone(),
                from: from.to_owned(),
                to: name.to_owned(),
            })
    }

    fn max_steps(&self) -> u64 {
        let n = self.nodes.len() as u64;
        match self.kind {
            GraphKind::Sequential | GraphKind::Parallel { .. } => n.max(1),
            GraphKind::Loop { max_iterations } => {
                n.saturating_mul(u64::from(max_iterations.get())).max(1)
            }
            GraphKind::Graph { max_steps } => max_steps,
        }
    }

    /// Runs the steps from `step`, then tells the observers the graph ended (unless it failed).
    async fn execute(
        &self,
        ctx: &InvocationContext,
        step: Step,
        steps: u64,
        iteration: u32,
        resumed: bool,
    ) -> Result<Control, FlowError> {
        let control = self.steps(ctx, step, steps, iteration, resumed).await?;
        for observer in ctx.observers() {
            observer.graph_finished(ctx, ctx.branch_path())?;
        }
        Ok(control)
    }

    async fn steps(
        &self,
        ctx: &InvocationContext,
        mut step: Step,
        mut steps: u64,
        mut iteration: u32,
        resumed: bool,
    ) -> Result<Control, FlowError> {
        let max_steps = self.max_steps();
        let mut enter_counts = !resumed;
        loop {
            let (ids, then) = match step {
                Step::End => return Ok(Control::Continue),
                Step::Node(id) => (vec![id], None),
                Step::Fan(ids, then) => (ids, Some(*then)),
            };
            if let GraphKind::Loop { max_iterations } = self.kind
                && ids == [0]
                && std::mem::replace(&mut enter_counts, true)
            {
                if iteration >= max_iterations.get() {
                    ctx.set_end_status(EndStatus::IterationLimit);
                    return Ok(Control::Continue);
                }
                iteration += 1;
                ctx.emit(Event::new(EventKind::Iteration { iteration }))?;
            }
            steps += 1;
            if steps > max_steps {
                return Err(FlowError::StepLimit {
                    graph: self.name.clone(),
                    max_steps,
                });
            }
            ctx.check()?;
            let node_name = self.step_name(&ids);
            for observer in ctx.observers() {
                observer.node_started(ctx.branch_path(), &node_name, steps);
            }
            let run = match ids.as_slice() {
                [id] => {
                    let node = self.nodes[*id].as_ref();
                    run_in(node, &ctx.child(node.name(), node.callbacks())).await?
                }
                _ => self.run_fan(ctx, &ids).await?,
            };
            let record = NodeRecord {
                graph: ctx.branch_path().to_owned(),
                node: node_name,
                step: steps,
                iteration: iteration.max(1),
                delta: run.delta,
                actions: run.actions,
            };
            for observer in ctx.observers() {
                observer.node_finished(ctx, &record)?;
            }
            match run.control {
                Control::Escalate => return Ok(Control::Escalate),
                Control::ExitLoop if matches!(self.kind, GraphKind::Loop { .. }) => {
                    ctx.set_end_status(EndStatus::ExitedLoop);
                    return Ok(Control::Continue);
                }
                Control::ExitLoop => return Ok(Control::ExitLoop),
                Control::Continue => {}
            }
            step = match then {
                Some(then) => then,
                None => self.follow(ctx, ids[0]).await?,
            };
        }
    }

    fn step_name(&self, ids: &[usize]) -> String {
        let names: Vec<&str> = ids.iter().map(|&i| self.nodes[i].name()).collect();
        names.join(",")
    }

    async fn follow(&self, ctx: &InvocationContext, from: usize) -> Result<Step, FlowError> {
        let from_name = self.nodes[from].name();
        let target = match &self.edges[from] {
            None => Target::End,
            Some(Edge::To(target)) => target.clone(),
            Some(Edge::When(router)) => router.route(ctx, from_name).await?,
        };
        Ok(match target {
            Target::End => Step::End,
            Target::Node(name) => Step::Node(self.node_id(from_name, &name)?),
        })
    }

    /// Runs the nodes `ids` as concurrent branches and merges them (see the module docs).
    async fn run_fan(
        &self,
        ctx: &InvocationContext,
        ids: &[usize],
    ) -> Result<AgentOutcome, FlowError> {
        let policy = match self.kind {
            GraphKind::Parallel { policy } => policy,
            _ => BranchPolicy::FailFast,
        };
        let group = ctx.cancel_token().child_token();
        let forked_at = ctx.history().len();
        let branches: Vec<InvocationContext> = ids
            .iter()
            .map(|&i| {
                let node = self.nodes[i].as_ref();
                ctx.branch(node.name(), node.callbacks(), group.clone())
            })
            .collect();
        let runs = join_all(ids.iter().zip(&branches).map(|(&i, branch)| {
            let group = &group;
            async move {
                let run = run_in(self.nodes[i].as_ref(), branch).await;
                if run.is_err() && policy == BranchPolicy::FailFast {
                    group.cancel();
                }
                run
            }
        }))
        .await;
        if ctx.cancel_token().is_cancelled() {
            return Err(ctx.stop_reason().unwrap_or(FlowError::Cancelled));
        }
        let mut control = Control::Continue;
        let mut actions = Actions::default();
        let mut merged = StateDelta::default();
        let mut failure = None;
        for (run, branch) in runs.into_iter().zip(&branches) {
            match run {
                Ok(run) => {
                    control = control.max(run.control);
                    actions = actions.union(run.actions);
                    merged.merge(run.delta);
                    ctx.extend_history(branch.history().into_iter().skip(forked_at));
                }
                // A branch cancelled because a sibling failed is not the failure.
                Err(FlowError::Cancelled) if policy == BranchPolicy::FailFast => {}
                Err(e) if policy == BranchPolicy::FailFast || e.is_stop() => {
                    failure.get_or_insert(e);
                }
                Err(_) => {}
            }
        }
        if let Some(e) = failure {
            return Err(e);
        }
        if !merged.is_empty() {
            ctx.apply(&merged);
            ctx.emit(Event::new(EventKind::StateUpdate))?;
        }
        Ok(AgentOutcome {
            control,
            delta: merged,
            actions,
        })
    }
}

/// A [`Graph`] that starts at a given node ([`Graph::resumed`]).
#[derive(Debug)]
pub struct Resumed<'a> {
    graph: &'a Graph,
    at: ResumeAt,
}

#[async_trait]
impl Agent for Resumed<'_> {
    fn name(&self) -> &str {
        &self.graph.name
    }

    fn description(&self) -> &str {
        &self.graph.description
    }

    fn class(&self) -> &str {
        self.graph.class()
    }

    fn sub_agents(&self) -> Vec<Arc<dyn Agent>> {
        self.graph.nodes.clone()
    }

    fn callbacks(&self) -> &Callbacks {
        &self.graph.callbacks
    }

    async fn run(&self, ctx: &InvocationContext) -> Result<Control, FlowError> {
        self.graph.run_from(ctx, &self.at).await
    }
}

/// Node steps a graph of nodes and edges may run unless told otherwise.
pub const DEFAULT_MAX_STEPS: u64 = 1_000;

#[async_trait]
impl Agent for Graph {
    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn class(&self) -> &str {
        match self.kind {
            GraphKind::Sequential => class::SEQUENTIAL,
            GraphKind::Loop { .. } => class::LOOP,
            GraphKind::Parallel { .. } => class::PARALLEL,
            GraphKind::Graph { .. } => class::GRAPH,
        }
    }

    fn sub_agents(&self) -> Vec<Arc<dyn Agent>> {
        self.nodes.clone()
    }

    fn callbacks(&self) -> &Callbacks {
        &self.callbacks
    }

    async fn run(&self, ctx: &InvocationContext) -> Result<Control, FlowError> {
        self.execute(ctx, self.start.clone(), 0, 0, false).await
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }
}

/// Builds a [`Graph`] of nodes with plain and conditional edges.
#[derive(Debug)]
pub struct GraphBuilder {
    name: String,
    nodes: Vec<Arc<dyn Agent>>,
    edges: Vec<(String, Edge)>,
    start: Option<String>,
    max_steps: u64,
}

impl GraphBuilder {
    /// Adds node `agent` (named by its name).
    pub fn node(mut self, agent: Arc<dyn Agent>) -> Self {
        self.nodes.push(agent);
        self
    }

    /// A plain edge from node `from` to `to`.
    pub fn edge(mut self, from: impl Into<String>, to: Target) -> Self {
        self.edges.push((from.into(), Edge::To(to)));
        self
    }

    /// A conditional edge from node `from`: `router` picks the next node.
    pub fn route(mut self, from: impl Into<String>, router: Arc<dyn Router>) -> Self {
        self.edges.push((from.into(), Edge::When(router)));
        self
    }

    /// The node that runs first.
    pub fn start(mut self, node: impl Into<String>) -> Self {
        self.start = Some(node.into());
        self
    }

    /// Node steps at most (default [`DEFAULT_MAX_STEPS`]).
    pub fn max_steps(mut self, max_steps: u64) -> Self {
        self.max_steps = max_steps;
        self
    }

    /// The graph, or why its nodes and edges do not fit together.
    pub fn build(self) -> Result<Graph, GraphError> {
        let kind = GraphKind::Graph {
            max_steps: self.max_steps,
        };
        let mut graph = Graph::with_nodes(self.name, kind, self.nodes)?;
        let unknown = |graph: &Graph, place, name: &str| GraphError::UnknownNode {
            graph: graph.name.clone(),
            place,
            name: name.to_owned(),
            known: graph
                .nodes
                .iter()
                .map(|n| format!("`{}`", n.name()))
                .collect::<Vec<_>>()
                .join(", "),
        };
        for (from, edge) in self.edges {
            let Some(&id) = graph.index.get(&from) else {
                return Err(unknown(&graph, "from", &from));
            };
            if let Edge::To(Target::Node(to)) = &edge
                && !graph.index.contains_key(to)
            {
                return Err(unknown(&graph, "to", to));
            }
            graph.edges[id] = Some(edge);
        }
        match self.start {
            Some(start) => match graph.index.get(&start) {
                Some(&id) => graph.start = Step::Node(id),
                None => return Err(unknown(&graph, "from the start to", &start)),
            },
            None if graph.nodes.is_empty() => {}
            None => return Err(GraphError::NoStart { graph: graph.name }),
        }
        Ok(graph)
    }
}
