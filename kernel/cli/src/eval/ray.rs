//! `rlm eval --ray [ADDRESS]`: the RLM runs of the grid on a Ray cluster, through the Python
//! package (`rlm_kernel.ray`); nothing of Ray is in this binary.
//!
//! The binary starts `PYTHON -m rlm_kernel.ray eval` (`PYTHON`: `$RLM_PYTHON`, else
//! `python3` on `PATH`, the interpreter the package is installed in), writes the job to its
//! standard input — the address, the run options as the package's keywords, and each run's
//! task, size and instance seed — and reads one result a line from its standard output; Ray's
//! progress and messages pass through on standard error. Each actor generates its run's
//! context itself (the same generator, `kernel::eval`), so no context crosses the network.
//! The results come back to the runner as
//! [`RlmRuns::Done`](super::runner::RlmRuns::Done): scored, written (trajectories,
//! `results.json`) and followed by the baseline calls here, exactly as local runs are.

use std::collections::HashMap;
use std::ffi::OsString;
use std::io::{BufRead as _, BufReader, Write as _};
use std::process::{Command, Stdio};

use anyhow::{Context as _, Result, bail};
use kernel::eval::instance_seed;
use serde_json::{Map, Value, json};

use super::runner::{Job, RemoteRun, Stopper};

/// The variable naming the interpreter that has `rlm_kernel[ray]`.
pub(super) const PYTHON_VARIABLE: &str = "RLM_PYTHON";

/// Runs every job's RLM run on the cluster at `address` (`None`: Ray's own choice, i.e.
/// `RAY_ADDRESS` or the cluster started on this machine, else a new local one) and returns
/// their results by job stem (every job's, unless interrupted).
pub(super) fn run(
    address: Option<&str>,
    options: Map<String, Value>,
    jobs: &[Job],
    seed: u64,
    needles: usize,
    stopper: &Stopper,
) -> Result<HashMap<String, RemoteRun>> {
    let python = std::env::var_os(PYTHON_VARIABLE).unwrap_or_else(|| OsString::from("python3"));
    let shown = python.to_string_lossy().into_owned();
    let runs: Vec<Value> = jobs
        .iter()
        .map(|job| {
            json!({
                "name": job.stem(),
                "task": job.kind.as_str(),
                "size_tokens": job.size,
                "seed": instance_seed(seed, job.index),
                "needles": needles,
            })
        })
        .collect();
    let job = json!({"address": address, "options": options, "runs": runs});

    let mut child = Command::new(&python)
        .args(["-m", "rlm_kernel.ray", "eval"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| {
            format!(
                "Could not start `{shown}` for `--ray`; set `{PYTHON_VARIABLE}` to the Python \
                 interpreter that has `rlm-kernel[ray]` installed"
            )
        })?;
    if let Some(mut stdin) = child.stdin.take() {
        // A child that exits at once (no package) closes its end: its own error says why.
        let _ = stdin.write_all(job.to_string().as_bytes());
    }
    let mut done = HashMap::new();
    if let Some(stdout) = child.stdout.take() {
        for line in BufReader::new(stdout).lines() {
            let line = line.context("Could not read the cluster's results")?;
            let run: RemoteRun = serde_json::from_str(&line).with_context(|| {
                format!(
                    "`{shown} -m rlm_kernel.ray eval` wrote a line that is not a result: {line}"
                )
            })?;
            done.insert(run.name.clone(), run);
        }
    }
    let status = child
        .wait()
        .with_context(|| format!("Could not wait for `{shown} -m rlm_kernel.ray eval`"))?;
    if stopper.is_stopped() {
        return Ok(done);
    }
    if !status.success() {
        bail!(
            "The runs on the cluster failed (`{shown} -m rlm_kernel.ray eval`, {status}); its \
             error is above. `--ray` needs the Python package with Ray in that interpreter: \
             `pip install 'rlm-kernel[ray]'` (or set `{PYTHON_VARIABLE}`)"
        );
    }
    if let Some(missing) = jobs.iter().find(|job| !done.contains_key(&job.stem())) {
        bail!(
            "The cluster sent no result for `{}` ({} of {} runs came back); please report \
             this as a bug",
            missing.stem(),
            done.len(),
            jobs.len()
        );
    }
    Ok(done)
}
