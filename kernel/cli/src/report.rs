//! How a run is reported: its output files checked before it starts; once finished, the
//! answer (or the result as JSON) on stdout, the closing lines on stderr, `--answer-file`.
//!
//! The closing lines speak the user's language: a limit is named by the flag that sets it
//! (`--max-iterations`, `--max-sub-calls`, …) with its value, read from the
//! [`TerminationReason`] and the options, never from the library's message. They never
//! contradict each other: a partial answer is called partial, and "ended without an answer"
//! appears only when there is none. Known secrets are `[redacted]` in all of it.

use std::io::Write as _;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Result;
use kernel::options::RunOptions;
use kernel::rlm::{FinalNote, IterationRecord, RlmResult, TerminationReason};
use serde_json::{Map, Value, json};

use crate::exit::RunOutcome;
use crate::outputs::{Document, Guard, Inputs, LogFile, LogStart, Output};
use crate::secrets::redact;
use crate::settings::Switches;
use kernel::rlm::trace::{self, SubCallCounts};

/// The files a run writes, cleared by the output guard before anything loads.
pub(crate) struct RunOutputs {
    /// `--trajectory`.
    pub(crate) trajectory: Option<LogFile>,
    /// `--answer-file`.
    pub(crate) answer: Option<Document>,
}

/// Declares `--answer-file` and `--trajectory` to `guard`, so that a clash or a path that
/// cannot be written is said before the models are paid for.
pub(crate) fn run_outputs(opts: &RunOptions, guard: &mut Guard) -> Result<RunOutputs> {
    let answer = opts
        .answer_file
        .as_ref()
        .map(|path| guard.document(Output::new("--answer-file", path)))
        .transpose()?;
    let trajectory = opts
        .trajectory
        .as_ref()
        .map(|path| guard.log(Output::new("--trajectory", path), LogStart::Fresh))
        .transpose()?;
    Ok(RunOutputs { trajectory, answer })
}

/// Adds what a run reads besides its contexts: the configuration and prompt files.
pub(crate) fn option_inputs(inputs: &mut Inputs, opts: &RunOptions, config: Option<&Path>) {
    if let Some(path) = config {
        inputs.file("the configuration file", path);
    }
    for path in [&opts.prompt_extension, &opts.system_prompt]
        .into_iter()
        .flatten()
    {
        inputs.file("the prompt file", path);
    }
}

/// Prints the result: JSON, or the answer as the last stdout line(s); writes `answer` (the
/// `--answer-file` the output guard cleared).
pub(crate) fn report(
    result: &RlmResult,
    opts: &RunOptions,
    query: &str,
    answer: Option<&Document>,
) -> Result<RunOutcome> {
    let outcome = RunOutcome::of(result.termination_reason);
    let mut stdout = std::io::stdout().lock();
    // Known secrets are redacted from everything printed or written here.
    if opts.json() {
        let json = serde_json::to_string_pretty(&json_result(result, opts, query))?;
        writeln!(stdout, "{}", redact(&json))?;
    } else if let Some(answer) = &result.answer {
        writeln!(stdout, "{}", redact(answer))?;
    }
    stdout.flush()?;
    // `--quiet` silences the summary, never the reason a run failed.
    if !opts.quiet() || outcome == RunOutcome::Failed {
        eprintln!(
            "{}",
            trace::summary(
                result.termination_reason,
                &result.metrics,
                &result.sub_calls,
                result
                    .iterations
                    .iter()
                    .map(IterationRecord::failed_children)
                    .sum(),
            )
        );
        for line in closing_lines(result, opts) {
            eprintln!("  {}", redact(&line));
        }
    }
    // After stdout: an answer file that cannot be written must not cost the answer.
    if let Some(file) = answer {
        let answer = redact(result.answer.as_deref().unwrap_or_default());
        file.write(answer.as_bytes())?;
    }
    if result.answer.is_none() {
        eprintln!("{}", no_answer(opts.trajectory.as_deref()));
    }
    Ok(outcome)
}

fn no_answer(trajectory: Option<&Path>) -> String {
    match trajectory {
        Some(path) => format!(
            "The run ended without an answer; the trajectory `{}` shows how far it got (`rlm show {}`).",
            path.display(),
            path.display()
        ),
        None => "The run ended without an answer; pass `--trajectory FILE` to keep a record of how far a run gets.".to_owned(),
    }
}

/// Why the run stopped (naming the flag that sets the limit), the model's attempts to finish
/// that the protocol did not count, and whether the answer printed is partial.
pub(crate) fn closing_lines(result: &RlmResult, opts: &RunOptions) -> Vec<String> {
    let mut lines = Vec::new();
    if let Some(why) = stop_message(result, opts) {
        lines.push(why);
    }
    if !result.termination_reason.is_success() {
        if let Some(mismatch) = protocol_mismatch(result) {
            lines.push(mismatch);
        }
        if result.answer.is_some() {
            lines.push(
                "The answer printed is the best partial answer the run found, not a final one."
                    .to_owned(),
            );
        }
    }
    lines
}

fn stop_message(result: &RlmResult, opts: &RunOptions) -> Option<String> {
    let flag_value = |value: Option<String>| value.unwrap_or_default();
    Some(match result.termination_reason {
        TerminationReason::FinalAnswer => return None,
        TerminationReason::MaxIterations => format!(
            "Reached `--max-iterations` ({}); the answer is the model's reply to a last request \
             to answer now. Raise `--max-iterations` to give it more room.",
            opts.max_iterations.unwrap_or(30)
        ),
        TerminationReason::Timeout => format!(
            "The run reached `--timeout {}` (seconds); raise it to give the run more time.",
            flag_value(opts.timeout.map(|t| t.to_string()))
        ),
        TerminationReason::CallBudget => format!(
            "`--max-sub-calls {}` is spent: a sub-call was refused before sending. Raise it to \
             allow more.",
            flag_value(opts.max_sub_calls.map(|n| n.to_string()))
        ),
        TerminationReason::TokenBudget => format!(
            "`--max-tokens {}` is spent: a call was refused before sending. Raise it to allow more.",
            flag_value(opts.max_tokens.map(|n| n.to_string()))
        ),
        TerminationReason::CostBudget => format!(
            "`--max-usd {}` is spent: a call was refused before sending. Raise it to allow more.",
            flag_value(opts.max_usd.map(|n| n.to_string()))
        ),
        TerminationReason::ConsecutiveFailures => format!(
            "{} iterations in a row had a failing block (last: `{}`); check the model and the \
             context, or raise `--max-consecutive-failures` (`0` turns the check off).",
            opts.max_consecutive_failures.unwrap_or(5),
            result
                .iterations
                .last()
                .and_then(|i| i.execution.error_type.as_deref())
                .unwrap_or("an error")
        ),
        _ => return result.error.clone(),
    })
}

/// The model kept finishing in a way `--protocol` does not count: say so rather than let the
/// user raise limits.
fn protocol_mismatch(result: &RlmResult) -> Option<String> {
    let mut attempts =
        result
            .iterations
            .iter()
            .flat_map(|i| &i.notes)
            .filter_map(|note| match note {
                FinalNote::Inactive { kind, protocol } => Some((*kind, *protocol)),
                _ => None,
            });
    let (kind, protocol) = attempts.next()?;
    let count = 1 + attempts.count();
    Some(format!(
        "The model tried to finish {count} time(s) with {}, which `--protocol {protocol}` does \
         not count; pass `--protocol auto` to accept every convention.",
        trace::convention(kind)
    ))
}

/// The `--json` document: the result with what a reader of the file alone needs (query, models,
/// `rlm` version, times, trajectory path), each fact once (costs `null` without a price, as
/// the metrics hold them), and floats rounded.
fn json_result(result: &RlmResult, opts: &RunOptions, query: &str) -> Value {
    let mut value = serde_json::to_value(result).unwrap_or(Value::Null);
    let Some(top) = value.as_object_mut() else {
        return value;
    };
    // Each sub-call is listed under its iteration; the run's status is at the top.
    top.remove("sub_calls");
    let counts = SubCallCounts::of(&result.sub_calls);
    if let Some(metrics) = top.get_mut("metrics").and_then(Value::as_object_mut) {
        metrics.remove("termination_reason");
        metrics.remove("final_answer_found");
        metrics.insert("sub_calls_sent".into(), json!(counts.sent));
        metrics.insert("sub_calls_refused".into(), json!(counts.refused));
        metrics.insert("sub_calls_cached".into(), json!(counts.cached));
    }
    let finished_ms = unix_ms();
    let started_ms = finished_ms.saturating_sub(result.metrics.total_ms as u64);
    let mut head = Map::new();
    head.insert("rlm_version".into(), json!(env!("CARGO_PKG_VERSION")));
    head.insert("query".into(), json!(query));
    head.insert(
        "models".into(),
        json!({
            "root": opts.model,
            "sub": opts.sub_model.as_ref().or(opts.model.as_ref()),
        }),
    );
    head.insert("started_at_ms".into(), json!(started_ms));
    head.insert("finished_at_ms".into(), json!(finished_ms));
    head.insert("trajectory".into(), json!(opts.trajectory));
    head.extend(std::mem::take(top));
    let mut value = Value::Object(head);
    round_floats(&mut value, None);
    value
}

/// Milliseconds to 0.1, USD to 1e-6, other fractions to 1e-4.
fn round_floats(value: &mut Value, key: Option<&str>) {
    match value {
        Value::Number(n) if n.is_f64() => {
            let places = match key {
                Some(k) if k.ends_with("_ms") => 1,
                Some(k) if k.contains("usd") => 6,
                _ => 4,
            };
            let scale = 10f64.powi(places);
            if let Some(rounded) = n
                .as_f64()
                .map(|x| (x * scale).round() / scale)
                .and_then(serde_json::Number::from_f64)
            {
                *n = rounded;
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| round_floats(v, key)),
        Value::Object(map) => map
            .iter_mut()
            .for_each(|(k, v)| round_floats(v, Some(k.as_str()))),
        _ => {}
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
