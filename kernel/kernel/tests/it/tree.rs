//! Run trees: `rlm_query` children (each an RLM loop with a REPL of its own) on the parent's
//! endpoints, one budget for the tree, the sub-call cache — against the mock LM server, which
//! plays the root model, the children's root model (`sub`, recognised by the RLM system
//! prompt) and the plain sub-calls.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bridge::mock::{MockConfig, MockServer, RequestRecord, Script};
use bridge::{Budget, EndpointConfig, Endpoints, Ledger, RetryPolicy};
use kernel::repl::{ContextSource, ReplSession, SessionConfig};
use kernel::rlm::{Rlm, RlmConfig, RlmResult, TerminationReason};
use serde_json::{Value, json};

fn rt() -> &'static tokio::runtime::Runtime {
    kernel::runtime::shared()
}

struct Tree {
    server: Option<MockServer>,
    endpoints: Arc<Endpoints>,
    session: Arc<ReplSession>,
}

impl Tree {
    fn new(script: Value, context: &str, budget: Budget, session: SessionConfig) -> Self {
        let script = Script::from_json_value(script).expect("valid script");
        let server = rt()
            .block_on(MockServer::start(MockConfig {
                script,
                record_requests: true,
                ..MockConfig::default()
            }))
            .expect("mock server starts");
        let url = server.openai_base_url();
        let endpoint = |name: &str| EndpointConfig {
            retry: RetryPolicy {
                max_attempts: 1,
                ..RetryPolicy::default()
            },
            timeout: Duration::from_secs(20),
            ..EndpointConfig::openai(name, url.clone(), name)
        };
        let mut root = endpoint("root");
        root.counts_toward_call_budget = false;
        let endpoints = Arc::new(
            Endpoints::new(vec![root, endpoint("sub")], Arc::new(Ledger::new(budget)))
                .expect("endpoints"),
        );
        let session = ReplSession::new(
            session,
            Arc::clone(&endpoints),
            &[ContextSource::Text(context.to_owned())],
        )
        .expect("session starts");
        Self {
            server: Some(server),
            endpoints,
            session: Arc::new(session),
        }
    }

    fn run(&self, max_depth: u32, query: &str) -> RlmResult {
        let config = RlmConfig {
            max_iterations: 6,
            max_depth,
            ..RlmConfig::default()
        };
        Rlm::new(
            config,
            Arc::clone(&self.endpoints),
            Arc::clone(&self.session),
        )
        .run(query)
        .expect("the run starts")
    }

    fn log(&self) -> Vec<RequestRecord> {
        let mut entries = self.server.as_ref().expect("server").log().entries();
        entries.sort_by_key(|r| r.id);
        entries
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            rt().block_on(server.shutdown());
        }
    }
}

/// The RLM system prompt, as a regex the mock matches children's requests by.
const RLM_SYSTEM: &str = "recursive language model";

/// A root model replying `root[turn]`; `sub` plays a child RLM that counts ERROR in its
/// context in two iterations (code, then `FINAL_VAR`), and answers plain sub-calls by
/// counting the word they name.
fn script(root: &[&str]) -> Value {
    json!({"models": {
        "root": {"replies": root},
        "sub": {"rules": [
            {"system": RLM_SYSTEM, "turn": 0,
             "reply": "Counting.\n```repl\nn = str(context).count('ERROR')\nprint(n)\n```"},
            {"system": RLM_SYSTEM, "turn": 1, "reply": "FINAL_VAR(n)"},
            {"last_user": "(?s)^Count (?P<word>\\w+) in:\\n(?P<body>.*)$",
             "reply": {"behaviour": "count_word", "word": "{{word}}", "input": "{{body}}"}}
        ], "fallback": {"behaviour": "echo"}}
    }})
}

fn system_prompt(record: &RequestRecord) -> String {
    let body: Value =
        serde_json::from_str(record.body.as_deref().expect("recorded body")).expect("a JSON body");
    body["messages"][0]["content"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

const PARTS: &str = "ERROR a ERROR|ok|ERROR ERROR ERROR";

const FAN_OUT_CHILDREN: &str = "Each part needs its own look.\n```repl\nparts = context.split('|')\nanswers = rlm_query_batched(['How many ERROR?'] * len(parts), parts)\nprint(answers)\ntotal = sum(int(a) for a in answers)\n```";

#[test]
fn children_each_run_their_own_loop_over_the_context_they_were_handed() {
    let tree = Tree::new(
        script(&[FAN_OUT_CHILDREN, "FINAL_VAR(total)"]),
        PARTS,
        Budget::default(),
        SessionConfig::default(),
    );
    let result = tree.run(2, "How many ERROR in all?");
    assert_eq!(
        result.termination_reason,
        TerminationReason::FinalAnswer,
        "{:?}",
        result.error
    );
    assert_eq!(result.answer.as_deref(), Some("5"));
    let block = &result.iterations[0].blocks[0];
    let children = &block.children;
    assert_eq!(children.len(), 3, "{block:?}");
    let answers: Vec<_> = children.iter().map(|c| c.answer.clone()).collect();
    assert_eq!(
        answers,
        [Some("2".into()), Some("0".into()), Some("3".into())],
        "each child counted its own part, in input order"
    );
    for (i, child) in children.iter().enumerate() {
        assert_eq!(child.index, i);
        assert_eq!(child.depth, 1);
        assert_eq!(child.model, "sub");
        assert_eq!(child.termination_reason, TerminationReason::FinalAnswer);
        assert_eq!(child.iterations.len(), 2, "two iterations each");
        assert_eq!(child.metrics.root_calls, 2);
        assert_eq!(child.contexts.len(), 1);
    }
    assert_eq!(result.metrics.child_runs, 3);
    assert_eq!(
        result.metrics.models["sub"].calls, 6,
        "the tree's totals include the children's calls"
    );

    // The root's system prompt offers rlm_query; at depth 1 of 2 the children's do not.
    let log = tree.log();
    let root_system = system_prompt(log.iter().find(|r| r.model == "root").expect("root"));
    assert!(root_system.contains("rlm_query("), "{root_system}");
    let child_requests: Vec<_> = log.iter().filter(|r| r.model == "sub").collect();
    assert_eq!(child_requests.len(), 6);
    for request in child_requests {
        let system = system_prompt(request);
        assert!(system.contains(RLM_SYSTEM));
        assert!(!system.contains("rlm_query("), "{system}");
    }
}

#[test]
fn at_the_depth_limit_rlm_query_is_llm_query_and_says_so_once() {
    let tree = Tree::new(
        script(&[
            "```repl\na = rlm_query('Count ERROR in:', 'ERROR ERROR')\nb = rlm_query_batched(['Count ok in:'], ['ok ok ok'])\nprint(a, b)\n```",
            "FINAL(done)",
        ]),
        "",
        Budget::default(),
        SessionConfig::default(),
    );
    let result = tree.run(1, "q");
    assert_eq!(result.termination_reason, TerminationReason::FinalAnswer);
    let block = &result.iterations[0].blocks[0];
    assert_eq!(
        block.stdout, "2 ['3']\n",
        "the prompt then str(context) went to the sub-model"
    );
    assert_eq!(
        block.stderr.matches("runs as llm_query()").count(),
        1,
        "said once: {}",
        block.stderr
    );
    assert!(block.children.is_empty());
    assert_eq!(result.metrics.sub_calls, 2);
    let root_system = system_prompt(&tree.log()[0]);
    assert!(
        !root_system.contains("rlm_query("),
        "the prompt does not offer what the depth does not allow"
    );
}

#[test]
fn the_budget_holds_for_the_whole_tree_and_the_stop_names_the_child() {
    // Each child needs two calls of `sub`; five sub-calls in all leave the third child short.
    let tree = Tree::new(
        script(&[FAN_OUT_CHILDREN, "FINAL_VAR(total)"]),
        PARTS,
        Budget {
            max_calls: Some(5),
            ..Budget::default()
        },
        SessionConfig {
            batch_concurrency: Some(1),
            ..SessionConfig::default()
        },
    );
    let result = tree.run(2, "q");
    assert_eq!(result.termination_reason, TerminationReason::CallBudget);
    let error = result.error.clone().unwrap_or_default();
    assert!(
        error.contains("rlm_query child #2") && error.contains("iteration 1, block 0"),
        "{error}"
    );
    let children = &result.iterations[0].blocks[0].children;
    assert_eq!(children.len(), 3);
    assert_eq!(
        children[2].termination_reason,
        TerminationReason::CallBudget
    );
    let log = tree.log();
    let sent = log.iter().filter(|r| r.model == "sub").count();
    assert_eq!(
        sent, 5,
        "the tree spent its five sub-calls and not one more"
    );
    let refused = tree
        .endpoints
        .ledger()
        .records()
        .into_iter()
        .filter(|c| c.error_kind == Some(bridge::FailureKind::Budget(bridge::BudgetLimit::Calls)))
        .count();
    assert_eq!(refused, 1, "the third child's second iteration was refused");
    assert_eq!(
        log.iter().filter(|r| r.model == "root").count(),
        1,
        "the root stopped after the block"
    );
}

#[test]
fn fifty_children_run_at_once_and_each_answers() {
    let parts: Vec<String> = (0..50).map(|i| "ERROR ".repeat(i % 4)).collect();
    let expected: usize = (0..50).map(|i| i % 4).sum();
    let tree = Tree::new(
        script(&[FAN_OUT_CHILDREN, "FINAL_VAR(total)"]),
        &parts.join("|"),
        Budget::default(),
        SessionConfig::default(),
    );
    let started = Instant::now();
    let result = tree.run(2, "q");
    assert_eq!(
        result.termination_reason,
        TerminationReason::FinalAnswer,
        "{:?}",
        result.error
    );
    assert_eq!(result.answer, Some(expected.to_string()));
    assert_eq!(result.metrics.child_runs, 50);
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "bounded: {:?}",
        started.elapsed()
    );
}

#[test]
fn identical_sub_calls_are_sent_once_across_the_tree() {
    let tree = Tree::new(
        script(&[
            "```repl\nq = 'Count ERROR in:\\nERROR ERROR'\nfirst = [llm_query(q) for _ in range(3)]\nsame = llm_query_batched([q] * 4)\nprint(first, same)\n```",
            "FINAL(done)",
        ]),
        "",
        Budget::default(),
        SessionConfig::default(),
    );
    let result = tree.run(1, "q");
    assert_eq!(result.termination_reason, TerminationReason::FinalAnswer);
    assert_eq!(
        result.iterations[0].blocks[0].stdout,
        "['2', '2', '2'] ['2', '2', '2', '2']\n"
    );
    let sent = tree.log().iter().filter(|r| r.model == "sub").count();
    assert_eq!(sent, 1, "seven identical calls, one request");
    assert_eq!(result.metrics.sub_calls, 7);
    assert_eq!(result.metrics.sub_call_cache_hits, 6);
    assert_eq!(result.metrics.models["sub"].cache_hits, 6);
    let cached: Vec<_> = result
        .sub_calls
        .iter()
        .filter(|c| c.cache.is_some())
        .collect();
    assert_eq!(cached.len(), 6);
    assert!(
        cached
            .iter()
            .all(|c| c.prompt_tokens == 0 && c.attempts == 0)
    );
}

#[test]
fn a_sub_call_too_long_for_the_window_the_server_lists_is_refused_before_sending() {
    let mut script = script(&[
        "```repl\nparts = llm_query_batched(['Count a in:\\n' + 'a ' * 20000, 'Count a in:\\na a'])\nprint(parts[1])\nprint(parts[0])\n```",
        "FINAL(done)",
    ]);
    script["models"]["sub"]["context_window"] = json!(4096);
    let tree = Tree::new(script, "", Budget::default(), SessionConfig::default());
    let result = tree.run(1, "q");
    assert_eq!(result.termination_reason, TerminationReason::FinalAnswer);
    let stdout = &result.iterations[0].blocks[0].stdout;
    assert!(
        stdout.starts_with(
            "2\nError: Prompt of ~10k tokens does not fit `sub`'s 4k window (as the server lists it); split it"
        ),
        "the short call is answered, the long one refused per item: {stdout}"
    );
    let log = tree.log();
    let chats: Vec<_> = log.iter().filter(|r| r.model == "sub").collect();
    assert_eq!(chats.len(), 1, "only the short call was sent");
    assert_eq!(
        log.iter().filter(|r| r.path.ends_with("/models")).count(),
        1,
        "the listing is asked once, for the long call only"
    );
    let refused: Vec<_> = result
        .sub_calls
        .iter()
        .filter(|c| c.error_kind == Some(bridge::FailureKind::ContextWindow))
        .collect();
    assert_eq!(refused.len(), 1);
    assert_eq!(refused[0].attempts, 0);
}
