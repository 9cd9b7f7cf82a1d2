//! The OpenAI chat-completions format, JSON and SSE, against the mock.

use bridge::mock::SAMPLE_SCRIPT;
use bridge::{BridgeError, Budget, CallOptions, ChatRequest, Message, Role, ToolDefinition};
use serde_json::json;

use crate::support::{
    AfterReply, endpoint, http_reply, openai_config, raw_config, raw_server, start, start_script,
};

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

/// One call (streamed or not) to a raw server answering `reply`, with `max_attempts`: the
/// result, the deltas received and the attempts made.
async fn call_raw(
    reply: String,
    stream: bool,
    max_attempts: u32,
) -> (Result<bridge::ChatResponse, BridgeError>, Vec<String>, u32) {
    let base_url = raw_server(reply, AfterReply::Close).await;
    let sub = endpoint(raw_config(&base_url, max_attempts), Budget::default());
    let req = ChatRequest::from_prompt("x");
    let opts = CallOptions::default();
    let mut deltas = Vec::new();
    let result = if stream {
        sub.call_streaming(req, &opts, &mut |d: &str| deltas.push(d.to_owned()))
            .await
    } else {
        sub.call(req, &opts).await
    };
    let attempts = sub.ledger().records()[0].attempts;
    (result, deltas, attempts)
}

const JSON: [(&str, &str); 1] = [("content-type", "application/json")];
const SSE: [(&str, &str); 1] = [("content-type", "text/event-stream")];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_json_answer_to_a_streaming_request_is_decoded() {
    let body = r#"{"model":"m","choices":[{"message":{"content":"whole"},"finish_reason":"stop"}],
                   "usage":{"prompt_tokens":3,"completion_tokens":4}}"#;
    let (result, deltas, attempts) = call_raw(http_reply("200 OK", &JSON, body), true, 3).await;
    let answer = result.expect("the JSON answer is used");
    assert_eq!(answer.content, "whole");
    assert_eq!(deltas, ["whole"], "the whole text arrives as one delta");
    assert_eq!(
        (answer.usage.prompt_tokens, answer.usage.completion_tokens),
        (3, 4)
    );
    assert_eq!(attempts, 1);

    let page = http_reply(
        "200 OK",
        &[("content-type", "text/html")],
        "<html>login</html>",
    );
    let (result, _, attempts) = call_raw(page, true, 3).await;
    let err = result.expect_err("not an answer");
    assert!(matches!(err, BridgeError::Decode { .. }), "{err:?}");
    assert!(!err.is_retryable() && err.is_garbled());
    let msg = err.to_string();
    assert!(
        msg.contains("text/html") && msg.contains("text/event-stream") && msg.contains("login"),
        "{msg}"
    );
    assert_eq!(
        attempts, 2,
        "a garbled reply is retried once, not three times"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_in_a_200_body_is_the_same_error_as_in_a_stream() {
    let error = r#"{"message":"upstream overloaded","code":429}"#;
    let is_the_error = |e: &BridgeError| matches!(e, BridgeError::Http { status: 429, message, .. } if message == "upstream overloaded");
    let json = http_reply("200 OK", &JSON, &format!(r#"{{"error":{error}}}"#));
    let (plain, _, attempts) = call_raw(json, false, 2).await;
    let plain = plain.expect_err("an error body");
    assert!(is_the_error(&plain), "{plain:?}");
    assert_eq!(attempts, 2, "retryable like the streamed error");

    let sse = http_reply("200 OK", &SSE, &format!("data: {{\"error\":{error}}}\n\n"));
    let (streamed, _, attempts) = call_raw(sse, true, 2).await;
    let streamed = streamed.expect_err("an error event");
    assert!(is_the_error(&streamed), "{streamed:?}");
    assert_eq!(attempts, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn null_choices_count_as_none() {
    let sse = concat!(
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"finish_reason\":\"stop\"}]}\n\n",
        "data: {\"choices\":null,\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":7}}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":null,\"finish_reason\":null}]}\n\n",
        "data: [DONE]\n\n"
    );
    let (result, _, _) = call_raw(http_reply("200 OK", &SSE, sse), true, 1).await;
    let answer = result.expect("null choices are skipped");
    assert_eq!(answer.content, "hi");
    assert_eq!(
        (answer.usage.prompt_tokens, answer.usage.completion_tokens),
        (5, 7)
    );

    let body = r#"{"model":"m","choices":null}"#;
    let (result, _, _) = call_raw(http_reply("200 OK", &JSON, body), false, 1).await;
    let err = result.expect_err("no choices");
    assert!(err.to_string().contains("has no `choices`"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_call_name_repeated_in_every_piece_is_not_doubled() {
    // llama-cpp-python's server (`chatml-function-calling`) repeats the id and the name in
    // every piece of a streamed call; OpenAI sends them once.
    let piece = |args: &str| {
        let call = json!({"index": 0, "id": "call__0_get_weather_cmpl-1", "type": "function",
                          "function": {"name": "get_weather", "arguments": args}});
        let delta = json!({"role": null, "content": null, "tool_calls": [call],
                           "function_call": {"name": "get_weather", "arguments": args}});
        format!(
            "data: {}\n\n",
            json!({"object": "chat.completion.chunk", "model": "m",
                   "choices": [{"index": 0, "finish_reason": null, "delta": delta}]})
        )
    };
    let sse = [
        r#"data: {"choices":[{"index":0,"finish_reason":null,"delta":{"role":"assistant","content":null,"function_call":null,"tool_calls":null}}]}"#.to_owned() + "\n\n",
        piece(r#"{"city""#),
        piece(r#": "Paris"}"#),
        r#"data: {"choices":[{"index":0,"finish_reason":"tool_calls","delta":{"role":null,"content":null,"function_call":null,"tool_calls":null}}]}"#.to_owned() + "\n\n",
        "data: [DONE]\n\n".to_owned(),
    ]
    .concat();
    let (result, deltas, _) = call_raw(http_reply("200 OK", &SSE, &sse), true, 1).await;
    let answer = result.expect("the stream is read");
    assert!(deltas.is_empty() && answer.content.is_empty());
    assert_eq!(answer.tool_calls.len(), 1);
    let call = &answer.tool_calls[0];
    assert_eq!(
        (
            call.id.as_str(),
            call.name.as_str(),
            call.arguments.as_str()
        ),
        (
            "call__0_get_weather_cmpl-1",
            "get_weather",
            r#"{"city": "Paris"}"#
        )
    );
    assert_eq!(answer.finish_reason.as_deref(), Some("tool_calls"));
}
