//! Seeing a run: `rlm run --trace` / `-v`, `rlm show`, the closing summary, logs.

use bridge::mock::{FaultKind, Faults, MockConfig, Script};

use crate::support::{Mock, file, redacted, repl, rlm, rlm_with};

/// A root model that talks, fans out two sub-calls, then answers.
fn talking_script() -> serde_json::Value {
    serde_json::json!({
        "models": {
            "root-model": {"replies": [
                format!("Let me look at the context.\n{}", repl("parts = llm_query_batched(['a', 'b'])\nprint(len(context), parts)")),
                "It has 4 characters.\nFINAL(4 characters)"
            ]},
            "sub-model": {"replies": [{"behaviour": "echo"}]}
        }
    })
}

#[test]
fn trace_prints_the_run_as_it_goes() {
    let mock = Mock::start(talking_script());
    let dir = tempfile::tempdir().expect("tempdir");
    let context = file(dir.path(), "c.txt", "text");
    let context = context.to_str().expect("utf-8");
    let run = mock.run(&["--context", context, "--query", "How long?", "--trace"]);
    run.assert_code(0);
    assert_eq!(run.stdout, "4 characters\n", "the trace stays on stderr");
    insta::assert_snapshot!(redacted(&run.stderr));

    // `-v` shows the same trace (plus logs, none here).
    let verbose = mock.run(&["--context", context, "--query", "How long?", "-v"]);
    verbose.assert_code(0);
    assert_eq!(redacted(&verbose.stderr), redacted(&run.stderr));
    // Without either, only the closing line.
    let plain = mock.run(&["--context", context, "--query", "How long?"]);
    assert_eq!(plain.stderr.lines().count(), 1, "{}", plain.stderr);
    assert!(
        plain
            .stderr
            .starts_with("final answer after 2 iteration(s), 2 sub-call(s) sent, "),
        "{}",
        plain.stderr
    );
}

#[test]
fn show_replays_a_saved_trajectory_with_the_same_renderer() {
    let mock = Mock::start(talking_script());
    let dir = tempfile::tempdir().expect("tempdir");
    let context = file(dir.path(), "c.txt", "text");
    let trajectory = dir.path().join("run.jsonl");
    let run = mock.run(&[
        "--context",
        context.to_str().expect("utf-8"),
        "--query",
        "How long?",
        "--trace",
        "--trajectory",
        trajectory.to_str().expect("utf-8"),
    ]);
    run.assert_code(0);
    let show = rlm(
        &[
            "show".to_owned(),
            trajectory.to_str().expect("utf-8").to_owned(),
        ],
        None,
    );
    show.assert_code(0);
    assert_eq!(show.stderr, "");
    insta::assert_snapshot!(redacted(&show.stdout));
    assert_eq!(
        redacted(&show.stdout),
        redacted(&run.stderr),
        "live and replayed traces are the same"
    );
}

/// The trajectory of a completed run of [`talking_script`] asked `query`, as `run.jsonl` in
/// `dir`, and its text.
fn saved_trajectory(dir: &std::path::Path, query: &str) -> String {
    let mock = Mock::start(talking_script());
    let context = file(dir, "c.txt", "text");
    let trajectory = dir.join("run.jsonl");
    mock.run(&[
        "--context",
        context.to_str().expect("utf-8"),
        "--query",
        query,
        "--trajectory",
        trajectory.to_str().expect("utf-8"),
    ])
    .assert_code(0);
    std::fs::read_to_string(&trajectory).expect("trajectory")
}

#[test]
fn show_reads_a_cut_trajectory_and_refuses_what_is_not_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A run killed after its first iteration leaves the header and that line.
    let text = saved_trajectory(dir.path(), "q");
    let cut: String = text.lines().take(2).map(|l| format!("{l}\n")).collect();
    let cut_path = file(dir.path(), "cut.jsonl", &cut);
    let show = rlm(
        &["show".into(), cut_path.to_str().expect("utf-8").into()],
        None,
    );
    show.assert_code(0);
    assert!(
        show.stdout.ends_with(
            "\n(the trajectory ends here: the run was stopped before it wrote its result)\n"
        ),
        "{}",
        show.stdout
    );

    let not_json = file(
        dir.path(),
        "notes.txt",
        "{\"type\": \"header\"}\nplain words\n",
    );
    let show = rlm(
        &["show".into(), not_json.to_str().expect("utf-8").into()],
        None,
    );
    show.assert_code(1);
    insta::assert_snapshot!(redacted(&show.stderr), @r"
    error: Line 1 of `[tmp]/notes.txt` is not a valid `header` line
      caused by: missing field `version`
    ");
}

/// A run killed while it wrote a line leaves that line cut off: `rlm show` prints what came
/// before it and says so (as `rlm view` does), instead of failing on it.
#[test]
fn show_prints_a_trajectory_whose_last_line_is_cut_off() {
    let dir = tempfile::tempdir().expect("tempdir");
    let text = saved_trajectory(dir.path(), "How long?");
    let lines: Vec<&str> = text.lines().collect();
    let iteration = lines
        .iter()
        .position(|l| l.contains("\"type\":\"iteration\""))
        .expect("an iteration line");
    // The first iteration's record, cut in the middle as a kill mid-write leaves it.
    let record = lines[iteration];
    let mut cut: String = lines[..iteration]
        .iter()
        .map(|l| format!("{l}\n"))
        .collect();
    cut.push_str(&record[..record.len() / 2]);
    let cut_path = file(dir.path(), "cut.jsonl", &cut);
    let show = rlm(&["show".into(), cut_path.display().to_string()], None);
    show.assert_code(0);
    assert!(
        show.stdout.starts_with("query: How long?\n"),
        "{}",
        show.stdout
    );
    assert!(
        show.stdout.contains(&format!(
            "(line {} is cut off: the run was stopped while writing it)",
            iteration + 1
        )),
        "{}",
        show.stdout
    );
    assert!(
        show.stdout.contains("── iteration 1 · root model"),
        "the iteration is shown from its reply line: {}",
        show.stdout
    );
    rlm(&["view".into(), cut_path.display().to_string()], None).assert_code(0);
}

/// An event log is not a trajectory cut short: `rlm show` prints the workflow's steps.
#[test]
fn show_prints_a_workflow_event_log_as_its_steps() {
    let dir = tempfile::tempdir().expect("tempdir");
    let events = dir.path().join("events.jsonl");
    let db = dir.path().join("runs.db");
    let demo = rlm(
        &[
            "flow".into(),
            "demo".into(),
            "refine".into(),
            "--events".into(),
            events.display().to_string(),
            "--db".into(),
            db.display().to_string(),
        ],
        None,
    );
    demo.assert_code(0);
    let show = rlm(&["show".into(), events.display().to_string()], None);
    show.assert_code(0);
    assert!(
        !show.stdout.contains("the trajectory ends here"),
        "{}",
        show.stdout
    );
    let lines: Vec<&str> = show.stdout.lines().collect();
    assert_eq!(lines.first(), Some(&"▶ refine"), "{}", show.stdout);
    assert_eq!(lines.last(), Some(&"■ refine completed"), "{}", show.stdout);
    for expected in [
        "  ▶ refinement_loop",
        "  ↻ refinement_loop iteration 2",
        "      evaluator calls exit_loop({})",
        "      exit_loop → {\"success\":true}",
        "  ■ refinement_loop exited_loop",
    ] {
        assert!(lines.contains(&expected), "{expected}:\n{}", show.stdout);
    }
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("      pruner wrote ") && l.contains("pruned_template")),
        "{}",
        show.stdout
    );
}

#[test]
fn the_closing_line_counts_refused_sub_calls_apart_and_shows_cost_with_a_price() {
    let mock = Mock::start(talking_script());
    let dir = tempfile::tempdir().expect("tempdir");
    let context = file(dir.path(), "c.txt", "text");
    let run = mock.run(&[
        "--context",
        context.to_str().expect("utf-8"),
        "--query",
        "q",
        "--max-sub-calls",
        "1",
        "--price",
        "1:2",
    ]);
    run.assert_code(3);
    insta::assert_snapshot!(redacted(&run.stderr), @r"
    stopped: sub-call budget spent after 1 iteration(s), 1 sub-call(s) sent, 1 refused before sending, [n] tokens, $0.0013, [secs]s
      `--max-sub-calls 1` is spent: a sub-call was refused before sending. Raise it to allow more.
    The run ended without an answer; pass `--trajectory FILE` to keep a record of how far a run gets.
    ");
}

#[test]
fn verbose_shows_retries_and_rust_log_picks_the_filter() {
    let mock = Mock::start_with(MockConfig {
        script: Script::from_json_value(talking_script()).expect("script"),
        faults: Faults::fail_first(1, FaultKind::ServerError),
        ..MockConfig::default()
    });
    let dir = tempfile::tempdir().expect("tempdir");
    let context = file(dir.path(), "c.txt", "text");
    let context = context.to_str().expect("utf-8");
    let quiet = mock.run(&["--context", context, "--query", "q"]);
    quiet.assert_code(0);
    assert!(!quiet.stderr.contains("retrying"), "{}", quiet.stderr);

    let mock = Mock::start_with(MockConfig {
        script: Script::from_json_value(talking_script()).expect("script"),
        faults: Faults::fail_first(1, FaultKind::ServerError),
        ..MockConfig::default()
    });
    let verbose = mock.run(&["--context", context, "--query", "q", "-v"]);
    verbose.assert_code(0);
    let retry = verbose
        .stderr
        .lines()
        .find(|l| l.contains("retrying model call"))
        .unwrap_or_else(|| panic!("no retry log:\n{}", verbose.stderr));
    assert!(
        retry.contains("INFO") && retry.contains("endpoint=root"),
        "{retry}"
    );

    // `RUST_LOG` wins over the default quiet: the same event, without the trace.
    let mock = Mock::start_with(MockConfig {
        script: Script::from_json_value(talking_script()).expect("script"),
        faults: Faults::fail_first(1, FaultKind::ServerError),
        ..MockConfig::default()
    });
    let logged = mock.run_env(
        &["--context", context, "--query", "q"],
        &[("RUST_LOG", "bridge=info")],
    );
    logged.assert_code(0);
    assert!(
        logged.stderr.contains("retrying model call"),
        "{}",
        logged.stderr
    );
    assert!(!logged.stderr.contains("── iteration"), "{}", logged.stderr);
}

#[test]
fn run_help_is_stable() {
    let help = rlm_with(&["run".into(), "--help".into()], None, &[]);
    help.assert_code(0);
    insta::assert_snapshot!(help.stdout);
}

#[test]
fn the_trajectory_keeps_sub_call_texts_cut_so_it_stays_small_for_a_huge_context() {
    let mock = Mock::start(serde_json::json!({
        "models": {
            "root-model": {"replies": [
                repl("r = llm_query('Summarize:\\n' + context)\nprint(len(r))"),
                "FINAL(done)"
            ]},
            "sub-model": {"replies": [{"behaviour": "echo"}]}
        }
    }));
    let dir = tempfile::tempdir().expect("tempdir");
    // 4 MB of context, all of it sent to the sub-model and echoed back.
    let context = file(
        dir.path(),
        "big.txt",
        &"0123456789abcdef".repeat(256 * 1024),
    );
    let trajectory = dir.path().join("t.jsonl");
    let texts = |extra: &[&str]| {
        let mut args = vec![
            "--context",
            context.to_str().expect("utf-8"),
            "--query",
            "q",
            "--force",
            "--trajectory",
            trajectory.to_str().expect("utf-8"),
        ];
        args.extend_from_slice(extra);
        mock.run(&args).assert_code(0);
        let size = std::fs::metadata(&trajectory).expect("trajectory").len();
        assert!(size < 64 * 1024, "the trajectory is {size} bytes");
        let text = std::fs::read_to_string(&trajectory).expect("trajectory");
        let iteration: serde_json::Value = text
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("JSON line"))
            .find(|l| l["type"] == "iteration")
            .expect("an iteration line");
        iteration["blocks"][0]["sub_call_texts"].clone()
    };
    let kept = texts(&[]);
    let prompt = kept[0]["prompt"].as_str().expect("a prompt");
    assert!(
        prompt.starts_with("Summarize:\n0123456789abcdef"),
        "{prompt}"
    );
    assert!(prompt.contains("…[4193715 characters]…"), "{prompt}");
    assert!(prompt.ends_with("abcdef"), "{prompt}");
    assert_eq!(kept[0]["reply"], kept[0]["prompt"], "the echo, cut alike");

    let short = texts(&["--sub-call-text-chars", "10"]);
    assert_eq!(short[0]["prompt"], "Summa…[4194305 characters]…bcdef");
    let none = texts(&["--sub-call-text-chars", "0"]);
    assert!(none.is_null(), "no texts kept: {none}");
}
