//! Retries: Retry-After, a busy server waited out within the patience, exhaustion, fail-fast
//! 4xx and timeouts (asserted on the mock's log).

use std::time::{Duration, Instant};

use bridge::mock::{FaultKind, Faults, Latency, MockConfig, MockServer};
use bridge::{
    BatchPolicy, BridgeError, Budget, CallOptions, CancellationToken, ChatRequest, Endpoint,
    EndpointConfig, FailureKind, RetryPolicy,
};
use serde_json::Value;

use crate::support::{
    AfterReply, anthropic_config, endpoint, fast_retry, http_reply, openai_config, raw_config,
    raw_server, start, start_with,
};

/// A mock server whose first `fails` requests are answered 429 with `Retry-After:
/// retry_after`, and an endpoint on it retried by `retry`.
async fn throttled(
    fails: u64,
    retry_after: Duration,
    retry: RetryPolicy,
) -> (MockServer, Endpoint) {
    let faults = Faults {
        retry_after,
        ..Faults::fail_first(fails, FaultKind::RateLimit)
    };
    let server = start_with(Latency::None, faults).await;
    let config = EndpointConfig {
        retry,
        ..openai_config(&server)
    };
    let sub = endpoint(config, Budget::default());
    (server, sub)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_is_honoured_between_attempts() {
    let retry = RetryPolicy {
        max_attempts: 4,
        base_delay: Duration::from_millis(1), // far below Retry-After
        max_delay: Duration::from_secs(5),
        ..RetryPolicy::default()
    };
    let (server, sub) = throttled(2, Duration::from_secs(1), retry).await;
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
                // Every 429 uses an attempt: the test is about the cap on one wait.
                rate_limit_patience: Duration::ZERO,
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_server_is_waited_out_past_max_attempts_within_the_patience() {
    // Six 429s that ask to come back after 100 ms, against two attempts: each is waited out
    // without using one up, and the seventh attempt is answered.
    let retry = RetryPolicy {
        rate_limit_patience: Duration::from_secs(20),
        ..fast_retry(2)
    };
    let (server, sub) = throttled(6, Duration::from_millis(100), retry).await;
    let answer = sub
        .call(ChatRequest::from_prompt("busy"), &CallOptions::default())
        .await
        .expect("the server is busy, not failing");
    assert_eq!(answer.content, "busy");
    assert_eq!(answer.attempts, 7);
    let log = server.log().entries();
    let statuses: Vec<u16> = log.iter().map(|r| r.status).collect();
    assert_eq!(statuses, [429, 429, 429, 429, 429, 429, 200]);
    for pair in log.windows(2) {
        let gap = pair[1].arrived - pair[0].arrived;
        assert!(gap >= Duration::from_millis(100), "retried after {gap:?}");
    }
    let record = &sub.ledger().records()[0];
    assert_eq!((record.attempts, record.error_kind), (7, None));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_patience_a_429_uses_up_attempts() {
    let patience = Duration::from_millis(600);
    let retry = RetryPolicy {
        rate_limit_patience: patience,
        ..fast_retry(2)
    };
    let (server, sub) = throttled(1000, Duration::from_millis(100), retry).await;
    let started = Instant::now();
    let err = sub
        .call(
            ChatRequest::from_prompt("always busy"),
            &CallOptions::default(),
        )
        .await
        .expect_err("always 429");
    let elapsed = started.elapsed();
    assert_eq!(err.kind(), FailureKind::RateLimited, "{err:?}");
    assert!(err.to_string().contains("retries were exhausted"), "{err}");
    // Waited out while within the patience (about six tries 100-110 ms apart), then two
    // attempts that count: the last one leaves after the patience, and not much later.
    assert!(
        elapsed >= patience && elapsed < patience + Duration::from_secs(5),
        "gave up after {elapsed:?}"
    );
    let record = &sub.ledger().records()[0];
    assert!((4..=9).contains(&record.attempts), "{record:?}");
    assert_eq!(server.log().len() as u32, record.attempts);
    assert_eq!(record.error_kind, Some(FailureKind::RateLimited));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_429_that_says_when_to_come_back_is_waited_out() {
    // A 429 without `Retry-After`, and a 503 with one: each uses up an attempt, as before,
    // however patient the policy is for 429s that say when to come back.
    let body = r#"{"error":{"message":"not now"}}"#;
    for (status, headers) in [
        ("429 Too Many Requests", &[][..]),
        ("503 Service Unavailable", &[("retry-after-ms", "20")][..]),
    ] {
        let base_url = raw_server(http_reply(status, headers, body), AfterReply::Close).await;
        let mut config = raw_config(&base_url, 2);
        config.retry.rate_limit_patience = Duration::from_secs(60);
        let sub = endpoint(config, Budget::default());
        let started = Instant::now();
        let err = sub
            .call(ChatRequest::from_prompt("x"), &CallOptions::default())
            .await
            .expect_err("always failing");
        assert!(err.to_string().contains("not now"), "{status}: {err}");
        assert_eq!(sub.ledger().records()[0].attempts, 2, "{status}");
        assert!(started.elapsed() < Duration::from_secs(30), "{status}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_wider_than_the_servers_capacity_loses_no_answer() {
    // 16 calls at once against a server that serves 2 at once and answers the rest 429 with
    // `Retry-After: 50 ms`, two attempts a call: every call is answered within the patience;
    // with no patience (every 429 an attempt, the count alone) some calls are lost.
    async fn run(patience: Duration) -> (usize, u32) {
        let server = start(MockConfig {
            latency: Latency::fixed(Duration::from_millis(50)),
            capacity: Some(2),
            faults: Faults {
                retry_after: Duration::from_millis(50),
                ..Faults::default()
            },
            ..MockConfig::default()
        })
        .await;
        let config = EndpointConfig {
            retry: RetryPolicy {
                rate_limit_patience: patience,
                ..fast_retry(2)
            },
            ..openai_config(&server)
        };
        let sub = endpoint(config, Budget::default());
        let prompts = (0..16)
            .map(|i| ChatRequest::from_prompt(format!("item {i}")))
            .collect();
        let results = sub
            .batch(prompts, BatchPolicy::bounded(16), &CancellationToken::new())
            .await;
        for (i, result) in results.iter().enumerate() {
            if let Ok(answer) = result {
                assert_eq!(answer.content, format!("item {i}"));
            }
        }
        let lost = results.iter().filter(|r| r.is_err()).count();
        let most = sub.ledger().records().iter().map(|r| r.attempts).max();
        (lost, most.unwrap_or(0))
    }
    let (lost, most) = run(Duration::from_secs(30)).await;
    assert_eq!(lost, 0, "a busy server lost {lost} answers");
    assert!(most > 2, "some call came back more than twice: {most}");
    let (lost, most) = run(Duration::ZERO).await;
    assert!(
        lost > 0,
        "with the count alone some call runs out of attempts"
    );
    assert_eq!(most, 2);
}
