//! Tool calls over both wire formats against the mock server: parallel calls assembled from
//! interleaved stream pieces, results sent back by call id, tool choice, request validation,
//! and the accounting path (retries, usage, budget, ledger) for tool-calling chats.

use std::sync::Arc;

use bridge::mock::{FaultKind, Faults, MockConfig, MockServer, Script};
use bridge::{
    BridgeError, Budget, CallOptions, ChatRequest, ChatResponse, Endpoint, EndpointConfig, Ledger,
    Message, Role, ToolCall, ToolChoice, ToolDefinition,
};
use serde_json::{Value, json};

use crate::support::{anthropic_config, endpoint, openai_config, start};

/// Turn 0: some text and three parallel calls; then rules on the last tool result.
fn script() -> Script {
    Script::from_json_value(json!({"models": {"*": {
        "rules": [
            {"tool_name": "^python$", "last_tool": "^(?P<out>\\d+)$",
             "reply": {"text": "python said {{out}} (turn {{turn}})"}},
            {"last_tool": "(?s)^contents of (\\S+)",
             "reply": {"text": "read {{1}} via {{tool_name}}",
                       "tool_call": {"name": "save", "arguments": {"text": "{{last_tool}}"}}}}
        ],
        "replies": [
            {"text": "Let me look at both files and compute.",
             "tool_calls": [
                {"name": "read_file", "arguments": {"path": "notes/a long file name.txt"}},
                {"name": "read_file", "arguments": {"path": "b.txt", "limit": 10}},
                {"name": "python", "arguments": {"code": "print(sum(range(10)))"}}
             ]}
        ]
    }}}))
    .expect("valid script")
}

async fn start_recording(script: Script, faults: Faults) -> MockServer {
    start(MockConfig {
        script,
        faults,
        record_requests: true,
        ..MockConfig::default()
    })
    .await
}

fn config_for(server: &MockServer, anthropic: bool) -> EndpointConfig {
    if anthropic {
        anthropic_config(server)
    } else {
        openai_config(server)
    }
}

/// A recording mock running [`script`] and an endpoint of the format on it.
async fn recording_endpoint(anthropic: bool) -> (MockServer, Endpoint) {
    let server = start_recording(script(), Faults::none()).await;
    let ep = endpoint(config_for(&server, anthropic), Budget::default());
    (server, ep)
}

fn tools() -> Vec<ToolDefinition> {
    let object = |props: Value| json!({"type": "object", "properties": props});
    vec![
        ToolDefinition {
            name: "read_file".into(),
            description: "Read a file".into(),
            parameters: object(json!({"path": {"type": "string"}})),
        },
        ToolDefinition {
            name: "python".into(),
            description: "Run Python".into(),
            parameters: object(json!({"code": {"type": "string"}})),
        },
        ToolDefinition {
            name: "save".into(),
            description: "Save text".into(),
            parameters: object(json!({"text": {"type": "string"}})),
        },
    ]
}

fn request(messages: Vec<Message>) -> ChatRequest {
    ChatRequest {
        messages,
        tools: tools(),
        ..ChatRequest::default()
    }
}

/// One call, streamed (collecting the deltas) or not.
async fn call(ep: &Endpoint, req: ChatRequest, stream: bool) -> (ChatResponse, String) {
    let mut deltas = String::new();
    let answer = if stream {
        ep.call_streaming(req, &CallOptions::default(), &mut |d: &str| {
            deltas.push_str(d)
        })
        .await
    } else {
        ep.call(req, &CallOptions::default()).await
    };
    (answer.expect("answer"), deltas)
}

fn assistant(answer: &ChatResponse) -> Message {
    Message {
        role: Role::Assistant,
        content: answer.content.clone(),
        tool_calls: answer.tool_calls.clone(),
        tool_call_id: None,
    }
}

fn arguments(call: &ToolCall) -> Value {
    serde_json::from_str(&call.arguments).expect("JSON arguments")
}

/// The recorded body of request `i`.
fn sent(server: &MockServer, i: usize) -> Value {
    let body = server.log().entries()[i]
        .body
        .clone()
        .expect("recorded body");
    serde_json::from_str(&body).expect("JSON body")
}

async fn parallel_calls_round_trip(anthropic: bool, stream: bool) {
    let (server, ep) = recording_endpoint(anthropic).await;
    let mut messages = vec![Message::system("You use tools."), Message::user("Go")];
    let (first, deltas) = call(&ep, request(messages.clone()), stream).await;

    assert_eq!(first.content, "Let me look at both files and compute.");
    if stream {
        assert_eq!(deltas, first.content, "text reaches the delta callback");
    }
    let expected_finish = if anthropic { "tool_use" } else { "tool_calls" };
    assert_eq!(first.finish_reason.as_deref(), Some(expected_finish));
    let names: Vec<&str> = first.tool_calls.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["read_file", "read_file", "python"]);
    let prefix = if anthropic { "toolu_0_" } else { "call_0_" };
    for (i, c) in first.tool_calls.iter().enumerate() {
        assert_eq!(c.id, format!("{prefix}{i}"));
    }
    assert_eq!(
        arguments(&first.tool_calls[0]),
        json!({"path": "notes/a long file name.txt"})
    );
    assert_eq!(
        arguments(&first.tool_calls[1]),
        json!({"path": "b.txt", "limit": 10})
    );
    assert_eq!(
        arguments(&first.tool_calls[2]),
        json!({"code": "print(sum(range(10)))"})
    );

    // Results in call order; the last one (python's) drives the next rule.
    messages.push(assistant(&first));
    let ids: Vec<String> = first.tool_calls.iter().map(|c| c.id.clone()).collect();
    messages.push(Message::tool_result(&ids[0], "contents of a"));
    messages.push(Message::tool_result(&ids[1], "contents of b"));
    messages.push(Message::tool_result(&ids[2], "45"));
    let (second, _) = call(&ep, request(messages.clone()), stream).await;
    assert_eq!(second.content, "python said 45 (turn 1)");
    assert!(second.tool_calls.is_empty());

    let body = sent(&server, 1);
    if anthropic {
        assert_eq!(
            body["messages"][1],
            json!({"role": "assistant", "content": [
                {"type": "text", "text": "Let me look at both files and compute."},
                {"type": "tool_use", "id": "toolu_0_0", "name": "read_file",
                 "input": {"path": "notes/a long file name.txt"}},
                {"type": "tool_use", "id": "toolu_0_1", "name": "read_file",
                 "input": {"path": "b.txt", "limit": 10}},
                {"type": "tool_use", "id": "toolu_0_2", "name": "python",
                 "input": {"code": "print(sum(range(10)))"}},
            ]})
        );
        // Consecutive results go back as ONE user message.
        assert_eq!(body["messages"].as_array().map(Vec::len), Some(3));
        assert_eq!(
            body["messages"][2],
            json!({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_0_0", "content": "contents of a"},
                {"type": "tool_result", "tool_use_id": "toolu_0_1", "content": "contents of b"},
                {"type": "tool_result", "tool_use_id": "toolu_0_2", "content": "45"},
            ]})
        );
    } else {
        assert_eq!(body["messages"][2]["tool_calls"][2]["id"], "call_0_2");
        assert_eq!(
            body["messages"][5],
            json!({"role": "tool", "content": "45", "tool_call_id": "call_0_2"})
        );
    }

    // A rule on the last tool result, with a capture group and `{{last_tool}}` in the
    // arguments of the call it makes.
    messages.truncate(messages.len() - 1);
    messages.push(Message::tool_result(&ids[2], "contents of c.txt"));
    let (third, _) = call(&ep, request(messages), stream).await;
    assert_eq!(third.content, "read c.txt via python");
    assert_eq!(third.tool_calls.len(), 1);
    assert_eq!(
        arguments(&third.tool_calls[0]),
        json!({"text": "contents of c.txt"})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_calls_round_trip_over_both_formats_streamed_or_not() {
    for (anthropic, stream) in [(false, false), (false, true), (true, false), (true, true)] {
        parallel_calls_round_trip(anthropic, stream).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_deal_argument_pieces_of_parallel_calls_interleaved() {
    let server = start(MockConfig {
        script: script(),
        ..MockConfig::default()
    })
    .await;
    let openai = stream_events(
        format!("{}/chat/completions", server.openai_base_url()),
        json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "go"}]}),
    )
    .await;
    let indices: Vec<u64> = openai
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"][0]["index"].as_u64())
        .collect();
    assert!(indices.len() > 6, "arguments arrive in pieces: {indices:?}");
    assert!(
        indices.windows(2).any(|w| w[1] < w[0]),
        "pieces of different calls interleave: {indices:?}"
    );
    let anthropic = stream_events(
        format!("{}/v1/messages", server.anthropic_base_url()),
        json!({"model": "m", "stream": true, "max_tokens": 9,
               "messages": [{"role": "user", "content": "go"}]}),
    )
    .await;
    let blocks: Vec<u64> = anthropic
        .iter()
        .filter(|e| e["delta"]["type"] == "input_json_delta")
        .filter_map(|e| e["index"].as_u64())
        .collect();
    assert!(blocks.len() > 6, "input arrives in pieces: {blocks:?}");
    assert!(blocks.windows(2).any(|w| w[1] < w[0]), "{blocks:?}");
}

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client")
}

/// The data of every event of the stream `body` posted to `url` gets.
async fn stream_events(url: String, body: Value) -> Vec<Value> {
    let text = http()
        .post(url)
        .json(&body)
        .send()
        .await
        .and_then(|r| r.error_for_status())
        .expect("stream")
        .text()
        .await
        .expect("body");
    text.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str(d).ok())
        .collect()
}

/// A request the mock must refuse with a 400, once, without retries.
async fn refused(ep: &Endpoint, req: ChatRequest) -> String {
    let recorded = ep.call_recorded(req, &CallOptions::default()).await;
    assert_eq!(recorded.record.attempts, 1, "a 400 is not retried");
    match recorded.result {
        Err(BridgeError::Http {
            status: 400,
            message,
            ..
        }) => message,
        other => panic!("expected a 400, got {other:?}"),
    }
}

fn with_call(id: &str) -> Message {
    Message {
        tool_calls: vec![ToolCall {
            id: id.into(),
            name: "python".into(),
            arguments: r#"{"code": "1"}"#.into(),
        }],
        ..Message::assistant("")
    }
}

async fn validates_tool_traffic(anthropic: bool) {
    let (server, ep) = recording_endpoint(anthropic).await;

    // A result answering no call.
    let err = refused(
        &ep,
        request(vec![
            Message::user("go"),
            with_call("c1"),
            Message::tool_result("c2", "x"),
        ]),
    )
    .await;
    assert!(err.contains("`c2`"), "{err}");

    // A call left unanswered before the next user turn.
    let err = refused(
        &ep,
        request(vec![
            Message::user("go"),
            with_call("c1"),
            Message::user("and?"),
        ]),
    )
    .await;
    assert!(err.contains("`c1`"), "{err}");

    // A tool whose name a real server refuses, and one whose schema is not an object.
    let mut req = request(vec![Message::user("go")]);
    req.tools[0].name = "read file".into();
    let err = refused(&ep, req).await;
    assert!(err.contains("`read file`"), "{err}");
    let mut req = request(vec![Message::user("go")]);
    req.tools[1].parameters = json!({"type": "array"});
    let err = refused(&ep, req).await;
    assert!(err.contains("Invalid schema for tool `python`"), "{err}");

    // A named tool choice that names no tool.
    let mut req = request(vec![Message::user("go")]);
    req.tool_choice = Some(ToolChoice::Tool("nope".into()));
    let err = refused(&ep, req).await;
    assert!(err.contains("`nope`"), "{err}");

    // Arguments that are not JSON still go out as a valid request and get an answer.
    let mut bad = with_call("c1");
    bad.tool_calls[0].arguments = "print(1".into();
    let ok = ep
        .call(
            request(vec![
                Message::user("go"),
                bad,
                Message::tool_result("c1", "error: bad JSON"),
            ]),
            &CallOptions::default(),
        )
        .await
        .expect("accepted");
    assert_eq!(ok.content, "Let me look at both files and compute.");
    let body = sent(&server, server.log().len() - 1);
    if anthropic {
        assert_eq!(
            body["messages"][1]["content"][0]["input"],
            json!({"_raw_arguments": "print(1"})
        );
    } else {
        assert_eq!(
            body["messages"][1]["tool_calls"][0]["function"]["arguments"],
            "print(1"
        );
        // A call without text still has string content: llama-cpp-python refuses `null`.
        assert_eq!(body["messages"][1]["content"], "");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_have_the_providers_error_shape() {
    let server = start_recording(script(), Faults::none()).await;
    let refusal = |url: String, body: Value| async move {
        let reply = http().post(url).json(&body).send().await.expect("response");
        assert_eq!(reply.status(), 400);
        reply.json::<Value>().await.expect("JSON error")
    };
    let body = refusal(
        format!("{}/chat/completions", server.openai_base_url()),
        json!({"model": "m", "messages": [
            {"role": "user", "content": "go"},
            {"role": "tool", "tool_call_id": "x", "content": "r"}]}),
    )
    .await;
    assert_eq!(body["error"]["type"], "invalid_request_error");
    let body = refusal(
        format!("{}/v1/messages", server.anthropic_base_url()),
        json!({"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "x", "content": "r"}]}]}),
    )
    .await;
    assert_eq!(body["type"], "error");
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("messages.0.content.0:")),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_tool_traffic_is_validated_like_the_real_api() {
    validates_tool_traffic(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_tool_traffic_is_validated_like_the_real_api() {
    validates_tool_traffic(true).await;
}

async fn tool_choice_shapes_the_request_and_the_reply(anthropic: bool) {
    let (server, ep) = recording_endpoint(anthropic).await;
    let mut req = request(vec![Message::user("go")]);
    req.parallel_tool_calls = Some(false);
    let single = ep.call(req, &CallOptions::default()).await.expect("answer");
    assert_eq!(single.tool_calls.len(), 1, "parallel calls switched off");
    let mut req = request(vec![Message::user("go")]);
    req.tool_choice = Some(ToolChoice::None);
    let none = ep.call(req, &CallOptions::default()).await.expect("answer");
    assert!(none.tool_calls.is_empty(), "`none` forbids tool calls");
    let mut req = request(vec![Message::user("go")]);
    req.tool_choice = Some(ToolChoice::Tool("python".into()));
    ep.call(req, &CallOptions::default()).await.expect("answer");
    let mut req = request(vec![Message::user("go")]);
    req.tool_choice = Some(ToolChoice::Required);
    ep.call(req, &CallOptions::default()).await.expect("answer");

    let sent_choices: Vec<(Value, Value)> = (0..4)
        .map(|i| {
            let body = sent(&server, i);
            (
                body["tool_choice"].clone(),
                body["parallel_tool_calls"].clone(),
            )
        })
        .collect();
    if anthropic {
        assert_eq!(
            sent_choices,
            [
                (
                    json!({"type": "auto", "disable_parallel_tool_use": true}),
                    Value::Null
                ),
                (json!({"type": "none"}), Value::Null),
                (json!({"type": "tool", "name": "python"}), Value::Null),
                (json!({"type": "any"}), Value::Null),
            ]
        );
    } else {
        // An unset choice goes out as `auto` (llama-cpp-python offers no tools without it).
        assert_eq!(
            sent_choices,
            [
                (json!("auto"), json!(false)),
                (json!("none"), Value::Null),
                (
                    json!({"type": "function", "function": {"name": "python"}}),
                    Value::Null
                ),
                (json!("required"), Value::Null),
            ]
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_tool_choice_and_parallel_calls() {
    tool_choice_shapes_the_request_and_the_reply(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_tool_choice_and_parallel_calls() {
    tool_choice_shapes_the_request_and_the_reply(true).await;
}

async fn accounting_covers_tool_calls(anthropic: bool, stream: bool) {
    // The first request fails with a 500: the call is retried, then answered with calls.
    let server = start_recording(script(), Faults::fail_first(1, FaultKind::ServerError)).await;
    let config = config_for(&server, anthropic);
    let ledger = Arc::new(Ledger::new(Budget {
        max_calls: Some(2),
        ..Budget::default()
    }));
    let ep = Endpoint::new(config, Arc::clone(&ledger)).expect("endpoint");
    let opts = CallOptions {
        stream,
        ..CallOptions::default()
    };
    let first = ep
        .call_recorded(request(vec![Message::user("go")]), &opts)
        .await;
    let answer = first.result.expect("answer after a retry");
    assert_eq!(answer.attempts, 2);
    assert_eq!(answer.tool_calls.len(), 3);
    let record = first.record;
    assert_eq!(record.attempts, 2);
    assert!(!record.tokens_estimated, "the server's usage is used");
    assert!(record.completion_tokens > 0 && record.prompt_tokens > 0);
    assert_eq!(record.response_chars, answer.response_chars());
    assert!(
        record.response_chars > answer.content.chars().count(),
        "tool-call arguments count as output"
    );
    // The mock counts names and arguments into completion tokens.
    let text_only = (answer.content.len() as u64).div_ceil(4);
    assert!(record.completion_tokens > text_only);

    let mut messages = vec![Message::user("go"), assistant(&answer)];
    for c in &answer.tool_calls {
        messages.push(Message::tool_result(&c.id, "45"));
    }
    let second = ep
        .call(request(messages.clone()), &opts)
        .await
        .expect("answer");
    assert_eq!(second.content, "python said 45 (turn 1)");
    let third = ep.call(request(messages), &opts).await;
    assert!(
        matches!(third, Err(BridgeError::Budget(_))),
        "the call budget covers tool-calling chats: {third:?}"
    );
    let totals = ledger.totals();
    assert_eq!(totals.calls, 3);
    assert_eq!(totals.errors, 1);
    assert_eq!(
        totals.prompt_tokens,
        ledger
            .records()
            .iter()
            .map(|r| r.prompt_tokens)
            .sum::<u64>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_tool_calls_are_accounted_streamed_or_not() {
    accounting_covers_tool_calls(false, false).await;
    accounting_covers_tool_calls(false, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_tool_calls_are_accounted_streamed_or_not() {
    accounting_covers_tool_calls(true, false).await;
    accounting_covers_tool_calls(true, true).await;
}
