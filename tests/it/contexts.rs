//! Every kind of context through `rlm run --context`, and a trajectory that does not grow
//! with the context.

use std::path::Path;

use crate::support::{Mock, file, repl, rlm_with};

/// Runs a root model that describes `context` (and `context_1` when given) into `kind`.
fn describe(contexts: &[&Path], stdin: Option<&[u8]>) -> String {
    let mock = Mock::start(serde_json::json!({
        "models": {"root-model": {"replies": [
            repl("kind = type(context).__name__ + ':' + str(len(context))\ntry:\n    kind += ' / ' + type(context_1).__name__\nexcept NameError:\n    pass"),
            "FINAL_VAR(kind)"
        ]}}
    }));
    let mut args: Vec<String> = [
        "run",
        "--base-url",
        &mock.url(),
        "--model",
        "root-model",
        "--query",
        "q",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for c in contexts {
        args.push("--context".into());
        args.push(c.to_str().expect("utf-8").into());
    }
    let run = rlm_with(&args, stdin, &[]);
    run.assert_code(0);
    run.last_line().to_owned()
}

#[test]
fn text_json_jsonl_csv_and_directories_load() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    assert_eq!(describe(&[&file(d, "a.txt", "hello")], None), "str:5");
    assert_eq!(
        describe(&[&file(d, "a.json", r#"{"a": 1, "b": [1, 2]}"#)], None),
        "dict:2"
    );
    assert_eq!(
        describe(
            &[&file(d, "a.jsonl", "{\"a\": 1}\n{\"a\": 2}\n{\"a\": 3}\n")],
            None
        ),
        "list:3"
    );
    assert_eq!(
        describe(&[&file(d, "t.csv", "x,y\n1,a\n2,b\n3,c\n")], None),
        "DataFrame:3"
    );
    let docs = d.join("docs");
    std::fs::create_dir_all(docs.join("sub")).expect("mkdir");
    file(&docs, "one.md", "# one");
    file(&docs.join("sub"), "two.txt", "two");
    assert_eq!(describe(&[&docs], None), "dict:2");
    assert_eq!(
        describe(
            &[&file(d, "b.txt", "first"), &file(d, "c.json", "[1]")],
            None
        ),
        "str:5 / list"
    );
}

#[test]
fn parquet_and_stdin_load() {
    let dir = tempfile::tempdir().expect("tempdir");
    let parquet = dir.path().join("t.parquet");
    let status = std::process::Command::new("python3")
        .args([
            "-c",
            "import polars as pl, sys; pl.DataFrame({'a': [1, 2, 3, 4]}).write_parquet(sys.argv[1])",
            parquet.to_str().expect("utf-8"),
        ])
        .status()
        .expect("python3 runs");
    assert!(status.success(), "polars wrote the parquet file");
    assert_eq!(describe(&[&parquet], None), "DataFrame:4");
    assert_eq!(describe(&[Path::new("-")], Some(b"from stdin")), "str:10");
}

#[test]
fn trajectory_size_does_not_depend_on_context_size() {
    let size_of_trajectory = |bytes: usize| {
        let mock = Mock::start(serde_json::json!({
            "models": {"root-model": {"replies": [
                repl("print(len(context))\nprint(context[:50])"),
                "FINAL(done)"
            ]}}
        }));
        let dir = tempfile::tempdir().expect("tempdir");
        let context = file(dir.path(), "big.txt", &"z".repeat(bytes));
        let trajectory = dir.path().join("t.jsonl");
        mock.run(&[
            "--context",
            context.to_str().expect("utf-8"),
            "--query",
            "q",
            "--trajectory",
            trajectory.to_str().expect("utf-8"),
        ])
        .assert_code(0);
        std::fs::metadata(&trajectory).expect("trajectory").len()
    };
    let small = size_of_trajectory(1_000);
    let large = size_of_trajectory(20_000_000);
    assert!(
        large < small + 1_000,
        "a 20 MB context must not grow the trajectory: {small} vs {large} bytes"
    );
}
