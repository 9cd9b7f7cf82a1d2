//! The run database guards itself: a damaged `runs.db` is refused by every command, writers
//! included, before anything is written; a read-only one is still listed, and a run that
//! cannot write to it says it is read-only.

use std::path::Path;
use std::process::Command;
use std::time::SystemTime;

use crate::flow_durable::Flows;
use crate::support::{Run, file, rlm};

/// Pads the `runs` table over many pages, then flips the header bytes of one leaf page in
/// the middle of it (not the last one, where a new run goes): SQLite's `quick_check` sees
/// it, an insert of a new run does not.
fn damage(db: &Path) {
    let status = Command::new("python3")
        .args([
            "-c",
            r#"
import sqlite3, sys
path = sys.argv[1]
c = sqlite3.connect(path)
for i in range(300):
    c.execute("INSERT INTO runs (run_id, workflow, status, detail, input, head, created_ms, updated_ms) "
              "VALUES (?, 'w', 'completed', NULL, ?, NULL, 0, 0)", ("pad-%04d" % i, '{"pad": "%s"}' % ("x" * 900)))
c.commit()
c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
c.close()
data = bytearray(open(path, "rb").read())
size = 4096
for page in range(len(data) // size):
    start = page * size
    if b"pad-0010" in data[start:start + size] and data[start] == 0x0D:
        for k in range(8):
            data[start + k] ^= 0xFF
        break
else:
    sys.exit("no page to damage")
open(path, "wb").write(data)
"#,
        ])
        .arg(db)
        .status()
        .expect("python3 runs");
    assert!(status.success(), "the database was damaged as planned");
}

fn snapshot(path: &Path) -> (Vec<u8>, SystemTime) {
    let meta = std::fs::metadata(path).expect("metadata");
    (
        std::fs::read(path).expect("bytes"),
        meta.modified().expect("mtime"),
    )
}

/// The first line of stderr: the error itself, without its causes.
fn first_line(run: &Run) -> &str {
    run.stderr.lines().next().unwrap_or_default()
}

#[test]
fn a_damaged_database_is_refused_by_run_and_resume_and_nothing_is_written() {
    let flows = Flows::new();
    file(flows.dir.path(), "go", "");
    let asking = flows.path("asking.yaml").display().to_string();
    rlm(
        &flows.model_args(&["run", &asking, "--run-id", "ask"]),
        None,
    )
    .assert_code(5);
    let db = flows.path("runs.db");
    damage(&db);
    let before = snapshot(&db);

    let listed = rlm(&flows.args(&["runs"]), None);
    listed.assert_code(1);
    assert!(
        first_line(&listed).contains("move it aside or pass another `--db`"),
        "{}",
        listed.stderr
    );
    let single = flows.path("first.yaml").display().to_string();
    let runs = [
        rlm(
            &flows.model_args(&["run", &single, "--run-id", "after"]),
            None,
        ),
        rlm(
            &flows.model_args(&["resume", "ask", "--input", "Monday"]),
            None,
        ),
    ];
    for run in &runs {
        run.assert_code(1);
        assert_eq!(first_line(run), first_line(&listed), "{}", run.stderr);
        assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
    }
    assert_eq!(
        snapshot(&db),
        before,
        "not a byte and not the mtime changed"
    );
    let wal = flows.path("runs.db-wal");
    assert!(
        std::fs::metadata(&wal).map_or(true, |m| m.len() == 0),
        "nothing waits in the write-ahead log either"
    );
}

/// Runs `rlm ARGS` with `dir` mounted read-only (a bind mount in a private user and mount
/// namespace: read-only for root too). Fails the test if `dir` is still writable there.
fn read_only(dir: &Path, args: &[&str]) -> Run {
    const SCRIPT: &str = r#"dir="$1"; shift
mount --bind "$dir" "$dir" && mount -o remount,bind,ro "$dir" || exit 98
if touch "$dir/.probe" 2>/dev/null; then echo "still writable" >&2; exit 99; fi
exec "$@""#;
    let out = Command::new("unshare")
        .args(["-rm", "sh", "-c", SCRIPT, "sh"])
        .arg(dir)
        .arg(env!("CARGO_BIN_EXE_rlm"))
        .args(args)
        .env_remove("OPENAI_API_KEY")
        .env_remove("ANTHROPIC_API_KEY")
        .env("NO_COLOR", "1")
        .output()
        .expect("unshare runs");
    let run = Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    assert!(
        !matches!(run.code, Some(98 | 99)),
        "the folder could not be made read-only (unprivileged user and mount namespaces?): {run:?}"
    );
    run
}

#[test]
fn a_read_only_database_is_listed_and_a_run_into_it_says_read_only() {
    let flows = Flows::new();
    file(flows.dir.path(), "go", "");
    rlm(&flows.run_pipeline("before", &[]), None).assert_code(0);
    let db = flows.db();
    let before = snapshot(&flows.path("runs.db"));

    let runs = read_only(flows.dir.path(), &["flow", "runs", "--db", &db, "--json"]);
    runs.assert_code(0);
    assert_eq!(runs.json()[0]["run_id"], "before", "{}", runs.stderr);
    let history = read_only(
        flows.dir.path(),
        &["flow", "history", "before", "--db", &db],
    );
    history.assert_code(0);
    assert!(history.stdout.contains("last"), "{}", history.stdout);
    read_only(
        flows.dir.path(),
        &["flow", "decisions", "before", "--db", &db],
    )
    .assert_code(0);

    let single = flows.path("first.yaml").display().to_string();
    let model = ["--model", "none", "--base-url", "http://127.0.0.1:9/v1"];
    let mut args = vec!["flow", "run", single.as_str(), "--db", db.as_str()];
    args.extend(model);
    let run = read_only(flows.dir.path(), &args);
    run.assert_code(1);
    assert!(run.stderr.contains("read-only"), "{}", run.stderr);
    let fresh = flows.path("fresh.db").display().to_string();
    let mut args = vec!["flow", "run", single.as_str(), "--db", fresh.as_str()];
    args.extend(model);
    let run = read_only(flows.dir.path(), &args);
    run.assert_code(1);
    assert!(run.stderr.contains("read-only"), "{}", run.stderr);
    assert_eq!(snapshot(&flows.path("runs.db")), before);
}
