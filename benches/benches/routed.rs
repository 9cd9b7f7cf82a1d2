//! A routed run against a plain graph of the same steps: memory and time.
//!
//! ```text
//! cargo bench -p rlm-benches --bench routed              # 1 000 steps, 5 runs each
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
//! Reported per variant: the median wall time and the median peak of heap bytes allocated
//! while the run ran (a counting global allocator), and the ratio routed / plain of each.
//! Target: a routed run within 2× the memory and time of the plain graph.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use async_trait::async_trait;
use engine::durable::{SqliteStore, Start, Store, run_durable};
use engine::flow::{
    Agent, Control, EventLog, FlowError, FnAgent, Graph, Invocation, InvocationContext, Router,
    Target, run_workflow,
};
use engine::reducer::MESSAGES;
use engine::route::{Branch, Condition, ControlPlane, END, RouterConfig, RouterMode};
use engine::{SharedState, State};
use rlm_benches::median;
use serde_json::{Value, json};

/// Heap bytes allocated now, and their peak since the last reset.
static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

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

/// One run: its wall time (s) and the peak heap bytes it added.
fn measure(run: impl FnOnce() -> anyhow::Result<()>) -> anyhow::Result<(f64, f64)> {
    let start = CURRENT.load(Ordering::Relaxed);
    PEAK.store(start, Ordering::Relaxed);
    let started = Instant::now();
    run()?;
    let elapsed = started.elapsed().as_secs_f64();
    let peak = PEAK.load(Ordering::Relaxed).saturating_sub(start);
    Ok((elapsed, peak as f64))
}

fn main() -> anyhow::Result<()> {
    let quick =
        std::env::args().any(|a| a == "--quick") || std::env::var_os("RLM_BENCH_QUICK").is_some();
    let runs = if quick { 3 } else { 5 };
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

    // (routed, plain) samples of (seconds, bytes) per variant.
    let mut memory: [Vec<(f64, f64)>; 2] = [Vec::new(), Vec::new()];
    let mut durable: [Vec<(f64, f64)>; 2] = [Vec::new(), Vec::new()];
    for run in 0..runs {
        for (i, graph) in [&routed_graph, &plain_graph].into_iter().enumerate() {
            memory[i].push(measure(|| {
                let invocation = Invocation::new(SharedState::new(State::default()));
                let report = rt.block_on(run_workflow(graph, invocation, None));
                check(&report.state)
            })?);
        }
        for (i, graph) in [&routed_graph, &plain_graph].into_iter().enumerate() {
            let plane = (i == 0).then_some(&plane);
            let base = dir.path().join(format!("{run}-{i}"));
            durable[i].push(measure(|| {
                let store: Arc<dyn Store> = Arc::new(SqliteStore::open(base.with_extension("db"))?);
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
    println!("routed vs plain graph, {STEPS} node steps, median of {runs} runs");
    println!(
        "{:<40} {:>10} {:>12} {:>10} {:>12}",
        "", "routed", "plain", "ratio", ""
    );
    for (label, samples) in [
        ("in memory", &memory),
        ("event log + SQLite checkpoints", &durable),
    ] {
        let time = |i: usize| median(samples[i].iter().map(|s| s.0).collect());
        let bytes = |i: usize| median(samples[i].iter().map(|s| s.1).collect());
        println!(
            "{:<40} {:>7.1} ms {:>9.1} ms {:>9.2}x",
            format!("{label}: time"),
            time(0) * 1e3,
            time(1) * 1e3,
            time(0) / time(1)
        );
        println!(
            "{:<40} {:>7.1} MB {:>9.1} MB {:>9.2}x",
            format!("{label}: peak heap"),
            bytes(0) / 1e6,
            bytes(1) / 1e6,
            bytes(0) / bytes(1)
        );
    }
    println!("target: routed within 2x the memory and time of the plain graph");
    Ok(())
}
