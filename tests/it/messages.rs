//! Consistent, honest messages: argument errors exit 2 and name the flags users type; closing
//! lines name limits by their flags; `--json` is one clean document, also on failure.

use crate::support::{Mock, file, redacted, repl, rlm, rlm_with, script};

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[test]
fn negative_and_malformed_numbers_are_usage_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let context = file(dir.path(), "c.txt", "text");
    let context = context.to_str().expect("utf-8");
    let mut errors = String::new();
    for (flag, value) in [
        ("--max-iterations", "-1"),
        ("--max-sub-calls", "-5"),
        ("--batch-concurrency", "0"),
        ("--max-tokens", "many"),
        ("--timeout", "-3"),
        ("--max-usd", "-1"),
        ("--price", "2:-1"),
    ] {
        let run = rlm(
            &args(&[
                "run",
                "--base-url",
                "http://127.0.0.1:9/v1",
                "--model",
                "m",
                "--context",
                context,
                "--query",
                "q",
                flag,
                value,
            ]),
            None,
        );
        run.assert_code(2);
        errors.push_str(&format!("$ {flag} {value}\n{}\n", run.stderr.trim_end()));
    }
    insta::assert_snapshot!(errors);
}

#[test]
fn a_remote_server_without_an_api_key_fails_before_any_call() {
    let dir = tempfile::tempdir().expect("tempdir");
    let context = file(dir.path(), "c.txt", "text");
    let base = [
        "run",
        "--model",
        "gpt",
        "--context",
        context.to_str().expect("utf-8"),
        "--query",
        "q",
    ];
    let run = rlm(&args(&base), None);
    run.assert_code(2);
    insta::assert_snapshot!(run.stderr, @"error: `https://api.openai.com/v1` needs an API key and `OPENAI_API_KEY` is not set; export `OPENAI_API_KEY` with your key, or name the variable that holds it with `--api-key-env VAR`");
    let mut anthropic = args(&base);
    anthropic.extend(args(&[
        "--provider",
        "anthropic",
        "--api-key-env",
        "MY_KEY",
    ]));
    let run = rlm(&anthropic, None);
    run.assert_code(2);
    insta::assert_snapshot!(run.stderr, @"error: `https://api.anthropic.com` needs an API key and `MY_KEY` is not set; export `MY_KEY` with your key, or name the variable that holds it with `--api-key-env VAR`");
    let mut bad_url = args(&base);
    bad_url.extend(args(&["--sub-base-url", "localhost:8000/v1"]));
    let run = rlm_with(&bad_url, None, &[("OPENAI_API_KEY", "k")]);
    run.assert_code(2);
    insta::assert_snapshot!(run.stderr, @"error: `--sub-base-url` must start with `http://` or `https://`, got `localhost:8000/v1`");
}

#[test]
fn stops_name_the_flag_that_set_the_limit() {
    let mock = Mock::start(script(&[&repl("print(1)"), "my best guess"]));
    let dir = tempfile::tempdir().expect("tempdir");
    let context = file(dir.path(), "c.txt", "text");
    let run = mock.run(&[
        "--context",
        context.to_str().expect("utf-8"),
        "--query",
        "q",
        "--max-iterations",
        "1",
    ]);
    run.assert_code(3);
    assert_eq!(run.last_line(), "my best guess");
    insta::assert_snapshot!(redacted(&run.stderr), @r"
    stopped at the iteration limit (answer requested) after 1 iteration(s), 0 sub-call(s) sent, [n] tokens, [secs]s
      Reached `--max-iterations` (1); the answer is the model's reply to a last request to answer now. Raise `--max-iterations` to give it more room.
      The answer printed is the best partial answer the run found, not a final one.
    ");
}

#[test]
fn a_protocol_mismatch_is_said_in_the_stop_message() {
    let mock = Mock::start(script(&["FINAL(42)", "FINAL(42)", "FINAL(42)"]));
    let dir = tempfile::tempdir().expect("tempdir");
    let context = file(dir.path(), "c.txt", "text");
    let run = mock.run(&[
        "--context",
        context.to_str().expect("utf-8"),
        "--query",
        "q",
        "--protocol",
        "answer",
        "--max-iterations",
        "2",
    ]);
    run.assert_code(3);
    insta::assert_snapshot!(redacted(&run.stderr), @r"
    stopped at the iteration limit (answer requested) after 2 iteration(s), 0 sub-call(s) sent, [n] tokens, [secs]s
      Reached `--max-iterations` (2); the answer is the model's reply to a last request to answer now. Raise `--max-iterations` to give it more room.
      The model tried to finish 2 time(s) with a `FINAL(...)` line, which `--protocol answer` does not count; pass `--protocol auto` to accept every convention.
      The answer printed is the best partial answer the run found, not a final one.
    ");
}

#[test]
fn json_is_one_clean_document() {
    let mock = Mock::start(script(&[
        &repl("r = llm_query('ping')\nprint(r)"),
        "FINAL(done)",
    ]));
    let dir = tempfile::tempdir().expect("tempdir");
    let context = file(dir.path(), "c.txt", "text");
    let trajectory = dir.path().join("t.jsonl");
    let run = mock.run(&[
        "--context",
        context.to_str().expect("utf-8"),
        "--query",
        "What now?",
        "--json",
        "--trajectory",
        trajectory.to_str().expect("utf-8"),
    ]);
    run.assert_code(0);
    let json = run.json();
    assert_eq!(json["query"], "What now?");
    assert_eq!(json["models"]["root"], "root-model");
    assert_eq!(json["models"]["sub"], "sub-model");
    assert_eq!(json["rlm_version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(json["trajectory"], trajectory.to_str().expect("utf-8"));
    assert!(json["finished_at_ms"].as_u64() >= json["started_at_ms"].as_u64());
    assert!(
        json["metrics"]["cost_usd"].is_null(),
        "no price: cost unknown"
    );
    assert!(json["metrics"]["models"]["sub-model"]["cost_usd"].is_null());
    assert!(
        json.get("sub_calls").is_none(),
        "sub-calls are listed once, per iteration"
    );
    assert!(json["metrics"].get("termination_reason").is_none());
    assert_eq!(json["metrics"]["sub_calls_sent"], 1);
    let total_ms = json["metrics"]["total_ms"].as_f64().expect("a number");
    assert_eq!(
        (total_ms * 10.0).round() / 10.0,
        total_ms,
        "rounded to 0.1 ms"
    );

    let priced = mock.run(&[
        "--context",
        context.to_str().expect("utf-8"),
        "--query",
        "q",
        "--json",
        "--price",
        "1:2",
    ]);
    assert!(priced.json()["metrics"]["cost_usd"].as_f64() > Some(0.0));
}

#[test]
fn json_reports_a_run_that_fails_before_it_starts() {
    let mock = Mock::start(script(&["FINAL(x)"]));
    let run = mock.run(&["--context", "/nonexistent/c.txt", "--query", "q", "--json"]);
    run.assert_code(1);
    let json = run.json();
    assert_eq!(json["error"]["message"], "Could not load the context");
    assert_eq!(json["error"]["exit_code"], 1);
    let run = mock.run(&[
        "--context",
        "/nonexistent/c.txt",
        "--query",
        "q",
        "--json",
        "--max-usd",
        "1",
    ]);
    run.assert_code(2);
    assert_eq!(run.json()["error"]["usage_error"], true);
}

#[test]
fn a_stopped_run_keeps_the_answer_content_set_without_ready() {
    let mock = Mock::start(script(&[&repl(
        "answer['content'] = 'partial: 7 errors so far'\nraise ValueError('boom')",
    )]));
    let dir = tempfile::tempdir().expect("tempdir");
    let context = file(dir.path(), "c.txt", "text");
    let run = mock.run(&[
        "--context",
        context.to_str().expect("utf-8"),
        "--query",
        "q",
        "--max-consecutive-failures",
        "1",
    ]);
    run.assert_code(3);
    assert_eq!(run.stdout, "partial: 7 errors so far\n");
    insta::assert_snapshot!(redacted(&run.stderr), @r"
    stopped: too many failing iterations in a row after 1 iteration(s), 0 sub-call(s) sent, [n] tokens, [secs]s
      1 iterations in a row had a failing block (last: `ValueError`); check the model and the context, or raise `--max-consecutive-failures` (`0` turns the check off).
      The answer printed is the best partial answer the run found, not a final one.
    ");
}

#[test]
fn messages_the_model_sees_name_the_flags_a_user_types() {
    let dir = tempfile::tempdir().expect("tempdir");
    let context = file(dir.path(), "c.txt", "text");
    let run = |replies: &[&str], extra: &[&str]| {
        let mock = Mock::start(script(replies));
        let mut args = vec![
            "--context",
            context.to_str().expect("utf-8"),
            "--query",
            "q",
        ];
        args.extend_from_slice(extra);
        args.push("--json");
        mock.run(&args)
    };
    // The second sub-call is refused: the code gets the reason, which stops the run too.
    let refused = run(
        &[
            &repl("print(llm_query('one'))\nprint(llm_query('two'))"),
            "FINAL(done)",
        ],
        &["--max-sub-calls", "1"],
    );
    refused.assert_code(3);
    let stdout = refused.json()["iterations"][0]["blocks"][0]["stdout"].clone();
    let stdout = stdout.as_str().unwrap_or_default();
    assert!(
        stdout.contains("Raise the budget with `--max-sub-calls` to allow more")
            && !stdout.contains("max_calls"),
        "{stdout}"
    );
    // A block over its time limit: the exception names the flag.
    let stopped = run(
        &[&repl("import time\ntime.sleep(30)"), "FINAL(done)"],
        &["--cell-timeout", "1"],
    );
    stopped.assert_code(0);
    let error = stopped.json()["iterations"][0]["blocks"][0]["error"].clone();
    let message = error["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("or raise `--cell-timeout`") && !message.contains("`cell_timeout`"),
        "{error}"
    );
}
