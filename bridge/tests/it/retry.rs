//! Retries: Retry-After, exhaustion, fail-fast 4xx and timeouts (asserted on the mock's log).

use std::time::Duration;

use bridge::mock::{FaultKind, Faults, Latency};
use bridge::{BridgeError, Budget, CallOptions, ChatRequest, EndpointConfig, RetryPolicy};
use serde_json::Value;

use crate::support::{
    AfterReply, anthropic_config, endpoint, fast_retry, http_reply, openai_config, raw_config,
    raw_server, start_with,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_is_honoured_between_attempts() {
    let faults = Faults {
        retry_after: Duration::from_secs(1),
        ..Faults::fail_first(2, FaultKind::RateLimit)
    };
    let server = start_with(Latency::None, faults).await;
    let config = EndpointConfig {
        retry: RetryPolicy {
            max_attempts: 4,
            base_delay: Duration::from_millis(1), // far below Retry-After
            max_delay: Duration::from_secs(5),
        },
        ..openai_config(&server)
    };
    let sub = endpoint(config, Budget::default());
    let answer = sub
        .call(
            ChatRequest::from_prompt("patience"),
            &CallOptions::default(),
        )
        .await
        .expect("third attempt succeeds");
    assert_eq!(answer.content, "patience");
    assert_eq!(answer.attempts, 3);

    let log = server.log().entries();
    let statuses: Vec<u16> = log.iter().map(|r| r.status).collect();
    assert_eq!(statuses, [429, 429, 200]);
    for pair in log.windows(2) {
        let gap = pair[1].arrived - pair[0].arrived;
        assert!(
            gap >= Duration::from_secs(1),
            "retried after {gap:?}, before Retry-After"
        );
    }
    assert_eq!(sub.ledger().records()[0].attempts, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_stop_after_max_attempts() {
    let server = start_with(
        Latency::None,
        Faults::fail_first(100, FaultKind::Unavailable),
    )
    .await;
    let config = EndpointConfig {
        retry: fast_retry(3),
        ..openai_config(&server)
    };
    let sub = endpoint(config, Budget::default());
    let err = sub
        .call(ChatRequest::from_prompt("doomed"), &CallOptions::default())
        .await
        .expect_err("always 503");
    assert!(
        matches!(err, BridgeError::Http { status: 503, .. }),
        "{err:?}"
    );
    assert!(err.is_retryable());
    assert!(err.to_string().contains("HTTP 503"), "{err}");
    assert_eq!(server.log().len(), 3);
    let record = &sub.ledger().records()[0];
    assert_eq!(record.attempts, 3);
    assert_eq!(record.error_kind, Some(bridge::FailureKind::ServerError));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_client_errors_fail_fast_with_the_servers_message() {
    let server = start_with(Latency::None, Faults::none()).await;
    let root = endpoint(anthropic_config(&server), Budget::default());
    let mut req = ChatRequest::from_prompt("no max_tokens");
    // `extra` wins over typed fields: this removes the mandatory `max_tokens`.
    req.params.extra.insert("max_tokens".into(), Value::Null);
    let err = root
        .call(req, &CallOptions::default())
        .await
        .expect_err("400");
    assert!(
        matches!(err, BridgeError::Http { status: 400, .. }),
        "{err:?}"
    );
    assert!(!err.is_retryable());
    assert!(err.to_string().contains("max_tokens"), "{err}");
    assert_eq!(server.log().len(), 1, "a 400 is not retried");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_attempt_times_out_and_is_retried() {
    let faults = Faults {
        hang: Duration::from_secs(30),
        ..Faults::fail_first(1, FaultKind::Hang)
    };
    let server = start_with(Latency::None, faults).await;
    let config = EndpointConfig {
        timeout: Duration::from_millis(300),
        retry: fast_retry(3),
        ..openai_config(&server)
    };
    let sub = endpoint(config, Budget::default());
    let answer = sub
        .call(
            ChatRequest::from_prompt("second time lucky"),
            &CallOptions::default(),
        )
        .await
        .expect("the retry succeeds");
    assert_eq!(answer.content, "second time lucky");
    assert_eq!(answer.attempts, 2);
    assert!(answer.latency >= Duration::from_millis(300));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeouts_say_which_setting_to_raise() {
    let faults = Faults {
        hang: Duration::from_secs(30),
        ..Faults::fail_first(10, FaultKind::Hang)
    };
    let server = start_with(Latency::None, faults).await;
    let config = EndpointConfig {
        timeout: Duration::from_millis(200),
        retry: fast_retry(1),
        ..openai_config(&server)
    };
    let sub = endpoint(config, Budget::default());
    let started = std::time::Instant::now();
    let err = sub
        .call(ChatRequest::from_prompt("hang"), &CallOptions::default())
        .await
        .expect_err("times out");
    // Well under the 30 s hang: the 200 ms timeout ended it (not a speed check).
    assert!(started.elapsed() < Duration::from_secs(15));
    assert!(matches!(err, BridgeError::Timeout { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("timed out after 0.2s") && msg.contains("`timeout`"),
        "{msg}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_retry_after_waits_at_most_max_delay() {
    let body = r#"{"error":{"message":"slow down"}}"#;
    for (header, value) in [
        ("retry-after", "1e20"),
        ("retry-after", "18000000000000000000"),
        ("retry-after-ms", "1e300"),
    ] {
        let reply = http_reply("429 Too Many Requests", &[(header, value)], body);
        let base_url = raw_server(reply, AfterReply::Close).await;
        let max_delay = Duration::from_millis(200);
        let config = EndpointConfig {
            retry: RetryPolicy {
                max_attempts: 2,
                base_delay: Duration::from_millis(1),
                max_delay,
            },
            ..raw_config(&base_url, 2)
        };
        let sub = endpoint(config, Budget::default());
        let started = std::time::Instant::now();
        let err = sub
            .call(ChatRequest::from_prompt("x"), &CallOptions::default())
            .await
            .expect_err("always 429");
        let elapsed = started.elapsed();
        assert!(
            matches!(err, BridgeError::Http { status: 429, retry_after: Some(d), .. } if d == max_delay),
            "{header}: {value}: {err:?}"
        );
        assert!(err.to_string().contains("slow down"), "{err}");
        assert!(
            elapsed >= max_delay && elapsed < Duration::from_secs(30),
            "{header}: {value}: waited {elapsed:?}"
        );
        assert_eq!(sub.ledger().records()[0].attempts, 2);
    }
}
