//! The mock LM server over real HTTP, driven with plain reqwest.

use std::time::Duration;

use bridge::mock::{Latency, MockConfig, MockServer, SAMPLE_SCRIPT, Script};
use serde_json::{Value, json};

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("reqwest client")
}

async fn start(config: MockConfig) -> MockServer {
    MockServer::start(config).await.expect("mock server starts")
}

async fn start_script(script: &str) -> MockServer {
    let script = Script::from_json_str(script).expect("valid script");
    start(MockConfig {
        script,
        ..MockConfig::default()
    })
    .await
}

fn openai_body(model: &str, messages: Value) -> Value {
    json!({ "model": model, "messages": messages })
}

fn user(text: &str) -> Value {
    json!([{ "role": "user", "content": text }])
}

async fn post(server: &MockServer, path: &str, body: &Value) -> reqwest::Response {
    client()
        .post(format!("{}{path}", server.anthropic_base_url()))
        .json(body)
        .send()
        .await
        .expect("request sent")
}

/// Sends an OpenAI chat request and returns the reply text.
async fn openai_text(server: &MockServer, model: &str, messages: Value) -> String {
    let resp = post(
        server,
        "/v1/chat/completions",
        &openai_body(model, messages),
    )
    .await;
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.expect("JSON body");
    v["choices"][0]["message"]["content"]
        .as_str()
        .expect("content")
        .to_owned()
}

#[tokio::test]
async fn openai_json_echoes_by_default_with_usage_and_ids() {
    let server = start(MockConfig::default()).await;
    let resp = post(
        &server,
        "/v1/chat/completions",
        &openai_body(
            "any",
            json!([
                { "role": "system", "content": "be brief" },
                { "role": "user", "content": "hello there" }
            ]),
        ),
    )
    .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "application/json");
    let v: Value = resp.json().await.expect("JSON");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], "any");
    assert_eq!(v["id"], "chatcmpl-mock-0");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(v["choices"][0]["message"]["content"], "hello there");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    // "be brief" + "hello there" = 19 bytes → 5 tokens; "hello there" = 11 bytes → 3 tokens.
    assert_eq!(
        v["usage"],
        json!({ "prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8 })
    );
    server.shutdown().await;
}

#[tokio::test]
async fn anthropic_json_has_content_blocks_stop_reason_and_usage() {
    let server = start(MockConfig::default()).await;
    let body = json!({
        "model": "claude-mock", "max_tokens": 100, "system": "sys",
        "messages": [{ "role": "user", "content": [{ "type": "text", "text": "ping" }] }]
    });
    let resp = post(&server, "/v1/messages", &body).await;
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.expect("JSON");
    assert_eq!(v["type"], "message");
    assert_eq!(v["id"], "msg_mock_0");
    assert_eq!(v["model"], "claude-mock");
    assert_eq!(v["content"], json!([{ "type": "text", "text": "ping" }]));
    assert_eq!(v["stop_reason"], "end_turn");
    assert_eq!(v["usage"], json!({ "input_tokens": 2, "output_tokens": 1 }));
    server.shutdown().await;
}

#[tokio::test]
async fn replies_follow_the_turn_and_fall_back() {
    let server = start_script(SAMPLE_SCRIPT).await;
    let turn0 = openai_text(&server, "root", user("go")).await;
    assert!(turn0.contains("```repl"), "{turn0}");
    let history = json!([
        { "role": "user", "content": "go" },
        { "role": "assistant", "content": "..." },
        { "role": "user", "content": "output" }
    ]);
    assert_eq!(openai_text(&server, "root", history).await, "FINAL(42)");
    let long = json!([
        { "role": "user", "content": "go" }, { "role": "assistant", "content": "a" },
        { "role": "user", "content": "b" }, { "role": "assistant", "content": "c" },
        { "role": "user", "content": "d" }
    ]);
    assert_eq!(
        openai_text(&server, "root", long).await,
        "FINAL(no more turns)"
    );
    // Unknown model → "*" entry → echo.
    assert_eq!(openai_text(&server, "who", user("same")).await, "same");
    server.shutdown().await;
}

#[tokio::test]
async fn last_reply_repeats_without_fallback() {
    let server = start_script(r#"{"models": {"m": {"replies": ["a", "b"]}}}"#).await;
    let three_turns = json!([
        { "role": "assistant", "content": "1" }, { "role": "assistant", "content": "2" },
        { "role": "assistant", "content": "3" }, { "role": "user", "content": "x" }
    ]);
    assert_eq!(openai_text(&server, "m", three_turns).await, "b");
    // No "*" entry: unknown models echo.
    assert_eq!(openai_text(&server, "other", user("x")).await, "x");
    server.shutdown().await;
}

#[tokio::test]
async fn fixed_latency_delays_and_is_logged() {
    let config = MockConfig {
        latency: Latency::fixed(Duration::from_millis(100)),
        ..MockConfig::default()
    };
    let server = start(config).await;
    openai_text(&server, "m", user("hi")).await;
    let entries = server.log().entries();
    assert_eq!(entries.len(), 1);
    let r = &entries[0];
    assert!(
        r.finished - r.arrived >= Duration::from_millis(100),
        "{r:?}"
    );
    assert_eq!(
        (r.path.as_str(), r.model.as_str(), r.status),
        ("/v1/chat/completions", "m", 200)
    );
    assert_eq!(
        (r.last_user.as_str(), r.stream, r.fault.as_deref()),
        ("hi", false, None)
    );
    assert!(r.request_bytes > 0 && r.response_bytes > 0);
    server.shutdown().await;
}

#[tokio::test]
async fn concurrent_requests_overlap_in_the_log() {
    let config = MockConfig {
        latency: Latency::fixed(Duration::from_millis(100)),
        ..MockConfig::default()
    };
    let server = start(config).await;
    let calls = (0..50).map(|i| {
        let server = &server;
        async move { openai_text(server, "m", user(&format!("q{i}"))).await }
    });
    let replies = futures::future::join_all(calls).await;
    assert_eq!(replies[7], "q7");
    let log = server.log();
    assert_eq!(log.len(), 50);
    assert_eq!(log.max_concurrency(), 50);
    log.clear();
    assert_eq!((log.len(), log.max_concurrency()), (0, 0));
    server.shutdown().await;
}
