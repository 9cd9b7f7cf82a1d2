//! `rlm eval`: scores RLM runs on generated long-context tasks ([`kernel::eval`]) and reports
//! per task and size the score, tokens, cost, latency, iterations, sub-calls and failures.
//!
//! Every instance runs through the real loop in its own REPL session (`runner`), a few at a
//! time (`--parallel`), optionally followed by the baseline: the same root model with the
//! context pasted into its prompt, cut to `--baseline-window` tokens. `--depths 1,2` runs
//! every instance once per depth of the run tree (`--max-depth`). `summary` turns the
//! run records into rows (table, `--json`), `plot` draws them (`--plot`). `--out DIR` keeps
//! each run's trajectory and the results; no file there is replaced without `--force`.
//! `--scripted` starts the mock LM server in-process with models whose strategies are right
//! (`scripted`), so the whole pipeline must score as scripted: 100 %, except `linked` at depth
//! 1, which the scripted models answer as one-shot sub-calls do (0) — a check for CI and the
//! README.
//! `--ray` makes the RLM runs on a Ray cluster through the Python package (`ray`) and hands
//! their results to the same runner, which scores and writes them as local runs.

mod plot;
mod ray;
mod runner;
mod scripted;
mod summary;

use std::collections::HashMap;
use std::io::{IsTerminal as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Mutex;

use anyhow::{Context as _, Result};
use bridge::mock::Script;
use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use kernel::eval::{TaskKind, parse_size};
use kernel::options::RunOptions;
use serde_json::json;

use crate::endpoints;
use crate::exit::{self, EXIT_INTERRUPTED, UsageError};
use crate::interrupt;
use crate::outputs::{Document, Guard, Inputs, LogFile, LogStart, Output};
use crate::report::option_inputs;
use crate::secrets::redact;
use crate::settings::{RunFlags, Switches, offers};
use runner::{Job, Method, Plan, RlmRuns, RunRecord, Stopper};

/// Arguments of `rlm eval`.
#[derive(Debug, Args)]
pub(crate) struct EvalArgs {
    /// Task families, comma-separated: `needle` (find one key's value), `aggregate` (count
    /// messages per inferred category), `pairs` (every pair of users meeting a condition),
    /// `linked` (every pair of users whose messages meet on a date: a relation between pairs
    /// of records, what deeper run trees are for; not run unless named).
    #[arg(long, value_delimiter = ',', default_value = "needle,aggregate,pairs", value_parser = parse_task)]
    pub(crate) tasks: Vec<TaskKind>,

    /// Context sizes in tokens (one token per 4 bytes), comma-separated, e.g. `8k,64k,1m`.
    #[arg(long, value_delimiter = ',', default_value = "8k,64k", value_parser = parse_tokens)]
    pub(crate) sizes: Vec<u64>,

    /// Instances per task and size.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) n: u32,

    /// Seed of the generated tasks (the same seed gives the same tasks).
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,

    /// Depths of the run tree to compare, comma-separated (e.g. `1,2`): every instance runs
    /// once at each `--max-depth` listed, and the table has a row per depth [default: the
    /// `--max-depth` of the options].
    #[arg(long, value_delimiter = ',', value_name = "DEPTHS", value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) depths: Vec<u32>,

    /// Facts in each needle context: one asked for, the others decoys with other keys.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub(crate) needles: u32,

    /// Runs at once, each in its own REPL session.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub(crate) parallel: u32,

    /// Also run the baseline: the root model answering with the context pasted into its
    /// prompt, cut to this many tokens (e.g. `32k`).
    #[arg(long, value_name = "TOKENS", value_parser = parse_tokens)]
    pub(crate) baseline_window: Option<u64>,

    /// Run against scripted mock models (in-process, no API key) whose strategies are right
    /// for each task: every score must be 1.
    #[arg(long, conflicts_with_all = ["base_url", "model"])]
    pub(crate) scripted: bool,

    /// Folder for each run's trajectory (`TASK-SIZE-NNN.jsonl`) and the results
    /// (`results.json`); created if missing.
    #[arg(long, value_name = "DIR")]
    pub(crate) out: Option<PathBuf>,

    /// Run the RLM runs on a Ray cluster through the Python package (`rlm_kernel.ray`, in
    /// `$RLM_PYTHON` or `python3`): at ADDRESS (`auto`, `HOST:PORT`, `ray://HOST:10001`), or
    /// without one where Ray looks (`RAY_ADDRESS`, a cluster started on this machine, else a new
    /// local one). Scores, files and table are those of a local run; baselines run here.
    #[arg(long, value_name = "ADDRESS", num_args = 0..=1)]
    pub(crate) ray: Option<Option<String>>,

    /// Draw the mean score against context size (RLM solid, baseline dashed) to an SVG file.
    #[arg(long, value_name = "FILE.svg")]
    pub(crate) plot: Option<PathBuf>,

    /// Model options (`--model`, `--base-url`, `--price`; budgets and `--batch-concurrency`
    /// hold for each run).
    #[command(flatten)]
    pub(crate) options: RunFlags<{ offers::EVAL }>,
}

fn parse_task(text: &str) -> Result<TaskKind, String> {
    text.parse()
        .map_err(|e: kernel::eval::EvalError| e.to_string())
}

fn parse_tokens(text: &str) -> Result<u64, String> {
    parse_size(text).map_err(|e| e.to_string())
}

/// `rlm eval`; `config` is the `--config` file, if given.
pub(crate) fn execute(args: EvalArgs, config: Option<&Path>) -> Result<ExitCode> {
    let settings = args.options.clone().settings(config)?;
    // A trajectory or answer file in a shared `rlm.toml` is for `rlm run`.
    let mut opts = RunOptions {
        trajectory: None,
        answer_file: None,
        ..settings.opts
    };
    let config_path = settings.file.as_deref();
    exit::json_errors(opts.json());
    for (flag, given) in [
        ("trajectory", settings.flags.trajectory.is_some()),
        ("answer-file", settings.flags.answer_file.is_some()),
    ] {
        if given {
            return Err(UsageError::new(format!(
                "`rlm eval` runs many tasks and takes no `--{flag}`; pass `--out DIR` to keep every run's trajectory and the results"
            ))
            .into());
        }
    }
    if !args.scripted && opts.model.is_none() {
        return Err(UsageError::new(
            "No model given; pass `--model NAME` (and `--base-url URL` for a server other than the provider's), or `--scripted` to run against scripted mock models",
        )
        .into());
    }
    // First, while the process has one thread and no Python: keys leave the environment.
    crate::secrets::protect(&opts)?;
    let runtime = kernel::runtime::shared();
    let server = if args.scripted {
        let script = Script::from_json_value(scripted::script())
            .context("The scripted models' script is invalid")?;
        let server = crate::mock_lm::start_scripted(
            script,
            &mut opts,
            scripted::ROOT_MODEL,
            scripted::SUB_MODEL,
        )?;
        if !opts.quiet() {
            eprintln!(
                "rlm eval: the models are SCRIPTED. A mock LM server on {} plays a root model whose \
                 strategy is right for each task and a sub-model that answers chunk questions by \
                 rules; no real language model is involved, so every score must be 1 (but 0 for \
                 `linked` at depth 1, where the scripted sub-model plays a one-shot reply).",
                server.openai_base_url()
            );
        }
        Some(server)
    } else {
        None
    };

    let rlm_config = endpoints::rlm_config(&opts)?;
    let swept = !args.depths.is_empty();
    let mut depths = if swept {
        args.depths.clone()
    } else {
        vec![rlm_config.max_depth]
    };
    depths.sort_unstable();
    depths.dedup();
    let depths = &depths;
    let jobs: Vec<Job> = args
        .tasks
        .iter()
        .flat_map(|kind| {
            args.sizes.iter().flat_map(move |size| {
                (0..args.n as usize).flat_map(move |index| {
                    depths.iter().enumerate().map(move |(i, depth)| Job {
                        kind: *kind,
                        size: *size,
                        index,
                        depth: *depth,
                        swept,
                        baseline: i == 0,
                    })
                })
            })
        })
        .collect();
    let outputs = declare_outputs(&args, &jobs, &opts, config_path)?;
    let trajectories = Mutex::new(outputs.trajectories);

    // Each run builds its own registry (see `runner`); building one now checks the options.
    endpoints::build_endpoints(&opts)?;
    let endpoints = || endpoints::build_endpoints(&opts);
    let bar = progress_bar(&opts, jobs.len());
    let on_done = |record: &RunRecord| {
        if record.method == Method::Rlm {
            bar.inc(1);
        }
    };
    let stopper = Stopper::default();
    stop_on_interrupt(stopper.clone());
    let started = std::time::Instant::now();
    let (rlm_runs, jobs_run) = match &args.ray {
        None => (RlmRuns::Local, jobs.clone()),
        Some(address) => {
            // One job on the cluster per depth: the package's options hold for a whole job.
            let mut done = HashMap::new();
            for depth in depths {
                let mut options = endpoints::keyword_options(&opts)?;
                options.insert("max_depth".into(), json!(depth));
                let of_depth: Vec<Job> =
                    jobs.iter().filter(|j| j.depth == *depth).copied().collect();
                done.extend(ray::run(
                    address.as_deref(),
                    options,
                    &of_depth,
                    args.seed,
                    args.needles as usize,
                    &stopper,
                )?);
                if stopper.is_stopped() {
                    break;
                }
            }
            // The jobs that came back, in the grid's order (depths interleaved per instance,
            // as a local sweep runs them), so records, files and table match a local run's.
            let ran = jobs
                .iter()
                .filter(|job| done.contains_key(&job.stem()))
                .copied()
                .collect();
            (RlmRuns::Done(Mutex::new(done)), ran)
        }
    };
    let plan = Plan {
        jobs: &jobs_run,
        seed: args.seed,
        needles: args.needles as usize,
        parallel: args.parallel as usize,
        baseline_window: args.baseline_window,
        trajectories: &trajectories,
        rlm_config,
        session_config: endpoints::session_config(&opts)?,
        endpoints: &endpoints,
        on_done: &on_done,
        rlm_runs,
    };
    let records = runner::run_all(&plan, &stopper);
    bar.finish_and_clear();
    if let Some(server) = server {
        runtime.block_on(server.shutdown());
    }
    let records = records?;
    let wall_s = started.elapsed().as_secs_f64();

    let rows = summary::summarise(&records, &args.tasks, &args.sizes);
    let document = json!({
        "rlm_version": env!("CARGO_PKG_VERSION"),
        "scripted": args.scripted,
        "models": {"root": opts.model, "sub": opts.sub_model.as_ref().or(opts.model.as_ref())},
        "seed": args.seed,
        "n": args.n,
        "needles": args.needles,
        "depths": depths,
        "baseline_window_tokens": args.baseline_window,
        "tokens_per_byte": 0.25,
        "wall_s": wall_s,
        "summary": rows,
        "runs": records,
    });
    let text = redact(&serde_json::to_string_pretty(&document)?).into_owned();
    if let Some(results) = &outputs.results {
        results.write(format!("{text}\n").as_bytes())?;
    }
    if let Some(file) = &outputs.plot {
        plot::write_plot(file, &rows, args.scripted)?;
    }
    let mut stdout = std::io::stdout().lock();
    if opts.json() {
        writeln!(stdout, "{text}")?;
    } else {
        if args.scripted {
            writeln!(
                stdout,
                "models: SCRIPTED (mock LM server, no real language model)"
            )?;
        } else {
            writeln!(
                stdout,
                "models: root `{}`, sub `{}`",
                opts.model.as_deref().unwrap_or_default(),
                opts.sub_model
                    .as_deref()
                    .or(opts.model.as_deref())
                    .unwrap_or_default()
            )?;
        }
        write!(stdout, "{}", summary::table(&rows))?;
    }
    stdout.flush()?;
    let done = records.iter().filter(|r| r.method == Method::Rlm).count();
    if !opts.quiet() {
        eprintln!(
            "{done} of {} runs in {wall_s:.1} s{}{}",
            jobs.len(),
            args.out
                .as_ref()
                .map(|d| format!("; trajectories and results.json in `{}`", d.display()))
                .unwrap_or_default(),
            args.plot
                .as_ref()
                .map(|p| format!("; plot in `{}`", p.display()))
                .unwrap_or_default(),
        );
    }
    if done < jobs.len() {
        eprintln!("Interrupted: {} runs did not start.", jobs.len() - done);
        return Ok(ExitCode::from(EXIT_INTERRUPTED));
    }
    if args.scripted {
        let expected = |r: &RunRecord| scripted::expected_score(r.task, r.depth.unwrap_or(1));
        let rlm_runs = || records.iter().filter(|r| r.method == Method::Rlm);
        let off = rlm_runs().filter(|r| r.score != expected(r)).count();
        if off > 0 {
            eprintln!(
                "check: {off} scripted runs did not score as their script says (1; `linked` at depth 1: 0); the pipeline lost or changed something (see their trajectories with `--out DIR`)"
            );
            return Ok(ExitCode::FAILURE);
        }
        if rlm_runs().all(|r| expected(r) == 1.0) {
            eprintln!("check: every scripted run scored 1 ✓");
        } else {
            eprintln!(
                "check: every scripted run scored as its script says ✓ (1; `linked` at depth 1: 0, as a one-shot sub-call cannot relate the records of a share of the dates)"
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The files an evaluation writes, cleared by the output guard.
struct EvalOutputs {
    /// Each job's trajectory in `--out`, by the job's stem.
    trajectories: HashMap<String, LogFile>,
    /// `results.json` in `--out`.
    results: Option<Document>,
    /// `--plot`.
    plot: Option<Document>,
}

/// Declares every output before any run: one that would replace an existing file without
/// `--force`, or that is an input (the configuration or a prompt file), is refused.
fn declare_outputs(
    args: &EvalArgs,
    jobs: &[Job],
    opts: &RunOptions,
    config_path: Option<&Path>,
) -> Result<EvalOutputs> {
    let mut inputs = Inputs::new();
    option_inputs(&mut inputs, opts, config_path);
    let mut guard = Guard::new(inputs, opts.force());
    let mut results = None;
    let mut trajectories = HashMap::new();
    let mut files = Vec::new();
    if let Some(dir) = &args.out {
        if dir.exists() && !dir.is_dir() {
            return Err(UsageError::new(format!(
                "`--out` `{}` is a file; pass a folder",
                dir.display()
            ))
            .into());
        }
        let out = |name: String| Output::new("--out", dir.join(name)).creating_folders();
        files.push(out("results.json".into()));
        files.extend(jobs.iter().map(|job| out(format!("{}.jsonl", job.stem()))));
    }
    let plot = args.plot.as_ref().map(|path| Output::new("--plot", path));
    let all: Vec<Output> = plot.iter().chain(&files).cloned().collect();
    guard.refuse_existing(&all, "outputs of this evaluation")?;
    let plot = plot.map(|plot| guard.document(plot)).transpose()?;
    let mut files = files.into_iter();
    if let Some(file) = files.next() {
        results = Some(guard.document(file)?);
    }
    for (job, file) in jobs.iter().zip(files) {
        trajectories.insert(job.stem(), guard.log(file, LogStart::Fresh)?);
    }
    Ok(EvalOutputs {
        trajectories,
        results,
        plot,
    })
}

fn progress_bar(opts: &RunOptions, runs: usize) -> ProgressBar {
    if opts.quiet() || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(runs as u64), ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} runs · {elapsed} · eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar
}

/// The first Ctrl-C (or `SIGTERM`, `SIGHUP`) stops the runs in progress (each keeps its best
/// answer and trajectory) and starts no more; a second one quits at once.
fn stop_on_interrupt(stopper: Stopper) {
    interrupt::on_interrupt(
        move |request| {
            request.say("stopping the runs in progress");
            stopper.stop();
        },
        || {},
    );
}
