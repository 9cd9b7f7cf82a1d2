//! A routed run against a plain graph of the same steps: memory and time.
//!
//! ```text
//! cargo bench -p rlm-benches --bench routed              # 1 000 steps, 5 runs each (20 in memory)
//! cargo bench -p rlm-benches --bench routed -- --quick   # 3 runs each (or RLM_BENCH_QUICK=1)
//! ```
//!
//! Two agents hand work back and forth, `a → b → a …`, for 1 000 node steps; each step puts
//! one message on record in `messages` (`{author, content, topic}`, as an LLM agent does
//! under a router) and counts the steps. The **routed** graph leaves every node through an
//! active router (a decision record appended to `decisions` after every node); the
//! **plain** graph has the same nodes joined by plain edges. Each runs twice: in memory (no
//! sinks) and as `rlm flow run` runs it — the JSONL event log written to a file and every
//! node (and routing decision) checkpointed to an SQLite file. Routed and plain runs
//! alternate, so both see the same machine.
//!
//! Reported per variant: the median wall time, the median peak of heap bytes allocated
//! while the run ran and the allocations a step (a counting global allocator), and the ratio
//! routed / plain of each. A run in memory takes milliseconds, so those are run four times as
//! often as the durable ones, and their CPU time is reported too: all of such a run is on the
//! bench's thread, and on a loaded machine its CPU time varies far less than its wall time.
//! Target: a routed run within 2× the memory and time of the plain graph.
//!
//! Before and after, in the same run: a routed step's node checkpoint and its decision's go
//! into the store as one chain in one transaction (`Store::put_chain`); they used to be a
//! transaction each. The durable routed run is measured a second time through a store that
//! writes each checkpoint of a chain in a transaction of its own, as before — the same
//! rows, one more transaction per step.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use async_trait::async_trait;
use engine::durable::{
    CheckpointId, CheckpointRecord, CheckpointState, Claim, Lease, LeaseHolder, Location,
    NewCheckpoint, NewRun, Owner, PruneReport, RunRecord, RunStatus, SqliteStore, Start, Store,
    StoreError, run_durable,
};
use engine::flow::{
    Agent, Control, EventLog, FlowError, FnAgent, Graph, Invocation, InvocationContext, Router,
    Target, run_workflow,
};
use engine::reducer::MESSAGES;
use engine::route::{Branch, Condition, ControlPlane, END, RouterConfig, RouterMode};
use engine::{SharedState, State, StateDelta};
use rlm_benches::median;
use serde_json::{Value, json};

/// Heap bytes allocated now, their peak since the last reset, and allocations made.
static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

/// The system allocator, counting.
struct Counting;

// SAFETY: every call is forwarded to `System` unchanged; only counters are added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is `System`'s.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            grow(layout.size());
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract is `System`'s.
        unsafe { System.dealloc(ptr, layout) };
        CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract is `System`'s.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
            grow(new_size);
        }
        new
    }
}

fn grow(size: usize) {
    ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    let now = CURRENT.fetch_add(size, Ordering::Relaxed) + size;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const STEPS: u64 = 1_000;

/// Puts a message by `author` on record in `messages`, as an LLM agent does under a router.
fn say(ctx: &InvocationContext, author: &str, step: u64) {
    let message = json!({
        "author": author,
        "content": format!("Step {step}: reviewed the previous work and handed it on."),
        "topic": format!("story-{step}"),
    });
    ctx.append_state(MESSAGES, vec![message]);
}

fn node(name: &'static str) -> Arc<dyn Agent> {
    Arc::new(FnAgent::new(name, move |ctx: &InvocationContext| {
        let steps = ctx.get_state("steps").and_then(|v| v.as_u64()).unwrap_or(0) + 1;
        say(ctx, name, steps);
        ctx.set_state("steps", json!(steps));
        if steps >= STEPS {
            ctx.set_state("done", json!(true));
        }
        Ok(Control::Continue)
    }))
}

/// `b` goes back to `a` until `done`.
struct UntilDone;

#[async_trait]
impl Router for UntilDone {
    async fn route(&self, ctx: &InvocationContext, _from: &str) -> Result<Target, FlowError> {
        Ok(match ctx.get_state("done") {
            Some(Value::Bool(true)) => Target::End,
            _ => Target::node("a"),
        })
    }
}

fn routed() -> anyhow::Result<(Graph, Arc<ControlPlane>)> {
    let config = RouterConfig::new(["a", "b"], [("a", "b")])
        .with_branches(
            "b",
            vec![
                Branch::when(Condition::truthy("done"), END),
                Branch::otherwise("a"),
            ],
        )
        .with_mode(RouterMode::Active);
    let plane = Arc::new(ControlPlane::new(config));
    let graph = plane
        .builder("team", vec![node("a"), node("b")], "a")
        .max_steps(STEPS + 1)
        .build()?;
    Ok((graph, plane))
}

fn plain() -> anyhow::Result<Graph> {
    Ok(Graph::builder("team")
        .node(node("a"))
        .node(node("b"))
        .start("a")
        .max_steps(STEPS + 1)
        .edge("a", Target::node("b"))
        .route("b", Arc::new(UntilDone))
        .build()?)
}

/// A store that writes each checkpoint of a chain in a transaction of its own: how a routed
/// step was checkpointed before its node and decision became one transaction.
#[derive(Debug)]
struct TransactionPerCheckpoint(Arc<dyn Store>);

#[async_trait]
impl Store for TransactionPerCheckpoint {
    fn location(&self) -> &Location {
        self.0.location()
    }
    fn lease_expiry(&self) -> Option<std::time::Duration> {
        self.0.lease_expiry()
    }
    async fn create_run(&self, run: &NewRun, owner: &Owner) -> Result<Lease, StoreError> {
        self.0.create_run(run, owner).await
    }
    async fn claim(&self, run_id: &str, owner: &Owner, take: bool) -> Result<Claim, StoreError> {
        self.0.claim(run_id, owner, take).await
    }
    async fn check_claim(
        &self,
        run_id: &str,
        take_over: bool,
    ) -> Result<Option<LeaseHolder>, StoreError> {
        self.0.check_claim(run_id, take_over).await
    }
    async fn heartbeat(&self, lease: &Lease) -> Result<(), StoreError> {
        self.0.heartbeat(lease).await
    }
    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        self.0.release(lease).await
    }
    async fn write_status(
        &self,
        lease: &Lease,
        status: &RunStatus,
        release: bool,
    ) -> Result<(), StoreError> {
        self.0.write_status(lease, status, release).await
    }
    async fn put_chain(
        &self,
        lease: &Lease,
        checkpoints: Vec<NewCheckpoint<'_>>,
    ) -> Result<Vec<CheckpointId>, StoreError> {
        let mut ids: Vec<CheckpointId> = Vec::new();
        for checkpoint in checkpoints {
            let checkpoint = match ids.last() {
                Some(&previous) => checkpoint.parent(Some(previous)),
                None => checkpoint,
            };
            ids.extend(self.0.put_chain(lease, vec![checkpoint]).await?);
        }
        Ok(ids)
    }
    async fn run(&self, run_id: &str) -> Result<Option<RunRecord>, StoreError> {
        self.0.run(run_id).await
    }
    async fn runs(&self) -> Result<Vec<RunRecord>, StoreError> {
        self.0.runs().await
    }
    async fn history(&self, run_id: &str) -> Result<Vec<CheckpointRecord>, StoreError> {
        self.0.history(run_id).await
    }
    async fn checkpoint(&self, id: CheckpointId) -> Result<CheckpointRecord, StoreError> {
        self.0.checkpoint(id).await
    }
    async fn writes(&self, id: CheckpointId) -> Result<StateDelta, StoreError> {
        self.0.writes(id).await
    }
    async fn state_at(&self, id: CheckpointId) -> Result<CheckpointState, StoreError> {
        self.0.state_at(id).await
    }
    async fn prune(&self, run_id: &str, keep_last: usize) -> Result<PruneReport, StoreError> {
        self.0.prune(run_id, keep_last).await
    }
}

/// The CPU time this thread has used (s).
fn thread_cpu() -> f64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid `timespec` for the call to fill in.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    now.tv_sec as f64 + now.tv_nsec as f64 * 1e-9
}

/// One run: its wall time (s), the peak heap bytes it added, the allocations it made (a
/// reallocation counts as one) and the CPU time of this thread (s: all of a run in memory,
/// which `block_on` runs here; a loaded machine stretches its wall time, not this).
fn measure(run: impl FnOnce() -> anyhow::Result<()>) -> anyhow::Result<[f64; 4]> {
    let start = CURRENT.load(Ordering::Relaxed);
    PEAK.store(start, Ordering::Relaxed);
    let allocations = ALLOCATIONS.load(Ordering::Relaxed);
    let cpu = thread_cpu();
    let started = Instant::now();
    run()?;
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = thread_cpu() - cpu;
    let peak = PEAK.load(Ordering::Relaxed).saturating_sub(start);
    let allocations = ALLOCATIONS.load(Ordering::Relaxed) - allocations;
    Ok([elapsed, peak as f64, allocations as f64, cpu])
}

fn main() -> anyhow::Result<()> {
    let quick =
        std::env::args().any(|a| a == "--quick") || std::env::var_os("RLM_BENCH_QUICK").is_some();
    let runs = if quick { 3 } else { 5 };
    // A run in memory takes milliseconds: four times as many, so that a loaded machine's
    // hiccups fall outside the median.
    let memory_runs = 4 * runs;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let dir = tempfile::tempdir()?;
    let (routed_graph, plane) = routed()?;
    let plain_graph = plain()?;
    let check = |state: &State| {
        anyhow::ensure!(
            state.get("steps") == Some(&json!(STEPS)),
            "the run stopped at {:?} steps",
            state.get("steps")
        );
        Ok(())
    };

    // (routed, plain) samples of [seconds, bytes, allocations, CPU seconds] per variant;
    // durable: then the
    // routed run with a transaction per checkpoint (before).
    let mut memory: [Vec<[f64; 4]>; 2] = [Vec::new(), Vec::new()];
    let mut durable: [Vec<[f64; 4]>; 3] = [Vec::new(), Vec::new(), Vec::new()];
    for run in 0..memory_runs {
        // Routed and plain take turns to go first.
        for i in [run % 2, (run + 1) % 2] {
            let graph = [&routed_graph, &plain_graph][i];
            memory[i].push(measure(|| {
                let invocation = Invocation::new(SharedState::new(State::default()));
                let report = rt.block_on(run_workflow(graph, invocation, None));
                check(&report.state)
            })?);
        }
    }
    for run in 0..runs {
        // Each variant goes first in turn, so a load that drifts favours none of them.
        for i in (0..3).map(|k| (k + run) % 3) {
            let graph = [&routed_graph, &plain_graph, &routed_graph][i];
            let plane = (i != 1).then_some(&plane);
            let base = dir.path().join(format!("{run}-{i}"));
            durable[i].push(measure(|| {
                let sqlite: Arc<dyn Store> =
                    Arc::new(SqliteStore::open(base.with_extension("db"))?);
                let store: Arc<dyn Store> = match i {
                    2 => Arc::new(TransactionPerCheckpoint(sqlite)),
                    _ => sqlite,
                };
                let log = Arc::new(EventLog::create(base.with_extension("jsonl"))?);
                let invocation = Invocation::new(SharedState::new(State::default())).with_sink(log);
                let start = Start::New {
                    workflow: "team".into(),
                    input: json!({}),
                };
                let report =
                    rt.block_on(run_durable(graph, plane, &store, "run", start, invocation))?;
                check(&report.run.state)
            })?);
        }
    }
    println!(
        "routed vs plain graph, {STEPS} node steps, median of {runs} runs ({memory_runs} in memory)"
    );
    println!(
        "{:<56} {:>10} {:>12} {:>10} {:>12}",
        "", "routed", "plain", "ratio", ""
    );
    let before = &[durable[2].clone(), durable[1].clone()];
    for (label, samples) in [
        ("in memory", &memory[..]),
        ("event log + SQLite checkpoints", &durable[..2]),
        ("SQLite, before: a transaction per checkpoint", &before[..]),
    ] {
        let figure = |i: usize, k: usize| median(samples[i].iter().map(|s| s[k]).collect());
        let time = |i: usize| figure(i, 0);
        let bytes = |i: usize| figure(i, 1);
        let allocations = |i: usize| figure(i, 2) / STEPS as f64;
        println!(
            "{:<56} {:>7.1} ms {:>9.1} ms {:>9.2}x",
            format!("{label}: time"),
            time(0) * 1e3,
            time(1) * 1e3,
            time(0) / time(1)
        );
        if label == "in memory" {
            let cpu = |i: usize| figure(i, 3);
            println!(
                "{:<56} {:>7.1} ms {:>9.1} ms {:>9.2}x",
                format!("{label}: CPU time"),
                cpu(0) * 1e3,
                cpu(1) * 1e3,
                cpu(0) / cpu(1)
            );
        }
        println!(
            "{:<56} {:>7.1} MB {:>9.1} MB {:>9.2}x",
            format!("{label}: peak heap"),
            bytes(0) / 1e6,
            bytes(1) / 1e6,
            bytes(0) / bytes(1)
        );
        println!(
            "{:<56} {:>10.1} {:>12.1} {:>9.2}x",
            format!("{label}: allocations a step"),
            allocations(0),
            allocations(1),
            allocations(0) / allocations(1)
        );
    }
    println!("target: routed within 2x the memory and time of the plain graph");
    Ok(())
}
