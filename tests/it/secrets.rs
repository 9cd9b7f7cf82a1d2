//! Secrets: API keys never reach the model's code, and no known secret reaches any output.
//!
//! Each run is against a mock that requires the key and records every request's headers and
//! body, so "the run authenticated" and "the key went nowhere but its auth header" are both
//! checked on what actually crossed the wire.

use std::path::Path;

use bridge::mock::{FaultKind, FaultRule, Faults, MockConfig, RequestRecord, Script};

use crate::support::{Mock, Run, file, repl, rlm_with};

const KEY: &str = "sk-e2e-key-7f3a9c1d5b";
/// A key of another service, in the environment but not used by the run.
const OTHER_KEY: &str = "gsk-unrelated-key-4e8b2a";
/// A value given to the run with `--secret`.
const PASSWORD: &str = "hunter2-but-longer-91";

/// A mock requiring `KEY`, recording requests, whose models reply as `models` says.
fn keyed_mock(models: serde_json::Value, faults: Faults) -> Mock {
    Mock::start_with(MockConfig {
        script: Script::from_json_value(serde_json::json!({ "models": models }))
            .expect("valid script"),
        api_key: Some(KEY.into()),
        record_requests: true,
        faults,
        ..MockConfig::default()
    })
}

/// The first request to `model` fails with a 500: the retry must authenticate too.
fn first_call_fails(faults: Faults, model: &str) -> Faults {
    faults.with_rule(FaultRule {
        model: Some(format!("^{model}$")),
        ..FaultRule::matching("", FaultKind::ServerError).times(1)
    })
}

/// Code that looks for keys everywhere a model's code could, and prints what it found
/// hex-encoded (so that redaction, which would hide a key in plain text, cannot hide a leak);
/// [`found_by_probe`] reads it back.
fn probe() -> String {
    r#"import os, subprocess, tempfile
found = [repr(dict(os.environ)), repr(os.environb), str(os.getenv("OPENAI_API_KEY")),
         str(os.getenv("GROQ_API_KEY")), str(os.environ.get("MY_SERVICE_TOKEN"))]
found.append(open("/proc/self/environ", "rb").read().decode("latin-1"))
found.append(subprocess.run(["env"], capture_output=True, text=True).stdout)
out = os.path.join(tempfile.gettempdir(), "env.system")
os.system(f"env > {out}")
found.append(open(out).read())
print("probed", "OPENAI_API_KEY" in os.environ, "PATH" in os.environ)
print("found:", "\n".join(found).encode().hex())"#
        .to_owned()
}

/// What [`probe`] found, from the trajectory it printed into.
fn found_by_probe(trajectory: &Path) -> String {
    let text = std::fs::read_to_string(trajectory).expect("trajectory");
    let hex = text
        .split("found: ")
        .nth(1)
        .and_then(|rest| rest.split(['\\', '"']).next())
        .expect("the probe ran");
    let bytes: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Asserts that `text` (named `what`) holds none of `values`.
#[track_caller]
fn assert_free_of(what: &str, text: &str, values: &[&str]) {
    for value in values {
        assert!(!text.contains(value), "{what} shows `{value}`:\n{text}");
    }
}

/// Asserts that the only place `key` crossed the wire is the auth header `header`.
#[track_caller]
fn assert_key_only_in_header(log: &[RequestRecord], key: &str, header: &str, others: &[&str]) {
    assert!(!log.is_empty());
    for record in log {
        let body = record.body.as_deref().expect("bodies recorded");
        assert_free_of("a request body", body, &[key]);
        assert_free_of("a request body", body, others);
        let carrying: Vec<&str> = record
            .headers
            .iter()
            .filter(|(_, value)| value.contains(key))
            .map(|(name, _)| name.as_str())
            .collect();
        assert_eq!(carrying, [header], "{record:?}");
        for (_, value) in &record.headers {
            assert_free_of("a request header", value, others);
        }
    }
}

/// `rlm run` against `mock` over a small context in `dir`, with a trajectory, plus `args`
/// and `envs`; returns the run and its trajectory's path.
fn run_keyed(
    mock: &Mock,
    dir: &Path,
    args: &[&str],
    envs: &[(&str, &str)],
) -> (Run, std::path::PathBuf) {
    let context = file(dir, "c.txt", "some text");
    let trajectory = dir.join("t.jsonl");
    let mut all = vec![
        "--context",
        context.to_str().expect("utf-8"),
        "--query",
        "q",
        "--trajectory",
        trajectory.to_str().expect("utf-8"),
    ];
    all.extend_from_slice(args);
    (mock.run_env(&all, envs), trajectory)
}

/// Everything a run wrote: stdout, stderr and the trajectory.
fn outputs(run: &Run, trajectory: &Path) -> Vec<(&'static str, String)> {
    vec![
        ("stdout", run.stdout.clone()),
        ("stderr", run.stderr.clone()),
        (
            "the trajectory",
            std::fs::read_to_string(trajectory).expect("trajectory written"),
        ),
    ]
}

#[test]
fn model_code_finds_no_key_and_every_endpoint_still_authenticates() {
    let dir = tempfile::tempdir().expect("tempdir");
    let faults = first_call_fails(
        first_call_fails(Faults::none(), "root-model"),
        "other-model",
    );
    let mock = keyed_mock(
        serde_json::json!({
            "root-model": {"replies": [
                repl(&probe()),
                repl("print(llm_query('ping', model='other'))\nprint(llm_query('pong'))"),
                "FINAL(done)",
            ]},
            "sub-model": {"replies": [{"behaviour": "echo"}]},
            "other-model": {"replies": [{"behaviour": "echo"}]}
        }),
        faults,
    );
    let (run, trajectory) = run_keyed(
        &mock,
        dir.path(),
        &["--extra-model", "other=other-model", "--json"],
        &[("OPENAI_API_KEY", KEY), ("GROQ_API_KEY", OTHER_KEY)],
    );
    run.assert_code(0);
    assert_eq!(run.json()["answer"], "done");

    let found = found_by_probe(&trajectory);
    assert!(
        found.contains("PATH="),
        "the probes read real environments:\n{found}"
    );
    assert_free_of("what the code found", &found, &[KEY, OTHER_KEY]);
    let trajectory_text = std::fs::read_to_string(&trajectory).expect("trajectory");
    assert!(
        trajectory_text.contains("probed False True"),
        "{trajectory_text}"
    );
    for (what, text) in outputs(&run, &trajectory) {
        assert_free_of(what, &text, &[KEY, OTHER_KEY]);
    }

    let log = mock.log().entries();
    assert_key_only_in_header(&log, KEY, "authorization", &[OTHER_KEY]);
    let statuses = |model: &str| -> Vec<u16> {
        log.iter()
            .filter(|r| r.model == model)
            .map(|r| r.status)
            .collect()
    };
    assert_eq!(statuses("root-model"), [500, 200, 200, 200], "{log:#?}");
    assert_eq!(statuses("other-model"), [500, 200]);
    assert_eq!(statuses("sub-model"), [200]);
}

#[test]
fn a_key_named_in_rlm_toml_is_removed_and_anthropic_sends_it_as_x_api_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mock = keyed_mock(
        serde_json::json!({
            "claude-root": {"replies": [repl(&probe()), "FINAL(done)"]}
        }),
        first_call_fails(Faults::none(), "claude-root"),
    );
    let config = file(
        dir.path(),
        "rlm.toml",
        "[run]\nprovider = \"anthropic\"\napi-key-env = \"MY_SERVICE_TOKEN\"\n",
    );
    let context = file(dir.path(), "c.txt", "some text");
    let trajectory = dir.path().join("t.jsonl");
    let base_url = mock.url();
    let run = rlm_with(
        &[
            "--config",
            config.to_str().expect("utf-8"),
            "run",
            "--base-url",
            base_url.trim_end_matches("/v1"),
            "--model",
            "claude-root",
            "--context",
            context.to_str().expect("utf-8"),
            "--query",
            "q",
            "--trajectory",
            trajectory.to_str().expect("utf-8"),
        ]
        .map(str::to_owned),
        None,
        &[("MY_SERVICE_TOKEN", KEY)],
    );
    run.assert_code(0);
    assert_eq!(run.last_line(), "done");
    let found = found_by_probe(&trajectory);
    assert_free_of("what the code found", &found, &[KEY]);
    for (what, text) in outputs(&run, &trajectory) {
        assert_free_of(what, &text, &[KEY]);
    }
    assert_key_only_in_header(&mock.log().entries(), KEY, "x-api-key", &[]);
}

#[test]
fn a_secret_printed_by_code_is_redacted_in_every_output() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mock = keyed_mock(
        serde_json::json!({
            "root-model": {"replies": [
                // A model that learned the value elsewhere: its own words are redacted too. Its
                // code finds the value on its own (a worker's environment does not have it).
                format!("I recall the password is {PASSWORD}.\n{}", repl(
                    "import os, sys\npw = 'hunter2-' + 'but-longer-91'\nprint('password:', pw)\n\
                     print('to stderr', pw, file=sys.stderr)\necho = llm_query('repeat ' + pw)\n\
                     long = llm_query('x' * 293 + pw + 'y' * 1000)\n\
                     print('echo:', echo)\nraise ValueError('bad password ' + pw)"
                )),
                "FINAL_VAR(pw)",
            ]},
            "sub-model": {"replies": [{"behaviour": "echo"}]}
        }),
        Faults::none(),
    );
    let answer = dir.path().join("answer.txt");
    let (run, trajectory) = run_keyed(
        &mock,
        dir.path(),
        &[
            // The readable trace and the info logs on stderr.
            "-v",
            "--secret",
            "DB_PASSWORD",
            "--answer-file",
            answer.to_str().expect("utf-8"),
            "--json",
        ],
        &[("OPENAI_API_KEY", KEY), ("DB_PASSWORD", PASSWORD)],
    );
    run.assert_code(0);
    let json = run.json();
    assert_eq!(json["answer"], "[redacted]");
    assert_eq!(
        std::fs::read_to_string(&answer).expect("answer file"),
        "[redacted]"
    );
    let first = &json["iterations"][0]["blocks"][0];
    let shown = first.to_string();
    assert!(shown.contains("password: [redacted]"), "{shown}");
    assert!(shown.contains("echo: repeat [redacted]"), "{shown}");
    assert!(shown.contains("bad password [redacted]"), "{shown}");
    assert!(
        run.stderr.contains("I recall the password is [redacted]."),
        "the trace shows the reply: {}",
        run.stderr
    );
    for (what, text) in outputs(&run, &trajectory) {
        // `xhunter2`: the head of the long prompt, had it been cut before it was redacted.
        assert_free_of(what, &text, &[PASSWORD, KEY, "xhunter2"]);
    }
    // The model never read it: not in the block output fed back, not in the sub-call.
    assert_key_only_in_header(&mock.log().entries(), KEY, "authorization", &[PASSWORD]);
}

#[test]
fn an_error_message_never_shows_a_secret() {
    let dir = tempfile::tempdir().expect("tempdir");
    let context = file(dir.path(), "c.txt", "some text");
    // A mistyped flag that pasted the secret: the error quotes the value it got.
    let run = rlm_with(
        &[
            "run",
            "--model",
            "m",
            "--base-url",
            "http://127.0.0.1:9/v1",
            "--context",
            context.to_str().expect("utf-8"),
            "--query",
            "q",
            "--secret",
            "DB_PASSWORD",
            "--extra-model",
            PASSWORD,
        ]
        .map(str::to_owned),
        None,
        &[("DB_PASSWORD", PASSWORD)],
    );
    assert!(matches!(run.code, Some(1 | 2)), "{run:?}");
    assert!(run.stderr.contains("got `[redacted]`"), "{}", run.stderr);
    assert_free_of("stderr", &run.stderr, &[PASSWORD]);
}

#[test]
fn a_secret_that_is_unset_or_too_short_is_a_usage_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let context = file(dir.path(), "c.txt", "some text");
    let run_with = |envs: &[(&str, &str)]| {
        rlm_with(
            &[
                "run",
                "--model",
                "m",
                "--context",
                context.to_str().expect("utf-8"),
                "--query",
                "q",
                "--secret",
                "DB_PASSWORD",
            ]
            .map(str::to_owned),
            None,
            envs,
        )
    };
    let unset = run_with(&[]);
    unset.assert_code(2);
    assert!(
        unset
            .stderr
            .contains("the environment variable `DB_PASSWORD` is not set"),
        "{}",
        unset.stderr
    );
    let short = run_with(&[("DB_PASSWORD", "1234")]);
    short.assert_code(2);
    assert!(
        short.stderr.contains("shorter than 8 characters"),
        "{}",
        short.stderr
    );
}

#[test]
fn rlm_chat_keeps_keys_from_code_too() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mock = keyed_mock(
        serde_json::json!({
            "root-model": {"replies": [repl(&probe()), "FINAL(done)"]}
        }),
        Faults::none(),
    );
    let context = file(dir.path(), "c.txt", "some text");
    let trajectory = dir.path().join("t.jsonl");
    let run = rlm_with(
        &[
            "chat",
            "--base-url",
            &mock.url(),
            "--model",
            "root-model",
            "--context",
            context.to_str().expect("utf-8"),
            "--trajectory",
            trajectory.to_str().expect("utf-8"),
        ]
        .map(str::to_owned),
        Some(b"what is in it?\n"),
        &[("OPENAI_API_KEY", KEY)],
    );
    run.assert_code(0);
    assert_eq!(run.last_line(), "done");
    let found = found_by_probe(&trajectory);
    assert_free_of("what the code found", &found, &[KEY]);
    assert_free_of("stdout", &run.stdout, &[KEY]);
    assert_free_of("stderr", &run.stderr, &[KEY]);
    assert_key_only_in_header(&mock.log().entries(), KEY, "authorization", &[]);
}

#[test]
fn a_dry_run_shows_the_first_request_as_sent_with_secrets_redacted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let context = file(dir.path(), "c.txt", "some text");
    let query = format!("is {PASSWORD} strong?");
    let run = rlm_with(
        &[
            "run",
            "--dry-run",
            "--base-url",
            "http://127.0.0.1:9/v1",
            "--model",
            "m",
            "--context",
            context.to_str().expect("utf-8"),
            "--query",
            &query,
            "--secret",
            "DB_PASSWORD",
        ]
        .map(str::to_owned),
        None,
        &[("DB_PASSWORD", PASSWORD)],
    );
    run.assert_code(0);
    assert!(
        run.stdout.contains("is [redacted] strong?"),
        "{}",
        run.stdout
    );
    assert_free_of("stdout", &run.stdout, &[PASSWORD]);
}

#[test]
fn a_remote_endpoint_still_finds_its_key_after_it_left_the_environment() {
    let dir = tempfile::tempdir().expect("tempdir");
    let context = file(dir.path(), "c.txt", "some text");
    // A dry run checks the endpoints and calls nothing: no traffic leaves this machine.
    let run = rlm_with(
        &[
            "run",
            "--dry-run",
            "--base-url",
            "https://api.example.invalid/v1",
            "--model",
            "m",
            "--context",
            context.to_str().expect("utf-8"),
            "--query",
            "q",
        ]
        .map(str::to_owned),
        None,
        &[("OPENAI_API_KEY", KEY)],
    );
    run.assert_code(0);
    assert_free_of("stdout", &run.stdout, &[KEY]);
}
