//! The README's examples, pasted in order: every ```` ```sh tested ```` block of the README's
//! tour, then of the guides that continue it, runs in one bash session, as a reader pastes
//! them into one shell.
//!
//! The session starts in a folder that looks like the repository after `cargo build
//! --release`: the repository's files (linked), and the binary under test at
//! `target/release/rlm`; the tour's `cargo build --release` is the only line that does not
//! run (the binary is built). Its `mktemp` goes to a folder of the test. Bounded in time;
//! any process the examples leave running fails the test (a mock server not stopped).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The documents whose tested blocks run, in the order a reader follows them.
const DOCS: [&str; 2] = ["README.md", "kernel/cli/docs/agents.md"];

/// What the whole session may take.
const LIMIT: Duration = Duration::from_secs(180);

/// The bodies of the ```` ```sh tested ```` blocks of `markdown`, in order.
fn tested_blocks(markdown: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in markdown.lines() {
        match current.as_mut() {
            None if line.trim_end() == "```sh tested" => current = Some(String::new()),
            None => {}
            Some(_) if line.trim_end() == "```" => blocks.extend(current.take()),
            Some(block) => {
                block.push_str(line);
                block.push('\n');
            }
        }
    }
    assert!(current.is_none(), "a tested block is never closed");
    blocks
}

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the repository's folder")
}

/// Whether a process of group `group` still runs.
fn group_alive(group: u32) -> bool {
    Command::new("kill")
        .args(["-0", "--", &format!("-{group}")])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn kill_group(group: u32) {
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{group}")])
        .stderr(Stdio::null())
        .status();
}

#[test]
fn the_readme_examples_work_pasted_in_order() {
    let repo = repository();
    let mut blocks = Vec::new();
    for doc in DOCS {
        let text = std::fs::read_to_string(repo.join(doc)).expect("read the document");
        let found = tested_blocks(&text);
        assert!(!found.is_empty(), "`{doc}` has no ```sh tested block");
        blocks.extend(found);
    }
    let hidden = regex::Regex::new(r"(2>|&>)\s*/dev/null|/dev/null\s*2>&1").expect("regex");
    for block in &blocks {
        assert!(
            !hidden.is_match(block),
            "an example hides its errors (stderr to /dev/null):\n{block}"
        );
    }

    // The checkout as a reader has it after `cargo build --release`.
    let dir = tempfile::tempdir().expect("tempdir");
    let checkout = dir.path().join("rlm-kernel");
    std::fs::create_dir_all(checkout.join("target/release")).expect("mkdir");
    for entry in std::fs::read_dir(&repo).expect("list the repository") {
        let name = entry.expect("entry").file_name();
        if name != "target" && name != ".git" {
            std::os::unix::fs::symlink(repo.join(&name), checkout.join(&name)).expect("link");
        }
    }
    std::os::unix::fs::symlink(
        env!("CARGO_BIN_EXE_rlm"),
        checkout.join("target/release/rlm"),
    )
    .expect("link the binary");
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).expect("mkdir tmp");

    let script = format!(
        "shopt -s expand_aliases\nset -euo pipefail\n\
         cargo() {{ [ \"$*\" = 'build --release' ] || {{ echo \"unexpected: cargo $*\" >&2; return 1; }}; }}\n\
         {}",
        blocks.concat()
    );
    let stdout_path = dir.path().join("stdout");
    let stderr_path = dir.path().join("stderr");
    let mut cmd = Command::new("bash");
    cmd.arg("-c")
        .arg(&script)
        .current_dir(&checkout)
        .env("TMPDIR", &tmp)
        .env("NO_COLOR", "1")
        .env_remove("OPENAI_API_KEY")
        .env_remove("ANTHROPIC_API_KEY")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout_path).expect("stdout file"))
        .stderr(std::fs::File::create(&stderr_path).expect("stderr file"));
    for (key, _) in std::env::vars() {
        if key.starts_with("RLM_") {
            cmd.env_remove(key);
        }
    }
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut child = cmd.spawn().expect("bash starts");
    let group = child.id();
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for bash") {
            break Some(status);
        }
        if started.elapsed() > LIMIT {
            kill_group(group);
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // What the examples started must have stopped with them (`kill $MOCK`).
    let left_running = {
        let deadline = Instant::now() + Duration::from_secs(5);
        while group_alive(group) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        group_alive(group)
    };
    kill_group(group);

    let stdout = std::fs::read_to_string(&stdout_path).expect("stdout");
    let stderr = std::fs::read_to_string(&stderr_path).expect("stderr");
    let shown = format!("--- stdout\n{stdout}\n--- stderr\n{stderr}");
    let status = status.unwrap_or_else(|| panic!("the examples ran over {LIMIT:?}\n{shown}"));
    assert!(status.success(), "the examples failed: {status}\n{shown}");
    assert!(
        !left_running,
        "the examples left a process running\n{shown}"
    );
    // The tour's run answers the count of its log, through the sample script's sub-calls.
    assert!(stdout.lines().any(|l| l == "2"), "{shown}");
    assert!(
        stderr.contains("check: every scripted run scored 1"),
        "{shown}"
    );
    // The agent example saved its document and showed it.
    assert!(stdout.contains("Saved the brief."), "{shown}");
    assert!(stdout.contains("Onboarding takes too long."), "{shown}");
}
