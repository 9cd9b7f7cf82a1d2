//! `rlm mock-lm`: the mock server as a command, driven by `rlm run`.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use crate::support::{file, repl, rlm};

/// Stops the server whatever the test does.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn mock_lm_serves_a_script_that_rlm_run_completes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let script = serde_json::json!({
        "models": {
            "root-model": {"replies": [repl("r = llm_query('ping')\nprint(r)"), "FINAL_VAR(r)"]},
            "sub-model": {"replies": ["pong"]}
        }
    });
    let script = file(dir.path(), "script.json", &script.to_string());
    let mut server = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_rlm"))
            .args(["mock-lm", "--port", "0", "--latency-ms", "5", "--script"])
            .arg(&script)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("rlm mock-lm starts"),
    );
    let stderr = server.0.stderr.take().expect("stderr");
    let mut lines = BufReader::new(stderr).lines().map_while(Result::ok);
    let url = lines
        .find_map(|line| {
            line.split_once("OpenAI-compatible:")
                .map(|(_, url)| url.trim().to_owned())
        })
        .expect("the server prints its URL");
    // Keep reading what else it says, as a terminal would.
    std::thread::spawn(move || lines.for_each(drop));
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");

    let context = file(dir.path(), "c.txt", "text");
    let run = rlm(
        &[
            "run",
            "--base-url",
            &url,
            "--model",
            "root-model",
            "--sub-model",
            "sub-model",
            "--context",
            context.to_str().expect("utf-8"),
            "--query",
            "q",
        ]
        .map(str::to_owned),
        None,
    );
    drop(server);
    run.assert_code(0);
    assert_eq!(run.last_line(), "pong");
}

#[test]
fn mock_lm_rejects_a_bad_script_clearly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let script = file(
        dir.path(),
        "bad.json",
        "{\"models\": {\"m\": {\"replies\": 3}}}",
    );
    let run = rlm(
        &[
            "mock-lm".to_owned(),
            "--port".to_owned(),
            "0".to_owned(),
            "--script".to_owned(),
            script.to_str().expect("utf-8").to_owned(),
        ],
        None,
    );
    run.assert_code(1);
    assert!(run.stderr.contains("bad.json"), "{}", run.stderr);
}
