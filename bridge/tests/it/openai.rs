//! The OpenAI chat-completions format, JSON and SSE, against the mock.

use bridge::mock::SAMPLE_SCRIPT;
use bridge::{Budget, CallOptions, ChatRequest, Message, Role, ToolDefinition};
use serde_json::json;

use crate::support::{endpoint, openai_config, start, start_script};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_round_trip_reports_usage_and_records_the_call() {
    let server = start(Default::default()).await;
    let sub = endpoint(openai_config(&server), Budget::default());
    let mut req = ChatRequest::from_prompt("hello bridge");
    req.params.temperature = Some(0.0);
    req.params.max_tokens = Some(16);
    let answer = sub
        .call(req, &CallOptions::default())
        .await
        .expect("echo answers");
    assert_eq!(answer.content, "hello bridge");
    assert_eq!(answer.model, "sub-model");
    assert_eq!(answer.attempts, 1);
    assert!(!answer.usage.estimated);
    assert!(answer.usage.prompt_tokens > 0 && answer.usage.completion_tokens > 0);

    let records = sub.ledger().records();
    assert_eq!(records.len(), 1);
    let r = &records[0];
    assert_eq!((r.call_index, r.endpoint.as_str()), (0, "sub"));
    assert_eq!((r.prompt_chars, r.response_chars), (12, 12));
    assert_eq!(r.prompt_tokens, answer.usage.prompt_tokens);
    assert!(!r.batched && r.batch_size == 1 && r.error.is_none());

    let log = server.log().entries();
    assert_eq!(log.len(), 1);
    assert_eq!(log[0].path, "/v1/chat/completions");
    assert_eq!(log[0].model, "sub-model");
    assert!(!log[0].stream);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_delivers_deltas_in_order_and_usage_from_the_last_chunk() {
    let server = start(Default::default()).await;
    let sub = endpoint(openai_config(&server), Budget::default());
    let prompt = "word ".repeat(400);
    let mut deltas = Vec::new();
    let answer = sub
        .call_streaming(
            ChatRequest::from_prompt(prompt.clone()),
            &CallOptions::default(),
            &mut |d: &str| deltas.push(d.to_owned()),
        )
        .await
        .expect("stream answers");
    assert!(
        deltas.len() > 1,
        "expected several deltas, got {}",
        deltas.len()
    );
    assert_eq!(deltas.concat(), prompt);
    assert_eq!(answer.content, prompt);
    assert_eq!(answer.finish_reason.as_deref(), Some("stop"));
    assert!(!answer.usage.estimated, "include_usage gives real usage");
    assert!(server.log().entries()[0].stream);

    // `CallOptions::stream` streams on the wire without a callback.
    let opts = CallOptions {
        stream: true,
        ..CallOptions::default()
    };
    let again = sub
        .call(ChatRequest::from_prompt("short"), &opts)
        .await
        .expect("stream answers");
    assert_eq!(again.content, "short");
    assert!(server.log().entries()[1].stream);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_usage_is_estimated_from_characters() {
    let server = start(Default::default()).await;
    let sub = endpoint(openai_config(&server), Budget::default());
    let mut req = ChatRequest::from_prompt("x".repeat(41));
    req.params
        .extra
        .insert("stream_options".into(), json!({"include_usage": false}));
    let opts = CallOptions {
        stream: true,
        ..CallOptions::default()
    };
    let answer = sub.call(req, &opts).await.expect("stream answers");
    assert!(answer.usage.estimated);
    assert_eq!(answer.usage.prompt_tokens, 11); // ceil(41 / 4)
    assert_eq!(answer.usage.completion_tokens, 11);
    let record = &sub.ledger().records()[0];
    assert!(record.tokens_estimated);
    assert_eq!(record.prompt_tokens, 11);
}

fn python_tool() -> ToolDefinition {
    ToolDefinition {
        name: "python".into(),
        description: "Run Python code".into(),
        parameters: json!({"type": "object", "properties": {"code": {"type": "string"}}}),
    }
}

/// Turn 0 asks for a tool call; sending the call and its result back (turn 1) gets the answer.
async fn tool_round_trip(stream: bool) {
    let server = start_script(SAMPLE_SCRIPT).await;
    let sub = endpoint(openai_config(&server), Budget::default());
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
        tools: vec![python_tool()],
        ..ChatRequest::default()
    };
    let first = sub.call(req.clone(), &opts).await.expect("tool call");
    assert_eq!(first.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(first.tool_calls.len(), 1);
    let call = &first.tool_calls[0];
    assert_eq!(call.name, "python");
    assert!(!call.id.is_empty());
    let args: serde_json::Value = serde_json::from_str(&call.arguments).expect("JSON arguments");
    assert_eq!(args, json!({"code": "print(1 + 1)"}));

    req.messages.push(Message {
        role: Role::Assistant,
        content: first.content.clone(),
        tool_calls: first.tool_calls.clone(),
        tool_call_id: None,
    });
    req.messages
        .push(Message::tool_result(call.id.clone(), "2"));
    let second = sub.call(req, &opts).await.expect("final answer");
    assert_eq!(second.content, "Done: 2");
    assert!(second.tool_calls.is_empty());
    assert_eq!(server.log().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_calls_round_trip_in_json() {
    tool_round_trip(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_calls_round_trip_in_sse() {
    tool_round_trip(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripted_rules_see_the_system_prompt_and_last_user_message() {
    let server = start_script(SAMPLE_SCRIPT).await;
    let sub = endpoint(openai_config(&server), Budget::default());
    let req = |system: &str, user: &str| ChatRequest {
        model: Some("sub".into()),
        messages: vec![Message::system(system), Message::user(user)],
        ..ChatRequest::default()
    };
    let opts = CallOptions::default();
    let count = sub
        .call(req("", "Count ERROR in:\nERROR a ERROR b"), &opts)
        .await
        .expect("count");
    assert_eq!(count.content, "2");
    let terse = sub
        .call(req("be terse", "anything"), &opts)
        .await
        .expect("terse");
    assert_eq!(terse.content, "ok");
}
