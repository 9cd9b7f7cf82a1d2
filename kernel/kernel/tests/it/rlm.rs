//! The RLM loop end to end: a real REPL session, the bridge over HTTP, and the mock LM server
//! playing both the root model and the sub-models from scripts.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bridge::mock::{MockConfig, MockServer, RequestRecord, Script};
use bridge::{Budget, EndpointConfig, Endpoints, Ledger, Price, RetryPolicy};
use kernel::repl::{ContextSource, ReplSession, SessionConfig};
use kernel::rlm::{
    BlockRun, CodeAndFinal, FinalKind, Hook, HookAction, ModelCall, Phase, Progress,
    ProgressSnapshot, Protocol, Rlm, RlmChat, RlmConfig, RlmResult, TerminationReason,
    TrajectoryWriter,
};
use serde_json::{Value, json};

/// A mock server, endpoints `root` and `sub` on it, and a session over the given context.
struct Harness {
    server: Option<MockServer>,
    endpoints: Arc<Endpoints>,
    session: Arc<ReplSession>,
}

struct Setup {
    script: Value,
    context: String,
    budget: Budget,
    sub_price: Option<Price>,
    cell_timeout: Duration,
    root_url: Option<String>,
}

impl Default for Setup {
    fn default() -> Self {
        Self {
            script: json!({"models": {}}),
            context: "no context".into(),
            budget: Budget::default(),
            sub_price: None,
            cell_timeout: Duration::from_secs(20),
            root_url: None,
        }
    }
}

fn rt() -> &'static tokio::runtime::Runtime {
    kernel::runtime::shared()
}

fn quick_retry() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 2,
        base_delay: Duration::from_millis(5),
        max_delay: Duration::from_millis(20),
        ..RetryPolicy::default()
    }
}

impl Harness {
    fn new(setup: Setup) -> Self {
        let script = Script::from_json_value(setup.script).expect("valid script");
        let server = rt()
            .block_on(MockServer::start(MockConfig {
                script,
                ..MockConfig::default()
            }))
            .expect("mock server starts");
        let url = server.openai_base_url();
        let root = EndpointConfig {
            retry: quick_retry(),
            timeout: Duration::from_secs(10),
            ..EndpointConfig::openai(
                "root",
                setup.root_url.unwrap_or_else(|| url.clone()),
                "root",
            )
        };
        let sub = EndpointConfig {
            retry: quick_retry(),
            timeout: Duration::from_secs(10),
            price: setup.sub_price,
            ..EndpointConfig::openai("sub", url, "sub")
        };
        let ledger = Arc::new(Ledger::new(setup.budget));
        let endpoints = Arc::new(Endpoints::new(vec![root, sub], ledger).expect("endpoints"));
        let session = ReplSession::new(
            SessionConfig {
                cell_timeout: setup.cell_timeout,
                ..SessionConfig::default()
            },
            Arc::clone(&endpoints),
            &[ContextSource::Text(setup.context)],
        )
        .expect("session starts");
        Self {
            server: Some(server),
            endpoints,
            session: Arc::new(session),
        }
    }

    fn rlm(&self, config: RlmConfig) -> Rlm {
        Rlm::new(
            config,
            Arc::clone(&self.endpoints),
            Arc::clone(&self.session),
        )
    }

    fn run(&self, config: RlmConfig, query: &str) -> RlmResult {
        self.rlm(config).run(query).expect("the run starts")
    }

    /// Runs and also returns the full last user message of every root request as sent (the
    /// mock's log keeps only the first 200 characters).
    fn run_capturing(&self, config: RlmConfig, query: &str) -> (RlmResult, Vec<String>) {
        let sent = Sent::default();
        let mut rlm = self.rlm(config);
        rlm.add_hook(sent.clone());
        let result = rlm.run(query).expect("the run starts");
        let seen = sent.0.lock().expect("sent").clone();
        let logged = self.root_requests();
        assert_eq!(
            logged.len(),
            seen.len(),
            "every root request reached the server"
        );
        for (log, full) in logged.iter().zip(&seen) {
            assert!(
                full.starts_with(&log.last_user),
                "the server got what the loop sent"
            );
        }
        (result, seen)
    }

    /// The requests the root model received, in order.
    fn root_requests(&self) -> Vec<RequestRecord> {
        self.log()
            .into_iter()
            .filter(|r| r.model == "root")
            .collect()
    }

    fn sub_requests(&self) -> Vec<RequestRecord> {
        self.log()
            .into_iter()
            .filter(|r| r.model == "sub")
            .collect()
    }

    fn log(&self) -> Vec<RequestRecord> {
        let mut entries = self.server.as_ref().expect("server").log().entries();
        entries.sort_by_key(|r| r.id);
        entries
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            rt().block_on(server.shutdown());
        }
    }
}

/// Captures the last user message of every root-model request.
#[derive(Clone, Default)]
struct Sent(Arc<Mutex<Vec<String>>>);

impl Hook for Sent {
    fn before_model_call(
        &mut self,
        _iteration: u32,
        request: &mut bridge::ChatRequest,
    ) -> HookAction<String> {
        let last = request
            .messages
            .last()
            .map(|m| m.content.clone())
            .unwrap_or_default();
        self.0.lock().expect("sent").push(last);
        HookAction::Continue
    }
}

/// A root model replying `replies[turn]`, and a counting sub-model.
fn script(replies: &[&str]) -> Value {
    json!({"models": {
        "root": {"replies": replies},
        "sub": {"rules": [{
            "last_user": "(?s)^Count (?P<word>\\w+) in:\\n(?P<body>.*)$",
            "reply": {"behaviour": "count_word", "word": "{{word}}", "input": "{{body}}"}
        }], "fallback": {"behaviour": "echo"}}
    }})
}

fn config() -> RlmConfig {
    RlmConfig {
        max_iterations: 8,
        ..RlmConfig::default()
    }
}

fn accept_mixed() -> RlmConfig {
    let mut config = config();
    config.completion.code_and_final = CodeAndFinal::Accept;
    config
}

/// Synthetic logs: `errors[i]` ERROR lines for service i, among OK lines.
fn logs(errors: &[usize]) -> (String, usize) {
    let mut text = String::new();
    for (service, &count) in errors.iter().enumerate() {
        for i in 0..count * 3 {
            let level = if i % 3 == 0 { "ERROR" } else { "OK" };
            text.push_str(&format!(
                "2026-01-01T00:00:{i:02} svc-{service} {level} request {i}\n"
            ));
        }
    }
    (text, errors.iter().sum())
}

#[test]
fn multi_iteration_run_with_batched_fan_out() {
    let (context, total) = logs(&[4, 7, 1, 9, 3]);
    let harness = Harness::new(Setup {
        script: script(&[
            "First, the shape of the context.\n```repl\nlines = context.splitlines()\nprint(type(context).__name__, len(lines))\n```",
            "Now count per chunk with sub-models.\n```repl\nchunks = ['\\n'.join(lines[i:i + 10]) for i in range(0, len(lines), 10)]\nparts = llm_query_batched([f'Count ERROR in:\\n{c}' for c in chunks])\ntotal = sum(int(p) for p in parts)\nprint(len(chunks), total)\n```",
            "The counts add up.\nFINAL_VAR(total)",
        ]),
        context,
        ..Setup::default()
    });
    let (result, seen) = harness.run_capturing(config(), "How many ERROR lines are there?");

    assert_eq!(result.termination_reason, TerminationReason::FinalAnswer);
    assert_eq!(result.answer.as_deref(), Some(total.to_string().as_str()));
    assert_eq!(result.answer_kind, Some(FinalKind::FinalVarLine));
    assert_eq!(result.iterations.len(), 3);

    let lines = 3 * total;
    let chunks = lines.div_ceil(10);
    assert_eq!(seen.len(), 3);
    assert!(seen[0].contains("How many ERROR lines are there?"));
    assert!(seen[0].contains("a Python `str`"), "{}", seen[0]);
    assert!(seen[1].contains(&format!("str {lines}")), "{}", seen[1]);
    assert!(
        seen[2].contains(&format!("{chunks} {total}")),
        "{}",
        seen[2]
    );
    assert_eq!(harness.sub_requests().len(), chunks);

    let m = &result.metrics;
    assert_eq!(m.iterations, 3);
    assert_eq!(m.code_blocks, 2);
    assert_eq!(m.llm_query_batched_calls, 1);
    assert_eq!(m.sub_calls, chunks as u64);
    assert_eq!(m.root_calls, 3);
    assert_eq!(m.models["root"].calls, 3);
    assert_eq!(m.models["sub"].calls, chunks as u64);
    assert!(m.final_answer_found);
    assert_eq!(m.termination_reason, Some(TerminationReason::FinalAnswer));
    assert_eq!(result.sub_calls.len(), chunks);
    assert!(
        result
            .sub_calls
            .iter()
            .all(|c| c.batched && c.batch_size == chunks)
    );
    let second = &result.iterations[1];
    assert_eq!(second.metadata.llm_query_batched_calls, 1);
    assert_eq!(second.execution.sub_calls, chunks);
    assert_eq!(
        second.execution.variables_created,
        ["chunks", "parts", "total"]
    );
}

/// Runs `replies` and returns the result and the `last_user` of every root request.
fn converse(config: RlmConfig, replies: &[&str]) -> (RlmResult, Vec<String>) {
    let harness = Harness::new(Setup {
        script: script(replies),
        ..Setup::default()
    });
    harness.run_capturing(config, "q")
}

#[test]
fn each_final_answer_convention() {
    struct Case {
        name: &'static str,
        config: RlmConfig,
        replies: &'static [&'static str],
        answer: &'static str,
        kind: FinalKind,
        iterations: usize,
    }
    let answer_only = {
        let mut c = config();
        c.completion.protocol = Protocol::Answer;
        c
    };
    let see_output_first = {
        let mut c = config();
        c.completion.code_and_final = CodeAndFinal::SeeOutputFirst;
        c
    };
    let cases = [
        Case {
            name: "answer dict, content as it was when ready became true",
            config: config(),
            replies: &[
                "```repl\nanswer['content'] = 'forty-two'\nanswer['ready'] = True\nanswer['content'] = 'changed later'\n```",
            ],
            answer: "forty-two",
            kind: FinalKind::AnswerDict,
            iterations: 1,
        },
        Case {
            name: "answer dict, ready set before the content",
            config: config(),
            replies: &["```repl\nanswer['ready'] = True\nanswer['content'] = 'forty-two'\n```"],
            answer: "forty-two",
            kind: FinalKind::AnswerDict,
            iterations: 1,
        },
        Case {
            name: "in-code FINAL_VAR with a value",
            config: config(),
            replies: &["```repl\nresult = 6 * 7\nFINAL_VAR(result)\n```"],
            answer: "42",
            kind: FinalKind::FinalVar,
            iterations: 1,
        },
        Case {
            name: "FINAL_VAR line after the variable was set",
            config: config(),
            replies: &[
                "```repl\nresult = 'a\\nmulti-line\\nanswer'\n```",
                "FINAL_VAR(\"result\")",
            ],
            answer: "a\nmulti-line\nanswer",
            kind: FinalKind::FinalVarLine,
            iterations: 2,
        },
        Case {
            name: "FINAL line with nested parentheses and quotes kept",
            config: config(),
            replies: &["Done.\nFINAL(func(a, \"b\"))"],
            answer: "func(a, \"b\")",
            kind: FinalKind::FinalLine,
            iterations: 1,
        },
        Case {
            name: "FINAL spanning lines",
            config: config(),
            replies: &["FINAL(first line\nsecond line)"],
            answer: "first line\nsecond line",
            kind: FinalKind::FinalLine,
            iterations: 1,
        },
        Case {
            name: "FINAL not at line start does not count; a later one does",
            config: config(),
            replies: &["The answer is FINAL(41)", "FINAL(42)"],
            answer: "42",
            kind: FinalKind::FinalLine,
            iterations: 2,
        },
        Case {
            name: "FINAL inside a repl block is code, not an answer",
            config: config(),
            replies: &["```repl\nFINAL = print\nFINAL(41)\n```", "FINAL(42)"],
            answer: "42",
            kind: FinalKind::FinalLine,
            iterations: 2,
        },
        Case {
            name: "missing variable, then a later FINAL",
            config: config(),
            replies: &["FINAL_VAR(nowhere)", "FINAL(42)"],
            answer: "42",
            kind: FinalKind::FinalLine,
            iterations: 2,
        },
        Case {
            name: "code and FINAL accepted when configured",
            config: accept_mixed(),
            replies: &["```repl\nx = 42\n```\nFINAL_VAR(x)"],
            answer: "42",
            kind: FinalKind::FinalVarLine,
            iterations: 1,
        },
        Case {
            name: "code and FINAL: by default accepted after the code ran",
            config: config(),
            replies: &["```repl\nx = 41\n```\nFINAL(41)", "FINAL(42)"],
            answer: "41",
            kind: FinalKind::FinalLine,
            iterations: 1,
        },
        Case {
            name: "code and FINAL_VAR of what the code just assigned: by default accepted",
            config: config(),
            replies: &["```repl\nx = 6 * 7\n```\nFINAL_VAR(x)"],
            answer: "42",
            kind: FinalKind::FinalVarLine,
            iterations: 1,
        },
        Case {
            name: "code that raised: by default the FINAL line is held back",
            config: config(),
            replies: &["```repl\nx = 41\n1 / 0\n```\nFINAL(41)", "FINAL(42)"],
            answer: "42",
            kind: FinalKind::FinalLine,
            iterations: 2,
        },
        Case {
            name: "code and FINAL: see the output first when configured",
            config: see_output_first,
            replies: &["```repl\nx = 41\n```\nFINAL(41)", "FINAL(42)"],
            answer: "42",
            kind: FinalKind::FinalLine,
            iterations: 2,
        },
        Case {
            name: "a FINAL line with text after its parenthesis is prose",
            config: config(),
            replies: &["FINAL(41) is my first guess", "FINAL(42)"],
            answer: "42",
            kind: FinalKind::FinalLine,
            iterations: 2,
        },
        Case {
            name: "in-code FINAL_VAR of a missing variable is not an answer",
            config: config(),
            replies: &["```repl\nFINAL_VAR('nowhere')\n```", "FINAL(42)"],
            answer: "42",
            kind: FinalKind::FinalLine,
            iterations: 2,
        },
        Case {
            name: "a rebound answer dict is the answer",
            config: config(),
            replies: &[
                "```repl\nanswer = {'content': 'later', 'ready': False}\n```",
                "```repl\nanswer['ready'] = True\n```",
            ],
            answer: "later",
            kind: FinalKind::AnswerDict,
            iterations: 2,
        },
        Case {
            name: "protocol answer ignores FINAL lines",
            config: answer_only,
            replies: &[
                "FINAL(41)",
                "```repl\nanswer.update(content=42, ready=True)\n```",
            ],
            answer: "42",
            kind: FinalKind::AnswerDict,
            iterations: 2,
        },
    ];
    for case in cases {
        let (result, _) = converse(case.config, case.replies);
        assert_eq!(
            result.termination_reason,
            TerminationReason::FinalAnswer,
            "{}",
            case.name
        );
        assert_eq!(result.answer.as_deref(), Some(case.answer), "{}", case.name);
        assert_eq!(result.answer_kind, Some(case.kind), "{}", case.name);
        assert_eq!(result.iterations.len(), case.iterations, "{}", case.name);
    }
}

#[test]
fn rejected_final_attempts_are_explained_in_the_next_message() {
    let (result, seen) = converse(
        config(),
        &[
            "FINAL_VAR(nowhere)",
            "FINAL()",
            "```repl\nx = 1 / 0\n```\nFINAL(1)",
            "FINAL(2)",
        ],
    );
    assert_eq!(result.answer.as_deref(), Some("2"));
    assert!(
        seen[1].contains("`FINAL_VAR(nowhere)` names a variable that does not exist"),
        "{}",
        seen[1]
    );
    assert!(
        seen[2].contains("is empty, so the run is not finished"),
        "{}",
        seen[2]
    );
    assert!(
        seen[3].contains("a block of that reply failed (see above), so the answer was held back"),
        "{}",
        seen[3]
    );
    assert_eq!(result.iterations[0].notes.len(), 1);
}

#[test]
fn an_exception_is_fed_back_and_earlier_variables_survive() {
    let (result, seen) = converse(
        config(),
        &[
            "```repl\nkept = 'still here'\nboom = 1 / 0\n```",
            "```repl\nprint(kept)\n```",
            "FINAL_VAR(kept)",
        ],
    );
    assert_eq!(result.answer.as_deref(), Some("still here"));
    assert!(seen[1].contains("raised ZeroDivisionError"), "{}", seen[1]);
    assert!(seen[1].contains("Traceback"), "{}", seen[1]);
    assert!(seen[1].contains("division by zero"), "{}", seen[1]);
    assert!(seen[2].contains("still here"), "{}", seen[2]);
    assert_eq!(
        result.iterations[0].execution.error_type.as_deref(),
        Some("ZeroDivisionError")
    );
    assert_eq!(result.metrics.block_errors, 1);
}

#[test]
fn a_cell_timeout_is_reported_and_the_session_recovers() {
    let harness = Harness::new(Setup {
        script: script(&[
            "```repl\nimport time\nbefore = 'set'\ntime.sleep(60)\n```",
            "```repl\nprint('alive', before)\n```",
            "FINAL(recovered)",
        ]),
        cell_timeout: Duration::from_millis(500),
        ..Setup::default()
    });
    let (result, seen) = harness.run_capturing(config(), "q");
    assert_eq!(result.answer.as_deref(), Some("recovered"));
    assert!(seen[1].contains("interrupted"), "{}", seen[1]);
    assert!(seen[2].contains("alive set"), "{}", seen[2]);
    assert!(result.iterations[0].blocks[0].timed_out);
    assert_eq!(result.metrics.block_timeouts, 1);
}

#[test]
fn oversized_output_is_cut_in_the_next_request() {
    let mut config = config();
    config.feedback.block_limit = 2_000;
    let harness = Harness::new(Setup {
        script: script(&[
            "```repl\nprint('HEAD' + 'x' * 500_000 + 'TAIL')\n```",
            "FINAL(done)",
        ]),
        ..Setup::default()
    });
    let (result, seen) = harness.run_capturing(config, "q");
    assert_eq!(result.answer.as_deref(), Some("done"));
    assert!(seen[1].contains("HEAD"), "head kept");
    assert!(seen[1].contains("TAIL"), "tail kept");
    assert!(seen[1].contains("characters omitted"), "{}", seen[1]);
    assert!(seen[1].len() < 4_000, "{} bytes", seen[1].len());
    // What went over the wire: the whole second request, system prompt and history included.
    let second = &harness.root_requests()[1];
    assert!(second.last_user.contains("HEAD"), "{}", second.last_user);
    assert!(
        second.request_bytes < 30_000,
        "{} bytes",
        second.request_bytes
    );
    assert!(result.iterations[0].blocks[0].stdout.len() < 2_200);
}

#[test]
fn max_iterations_then_one_answer_now_call() {
    let mut config = config();
    config.max_iterations = 2;
    let (result, seen) = converse(
        config,
        &[
            "```repl\nx = 1\n```",
            "```repl\nx += 1\n```",
            "My best estimate is 2.",
        ],
    );
    assert_eq!(result.termination_reason, TerminationReason::MaxIterations);
    assert_eq!(result.answer.as_deref(), Some("My best estimate is 2."));
    assert_eq!(result.answer_kind, Some(FinalKind::AnswerNow));
    assert_eq!(seen.len(), 3);
    assert!(
        seen[2].contains("That was the last reply allowed"),
        "{}",
        seen[2]
    );
    assert_eq!(result.metrics.iterations, 2);
    assert_eq!(result.metrics.root_calls, 3);
    assert!(
        result
            .error
            .as_deref()
            .is_some_and(|e| e.contains("limit of 2 iterations"))
    );
}

#[test]
fn the_answer_now_reply_may_use_final() {
    let mut config = config();
    config.max_iterations = 1;
    let (result, _) = converse(config, &["```repl\nx = 7\n```", "FINAL_VAR(x)"]);
    assert_eq!(result.termination_reason, TerminationReason::MaxIterations);
    assert_eq!(result.answer.as_deref(), Some("7"));
}

const FAN_OUT: &str = "```repl\nparts = llm_query_batched([f'Count a in:\\n{\"a\" * i}' for i in range(6)])\nprint(parts)\n```";

#[test]
fn call_budget_stops_the_run() {
    let harness = Harness::new(Setup {
        script: script(&[FAN_OUT, "FINAL(never)"]),
        budget: Budget {
            max_calls: Some(4),
            ..Budget::default()
        },
        ..Setup::default()
    });
    let result = harness.run(config(), "q");
    assert_eq!(result.termination_reason, TerminationReason::CallBudget);
    assert!(
        result
            .error
            .as_deref()
            .is_some_and(|e| e.contains("Budget exhausted")),
        "{:?}",
        result.error
    );
    assert_eq!(
        harness.root_requests().len(),
        1,
        "no root call after the stop"
    );
    assert_eq!(
        harness.sub_requests().len(),
        3,
        "one call went to the root model"
    );
    assert_eq!(
        result.iterations.len(),
        1,
        "the iteration that hit the budget is recorded"
    );
}

#[test]
fn token_budget_stops_the_run() {
    let harness = Harness::new(Setup {
        script: script(&[
            "```repl\nprint(1)\n```",
            "```repl\nprint(2)\n```",
            "FINAL(never)",
        ]),
        budget: Budget {
            max_tokens: Some(100),
            ..Budget::default()
        },
        ..Setup::default()
    });
    let result = harness.run(config(), "q");
    assert_eq!(result.termination_reason, TerminationReason::TokenBudget);
    assert_eq!(
        harness.root_requests().len(),
        0,
        "the system prompt alone is over 100 tokens: the first call is refused before sending"
    );
    assert_eq!(result.metrics.prompt_tokens, 0, "nothing was spent");
}

#[test]
fn cost_budget_stops_the_run() {
    let harness = Harness::new(Setup {
        script: script(&[FAN_OUT, FAN_OUT, "FINAL(never)"]),
        sub_price: Some(Price {
            input_per_mtok: 1_000_000.0,
            output_per_mtok: 1_000_000.0,
        }),
        budget: Budget {
            max_usd: Some(1.0),
            ..Budget::default()
        },
        ..Setup::default()
    });
    let result = harness.run(config(), "q");
    assert_eq!(result.termination_reason, TerminationReason::CostBudget);
    // At $1 a token, every sub-call's estimate is over the $1 limit: refused, never sent.
    let cost = result.metrics.cost_usd.expect("a priced run has a cost");
    assert!(cost <= 1.0, "{cost}");
    assert!(harness.sub_requests().is_empty());
    assert!(
        result
            .sub_calls
            .iter()
            .all(|c| c.error_kind == Some(bridge::FailureKind::Budget(bridge::BudgetLimit::Usd))),
        "{:?}",
        result.sub_calls
    );
}

#[test]
fn a_candidate_answer_survives_a_stop() {
    let harness = Harness::new(Setup {
        script: script(&[
            "```repl\nx = 42\nraise ValueError('not yet')\n```\nFINAL(42)",
            FAN_OUT,
            "FINAL(never)",
        ]),
        budget: Budget {
            max_calls: Some(3),
            ..Budget::default()
        },
        ..Setup::default()
    });
    let result = harness.run(config(), "q");
    assert_eq!(result.termination_reason, TerminationReason::CallBudget);
    assert_eq!(
        result.answer.as_deref(),
        Some("42"),
        "the held-back FINAL is the best partial answer"
    );
    assert_eq!(result.answer_kind, Some(FinalKind::FinalLine));
}

#[test]
fn consecutive_failures_stop_the_run() {
    let mut config = config();
    config.max_consecutive_failures = Some(2);
    let (result, seen) = converse(config, &["```repl\nraise ValueError('bad')\n```"]);
    assert_eq!(
        result.termination_reason,
        TerminationReason::ConsecutiveFailures
    );
    assert_eq!(seen.len(), 2);
    assert!(
        result
            .error
            .as_deref()
            .is_some_and(|e| e.contains("ValueError")),
        "{:?}",
        result.error
    );
}

#[test]
fn an_unreachable_root_model_ends_the_run_with_a_clear_error_and_a_trajectory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("t.jsonl");
    let harness = Harness::new(Setup {
        root_url: Some("http://127.0.0.1:9/v1".into()),
        ..Setup::default()
    });
    let mut rlm = harness.rlm(config());
    rlm.add_hook(TrajectoryWriter::create(&path).expect("create"));
    let result = rlm.run("q").expect("the run starts");
    assert_eq!(result.termination_reason, TerminationReason::RootModelError);
    assert!(
        result
            .error
            .as_deref()
            .is_some_and(|e| e.contains("Could not connect")),
        "{:?}",
        result.error
    );
    let lines = read_jsonl(&path);
    let kinds: Vec<&str> = lines
        .iter()
        .map(|l| l["type"].as_str().expect("type"))
        .collect();
    assert_eq!(kinds, ["header", "error", "result"]);
    assert_eq!(lines[2]["termination_reason"], "root_model_error");
}

#[test]
fn the_run_timeout_cancels_a_slow_root_call() {
    let mut script = script(&["FINAL(too late)"]);
    script["models"]["root"]["latency"] = json!({"kind": "fixed", "ms": 60_000});
    let harness = Harness::new(Setup {
        script,
        ..Setup::default()
    });
    let mut config = config();
    config.run_timeout = Some(Duration::from_millis(300));
    let started = std::time::Instant::now();
    let result = harness.run(config, "q");
    assert_eq!(result.termination_reason, TerminationReason::Timeout);
    // Well under the call's 60 s: cancelled, not waited out (not a speed check).
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    // Cancelled, not dropped: the bridge still records the call.
    let records = harness.endpoints.ledger().records();
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0].error_kind, Some(bridge::FailureKind::Cancelled));
}

#[test]
fn the_run_timeout_interrupts_a_running_block() {
    let harness = Harness::new(Setup {
        script: script(&[
            "```repl\nimport time\ntime.sleep(60)\n```",
            "FINAL(too late)",
        ]),
        cell_timeout: Duration::from_secs(30),
        ..Setup::default()
    });
    let mut config = config();
    config.run_timeout = Some(Duration::from_millis(800));
    let started = std::time::Instant::now();
    let result = harness.run(config, "q");
    assert_eq!(result.termination_reason, TerminationReason::Timeout);
    // Well under the block's 60 s (and its 30 s cell limit): the run's deadline stopped it.
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        result.iterations.len(),
        1,
        "the interrupted iteration is recorded"
    );
    assert_eq!(harness.root_requests().len(), 1);
    // Only the block was interrupted: the session keeps its state and can still call models.
    let after = harness
        .session
        .exec(
            "import time
print(llm_query('still here'))",
        )
        .expect("the session answers");
    assert!(after.error.is_none(), "{:?}", after.error);
    assert_eq!(after.stdout, "still here\n");
}

fn read_jsonl(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .expect("trajectory readable")
        .lines()
        .map(|l| serde_json::from_str(l).expect("every line is JSON"))
        .collect()
}

/// Runs the fan-out conversation over a context of `lines` log lines, with a trajectory.
fn trajectory_for(lines: usize) -> (u64, Vec<Value>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("t.jsonl");
    let mut context = String::new();
    for i in 0..lines {
        context.push_str(&format!("line {i:09} ERROR something happened\n"));
    }
    let harness = Harness::new(Setup {
        script: script(&[
            "```repl\nprint(len(context))\nprint(context)\n```",
            "```repl\nparts = llm_query_batched([f'Count ERROR in:\\n{context[:1000]}' for _ in range(3)])\nprint(parts)\n```",
            "FINAL(done)",
        ]),
        context,
        ..Setup::default()
    });
    let mut rlm = harness.rlm(config());
    rlm.add_hook(TrajectoryWriter::create(&path).expect("create"));
    let result = rlm.run("q").expect("the run starts");
    assert_eq!(result.answer.as_deref(), Some("done"));
    let size = std::fs::metadata(&path).expect("file").len();
    (size, read_jsonl(&path))
}

#[test]
fn trajectory_lines_are_json_and_do_not_grow_with_the_context() {
    // Both contexts are larger than what a block's output may show (20 000 characters).
    let (small, lines) = trajectory_for(1_000);
    let (large, _) = trajectory_for(200_000);
    let kinds: Vec<&str> = lines
        .iter()
        .map(|l| l["type"].as_str().expect("type"))
        .collect();
    assert_eq!(
        kinds,
        [
            "header",
            "reply",
            "block",
            "iteration",
            "reply",
            "block",
            "iteration",
            "reply",
            "iteration",
            "result"
        ]
    );
    let header = &lines[0];
    assert_eq!(header["contexts"][0]["name"], "context_0");
    assert_eq!(header["endpoints"][0]["name"], "root");
    assert!(!header.to_string().contains("api_key\":\""), "no secrets");
    assert_eq!(lines[6]["sub_calls"].as_array().expect("records").len(), 3);
    assert_eq!(lines[9]["metrics"]["sub_calls"], 3);
    // The large context is 200 times the small one (~8 MB); the trajectory stays put.
    assert!(
        large < small + 4_000,
        "small {small} bytes, large {large} bytes"
    );
    assert!(large < 200_000, "{large} bytes");
}

/// Records the order of hook events.
#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<String>>>);

impl Hook for Recorder {
    fn before_model_call(
        &mut self,
        iteration: u32,
        _r: &mut bridge::ChatRequest,
    ) -> HookAction<String> {
        self.0
            .lock()
            .expect("log")
            .push(format!("model {iteration}"));
        HookAction::Continue
    }
    fn before_block(
        &mut self,
        iteration: u32,
        block: &mut kernel::rlm::CodeBlock,
    ) -> HookAction<kernel::repl::ExecutionResult> {
        self.0
            .lock()
            .expect("log")
            .push(format!("block {iteration}.{}", block.index));
        block.code = block.code.replace("41", "42");
        HookAction::Continue
    }
    fn on_sub_call(&mut self, iteration: u32, _call: &bridge::SubCallMetadata) {
        self.0.lock().expect("log").push(format!("sub {iteration}"));
    }
    fn after_run(&mut self, result: &mut RlmResult) {
        self.0
            .lock()
            .expect("log")
            .push(format!("end {:?}", result.termination_reason));
    }
}

#[test]
fn hooks_see_every_step_and_may_amend_code() {
    let harness = Harness::new(Setup {
        script: script(&[
            "```repl\nx = 41\nprint(llm_query('Count a in:\\naa'))\n```",
            "FINAL_VAR(x)",
        ]),
        ..Setup::default()
    });
    let recorder = Recorder::default();
    let mut rlm = harness.rlm(config());
    rlm.add_hook(recorder.clone());
    let result = rlm.run("q").expect("run");
    assert_eq!(
        result.answer.as_deref(),
        Some("42"),
        "the hook rewrote the code"
    );
    assert_eq!(
        *recorder.0.lock().expect("log"),
        [
            "model 1",
            "block 1.0",
            "sub 1",
            "model 2",
            "end FinalAnswer"
        ]
    );
}

/// Replaces root-model calls with canned replies: no HTTP at all.
struct Canned(Vec<&'static str>);

impl Hook for Canned {
    fn before_model_call(
        &mut self,
        iteration: u32,
        _r: &mut bridge::ChatRequest,
    ) -> HookAction<String> {
        match self.0.get(iteration as usize - 1) {
            Some(reply) => HookAction::Replace((*reply).to_owned()),
            None => HookAction::Stop("no more canned replies".into()),
        }
    }
}

#[test]
fn a_hook_can_replace_model_calls_and_stop_the_run() {
    let harness = Harness::new(Setup::default());
    let mut rlm = harness.rlm(config());
    rlm.add_hook(Canned(vec!["```repl\nprint(2 + 2)\n```"]));
    let result = rlm.run("q").expect("run");
    assert_eq!(result.termination_reason, TerminationReason::StoppedByHook);
    assert_eq!(result.error.as_deref(), Some("no more canned replies"));
    assert_eq!(result.iterations.len(), 1);
    assert_eq!(result.iterations[0].blocks[0].stdout, "4\n");
    assert!(harness.log().is_empty(), "no request reached the server");
}

#[test]
fn progress_reports_the_run() {
    let harness = Harness::new(Setup {
        script: script(&[FAN_OUT, "FINAL(ok)"]),
        ..Setup::default()
    });
    let progress = Progress::new();
    let mut rlm = harness.rlm(config());
    rlm.add_hook(progress.hook());
    let result = rlm.run("q").expect("run");
    assert_eq!(result.answer.as_deref(), Some("ok"));
    let snapshot = progress.snapshot();
    assert_eq!(snapshot.iteration, 2);
    assert_eq!(snapshot.max_iterations, 8);
    assert_eq!(snapshot.sub_calls_done, 6);
    assert_eq!(snapshot.calls_in_flight, 0);
    assert!(snapshot.tokens > 0);
    assert_eq!(
        serde_json::to_value(snapshot.phase).expect("json")["phase"],
        "done"
    );
}

#[test]
fn progress_counts_the_running_block_and_its_fan_out() {
    /// Takes a snapshot when a block has run, before the phase moves on.
    struct AtBlockEnd(Progress, Arc<Mutex<Vec<ProgressSnapshot>>>);
    impl Hook for AtBlockEnd {
        fn after_block(&mut self, _iteration: u32, _run: &mut BlockRun) {
            self.1.lock().expect("snapshots").push(self.0.snapshot());
        }
    }
    let harness = Harness::new(Setup {
        script: script(&[FAN_OUT, "FINAL(ok)"]),
        ..Setup::default()
    });
    let progress = Progress::new();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut rlm = harness.rlm(config());
    rlm.add_hook(progress.hook());
    rlm.add_hook(AtBlockEnd(progress.clone(), Arc::clone(&seen)));
    rlm.run("q").expect("run");
    let seen = seen.lock().expect("snapshots");
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0].phase,
        Phase::Running {
            block: 1,
            blocks: 1
        }
    );
    assert_eq!(seen[0].phase_sub_calls_started, 6, "the block's fan-out");
    assert_eq!(seen[0].phase_sub_calls_done, 6);
    let done = progress.snapshot();
    assert_eq!(
        done.phase_elapsed,
        Duration::ZERO,
        "no phase runs after the end"
    );
}

#[test]
fn a_model_call_observer_sees_the_reply() {
    struct Upper;
    impl Hook for Upper {
        fn after_model_call(&mut self, call: &mut ModelCall) {
            call.reply = call.reply.replace("final(", "FINAL(");
        }
    }
    let harness = Harness::new(Setup {
        script: script(&["final(amended)"]),
        ..Setup::default()
    });
    let mut rlm = harness.rlm(config());
    rlm.add_hook(Upper);
    let result = rlm.run("q").expect("run");
    assert_eq!(result.answer.as_deref(), Some("amended"));
}

/// Reads the trajectory file after each iteration, as a `kill -9` at that point would leave it.
struct PrefixCheck {
    path: std::path::PathBuf,
    seen: Arc<Mutex<Vec<usize>>>,
}

impl Hook for PrefixCheck {
    fn after_iteration(&mut self, _record: &mut kernel::rlm::IterationRecord) {
        let text = std::fs::read_to_string(&self.path).expect("readable mid-run");
        assert!(text.ends_with('\n'), "only whole lines are on disk");
        for line in text.lines() {
            serde_json::from_str::<Value>(line).expect("every line on disk is JSON");
        }
        self.seen.lock().expect("seen").push(text.lines().count());
    }
}

#[test]
fn the_trajectory_is_flushed_after_every_iteration() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("t.jsonl");
    let harness = Harness::new(Setup {
        script: script(&[
            "```repl\nx = 1\n```",
            "```repl\nx += 1\n```",
            "FINAL_VAR(x)",
        ]),
        ..Setup::default()
    });
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut rlm = harness.rlm(config());
    rlm.add_hook(TrajectoryWriter::create(&path).expect("create"));
    rlm.add_hook(PrefixCheck {
        path: path.clone(),
        seen: Arc::clone(&seen),
    });
    let result = rlm.run("q").expect("run");
    assert_eq!(result.answer.as_deref(), Some("2"));
    assert_eq!(
        *seen.lock().expect("seen"),
        [4, 7, 9],
        "header, then per iteration its reply, its blocks and the iteration line"
    );
    assert_eq!(read_jsonl(&path).len(), 10);
}

/// Answers from a cache before anything runs.
struct Cache;

impl Hook for Cache {
    fn before_run(&mut self, run: &kernel::rlm::RunInfo<'_>) -> HookAction<String> {
        assert_eq!(run.contexts.len(), 1);
        assert!(run.system_prompt.contains("llm_query_batched"));
        HookAction::Replace(format!("cached answer to {}", run.query))
    }
}

#[test]
fn a_hook_can_answer_before_the_run() {
    let harness = Harness::new(Setup::default());
    let mut rlm = harness.rlm(config());
    rlm.add_hook(Cache);
    let result = rlm.run("q").expect("run");
    assert_eq!(result.termination_reason, TerminationReason::FinalAnswer);
    assert_eq!(result.answer.as_deref(), Some("cached answer to q"));
    assert_eq!(result.answer_kind, Some(FinalKind::Hook));
    assert!(result.iterations.is_empty());
    assert!(harness.log().is_empty());
}

#[test]
fn an_unknown_root_endpoint_is_an_error_before_the_run() {
    let harness = Harness::new(Setup::default());
    let mut config = config();
    config.root_endpoint = "nope".into();
    let error = harness.rlm(config).run("q").expect_err("no such endpoint");
    let message = error.to_string();
    assert!(message.contains("Unknown endpoint `nope`"), "{message}");
    assert!(message.contains("`root`"), "{message}");
}

#[test]
fn running_inside_a_tokio_runtime_is_refused() {
    let harness = Harness::new(Setup::default());
    let mut rlm = harness.rlm(config());
    let error = rt()
        .block_on(async { rlm.run("q") })
        .expect_err("blocking inside the runtime is refused");
    assert!(
        matches!(error, kernel::rlm::RlmError::InsideRuntime),
        "{error}"
    );
}

#[test]
fn a_reply_cut_off_at_the_token_limit_is_pointed_out() {
    let harness = Harness::new(Setup {
        script: json!({"models": {"root": {"replies": [
            {"text": "Let me count.\n```repl\nprint(len(cont", "finish_reason": "length"},
            "FINAL(3)"
        ]}}}),
        ..Setup::default()
    });
    let (result, seen) = harness.run_capturing(config(), "q");
    assert_eq!(result.answer.as_deref(), Some("3"));
    assert!(
        seen[1].contains("stopped at the output token limit"),
        "{}",
        seen[1]
    );
    assert_eq!(result.iterations[0].notes, [kernel::rlm::FinalNote::CutOff]);
}

#[test]
fn a_stop_handle_cancels_a_slow_root_call_and_later_runs_end_at_once() {
    let mut script = script(&["FINAL(too late)"]);
    script["models"]["root"]["latency"] = json!({"kind": "fixed", "ms": 60_000});
    let harness = Harness::new(Setup {
        script,
        ..Setup::default()
    });
    let mut rlm = harness.rlm(config());
    let handle = rlm.stop_handle();
    let stopper = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        handle.stop();
    });
    let started = std::time::Instant::now();
    let result = rlm.run("q").expect("the run starts");
    stopper.join().expect("joins");
    assert_eq!(result.termination_reason, TerminationReason::Interrupted);
    // Well under the call's 60 s: cancelled, not waited out (not a speed check).
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    assert!(rlm.stop_handle().is_stopped());
    let again = rlm.run("q").expect("the run starts");
    assert_eq!(again.termination_reason, TerminationReason::Interrupted);
    assert!(
        again.iterations.is_empty(),
        "a stopped runner asks nothing more"
    );
    assert_eq!(again.metrics.root_calls, 0);
    // The session itself is fine for a new runner.
    assert!(
        harness
            .session
            .exec("1 + 1")
            .expect("answers")
            .error
            .is_none()
    );
}

#[test]
fn a_second_run_on_the_session_does_not_inherit_the_finished_answer() {
    let harness = Harness::new(Setup {
        script: json!({"models": {
            "root": {
                "rules": [
                    {"turn": 0, "last_user": "QUERY-ONE",
                     "reply": "```repl\nanswer['content'] = 'first run'\nanswer['ready'] = True\n```"},
                    {"turn": 0, "last_user": "QUERY-TWO",
                     "reply": "```repl\nanswer['content'] = 'draft, still working'\n```"}
                ],
                "replies": ["", "FINAL(second run)"]
            },
            "sub": {"replies": [{"behaviour": "echo"}]}
        }}),
        ..Setup::default()
    });
    let first = harness.run(config(), "QUERY-ONE");
    assert_eq!(first.answer.as_deref(), Some("first run"));
    // Without the reset, `ready` would still be true and the draft would end this run.
    let second = harness.run(config(), "QUERY-TWO");
    assert_eq!(second.answer.as_deref(), Some("second run"));
    assert_eq!(second.iterations.len(), 2);
}

/// Runs `action` in `before_block`, after the loop's own stop check and before the block is
/// armed: the window in which an interrupt used to be lost.
struct BeforeBlock<F: FnMut() + Send>(F);

impl<F: FnMut() + Send> Hook for BeforeBlock<F> {
    fn before_block(
        &mut self,
        _iteration: u32,
        _block: &mut kernel::rlm::CodeBlock,
    ) -> HookAction<kernel::repl::ExecutionResult> {
        (self.0)();
        HookAction::Continue
    }
}

/// The error type the first block of a result ended with.
fn first_block_error(result: &RlmResult) -> String {
    result.iterations[0].blocks[0]
        .error
        .as_ref()
        .map(|e| e.type_name.clone())
        .unwrap_or_default()
}

#[test]
fn a_stop_between_before_block_and_the_block_start_is_not_lost() {
    let harness = Harness::new(Setup {
        script: script(&["```repl\nimport time\ntime.sleep(60)\n```", "FINAL(x)"]),
        // Long enough that a lost interrupt shows as a `CellTimeout` instead.
        cell_timeout: Duration::from_secs(5),
        ..Setup::default()
    });
    let mut rlm = harness.rlm(config());
    let handle = rlm.stop_handle();
    rlm.add_hook(BeforeBlock(move || handle.stop()));
    let result = rlm.run("q").expect("the run starts");
    assert_eq!(result.termination_reason, TerminationReason::Interrupted);
    assert_eq!(first_block_error(&result), "CellCancelled");
    // The stop belonged to that run: the session runs the next block normally.
    assert_eq!(
        harness.session.exec("print('next')").expect("runs").stdout,
        "next\n"
    );
}

#[test]
fn a_deadline_passing_as_the_block_starts_still_stops_it() {
    let harness = Harness::new(Setup {
        script: script(&["```repl\nimport time\ntime.sleep(60)\n```", "FINAL(x)"]),
        cell_timeout: Duration::from_secs(5),
        ..Setup::default()
    });
    let mut config = config();
    config.run_timeout = Some(Duration::from_millis(300));
    let mut rlm = harness.rlm(config);
    // The deadline passes inside `before_block`, after the executor checked it.
    rlm.add_hook(BeforeBlock(|| {
        std::thread::sleep(Duration::from_millis(600))
    }));
    let result = rlm.run("q").expect("the run starts");
    assert_eq!(result.termination_reason, TerminationReason::Timeout);
    assert_eq!(first_block_error(&result), "CellCancelled");
}

/// A root model that makes `x` when it is missing and reads it when it is there.
const MAKE_OR_USE_X: &str = "```repl\ntry:\n    print('x is', x + 1)\nexcept NameError:\n    x = 41\n    print('made x')\n```";

fn chat_script() -> Value {
    json!({"models": {"root": {
        "rules": [
            {"turn": 1, "last_user": "x is (\\d+)", "reply": "FINAL({{1}})"},
            {"turn": 1, "last_user": "made x", "reply": "FINAL(made x)"}
        ],
        "replies": [MAKE_OR_USE_X]
    }}})
}

#[test]
fn a_chat_keeps_the_session_and_tells_the_model_what_came_before() {
    let harness = Harness::new(Setup {
        script: chat_script(),
        ..Setup::default()
    });
    let sent = Sent::default();
    let mut rlm = harness.rlm(config());
    rlm.add_hook(sent.clone());
    let mut chat = RlmChat::new(rlm);
    let first = chat.ask("Make x.").expect("first question");
    assert_eq!(first.answer.as_deref(), Some("made x"));
    assert_eq!(
        chat.summary(),
        "1. Q: Make x.\n   A: made x\n   Variables: x"
    );
    let second = chat.ask("What is x + 1?").expect("second question");
    assert_eq!(
        second.answer.as_deref(),
        Some("42"),
        "x survived the first question"
    );
    assert_eq!(chat.exchanges().len(), 2);
    assert_eq!(chat.exchanges()[1].variables_created, Vec::<String>::new());

    let sent = sent.0.lock().expect("sent");
    assert_eq!(sent.len(), 4, "two root calls per question");
    assert!(!sent[0].contains("Earlier questions"), "{}", sent[0]);
    let follow_up = &sent[2];
    let from = follow_up
        .find("# Earlier questions")
        .expect("a summary section");
    insta::assert_snapshot!(&follow_up[from..]);
}

#[test]
fn the_chat_summary_keeps_the_latest_exchanges_within_its_bound() {
    let harness = Harness::new(Setup {
        script: chat_script(),
        ..Setup::default()
    });
    let mut chat = RlmChat::new(harness.rlm(config())).with_summary_limit(70);
    for question in ["Make x.", "Use x.", "Use x again."] {
        chat.ask(question).expect("question");
    }
    let summary = chat.summary();
    assert!(summary.chars().count() <= 70, "{summary}");
    assert!(
        summary.starts_with("(2 earlier question(s) not shown)\n3. Q: Use x again."),
        "{summary}"
    );
    let none = RlmChat::new(harness.rlm(config())).with_summary_limit(0);
    assert_eq!(none.summary(), "");
}

/// The root call's record is its own: calls made on the same endpoint at the same time (by
/// another run sharing it, say) are never taken for it. Here a thread starts a burst of calls
/// (refused by the budget, so each takes a ledger index at once) just as each root call starts.
#[test]
fn a_generation_records_its_own_call_among_concurrent_calls_on_its_endpoint() {
    use std::sync::atomic::{AtomicU64, Ordering};

    use bridge::{CallOptions, CancellationToken, ChatRequest, Endpoint, Message};
    use kernel::rlm::CodeGenerator;

    let server = rt()
        .block_on(MockServer::start(MockConfig::default()))
        .expect("mock server starts");
    let config = EndpointConfig::openai("root", server.openai_base_url(), "root");
    let budget = Budget {
        max_tokens: Some(1_000_000_000),
        ..Budget::default()
    };
    let ledger = Arc::new(Ledger::new(budget));
    let endpoint = Arc::new(Endpoint::new(config, ledger).expect("valid endpoint"));
    let generator = CodeGenerator::new(Arc::clone(&endpoint));
    const ROUNDS: u64 = 200;
    // The round whose burst may start; `u64::MAX` ends the thread.
    let go = Arc::new(AtomicU64::new(0));
    let noise = {
        let (endpoint, go) = (Arc::clone(&endpoint), Arc::clone(&go));
        std::thread::spawn(move || {
            let mut request = ChatRequest::from_prompt("noise");
            request.params.max_tokens = Some(u32::MAX);
            let options = CallOptions::default();
            for round in 1..=ROUNDS {
                while go.load(Ordering::Acquire) < round {
                    std::thread::yield_now();
                }
                for _ in 0..32 {
                    let call = endpoint.call(request.clone(), &options);
                    let refused = rt().block_on(call).expect_err("over the token budget");
                    assert!(matches!(refused, bridge::BridgeError::Budget(_)));
                }
            }
        })
    };
    let mut indexes = std::collections::HashSet::new();
    for round in 1..=ROUNDS {
        let prompt = format!("root call {round}");
        let request = generator.request(&[Message::user(prompt.clone())]);
        go.store(round, Ordering::Release);
        let generation = rt().block_on(generator.generate(request, &CancellationToken::new()));
        let answer = generation.result.expect("the mock answers");
        assert_eq!(answer.content, prompt, "the echo of this call");
        let record = generation.record;
        assert_eq!(
            record.prompt_chars,
            prompt.chars().count(),
            "round {round}: the record of another call: {record:?}"
        );
        assert!(indexes.insert(record.call_index), "a record given twice");
    }
    noise.join().expect("the noise thread ends");
}
