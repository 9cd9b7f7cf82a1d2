//! Cells that would end the process: `os._exit` and friends end only the block; a crash in C
//! code ends `rlm` with exit code 4, one line naming the block, and a trajectory whose last line
//! is that block.

use crate::support::{repl, run_replies_traced};

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
    let (_mock, run, lines) = run_replies_traced(&["Reading memory.", &crash, "FINAL(never)"], &[]);
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
