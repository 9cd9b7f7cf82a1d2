//! The Anthropic Messages format, JSON and SSE, against the mock.

use bridge::mock::SAMPLE_SCRIPT;
use bridge::{
    BridgeError, Budget, CallOptions, ChatRequest, EndpointConfig, Message, Provider, Role,
    ToolDefinition,
};
use serde_json::json;

use crate::support::{
    AfterReply, anthropic_config, endpoint, http_reply, raw_config, raw_server, start, start_script,
};

const SYSTEM_SCRIPT: &str = r#"{"models": {"*": {"rules": [
    {"system": "^You are (\\w+)$", "reply": "system={{1}} user={{last_user}} turn={{turn}}"}
]}}}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn system_prompt_travels_as_its_own_field() {
    let server = start_script(SYSTEM_SCRIPT).await;
    let root = endpoint(anthropic_config(&server), Budget::default());
    let req = ChatRequest {
        messages: vec![
            Message::system("You are terse"),
            Message::user("first"),
            Message::assistant("noted"),
            Message::user("second"),
        ],
        ..ChatRequest::default()
    };
    let answer = root
        .call(req, &CallOptions::default())
        .await
        .expect("answer");
    assert_eq!(answer.content, "system=terse user=second turn=1");
    assert_eq!(answer.finish_reason.as_deref(), Some("end_turn"));
    assert_eq!(answer.model, "claude-mock");
    assert!(!answer.usage.estimated);
    assert!(answer.usage.prompt_tokens > 0);
    let log = server.log().entries();
    assert_eq!(log[0].path, "/v1/messages");
    assert_eq!(log[0].status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_assembles_text_deltas_and_usage() {
    let server = start(Default::default()).await;
    let root = endpoint(anthropic_config(&server), Budget::default());
    let prompt = "stream me ".repeat(300);
    let mut deltas = String::new();
    let mut pieces = 0;
    let answer = root
        .call_streaming(
            ChatRequest::from_prompt(prompt.clone()),
            &CallOptions::default(),
            &mut |d: &str| {
                pieces += 1;
                deltas.push_str(d);
            },
        )
        .await
        .expect("stream answers");
    assert!(pieces > 1);
    assert_eq!(deltas, prompt);
    assert_eq!(answer.content, prompt);
    assert_eq!(answer.finish_reason.as_deref(), Some("end_turn"));
    assert!(!answer.usage.estimated);
    assert!(answer.usage.prompt_tokens > 0 && answer.usage.completion_tokens > 0);
    assert!(server.log().entries()[0].stream);
}

async fn tool_use_round_trip(stream: bool) {
    let server = start_script(SAMPLE_SCRIPT).await;
    let root = endpoint(anthropic_config(&server), Budget::default());
    let opts = CallOptions {
        stream,
        ..CallOptions::default()
    };
    let mut req = ChatRequest {
        model: Some("agent".into()),
        messages: vec![
            Message::system("You run code."),
            Message::user("What is 1+1?"),
        ],
        tools: vec![ToolDefinition {
            name: "python".into(),
            description: "Run Python code".into(),
            parameters: json!({"type": "object", "properties": {"code": {"type": "string"}}}),
        }],
        ..ChatRequest::default()
    };
    let first = root.call(req.clone(), &opts).await.expect("tool use");
    assert_eq!(first.finish_reason.as_deref(), Some("tool_use"));
    assert_eq!(first.tool_calls.len(), 1);
    let call = first.tool_calls[0].clone();
    assert_eq!(call.name, "python");
    assert!(call.id.starts_with("toolu_"), "{}", call.id);
    let args: serde_json::Value = serde_json::from_str(&call.arguments).expect("JSON input");
    assert_eq!(args, json!({"code": "print(1 + 1)"}));

    req.messages.push(Message {
        role: Role::Assistant,
        content: first.content.clone(),
        tool_calls: first.tool_calls.clone(),
        tool_call_id: None,
    });
    req.messages.push(Message::tool_result(call.id, "2"));
    let second = root.call(req, &opts).await.expect("final answer");
    assert_eq!(second.content, "Done: 2");
    assert_eq!(second.finish_reason.as_deref(), Some("end_turn"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_use_round_trip_in_json() {
    tool_use_round_trip(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_use_round_trip_in_sse() {
    tool_use_round_trip(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_json_answer_to_a_streaming_request_is_decoded() {
    let json = [("content-type", "application/json")];
    let answer = r#"{"model":"m","content":[{"type":"text","text":"whole"}],
                     "stop_reason":"end_turn","usage":{"input_tokens":3,"output_tokens":4}}"#;
    let error = r#"{"type":"error","error":{"type":"overloaded_error","message":"busy"}}"#;
    let mut results = Vec::new();
    for body in [answer, error] {
        let base_url = raw_server(http_reply("200 OK", &json, body), AfterReply::Close).await;
        let config = EndpointConfig {
            provider: Provider::Anthropic,
            ..raw_config(&base_url, 1)
        };
        let root = endpoint(config, Budget::default());
        let mut deltas = Vec::new();
        let result = root
            .call_streaming(
                ChatRequest::from_prompt("x"),
                &CallOptions::default(),
                &mut |d: &str| deltas.push(d.to_owned()),
            )
            .await;
        results.push((result, deltas));
    }
    let (answer, deltas) = &results[0];
    let answer = answer.as_ref().expect("the JSON answer is used");
    assert_eq!(answer.content, "whole");
    assert_eq!(deltas, &["whole"]);
    assert_eq!(answer.usage.completion_tokens, 4);
    let (error, _) = &results[1];
    let error = error.as_ref().expect_err("an error body");
    assert!(
        matches!(error, BridgeError::Http { status: 529, message, .. } if message == "busy"),
        "{error:?}"
    );
}
