//! `rlm flow resume` of plan-discover killed (`kill -9`) inside its discovery loop: the run
//! goes on in that discovery round's second iteration, so only the agent that was running
//! asks the model again — no earlier round's or iteration's model call is repeated — and the
//! plan and the state are those of an unbroken run; `history` shows the nested checkpoints.
//!
//! The scripted results processor sends the second question's first findings back once
//! ("Recheck the numbers."), so the discovery loop runs a second iteration, whose RLM code
//! blocks until a file exists: the test kills the process there.
//!
//! Each run's `TMPDIR` is a folder of the test's: the killed run leaves there the copy of the
//! built-in it could not remove (removed with the test's folder); the runs that end leave
//! nothing.

use std::path::Path;
use std::process::Stdio;

use serde_json::{Value, json};

use crate::flow::{read_events, started};
use crate::flow_durable::wait_for;
use crate::plan_discover::{SALES, call, script};
use crate::support::{Mock, Run, file, rlm, rlm_command, rlm_with};

/// The demo's script, with the recheck and the blocking second iteration first.
fn recheck_script(dir: &Path) -> Value {
    let started = dir.join("started").display().to_string();
    let go = dir.join("go").display().to_string();
    let blocking = format!(
        "```repl\nimport os, time\nopen({started:?}, 'a').write('started\\n')\n\
         while not os.path.exists({go:?}):\n    time.sleep(0.02)\n\
         rows = [line.replace(' ', '').split(':') for line in context.splitlines() if line]\n\
         fell = [f'{{region}} fell from {{a}} to {{b}}' for region, change in rows for a, b in [change.split('->')] if int(b) < int(a)]\n\
         answer_text = '; '.join(fell) + ' (rechecked)'\nprint(answer_text)\n```"
    );
    script(&[
        json!({"system": "root model of a recursive language model", "turn": 0,
               "last_user": "(?s)# Query\\s+Which region.*Recheck the numbers",
               "reply": blocking}),
        json!({"system": "(?s)You check the findings.*?Question: (?P<q>[^\\n]*)\\nFindings:\\n(?P<f>[^\\n]*rechecked\\))",
               "reply": call("write_discovery_results_and_exit",
                             json!({"results": "{{f}}", "summary": "Answered: {{q}}"}))}),
        json!({"system": "(?s)You check the findings.*?Question: Which region",
               "reply": "Recheck the numbers."}),
    ])
}

struct Setup {
    dir: tempfile::TempDir,
    mock: Mock,
}

impl Setup {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        file(dir.path(), "sales.txt", SALES);
        for tmp in ["tmp", "killed-tmp"] {
            std::fs::create_dir(dir.path().join(tmp)).expect("a TMPDIR");
        }
        let mock = Mock::start(recheck_script(dir.path()));
        Self { dir, mock }
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    /// `rlm ARGS` with `TMPDIR` the test's folder `tmp`.
    fn rlm(&self, args: &[String], tmp: &str) -> Run {
        rlm_with(args, None, &[("TMPDIR", &self.path(tmp))])
    }

    /// What is in the test's folder `tmp`.
    fn left_in(&self, tmp: &str) -> Vec<String> {
        std::fs::read_dir(self.dir.path().join(tmp))
            .expect("a TMPDIR")
            .map(|entry| entry.expect("an entry").path().display().to_string())
            .collect()
    }

    /// `rlm flow SUBCOMMAND ARGS...` on the test's database, model and event log `events`.
    fn flow(&self, args: &[&str], events: &str) -> Vec<String> {
        let mut all: Vec<String> = ["flow"].iter().chain(args).map(|s| s.to_string()).collect();
        let url = self.mock.url();
        let events = self.path(events);
        let db = self.path("runs.db");
        all.extend(
            [
                "--base-url",
                &url,
                "--provider",
                "openai",
                "--model",
                "flow-model",
                "--db",
                &db,
                "--events",
                &events,
                // The model's code marks where it is in a file beside the test's, which a
                // confined worker may not write: this run is about resuming, not confinement.
                "--isolation",
                "none",
            ]
            .map(String::from),
        );
        all
    }

    fn run_args(&self, id: &str) -> Vec<String> {
        let sales = self.path("sales.txt");
        let out = format!("output_dir={}", self.path("out"));
        self.flow(
            &[
                "run",
                "plan-discover",
                "--run-id",
                id,
                "--context",
                &sales,
                "--input",
                "goal=Grow sales next quarter",
                "--input",
                &out,
            ],
            &format!("{id}.jsonl"),
        )
    }

    fn records(&self, args: &[&str]) -> Run {
        let db = self.path("runs.db");
        let mut all: Vec<String> = ["flow"].iter().chain(args).map(|s| s.to_string()).collect();
        all.extend(["--db".to_owned(), db]);
        rlm(&all, None)
    }

    /// The run's checkpoints as `history --json` gives them.
    fn history(&self, id: &str) -> Vec<Value> {
        let run = self.records(&["history", id, "--json"]);
        run.assert_code(0);
        run.json().as_array().cloned().unwrap_or_default()
    }

    /// The state at the run's head, without its `temp:` keys.
    fn final_state(&self, id: &str) -> Value {
        use engine::durable::Store as _;
        let store =
            engine::durable::SqliteStore::open(self.dir.path().join("runs.db")).expect("db");
        let head = crate::support::block_on(store.run(id))
            .expect("readable")
            .and_then(|r| r.head);
        let state = crate::support::block_on(store.state_at(head.expect("a head")))
            .expect("state")
            .state;
        let kept = state
            .to_map()
            .into_iter()
            .filter(|(k, _)| !k.starts_with("temp:"));
        Value::Object(kept.collect())
    }

    fn plan(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("out/plan.md")).expect("the plan")
    }
}

fn paths(history: &[Value]) -> Vec<String> {
    history
        .iter()
        .map(|c| {
            c["path"]
                .as_str()
                .or_else(|| c["node"].as_str())
                .unwrap_or_default()
                .to_owned()
        })
        .collect()
}

#[test]
fn plan_discover_killed_in_its_discovery_loop_resumes_without_repeating_model_calls() {
    let setup = Setup::new();
    // The unbroken run: `go` is there, so the recheck does not block.
    file(setup.dir.path(), "go", "");
    let whole = setup.rlm(&setup.run_args("whole"), "tmp");
    whole.assert_code(0);
    let whole_requests = setup.mock.log().len();
    let whole_plan = setup.plan();
    assert!(
        whole_plan.contains("(rechecked) (discovery 2)"),
        "{whole_plan}"
    );
    let whole_history = paths(&setup.history("whole"));
    assert!(
        whole_history.contains(&"plan_discover[2]/discovery[2]/discoverer".to_owned()),
        "{whole_history:?}"
    );
    std::fs::remove_file(setup.dir.path().join("go")).expect("remove go");
    std::fs::remove_file(setup.dir.path().join("started")).expect("remove started");
    std::fs::remove_dir_all(setup.dir.path().join("out")).expect("remove the plan");
    setup.mock.log().clear();

    // The crashed run: killed while the second discovery iteration's RLM code runs.
    let mut child = rlm_command(&setup.run_args("crash"))
        .env("TMPDIR", setup.path("killed-tmp"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("rlm starts");
    let marker = setup.dir.path().join("started");
    wait_for(&marker, &mut child);
    child.kill().expect("kill -9");
    child.wait().expect("reaped");
    let left = setup.left_in("killed-tmp");
    assert!(
        left.len() == 1 && Path::new(&left[0]).join("plan-discover").is_dir(),
        "the killed run's copy of the built-in, and only it: {left:?}"
    );
    let before = setup.mock.log().len();
    let crash_history = paths(&setup.history("crash"));
    assert_eq!(
        crash_history.last().map(String::as_str),
        Some("plan_discover[2]/discovery[1]/results_processor"),
        "{crash_history:?}"
    );
    let table = setup.records(&["history", "crash"]);
    table.assert_code(0);
    assert!(
        table
            .stdout
            .contains("plan_discover[2]/discovery[1]/discoverer"),
        "{}",
        table.stdout
    );

    file(setup.dir.path(), "go", "");
    let resumed = setup.rlm(&setup.flow(&["resume", "crash"], "resumed.jsonl"), "tmp");
    resumed.assert_code(0);
    assert_eq!(
        setup.left_in("tmp"),
        Vec::<String>::new(),
        "runs that ended"
    );
    let after = setup.mock.log().len() - before;
    // Only the killed discoverer's first model call is asked again.
    assert_eq!(before + after, whole_requests + 1);
    let events = read_events(&setup.dir.path().join("resumed.jsonl"));
    assert_eq!(
        started(&events),
        [
            "plan_discover",
            "discovery",
            "discoverer",
            "results_processor",
            "planner"
        ]
    );
    let blocked = std::fs::read_to_string(&marker).expect("started file");
    assert_eq!(blocked.lines().count(), 2, "killed once, then run again");
    assert_eq!(setup.plan(), whole_plan);
    assert_eq!(setup.final_state("crash"), setup.final_state("whole"));
    assert_eq!(
        paths(&setup.history("crash")),
        whole_history,
        "the checkpoints of an unbroken run"
    );
}
