//! What `rlm flow run` shows while it runs.
//!
//! On a terminal (stderr is one, `TERM` is not `dumb`, `CI` is unset, no logs are on) the
//! agent tree of [`progress`](super::progress) is redrawn in place as events arrive and a
//! few times a second (running agents' clocks move): the frame is the message of an
//! indicatif bar, which does the cursor work; console hides the cursor meanwhile.
//! [`Live::finish`] leaves the last frame on screen and gives the cursor back — at the end,
//! on an error, or before a second Ctrl-C quits; a run that stopped to ask a human ends
//! drawn as waiting. Whatever is said before the tree (the run's id, which `resume` needs)
//! is written before its first frame, so the redrawing never covers it. Elsewhere each
//! agent's start and end is a plain line on stderr, indented by depth (the root's end says
//! how its graph ended; a run that stopped to ask a human then gets a last line saying it
//! waits for the answer); with `--json` every event is one JSON line on stdout; with
//! `--quiet` nothing.

use std::io::{IsTerminal as _, Write as _};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use engine::durable::RunStatus;
use engine::flow::file::AgentSpec;
use engine::flow::{Event, EventKind, EventSink, FlowError};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tracing_subscriber::filter::LevelFilter;

use super::progress::AgentTree;

/// How often the tree is redrawn when no event arrives.
const TICK: Duration = Duration::from_millis(250);

/// The run's display: an event sink.
pub(crate) struct Live {
    mode: Mode,
    /// The root agent's name.
    root: String,
}

enum Mode {
    Json,
    Quiet,
    Lines,
    Tree {
        tree: Arc<Mutex<AgentTree>>,
        bar: ProgressBar,
    },
}

impl Live {
    /// The display for a run of `spec`: every event on stdout with `json`, nothing when
    /// `quiet`, else the tree on a terminal and plain lines elsewhere.
    pub(crate) fn new(spec: &AgentSpec, json: bool, quiet: bool) -> Self {
        let mode = if json {
            Mode::Json
        } else if quiet {
            Mode::Quiet
        } else if draws_in_place() {
            let tree = Arc::new(Mutex::new(AgentTree::new(spec)));
            let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr()).with_style(
                ProgressStyle::with_template("{msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            );
            let _ = console::Term::stderr().hide_cursor();
            redraw(&lock(&tree), &bar);
            let (tree_, bar_) = (Arc::clone(&tree), bar.clone());
            // Running agents' clocks move between events too. Without the ticker (no thread
            // to be had) the tree still changes with every event.
            let _ = std::thread::Builder::new()
                .name("rlm-flow-tree".into())
                .spawn(move || {
                    loop {
                        std::thread::sleep(TICK);
                        let tree = lock(&tree_);
                        if bar_.is_finished() {
                            break;
                        }
                        redraw(&tree, &bar_);
                    }
                });
            Mode::Tree { tree, bar }
        } else {
            Mode::Lines
        };
        Self {
            mode,
            root: spec.config.name().to_owned(),
        }
    }

    /// Writes `text` as a line on stderr, above the tree when there is one.
    pub(crate) fn note(&self, text: &str) {
        match &self.mode {
            Mode::Tree { bar, .. } => bar.println(text),
            _ => {
                let _ = writeln!(std::io::stderr(), "{text}");
            }
        }
    }

    /// Leaves the last frame on screen and shows the cursor again.
    pub(crate) fn finish(&self) {
        self.finish_as(None);
    }

    /// [`Live::finish`] for a run that ended `as` the run database records it: a run that
    /// stopped to ask a human is drawn waiting for the answer, not done.
    pub(crate) fn finish_as(&self, ended: Option<&RunStatus>) {
        let awaiting = matches!(ended, Some(RunStatus::AwaitingHuman { .. }));
        match &self.mode {
            Mode::Tree { tree, bar } => {
                // Under the tree's lock: the ticker draws no frame after the last.
                let mut tree = lock(tree);
                if !bar.is_finished() {
                    if awaiting {
                        tree.awaiting_human();
                    }
                    redraw(&tree, bar);
                    bar.finish();
                    let _ = console::Term::stderr().show_cursor();
                }
            }
            // The root's last line said how its graph ended (`completed`): the run itself
            // waits.
            Mode::Lines if awaiting => {
                let _ = writeln!(
                    std::io::stderr(),
                    "⏸ {} waiting for a human's answer",
                    self.root
                );
            }
            _ => {}
        }
    }
}

/// Whether stderr is a terminal that can redraw in place, and nothing else writes there:
/// a log line (`-v`, `RUST_LOG`) would tear the frame.
fn draws_in_place() -> bool {
    std::io::stderr().is_terminal()
        && std::env::var_os("CI").is_none()
        && std::env::var_os("TERM").is_none_or(|term| term != "dumb")
        && LevelFilter::current() == LevelFilter::OFF
}

/// Draws the frame of `tree` now (indicatif limits how often it reaches the terminal).
fn redraw(tree: &AgentTree, bar: &ProgressBar) {
    // The bar's last line is the frame's: no newline after it.
    bar.set_message(tree.render(now_ms()).trim_end().to_owned());
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl EventSink for Live {
    fn emit(&self, event: &Event) -> Result<(), FlowError> {
        match &self.mode {
            Mode::Json => {
                let line = serde_json::to_string(event).unwrap_or_default();
                let mut stdout = std::io::stdout().lock();
                let _ = writeln!(stdout, "{}", crate::secrets::redact(&line));
                let _ = stdout.flush();
            }
            Mode::Quiet => {}
            Mode::Lines => {
                if let Some(line) = plain_line(event) {
                    let _ = writeln!(std::io::stderr(), "{line}");
                }
            }
            Mode::Tree { tree, bar } => {
                let mut tree = lock(tree);
                tree.apply(event);
                redraw(&tree, bar);
            }
        }
        Ok(())
    }
}

/// An agent's start or end, a loop's iteration or a model's tool calls, indented by depth.
fn plain_line(event: &Event) -> Option<String> {
    let depth = event.branch.matches('/').count();
    let indent = "  ".repeat(depth);
    Some(match &event.kind {
        EventKind::Start => format!("{indent}▶ {}", event.author),
        EventKind::End { status } => {
            let status = serde_json::to_value(status)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default();
            format!("{indent}■ {} {status}", event.author)
        }
        EventKind::Iteration { iteration } => {
            format!("{indent}↻ {} iteration {iteration}", event.author)
        }
        EventKind::ToolCalls => format!(
            "{indent}  {} calls {}",
            event.author,
            event
                .tool_calls
                .iter()
                .map(|c| c.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        _ => return None,
    })
}
