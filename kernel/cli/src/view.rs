//! `rlm view`: a trajectory (JSONL) as one self-contained HTML page, rendered by the kernel
//! library's [`kernel::rlm::render_trajectory_html`] (the notebook shows the same view), or a
//! workflow's event log (`rlm flow run --events`) by [`kernel::flow::render_event_log_html`].

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Args;

use crate::exit::UsageError;

/// Arguments of `rlm view`.
#[derive(Debug, Args)]
pub(crate) struct ViewArgs {
    /// The trajectory file written by `rlm run --trajectory`.
    #[arg(value_name = "TRAJECTORY")]
    pub(crate) trajectory: PathBuf,

    /// Where to write the page (default: the trajectory's path with `.html`).
    #[arg(long, short = 'o', value_name = "FILE")]
    pub(crate) output: Option<PathBuf>,
}

/// Writes the page; the default output is the trajectory's path with `.html`.
pub(crate) fn execute(args: ViewArgs) -> Result<ExitCode> {
    let output = args
        .output
        .clone()
        .unwrap_or_else(|| args.trajectory.with_extension("html"));
    if same_file(&output, &args.trajectory) {
        return Err(UsageError::new(format!(
            "`-o {}` is the trajectory itself; pick another output path",
            output.display()
        ))
        .into());
    }
    let jsonl = std::fs::read_to_string(&args.trajectory).with_context(|| {
        format!(
            "Could not read the trajectory `{}`; pass the file written by `rlm run --trajectory FILE`",
            args.trajectory.display()
        )
    })?;
    let html = if kernel::flow::is_event_log(&jsonl) {
        kernel::flow::render_event_log_html(&jsonl)
            .with_context(|| format!("Cannot show `{}`", args.trajectory.display()))?
    } else {
        kernel::rlm::render_trajectory_html(&jsonl, false)
            .with_context(|| format!("Cannot show `{}`", args.trajectory.display()))?
    };
    std::fs::write(&output, html)
        .with_context(|| format!("Could not write `{}`", output.display()))?;
    eprintln!("wrote {}", output.display());
    Ok(ExitCode::SUCCESS)
}

fn same_file(a: &Path, b: &Path) -> bool {
    let canonical = |p: &Path| -> Option<PathBuf> { p.canonicalize().ok() };
    a == b || matches!((canonical(a), canonical(b)), (Some(x), Some(y)) if x == y)
}
