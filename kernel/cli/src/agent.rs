//! `rlm agent`: talk with a persona agent — a BMAD 6.0 agent file, a BMAD 6.1+ agent skill, or
//! any Agent Skill.
//!
//! The agent starts ([`StartedAgent::start`]: only the files its start-up needs are read —
//! its config, its customization, its persistent facts, the front matter of the skills it
//! may load), then each user turn runs the function-calling loop ([`AgentLoop`]) over the
//! whole conversation so far, with its tools (`read_file`, `save_output`, `execute_workflow`
//! and `invoke_agent` for a 6.0 agent, `load_skill` and `run_skill_script` when there are
//! skills). A turn that is `*name` or a menu number runs that command. Turns come from
//! `--message` (one per flag, then exit) or, without it, from the terminal (line editing and
//! history; the menu is shown first) or one per line of standard input. Model flags and
//! `rlm.toml` are those of `rlm run`. `--python` adds the kernel's `python` tool over an
//! embedded REPL session, through which skill scripts run too; `--skills DIR` adds skills.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result};
use bridge::{CancellationToken, ChatResponse, Endpoint, Message};
use clap::Args;
use engine::agent::{
    AgentHook, AgentLoop, LoopConfig, LoopErrorKind, LoopMetrics, ToolCallRecord, Toolbox,
};
use engine::bundle::{
    BundleError, PathError, SandboxPolicy, StartOptions, StartedAgent, agent_tools,
};
use engine::{SharedState, State, Tool};
use kernel::options::RunOptions;
use kernel::repl::ReplSession;
use kernel::tools::PythonTool;
use serde_json::json;

use crate::endpoints;
use crate::exit::RunOutcome;
use crate::interrupt;
use crate::outputs::{Document, Guard, Inputs, Output};
use crate::questions::Questions;
use crate::report::option_inputs;
use crate::secrets;
use crate::settings::{RunFlags, Switches, offers};

/// Arguments of `rlm agent`.
#[derive(Debug, Args)]
pub(crate) struct AgentArgs {
    /// The agent: a skill folder (`.claude/skills/bmad-agent-pm`, BMAD 6.1 and later, or any
    /// Agent Skill), a skill's name (found in the project's skill folders or `--skills`), or
    /// a BMAD 6.0 agent file (`agents/NAME.md`).
    #[arg(value_name = "AGENT")]
    pub(crate) agent: PathBuf,

    /// A folder of skills (or one skill folder) the agent may load, besides those of the
    /// project (`.agents/skills/`, `.claude/skills/` and other tools' folders). Repeat for
    /// several; they are searched first.
    #[arg(long = "skills", value_name = "DIR")]
    pub(crate) skills: Vec<PathBuf>,

    /// Send TEXT as one turn, print the answer and exit (no menu). `*name` or a menu number
    /// runs that command. Repeat for several turns in order.
    #[arg(long, value_name = "TEXT")]
    pub(crate) message: Vec<String>,

    /// Stream each answer as it arrives (default: on without `--message`).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub(crate) stream: Option<bool>,

    /// Give the agent a `python` tool: code runs in an embedded Python session where
    /// `llm_query` asks the sub-model. Python code is not confined by the path sandbox.
    #[arg(long)]
    pub(crate) python: bool,

    /// Write every file the agent read or wrote to FILE, one JSON object a line.
    #[arg(long, value_name = "FILE")]
    pub(crate) file_log: Option<PathBuf>,

    #[command(flatten)]
    pub(crate) options: RunFlags<{ offers::AGENT }>,
}

/// `rlm agent`; `config` is the `--config` file, if given.
pub(crate) fn execute(args: AgentArgs, config: Option<&Path>, verbosity: u8) -> Result<ExitCode> {
    let settings = args.options.settings(config)?;
    let opts = settings.opts;
    let config_path = settings.file.as_deref();
    secrets::protect(&opts)?;
    let endpoints = endpoints::build_endpoints(&opts)?;
    let endpoint = endpoints.get(kernel::options::ROOT)?;
    let started = StartedAgent::start(
        &args.agent,
        &StartOptions {
            project_root: opts.project_root.clone(),
            policy: SandboxPolicy {
                allow_broad_roots: opts.allow_broad_root.unwrap_or(false),
                allow_hard_links: opts.allow_hard_links.unwrap_or(false),
            },
            skill_folders: args.skills.clone(),
            ..StartOptions::default()
        },
    )
    .map_err(|e| {
        // A start-up file missing where the default project root put it: say how the root
        // was chosen and how to choose it.
        let missing = matches!(&e, BundleError::StartupFile { error, .. }
            if matches!(**error, BundleError::Path(PathError::NotFound { .. })));
        let hint = if missing && opts.project_root.is_none() {
            " (the project root is the working directory, or the folder inside it above the \
             agent where its start-up files are: run `rlm agent` from the project the bundle is \
             installed in, or pass `--project-root DIR` or set `project-root` in rlm.toml)"
        } else {
            ""
        };
        anyhow::Error::new(e).context(format!(
            "Could not start the agent `{}`{hint}",
            args.agent.display()
        ))
    })?;
    // Start-up only read files; no model has been called yet.
    let file_log = args
        .file_log
        .as_ref()
        .map(|path| {
            Guard::new(agent_inputs(&started, &opts, config_path), opts.force())
                .document(Output::new("--file-log", path))
        })
        .transpose()?;
    if !opts.quiet() {
        for warning in started.warnings() {
            eprintln!("warning: {warning}");
        }
    }
    let interactive = args.message.is_empty();
    let json = opts.json();
    let config = LoopConfig {
        max_iterations: opts
            .max_iterations
            .unwrap_or(LoopConfig::default().max_iterations),
        run_timeout: endpoints::run_timeout(&opts)?,
        stream: args.stream.unwrap_or(interactive),
        ..LoopConfig::default()
    };
    let python: Option<Arc<dyn Tool>> = if args.python {
        let mut config = endpoints::session_config(&opts)?;
        // Skill scripts run through this tool and import modules beside them: a confined
        // worker may read the skills' `scripts/` folders and BMAD's shared scripts, nothing
        // else of the project.
        let shared = started
            .session
            .roots()
            .project
            .join("_bmad")
            .join("scripts");
        let scripts = started
            .session
            .skills()
            .iter()
            .map(|s| s.dir.join("scripts"));
        config
            .read_paths
            .extend(scripts.chain([shared]).filter(|dir| dir.is_dir()));
        let session = ReplSession::new(config, Arc::clone(&endpoints), &[])
            .context("Could not start the Python session for the `python` tool")?;
        crate::observe::report_isolation(&session);
        Some(Arc::new(PythonTool::new(Arc::new(session))))
    } else {
        None
    };
    let mut toolbox = Toolbox::new();
    for tool in agent_tools(
        &started,
        Arc::clone(&endpoint),
        config.clone(),
        python.clone(),
    ) {
        toolbox.add(tool)?;
    }
    if let Some(python) = python {
        toolbox.add(python)?;
    }
    let mut agent = AgentLoop::new(Arc::clone(&endpoint), toolbox, config.clone());
    if verbosity > 0 || opts.trace() {
        agent = agent.with_hook(Arc::new(VerboseLog));
    }
    if !json {
        agent = agent.with_hook(Arc::new(ReplyText {
            streamed: config.stream,
        }));
    }
    if config.stream && !json {
        agent = agent.with_text_sink(|text| {
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(text.as_bytes());
            let _ = out.flush();
        });
    }

    let mut session = Session {
        started: &started,
        agent,
        endpoint,
        transcript: started.messages(),
        state: SharedState::new(State::default()),
        turns: Vec::new(),
        streamed: config.stream && !json,
        json,
        quiet: opts.quiet(),
        verbose: verbosity > 0 || opts.trace(),
        logged_files: 0,
    };
    let cancel = CancellationToken::new();
    cancel_on_interrupt(cancel.clone());
    let outcome = if interactive {
        if !json {
            println!("{}\n", started.menu());
        }
        let mut questions = Questions::open("> ")?;
        let mut last = RunOutcome::Answered;
        while let Some(input) = questions.next()? {
            last = session.turn(&input, &cancel)?;
            if last != RunOutcome::Answered {
                break;
            }
        }
        last
    } else {
        let mut last = RunOutcome::Answered;
        for input in &args.message {
            last = session.turn(input, &cancel)?;
            if last != RunOutcome::Answered {
                break;
            }
        }
        last
    };
    if let Some(file) = &file_log {
        write_file_log(file, &started)?;
    }
    if json {
        session.print_json()?;
    }
    Ok(outcome.exit_code())
}

/// The conversation with one agent.
struct Session<'a> {
    started: &'a StartedAgent,
    agent: AgentLoop,
    endpoint: Arc<Endpoint>,
    transcript: Vec<Message>,
    state: SharedState,
    turns: Vec<serde_json::Value>,
    streamed: bool,
    json: bool,
    quiet: bool,
    verbose: bool,
    /// File accesses already shown with `-v`.
    logged_files: usize,
}

impl Session<'_> {
    /// Runs one user turn; prints the answer (unless streamed or `--json`).
    fn turn(&mut self, input: &str, cancel: &CancellationToken) -> Result<RunOutcome> {
        let message = self
            .started
            .command_message(input)
            .unwrap_or_else(|| input.to_owned());
        self.transcript.push(Message::user(message.clone()));
        let runtime = kernel::runtime::shared();
        let result = runtime.block_on(self.agent.run(
            self.transcript.clone(),
            self.state.clone(),
            cancel.child_token(),
        ));
        let (outcome, answer, termination, run) = match result {
            Ok(outcome) => (
                RunOutcome::Answered,
                Some(outcome.answer),
                json!(outcome.termination),
                outcome.run,
            ),
            Err(err) => {
                let outcome = match err.kind() {
                    LoopErrorKind::Cancelled => RunOutcome::Interrupted,
                    LoopErrorKind::MaxIterations { .. }
                    | LoopErrorKind::RunTimeout { .. }
                    | LoopErrorKind::Budget(_) => RunOutcome::Limited,
                    LoopErrorKind::Model(_) | LoopErrorKind::StoppedByHook(_) => RunOutcome::Failed,
                };
                eprintln!("error: {}", secrets::redact(&stop_message(err.kind())));
                let termination = json!({"error": err.to_string()});
                (outcome, None, termination, err.into_parts().1)
            }
        };
        self.transcript = run.transcript;
        self.log_files();
        if let Some(answer) = answer.as_deref().filter(|_| !self.json) {
            if self.streamed {
                // The text is out already; end its line.
                println!();
            } else {
                println!("{}", secrets::redact(answer));
            }
        }
        if !self.quiet && !self.json {
            eprintln!("{}", summary(outcome, &run.metrics));
        }
        self.turns.push(json!({
            "input": input,
            "message": message,
            "answer": answer,
            "termination": termination,
            "metrics": run.metrics,
        }));
        let _ = std::io::stdout().flush();
        Ok(outcome)
    }

    /// With `-v`: the files read and written since the last call.
    fn log_files(&mut self) {
        let entries = self.started.session.file_log().entries();
        if self.verbose {
            for access in entries.iter().skip(self.logged_files) {
                eprintln!(
                    "agent: file {} {} ({} bytes, by {})",
                    json!(access.op).as_str().unwrap_or_default(),
                    access.path.display(),
                    access.bytes,
                    access.by
                );
            }
        }
        self.logged_files = entries.len();
    }

    fn print_json(&self) -> Result<()> {
        let agent = &self.started.definition;
        let document = json!({
            "rlm_version": env!("CARGO_PKG_VERSION"),
            "agent": {
                "name": agent.name,
                "title": agent.title,
                "format": agent.format,
                "path": agent.path,
                "project_root": self.started.session.roots().project,
                "output_folder": self.started.session.sandbox().write_root(),
                "model": self.endpoint.config().model,
            },
            "startup": {"loaded": self.started.loaded},
            "skills": self.started.session.skills().iter().collect::<Vec<_>>(),
            "turns": self.turns,
            "transcript": self.transcript,
            "files": self.started.session.file_log().entries(),
        });
        let text = serde_json::to_string_pretty(&document)?;
        println!("{}", secrets::redact(&text));
        Ok(())
    }
}

/// Why a turn ended without an answer, naming the flag that sets a limit.
fn stop_message(kind: &LoopErrorKind) -> String {
    match kind {
        LoopErrorKind::MaxIterations { max } => format!(
            "The agent was still calling tools after {max} iterations (`--max-iterations \
             {max}`); raise `--max-iterations` or give it a narrower task"
        ),
        LoopErrorKind::RunTimeout { timeout } => format!(
            "The agent did not answer within `--timeout {}` (seconds); raise `--timeout` or \
             give it a narrower task",
            timeout.as_secs_f64()
        ),
        other => other.to_string(),
    }
}

/// One line per turn on stderr: how it ended, iterations, tool calls, tokens, time.
fn summary(outcome: RunOutcome, metrics: &LoopMetrics) -> String {
    let ended = match outcome {
        RunOutcome::Answered => "answered",
        RunOutcome::Limited => "stopped at a limit",
        RunOutcome::Failed => "failed",
        RunOutcome::Interrupted => "interrupted",
    };
    format!(
        "{ended} after {} iteration(s), {} tool call(s), {} tokens, {:.1}s",
        metrics.iterations,
        metrics.tool_calls.len(),
        metrics.total_tokens(),
        metrics.wall_ms / 1000.0
    )
}

/// What the agent reads: its file, the bundle's folders (every file in them may be loaded by
/// name), what its start-up loaded, and the configuration and prompt files.
fn agent_inputs(started: &StartedAgent, opts: &RunOptions, config_path: Option<&Path>) -> Inputs {
    let mut inputs = Inputs::new();
    inputs.file("the agent file", &started.definition.path);
    let roots = started.session.roots();
    inputs.tree("the agent bundle", &roots.bundle);
    inputs.tree("the agent bundle's core", &roots.core);
    for loaded in &started.loaded {
        inputs.file("a file the agent loaded", &loaded.path);
    }
    for skill in started.session.skills().iter() {
        inputs.tree("a skill the agent may load", &skill.dir);
    }
    option_inputs(&mut inputs, opts, config_path);
    inputs
}

/// `--file-log`: one JSON line per file the agent read or wrote, written whole at the end.
fn write_file_log(file: &Document, started: &StartedAgent) -> Result<()> {
    let mut text = String::new();
    for access in started.session.file_log().entries() {
        text.push_str(&serde_json::to_string(&access)?);
        text.push('\n');
    }
    file.write(text.as_bytes())
}

/// Prints the text of replies that also call tools (the last reply, the answer, is printed
/// by the turn), so the user sees "Step 1: …" before the tools run; when streamed, the text
/// is out already and only its line is ended.
struct ReplyText {
    streamed: bool,
}

impl AgentHook for ReplyText {
    fn after_model_call(&self, _iteration: u32, response: &mut ChatResponse) {
        if response.tool_calls.is_empty() || response.content.is_empty() {
            return;
        }
        if self.streamed {
            println!();
        } else {
            println!("{}", secrets::redact(&response.content));
        }
    }
}

/// `-v`: each iteration and each tool call (name, arguments, success, duration) on stderr.
struct VerboseLog;

/// Characters of a tool call's arguments shown with `-v`.
const SHOWN_ARGUMENT_CHARS: usize = 200;

impl AgentHook for VerboseLog {
    fn after_model_call(&self, iteration: u32, response: &mut ChatResponse) {
        eprintln!(
            "agent: iteration {iteration}: {} tool call(s), {} tokens, {} ms",
            response.tool_calls.len(),
            response.usage.total(),
            response.latency.as_millis()
        );
    }

    fn after_tool_call(&self, record: &mut ToolCallRecord) {
        let mut arguments: String = record
            .call
            .arguments
            .chars()
            .take(SHOWN_ARGUMENT_CHARS)
            .collect();
        if record.call.arguments.chars().count() > SHOWN_ARGUMENT_CHARS {
            arguments.push('…');
        }
        let result = match &record.output {
            Ok(_) => "ok".to_owned(),
            Err(e) => format!("failed: {e}"),
        };
        eprintln!(
            "agent: tool {} {} → {result} ({} ms)",
            record.call.name,
            secrets::redact(&arguments),
            record.duration.as_millis()
        );
    }
}

/// Ctrl-C (or `SIGTERM`, `SIGHUP`) cancels the turn in progress (the transcript is kept); a
/// second one quits.
fn cancel_on_interrupt(cancel: CancellationToken) {
    interrupt::on_interrupt(
        move |request| {
            request.say("stopping the agent");
            cancel.cancel();
        },
        || {},
    );
}
