//! Property test of one budget for a tree of runs: whatever the shape of a tree of
//! `rlm_query` children, whatever fails where, what the tree spends never passes a limit.
//!
//! A tree node stands for one RLM loop: its iterations (calls to `root`, each an iteration)
//! and its code's sub-calls (to `sub`, counted toward `max_calls`) run while its children run
//! concurrently, all on one ledger, as the kernel runs a tree. Calls fail at random in every
//! way a call can end: a server error after the request was sent, a cancellation while in
//! flight, a caller that drops the call's future (a timeout), a cancellation before it was
//! sent. A scripted client stands in for the server (the HTTP path is tested elsewhere; what
//! is tested here is admission and settlement under concurrency): it answers within what the
//! call reserved, as the budget's contract says (prompt tokens as estimated, no more
//! completion tokens than `max_tokens`).
//!
//! Checked, for every tree: calls, iterations, tokens and USD used stay within their limits
//! (watched while the tree runs, and at the end), every call leaves exactly one record whose
//! usage adds up to the ledger's totals, and nothing stays reserved once the tree ended.
//! The seed is fixed; `PROPTEST_CASES` raises the number of cases.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use bridge::{
    BridgeError, Budget, CallOptions, CancellationToken, ChatRequest, ChatResponse, Endpoint,
    EndpointConfig, Ledger, LmClient, Message, Price, Usage,
};
use futures::future::{BoxFuture, FutureExt, join_all};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

/// How one call ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// Answered, using `used` percent of its `max_tokens`.
    Answered { used: u8 },
    /// The server answered 500 after the request was sent.
    ServerError,
    /// Cancelled while in flight.
    CancelledInFlight,
    /// Its future was dropped while in flight (a caller's timeout).
    Dropped,
    /// Cancelled before it was sent.
    CancelledBefore,
}

#[derive(Debug, Clone)]
struct Call {
    /// An iteration (to `root`) or a sub-call (to `sub`).
    iteration: bool,
    prompt_chars: usize,
    max_tokens: u32,
    fate: Fate,
}

#[derive(Debug, Clone)]
struct Node {
    calls: Vec<Call>,
    children: Vec<Node>,
}

fn fate() -> impl Strategy<Value = Fate> {
    prop_oneof![
        6 => (0u8..=100).prop_map(|used| Fate::Answered { used }),
        1 => Just(Fate::ServerError),
        1 => Just(Fate::CancelledInFlight),
        1 => Just(Fate::Dropped),
        1 => Just(Fate::CancelledBefore),
    ]
}

fn call() -> impl Strategy<Value = Call> {
    (any::<bool>(), 0usize..2_000, 1u32..300, fate()).prop_map(
        |(iteration, prompt_chars, max_tokens, fate)| Call {
            iteration,
            prompt_chars,
            max_tokens,
            fate,
        },
    )
}

fn tree() -> impl Strategy<Value = Node> {
    let leaf = prop::collection::vec(call(), 0..6).prop_map(|calls| Node {
        calls,
        children: Vec::new(),
    });
    // Up to three levels below the root, up to four children each.
    leaf.prop_recursive(3, 40, 4, |inner| {
        (
            prop::collection::vec(call(), 0..6),
            prop::collection::vec(inner, 0..4),
        )
            .prop_map(|(calls, children)| Node { calls, children })
    })
}

fn limit<T: std::fmt::Debug + Clone + 'static>(
    value: impl Strategy<Value = T> + 'static,
) -> impl Strategy<Value = Option<T>> {
    prop_oneof![1 => Just(None), 3 => value.prop_map(Some)]
}

fn budget() -> impl Strategy<Value = Budget> {
    (
        limit(0u64..40),
        limit(0u64..20_000),
        limit(0.000_01f64..0.01),
        limit(0u64..30),
    )
        .prop_map(|(max_calls, max_tokens, max_usd, max_iterations)| Budget {
            max_calls,
            max_tokens,
            max_usd,
            max_iterations,
        })
}

/// Answers as each request's plan (in its `extra` parameters) says, within what it reserved.
#[derive(Debug)]
struct ScriptedServer;

#[async_trait]
impl LmClient for ScriptedServer {
    async fn chat(&self, req: &ChatRequest) -> Result<ChatResponse, BridgeError> {
        let plan = |key: &str| req.params.extra.get(key).and_then(|v| v.as_u64());
        // Long enough for a cancellation or a timeout to land while the call is in flight.
        tokio::time::sleep(Duration::from_micros(plan("sleep_us").unwrap_or(0))).await;
        if plan("server_error") == Some(1) {
            return Err(BridgeError::Http {
                endpoint: "scripted".into(),
                base_url_setting: "base_url".into(),
                url: "scripted://".into(),
                status: 500,
                message: "scripted failure".into(),
                retry_after: None,
            });
        }
        let max_tokens = u64::from(req.params.max_tokens.unwrap_or(0));
        let used = plan("used_percent").unwrap_or(100);
        Ok(ChatResponse {
            content: "ok".into(),
            tool_calls: Vec::new(),
            usage: Usage {
                // What the ledger estimated: the contract is that the server uses no more.
                prompt_tokens: (req.prompt_chars() as u64).div_ceil(4),
                completion_tokens: max_tokens * used / 100,
                estimated: false,
            },
            finish_reason: Some("stop".into()),
            model: "scripted".into(),
            latency: Duration::ZERO,
            attempts: 1,
        })
    }

    async fn chat_stream(
        &self,
        req: &ChatRequest,
        _on_delta: &mut (dyn for<'s> FnMut(&'s str) + Send),
    ) -> Result<ChatResponse, BridgeError> {
        self.chat(req).await
    }
}

struct Tree {
    root: Endpoint,
    sub: Endpoint,
}

fn endpoints(ledger: &Arc<Ledger>) -> Tree {
    let config = |name: &str, price: Price, counted: bool| EndpointConfig {
        price: Some(price),
        counts_toward_call_budget: counted,
        // One attempt: a server error is a failed call, not a retry loop.
        retry: bridge::RetryPolicy {
            max_attempts: 1,
            ..bridge::RetryPolicy::default()
        },
        ..EndpointConfig::openai(name, "http://127.0.0.1:9/v1", name)
    };
    let client: Arc<dyn LmClient> = Arc::new(ScriptedServer);
    let endpoint = |config| {
        Endpoint::with_client(config, Arc::clone(&client), Arc::clone(ledger))
            .expect("valid endpoint")
    };
    Tree {
        root: endpoint(config(
            "root",
            Price {
                input_per_mtok: 3.0,
                output_per_mtok: 15.0,
            },
            false,
        )),
        sub: endpoint(config(
            "sub",
            Price {
                input_per_mtok: 0.5,
                output_per_mtok: 1.5,
            },
            true,
        )),
    }
}

async fn make_call(tree: &Tree, call: &Call) {
    let mut request = ChatRequest {
        messages: vec![Message::user("x".repeat(call.prompt_chars))],
        ..ChatRequest::default()
    };
    request.params.max_tokens = Some(call.max_tokens);
    let extra = &mut request.params.extra;
    extra.insert("sleep_us".into(), 300.into());
    match call.fate {
        Fate::Answered { used } => {
            extra.insert("used_percent".into(), used.into());
        }
        Fate::ServerError => {
            extra.insert("server_error".into(), 1.into());
        }
        Fate::CancelledInFlight | Fate::Dropped | Fate::CancelledBefore => {
            extra.insert("sleep_us".into(), 20_000.into());
        }
    }
    let options = CallOptions {
        cancel: CancellationToken::new(),
        iteration: call.iteration,
        ..CallOptions::default()
    };
    let endpoint = if call.iteration {
        &tree.root
    } else {
        &tree.sub
    };
    match call.fate {
        Fate::CancelledBefore => {
            options.cancel.cancel();
            let _ = endpoint.call(request, &options).await;
        }
        Fate::CancelledInFlight => {
            let cancel = options.cancel.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(2)).await;
                cancel.cancel();
            });
            let _ = endpoint.call(request, &options).await;
        }
        Fate::Dropped => {
            let _ =
                tokio::time::timeout(Duration::from_millis(2), endpoint.call(request, &options))
                    .await;
        }
        Fate::Answered { .. } | Fate::ServerError => {
            let _ = endpoint.call(request, &options).await;
        }
    }
}

/// A node: its calls one after another (a loop's iterations and its code's sub-calls) while
/// its children run, all at once.
fn run_node<'a>(tree: &'a Tree, node: &'a Node) -> BoxFuture<'a, ()> {
    async move {
        let own = async {
            for call in &node.calls {
                make_call(tree, call).await;
            }
        };
        let children = join_all(node.children.iter().map(|child| run_node(tree, child)));
        tokio::join!(own, children);
    }
    .boxed()
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime")
    })
}

/// Whether `ledger` is within `budget` now.
fn within(ledger: &Ledger, budget: &Budget) -> Result<(), String> {
    let checks = [
        (
            "calls",
            budget.max_calls.map(|m| m as f64),
            ledger.calls_reserved() as f64,
        ),
        (
            "iterations",
            budget.max_iterations.map(|m| m as f64),
            ledger.iterations_reserved() as f64,
        ),
        (
            "tokens",
            budget.max_tokens.map(|m| m as f64),
            ledger.tokens_used() as f64,
        ),
        // Costs are counted in nano-USD, rounded to the nearest one per call.
        (
            "usd",
            budget
                .max_usd
                .map(|m| m + 1e-9 * ledger.records().len() as f64),
            ledger.usd_used(),
        ),
    ];
    for (what, max, used) in checks {
        if let Some(max) = max
            && used > max
        {
            return Err(format!("{what}: {used} spent of {max}"));
        }
    }
    Ok(())
}

fn check_tree(node: &Node, budget: Budget) -> Result<(), TestCaseError> {
    let ledger = Arc::new(Ledger::new(budget));
    let tree = endpoints(&ledger);
    let overspent = runtime().block_on(async {
        let done = CancellationToken::new();
        let watch = {
            let (ledger, done) = (Arc::clone(&ledger), done.clone());
            tokio::spawn(async move {
                loop {
                    within(&ledger, &budget)?;
                    tokio::select! {
                        () = done.cancelled() => return Ok(()),
                        () = tokio::time::sleep(Duration::from_micros(200)) => {}
                    }
                }
            })
        };
        run_node(&tree, node).await;
        done.cancel();
        watch.await.unwrap_or_else(|e| Err(e.to_string()))
    });
    prop_assert!(overspent.is_ok(), "while running: {overspent:?}");
    prop_assert!(
        within(&ledger, &budget).is_ok(),
        "at the end: {:?}",
        within(&ledger, &budget)
    );
    prop_assert_eq!(ledger.tokens_reserved(), 0, "nothing stays reserved");
    let records = ledger.records();
    prop_assert_eq!(records.len() as u64, ledger.next_call_index());
    let tokens: u64 = records
        .iter()
        .map(|r| r.prompt_tokens + r.completion_tokens)
        .sum();
    prop_assert_eq!(tokens, ledger.tokens_used(), "records add up to the totals");
    let sent = |iteration: bool| {
        records
            .iter()
            .filter(|r| r.attempts > 0 && (r.endpoint == "root") == iteration)
            .count() as u64
    };
    prop_assert_eq!(
        sent(false),
        ledger.calls_reserved(),
        "a sent sub-call holds its slot"
    );
    prop_assert_eq!(
        sent(true),
        ledger.iterations_reserved(),
        "a sent iteration holds its slot"
    );
    Ok(())
}

#[test]
fn a_tree_never_spends_beyond_its_budget() {
    let config = Config {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(128),
        failure_persistence: None,
        ..Config::default()
    };
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &[25; 32]);
    let mut runner = TestRunner::new_with_rng(config, rng);
    runner
        .run(&(tree(), budget()), |(node, budget)| {
            check_tree(&node, budget)
        })
        .unwrap_or_else(|e| panic!("{e}"));
}
