//! Wire-format checks against a real third-party OpenAI-compatible server, outside the default
//! run (`#[ignore]`): start one on loopback, then
//!
//! ```sh
//! RLM_INTEROP_BASE_URL=http://127.0.0.1:8089/v1 RLM_INTEROP_MODEL=smollm2 \
//!     cargo nextest run -p rlm-bridge --run-ignored only interop
//! ```
//!
//! Checked with llama.cpp's server (`llama-cpp-python[server]` 0.3.36, SmolLM2-135M-Instruct):
//! JSON and SSE replies, usage, `max_tokens`, and an ordered batch. The model's answers are not
//! judged, only the wire.

use std::sync::Arc;

use bridge::{
    BatchPolicy, Budget, CallOptions, CancellationToken, ChatRequest, EndpointConfig, Endpoints,
    Ledger,
};

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
