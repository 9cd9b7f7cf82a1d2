//! Watching a run of the RLM loop as it goes: what stderr shows ([`Display`]: nothing, a live
//! progress line on a terminal, or the trace), the trajectory file, and Ctrl-C, `SIGTERM` or
//! `SIGHUP` (`interrupt.rs`: the first stops the run gracefully, keeping its best answer and
//! trajectory; a second quits). Shared
//! by `rlm run`, `rlm chat` and `rlm demo`; [`report_isolation`] says once what confines the
//! model's code.

use std::io::IsTerminal;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use bridge::Endpoints;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use kernel::options::RunOptions;
use kernel::repl::ReplSession;
use kernel::rlm::{
    Phase, Progress, ProgressSnapshot, Rlm, RlmConfig, RlmError, RlmResult, StopHandle,
    TrajectoryWriter, trace::TraceHook,
};

use crate::interrupt;
use crate::outputs::LogFile;
use crate::secrets::redact;
use crate::settings::Switches;

/// Says once per process what confines the model's code of `session`: one warning line when
/// a layer is missing (naming it), else a debug log (`-vv`).
pub(crate) fn report_isolation(session: &ReplSession) {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    match session.confinement() {
        Some(report) if !report.is_fully_confined() => eprintln!(
            "warning: model code runs in a worker process, but it is {} (`rlm doctor` says why)",
            report.summary()
        ),
        Some(report) => {
            tracing::debug!("model code runs in a worker process, {}", report.summary())
        }
        None => tracing::debug!(
            "model code runs in this process (`--isolation none`): nothing confines it"
        ),
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
    trajectory: Option<LogFile>,
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
    trajectory: Option<LogFile>,
    display: Display,
) -> Result<Observer> {
    if let Some(log) = trajectory {
        let log = log.open()?;
        rlm.add_hook(TrajectoryWriter::from_file(log.file, &log.path));
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
        rlm.add_hook(TraceHook::new(
            Box::new(move |text| {
                bar.suspend(|| eprint!("{}", redact(text)));
            }),
            "`--cell-timeout`",
        ));
    }
    let progress = Progress::new();
    rlm.add_hook(progress.hook());
    stop_on_interrupt(rlm.stop_handle());
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

/// The first Ctrl-C (or `SIGTERM`, `SIGHUP`) stops the run gracefully (best partial answer,
/// closed trajectory); a second one quits at once.
fn stop_on_interrupt(handle: StopHandle) {
    interrupt::on_interrupt(
        move |request| {
            request.say("stopping the run and keeping what it found");
            handle.stop();
        },
        || {},
    );
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
    let cost = s
        .cost_usd
        .map_or_else(String::new, |usd| format!(" · ${usd:.4}"));
    format!(
        "iteration {}/{max_iterations} · {doing} · {} tokens{cost} · {:.1} s",
        s.iteration,
        s.tokens,
        s.elapsed.as_secs_f64()
    )
}
