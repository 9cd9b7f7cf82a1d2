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
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("rlm mock-lm starts"),
    );
    // The URLs, one a line on stdout: OpenAI-compatible, then Anthropic.
    let stdout = server.0.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines().map_while(Result::ok);
    let url = lines.next().expect("the server prints its OpenAI URL");
    let anthropic = lines.next().expect("the server prints its Anthropic URL");
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    assert_eq!(url, format!("{anthropic}/v1"));
    assert_ne!(
        url, "http://127.0.0.1:0/v1",
        "`--port 0` prints the port it got"
    );

    // `/v1/models` lists the script's models.
    let models = http_get(&format!("{url}/models"));
    let ids: Vec<&str> = models["data"]
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(|m| m["id"].as_str())
        .collect();
    assert_eq!(ids, ["root-model", "sub-model"]);

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
    assert!(
        run.stderr.contains("bad.json") && run.stderr.contains("scripts/sample.json"),
        "names the file and where the format is: {}",
        run.stderr
    );

    // A script that is not there: the reason said once, not again as its own cause.
    let missing = dir.path().join("missing.json");
    let run = rlm(
        &[
            "mock-lm".to_owned(),
            "--script".to_owned(),
            missing.to_str().expect("utf-8").to_owned(),
        ],
        None,
    );
    run.assert_code(1);
    assert!(run.stderr.contains("missing.json"), "{}", run.stderr);
    assert_eq!(
        run.stderr.matches("No such file or directory").count(),
        1,
        "{}",
        run.stderr
    );
}

/// `GET url` (plain HTTP/1.0 on 127.0.0.1), the body as JSON.
fn http_get(url: &str) -> serde_json::Value {
    use std::io::{Read, Write};
    let rest = url.strip_prefix("http://").expect("http URL");
    let (host, path) = rest.split_once('/').expect("a path");
    let mut stream = std::net::TcpStream::connect(host).expect("connect");
    write!(stream, "GET /{path} HTTP/1.0\r\nHost: {host}\r\n\r\n").expect("send");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read");
    let (_, body) = response.split_once("\r\n\r\n").expect("headers end");
    serde_json::from_str(body).expect("JSON body")
}
