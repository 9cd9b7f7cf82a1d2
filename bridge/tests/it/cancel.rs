//! Cancellation reaches calls wherever they are: in flight, queued, or backing off.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bridge::mock::{FaultKind, FaultRule, Faults, Latency};
use bridge::{
    BatchPolicy, BridgeError, Budget, CallOptions, CancellationToken, ChatRequest, EndpointConfig,
    RetryPolicy,
};

use crate::support::{endpoint, openai_config, start_with};

/// "Promptly": half the mock's 30 s, so only a cancelled call ends in time, whatever the
/// machine's load (not a speed check).
const PROMPT: Duration = Duration::from_secs(15);

fn cancel_after(token: &CancellationToken, delay: Duration) {
    let token = token.clone();
    tokio::spawn(async move {
        tokio::time::sleep(delay).await;
        token.cancel();
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_batch_stops_in_flight_calls() {
    let server = start_with(Latency::fixed(Duration::from_secs(30)), Faults::none()).await;
    let sub = endpoint(openai_config(&server), Budget::default());
    let reqs = (0..50)
        .map(|i| ChatRequest::from_prompt(format!("slow {i}")))
        .collect();
    let cancel = CancellationToken::new();
    cancel_after(&cancel, Duration::from_millis(300));
    let started = Instant::now();
    let results = sub.batch(reqs, BatchPolicy::bounded(16), &cancel).await;
    assert!(started.elapsed() < PROMPT, "took {:?}", started.elapsed());
    assert_eq!(results.len(), 50);
    assert!(
        results
            .iter()
            .all(|r| matches!(r, Err(BridgeError::Cancelled)))
    );
    let records = sub.ledger().records();
    assert_eq!(records.len(), 50, "every slot is recorded");
    assert!(
        records
            .iter()
            .all(|r| r.error_kind == Some(bridge::FailureKind::Cancelled))
    );
    assert_eq!(records.iter().filter(|r| r.attempts == 1).count(), 16);
    assert_eq!(sub.ledger().calls_reserved(), 16, "only sent calls count");
    assert_eq!(sub.in_flight(), 0, "permits are released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_during_backoff_returns_promptly() {
    let faults = Faults {
        retry_after: Duration::from_secs(30),
        ..Faults::fail_first(1, FaultKind::RateLimit)
    };
    let server = start_with(Latency::None, faults).await;
    let config = EndpointConfig {
        retry: RetryPolicy {
            max_attempts: 3,
            base_delay: Duration::from_millis(10),
            max_delay: Duration::from_secs(60),
            ..RetryPolicy::default()
        },
        ..openai_config(&server)
    };
    let sub = endpoint(config, Budget::default());
    let opts = CallOptions::default();
    cancel_after(&opts.cancel, Duration::from_millis(300));
    let started = Instant::now();
    let err = sub
        .call(ChatRequest::from_prompt("throttled"), &opts)
        .await
        .expect_err("cancelled while waiting for Retry-After");
    assert!(started.elapsed() < PROMPT, "took {:?}", started.elapsed());
    assert_eq!(err, BridgeError::Cancelled);
    assert_eq!(server.log().len(), 1, "no second attempt");
    assert_eq!(sub.ledger().records()[0].attempts, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_queued_on_the_limiter_can_be_cancelled() {
    let server = start_with(Latency::fixed(Duration::from_secs(30)), Faults::none()).await;
    let config = EndpointConfig {
        max_in_flight: 1,
        ..openai_config(&server)
    };
    let sub = Arc::new(endpoint(config, Budget::default()));
    let first = CallOptions::default();
    let running = tokio::spawn({
        let (sub, first) = (Arc::clone(&sub), first.clone());
        async move {
            sub.call(ChatRequest::from_prompt("holds the permit"), &first)
                .await
        }
    });
    while sub.in_flight() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let queued = CallOptions::default();
    cancel_after(&queued.cancel, Duration::from_millis(200));
    let started = Instant::now();
    let err = sub
        .call(ChatRequest::from_prompt("waits"), &queued)
        .await
        .expect_err("cancelled in the queue");
    assert!(started.elapsed() < PROMPT);
    assert_eq!(err, BridgeError::Cancelled);
    assert_eq!(
        sub.ledger().calls_reserved(),
        1,
        "the queued call gave its reservation back"
    );

    first.cancel.cancel();
    let first_result = running.await.expect("task joins");
    assert_eq!(first_result.expect_err("cancelled"), BridgeError::Cancelled);
    let records = sub.ledger().records();
    assert_eq!(records.len(), 2);
    assert_eq!(records.iter().map(|r| r.attempts).sum::<u32>(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_token_sends_nothing() {
    let server = start_with(Latency::None, Faults::none()).await;
    let sub = endpoint(openai_config(&server), Budget::default());
    let opts = CallOptions::default();
    opts.cancel.cancel();
    let err = sub
        .call(ChatRequest::from_prompt("never"), &opts)
        .await
        .expect_err("cancelled");
    assert_eq!(err, BridgeError::Cancelled);
    let results = sub
        .batch(
            vec![ChatRequest::from_prompt("a"), ChatRequest::from_prompt("b")],
            BatchPolicy::default(),
            &opts.cancel,
        )
        .await;
    assert!(
        results
            .iter()
            .all(|r| matches!(r, Err(BridgeError::Cancelled)))
    );
    assert_eq!(server.log().len(), 0);
    assert_eq!(sub.ledger().records().len(), 3);
}

/// A mock where every call whose prompt starts with `hang` hangs for 30 s.
async fn hanging_server() -> bridge::mock::MockServer {
    let faults = Faults {
        hang: Duration::from_secs(30),
        ..Faults::none()
    }
    .with_rule(FaultRule::matching("^hang", FaultKind::Hang));
    start_with(Latency::None, faults).await
}

/// Poll `done` every 5 ms for up to 3 s.
async fn eventually(mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + PROMPT;
    while Instant::now() < deadline {
        if done() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    done()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_call_is_recorded_and_an_unsent_one_gives_its_slot_back() {
    let server = hanging_server().await;
    let config = EndpointConfig {
        max_in_flight: 1,
        ..openai_config(&server)
    };
    let budget = Budget {
        max_calls: Some(2),
        ..Budget::default()
    };
    let sub = Arc::new(endpoint(config, budget));
    let ledger = Arc::clone(sub.ledger());

    // A holds the only permit, hanging at the server.
    let a = tokio::spawn({
        let sub = Arc::clone(&sub);
        async move {
            sub.call(ChatRequest::from_prompt("hang A"), &CallOptions::default())
                .await
        }
    });
    assert!(eventually(|| sub.in_flight() == 1).await);

    // B queues for the permit; its caller gives up by dropping the future.
    let b = tokio::time::timeout(
        Duration::from_millis(100),
        sub.call(ChatRequest::from_prompt("B"), &CallOptions::default()),
    )
    .await;
    assert!(b.is_err(), "B cannot have finished: {b:?}");
    assert_eq!(
        ledger.calls_reserved(),
        1,
        "B was never sent: its slot is back"
    );
    let b_record = &ledger.records()[0];
    assert_eq!(b_record.call_index, 1);
    assert_eq!(b_record.error_kind, Some(bridge::FailureKind::Cancelled));
    assert_eq!(b_record.attempts, 0);

    // A is dropped mid-flight: it was sent, so its slot stays spent.
    a.abort();
    assert!(a.await.expect_err("aborted").is_cancelled());
    assert!(eventually(|| sub.in_flight() == 0).await);

    // C gets the slot B gave back; D finds the budget spent.
    let c = sub
        .call(ChatRequest::from_prompt("C"), &CallOptions::default())
        .await
        .expect("C uses the slot B gave back");
    assert_eq!(c.content, "C");
    let d = sub
        .call(ChatRequest::from_prompt("D"), &CallOptions::default())
        .await;
    assert!(matches!(d, Err(BridgeError::Budget(_))), "{d:?}");

    let records = ledger.records();
    let indices: Vec<u64> = records.iter().map(|r| r.call_index).collect();
    assert_eq!(indices, [0, 1, 2, 3], "one record per call index");
    assert_eq!(ledger.next_call_index(), 4);
    let kinds: Vec<(Option<&str>, u32)> = records
        .iter()
        .map(|r| (r.error_kind.map(bridge::FailureKind::name), r.attempts))
        .collect();
    assert_eq!(
        kinds,
        [
            (Some("cancelled"), 1),
            (Some("cancelled"), 0),
            (None, 1),
            (Some("budget_max_calls"), 0)
        ]
    );
    assert_eq!(ledger.calls_reserved(), 2, "A and C were sent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_batch_leaves_a_record_for_every_started_call() {
    let server = hanging_server().await;
    let sub = endpoint(openai_config(&server), Budget::default());
    let reqs = (0..5)
        .map(|i| ChatRequest::from_prompt(format!("hang {i}")))
        .collect();
    let cancel = CancellationToken::new();
    let dropped = tokio::time::timeout(
        Duration::from_millis(300),
        sub.batch(reqs, BatchPolicy::bounded(2), &cancel),
    )
    .await;
    assert!(dropped.is_err(), "the batch cannot have finished");
    let ledger = sub.ledger();
    assert!(
        eventually(|| ledger.records().len() == 2).await,
        "{} records",
        ledger.records().len()
    );
    assert_eq!(
        ledger.next_call_index(),
        2,
        "calls never started take no index"
    );
    for r in ledger.records() {
        assert_eq!(r.error_kind, Some(bridge::FailureKind::Cancelled), "{r:?}");
        assert_eq!(r.attempts, 1);
        assert!(r.batched && r.batch_size == 5);
    }
    assert!(eventually(|| sub.in_flight() == 0).await);
}
