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
//!   history. At the join every branch's **appends are all kept**, in the order they were
//!   made; a key that a branch **replaced or deleted** is settled as if the branches had
//!   written **in declaration order** — the last-declared branch that replaced or deleted it
//!   decides its value, and appends of branches declared after it go on top — whatever the
//!   timing. The join's own event carries those settled values, so the event log and the
//!   checkpoints replay to the state the next node sees. What a failed branch wrote stays
//!   written and takes part. Histories are appended in declaration order. [`BranchPolicy`]
//!   says what a failing branch does.
//!
//! `escalate` from any node ends the graph and travels to the root.
//!
//! Each node of a sequence, loop or graph runs at a [`Position`] (graph, node, step, loop
//! iteration), so the observers see every node's path from the root down, at every depth.
//! A run started with a [`ResumePoint`](super::ResumePoint) continues at that path: a graph
//! that starts takes its level of the point (if it is the graph on the path there) and
//! begins at its recorded step and iteration — re-entering a container without counting a
//! new iteration, or, at the deepest level, acting on the finished node's control and
//! following its edge as an unbroken run would have. The first node to finish ends the
//! descent. A parallel group's branches have no position: nodes inside a group are not
//! resumed into; the group is a node of its enclosing graph like any other.

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
use super::position::{Position, ResumeAction};
use crate::state::{State, StateDelta, StateWrite};
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
pub(crate) enum GraphKind {
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
pub(crate) enum Edge {
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

/// How the executor enters a graph's steps.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Entry {
    /// At this step, as a fresh run: entering a loop's first node counts an iteration.
    Fresh(Step),
    /// At this step of a resumed run: its iteration was counted already.
    Resumed(Step),
    /// After node `from` finished with `control`, as if it had just run.
    After { from: usize, control: Control },
}

/// What follows a finished step: another step, or the graph's end with this control.
enum Next {
    Step(Step),
    Return(Control),
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
    pub(crate) fn with_description(mut self, description: impl Into<String>) -> Self {
        self.description = description.into();
        self
    }

    /// This graph with its own `callbacks`.
    pub fn with_callbacks(mut self, callbacks: Callbacks) -> Self {
        self.callbacks = callbacks;
        self
    }

    /// Its nodes, in declaration order.
    pub(crate) fn nodes(&self) -> &[Arc<dyn Agent>] {
        &self.nodes
    }

    /// The outgoing edge of each node, by node name (a node without one ends the graph).
    pub(crate) fn edges(&self) -> Vec<(&str, Option<&Edge>)> {
        self.nodes
            .iter()
            .zip(&self.edges)
            .map(|(node, edge)| (node.name(), edge.as_ref()))
            .collect()
    }

    /// The first node (`None` for an empty graph or a parallel group).
    pub(crate) fn start_node(&self) -> Option<&str> {
        match self.start {
            Step::Node(i) => Some(self.nodes[i].name()),
            _ => None,
        }
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

    /// Runs the graph from its start, or from its level of the run's resume point.
    async fn start(&self, ctx: &InvocationContext) -> Result<Control, FlowError> {
        let Some((at, action)) = ctx.take_resume(&self.name) else {
            return self
                .execute(ctx, Entry::Fresh(self.start.clone()), 0, 0)
                .await;
        };
        let iteration = at.iteration.unwrap_or(1).max(1);
        let entry = match action {
            Some(ResumeAction::End) => Entry::Resumed(Step::End),
            Some(ResumeAction::After(control)) => Entry::After {
                from: self.node_id(&at.node, &at.node)?,
                control,
            },
            // A container on the way down, or a node that had not run: it runs as this step.
            None | Some(ResumeAction::Run) => {
                let id = self.node_id(&at.node, &at.node)?;
                let steps = at.step.saturating_sub(1);
                return self
                    .execute(ctx, Entry::Resumed(Step::Node(id)), steps, iteration)
                    .await;
            }
        };
        self.execute(ctx, entry, at.step, iteration).await
    }

    /// Runs the steps from `entry`.
    async fn execute(
        &self,
        ctx: &InvocationContext,
        entry: Entry,
        mut steps: u64,
        mut iteration: u32,
    ) -> Result<Control, FlowError> {
        let max_steps = self.max_steps();
        // A resumed loop at its first node is in the iteration it was in; anywhere else, the
        // next entry of its first node starts a new one.
        let mut enter_counts = !matches!(entry, Entry::Resumed(Step::Node(0)));
        let mut step = match entry {
            Entry::Fresh(step) | Entry::Resumed(step) => step,
            Entry::After { from, control } => match self.after(ctx, from, control, None).await? {
                Next::Step(step) => step,
                Next::Return(control) => return Ok(control),
            },
        };
        let looping = matches!(self.kind, GraphKind::Loop { .. });
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
            let position = Position {
                graph: self.name.clone(),
                node: node_name,
                step: steps,
                iteration: looping.then_some(iteration.max(1)),
            };
            let run = match ids.as_slice() {
                [id] => {
                    let node = self.nodes[*id].as_ref();
                    let child = ctx.child_at(node.name(), node.callbacks(), position.clone());
                    run_in(node, &child).await?
                }
                _ => self.run_fan(ctx, &ids).await?,
            };
            // A parallel group's own step is its enclosing graph's node: resumed only there.
            let path = match self.kind {
                GraphKind::Parallel { .. } => None,
                _ => ctx.positions().map(|mut path| {
                    path.push(position.clone());
                    path
                }),
            };
            // The writes since the last record go with the first record that can be resumed
            // into: a checkpoint of it replays them.
            let writes = match path {
                Some(_) => ctx.state().take_journal(),
                None => StateDelta::new(),
            };
            let record = NodeRecord {
                graph: ctx.branch_path().to_owned(),
                node: position.node,
                step: steps,
                iteration: iteration.max(1),
                writes,
                actions: run.actions,
                control: run.control,
                path,
            };
            ctx.drop_resume();
            for observer in ctx.observers() {
                observer.node_finished(ctx, &record).await?;
            }
            step = match self.after(ctx, ids[0], run.control, then).await? {
                Next::Step(step) => step,
                Next::Return(control) => return Ok(control),
            };
        }
    }

    /// What follows node `from` (or a fan-out step, whose next step is `then`) that finished
    /// with `control`.
    async fn after(
        &self,
        ctx: &InvocationContext,
        from: usize,
        control: Control,
        then: Option<Step>,
    ) -> Result<Next, FlowError> {
        match control {
            Control::Escalate => return Ok(Next::Return(Control::Escalate)),
            Control::ExitLoop if matches!(self.kind, GraphKind::Loop { .. }) => {
                ctx.set_end_status(EndStatus::ExitedLoop);
                return Ok(Next::Return(Control::Continue));
            }
            Control::ExitLoop => return Ok(Next::Return(Control::ExitLoop)),
            Control::Continue => {}
        }
        Ok(Next::Step(match then {
            Some(then) => then,
            None => self.follow(ctx, from).await?,
        }))
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
        let mut failure = None;
        let mut written = Vec::with_capacity(branches.len());
        for (run, branch) in runs.into_iter().zip(&branches) {
            written.push(branch.branch_writes());
            match run {
                Ok(run) => {
                    control = control.max(run.control);
                    actions = actions.union(run.actions);
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
        let settled = settle(&written);
        if !settled.is_empty() {
            ctx.apply(&settled);
            ctx.emit(Event::new(EventKind::StateUpdate))?;
        }
        Ok(AgentOutcome { control, actions })
    }
}

/// The writes that settle a join of branches that wrote `written` (in declaration order):
/// for each key some branch replaced or deleted, its value as if the branches had written
/// one after the other in declaration order. Keys only appended to are left as they are.
fn settle(written: &[StateDelta]) -> StateDelta {
    let all = || written.iter().flat_map(StateDelta::iter);
    let mut settled = StateDelta::new();
    let mut seen = std::collections::BTreeSet::new();
    for write in all() {
        let key = write.key();
        if matches!(write, StateWrite::Append { .. }) || !seen.insert(key) {
            continue;
        }
        let of_key: Vec<&StateWrite> = all().filter(|w| w.key() == key).collect();
        let last_base = of_key
            .iter()
            .rposition(|w| !matches!(w, StateWrite::Append { .. }))
            .unwrap_or(0);
        let mut state = State::default();
        for write in &of_key[last_base..] {
            state.write(write);
        }
        match state.remove(key) {
            Some(value) => settled.set(key, value),
            None => settled.delete(key),
        }
    }
    settled
}

/// Node steps a graph of nodes and edges may run unless told otherwise.
pub(crate) const DEFAULT_MAX_STEPS: u64 = 1_000;

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
        self.start(ctx).await
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

    /// Node steps at most (default `DEFAULT_MAX_STEPS`).
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
