//! The mock LM server over real HTTP, driven with plain reqwest.

use std::time::Duration;

use bridge::mock::{
    FaultKind, FaultRule, Faults, Latency, MockConfig, MockOptions, MockServer, SAMPLE_SCRIPT,
    Script,
};
use serde_json::{Value, json};

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        // A test fails, not hangs, when the server never answers.
        .timeout(Duration::from_secs(60))
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
    assert_eq!(
        openai_text(&server, "root", history).await,
        "FINAL_VAR(total)"
    );
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
    // 400 ms: all 50 requests must arrive before the first finishes, even on a busy machine.
    let config = MockConfig {
        latency: Latency::fixed(Duration::from_millis(400)),
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

// ---- streaming --------------------------------------------------------------------------------

/// The JSON payloads of `data:` lines, in order (`[DONE]` kept as a string).
fn sse_data(text: &str) -> Vec<Value> {
    text.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).unwrap_or_else(|_| Value::String(d.to_owned())))
        .collect()
}

#[tokio::test]
async fn openai_sse_streams_deltas_finish_usage_and_done() {
    let server = start(MockConfig::default()).await;
    let prompt = "stream me a fairly long reply so that it is split into several deltas";
    let body = json!({
        "model": "m", "stream": true, "stream_options": { "include_usage": true },
        "messages": [{ "role": "user", "content": prompt }]
    });
    let resp = post(&server, "/v1/chat/completions", &body).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let events = sse_data(&resp.text().await.expect("body"));
    assert_eq!(events.last(), Some(&json!("[DONE]")));
    let chunks = &events[..events.len() - 1];
    assert!(
        chunks
            .iter()
            .all(|c| c["object"] == "chat.completion.chunk" && c["model"] == "m")
    );
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, prompt);
    let pieces = chunks
        .iter()
        .filter(|c| c["choices"][0]["delta"]["content"].is_string())
        .count();
    assert!(pieces > 2, "{pieces} content deltas");
    let finish = &chunks[chunks.len() - 2];
    assert_eq!(finish["choices"][0]["finish_reason"], "stop");
    let usage = &chunks[chunks.len() - 1];
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 18);
    assert!(server.log().entries()[0].stream);

    // Without include_usage there is no usage chunk.
    let body = json!({ "model": "m", "stream": true, "messages": user("x") });
    let events = sse_data(
        &post(&server, "/v1/chat/completions", &body)
            .await
            .text()
            .await
            .expect("body"),
    );
    assert!(events.iter().all(|e| e.get("usage").is_none()));
    server.shutdown().await;
}

#[tokio::test]
async fn anthropic_sse_emits_the_documented_event_sequence() {
    let server = start(MockConfig::default()).await;
    let body = json!({
        "model": "c", "max_tokens": 10, "stream": true,
        "messages": [{ "role": "user", "content": "hello streaming world, one two three four" }]
    });
    let resp = post(&server, "/v1/messages", &body).await;
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let text = resp.text().await.expect("body");
    let names: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .collect();
    let data = sse_data(&text);
    assert_eq!(names.len(), data.len());
    for (name, d) in names.iter().zip(&data) {
        assert_eq!(d["type"], *name);
    }
    let mut expected = vec!["message_start", "ping", "content_block_start"];
    let deltas = names
        .iter()
        .filter(|n| **n == "content_block_delta")
        .count();
    expected.extend(std::iter::repeat_n("content_block_delta", deltas));
    expected.extend(["content_block_stop", "message_delta", "message_stop"]);
    assert_eq!(names, expected);
    let joined: String = data
        .iter()
        .filter(|d| d["type"] == "content_block_delta")
        .map(|d| {
            assert_eq!(d["delta"]["type"], "text_delta");
            d["delta"]["text"].as_str().expect("text").to_owned()
        })
        .collect();
    assert_eq!(joined, "hello streaming world, one two three four");
    assert_eq!(data[0]["message"]["usage"]["input_tokens"], 11);
    let delta = &data[data.len() - 2];
    assert_eq!(delta["delta"]["stop_reason"], "end_turn");
    assert_eq!(delta["usage"]["output_tokens"], 11);
    server.shutdown().await;
}

// ---- rules, behaviours, tool calls --------------------------------------------------------------

#[tokio::test]
async fn rules_and_behaviours_of_the_sample_script() {
    let server = start_script(SAMPLE_SCRIPT).await;
    let count = "Count ERROR in:\nERROR a\nERRORS b\nok ERROR\nERROR_X";
    assert_eq!(openai_text(&server, "sub", user(count)).await, "2");
    assert_eq!(
        openai_text(&server, "sub", user("classify: Disk full")).await,
        "storage"
    );
    assert_eq!(
        openai_text(&server, "sub", user("CLASSIFY: a TIMEOUT, then disk")).await,
        "network"
    );
    assert_eq!(
        openai_text(&server, "sub", user("classify: fine")).await,
        "other"
    );
    assert_eq!(
        openai_text(&server, "sub", user("Say hello to Ada")).await,
        "hello, Ada! (turn 0, model sub)"
    );
    let terse =
        json!([{ "role": "system", "content": "be terse" }, { "role": "user", "content": "q" }]);
    assert_eq!(openai_text(&server, "sub", terse).await, "ok");
    assert_eq!(
        openai_text(&server, "sub", user("no rule")).await,
        "no rule"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn count_word_is_case_sensitive_substring_count() {
    let script = r#"{"models": {"*": {"replies": [{"behaviour": "count_word", "word": "ab"}]}}}"#;
    let server = start_script(script).await;
    assert_eq!(openai_text(&server, "m", user("ab abab AB xab")).await, "4");
    assert_eq!(openai_text(&server, "m", user("nothing")).await, "0");
    server.shutdown().await;
}

#[tokio::test]
async fn label_per_line_labels_each_non_empty_line() {
    let script = r#"{"models": {"*": {"rules": [{
        "last_user": "(?s)^Label:\\n(?P<body>.*)$",
        "reply": {"behaviour": "label", "per_line": true, "case_insensitive": true,
                  "input": "{{body}}", "default": "other",
                  "table": [["refund", "billing"], ["PACKAGE", "delivery"]]}
    }]}}}"#;
    let server = start_script(script).await;
    let text = "Label:\nI want a Refund\n\nwhere is my package\nhello\n";
    assert_eq!(
        openai_text(&server, "m", user(text)).await,
        "billing\ndelivery\nother"
    );
    assert_eq!(openai_text(&server, "m", user("Label:\n")).await, "");
    server.shutdown().await;
}

#[tokio::test]
async fn extract_finds_a_pattern_built_from_the_question() {
    // The key comes from the question and is escaped: `a.b` must not match `axb`.
    let script = r#"{"models": {"*": {"rules": [{
        "last_user": "(?s)^Find (?P<key>\\S+)\\n(?P<body>.*)$",
        "reply": {"behaviour": "extract", "pattern": "code for {{key}} is: (\\d+)",
                  "input": "{{body}}", "default": "NONE"}
    }]}}}"#;
    let server = start_script(script).await;
    let body = "code for axb is: 1\ncode for a.b is: 22\ncode for a.b is: 333";
    assert_eq!(
        openai_text(&server, "m", user(&format!("Find a.b\n{body}"))).await,
        "22"
    );
    assert_eq!(
        openai_text(&server, "m", user(&format!("Find zz\n{body}"))).await,
        "NONE"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn rules_match_model_turn_and_keep_unknown_placeholders() {
    let script = r#"{"models": {"*": {
        "rules": [
            {"model": "^gpt", "turn": 1, "reply": "second turn of {{model}}"},
            {"last_user": "(\\d+)", "reply": "f\"{{x}}\" {{1}} {{2}}"}
        ],
        "replies": ["plain"]
    }}}"#;
    let server = start_script(script).await;
    let turn1 =
        json!([{ "role": "assistant", "content": "a" }, { "role": "user", "content": "b" }]);
    assert_eq!(
        openai_text(&server, "gpt-x", turn1.clone()).await,
        "second turn of gpt-x"
    );
    assert_eq!(openai_text(&server, "claude", turn1).await, "plain");
    assert_eq!(
        openai_text(&server, "m", user("n=42")).await,
        "f\"{{x}}\" 42 {{2}}"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn tool_calls_render_in_both_formats() {
    let server = start_script(SAMPLE_SCRIPT).await;
    let v: Value = post(
        &server,
        "/v1/chat/completions",
        &openai_body("agent", user("go")),
    )
    .await
    .json()
    .await
    .expect("JSON");
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    assert_eq!(choice["message"]["content"], Value::Null);
    let call = &choice["message"]["tool_calls"][0];
    assert_eq!(
        (call["id"].as_str(), call["type"].as_str()),
        (Some("call_0_0"), Some("function"))
    );
    assert_eq!(call["function"]["name"], "python");
    let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().expect("string"))
        .expect("arguments are JSON text");
    assert_eq!(args, json!({ "code": "print(1 + 1)" }));

    let body = json!({ "model": "agent", "max_tokens": 50, "messages": user("go") });
    let v: Value = post(&server, "/v1/messages", &body)
        .await
        .json()
        .await
        .expect("JSON");
    assert_eq!(v["stop_reason"], "tool_use");
    assert_eq!(
        v["content"],
        json!([{ "type": "tool_use", "id": "toolu_0_0", "name": "python", "input": { "code": "print(1 + 1)" } }])
    );

    // Streaming: OpenAI sends the call in deltas, Anthropic as input_json_deltas.
    let body = json!({ "model": "agent", "stream": true, "messages": user("go") });
    let events = sse_data(
        &post(&server, "/v1/chat/completions", &body)
            .await
            .text()
            .await
            .expect("body"),
    );
    let call = events
        .iter()
        .find_map(|e| e["choices"][0]["delta"]["tool_calls"].get(0).cloned())
        .expect("a tool-call delta");
    assert_eq!(call["function"]["name"], "python");
    let body = json!({ "model": "agent", "max_tokens": 5, "stream": true, "messages": user("go") });
    let events = sse_data(
        &post(&server, "/v1/messages", &body)
            .await
            .text()
            .await
            .expect("body"),
    );
    let start = events
        .iter()
        .find(|e| e["type"] == "content_block_start")
        .expect("block start");
    assert_eq!(start["content_block"]["type"], "tool_use");
    // The input arrives in pieces whose concatenation is the whole input.
    let pieces: String = events
        .iter()
        .filter(|e| e["type"] == "content_block_delta")
        .inspect(|e| assert_eq!(e["delta"]["type"], "input_json_delta"))
        .filter_map(|e| e["delta"]["partial_json"].as_str())
        .collect();
    let partial: Value = serde_json::from_str(&pieces).expect("the pieces make the input");
    assert_eq!(partial, json!({ "code": "print(1 + 1)" }));

    // Turn 1: text with an explicit finish reason, mapped for Anthropic.
    let turn1 = json!([{ "role": "user", "content": "go" }, { "role": "assistant", "content": "" },
                       { "role": "user", "content": "2" }]);
    let body = json!({ "model": "agent", "max_tokens": 5, "messages": turn1 });
    let v: Value = post(&server, "/v1/messages", &body)
        .await
        .json()
        .await
        .expect("JSON");
    assert_eq!(
        (v["content"][0]["text"].as_str(), v["stop_reason"].as_str()),
        (Some("Done: 2"), Some("end_turn"))
    );
    server.shutdown().await;
}

#[tokio::test]
async fn models_endpoint_lists_scripted_names() {
    let server = start_script(SAMPLE_SCRIPT).await;
    let v: Value = client()
        .get(format!("{}/models", server.openai_base_url()))
        .send()
        .await
        .expect("sent")
        .json()
        .await
        .expect("JSON");
    let ids: Vec<&str> = v["data"]
        .as_array()
        .expect("list")
        .iter()
        .filter_map(|m| m["id"].as_str())
        .collect();
    assert_eq!(ids, ["agent", "root", "slow", "sub"]);
    assert_eq!(v["object"], "list");
    server.shutdown().await;
}

#[tokio::test]
async fn per_model_latency_overrides_the_server_setting() {
    let server = start_script(SAMPLE_SCRIPT).await;
    assert_eq!(openai_text(&server, "slow", user("x")).await, "slow reply");
    openai_text(&server, "fast", user("x")).await;
    let log = server.log().entries();
    assert!(
        log[0].finished - log[0].arrived >= Duration::from_millis(150),
        "{:?}",
        log[0]
    );
    assert!(
        log[1].finished - log[1].arrived < Duration::from_millis(150),
        "{:?}",
        log[1]
    );
    server.shutdown().await;
}

// ---- errors -----------------------------------------------------------------------------------

#[tokio::test]
async fn api_key_is_enforced_with_provider_shaped_401s() {
    let config = MockConfig {
        api_key: Some("sekret".into()),
        ..MockConfig::default()
    };
    let server = start(config).await;
    let url = format!("{}/chat/completions", server.openai_base_url());
    let body = openai_body("m", user("x"));
    let resp = client().post(&url).json(&body).send().await.expect("sent");
    assert_eq!(resp.status(), 401);
    let v: Value = resp.json().await.expect("JSON");
    assert_eq!(v["error"]["code"], "invalid_api_key");
    assert!(
        v["error"]["message"]
            .as_str()
            .expect("message")
            .contains("API key")
    );
    let wrong = client()
        .post(&url)
        .bearer_auth("nope")
        .json(&body)
        .send()
        .await
        .expect("sent");
    assert_eq!(wrong.status(), 401);
    let ok = client()
        .post(&url)
        .bearer_auth("sekret")
        .json(&body)
        .send()
        .await
        .expect("sent");
    assert_eq!(ok.status(), 200);

    let url = format!("{}/v1/messages", server.anthropic_base_url());
    let body = json!({ "model": "c", "max_tokens": 5, "messages": user("x") });
    let resp = client().post(&url).json(&body).send().await.expect("sent");
    assert_eq!(resp.status(), 401);
    let v: Value = resp.json().await.expect("JSON");
    assert_eq!(
        (v["type"].as_str(), v["error"]["type"].as_str()),
        (Some("error"), Some("authentication_error"))
    );
    let ok = client()
        .post(&url)
        .header("x-api-key", "sekret")
        .json(&body)
        .send()
        .await
        .expect("sent");
    assert_eq!(ok.status(), 200);
    let models = client()
        .get(format!("{}/models", server.openai_base_url()))
        .send()
        .await
        .expect("sent");
    assert_eq!(models.status(), 401);
    let statuses: Vec<u16> = server.log().entries().iter().map(|r| r.status).collect();
    assert_eq!(statuses, [401, 401, 200, 401, 200, 401]);
    server.shutdown().await;
}

#[tokio::test]
async fn unknown_paths_and_methods_get_json_errors() {
    let server = start(MockConfig::default()).await;
    let resp = post(&server, "/v2/nothing", &json!({})).await;
    assert_eq!(resp.status(), 404);
    let v: Value = resp.json().await.expect("JSON");
    assert!(
        v["error"]["message"]
            .as_str()
            .expect("message")
            .contains("/v2/nothing")
    );
    let resp = client()
        .get(format!("{}/chat/completions", server.openai_base_url()))
        .send()
        .await
        .expect("sent");
    assert_eq!(resp.status(), 405);
    let v: Value = resp.json().await.expect("JSON");
    assert!(v["error"]["message"].is_string());
    assert_eq!(server.log().entries()[0].path, "/v2/nothing");
    server.shutdown().await;
}

#[tokio::test]
async fn malformed_requests_get_400_with_a_message() {
    let server = start(MockConfig::default()).await;
    let url = format!("{}/chat/completions", server.openai_base_url());
    let resp = client()
        .post(&url)
        .body("{not json")
        .send()
        .await
        .expect("sent");
    assert_eq!(resp.status(), 400);
    let v: Value = resp.json().await.expect("JSON");
    assert!(
        v["error"]["message"]
            .as_str()
            .expect("message")
            .contains("not a valid chat request")
    );
    let resp = post(&server, "/v1/chat/completions", &json!({ "model": "m" })).await;
    assert_eq!(resp.status(), 400);
    let v: Value = resp.json().await.expect("JSON");
    assert!(
        v["error"]["message"]
            .as_str()
            .expect("message")
            .contains("`messages`")
    );
    let resp = post(
        &server,
        "/v1/messages",
        &json!({ "model": "m", "messages": user("x") }),
    )
    .await;
    assert_eq!(resp.status(), 400);
    let v: Value = resp.json().await.expect("JSON");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert!(
        v["error"]["message"]
            .as_str()
            .expect("message")
            .contains("max_tokens")
    );
    server.shutdown().await;
}

// ---- faults -----------------------------------------------------------------------------------

async fn start_faults(faults: Faults) -> MockServer {
    start(MockConfig {
        faults,
        ..MockConfig::default()
    })
    .await
}

#[tokio::test]
async fn rate_limit_fault_sends_retry_after_then_recovers() {
    let mut faults = Faults::fail_first(2, FaultKind::RateLimit);
    faults.retry_after = Duration::from_secs(7);
    let server = start_faults(faults).await;
    for _ in 0..2 {
        let resp = post(
            &server,
            "/v1/chat/completions",
            &openai_body("m", user("x")),
        )
        .await;
        assert_eq!(resp.status(), 429);
        assert_eq!(resp.headers()["retry-after"], "7");
        assert_eq!(resp.headers()["retry-after-ms"], "7000");
        let v: Value = resp.json().await.expect("JSON");
        assert_eq!(v["error"]["code"], "rate_limit_exceeded");
    }
    assert_eq!(openai_text(&server, "m", user("x")).await, "x");
    let faults: Vec<Option<String>> = server
        .log()
        .entries()
        .into_iter()
        .map(|r| r.fault)
        .collect();
    assert_eq!(
        faults,
        [Some("rate_limit".into()), Some("rate_limit".into()), None]
    );
    server.shutdown().await;
}

#[tokio::test]
async fn server_error_faults_are_provider_shaped() {
    let faults = Faults::default()
        .with_rule(FaultRule::matching("five hundred", FaultKind::ServerError))
        .with_rule(FaultRule::matching("five oh three", FaultKind::Unavailable));
    let server = start_faults(faults).await;
    let resp = post(
        &server,
        "/v1/chat/completions",
        &openai_body("m", user("five hundred")),
    )
    .await;
    assert_eq!(resp.status(), 500);
    let v: Value = resp.json().await.expect("JSON");
    assert_eq!(v["error"]["type"], "server_error");
    let body = json!({ "model": "c", "max_tokens": 5, "messages": user("five oh three") });
    let resp = post(&server, "/v1/messages", &body).await;
    assert_eq!(resp.status(), 503);
    let v: Value = resp.json().await.expect("JSON");
    assert_eq!(v["error"]["type"], "overloaded_error");
    assert_eq!(openai_text(&server, "m", user("fine")).await, "fine");
    server.shutdown().await;
}

#[tokio::test]
async fn regex_fault_rules_target_items_and_respect_times() {
    let faults = Faults::default()
        .with_rule(FaultRule::matching("^item 3$", FaultKind::ServerError).times(1));
    let server = start_faults(faults).await;
    let statuses = futures::future::join_all((0..6).map(|i| {
        let server = &server;
        async move {
            post(
                server,
                "/v1/chat/completions",
                &openai_body("m", user(&format!("item {i}"))),
            )
            .await
            .status()
            .as_u16()
        }
    }))
    .await;
    assert_eq!(statuses, [200, 200, 200, 500, 200, 200]);
    // The rule fired once; the retry of item 3 succeeds.
    assert_eq!(openai_text(&server, "m", user("item 3")).await, "item 3");
    let failed: Vec<String> = server
        .log()
        .entries()
        .into_iter()
        .filter(|r| r.fault.is_some())
        .map(|r| r.last_user)
        .collect();
    assert_eq!(failed, ["item 3"]);
    server.shutdown().await;
}

#[tokio::test]
async fn reset_fault_is_a_transport_error() {
    let server = start_faults(Faults::fail_first(1, FaultKind::Reset)).await;
    let result = client()
        .post(format!("{}/chat/completions", server.openai_base_url()))
        .json(&openai_body("m", user("x")))
        .send()
        .await;
    match result {
        Err(e) => assert!(!e.is_status(), "{e}"),
        Ok(resp) => panic!("expected a transport error, got status {}", resp.status()),
    }
    assert_eq!(openai_text(&server, "m", user("again")).await, "again");
    let entries = server.log().entries();
    assert_eq!(
        (entries[0].status, entries[0].fault.as_deref()),
        (0, Some("reset"))
    );
    server.shutdown().await;
}

#[tokio::test]
async fn malformed_json_fault_is_200_with_invalid_json() {
    let faults = Faults::default().with_rule(FaultRule::matching("bad", FaultKind::MalformedJson));
    let server = start_faults(faults).await;
    let resp = post(
        &server,
        "/v1/chat/completions",
        &openai_body("m", user("bad")),
    )
    .await;
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.expect("complete body");
    assert!(serde_json::from_str::<Value>(&text).is_err(), "{text}");
    let body = json!({ "model": "m", "stream": true, "messages": user("bad") });
    let text = post(&server, "/v1/chat/completions", &body)
        .await
        .text()
        .await
        .expect("body");
    let first = text
        .lines()
        .find_map(|l| l.strip_prefix("data: "))
        .expect("a data line");
    assert!(serde_json::from_str::<Value>(first).is_err(), "{first}");
    server.shutdown().await;
}

#[tokio::test]
async fn truncated_body_fault_cuts_the_body() {
    let faults = Faults::default().with_rule(FaultRule::matching("cut", FaultKind::TruncatedBody));
    let server = start_faults(faults).await;
    let resp = post(
        &server,
        "/v1/chat/completions",
        &openai_body("m", user("cut me please")),
    )
    .await;
    assert_eq!(resp.status(), 200);
    let announced = resp.content_length().expect("Content-Length");
    assert!(announced > 0);
    assert!(resp.bytes().await.is_err(), "the body must end early");
    let body = json!({ "model": "c", "max_tokens": 5, "stream": true, "messages": user("cut") });
    let resp = post(&server, "/v1/messages", &body).await;
    assert_eq!(resp.status(), 200);
    assert!(resp.bytes().await.is_err(), "the stream must end early");
    server.shutdown().await;
}

/// Shuts `server` down and checks that it took less than `limit`.
async fn shut_down_within(server: MockServer, limit: Duration) {
    let started = std::time::Instant::now();
    server.shutdown().await;
    assert!(
        started.elapsed() < limit,
        "shutdown took {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn hang_fault_outlasts_the_client_timeout_and_ends_on_shutdown() {
    let server = start_faults(Faults::fail_first(1, FaultKind::Hang)).await;
    let url = format!("{}/chat/completions", server.openai_base_url());
    let slow_client = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_millis(200))
        .build()
        .expect("client");
    let err = slow_client
        .post(&url)
        .json(&openai_body("m", user("x")))
        .send()
        .await
        .expect_err("times out");
    assert!(err.is_timeout(), "{err}");
    // The abandoned request is logged as 499 once the server notices the client left.
    let log = server.log();
    assert!(
        log.wait_for(1, Duration::from_secs(5)).await,
        "no record of the abandoned request"
    );
    let r = &log.entries()[0];
    assert_eq!((r.status, r.fault.as_deref()), (499, Some("hang")));
    // A second hanging request is still open when we shut down; shutdown must not wait an hour.
    let server2 = start_faults(Faults::fail_first(1, FaultKind::Hang)).await;
    let url2 = format!("{}/chat/completions", server2.openai_base_url());
    let pending = tokio::spawn(async move {
        client()
            .post(&url2)
            .json(&openai_body("m", user("x")))
            .send()
            .await
            .map(|r| r.status())
    });
    // Shut down once the request hangs at the server (evidence, not a sleep).
    while server2.arrived() < 1 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let log2 = server2.log();
    assert!(
        log2.is_empty(),
        "arrived counts a request the log holds only once it ends"
    );
    // Far from the hour-long hang (the 503 below shows it was ended, not dropped).
    shut_down_within(server2, Duration::from_secs(30)).await;
    let status = pending.await.expect("task").expect("answered on shutdown");
    assert_eq!(status, 503);
    assert_eq!(log2.entries()[0].fault.as_deref(), Some("hang"));
    server.shutdown().await;
}

#[tokio::test]
async fn hang_answers_normally_after_a_short_hang() {
    let mut faults = Faults::fail_first(1, FaultKind::Hang);
    faults.hang = Duration::from_millis(50);
    let server = start_faults(faults).await;
    assert_eq!(openai_text(&server, "m", user("late")).await, "late");
    let r = &server.log().entries()[0];
    assert!(r.finished - r.arrived >= Duration::from_millis(50));
    server.shutdown().await;
}

#[tokio::test]
async fn random_faults_follow_the_rate_and_the_seed() {
    async fn fault_pattern(seed: u64) -> Vec<u16> {
        let config = MockConfig {
            faults: Faults::random(0.3, [FaultKind::ServerError, FaultKind::RateLimit]),
            seed,
            ..MockConfig::default()
        };
        let server = start(config).await;
        let mut statuses = Vec::new();
        for i in 0..200 {
            let body = openai_body("m", user(&format!("{i}")));
            statuses.push(
                post(&server, "/v1/chat/completions", &body)
                    .await
                    .status()
                    .as_u16(),
            );
        }
        server.shutdown().await;
        statuses
    }
    let a = fault_pattern(7).await;
    assert_eq!(a, fault_pattern(7).await, "same seed, same faults");
    assert_ne!(a, fault_pattern(8).await, "another seed, other faults");
    let failed = a.iter().filter(|s| **s != 200).count();
    assert!(
        (30..=90).contains(&failed),
        "{failed} of 200 failed at rate 0.3"
    );
    assert!(a.contains(&500) && a.contains(&429));
}

// ---- configuration ----------------------------------------------------------------------------

#[tokio::test]
async fn non_loopback_addresses_are_refused() {
    let config = MockConfig {
        addr: Some("0.0.0.0:0".parse().expect("addr")),
        ..MockConfig::default()
    };
    let err = MockServer::start(config).await.expect_err("refused");
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    assert!(err.to_string().contains("loopback"), "{err}");
}

#[tokio::test]
async fn options_build_a_config_for_the_cli() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("script.json");
    std::fs::write(&path, SAMPLE_SCRIPT).expect("write script");
    let options: MockOptions = serde_json::from_value(json!({
        "script": path, "latency_ms": 5, "fault_rate": 0.1, "faults": ["429", "reset"],
        "retry_after_secs": 2, "seed": 3
    }))
    .expect("options");
    let config = options.into_config().expect("config");
    assert_eq!(config.latency, Latency::fixed(Duration::from_millis(5)));
    assert_eq!(
        config.faults.kinds,
        [FaultKind::RateLimit, FaultKind::Reset]
    );
    assert_eq!(config.faults.retry_after, Duration::from_secs(2));
    assert_eq!(config.addr.map(|a| a.ip().is_loopback()), Some(true));
    let server = start(config).await;
    assert!(server.openai_base_url().starts_with("http://127.0.0.1:"));
    server.shutdown().await;

    assert_eq!(
        FaultKind::parse_list("429, 500,hang").expect("list").len(),
        3
    );
    let err = FaultKind::parse_list("429,teapot").expect_err("unknown kind");
    assert!(err.to_string().contains("teapot"), "{err}");
    let err = MockOptions {
        fault_rate: 0.5,
        ..MockOptions::default()
    }
    .into_config()
    .expect_err("no kinds");
    assert!(err.to_string().contains("--faults"), "{err}");
}

/// Every latency the mock has, sequential calls after idle gaps of 0 to 1 ms (each gap puts
/// the arrival elsewhere in a millisecond) and concurrent ones: each request is answered no
/// sooner than its arrival plus the latency drawn for it, the draw within the model's bounds,
/// and on a kernel timer of its own.
async fn no_request_is_answered_before_its_latency() {
    let fixed = Duration::from_millis(3);
    let (min, max) = (Duration::from_millis(1), Duration::from_millis(6));
    for latency in [
        Latency::fixed(fixed),
        Latency::uniform(min, max),
        Latency::normal(Duration::from_millis(4), Duration::from_millis(2)),
    ] {
        let server = start(MockConfig {
            latency,
            ..MockConfig::default()
        })
        .await;
        let url = format!("{}/chat/completions", server.openai_base_url());
        let keep_alive = client();
        for i in 0..24u64 {
            // A blocking gap: the server is idle meanwhile.
            std::thread::sleep(Duration::from_micros(i * 1000 / 24));
            let sent = std::time::Instant::now();
            let resp = keep_alive
                .post(&url)
                .json(&openai_body("m", user(&i.to_string())))
                .send()
                .await
                .expect("sent");
            assert_eq!(resp.status(), 200);
            if latency == Latency::fixed(fixed) {
                assert!(sent.elapsed() >= fixed, "{:?}", sent.elapsed());
            }
        }
        let calls = (0..16).map(|i| {
            let server = &server;
            async move { openai_text(server, "m", user(&format!("c{i}"))).await }
        });
        futures::future::join_all(calls).await;
        let log = server.log().entries();
        assert_eq!(log.len(), 40);
        for r in &log {
            assert_eq!(r.status, 200, "{r:?}");
            assert!(r.finished - r.arrived >= r.latency, "{latency:?}: {r:?}");
            // Not absurd either way (precision is shown by the benchmarks, not here).
            assert!(r.finished - r.arrived < Duration::from_secs(2), "{r:?}");
            match latency {
                Latency::Fixed { delay } => assert_eq!(r.latency, delay),
                Latency::Uniform { .. } => {
                    assert!((min..=max).contains(&r.latency), "{r:?}");
                }
                Latency::Normal { .. } | Latency::None => {}
            }
        }
        if matches!(latency, Latency::Normal { .. }) {
            let distinct: std::collections::BTreeSet<_> = log.iter().map(|r| r.latency).collect();
            assert!(distinct.len() > 30, "drawn per request: {distinct:?}");
        }
        assert_eq!(server.timer_fallbacks(), 0, "a kernel timer each");
        server.shutdown().await;
    }
}

#[tokio::test]
async fn no_request_is_answered_before_its_latency_on_a_current_thread_runtime() {
    no_request_is_answered_before_its_latency().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_request_is_answered_before_its_latency_on_a_multi_thread_runtime() {
    no_request_is_answered_before_its_latency().await;
}

/// Requests waiting at once are answered by their own deadlines: one that arrives later with
/// a shorter latency is not held behind an earlier, longer one.
#[tokio::test]
async fn a_shorter_latency_is_not_held_behind_a_longer_one() {
    let script = r#"{"models": {
        "slow": {"replies": ["slow"], "latency": {"kind": "fixed", "ms": 2000}},
        "fast": {"replies": ["fast"], "latency": {"kind": "fixed", "ms": 10}}
    }}"#;
    let server = start_script(script).await;
    let (slow, fast) = tokio::join!(openai_text(&server, "slow", user("a")), async {
        while server.arrived() < 1 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        openai_text(&server, "fast", user("b")).await
    });
    assert_eq!((slow.as_str(), fast.as_str()), ("slow", "fast"));
    let log = server.log().entries();
    let (slow, fast) = (&log[0], &log[1]);
    assert_eq!((slow.model.as_str(), fast.model.as_str()), ("slow", "fast"));
    assert!(fast.arrived > slow.arrived, "{log:?}");
    // Not a precision bound: waiting for the slow one's deadline would take 2 s.
    assert!(
        fast.finished - fast.arrived < Duration::from_secs(1),
        "held behind the slow one: {log:?}"
    );
    for r in &log {
        assert!(r.finished - r.arrived >= r.latency, "{r:?}");
    }
    server.shutdown().await;
}

/// A request's latency counts from its arrival (its headers read), not from the end of its
/// body: a client slow to send the body waits the latency once, not the body's time plus the
/// latency; and never less.
#[tokio::test]
async fn the_latency_counts_from_the_arrival_not_from_the_body() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let latency = Duration::from_secs(1);
    let server = start(MockConfig {
        latency: Latency::fixed(latency),
        ..MockConfig::default()
    })
    .await;
    let body = openai_body("m", user("slow body")).to_string();
    let mut tcp = tokio::net::TcpStream::connect(server.addr())
        .await
        .expect("connects");
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: mock\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    tcp.write_all(head.as_bytes()).await.expect("head sent");
    // The body comes as late as the whole latency: the handler has its arrival meanwhile.
    while server.arrived() < 1 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(latency).await;
    tcp.write_all(body.as_bytes()).await.expect("body sent");
    let mut response = String::new();
    tcp.read_to_string(&mut response).await.expect("response");
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(response.contains("slow body"), "{response}");
    let r = &server.log().entries()[0];
    let waited = r.finished - r.arrived;
    assert!(waited >= latency, "{r:?}");
    // The body alone took the latency: waiting it again after the body would double it.
    assert!(waited < 2 * latency, "waited twice: {r:?}");
    assert_eq!(r.latency, latency);
    server.shutdown().await;
}

/// Shutdown ends a request waiting for its latency at once (503), however long the latency,
/// and one whose deadline is past any clock (`hang` on top of the latency) too.
#[tokio::test]
async fn shutdown_ends_requests_waiting_for_their_latency_at_once() {
    let mut faults = Faults::fail_first(1, FaultKind::Hang);
    faults.hang = Duration::MAX;
    let server = start(MockConfig {
        latency: Latency::fixed(Duration::from_secs(3600)),
        faults,
        ..MockConfig::default()
    })
    .await;
    let url = format!("{}/chat/completions", server.openai_base_url());
    let pending: Vec<_> = (0..2)
        .map(|i| {
            let url = url.clone();
            tokio::spawn(async move {
                client()
                    .post(&url)
                    .json(&openai_body("m", user(&i.to_string())))
                    .send()
                    .await
                    .map(|r| r.status())
            })
        })
        .collect();
    while server.arrived() < 2 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let log = server.log();
    // Far from the hour-long latency (the 503s below show they were ended, not dropped).
    shut_down_within(server, Duration::from_secs(30)).await;
    for call in pending {
        let status = tokio::time::timeout(Duration::from_secs(30), call)
            .await
            .expect("answered, not left waiting")
            .expect("task")
            .expect("answered on shutdown");
        assert_eq!(status, 503);
    }
    let entries = log.entries();
    assert_eq!(entries.len(), 2);
    assert!(entries.iter().any(|r| r.fault.as_deref() == Some("hang")));
    assert!(entries.iter().all(|r| r.status == 503), "{entries:?}");
}

/// A server started without a file descriptor for its kernel timer still serves: its requests
/// wait their latency on tokio's timer, never less, and are counted. Run in a child process of
/// its own, whose descriptors it uses up.
#[test]
fn latency_falls_back_to_tokios_timer_without_a_file_descriptor() {
    const CHILD: &str = "RLM_TEST_NO_FD_CHILD";
    if std::env::var_os(CHILD).is_none() {
        let out = std::process::Command::new(std::env::current_exe().expect("test binary"))
            .args([
                "--exact",
                "mock::latency_falls_back_to_tokios_timer_without_a_file_descriptor",
                "--nocapture",
            ])
            .env(CHILD, "1")
            .output()
            .expect("child runs");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("1 passed"),
            "{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        return;
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let keep_alive = client();
    // Every descriptor taken (a low limit first: bounded work), then one given back: the
    // server's listening socket takes it, its timer finds none.
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    let low = Rlimit {
        current: Some(limit.current.map_or(1024, |current| current.min(1024))),
        maximum: limit.maximum,
    };
    setrlimit(Resource::Nofile, low).expect("lower limit");
    let mut held = Vec::new();
    let exhausted = loop {
        match std::fs::File::open("/dev/null") {
            Ok(file) if held.len() < 1 << 20 => held.push(file),
            Ok(_) => break None,
            Err(e) => break Some(e),
        }
    };
    let exhausted = exhausted.expect("descriptors run out");
    assert_eq!(exhausted.raw_os_error(), Some(24), "EMFILE: {exhausted}");
    held.pop();
    let latency = Duration::from_millis(20);
    let server = rt.block_on(start(MockConfig {
        latency: Latency::fixed(latency),
        ..MockConfig::default()
    }));
    drop(held);
    rt.block_on(async {
        let url = format!("{}/chat/completions", server.openai_base_url());
        for text in ["first", "second"] {
            let resp = keep_alive
                .post(&url)
                .json(&openai_body("m", user(text)))
                .send()
                .await
                .expect("sent");
            assert_eq!(resp.status(), 200);
            let v: Value = resp.json().await.expect("JSON body");
            assert_eq!(v["choices"][0]["message"]["content"], text);
        }
        assert_eq!(server.timer_fallbacks(), 2);
        let log = server.log().entries();
        assert_eq!(log.len(), 2);
        for r in &log {
            assert!(r.finished - r.arrived >= latency, "{r:?}");
        }
        server.shutdown().await;
    });
}

#[test]
fn script_errors_name_the_file_and_the_problem() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("broken.json");
    std::fs::write(
        &path,
        r#"{"models": {"sub": {"rules": [{"last_user": "(", "reply": "x"}]}}}"#,
    )
    .expect("write");
    let err = Script::from_path(&path).expect_err("bad regex").to_string();
    assert!(
        err.contains("broken.json") && err.contains("models.\"sub\".rules[0].last_user"),
        "{err}"
    );

    let err = Script::from_path(&dir.path().join("missing.json"))
        .expect_err("missing")
        .to_string();
    assert!(err.contains("missing.json"), "{err}");

    for (script, needle) in [
        (
            r#"{"models": {"m": {"replies": [{"behaviour": "count_word"}]}}}"#,
            "needs `word`",
        ),
        (
            r#"{"models": {"m": {"replies": [{"behaviour": "dance"}]}}}"#,
            "dance",
        ),
        (
            r#"{"models": {"m": {"replies": [{"behaviour": "extract"}]}}}"#,
            "needs `pattern`",
        ),
        (
            r#"{"models": {"m": {"replies": [{"behaviour": "extract", "pattern": "(x{{model}}"}]}}}"#,
            "invalid regex `(x{{model}}`",
        ),
        (r#"{"models": {"m": {"replies": [{"txt": "x"}]}}}"#, "txt"),
        (
            r#"{"models": {"m": {"replies": [3]}}}"#,
            "string or an object",
        ),
        (r#"{"models": {"m": {"reply": []}}}"#, "reply"),
        (r#"{"models": "#, "EOF"),
    ] {
        let err = Script::from_json_str(script).expect_err(script).to_string();
        assert!(
            err.contains(needle) && err.contains("<string>"),
            "{script}: {err}"
        );
    }
}

#[tokio::test]
async fn h2c_prior_knowledge_works() {
    let server = start(MockConfig::default()).await;
    let h2 = reqwest::Client::builder()
        .no_proxy()
        .http2_prior_knowledge()
        .build()
        .expect("client");
    let resp = h2
        .post(format!("{}/chat/completions", server.openai_base_url()))
        .json(&openai_body("m", user("over h2")))
        .send()
        .await
        .expect("sent");
    assert_eq!(resp.version(), reqwest::Version::HTTP_2);
    let v: Value = resp.json().await.expect("JSON");
    assert_eq!(v["choices"][0]["message"]["content"], "over h2");
    server.shutdown().await;
}

#[tokio::test]
async fn shutdown_is_prompt_with_idle_keep_alive_connections_and_frees_the_port() {
    let server = start(MockConfig::default()).await;
    let keep_alive = client();
    let url = format!("{}/chat/completions", server.openai_base_url());
    for i in 0..3 {
        let resp = keep_alive
            .post(&url)
            .json(&openai_body("m", user(&i.to_string())))
            .send()
            .await;
        assert_eq!(resp.expect("sent").status(), 200);
    }
    assert_eq!(
        server.log().max_concurrency(),
        1,
        "sequential requests never overlap"
    );
    shut_down_within(server, Duration::from_secs(2)).await;
    let err = keep_alive
        .post(&url)
        .json(&openai_body("m", user("late")))
        .send()
        .await
        .expect_err("server is gone");
    assert!(err.is_connect() || err.is_request(), "{err}");
}

#[tokio::test]
async fn log_limit_keeps_the_newest_records() {
    let server = start(MockConfig {
        log_limit: Some(3),
        ..MockConfig::default()
    })
    .await;
    for i in 0..5 {
        openai_text(&server, "m", user(&i.to_string())).await;
    }
    let kept: Vec<(u64, String)> = server
        .log()
        .entries()
        .into_iter()
        .map(|r| (r.id, r.last_user))
        .collect();
    assert_eq!(kept, [(2, "2".into()), (3, "3".into()), (4, "4".into())]);
    server.shutdown().await;
}

#[tokio::test]
async fn capacity_answers_429_with_retry_after_beyond_n_in_flight() {
    // 2 s: all 10 requests arrive while the first 4 are still being served.
    let config = MockConfig {
        latency: Latency::fixed(Duration::from_secs(2)),
        capacity: Some(4),
        faults: Faults {
            retry_after: Duration::from_millis(250),
            ..Faults::default()
        },
        ..MockConfig::default()
    };
    let server = start(config).await;
    let body = openai_body("m", user("hi"));
    let calls = (0..10).map(|_| post(&server, "/v1/chat/completions", &body));
    let responses = futures::future::join_all(calls).await;
    let mut ok = 0;
    for response in &responses {
        match response.status().as_u16() {
            200 => ok += 1,
            429 => {
                let headers = response.headers();
                assert_eq!(headers["retry-after"], "1", "whole seconds, rounded up");
                assert_eq!(headers["retry-after-ms"], "250");
            }
            other => panic!("status {other}"),
        }
    }
    assert_eq!(ok, 4, "the capacity is served, the rest refused");
    let log = server.log();
    let refused: Vec<_> = log
        .entries()
        .into_iter()
        .filter(|r| r.status == 429)
        .collect();
    assert_eq!(refused.len(), 6);
    assert!(
        refused
            .iter()
            .all(|r| r.finished - r.arrived < Duration::from_secs(2)),
        "refused at once, before the latency"
    );
    // The places come back: a later request is served.
    assert_eq!(openai_text(&server, "m", user("again")).await, "again");
    server.shutdown().await;
}

#[tokio::test]
async fn a_capacity_of_zero_is_refused() {
    let err = MockServer::start(MockConfig {
        capacity: Some(0),
        ..MockConfig::default()
    })
    .await
    .expect_err("invalid");
    assert!(
        err.to_string().contains("`capacity` must be at least 1"),
        "{err}"
    );
    let options = MockOptions {
        capacity: Some(0),
        ..MockOptions::default()
    };
    assert!(options.into_config().is_err());
}
