//! `rlm flow`: the built-in workflows end to end against scripted models over both wire
//! formats (agent order from the event log, the final state), Mermaid graphs, and
//! workflow-file errors.

use serde_json::json;

use crate::support::{Mock, Run, file, rlm, rlm_in, rlm_on_terminal};

pub(crate) fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn flow_list_names_the_built_in_workflows() {
    let run = rlm(&args(&["flow", "list"]), None);
    run.assert_code(0);
    insta::assert_snapshot!(run.stdout);
}

#[test]
fn flow_graph_draws_a_built_in_and_its_readable_file_alike() {
    let run = rlm(&args(&["flow", "graph", "refine"]), None);
    run.assert_code(0);
    insta::assert_snapshot!(run.stdout);
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/flows/refine/refine.yaml");
    let from_file = rlm(&args(&["flow", "graph", path]), None);
    from_file.assert_code(0);
    assert_eq!(from_file.stdout, run.stdout);
    rlm(&args(&["flow", "graph", "rlm-completion"]), None).assert_code(0);
}

#[test]
fn flow_graph_draws_the_team_router_with_its_successors_and_recovery_edges() {
    let run = rlm(&args(&["flow", "graph", "team"]), None);
    run.assert_code(0);
    insta::assert_snapshot!(run.stdout);
}

#[test]
fn flow_graph_names_the_file_line_and_column_of_a_mistake() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = file(dir.path(), "bad.yaml", "name: a\nmodle: root\n");
    let run = rlm(
        &args(&["flow", "graph", bad.to_str().expect("utf-8")]),
        None,
    );
    run.assert_code(1);
    assert!(
        run.stderr
            .contains("bad.yaml:2:1: Unknown field `modle`, expected one of"),
        "{}",
        run.stderr
    );
    let unknown = rlm(&args(&["flow", "graph", "no-such-flow"]), None);
    unknown.assert_code(2);
    assert!(
        unknown
            .stderr
            .contains("`no-such-flow` is neither a workflow file nor a built-in"),
        "{}",
        unknown.stderr
    );
}

/// The scripted model of the `refine` tests: each agent wraps what it got (`P[...]`,
/// `F[...]`, `E[...]`), so the document shows how many rounds ran; the evaluator calls
/// `exit_loop` once the document has been through two rounds, unless `never_satisfied`.
fn refine_script(never_satisfied: bool) -> serde_json::Value {
    let mut rules = vec![
        json!({"system": "(?s)You prune a document.*?Latest reworked version[^\\n]*\\n(?P<prev>[^\\n]*)",
               "reply": "P[{{prev}}]"}),
        json!({"system": "(?s)You fill a document.*?Pruned template:\\n(?P<p>[^\\n]*)",
               "reply": "F[{{p}}]"}),
        json!({"system": "(?s)You improve a filled document.*?Filled document:\\n(?P<f>[^\\n]*)",
               "reply": "E[{{f}}]"}),
    ];
    if !never_satisfied {
        rules.push(
            json!({"system": "(?s)You review a document.*?Document:\\nE\\[F\\[P\\[E",
                          "reply": {"tool_call": {"name": "exit_loop", "arguments": {}}}}),
        );
    }
    rules.push(json!({"system": "You review a document", "reply": "Cut the filler."}));
    json!({"models": {"flow-model": {"rules": rules}}})
}

fn nested(rounds: usize) -> String {
    (0..rounds).fold(String::new(), |inner, _| format!("E[F[P[{inner}]]]"))
}

pub(crate) fn started(events: &[serde_json::Value]) -> Vec<String> {
    events
        .iter()
        .filter(|e| e["kind"] == "start")
        .map(|e| e["author"].as_str().unwrap_or_default().to_owned())
        .collect()
}

pub(crate) fn ended<'a>(events: &'a [serde_json::Value], author: &str) -> Vec<&'a str> {
    events
        .iter()
        .filter(|e| e["kind"] == "end" && e["author"] == author)
        .filter_map(|e| e["status"].as_str())
        .collect()
}

pub(crate) fn read_events(path: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .expect("event log")
        .lines()
        .map(|l| serde_json::from_str(l).expect("one event per line"))
        .collect()
}

/// `rlm flow run` against `mock` over `provider`'s wire format, with the events and state
/// in `dir`.
pub(crate) fn run_flow(
    mock: &Mock,
    provider: &str,
    dir: &std::path::Path,
    extra: &[String],
) -> Run {
    let url = if provider == "anthropic" {
        mock.anthropic_url()
    } else {
        mock.url()
    };
    let mut all = args(&["flow", "run"]);
    all.extend(extra.iter().cloned());
    all.extend(args(&[
        "--base-url",
        &url,
        "--provider",
        provider,
        "--model",
        "flow-model",
    ]));
    all.push("--events".into());
    all.push(dir.join("events.jsonl").display().to_string());
    all.push("--state".into());
    all.push(dir.join("state.json").display().to_string());
    all.push("--db".into());
    all.push(dir.join("runs.db").display().to_string());
    rlm(&all, None)
}

fn refine_round(agents: &mut Vec<String>) {
    agents.extend(["pruner", "filler", "enricher", "evaluator"].map(String::from));
}

#[test]
fn refine_exits_at_round_two_when_the_evaluator_is_satisfied_over_both_wire_formats() {
    for provider in ["openai", "anthropic"] {
        let dir = tempfile::tempdir().expect("tempdir");
        let template = file(dir.path(), "template.md", "# Report\n{summary}\n");
        let mock = Mock::start(refine_script(false));
        let run = run_flow(
            &mock,
            provider,
            dir.path(),
            &[
                "refine".into(),
                "--input".into(),
                format!("template=@{}", template.display()),
                "--input".into(),
                "reviewed_summary=Sales grew 4%.".into(),
            ],
        );
        run.assert_code(0);
        let events = read_events(&dir.path().join("events.jsonl"));
        let mut expected = args(&["refine", "save_inputs", "refinement_loop"]);
        refine_round(&mut expected);
        refine_round(&mut expected);
        expected.push("save_document".into());
        assert_eq!(started(&events), expected, "{provider}");
        assert_eq!(ended(&events, "refinement_loop"), ["exited_loop"]);
        let state: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(dir.path().join("state.json")).expect("state written"),
        )
        .expect("JSON");
        assert_eq!(state["final_document"], json!(nested(2)), "{provider}");
        assert_eq!(state["enriched_template"], json!(nested(2)));
        assert_eq!(state["refinement_feedback"], json!("Cut the filler."));
        assert_eq!(state["template"], json!("# Report\n{summary}\n"));
        assert_eq!(run.stdout.trim(), nested(2));
        if provider == "openai" {
            // `rlm view` renders the event log: the agent tree with how each run ended.
            let log = dir.path().join("events.jsonl");
            rlm(&args(&["view", log.to_str().expect("utf-8")]), None).assert_code(0);
            let html = std::fs::read_to_string(dir.path().join("events.html")).expect("page");
            assert!(html.contains("<h1>Workflow run: refine</h1>"), "{html}");
            assert_eq!(html.matches("<summary>evaluator ").count(), 2);
            assert!(html.contains("class=\"st-exited_loop\""));
        }
    }
}

#[test]
fn refine_stops_at_its_limit_of_five_rounds_and_keeps_the_last_document() {
    for provider in ["openai", "anthropic"] {
        let dir = tempfile::tempdir().expect("tempdir");
        let mock = Mock::start(refine_script(true));
        let run = run_flow(
            &mock,
            provider,
            dir.path(),
            &args(&[
                "refine",
                "--input",
                "template=# Report",
                "--input",
                "reviewed_summary=Sales grew 4%.",
                "--input",
                "show_state=true",
            ]),
        );
        run.assert_code(0);
        let events = read_events(&dir.path().join("events.jsonl"));
        let mut expected = args(&["refine", "save_inputs", "refinement_loop"]);
        for _ in 0..5 {
            refine_round(&mut expected);
        }
        expected.push("save_document".into());
        assert_eq!(started(&events), expected, "{provider}");
        assert_eq!(ended(&events, "refinement_loop"), ["iteration_limit"]);
        let state: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(dir.path().join("state.json")).expect("state written"),
        )
        .expect("JSON");
        assert_eq!(state["final_document"], json!(nested(5)));
        // `show_state` prints every state key after the document.
        assert!(run.stdout.starts_with(&nested(5)), "{}", run.stdout);
        assert!(
            run.stdout
                .contains("\"refinement_feedback\": \"Cut the filler.\""),
            "{}",
            run.stdout
        );
    }
}

/// A workflow writes no trajectory or answer file (its record is the event log and the run
/// database): `rlm flow run` and `resume` refuse `--trajectory` and `--answer-file` as usage
/// errors naming the flag, before anything runs or is written, instead of taking and
/// ignoring them.
#[test]
fn flow_run_and_resume_refuse_a_trajectory_or_answer_file() {
    let mock = Mock::start(refine_script(false));
    let url = mock.url();
    for (flag, name) in [("--trajectory", "t.jsonl"), ("--answer-file", "a.txt")] {
        for command in [
            vec![
                "flow",
                "run",
                "refine",
                "-i",
                "template=T",
                "-i",
                "reviewed_summary=S",
            ],
            vec!["flow", "resume", "refine-1"],
        ] {
            let dir = tempfile::tempdir().expect("tempdir");
            let mut all = args(&command);
            all.extend(args(&["--model", "m", "--base-url", &url, flag, name]));
            let run = rlm_in(dir.path(), &all, None);
            run.assert_code(2);
            assert!(
                run.stderr
                    .contains(&format!("unexpected argument '{flag}' found")),
                "{command:?}: {}",
                run.stderr
            );
            let left: Vec<_> = std::fs::read_dir(dir.path())
                .expect("read dir")
                .flatten()
                .map(|e| e.file_name())
                .collect();
            assert!(left.is_empty(), "{command:?} wrote {left:?}");
        }
    }
    assert!(mock.log().is_empty(), "no model was called");
}

/// A required input left out is a usage error before the run exists (issue 23 §2): it names
/// the key, the agents that need it and how to pass it; no run record, event log or state
/// file is written, no Python runs (no traceback), no model is called.
#[test]
fn a_missing_input_is_refused_before_the_run_exists_naming_it() {
    for (workflow, given, key, agents) in [
        (
            "refine",
            "template=x",
            "reviewed_summary",
            "`pruner` (refine/pruner.yaml:10)",
        ),
        (
            "team",
            "story=x",
            "request",
            "`analyst` (team/analyst.yaml:9)",
        ),
    ] {
        let dir = tempfile::tempdir().expect("tempdir");
        let mock = Mock::start(refine_script(false));
        let run = run_flow(
            &mock,
            "openai",
            dir.path(),
            &args(&[workflow, "--input", given]),
        );
        run.assert_code(2);
        for part in [
            format!("`rlm flow run {workflow}` needs a state key"),
            format!("`{key}`, in the instruction of {agents}"),
            format!("`--input {key}=...`"),
        ] {
            assert!(run.stderr.contains(&part), "{part:?} in {}", run.stderr);
        }
        assert!(!run.stderr.contains("Traceback"), "{}", run.stderr);
        assert!(mock.log().is_empty(), "no model was called");
        for file in ["runs.db", "events.jsonl", "state.json"] {
            assert!(
                !dir.path().join(file).exists(),
                "{workflow}: {file} written"
            );
        }
    }
}

/// A Python step whose function needs an argument its `args` do not give is refused before
/// the run exists, naming the step, the function, the parameter and how to give it, instead
/// of a failed run and a `TypeError` (issue 23 §2).
#[test]
fn a_python_step_missing_a_required_argument_is_refused_before_the_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    file(
        d,
        "steps.py",
        "def tidy(ctx, limit, sep=','):\n    return f'limit {limit}'\n",
    );
    file(
        d,
        "flow.yaml",
        "agent_class: PythonAgent\nname: tidy\nfunction: steps.py:tidy\n",
    );
    let flow = d.join("flow.yaml").display().to_string();
    let run = rlm_in(d, &args(&["flow", "run", &flow]), None);
    run.assert_code(2);
    assert!(
        run.stderr.contains(&format!(
            "cannot call the Python step `tidy` ({flow}): `steps.py:tidy` needs `limit` that its \
             `args` do not give. Give each in the step's file, e.g. `args: {{limit: ...}}`"
        )),
        "{}",
        run.stderr
    );
    assert!(!run.stderr.contains("TypeError"), "{}", run.stderr);
    assert!(!d.join(".rlm").exists(), "no run record");
    // Given, it runs.
    file(
        d,
        "flow.yaml",
        "agent_class: PythonAgent\nname: tidy\nfunction: steps.py:tidy\nargs:\n  limit: 3\n",
    );
    let model = ["--model", "m", "--base-url", "http://127.0.0.1:9/v1"];
    let fixed = rlm_in(
        d,
        &args(&[&["flow", "run", &flow][..], &model].concat()),
        None,
    );
    fixed.assert_code(0);
    assert!(fixed.stdout.contains("limit 3"), "{}", fixed.stdout);
}

/// An instruction's `{key}` that nothing gives or writes, close to a key the workflow knows,
/// is named as a likely typo at load time, before anything runs (issue 23 §2).
#[test]
fn a_typo_in_an_instruction_is_found_before_the_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    file(
        d,
        "flow.yaml",
        "agent_class: SequentialAgent\nname: flow\nsub_agents:\n  - config_path: brief.yaml\n  \
         - config_path: plan.yaml\n",
    );
    file(
        d,
        "brief.yaml",
        "name: brief\ninstruction: Brief {topic}.\noutput_key: brief\n",
    );
    file(
        d,
        "plan.yaml",
        "name: plan\ninstruction: |\n  Plan from this:\n  {breif}\n",
    );
    let mock = Mock::start(refine_script(false));
    let flow = d.join("flow.yaml").display().to_string();
    let run = run_flow(
        &mock,
        "openai",
        d,
        &args(&[&flow, "--input", "topic=sales"]),
    );
    run.assert_code(2);
    let plan = d.join("plan.yaml").display().to_string();
    assert!(
        run.stderr.contains(&format!(
            "`breif`, in the instruction of `plan` ({plan}:4) — a typo of `brief`?"
        )),
        "{}",
        run.stderr
    );
    assert!(mock.log().is_empty(), "no model was called");
    assert!(!d.join("runs.db").exists());
    // Given, it runs.
    let fixed = run_flow(
        &mock,
        "openai",
        d,
        &args(&[&flow, "--input", "topic=sales", "--input", "breif=ok"]),
    );
    assert_ne!(fixed.code, Some(2), "{}", fixed.stderr);
}

#[test]
fn rlm_completion_loads_the_contexts_answers_and_formats_over_both_wire_formats() {
    let script = json!({"models": {"flow-model": {"rules": [
        {"system": "root model of a recursive language model", "turn": 0,
         "reply": "```repl\nprint(len(context.splitlines()))\n```"},
        {"system": "root model of a recursive language model", "reply": "FINAL(3 lines)"},
        {"system": "(?s)Rewrite the answer below.*?Answer:\\n(?P<a>[^\\n]*)",
         "reply": "Formatted: {{a}}"},
    ]}}});
    for provider in ["openai", "anthropic"] {
        let dir = tempfile::tempdir().expect("tempdir");
        let notes = file(dir.path(), "notes.txt", "alpha\nsecret-beta-line\ngamma\n");
        let mock = Mock::start(script.clone());
        let run = run_flow(
            &mock,
            provider,
            dir.path(),
            &[
                "rlm-completion".into(),
                "--context".into(),
                notes.display().to_string(),
                "--input".into(),
                "query=How many lines?".into(),
                "--input".into(),
                "format=one short line".into(),
            ],
        );
        run.assert_code(0);
        assert_eq!(run.stdout.trim(), "Formatted: 3 lines");
        let events = read_events(&dir.path().join("events.jsonl"));
        assert_eq!(
            started(&events),
            ["rlm_completion", "load_contexts", "analyst", "formatter"],
            "{provider}"
        );
        let iterations = events
            .iter()
            .filter(|e| e["kind"] == "metadata" && e["topic"] == "rlm_iteration")
            .count();
        assert_eq!(iterations, 2);
        let state: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(dir.path().join("state.json")).expect("state written"),
        )
        .expect("JSON");
        assert_eq!(state["raw_answer"], json!("3 lines"));
        assert_eq!(state["answer"], json!("Formatted: 3 lines"));
        assert_eq!(state["contexts"][0]["kind"], json!("text"));
        assert_eq!(state["rlm_calls"].as_array().map(Vec::len), Some(2));
        assert_eq!(state["user:answer_history"], json!(["3 lines"]));
        let log = std::fs::read_to_string(dir.path().join("events.jsonl")).expect("log");
        assert!(
            !log.contains("secret-beta-line"),
            "no context data in the event log"
        );
    }
}

#[test]
fn flow_demo_runs_a_built_in_against_models_it_says_are_scripted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("runs.db").display().to_string();
    for wire in [None, Some("--anthropic")] {
        let mut all = args(&["flow", "demo", "refine", "--db", &db]);
        all.extend(wire.map(String::from));
        let run = rlm(&all, None);
        run.assert_code(0);
        assert!(
            run.stderr.contains("the models are SCRIPTED"),
            "{}",
            run.stderr
        );
        assert_eq!(run.stdout.trim(), nested(2));
        assert!(run.stderr.contains("▶ refinement_loop"), "{}", run.stderr);
    }
    let run = rlm(
        &args(&["flow", "demo", "rlm-completion", "--db", &db]),
        None,
    );
    run.assert_code(0);
    assert_eq!(run.stdout.trim(), "The notes have 3 lines.");
}

const HIDE_CURSOR: &str = "\x1b[?25l";
const SHOW_CURSOR: &str = "\x1b[?25h";

#[test]
fn on_a_terminal_the_agent_tree_is_redrawn_in_place_and_left_on_screen() {
    let run = rlm_on_terminal(&args(&["flow", "demo", "refine"]), &[], |_, _| {});
    assert_eq!(run.code, Some(0), "{}", run.terminal);
    assert_eq!(run.stdout.trim(), nested(2));
    let screen = &run.terminal;
    // The cursor hides while the tree is drawn and comes back after its last frame.
    let (hidden, shown) = (screen.find(HIDE_CURSOR), screen.rfind(SHOW_CURSOR));
    assert!(hidden.is_some() && shown > hidden, "{screen:?}");
    let last_frame = &screen[..shown.unwrap_or_default()];
    let last_frame = &last_frame[last_frame.rfind("✓ refine ").unwrap_or_default()..];
    for line in [
        "├─ ✓ refinement_loop  done",
        "iteration 2/5 · exit_loop",
        "│  └─ ✓ evaluator     done",
        "2 runs · 2 model calls · 1 tool call",
        "└─ ✓ save_document    done",
    ] {
        assert!(last_frame.contains(line), "{line:?} in {last_frame:?}");
    }
    // Redrawn in place: the cursor goes back up over the tree; no plain progress lines.
    assert!(screen.contains("\x1b[7A"), "{screen:?}");
    assert!(
        !screen.contains("■ refinement_loop exited_loop"),
        "{screen:?}"
    );

    // Under CI, with `TERM=dumb` or with logs on, the same terminal gets the plain lines.
    for env in [("CI", "true"), ("TERM", "dumb"), ("RUST_LOG", "info")] {
        let run = rlm_on_terminal(&args(&["flow", "demo", "refine"]), &[env], |_, _| {});
        assert_eq!(run.code, Some(0));
        assert!(
            run.terminal.contains("  ■ refinement_loop exited_loop"),
            "{env:?}: {}",
            run.terminal
        );
        assert!(!run.terminal.contains(HIDE_CURSOR), "{env:?}");
    }
}

#[test]
fn ctrl_c_under_the_tree_keeps_state_and_log_and_gives_the_cursor_back() {
    let mut script = refine_script(false);
    // The pruner's model call hangs until Ctrl-C.
    script["models"]["flow-model"]["latency"] = json!({"kind": "fixed", "ms": 60_000});
    let mock = Mock::start(script);
    let dir = tempfile::tempdir().expect("tempdir");
    let (events, state) = (
        dir.path().join("events.jsonl"),
        dir.path().join("state.json"),
    );
    let mut all = args(&["flow", "run", "refine", "--base-url", &mock.url()]);
    all.extend(args(&["--model", "flow-model", "--input", "template=T"]));
    all.extend(args(&["--input", "reviewed_summary=S"]));
    all.extend(args(&["--events", &events.display().to_string()]));
    all.extend(args(&["--state", &state.display().to_string()]));
    let run = rlm_on_terminal(&all, &[], |pid, _| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !std::fs::read_to_string(&events).is_ok_and(|log| log.contains("\"pruner\"")) {
            assert!(std::time::Instant::now() < deadline, "the pruner started");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        // SAFETY: sends SIGINT to our own child process.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
    });
    let screen = &run.terminal;
    assert_eq!(run.code, Some(130), "{screen}");
    assert!(
        screen.contains("Interrupted: stopping the workflow"),
        "{screen}"
    );
    assert!(screen.contains("■ pruner"), "{screen}");
    // The last frame stays, the cursor comes back after it, then how to continue is said
    // (no error: the run was stopped, not broken).
    let last_frame = screen.rfind("└─ · save_document    not run");
    assert!(last_frame.is_some(), "{screen:?}");
    let shown = screen.rfind(SHOW_CURSOR);
    assert!(shown > last_frame, "{screen:?}");
    let after = &screen[shown.unwrap_or_default()..];
    assert!(
        after.contains("was interrupted; its state and checkpoints are kept"),
        "{after:?}"
    );
    assert!(
        after
            .trim_end()
            .lines()
            .last()
            .is_some_and(|l| l.trim_start().starts_with("rlm flow resume refine-")),
        "{after:?}"
    );
    assert!(!after.contains("error:"), "{after:?}");
    let state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&state).expect("state kept")).expect("JSON");
    assert_eq!(state["template"], json!("T"));
    let log = read_events(&events);
    assert_eq!(ended(&log, "pruner"), ["cancelled"]);
}

/// The scripted models of `rlm flow demo team`: dev and tea disagree until the router asks a
/// human.
pub(crate) const TEAM_SCRIPT: &str = include_str!("../../kernel/cli/src/flow/demo/team.json");

/// On a terminal the run's id (which `resume`, `history` and `decisions` need) is said above
/// the live tree, never covered by its redrawing, and a run that stops to ask a human ends
/// drawn as waiting, not done (issue 23 §5).
#[test]
fn on_a_terminal_the_run_id_stays_above_the_tree_and_a_run_asking_a_human_is_drawn_waiting() {
    let mock = Mock::start(serde_json::from_str(TEAM_SCRIPT).expect("JSON"));
    let mut all = args(&["flow", "run", "team", "--base-url", &mock.url()]);
    all.extend(args(&[
        "--model",
        "demo-model",
        "--input",
        "request=CSV export",
    ]));
    let run = rlm_on_terminal(&all, &[], |_, _| {});
    let screen = &run.terminal;
    assert_eq!(run.code, Some(5), "{screen}");
    assert!(
        run.stdout.contains("is waiting for a human"),
        "{}",
        run.stdout
    );
    // The id comes before the tree's first frame: the cursor only ever moves up over the
    // tree's own lines, so the id stays on screen.
    let id = screen.find("run `team-");
    assert!(id.is_some(), "{screen:?}");
    assert!(id < screen.find(HIDE_CURSOR), "{screen:?}");
    assert!(id < screen.find("· analyst"), "{screen:?}");
    // The last frame draws the root waiting for the answer, not done.
    let shown = screen.rfind(SHOW_CURSOR);
    assert!(shown.is_some(), "{screen:?}");
    let frames = &screen[..shown.unwrap_or_default()];
    let root = frames.rfind("⏸ team ");
    assert!(root.is_some(), "{screen:?}");
    assert!(frames.rfind("✓ team ") < root, "{screen:?}");
    let line = frames[root.unwrap_or_default()..]
        .lines()
        .next()
        .unwrap_or_default();
    assert!(
        line.contains("waiting") && line.contains("for a human's answer"),
        "{line:?}"
    );
}

#[test]
fn typed_inputs_reach_the_state_as_json_and_bad_json_runs_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mock = Mock::start(refine_script(false));
    let list = file(dir.path(), "list.json", "[\"north\", \"south\"]\n");
    let run = run_flow(
        &mock,
        "openai",
        dir.path(),
        &[
            "refine".into(),
            "--input".into(),
            "template=# Report".into(),
            "--input".into(),
            "reviewed_summary=3".into(),
            "--input".into(),
            "rounds:=3".into(),
            "--input".into(),
            "show_state:=false".into(),
            "--input".into(),
            "limits:={\"usd\": 0.5, \"tags\": [\"q3\"]}".into(),
            "--input".into(),
            format!("regions:=@{}", list.display()),
        ],
    );
    run.assert_code(0);
    let state: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("state.json")).expect("state written"),
    )
    .expect("JSON");
    assert_eq!(state["reviewed_summary"], json!("3"));
    assert_eq!(state["rounds"], json!(3));
    assert_eq!(state["show_state"], json!(false));
    assert_eq!(state["limits"], json!({"usd": 0.5, "tags": ["q3"]}));
    assert_eq!(state["regions"], json!(["north", "south"]));

    let bad = run_flow(
        &mock,
        "openai",
        dir.path(),
        &args(&["refine", "--input", "rounds:=three"]),
    );
    bad.assert_code(2);
    assert!(
        bad.stderr
            .contains("The value of `rounds` in `--input rounds:=three` is not JSON"),
        "{}",
        bad.stderr
    );
    assert_eq!(mock.log().len(), 8, "the bad run called no model");
}

/// A hostile workflow file — 100 KB of nested brackets, which the YAML scanner alone took
/// seconds to refuse — is refused at once, naming the file, the place and the limit.
#[test]
fn a_deeply_nested_workflow_file_is_refused_naming_the_file_and_the_limit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hostile = file(
        dir.path(),
        "hostile.yaml",
        &format!(
            "name: hostile\nagent_class: LlmAgent\ninstruction: {}\n",
            "[".repeat(100_000)
        ),
    );
    let run = rlm(
        &args(&["flow", "graph", hostile.to_str().expect("utf-8")]),
        None,
    );
    assert_ne!(run.code, Some(0), "{}", run.stderr);
    assert!(
        run.stderr.contains(&format!(
            "{}:3:78: Brackets nest more than 64 levels deep here",
            hostile.display()
        )) && run
            .stderr
            .contains("a YAML file may nest at most 64 levels"),
        "{}",
        run.stderr
    );
}
