//! Context loading: every kind, metadata, and clear errors for bad files.

use std::path::{Path, PathBuf};

use kernel::repl::{ContextKind, ContextSource, ReplError, ReplSession};

use crate::support::{config, no_endpoints, ok, session, session_with};

fn write(dir: &Path, name: &str, bytes: impl AsRef<[u8]>) -> PathBuf {
    let path = dir.join(name);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).expect("mkdir");
    }
    std::fs::write(&path, bytes).expect("write");
    path
}

fn load_err(sources: &[ContextSource]) -> ReplError {
    match ReplSession::new(
        config(std::time::Duration::from_secs(30)),
        no_endpoints(),
        sources,
    ) {
        Ok(_) => panic!("loading {sources:?} should fail"),
        Err(e) => e,
    }
}

#[test]
fn text_file_becomes_str_with_metadata() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write(dir.path(), "notes.txt", "héllo\nworld\n");
    let started = std::time::Instant::now();
    let s = session_with(&[ContextSource::Path(path.clone())]);
    let session_ms = started.elapsed().as_secs_f64() * 1e3;
    let meta = &s.contexts()[0];
    assert_eq!(meta.kind, ContextKind::Text);
    assert_eq!(meta.name, "context_0");
    assert_eq!(meta.bytes, 13);
    assert_eq!(meta.chars, Some(12));
    assert_eq!(meta.source, path.display().to_string());
    // The load is measured, and is part of starting the session.
    assert!(
        meta.load_ms > 0.0 && meta.load_ms <= session_ms,
        "load {} ms within session start {session_ms} ms",
        meta.load_ms
    );
    let r = ok(
        &s,
        "print(type(context).__name__, len(context), context is context_0)",
    );
    assert_eq!(r.stdout, "str 12 True\n");
}

#[test]
fn several_contexts_get_numbered_names() {
    let s = session_with(&[
        ContextSource::Text("first".into()),
        ContextSource::Text("second".into()),
        ContextSource::Text("third".into()),
    ]);
    let names: Vec<_> = s.contexts().iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, ["context_0", "context_1", "context_2"]);
    let r = ok(&s, "print(context, context_1, context_2)");
    assert_eq!(r.stdout, "first second third\n");
    assert_eq!(s.contexts()[1].source, "<text>");
}

#[test]
fn json_becomes_dict_or_list_with_item_sizes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let obj = write(
        dir.path(),
        "obj.json",
        r#"{"a": 1, "b": [1, 2, 3], "c": {"d": "e"}}"#,
    );
    let arr = write(dir.path(), "arr.json", "[\"x\", \"yy\", {\"k\": null}]\n");
    let s = session_with(&[ContextSource::Path(obj), ContextSource::Path(arr)]);
    let (m0, m1) = (&s.contexts()[0], &s.contexts()[1]);
    assert_eq!(m0.kind, ContextKind::Json);
    assert_eq!(m0.items, Some(3));
    let sizes = m0.item_sizes.as_ref().expect("sizes");
    assert_eq!((sizes.min, sizes.max, sizes.total), (1, 10, 20));
    assert_eq!(m1.items, Some(3));
    let r = ok(
        &s,
        "print(context['b'][2], context['c']['d'], context_1[2], type(context_1).__name__)",
    );
    assert_eq!(r.stdout, "3 e {'k': None} list\n");
}

#[test]
fn json_with_nan_loads_like_python_reads_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write(dir.path(), "pandas.json", r#"[{"x": NaN}, {"x": 1.5}]"#);
    let s = session_with(&[ContextSource::Path(path)]);
    assert_eq!(s.contexts()[0].kind, ContextKind::Json);
    let r = ok(
        &s,
        "import math\nprint(math.isnan(context[0]['x']), context[1]['x'])",
    );
    assert_eq!(r.stdout, "True 1.5\n");
}

#[test]
fn jsonl_becomes_list_skipping_blank_lines() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write(
        dir.path(),
        "rows.jsonl",
        "{\"id\": 1}\n\n{\"id\": 2, \"t\": \"a\\u2028b\"}\r\n[3]\n",
    );
    let s = session_with(&[ContextSource::Path(path)]);
    let meta = &s.contexts()[0];
    assert_eq!(meta.kind, ContextKind::JsonLines);
    assert_eq!(meta.items, Some(3));
    let r = ok(
        &s,
        "print(len(context), context[0]['id'], context[1]['id'], context[2])",
    );
    assert_eq!(r.stdout, "3 1 2 [3]\n");
}

#[test]
fn tables_become_polars_dataframes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let csv = write(
        dir.path(),
        "t.csv",
        "name,price\napple,1.5\npear,2.25\nfig,3.0\n",
    );
    let tsv = write(dir.path(), "t.tsv", "name\tqty\napple\t3\n");
    let ndjson = write(dir.path(), "t.ndjson", "{\"a\": 1}\n{\"a\": 2}\n");
    // Parquet and Arrow files written by polars itself.
    let parquet = dir.path().join("t.parquet");
    let ipc = dir.path().join("t.arrow");
    let writer = session();
    ok(
        &writer,
        &format!(
            "import polars as pl\ndf = pl.DataFrame({{'x': [1, 2, 3, 4], 'y': ['a', 'b', 'c', 'd']}})\ndf.write_parquet({:?})\ndf.write_ipc({:?})",
            parquet.display().to_string(),
            ipc.display().to_string()
        ),
    );
    let s = session_with(&[
        ContextSource::Path(csv),
        ContextSource::Path(tsv),
        ContextSource::Path(ndjson),
        ContextSource::Path(parquet),
        ContextSource::Path(ipc),
    ]);
    for meta in s.contexts() {
        assert_eq!(meta.kind, ContextKind::Table, "{meta:?}");
    }
    let m = &s.contexts()[0];
    assert_eq!(m.rows, Some(3));
    assert_eq!(
        m.columns.as_deref(),
        Some(
            &[
                ("name".to_owned(), "String".to_owned()),
                ("price".to_owned(), "Float64".to_owned())
            ][..]
        )
    );
    assert_eq!(s.contexts()[1].rows, Some(1));
    assert_eq!(s.contexts()[2].rows, Some(2));
    assert_eq!(s.contexts()[3].rows, Some(4));
    assert_eq!(s.contexts()[4].columns.as_ref().map(Vec::len), Some(2));
    let r = ok(
        &s,
        "print(type(context).__name__, context['price'].sum(), context_1['qty'][0], context_2['a'].to_list(), context_3.height, context_4['y'][3])",
    );
    assert_eq!(r.stdout, "DataFrame 6.75 3 [1, 2] 4 d\n");
}

#[test]
fn directory_becomes_dict_of_relative_paths() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path(), "b.txt", "bee");
    write(dir.path(), "a/one.md", "# one");
    write(dir.path(), "a/deeper/two.txt", "two!");
    write(dir.path(), ".git/config", [0xff, 0xfe]);
    write(dir.path(), ".hidden", "skip me");
    let s = session_with(&[ContextSource::Path(dir.path().to_owned())]);
    let meta = &s.contexts()[0];
    assert_eq!(meta.kind, ContextKind::Directory);
    assert_eq!(meta.items, Some(3));
    assert_eq!(meta.chars, Some(12));
    assert_eq!(meta.item_sizes.as_ref().map(|s| s.max), Some(5));
    let r = ok(
        &s,
        "print(list(context))\nprint(context['a/deeper/two.txt'])",
    );
    assert_eq!(
        r.stdout,
        "['a/deeper/two.txt', 'a/one.md', 'b.txt']\ntwo!\n"
    );
}

#[test]
fn summary_line_describes_the_context() {
    let s = session_with(&[ContextSource::Text("abc".into())]);
    assert_eq!(
        s.contexts()[0].summary(),
        "context_0 (str from `<text>`): 3 characters, 3 bytes"
    );
}

#[test]
fn missing_files_name_the_path() {
    let err = load_err(&[ContextSource::Path("/no/such/file.txt".into())]);
    assert!(matches!(err, ReplError::ContextRead { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("`/no/such/file.txt`"), "{text}");
    assert!(text.contains("check that the path exists"), "{text}");
}

#[test]
fn non_utf8_text_is_rejected_with_location_and_fix() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write(dir.path(), "latin1.txt", b"ok line\ncaf\xe9\n");
    let text = load_err(&[ContextSource::Path(path.clone())]).to_string();
    assert!(text.contains(&format!("`{}`", path.display())), "{text}");
    assert!(text.contains("not valid UTF-8"), "{text}");
    assert!(text.contains("line 2"), "{text}");
    assert!(text.contains("iconv"), "{text}");
}

#[test]
fn binary_file_in_a_directory_fails_naming_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path(), "good.txt", "fine");
    let bad = write(
        dir.path(),
        "img/logo.png",
        [0x89, b'P', b'N', b'G', 0xff, 0x00],
    );
    let text = load_err(&[ContextSource::Path(dir.path().to_owned())]).to_string();
    assert!(text.contains(&format!("`{}`", bad.display())), "{text}");
    assert!(text.contains("directory context"), "{text}");
}

#[test]
fn malformed_json_and_jsonl_name_line_and_column() {
    let dir = tempfile::tempdir().expect("tempdir");
    let json = write(dir.path(), "bad.json", "{\n  \"a\": 1,\n  \"b\": oops\n}");
    let err = load_err(&[ContextSource::Path(json)]);
    assert!(
        matches!(err, ReplError::ContextMalformed { format: "JSON", .. }),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(text.contains("line 3"), "{text}");
    assert!(text.contains(".txt"), "{text}");

    let jsonl = write(
        dir.path(),
        "bad.jsonl",
        "{\"a\": 1}\n{\"a\": 2}\nnot json\n",
    );
    let text = load_err(&[ContextSource::Path(jsonl)]).to_string();
    assert!(text.contains("line 3"), "{text}");
    assert!(text.contains("JSON lines"), "{text}");
}

#[test]
fn malformed_tables_fail_with_the_format_and_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let parquet = write(dir.path(), "broken.parquet", "this is not parquet");
    let err = load_err(&[ContextSource::Path(parquet.clone())]);
    let text = err.to_string();
    assert!(
        matches!(
            err,
            ReplError::ContextMalformed {
                format: "Parquet",
                ..
            }
        ),
        "{text}"
    );
    assert!(text.contains(&format!("`{}`", parquet.display())), "{text}");
    let csv = write(dir.path(), "ragged.csv", "a,b\n1,2\n3,4,5,6\n");
    let text = load_err(&[ContextSource::Path(csv)]).to_string();
    assert!(text.contains("not valid CSV"), "{text}");
}

#[test]
fn a_bad_context_among_good_ones_loads_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let good = write(dir.path(), "good.txt", "fine");
    let bad = write(dir.path(), "bad.json", "[1,");
    let err = load_err(&[ContextSource::Path(good), ContextSource::Path(bad.clone())]);
    assert!(err.to_string().contains(&format!("`{}`", bad.display())));
}

#[test]
fn stdin_context_is_read_as_text() {
    use std::io::Write;
    use std::process::{Command, Stdio};
    if std::env::var_os("RLM_TEST_STDIN_CHILD").is_some() {
        let s = session_with(&[ContextSource::from_arg("-")]);
        let meta = &s.contexts()[0];
        let r = ok(&s, "print(repr(context))");
        println!(
            "CHILD-RESULT {} {:?} {}",
            meta.source,
            meta.chars,
            r.stdout.trim()
        );
        return;
    }
    // Re-run this test in a child process whose stdin we control.
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "context::stdin_context_is_read_as_text",
            "--nocapture",
        ])
        .env("RLM_TEST_STDIN_CHILD", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("child starts");
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(b"line one\nline two\n")
        .expect("writes");
    let out = child.wait_with_output().expect("child ends");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("CHILD-RESULT - Some(18) 'line one\\nline two\\n'"),
        "{stdout}"
    );
}
