//! The crash reporter: a fatal signal names the running block on stderr and exits with the
//! code given to `install`. Each case re-runs this test binary as a child that crashes.

use std::process::Command;

/// Set in the child: the signal to die of.
const CHILD: &str = "RLM_FATAL_TEST_SIGNAL";
const TEST: &str = "fatal::a_fatal_signal_names_the_running_block_and_exits_with_the_code";

#[test]
fn a_fatal_signal_names_the_running_block_and_exits_with_the_code() {
    if let Some(signal) = std::env::var(CHILD).ok().and_then(|s| s.parse().ok()) {
        crash(signal);
    }
    let cases = [
        (libc::SIGSEGV, "SIGSEGV (segmentation fault)", true),
        (libc::SIGBUS, "SIGBUS (bus error)", true),
        (libc::SIGFPE, "SIGFPE (arithmetic fault)", true),
        (libc::SIGILL, "SIGILL (illegal instruction)", true),
        (libc::SIGABRT, "SIGABRT (abort)", true),
        // After the block ended, the line says no block was running.
        (
            -libc::SIGSEGV,
            "SIGSEGV (segmentation fault) outside any block",
            false,
        ),
    ];
    for (signal, name, in_block) in cases {
        let output = Command::new(std::env::current_exe().expect("test binary"))
            .args(["--exact", TEST, "--nocapture"])
            .env(CHILD, signal.to_string())
            .output()
            .expect("child runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(42), "{name}: {stderr}");
        let line = stderr
            .lines()
            .find(|l| l.starts_with("rlm: fatal signal"))
            .unwrap_or_else(|| panic!("{name}: no report in {stderr}"));
        assert!(line.contains(name), "{line}");
        if in_block {
            assert!(
                line.contains("while running block 3 of iteration 2 (`import ctypes`)"),
                "{line}"
            );
        }
    }
}

/// In the child: install the reporter, describe a block, die of `signal` (negative: after
/// the block ended).
fn crash(signal: i32) -> ! {
    kernel::fatal::install(42).expect("installs");
    kernel::fatal::set_running_block(2, 2, "\n  import ctypes\nctypes.string_at(0)");
    if signal < 0 {
        kernel::fatal::clear_running_block();
    }
    // SAFETY: raising a signal in our own (child) process is what the test is about.
    unsafe { libc::raise(signal.abs()) };
    unreachable!("the handler exits");
}
