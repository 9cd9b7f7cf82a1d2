//! The agent loop against the mock LM server: tool calls, concurrency, bad tool traffic,
//! limits, hooks and metrics.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bridge::{
    Budget, BudgetLimit, CancellationToken, ChatRequest, ChatResponse, Message, Provider, Role,
    ToolCall, Usage,
};
use engine::agent::{
    AgentHook, AgentLoop, LoopConfig, LoopErrorKind, Termination, ToolCallRecord, ToolFailureKind,
    Toolbox, ToolboxError,
};
use engine::{HookAction, SharedState, State, Tool, ToolContext, ToolError};
use serde_json::{Value, json};
use tokio::sync::Barrier;

use crate::agent_support::{Add, Crash, Fail, Hang, Sleep, agent, endpoint, mock};
use crate::support::written;

fn call(name: &str, arguments: Value) -> Value {
    json!({"name": name, "arguments": arguments})
}

fn tool_calls(calls: Vec<Value>) -> Value {
    json!({"tool_calls": calls})
}

fn user(text: &str) -> Vec<Message> {
    vec![Message::system("You add numbers."), Message::user(text)]
}

/// The tool-result messages of a transcript, as (call id, content).
fn results(transcript: &[Message]) -> Vec<(String, String)> {
    transcript
        .iter()
        .filter(|m| m.role == Role::Tool)
        .map(|m| {
            (
                m.tool_call_id.clone().unwrap_or_default(),
                m.content.clone(),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_tool_call_runs_and_its_result_reaches_the_model_on_both_wire_formats() {
    for provider in [Provider::OpenAi, Provider::Anthropic] {
        for stream in [false, true] {
            let server = mock(json!([
                tool_calls(vec![call("add", json!({"a": 2, "b": 3}))]),
                "The sum is 5."
            ]))
            .await;
            let mut toolbox = Toolbox::new();
            toolbox.add(Arc::new(Add)).expect("add");
            let config = LoopConfig {
                stream,
                ..LoopConfig::default()
            };
            let agent = AgentLoop::new(
                endpoint(&server, provider, Budget::default()),
                toolbox,
                config,
            );
            let outcome = agent
                .run(
                    user("2 + 3?"),
                    SharedState::default(),
                    CancellationToken::new(),
                )
                .await
                .expect("answered");
            assert_eq!(
                outcome.answer, "The sum is 5.",
                "{provider:?} stream={stream}"
            );
            assert_eq!(outcome.termination, Termination::Answered);
            let transcript = &outcome.run.transcript;
            assert_eq!(transcript.len(), 5, "system, user, call, result, answer");
            assert_eq!(transcript[2].tool_calls[0].name, "add");
            assert_eq!(results(transcript)[0].1, "5");
            assert_eq!(outcome.run.metrics.iterations, 2);

            // The second request carried the tool definition and the result.
            let log = server.log().entries();
            assert_eq!(log.len(), 2);
            assert_eq!(log[1].stream, stream);
            let body: Value =
                serde_json::from_str(log[1].body.as_deref().unwrap_or("{}")).expect("json body");
            assert!(body["tools"].to_string().contains("Adds two integers."));
            assert!(
                body["messages"].to_string().contains("toolu_0_0")
                    || body["messages"].to_string().contains("call_0_0")
            );
            server.shutdown().await;
        }
    }
}

#[tokio::test]
async fn streamed_text_reaches_the_sink_as_it_arrives() {
    let server = mock(json!(["Hello from the agent."])).await;
    let seen = Arc::new(Mutex::new(String::new()));
    let sink = Arc::clone(&seen);
    let agent = agent(&server, vec![Arc::new(Add)], LoopConfig::default())
        .with_text_sink(move |text| sink.lock().expect("sink").push_str(text));
    let outcome = agent
        .run(user("hi"), SharedState::default(), CancellationToken::new())
        .await
        .expect("answered");
    assert_eq!(outcome.answer, "Hello from the agent.");
    assert_eq!(*seen.lock().expect("sink"), "Hello from the agent.");
    assert!(server.log().entries()[0].stream);
    server.shutdown().await;
}

/// Waits until `parties` calls are in at once, counting the peak in flight.
struct Meet {
    barrier: Barrier,
    in_flight: AtomicUsize,
    peak: AtomicUsize,
}

impl Meet {
    fn new(parties: usize) -> Self {
        Self {
            barrier: Barrier::new(parties),
            in_flight: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
        }
    }
}

#[async_trait]
impl Tool for Meet {
    fn name(&self) -> &str {
        "meet"
    }
    fn description(&self) -> &str {
        "Waits for the other calls, then returns its tag."
    }
    fn parameters(&self) -> Value {
        json!({"type": "object", "properties": {"tag": {"type": "string"}}})
    }
    fn timeout(&self) -> Option<Duration> {
        Some(Duration::from_secs(10))
    }
    async fn call(&self, args: Value, _ctx: &ToolContext) -> Result<Value, ToolError> {
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(now, Ordering::SeqCst);
        self.barrier.wait().await;
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        Ok(args["tag"].clone())
    }
}

#[tokio::test]
async fn the_calls_of_one_reply_run_concurrently_and_answer_in_call_order() {
    let server = mock(json!([
        tool_calls(vec![
            call("meet", json!({"tag": "a"})),
            call("meet", json!({"tag": "b"})),
            call("meet", json!({"tag": "c"})),
        ]),
        "done"
    ]))
    .await;
    // Three calls meet at a barrier of three: run one after another, the first would wait
    // until its timeout.
    let meet = Arc::new(Meet::new(3));
    let agent = agent(&server, vec![meet.clone()], LoopConfig::default());
    let outcome = agent
        .run(user("go"), SharedState::default(), CancellationToken::new())
        .await
        .expect("answered");
    assert_eq!(
        results(&outcome.run.transcript),
        [
            ("call_0_0".to_owned(), "a".to_owned()),
            ("call_0_1".to_owned(), "b".to_owned()),
            ("call_0_2".to_owned(), "c".to_owned()),
        ]
    );
    assert_eq!(meet.peak.load(Ordering::SeqCst), 3);
    assert_eq!(outcome.run.metrics.tools["meet"].calls, 3);
    assert_eq!(outcome.run.metrics.tools["meet"].failures, 0);
    server.shutdown().await;
}

#[tokio::test]
async fn concurrency_is_bounded_by_max_concurrent_tools() {
    let calls = (0..6)
        .map(|i| call("meet", json!({"tag": i.to_string()})))
        .collect();
    let server = mock(json!([tool_calls(calls), "done"])).await;
    let meet = Arc::new(Meet::new(2));
    let config = LoopConfig {
        max_concurrent_tools: 2,
        ..LoopConfig::default()
    };
    let outcome = agent(&server, vec![meet.clone()], config)
        .run(user("go"), SharedState::default(), CancellationToken::new())
        .await
        .expect("answered");
    assert_eq!(results(&outcome.run.transcript).len(), 6);
    assert_eq!(
        meet.peak.load(Ordering::SeqCst),
        2,
        "never more than two at once"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn bad_tool_traffic_becomes_tool_errors_the_model_can_act_on() {
    let server = mock(json!([
        tool_calls(vec![
            call("subtract", json!({"a": 1})),
            call("add", json!("2 and 3")),
            call("add", json!({"a": "two", "c": 3})),
            call(
                "fail",
                json!({"message": "The file `notes.md` does not exist; list the folder first"})
            ),
            call("crash", json!({})),
            call("hang", json!({})),
            call("add", json!({"a": 2, "b": 3})),
        ]),
        "I will try again."
    ]))
    .await;
    let tools: Vec<Arc<dyn Tool>> = vec![
        Arc::new(Add),
        Arc::new(Fail),
        Arc::new(Crash),
        Arc::new(Hang),
    ];
    let state = SharedState::default();
    let outcome = agent(&server, tools, LoopConfig::default())
        .run(user("go"), state.clone(), CancellationToken::new())
        .await
        .expect("the run survives every bad call");
    assert_eq!(outcome.answer, "I will try again.");
    let results = results(&outcome.run.transcript);
    assert_eq!(results.len(), 7);
    let mut errors = Vec::new();
    for (id, content) in &results[..6] {
        let value: Value = serde_json::from_str(content).expect("an error result is JSON");
        assert_eq!(value["success"], false, "{id}: {content}");
        errors.push(value["error"].as_str().unwrap_or_default().to_owned());
    }
    assert_eq!(
        results[6].1, "5",
        "a good call in the same reply still runs"
    );
    insta::assert_snapshot!(errors.join("\n"));
    let kinds: Vec<_> = outcome
        .run
        .metrics
        .tool_calls
        .iter()
        .map(|c| c.failure)
        .collect();
    assert_eq!(
        kinds,
        [
            Some(ToolFailureKind::UnknownTool),
            Some(ToolFailureKind::MalformedArguments),
            Some(ToolFailureKind::SchemaMismatch),
            Some(ToolFailureKind::Failed),
            Some(ToolFailureKind::Panicked),
            Some(ToolFailureKind::TimedOut),
            None,
        ]
    );
    assert_eq!(state.get("temp:crashed"), Some(json!(true)));
    assert_eq!(
        written(&outcome.run.delta, "temp:crashed").as_ref(),
        Some(&json!(true))
    );
    // What the model saw next is what the transcript holds.
    let body = server.log().entries()[1].body.clone().unwrap_or_default();
    assert!(body.contains("There is no tool `subtract`"), "{body}");
    server.shutdown().await;
}

#[tokio::test]
async fn the_iteration_cap_ends_the_run_with_the_transcript_kept() {
    let server = mock(json!([tool_calls(vec![call(
        "add",
        json!({"a": 1, "b": 1})
    )])]))
    .await;
    let config = LoopConfig {
        max_iterations: 3,
        ..LoopConfig::default()
    };
    let error = agent(&server, vec![Arc::new(Add)], config)
        .run(
            user("loop"),
            SharedState::default(),
            CancellationToken::new(),
        )
        .await
        .expect_err("never answers");
    assert_eq!(*error.kind(), LoopErrorKind::MaxIterations { max: 3 });
    assert_eq!(error.transcript().len(), 2 + 3 * 2);
    assert_eq!(error.run().metrics.iterations, 3);
    insta::assert_snapshot!(error.to_string(), @"The agent was still calling tools after 3 iterations (`max_iterations`); raise the limit or give it a narrower task");
    server.shutdown().await;
}

#[tokio::test]
async fn a_run_timeout_stops_running_tools_and_closes_their_calls() {
    let server = mock(json!([tool_calls(vec![
        call("add", json!({"a": 1, "b": 1})),
        call("sleep", json!({"ms": 60_000})),
    ])]))
    .await;
    let config = LoopConfig {
        run_timeout: Some(Duration::from_millis(200)),
        ..LoopConfig::default()
    };
    let sleep = Arc::new(Sleep::default());
    let error = agent(&server, vec![Arc::new(Add), sleep.clone()], config)
        .run(
            user("wait"),
            SharedState::default(),
            CancellationToken::new(),
        )
        .await
        .expect_err("times out");
    assert_eq!(
        *error.kind(),
        LoopErrorKind::RunTimeout {
            timeout: Duration::from_millis(200)
        }
    );
    let results = results(error.transcript());
    assert_eq!(results[0].1, "2", "the finished call's result is kept");
    assert_eq!(results[1].0, "call_0_1");
    assert!(results[1].1.contains("cancelled"), "{}", results[1].1);
    server.shutdown().await;
}

/// Cancels the caller's token when called (Ctrl-C while a tool runs).
struct Interrupt(CancellationToken);

#[async_trait]
impl Tool for Interrupt {
    fn name(&self) -> &str {
        "interrupt"
    }
    fn description(&self) -> &str {
        "Presses Ctrl-C."
    }
    fn parameters(&self) -> Value {
        json!({"type": "object"})
    }
    async fn call(&self, _args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        self.0.cancel();
        ctx.cancel().cancelled().await;
        Err(ToolError::Cancelled)
    }
}

#[tokio::test]
async fn cancelling_keeps_the_transcript() {
    let server = mock(json!([
        tool_calls(vec![call("interrupt", json!({}))]),
        "never"
    ]))
    .await;
    let cancel = CancellationToken::new();
    let error = agent(
        &server,
        vec![Arc::new(Interrupt(cancel.clone()))],
        LoopConfig::default(),
    )
    .run(user("stop"), SharedState::default(), cancel)
    .await
    .expect_err("cancelled");
    assert_eq!(*error.kind(), LoopErrorKind::Cancelled);
    assert_eq!(
        error.transcript().len(),
        4,
        "system, user, call, cancelled result"
    );
    assert_eq!(server.log().len(), 1, "no model call after Ctrl-C");
    server.shutdown().await;
}

#[tokio::test]
async fn a_spent_budget_ends_the_run() {
    let server = mock(json!([tool_calls(vec![call(
        "add",
        json!({"a": 1, "b": 1})
    )])]))
    .await;
    let mut toolbox = Toolbox::new();
    toolbox.add(Arc::new(Add)).expect("add");
    let budget = Budget {
        max_calls: Some(2),
        ..Budget::default()
    };
    let error = AgentLoop::new(
        endpoint(&server, Provider::OpenAi, budget),
        toolbox,
        LoopConfig::default(),
    )
    .run(
        user("loop"),
        SharedState::default(),
        CancellationToken::new(),
    )
    .await
    .expect_err("budget");
    match error.kind() {
        LoopErrorKind::Budget(exceeded) => assert_eq!(exceeded.limit, BudgetLimit::Calls),
        other => panic!("expected a budget stop, got {other:?}"),
    }
    assert_eq!(error.run().metrics.iterations, 3);
    assert_eq!(error.transcript().len(), 2 + 2 * 2);
    server.shutdown().await;
}

#[tokio::test]
async fn a_failing_model_call_is_a_model_error() {
    let server = mock(json!(["unused"])).await;
    let url = server.openai_base_url();
    server.shutdown().await;
    let config = bridge::EndpointConfig {
        retry: bridge::RetryPolicy {
            max_attempts: 1,
            ..bridge::RetryPolicy::default()
        },
        ..bridge::EndpointConfig::openai("root", url, "mock")
    };
    let endpoint = bridge::Endpoint::new(config, Arc::new(bridge::Ledger::new(Budget::default())))
        .expect("endpoint");
    let error = AgentLoop::new(Arc::new(endpoint), Toolbox::new(), LoopConfig::default())
        .run(user("hi"), SharedState::default(), CancellationToken::new())
        .await
        .expect_err("server gone");
    assert!(matches!(error.kind(), LoopErrorKind::Model(_)), "{error}");
    assert_eq!(error.transcript().len(), 2);
}

/// Writes state and ends the turn.
struct Finish;

#[async_trait]
impl Tool for Finish {
    fn name(&self) -> &str {
        "finish"
    }
    fn description(&self) -> &str {
        "Stores the result and ends the turn."
    }
    fn parameters(&self) -> Value {
        json!({"type": "object", "required": ["result"], "properties": {"result": {}}})
    }
    async fn call(&self, args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        ctx.set_state("result", args["result"].clone());
        ctx.end_turn();
        Ok(json!({"success": true}))
    }
}

#[tokio::test]
async fn an_action_ends_the_turn_after_the_replys_results() {
    let server = mock(json!([
        {"text": "Saving.", "tool_calls": [
            call("finish", json!({"result": 42})),
            call("add", json!({"a": 1, "b": 2})),
        ]},
        "never asked"
    ]))
    .await;
    let state = SharedState::new(State::default());
    let outcome = agent(
        &server,
        vec![Arc::new(Finish), Arc::new(Add)],
        LoopConfig::default(),
    )
    .run(user("save"), state.clone(), CancellationToken::new())
    .await
    .expect("ends by action");
    assert_eq!(outcome.termination, Termination::Action);
    assert_eq!(outcome.answer, "Saving.");
    assert!(outcome.run.actions.end_turn && !outcome.run.actions.escalate);
    assert_eq!(
        written(&outcome.run.delta, "result").as_ref(),
        Some(&json!(42))
    );
    assert_eq!(state.get("result"), Some(json!(42)));
    assert_eq!(
        results(&outcome.run.transcript).len(),
        2,
        "both results are in"
    );
    assert_eq!(server.log().len(), 1);
    server.shutdown().await;
}

/// Replaces the first model call, short-circuits `add`, amends results, logs messages.
#[derive(Default)]
struct Steer {
    messages: Mutex<Vec<(u32, Role)>>,
    finished: AtomicUsize,
}

impl AgentHook for Steer {
    fn before_model_call(
        &self,
        iteration: u32,
        request: &mut ChatRequest,
    ) -> HookAction<ChatResponse> {
        assert_eq!(request.tools.len(), 2);
        if iteration == 1 {
            return HookAction::Replace(ChatResponse {
                content: String::new(),
                tool_calls: vec![
                    ToolCall {
                        id: "h1".into(),
                        name: "add".into(),
                        arguments: r#"{"a":1,"b":2}"#.into(),
                    },
                    ToolCall {
                        id: "h2".into(),
                        name: "fail".into(),
                        arguments: "{}".into(),
                    },
                ],
                usage: Usage::default(),
                finish_reason: Some("tool_calls".into()),
                model: "hook".into(),
                latency: Duration::ZERO,
                attempts: 0,
            });
        }
        HookAction::Continue
    }

    fn before_tool_call(
        &self,
        _iteration: u32,
        call: &mut ToolCall,
    ) -> HookAction<Result<Value, ToolError>> {
        if call.name == "add" {
            return HookAction::Replace(Ok(json!("cached: 3")));
        }
        HookAction::Continue
    }

    fn after_tool_call(&self, record: &mut ToolCallRecord) {
        if record.output.is_err() {
            record.output = Ok(json!("recovered"));
        }
    }

    fn on_message(&self, iteration: u32, message: &Message) {
        self.messages
            .lock()
            .expect("log")
            .push((iteration, message.role));
    }

    fn on_finish(&self, result: Result<&engine::LoopOutcome, &engine::LoopError>) {
        assert!(result.is_ok());
        self.finished.fetch_add(1, Ordering::SeqCst);
    }
}

#[tokio::test]
async fn hooks_replace_model_and_tool_calls_and_see_every_message() {
    let server = mock(json!(["unused turn 0", "answer"])).await;
    let steer = Arc::new(Steer::default());
    let outcome = agent(
        &server,
        vec![Arc::new(Add), Arc::new(Fail)],
        LoopConfig::default(),
    )
    .with_hook(steer.clone())
    .run(user("go"), SharedState::default(), CancellationToken::new())
    .await
    .expect("answered");
    assert_eq!(outcome.answer, "answer");
    assert_eq!(
        results(&outcome.run.transcript),
        [
            ("h1".to_owned(), "cached: 3".to_owned()),
            ("h2".to_owned(), "recovered".to_owned())
        ]
    );
    assert_eq!(
        server.log().len(),
        1,
        "the first model call never reached the server"
    );
    assert!(outcome.run.metrics.model_calls[0].replaced);
    assert_eq!(
        *steer.messages.lock().expect("log"),
        [
            (0, Role::System),
            (0, Role::User),
            (1, Role::Assistant),
            (1, Role::Tool),
            (1, Role::Tool),
            (2, Role::Assistant)
        ]
    );
    assert_eq!(steer.finished.load(Ordering::SeqCst), 1);
    server.shutdown().await;
}

/// Stops the run before the second model call.
struct Halt;

impl AgentHook for Halt {
    fn before_model_call(
        &self,
        iteration: u32,
        _request: &mut ChatRequest,
    ) -> HookAction<ChatResponse> {
        if iteration == 2 {
            return HookAction::Stop("The transcript file is full".into());
        }
        HookAction::Continue
    }
}

#[tokio::test]
async fn a_hook_can_stop_the_run() {
    let server = mock(json!([
        tool_calls(vec![call("add", json!({"a": 1, "b": 1}))]),
        "never"
    ]))
    .await;
    let error = agent(&server, vec![Arc::new(Add)], LoopConfig::default())
        .with_hook(Arc::new(Halt))
        .run(user("go"), SharedState::default(), CancellationToken::new())
        .await
        .expect_err("stopped");
    assert_eq!(
        error.to_string(),
        "A hook stopped the agent run: The transcript file is full"
    );
    assert_eq!(error.transcript().len(), 4);
    server.shutdown().await;
}

#[tokio::test]
async fn metrics_count_tokens_per_iteration_and_bytes_each_result_added() {
    let server = mock(json!([
        tool_calls(vec![
            call("sleep", json!({"ms": 1})),
            call("add", json!({"a": 20, "b": 22}))
        ]),
        "done"
    ]))
    .await;
    let outcome = agent(
        &server,
        vec![Arc::new(Sleep::default()), Arc::new(Add)],
        LoopConfig::default(),
    )
    .run(user("go"), SharedState::default(), CancellationToken::new())
    .await
    .expect("answered");
    let metrics = &outcome.run.metrics;
    assert_eq!(metrics.model_calls.len(), 2);
    assert!(
        metrics
            .model_calls
            .iter()
            .all(|m| m.prompt_tokens > 0 && !m.replaced)
    );
    assert!(
        metrics.model_calls[1].prompt_tokens > metrics.model_calls[0].prompt_tokens,
        "the second request carries the results"
    );
    assert_eq!(metrics.model_calls[0].tool_calls, 2);
    assert_eq!(
        metrics.total_tokens(),
        metrics
            .model_calls
            .iter()
            .map(|m| m.prompt_tokens + m.completion_tokens)
            .sum::<u64>()
    );
    let bytes: Vec<usize> = metrics.tool_calls.iter().map(|c| c.result_bytes).collect();
    assert_eq!(bytes, [1, 2], "`1` and `42`");
    assert_eq!(metrics.tools["sleep"].calls, 1);
    assert!(metrics.tools["sleep"].total_ms >= 1.0);
    assert_eq!(metrics.tool_calls[1].call_id, "call_0_1");
    server.shutdown().await;
}

#[test]
fn the_toolbox_refuses_duplicates_bad_names_and_bad_schemas() {
    struct Named(&'static str, Value);

    #[async_trait]
    impl Tool for Named {
        fn name(&self) -> &str {
            self.0
        }
        fn description(&self) -> &str {
            ""
        }
        fn parameters(&self) -> Value {
            self.1.clone()
        }
        async fn call(&self, _args: Value, _ctx: &ToolContext) -> Result<Value, ToolError> {
            Ok(Value::Null)
        }
    }

    let mut toolbox = Toolbox::new();
    toolbox.add(Arc::new(Add)).expect("add");
    assert_eq!(
        toolbox.add(Arc::new(Add)),
        Err(ToolboxError::DuplicateName("add".into()))
    );
    assert_eq!(
        toolbox.add(Arc::new(Named("read file", json!({"type": "object"})))),
        Err(ToolboxError::InvalidName("read file".into()))
    );
    let bad = toolbox.add(Arc::new(Named("bad", json!({"type": "objekt"}))));
    assert!(
        matches!(bad, Err(ToolboxError::InvalidSchema { .. })),
        "{bad:?}"
    );
    assert_eq!(toolbox.names(), ["add"]);
    assert_eq!(toolbox.definitions()[0].description, "Adds two integers.");
    assert!(toolbox.get("add").is_some() && toolbox.get("bad").is_none());

    let malformed = ToolCall {
        id: "c".into(),
        name: "add".into(),
        arguments: "{\"a\": 1,".into(),
    };
    let error = toolbox.prepare(&malformed).err().expect("malformed");
    assert_eq!(error.kind(), ToolFailureKind::MalformedArguments);
    assert!(
        error
            .to_string()
            .starts_with("The arguments of `add` are not a valid JSON object (EOF"),
        "{error}"
    );
}

/// A tool's schema may refer to its own `$defs`; a `$ref` to a file or a URL is refused when
/// the tool is added, and nothing is read.
#[test]
fn tool_schemas_refer_only_inside_themselves() {
    struct Schema(Value);

    #[async_trait]
    impl Tool for Schema {
        fn name(&self) -> &str {
            "tool"
        }
        fn description(&self) -> &str {
            ""
        }
        fn parameters(&self) -> Value {
            self.0.clone()
        }
        async fn call(&self, _args: Value, _ctx: &ToolContext) -> Result<Value, ToolError> {
            Ok(Value::Null)
        }
    }

    let dir = tempfile::tempdir().expect("a temporary folder");
    let outside = dir.path().join("defs.json");
    std::fs::write(&outside, r#"{"type": "string"}"#).expect("a schema file");
    let file_url = format!("file://{}", outside.display());
    for target in [
        file_url.as_str(),
        "http://127.0.0.1:9/defs.json",
        "defs.json",
    ] {
        let schema = json!({"type": "object", "properties": {"p": {"$ref": target}}});
        let refused = Toolbox::new().with(Arc::new(Schema(schema)));
        let Err(ToolboxError::InvalidSchema { tool, detail }) = refused else {
            panic!("a `$ref` to {target} was accepted: {refused:?}");
        };
        assert_eq!(tool, "tool");
        assert!(detail.contains("self-contained"), "{target}: {detail}");
    }

    let local = json!({
        "type": "object",
        "$defs": {"word": {"type": "string", "pattern": "^[a-z]+$"}},
        "properties": {"w": {"$ref": "#/$defs/word"}},
        "required": ["w"],
    });
    let toolbox = Toolbox::new()
        .with(Arc::new(Schema(local)))
        .expect("a local `$ref` compiles");
    let call = |arguments: &str| ToolCall {
        id: "c".into(),
        name: "tool".into(),
        arguments: arguments.into(),
    };
    assert!(toolbox.prepare(&call(r#"{"w": "abc"}"#)).is_ok());
    let error = toolbox
        .prepare(&call(r#"{"w": "ABC"}"#))
        .err()
        .expect("refused");
    assert_eq!(error.kind(), ToolFailureKind::SchemaMismatch);
    assert!(
        error
            .to_string()
            .contains("`/w`: 'ABC' does not match pattern"),
        "{error}"
    );
}

#[tokio::test]
async fn tool_choice_and_parallel_tool_calls_reach_the_server() {
    let server = mock(json!([
        tool_calls(vec![call("add", json!({"a": 1, "b": 2}))]),
        "3"
    ]))
    .await;
    let config = LoopConfig {
        tool_choice: Some(bridge::ToolChoice::Tool("add".into())),
        parallel_tool_calls: Some(false),
        ..LoopConfig::default()
    };
    let outcome = agent(&server, vec![Arc::new(Add)], config)
        .run(
            user("1 + 2?"),
            SharedState::default(),
            CancellationToken::new(),
        )
        .await
        .expect("answered");
    assert_eq!(outcome.answer, "3");
    let body: Value =
        serde_json::from_str(&server.log().entries()[0].body.clone().unwrap_or_default())
            .expect("json body");
    assert_eq!(body["tool_choice"]["function"]["name"], "add");
    assert_eq!(body["parallel_tool_calls"], false);
    server.shutdown().await;
}

/// Returns `size` characters: `size` of `x` between a head and a tail marker.
struct Huge {
    size: usize,
    hint: Option<&'static str>,
}

#[async_trait]
impl Tool for Huge {
    fn name(&self) -> &str {
        "huge"
    }
    fn description(&self) -> &str {
        "Returns a very long text."
    }
    fn parameters(&self) -> Value {
        json!({"type": "object"})
    }
    async fn call(&self, _args: Value, _ctx: &ToolContext) -> Result<Value, ToolError> {
        let body = "x".repeat(self.size - 10);
        Ok(Value::String(format!("HEAD>{body}<TAIL")))
    }
    fn when_cut(&self) -> Option<&str> {
        self.hint
    }
}

/// One cap for every tool's result: 10 MB reach the model as at most the cap plus a note
/// saying how much was cut and how to see it.
#[tokio::test]
async fn a_huge_tool_result_is_cut_to_the_one_cap_with_a_note() {
    for (hint, how) in [
        (
            None,
            "To see it, call `huge` again asking for less at a time",
        ),
        (Some("Print a slice of it"), "Print a slice of it"),
    ] {
        let server = mock(json!([tool_calls(vec![call("huge", json!({}))]), "ok"])).await;
        let tool = Huge {
            size: 10_000_000,
            hint,
        };
        let agent = agent(&server, vec![Arc::new(tool)], LoopConfig::default());
        let outcome = agent
            .run(user("go"), SharedState::default(), Default::default())
            .await
            .expect("answers");
        let (_, text) = results(&outcome.run.transcript)
            .into_iter()
            .next()
            .expect("a result");
        assert!(
            text.starts_with("HEAD>") && text.ends_with("<TAIL"),
            "head and tail kept"
        );
        assert!(text.len() < 100_000 + 400, "{} bytes sent", text.len());
        let note = format!(
            "[... 9,900,000 of the 10,000,000 characters of this result were cut here: a tool \
             result holds at most 100,000 characters. {how} ...]"
        );
        assert!(text.contains(&note), "{}", &text[49_990..50_400]);
        assert_eq!(
            outcome.run.metrics.tool_calls[0].result_bytes,
            text.len(),
            "the metrics count what was sent"
        );
        server.shutdown().await;
    }
    // A result within the cap is sent whole.
    let server = mock(json!([tool_calls(vec![call("huge", json!({}))]), "ok"])).await;
    let config = LoopConfig {
        max_tool_result_chars: 200,
        ..LoopConfig::default()
    };
    let tool = Huge {
        size: 200,
        hint: None,
    };
    let outcome = agent(&server, vec![Arc::new(tool)], config)
        .run(user("go"), SharedState::default(), Default::default())
        .await
        .expect("answers");
    let (_, text) = results(&outcome.run.transcript).remove(0);
    assert_eq!(text.len(), 200);
    server.shutdown().await;
}
