//! `rlm run`: resolve the configuration, build the endpoints and the session, run the loop,
//! print the answer.
//!
//! Precedence of every option: flag > environment variable > `rlm.toml` (`[run]` table) >
//! built-in default. Output contract: progress and the trace go to stderr; the final answer is
//! the last line(s) of stdout (or the whole result as JSON with `--json`); the exit code says
//! how the run ended ([`RunOutcome`]).

use std::io::{IsTerminal, Write as _};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use bridge::{EndpointConfig, Endpoints};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use kernel::repl::{ReplSession, SessionConfig};
use kernel::rlm::{
    Phase, Progress, ProgressSnapshot, Rlm, RlmConfig, RlmError, RlmResult, StopHandle,
    TerminationReason, TrajectoryWriter,
};
use serde::Deserialize;

use crate::UsageError;
use crate::args::{RunArgs, RunOptions};
use crate::contexts;
use crate::outputs::{self, Output};
use crate::report;
use crate::secrets::{self, redact};
use crate::trace::TraceHook;

/// Exit code of a run that stopped at a limit (iterations, time, budget) or without an answer.
pub(crate) const EXIT_LIMIT: u8 = 3;

/// Exit code after Ctrl-C, as shells report a SIGINT death (128 + 2).
pub(crate) const EXIT_INTERRUPTED: u8 = 130;

/// Exit code after a fatal signal (a crash in C code a cell called), see `kernel::fatal`.
pub(crate) const EXIT_CRASHED: u8 = 4;

pub(crate) use kernel::options::ROOT;
use kernel::options::{self, OptionError, SUB, Spelling};

/// The `rlm.toml` file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    #[serde(default)]
    run: RunOptions,
}

/// The configuration file in use: the explicit `--config` path, else `./rlm.toml` if present.
pub(crate) fn config_file_path(explicit: Option<&Path>) -> Option<PathBuf> {
    match explicit {
        Some(p) => Some(p.to_path_buf()),
        None => Some(PathBuf::from("rlm.toml")).filter(|p| p.exists()),
    }
}

/// Reads `rlm.toml`: the explicit `--config` path (must exist), else `./rlm.toml` if present.
pub(crate) fn load_config_file(explicit: Option<&Path>) -> Result<RunOptions> {
    let Some(path) = config_file_path(explicit) else {
        return Ok(RunOptions::default());
    };
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("Could not read the configuration file `{}`", path.display()))?;
    let file: ConfigFile = toml::from_str(&text).with_context(|| {
        format!(
            "Configuration file `{}` is not valid; options go in a `[run]` table with the flag names, e.g. `max-iterations = 20`",
            path.display()
        )
    })?;
    // Paths in the file are relative to the file, as a reader of it would expect.
    let mut run = file.run;
    if let Some(dir) = path.parent() {
        for p in [
            &mut run.prompt_extension,
            &mut run.system_prompt,
            &mut run.trajectory,
            &mut run.answer_file,
        ]
        .into_iter()
        .flatten()
        {
            if p.is_relative() {
                *p = dir.join(&*p);
            }
        }
    }
    Ok(run)
}

/// Flag/env values win over the file's.
pub(crate) fn merge(cli: RunOptions, file: RunOptions) -> RunOptions {
    RunOptions {
        model: cli.model.or(file.model),
        sub_model: cli.sub_model.or(file.sub_model),
        base_url: cli.base_url.or(file.base_url),
        sub_base_url: cli.sub_base_url.or(file.sub_base_url),
        extra_models: if cli.extra_models.is_empty() {
            file.extra_models
        } else {
            cli.extra_models
        },
        provider: cli.provider.or(file.provider),
        api_key_env: cli.api_key_env.or(file.api_key_env),
        // Secrets add up: a value the file marks secret stays secret.
        secrets: file.secrets.into_iter().chain(cli.secrets).collect(),
        max_output_tokens: cli.max_output_tokens.or(file.max_output_tokens),
        temperature: cli.temperature.or(file.temperature),
        max_iterations: cli.max_iterations.or(file.max_iterations),
        timeout: cli.timeout.or(file.timeout),
        cell_timeout: cli.cell_timeout.or(file.cell_timeout),
        sub_timeout: cli.sub_timeout.or(file.sub_timeout),
        max_sub_calls: cli.max_sub_calls.or(file.max_sub_calls),
        max_tokens: cli.max_tokens.or(file.max_tokens),
        max_usd: cli.max_usd.or(file.max_usd),
        price: cli.price.or(file.price),
        sub_price: cli.sub_price.or(file.sub_price),
        batch_concurrency: cli.batch_concurrency.or(file.batch_concurrency),
        sub_call_errors: cli.sub_call_errors.or(file.sub_call_errors),
        sub_call_text_chars: cli.sub_call_text_chars.or(file.sub_call_text_chars),
        protocol: cli.protocol.or(file.protocol),
        code_and_final: cli.code_and_final.or(file.code_and_final),
        output_limit: cli.output_limit.or(file.output_limit),
        max_history_chars: cli.max_history_chars.or(file.max_history_chars),
        max_consecutive_failures: cli
            .max_consecutive_failures
            .or(file.max_consecutive_failures),
        prompt_extension: cli.prompt_extension.or(file.prompt_extension),
        system_prompt: cli.system_prompt.or(file.system_prompt),
        trajectory: cli.trajectory.or(file.trajectory),
        answer_file: cli.answer_file.or(file.answer_file),
        json: cli.json.or(file.json),
        quiet: cli.quiet.or(file.quiet),
        trace: cli.trace.or(file.trace),
        force: cli.force.or(file.force),
    }
}

/// A mistake in the options: exit code 2.
fn usage(message: impl Into<String>) -> anyhow::Error {
    UsageError::new(message).into()
}

/// An option error as the binary reports it: wrong options are a usage error (exit 2).
fn option_error(error: OptionError) -> anyhow::Error {
    if error.is_usage() {
        UsageError::new(error.to_string()).into()
    } else {
        error.into()
    }
}

/// The model and loop options, as the kernel resolves them (the same mapping as the Python
/// package's).
fn kernel_options(opts: &RunOptions) -> options::RunOptions {
    options::RunOptions {
        model: opts.model.clone(),
        sub_model: opts.sub_model.clone(),
        base_url: opts.base_url.clone(),
        sub_base_url: opts.sub_base_url.clone(),
        extra_models: opts.extra_models.clone(),
        provider: opts.provider,
        api_key_env: opts.api_key_env.clone(),
        max_output_tokens: opts.max_output_tokens,
        temperature: opts.temperature,
        max_iterations: opts.max_iterations,
        timeout: opts.timeout,
        cell_timeout: opts.cell_timeout,
        sub_timeout: opts.sub_timeout,
        max_sub_calls: opts.max_sub_calls,
        max_tokens: opts.max_tokens,
        max_usd: opts.max_usd,
        price: opts.price.clone(),
        sub_price: opts.sub_price.clone(),
        batch_concurrency: opts.batch_concurrency,
        sub_call_errors: opts.sub_call_errors,
        sub_call_text_chars: opts.sub_call_text_chars,
        protocol: opts.protocol,
        code_and_final: opts.code_and_final,
        output_limit: opts.output_limit,
        max_history_chars: opts.max_history_chars,
        max_consecutive_failures: opts.max_consecutive_failures,
        prompt_extension: opts.prompt_extension.clone(),
        system_prompt: opts.system_prompt.clone(),
        trajectory: opts.trajectory.clone(),
    }
}

/// `value` seconds of `--{flag}`: positive, at most ten years.
pub(crate) fn seconds(flag: &str, value: f64) -> Result<Duration> {
    options::seconds(Spelling::Flag, flag, value).map_err(option_error)
}

/// Builds the `root`, `sub` and `--extra-model` endpoints, sharing one ledger with the run's budget.
pub(crate) fn build_endpoints(opts: &RunOptions) -> Result<Arc<Endpoints>> {
    endpoints(opts, Keys::Required)
}

/// Whether a server off this machine must have an API key to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Keys {
    /// It must: the run calls models.
    Required,
    /// It need not: nothing is sent (`--dry-run`).
    Optional,
}

fn endpoints(opts: &RunOptions, keys: Keys) -> Result<Arc<Endpoints>> {
    let (configs, budget) = kernel_options(opts)
        .endpoint_configs(Spelling::Flag)
        .map_err(option_error)?;
    check_urls_and_keys(&configs, opts, keys)?;
    options::build_endpoints(configs, budget).map_err(option_error)
}

/// Before any call: every base URL is an `http(s)://` URL, and a server off this machine has
/// an API key to send (a local server often needs none). Each message names the flag or the
/// variable to set.
fn check_urls_and_keys(configs: &[EndpointConfig], opts: &RunOptions, keys: Keys) -> Result<()> {
    for config in configs {
        let flag = match config.name.as_str() {
            ROOT => "--base-url",
            SUB if opts.sub_base_url.is_some() => "--sub-base-url",
            SUB => "--base-url",
            _ => "--extra-model",
        };
        let url = config.base_url.as_str();
        let Some(rest) = url
            .strip_prefix("http://")
            .or_else(|| url.strip_prefix("https://"))
        else {
            return Err(usage(format!(
                "`{flag}` must start with `http://` or `https://`, got `{url}`"
            )));
        };
        let Some(var) = config
            .api_key_env
            .as_deref()
            .filter(|_| keys == Keys::Required)
        else {
            continue;
        };
        // Through the bridge: the variable itself has left the environment by now.
        let has_key =
            bridge::secret::env_secret(var).is_some_and(|key| !key.expose().trim().is_empty());
        if !has_key && !is_loopback(rest) {
            return Err(usage(format!(
                "`{url}` needs an API key and `{var}` is not set; export `{var}` with your key, or \
                 name the variable that holds it with `--api-key-env VAR`"
            )));
        }
    }
    Ok(())
}

/// Whether the host of `rest` (a URL after its scheme) is this machine.
fn is_loopback(rest: &str) -> bool {
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host_port = authority.rsplit('@').next().unwrap_or_default();
    let host = match host_port.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => host_port.split(':').next().unwrap_or_default(),
    };
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

pub(crate) fn session_config(opts: &RunOptions) -> Result<SessionConfig> {
    kernel_options(opts)
        .session_config(Spelling::Flag)
        .map_err(option_error)
}

pub(crate) fn rlm_config(opts: &RunOptions) -> Result<RlmConfig> {
    kernel_options(opts)
        .rlm_config(Spelling::Flag)
        .map_err(option_error)
}

/// How a run ended, as the process sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RunOutcome {
    /// The model gave a final answer: exit 0.
    Answered,
    /// A limit stopped the run (a partial or fallback answer may be printed): exit 3.
    Limited,
    /// The run could not go on (model unreachable, kernel broke): exit 1.
    Failed,
    /// Ctrl-C stopped the run (its best partial answer may be printed): exit 130.
    Interrupted,
}

impl RunOutcome {
    pub(crate) fn of(reason: TerminationReason) -> Self {
        if reason == TerminationReason::Interrupted {
            Self::Interrupted
        } else if reason == TerminationReason::StoppedByHook {
            // The CLI's own hooks stop a run only when they fail (the trajectory cannot be
            // written): an error, not a limit.
            Self::Failed
        } else if reason.is_success() {
            Self::Answered
        } else if reason.is_limit() {
            Self::Limited
        } else {
            Self::Failed
        }
    }

    pub(crate) fn exit_code(self) -> ExitCode {
        match self {
            Self::Answered => ExitCode::SUCCESS,
            Self::Limited => ExitCode::from(EXIT_LIMIT),
            Self::Failed => ExitCode::FAILURE,
            Self::Interrupted => ExitCode::from(EXIT_INTERRUPTED),
        }
    }
}

/// What to show while a run goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Display {
    /// Nothing on stderr.
    Quiet,
    /// A live progress line (only when stderr is a terminal).
    Progress,
    /// The progress line plus each reply, block and output, as the run goes.
    Trace,
}

impl Display {
    /// `--trace` or `-v` (which win over `--quiet`: they are asked for on purpose), else
    /// `--quiet`, else `default`.
    pub(crate) fn choose(opts: &RunOptions, verbosity: u8, default: Display) -> Self {
        if opts.trace() || verbosity > 0 {
            Display::Trace
        } else if opts.quiet() {
            Display::Quiet
        } else {
            default
        }
    }
}

/// Runs the loop over `session` and reports on stderr as `display` says.
pub(crate) fn run_loop(
    query: &str,
    config: RlmConfig,
    endpoints: Arc<Endpoints>,
    session: Arc<ReplSession>,
    trajectory: Option<&Path>,
    display: Display,
) -> Result<RlmResult> {
    let mut rlm = Rlm::new(config, endpoints, session);
    let observer = observe(&mut rlm, trajectory, display)?;
    observer.run(|| rlm.run(query))
}

/// What watches a runner's runs: the trajectory, the trace, the progress line, Ctrl-C.
pub(crate) struct Observer {
    bar: ProgressBar,
    show_bar: bool,
    progress: Progress,
    max_iterations: u32,
}

/// Adds the trajectory, trace and progress hooks to `rlm` and stops it on Ctrl-C.
pub(crate) fn observe(
    rlm: &mut Rlm,
    trajectory: Option<&Path>,
    display: Display,
) -> Result<Observer> {
    if let Some(path) = trajectory {
        // The error names the file.
        rlm.add_hook(TrajectoryWriter::create(path)?);
    }
    let show_bar = display != Display::Quiet && std::io::stderr().is_terminal();
    let bar = if show_bar {
        ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr())
    } else {
        ProgressBar::hidden()
    };
    if display == Display::Trace {
        let bar = bar.clone();
        // Through the bar, so the progress line is lifted while the trace prints.
        rlm.add_hook(TraceHook::new(Box::new(move |text| {
            bar.suspend(|| eprint!("{}", redact(text)));
        })));
    }
    let progress = Progress::new();
    rlm.add_hook(progress.hook());
    stop_on_ctrl_c(rlm.stop_handle());
    Ok(Observer {
        bar,
        show_bar,
        progress,
        max_iterations: rlm.config().max_iterations,
    })
}

impl Observer {
    /// Runs `run` with the progress line drawn meanwhile.
    pub(crate) fn run(
        &self,
        run: impl FnOnce() -> Result<RlmResult, RlmError>,
    ) -> Result<RlmResult> {
        let stop = self.show_bar.then(|| {
            self.bar.reset();
            spawn_progress_bar(&self.bar, self.progress.clone(), self.max_iterations)
        });
        let result = run();
        if let Some(stop) = stop {
            stop.cancel();
            self.bar.finish_and_clear();
        }
        Ok(result?)
    }
}

/// The first Ctrl-C stops the run gracefully (best partial answer, closed trajectory); a
/// second one quits at once.
fn stop_on_ctrl_c(handle: StopHandle) {
    kernel::runtime::shared().spawn(async move {
        if tokio::signal::ctrl_c().await.is_err() {
            return;
        }
        let _ = writeln!(
            std::io::stderr(),
            "\nInterrupted: stopping the run and keeping what it found (Ctrl-C again to quit at once)"
        );
        handle.stop();
        if tokio::signal::ctrl_c().await.is_ok() {
            std::process::exit(i32::from(EXIT_INTERRUPTED));
        }
    });
}

/// Redraws `bar` from the [`Progress`] handle until the returned token is cancelled.
fn spawn_progress_bar(
    bar: &ProgressBar,
    progress: Progress,
    max_iterations: u32,
) -> tokio_util::sync::CancellationToken {
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    let stop = tokio_util::sync::CancellationToken::new();
    let (bar, stop2) = (bar.clone(), stop.clone());
    std::thread::spawn(move || {
        while !stop2.is_cancelled() {
            bar.set_message(progress_line(&progress.snapshot(), max_iterations));
            bar.tick();
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    stop
}

/// What the run is doing, e.g. `iteration 3/30 · block 2/3 running 37 s · sub-calls 12/31 ·
/// 18204 tokens · 41.2 s`.
pub(crate) fn progress_line(s: &ProgressSnapshot, max_iterations: u32) -> String {
    let doing = match s.phase {
        Phase::Starting => "starting".to_owned(),
        Phase::Thinking => format!("root model thinking {:.0} s", s.phase_elapsed.as_secs_f64()),
        Phase::Running { block, blocks } => {
            let mut text = format!(
                "block {block}/{blocks} running {:.0} s",
                s.phase_elapsed.as_secs_f64()
            );
            if s.phase_sub_calls_started > 0 {
                text.push_str(&format!(
                    " · sub-calls {}/{}",
                    s.phase_sub_calls_done, s.phase_sub_calls_started
                ));
            }
            text
        }
        Phase::Done => "done".to_owned(),
    };
    let cost = if s.cost_usd > 0.0 {
        format!(" · ${:.4}", s.cost_usd)
    } else {
        String::new()
    };
    format!(
        "iteration {}/{max_iterations} · {doing} · {} tokens{cost} · {:.1} s",
        s.iteration,
        s.tokens,
        s.elapsed.as_secs_f64()
    )
}

/// Checks before the run that no output clobbers an input and that `--answer-file` can be
/// written (without touching it), so a typo in its path does not surface only after the
/// models were paid for.
pub(crate) fn check_outputs(opts: &RunOptions, inputs: &[PathBuf]) -> Result<()> {
    let outputs: Vec<Output<'_>> = [
        ("answer-file", opts.answer_file.as_deref()),
        ("trajectory", opts.trajectory.as_deref()),
    ]
    .into_iter()
    .filter_map(|(flag, path)| Some(Output { flag, path: path? }))
    .collect();
    outputs::check_outputs(inputs, &outputs, opts.force())?;
    if let Some(path) = &opts.answer_file {
        outputs::check_answer_file(path)?;
    }
    Ok(())
}

/// The files a run reads besides its contexts: the configuration and prompt files.
pub(crate) fn option_inputs(opts: &RunOptions, config: Option<&Path>) -> Vec<PathBuf> {
    config
        .into_iter()
        .chain(opts.prompt_extension.as_deref())
        .chain(opts.system_prompt.as_deref())
        .map(Path::to_path_buf)
        .collect()
}

/// `--dry-run`: the first root-model request as it would be sent, on stdout.
fn print_first_request(rlm: &Rlm, endpoints: &Endpoints, query: &str, json: bool) -> Result<()> {
    // As the bridge would send them: with known secrets redacted.
    let mut messages = rlm.first_messages(query);
    let redactor = bridge::secret::redactor();
    for message in &mut messages {
        redactor.redact_in_place(&mut message.content);
    }
    let root = endpoints.get(&rlm.config().root_endpoint)?;
    let endpoint = root.config();
    let mut out = std::io::stdout().lock();
    if json {
        let request = serde_json::json!({
            "dry_run": true,
            "provider": endpoint.provider.to_string(),
            "base_url": endpoint.base_url,
            "model": endpoint.model,
            "messages": messages,
        });
        serde_json::to_writer_pretty(&mut out, &request)?;
        writeln!(out)?;
    } else {
        writeln!(
            out,
            "First request to `{}` at {} ({}):",
            endpoint.model, endpoint.base_url, endpoint.provider
        )?;
        for message in &messages {
            writeln!(
                out,
                "\n── {} ─────────────\n{}",
                message.role.as_str(),
                message.content.trim_end()
            )?;
        }
    }
    out.flush()?;
    eprintln!("Dry run: no model was called.");
    Ok(())
}

/// `rlm run`; `config_path` is the configuration file in use, an input like the contexts.
pub(crate) fn execute(
    args: RunArgs,
    file: RunOptions,
    config_path: Option<&Path>,
    verbosity: u8,
) -> Result<ExitCode> {
    if args.query.trim().is_empty() {
        return Err(UsageError::new(
            "`--query` is empty; ask a question about the context, e.g. `--query \"Which service failed first?\"`",
        )
        .into());
    }
    let opts = merge(args.options, file);
    // First, while the process has one thread and no Python: keys leave the environment.
    secrets::protect(&opts)?;
    crate::json_errors(opts.json());
    // Every option is checked before the context loads: a big context can take a while. A
    // dry run sends nothing, so it needs no API key: the request can be checked first.
    let keys = if args.dry_run {
        Keys::Optional
    } else {
        Keys::Required
    };
    let endpoints = endpoints(&opts, keys)?;
    let config = rlm_config(&opts)?;
    let mut session_config = session_config(&opts)?;
    let contexts = args.context.resolve()?;
    session_config.load = contexts.load;
    let mut inputs = contexts.paths;
    inputs.extend(option_inputs(&opts, config_path));
    check_outputs(&opts, &inputs)?;
    let session =
        ReplSession::with_inputs(session_config, Arc::clone(&endpoints), &contexts.inputs)
            .context("Could not load the context")?;
    contexts::print_warnings(session.contexts());
    if args.dry_run {
        let rlm = Rlm::new(config, Arc::clone(&endpoints), Arc::new(session));
        print_first_request(&rlm, &endpoints, &args.query, opts.json())?;
        return Ok(ExitCode::SUCCESS);
    }
    let display = Display::choose(&opts, verbosity, Display::Progress);
    let result = run_loop(
        &args.query,
        config,
        endpoints,
        Arc::new(session),
        opts.trajectory.as_deref(),
        display,
    )?;
    Ok(report::report(&result, &opts, &args.query)?.exit_code())
}
