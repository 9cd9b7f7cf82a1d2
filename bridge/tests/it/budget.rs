//! Budgets: exact call limits under concurrency, token and USD limits, cost.

use std::sync::Arc;

use bridge::mock::{Faults, Latency};
use bridge::{
    BatchPolicy, BridgeError, Budget, BudgetLimit, CallOptions, CancellationToken, ChatRequest,
    EndpointConfig, Price,
};
use futures::future::join_all;

use crate::support::{
    AfterReply, endpoint, http_reply, openai_config, raw_config, raw_server, start_with,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_calls_is_exact_under_concurrency() {
    let server = start_with(
        Latency::fixed(std::time::Duration::from_millis(5)),
        Faults::none(),
    )
    .await;
    let budget = Budget {
        max_calls: Some(37),
        ..Budget::default()
    };
    let sub = Arc::new(endpoint(openai_config(&server), budget));
    let reqs: Vec<_> = (0..150)
        .map(|i| ChatRequest::from_prompt(format!("p{i}")))
        .collect();
    let cancel = CancellationToken::new();
    // Half through one wide batch, half through independent concurrent calls.
    let (batch, singles) = tokio::join!(
        sub.batch(reqs[..75].to_vec(), BatchPolicy::unbounded(), &cancel),
        join_all(reqs[75..].iter().cloned().map(|r| {
            let sub = Arc::clone(&sub);
            async move { sub.call(r, &CallOptions::default()).await }
        })),
    );
    let all: Vec<_> = batch.into_iter().chain(singles).collect();
    let ok = all.iter().filter(|r| r.is_ok()).count();
    assert_eq!(ok, 37);
    for r in &all {
        if let Err(e) = r {
            let BridgeError::Budget(b) = e else {
                panic!("unexpected error {e:?}");
            };
            assert_eq!(b.limit, BudgetLimit::Calls);
            let msg = e.to_string();
            assert!(
                msg.contains("Raise `max_calls` of the budget") && !msg.contains("--max"),
                "{msg}"
            );
        }
    }
    assert_eq!(
        server.log().len(),
        37,
        "refused calls never reach the server"
    );
    assert_eq!(sub.ledger().calls_reserved(), 37);
    let records = sub.ledger().records();
    assert_eq!(records.len(), 150);
    let refused = records
        .iter()
        .filter(|r| r.error_kind == Some(bridge::FailureKind::Budget(bridge::BudgetLimit::Calls)))
        .count();
    assert_eq!(refused, 113);
    assert!(
        records
            .iter()
            .filter(|r| r.error.is_some())
            .all(|r| r.attempts == 0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_budget_refuses_calls_once_reached() {
    let server = start_with(Latency::None, Faults::none()).await;
    let budget = Budget {
        max_tokens: Some(100),
        ..Budget::default()
    };
    let sub = endpoint(openai_config(&server), budget);
    // 40 characters each way = 10 + 10 tokens per call (the mock's estimate).
    let prompt = "x".repeat(40);
    let mut sent = 0;
    let err = loop {
        match sub
            .call(
                ChatRequest::from_prompt(prompt.clone()),
                &CallOptions::default(),
            )
            .await
        {
            Ok(_) => sent += 1,
            Err(e) => break e,
        }
        assert!(sent <= 10, "the budget never stopped the calls");
    };
    let tokens = sub.ledger().tokens_used();
    assert!(tokens >= 100, "refused before reaching the limit: {tokens}");
    assert!(
        tokens - 100 < 20,
        "overshot by more than one call: {tokens}"
    );
    assert_eq!(server.log().len(), sent);
    let msg = err.to_string();
    assert!(
        msg.contains("Raise `max_tokens` of the budget") && !msg.contains("--max"),
        "{msg}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prices_give_costs_and_the_usd_budget_stops_calls() {
    let server = start_with(Latency::None, Faults::none()).await;
    let config = EndpointConfig {
        price: Some(Price {
            input_per_mtok: 1_000.0,
            output_per_mtok: 3_000.0,
        }),
        ..openai_config(&server)
    };
    let sub = endpoint(
        config,
        Budget {
            max_usd: Some(0.1),
            ..Budget::default()
        },
    );
    let prompt = "y".repeat(40); // 10 tokens in, 10 out: 0.01 + 0.03 USD
    let mut costs = Vec::new();
    let err = loop {
        match sub
            .call(
                ChatRequest::from_prompt(prompt.clone()),
                &CallOptions::default(),
            )
            .await
        {
            Ok(_) => costs.push(sub.ledger().records().last().and_then(|r| r.cost_usd)),
            Err(e) => break e,
        }
        assert!(costs.len() <= 10, "the USD budget never stopped the calls");
    };
    assert_eq!(costs.len(), 3, "0.04, 0.08, 0.12 >= 0.1 then refused");
    for cost in costs {
        let cost = cost.expect("priced endpoint records costs");
        assert!((cost - 0.04).abs() < 1e-9, "{cost}");
    }
    let total = sub
        .ledger()
        .totals()
        .cost_usd
        .expect("a priced endpoint's total");
    assert!((total - 0.12).abs() < 1e-9, "{total}");
    let by_model = sub.ledger().usage_by_model();
    assert_eq!(by_model["sub-model"].calls, 4);
    assert_eq!(by_model["sub-model"].errors, 1);
    assert!(matches!(err, BridgeError::Budget(ref b) if b.limit == BudgetLimit::Usd));
    assert!(
        err.to_string().contains("Raise `max_usd` of the budget")
            && !err.to_string().contains("--max"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uncounted_endpoints_spend_tokens_but_not_calls() {
    let server = start_with(Latency::None, Faults::none()).await;
    let ledger = Arc::new(bridge::Ledger::new(Budget {
        max_calls: Some(2),
        ..Budget::default()
    }));
    let root = EndpointConfig {
        counts_toward_call_budget: false,
        ..EndpointConfig::openai("root", server.openai_base_url(), "root-model")
    };
    let sub = EndpointConfig::openai("sub", server.openai_base_url(), "sub-model");
    let endpoints = bridge::Endpoints::new(vec![root, sub], Arc::clone(&ledger)).expect("valid");
    let (root, sub) = (
        endpoints.get("root").expect("root"),
        endpoints.get("sub").expect("sub"),
    );
    let opts = CallOptions::default();
    for i in 0..5 {
        root.call(ChatRequest::from_prompt(format!("iteration {i}")), &opts)
            .await
            .expect("root calls are not limited by max_calls");
    }
    for _ in 0..2 {
        sub.call(ChatRequest::from_prompt("sub"), &opts)
            .await
            .expect("within the call budget");
    }
    let refused = sub.call(ChatRequest::from_prompt("sub"), &opts).await;
    assert!(
        matches!(refused, Err(BridgeError::Budget(_))),
        "{refused:?}"
    );
    assert_eq!(ledger.calls_reserved(), 2);
    assert!(ledger.tokens_used() > 0);
    assert_eq!(ledger.usage_by_model()["root-model"].calls, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_budget_holds_under_concurrency() {
    let server = start_with(
        Latency::fixed(std::time::Duration::from_millis(50)),
        Faults::none(),
    )
    .await;
    let max = 10;
    let budget = Budget {
        max_tokens: Some(max),
        ..Budget::default()
    };
    let sub = endpoint(openai_config(&server), budget);
    // 18 or 19 characters: an estimate of 5 tokens each, so two calls fit in flight.
    let reqs = (0..100)
        .map(|i| ChatRequest::from_prompt(format!("some prompt text {i}")))
        .collect();
    let results = sub
        .batch(reqs, BatchPolicy::unbounded(), &CancellationToken::new())
        .await;
    let ok = results.iter().filter(|r| r.is_ok()).count();
    assert!((1..=2).contains(&ok), "{ok} calls were admitted");
    for r in &results {
        if let Err(e) = r {
            assert!(
                matches!(e, BridgeError::Budget(b) if b.limit == BudgetLimit::Tokens),
                "{e:?}"
            );
            assert!(e.to_string().contains("`max_tokens`"), "{e}");
        }
    }
    assert_eq!(
        server.log().len(),
        ok,
        "refused calls never reach the server"
    );

    // Admission counted each call's estimate (its prompt); only the part of its real usage
    // beyond that estimate can overshoot the limit.
    let records = sub.ledger().records();
    let estimate_error: u64 = records
        .iter()
        .filter(|r| r.error.is_none())
        .map(|r| {
            let estimate = (r.prompt_chars as u64).div_ceil(4);
            (r.prompt_tokens + r.completion_tokens).saturating_sub(estimate)
        })
        .sum();
    let used = sub.ledger().tokens_used();
    assert!(
        used <= max + estimate_error,
        "{used} tokens used, limit {max} + estimate error {estimate_error}"
    );
    assert!(used <= 2 * max, "{used}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_and_usd_estimates_count_max_tokens_and_the_price() {
    let server = start_with(Latency::None, Faults::none()).await;
    let config = EndpointConfig {
        price: Some(Price {
            input_per_mtok: 1_000.0,
            output_per_mtok: 3_000.0,
        }),
        ..openai_config(&server)
    };
    // 40 characters = 10 prompt tokens, plus `max_tokens` 90: a 100-token estimate.
    let mut req = ChatRequest::from_prompt("z".repeat(40));
    req.params.max_tokens = Some(90);
    let tokens = endpoint(
        config.clone(),
        Budget {
            max_tokens: Some(99),
            ..Budget::default()
        },
    );
    let err = tokens
        .call(req.clone(), &CallOptions::default())
        .await
        .expect_err("the estimate alone is over the limit");
    assert!(
        matches!(err, BridgeError::Budget(ref b) if b.limit == BudgetLimit::Tokens),
        "{err:?}"
    );
    assert!(err.to_string().contains("100"), "names the estimate: {err}");
    assert_eq!(server.log().len(), 0);

    // The same estimate costs 10 * 1000 / 1e6 + 90 * 3000 / 1e6 = 0.28 USD.
    let usd = endpoint(
        config,
        Budget {
            max_usd: Some(0.279),
            ..Budget::default()
        },
    );
    let err = usd
        .call(req.clone(), &CallOptions::default())
        .await
        .expect_err("the estimated cost is over the limit");
    assert!(
        matches!(err, BridgeError::Budget(ref b) if b.limit == BudgetLimit::Usd),
        "{err:?}"
    );
    assert_eq!(server.log().len(), 0);
    assert_eq!(usd.ledger().usd_used(), 0.0);
    assert_eq!(usd.ledger().records().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absurd_server_usage_saturates_the_counters() {
    let json = [("content-type", "application/json")];
    let openai = http_reply(
        "200 OK",
        &json,
        r#"{"model":"m","choices":[{"message":{"content":"hi"},"finish_reason":"stop"}],
            "usage":{"prompt_tokens":18446744073709551615,"completion_tokens":1}}"#,
    );
    let config = EndpointConfig {
        price: Some(Price {
            input_per_mtok: 1e300,
            output_per_mtok: 1e300,
        }),
        ..raw_config(&raw_server(openai, AfterReply::Close).await, 1)
    };
    let sub = endpoint(config.clone(), Budget::default());
    for _ in 0..2 {
        let answer = sub
            .call(ChatRequest::from_prompt("x"), &CallOptions::default())
            .await
            .expect("a huge usage is still an answer");
        assert_eq!(answer.usage.prompt_tokens, u64::MAX);
        assert_eq!(answer.usage.total(), u64::MAX);
    }
    let ledger = sub.ledger();
    assert_eq!(ledger.tokens_used(), u64::MAX);
    let totals = ledger.totals();
    assert_eq!(
        (totals.prompt_tokens, totals.completion_tokens),
        (u64::MAX, 2)
    );
    assert_eq!(ledger.usd_used(), u64::MAX as f64 / 1e9);

    let anthropic = http_reply(
        "200 OK",
        &json,
        r#"{"model":"m","content":[{"type":"text","text":"hi"}],"stop_reason":"end_turn",
            "usage":{"input_tokens":18446744073709551615,"cache_read_input_tokens":5,
                     "output_tokens":18446744073709551615}}"#,
    );
    let base_url = raw_server(anthropic, AfterReply::Close).await;
    let root = endpoint(
        EndpointConfig {
            provider: bridge::Provider::Anthropic,
            ..raw_config(&base_url, 1)
        },
        Budget {
            max_tokens: Some(1000),
            ..Budget::default()
        },
    );
    let answer = root
        .call(ChatRequest::from_prompt("x"), &CallOptions::default())
        .await
        .expect("a huge usage is still an answer");
    assert_eq!(answer.usage.prompt_tokens, u64::MAX);
    assert_eq!(answer.usage.total(), u64::MAX);
    assert_eq!(root.ledger().tokens_used(), u64::MAX);
    let refused = root
        .call(ChatRequest::from_prompt("x"), &CallOptions::default())
        .await;
    assert!(
        matches!(refused, Err(BridgeError::Budget(ref b)) if b.limit == BudgetLimit::Tokens),
        "{refused:?}"
    );
}
