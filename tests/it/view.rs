//! `rlm view`: a run's trajectory as one self-contained HTML page.

use crate::support::{Mock, file, repl, rlm, script};

#[test]
fn view_renders_a_run_trajectory_next_to_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let context = file(dir.path(), "notes.txt", "alpha beta gamma");
    let trajectory = dir.path().join("run.jsonl");
    let code = repl("words = context.split()\nprint(len(words), '<words>')");
    let mock = Mock::start(script(&[&code, "FINAL(three words)"]));
    mock.run(&[
        "--context",
        context.to_str().expect("utf-8 path"),
        "--query",
        "How many words?",
        "--trajectory",
        trajectory.to_str().expect("utf-8 path"),
    ])
    .assert_code(0);

    let run = rlm(&["view".into(), trajectory.display().to_string()], None);
    run.assert_code(0);
    let html = std::fs::read_to_string(dir.path().join("run.html")).expect("run.html written");
    assert!(html.starts_with("<!DOCTYPE html>"));
    assert!(html.contains("How many words?"));
    assert!(html.contains("three words"));
    assert_eq!(html.matches("<details class=\"rlm-it\">").count(), 2);
    // The block's output is escaped, never markup.
    assert!(html.contains("3 &lt;words&gt;"));
    assert!(!html.contains("src=\""), "no external assets");
    // The `reply` and `block` lines before each iteration are read, not reported as skipped.
    assert!(!html.contains("Skipped line"), "{html}");
}

/// A run without a price has no cost, not a cost of 0: `null` in the trajectory as in
/// `--json`, and "no price given" in the view; with a price, dollars everywhere.
#[test]
fn a_cost_without_a_price_is_no_price_given_in_the_trajectory_and_the_view() {
    let dir = tempfile::tempdir().expect("tempdir");
    let context = file(dir.path(), "notes.txt", "alpha beta gamma");
    let mock = Mock::start(script(&[&repl("print(llm_query('hi'))"), "FINAL(done)"]));
    for (name, price) in [("free", None), ("priced", Some("1:2"))] {
        let trajectory = dir.path().join(format!("{name}.jsonl"));
        let mut args = vec![
            "--context",
            context.to_str().expect("utf-8 path"),
            "--query",
            "q",
            "--trajectory",
            trajectory.to_str().expect("utf-8 path"),
            "--json",
        ];
        args.extend(price.iter().flat_map(|p| ["--price", *p]));
        let run = mock.run(&args);
        run.assert_code(0);
        let json = run.json();
        let text = std::fs::read_to_string(&trajectory).expect("trajectory");
        let result: serde_json::Value = text
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|l| l["type"] == "result")
            .expect("a result line");
        let metrics = &result["metrics"];
        rlm(&["view".into(), trajectory.display().to_string()], None).assert_code(0);
        let html =
            std::fs::read_to_string(dir.path().join(format!("{name}.html"))).expect("the page");
        if price.is_none() {
            assert!(metrics["cost_usd"].is_null(), "{metrics}");
            assert!(metrics["models"]["root-model"]["cost_usd"].is_null());
            assert!(metrics["models"]["sub-model"]["cost_usd"].is_null());
            assert!(json["metrics"]["cost_usd"].is_null());
            assert!(html.contains("<i>cost</i> no price given"));
            assert!(!html.contains("$0.0000"));
        } else {
            let cost = metrics["cost_usd"].as_f64().expect("a priced run's cost");
            assert!(cost > 0.0, "{metrics}");
            // `--json` rounds dollars to 1e-6.
            let reported = json["metrics"]["cost_usd"]
                .as_f64()
                .expect("a cost in --json");
            assert!((reported - cost).abs() < 1e-6, "{reported} vs {cost}");
            assert!(html.contains(&format!("<i>cost</i> ${cost:.4}")), "{html}");
        }
    }
}

#[test]
fn view_writes_where_asked_and_refuses_to_overwrite_its_input() {
    let dir = tempfile::tempdir().expect("tempdir");
    let jsonl = r#"{"type":"header","version":1,"query":"q"}
{"type":"result","answer":"42","termination_reason":"final_answer","metrics":{}}
"#;
    let trajectory = file(dir.path(), "t.jsonl", jsonl);
    let out = dir.path().join("page.html");
    let path = |p: &std::path::Path| p.display().to_string();
    rlm(
        &["view".into(), path(&trajectory), "-o".into(), path(&out)],
        None,
    )
    .assert_code(0);
    assert!(std::fs::read_to_string(&out).expect("page").contains("42"));

    let same = rlm(
        &[
            "view".into(),
            path(&trajectory),
            "-o".into(),
            path(&trajectory),
        ],
        None,
    );
    same.assert_code(2);
    assert!(
        same.stderr.contains("is the trajectory")
            && same.stderr.contains("would destroy the input"),
        "{}",
        same.stderr
    );
    assert_eq!(
        std::fs::read_to_string(&trajectory).expect("input kept"),
        jsonl
    );

    let junk = file(dir.path(), "junk.txt", "not a trajectory\n");
    let refused = rlm(&["view".into(), path(&junk)], None);
    refused.assert_code(1);
    assert!(
        refused.stderr.contains("holds no trajectory lines"),
        "{}",
        refused.stderr
    );
}
