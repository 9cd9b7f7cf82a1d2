//! Errors a user can act on: wrong URL, refused connection, bad or missing key.

use std::sync::Arc;

use bridge::mock::{MockConfig, MockServer};
use bridge::{
    BridgeError, Budget, CallOptions, ChatRequest, EndpointConfig, Endpoints, Ledger, Provider,
};

use crate::support::{
    AfterReply, anthropic_config, endpoint, fast_retry, openai_config, raw_config, raw_server,
    start, start_with,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_base_url_is_a_404_that_points_at_base_url() {
    let server = start(MockConfig::default()).await;
    // Forgot the `/v1`.
    let config = EndpointConfig {
        base_url: server.anthropic_base_url(),
        ..openai_config(&server)
    };
    let sub = endpoint(config, Budget::default());
    let err = sub
        .call(ChatRequest::from_prompt("hi"), &CallOptions::default())
        .await
        .expect_err("404");
    assert!(
        matches!(err, BridgeError::Http { status: 404, .. }),
        "{err:?}"
    );
    let msg = err.to_string();
    let url = format!("{}/chat/completions", server.anthropic_base_url());
    assert!(msg.contains(&url), "{msg}");
    assert!(msg.contains("`base_url`") && msg.contains("`/v1`"), "{msg}");
    assert!(
        msg.contains("Unknown path"),
        "carries the server's message: {msg}"
    );
    assert_eq!(server.log().len(), 1, "a 404 is not retried");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_names_the_url() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("addr").port()
    }; // dropped: nothing listens there any more
    let base_url = format!("http://127.0.0.1:{port}/v1");
    let config = EndpointConfig {
        retry: fast_retry(2),
        ..EndpointConfig::openai("sub", base_url.clone(), "m")
    };
    let sub = endpoint(config, Budget::default());
    let err = sub
        .call(ChatRequest::from_prompt("hi"), &CallOptions::default())
        .await
        .expect_err("refused");
    assert!(matches!(err, BridgeError::Connect { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains(&format!("{base_url}/chat/completions")),
        "{msg}"
    );
    assert!(msg.to_lowercase().contains("refused"), "{msg}");
    assert!(
        msg.contains("server is running") && msg.contains("`base_url` of endpoint `sub`"),
        "{msg}"
    );
    assert_eq!(
        sub.ledger().records()[0].attempts,
        2,
        "connection errors are retried"
    );
}

async fn keyed_server() -> MockServer {
    start(MockConfig {
        api_key: Some("s3cret".into()),
        ..MockConfig::default()
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_key_names_the_environment_variable() {
    let server = keyed_server().await;
    let config = EndpointConfig {
        api_key_env: Some("RLM_TEST_KEY_THAT_IS_NOT_SET".into()),
        ..openai_config(&server)
    };
    let sub = endpoint(config, Budget::default());
    let err = sub
        .call(ChatRequest::from_prompt("hi"), &CallOptions::default())
        .await
        .expect_err("401");
    assert!(
        matches!(err, BridgeError::Unauthorized { status: 401, .. }),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("`RLM_TEST_KEY_THAT_IS_NOT_SET` is not set"),
        "{msg}"
    );
    assert!(
        msg.contains("Invalid or missing API key"),
        "server message kept: {msg}"
    );
    assert_eq!(server.log().len(), 1, "a 401 is not retried");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_key_says_where_it_came_from() {
    let server = keyed_server().await;
    // `HOME` is set but is not the key.
    let from_env = EndpointConfig {
        api_key_env: Some("HOME".into()),
        ..openai_config(&server)
    };
    let err = endpoint(from_env, Budget::default())
        .call(ChatRequest::from_prompt("hi"), &CallOptions::default())
        .await
        .expect_err("401");
    assert!(
        err.to_string().contains("environment variable `HOME`"),
        "{err}"
    );

    let inline = EndpointConfig {
        api_key: Some("wrong".into()),
        ..anthropic_config(&server)
    };
    let err = endpoint(inline, Budget::default())
        .call(ChatRequest::from_prompt("hi"), &CallOptions::default())
        .await
        .expect_err("401");
    assert!(matches!(err, BridgeError::Unauthorized { .. }), "{err:?}");
    assert!(
        err.to_string().contains("`api_key` of endpoint `root`"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_right_key_is_sent_by_both_clients() {
    let server = keyed_server().await;
    for config in [openai_config(&server), anthropic_config(&server)] {
        let config = EndpointConfig {
            api_key: Some("s3cret".into()),
            ..config
        };
        let answer = endpoint(config, Budget::default())
            .call(
                ChatRequest::from_prompt("let me in"),
                &CallOptions::default(),
            )
            .await
            .expect("authorized");
        assert_eq!(answer.content, "let me in");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_garbled_answer_is_retried_once() {
    let faults = bridge::mock::Faults::fail_first(1, bridge::mock::FaultKind::MalformedJson);
    let server = start_with(bridge::mock::Latency::None, faults).await;
    let answer = endpoint(openai_config(&server), Budget::default())
        .call(ChatRequest::from_prompt("hi"), &CallOptions::default())
        .await
        .expect("the retry is answered");
    assert_eq!(answer.content, "hi");
    assert_eq!(server.log().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_keeps_answering_badly_is_a_decode_error_after_one_retry() {
    let faults = bridge::mock::Faults::fail_first(5, bridge::mock::FaultKind::MalformedJson);
    let server = start_with(bridge::mock::Latency::None, faults).await;
    let err = endpoint(openai_config(&server), Budget::default())
        .call(ChatRequest::from_prompt("hi"), &CallOptions::default())
        .await
        .expect_err("malformed");
    assert!(matches!(err, BridgeError::Decode { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("answered badly") && msg.contains("`provider`"),
        "{msg}"
    );
    assert!(!msg.contains("could not be reached"), "{msg}");
    assert_eq!(
        server.log().len(),
        2,
        "one retry, not the policy's full count"
    );
}

#[test]
fn configuration_mistakes_are_explained() {
    let ledger = Arc::new(Ledger::default());
    let endpoints = Endpoints::new(
        vec![
            EndpointConfig::openai("root", "http://127.0.0.1:1/v1", "a"),
            EndpointConfig::openai("sub", "http://127.0.0.1:1/v1", "b"),
        ],
        Arc::clone(&ledger),
    )
    .expect("valid");
    assert_eq!(endpoints.names(), ["root", "sub"]);
    let err = endpoints.get("critic").expect_err("unknown");
    assert_eq!(
        err.to_string(),
        "Unknown endpoint `critic`; known endpoints: `root`, `sub`"
    );

    let dup = Endpoints::new(
        vec![
            EndpointConfig::openai("sub", "http://127.0.0.1:1/v1", "a"),
            EndpointConfig::openai("sub", "http://127.0.0.1:1/v1", "b"),
        ],
        Arc::clone(&ledger),
    )
    .expect_err("duplicate");
    assert!(
        dup.to_string().contains("two endpoints are named `sub`"),
        "{dup}"
    );

    let bad_url = Endpoints::new(
        vec![EndpointConfig::openai("sub", "localhost:8000", "a")],
        Arc::clone(&ledger),
    )
    .expect_err("no scheme");
    assert!(matches!(bad_url, BridgeError::Config(_)), "{bad_url:?}");

    assert_eq!(
        "Anthropic".parse::<Provider>().expect("known"),
        Provider::Anthropic
    );
    let unknown = "gemini".parse::<Provider>().expect_err("unknown");
    assert!(
        unknown.to_string().contains("`openai` or `anthropic`"),
        "{unknown}"
    );
}

#[test]
fn debug_output_never_shows_keys() {
    let config = EndpointConfig {
        api_key: Some("sk-very-secret".into()),
        headers: vec![("x-extra-auth".into(), "hidden-token".into())],
        ..EndpointConfig::openai("sub", "http://127.0.0.1:1/v1", "m")
    };
    let endpoint =
        bridge::Endpoint::new(config.clone(), Arc::new(Ledger::default())).expect("valid");
    for text in [format!("{config:?}"), format!("{endpoint:?}")] {
        assert!(
            !text.contains("sk-very-secret") && !text.contains("hidden-token"),
            "{text}"
        );
    }
}

/// A reply announcing a 1 GiB body of which it sends only `sent`, then stalls.
fn huge_reply(status: &str, sent: &str) -> String {
    format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{sent}",
        1u64 << 30
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answer_bodies_are_capped() {
    let base_url = raw_server(huge_reply("200 OK", "{"), AfterReply::Stall).await;
    let config = EndpointConfig {
        timeout: std::time::Duration::from_secs(2),
        ..raw_config(&base_url, 1)
    };
    let sub = endpoint(config, Budget::default());
    for stream in [false, true] {
        let opts = CallOptions {
            stream,
            ..CallOptions::default()
        };
        let err = sub
            .call(ChatRequest::from_prompt("hi"), &opts)
            .await
            .expect_err("too large");
        assert!(matches!(err, BridgeError::Decode { .. }), "{err:?}");
        assert!(!err.is_retryable());
        let msg = err.to_string();
        assert!(
            msg.contains("64 MiB") && msg.contains("1073741824"),
            "{msg}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_bodies_are_read_only_as_far_as_the_message_needs() {
    let sent = format!(r#"{{"error":{{"message":"{}"#, "x".repeat(200 * 1024));
    let reply = huge_reply("400 Bad Request", &sent);
    let base_url = raw_server(reply, AfterReply::Stall).await;
    let config = EndpointConfig {
        timeout: std::time::Duration::from_secs(2),
        ..raw_config(&base_url, 1)
    };
    let sub = endpoint(config, Budget::default());
    let err = sub
        .call(ChatRequest::from_prompt("hi"), &CallOptions::default())
        .await
        .expect_err("400");
    assert!(
        matches!(err, BridgeError::Http { status: 400, .. }),
        "read the start of the body, not all of it: {err:?}"
    );
    let msg = err.to_string();
    assert!(msg.contains("xxxx") && msg.len() < 2_000, "{}", msg.len());
}
