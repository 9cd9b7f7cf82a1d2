//! `rlm eval`: scripted runs are exact at every size, a sweep of depths scores a relation task
//! by depth, real-endpoint runs are scored and their failures counted, outputs are never
//! replaced without `--force`, bad options are usage errors.

use serde_json::{Value, json};

use crate::support::{Mock, rlm};

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

fn rows(doc: &Value) -> &Vec<Value> {
    doc["summary"].as_array().expect("summary rows")
}

#[test]
fn scripted_eval_is_exact_at_8k_and_1m_tokens() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("runs");
    let plot = dir.path().join("eval.svg");
    let run = rlm(
        &args(&[
            "eval",
            "--scripted",
            "--sizes",
            "8k,1m",
            "--n",
            "1",
            "--baseline-window",
            "4k",
            "--json",
            "--out",
            out.to_str().expect("utf-8"),
            "--plot",
            plot.to_str().expect("utf-8"),
        ]),
        None,
    );
    run.assert_code(0);
    assert!(
        run.stderr.contains("the models are SCRIPTED"),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("every scripted run scored 1"),
        "{}",
        run.stderr
    );
    let doc = run.json();
    assert_eq!(doc["scripted"], true);
    let runs = doc["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 12, "3 tasks × 2 sizes × (RLM + baseline)");
    for r in runs.iter().filter(|r| r["method"] == "rlm") {
        assert_eq!(
            (&r["score"], &r["exact"]),
            (&json!(1.0), &json!(true)),
            "{r}"
        );
        assert_eq!(r["outcome"], "final_answer", "{r}");
        assert_eq!(r["iterations"], 2, "{r}");
        let size = r["size_tokens"].as_u64().expect("size");
        let context = r["context_tokens"].as_u64().expect("context tokens");
        assert!(context >= size && context < size + 200, "{r}");
        // At 1m tokens the fan-out takes dozens of sub-calls (100 000 characters a chunk).
        let sub_calls = r["sub_calls"].as_u64().expect("sub-calls");
        assert!(sub_calls >= (size * 4).div_ceil(100_000), "{r}");
        let trajectory = r["trajectory"].as_str().expect("trajectory path");
        let lines = std::fs::read_to_string(trajectory).expect("trajectory written");
        assert!(lines.contains("llm_query_batched"), "{trajectory}");
    }
    // The scripted base model only sees the first 4k tokens: it cannot count the messages.
    let base: Vec<&Value> = rows(&doc)
        .iter()
        .filter(|r| r["method"] == "base")
        .collect();
    assert_eq!(base.len(), 6);
    for row in base.iter().filter(|r| r["task"] != "needle") {
        assert_eq!(row["score"], 0.0, "{row}");
    }
    let results: Value = serde_json::from_str(
        &std::fs::read_to_string(out.join("results.json")).expect("results.json"),
    )
    .expect("JSON");
    assert_eq!(results["summary"], doc["summary"]);
    let svg = std::fs::read_to_string(&plot).expect("plot written");
    assert!(
        svg.starts_with("<svg") && svg.contains("SCRIPTED"),
        "{svg:.200}"
    );
    assert!(svg.contains("needle · rlm") && svg.contains("pairs · base"));
    assert!(!svg.contains("href"), "no external assets");
}

#[test]
fn the_table_names_the_scripted_models_and_every_task_and_size() {
    let run = rlm(
        &args(&[
            "eval",
            "--scripted",
            "--sizes",
            "2k,4k",
            "--n",
            "2",
            "--tasks",
            "pairs,needle",
            // The sub-model must find the asked key's fact among two decoys.
            "--needles",
            "3",
        ]),
        None,
    );
    run.assert_code(0);
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(
        lines[0],
        "models: SCRIPTED (mock LM server, no real language model)"
    );
    assert!(
        lines[1].starts_with("task    size  method  depth  runs  score  exact  calls  children  tokens/run  USD  p50 s  p95 s  iters  sub-calls  failures"),
        "{}",
        run.stdout
    );
    let order: Vec<(&str, &str)> = lines[2..]
        .iter()
        .map(|l| {
            let mut cells = l.split_whitespace();
            (cells.next().unwrap_or(""), cells.next().unwrap_or(""))
        })
        .collect();
    assert_eq!(
        order,
        [
            ("pairs", "2k"),
            ("pairs", "4k"),
            ("needle", "2k"),
            ("needle", "4k")
        ]
    );
    for line in &lines[2..] {
        let cells: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(cells[2..7], ["rlm", "1", "2", "1.000", "2/2"], "{line}");
        assert!(line.ends_with(" -"), "no failures: {line}");
    }
}

/// `--depths 1,2` over `linked` (pairs of users whose messages meet on a date) and `pairs`:
/// every instance runs once per depth; the scripted root hands shares of the dates to
/// `rlm_query` children, so `linked` is exact from depth 2 on and scores 0 at depth 1, where
/// each share is one sub-call (answered `unknown`, or refused when it does not fit the
/// sub-model's 32k window). The table has a row per depth with its calls, children and cost.
#[test]
fn a_sweep_of_depths_scores_a_relation_task_per_depth() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("runs");
    let plot = dir.path().join("depths.svg");
    let run = rlm(
        &args(&[
            "eval",
            "--scripted",
            "--tasks",
            "linked,pairs",
            "--sizes",
            "8k,160k",
            "--n",
            "1",
            "--depths",
            "2,1",
            "--price",
            "1:2",
            "--json",
            "--out",
            out.to_str().expect("utf-8"),
            "--plot",
            plot.to_str().expect("utf-8"),
        ]),
        None,
    );
    run.assert_code(0);
    assert!(
        run.stderr
            .contains("every scripted run scored as its script says"),
        "{}",
        run.stderr
    );
    let doc = run.json();
    assert_eq!(doc["depths"], json!([1, 2]));
    let runs = doc["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 8, "2 tasks × 2 sizes × 2 depths");
    let summary = rows(&doc);
    let keys: Vec<(&str, u64, u64)> = summary
        .iter()
        .map(|r| {
            (
                r["task"].as_str().unwrap_or_default(),
                r["size_tokens"].as_u64().unwrap_or_default(),
                r["depth"].as_u64().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        keys,
        [
            ("linked", 8_000, 1),
            ("linked", 8_000, 2),
            ("linked", 160_000, 1),
            ("linked", 160_000, 2),
            ("pairs", 8_000, 1),
            ("pairs", 8_000, 2),
            ("pairs", 160_000, 1),
            ("pairs", 160_000, 2),
        ]
    );
    let number =
        |row: &Value, key: &str| row[key].as_f64().unwrap_or_else(|| panic!("{key}: {row}"));
    for pair in summary.chunks(2) {
        let (flat, deep) = (&pair[0], &pair[1]);
        if flat["task"] == "linked" {
            // One sub-call per share of the dates at depth 1; four children, each two
            // iterations and its own labelling sub-calls, at depth 2.
            assert_eq!((number(flat, "score"), number(deep, "score")), (0.0, 1.0));
            assert_eq!(
                (number(flat, "child_runs"), number(deep, "child_runs")),
                (0.0, 4.0)
            );
            assert!(number(deep, "model_calls") >= 2.0 + 4.0 * 3.0, "{deep}");
            assert!(
                number(deep, "cost_usd") > number(flat, "cost_usd"),
                "{pair:?}"
            );
        } else {
            // `pairs` needs no relation between records: depth changes nothing.
            assert_eq!((number(flat, "score"), number(deep, "score")), (1.0, 1.0));
            assert_eq!(number(deep, "child_runs"), 0.0);
            assert_eq!(number(flat, "model_calls"), number(deep, "model_calls"));
        }
    }
    // At 8k a share fits the window and is answered in one reply; at 160k (shares of ~40k
    // tokens) the context-window check refuses it before sending.
    let linked_8k = &summary[0];
    assert_eq!(number(linked_8k, "model_calls"), 2.0 + 4.0);
    let linked_160k = &summary[2];
    assert_eq!(number(linked_160k, "model_calls"), 2.0);
    let refused =
        std::fs::read_to_string(out.join("linked-160k-d1-000.jsonl")).expect("trajectory");
    assert!(
        refused.contains("does not fit `scripted-sub`'s 32k window (as the server lists it)"),
        "{refused:.2000}"
    );
    let deep = std::fs::read_to_string(out.join("linked-8k-d2-000.jsonl")).expect("trajectory");
    assert!(
        deep.contains("\"children\""),
        "the tree is in the trajectory"
    );
    let svg = std::fs::read_to_string(&plot).expect("plot written");
    for line in [
        "linked · rlm depth 1",
        "linked · rlm depth 2",
        "pairs · rlm depth 2",
    ] {
        assert!(svg.contains(line), "a line per task and depth: {line}");
    }
    for r in runs {
        let depth = r["depth"].as_u64().expect("a depth");
        let stem = format!(
            "{}-{}-d{depth}-000.jsonl",
            r["task"].as_str().expect("task"),
            if r["size_tokens"] == 8_000 {
                "8k"
            } else {
                "160k"
            }
        );
        assert_eq!(
            r["trajectory"],
            out.join(&stem).to_str().expect("utf-8"),
            "{r}"
        );
    }
}

/// A root model that never finishes: every run stops at the iteration limit, and the baseline
/// gets the same reply.
#[test]
fn real_endpoint_runs_are_scored_priced_and_failures_counted() {
    let mock = Mock::start(json!({"models": {"*": {"replies": ["I am still thinking."]}}}));
    let run = rlm(
        &args(&[
            "eval",
            "--base-url",
            &mock.url(),
            "--model",
            "root-model",
            "--tasks",
            "needle",
            "--sizes",
            "1k",
            "--n",
            "3",
            "--max-iterations",
            "1",
            "--baseline-window",
            "500",
            "--price",
            "1:2",
            "--json",
        ]),
        None,
    );
    run.assert_code(0);
    assert!(!run.stderr.contains("SCRIPTED"), "{}", run.stderr);
    let doc = run.json();
    assert_eq!(doc["scripted"], false);
    assert_eq!(doc["models"]["root"], "root-model");
    let summary = rows(&doc);
    assert_eq!(summary.len(), 2);
    let (rlm_row, base_row) = (&summary[0], &summary[1]);
    assert_eq!(rlm_row["method"], "rlm");
    assert_eq!(rlm_row["score"], 0.0);
    assert_eq!(rlm_row["failures"], json!({"max_iterations": 3}));
    assert!(
        rlm_row["cost_usd"].as_f64().expect("priced") > 0.0,
        "{rlm_row}"
    );
    assert_eq!(base_row["method"], "base");
    assert_eq!(base_row["failures"], json!({}));
    assert_eq!(base_row["iterations"], 1.0);
    // The baseline prompt holds the first 500 tokens of the 1000-token context and says so.
    let base_prompts: Vec<String> = mock
        .log()
        .entries()
        .into_iter()
        .map(|r| r.last_user)
        .filter(|text| text.starts_with("The document"))
        .collect();
    assert_eq!(base_prompts.len(), 3);
    assert!(base_prompts[0].contains("of its 10"), "{}", base_prompts[0]);
    assert!(base_prompts[0].contains("tokens; the rest did not fit):\n<document>\n"));
    let runs = doc["runs"].as_array().expect("runs");
    let prompt_tokens: Vec<u64> = runs
        .iter()
        .filter(|r| r["method"] == "base")
        .map(|r| r["prompt_tokens"].as_u64().expect("tokens"))
        .collect();
    assert_eq!(prompt_tokens.len(), 3);
    assert!(
        prompt_tokens.iter().all(|t| (500..800).contains(t)),
        "{prompt_tokens:?}"
    );
}

#[test]
fn outputs_are_kept_unless_forced() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("runs");
    let eval = |extra: &[&str]| {
        let mut list = args(&[
            "eval",
            "--scripted",
            "--tasks",
            "needle",
            "--sizes",
            "1k",
            "--n",
            "1",
            "--out",
        ]);
        list.push(out.to_str().expect("utf-8").to_owned());
        list.extend(args(extra));
        rlm(&list, None)
    };
    eval(&[]).assert_code(0);
    let trajectory = out.join("needle-1k-000.jsonl");
    let before = std::fs::read_to_string(&trajectory).expect("trajectory");
    let again = eval(&[]);
    again.assert_code(2);
    assert!(
        again
            .stderr
            .contains("already exists (and 1 more outputs of this evaluation); pass `--force`"),
        "{}",
        again.stderr
    );
    assert_eq!(std::fs::read_to_string(&trajectory).expect("kept"), before);
    eval(&["--force"]).assert_code(0);
}

#[test]
fn bad_options_are_usage_errors() {
    for (list, message) in [
        (vec!["eval"], "pass `--model NAME`"),
        (
            vec!["eval", "--scripted", "--tasks", "needle,haystack"],
            "Unknown task `haystack`",
        ),
        (
            vec!["eval", "--scripted", "--sizes", "8q"],
            "`8q` is not a context size",
        ),
        (vec!["eval", "--scripted", "--n", "0"], "--n"),
        (
            vec!["eval", "--scripted", "--model", "m"],
            "cannot be used with",
        ),
        (
            vec!["eval", "--scripted", "--trajectory", "t.jsonl"],
            "pass `--out DIR`",
        ),
    ] {
        let run = rlm(&args(&list), None);
        run.assert_code(2);
        assert!(run.stderr.contains(message), "{list:?}: {}", run.stderr);
    }
}

#[test]
fn json_reports_an_eval_that_fails_before_it_starts() {
    let usage = rlm(&args(&["eval", "--json"]), None);
    usage.assert_code(2);
    let error = &usage.json()["error"];
    assert!(
        error["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("No model given; pass `--model NAME`")),
        "{error}"
    );
    assert_eq!(error["usage_error"], true);
    assert_eq!(error["exit_code"], 2);

    let failed = rlm(
        &args(&[
            "eval",
            "--json",
            "--scripted",
            "--tasks",
            "needle",
            "--sizes",
            "8k",
            "--n",
            "1",
            "--out",
            "/dev/null/runs",
        ]),
        None,
    );
    failed.assert_code(1);
    let error = &failed.json()["error"];
    assert_eq!(
        error["message"],
        "Could not create the folder `/dev/null/runs`"
    );
    assert_eq!(error["causes"], json!(["Not a directory (os error 20)"]));
    assert_eq!(error["usage_error"], false);
    assert_eq!(error["exit_code"], 1);
}
