//! `rlm demo`: a complete RLM analysis on a fresh machine, with no API key.
//!
//! It generates a few MB of service logs whose per-service error counts are known, starts the
//! mock LM server in-process with a bundled strategy script (`strategy.json`: the root model
//! looks at the context, fans chunks out with `llm_query_batched`, sets the `answer` dict; the
//! sub-model counts `level=ERROR`), runs the real loop — REPL, batched sub-calls, final-answer
//! detection — printing the trajectory as it goes, and checks the answer against the truth.
//! With `--base-url` and `--model` the same task runs against a real endpoint instead.

mod logs;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result};
use bridge::mock::Script;
use clap::Args;
use kernel::repl::{ContextSource, ReplSession};

use crate::endpoints;
use crate::exit::RunOutcome;
use crate::observe::{self, Display};
use crate::outputs::{Guard, Inputs, Output, Scratch};
use crate::report::{self, option_inputs, run_outputs};
use crate::settings::{RunFlags, Switches, offers};

/// Arguments of `rlm demo`.
#[derive(Debug, Args)]
pub(crate) struct DemoArgs {
    /// Size of the generated log context in MB.
    #[arg(long, default_value_t = 4.0, value_name = "MB")]
    pub(crate) size_mb: f64,

    /// Seed of the generated logs.
    #[arg(long, default_value_t = 7)]
    pub(crate) seed: u64,

    /// Keep the generated context at PATH instead of a temporary file.
    #[arg(long, value_name = "PATH")]
    pub(crate) keep_context: Option<PathBuf>,

    /// Model options; with `--base-url` and `--model` the demo runs against a real endpoint.
    #[command(flatten)]
    pub(crate) options: RunFlags<{ offers::DEMO }>,
}

/// The scripted root and sub-model.
const STRATEGY: &str = include_str!("strategy.json");

const QUERY: &str = "The context is a service log, one event per line. For each service, count \
the lines whose level is ERROR. Answer with a JSON object mapping every service name to its \
count, keys sorted.";

/// `rlm demo`; `config` is the `--config` file, if given.
pub(crate) fn execute(args: DemoArgs, config: Option<&Path>, verbosity: u8) -> Result<ExitCode> {
    let settings = args.options.settings(config)?;
    let mut opts = settings.opts;
    // First, while the process has one thread and no Python: keys leave the environment.
    crate::secrets::protect(&opts)?;
    // `--keep-context` is an output too: it must not replace a file the user has.
    let mut inputs = Inputs::new();
    option_inputs(&mut inputs, &opts, settings.file.as_deref());
    let mut guard = Guard::new(inputs, opts.force());
    let keep = args
        .keep_context
        .as_ref()
        .map(|path| guard.document(Output::new("--keep-context", path)))
        .transpose()?;
    let outputs = run_outputs(&opts, &mut guard)?;
    let runtime = kernel::runtime::shared();
    let server = if opts.base_url.is_none() {
        let script =
            Script::from_json_str(STRATEGY).context("The bundled demo script is invalid")?;
        let server = crate::mock_lm::start_scripted(script, &mut opts, "demo-root", "demo-sub")?;
        if !opts.quiet() {
            eprintln!(
                "rlm demo: the models are SCRIPTED. A mock LM server on {} replays a fixed \
                 strategy; no real language model is involved. Pass `--base-url URL --model NAME` \
                 to run the same task against a real endpoint.",
                server.openai_base_url()
            );
        }
        Some(server)
    } else {
        if opts.model.is_none() {
            anyhow::bail!("With `--base-url`, pass `--model NAME` too");
        }
        None
    };

    let size = (args.size_mb.max(0.01) * 1e6) as usize;
    let logs = logs::generate(size, args.seed);
    let scratch = Scratch::new()?;
    let path = match &keep {
        Some(file) => {
            file.write(logs.text.as_bytes())?;
            file.path().to_path_buf()
        }
        None => scratch.write("service.log", logs.text.as_bytes())?,
    };
    if !opts.quiet() {
        eprintln!(
            "context: {} ({:.1} MB, {} lines across {} services)",
            path.display(),
            logs.text.len() as f64 / 1e6,
            logs.lines,
            logs.errors_by_service.len()
        );
    }

    let endpoints = endpoints::build_endpoints(&opts)?;
    let session = ReplSession::new(
        endpoints::session_config(&opts)?,
        Arc::clone(&endpoints),
        &[ContextSource::Path(path.clone())],
    )
    .context("Could not load the demo context")?;
    let display = Display::choose(&opts, verbosity, Display::Trace);
    let result = observe::run_loop(
        QUERY,
        endpoints::rlm_config(&opts)?,
        endpoints,
        Arc::new(session),
        outputs.trajectory,
        display,
    )?;
    if let Some(server) = server.as_ref() {
        // Keep the server's request count for the summary before shutting it down.
        eprintln!("mock LM server answered {} requests", server.log().len());
    }
    if let Some(server) = server {
        runtime.block_on(server.shutdown());
    }
    let outcome = report::report(&result, &opts, QUERY, outputs.answer.as_ref())?;

    let verdict = check(result.answer.as_deref(), &logs.errors_by_service);
    match &verdict {
        Ok(()) => eprintln!(
            "check: the answer matches the error counts computed from the generated logs ✓"
        ),
        Err(why) => eprintln!("check: the answer is WRONG: {why}"),
    }
    Ok(match (outcome, verdict) {
        (RunOutcome::Answered, Ok(())) => ExitCode::SUCCESS,
        (RunOutcome::Answered, Err(_)) => ExitCode::FAILURE,
        (other, _) => other.exit_code(),
    })
}

/// Compares the JSON object in `answer` with the true counts.
fn check(answer: Option<&str>, truth: &BTreeMap<String, u64>) -> Result<(), String> {
    let answer = answer.ok_or("the run gave no answer")?;
    let json = match (answer.find('{'), answer.rfind('}')) {
        (Some(start), Some(end)) if start < end => &answer[start..=end],
        _ => return Err(format!("no JSON object in the answer `{answer}`")),
    };
    let got: BTreeMap<String, u64> = serde_json::from_str(json)
        .map_err(|e| format!("the answer is not a JSON object of counts: {e}"))?;
    if &got == truth {
        return Ok(());
    }
    let diff: Vec<String> = truth
        .iter()
        .filter(|(k, v)| got.get(*k) != Some(v))
        .map(|(k, v)| format!("{k}: expected {v}, got {:?}", got.get(k)))
        .chain(
            got.keys()
                .filter(|k| !truth.contains_key(*k))
                .map(|k| format!("unexpected service `{k}`")),
        )
        .collect();
    Err(diff.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_check_accepts_only_the_true_counts() {
        let truth: BTreeMap<String, u64> = [("a".into(), 2), ("b".into(), 0)].into();
        assert!(check(Some(r#"{"a": 2, "b": 0}"#), &truth).is_ok());
        assert!(check(Some("Counts: {\"b\": 0, \"a\": 2}."), &truth).is_ok());
        let wrong = check(Some(r#"{"a": 3, "b": 0}"#), &truth).expect_err("wrong count");
        assert!(wrong.contains("a: expected 2"), "{wrong}");
        assert!(check(Some(r#"{"a": 2}"#), &truth).is_err());
        assert!(check(Some("no json"), &truth).is_err());
        assert!(check(None, &truth).is_err());
    }
}
