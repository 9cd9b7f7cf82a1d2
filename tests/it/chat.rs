//! `rlm chat`: follow-up questions over one session, read from standard input.

use crate::agent::start_mock;
use crate::support::{Mock, file, last_user_message, redacted, rlm};

/// A root model that makes `x` when it is missing and reads it when it is there.
fn make_or_use_x() -> serde_json::Value {
    let code = "```repl\ntry:\n    print('x is', x + 1)\nexcept NameError:\n    x = 41\n    print('made x')\n```";
    serde_json::json!({"models": {"root-model": {
        "rules": [
            {"turn": 1, "last_user": "x is (\\d+)", "reply": "FINAL({{1}})"},
            {"turn": 1, "last_user": "made x", "reply": "FINAL(made x)"}
        ],
        "replies": [code]
    }}})
}

fn chat_args(mock: &Mock, rest: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = ["chat", "--base-url", &mock.url(), "--model", "root-model"]
        .map(str::to_owned)
        .to_vec();
    args.extend(rest.iter().map(|s| s.to_string()));
    args
}

#[test]
fn chat_answers_a_follow_up_that_uses_a_variable_of_the_first_question() {
    let mock = start_mock(make_or_use_x());
    let dir = tempfile::tempdir().expect("tempdir");
    let context = file(dir.path(), "c.txt", "text");
    let trajectory = dir.path().join("chat.jsonl");
    let run = rlm(
        &chat_args(
            &mock,
            &[
                "--context",
                context.to_str().expect("utf-8"),
                "--trajectory",
                trajectory.to_str().expect("utf-8"),
            ],
        ),
        Some(b"Make x.\n\n   \nWhat is x + 1?\n"),
    );
    run.assert_code(0);
    assert_eq!(
        run.stdout, "made x\n42\n",
        "one answer per question, blank lines skipped"
    );
    insta::assert_snapshot!(redacted(&run.stderr), @r"
    final answer after 2 iteration(s), 0 sub-call(s) sent, [n] tokens, [secs]s
    final answer after 2 iteration(s), 0 sub-call(s) sent, [n] tokens, [secs]s
    ");
    assert_eq!(mock.root_requests(), 4);
    let follow_up = last_user_message(&mock.log().entries()[2]);
    assert!(
        follow_up.contains("# Earlier questions in this session"),
        "{follow_up}"
    );
    // The trajectory holds both runs; `rlm show` replays them in order.
    let show = rlm(
        &["show".into(), trajectory.to_str().expect("utf-8").into()],
        None,
    );
    show.assert_code(0);
    let queries: Vec<&str> = show
        .stdout
        .lines()
        .filter(|l| l.starts_with("query: "))
        .collect();
    assert_eq!(queries, ["query: Make x.", "query: What is x + 1?"]);
}

/// Refused before stdin is read: no questions are piped in, so none can meet a closed pipe.
#[test]
fn chat_refuses_stdin_as_a_context_and_an_answer_file() {
    let mock = Mock::start(make_or_use_x());
    let run = rlm(&chat_args(&mock, &["--context", "-"]), None);
    run.assert_code(2);
    insta::assert_snapshot!(run.stderr, @"error: `rlm chat` reads its questions from standard input, so `-` cannot be a context; pass a file");
    let dir = tempfile::tempdir().expect("tempdir");
    let context = file(dir.path(), "c.txt", "text");
    let run = rlm(
        &chat_args(
            &mock,
            &[
                "--context",
                context.to_str().expect("utf-8"),
                "--answer-file",
                "a.txt",
            ],
        ),
        None,
    );
    run.assert_code(2);
    assert!(run.stderr.contains("`--answer-file`"), "{}", run.stderr);
    assert_eq!(mock.log().len(), 0, "nothing was asked");
}

#[test]
fn chat_with_no_questions_ends_cleanly() {
    let mock = Mock::start(make_or_use_x());
    let dir = tempfile::tempdir().expect("tempdir");
    let context = file(dir.path(), "c.txt", "text");
    let run = rlm(
        &chat_args(&mock, &["--context", context.to_str().expect("utf-8")]),
        Some(b""),
    );
    run.assert_code(0);
    assert_eq!(run.stdout, "");
    assert_eq!(mock.log().len(), 0);
}
