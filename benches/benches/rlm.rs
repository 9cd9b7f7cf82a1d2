//! RLM loop benchmarks against the in-process mock LM server.
//!
//! ```text
//! cargo bench -p rlm-benches --bench rlm             # full (a few minutes; writes up to 200 MB to the temp dir)
//! cargo bench -p rlm-benches --bench rlm -- --quick  # fewer runs, smaller contexts (or RLM_BENCH_QUICK=1)
//! ```
//!
//! 1. Fixed overhead of a one-iteration run: `Rlm::run` on a session already started, against
//!    its baseline measured in the same run (one raw root `Endpoint::call` of the same first
//!    request plus one `ReplSession::exec` of the same block). Interpreter and session start
//!    are reported apart.
//! 2. Six iterations over a 50 MB text context and over a tiny one: wall time per iteration
//!    (from a hook's clock), the root call and block times from the iteration records, and
//!    each root request's size from the mock's request log (the context is never sent).
//! 3. Peak RSS against context size: a one-iteration loop in a child process per size (this
//!    binary re-executed with `--rss-child FILE`), so one size's peak does not hide another's.
//! 4. `llm_query_batched` of K = 1000 prompts at 50 ms through the whole loop against the
//!    bridge's own `Endpoint::batch` of the same requests at the same width, same server; and
//!    the same loop over an isolated session (a worker process, `--isolation process`)
//!    against the in-process one, rounds interleaved.
//!
//! The mock serves from a tokio runtime of its own (one worker thread); the kernel's calls run
//! on `kernel::runtime::shared()`, and `Rlm::run` is called from the main thread, which is not
//! inside any runtime. The root model answers without latency (a per-model override in the
//! script); sub-models echo the prompt.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use bridge::mock::{Latency, MockConfig, MockServer, Script};
use bridge::{
    BatchPolicy, Budget, CallOptions, CancellationToken, ChatRequest, EndpointConfig, Endpoints,
    Ledger, Message,
};
use kernel::repl::{ContextSource, ReplSession, SessionConfig};
use kernel::rlm::{Hook, HookAction, Rlm, RlmConfig, RlmResult, TerminationReason};
use rlm_benches::{generate_text, percentile, status_kib};
use serde_json::json;

const ROOT_MODEL: &str = "root-model";
const SUB_MODEL: &str = "sub-model";
const MB: u64 = 1 << 20;

fn main() -> anyhow::Result<()> {
    rlm_benches::serve_as_worker();
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--rss-child") {
        let path = args
            .get(i + 1)
            .map(PathBuf::from)
            .context("`--rss-child` needs a context file")?;
        return rss_child(&path);
    }
    let quick = args.iter().any(|a| a == "--quick")
        || std::env::var("RLM_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
    let mock_rt = mock_runtime()?;
    let dir = tempfile::Builder::new()
        .prefix("rlm-loop-bench")
        .tempdir()?;
    println!(
        "# rlm loop benchmarks{}",
        if quick { " (--quick)" } else { "" }
    );
    fixed_overhead(&mock_rt, quick)?;
    flat_iterations(&mock_rt, dir.path(), quick)?;
    peak_rss(dir.path(), quick)?;
    fan_out(&mock_rt, quick)?;
    Ok(())
}

/// The mock's own runtime, so it does not compete with the kernel's for worker threads.
fn mock_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("mock-lm")
        .enable_all()
        .build()?)
}

/// A mock whose root model answers `replies` by turn, at once; every other model echoes
/// after `latency`.
fn start_mock(
    rt: &tokio::runtime::Runtime,
    replies: &[String],
    latency: Latency,
) -> anyhow::Result<MockServer> {
    let script = Script::from_json_value(json!({
        "models": {
            ROOT_MODEL: {"replies": replies, "latency": {"kind": "none"}},
            "*": {"replies": [{"behaviour": "echo"}]},
        }
    }))?;
    Ok(rt.block_on(MockServer::start(MockConfig {
        script,
        latency,
        ..MockConfig::default()
    }))?)
}

/// `root` and `sub` endpoints as `rlm run` builds them: root calls do not count toward the
/// call budget; the sub endpoint admits at least `width` calls in flight (default 128).
fn endpoints(server: &MockServer, width: usize) -> anyhow::Result<Arc<Endpoints>> {
    let url = server.openai_base_url();
    let root = EndpointConfig {
        counts_toward_call_budget: false,
        ..EndpointConfig::openai("root", &url, ROOT_MODEL)
    };
    let sub = EndpointConfig {
        max_in_flight: EndpointConfig::default().max_in_flight.max(width),
        ..EndpointConfig::openai("sub", &url, SUB_MODEL)
    };
    Ok(Arc::new(Endpoints::new(
        vec![root, sub],
        Arc::new(Ledger::new(Budget::default())),
    )?))
}

fn repl_reply(code: &str) -> String {
    format!("Let me look.\n```repl\n{code}\n```")
}

/// Runs the loop once and checks that it ended with `expected`.
fn run_checked(
    rlm: &mut Rlm,
    query: &str,
    expected: &str,
) -> anyhow::Result<(Duration, RlmResult)> {
    let started = Instant::now();
    let result = rlm.run(query)?;
    let wall = started.elapsed();
    anyhow::ensure!(
        result.termination_reason == TerminationReason::FinalAnswer
            && result.answer.as_deref() == Some(expected),
        "the run ended with {:?} / {:?} ({:?}), expected the answer {expected:?}",
        result.termination_reason,
        result.answer,
        result.error
    );
    Ok((wall, result))
}

/// Instants at the start of every iteration and at the end of the run.
#[derive(Debug, Clone, Default)]
struct IterationClock(Arc<Mutex<Vec<Instant>>>);

impl IterationClock {
    fn take(&self) -> Vec<Instant> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }

    fn mark(&self) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Instant::now());
    }
}

impl Hook for IterationClock {
    fn before_iteration(&mut self, _iteration: u32, _messages: &[Message]) -> HookAction<String> {
        self.mark();
        HookAction::Continue
    }

    fn after_run(&mut self, _result: &mut RlmResult) {
        self.mark();
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

fn median(v: &[f64]) -> f64 {
    percentile(&sorted(v.to_vec()), 0.5)
}

/// 1. What a one-iteration run costs beyond its model call and its block.
fn fixed_overhead(mock_rt: &tokio::runtime::Runtime, quick: bool) -> anyhow::Result<()> {
    let (warmup, n) = if quick { (10, 100) } else { (30, 1000) };
    let block = "x = 6 * 7\nFINAL_VAR(x)";
    let reply = repl_reply(block);
    let server = start_mock(mock_rt, std::slice::from_ref(&reply), Latency::None)?;
    let eps = endpoints(&server, 1)?;
    let context = || [ContextSource::Text("alpha beta gamma delta".to_owned())];

    let started = Instant::now();
    let session = ReplSession::new(SessionConfig::default(), Arc::clone(&eps), &context())?;
    let first_start = started.elapsed();
    let started = Instant::now();
    drop(ReplSession::new(
        SessionConfig::default(),
        Arc::clone(&eps),
        &context(),
    )?);
    let next_start = started.elapsed();

    let session = Arc::new(session);
    let mut rlm = Rlm::new(RlmConfig::default(), Arc::clone(&eps), Arc::clone(&session));
    let query = "What is six times seven?";
    // Exactly the first root request of a run.
    let prompts = rlm.prompts();
    let request = ChatRequest {
        messages: vec![
            Message::system(prompts.system_prompt()),
            Message::user(prompts.first_message(session.contexts(), query)),
        ],
        ..ChatRequest::default()
    };
    let root = eps.get("root")?;
    let rt = kernel::runtime::shared();
    let baseline = || -> anyhow::Result<Duration> {
        let started = Instant::now();
        let response = rt.block_on(root.call(request.clone(), &CallOptions::default()))?;
        let result = session.exec(block)?;
        let wall = started.elapsed();
        anyhow::ensure!(response.content == reply, "unexpected root reply");
        anyhow::ensure!(
            result.final_answer().is_some(),
            "the block gave no final answer"
        );
        Ok(wall)
    };

    for _ in 0..warmup {
        run_checked(&mut rlm, query, "42")?;
        baseline()?;
    }
    let (mut runs, mut model, mut exec, mut bases) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..n {
        let (wall, result) = run_checked(&mut rlm, query, "42")?;
        runs.push(ms(wall));
        model.push(result.iterations[0].model_ms);
        exec.push(result.iterations[0].execution_ms);
        bases.push(ms(baseline()?));
    }
    let (runs, model, exec, bases) = (sorted(runs), sorted(model), sorted(exec), sorted(bases));
    let q = |v: &[f64], q: f64| percentile(v, q);
    let overhead = (
        q(&runs, 0.5) - q(&bases, 0.5),
        q(&runs, 0.9) - q(&bases, 0.9),
    );

    println!();
    println!(
        "## 1. fixed overhead of a one-iteration run (mock at 0 ms, {n} runs after {warmup} warm-up, interleaved with the baseline)"
    );
    println!("| measure | median ms | p90 ms |");
    println!("|---|---:|---:|");
    println!(
        "| interpreter start + first session (once) | {:.3} | — |",
        ms(first_start)
    );
    println!(
        "| a further session start (once) | {:.3} | — |",
        ms(next_start)
    );
    let row = |label: &str, v: &[f64]| {
        println!("| {label} | {:.3} | {:.3} |", q(v, 0.5), q(v, 0.9));
    };
    row("`Rlm::run`, one iteration, `FINAL_VAR` in the block", &runs);
    row("  of which the root call (`model_ms`)", &model);
    row("  of which the block (`execution_ms`)", &exec);
    row(
        "baseline: root `Endpoint::call` + `ReplSession::exec` of the block",
        &bases,
    );
    println!(
        "| **overhead = run − baseline** | **{:.3}** | {:.3} |",
        overhead.0, overhead.1
    );
    let verdict = if overhead.0 <= 5.0 { "met" } else { "MISSED" };
    println!(
        "overhead columns: difference of the medians and of the p90s; target median ≤ 5 ms → {verdict}"
    );
    drop(rlm);
    drop(session);
    mock_rt.block_on(server.shutdown());
    Ok(())
}

const ITERATIONS: usize = 6;

/// One context's loop in the iteration benchmark, and what its runs measured.
struct IterationProfile {
    rlm: Rlm,
    clock: IterationClock,
    expected: String,
    load_ms: f64,
    /// One row per run, one column per iteration: wall, root call and block time in ms.
    walls: Vec<Vec<f64>>,
    models: Vec<Vec<f64>>,
    execs: Vec<Vec<f64>>,
    /// Request body bytes of each root call of the last run, from the mock's log.
    request_bytes: Vec<usize>,
}

impl IterationProfile {
    const QUERY: &str = "How long is the context?";

    fn start(eps: &Arc<Endpoints>, source: ContextSource) -> anyhow::Result<Self> {
        let started = Instant::now();
        let session = ReplSession::new(SessionConfig::default(), Arc::clone(eps), &[source])?;
        let load_ms = ms(started.elapsed());
        let expected = session.contexts()[0].chars.unwrap_or(0).to_string();
        let mut rlm = Rlm::new(RlmConfig::default(), Arc::clone(eps), Arc::new(session));
        let clock = IterationClock::default();
        rlm.add_hook(clock.clone());
        run_checked(&mut rlm, Self::QUERY, &expected)?; // warm-up
        Ok(Self {
            rlm,
            clock,
            expected,
            load_ms,
            walls: Vec::new(),
            models: Vec::new(),
            execs: Vec::new(),
            request_bytes: Vec::new(),
        })
    }

    fn measure(&mut self, server: &MockServer) -> anyhow::Result<()> {
        self.clock.take();
        server.log().clear();
        let (_, result) = run_checked(&mut self.rlm, Self::QUERY, &self.expected)?;
        let marks = self.clock.take();
        anyhow::ensure!(
            result.iterations.len() == ITERATIONS && marks.len() == ITERATIONS + 1,
            "expected {ITERATIONS} iterations, got {}",
            result.iterations.len()
        );
        self.walls
            .push(marks.windows(2).map(|w| ms(w[1] - w[0])).collect());
        self.models
            .push(result.iterations.iter().map(|r| r.model_ms).collect());
        self.execs
            .push(result.iterations.iter().map(|r| r.execution_ms).collect());
        self.request_bytes = server
            .log()
            .entries()
            .into_iter()
            .filter(|r| r.model == ROOT_MODEL)
            .map(|r| r.request_bytes)
            .collect();
        Ok(())
    }

    /// Per iteration, the median over runs of one measure.
    fn medians(rows: &[Vec<f64>]) -> Vec<f64> {
        (0..ITERATIONS)
            .map(|i| median(&rows.iter().map(|r| r[i]).collect::<Vec<_>>()))
            .collect()
    }
}

/// 2. Six iterations over a 50 MB text context and over a tiny one, runs interleaved.
fn flat_iterations(
    mock_rt: &tokio::runtime::Runtime,
    dir: &Path,
    quick: bool,
) -> anyhow::Result<()> {
    let runs = if quick { 3 } else { 20 };
    let replies: Vec<String> = (1..=ITERATIONS)
        .map(|k| {
            let mut code = format!(
                "n = len(context)\nmid = context[n // 2 : n // 2 + 100]\nprint({k}, n, mid.count(' '))"
            );
            if k == ITERATIONS {
                code.push_str("\nFINAL_VAR(n)");
            }
            repl_reply(&code)
        })
        .collect();
    let server = start_mock(mock_rt, &replies, Latency::None)?;
    let eps = endpoints(&server, 1)?;

    let big = dir.join("context-50mb.txt");
    generate_text(&big, 50 * MB)?;
    let big_bytes = std::fs::metadata(&big)?.len();
    let mut large = IterationProfile::start(&eps, ContextSource::Path(big.clone()))?;
    std::fs::remove_file(&big)?;
    let tiny = "alpha beta gamma delta ".repeat(4);
    let mut small = IterationProfile::start(&eps, ContextSource::Text(tiny))?;
    for _ in 0..runs {
        large.measure(&server)?;
        small.measure(&server)?;
    }
    let columns = |p: &IterationProfile| {
        (
            IterationProfile::medians(&p.walls),
            IterationProfile::medians(&p.models),
            IterationProfile::medians(&p.execs),
        )
    };
    let (big_wall, big_model, big_exec) = columns(&large);
    let (tiny_wall, tiny_model, tiny_exec) = columns(&small);

    println!();
    println!(
        "## 2. {ITERATIONS} iterations, each block `len(context)` + a 100-char slice (median of {runs} runs, the two contexts alternating; loaded once: 50 MB in {:.0} ms, tiny in {:.1} ms)",
        large.load_ms, small.load_ms
    );
    println!(
        "| iteration | 50 MB: wall ms | root call ms | block ms | root request bytes | tiny: wall ms | root call ms | block ms | root request bytes | wall 50 MB / tiny |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let bytes = |p: &IterationProfile, i: usize| {
        p.request_bytes
            .get(i)
            .map_or_else(|| "?".to_owned(), ToString::to_string)
    };
    for i in 0..ITERATIONS {
        println!(
            "| {} | {:.3} | {:.3} | {:.3} | {} | {:.3} | {:.3} | {:.3} | {} | {:.2}× |",
            i + 1,
            big_wall[i],
            big_model[i],
            big_exec[i],
            bytes(&large, i),
            tiny_wall[i],
            tiny_model[i],
            tiny_exec[i],
            bytes(&small, i),
            big_wall[i] / tiny_wall[i],
        );
    }
    let spread = |v: &[f64]| {
        let s = sorted(v.to_vec());
        (s[s.len() - 1] - s[0], s[s.len() - 1] / s[0])
    };
    let (big_abs, big_rel) = spread(&big_wall);
    let (tiny_abs, tiny_rel) = spread(&tiny_wall);
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    println!(
        "spread of wall over iterations 1..{ITERATIONS} (max − min, max / min): 50 MB {big_abs:.3} ms, {big_rel:.2}×; tiny {tiny_abs:.3} ms, {tiny_rel:.2}×; mean per iteration 50 MB {:.3} ms vs tiny {:.3} ms",
        mean(&big_wall),
        mean(&tiny_wall)
    );
    let largest_request = large.request_bytes.iter().copied().max().unwrap_or(0);
    println!(
        "largest root request with the 50 MB context: {largest_request} bytes ({:.5}% of the context)",
        largest_request as f64 * 100.0 / big_bytes as f64
    );
    drop((large, small));
    mock_rt.block_on(server.shutdown());
    Ok(())
}

/// Child of [`peak_rss`]: one one-iteration loop over the file at `path`; prints one JSON line.
fn rss_child(path: &Path) -> anyhow::Result<()> {
    let mock_rt = mock_runtime()?;
    let reply = repl_reply("n = len(context)\nFINAL_VAR(n)");
    let server = start_mock(&mock_rt, &[reply], Latency::None)?;
    let eps = endpoints(&server, 1)?;
    // Interpreter, runtimes and connections up before the context is loaded.
    let warm = ReplSession::new(SessionConfig::default(), Arc::clone(&eps), &[])?;
    warm.exec("import json")?;
    kernel::runtime::shared().block_on(
        eps.get("root")?
            .call(ChatRequest::from_prompt("hi"), &CallOptions::default()),
    )?;
    let before_kib = status_kib("VmRSS:");
    let started = Instant::now();
    let session = ReplSession::new(
        SessionConfig::default(),
        Arc::clone(&eps),
        &[ContextSource::Path(path.to_owned())],
    )?;
    let expected = session.contexts()[0].chars.unwrap_or(0).to_string();
    let mut rlm = Rlm::new(RlmConfig::default(), eps, Arc::new(session));
    run_checked(&mut rlm, "How long is the context?", &expected)?;
    let wall_ms = ms(started.elapsed());
    println!(
        "{}",
        json!({
            "before_kib": before_kib,
            "hwm_kib": status_kib("VmHWM:"),
            "rss_kib": status_kib("VmRSS:"),
            "wall_ms": wall_ms,
        })
    );
    drop(rlm);
    mock_rt.block_on(server.shutdown());
    Ok(())
}

/// 3. Peak RSS of a whole one-iteration run against the size of a text context.
fn peak_rss(dir: &Path, quick: bool) -> anyhow::Result<()> {
    let sizes_mb: &[u64] = if quick {
        &[1, 4, 16]
    } else {
        &[1, 10, 50, 200]
    };
    let exe = std::env::current_exe()?;
    let child = |path: &Path| -> anyhow::Result<serde_json::Value> {
        let output = Command::new(&exe).arg("--rss-child").arg(path).output()?;
        anyhow::ensure!(
            output.status.success(),
            "the RSS child failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let stdout = String::from_utf8_lossy(&output.stdout);
        let line = stdout.lines().last().unwrap_or_default();
        Ok(serde_json::from_str(line)?)
    };
    let kib = |v: &serde_json::Value, key: &str| v[key].as_u64().unwrap_or(0) as f64 / 1024.0;

    let empty = dir.join("empty.txt");
    std::fs::write(&empty, "")?;
    let base = child(&empty)?;
    let base_hwm = kib(&base, "hwm_kib");
    std::fs::remove_file(&empty)?;

    println!();
    println!(
        "## 3. peak RSS of a one-iteration run (`len(context)`) against text context size (one child process each)"
    );
    println!(
        "empty context: VmHWM {base_hwm:.1} MB (RSS before the load {:.1} MB, run {:.0} ms)",
        kib(&base, "before_kib"),
        base["wall_ms"].as_f64().unwrap_or(f64::NAN)
    );
    println!(
        "| context MB | VmHWM MB | VmHWM / file | VmHWM − empty run MB | (VmHWM − empty) / file | RSS after run − empty MB | load + run ms |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for &size in sizes_mb {
        let path = dir.join(format!("context-{size}mb.txt"));
        generate_text(&path, size * MB)?;
        let file_mb = std::fs::metadata(&path)?.len() as f64 / MB as f64;
        let report = child(&path)?;
        std::fs::remove_file(&path)?;
        let hwm = kib(&report, "hwm_kib");
        let extra = hwm - base_hwm;
        println!(
            "| {file_mb:.0} | {hwm:.1} | {:.2}× | {extra:.1} | {:.2}× | {:.1} | {:.0} |",
            hwm / file_mb,
            extra / file_mb,
            kib(&report, "rss_kib") - kib(&base, "rss_kib"),
            report["wall_ms"].as_f64().unwrap_or(f64::NAN),
        );
    }
    Ok(())
}

/// 4. `llm_query_batched` of K prompts through the loop against the bridge's own batch.
fn fan_out(mock_rt: &tokio::runtime::Runtime, quick: bool) -> anyhow::Result<()> {
    const K: usize = 1000;
    const WIDTH: usize = 256;
    let latency = Duration::from_millis(50);
    let rounds = if quick { 2 } else { 5 };
    let block = format!(
        "r = llm_query_batched([f'item {{i}}' for i in range({K})])\nassert len(r) == {K} and r[7] == 'item 7', r[7]\nFINAL_VAR(len(r))"
    );
    let server = start_mock(mock_rt, &[repl_reply(&block)], Latency::fixed(latency))?;
    let eps = endpoints(&server, WIDTH)?;
    let config = SessionConfig {
        batch_concurrency: Some(WIDTH),
        cell_timeout: Duration::from_secs(600),
        ..SessionConfig::default()
    };
    let isolated_config = SessionConfig {
        isolation: kernel::repl::Isolation::Process,
        ..config.clone()
    };
    let session = ReplSession::new(config, Arc::clone(&eps), &[])?;
    let mut rlm = Rlm::new(RlmConfig::default(), Arc::clone(&eps), Arc::new(session));
    let isolated_session = ReplSession::new(isolated_config, Arc::clone(&eps), &[])?;
    let mut isolated = Rlm::new(
        RlmConfig::default(),
        Arc::clone(&eps),
        Arc::new(isolated_session),
    );
    let sub = eps.get("sub")?;
    let rt = kernel::runtime::shared();
    let bridge_batch = |k: usize| -> anyhow::Result<Duration> {
        let requests = (0..k)
            .map(|i| ChatRequest::from_prompt(format!("item {i}")))
            .collect();
        let started = Instant::now();
        let out = rt.block_on(sub.batch(
            requests,
            BatchPolicy::bounded(WIDTH),
            &CancellationToken::new(),
        ));
        let wall = started.elapsed();
        let failed = out.iter().filter(|r| r.is_err()).count();
        anyhow::ensure!(
            out.len() == k && failed == 0,
            "{failed} of {k} calls failed"
        );
        Ok(wall)
    };
    let query = "Label every item.";
    let expected = K.to_string();

    // Open the connections and warm both paths.
    bridge_batch(WIDTH)?;
    run_checked(&mut rlm, query, &expected)?;
    run_checked(&mut isolated, query, &expected)?;
    let (mut bridge_walls, mut loop_walls, mut block_ms) = (Vec::new(), Vec::new(), Vec::new());
    let mut isolated_walls = Vec::new();
    let (mut bridge_flight, mut loop_flight) = (0, 0);
    for _ in 0..rounds {
        isolated_walls.push(ms(run_checked(&mut isolated, query, &expected)?.0));
        server.log().clear();
        bridge_walls.push(ms(bridge_batch(K)?));
        bridge_flight = bridge_flight.max(server.log().max_concurrency());
        server.log().clear();
        let (wall, result) = run_checked(&mut rlm, query, &expected)?;
        loop_walls.push(ms(wall));
        block_ms.push(result.iterations[0].execution_ms);
        loop_flight = loop_flight.max(server.log().max_concurrency());
    }
    let (bridge, whole, block) = (
        median(&bridge_walls),
        median(&loop_walls),
        median(&block_ms),
    );
    let isolated_whole = median(&isolated_walls);
    let ideal = ms(latency) * K.div_ceil(WIDTH) as f64;

    println!();
    println!(
        "## 4. fan-out of K = {K} prompts at {} ms mock latency, width {WIDTH} (median of {rounds} rounds, interleaved)",
        latency.as_millis()
    );
    println!("| path | wall ms | / ideal | / bridge | max in flight (mock log) |");
    println!("|---|---:|---:|---:|---:|");
    println!(
        "| ideal: latency × ceil(K / width) | {ideal:.1} | 1.00× | {:.2}× | {WIDTH} |",
        ideal / bridge
    );
    println!(
        "| bridge `Endpoint::batch` | {bridge:.1} | {:.2}× | 1.00× | {bridge_flight} |",
        bridge / ideal
    );
    println!(
        "| `Rlm::run`: one iteration, `llm_query_batched` in the block | {whole:.1} | {:.2}× | {:.2}× | {loop_flight} |",
        whole / ideal,
        whole / bridge
    );
    println!(
        "|   of which the block (`execution_ms`) | {block:.1} | {:.2}× | {:.2}× | — |",
        block / ideal,
        block / bridge
    );
    println!(
        "| `Rlm::run` over an isolated session (worker process) | {isolated_whole:.1} | {:.2}× | {:.2}× | — |",
        isolated_whole / ideal,
        isolated_whole / bridge
    );
    println!(
        "|   isolated / in-process (`--isolation process` / `none`) | {:.3}× | | | |",
        isolated_whole / whole
    );
    drop(isolated);
    drop(rlm);
    mock_rt.block_on(server.shutdown());
    Ok(())
}
