//! Recursion through the real binary: `rlm_query` children under `--max-depth`, one budget for
//! the tree, the sub-call cache, the context-window check, and the tree in `--json`,
//! `rlm show` and `rlm view`.

use serde_json::{Value, json};

use crate::support::{Mock, file, redacted, repl, rlm};

/// `root-model` replies `root[turn]`; `sub-model` plays a child RLM (recognised by the RLM
/// system prompt) that counts ERROR in its context in two iterations, and answers plain
/// sub-calls `Count WORD in:\nTEXT` by counting.
fn script(root: &[&str]) -> Value {
    json!({"models": {
        "root-model": {"replies": root},
        "sub-model": {"rules": [
            {"system": "recursive language model", "turn": 0,
             "reply": "Counting.\n```repl\nn = str(context).count('ERROR')\nprint(n)\n```"},
            {"system": "recursive language model", "turn": 1, "reply": "FINAL_VAR(n)"},
            {"last_user": "(?s)^Count (?P<word>\\w+) in:\\n(?P<body>.*)$",
             "reply": {"behaviour": "count_word", "word": "{{word}}", "input": "{{body}}"}}
        ], "fallback": {"behaviour": "echo"}}
    }})
}

const CHILDREN: &str = "parts = context.split('|')\nanswers = rlm_query_batched(['How many ERROR?'] * len(parts), parts)\ntotal = sum(int(a) for a in answers)\nprint(len(answers), total)";

fn context(dir: &tempfile::TempDir, parts: &[&str]) -> String {
    file(dir.path(), "ctx.txt", &parts.join("|"))
        .to_str()
        .expect("utf-8")
        .to_owned()
}

#[test]
fn a_depth_two_run_whose_children_each_run_two_iterations_and_the_tree_afterwards() {
    let mock = Mock::start(script(&[&repl(CHILDREN), "FINAL_VAR(total)"]));
    let dir = tempfile::tempdir().expect("tempdir");
    let trajectory = dir.path().join("run.jsonl");
    let run = mock.run(&[
        "--context",
        &context(&dir, &["ERROR x ERROR", "fine", "ERROR"]),
        "--query",
        "How many ERROR?",
        "--max-depth",
        "2",
        "--json",
        "--trajectory",
        trajectory.to_str().expect("utf-8"),
    ]);
    run.assert_code(0);
    let json = run.json();
    assert_eq!(json["answer"], "3");
    let children = json["iterations"][0]["blocks"][0]["children"]
        .as_array()
        .expect("the tree in --json");
    assert_eq!(children.len(), 3);
    for (child, answer) in children.iter().zip(["2", "0", "1"]) {
        assert_eq!(child["depth"], 1);
        assert_eq!(child["answer"], answer);
        assert_eq!(child["termination_reason"], "final_answer");
        assert_eq!(child["iterations"].as_array().map(Vec::len), Some(2));
    }
    assert_eq!(json["metrics"]["child_runs"], 3);

    let show = rlm(
        &["show".to_owned(), trajectory.to_string_lossy().into_owned()],
        None,
    );
    show.assert_code(0);
    assert!(
        show.stdout.contains("rlm_query children ×3"),
        "{}",
        show.stdout
    );
    assert!(
        show.stdout.contains("#2 sub · 2 iterations"),
        "{}",
        show.stdout
    );

    let html = dir.path().join("run.html");
    rlm(
        &[
            "view".to_owned(),
            trajectory.to_string_lossy().into_owned(),
            "-o".to_owned(),
            html.to_string_lossy().into_owned(),
        ],
        None,
    )
    .assert_code(0);
    let page = std::fs::read_to_string(&html).expect("the page");
    assert_eq!(page.matches("<b>Child #").count(), 3, "folded child nodes");
}

#[test]
fn fifty_batched_children_each_answer_for_their_part() {
    let parts: Vec<String> = (0..50).map(|i| "ERROR ".repeat(i % 3)).collect();
    let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
    let expected: usize = (0..50).map(|i| i % 3).sum();
    let mock = Mock::start(script(&[&repl(CHILDREN), "FINAL_VAR(total)"]));
    let dir = tempfile::tempdir().expect("tempdir");
    let run = mock.run(&[
        "--context",
        &context(&dir, &parts),
        "--query",
        "q",
        "--max-depth",
        "2",
        "--isolation",
        "none",
        "--json",
    ]);
    run.assert_code(0);
    let json = run.json();
    assert_eq!(json["answer"], expected.to_string());
    assert_eq!(json["metrics"]["child_runs"], 50);
    let sub_requests = mock
        .log()
        .entries()
        .iter()
        .filter(|r| r.model == "sub-model")
        .count();
    assert_eq!(
        sub_requests, 100,
        "two iterations for each of the 50 children"
    );
}

#[test]
fn the_budget_stops_at_a_child_and_the_run_says_which() {
    let mock = Mock::start(script(&[&repl(CHILDREN), "FINAL_VAR(total)"]));
    let dir = tempfile::tempdir().expect("tempdir");
    let run = mock.run(&[
        "--context",
        &context(&dir, &["ERROR", "ERROR", "ERROR"]),
        "--query",
        "q",
        "--max-depth",
        "2",
        "--isolation",
        "none",
        "--max-sub-calls",
        "5",
        "--batch-concurrency",
        "1",
        "--json",
    ]);
    run.assert_code(3);
    let json = run.json();
    assert_eq!(json["termination_reason"], "call_budget");
    let error = json["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("rlm_query child #2 (depth 1, started by iteration 1, block 0)"),
        "{error}"
    );
    // The child the budget stopped gave its parent's code an error: one failed sub-call.
    assert_eq!(json["metrics"]["sub_call_errors"], 1);
    assert!(
        run.stderr
            .contains(", 0 sub-call(s) sent, 1 rlm_query child run(s) gave no answer, "),
        "{}",
        run.stderr
    );
    let sent = mock
        .log()
        .entries()
        .iter()
        .filter(|r| r.model == "sub-model")
        .count();
    assert_eq!(sent, 5, "not one call past the budget");
}

/// A child that the tree's spent budget keeps from starting says so as one the budget stopped
/// while it ran: its node ends for that budget (not as a broken session), its code gets the
/// budget's kind, and its parent stops after the block naming it.
#[test]
fn a_child_the_spent_budget_keeps_from_starting_ends_for_that_budget() {
    let mock = Mock::start(script(&[
        &repl(
            "try:\n    rlm_query_batched(['How many ERROR?'] * 3, ['ERROR'] * 3)\n\
             except LlmQueryError as e:\n    print(e.kind, e.results[2])",
        ),
        "FINAL(never)",
    ]));
    let run = at_depth_two(
        &mock,
        &[
            "--isolation",
            "none",
            "--max-sub-calls",
            "4",
            "--batch-concurrency",
            "1",
            "--sub-call-errors",
            "raise",
        ],
    );
    run.assert_code(3);
    let json = run.json();
    let block = &json["iterations"][0]["blocks"][0];
    assert_eq!(
        block["stdout"],
        "budget_max_calls Error: the rlm_query child run could not run: the tree's budget is \
         spent (calls)\n",
        "{block:#}"
    );
    let refused = &block["children"][2];
    assert_eq!(refused["termination_reason"], "call_budget", "{refused:#}");
    assert_eq!(refused["error"], "the tree's budget is spent (calls)");
    assert_eq!(json["termination_reason"], "call_budget");
    let error = json["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("rlm_query child #2 (depth 1, started by iteration 1, block 0) hit the budget: the tree's budget is spent (calls)"),
        "{error}"
    );
    assert_eq!(json["metrics"]["sub_call_errors"], 1);
    assert_eq!(mock.requests_to("sub-model"), 4, "two children's two calls");
}

#[test]
fn repeated_sub_calls_hit_the_cache_unless_it_is_off() {
    let code = "q = 'Count ERROR in:\\nERROR ERROR'\nr = [llm_query(q) for _ in range(4)] + llm_query_batched([q] * 4)\nprint(r)";
    let dir = tempfile::tempdir().expect("tempdir");
    let ctx = context(&dir, &["x"]);
    for (extra, sent, hits) in [(None, 1, 7), (Some("--no-sub-call-cache"), 8, 0)] {
        let mock = Mock::start(script(&[&repl(code), "FINAL(done)"]));
        let mut args = vec!["--context", &ctx, "--query", "q", "--json"];
        args.extend(extra);
        let run = mock.run(&args);
        run.assert_code(0);
        let json = run.json();
        let to_sub = mock
            .log()
            .entries()
            .iter()
            .filter(|r| r.model == "sub-model")
            .count();
        assert_eq!(to_sub, sent, "{extra:?}");
        assert_eq!(json["metrics"]["sub_call_cache_hits"], hits, "{extra:?}");
        assert_eq!(json["metrics"]["sub_calls_cached"], hits);
        let cached = json["iterations"][0]["sub_calls"]
            .as_array()
            .expect("sub_calls")
            .iter()
            .filter(|c| c["cache"].is_string())
            .count();
        assert_eq!(cached, hits as usize);
        assert!(
            json["iterations"][0]["blocks"][0]["stdout"]
                .as_str()
                .is_some_and(|s| s.starts_with("['2', '2', '2', '2', '2',"))
        );
    }
}

#[test]
fn a_sub_call_too_long_for_the_window_is_refused_with_an_error_the_code_can_act_on() {
    let code = "r = llm_query('Count a in:\\n' + 'a ' * 4000)\nprint(r)";
    let mock = Mock::start(script(&[&repl(code), "FINAL(done)"]));
    let dir = tempfile::tempdir().expect("tempdir");
    let run = mock.run(&[
        "--context",
        &context(&dir, &["x"]),
        "--query",
        "q",
        "--sub-context-window",
        "1000",
        "--json",
    ]);
    run.assert_code(0);
    let json = run.json();
    let stdout = json["iterations"][0]["blocks"][0]["stdout"]
        .as_str()
        .unwrap_or_default();
    assert!(
        stdout.starts_with(
            "Error: Prompt of ~2k tokens does not fit `sub-model`'s 1k window (as configured); split it"
        ),
        "{stdout}"
    );
    assert_eq!(
        json["iterations"][0]["sub_calls"][0]["error_kind"],
        "context_window"
    );
    assert!(
        mock.log().entries().iter().all(|r| r.model != "sub-model"),
        "never sent"
    );
}

#[test]
fn a_child_whose_worker_crashes_is_an_error_the_isolated_parent_survives() {
    let mut script = script(&[
        &repl(
            "answers = rlm_query_batched(['crash please', 'How many ERROR?'], ['x', 'ERROR ERROR'])\nprint(answers)",
        ),
        "FINAL_VAR(answers)",
    ]);
    let rules = script["models"]["sub-model"]["rules"]
        .as_array_mut()
        .expect("rules");
    rules.insert(
        0,
        json!({"system": "recursive language model", "last_user": "crash please",
               "reply": "```repl\nimport ctypes\nctypes.string_at(0)\n```"}),
    );
    let mock = Mock::start(script);
    let run = run_at_depth_two(&mock, &["--max-consecutive-failures", "1"]);
    let json = run.json();
    let answer = json["answer"].as_str().unwrap_or_default();
    assert!(
        answer.starts_with(
            "['Error: the rlm_query child run ended without an answer (consecutive_failures)"
        ) && answer.ends_with(", '2']"),
        "the crashed child is an error, the other answers: {answer}"
    );
    let children = &json["iterations"][0]["blocks"][0]["children"];
    assert_eq!(children[0]["termination_reason"], "consecutive_failures");
    let stderr = children[0]["iterations"][0]["blocks"][0]["stdout"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
        + children[0]["iterations"][0]["blocks"][0]["stderr"]
            .as_str()
            .unwrap_or_default();
    let error = children[0]["iterations"][0]["blocks"][0]["error"].to_string();
    assert!(
        (stderr + &error).contains("SIGSEGV"),
        "the child's block says its worker crashed: {}",
        children[0]
    );
    assert_eq!(children[1]["answer"], "2");
}

/// What each kind of `context` an isolated parent's code can hand to `rlm_query` becomes
/// (the root code, in its worker): the name of the kind, the Python expression.
const CHILD_CONTEXTS: &[(&str, &str)] = &[
    ("empty str", "''"),
    ("str", "'alpha beta gamma'"),
    ("unicode str", "'héllo wörld ✓ 🙂\\nzweite Zeile'"),
    ("utf-8 bytes", "'naïve café'.encode()"),
    ("large str", "'lorem ipsum dolor sit amet ' * 100_000"),
    ("dict", "{'a': [1, 2], 'b': 'x', 'c': None}"),
    ("list", "[1, 'two', {'three': 3}, [4]]"),
    ("tuple", "(1.5, 'x')"),
    ("empty list", "[]"),
    (
        "polars frame",
        "pl.DataFrame({'x': [1, 2, 3], 'y': ['a', 'b', 'c']})",
    ),
    (
        "pandas frame",
        "pd.DataFrame({'x': [1.5, 2.5], 'y': ['a', 'b']})",
    ),
];

/// `root-model` replies `root`, then `FINAL_VAR(answers)`; `sub-model` plays a child that
/// answers its context's type and length.
fn kinds_script(root: &str) -> Value {
    json!({"models": {
        "root-model": {"replies": [repl(root), "FINAL_VAR(answers)"]},
        "sub-model": {"rules": [
            {"system": "recursive language model", "turn": 0,
             "reply": repl("result = f'{type(context).__name__} {len(context)}'")},
            {"system": "recursive language model", "turn": 1, "reply": "FINAL_VAR(result)"}
        ]}
    }})
}

/// `rlm run --max-depth 2 --json` (and `extra`) against `mock`, checked to end with an answer.
fn run_at_depth_two(mock: &Mock, extra: &[&str]) -> crate::support::Run {
    let run = at_depth_two(mock, extra);
    run.assert_code(0);
    run
}

/// `rlm run --max-depth 2 --json` (and `extra`) against `mock`, over a context `x`.
fn at_depth_two(mock: &Mock, extra: &[&str]) -> crate::support::Run {
    let dir = tempfile::tempdir().expect("tempdir");
    let context = context(&dir, &["x"]);
    let mut args = vec![
        "--context",
        &context,
        "--query",
        "q",
        "--max-depth",
        "2",
        "--json",
    ];
    args.extend_from_slice(extra);
    mock.run(&args)
}

#[test]
fn every_kind_of_child_context_is_described_in_the_childs_first_prompt_as_its_worker_loads_it() {
    // An isolated child's first prompt describes its context; rlm describes a text, and a
    // `dict`, `list` or tuple's JSON, itself while the child's worker loads it (the child's
    // first model call does not wait for the worker), and must say exactly what the worker's
    // own description said (a frame waits for it): the snapshot, recorded when every
    // structured context went as a file the worker described, holds each kind's first user
    // message byte for byte, and each child's block checks what its worker loaded.
    let kinds: Vec<String> = CHILD_CONTEXTS
        .iter()
        .map(|(kind, value)| format!("    ({kind:?}, {value}),"))
        .collect();
    let root = format!(
        "import polars as pl, pandas as pd\nkinds = [\n{}\n]\nanswers = [rlm_query(f'kind {{k}}', context=v) for k, v in kinds]",
        kinds.join("\n")
    );
    let mock = Mock::start_with(bridge::mock::MockConfig {
        script: bridge::mock::Script::from_json_value(kinds_script(&root)).expect("valid script"),
        record_requests: true,
        ..bridge::mock::MockConfig::default()
    });
    let run = run_at_depth_two(&mock, &[]);
    assert_eq!(
        run.json()["answer"],
        "['str 0', 'str 16', 'str 28', 'str 10', 'str 2700000', 'dict 3', 'list 4', 'list 2', \
         'list 0', 'DataFrame 3', 'DataFrame 2']",
        "{}",
        run.stderr
    );
    let firsts: Vec<String> = mock
        .log()
        .entries()
        .iter()
        .filter(|r| r.model == "sub-model")
        .filter_map(|r| serde_json::from_str::<Value>(r.body.as_deref()?).ok())
        .filter(|body| body["messages"].as_array().is_some_and(|m| m.len() == 2))
        .map(|body| {
            body["messages"][1]["content"]
                .as_str()
                .unwrap_or("")
                .to_owned()
        })
        .collect();
    assert_eq!(firsts.len(), CHILD_CONTEXTS.len(), "{firsts:#?}");
    // A structured context is named as a file of the parent worker's scratch directory, with
    // that worker's pid; a Parquet file's size is its writer's (the installed polars').
    let scratch = regex::Regex::new(r"`[^`]*/rlm-child-context-\d+-(\d+)\.(\w+)`").expect("regex");
    let parquet =
        regex::Regex::new(r"\d+ bytes on disk(\), from `[^`]*\.parquet`)").expect("regex");
    let shown: Vec<String> = firsts
        .iter()
        .map(|m| {
            let m = scratch.replace_all(m, "`[scratch]/rlm-child-context-[pid]-$1.$2`");
            parquet.replace_all(&m, "[n] bytes on disk$1").into_owned()
        })
        .collect();
    insta::assert_snapshot!(shown.join("\n\n----------\n\n"));
}

#[test]
fn a_childs_context_its_parents_code_tampered_with_is_a_clear_error_for_that_child_alone() {
    // The parent's code runs in its worker, which serialises a child's `dict`, `list` or
    // frame: what reaches the child's worker (in a sealed memfd, through rlm) is whatever that
    // code made it. Cut JSON, JSON nested past Python's limit and a cut Parquet file fail
    // that child with an error that names the context; JSON only Python accepts (`NaN`)
    // loads; the parent and its other children go on.
    let root = "import json, polars as pl\n\
        good = rlm_query('good', context={'a': 1})\n\
        json.dumps = lambda *a, **k: '{\"a\": [1, 2'\n\
        cut = rlm_query('cut json', context={'a': 1})\n\
        json.dumps = lambda *a, **k: '[' * 100_000 + ']' * 100_000\n\
        deep = rlm_query('deep json', context=[1])\n\
        json.dumps = lambda *a, **k: '{\"x\": NaN}'\n\
        nan = rlm_query('nan json', context={'x': 1})\n\
        pl.DataFrame.write_parquet = lambda self, f, *a, **k: f.write(b'PAR1 cut short')\n\
        frame = rlm_query('cut parquet', context=pl.DataFrame({'x': [1]}))\n\
        answers = [good, cut, deep, nan, frame]";
    let mock = Mock::start(kinds_script(root));
    let run = run_at_depth_two(&mock, &[]);
    let children = &run.json()["iterations"][0]["blocks"][0]["children"];
    let answers: Vec<String> = (0..5)
        .map(|i| {
            children[i]["answer"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    let errors: Vec<String> = (0..5).map(|i| children[i].to_string()).collect();
    assert_eq!(answers[0], "dict 1", "{}", errors[0]);
    assert_eq!(answers[3], "dict 1", "{}", errors[3]);
    for (i, format) in [
        (1, "is not valid JSON"),
        (2, "is not valid JSON"),
        (4, "is not valid Parquet"),
    ] {
        assert!(
            errors[i].contains(format)
                && errors[i].contains("rlm-child-context-")
                && errors[i].contains("handed to `rlm_query`"),
            "child {i}: {}",
            errors[i]
        );
    }
    assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
}

/// A mock whose `root-model` runs `code`, then answers `done`, and whose children (played by
/// `sub-model`, as in [`script`]) fail on their prompt: `model fails` gets a garbled reply
/// from its model (twice: the retry too), `code fails` writes a block that raises, `crash
/// please` one that crashes its worker.
fn failing_children_mock(code: &str) -> Mock {
    let mut script = script(&[&repl(code), "FINAL(done)"]);
    let rules = script["models"]["sub-model"]["rules"]
        .as_array_mut()
        .expect("rules");
    for (prompt, code) in [
        ("code fails", "1 / 0"),
        ("crash please", "import ctypes\nctypes.string_at(0)"),
    ] {
        rules.insert(
            0,
            json!({"system": "recursive language model", "last_user": prompt,
                   "reply": repl(code)}),
        );
    }
    let mut garbled =
        bridge::mock::FaultRule::matching("model fails", bridge::mock::FaultKind::MalformedJson);
    garbled.model = Some("sub-model".to_owned());
    Mock::start_with(bridge::mock::MockConfig {
        script: bridge::mock::Script::from_json_value(script).expect("script"),
        faults: bridge::mock::Faults::none().with_rule(garbled),
        ..bridge::mock::MockConfig::default()
    })
}

/// Every `rlm_query` child that gives its parent's code an error instead of an answer counts
/// in the parent's `sub_call_errors`, whatever ended it: its model call failed, its blocks
/// failed, its model name has no endpoint (it never started), its worker crashed (isolated
/// only: in-process the crash would end `rlm`). Each node says why; the closing line of
/// `rlm run` and of `rlm show` adds up to the same count, saying how many were children.
#[test]
fn each_child_that_gives_no_answer_counts_as_a_failed_sub_call_and_its_node_says_why() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ctx = context(&dir, &["x"]);
    for (isolation, crash) in [("process", true), ("none", false)] {
        let prompts = if crash {
            "['fine', 'model fails', 'code fails', 'crash please']"
        } else {
            "['fine', 'model fails', 'code fails']"
        };
        let mock = failing_children_mock(&format!(
            "answers = rlm_query_batched({prompts}, ['ERROR'] * len({prompts}))\n\
             lost = rlm_query('who?', model='nope')\n\
             print([a[:6] for a in answers], lost[:6])"
        ));
        let trajectory = dir.path().join(format!("{isolation}.jsonl"));
        let run = mock.run(&[
            "--context",
            &ctx,
            "--query",
            "q",
            "--max-depth",
            "2",
            "--max-consecutive-failures",
            "1",
            "--isolation",
            isolation,
            "--trajectory",
            trajectory.to_str().expect("utf-8"),
            "--json",
        ]);
        run.assert_code(0);
        let json = run.json();
        let block = &json["iterations"][0]["blocks"][0];
        let failed = if crash { 4 } else { 3 };
        let errors = vec!["Error:"; failed - 1].join("', '");
        assert_eq!(
            block["stdout"],
            format!("['1', '{errors}'] Error:\n"),
            "{isolation}: {block:#}"
        );
        assert_eq!(json["metrics"]["sub_call_errors"], failed, "{isolation}");
        assert_eq!(json["metrics"]["sub_calls"], 0, "{isolation}");

        let children = block["children"].as_array().expect("the tree");
        let why: Vec<(&str, &str)> = children
            .iter()
            .map(|child| {
                (
                    child["termination_reason"].as_str().unwrap_or_default(),
                    child["error"].as_str().unwrap_or_default(),
                )
            })
            .collect();
        assert_eq!(why[0], ("final_answer", ""), "{isolation}: {why:?}");
        assert_eq!(why[1].0, "root_model_error", "{isolation}: {why:?}");
        assert!(why[1].1.contains("answered badly"), "{isolation}: {why:?}");
        assert_eq!(why[2].0, "consecutive_failures", "{isolation}: {why:?}");
        assert!(
            why[2].1.contains("ZeroDivisionError"),
            "{isolation}: {why:?}"
        );
        if crash {
            assert_eq!(why[3].0, "consecutive_failures", "{isolation}: {why:?}");
        }
        let lost = why.last().expect("the child with no endpoint");
        assert_eq!(lost.0, "root_model_error", "{isolation}: {why:?}");
        assert!(lost.1.contains("`nope`"), "{isolation}: {why:?}");

        let closing = format!(
            "final answer after 2 iteration(s), 0 sub-call(s) sent, {failed} rlm_query child \
             run(s) gave no answer, "
        );
        assert!(run.stderr.contains(&closing), "{isolation}: {}", run.stderr);
        let show = rlm(
            &["show".to_owned(), trajectory.to_string_lossy().into_owned()],
            None,
        );
        show.assert_code(0);
        assert!(
            show.stdout.contains(&closing),
            "{isolation}: {}",
            show.stdout
        );
    }
}

/// A block whose worker crashed after its children failed still counts them: the worker's
/// count ended with it, and the parent's (which sent the children's answers) stands in.
#[test]
fn a_block_whose_worker_crashed_counts_the_children_that_gave_its_code_an_error() {
    let mock = failing_children_mock(
        "answers = rlm_query_batched(['fine', 'model fails'], ['ERROR', 'x'])\n\
         lost = rlm_query('who?', model='nope')\n\
         import ctypes\n\
         ctypes.CDLL(None).abort()",
    );
    let json = run_at_depth_two(&mock, &["--isolation", "process"]).json();
    let block = &json["iterations"][0]["blocks"][0];
    assert_eq!(block["restart"]["cause"]["kind"], "crashed", "{block:#}");
    let answered: Vec<bool> = block["children"]
        .as_array()
        .expect("the tree")
        .iter()
        .map(|child| child["answer"].is_string())
        .collect();
    assert_eq!(answered, [true, false, false], "{block:#}");
    assert_eq!(
        json["metrics"]["sub_call_errors"], 2,
        "{:#}",
        json["metrics"]
    );
}

/// The live trace (`rlm run --trace`) shows the `rlm_query` children a block started, as `rlm
/// show` shows them from the trajectory: the block's record is complete when the trace prints
/// it, so its sub-call line also says which of its errors were children that gave no answer.
#[test]
fn the_live_trace_shows_the_children_a_block_started_as_rlm_show_does() {
    let mock = failing_children_mock(
        "answers = rlm_query_batched(['fine', 'code fails'], ['ERROR', 'x'])\n\
         print([a[:6] for a in answers])",
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let trajectory = dir.path().join("run.jsonl");
    let run = mock.run(&[
        "--context",
        &context(&dir, &["x"]),
        "--query",
        "q",
        "--max-depth",
        "2",
        "--max-consecutive-failures",
        "1",
        "--trace",
        "--trajectory",
        trajectory.to_str().expect("utf-8"),
    ]);
    run.assert_code(0);
    let live = redacted(&run.stderr);
    for line in [
        "  ├ 0 sub-call(s) sent, 1 rlm_query child run(s) gave no answer · 1 sub-call error(s)\n",
        "  ├ rlm_query children ×2 (their runs, folded: `rlm view` opens them)\n",
        "  │ #0 sub · 2 iterations · [n] tokens → `1`\n",
        "  │ #1 sub · 1 iteration · [n] tokens ✗ stopped: too many failing iterations in a row: \
         `1 iterations in a row had a failing block (last: `ZeroDivis…`\n",
    ] {
        assert!(
            live.contains(line),
            "{line:?} not in the live trace:\n{live}"
        );
    }
    let show = rlm(
        &["show".to_owned(), trajectory.to_string_lossy().into_owned()],
        None,
    );
    show.assert_code(0);
    assert_eq!(
        redacted(&show.stdout),
        live,
        "live and replayed traces are the same"
    );
}
