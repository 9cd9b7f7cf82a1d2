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
