//! Every kind of context through `rlm run --context` (compressed, Excel, sniffed CSV,
//! directories with binaries, named, empty, legacy encodings), clear errors for files that
//! cannot load, and a trajectory that does not grow with the context.

use std::path::Path;

use crate::support::{Mock, Run, file, repl, rlm_with};

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

/// `rlm run` with `args` (contexts and load flags) whose root model runs `code`, which sets
/// `fact`, and then answers `FINAL_VAR(fact)`.
fn fact(args: &[&str], code: &str) -> Run {
    let mock = Mock::start(serde_json::json!({
        "models": {"root-model": {"replies": [repl(code), "FINAL_VAR(fact)"]}}
    }));
    let mut all = vec!["--query", "q"];
    all.extend_from_slice(args);
    mock.run(&all)
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(bytes).expect("compress");
    encoder.finish().expect("compress")
}

fn s(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// stderr with the temporary directory replaced by `[DIR]`, for snapshots.
fn redacted(run: &Run, dir: &Path) -> String {
    run.stderr.replace(s(dir), "[DIR]")
}

#[test]
fn a_gzipped_csv_loads_as_a_dataframe() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("sales.csv.gz");
    std::fs::write(&path, gzip(b"region,amount\nnorth,10\nsouth,32\n")).expect("write");
    let run = fact(
        &["--context", s(&path)],
        "fact = f\"{type(context).__name__} {context['amount'].sum()}\"",
    );
    run.assert_code(0);
    assert_eq!(run.last_line(), "DataFrame 42");
}

#[test]
fn an_xlsx_workbook_loads_as_a_dataframe() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("budget.xlsx");
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../kernel/tests/it/fixtures/make_xlsx.py"
    );
    let status = std::process::Command::new("python3")
        .arg(script)
        .arg(&path)
        .arg(r#"[["Budget", [["item", "usd"], ["rent", 1200], ["food", 300.5]]]]"#)
        .status()
        .expect("python3 runs");
    assert!(status.success(), "the workbook was written");
    let run = fact(
        &["--context", s(&path)],
        "fact = f\"{type(context).__name__} {context.columns} {context['usd'].sum()}\"",
    );
    run.assert_code(0);
    assert_eq!(run.last_line(), "DataFrame ['item', 'usd'] 1500.5");
    // The same table as pandas, for code that expects it.
    let run = fact(
        &["--context", s(&path), "--as", "pandas"],
        "fact = f\"{type(context).__module__.split('.')[0]} {context['usd'].sum()}\"",
    );
    run.assert_code(0);
    assert_eq!(run.last_line(), "pandas 1500.5");
}

#[test]
fn a_semicolon_csv_is_sniffed_or_given() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = file(dir.path(), "eu.csv", "name;price\napple;1,5\npear;2,25\n");
    let run = fact(
        &["--context", s(&path)],
        "fact = f\"{context.columns} {context.height}\"",
    );
    run.assert_code(0);
    assert_eq!(run.last_line(), "['name', 'price'] 2");
    let piped = file(dir.path(), "p.txt.csv", "a|b\n1|2\n");
    let run = fact(
        &["--context", s(&piped), "--csv-sep", "|"],
        "fact = str(context.columns)",
    );
    run.assert_code(0);
    assert_eq!(run.last_line(), "['a', 'b']");
    let run = fact(&["--context", s(&piped), "--csv-sep", "||"], "fact = 1");
    run.assert_code(2);
    assert!(
        run.stderr.contains("`--csv-sep` takes one ASCII character"),
        "{}",
        run.stderr
    );
}

#[test]
fn a_directory_with_a_png_loads_its_files_by_kind_and_lists_what_it_skipped() {
    let dir = tempfile::tempdir().expect("tempdir");
    let docs = dir.path().join("docs");
    std::fs::create_dir_all(docs.join("img")).expect("mkdir");
    file(&docs, "notes.md", "# notes");
    file(&docs, "prices.csv", "item,usd\npen,2\n");
    std::fs::write(docs.join("img/logo.png"), b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR").expect("png");
    let run = fact(
        &["--context", s(&docs)],
        "fact = ' '.join(f'{k}={type(v).__name__}' for k, v in sorted(context.items()))",
    );
    run.assert_code(0);
    assert_eq!(run.last_line(), "notes.md=str prices.csv=DataFrame");
    let warning: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| l.starts_with("warning:"))
        .collect();
    insta::assert_snapshot!(warning.join("\n").replace(s(dir.path()), "[DIR]"), @"warning: Skipped 1 file(s) of the directory `[DIR]/docs` that cannot be a context: `img/logo.png` (a PNG image)");
}

#[test]
fn a_png_context_gets_advice_that_fits() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("chart.png");
    std::fs::write(&path, b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR").expect("png");
    let run = fact(&["--context", s(&path)], "fact = 1");
    run.assert_code(1);
    insta::assert_snapshot!(redacted(&run, dir.path()), @r"
    error: Could not load the context
      caused by: Context file `[DIR]/chart.png` is a PNG image, which cannot be a context; a context is text, JSON or a table: transcribe or describe the image as text, or leave it out
    ");
}

#[test]
fn a_broken_csv_row_is_reported_with_its_line_or_skipped() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = file(dir.path(), "orders.csv", "id,qty\n1,5\n2,7\n3,1,9\n4,2\n");
    let run = fact(&["--context", s(&path)], "fact = 1");
    run.assert_code(1);
    insta::assert_snapshot!(redacted(&run, dir.path()), @r"
    error: Could not load the context
      caused by: Context file `[DIR]/orders.csv` has a malformed CSV row at line 4 (3 fields where the header has 2, reading with separator `,`); fix or remove that row, pass `--csv-sep` if the separator is wrong, or `--csv-skip-bad-rows` to leave such rows out
    ");
    let run = fact(
        &["--context", s(&path), "--csv-skip-bad-rows"],
        "fact = str(context['id'].to_list())",
    );
    run.assert_code(0);
    assert_eq!(run.last_line(), "[1, 2, 4]");
    assert!(
        run.stderr.contains(&format!(
            "warning: Skipped 1 malformed row(s) of `{}` (the first at line 4)",
            path.display()
        )),
        "{}",
        run.stderr
    );
}

#[test]
fn named_contexts_become_variables_and_are_described_by_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sales = file(dir.path(), "sales.csv", "amount\n3\n4\n");
    let notes = file(dir.path(), "notes.md", "ship it");
    let mock = Mock::start(serde_json::json!({
        "models": {"root-model": {"replies": [
            repl("fact = f\"{sales['amount'].sum()} {notes} {context is sales} {context_1 is notes}\""),
            "FINAL_VAR(fact)"
        ]}}
    }));
    let sales_arg = format!("sales={}", s(&sales));
    let notes_arg = format!("notes={}", s(&notes));
    let run = mock.run(&["--query", "q", "-c", &sales_arg, "-c", &notes_arg]);
    run.assert_code(0);
    assert_eq!(run.last_line(), "7 ship it True True");
    let first = &mock.log().entries()[0].last_user;
    assert!(
        first.contains("- `sales` (also `context`, `context_0`): a table"),
        "{first}"
    );
    // A file whose name holds `=` still loads as a path.
    let odd = file(dir.path(), "a=b.txt", "odd name");
    let run = fact(&["--context", s(&odd)], "fact = context");
    run.assert_code(0);
    assert_eq!(run.last_line(), "odd name");
}

#[test]
fn bad_context_names_are_usage_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = file(dir.path(), "t.txt", "x");
    for (name, why) in [
        ("len", "would hide the Python builtin"),
        ("2x", "is not a valid Python name"),
        ("context", "is a name the kernel defines"),
    ] {
        let arg = format!("{name}={}", s(&path));
        let run = fact(&["--context", &arg], "fact = 1");
        run.assert_code(2);
        assert!(run.stderr.contains(why), "{name}: {}", run.stderr);
    }
}

#[test]
fn an_empty_query_is_refused_and_an_empty_context_warned_about() {
    let dir = tempfile::tempdir().expect("tempdir");
    let empty = file(dir.path(), "empty.txt", "");
    let run = rlm_with(
        &[
            "run".into(),
            "--base-url".into(),
            "http://127.0.0.1:9/v1".into(),
            "--model".into(),
            "m".into(),
            "--context".into(),
            s(&empty).into(),
            "--query".into(),
            "  ".into(),
        ],
        None,
        &[],
    );
    run.assert_code(2);
    assert!(run.stderr.contains("`--query` is empty"), "{}", run.stderr);
    let run = fact(&["--context", s(&empty)], "fact = repr(context)");
    run.assert_code(0);
    assert_eq!(run.last_line(), "''");
    assert!(
        run.stderr.contains(&format!(
            "warning: Context `context_0` (`{}`) is empty",
            empty.display()
        )),
        "{}",
        run.stderr
    );
}

#[test]
fn legacy_text_loads_with_an_encoding() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("old.txt");
    std::fs::write(&path, b"na\xefve caf\xe9").expect("write");
    let run = fact(&["--context", s(&path)], "fact = context");
    run.assert_code(1);
    assert!(run.stderr.contains("--encoding latin-1"), "{}", run.stderr);
    let run = fact(
        &["--context", s(&path), "--encoding", "latin-1"],
        "fact = context",
    );
    run.assert_code(0);
    assert_eq!(run.last_line(), "naïve café");
    let run = fact(
        &["--context", s(&path), "--encoding", "klingon"],
        "fact = 1",
    );
    run.assert_code(2);
    assert!(
        run.stderr.contains("Unknown text encoding `klingon`"),
        "{}",
        run.stderr
    );
}

/// A table context whose package cannot be imported fails before any model call, naming the
/// package, the file and how to install it for `rlm`'s own interpreter (`.ci/setup`; the
/// Python package names its pip extra instead).
#[test]
fn a_missing_polars_says_how_to_install_it_for_rlm() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hide = dir.path().join("hide/polars");
    std::fs::create_dir_all(&hide).expect("mkdir");
    file(
        &hide,
        "__init__.py",
        "raise ImportError(\"No module named 'polars' (hidden by the test)\")\n",
    );
    let table = file(dir.path(), "sales.csv", "region,amount\nnorth,1\n");
    let mock = Mock::start(serde_json::json!({
        "models": {"root-model": {"replies": ["FINAL(unreached)"]}}
    }));
    let hidden = dir.path().join("hide");
    let run = mock.run_env(
        &["--query", "q", "--context", s(&table)],
        &[("PYTHONPATH", s(&hidden))],
    );
    run.assert_code(1);
    assert!(
        run.stderr.contains("`polars`") && run.stderr.contains("sales.csv"),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("`bash .ci/setup`"), "{}", run.stderr);
    assert!(!run.stderr.contains("rlm-kernel["), "{}", run.stderr);
    assert_eq!(mock.root_requests(), 0, "no model was asked");
}

#[test]
fn a_name_given_to_two_contexts_is_a_usage_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let x = file(dir.path(), "x.txt", "x");
    let y = file(dir.path(), "y.txt", "y");
    let (first, second) = (format!("a={}", s(&x)), format!("a={}", s(&y)));
    let run = fact(&["--context", &first, "--context", &second], "fact = 1");
    run.assert_code(2);
    assert!(
        run.stderr.contains(&format!(
            "`--context {second}`: the name `a` is given to two contexts"
        )),
        "{}",
        run.stderr
    );
}
