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
//! **LLM-agent step**: a `LoopAgent` of 200 iterations around one `LlmAgent` (instruction
//! from the state, `output_key`, no tools, `include_contents: none` so every request is the
//! same size) against the in-process mock LM at 0 ms latency, over OpenAI's wire format;
//! the baseline is the same number of raw `Endpoint::call`s of the same request size in the
//! same run. Reported: ms per step, ms per raw call, and their ratio. (For reference:
//! google-adk 2.13 with LiteLLM spends about 18 ms per LLM-agent step against a local mock
//! on this machine.)
//!
//! The median of the runs is reported.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bridge::mock::{MockConfig, MockServer, Script};
use bridge::{CallOptions, ChatRequest, Endpoint, EndpointConfig, Ledger, Message};
use engine::flow::file::IncludeContents;
use engine::flow::{
    Agent, Control, EventLog, FlowError, FnAgent, Graph, Invocation, InvocationContext, LlmAgent,
    run_workflow,
};
use engine::{SharedState, State};
use rlm_benches::median;
use serde_json::json;

const STEPS: u32 = 1_000;
const LLM_STEPS: u32 = 200;

fn step(ctx: &InvocationContext) -> Result<Control, FlowError> {
    let n = ctx.get_state("n").and_then(|v| v.as_u64()).unwrap_or(0);
    ctx.set_state("n", json!(n + 1));
    Ok(Control::Continue)
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
    println!();
    llm_steps(&rt, runs)
}

/// The LLM-agent rows (see the module docs).
fn llm_steps(rt: &tokio::runtime::Runtime, runs: usize) -> anyhow::Result<()> {
    let server = rt.block_on(MockServer::start(MockConfig {
        script: Script::from_json_value(json!({"models": {"*": {"replies": ["The answer."]}}}))?,
        ..MockConfig::default()
    }))?;
    let endpoint = Arc::new(Endpoint::new(
        EndpointConfig::openai("root", server.openai_base_url(), "mock"),
        Arc::new(Ledger::default()),
    )?);
    let agent = LlmAgent::builder("answerer", endpoint.clone())
        .instruction("Answer the question about {topic}.")
        .include_contents(IncludeContents::None)
        .output_key("answer")
        .build()?;
    let max = NonZeroU32::new(LLM_STEPS).unwrap_or(NonZeroU32::MIN);
    let flow = Graph::looping("loop", vec![Arc::new(agent) as Arc<dyn Agent>], max)?;
    let request = ChatRequest {
        messages: vec![
            Message::system("Answer the question about sales."),
            Message::user("Continue."),
        ],
        ..ChatRequest::default()
    };
    let mut raw = Vec::new();
    let mut steps = Vec::new();
    for _ in 0..runs {
        let started = Instant::now();
        rt.block_on(async {
            for _ in 0..LLM_STEPS {
                endpoint
                    .call(request.clone(), &CallOptions::default())
                    .await?;
            }
            anyhow::Ok(())
        })?;
        raw.push(started.elapsed().as_secs_f64() / f64::from(LLM_STEPS));

        let mut state = State::default();
        state.set("topic", json!("sales"));
        let started = Instant::now();
        let report = rt.block_on(run_workflow(
            &flow,
            Invocation::new(SharedState::new(state)),
            None,
        ));
        steps.push(started.elapsed().as_secs_f64() / f64::from(LLM_STEPS));
        anyhow::ensure!(
            report.state.get("answer") == Some(&json!("The answer.")),
            "a step failed"
        );
    }
    let (raw, step) = (median(raw), median(steps));
    println!(
        "LLM-agent step against the mock at 0 ms, {LLM_STEPS}-step LoopAgent, median of {runs} runs"
    );
    println!("{:<34} {:>9.3} ms", "raw Endpoint::call", raw * 1e3);
    println!(
        "{:<34} {:>9.3} ms",
        "LlmAgent step (engine + loop + call)",
        step * 1e3
    );
    println!("{:<34} {:>9.2}x", "ratio step / raw call", step / raw);
    println!("reference: google-adk 2.13 + LiteLLM, about 18 ms per step on this machine");
    rt.block_on(server.shutdown());
    Ok(())
}
