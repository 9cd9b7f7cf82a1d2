//! `rlm flow run` limits and usage errors: a token budget and the whole-run timeout stop the
//! run with exit code 3 keeping the state and the event log written so far; `--bundle` on a
//! workflow that plays no persona is refused before any model call; a workflow of Python steps
//! needs no model (a sub-call its code makes says how to name one), one with a model's agent
//! does.

use serde_json::{Value, json};

use crate::flow::{args, ended, read_events, run_flow};
use crate::support::{Mock, file, rlm_in};

/// Every agent of `refine` answers `reply`; the evaluator never calls `exit_loop`.
fn answering(reply: &str) -> Value {
    json!({"models": {"flow-model": {"rules": [{"system": ".", "reply": reply}]}}})
}

fn refine(extra: &[&str]) -> Vec<String> {
    let mut all = args(&[
        "refine",
        "--input",
        "template=# Report",
        "--input",
        "reviewed_summary=Sales grew 4%.",
    ]);
    all.extend(args(extra));
    all
}

fn state(dir: &std::path::Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("state.json")).expect("state kept"))
        .expect("JSON")
}

#[test]
fn a_token_budget_stops_the_run_with_exit_3_and_keeps_state_and_log() {
    for provider in ["openai", "anthropic"] {
        let dir = tempfile::tempdir().expect("tempdir");
        let mock = Mock::start(answering("A reworked document."));
        let run = run_flow(
            &mock,
            provider,
            dir.path(),
            &refine(&["--max-tokens", "600"]),
        );
        run.assert_code(3);
        assert!(run.stderr.contains("budget"), "{provider}: {}", run.stderr);
        // Some calls ran, not the twenty of five full rounds.
        let calls = mock.log().len();
        assert!((1..20).contains(&calls), "{provider}: {calls} model calls");
        assert_eq!(state(dir.path())["template"], json!("# Report"));
        let events = read_events(&dir.path().join("events.jsonl"));
        assert_eq!(ended(&events, "refine"), ["cancelled"], "{provider}");
        assert!(ended(&events, "save_document").is_empty(), "{provider}");
    }
}

#[test]
fn the_whole_run_timeout_stops_the_run_with_exit_3_and_keeps_state_and_log() {
    let mut script = answering("A reworked document.");
    // The pruner's model call hangs far longer than the run may take.
    script["models"]["flow-model"]["latency"] = json!({"kind": "fixed", "ms": 60_000});
    let mock = Mock::start(script);
    let dir = tempfile::tempdir().expect("tempdir");
    // The run's time also pays for starting the confined worker of the first Python step,
    // which took over a second at a load of 17: 5 s leave the hang (60 s) to be what stops it.
    let run = run_flow(&mock, "openai", dir.path(), &refine(&["--timeout", "5"]));
    run.assert_code(3);
    assert!(run.stderr.contains("time"), "{}", run.stderr);
    assert_eq!(state(dir.path())["template"], json!("# Report"));
    let events = read_events(&dir.path().join("events.jsonl"));
    assert_eq!(ended(&events, "refine"), ["cancelled"]);
    assert!(ended(&events, "pruner").len() == 1, "{events:?}");
}

#[test]
fn a_bundle_for_a_workflow_without_a_persona_agent_is_a_usage_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mock = Mock::start(answering("never"));
    let bundle = concat!(env!("CARGO_MANIFEST_DIR"), "/flows/plan-discover/bundle");
    let run = run_flow(&mock, "openai", dir.path(), &refine(&["--bundle", bundle]));
    run.assert_code(2);
    insta::assert_snapshot!(run.stderr.replace(bundle, "[BUNDLE]"));
    assert!(mock.log().is_empty(), "no model was called");
    assert!(!dir.path().join("events.jsonl").exists(), "nothing ran");
}

#[test]
fn json_streams_every_event_of_the_log_on_stdout_and_nothing_else() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mock = Mock::start(answering("A reworked document."));
    let run = run_flow(&mock, "openai", dir.path(), &refine(&["--json"]));
    run.assert_code(0);
    let streamed: Vec<Value> = run
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON event per line"))
        .collect();
    // The stream is the event log, event for event, and no final text follows it.
    assert_eq!(streamed, read_events(&dir.path().join("events.jsonl")));
    assert_eq!(ended(&streamed, "refinement_loop"), ["iteration_limit"]);
    assert!(run.stderr.is_empty(), "{}", run.stderr);
}

#[test]
fn an_agent_at_its_iteration_limit_stops_the_run_with_exit_3_as_in_rlm_agent() {
    let dir = tempfile::tempdir().expect("tempdir");
    crate::support::file(
        dir.path(),
        "tools.py",
        "def lookup(region: str) -> dict:\n    \"\"\"Sales of one region.\n\n    Args:\n        \
         region: The region's name.\n    \"\"\"\n    return {'region': region, 'sales': 42}\n",
    );
    let flow = crate::support::file(
        dir.path(),
        "analyst.yaml",
        "name: analyst\ninstruction: Look the north up.\nmax_iterations: 2\n\
         tools: [{name: tools.py:lookup}]\n",
    );
    // The model calls the tool at every turn and never answers.
    let mock = Mock::start(json!({"models": {"flow-model": {"replies": [
        {"tool_calls": [{"name": "lookup", "arguments": {"region": "north"}}]},
    ]}}}));
    let run = run_flow(&mock, "openai", dir.path(), &[flow.display().to_string()]);
    run.assert_code(3);
    assert!(
        run.stderr.contains("Agent `analyst` stopped at a limit")
            && run.stderr.contains("after 2 iterations"),
        "{}",
        run.stderr
    );
    assert_eq!(
        mock.log().len(),
        2,
        "two model calls, as `max_iterations` says"
    );
}

/// A workflow of Python steps runs without `--model`, in the default worker and from a
/// relative path (its code's folder is readable there); one with a model's agent and no
/// model is a usage error (exit 2) that writes nothing, not even the run database.
#[test]
fn a_workflow_of_python_steps_needs_no_model_but_one_with_a_models_agent_does() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    file(
        d,
        "steps.py",
        "def count(state):\n    n = len(state['words'].split())\n    \
         return {'n': n, '__message__': f'{n} words'}\n",
    );
    file(
        d,
        "count.yaml",
        "agent_class: PythonAgent\nname: count\nfunction: steps.py:count\n",
    );
    file(
        d,
        "say.yaml",
        "name: say\ninstruction: Say how many words there are.\n",
    );
    let sequence = |name: &str, steps: &[&str]| {
        let subs: String = steps
            .iter()
            .map(|s| format!("  - config_path: {s}.yaml\n"))
            .collect();
        format!("agent_class: SequentialAgent\nname: {name}\nsub_agents:\n{subs}")
    };
    file(d, "counting.yaml", &sequence("counting", &["count"]));
    file(d, "talking.yaml", &sequence("talking", &["count", "say"]));

    let run = rlm_in(
        d,
        &args(&["flow", "run", "counting.yaml", "--input", "words=a b c"]),
        None,
    );
    run.assert_code(0);
    assert_eq!(run.stdout.trim(), "3 words", "{}", run.stderr);
    assert!(d.join(".rlm/runs.db").exists(), "the run is recorded");

    let elsewhere = tempfile::tempdir().expect("tempdir");
    let talking = d.join("talking.yaml").display().to_string();
    let run = rlm_in(
        elsewhere.path(),
        &args(&["flow", "run", &talking, "--input", "words=a b"]),
        None,
    );
    run.assert_code(2);
    assert!(
        run.stderr.contains(
            "No root model given; pass `--model NAME` (or set `RLM_MODEL`, or `model` in rlm.toml)"
        ),
        "{}",
        run.stderr
    );
    let written: Vec<_> = std::fs::read_dir(elsewhere.path())
        .expect("readable")
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(written.is_empty(), "written: {written:?}");
}

/// A sub-call from a Python step of a run started without a model says how to name one,
/// in the CLI's words.
#[test]
fn a_sub_call_in_a_run_without_a_model_says_to_give_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    file(
        d,
        "steps.py",
        "def ask(state):\n    return {'__message__': llm_query('hi')}\n",
    );
    file(
        d,
        "ask.yaml",
        "agent_class: PythonAgent\nname: ask\nfunction: steps.py:ask\n",
    );
    let run = rlm_in(d, &args(&["flow", "run", "ask.yaml"]), None);
    run.assert_code(0);
    assert_eq!(
        run.stdout.trim(),
        "Error: No model is configured for this run, so there is no endpoint `sub` to call; \
         name one with `--model NAME` (or set `RLM_MODEL`, or `model` in rlm.toml), and \
         `--sub-model` for a different sub-model",
        "{}",
        run.stderr
    );
}

/// A routed run's Python steps see every write made before them — their own earlier
/// messages, the router's decisions, a callback's writes — in a confined worker as in `rlm`
/// itself, now that the session keeps the state and gets only the writes since it last saw
/// it: each step checks the messages it finds and records how many decisions it saw, and
/// both runs end in the same state.
#[test]
fn routed_python_steps_see_every_earlier_write_with_isolation_on_and_off() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    file(
        d,
        "steps.py",
        "def step(ctx, name, steps):\n    n = ctx.state.get('steps', 0) + 1\n    \
         topics = [m['topic'] for m in ctx.state['messages']]\n    \
         if topics != [f'story-{k}' for k in range(1, n)]:\n        \
         raise AssertionError(f'step {n} saw {topics}')\n    \
         ctx.state['messages'].append({'author': name, 'topic': f'story-{n}'})\n    \
         ctx.state['seen'] = ctx.state.get('seen', []) + [len(ctx.state.get('decisions', []))]\n    \
         ctx.state['steps'] = n\n    if n >= steps:\n        ctx.state['done'] = True\n\n\
         def check(ctx):\n    state = ctx['state']\n    \
         if len(state['messages']) != state.get('steps', 0) or state.get('checked', 0) * 2 + 1 != state.get('steps'):\n        \
         state['mismatch'] = True\n    state['checked'] = state.get('checked', 0) + 1\n",
    );
    for name in ["a", "b"] {
        let callback = if name == "b" {
            "before_agent_callbacks: [{name: steps.py:check}]\n"
        } else {
            ""
        };
        file(
            d,
            &format!("{name}.yaml"),
            &format!(
                "agent_class: PythonAgent\nname: {name}\nfunction: steps.py:step\n\
                 args: {{name: {name}, steps: 30}}\n{callback}"
            ),
        );
    }
    file(
        d,
        "routed.yaml",
        "agent_class: RouterAgent\nname: routed\nmode: active\nstart: a\nmax_steps: 100\n\
         sub_agents:\n  - config_path: a.yaml\n  - config_path: b.yaml\n\
         successors:\n  a: b\n  b:\n    - {when: {key: done, truthy: true}, to: END}\n    - {to: a}\n",
    );
    let mut states = Vec::new();
    for isolation in ["process", "none"] {
        let out = format!("state-{isolation}.json");
        let run = rlm_in(
            d,
            &args(&[
                "flow",
                "run",
                "routed.yaml",
                "--quiet",
                "--input",
                "messages:=[]",
                "--isolation",
                isolation,
                "--state",
                &out,
            ]),
            None,
        );
        run.assert_code(0);
        let state: Value =
            serde_json::from_str(&std::fs::read_to_string(d.join(&out)).expect("state kept"))
                .expect("JSON");
        assert_eq!(state["steps"], json!(30), "{isolation}: {}", run.stderr);
        assert_eq!(state.get("mismatch"), None, "{isolation}: {state}");
        assert_eq!(state["checked"], json!(15), "{isolation}");
        let decisions = state["decisions"].as_array().map_or(0, Vec::len);
        assert_eq!(decisions, 30, "{isolation}");
        // Step n saw the decisions of the n - 1 nodes before it.
        assert_eq!(
            state["seen"],
            json!((0..30).collect::<Vec<_>>()),
            "{isolation}"
        );
        states.push(state);
    }
    let without_times = |state: &Value| {
        let mut state = state.clone();
        if let Some(map) = state.as_object_mut() {
            map.remove("decisions");
        }
        state
    };
    assert_eq!(without_times(&states[0]), without_times(&states[1]));
}
