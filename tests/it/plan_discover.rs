//! `rlm flow run plan-discover`: the planner persona asks for two discoveries (an RLM over
//! the contexts each), loads its workflow file and writes its plan, over both wire formats;
//! a discovery request ends the planner's turn; the inner exit leaves the outer loop
//! running; a round without a request skips the discovery; `--bundle` with either fixture
//! tree; hostile artifact names are refused.

use std::path::Path;

use serde_json::{Value, json};

use crate::agent::Project;
use crate::flow::{args, ended, read_events, run_flow, started};
use crate::support::{Mock, Run, file, rlm};

pub(crate) const SALES: &str = "north: 120 -> 131\nsouth: 98 -> 97\neast: 77 -> 90\n";

/// The demo's script (`kernel/cli/src/flow/demo/plan-discover.json`) for model
/// `flow-model`, with `first` rules tried before its own.
pub(crate) fn script(first: &[Value]) -> Value {
    let demo: Value = serde_json::from_str(include_str!(
        "../../kernel/cli/src/flow/demo/plan-discover.json"
    ))
    .expect("the demo script is JSON");
    let mut rules: Vec<Value> = first.to_vec();
    rules.extend(
        demo["models"]["demo-model"]["rules"]
            .as_array()
            .expect("rules")
            .iter()
            .cloned(),
    );
    json!({"models": {"flow-model": {"rules": rules}}})
}

pub(crate) fn call(name: &str, arguments: Value) -> Value {
    json!({"tool_call": {"name": name, "arguments": arguments}})
}

/// `rlm flow run plan-discover` over the sales notes, writing into `dir/out`.
fn plan(mock: &Mock, provider: &str, dir: &Path, extra: &[&str]) -> Run {
    let sales = file(dir, "sales.txt", SALES);
    let mut all = args(&["plan-discover", "--input", "goal=Grow sales next quarter"]);
    all.extend([
        "--context".into(),
        sales.display().to_string(),
        "--input".into(),
        format!("output_dir={}", dir.join("out").display()),
    ]);
    all.extend(args(extra));
    run_flow(mock, provider, dir, &all)
}

/// `rlm flow run plan-discover` over the sales notes in `dir` as the working directory,
/// with relative paths only, plus `extra`.
fn plan_in(mock: &Mock, dir: &Path, extra: &[&str]) -> Run {
    file(dir, "sales.txt", SALES);
    let mut all = args(&[
        "flow",
        "run",
        "plan-discover",
        "--input",
        "goal=Grow sales next quarter",
        "--context",
        "sales.txt",
        "--base-url",
        &mock.url(),
        "--model",
        "flow-model",
        "--events",
        "events.jsonl",
    ]);
    all.extend(args(extra));
    let output = crate::support::rlm_command(&all)
        .current_dir(dir)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("rlm runs");
    Run {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

fn state(dir: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("state.json")).expect("state"))
        .expect("JSON")
}

/// The tool calls of each turn of `author`, turn by turn.
fn turns(events: &[Value], author: &str) -> Vec<Vec<String>> {
    let mut out: Vec<Vec<String>> = Vec::new();
    for event in events.iter().filter(|e| e["author"] == author) {
        match event["kind"].as_str() {
            Some("start") => out.push(Vec::new()),
            Some("tool_calls") => {
                let names = event["tool_calls"].as_array().into_iter().flatten();
                if let Some(turn) = out.last_mut() {
                    turn.extend(names.filter_map(|c| c["name"].as_str().map(str::to_owned)));
                }
            }
            _ => {}
        }
    }
    out
}

#[test]
fn plan_discover_runs_two_discovery_rounds_and_writes_its_plan_over_both_wire_formats() {
    for provider in ["openai", "anthropic"] {
        let dir = tempfile::tempdir().expect("tempdir");
        let mock = Mock::start(script(&[]));
        let run = plan(&mock, provider, dir.path(), &[]);
        run.assert_code(0);
        assert!(
            run.stdout.starts_with("The plan is written to plan.md"),
            "{}",
            run.stdout
        );
        let events = read_events(&dir.path().join("events.jsonl"));
        let round = ["planner", "discovery", "discoverer", "results_processor"];
        let mut expected = vec!["plan_discover"];
        expected.extend(round);
        expected.extend(round);
        expected.push("planner");
        assert_eq!(started(&events), expected, "{provider}");
        assert_eq!(ended(&events, "discovery"), ["exited_loop", "exited_loop"]);
        assert_eq!(ended(&events, "plan_discover"), ["exited_loop"]);
        let rlm_iterations = events
            .iter()
            .filter(|e| e["kind"] == "metadata" && e["topic"] == "rlm_iteration")
            .count();
        assert_eq!(rlm_iterations, 4, "two RLM iterations per discovery");
        let plan = std::fs::read_to_string(dir.path().join("out/plan.md")).expect("the plan");
        assert!(
            plan.starts_with("# Plan: Grow sales next quarter"),
            "{plan}"
        );
        assert!(
            plan.contains("- south fell from 98 to 97 (discovery 2)"),
            "{plan}"
        );
        let state = state(dir.path());
        let written = std::fs::canonicalize(dir.path().join("out/plan.md")).expect("canonical");
        assert_eq!(
            state["planning_artifacts"],
            json!([written.display().to_string()])
        );
        assert!(
            state
                .as_object()
                .is_some_and(|s| s.keys().all(|k| !k.starts_with("temp:"))),
            "{state}"
        );
        let log = std::fs::read_to_string(dir.path().join("events.jsonl")).expect("log");
        assert!(
            log.contains(
                "\"key\":\"temp:discovery:results\",\"value\":\"north 120 to 131; south 98 to 97; east 77 to 90\""
            ),
            "the first round's results travel in a namespaced temp key"
        );
    }
}

/// The README's `--input output_dir=plans` and the default `planning-artifacts` are relative
/// folders: each is taken from the working directory once (it was joined twice, and the plan
/// never written).
#[test]
fn a_relative_output_folder_is_taken_from_the_working_directory() {
    for (input, folder) in [
        (Some("output_dir=plans"), "plans"),
        (None, "planning-artifacts"),
    ] {
        let dir = tempfile::tempdir().expect("tempdir");
        let mock = Mock::start(script(&[]));
        let extra: Vec<&str> = input.into_iter().flat_map(|i| ["--input", i]).collect();
        let run = plan_in(&mock, dir.path(), &extra);
        run.assert_code(0);
        let plan = std::fs::read_to_string(dir.path().join(folder).join("plan.md"))
            .unwrap_or_else(|e| panic!("{folder}/plan.md: {e}\n{}", run.stderr));
        assert!(
            plan.starts_with("# Plan: Grow sales next quarter"),
            "{plan}"
        );
        assert!(!dir.path().join(folder).join(folder).exists(), "{folder}");
        let events = read_events(&dir.path().join("events.jsonl"));
        let written = events
            .iter()
            .flat_map(|e| e["tool_results"].as_array().into_iter().flatten())
            .find(|r| r["name"] == "write_planning_artifact")
            .expect("the plan was written");
        assert_ne!(written["is_error"], json!(true), "{written}");
    }
}

/// A planner that ends the run without writing its plan is told to write it first: the run
/// never ends "done" with no plan (issue 23 §1).
#[test]
fn the_planner_cannot_end_the_run_before_its_plan_is_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mock = Mock::start(script(&[
        // With its workflow loaded, the planner ends at once, writing nothing ...
        json!({"tool_name": "load_workflow_file", "reply": call("exit_loop", json!({}))}),
        // ... is refused, and then writes the plan (and ends, by the demo's rule).
        json!({"tool_name": "exit_loop", "reply": call(
            "write_planning_artifact",
            json!({"name": "plan.md", "content": "# Plan: written after all\n"}),
        )}),
    ]));
    let run = plan(&mock, "openai", dir.path(), &[]);
    run.assert_code(0);
    let plan = std::fs::read_to_string(dir.path().join("out/plan.md"))
        .unwrap_or_else(|e| panic!("the plan: {e}\n{}", run.stderr));
    assert_eq!(plan, "# Plan: written after all\n");
    let events = read_events(&dir.path().join("events.jsonl"));
    let exits: Vec<&Value> = events
        .iter()
        .flat_map(|e| e["tool_results"].as_array().into_iter().flatten())
        .filter(|r| r["name"] == "exit_loop")
        .collect();
    assert!(
        exits
            .first()
            .is_some_and(|r| r.to_string().contains("no plan is written yet")),
        "{exits:?}"
    );
}

/// A run that ends without its plan (here: a planner that only ever talks, until the loop's
/// 20 rounds are spent) fails saying so, never "done" with exit 0 (issue 23 §1).
#[test]
fn a_run_that_ends_without_its_plan_fails_saying_so() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mock = Mock::start(script(&[json!({
        "system": "You are the planner",
        "reply": "The plan is written to plan.md."
    })]));
    let run = plan(&mock, "openai", dir.path(), &[]);
    run.assert_code(1);
    assert!(
        run.stderr.contains(
            "Agent `plan_discover` was stopped by a hook: the run ended without its plan: \
             `write_planning_artifact` never wrote one"
        ),
        "{}",
        run.stderr
    );
    assert!(!dir.path().join("out").exists(), "nothing was written");
    let events = read_events(&dir.path().join("events.jsonl"));
    assert_eq!(ended(&events, "plan_discover"), ["failed"]);
    assert_eq!(ended(&events, "planner").len(), 20, "every round ran");
}

#[test]
fn a_discovery_request_ends_the_planners_turn() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Were the planner asked again after `request_discovery`, it would write this too early.
    let too_early = json!({"tool_name": "request_discovery",
        "reply": call("write_planning_artifact", json!({"name": "too-early.md", "content": "x"}))});
    let mock = Mock::start(script(&[too_early]));
    let run = plan(&mock, "openai", dir.path(), &[]);
    run.assert_code(0);
    let events = read_events(&dir.path().join("events.jsonl"));
    let planner = turns(&events, "planner");
    assert_eq!(
        planner,
        [
            vec!["request_discovery"],
            vec!["request_discovery"],
            vec!["load_workflow_file", "write_planning_artifact", "exit_loop"]
        ]
    );
    assert!(!dir.path().join("out/too-early.md").exists());
    // Each request is followed by the planner's end, then the discovery's start.
    let after_request: Vec<(&str, &str)> = events
        .iter()
        .skip_while(|e| e["kind"] != "tool_results")
        .skip(1)
        .take(3)
        .map(|e| {
            (
                e["author"].as_str().unwrap_or_default(),
                e["kind"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        after_request,
        [
            ("planner", "state_update"),
            ("planner", "end"),
            ("discovery", "start")
        ]
    );
}

#[test]
fn the_inner_exit_returns_to_the_planner_without_ending_the_outer_loop() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mock = Mock::start(script(&[]));
    let run = plan(&mock, "anthropic", dir.path(), &[]);
    run.assert_code(0);
    let events = read_events(&dir.path().join("events.jsonl"));
    let outline: Vec<String> = events
        .iter()
        .filter(|e| {
            (e["author"] == "discovery" && e["kind"] == "end")
                || (e["author"] == "plan_discover" && e["kind"] != "state_update")
                || (e["author"] == "planner" && e["kind"] == "start")
        })
        .map(|e| {
            let detail = e["status"]
                .as_str()
                .map(str::to_owned)
                .or_else(|| e["iteration"].as_u64().map(|i| i.to_string()))
                .unwrap_or_default();
            format!(
                "{} {} {detail}",
                e["author"].as_str().unwrap_or_default(),
                e["kind"].as_str().unwrap_or_default()
            )
            .trim_end()
            .to_owned()
        })
        .collect();
    assert_eq!(
        outline,
        [
            "plan_discover start",
            "plan_discover iteration 1",
            "planner start",
            "discovery end exited_loop",
            "plan_discover iteration 2",
            "planner start",
            "discovery end exited_loop",
            "plan_discover iteration 3",
            "planner start",
            "plan_discover end exited_loop",
        ]
    );
}

#[test]
fn a_round_without_a_request_skips_the_discovery_and_hostile_artifact_names_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let first = [
        json!({"system": "You are the planner", "tool_name": "write_planning_artifact",
               "reply": call("exit_loop", json!({}))}),
        json!({"system": "You are the planner", "turn": 1,
               "reply": call("write_planning_artifact", json!({"name": "../escape.md", "content": "x"}))}),
        json!({"system": "You are the planner", "turn": 0, "reply": "Let me think first."}),
    ];
    let mock = Mock::start(script(&first));
    let run = plan(&mock, "openai", dir.path(), &[]);
    run.assert_code(0);
    let events = read_events(&dir.path().join("events.jsonl"));
    assert_eq!(
        started(&events)[..4],
        ["plan_discover", "planner", "discovery", "planner"]
    );
    assert_eq!(ended(&events, "discovery")[0], "skipped");
    // The planner's `exit_loop` after the refused write is refused in turn (no plan yet), so
    // it goes on, asks its questions and writes its plan (issue 23 §1).
    let exit = events
        .iter()
        .flat_map(|e| e["tool_results"].as_array().into_iter().flatten())
        .find(|r| r["name"] == "exit_loop")
        .expect("the exit was answered");
    assert!(
        exit.to_string().contains("no plan is written yet"),
        "{exit}"
    );
    assert!(dir.path().join("out/plan.md").exists(), "{}", run.stderr);
    let refused = events
        .iter()
        .flat_map(|e| e["tool_results"].as_array().into_iter().flatten())
        .find(|r| r["name"] == "write_planning_artifact")
        .expect("the write was answered");
    assert_eq!(refused["is_error"], json!(true), "{refused}");
    assert!(
        refused["result"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("outside the folders")),
        "{refused}"
    );
    assert!(!dir.path().join("escape.md").exists());
}

#[test]
fn bundle_names_an_agent_of_either_fixture_tree_to_play_the_planner() {
    let cases = [
        (
            "v6-installed",
            "_bmad/bmm/agents/sm.md",
            "workflows/4-implementation/sprint-planning/workflow.yaml",
            "Technical Scrum Master",
        ),
        (
            "v6-alpha0",
            "bmad/cis/agents/design-thinking-coach.md",
            "{bundle-root}/workflows/design-thinking/workflow.yaml",
            "Human-Centered Design Expert",
        ),
    ];
    for (tree, agent, workflow, role) in cases {
        let project = Project::copy(tree);
        let dir = tempfile::tempdir().expect("tempdir");
        let first = [
            json!({"tool_name": "write_planning_artifact", "reply": call("exit_loop", json!({}))}),
            json!({"tool_name": "load_workflow_file",
                   "system": "(?s)- Role: (?P<role>[^\\n]*)",
                   "reply": call("write_planning_artifact",
                                 json!({"name": "plan.md", "content": "Planned by {{role}}"}))}),
            json!({"system": "Discovery rounds so far: 2\\n",
                   "reply": call("load_workflow_file", json!({"file_path": workflow}))}),
        ];
        let mock = Mock::start(script(&first));
        let run = plan(
            &mock,
            "openai",
            dir.path(),
            &["--bundle", &project.path(agent)],
        );
        run.assert_code(0);
        let plan = std::fs::read_to_string(dir.path().join("out/plan.md")).expect("the plan");
        assert!(
            plan.starts_with(&format!("Planned by {role}")),
            "{tree}: {plan}"
        );
        let events = read_events(&dir.path().join("events.jsonl"));
        let loaded = events
            .iter()
            .flat_map(|e| e["tool_results"].as_array().into_iter().flatten())
            .find(|r| r["name"] == "load_workflow_file")
            .expect("a workflow file was loaded");
        assert_ne!(loaded["is_error"], json!(true), "{tree}: {loaded}");
        assert!(
            loaded["result"]["content"]
                .as_str()
                .is_some_and(|c| c.contains("installed_path")),
            "{tree}: {loaded}"
        );
        assert_eq!(ended(&events, "discovery"), ["exited_loop", "exited_loop"]);
    }
}

#[test]
fn bundle_names_a_bmad_agent_skill_to_play_the_planner() {
    let project = Project::copy("v6.12-installed");
    let dir = tempfile::tempdir().expect("tempdir");
    let first = [
        json!({"tool_name": "write_planning_artifact", "reply": call("exit_loop", json!({}))}),
        json!({"tool_name": "load_workflow_file",
               "system": "(?s)You are (?P<who>[^,]*), Product Manager, one agent of a workflow.*- Role: (?P<role>[^\\n]*)",
               "reply": call("write_planning_artifact",
                             json!({"name": "plan.md", "content": "Planned by {{who}}: {{role}}"}))}),
        json!({"system": "Discovery rounds so far: 2\\n",
               "reply": call("load_workflow_file", json!({"file_path": "customize.toml"}))}),
    ];
    let mock = Mock::start(script(&first));
    let run = plan(
        &mock,
        "anthropic",
        dir.path(),
        &["--bundle", &project.path(".claude/skills/bmad-agent-pm")],
    );
    run.assert_code(0);
    let plan = std::fs::read_to_string(dir.path().join("out/plan.md")).expect("the plan");
    assert_eq!(
        plan,
        "Planned by John: Translate product vision into a validated PRD, epics, and stories \
         that development can execute during the BMad Method planning phase."
    );
    let events = read_events(&dir.path().join("events.jsonl"));
    let loaded = events
        .iter()
        .flat_map(|e| e["tool_results"].as_array().into_iter().flatten())
        .find(|r| r["name"] == "load_workflow_file")
        .expect("a file of the skill was loaded");
    assert!(
        loaded["result"]["content"]
            .as_str()
            .is_some_and(|c| c.contains("[[agent.menu]]")),
        "{loaded}"
    );
}

#[test]
fn a_bundle_without_the_persona_or_no_bundle_at_all_is_refused_before_any_model_call() {
    let project = Project::copy("v6-installed");
    let dir = tempfile::tempdir().expect("tempdir");
    let mock = Mock::start(script(&[]));
    let run = plan(
        &mock,
        "openai",
        dir.path(),
        &["--bundle", &project.path("_bmad/bmm")],
    );
    run.assert_code(1);
    assert!(
        run.stderr.contains("planner.yaml:3:1: Persona `planner`")
            && run.stderr.contains("has no agent `planner`")
            && run.stderr.contains("`sm`"),
        "{}",
        run.stderr
    );
    let missing = plan(
        &mock,
        "openai",
        dir.path(),
        &["--bundle", &project.path("no-such-bundle")],
    );
    missing.assert_code(2);
    assert!(
        missing.stderr.contains("no-such-bundle` does not exist"),
        "{}",
        missing.stderr
    );
    assert!(mock.log().is_empty(), "no model was called");
}

#[test]
fn flow_demo_plan_discover_says_it_is_scripted_and_shows_the_plan() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("runs.db").display().to_string();
    for wire in [None, Some("--anthropic")] {
        let mut all = args(&["flow", "demo", "plan-discover", "--db", &db]);
        all.extend(wire.map(String::from));
        let run = rlm(&all, None);
        run.assert_code(0);
        assert!(
            run.stderr.contains("the models are SCRIPTED"),
            "{}",
            run.stderr
        );
        assert!(
            run.stdout.contains(
                "--- plan.md (written by the planner) ---\n# Plan: Plan next quarter's sales push"
            ),
            "{}",
            run.stdout
        );
        assert_eq!(
            run.stderr.matches("▶ discoverer").count(),
            2,
            "{}",
            run.stderr
        );
    }
}

#[test]
fn flow_graph_draws_plan_discover_with_its_persona() {
    let run = rlm(&args(&["flow", "graph", "plan-discover"]), None);
    run.assert_code(0);
    insta::assert_snapshot!(run.stdout);
}
