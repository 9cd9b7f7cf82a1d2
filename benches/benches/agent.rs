//! Agent-loop benchmarks against the in-process mock LM server (no Python involved).
//!
//! ```text
//! cargo bench -p rlm-benches --bench agent             # full (about half a minute)
//! cargo bench -p rlm-benches --bench agent -- --quick  # fewer runs (or RLM_BENCH_QUICK=1)
//! ```
//!
//! 1. The loop's own overhead per iteration: a run of `K` iterations (each reply calls one
//!    no-op tool, the last one answers) through `AgentLoop::run`, against its baseline
//!    measured in the same run, interleaved: the very requests that run sent (captured once
//!    by a hook), made one after another straight through `Endpoint::call`. The difference,
//!    divided by `K`, is what the loop adds per iteration: building the request, hooks,
//!    checking the arguments against the schema, spawning and awaiting the tool task,
//!    metrics, the transcript.
//! 2. One reply calling `N` tools that each sleep 100 ms, against one such call: with the
//!    calls of a reply run concurrently, the wall time stays about 100 ms whatever `N`.
//!
//! The mock serves from a tokio runtime of its own (one worker thread) at 0 ms latency; the
//! loop runs on a second runtime, as `rlm` runs it.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use async_trait::async_trait;
use bridge::mock::{MockConfig, MockServer, Script};
use bridge::{
    Budget, CallOptions, CancellationToken, ChatRequest, ChatResponse, Endpoint, EndpointConfig,
    Ledger, Message,
};
use engine::HookAction;
use engine::agent::{AgentHook, AgentLoop, LoopConfig, Termination, Toolbox};
use engine::{SharedState, Tool, ToolContext, ToolError};
use rlm_benches::percentile;
use serde_json::{Value, json};

/// Iterations of one run in the overhead benchmark.
const K: usize = 10;

fn main() -> anyhow::Result<()> {
    let quick = std::env::args().any(|a| a == "--quick")
        || std::env::var("RLM_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
    let mock_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("mock-lm")
        .enable_all()
        .build()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .thread_name("agent")
        .enable_all()
        .build()?;
    println!(
        "# agent loop benchmarks{}",
        if quick { " (--quick)" } else { "" }
    );
    overhead(&mock_rt, &rt, quick)?;
    parallel_tools(&mock_rt, &rt, quick)?;
    Ok(())
}

/// `noop(i)`: returns `i` at once.
struct Noop;

#[async_trait]
impl Tool for Noop {
    fn name(&self) -> &str {
        "noop"
    }
    fn description(&self) -> &str {
        "Returns its argument."
    }
    fn parameters(&self) -> Value {
        json!({"type": "object", "required": ["i"], "properties": {"i": {"type": "integer"}}})
    }
    async fn call(&self, args: Value, _ctx: &ToolContext) -> Result<Value, ToolError> {
        Ok(args["i"].clone())
    }
}

/// `sleep(ms)`: waits.
struct Sleep;

#[async_trait]
impl Tool for Sleep {
    fn name(&self) -> &str {
        "sleep"
    }
    fn description(&self) -> &str {
        "Waits `ms` milliseconds."
    }
    fn parameters(&self) -> Value {
        json!({"type": "object", "required": ["ms"], "properties": {"ms": {"type": "integer"}}})
    }
    async fn call(&self, args: Value, _ctx: &ToolContext) -> Result<Value, ToolError> {
        let ms = args["ms"].as_u64().unwrap_or_default();
        tokio::time::sleep(Duration::from_millis(ms)).await;
        Ok(json!(ms))
    }
}

/// Keeps a copy of every request the loop sends.
#[derive(Default)]
struct Capture(Mutex<Vec<ChatRequest>>);

impl AgentHook for Capture {
    fn before_model_call(
        &self,
        _iteration: u32,
        request: &mut ChatRequest,
    ) -> HookAction<ChatResponse> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(request.clone());
        HookAction::Continue
    }
}

fn start_mock(rt: &tokio::runtime::Runtime, replies: Vec<Value>) -> anyhow::Result<MockServer> {
    let script = Script::from_json_value(json!({"models": {"*": {"replies": replies}}}))?;
    Ok(rt.block_on(MockServer::start(MockConfig {
        script,
        ..MockConfig::default()
    }))?)
}

fn endpoint(server: &MockServer) -> anyhow::Result<Arc<Endpoint>> {
    let config = EndpointConfig::openai("root", server.openai_base_url(), "mock");
    Ok(Arc::new(Endpoint::new(
        config,
        Arc::new(Ledger::new(Budget::default())),
    )?))
}

fn run_checked(
    rt: &tokio::runtime::Runtime,
    agent: &AgentLoop,
    expected: &str,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let outcome = rt.block_on(agent.run(
        vec![Message::user("Go.")],
        SharedState::default(),
        CancellationToken::new(),
    ))?;
    let wall = started.elapsed();
    anyhow::ensure!(
        outcome.termination == Termination::Answered && outcome.answer == expected,
        "the run ended with {:?} / {:?}, expected the answer {expected:?}",
        outcome.termination,
        outcome.answer
    );
    anyhow::ensure!(
        outcome
            .run
            .metrics
            .tool_calls
            .iter()
            .all(|c| c.failure.is_none()),
        "a tool call failed"
    );
    Ok(wall)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

/// 1. What the loop adds per iteration beyond its model calls.
fn overhead(
    mock_rt: &tokio::runtime::Runtime,
    rt: &tokio::runtime::Runtime,
    quick: bool,
) -> anyhow::Result<()> {
    let (warmup, n) = if quick { (10, 50) } else { (30, 300) };
    let mut replies: Vec<Value> = (0..K - 1)
        .map(|i| json!({"tool_call": {"name": "noop", "arguments": {"i": i}}}))
        .collect();
    replies.push(json!("done"));
    let server = start_mock(mock_rt, replies)?;
    let endpoint = endpoint(&server)?;
    let mut toolbox = Toolbox::new();
    toolbox.add(Arc::new(Noop))?;
    let agent = AgentLoop::new(Arc::clone(&endpoint), toolbox, LoopConfig::default());

    // The requests of one run, exactly as the loop sends them.
    let capture = Arc::new(Capture::default());
    run_checked(rt, &agent.clone().with_hook(capture.clone()), "done")?;
    let requests = std::mem::take(&mut *capture.0.lock().unwrap_or_else(PoisonError::into_inner));
    anyhow::ensure!(requests.len() == K, "captured {} requests", requests.len());
    let baseline = || -> anyhow::Result<Duration> {
        let started = Instant::now();
        for request in &requests {
            rt.block_on(endpoint.call(request.clone(), &CallOptions::default()))
                .context("baseline call")?;
        }
        Ok(started.elapsed())
    };

    for _ in 0..warmup {
        run_checked(rt, &agent, "done")?;
        baseline()?;
    }
    let (mut runs, mut bases) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        runs.push(ms(run_checked(rt, &agent, "done")?));
        bases.push(ms(baseline()?));
    }
    let (runs, bases) = (sorted(runs), sorted(bases));
    let q = |v: &[f64], q: f64| percentile(v, q);
    let per_iteration = |q_: f64| (q(&runs, q_) - q(&bases, q_)) / K as f64;

    println!();
    println!(
        "## 1. loop overhead per iteration (mock at 0 ms, {K} iterations per run, {n} runs after {warmup} warm-up, interleaved with the baseline)"
    );
    println!("| measure | median ms | p90 ms |");
    println!("|---|---:|---:|");
    let row = |label: &str, v: &[f64]| {
        println!("| {label} | {:.3} | {:.3} |", q(v, 0.5), q(v, 0.9));
    };
    row(
        &format!("`AgentLoop::run`, {K} iterations, one no-op tool call in each but the last"),
        &runs,
    );
    row(
        &format!("baseline: the same {K} requests through `Endpoint::call`"),
        &bases,
    );
    println!(
        "| **overhead per iteration = (run − baseline) / {K}** | **{:.3}** | {:.3} |",
        per_iteration(0.5),
        per_iteration(0.9)
    );
    let verdict = if per_iteration(0.5) <= 0.2 {
        "met"
    } else {
        "MISSED"
    };
    println!(
        "overhead columns: difference of the medians and of the p90s over {K}; target median ≤ 0.2 ms → {verdict}"
    );
    drop(agent);
    mock_rt.block_on(server.shutdown());
    Ok(())
}

/// 2. N tool calls of 100 ms in one reply against one.
fn parallel_tools(
    mock_rt: &tokio::runtime::Runtime,
    rt: &tokio::runtime::Runtime,
    quick: bool,
) -> anyhow::Result<()> {
    const SLEEP_MS: u64 = 100;
    let runs = if quick { 3 } else { 10 };
    let widths: &[usize] = if quick {
        &[1, 8, 32]
    } else {
        &[1, 2, 8, 32, 128]
    };
    println!();
    println!(
        "## 2. N tool calls of {SLEEP_MS} ms in one reply (mock at 0 ms, median of {runs} runs; `max_concurrent_tools` = N)"
    );
    println!("| N | wall ms | tool time ms (sum) | ratio to N = 1 |");
    println!("|---:|---:|---:|---:|");
    let mut one = None;
    let mut worst: f64 = 0.0;
    for &width in widths {
        let calls: Vec<Value> = (0..width)
            .map(|_| json!({"name": "sleep", "arguments": {"ms": SLEEP_MS}}))
            .collect();
        let server = start_mock(mock_rt, vec![json!({"tool_calls": calls}), json!("slept")])?;
        let mut toolbox = Toolbox::new();
        toolbox.add(Arc::new(Sleep))?;
        let config = LoopConfig {
            max_concurrent_tools: width,
            ..LoopConfig::default()
        };
        let agent = AgentLoop::new(endpoint(&server)?, toolbox, config);
        run_checked(rt, &agent, "slept")?;
        let walls = sorted(
            (0..runs)
                .map(|_| run_checked(rt, &agent, "slept").map(ms))
                .collect::<anyhow::Result<Vec<_>>>()?,
        );
        let wall = percentile(&walls, 0.5);
        let base = *one.get_or_insert(wall);
        let ratio = wall / base;
        worst = worst.max(ratio);
        println!(
            "| {width} | {wall:.1} | {} | {ratio:.3} |",
            width as u64 * SLEEP_MS
        );
        mock_rt.block_on(server.shutdown());
    }
    let verdict = if worst <= 1.2 { "met" } else { "MISSED" };
    println!(
        "ratio = wall(N) / wall(1), both measured above; target: about 1 (≤ 1.2) for every N → {verdict}"
    );
    Ok(())
}
