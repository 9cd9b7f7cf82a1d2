//! The invocation context: what every agent of one run shares, and where it stands.
//!
//! An [`InvocationContext`] is two things. The run's shared parts — the session
//! [`SharedState`], the cancellation token, the [`Ledger`] whose budgets every model call
//! draws on, the event sinks, the invocation-wide callbacks and node observers, the deadline
//! — live once behind an `Arc`. The agent's own frame — its name, its branch (the path of
//! names from the root), the writes it has not reported yet, its conversation history — is
//! made fresh for each agent run by [`InvocationContext::child`].
//!
//! A frame the graph executor makes for a node carries the node's [`Position`]; the chain
//! of positions up to the root graph is the node's path ([`InvocationContext::positions`]),
//! and a run started with a [`ResumePoint`] hands each graph on that path its level as the
//! graph starts.
//!
//! State written through the context is applied at once (the next step sees it) and
//! recorded; the next [`emit`](InvocationContext::emit)ted event carries the recorded writes
//! as its delta (an enclosing frame's unreported writes go out first, in an event of its
//! own, so the log reports writes in the order they were made). When nothing would carry
//! them — the run has no event sinks and no enclosing parallel branch keeps them — writes are
//! not recorded and their values move into the state instead of being copied. A parallel branch's frame
//! also keeps every write made in it, shared with its events rather than copied, for the
//! join to settle. When the run has node observers (a checkpointer), the shared state
//! journals every write as it is applied, and the graph executor hands each observed node
//! the writes applied since the last one ([`NodeRecord::writes`]).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bridge::{BudgetExceeded, BudgetLimit, CancellationToken, Ledger};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::callbacks::{CallbackContext, Callbacks};
use super::control::Control;
use super::error::FlowError;
use super::event::{EndStatus, Event, EventKind};
use super::position::{Position, ResumeAction, ResumePoint};
use super::sink::EventSink;
use crate::state::{SharedState, StateDelta};
use crate::tool::Actions;

/// One turn of the conversation a run has so far (what LLM agents may see as history).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Turn {
    /// Who said it: `user` for the run's input, otherwise an agent's name.
    pub author: String,
    /// What was said.
    pub content: String,
}

/// A node finished inside a graph: what a checkpointer or progress display observes.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeRecord {
    /// The branch of the graph (path of agent names from the root).
    pub graph: String,
    /// The node's name.
    pub node: String,
    /// Node steps the graph has run, this one included (1-based).
    pub step: u64,
    /// The graph's loop iteration (1-based; 1 for graphs that are not loops).
    pub(crate) iteration: u32,
    /// The state writes applied since the previous record that has a path, in the order
    /// they were applied: the node's own, and any made before it that no record carried yet
    /// (its container's callbacks, say). Empty for a record without a path: its writes go
    /// with the record of the node around it. Empty too when the run has no node observers
    /// (nothing is journaled then).
    pub writes: StateDelta,
    /// The actions the node's run ended with.
    pub(crate) actions: Actions,
    /// How control went on after it.
    pub(crate) control: Control,
    /// Its path: the positions from the root graph down, this node's last; `None` when a
    /// level on the way cannot be resumed into (a parallel group, an agent called as a tool).
    pub path: Option<Vec<Position>>,
}

/// Observes every node a graph runs (checkpointers, progress, health metrics).
///
/// `node_finished` is awaited before the graph goes on, so a checkpointer's write is done
/// (or its failure stops the run) before the next node starts; it awaits I/O rather than
/// blocking the async worker.
#[async_trait::async_trait]
pub trait NodeObserver: Send + Sync {
    /// A node is about to run.
    fn node_started(&self, _graph: &str, _node: &str, _step: u64) {}

    /// A node finished; an error stops the run (its state is kept).
    async fn node_finished(
        &self,
        _ctx: &InvocationContext,
        _record: &NodeRecord,
    ) -> Result<(), FlowError> {
        Ok(())
    }
}

/// The settings of one invocation.
#[derive(Clone)]
pub struct Invocation {
    /// The session state the run works on.
    pub(crate) state: SharedState,
    /// Cancel it to stop the run (Ctrl-C).
    pub cancel: CancellationToken,
    /// The ledger every model call is recorded in (its budget stops the run).
    pub(crate) ledger: Arc<Ledger>,
    /// Where events go, in order.
    pub(crate) sinks: Vec<Arc<dyn EventSink>>,
    /// Callbacks for every agent (run before each agent's own).
    pub callbacks: Callbacks,
    /// Observers of every graph node.
    pub(crate) observers: Vec<Arc<dyn NodeObserver>>,
    /// The whole run's time limit.
    pub(crate) timeout: Option<Duration>,
    /// Where the run picks up, when it resumes an earlier one.
    pub(crate) resume: Option<ResumePoint>,
}

impl std::fmt::Debug for Invocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Invocation")
            .field("sinks", &self.sinks.len())
            .field("observers", &self.observers.len())
            .field("callbacks", &self.callbacks)
            .field("timeout", &self.timeout)
            .field("resume", &self.resume)
            .finish_non_exhaustive()
    }
}

impl Invocation {
    /// An invocation over `state` with no limits beyond the ledger's (an unlimited one).
    pub fn new(state: SharedState) -> Self {
        Self {
            state,
            cancel: CancellationToken::new(),
            ledger: Arc::new(Ledger::default()),
            sinks: Vec::new(),
            callbacks: Callbacks::new(),
            observers: Vec::new(),
            timeout: None,
            resume: None,
        }
    }

    /// Adds an event sink.
    pub fn with_sink(mut self, sink: Arc<dyn EventSink>) -> Self {
        self.sinks.push(sink);
        self
    }

    /// Uses `ledger` (its budgets bound the run).
    pub fn with_ledger(mut self, ledger: Arc<Ledger>) -> Self {
        self.ledger = ledger;
        self
    }

    /// Bounds the whole run by `timeout`.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Adds a node observer.
    pub fn with_observer(mut self, observer: Arc<dyn NodeObserver>) -> Self {
        self.observers.push(observer);
        self
    }

    /// Picks the run up at `point` instead of the root's start.
    pub fn with_resume(mut self, point: ResumePoint) -> Self {
        self.resume = Some(point);
        self
    }
}

/// A resume point still being descended: its levels before `depth` were taken.
struct PendingResume {
    point: ResumePoint,
    depth: usize,
}

struct Shared {
    settings: Invocation,
    deadline: Option<Instant>,
    next_seq: AtomicU64,
    /// How many [`WindingDown`] guards are held: work that reports how it ended when it is
    /// stopped, so a cancelled agent waits a moment for it before its `End`.
    winding_down: AtomicUsize,
    /// Held while an event is numbered and handed to the sinks, so sinks see `seq` order.
    emitting: Mutex<()>,
    /// Why the run stops, set once by whoever stops it first.
    stop: Mutex<Option<FlowError>>,
    /// The resume point until every level of it was taken, or a node finished.
    resume: Mutex<Option<PendingResume>>,
}

struct Frame {
    agent: String,
    branch: String,
    /// Where the executor runs this node (`None` for the root, a parallel branch, a tool).
    position: Option<Position>,
    cancel: CancellationToken,
    /// Writes made through this frame not yet carried by an event.
    pending: Mutex<StateDelta>,
    /// A parallel branch's frame: every write made in it and below, in order (for the join).
    recorded: Option<Mutex<StateDelta>>,
    /// Actions raised by this frame's events.
    actions: Mutex<Actions>,
    end_status: Mutex<Option<EndStatus>>,
    /// Set (under `emitting`) when this frame's `End` event went out: nothing of it or of
    /// its descendants is logged after that.
    ended: AtomicBool,
    history: Arc<Mutex<Vec<Turn>>>,
    callbacks: Callbacks,
    parent: Option<Arc<Frame>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section is one assignment or push, so a poisoned lock is consistent.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Work that winds down when its run is cancelled; see [`InvocationContext::winding_down`].
#[must_use = "the guard holds cancelled agents back only while it lives"]
pub struct WindingDown(Arc<Shared>);

impl Drop for WindingDown {
    fn drop(&mut self) {
        self.0.winding_down.fetch_sub(1, Ordering::AcqRel);
    }
}

impl std::fmt::Debug for WindingDown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WindingDown")
    }
}

/// Whether `frame` or a frame enclosing it has written its `End`.
fn ended(frame: &Frame) -> bool {
    let mut up = Some(frame);
    while let Some(f) = up {
        if f.ended.load(Ordering::Acquire) {
            return true;
        }
        up = f.parent.as_deref();
    }
    false
}

/// An event of work that outlived its agent's `End` (it did not stop within the agent's
/// wind-down): not logged, so that `End` stays the last event of every agent's run.
fn late(frame: &Frame, event: &Event) {
    tracing::warn!(
        agent = %frame.agent,
        branch = %frame.branch,
        kind = ?event.kind,
        "an event came after its agent's end (the agent was abandoned when it did not stop in time); it is not logged"
    );
}

/// What an agent run can see and do; cheap to clone.
#[derive(Clone)]
pub struct InvocationContext {
    shared: Arc<Shared>,
    frame: Arc<Frame>,
}

impl std::fmt::Debug for InvocationContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InvocationContext")
            .field("branch", &self.frame.branch)
            .finish_non_exhaustive()
    }
}

impl InvocationContext {
    /// The root context of a run with `settings`; its deadline starts now.
    pub fn new(settings: Invocation) -> Self {
        let deadline = settings.timeout.map(|t| Instant::now() + t);
        let cancel = settings.cancel.clone();
        if !settings.observers.is_empty() {
            settings.state.start_journal();
        }
        let resume = settings
            .resume
            .clone()
            .filter(|point| !point.path.is_empty())
            .map(|point| PendingResume { point, depth: 0 });
        Self {
            shared: Arc::new(Shared {
                settings,
                deadline,
                next_seq: AtomicU64::new(0),
                winding_down: AtomicUsize::new(0),
                emitting: Mutex::new(()),
                stop: Mutex::new(None),
                resume: Mutex::new(resume),
            }),
            frame: Arc::new(Frame {
                agent: String::new(),
                branch: String::new(),
                position: None,
                cancel,
                pending: Mutex::default(),
                recorded: None,
                actions: Mutex::default(),
                end_status: Mutex::default(),
                ended: AtomicBool::new(false),
                history: Arc::default(),
                callbacks: Callbacks::new(),
                parent: None,
            }),
        }
    }

    fn frame_for(
        &self,
        agent: &str,
        callbacks: Callbacks,
        history: Arc<Mutex<Vec<Turn>>>,
        cancel: CancellationToken,
        position: Option<Position>,
        records: bool,
    ) -> Self {
        let parent = &self.frame.branch;
        let mut branch = String::with_capacity(parent.len() + 1 + agent.len());
        if !parent.is_empty() {
            branch.push_str(parent);
            branch.push('/');
        }
        branch.push_str(agent);
        Self {
            shared: self.shared.clone(),
            frame: Arc::new(Frame {
                agent: agent.to_owned(),
                branch,
                position,
                cancel,
                pending: Mutex::default(),
                recorded: records.then(Mutex::default),
                actions: Mutex::default(),
                end_status: Mutex::default(),
                ended: AtomicBool::new(false),
                history,
                callbacks,
                parent: Some(self.frame.clone()),
            }),
        }
    }

    /// The context of sub-agent `agent` with its own `callbacks`, sharing this history.
    pub(crate) fn child(&self, agent: &str, callbacks: &Callbacks) -> Self {
        self.frame_for(
            agent,
            callbacks.clone(),
            self.frame.history.clone(),
            self.frame.cancel.clone(),
            None,
            false,
        )
    }

    /// The context of graph node `agent` at `position` (see [`positions`](Self::positions)).
    pub(crate) fn child_at(&self, agent: &str, callbacks: &Callbacks, position: Position) -> Self {
        self.frame_for(
            agent,
            callbacks.clone(),
            self.frame.history.clone(),
            self.frame.cancel.clone(),
            Some(position),
            false,
        )
    }

    /// The context of parallel branch `agent`: its own copy of the history so far and a
    /// cancellation token that `cancel` stops (and that stops with this context's).
    pub(crate) fn branch(
        &self,
        agent: &str,
        callbacks: &Callbacks,
        cancel: CancellationToken,
    ) -> Self {
        let history = Arc::new(Mutex::new(self.history()));
        self.frame_for(agent, callbacks.clone(), history, cancel, None, true)
    }

    /// The context of agent `agent` called as a tool: a conversation of its own that starts
    /// with `input`, and `cancel` as its token.
    pub(crate) fn sub_run(
        &self,
        agent: &str,
        callbacks: &Callbacks,
        input: &str,
        cancel: CancellationToken,
    ) -> Self {
        let history = Arc::new(Mutex::new(vec![Turn {
            author: "user".to_owned(),
            content: input.to_owned(),
        }]));
        self.frame_for(agent, callbacks.clone(), history, cancel, None, false)
    }

    /// The agent this context runs (empty at the root).
    pub(crate) fn agent(&self) -> &str {
        &self.frame.agent
    }

    /// The path of agent names from the root, joined by `/`.
    pub(crate) fn branch_path(&self) -> &str {
        &self.frame.branch
    }

    /// The positions from the root graph down to this context's agent (empty for the root
    /// agent), or `None` when a frame on the way has none (a parallel branch, a tool's run).
    pub(crate) fn positions(&self) -> Option<Vec<Position>> {
        let mut path = Vec::new();
        let mut frame = &self.frame;
        // The invocation's own frame and the root agent's carry no position.
        while let Some(parent) = frame.parent.as_ref().filter(|p| p.parent.is_some()) {
            path.push(frame.position.clone()?);
            frame = parent;
        }
        path.reverse();
        Some(path)
    }

    /// The level of the run's resume point that graph `graph`, starting in this context,
    /// continues at: its position and, at the deepest level, what it does (`None` above it:
    /// re-enter the node). `None` when the run resumes nothing here.
    pub(crate) fn take_resume(&self, graph: &str) -> Option<(Position, Option<ResumeAction>)> {
        let mut pending = lock(&self.shared.resume);
        let resume = pending.as_mut()?;
        let here = self.positions()?;
        let path = &resume.point.path;
        let matches = here.len() == resume.depth
            && path
                .get(here.len())
                .is_some_and(|level| level.graph == graph)
            && here
                .iter()
                .zip(path)
                .all(|(at, level)| at.graph == level.graph && at.node == level.node);
        if !matches {
            return None;
        }
        let level = path[resume.depth].clone();
        resume.depth += 1;
        let action = (resume.depth == path.len()).then_some(resume.point.action);
        if action.is_some() {
            *pending = None;
        }
        Some((level, action))
    }

    /// Forgets the run's resume point: a node finished, so the descent is over (a callback
    /// skipped a container on the way, say) and no later graph may take it.
    pub(crate) fn drop_resume(&self) {
        lock(&self.shared.resume).take();
    }

    /// The session state.
    pub fn state(&self) -> &SharedState {
        &self.shared.settings.state
    }

    /// A copy of the value of state key `key`.
    pub fn get_state(&self, key: &str) -> Option<Value> {
        self.state().get(key)
    }

    /// Writes state key `key`: visible at once, carried by this agent's next event.
    pub fn set_state(&self, key: impl Into<String>, value: Value) {
        let mut delta = StateDelta::new();
        delta.set(key, value);
        self.write(delta);
    }

    /// Appends `items` to the list under state key `key` (visible at once, carried by this
    /// agent's next event).
    pub fn append_state(&self, key: impl Into<String>, items: Vec<Value>) {
        let mut delta = StateDelta::new();
        delta.append(key, items);
        self.write(delta);
    }

    /// Deletes state key `key` (visible at once, carried by this agent's next event; not
    /// the same as setting it to `null`).
    pub fn delete_state(&self, key: impl Into<String>) {
        let mut delta = StateDelta::new();
        delta.delete(key);
        self.write(delta);
    }

    /// Applies every write of `delta` (visible at once, carried by the next event).
    pub fn apply(&self, delta: &StateDelta) {
        self.write(delta.clone());
    }

    /// Applies `delta`, which the caller no longer needs (the values move into the state
    /// when nothing will carry the writes), as [`apply`](Self::apply) does.
    pub(crate) fn write(&self, delta: StateDelta) {
        if self.writes_unseen() {
            self.state().apply_owned(delta);
        } else {
            self.state().apply(&delta);
            self.record(delta);
        }
    }

    /// Whether no one will see this frame's writes as writes: the run has no event sinks
    /// (so its events carry them nowhere) and no enclosing parallel branch keeps them for its
    /// join. (A checkpointer's journal is the shared state's own.)
    pub(crate) fn writes_unseen(&self) -> bool {
        if !self.shared.settings.sinks.is_empty() {
            return false;
        }
        let mut up = Some(&self.frame);
        while let Some(frame) = up {
            if frame.recorded.is_some() {
                return false;
            }
            up = frame.parent.as_ref();
        }
        true
    }

    /// Records writes already applied to the state (by a tool context, a callback), so the
    /// next event carries them.
    pub(crate) fn record(&self, delta: StateDelta) {
        if !delta.is_empty() {
            lock(&self.frame.pending).extend(delta);
        }
    }

    /// Every write made in this parallel branch and below so far (empty for other frames).
    pub(crate) fn branch_writes(&self) -> StateDelta {
        self.frame
            .recorded
            .as_ref()
            .map(|recorded| lock(recorded).clone())
            .unwrap_or_default()
    }

    /// The actions raised by this agent's events so far.
    pub(crate) fn actions(&self) -> Actions {
        *lock(&self.frame.actions)
    }

    /// The cancellation token of this agent (cancelled when the run or its branch stops).
    pub fn cancel_token(&self) -> &CancellationToken {
        &self.frame.cancel
    }

    /// The ledger of the run.
    pub(crate) fn ledger(&self) -> &Arc<Ledger> {
        &self.shared.settings.ledger
    }

    /// The invocation-wide callbacks followed by this agent's own.
    pub fn callbacks(&self) -> Callbacks {
        self.shared.settings.callbacks.chain(&self.frame.callbacks)
    }

    /// The node observers of the run.
    pub(crate) fn observers(&self) -> &[Arc<dyn NodeObserver>] {
        &self.shared.settings.observers
    }

    /// A copy of the conversation so far.
    pub fn history(&self) -> Vec<Turn> {
        lock(&self.frame.history).clone()
    }

    /// Adds a turn to the conversation (the run's input; an agent's reply is added by
    /// [`emit`](Self::emit)).
    pub(crate) fn add_turn(&self, author: impl Into<String>, content: impl Into<String>) {
        lock(&self.frame.history).push(Turn {
            author: author.into(),
            content: content.into(),
        });
    }

    /// Appends `turns` to this context's conversation (a parallel join).
    pub(crate) fn extend_history(&self, turns: impl IntoIterator<Item = Turn>) {
        lock(&self.frame.history).extend(turns);
    }

    /// Sets how this agent's end is reported (a loop's exit, a skipped agent).
    pub(crate) fn set_end_status(&self, status: EndStatus) {
        *lock(&self.frame.end_status) = Some(status);
    }

    pub(crate) fn end_status(&self) -> Option<EndStatus> {
        *lock(&self.frame.end_status)
    }

    /// A callback context for this agent; its effects go back through
    /// [`absorb_callback`](Self::absorb_callback).
    pub fn callback_context(&self) -> CallbackContext {
        CallbackContext::new(self.agent(), self.branch_path(), self.state().clone())
    }

    /// Takes the writes and actions of a callback: writes are recorded for the next event,
    /// actions returned for the caller to act on.
    pub fn absorb_callback(&self, cb: &CallbackContext) -> Actions {
        let (delta, actions) = cb.take_effects();
        self.record(delta);
        actions
    }

    /// Emits `event` as this agent's: reports first the writes an enclosing frame has not
    /// reported yet (each in an event of that frame), then stamps the event, attaches this
    /// frame's unreported writes, adds them to the record of each enclosing parallel branch,
    /// adds a message to the conversation, and hands it to the sinks.
    pub fn emit(&self, event: Event) -> Result<(), FlowError> {
        if ended(&self.frame) {
            late(&self.frame, &event);
            return Ok(());
        }
        let mut earlier = Vec::new();
        let mut frame = self.frame.parent.as_ref();
        while let Some(f) = frame {
            let pending = std::mem::take(&mut *lock(&f.pending));
            if !pending.is_empty() {
                earlier.push((f.clone(), pending));
            }
            frame = f.parent.as_ref();
        }
        // Outermost first: the order the writes were made in.
        for (f, pending) in earlier.into_iter().rev() {
            let update = Event::new(EventKind::StateUpdate).with_delta(pending);
            self.emit_in(&f, update)?;
        }
        self.emit_in(&self.frame, event)
    }

    fn emit_in(&self, frame: &Arc<Frame>, mut event: Event) -> Result<(), FlowError> {
        let pending = std::mem::take(&mut *lock(&frame.pending));
        if !pending.is_empty() {
            let later = std::mem::replace(&mut event.delta, pending);
            event.delta.extend(later);
        }
        event.author = frame.agent.clone();
        event.branch = frame.branch.clone();
        if event.actions.any() {
            let mut actions = lock(&frame.actions);
            *actions = actions.union(event.actions);
        }
        if !event.delta.is_empty() {
            let mut up = Some(frame);
            while let Some(f) = up {
                if let Some(recorded) = &f.recorded {
                    lock(recorded).extend(event.delta.clone());
                }
                up = f.parent.as_ref();
            }
        }
        if let (EventKind::Message, Some(content)) = (&event.kind, &event.content) {
            lock(&frame.history).push(Turn {
                author: frame.agent.clone(),
                content: content.clone(),
            });
        }
        let _order = lock(&self.shared.emitting);
        if ended(frame) {
            late(frame, &event);
            return Ok(());
        }
        event.seq = self.shared.next_seq.fetch_add(1, Ordering::Relaxed);
        event.at_ms = now_ms();
        if matches!(event.kind, EventKind::End { .. }) {
            frame.ended.store(true, Ordering::Release);
        }
        for sink in &self.shared.settings.sinks {
            sink.emit(&event)?;
        }
        Ok(())
    }

    /// Flushes every sink of the run (its end); the first error.
    pub(crate) fn flush_sinks(&self) -> Result<(), FlowError> {
        let mut first = Ok(());
        for sink in &self.shared.settings.sinks {
            if let Err(e) = sink.flush() {
                first = first.and(Err(e));
            }
        }
        first
    }

    /// Holds this run's cancelled agents back, while the guard lives, from writing their
    /// `End` at once: each waits up to a bounded moment for its run to return (see
    /// `run_agent`). For work that reports how it ended when it is
    /// stopped — an RLM loop on a thread of its own, stopped at its next step, records its
    /// result — so that the record comes before the `End` rather than after it.
    pub fn winding_down(&self) -> WindingDown {
        self.shared.winding_down.fetch_add(1, Ordering::AcqRel);
        WindingDown(Arc::clone(&self.shared))
    }

    /// Whether some work of the run holds a [`WindingDown`] guard.
    pub(crate) fn is_winding_down(&self) -> bool {
        self.shared.winding_down.load(Ordering::Acquire) > 0
    }

    /// Stops the whole run for `reason` (the first reason given wins) and cancels it.
    pub(crate) fn stop(&self, reason: FlowError) {
        lock(&self.shared.stop).get_or_insert(reason);
        self.shared.settings.cancel.cancel();
    }

    /// Why the run was stopped, if it was.
    pub(crate) fn stop_reason(&self) -> Option<FlowError> {
        lock(&self.shared.stop).clone()
    }

    /// The time limit of the whole run.
    pub(crate) fn timeout(&self) -> Option<Duration> {
        self.shared.settings.timeout
    }

    /// The deadline of the whole run.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        self.shared.deadline
    }

    /// Whether the run may take another step: not cancelled, not past its deadline, no
    /// budget spent. Called by the executor before every node.
    pub fn check(&self) -> Result<(), FlowError> {
        if let Some(deadline) = self.shared.deadline
            && Instant::now() >= deadline
        {
            let timeout = self.shared.settings.timeout.unwrap_or_default();
            self.stop(FlowError::TimedOut(timeout));
        }
        if let Some(exceeded) = spent_budget(self.ledger()) {
            self.stop(FlowError::Budget(exceeded));
        }
        if self.frame.cancel.is_cancelled() {
            return Err(self.stop_reason().unwrap_or(FlowError::Cancelled));
        }
        Ok(())
    }
}

/// The first budget of `ledger` already spent, so that no further call can be admitted.
fn spent_budget(ledger: &Ledger) -> Option<BudgetExceeded> {
    let budget = ledger.budget();
    let spent = |limit, max: f64, used: f64| {
        (used >= max).then(|| BudgetExceeded {
            limit,
            max,
            used,
            reserved: 0.0,
            needed: 0.0,
            setting: ledger.names().of(limit),
        })
    };
    let calls = budget.max_calls.and_then(|max| {
        spent(
            BudgetLimit::Calls,
            max as f64,
            ledger.calls_reserved() as f64,
        )
    });
    let tokens = budget
        .max_tokens
        .and_then(|max| spent(BudgetLimit::Tokens, max as f64, ledger.tokens_used() as f64));
    let usd = budget
        .max_usd
        .and_then(|max| spent(BudgetLimit::Usd, max, ledger.usd_used()));
    let iterations = budget.max_iterations.and_then(|max| {
        spent(
            BudgetLimit::Iterations,
            max as f64,
            ledger.iterations_reserved() as f64,
        )
    });
    calls.or(tokens).or(usd).or(iterations)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
