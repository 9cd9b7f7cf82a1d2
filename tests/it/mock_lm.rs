//! `rlm mock-lm`: the mock server as a command, driven by `rlm run`.

use std::io::{BufRead, BufReader};
use std::path::Path;
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
    let (server, url, anthropic) = serve(&script);
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

/// `rlm mock-lm --port 0 --script SCRIPT`, left running until the guard drops, with the two
/// URLs it prints (one a line on stdout: OpenAI-compatible, then Anthropic).
fn serve(script: &Path) -> (KillOnDrop, String, String) {
    let mut server = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_rlm"))
            .args(["mock-lm", "--port", "0", "--latency-ms", "5", "--script"])
            .arg(script)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("rlm mock-lm starts"),
    );
    let stdout = server.0.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines().map_while(Result::ok);
    let url = lines.next().expect("the server prints its OpenAI URL");
    let anthropic = lines.next().expect("the server prints its Anthropic URL");
    (server, url, anthropic)
}

/// The sample script that errors and the mock-server guide point newcomers to is a correct
/// small RLM run: `rlm run --model root --sub-model sub` over a log counts its `ERROR`s through
/// batched sub-calls, no block fails, and the answer is the count.
#[test]
fn the_shipped_sample_script_is_a_correct_small_rlm_run() {
    let sample =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bridge/src/mock/scripts/sample.json");
    let (server, url, _) = serve(&sample);
    let dir = tempfile::tempdir().expect("tempdir");
    // 250 lines, so more than one chunk; 84 of them name `ERROR`, one of them twice.
    let log: String = (0..250)
        .map(|i| match i % 3 {
            0 => format!("{i} ERROR disk full\n"),
            1 if i == 1 => format!("{i} ERROR retry failed: ERROR timeout\n"),
            _ => format!("{i} INFO ok\n"),
        })
        .collect();
    let context = file(dir.path(), "app.log", &log);
    let run = rlm(
        &[
            "run",
            "--base-url",
            &url,
            "--model",
            "root",
            "--sub-model",
            "sub",
            "--context",
            context.to_str().expect("utf-8"),
            "--query",
            "How many times does ERROR occur?",
            "--json",
        ]
        .map(str::to_owned),
        None,
    );
    drop(server);
    run.assert_code(0);
    let result = run.json();
    assert_eq!(result["answer"], "86", "{result}");
    let iterations = result["iterations"].as_array().expect("iterations");
    let blocks: Vec<&serde_json::Value> = iterations
        .iter()
        .flat_map(|i| i["blocks"].as_array().expect("blocks"))
        .collect();
    assert!(!blocks.is_empty(), "the script runs code: {result}");
    for block in &blocks {
        assert!(block["error"].is_null(), "a block failed: {block}");
    }
    let sub_calls: Vec<&serde_json::Value> = iterations
        .iter()
        .flat_map(|i| i["sub_calls"].as_array().expect("sub_calls"))
        .collect();
    assert!(
        sub_calls.len() >= 2,
        "the log is counted in chunks: {result}"
    );
    assert!(sub_calls.iter().all(|c| c["error"].is_null()), "{result}");
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
