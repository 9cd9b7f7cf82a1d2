//! `rlm bench`: sub-call throughput of an endpoint, through the same bridge the REPL uses.
//!
//! The sweep sends `--calls` calls at each `--width` (a number, or `auto` for the adaptive
//! limit) through a fresh `sub` endpoint per width, built from the `rlm run` model flags and
//! sharing one ledger, so the budget (`--max-calls`, `--max-usd` with `--price`,
//! `--max-tokens`) covers the whole sweep. A fixed width is both the batch width and the
//! endpoint's limit; `auto` queues every call at the adaptive limiter. Each step is timed from
//! the batch's start to its last answer; its ledger records give latency percentiles (answered
//! calls; first attempt to answer, retries included), tokens (as the server reported them),
//! errors by kind and retries; the limiter gives 429s and where `auto` settled; `getrusage`
//! less the in-process mock's threads gives the client's CPU. `--through-repl` repeats every
//! width with one `llm_query_batched` in the embedded Python session, so both paths appear
//! side by side.
//!
//! Before each step's clock starts, the step's endpoint opens as many keep-alive connections
//! as the width can use ([`Endpoint::warm_up`]: `GET`s of the model list, no model call, no
//! budget): every row then times calls on open connections, as an RLM session's batches after
//! its first run, not the TCP/TLS set-up of a cold pool (which made a width-256 row against
//! the in-process mock about 1.4× its ideal time, and each width's row depend on the widths
//! swept before it). The rows say how many connections were opened.
//!
//! Without `--base-url` the mock LM server runs in-process on a runtime of its own (fixed
//! `--latency-ms`, optional `--capacity`) and the output says so; with one, a first call must
//! succeed before the sweep starts. A sweep the call budget cannot cover is refused before any
//! call; one stopped by a budget at run time keeps its finished rows (exit code 3).

mod cpu;
mod plot;
mod report;

use std::io::{IsTerminal, Write as _};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bridge::mock::{Latency, MockConfig, MockServer};
use bridge::{
    BatchPolicy, BudgetLimit, CallOptions, CancellationToken, ChatRequest, Concurrency, Endpoint,
    EndpointConfig, Endpoints, Ledger,
};
use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use kernel::repl::{ContextInput, ContextSource, ReplSession, SessionConfig};

use crate::endpoints;
use crate::exit::{self, EXIT_INTERRUPTED, EXIT_LIMIT, LimitError, UsageError};
use crate::interrupt;
use crate::outputs::{Guard, Inputs, Output};
use crate::report::option_inputs;
use crate::settings::{RunFlags, Switches, offers};
use report::{Measured, Path, Row};

/// `max_tokens` of each call unless `--max-output-tokens` says otherwise.
const DEFAULT_MAX_OUTPUT_TOKENS: u32 = 16;

/// Arguments of `rlm bench`.
#[derive(Debug, Args)]
pub(crate) struct BenchArgs {
    /// Widths to sweep, comma-separated: requests in flight at once, or `auto` (the adaptive
    /// limit of `--batch-concurrency auto`).
    #[arg(long, value_name = "N|auto,...", value_delimiter = ',', default_value = "1,16,64,256",
          value_parser = concurrency)]
    pub(crate) width: Vec<Concurrency>,

    /// Calls per width.
    #[arg(long, default_value_t = 1000, value_parser = at_least_one)]
    pub(crate) calls: usize,

    /// Size of each prompt in tokens (estimated as 4 characters each). Each call's reply is
    /// capped by `--max-output-tokens`, 16 unless given.
    #[arg(long, default_value_t = 100, value_parser = at_least_one)]
    pub(crate) prompt_tokens: usize,

    /// Without `--base-url`: the built-in mock's latency per call, in milliseconds [default: 50].
    #[arg(long, value_name = "MS")]
    pub(crate) latency_ms: Option<f64>,

    /// Without `--base-url`: the built-in mock serves at most N calls at once and answers 429
    /// beyond (`rlm mock-lm --capacity`).
    #[arg(long, value_name = "N", value_parser = at_least_one)]
    pub(crate) capacity: Option<usize>,

    /// Also run every width through `llm_query_batched` in the embedded Python session.
    #[arg(long)]
    pub(crate) through_repl: bool,

    /// Budget: the most calls the whole sweep may send (the first test call included).
    #[arg(long, value_name = "N")]
    pub(crate) max_calls: Option<u64>,

    /// Draw calls/s and p99 latency against the width into FILE (SVG).
    #[arg(long, value_name = "FILE")]
    pub(crate) plot: Option<PathBuf>,

    /// Refused: the sweep's widths are `--width` (a run's `--batch-concurrency` in
    /// `rlm.toml` is ignored here).
    #[arg(long, hide = true, value_name = "N|auto")]
    pub(crate) batch_concurrency: Option<String>,

    /// Model options, as for `rlm run` (the `sub` endpoint is measured).
    #[command(flatten)]
    pub(crate) options: RunFlags<{ offers::BENCH }>,
}

fn concurrency(text: &str) -> Result<Concurrency, bridge::InvalidConcurrency> {
    text.parse()
}

fn at_least_one(text: &str) -> Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("must be a whole number ≥ 1, got `{text}`")),
    }
}

/// The in-process mock and the threads it runs on.
struct InProcessMock {
    runtime: tokio::runtime::Runtime,
    server: MockServer,
    threads: cpu::Threads,
    latency_ms: f64,
    capacity: Option<usize>,
}

impl InProcessMock {
    fn start(latency_ms: f64, capacity: Option<usize>) -> Result<Self> {
        let delay = Duration::try_from_secs_f64(latency_ms / 1e3)
            .ok()
            .filter(|_| latency_ms.is_finite())
            .ok_or_else(|| {
                UsageError::new(format!(
                    "`--latency-ms` must be a non-negative number, got {latency_ms}"
                ))
            })?;
        let threads = cpu::Threads::default();
        let registered = threads.clone();
        // Its own threads, so that the client's CPU time can leave the mock's out.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("mock-lm")
            .on_thread_start(move || registered.add_current())
            .enable_all()
            .build()
            .context("Could not start the mock LM server's threads")?;
        let server = runtime
            .block_on(MockServer::start(MockConfig {
                latency: Latency::fixed(delay),
                capacity,
                log_limit: Some(1000),
                ..MockConfig::default()
            }))
            .context("Could not start the mock LM server on 127.0.0.1")?;
        Ok(Self {
            runtime,
            server,
            threads,
            latency_ms,
            capacity,
        })
    }
}

/// `rlm bench`; `config` is the `--config` file, if given.
pub(crate) fn execute(args: BenchArgs, config: Option<&std::path::Path>) -> Result<ExitCode> {
    let settings = args.options.clone().settings(config)?;
    let config_path = settings.file.as_deref();
    let mut opts = settings.opts;
    exit::json_errors(opts.json());
    if let Some(width) = &args.batch_concurrency {
        return Err(UsageError::new(format!(
            "`rlm bench` sweeps the widths of `--width`; pass `--width {width}` to measure that \
             width (`--batch-concurrency` sets the width of a run)"
        ))
        .into());
    }
    crate::secrets::protect(&opts)?;
    if opts.base_url.is_some() && (args.latency_ms.is_some() || args.capacity.is_some()) {
        return Err(UsageError::new(
            "`--latency-ms` and `--capacity` set up the built-in mock; with `--base-url` the \
             server's own latency and capacity are measured",
        )
        .into());
    }
    let mut inputs = Inputs::new();
    option_inputs(&mut inputs, &opts, config_path);
    let plot = args
        .plot
        .as_ref()
        .map(|path| Guard::new(inputs, opts.force()).document(Output::new("--plot", path)))
        .transpose()?;
    if let Some(n) = args.max_calls {
        opts.max_sub_calls = Some(opts.max_sub_calls.map_or(n, |m| m.min(n)));
    }
    opts.max_output_tokens
        .get_or_insert(DEFAULT_MAX_OUTPUT_TOKENS);
    let paths: &[Path] = if args.through_repl {
        &[Path::Bridge, Path::Repl]
    } else {
        &[Path::Bridge]
    };
    let planned = 1 + (args.width.len() * paths.len() * args.calls) as u64;
    if let Some(max) = opts.max_sub_calls
        && planned > max
    {
        return Err(LimitError::new(format!(
            "The sweep needs {planned} calls ({} widths × {} paths × {} calls, plus one test \
             call), more than the budget of {max} (`--max-calls`); lower `--calls` or \
             `--width`, or raise `--max-calls`. No call was sent.",
            args.width.len(),
            paths.len(),
            args.calls
        ))
        .into());
    }

    let mock = match opts.base_url {
        Some(_) => None,
        None => {
            let mock = InProcessMock::start(args.latency_ms.unwrap_or(50.0), args.capacity)?;
            opts.base_url = Some(mock.server.openai_base_url());
            opts.provider = Some(bridge::Provider::OpenAi);
            opts.model.get_or_insert_with(|| "mock".to_owned());
            if !opts.quiet() {
                let capacity = mock.capacity.map_or(String::new(), |n| {
                    format!(", at most {n} at once and 429 beyond")
                });
                eprintln!(
                    "rlm bench: no `--base-url`, so the calls go to the built-in mock LM server \
                     at {} ({} ms per call{capacity}). This measures rlm's side of a sub-call, \
                     not a model; pass `--base-url URL --model NAME` to measure your endpoint.",
                    mock.server.openai_base_url(),
                    mock.latency_ms
                );
            }
            Some(mock)
        }
    };
    let endpoints = endpoints::build_endpoints(&opts)?;
    let sub = endpoints.get("sub")?;
    let template = sub.config().clone();
    let ledger = Arc::clone(endpoints.ledger());
    let runtime = kernel::runtime::shared();

    // One call first: an unreachable server or a rejected model stops here, not 1000 times.
    let probe = runtime.block_on(sub.call(request(0, args.prompt_tokens), &CallOptions::default()));
    if let Err(e) = probe {
        return Err(anyhow::Error::new(e).context(format!(
            "The first test call to model `{}` at `{}` failed, so the sweep did not start",
            template.model, template.base_url
        )));
    }

    if !opts.quiet() {
        eprintln!(
            "rlm bench: before each width's clock starts, up to that many keep-alive connections \
             are opened with `GET` of the model list (no model call, not counted): the rows time \
             calls on open connections, not connection set-up."
        );
    }
    let stop = CancellationToken::new();
    stop_on_interrupt(stop.clone());
    let mock_threads = mock.as_ref().map(|m| m.threads.clone()).unwrap_or_default();
    let show_bar = !opts.quiet() && std::io::stderr().is_terminal();
    let mut rows = Vec::new();
    let mut budget_stop = None;
    'sweep: for &width in &args.width {
        for &path in paths {
            let step = Step {
                template: &template,
                ledger: &ledger,
                width,
                path,
                calls: args.calls,
                prompt_tokens: args.prompt_tokens,
                stop: &stop,
                mock_threads: &mock_threads,
            };
            let bar = progress_bar(show_bar, &step);
            let measured = step.run(&bar)?;
            bar.finish_and_clear();
            let row = Row::of(&measured);
            if let Some(limit) = Row::budget_stop(&measured.records) {
                budget_stop = Some((limit, path, width, row.calls));
            }
            rows.push(row);
            if budget_stop.is_some() || stop.is_cancelled() {
                break 'sweep;
            }
        }
    }
    let mock_info = mock
        .as_ref()
        .map(|m| serde_json::json!({"latency_ms": m.latency_ms, "capacity": m.capacity}));
    let title = match &mock {
        Some(m) => format!(
            "rlm bench: the built-in mock, {} ms per call{}",
            m.latency_ms,
            m.capacity
                .map_or(String::new(), |n| format!(", capacity {n} (429 beyond)"))
        ),
        None => format!("rlm bench: {} at {}", template.model, template.base_url),
    };
    if let Some(mock) = mock {
        mock.runtime.block_on(mock.server.shutdown());
    }

    let verdict = report::auto_verdict(&rows);
    let mut out = std::io::stdout().lock();
    if opts.json() {
        let document = serde_json::json!({
            "rlm_version": env!("CARGO_PKG_VERSION"),
            "endpoint": {
                "base_url": template.base_url,
                "model": template.model,
                "provider": template.provider.to_string(),
            },
            "mock": mock_info,
            "calls_per_width": args.calls,
            "prompt_tokens": args.prompt_tokens,
            "max_output_tokens": opts.max_output_tokens,
            "rows": rows,
            "auto_verdict": verdict,
            "stopped_by": budget_stop.map(|(limit, ..)| limit.field()),
            "interrupted": stop.is_cancelled(),
        });
        serde_json::to_writer_pretty(&mut out, &document)?;
        writeln!(out)?;
    } else {
        write!(out, "{}", report::table(&rows))?;
        for line in &verdict {
            writeln!(out, "{line}")?;
        }
    }
    out.flush()?;
    drop(out);
    if let Some(plot) = &plot {
        plot::write(plot, &rows, &title)?;
        if !opts.quiet() {
            eprintln!("plot: {}", plot.path().display());
        }
    }
    if let Some((limit, path, width, calls)) = budget_stop {
        let flag = match limit {
            BudgetLimit::Calls => "--max-calls",
            BudgetLimit::Tokens => "--max-tokens",
            BudgetLimit::Usd => "--max-usd",
            // Bench runs no RLM loop, so no call of it is an iteration.
            BudgetLimit::Iterations => "--max-tree-iterations",
        };
        eprintln!(
            "error: The budget stopped the sweep: `{flag}` refused calls at width {width} \
             ({} path) after {calls} were recorded; the rows above are what was measured. \
             Raise `{flag}`, or sweep fewer calls or widths.",
            match path {
                Path::Bridge => "bridge",
                Path::Repl => "repl",
            }
        );
        return Ok(ExitCode::from(EXIT_LIMIT));
    }
    if stop.is_cancelled() {
        eprintln!("Interrupted: the rows above are the widths that finished.");
        return Ok(ExitCode::from(EXIT_INTERRUPTED));
    }
    Ok(ExitCode::SUCCESS)
}

/// Words the prompts are made of (deterministic, varied, so no two prompts share a prefix
/// beyond their first words: servers with prefix caches see distinct requests).
const WORDS: [&str; 16] = [
    "amber", "basalt", "cedar", "delta", "ember", "fjord", "granite", "harbor", "indigo",
    "juniper", "kelp", "lumen", "meadow", "nectar", "orchid", "pumice",
];

/// Call `i`'s prompt: about `tokens × 4` characters.
fn prompt(i: usize, tokens: usize) -> String {
    let target = tokens.saturating_mul(4);
    let mut text = format!("Request {i}. Reply with one word.");
    let mut j = 0usize;
    while text.len() < target {
        text.push(' ');
        text.push_str(WORDS[(i.wrapping_mul(7) + j.wrapping_mul(13)) % WORDS.len()]);
        j += 1;
    }
    text
}

fn request(i: usize, tokens: usize) -> ChatRequest {
    ChatRequest::from_prompt(prompt(i, tokens))
}

/// One width on one path.
struct Step<'a> {
    template: &'a EndpointConfig,
    ledger: &'a Arc<Ledger>,
    width: Concurrency,
    path: Path,
    calls: usize,
    prompt_tokens: usize,
    stop: &'a CancellationToken,
    mock_threads: &'a cpu::Threads,
}

impl Step<'_> {
    /// The `sub` endpoint at this width: a fixed width is its limit; `auto` is adaptive.
    fn config(&self) -> EndpointConfig {
        let mut config = self.template.clone();
        match self.width {
            Concurrency::Fixed(width) => {
                config.max_in_flight = width;
                config.adaptive = None;
            }
            Concurrency::Auto => {
                config.max_in_flight = bridge::AUTO_CEILING;
                Concurrency::Auto.apply(&mut config);
            }
        }
        config
    }

    fn label(&self) -> String {
        let path = match self.path {
            Path::Bridge => "bridge",
            Path::Repl => "repl",
        };
        format!("{path} width {}", self.width)
    }

    fn run(&self, bar: &ProgressBar) -> Result<Measured> {
        let first = self.ledger.next_call_index();
        let ticker = tick(bar.clone(), Arc::clone(self.ledger), first);
        let measured = match self.path {
            Path::Bridge => self.run_bridge(first),
            Path::Repl => self.run_repl(first),
        };
        ticker.cancel();
        measured
    }

    fn run_bridge(&self, first: u64) -> Result<Measured> {
        let endpoint = Endpoint::new(self.config(), Arc::clone(self.ledger))
            .context("Could not set up the endpoint")?;
        let requests = (0..self.calls)
            .map(|i| request(i, self.prompt_tokens))
            .collect();
        let policy = BatchPolicy {
            concurrency: self.width.batch_width(),
        };
        let warm = self.warm_up(&endpoint);
        let (clock, started) = self.start_clock();
        kernel::runtime::shared().block_on(endpoint.batch(requests, policy, self.stop));
        Ok(self.measured(first, started.elapsed(), clock, &endpoint, warm))
    }

    fn run_repl(&self, first: u64) -> Result<Measured> {
        let endpoints = Arc::new(
            Endpoints::new(vec![self.config()], Arc::clone(self.ledger))
                .context("Could not set up the endpoint")?,
        );
        let prompts: Vec<String> = (0..self.calls)
            .map(|i| prompt(i, self.prompt_tokens))
            .collect();
        let config = SessionConfig {
            cell_timeout: Duration::from_secs(7 * 86_400),
            sub_endpoint: self.template.name.clone(),
            batch_concurrency: self.width.batch_width(),
            sub_call_text_chars: 0,
            ..SessionConfig::default()
        };
        let context = ContextInput::from(ContextSource::Text(serde_json::to_string(&prompts)?));
        let session = ReplSession::with_inputs(config, Arc::clone(&endpoints), &[context])
            .context("Could not start the Python session for `--through-repl`")?;
        let setup = session.exec("import json as _json\n_prompts = _json.loads(context)")?;
        if let Some(error) = setup.error {
            anyhow::bail!(
                "The benchmark's setup failed in the REPL: {}",
                error.message
            );
        }
        let cancel = session.cancel_token();
        let stop = self.stop.clone();
        let watcher = kernel::runtime::shared().spawn(async move {
            stop.cancelled().await;
            cancel.cancel();
        });
        let endpoint = endpoints.get(&self.template.name)?;
        let warm = self.warm_up(&endpoint);
        let (clock, started) = self.start_clock();
        let result = session.exec("_answers = llm_query_batched(_prompts)");
        let wall = started.elapsed();
        watcher.abort();
        let result = result?;
        if let Some(error) = result.error.filter(|_| !self.stop.is_cancelled()) {
            anyhow::bail!(
                "`llm_query_batched` failed in the REPL: {}: {}",
                error.type_name,
                error.message
            );
        }
        Ok(self.measured(first, wall, clock, &endpoint, warm))
    }

    /// Opens the connections the step can use at once (its width, at most its calls) before
    /// its clock starts; returns how many the server answered.
    fn warm_up(&self, endpoint: &Endpoint) -> usize {
        let width = self.width.batch_width().unwrap_or(self.calls);
        kernel::runtime::shared().block_on(endpoint.warm_up(width.min(self.calls)))
    }

    /// What the step measured: the calls recorded since `first`, and the endpoint's limiter.
    fn measured(
        &self,
        first: u64,
        wall: Duration,
        clock: (Duration, Duration),
        endpoint: &Endpoint,
        warm_connections: usize,
    ) -> Measured {
        Measured {
            path: self.path,
            width: self.width,
            wall,
            client_cpu: self.client_cpu(clock),
            records: self.ledger.records_since(first),
            limiter: endpoint.limiter_stats(),
            warm_connections,
        }
    }

    /// CPU times now (process, mock threads) and the wall clock.
    fn start_clock(&self) -> ((Duration, Duration), Instant) {
        ((cpu::process(), self.mock_threads.cpu()), Instant::now())
    }

    /// The client's CPU since `clock`: the process's less the mock's threads'.
    fn client_cpu(&self, (process, mock): (Duration, Duration)) -> Duration {
        let process = cpu::process().saturating_sub(process);
        process.saturating_sub(self.mock_threads.cpu().saturating_sub(mock))
    }
}

fn progress_bar(show: bool, step: &Step<'_>) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(step.calls as u64), ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template(
            "{prefix:>18} [{bar:30}] {pos}/{len} calls · {per_sec} · {elapsed}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    bar.set_prefix(step.label());
    bar
}

/// Moves `bar` to the calls recorded since `first` until the returned token is cancelled.
fn tick(bar: ProgressBar, ledger: Arc<Ledger>, first: u64) -> CancellationToken {
    let stop = CancellationToken::new();
    if bar.is_hidden() {
        return stop;
    }
    let done = stop.clone();
    std::thread::spawn(move || {
        while !done.is_cancelled() {
            bar.set_position(ledger.next_call_index().saturating_sub(first));
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    stop
}

/// The first Ctrl-C (or `SIGTERM`, `SIGHUP`) cancels the calls in flight and ends the sweep
/// with the rows so far; a second one quits at once.
fn stop_on_interrupt(stop: CancellationToken) {
    interrupt::on_interrupt(move |_| stop.cancel(), || {});
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_have_the_asked_size_and_differ() {
        let a = prompt(1, 100);
        let b = prompt(2, 100);
        assert!((400..420).contains(&a.len()), "{}", a.len());
        assert_ne!(a, b);
        assert!(a.starts_with("Request 1. Reply with one word. "));
        assert_eq!(prompt(3, 1), "Request 3. Reply with one word.");
    }
}
