//! The live agent tree of `rlm flow run`: events → tree state → text frame.
//!
//! An [`AgentTree`] starts from the workflow's agents (from its file, every agent waiting)
//! and folds in the run's events one by one ([`AgentTree::apply`]): an agent's start and end
//! set its status, a loop's iteration resets the agents below it to waiting (what is left
//! of this round), its `model_call` / `rlm_iteration` / `rlm_sub_call` records and tool calls
//! are counted, and the time it spent running is summed over its runs.
//! [`AgentTree::render`] draws the frame — one line per agent, indented as a tree, with its
//! status, elapsed time, loop iteration and call counts. The module is pure (no terminal, no
//! clock: the caller passes the time), so a frame is a function of the events and a time,
//! and is snapshot-tested over a recorded run; `live` puts it on the terminal.
//!
//! ```text
//! ✓ refine                done     0.1s
//! ├─ ✓ save_inputs        done     0.1s
//! ├─ ▶ refinement_loop    running  0.0s  iteration 2/5
//! │  ├─ ✓ pruner          done     0.0s  2 runs · 2 model calls
//! │  └─ · evaluator       waiting  0.0s  1 run · 1 model call
//! └─ · save_document      waiting
//! ```

use std::collections::HashMap;
use std::fmt::Write as _;

use engine::flow::file::{AgentConfig, AgentSpec};
use engine::flow::{EndStatus, Event, EventKind};

use crate::table::{self, Align};

/// Where an agent is, as the tree shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    /// Not started (in this loop iteration).
    Waiting,
    Running,
    /// Ended well: completed, left its loop, reached its limit or escalated.
    Done,
    Failed,
    /// A callback answered in its place.
    Skipped,
    Cancelled,
    /// The run stopped to ask a human; it goes on with the answer (`rlm flow resume`).
    AwaitingHuman,
}

impl Status {
    fn of(end: EndStatus) -> Self {
        match end {
            EndStatus::Completed
            | EndStatus::ExitedLoop
            | EndStatus::IterationLimit
            | EndStatus::Escalated => Self::Done,
            EndStatus::Skipped => Self::Skipped,
            EndStatus::Failed => Self::Failed,
            EndStatus::Cancelled => Self::Cancelled,
        }
    }

    /// The mark before the name and the word after it.
    fn label(self, run_over: bool) -> (&'static str, &'static str) {
        match self {
            Self::Waiting if run_over => ("·", "not run"),
            Self::Waiting => ("·", "waiting"),
            Self::Running => ("▶", "running"),
            Self::Done => ("✓", "done"),
            Self::Failed => ("✗", "failed"),
            Self::Skipped => ("↷", "skipped"),
            Self::Cancelled => ("■", "cancelled"),
            Self::AwaitingHuman => ("⏸", "waiting"),
        }
    }
}

/// One agent of the tree.
#[derive(Debug)]
struct Node {
    name: String,
    /// Agent names from the root, joined by `/` (as events name it).
    branch: String,
    children: Vec<usize>,
    /// A loop's `max_iterations`.
    max_iterations: Option<u32>,
    status: Status,
    /// How its last run ended (shown again when its loop ends between two of its runs).
    last: Option<Status>,
    runs: u32,
    /// When its current run started (unix ms).
    since_ms: Option<u64>,
    /// Time spent in runs that ended.
    spent_ms: u64,
    /// A loop's current iteration.
    iteration: Option<u32>,
    model_calls: u32,
    tool_calls: u32,
    /// How its last run ended, beyond the status: `exit_loop`, `limit`, an error.
    note: Option<String>,
}

impl Node {
    fn new(name: &str, branch: String, max_iterations: Option<u32>) -> Self {
        Self {
            name: name.to_owned(),
            branch,
            children: Vec::new(),
            max_iterations,
            status: Status::Waiting,
            last: None,
            runs: 0,
            since_ms: None,
            spent_ms: 0,
            iteration: None,
            model_calls: 0,
            tool_calls: 0,
            note: None,
        }
    }

    fn elapsed_ms(&self, now_ms: u64) -> u64 {
        self.spent_ms
            + self
                .since_ms
                .map_or(0, |since| now_ms.saturating_sub(since))
    }

    /// What else there is to say: iteration, runs, calls, how it ended.
    fn details(&self) -> Vec<String> {
        let mut details = Vec::new();
        if let Some(iteration) = self.iteration {
            details.push(match self.max_iterations {
                Some(max) => format!("iteration {iteration}/{max}"),
                None => format!("iteration {iteration}"),
            });
        }
        if self.runs > 1 {
            details.push(format!("{} runs", self.runs));
        }
        for (count, what) in [(self.model_calls, "model"), (self.tool_calls, "tool")] {
            match count {
                0 => {}
                1 => details.push(format!("1 {what} call")),
                n => details.push(format!("{n} {what} calls")),
            }
        }
        details.extend(self.note.clone());
        details
    }
}

/// The agents of one run and where each of them is.
#[derive(Debug)]
pub(crate) struct AgentTree {
    /// `nodes[0]` is the root.
    nodes: Vec<Node>,
    /// Node index by branch (agent names from the root, joined by `/`).
    branches: HashMap<String, usize>,
}

impl AgentTree {
    /// The agents of `spec`, all waiting.
    pub(crate) fn new(spec: &AgentSpec) -> Self {
        let mut tree = Self {
            nodes: Vec::new(),
            branches: HashMap::new(),
        };
        tree.add_spec(spec, None);
        tree
    }

    fn add_spec(&mut self, spec: &AgentSpec, parent: Option<usize>) {
        let max = match &spec.config {
            AgentConfig::Loop(c) => Some(c.max_iterations.get()),
            _ => None,
        };
        let index = self.add(spec.config.name(), max, parent);
        for child in spec.sub_agents.iter().chain(&spec.tool_agents) {
            self.add_spec(child, Some(index));
        }
    }

    fn add(&mut self, name: &str, max_iterations: Option<u32>, parent: Option<usize>) -> usize {
        let index = self.nodes.len();
        let branch = match parent {
            Some(p) => format!("{}/{name}", self.nodes[p].branch),
            None => name.to_owned(),
        };
        // The first agent of a branch wins: the engine gives siblings distinct names.
        self.branches.entry(branch.clone()).or_insert(index);
        self.nodes.push(Node::new(name, branch, max_iterations));
        if let Some(p) = parent {
            self.nodes[p].children.push(index);
        }
        index
    }

    /// The node of `branch`, added (under its parent branch) when the file did not name it.
    fn node(&mut self, branch: &str) -> usize {
        if let Some(index) = self.branches.get(branch) {
            return *index;
        }
        let (parent, name) = match branch.rsplit_once('/') {
            Some((parent, name)) => (Some(self.node(parent)), name),
            None if self.nodes.is_empty() => (None, branch),
            // Another root: shown under ours rather than lost.
            None => (Some(0), branch),
        };
        self.add(name, None, parent)
    }

    /// Folds in one event of the run.
    pub(crate) fn apply(&mut self, event: &Event) {
        let index = match self.branches.get(&event.branch) {
            Some(index) => *index,
            None if event.kind == EventKind::Start => self.node(&event.branch),
            // A step recorded on no agent's branch (a router's decision) is no agent.
            None => return,
        };
        let node = &mut self.nodes[index];
        match &event.kind {
            EventKind::Start => {
                node.status = Status::Running;
                node.runs += 1;
                node.since_ms = Some(event.at_ms);
                node.iteration = None;
                node.note = None;
            }
            EventKind::Iteration { iteration } => {
                node.iteration = Some(*iteration);
                if *iteration > 1 {
                    self.each_below(index, |n| n.status = Status::Waiting);
                }
            }
            EventKind::End { status } => {
                if let Some(since) = node.since_ms.take() {
                    node.spent_ms += event.at_ms.saturating_sub(since);
                }
                node.status = Status::of(*status);
                node.last = Some(node.status);
                node.note = match status {
                    EndStatus::ExitedLoop => Some("exit_loop".into()),
                    EndStatus::IterationLimit => Some("limit".into()),
                    EndStatus::Escalated => Some("escalated".into()),
                    EndStatus::Failed => event.content.as_deref().map(first_line),
                    _ => None,
                };
                // Agents of a loop that ended before their turn in this round ran in an
                // earlier one: they show how that run ended.
                self.each_below(index, |n| {
                    if n.status == Status::Waiting
                        && let Some(last) = n.last
                    {
                        n.status = last;
                    }
                });
            }
            EventKind::ToolCalls => {
                node.tool_calls += u32::try_from(event.tool_calls.len()).unwrap_or(u32::MAX);
            }
            EventKind::Metadata { topic } => {
                let model_call = match topic.as_str() {
                    // A callback's answer in the model's place is no model call.
                    "model_call" => event.metadata["replaced"] != true,
                    "rlm_iteration" | "rlm_sub_call" => true,
                    _ => false,
                };
                if model_call {
                    node.model_calls += 1;
                }
            }
            EventKind::Message | EventKind::ToolResults | EventKind::StateUpdate => {}
        }
    }

    /// The run stopped to ask a human: its root is drawn waiting (for the answer), not done,
    /// and the agents that did not run are not run.
    pub(crate) fn awaiting_human(&mut self) {
        if let Some(root) = self.nodes.first_mut() {
            root.status = Status::AwaitingHuman;
            root.last = Some(Status::AwaitingHuman);
            root.note = Some("for a human's answer".into());
        }
    }

    fn each_below(&mut self, index: usize, mut f: impl FnMut(&mut Node)) {
        let mut stack = self.nodes[index].children.clone();
        while let Some(i) = stack.pop() {
            f(&mut self.nodes[i]);
            stack.extend(self.nodes[i].children.iter().copied());
        }
    }

    /// The frame at `now_ms` (unix ms): one line per agent, each ending in a newline.
    pub(crate) fn render(&self, now_ms: u64) -> String {
        let mut rows = Vec::new();
        if !self.nodes.is_empty() {
            self.rows(0, String::new(), String::new(), &mut rows);
        }
        let run_over = self.nodes.first().is_some_and(|root| root.last.is_some());
        // The status mark and its space take two columns (every mark is one column wide).
        let width = rows
            .iter()
            .map(|(lead, i)| table::width(lead) + 2 + table::width(&self.nodes[*i].name))
            .max()
            .unwrap_or(0);
        let mut out = String::new();
        for (lead, index) in rows {
            let node = &self.nodes[index];
            let (mark, word) = node.status.label(run_over);
            let head = table::pad(&format!("{lead}{mark} {}", node.name), width, Align::Left);
            let _ = write!(out, "{head}  {word:<9}");
            if node.runs > 0 {
                let _ = write!(out, " {:>5}", elapsed(node.elapsed_ms(now_ms)));
                let details = node.details();
                if !details.is_empty() {
                    let _ = write!(out, "  {}", details.join(" · "));
                }
            }
            out.truncate(out.trim_end().len());
            out.push('\n');
        }
        out
    }

    /// Depth-first rows: the tree drawing before each name, and the node.
    fn rows(&self, index: usize, lead: String, indent: String, rows: &mut Vec<(String, usize)>) {
        rows.push((lead, index));
        let children = &self.nodes[index].children;
        for (n, child) in children.iter().enumerate() {
            let last = n + 1 == children.len();
            let (branch, next) = if last {
                ("└─ ", "   ")
            } else {
                ("├─ ", "│  ")
            };
            self.rows(
                *child,
                format!("{indent}{branch}"),
                format!("{indent}{next}"),
                rows,
            );
        }
    }
}

/// The first line of an error, cut at 80 characters.
fn first_line(text: &str) -> String {
    let line = text.lines().next().unwrap_or_default();
    match line.char_indices().nth(80) {
        Some((cut, _)) => format!("{}…", &line[..cut]),
        None => line.to_owned(),
    }
}

/// `0.4s`, `12.3s`, `2m05s`, `1h02m`.
fn elapsed(ms: u64) -> String {
    let secs = ms / 1000;
    match secs {
        0..60 => format!("{}.{}s", secs, (ms % 1000) / 100),
        60..3600 => format!("{}m{:02}s", secs / 60, secs % 60),
        _ => format!("{}h{:02}m", secs / 3600, secs / 60 % 60),
    }
}

#[cfg(test)]
mod tests {
    use engine::flow::file::load_workflow_from;

    use super::*;
    use crate::flow::builtin::Builtin;

    /// The events of `rlm flow demo refine --events FILE` (recorded; the evaluator is
    /// satisfied in round 2).
    const REFINE_EVENTS: &str = include_str!("demo/refine-events.jsonl");

    fn refine() -> (AgentTree, Vec<Event>) {
        let builtin = Builtin::find("refine").expect("refine is built in");
        let spec = load_workflow_from(&builtin.embedded(), builtin.root).expect("valid");
        let events = REFINE_EVENTS
            .lines()
            .map(|line| serde_json::from_str(line).expect("an event per line"))
            .collect();
        (AgentTree::new(&spec), events)
    }

    /// The frame after the events up to and including the `nth` (1-based) that `stop`
    /// accepts, at its time plus `later_ms`.
    fn frame_at(stop: impl Fn(&Event) -> bool, nth: usize, later_ms: u64) -> String {
        let (mut tree, events) = refine();
        let mut seen = 0;
        for event in &events {
            tree.apply(event);
            seen += usize::from(stop(event));
            if seen == nth {
                return tree.render(event.at_ms + later_ms);
            }
        }
        panic!("fewer than {nth} events matched");
    }

    #[test]
    fn before_the_run_every_agent_waits() {
        let (tree, _) = refine();
        insta::assert_snapshot!(tree.render(0));
    }

    #[test]
    fn in_round_two_the_loop_shows_its_iteration_and_what_is_left_of_the_round() {
        // The filler of round 2, 1.5 s into its turn: the pruner is done, the enricher and
        // the evaluator wait for their second run.
        let frame = frame_at(
            |e| e.author == "filler" && e.kind == EventKind::Start,
            2,
            1500,
        );
        insta::assert_snapshot!(frame);
        // The evaluator of round 2 has asked for `exit_loop`.
        let frame = frame_at(
            |e| e.author == "evaluator" && e.kind == EventKind::ToolCalls,
            1,
            0,
        );
        let line = frame
            .lines()
            .find(|l| l.contains("evaluator"))
            .unwrap_or_default();
        assert!(
            line.starts_with("│  └─ ▶ evaluator") && line.ends_with("2 model calls · 1 tool call"),
            "{frame}"
        );
    }

    #[test]
    fn the_final_frame_shows_how_every_agent_ended() {
        let (mut tree, events) = refine();
        for event in &events {
            tree.apply(event);
        }
        let end = events.last().map_or(0, |e| e.at_ms);
        // Nothing runs any more: the frame no longer changes with the time.
        assert_eq!(tree.render(end), tree.render(end + 60_000));
        insta::assert_snapshot!(tree.render(end));
    }

    #[test]
    fn a_failed_agent_shows_its_error_and_agents_never_reached_are_not_run() {
        let (mut tree, events) = refine();
        for event in events.iter().take_while(|e| e.author != "pruner") {
            tree.apply(event);
        }
        let at = |mut event: Event, author: &str, branch: &str, at_ms: u64| {
            event.author = author.into();
            event.branch = branch.into();
            event.at_ms = at_ms;
            event
        };
        let t = events
            .iter()
            .find(|e| e.author == "pruner")
            .map_or(0, |e| e.at_ms);
        let pruner = "refine/refinement_loop/pruner";
        tree.apply(&at(Event::new(EventKind::Start), "pruner", pruner, t));
        let failed = Event::new(EventKind::End {
            status: EndStatus::Failed,
        })
        .with_content("Model `flow-model` failed: connection refused\nretried 3 times");
        tree.apply(&at(failed, "pruner", pruner, t + 65_000));
        for (author, branch) in [
            ("refinement_loop", "refine/refinement_loop"),
            ("refine", "refine"),
        ] {
            let end = Event::new(EventKind::End {
                status: EndStatus::Failed,
            });
            tree.apply(&at(end, author, branch, t + 65_000));
        }
        insta::assert_snapshot!(tree.render(t + 70_000));
    }

    #[test]
    fn agents_the_file_does_not_name_join_the_tree_under_their_parent() {
        let (mut tree, _) = refine();
        let mut start = Event::new(EventKind::Start);
        start.author = "helper".into();
        start.branch = "refine/refinement_loop/evaluator/helper".into();
        tree.apply(&start);
        let frame = tree.render(0);
        assert!(
            frame.contains("│  └─ · evaluator") && frame.contains("│     └─ ▶ helper"),
            "{frame}"
        );
        // Other steps on a branch no agent started (a router's decisions) add no agent.
        let mut decision = Event::new(EventKind::StateUpdate);
        decision.author = "refine".into();
        decision.branch = "refine/refine".into();
        tree.apply(&decision);
        assert_eq!(tree.render(0), frame);
    }

    #[test]
    fn agents_named_in_wide_characters_or_with_combining_marks_stay_in_line() {
        let (mut tree, events) = refine();
        for event in &events {
            tree.apply(event);
        }
        // Names as a workflow may give them: CJK (two columns a character), an emoji (two),
        // a combining accent (none).
        for (node, name) in tree.nodes.iter_mut().zip([
            "改良",
            "保存输入",
            "refinement_loop",
            "🚀pruner",
            "filler",
            "cafe\u{301}_enricher",
        ]) {
            node.name = name.into();
        }
        let end = events.last().map_or(0, |e| e.at_ms);
        let frame = tree.render(end);
        // Every status word starts at the same terminal column.
        let columns: Vec<usize> = frame
            .lines()
            .map(|line| {
                unicode_width::UnicodeWidthStr::width(&line[..line.find("  done").unwrap_or(0)])
            })
            .collect();
        assert!(
            columns.iter().all(|c| *c == columns[0]),
            "{columns:?}\n{frame}"
        );
        insta::assert_snapshot!(frame);
    }

    #[test]
    fn every_status_mark_is_one_column_wide() {
        // `render` counts a mark and its space as two columns.
        for status in [
            Status::Waiting,
            Status::Running,
            Status::Done,
            Status::Failed,
            Status::Skipped,
            Status::Cancelled,
            Status::AwaitingHuman,
        ] {
            for run_over in [false, true] {
                let (mark, _) = status.label(run_over);
                assert_eq!(table::width(mark), 1, "{status:?}: {mark}");
            }
        }
    }

    #[test]
    fn elapsed_times_read_as_seconds_minutes_or_hours() {
        assert_eq!(elapsed(0), "0.0s");
        assert_eq!(elapsed(12_345), "12.3s");
        assert_eq!(elapsed(125_000), "2m05s");
        assert_eq!(elapsed(3_720_000), "1h02m");
    }
}
