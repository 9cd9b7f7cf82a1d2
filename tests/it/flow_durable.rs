//! Durable `rlm flow` runs end to end: a `kill -9` mid-node and `resume` to the same final
//! state as an unbroken run, `runs` / `history` / `decisions` output, `--keep-last`,
//! `--from-checkpoint`, the `awaiting_human` interrupt and its answer, the errors, and one
//! writer per run (a second driver refused, a dead one taken over, a taken-over one fenced).
//!
//! The workflows here are Python steps (no model): `wait` blocks until a file exists, so a
//! test can kill the process while that node runs.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use engine::durable::{Location, SqliteStore, Store as _, open_read_only};
use serde_json::{Value, json};

use crate::flow::args;
use crate::support::{Mock, Run, block_on, file, rlm, rlm_command, rlm_with, signal_and_wait};

const STEPS: &str = r#"
import os
import time


def first(state):
    return {"a": 1, "log": "first"}


def wait(state):
    open(state["started_file"], "a").write("started\n")
    while not os.path.exists(state["go_file"]):
        time.sleep(0.02)
    return {"b": state["a"] + 1, "log": state["log"] + ",wait"}


def last(state):
    return {"c": state["b"] * 10, "log": state["log"] + ",last", "__message__": "c=%d" % (state["b"] * 10)}


def ask(state):
    if state.get("human_input"):
        return {"asked": True}
    return {"escalate_to_human": "Ship on Friday or on Monday?", "__actions__": ["escalate"]}


def ship(state):
    return {"shipped": state["human_input"], "__message__": "shipping " + state["human_input"]}
"#;

/// A folder of workflows: `pipeline` (first → wait → last), `single` (one Python step as
/// the root) and `ask` (ask → ship, `ask` escalates until a human answered).
pub(crate) struct Flows {
    pub(crate) dir: tempfile::TempDir,
    /// `--db`: `runs.db` in `dir` unless set.
    db: Option<String>,
}

impl Flows {
    /// The workflows, their runs in the PostgreSQL database at `url`.
    pub(crate) fn on(url: String) -> Self {
        Self {
            db: Some(url),
            ..Self::new()
        }
    }

    pub(crate) fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        file(d, "steps.py", STEPS);
        for step in ["first", "wait", "last", "ask", "ship"] {
            file(
                d,
                &format!("{step}.yaml"),
                &format!("agent_class: PythonAgent\nname: {step}\nfunction: steps.py:{step}\n"),
            );
        }
        let seq = |name: &str, steps: &[&str]| {
            let subs: String = steps
                .iter()
                .map(|s| format!("  - config_path: {s}.yaml\n"))
                .collect();
            format!("agent_class: SequentialAgent\nname: {name}\nsub_agents:\n{subs}")
        };
        file(
            d,
            "pipeline.yaml",
            &seq("pipeline", &["first", "wait", "last"]),
        );
        file(d, "asking.yaml", &seq("asking", &["first", "ask", "ship"]));
        Self { dir, db: None }
    }

    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub(crate) fn db(&self) -> String {
        self.db
            .clone()
            .unwrap_or_else(|| self.path("runs.db").display().to_string())
    }

    /// `rlm flow ARGS... --db DB` plus the model flags (no model is called).
    pub(crate) fn args(&self, args: &[&str]) -> Vec<String> {
        let mut all: Vec<String> = ["flow"].iter().chain(args).map(|s| s.to_string()).collect();
        all.extend(["--db".into(), self.db()]);
        all
    }

    pub(crate) fn model_args(&self, args: &[&str]) -> Vec<String> {
        let mut all = self.args(args);
        all.extend(["--model", "none", "--base-url", "http://127.0.0.1:9/v1"].map(String::from));
        // The steps tell the test where they are through files next to the workflow, which a
        // confined worker may not write: these runs are about checkpoints, not confinement.
        all.extend(["--isolation", "none"].map(String::from));
        all
    }

    /// `rlm flow run pipeline.yaml --run-id ID` with the go/started files.
    pub(crate) fn run_pipeline(&self, id: &str, extra: &[&str]) -> Vec<String> {
        let pipeline = self.path("pipeline.yaml").display().to_string();
        let go = format!("go_file={}", self.path("go").display());
        let started = format!("started_file={}", self.path("started").display());
        let mut args = vec![
            "run", &pipeline, "--run-id", id, "--input", &go, "--input", &started,
        ];
        args.extend(extra);
        self.model_args(&args)
    }

    /// Runs the pipeline as run `id` (plus `extra`) and kills it (`kill -9`) while `wait`
    /// runs.
    pub(crate) fn crash_in_wait(&self, id: &str, extra: &[&str]) {
        let mut child = rlm_command(&self.run_pipeline(id, extra))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("rlm starts");
        wait_for(&self.path("started"), &mut child);
        child.kill().expect("kill -9");
        child.wait().expect("reaped");
    }

    pub(crate) fn store(&self) -> SqliteStore {
        SqliteStore::open(self.path("runs.db")).expect("the run database opens")
    }

    /// The state at run `id`'s head.
    pub(crate) fn final_state(&self, id: &str) -> Value {
        let location = Location::parse(&self.db()).expect("a database");
        let store = block_on(open_read_only(&location)).expect("the run database opens");
        let head = block_on(store.run(id))
            .expect("readable")
            .and_then(|r| r.head)
            .expect("a head checkpoint");
        Value::Object(
            block_on(store.state_at(head))
                .expect("state")
                .state
                .to_map(),
        )
    }

    /// How `runs --json` shows run `id`.
    pub(crate) fn listed(&self, id: &str) -> Value {
        let run = rlm(&self.args(&["runs", "--json"]), None);
        run.assert_code(0);
        run.json()
            .as_array()
            .and_then(|runs| runs.iter().find(|r| r["run_id"] == id).cloned())
            .unwrap_or_default()
    }

    pub(crate) fn status(&self, id: &str) -> String {
        self.listed(id)["status"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    pub(crate) fn history(&self, id: &str) -> Vec<Value> {
        let run = rlm(&self.args(&["history", id, "--json"]), None);
        run.assert_code(0);
        run.json().as_array().cloned().unwrap_or_default()
    }
}

/// Whether `ask` saw the human's answer in run `id`.
fn state_asked(flows: &Flows, id: &str) -> Value {
    flows.final_state(id)["asked"].clone()
}

pub(crate) fn nodes(history: &[Value]) -> Vec<String> {
    history
        .iter()
        .map(|c| c["node"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// The state without the keys that name this test's temporary files.
pub(crate) fn portable(mut state: Value) -> Value {
    if let Some(map) = state.as_object_mut() {
        map.remove("go_file");
        map.remove("started_file");
    }
    state
}

/// Volatile fields of the CLI's output replaced by placeholders.
fn redact(text: &str, dir: &Path) -> String {
    let text = text.replace(&dir.display().to_string(), "[dir]");
    let time = regex::Regex::new(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z").expect("regex");
    time.replace_all(&text, "[time]").into_owned()
}

/// A table `rlm flow` printed (left-aligned columns two spaces apart, each as wide as its
/// widest cell), its cells redacted as [`redact`] does, laid out again by the same rule: a
/// placeholder is narrower than what it replaces, and the folder's length depends on
/// `TMPDIR`. Fails unless the printed table kept that rule: every cell starts where its
/// header does, two spaces after the widest cell of the column before.
fn redact_table(text: &str, dir: &Path) -> String {
    let lines: Vec<Vec<char>> = text.lines().map(|l| l.chars().collect()).collect();
    let header = lines.first().expect("a header line");
    let starts: Vec<usize> = (0..header.len())
        .filter(|&i| header[i] != ' ' && (i == 0 || header[..i].ends_with(&[' ', ' '])))
        .collect();
    let rows: Vec<Vec<String>> = lines
        .iter()
        .map(|line| {
            let shown = String::from_iter(line);
            (0..starts.len())
                .map(|k| {
                    let start = starts[k];
                    let end = starts.get(k + 1).map_or(line.len(), |&next| next - 2);
                    let cell = line.get(start..end.max(start)).unwrap_or_default();
                    let gap = line.get(end..starts.get(k + 1).map_or(end, |&next| next));
                    assert!(
                        cell.first().is_some_and(|&c| c != ' ')
                            && gap.is_some_and(|gap| gap.iter().all(|&c| c == ' ')),
                        "column {k} does not line up with its header:\n{shown}"
                    );
                    String::from_iter(cell).trim_end().to_owned()
                })
                .collect()
        })
        .collect();
    // Each column's width: its widest cell's (the header's included).
    let widest = |rows: &[Vec<String>]| -> Vec<usize> {
        (0..starts.len())
            .map(|k| {
                rows.iter()
                    .map(|row| row[k].chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect()
    };
    let widths = widest(&rows);
    for (k, pair) in starts.windows(2).enumerate() {
        assert_eq!(
            pair[1] - pair[0],
            widths[k] + 2,
            "column {} is not two spaces after the widest cell before it:\n{text}",
            k + 1
        );
    }
    let redacted: Vec<Vec<String>> = rows
        .iter()
        .map(|row| row.iter().map(|cell| redact(cell, dir)).collect())
        .collect();
    let widths = widest(&redacted);
    redacted
        .iter()
        .map(|row| {
            let cells: Vec<String> = row
                .iter()
                .zip(&widths)
                .map(|(cell, &width)| format!("{cell:<width$}"))
                .collect();
            format!("{}\n", cells.join("  ").trim_end())
        })
        .collect()
}

/// Waits until the node has written its whole line to `path`.
///
/// The file exists from the node's `open` on, a moment before its line is in
/// it: a kill in that moment would leave an empty marker, and the test would
/// count one start too few. So wait for the line's end, not for the file.
pub(crate) fn wait_for(path: &Path, child: &mut std::process::Child) {
    let start = Instant::now();
    while !std::fs::read_to_string(path).is_ok_and(|text| text.ends_with('\n')) {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("rlm ended before the node started: {status}");
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "the node never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_run_killed_mid_node_resumes_to_the_state_of_an_unbroken_run() {
    let flows = Flows::new();
    // The unbroken run: `go` is there, so `wait` returns at once.
    file(flows.dir.path(), "go", "");
    let run = rlm(&flows.run_pipeline("whole", &[]), None);
    run.assert_code(0);
    assert_eq!(run.stdout.trim(), "c=20");
    assert!(
        run.stderr.contains("run `whole` (checkpoints in"),
        "{}",
        run.stderr
    );
    std::fs::remove_file(flows.path("go")).expect("remove go");
    std::fs::remove_file(flows.path("started")).expect("remove started");

    // The crashed run: killed while `wait` runs.
    flows.crash_in_wait("crash", &[]);
    // Still `running` in the database, but its process is gone: shown as interrupted.
    assert_eq!(flows.status("crash"), "interrupted");
    assert_eq!(nodes(&flows.history("crash")), ["__start__", "first"]);

    file(flows.dir.path(), "go", "");
    let resumed = rlm(&flows.model_args(&["resume", "crash"]), None);
    resumed.assert_code(0);
    assert_eq!(resumed.stdout.trim(), "c=20");
    assert!(
        resumed.stderr.contains("resuming run `crash`"),
        "{}",
        resumed.stderr
    );
    // `wait` ran twice (killed once, then again), and nothing else did.
    let started = std::fs::read_to_string(flows.path("started")).expect("started file");
    assert_eq!(started.lines().count(), 2);
    assert_eq!(
        nodes(&flows.history("crash")),
        ["__start__", "first", "wait", "last"]
    );
    assert_eq!(flows.status("crash"), "completed");
    assert_eq!(
        portable(flows.final_state("crash")),
        portable(flows.final_state("whole"))
    );
    assert_eq!(
        portable(flows.final_state("crash")),
        json!({"a": 1, "b": 2, "c": 20, "log": "first,wait,last"})
    );
    assert_eq!(flows.store().integrity_check().expect("check"), "ok");
}

#[test]
fn runs_and_history_list_what_the_database_holds() {
    let flows = Flows::new();
    file(flows.dir.path(), "go", "");
    rlm(&flows.run_pipeline("first-run", &[]), None).assert_code(0);
    let single = flows.path("first.yaml").display().to_string();
    let run = rlm(
        &flows.model_args(&["run", &single, "--run-id", "single"]),
        None,
    );
    run.assert_code(0);

    let runs = rlm(&flows.args(&["runs"]), None);
    runs.assert_code(0);
    insta::assert_snapshot!(redact_table(&runs.stdout, flows.dir.path()));
    let history = rlm(&flows.args(&["history", "first-run"]), None);
    history.assert_code(0);
    insta::assert_snapshot!(redact_table(&history.stdout, flows.dir.path()));
    // A root that is not a graph runs as the one node of a sequence: checkpointed after it.
    assert_eq!(nodes(&flows.history("single")), ["__start__", "first"]);
    assert_eq!(flows.final_state("single")["log"], json!("first"));
    let json = rlm(&flows.args(&["history", "first-run", "--json"]), None);
    json.assert_code(0);
    let first = &json.json()[1];
    assert_eq!(first["node"], json!("first"));
    assert_eq!(first["writes"], json!(["a", "log"]));
    assert_eq!(first["parent"], json.json()[0]["id"]);
}

#[test]
fn keep_last_prunes_a_run_to_its_newest_checkpoints_which_stay_readable() {
    let flows = Flows::new();
    file(flows.dir.path(), "go", "");
    let run = rlm(&flows.run_pipeline("kept", &["--keep-last", "2"]), None);
    run.assert_code(0);
    assert!(
        run.stderr
            .contains("kept the last 2 checkpoints of `kept` (2 older removed)"),
        "{}",
        run.stderr
    );
    let history = flows.history("kept");
    assert_eq!(nodes(&history), ["wait", "last"]);
    assert_eq!(history[0]["parent"], Value::Null);
    assert_eq!(flows.final_state("kept")["c"], json!(20));
    // Time travel from the oldest kept checkpoint still works.
    let id = history[0]["id"].to_string();
    rlm(
        &flows.model_args(&["resume", "kept", "--from-checkpoint", &id]),
        None,
    )
    .assert_code(0);
}

#[test]
fn from_checkpoint_reruns_from_an_earlier_checkpoint_on_a_branch() {
    let flows = Flows::new();
    file(flows.dir.path(), "go", "");
    rlm(&flows.run_pipeline("tt", &[]), None).assert_code(0);
    let before = flows.history("tt");
    let after_first = before[1]["id"].as_i64().expect("id");
    let run = rlm(
        &flows.model_args(&[
            "resume",
            "tt",
            "--from-checkpoint",
            &after_first.to_string(),
        ]),
        None,
    );
    run.assert_code(0);
    let history = flows.history("tt");
    // The old line stays; `wait` and `last` ran again on a branch from `first`.
    assert_eq!(
        nodes(&history),
        ["__start__", "first", "wait", "last", "wait", "last"]
    );
    assert_eq!(history[4]["parent"], json!(after_first));
    assert_eq!(flows.final_state("tt")["log"], json!("first,wait,last"));
    let started = std::fs::read_to_string(flows.path("started")).expect("started file");
    assert_eq!(started.lines().count(), 2);

    // A checkpoint of another run, or none at all: refused, nothing written.
    rlm(&flows.run_pipeline("other", &[]), None).assert_code(0);
    let theirs = flows.history("other")[0]["id"].to_string();
    let wrong = rlm(
        &flows.model_args(&["resume", "tt", "--from-checkpoint", &theirs]),
        None,
    );
    wrong.assert_code(2);
    assert!(
        wrong.stderr.contains(&format!(
            "Checkpoint {theirs} belongs to run `other`, not `tt`"
        )),
        "{}",
        wrong.stderr
    );
    let missing = rlm(
        &flows.model_args(&["resume", "tt", "--from-checkpoint", "999"]),
        None,
    );
    missing.assert_code(2);
    assert_eq!(flows.history("tt").len(), 6);
}

#[test]
fn a_run_that_escalates_waits_for_a_human_and_the_answer_completes_it() {
    let flows = Flows::new();
    let asking = flows.path("asking.yaml").display().to_string();
    let run = rlm(
        &flows.model_args(&["run", &asking, "--run-id", "ask-1"]),
        None,
    );
    run.assert_code(5);
    insta::assert_snapshot!(redact(&run.stdout, flows.dir.path()));
    assert_eq!(flows.status("ask-1"), "awaiting_human");

    // Resuming without the answer, or answering a question nobody asked: refused.
    let bare = rlm(&flows.model_args(&["resume", "ask-1"]), None);
    bare.assert_code(2);
    assert!(
        bare.stderr.contains(
            "Run `ask-1` is waiting for a human: Ship on Friday or on Monday?\nResume it with \
             `--input \"...\"`"
        ),
        "{}",
        bare.stderr
    );
    assert_eq!(flows.status("ask-1"), "awaiting_human");

    let answered = rlm(
        &flows.model_args(&["resume", "ask-1", "--input", "Monday"]),
        None,
    );
    answered.assert_code(0);
    assert_eq!(answered.stdout.trim(), "shipping Monday");
    // `ask`, which asked, runs again with the answer; then `ship`.
    assert_eq!(
        nodes(&flows.history("ask-1")),
        ["__start__", "first", "ask", "human", "ask", "ship"]
    );
    assert_eq!(state_asked(&flows, "ask-1"), json!(true));
    let state = flows.final_state("ask-1");
    assert_eq!(state["human_input"], json!("Monday"));
    assert_eq!(state["shipped"], json!("Monday"));
    assert_eq!(flows.status("ask-1"), "completed");

    let again = rlm(
        &flows.model_args(&["resume", "ask-1", "--input", "Friday"]),
        None,
    );
    again.assert_code(2);
    assert!(
        again.stderr.contains("Run `ask-1` is completed"),
        "{}",
        again.stderr
    );
}

/// A resumed run keeps the isolation it was started with, as it keeps its models, unless
/// `resume` says otherwise: `where` notes its process's parent, which is this test only when
/// the step runs in `rlm` itself (`--isolation none`), not in a worker.
#[test]
fn a_resumed_run_keeps_its_isolation_unless_resume_says_otherwise() {
    let flows = Flows::new();
    let d = flows.dir.path();
    file(
        d,
        "where.py",
        "import os\n\ndef where(state):\n    return {\"parent\": os.getppid()}\n",
    );
    file(
        d,
        "where.yaml",
        "agent_class: PythonAgent\nname: where\nfunction: where.py:where\n",
    );
    file(
        d,
        "placed.yaml",
        "agent_class: SequentialAgent\nname: placed\nsub_agents:\n  - config_path: first.yaml\n  \
         - config_path: ask.yaml\n  - config_path: where.yaml\n",
    );
    let placed = flows.path("placed.yaml").display().to_string();
    let me = json!(std::process::id());
    for (id, resume_flags, in_rlm) in [
        ("kept", &[][..], true),
        ("overridden", &["--isolation", "process"][..], false),
    ] {
        let started = rlm(
            &flows.args(&[
                "run",
                &placed,
                "--run-id",
                id,
                "--isolation",
                "none",
                "--model",
                "none",
                "--base-url",
                "http://127.0.0.1:9/v1",
            ]),
            None,
        );
        started.assert_code(5);
        let mut resume = vec!["resume", id, "--input", "Monday"];
        resume.extend(resume_flags);
        let resumed = rlm(&flows.args(&resume), None);
        resumed.assert_code(0);
        let parent = flows.final_state(id)["parent"].clone();
        assert!(parent.is_u64(), "{id}: {parent}");
        assert_eq!(
            parent == me,
            in_rlm,
            "{id}: the step's parent {parent}, this test {me}"
        );
    }
}

/// `--from-checkpoint N --input ANSWER` answers the question checkpoint N asked: at a
/// checkpoint where nobody was asked it is a usage error (exit 2, nothing written), not an
/// answer that reruns the wrong node; at the checkpoint that asked, time travel answers it.
#[test]
fn an_answer_from_a_checkpoint_that_asked_nothing_is_refused() {
    let flows = Flows::new();
    let asking = flows.path("asking.yaml").display().to_string();
    rlm(
        &flows.model_args(&["run", &asking, "--run-id", "ask-2"]),
        None,
    )
    .assert_code(5);
    let before = flows.history("ask-2");
    assert_eq!(nodes(&before), ["__start__", "first", "ask"]);
    let id = |i: usize| before[i]["id"].as_i64().expect("id").to_string();
    for quiet in [id(0), id(1)] {
        let refused = rlm(
            &flows.model_args(&[
                "resume",
                "ask-2",
                "--from-checkpoint",
                &quiet,
                "--input",
                "Monday",
            ]),
            None,
        );
        refused.assert_code(2);
        assert!(
            refused
                .stderr
                .contains(&format!("Checkpoint {quiet} of run `ask-2` (after `"))
                && refused
                    .stderr
                    .contains("asked no question; resume from it without `--input`"),
            "{}",
            refused.stderr
        );
        assert_eq!(flows.history("ask-2").len(), 3, "nothing written");
        assert_eq!(flows.status("ask-2"), "awaiting_human");
    }
    let answered = rlm(
        &flows.model_args(&[
            "resume",
            "ask-2",
            "--from-checkpoint",
            &id(2),
            "--input",
            "Monday",
        ]),
        None,
    );
    answered.assert_code(0);
    assert_eq!(answered.stdout.trim(), "shipping Monday");
    assert_eq!(
        nodes(&flows.history("ask-2")),
        ["__start__", "first", "ask", "human", "ask", "ship"]
    );
}

/// A `RouterAgent` root's own callbacks from its file run in a durable `rlm flow run`, once
/// per run: `before_agent` when the run starts, `after_agent` when it completes — not when
/// it stops for a human, and not again on resume.
#[test]
fn a_router_roots_callbacks_run_once_per_run_across_a_human_stop() {
    let flows = Flows::new();
    let d = flows.dir.path();
    file(
        d,
        "hooks.py",
        "def mark(ctx):\n    with open(ctx['state']['trace_file'], 'a') as f:\n        \
         f.write(ctx['point'] + ' ' + ctx['agent'] + '\\n')\n",
    );
    file(
        d,
        "routed.yaml",
        "agent_class: RouterAgent\nname: routed\nmode: active\nstart: ask\nsub_agents:\n  \
         - config_path: ask.yaml\n  - config_path: ship.yaml\nsuccessors:\n  ask: ship\n\
         before_agent_callbacks: [{name: hooks.py:mark}]\n\
         after_agent_callbacks: [{name: hooks.py:mark}]\n",
    );
    // `ask` asks through the router's flag (no action), so the router escalates on record.
    file(
        d,
        "steps.py",
        &STEPS.replace(
            r#""__actions__": ["escalate"]"#,
            r#""__message__": "asking""#,
        ),
    );
    let routed = flows.path("routed.yaml").display().to_string();
    let trace = flows.path("trace");
    let trace_input = format!("trace_file={}", trace.display());
    let run = rlm(
        &flows.model_args(&["run", &routed, "--run-id", "r", "--input", &trace_input]),
        None,
    );
    run.assert_code(5);
    assert_eq!(flows.status("r"), "awaiting_human");
    let read = || std::fs::read_to_string(&trace).unwrap_or_default();
    assert_eq!(read(), "before_agent routed\n", "started, not ended");

    let answered = rlm(
        &flows.model_args(&["resume", "r", "--input", "Monday"]),
        None,
    );
    answered.assert_code(0);
    assert_eq!(flows.status("r"), "completed");
    assert_eq!(flows.final_state("r")["shipped"], json!("Monday"));
    assert_eq!(read(), "before_agent routed\nafter_agent routed\n");
}

#[test]
fn database_errors_name_the_cause_and_change_nothing() {
    let flows = Flows::new();
    file(flows.dir.path(), "go", "");
    rlm(&flows.run_pipeline("taken", &[]), None).assert_code(0);
    let twice = rlm(&flows.run_pipeline("taken", &[]), None);
    twice.assert_code(2);
    assert!(
        twice
            .stderr
            .contains("A run `taken` exists already; pick another run id"),
        "{}",
        twice.stderr
    );
    let unknown = rlm(&flows.args(&["history", "nope"]), None);
    unknown.assert_code(2);
    assert!(
        unknown.stderr.contains("No run `nope`"),
        "{}",
        unknown.stderr
    );
    let decisions = rlm(&flows.args(&["decisions", "taken"]), None);
    decisions.assert_code(0);
    assert!(
        decisions.stdout.contains("no routing decisions"),
        "{}",
        decisions.stdout
    );

    // A newer schema is refused, not misread.
    let newer = flows.path("newer.db");
    std::fs::copy(flows.path("runs.db"), &newer).expect("copy");
    let set = Command::new("python3")
        .args([
            "-c",
            "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); \
             c.execute('PRAGMA user_version = 99'); c.commit()",
        ])
        .arg(&newer)
        .status()
        .expect("python3 runs");
    assert!(set.success());
    let run = rlm(
        &[
            "flow".into(),
            "runs".into(),
            "--db".into(),
            newer.display().to_string(),
        ],
        None,
    );
    run.assert_code(1);
    assert!(
        run.stderr
            .contains("has schema version 99, newer than the 2 this rlm reads"),
        "{}",
        run.stderr
    );

    // A file that is not a database.
    let junk = file(flows.dir.path(), "junk.db", &"not a database\n".repeat(100));
    let args = |cmd: &str| -> Vec<String> {
        vec![
            "flow".into(),
            cmd.into(),
            "--db".into(),
            junk.display().to_string(),
        ]
    };
    let damaged: Run = rlm(&args("runs"), None);
    damaged.assert_code(1);
    assert!(
        damaged
            .stderr
            .contains("is not a readable checkpoint database (not SQLite, or damaged)"),
        "{}",
        damaged.stderr
    );
    assert_eq!(
        std::fs::read_to_string(&junk).expect("still there"),
        "not a database\n".repeat(100)
    );
    assert_eq!(flows.store().integrity_check().expect("check"), "ok");
}

/// `rlm flow demo team` in `db` as run `id`, over `wire`'s format.
pub(crate) fn team_demo(db: &str, id: &str, wire: Option<&str>) -> Run {
    let mut all: Vec<String> = ["flow", "demo", "team", "--db", db, "--run-id", id]
        .map(String::from)
        .to_vec();
    all.extend(wire.map(String::from));
    rlm(&all, None)
}

#[test]
fn flow_demo_team_escalates_on_circular_logic_and_completes_with_the_scripted_answer() {
    for wire in [None, Some("--anthropic")] {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("runs.db");
        let db_text = db.display().to_string();
        let run = team_demo(&db_text, "team-demo", wire);
        run.assert_code(0);
        assert!(
            run.stderr.contains("the models are SCRIPTED")
                && run.stderr.contains("the human's answer is SCRIPTED too"),
            "{}",
            run.stderr
        );
        assert!(
            run.stdout.contains(
                "Run `team-demo` is waiting for a human.\nQuestion: Circular logic: `dev` and \
                 `tea` exchanged work 4 times on `Story 1: export the report table as CSV` (more \
                 than 3); a human must decide\n"
            ),
            "{}",
            run.stdout
        );
        assert!(
            run.stdout.contains("rlm flow resume team-demo --db")
                && run.stdout.trim_end().ends_with(
                    "APPROVED: every field is quoted, as decided; the export opens in every \
                     spreadsheet we test."
                ),
            "{}",
            run.stdout
        );
        let history = rlm(
            &["flow", "history", "team-demo", "--db", &db_text, "--json"].map(String::from),
            None,
        );
        history.assert_code(0);
        // The router (`team`) decides after every node; the human's answer is a checkpoint.
        let agents: Vec<String> = nodes(history.json().as_array().expect("a list"))
            .into_iter()
            .filter(|n| n != "team")
            .collect();
        assert_eq!(
            agents,
            [
                "__start__",
                "analyst",
                "pm",
                "architect",
                "dev",
                "tea",
                "dev",
                "tea",
                "dev",
                "human",
                "dev",
                "tea"
            ],
            "{wire:?}"
        );
        let store = SqliteStore::open(&db).expect("opens");
        let head = block_on(store.run("team-demo"))
            .expect("readable")
            .expect("the run");
        assert_eq!(head.status, engine::durable::RunStatus::Completed);
        let state = block_on(store.state_at(head.head.expect("a head")))
            .expect("state")
            .state;
        assert_eq!(
            state.get("human_input"),
            Some(&json!("Quote every field: our importers need it."))
        );
        assert_eq!(state.get("routing_decision"), Some(&json!("END")));
        assert_eq!(state.get("escalation_triggered"), Some(&json!(false)));
        assert!(
            state
                .get("review")
                .and_then(Value::as_str)
                .is_some_and(|r| r.starts_with("APPROVED")),
            "{state:?}"
        );
        // dev reworked the story with the human's decision in its prompt before tea approved.
        assert_eq!(
            state.get("implementation"),
            Some(&json!(
                "Implemented: every field is quoted, as the human decided."
            ))
        );
        assert!(
            run.stderr.contains("mock LM server answered 10 requests"),
            "{}",
            run.stderr
        );
        if wire.is_none() {
            let decisions = rlm(
                &["flow", "decisions", "team-demo", "--db", &db_text].map(String::from),
                None,
            );
            decisions.assert_code(0);
            insta::assert_snapshot!(redact(&decisions.stdout, dir.path()));
            let json = rlm(
                &["flow", "decisions", "team-demo", "--db", &db_text, "--json"].map(String::from),
                None,
            );
            let records = json.json();
            assert_eq!(records.as_array().map(Vec::len), Some(10));
            assert_eq!(records[8]["summary"], json!("dev → tea"), "{records}");
            assert_eq!(
                records[7]["summary"],
                json!("dev → escalate to a human"),
                "{records}"
            );
            for key in [
                "agent",
                "summary",
                "rationale",
                "timestamp",
                "related_artifacts",
            ] {
                assert!(records[0].get(key).is_some(), "{key} in {}", records[0]);
            }
        }
    }
}

#[test]
fn a_database_another_process_keeps_locked_is_refused_and_left_as_it_was() {
    use std::io::BufRead as _;

    let flows = Flows::new();
    file(flows.dir.path(), "go", "");
    rlm(&flows.run_pipeline("before", &[]), None).assert_code(0);
    let mut holder = Command::new("python3")
        .args([
            "-c",
            "import sqlite3, sys, time\n\
             c = sqlite3.connect(sys.argv[1], isolation_level=None)\n\
             c.execute('BEGIN IMMEDIATE')\n\
             print('locked', flush=True)\n\
             time.sleep(60)",
        ])
        .arg(flows.path("runs.db"))
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    let mut line = String::new();
    std::io::BufReader::new(holder.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("python3 says it holds the lock");
    assert_eq!(line.trim(), "locked");
    let run = rlm(&flows.run_pipeline("blocked", &[]), None);
    holder.kill().expect("stop the holder");
    holder.wait().expect("reaped");
    run.assert_code(1);
    assert!(
        run.stderr
            .contains("is locked by another process (a run still going?); wait for it"),
        "{}",
        run.stderr
    );
    let runs = rlm(&flows.args(&["runs", "--json"]), None);
    let ids: Vec<Value> = runs
        .json()
        .as_array()
        .map(|r| r.iter().map(|run| run["run_id"].clone()).collect())
        .unwrap_or_default();
    assert_eq!(ids, [json!("before")]);
    assert_eq!(flows.store().integrity_check().expect("check"), "ok");
}

/// An `rlm` in the background (stdout and stderr piped), killed if the test fails first.
pub(crate) struct Background(Option<std::process::Child>);

impl Background {
    pub(crate) fn spawn(args: &[String]) -> Self {
        Self::from_command(rlm_command(args))
    }

    /// Starts `command` (an `rlm` command line), its output piped.
    pub(crate) fn from_command(mut command: Command) -> Self {
        let child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("rlm starts");
        Self(Some(child))
    }

    pub(crate) fn child(&mut self) -> &mut std::process::Child {
        self.0.as_mut().expect("not waited for yet")
    }

    /// Its exit code and stderr, once it ends.
    pub(crate) fn finish(mut self) -> (Option<i32>, String) {
        let child = self.0.take().expect("not waited for yet");
        code_and_stderr(&child.wait_with_output().expect("it ends"))
    }

    /// Sends it `signal` and waits for its end, as [`signal_and_wait`]: its exit code and
    /// stderr.
    pub(crate) fn signal_and_wait(
        mut self,
        signal: libc::c_int,
        what: &str,
    ) -> (Option<i32>, String) {
        let child = self.0.take().expect("not waited for yet");
        code_and_stderr(&signal_and_wait(child, signal, what))
    }
}

/// A [`Background`]'s exit code and stderr, from its output.
fn code_and_stderr(output: &Output) -> (Option<i32>, String) {
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

impl Drop for Background {
    fn drop(&mut self) {
        if let Some(child) = &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Waits (bounded) until `path` has `lines` lines.
pub(crate) fn wait_lines(path: &Path, lines: usize) {
    let start = Instant::now();
    while std::fs::read_to_string(path).map_or(0, |t| t.lines().count()) < lines {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "`{}` never had {lines} lines",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_run_another_process_drives_is_refused_until_that_process_dies() {
    let flows = Flows::new();
    let mut first = Background::spawn(&flows.run_pipeline("busy", &[]));
    wait_for(&flows.path("started"), first.child());
    let pid = first.child().id();
    let listed_busy = flows.listed("busy");
    assert_eq!(listed_busy["status"], json!("running"), "{listed_busy}");
    assert_eq!(listed_busy["owner"]["pid"], json!(pid), "{listed_busy}");
    assert_eq!(
        listed_busy["owner"]["checked"],
        json!(true),
        "{listed_busy}"
    );
    let host = listed_busy["owner"]["host"]
        .as_str()
        .expect("a host")
        .to_owned();
    let table = rlm(&flows.args(&["runs"]), None);
    assert!(
        table.stdout.contains(&format!("  pid {pid}\n")),
        "{}",
        table.stdout
    );

    // A second driver: refused before anything runs, the run untouched.
    let second = rlm(&flows.model_args(&["resume", "busy"]), None);
    second.assert_code(6);
    let shown = redact(&second.stderr, flows.dir.path())
        .replace(&format!("pid {pid} "), "pid [pid] ")
        .replace(&format!("`{host}`"), "`[host]`");
    insta::assert_snapshot!(shown);
    assert_eq!(nodes(&flows.history("busy")), ["__start__", "first"]);
    let started = std::fs::read_to_string(flows.path("started")).expect("started file");
    assert_eq!(started.lines().count(), 1, "the second driver ran no node");
    // Nor can a new run take its id.
    rlm(&flows.run_pipeline("busy", &[]), None).assert_code(2);

    // Once the driver is killed, the run is interrupted, and resume takes it over.
    first.child().kill().expect("kill -9");
    first.child().wait().expect("reaped");
    let interrupted = flows.listed("busy");
    assert_eq!(interrupted["status"], json!("interrupted"), "{interrupted}");
    assert_eq!(interrupted["owner"], Value::Null);
    file(flows.dir.path(), "go", "");
    let resumed = rlm(&flows.model_args(&["resume", "busy"]), None);
    resumed.assert_code(0);
    assert_eq!(resumed.stdout.trim(), "c=20");
    let takeover: Vec<&str> = resumed
        .stderr
        .lines()
        .filter(|l| l.starts_with("taking the run over"))
        .collect();
    assert_eq!(takeover.len(), 1, "{}", resumed.stderr);
    assert!(
        takeover[0].starts_with(&format!(
            "taking the run over from pid {pid} on host `{host}` since "
        )) && takeover[0].ends_with(" (that process is gone)"),
        "{}",
        resumed.stderr
    );
    let done = flows.listed("busy");
    assert_eq!(
        (&done["status"], &done["owner"]),
        (&json!("completed"), &Value::Null)
    );
    assert_eq!(
        nodes(&flows.history("busy")),
        ["__start__", "first", "wait", "last"]
    );
    // The same final state as an unbroken run.
    rlm(&flows.run_pipeline("whole", &[]), None).assert_code(0);
    assert_eq!(
        portable(flows.final_state("busy")),
        portable(flows.final_state("whole"))
    );
    assert_eq!(flows.store().integrity_check().expect("check"), "ok");
}

#[test]
fn a_run_held_from_another_host_is_taken_over_only_with_take_over_and_the_old_driver_is_fenced() {
    let flows = Flows::new();
    let mut first = Background::spawn(&flows.run_pipeline("shared", &[]));
    wait_for(&flows.path("started"), first.child());
    let pid = first.child().id();
    // As if the driver ran on another machine sharing the disk: it cannot be checked.
    let moved = Command::new("python3")
        .args([
            "-c",
            "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); \
             c.execute(\"UPDATE leases SET host = 'far-away' WHERE run_id = 'shared'\"); c.commit()",
        ])
        .arg(flows.path("runs.db"))
        .status()
        .expect("python3 runs");
    assert!(moved.success());
    let listed_shared = flows.listed("shared");
    assert_eq!(listed_shared["status"], json!("running"));
    assert_eq!(listed_shared["owner"]["host"], json!("far-away"));
    assert_eq!(listed_shared["owner"]["checked"], json!(false));
    // An SQLite lease has no expiry: its owner's pid is checked instead.
    assert_eq!(listed_shared["owner"]["lease_until"], Value::Null);
    let refused = rlm(&flows.model_args(&["resume", "shared"]), None);
    refused.assert_code(6);
    assert!(
        refused.stderr.contains(&format!(
            "Run `shared` is being driven by pid {pid} on host `far-away` since "
        )) && refused.stderr.contains(
            ", which cannot be checked from here; if that process is gone, resume with \
             `--take-over`"
        ),
        "{}",
        refused.stderr
    );

    // `--take-over`: the new driver owns the run; the old one, still running, is fenced off
    // at its next checkpoint and stops with exit 6, writing nothing.
    let second = Background::spawn(&flows.model_args(&["resume", "shared", "--take-over"]));
    wait_lines(&flows.path("started"), 2);
    file(flows.dir.path(), "go", "");
    let (old_code, old_err) = first.finish();
    let (new_code, new_err) = second.finish();
    assert_eq!(old_code, Some(6), "{old_err}");
    // Whether the new driver still holds the run then, or finished and released it first.
    assert!(
        old_err.contains("This process no longer drives run `shared` (taken over by pid ")
            || old_err
                .contains("This process no longer drives run `shared` (its lease was released)"),
        "{old_err}"
    );
    assert_eq!(new_code, Some(0), "{new_err}");
    assert!(
        new_err.contains(" on host `far-away` since ")
            && new_err.contains(" (as `--take-over` asks)\n"),
        "{new_err}"
    );
    assert_eq!(
        nodes(&flows.history("shared")),
        ["__start__", "first", "wait", "last"]
    );
    assert_eq!(
        portable(flows.final_state("shared")),
        json!({"a": 1, "b": 2, "c": 20, "log": "first,wait,last"})
    );
    assert_eq!(flows.status("shared"), "completed");
}

/// Ctrl-C, a `kill PID` (`SIGTERM`) and a closed terminal (`SIGHUP`) stop a workflow run the
/// same way: between steps, its lease released and its checkpoint whole, listed as
/// interrupted, and resumed by the next process without a takeover.
#[test]
fn a_run_stopped_by_ctrl_c_sigterm_or_sighup_is_released_and_resumed_without_a_takeover() {
    for (signal, run) in [
        (libc::SIGINT, "stopped-int"),
        (libc::SIGTERM, "stopped-term"),
        (libc::SIGHUP, "stopped-hup"),
    ] {
        let flows = Flows::new();
        let mut first = Background::spawn(&flows.run_pipeline(run, &[]));
        wait_for(&flows.path("started"), first.child());
        let (code, stderr) = first.signal_and_wait(signal, run);
        assert_eq!(code, Some(130), "{run}: {stderr}");
        // Listed as stopped on purpose, not failed, with the command that continues it.
        let stopped = flows.listed(run);
        assert_eq!(stopped["owner"], Value::Null, "{stopped}");
        assert_eq!(stopped["status"], json!("interrupted"), "{stopped}");
        let command = format!("rlm flow resume {run} --db {}", flows.db());
        assert!(
            stderr.trim_end().ends_with(&command),
            "{command:?} in {stderr}"
        );
        assert!(!stderr.contains("error:"), "{stderr}");
        file(flows.dir.path(), "go", "");
        // As printed: the run keeps its model settings. (Not its isolation, a choice of each
        // process: the steps write beside the workflow, which a confined worker may not, so
        // `--isolation none` comes from the environment, as for the first run's flag.)
        let resumed = rlm_with(
            &flows.args(&["resume", run]),
            None,
            &[("RLM_ISOLATION", "none")],
        );
        resumed.assert_code(0);
        assert!(
            !resumed.stderr.contains("taking the run over"),
            "{}",
            resumed.stderr
        );
        assert_eq!(flows.status(run), "completed");
    }
}

/// The command a run waiting for a human prints works pasted as it is: the run record keeps
/// the run's endpoint settings (never its key), so `resume` needs no model flags (issue 23
/// §4).
#[test]
fn the_printed_resume_command_works_pasted_without_model_flags() {
    let mock = Mock::start(serde_json::from_str(crate::flow::TEAM_SCRIPT).expect("JSON"));
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("runs.db").display().to_string();
    let key = "sk-never-stored-4711";
    let mut first = args(&["flow", "run", "team", "--db", &db, "--run-id", "asks"]);
    first.extend(args(&[
        "--input",
        "request=CSV export",
        "--base-url",
        &mock.url(),
    ]));
    first.extend(args(&["--model", "demo-model"]));
    let run = rlm_with(&first, None, &[("OPENAI_API_KEY", key)]);
    run.assert_code(5);
    // Off a terminal too, the run's last progress line says it waits, not that it is done.
    assert_eq!(
        run.stderr.lines().last(),
        Some("⏸ team waiting for a human's answer"),
        "{}",
        run.stderr
    );
    let command = run
        .stdout
        .lines()
        .skip_while(|l| !l.starts_with("Answer and continue"))
        .nth(1)
        .unwrap_or_default()
        .replace("\"<your answer>\"", "Quote-every-field");
    let words: Vec<String> = command.split_whitespace().map(String::from).collect();
    assert_eq!(
        words.iter().take(5).collect::<Vec<_>>(),
        ["rlm", "flow", "resume", "asks", "--db"],
        "{}",
        run.stdout
    );
    let resumed = rlm(&words[1..], None);
    resumed.assert_code(0);
    assert!(resumed.stdout.contains("APPROVED"), "{}", resumed.stdout);
    for path in [db.clone(), format!("{db}-wal")] {
        let bytes = std::fs::read(&path).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&bytes).contains(key),
            "the key is in {path}"
        );
    }
}
