//! `rlm flow`: the built-in workflows end to end against scripted models over both wire
//! formats (agent order from the event log, the final state), Mermaid graphs, and
//! workflow-file errors.

use serde_json::json;

use crate::support::{Mock, Run, file, rlm};

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

#[test]
fn refine_without_its_inputs_fails_naming_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mock = Mock::start(refine_script(false));
    let run = run_flow(
        &mock,
        "openai",
        dir.path(),
        &args(&["refine", "--input", "template=x"]),
    );
    run.assert_code(1);
    assert!(
        run.stderr.contains("refine needs `reviewed_summary`"),
        "{}",
        run.stderr
    );
    assert!(mock.log().is_empty(), "no model was called");
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
    for wire in [None, Some("--anthropic")] {
        let mut all = args(&["flow", "demo", "refine"]);
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
    let run = rlm(&args(&["flow", "demo", "rlm-completion"]), None);
    run.assert_code(0);
    assert_eq!(run.stdout.trim(), "The notes have 3 lines.");
}
