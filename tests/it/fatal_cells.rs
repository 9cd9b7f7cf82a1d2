//! Cells that would end the process: `os._exit` and friends end only the block; with
//! `--isolation none` a crash in C code ends `rlm` with exit code 4, one line naming the block,
//! and a trajectory whose last line is that block, which `rlm view` and `rlm show` show as the
//! block that crashed (in a worker, the default, the run survives it: see `isolation.rs`).

use crate::support::{repl, rlm, run_replies, run_replies_traced};

#[test]
fn os_exit_abort_and_kill_self_end_only_the_block() {
    for call in [
        "os._exit(3)",
        "os.abort()",
        "os.kill(os.getpid(), signal.SIGTERM)",
    ] {
        let first = repl(&format!("import os, signal\nx = 41\n{call}"));
        let (mock, run, lines) = run_replies_traced(&[&first, &repl("FINAL_VAR(x + 1)")], &[]);
        run.assert_code(0);
        assert_eq!(run.last_line(), "42", "{call}: the session kept `x`");
        assert_eq!(mock.root_requests(), 2, "{call}");
        let first_iteration = lines
            .iter()
            .find(|l| l["type"] == "iteration")
            .expect("iteration line");
        let error = &first_iteration["blocks"][0]["error"];
        assert_eq!(error["type_name"], "ProcessExit", "{call}");
        assert!(
            error["message"]
                .as_str()
                .is_some_and(|m| m.contains("would end the whole rlm process")),
            "{call}: {error}"
        );
    }
}

#[test]
fn a_crash_in_c_code_is_reported_and_the_trajectory_names_the_block() {
    let crash = repl("import ctypes\nx = 1\nctypes.string_at(0)");
    let (_mock, run, lines) = run_replies_traced(
        &["Reading memory.", &crash, "FINAL(never)"],
        &["--isolation", "none"],
    );
    run.assert_code(4);
    let reports: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| l.starts_with("rlm: fatal signal"))
        .collect();
    assert_eq!(
        reports,
        [
            "rlm: fatal signal SIGSEGV (segmentation fault) while running block 1 of iteration 2 \
          (`import ctypes`); a crash in C code cannot be survived, the trajectory's last line \
          names the block"
        ],
        "{}",
        run.stderr
    );
    let kinds: Vec<&str> = lines.iter().filter_map(|l| l["type"].as_str()).collect();
    assert_eq!(
        kinds,
        ["header", "reply", "iteration", "reply", "block"],
        "the reply and the block are on disk before the block runs"
    );
    let last = lines.last().expect("lines");
    assert_eq!(last["iteration"], 2);
    assert_eq!(last["index"], 0);
    assert_eq!(last["code"], "import ctypes\nx = 1\nctypes.string_at(0)");
}

/// What `rlm view` and `rlm show` make of the crashed run's trajectory: every line read (no
/// note of skipped lines), and the block that crashed shown as such, after the one iteration
/// that finished.
#[test]
fn view_and_show_name_the_block_that_crashed() {
    let crash = repl("import ctypes\nx = 1\nctypes.string_at(0)");
    let dir = tempfile::tempdir().expect("tempdir");
    let trajectory = dir.path().join("t.jsonl");
    // In this process (`--isolation none`): in a worker the run would survive the crash.
    let (_mock, run) = run_replies(
        &["Reading memory.", &crash, "FINAL(never)"],
        &[
            "--trajectory",
            trajectory.to_str().expect("utf-8"),
            "--isolation",
            "none",
        ],
    );
    run.assert_code(4);
    let path = trajectory.display().to_string();

    rlm(&["view".into(), path.clone()], None).assert_code(0);
    let html = std::fs::read_to_string(dir.path().join("t.html")).expect("the page");
    assert!(
        !html.contains("Skipped line"),
        "every line is a trajectory line"
    );
    assert!(html.contains("<h2>Iterations (2)</h2>"), "{html}");
    let crashed = &html[html
        .find("rlm-block rlm-crashed")
        .expect("the crashed block")..];
    assert!(crashed.contains("import ctypes\nx = 1\nctypes.string_at(0)"));
    assert!(crashed.contains("The run stopped while this block was running"));

    let show = rlm(&["show".into(), path], None);
    show.assert_code(0);
    let crashed = show
        .stdout
        .find("── iteration 2 · root model")
        .map(|at| &show.stdout[at..])
        .unwrap_or_else(|| panic!("iteration 2 is shown:\n{}", show.stdout));
    assert!(
        crashed.contains("ctypes.string_at(0)")
            && crashed.contains("└ ✗ the run stopped while this block ran"),
        "{}",
        show.stdout
    );
    assert!(
        show.stdout.ends_with(
            "(the trajectory ends here: the run was stopped before it wrote its result)\n"
        ),
        "{}",
        show.stdout
    );
}
