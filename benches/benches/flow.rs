//! The workflow engine's own cost per agent step, beyond the work of the agents.
//!
//! ```text
//! cargo bench -p rlm-benches --bench flow              # 1 000 steps, 7 runs each
//! cargo bench -p rlm-benches --bench flow -- --quick   # 3 runs each (or RLM_BENCH_QUICK=1)
//! ```
//!
//! **Engine step**: a `LoopAgent` of `max_iterations` 1 000 around one Rust step that reads
//! a counter from the state and writes it back plus one. Each iteration is a full agent run
//! through the executor: a limits check, a child context, `Start` / `Iteration` / `End`
//! events with the state delta, the node observers, the edge. The baseline is the same step
//! function called 1 000 times on a bare context in the same run; the engine's own cost per
//! step is `(loop − baseline) / 1 000`. A second row adds the JSONL event log (a write and
//! a flush per event) to the same loop. Target: ≤ 0.05 ms per step.
//!
//! The median of the runs is reported.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use engine::flow::{
    Agent, Control, EventLog, FlowError, FnAgent, Graph, Invocation, InvocationContext,
    run_workflow,
};
use engine::{SharedState, State};
use rlm_benches::percentile;
use serde_json::json;

const STEPS: u32 = 1_000;

fn step(ctx: &InvocationContext) -> Result<Control, FlowError> {
    let n = ctx.get_state("n").and_then(|v| v.as_u64()).unwrap_or(0);
    ctx.set_state("n", json!(n + 1));
    Ok(Control::Continue)
}

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    percentile(&samples, 0.5)
}

fn main() -> anyhow::Result<()> {
    let quick =
        std::env::args().any(|a| a == "--quick") || std::env::var_os("RLM_BENCH_QUICK").is_some();
    let runs = if quick { 3 } else { 7 };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let max = NonZeroU32::new(STEPS).unwrap_or(NonZeroU32::MIN);
    let body: Arc<dyn Agent> = Arc::new(FnAgent::new("step", step));
    let flow = Graph::looping("loop", vec![body], max)?;
    let dir = tempfile::tempdir()?;

    let mut baseline = Vec::new();
    let mut plain = Vec::new();
    let mut logged = Vec::new();
    for run in 0..runs {
        let ctx = InvocationContext::new(Invocation::new(SharedState::new(State::default())));
        let started = Instant::now();
        for _ in 0..STEPS {
            step(&ctx)?;
        }
        baseline.push(started.elapsed().as_secs_f64());

        let invocation = Invocation::new(SharedState::new(State::default()));
        let started = Instant::now();
        let report = rt.block_on(run_workflow(&flow, invocation, None));
        plain.push(started.elapsed().as_secs_f64());
        anyhow::ensure!(
            report.state.get("n") == Some(&json!(STEPS)),
            "the loop ran short"
        );

        let log = Arc::new(EventLog::create(
            dir.path().join(format!("events-{run}.jsonl")),
        )?);
        let invocation = Invocation::new(SharedState::new(State::default())).with_sink(log);
        let started = Instant::now();
        let report = rt.block_on(run_workflow(&flow, invocation, None));
        logged.push(started.elapsed().as_secs_f64());
        anyhow::ensure!(report.result.is_ok(), "the logged loop failed");
    }
    let baseline = median(baseline);
    let per_step =
        |total: f64| Duration::from_secs_f64((total - baseline).max(0.0) / f64::from(STEPS));
    println!("engine cost per agent step, {STEPS}-step LoopAgent, median of {runs} runs");
    println!("{:<34} {:>12} {:>16}", "", "whole loop", "engine per step");
    println!(
        "{:<34} {:>9.3} ms {:>16}",
        "baseline (step function alone)",
        baseline * 1e3,
        "-"
    );
    for (label, total) in [
        ("loop, no sinks", median(plain)),
        ("loop + JSONL event log", median(logged)),
    ] {
        println!(
            "{label:<34} {:>9.3} ms {:>13.4} ms",
            total * 1e3,
            per_step(total).as_secs_f64() * 1e3
        );
    }
    println!("target: <= 0.05 ms per step");
    Ok(())
}
