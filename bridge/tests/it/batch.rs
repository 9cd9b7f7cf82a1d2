//! Ordered, bounded batches: order, limits, and per-slot errors under injected faults.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use bridge::mock::{FaultKind, Faults, Latency};
use bridge::{
    BatchPolicy, BridgeError, Budget, CancellationToken, ChatRequest, EndpointConfig, Endpoints,
    Ledger, RetryPolicy,
};

use crate::support::{anthropic_config, endpoint, fast_retry, openai_config, start_with};

fn prompts(n: usize) -> Vec<ChatRequest> {
    (0..n)
        .map(|i| ChatRequest::from_prompt(format!("item {i}")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn order_is_kept_over_1000_requests() {
    // Random latency makes answers finish out of order.
    let latency = Latency::uniform(Duration::ZERO, Duration::from_millis(20));
    let server = start_with(latency, Faults::none()).await;
    let sub = endpoint(openai_config(&server), Budget::default());
    let n = 1000;
    let results = sub
        .batch(
            prompts(n),
            BatchPolicy::bounded(64),
            &CancellationToken::new(),
        )
        .await;
    assert_eq!(results.len(), n);
    for (i, r) in results.iter().enumerate() {
        let answer = r.as_ref().expect("no faults injected");
        assert_eq!(answer.content, format!("item {i}"), "slot {i}");
    }
    let records = sub.ledger().records();
    assert_eq!(records.len(), n);
    assert!(
        records
            .iter()
            .all(|r| r.batched && r.batch_size == n && r.error.is_none())
    );
    let indexes: BTreeSet<u64> = records.iter().map(|r| r.call_index).collect();
    assert_eq!(indexes, (0..n as u64).collect());
    let log = server.log();
    assert_eq!(log.len(), n);
    let overlap = log.max_concurrency();
    assert!(overlap <= 64, "batch width exceeded: {overlap}");
    assert!(overlap > 8, "batch did not run concurrently: {overlap}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_endpoint_limiter_caps_all_callers_together() {
    let latency = Latency::fixed(Duration::from_millis(20));
    let server = start_with(latency, Faults::none()).await;
    let config = EndpointConfig {
        max_in_flight: 8,
        ..openai_config(&server)
    };
    let endpoints = Endpoints::new(vec![config], Arc::new(Ledger::default())).expect("valid");
    let (a, b) = (
        endpoints.get("sub").expect("known"),
        endpoints.get("sub").expect("known"),
    );
    let cancel = CancellationToken::new();
    // Two "nested" callers each asking for more width than the endpoint allows.
    let (ra, rb) = tokio::join!(
        a.batch(prompts(40), BatchPolicy::unbounded(), &cancel),
        b.batch(prompts(40), BatchPolicy::bounded(32), &cancel),
    );
    assert!(ra.iter().chain(&rb).all(Result::is_ok));
    let overlap = server.log().max_concurrency();
    assert!(overlap <= 8, "limiter exceeded: {overlap} in flight");
    assert!(overlap >= 4, "limiter too strict: {overlap} in flight");
    assert_eq!(endpoints.ledger().records().len(), 80);
    assert_eq!(a.in_flight(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_fail_only_their_own_slots() {
    let faults = Faults::random(
        0.3,
        [
            FaultKind::ServerError,
            FaultKind::RateLimit,
            FaultKind::Reset,
            FaultKind::MalformedJson,
            FaultKind::TruncatedBody,
        ],
    );
    let server = start_with(Latency::None, faults).await;
    let config = EndpointConfig {
        // No retries, 429s included: every fault surfaces in its slot.
        retry: RetryPolicy {
            rate_limit_patience: Duration::ZERO,
            ..fast_retry(1)
        },
        ..openai_config(&server)
    };
    let sub = endpoint(config, Budget::default());
    let n = 300;
    let results = sub
        .batch(
            prompts(n),
            BatchPolicy::bounded(32),
            &CancellationToken::new(),
        )
        .await;
    assert_eq!(results.len(), n);
    let mut errors = 0;
    for (i, r) in results.iter().enumerate() {
        match r {
            Ok(answer) => assert_eq!(answer.content, format!("item {i}")),
            Err(e) => {
                errors += 1;
                assert!(
                    matches!(
                        e,
                        BridgeError::Http {
                            status: 500 | 429,
                            ..
                        } | BridgeError::Network { .. }
                            | BridgeError::Decode { .. }
                    ),
                    "slot {i}: unexpected error {e:?}"
                );
            }
        }
    }
    let log = server.log().entries();
    let faulted = log.iter().filter(|r| r.fault.is_some()).count();
    assert!(faulted > 30, "the fault rate should fire: {faulted}");
    assert_eq!(log.len(), n, "one attempt per slot");
    assert_eq!(
        errors, faulted,
        "each injected fault fails exactly its slot"
    );
    let records = sub.ledger().records();
    assert_eq!(records.len(), n, "every slot leaves a record");
    assert_eq!(records.iter().filter(|r| r.error.is_some()).count(), errors);
    let usage = sub.ledger().totals();
    assert_eq!((usage.calls, usage.errors), (n as u64, errors as u64));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_absorb_transient_faults_in_a_batch() {
    let faults = Faults::random(
        0.2,
        [
            FaultKind::ServerError,
            FaultKind::Unavailable,
            FaultKind::Reset,
            FaultKind::TruncatedBody,
        ],
    );
    let server = start_with(Latency::None, faults).await;
    let config = EndpointConfig {
        retry: fast_retry(10),
        ..openai_config(&server)
    };
    let sub = endpoint(config, Budget::default());
    let n = 300;
    let results = sub
        .batch(
            prompts(n),
            BatchPolicy::bounded(32),
            &CancellationToken::new(),
        )
        .await;
    for (i, r) in results.iter().enumerate() {
        assert_eq!(
            r.as_ref().expect("retried to success").content,
            format!("item {i}")
        );
    }
    let records = sub.ledger().records();
    let attempts: u64 = records.iter().map(|r| u64::from(r.attempts)).sum();
    assert_eq!(
        attempts as usize,
        server.log().len(),
        "attempts match requests served"
    );
    assert!(
        records.iter().any(|r| r.attempts > 1),
        "some calls were retried"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_batch_is_empty() {
    let server = start_with(Latency::None, Faults::none()).await;
    let sub = endpoint(openai_config(&server), Budget::default());
    let results = sub
        .batch(
            Vec::new(),
            BatchPolicy::default(),
            &CancellationToken::new(),
        )
        .await;
    assert!(results.is_empty());
    assert!(sub.ledger().records().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adaptive_limit_finds_the_width_a_capacity_limited_server_takes() {
    let capacity = 16;
    let server = crate::support::start(bridge::mock::MockConfig {
        latency: Latency::fixed(Duration::from_millis(20)),
        capacity: Some(capacity),
        faults: Faults {
            retry_after: Duration::from_millis(20),
            ..Faults::default()
        },
        ..bridge::mock::MockConfig::default()
    })
    .await;
    let mut config = EndpointConfig {
        retry: fast_retry(10),
        max_in_flight: 128,
        ..openai_config(&server)
    };
    bridge::Concurrency::Auto.apply(&mut config);
    assert_eq!(config.max_in_flight, bridge::AUTO_CEILING);
    let sub = endpoint(config, Budget::default());
    let n = 600;
    let results = sub
        .batch(
            prompts(n),
            BatchPolicy::unbounded(),
            &CancellationToken::new(),
        )
        .await;
    assert!(
        results.iter().all(Result::is_ok),
        "every call ends answered"
    );
    let stats = sub.limiter_stats();
    assert!(stats.adaptive);
    assert!(
        stats.peak_limit > capacity,
        "it probed past the capacity: {stats:?}"
    );
    assert!(
        stats.limit <= capacity + capacity / 4,
        "and came back to about it: {stats:?}"
    );
    assert!(stats.rate_limited >= 1, "{stats:?}");
    assert!(
        stats.rate_limited < n as u64 / 4,
        "far fewer 429s than calls: {stats:?}"
    );
    assert_eq!(stats.in_flight, 0);
}

/// Waits (at most 10 s) until `server` has accepted `n` connections, then a moment more for
/// the client's pool to take the last one in: a warm-up request that found another's
/// connection idle first leaves its own connection to finish opening in the background.
async fn accepted(server: &bridge::mock::MockServer, n: u64) -> u64 {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while server.connections() < n && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    server.connections()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_up_opens_the_connections_a_batch_then_runs_on() {
    for anthropic in [false, true] {
        let server = start_with(Latency::fixed(Duration::from_millis(20)), Faults::none()).await;
        let config = if anthropic {
            anthropic_config(&server)
        } else {
            openai_config(&server)
        };
        let sub = endpoint(config, Budget::default());
        assert_eq!(sub.warm_up(8).await, 8, "anthropic: {anthropic}");
        assert_eq!(accepted(&server, 8).await, 8, "one connection per request");
        let log = server.log().entries();
        // Both wire formats list models at `/v1/models` (OpenAI's base URL ends in `/v1`).
        assert!(
            log.len() == 8
                && log
                    .iter()
                    .all(|r| r.path == "/v1/models" && r.status == 200),
            "{log:?}"
        );
        assert!(sub.ledger().records().is_empty(), "a warm-up is no call");

        let results = sub
            .batch(
                prompts(8),
                BatchPolicy::bounded(8),
                &CancellationToken::new(),
            )
            .await;
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        assert_eq!(
            server.connections(),
            8,
            "the batch opened no connection of its own (anthropic: {anthropic})"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_up_is_capped_by_the_endpoints_limit() {
    let server = start_with(Latency::fixed(Duration::from_millis(20)), Faults::none()).await;
    let config = EndpointConfig {
        max_in_flight: 3,
        ..openai_config(&server)
    };
    let sub = endpoint(config, Budget::default());
    assert_eq!(sub.warm_up(64).await, 3);
    assert_eq!(server.log().len(), 3, "no more requests than the limit");
    assert_eq!(accepted(&server, 3).await, 3);
}
