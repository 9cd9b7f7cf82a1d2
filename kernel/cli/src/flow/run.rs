//! `rlm flow run`: one invocation of a workflow, with the model flags of `rlm run`.
//!
//! The state starts from `--state FILE` (a JSON object; the final state, without `temp:`
//! keys, is written back to it) and the `--input` values ([`parse_input`]: `KEY=VALUE`
//! text, `KEY=@FILE` a file's text, `KEY:=JSON` typed). `--context` loads into the run's one REPL session (`RlmAgent`s and Python steps
//! share it). Progress goes to stderr ([`Live`]: the agent tree redrawn in place on a
//! terminal, else each agent's start and end as a line) unless `--json` streams every event
//! as one JSON line on stdout; `--events FILE` writes
//! the JSONL event log (flushed per event; `rlm view FILE` renders it). At the end the last
//! message of the run is printed. Every run is checkpointed ([`super::durable`]). Exit codes
//! as `rlm run`: 0 done, 1 an agent failed, 2 a usage error, 3 a limit (timeout, budget, an
//! agent's iteration limit), 130
//! Ctrl-C (state, event log and checkpoints kept); and 5 when the run waits for a human.

use std::ffi::OsString;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex, PoisonError};

use anyhow::{Context, Result};
use clap::Args;
use engine::durable::Location;
use engine::flow::Event;
use engine::flow::file::{AgentSpec, Filesystem, load_workflow};
use engine::flow::{EventKind, EventLog, EventSink, FlowError, Invocation, Registry, RunOutcome};
use engine::inputs::{missing_arguments, missing_inputs};
use engine::{SharedState, State};
use kernel::flow::{FlowKernel, register};
use serde_json::{Map, Value};

use super::durable::{Durable, DurableArgs, Resume, RunDb};
use super::input::{input_file, parse_input};
use super::live::Live;
use super::workflow::Workflow;
use crate::endpoints;
use crate::exit::{EXIT_INTERRUPTED, EXIT_LIMIT, UsageError};
use crate::interrupt;
use crate::outputs::{Database, Document, Guard, Inputs, LogFile, LogStart, Output};
use crate::report::option_inputs;
use crate::settings::{RunFlags, Settings, Switches, offers};

/// Arguments of `rlm flow run`.
#[derive(Debug, Args)]
pub(crate) struct FlowRunArgs {
    /// The workflow: a YAML file, or the name of a built-in (`rlm flow list`).
    #[arg(value_name = "FILE|NAME")]
    pub(crate) workflow: String,

    /// A state value: `KEY=VALUE` (text), `KEY=@FILE` (a file's text), `KEY:=JSON` (a
    /// number, boolean, list or object) or `KEY:=@FILE` (a JSON file). Repeatable.
    #[arg(long = "input", short = 'i', value_name = "KEY=VALUE")]
    pub(crate) inputs: Vec<String>,

    /// Context file(s) or directory for the run's Python session (`NAME=PATH` names it).
    #[arg(long = "context", short = 'c', value_name = "[NAME=]PATH")]
    pub(crate) contexts: Vec<OsString>,

    /// The session state as a JSON object: read at the start, written back at the end
    /// (without `temp:` keys), also after Ctrl-C.
    #[arg(long, value_name = "FILE")]
    pub(crate) state: Option<PathBuf>,

    /// Write the JSONL event log here (one event per line, flushed per event).
    #[arg(long, value_name = "FILE")]
    pub(crate) events: Option<PathBuf>,

    /// The agent bundle that `persona:` agents come from: a bundle folder (holding `agents/`)
    /// or one agent file, which then plays every persona (default: the workflow's own
    /// `bundle/` folder).
    #[arg(long, value_name = "PATH")]
    pub(crate) bundle: Option<PathBuf>,

    #[command(flatten)]
    pub(crate) durable: DurableArgs,

    #[command(flatten)]
    pub(crate) options: RunFlags<{ offers::FLOW }>,
}

/// `rlm flow run`: a new run, or resuming one as `resume` says; `settings` are those of
/// `args.options` (flags over the environment and `rlm.toml`), whose keys the caller has
/// taken out of the environment before any thread started.
pub(crate) fn execute(
    args: FlowRunArgs,
    settings: &Settings,
    workflow: &Workflow,
    resume: Option<Resume>,
) -> Result<ExitCode> {
    let opts = &settings.opts;
    let mut args = args;
    args.durable.db = RunDb::of(opts)?;
    let contexts = crate::contexts::resolve(&args.contexts)?;
    let mut state = match &args.state {
        Some(path) if path.exists() => read_state(path)?,
        _ => State::default(),
    };
    for input in &args.inputs {
        let (key, value) = parse_input(input)?;
        state.set(key, value);
    }
    // Nothing is written before every output is cleared against everything the run reads.
    let spec = load_workflow(workflow.root())?;
    // A new run that would stop at an instruction's missing `{key}` is refused before its
    // run record exists; a resumed run has its state.
    if resume.is_none() {
        check_inputs(&args.workflow, workflow, &spec, &state)?;
    }
    // A workflow with a model's agent and no model named is refused before anything is
    // written; one of Python steps needs none.
    let endpoints = endpoints::endpoints_if_needed(opts, spec.calls_models())?;
    let mut inputs = read_files(&args, workflow, &spec, &contexts.paths, &state);
    option_inputs(&mut inputs, opts, settings.file.as_deref());
    let outputs = declare_outputs(&args, Guard::new(inputs, opts.force()), resume.is_some())?;
    let store =
        super::durable::open_store(&outputs.location, outputs.db.as_ref(), &args.durable.db)?;
    let durable = match resume {
        Some(resume) => Durable::resume(store, &args.durable, resume)?,
        None => Durable::new_run(
            store,
            &args.durable,
            &args.workflow,
            &state,
            &args.contexts,
            args.bundle.as_deref(),
            opts,
        )?,
    };
    let session = endpoints::session_config(opts)?;
    let kernel = Arc::new(FlowKernel::new(
        Arc::clone(&endpoints),
        session,
        contexts.inputs,
    ));
    let registry = super::bundle::extend(
        register(
            Registry::new(Arc::clone(&endpoints), kernel::options::ROOT),
            &kernel,
            workflow.dir(),
        ),
        args.bundle.as_deref(),
        workflow,
    )?;
    let root = registry.build(&spec)?;

    let mut invocation =
        Invocation::new(SharedState::new(state)).with_ledger(Arc::clone(endpoints.ledger()));
    if let Some(timeout) = endpoints::run_timeout(opts)? {
        invocation = invocation.with_timeout(timeout);
    }
    if let Some(log) = outputs.events {
        let log = log.open()?;
        invocation = invocation.with_sink(Arc::new(EventLog::from_file(log.file, log.path)?));
    }
    let last = Arc::new(LastMessage::default());
    invocation = invocation.with_sink(last.clone());
    let json = opts.json();
    // `--json` keeps stderr for errors only; `rlm flow runs --json` names the run. Said
    // before the live tree's first frame, so the redrawing never covers the run's id.
    if !opts.quiet() && !json {
        durable.announce();
    }
    let live = Arc::new(Live::new(&spec, json, opts.quiet()));
    invocation = invocation.with_sink(live.clone());
    let cancel = invocation.cancel.clone();
    let on_interrupt = live.clone();
    let on_quit = live.clone();
    interrupt::on_interrupt(
        move |request| {
            on_interrupt.note(
                &request.line("stopping the workflow; the state and event log so far are kept"),
            );
            cancel.cancel();
        },
        move || on_quit.finish(),
    );
    let outcome = kernel::runtime::shared().block_on(durable.run(root, invocation));
    live.finish_as(outcome.as_ref().ok().map(|o| &o.status));
    let outcome = outcome?;
    let report = &outcome.run;
    if let Some(file) = &outputs.state {
        write_state(file, &report.state)?;
    }
    let status = report.outcome();
    if !json && let Some(text) = last.take() {
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "{text}")?;
    }
    // A run stopped by Ctrl-C is no error: `conclude` says how to continue it.
    if let Err(e) = &report.result
        && status != RunOutcome::Cancelled
    {
        eprintln!("error: {}", crate::secrets::redact(&e.to_string()));
    }
    if let Some(code) = durable.conclude(&outcome, json) {
        return Ok(code);
    }
    Ok(match status {
        RunOutcome::Completed | RunOutcome::Escalated => ExitCode::SUCCESS,
        RunOutcome::Cancelled => ExitCode::from(EXIT_INTERRUPTED),
        RunOutcome::TimedOut | RunOutcome::BudgetExceeded => ExitCode::from(EXIT_LIMIT),
        // An agent's own limit (its iterations) or a graph's step limit: a limit, as in
        // `rlm agent`.
        RunOutcome::Failed if report.result.as_ref().is_err_and(FlowError::is_limit) => {
            ExitCode::from(EXIT_LIMIT)
        }
        RunOutcome::Failed => ExitCode::FAILURE,
    })
}

/// Refuses (a usage error) a run of `spec` whose starting `state` lacks a key an instruction
/// needs that nothing in the workflow provides ([`missing_inputs`]), saying which agents need
/// it, where, and how to pass it; and one with a Python step whose function needs an
/// argument its `args` do not give ([`missing_arguments`]).
fn check_inputs(name: &str, workflow: &Workflow, spec: &AgentSpec, state: &State) -> Result<()> {
    let given = state.keys().map(str::to_owned).collect();
    let missing = missing_inputs(spec, &given, &Filesystem, &kernel::flow::step_writes);
    let arguments = missing_arguments(spec, &Filesystem);
    if missing.is_empty() && arguments.is_empty() {
        return Ok(());
    }
    let backticked = |names: &[String]| {
        names
            .iter()
            .map(|n| format!("`{n}`"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut text = String::new();
    if let Some(first) = missing.first() {
        text.push_str(&format!(
            "`rlm flow run {name}` needs {} that no input gives and no agent of the workflow \
             writes:",
            if missing.len() == 1 {
                "a state key"
            } else {
                "state keys"
            }
        ));
        for input in &missing {
            let places: Vec<String> = input
                .needed_by
                .iter()
                .map(|at| {
                    format!(
                        "`{}` ({}:{})",
                        at.agent,
                        workflow.shown(&at.file).display(),
                        at.line
                    )
                })
                .collect();
            text.push_str(&format!(
                "\n  `{}`, in the instruction of {}",
                input.key,
                places.join(", ")
            ));
            if let Some(close) = &input.close_to {
                text.push_str(&format!(" — a typo of `{close}`?"));
            }
        }
        let example = &first.key;
        text.push_str(&format!(
            "\nPass each with `--input KEY=VALUE` (`KEY=@FILE` for a file's text), e.g. \
             `--input {example}=...`, or in `--state FILE`; or write `{{{example}?}}` in the \
             instruction if it may be missing."
        ));
    }
    for step in &arguments {
        if !text.is_empty() {
            text.push('\n');
        }
        text.push_str(&format!(
            "`rlm flow run {name}` cannot call the Python step `{}` ({}): `{}` needs {} that \
             its `args` do not give. Give each in the step's file, e.g. `args: {{{}: ...}}`, \
             or give the parameter a default.",
            step.agent,
            workflow.shown(&step.file).display(),
            step.function,
            backticked(&step.names),
            step.names.first().map_or("", String::as_str),
        ));
    }
    Err(UsageError::new(text).into())
}

fn read_state(path: &Path) -> Result<State> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("Could not read the state file `{}`", path.display()))?;
    let values: Map<String, Value> = serde_json::from_str(&text).map_err(|e| {
        UsageError::new(format!(
            "`--state {}` is not a JSON object of state keys: {e}",
            path.display()
        ))
    })?;
    Ok(State::from_map(values))
}

fn write_state(file: &Document, state: &State) -> Result<()> {
    let text = serde_json::to_string_pretty(state)?;
    file.write((text + "\n").as_bytes())
}

/// What a workflow run writes, cleared by the output guard.
struct FlowOutputs {
    /// The run database.
    location: Location,
    /// The run database's file, when it is one (SQLite).
    db: Option<Database>,
    events: Option<LogFile>,
    state: Option<Document>,
}

/// What a workflow run reads besides the configuration: its contexts, the `--input
/// KEY=@FILE` files, the workflow's files, its bundle and the files its state names.
fn read_files(
    args: &FlowRunArgs,
    workflow: &Workflow,
    spec: &AgentSpec,
    contexts: &[PathBuf],
    state: &State,
) -> Inputs {
    let mut inputs = Inputs::new();
    for path in contexts {
        inputs.context(path);
    }
    for path in args.inputs.iter().filter_map(|i| input_file(i)) {
        inputs.file("the `--input` file", path);
    }
    workflow.add_inputs(spec, &mut inputs);
    if let Some(bundle) = super::bundle::path_of(args.bundle.as_deref(), workflow) {
        if bundle.is_dir() {
            inputs.tree("the agent bundle", bundle);
        } else {
            inputs.file("the agent file", bundle);
        }
    }
    for path in named_files(state) {
        inputs.file("a file the state names", path);
    }
    inputs
}

/// Declares the run database, `--events` and `--state` to `guard`. A resumed run appends to
/// an existing event log (a file that reads as one); anything else there needs `--force`.
fn declare_outputs(args: &FlowRunArgs, mut guard: Guard, resuming: bool) -> Result<FlowOutputs> {
    // A PostgreSQL database is no file of this host's: nothing to clear.
    let location = args.durable.db.location()?;
    let db = match &location {
        Location::Sqlite(path) => Some(guard.database(Output::new("--db", path))?),
        Location::Postgres(_) => None,
    };
    let events = args
        .events
        .as_ref()
        .map(|path| {
            let start = if resuming && path.is_file() && EventLog::read(path).is_ok() {
                LogStart::Append
            } else {
                LogStart::Fresh
            };
            guard.log(Output::new("--events", path), start)
        })
        .transpose()?;
    let state = args
        .state
        .as_ref()
        .map(|path| guard.read_and_written(Output::new("--state", path)))
        .transpose()?;
    Ok(FlowOutputs {
        location,
        db,
        events,
        state,
    })
}

/// The existing files that string values of `state` name (a step may read them).
fn named_files(state: &State) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let values = state.to_map();
    let mut values: Vec<&Value> = values.values().collect();
    while let Some(value) = values.pop() {
        match value {
            Value::String(text) if text.len() < 4096 && !text.contains('\n') => {
                let path = Path::new(text);
                if path.is_file() {
                    found.push(path.to_path_buf());
                }
            }
            Value::Array(items) => values.extend(items),
            Value::Object(map) => values.extend(map.values()),
            _ => {}
        }
    }
    found
}

/// Keeps the run's last message (what `rlm flow run` prints at the end).
#[derive(Default)]
struct LastMessage(Mutex<Option<String>>);

impl LastMessage {
    fn take(&self) -> Option<String> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).take()
    }
}

impl EventSink for LastMessage {
    fn emit(&self, event: &Event) -> Result<(), FlowError> {
        if let (EventKind::Message, Some(text)) = (&event.kind, &event.content) {
            *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(text.clone());
        }
        Ok(())
    }
}
