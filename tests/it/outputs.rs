//! Outputs never destroy inputs: `--answer-file` and `--trajectory` naming an input are
//! refused (exit 2) with the input byte-identical; the answer file is never truncated up
//! front; an existing trajectory needs `--force`.

use crate::support::{Mock, file, repl, script};

const CONTEXT: &str = "line one\nline two: the data a user cannot lose\n";

fn assert_refused(run: &crate::support::Run, needle: &str) {
    run.assert_code(2);
    assert!(run.stderr.contains(needle), "stderr: {}", run.stderr);
    assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
}

#[test]
fn an_output_naming_the_context_is_refused_and_the_context_is_untouched() {
    let mock = Mock::start(script(&["FINAL(x)"]));
    let dir = tempfile::tempdir().expect("tempdir");
    let context = file(dir.path(), "data.txt", CONTEXT);
    let link = dir.path().join("link.txt");
    std::os::unix::fs::symlink(&context, &link).expect("symlink");
    let dotted = format!("{}/./data.txt", dir.path().display());
    for flag in ["--answer-file", "--trajectory"] {
        for out in [
            context.to_str().expect("utf-8"),
            link.to_str().expect("utf-8"),
            dotted.as_str(),
        ] {
            let run = mock.run(&[
                "--context",
                context.to_str().expect("utf-8"),
                "--query",
                "q",
                flag,
                out,
                "--force",
            ]);
            assert_refused(&run, "would destroy the input");
            assert_eq!(
                std::fs::read_to_string(&context).expect("context"),
                CONTEXT,
                "{flag} {out} left the context byte-identical"
            );
        }
    }
    assert_eq!(mock.log().len(), 0, "no model was called");
}

#[test]
fn an_output_naming_the_config_file_or_a_file_in_a_context_directory_is_refused() {
    let mock = Mock::start(script(&["FINAL(x)"]));
    let dir = tempfile::tempdir().expect("tempdir");
    let config = file(dir.path(), "rlm.toml", "[run]\nmax-iterations = 3\n");
    let docs = dir.path().join("docs");
    std::fs::create_dir(&docs).expect("mkdir");
    let note = file(&docs, "note.md", CONTEXT);
    let run = crate::support::rlm(
        &[
            "--config",
            config.to_str().expect("utf-8"),
            "run",
            "--base-url",
            &mock.url(),
            "--model",
            "root-model",
            "--context",
            docs.to_str().expect("utf-8"),
            "--query",
            "q",
            "--answer-file",
            config.to_str().expect("utf-8"),
        ]
        .map(str::to_owned),
        None,
    );
    assert_refused(&run, "would destroy the input");
    let run = mock.run(&[
        "--context",
        docs.to_str().expect("utf-8"),
        "--query",
        "q",
        "--trajectory",
        note.to_str().expect("utf-8"),
    ]);
    assert_refused(&run, "inside the context directory");
    assert_eq!(std::fs::read_to_string(&note).expect("note"), CONTEXT);
    assert_eq!(
        std::fs::read_to_string(&config).expect("config"),
        "[run]\nmax-iterations = 3\n"
    );
}

#[test]
fn the_answer_file_is_not_truncated_before_the_run_and_is_replaced_at_the_end() {
    let mock = Mock::start(script(&[&repl("x = 6 * 7"), "FINAL(42)"]));
    let dir = tempfile::tempdir().expect("tempdir");
    let context = file(dir.path(), "data.txt", CONTEXT);
    let answer = file(dir.path(), "answer.txt", "the previous answer");
    // A run that fails before it starts leaves the old answer file alone.
    let run = mock.run(&[
        "--context",
        "/nonexistent/input.txt",
        "--query",
        "q",
        "--answer-file",
        answer.to_str().expect("utf-8"),
    ]);
    run.assert_code(1);
    assert_eq!(
        std::fs::read_to_string(&answer).expect("answer"),
        "the previous answer"
    );
    let run = mock.run(&[
        "--context",
        context.to_str().expect("utf-8"),
        "--query",
        "q",
        "--answer-file",
        answer.to_str().expect("utf-8"),
    ]);
    run.assert_code(0);
    assert_eq!(std::fs::read_to_string(&answer).expect("answer"), "42");
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .expect("ls")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 2, "no temporary file left behind: {names:?}");
}

#[test]
fn an_existing_trajectory_is_kept_unless_forced() {
    let mock = Mock::start(script(&["FINAL(a)", "FINAL(b)"]));
    let dir = tempfile::tempdir().expect("tempdir");
    let context = file(dir.path(), "data.txt", CONTEXT);
    let trajectory = file(dir.path(), "t.jsonl", "{\"earlier\": \"run\"}\n");
    let args = |force: bool| {
        let mut a = vec![
            "--context",
            context.to_str().expect("utf-8"),
            "--query",
            "q",
            "--trajectory",
            trajectory.to_str().expect("utf-8"),
        ];
        if force {
            a.push("--force");
        }
        a
    };
    let run = mock.run(&args(false));
    assert_refused(&run, "--force");
    assert_eq!(
        std::fs::read_to_string(&trajectory).expect("t"),
        "{\"earlier\": \"run\"}\n"
    );
    mock.run(&args(true)).assert_code(0);
    let text = std::fs::read_to_string(&trajectory).expect("t");
    assert!(!text.contains("earlier"), "replaced with --force: {text}");
}

#[test]
fn the_demo_never_overwrites_a_file_with_keep_context() {
    let dir = tempfile::tempdir().expect("tempdir");
    let precious = file(dir.path(), "precious.txt", CONTEXT);
    let run = crate::support::rlm(
        &[
            "demo",
            "--quiet",
            "--size-mb",
            "0.05",
            "--keep-context",
            precious.to_str().expect("utf-8"),
        ]
        .map(str::to_owned),
        None,
    );
    assert_refused(&run, "--force");
    assert_eq!(std::fs::read_to_string(&precious).expect("p"), CONTEXT);
}
