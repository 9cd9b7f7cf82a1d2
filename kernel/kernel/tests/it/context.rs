//! Context loading: every kind, metadata, and clear errors for bad files.

use std::path::{Path, PathBuf};

use kernel::repl::{
    BinaryKind, Compression, ContextInput, ContextKind, ContextSource, FrameLibrary, LoadOptions,
    NameProblem, ReplError, ReplSession, RowProblem, SessionConfig, SkippedFile, SkippedRows,
};

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
    assert!(text.contains("--encoding latin-1"), "{text}");
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
    let csv = write(dir.path(), "quoted.csv", "a,b\n1,\"x\n2,3\n");
    let text = load_err(&[ContextSource::Path(csv)]).to_string();
    assert!(text.contains("line 2"), "{text}");
    assert!(text.contains("quoted field"), "{text}");
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

fn session_opts(inputs: &[ContextInput], load: LoadOptions) -> Result<ReplSession, ReplError> {
    ReplSession::with_inputs(
        SessionConfig {
            load,
            ..config(std::time::Duration::from_secs(30))
        },
        no_endpoints(),
        inputs,
    )
}

fn paths(paths: &[&Path]) -> Vec<ContextInput> {
    paths
        .iter()
        .map(|p| ContextSource::Path(p.to_path_buf()).into())
        .collect()
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(bytes).expect("compress");
    encoder.finish().expect("compress")
}

/// An `.xlsx` written by `fixtures/make_xlsx.py` (standard library only).
fn xlsx(dir: &Path, name: &str, sheets: serde_json::Value) -> PathBuf {
    let path = dir.join(name);
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/it/fixtures/make_xlsx.py"
    );
    let status = std::process::Command::new("python3")
        .arg(script)
        .arg(&path)
        .arg(sheets.to_string())
        .status()
        .expect("python3 runs");
    assert!(status.success(), "the workbook was written");
    path
}

#[test]
fn compressed_files_load_through_their_decoder() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let text = "héllo gzip\n".repeat(1000);
    let txt = write(d, "notes.txt.gz", gzip(text.as_bytes()));
    let csv = write(d, "t.csv.gz", gzip(b"x,y\n1,a\n2,b\n"));
    let jsonl = write(
        d,
        "rows.jsonl.zst",
        zstd::encode_all(&b"{\"id\": 1}\n{\"id\": 2}\n"[..], 3).expect("zstd"),
    );
    // Compressed without the suffix: the magic number decides.
    let json = write(d, "conf.json", gzip(br#"{"a": [1, 2]}"#));
    let s = session_with(&[
        ContextSource::Path(txt),
        ContextSource::Path(csv),
        ContextSource::Path(jsonl),
        ContextSource::Path(json),
    ]);
    let m = s.contexts();
    assert_eq!(m[0].kind, ContextKind::Text);
    assert_eq!(m[0].compression, Some(Compression::Gzip));
    assert_eq!(m[0].chars, Some(text.chars().count() as u64));
    assert_eq!(m[1].kind, ContextKind::Table);
    assert_eq!(m[1].rows, Some(2));
    assert_eq!((m[2].kind, m[2].items), (ContextKind::JsonLines, Some(2)));
    assert_eq!(m[2].compression, Some(Compression::Zstd));
    assert_eq!(m[3].kind, ContextKind::Json);
    let r = ok(
        &s,
        "print(context.count('héllo'), context_1['y'].to_list(), context_2[1]['id'], context_3['a'])",
    );
    assert_eq!(r.stdout, "1000 ['a', 'b'] 2 [1, 2]\n");
}

#[test]
fn a_corrupt_gzip_says_so() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut bytes = gzip(&b"some text ".repeat(10_000));
    bytes.truncate(bytes.len() / 2);
    let path = write(dir.path(), "cut.txt.gz", bytes);
    let err = load_err(&[ContextSource::Path(path)]);
    assert!(
        matches!(err, ReplError::ContextMalformed { format: "gzip", .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("corrupt or cut short"), "{err}");
}

#[test]
fn binaries_are_named_by_their_first_bytes_with_fitting_advice() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let cases: [(&str, &[u8], BinaryKind, &str); 5] = [
        (
            "chart.png",
            b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR",
            BinaryKind::Png,
            "PNG image",
        ),
        (
            "scan.csv",
            b"%PDF-1.7\n%\xe2\xe3",
            BinaryKind::Pdf,
            "pdftotext",
        ),
        (
            "data.zip",
            b"PK\x03\x04\x14\0\0\0notes.txt",
            BinaryKind::Zip,
            "unzip",
        ),
        (
            "blob.txt",
            b"abc\0\x01\x02def",
            BinaryKind::Other,
            "--encoding",
        ),
        (
            "wide.txt",
            b"\xff\xfea\0b\0",
            BinaryKind::Utf16,
            "--encoding utf-16",
        ),
    ];
    for (name, bytes, kind, advice) in cases {
        let path = write(d, name, bytes);
        let err = load_err(&[ContextSource::Path(path.clone())]);
        assert!(
            matches!(&err, ReplError::ContextBinary { kind: k, .. } if *k == kind),
            "{name}: {err:?}"
        );
        let text = err.to_string();
        assert!(text.contains(&format!("`{}`", path.display())), "{text}");
        assert!(text.contains(advice), "{name}: {text}");
        assert!(!text.contains("iconv"), "{text}");
    }
}

#[test]
fn csv_separators_are_sniffed_or_given() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let semi = write(d, "eu.csv", "name;price\napple;1,5\npear;2,25\n");
    let pipe = write(d, "p.csv", "a|b|c\n1|2|3\n");
    let s = session_with(&[ContextSource::Path(semi), ContextSource::Path(pipe.clone())]);
    assert_eq!(s.contexts()[0].columns.as_ref().map(Vec::len), Some(2));
    let r = ok(
        &s,
        "print(context.columns, context['price'].to_list(), context_1.width)",
    );
    assert_eq!(r.stdout, "['name', 'price'] ['1,5', '2,25'] 3\n");
    // Given explicitly, the separator is used as is.
    let s = session_opts(
        &paths(&[&pipe]),
        LoadOptions {
            csv_separator: Some(b';'),
            ..LoadOptions::default()
        },
    )
    .expect("loads");
    assert_eq!(s.contexts()[0].columns.as_ref().map(Vec::len), Some(1));
}

#[test]
fn a_malformed_csv_row_is_named_by_line_or_skipped_and_counted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let csv = write(
        dir.path(),
        "ragged.csv",
        "a,b\n1,2\n3,4\n5,6,7\n8,9\n10,11,12,13\n",
    );
    let err = load_err(&[ContextSource::Path(csv.clone())]);
    assert!(
        matches!(
            err,
            ReplError::ContextBadRow {
                line: 4,
                problem: RowProblem::ExtraFields {
                    found: 3,
                    expected: 2
                },
                ..
            }
        ),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(text.contains("line 4"), "{text}");
    assert!(text.contains("--csv-skip-bad-rows"), "{text}");

    let s = session_opts(
        &paths(&[&csv]),
        LoadOptions {
            skip_bad_rows: true,
            ..LoadOptions::default()
        },
    )
    .expect("loads");
    let meta = &s.contexts()[0];
    assert_eq!(
        meta.skipped_rows,
        Some(SkippedRows {
            count: 2,
            first_line: 4
        })
    );
    assert_eq!(meta.rows, Some(3));
    assert!(meta.warnings()[0].contains("Skipped 2 malformed row(s)"));
    let r = ok(&s, "print(context['a'].to_list())");
    assert_eq!(r.stdout, "[1, 3, 8]\n");
}

#[test]
fn a_late_non_numeric_value_loads_the_column_as_text() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut text = String::from("id,code\n");
    for i in 0..300 {
        text.push_str(&format!("{i},{i}\n"));
    }
    text.push_str("300,N/A\n");
    let csv = write(dir.path(), "late.csv", text);
    let s = session_with(&[ContextSource::Path(csv)]);
    let r = ok(
        &s,
        "print(context.height, context['code'].dtype, context['code'][-1])",
    );
    assert_eq!(r.stdout, "301 String N/A\n");
}

#[test]
fn legacy_encodings_are_decoded_when_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let txt = write(d, "old.txt", b"caf\xe9 cr\xe8me\r\n");
    let csv = write(d, "old.csv", b"name;city\nJos\xe9;M\xe1laga\n");
    let s = session_opts(
        &paths(&[&txt, &csv]),
        LoadOptions {
            encoding: Some("cp1252".into()),
            ..LoadOptions::default()
        },
    )
    .expect("loads");
    assert_eq!(s.contexts()[0].chars, Some(12));
    let r = ok(&s, "print(repr(context), context_1['city'][0])");
    assert_eq!(r.stdout, "'café crème\\r\\n' Málaga\n");
    let err = session_opts(
        &paths(&[&txt]),
        LoadOptions {
            encoding: Some("no-such-codec".into()),
            ..LoadOptions::default()
        },
    )
    .expect_err("unknown codec");
    assert!(matches!(err, ReplError::UnknownEncoding { .. }), "{err:?}");
    assert!(err.to_string().contains("`latin-1`"), "{err}");
}

#[test]
fn excel_workbooks_load_as_frames_or_a_dict_of_sheets() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let one = xlsx(
        d,
        "one.xlsx",
        serde_json::json!([["Sales", [["item", "amount"], ["pen", 1.5], ["ink", 2]]]]),
    );
    let two = xlsx(
        d,
        "two.xlsx",
        serde_json::json!([
            ["Q1", [["item", "amount"], ["pen", 1.5]]],
            ["Q2", [["item", "amount"], ["cap", 3], ["hat", 4]]]
        ]),
    );
    let s = session_with(&[ContextSource::Path(one), ContextSource::Path(two)]);
    let (m0, m1) = (&s.contexts()[0], &s.contexts()[1]);
    assert_eq!((m0.kind, m0.rows), (ContextKind::Table, Some(2)));
    assert_eq!(m1.kind, ContextKind::Workbook);
    assert_eq!(m1.items, Some(2));
    assert_eq!(
        m1.sheets
            .iter()
            .map(|s| (s.name.as_str(), s.rows))
            .collect::<Vec<_>>(),
        [("Q1", 1), ("Q2", 2)]
    );
    let r = ok(
        &s,
        "print(type(context).__name__, context['amount'].sum(), list(context_1), context_1['Q2']['item'].to_list())",
    );
    assert_eq!(r.stdout, "DataFrame 3.5 ['Q1', 'Q2'] ['cap', 'hat']\n");
}

#[test]
fn tables_can_be_pandas_frames() {
    let dir = tempfile::tempdir().expect("tempdir");
    let csv = write(dir.path(), "t.csv", "name,qty\napple,3\npear,\n");
    let s = session_opts(
        &paths(&[&csv]),
        LoadOptions {
            frames: FrameLibrary::Pandas,
            ..LoadOptions::default()
        },
    )
    .expect("loads");
    assert_eq!(s.contexts()[0].python_type(), "pandas.DataFrame");
    let r = ok(
        &s,
        "print(type(context).__module__.split('.')[0], list(context.columns), context['qty'].isna().sum(), context.loc[0, 'name'])",
    );
    assert_eq!(r.stdout, "pandas ['name', 'qty'] 1 apple\n");
}

#[test]
fn directories_load_each_file_by_kind_and_skip_binaries() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    write(d, "notes.md", "# notes");
    write(d, "data/t.csv", "a;b\n1;2\n");
    write(d, "data/conf.json", r#"{"k": 1}"#);
    write(d, "img/logo.png", b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR");
    write(d, "img/photo.jpg", b"\xff\xd8\xff\xe0\0\x10JFIF");
    let s = session_with(&[ContextSource::Path(d.to_owned())]);
    let meta = &s.contexts()[0];
    assert_eq!(meta.items, Some(3));
    assert_eq!(
        meta.skipped_files,
        [
            SkippedFile {
                path: "img/logo.png".into(),
                kind: BinaryKind::Png
            },
            SkippedFile {
                path: "img/photo.jpg".into(),
                kind: BinaryKind::Jpeg
            }
        ]
    );
    let warnings = meta.warnings();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains("`img/logo.png` (a PNG image), `img/photo.jpg` (a JPEG image)"),
        "{warnings:?}"
    );
    let r = ok(
        &s,
        "print(sorted(context), type(context['data/t.csv']).__name__, context['data/t.csv']['b'][0], context['data/conf.json']['k'], context['notes.md'])",
    );
    assert_eq!(
        r.stdout,
        "['data/conf.json', 'data/t.csv', 'notes.md'] DataFrame 2 1 # notes\n"
    );
}

#[test]
fn empty_contexts_load_as_empty_values_and_are_flagged() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let txt = write(d, "e.txt", "");
    let csv = write(d, "e.csv", "");
    let json = write(d, "e.json", gzip(b""));
    let empty_dir = d.join("nothing");
    std::fs::create_dir(&empty_dir).expect("mkdir");
    let s = session_with(&[
        ContextSource::Path(txt),
        ContextSource::Path(csv),
        ContextSource::Path(json),
        ContextSource::Path(empty_dir),
    ]);
    assert!(s.contexts().iter().all(|m| m.empty), "{:?}", s.contexts());
    assert!(s.contexts()[0].warnings()[0].contains("is empty"));
    let r = ok(
        &s,
        "print(repr(context), context_1.shape, context_2, context_3)",
    );
    assert_eq!(r.stdout, "'' (0, 0) None {}\n");
}

#[test]
fn named_contexts_are_variables_too() {
    let s = session_opts(
        &[
            ContextInput {
                name: Some("notes".into()),
                source: ContextSource::Text("first".into()),
            },
            ContextInput {
                name: Some("sales".into()),
                source: ContextSource::Text("second".into()),
            },
        ],
        LoadOptions::default(),
    )
    .expect("loads");
    assert_eq!(s.contexts()[1].name, "sales");
    let r = ok(&s, "print(notes, context, sales, context_1)");
    assert_eq!(r.stdout, "first first second second\n");
    // Rebinding a context's name is undone like any kernel name.
    let r = s.exec("sales = 1").expect("runs");
    assert!(r.stderr.contains("sales"), "{}", r.stderr);
    assert_eq!(ok(&s, "print(sales)").stdout, "second\n");
}

#[test]
fn bad_context_names_are_refused_before_loading() {
    let named = |name: &str| ContextInput {
        name: Some(name.into()),
        source: ContextSource::Path("/no/such/file".into()),
    };
    for (name, problem) in [
        ("2x", NameProblem::NotIdentifier),
        ("my-data", NameProblem::NotIdentifier),
        ("class", NameProblem::Keyword),
        ("len", NameProblem::Builtin),
        ("context", NameProblem::Reserved),
        ("context_1", NameProblem::Reserved),
        ("llm_query", NameProblem::Reserved),
    ] {
        let err = session_opts(&[named(name)], LoadOptions::default()).expect_err(name);
        assert!(
            matches!(&err, ReplError::ContextName { problem: p, .. } if *p == problem),
            "{name}: {err:?}"
        );
        assert!(err.to_string().contains(&format!("`{name}`")), "{err}");
    }
    let err =
        session_opts(&[named("a"), named("a")], LoadOptions::default()).expect_err("duplicate");
    assert!(
        matches!(
            err,
            ReplError::ContextName {
                problem: NameProblem::Duplicate,
                ..
            }
        ),
        "{err:?}"
    );
}
