//! `rlm flow demo NAME`: a built-in workflow against scripted mock models started
//! in-process (no API key, no real model), with sample inputs.
//!
//! A demo with a scripted human answer (`team`) runs until the router escalates
//! (`awaiting_human`: the question and the decisions are shown), then resumes the run with
//! that answer as `rlm flow resume RUN --input "..."` would, and completes it.

use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Args;

use engine::durable::RunStatus;
use kernel::options::RunOptions;

use super::durable::{Resume, fresh_id};
use super::run::FlowRunArgs;
use crate::exit::UsageError;
use crate::outputs::Scratch;
use crate::settings::{RunFlags, offers};

/// Arguments of `rlm flow demo`.
#[derive(Debug, Args)]
pub(crate) struct FlowDemoArgs {
    /// The built-in workflow (`refine`, `rlm-completion`, `plan-discover` or `team`).
    #[arg(value_name = "NAME")]
    name: String,

    /// Speak the Anthropic wire format to the mock instead of OpenAI's.
    #[arg(long)]
    anthropic: bool,

    /// Write the JSONL event log here.
    #[arg(long, value_name = "FILE")]
    events: Option<std::path::PathBuf>,

    #[command(flatten)]
    pub(super) durable: super::durable::DurableArgs,

    /// Overwrite an existing `--events` file.
    #[arg(long)]
    force: bool,

    /// The run database and lease (the models are scripted: no model options).
    #[command(flatten)]
    options: RunFlags<{ offers::DURABLE }>,
}

/// A demo: its script and sample inputs.
struct Demo {
    name: &'static str,
    script: &'static str,
    inputs: &'static [(&'static str, &'static str)],
    /// A sample context file, by name and text.
    context: Option<(&'static str, &'static str)>,
    /// Whether it writes documents (into a temporary `output_dir`, shown at the end).
    writes_artifacts: bool,
    /// The scripted human's answer when the run stops to ask one.
    answer: Option<&'static str>,
}

const DEMOS: &[Demo] = &[
    Demo {
        name: "refine",
        script: include_str!("demo/refine.json"),
        inputs: &[
            ("template", "# Quarterly note\n{region} grew by {growth}.\n"),
            (
                "reviewed_summary",
                "Sales grew 4% in the north region; the south was flat.",
            ),
        ],
        context: None,
        writes_artifacts: false,
        answer: None,
    },
    Demo {
        name: "rlm-completion",
        script: include_str!("demo/rlm-completion.json"),
        inputs: &[
            ("query", "How many lines do the notes have?"),
            ("format", "one sentence"),
        ],
        context: Some(("notes.txt", "alpha\nbeta\ngamma\n")),
        writes_artifacts: false,
        answer: None,
    },
    Demo {
        name: "plan-discover",
        script: include_str!("demo/plan-discover.json"),
        inputs: &[("goal", "Plan next quarter's sales push")],
        context: Some((
            "sales.txt",
            "north: 120 -> 131\nsouth: 98 -> 97\neast: 77 -> 90\n",
        )),
        writes_artifacts: true,
        answer: None,
    },
    Demo {
        name: "team",
        script: include_str!("demo/team.json"),
        inputs: &[("request", "Export the weekly report table as CSV.")],
        context: None,
        writes_artifacts: false,
        answer: Some("Quote every field: our importers need it."),
    },
];

/// `rlm flow demo`; `config` is the `--config` file, if given (its model options give way to
/// the scripted models').
pub(crate) fn execute(args: FlowDemoArgs, config: Option<&Path>) -> Result<ExitCode> {
    let demo = DEMOS.iter().find(|d| d.name == args.name).ok_or_else(|| {
        UsageError::new(format!(
            "There is no demo `{}`; demos: {}",
            args.name,
            DEMOS
                .iter()
                .map(|d| format!("`{}`", d.name))
                .collect::<Vec<_>>()
                .join(", ")
        ))
    })?;
    let script = bridge::mock::Script::from_json_str(demo.script)
        .context("The bundled demo script is invalid")?;
    let mut settings = RunFlags::<{ offers::FLOW }>::default().settings(config)?;
    // `--db` and `--lease-expiry` over the environment and the file.
    settings.opts = args.options.given()?.combine(settings.opts);
    // First, while the process has one thread and no Python: keys leave the environment.
    crate::secrets::protect(&settings.opts)?;
    let mut scripted = RunOptions::default();
    let server = crate::mock_lm::start_scripted(script, &mut scripted, "demo-model", "demo-model")?;
    if args.anthropic {
        scripted.base_url = Some(server.anthropic_base_url());
        scripted.provider = Some(bridge::Provider::Anthropic);
    }
    eprintln!(
        "rlm flow demo: the models are SCRIPTED. A mock LM server on 127.0.0.1 replays fixed \
         replies (kernel/cli/src/flow/demo/{}.json); no real language model is involved.",
        demo.name
    );
    scripted.force = args.force.then_some(true);
    // The scripted models over the rest of the file's options.
    settings.opts = scripted.combine(settings.opts);
    let dir = Scratch::new()?;
    let mut contexts = Vec::new();
    if let Some((name, text)) = demo.context {
        contexts.push(dir.write(name, text.as_bytes())?.into_os_string());
    }
    let mut inputs: Vec<String> = demo
        .inputs
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let artifacts = dir.path("plans");
    if demo.writes_artifacts {
        inputs.push(format!("output_dir={}", artifacts.display()));
    }
    let mut durable = args.durable;
    if demo.answer.is_some() && durable.run_id.is_none() {
        durable.run_id = Some(fresh_id(demo.name));
    }
    let run = FlowRunArgs {
        workflow: demo.name.to_owned(),
        inputs,
        contexts,
        state: None,
        events: args.events.clone(),
        bundle: None,
        durable: durable.clone(),
        options: RunFlags::default(),
    };
    let workflow = super::workflow::Workflow::find(demo.name)?;
    let mut code = super::run::execute(run, &settings, &workflow, None);
    if let (Some(answer), Ok(_), Some(run_id)) = (demo.answer, &code, &durable.run_id) {
        let store = super::durable::RunDb::of(&settings.opts)?.open_read_only()?;
        let status = super::durable::wait(store.run(run_id))
            .ok()
            .flatten()
            .map(|r| r.status);
        if matches!(status, Some(RunStatus::AwaitingHuman { .. })) {
            eprintln!(
                "\nrlm flow demo: the human's answer is SCRIPTED too: \"{answer}\" (as \
                 `rlm flow resume {run_id} --input \"...\"` would give it)\n"
            );
            // The resumed half continues the same event log.
            let run = FlowRunArgs {
                workflow: demo.name.to_owned(),
                inputs: Vec::new(),
                contexts: Vec::new(),
                state: None,
                events: args.events,
                bundle: None,
                durable,
                options: RunFlags::default(),
            };
            let resume = Resume {
                answer: Some(answer.to_owned()),
                ..Resume::default()
            };
            code = super::run::execute(run, &settings, &workflow, Some(resume));
        }
    }
    if demo.writes_artifacts {
        show_artifacts(&artifacts)?;
    }
    let requests = server.log().len();
    kernel::runtime::shared().block_on(server.shutdown());
    eprintln!("mock LM server answered {requests} requests");
    code
}

/// Prints each document the demo wrote (they go away with its temporary folder).
fn show_artifacts(folder: &std::path::Path) -> Result<()> {
    let mut paths: Vec<_> = std::fs::read_dir(folder)
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path())
        .collect();
    paths.sort();
    for path in paths {
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("Could not read `{}`", path.display()))?;
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        println!(
            "\n--- {name} (written by the planner) ---\n{}",
            text.trim_end()
        );
    }
    Ok(())
}
