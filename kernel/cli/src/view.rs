//! `rlm view`: a trajectory (JSONL) as one self-contained HTML page, rendered by the kernel
//! library's [`kernel::rlm::render_trajectory_html`] (the notebook shows the same view), or a
//! workflow's event log (`rlm flow run --events`) by [`kernel::flow::render_event_log_html`].

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Args;

use crate::outputs::{Guard, Inputs, Output};

/// Arguments of `rlm view`.
#[derive(Debug, Args)]
pub(crate) struct ViewArgs {
    /// The trajectory file written by `rlm run --trajectory`.
    #[arg(value_name = "TRAJECTORY")]
    pub(crate) trajectory: PathBuf,

    /// Where to write the page (default: the trajectory's path with `.html`).
    #[arg(long, short = 'o', value_name = "FILE")]
    pub(crate) output: Option<PathBuf>,

    /// Overwrite an existing page (the trajectory itself is refused even so).
    #[arg(long)]
    pub(crate) force: bool,
}

/// Writes the page; the default output is the trajectory's path with `.html`.
pub(crate) fn execute(args: ViewArgs) -> Result<ExitCode> {
    let output = args
        .output
        .clone()
        .unwrap_or_else(|| args.trajectory.with_extension("html"));
    let mut inputs = Inputs::new();
    inputs.file("the trajectory", &args.trajectory);
    let declared = match &args.output {
        Some(path) => Output::new("-o", path),
        None => Output::named("the page", &output),
    };
    let page = Guard::new(inputs, args.force).document(declared)?;
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
    page.write(html.as_bytes())?;
    eprintln!("wrote {}", output.display());
    Ok(ExitCode::SUCCESS)
}
