//! `rlm run --dry-run`: the exact first request, no model call.

use crate::support::{Mock, file, redacted, rlm, script};

#[test]
fn dry_run_prints_the_first_request_and_calls_no_model() {
    let mock = Mock::start(script(&["FINAL(never)"]));
    let dir = tempfile::tempdir().expect("tempdir");
    let context = file(dir.path(), "c.txt", "four");
    let context = context.to_str().expect("utf-8");
    let run = mock.run(&["--context", context, "--query", "How long?", "--dry-run"]);
    run.assert_code(0);
    assert_eq!(run.stderr, "Dry run: no model was called.\n");
    let user = run
        .stdout
        .split("── user ─────────────\n")
        .nth(1)
        .expect("a user message");
    insta::assert_snapshot!(redacted(user));
    assert!(
        run.stdout.contains("── system ─────────────\n"),
        "{}",
        run.stdout
    );
    assert!(run.stdout.starts_with(&format!(
        "First request to `root-model` at {} (openai):",
        mock.url()
    )));

    let json = mock.run(&[
        "--context",
        context,
        "--query",
        "How long?",
        "--dry-run",
        "--json",
    ]);
    json.assert_code(0);
    let request = json.json();
    assert_eq!(request["model"], "root-model");
    assert_eq!(request["messages"][0]["role"], "system");
    assert_eq!(request["messages"][1]["role"], "user");
    assert_eq!(
        redacted(
            request["messages"][1]["content"]
                .as_str()
                .expect("text")
                .trim_end()
        ),
        redacted(user.trim_end())
    );
    assert_eq!(mock.log().len(), 0, "no model was called");
}

#[test]
fn a_dry_run_needs_no_api_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let context = file(dir.path(), "c.txt", "four");
    let args = [
        "run",
        "--base-url",
        "https://api.example.invalid/v1",
        "--model",
        "big-model",
        "--context",
        context.to_str().expect("utf-8"),
        "--query",
        "How long?",
    ];
    let dry: Vec<String> = args
        .iter()
        .chain(&["--dry-run"])
        .map(|a| a.to_string())
        .collect();
    let run = rlm(&dry, None);
    run.assert_code(0);
    assert!(
        run.stdout.starts_with(
            "First request to `big-model` at https://api.example.invalid/v1 (openai):"
        ),
        "{}",
        run.stdout
    );
    // A real run is still refused before any call, naming the variable.
    let real: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let run = rlm(&real, None);
    run.assert_code(2);
    assert!(
        run.stderr.contains("`OPENAI_API_KEY` is not set"),
        "{}",
        run.stderr
    );
}

#[test]
fn a_dry_run_needs_no_model() {
    let dir = tempfile::tempdir().expect("tempdir");
    let context = file(dir.path(), "c.txt", "four");
    let args = |extra: &[&str]| -> Vec<String> {
        [
            "run",
            "--context",
            context.to_str().expect("utf-8"),
            "--query",
            "How long?",
        ]
        .iter()
        .chain(extra)
        .map(|a| a.to_string())
        .collect()
    };
    let run = rlm(&args(&["--dry-run"]), None);
    run.assert_code(0);
    assert!(
        run.stdout.starts_with(
            "First request to the root model (no `--model` given) at https://api.openai.com/v1 \
             (openai):"
        ),
        "{}",
        run.stdout
    );
    assert!(run.stdout.contains("How long?"), "{}", run.stdout);
    let json = rlm(&args(&["--dry-run", "--json"]), None);
    json.assert_code(0);
    assert_eq!(json.json()["model"], serde_json::Value::Null);
    assert_eq!(json.json()["messages"][1]["role"], "user");
    // A real run still needs one, and says where to give it.
    let run = rlm(&args(&[]), None);
    run.assert_code(2);
    assert!(
        run.stderr
            .contains("No root model given; pass `--model NAME`"),
        "{}",
        run.stderr
    );
}
