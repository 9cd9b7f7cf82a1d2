//! LLM agents against the real mock LM server, over both wire formats: instruction
//! templates, tools and state, `output_key`, the three actions from model tool calls,
//! `include_contents`, agent-as-tool, model and tool callbacks, budgets.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bridge::mock::{MockConfig, MockServer, Script};
use bridge::{
    Budget, ChatRequest, ChatResponse, Endpoint, EndpointConfig, Ledger, Provider, RetryPolicy,
};
use engine::HookAction;
use engine::agent::ToolCallError;
use engine::flow::{
    Agent, Callback, CallbackContext, Callbacks, Control, EndStatus, EventKind, FlowError, FnAgent,
    Graph, Invocation, LlmAgent, RunOutcome, ToolInvocation, builtin_tool,
};
use engine::{SharedState, State, Tool, ToolContext, ToolError};
use serde_json::{Value, json};

use crate::support::{ends, iters, run_with, trace, traced, written};

const PROVIDERS: [Provider; 2] = [Provider::OpenAi, Provider::Anthropic];

/// A mock server recording requests; `models` maps model names to script entries.
pub(crate) async fn mock(models: Value) -> MockServer {
    let script = Script::from_json_value(json!({ "models": models })).expect("valid script");
    MockServer::start(MockConfig {
        script,
        record_requests: true,
        ..MockConfig::default()
    })
    .await
    .expect("mock server starts")
}

/// An endpoint named and asking for `model` on `server`, recording into `ledger`.
fn endpoint(
    server: &MockServer,
    provider: Provider,
    model: &str,
    ledger: &Arc<Ledger>,
) -> Arc<Endpoint> {
    let config = match provider {
        Provider::OpenAi => EndpointConfig::openai(model, server.openai_base_url(), model),
        Provider::Anthropic => EndpointConfig::anthropic(model, server.anthropic_base_url(), model),
    };
    let config = EndpointConfig {
        timeout: Duration::from_secs(20),
        retry: RetryPolicy {
            max_attempts: 1,
            ..RetryPolicy::default()
        },
        ..config
    };
    Arc::new(Endpoint::new(config, ledger.clone()).expect("valid endpoint"))
}

fn invocation(state: State, ledger: &Arc<Ledger>) -> Invocation {
    Invocation::new(SharedState::new(state)).with_ledger(ledger.clone())
}

/// `set_note(text)`: writes `temp:note`.
struct SetNote;

#[async_trait]
impl Tool for SetNote {
    fn name(&self) -> &str {
        "set_note"
    }
    fn description(&self) -> &str {
        "Stores a note."
    }
    fn parameters(&self) -> Value {
        json!({"type": "object", "required": ["text"], "properties": {"text": {"type": "string"}}})
    }
    async fn call(&self, args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        ctx.set_state("temp:note", args["text"].clone());
        Ok(json!({"success": true}))
    }
}

/// `read_note()`: returns `temp:note` (or fails when there is none).
struct ReadNote;

#[async_trait]
impl Tool for ReadNote {
    fn name(&self) -> &str {
        "read_note"
    }
    fn description(&self) -> &str {
        "Reads the note."
    }
    fn parameters(&self) -> Value {
        json!({"type": "object", "properties": {}})
    }
    async fn call(&self, _args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        ctx.get_state("temp:note")
            .ok_or_else(|| ToolError::Failed("There is no note yet".into()))
    }
}

fn call(name: &str, arguments: Value) -> Value {
    json!({"tool_call": {"name": name, "arguments": arguments}})
}

fn system_prompt(body: &str) -> String {
    let body: Value = serde_json::from_str(body).expect("a JSON body");
    match &body["system"] {
        Value::String(text) => text.clone(),
        _ => body["messages"][0]["content"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
    }
}

#[tokio::test]
async fn tool_writes_reach_the_next_tool_and_the_answer_reaches_output_key() {
    for provider in PROVIDERS {
        let server = mock(json!({"writer": {"replies": [
            call("set_note", json!({"text": "north grew"})),
            call("read_note", json!({})),
            "Summary: {{last_tool}}",
        ]}}))
        .await;
        let ledger = Arc::new(Ledger::default());
        let writer = LlmAgent::builder("writer", endpoint(&server, provider, "writer", &ledger))
            .instruction("Summarise {topic}. Feedback: {feedback?}.")
            .tool(Arc::new(SetNote))
            .tool(Arc::new(ReadNote))
            .output_key("summary")
            .build()
            .expect("valid tools");
        let reader = FnAgent::new("reader", |ctx| {
            let summary = ctx.get_state("summary").unwrap_or_default();
            ctx.set_state("seen", summary);
            Ok(Control::Continue)
        });
        let root = Graph::sequential("root", vec![Arc::new(writer), Arc::new(reader)])
            .expect("valid graph");
        let mut state = State::default();
        state.set("topic", json!("sales"));
        let (report, events) = run_with(&root, invocation(state, &ledger)).await;
        assert_eq!(report.outcome(), RunOutcome::Completed, "{provider:?}");
        assert_eq!(
            report.state.get("seen"),
            Some(&json!("Summary: north grew")),
            "{provider:?}"
        );
        let bodies: Vec<String> = server
            .log()
            .entries()
            .into_iter()
            .filter_map(|e| e.body)
            .collect();
        assert_eq!(bodies.len(), 3);
        assert_eq!(system_prompt(&bodies[0]), "Summarise sales. Feedback: .");
        let kinds: Vec<&EventKind> = events
            .iter()
            .filter(|e| e.author == "writer")
            .map(|e| &e.kind)
            .collect();
        let call = EventKind::Metadata {
            topic: "model_call".into(),
        };
        assert_eq!(
            kinds,
            [
                &EventKind::Start,
                &call,
                &EventKind::ToolCalls,
                &EventKind::ToolResults,
                &call,
                &EventKind::ToolCalls,
                &EventKind::ToolResults,
                &call,
                &EventKind::Message,
                &EventKind::End {
                    status: EndStatus::Completed
                },
            ]
        );
        let answer = events
            .iter()
            .find(|e| e.author == "writer" && e.kind == EventKind::Message)
            .expect("an answer event");
        assert_eq!(
            written(&answer.delta, "summary").as_ref(),
            Some(&json!("Summary: north grew"))
        );
        assert_eq!(
            written(&answer.delta, "temp:note").as_ref(),
            Some(&json!("north grew"))
        );
        server.shutdown().await;
    }
}

/// The ADK defect, with real model tool calls: the inner worker's `exit_loop` ends only the
/// inner loop; the outer loop's next sub-agent runs. `escalate` ends everything.
#[tokio::test]
async fn a_model_exit_loop_ends_the_nearest_loop_and_escalate_the_run() {
    for provider in PROVIDERS {
        for (action, status) in [
            ("exit_loop", RunOutcome::Completed),
            ("escalate", RunOutcome::Escalated),
        ] {
            let server = mock(json!({
                "planner": {"replies": ["Plan: look at sales."]},
                // Every turn of the worker (it sees its earlier turns) raises the action.
                "worker": {"rules": [{"reply":
                    {"text": "Done here.", "tool_call": {"name": action, "arguments": {}}},
                }]},
            }))
            .await;
            let ledger = Arc::new(Ledger::default());
            let planner =
                LlmAgent::builder("planner", endpoint(&server, provider, "planner", &ledger))
                    .output_key("plan")
                    .build()
                    .expect("no tools");
            let worker =
                LlmAgent::builder("worker", endpoint(&server, provider, "worker", &ledger))
                    .instruction("Work on: {plan}")
                    .tool(builtin_tool(action).expect("a built-in"))
                    .build()
                    .expect("valid tools");
            let inner = Graph::looping("inner", vec![Arc::new(worker)], iters(5)).expect("valid");
            let after = FnAgent::new("after_inner", |ctx| {
                trace(ctx, "after_inner");
                Ok(Control::Continue)
            });
            let outer = Graph::looping(
                "outer",
                vec![Arc::new(planner), Arc::new(inner), Arc::new(after)],
                iters(2),
            )
            .expect("valid graph");
            let (report, events) = run_with(&outer, invocation(State::default(), &ledger)).await;
            assert_eq!(report.outcome(), status, "{provider:?} {action}");
            match action {
                "exit_loop" => {
                    assert_eq!(traced(&report.state), ["after_inner", "after_inner"]);
                    assert_eq!(ends(&events, "inner"), [EndStatus::ExitedLoop; 2]);
                    assert_eq!(ends(&events, "outer"), [EndStatus::IterationLimit]);
                    assert_eq!(ledger.records().len(), 4, "one call per agent turn");
                }
                _ => {
                    assert_eq!(traced(&report.state), Vec::<String>::new());
                    assert_eq!(ledger.records().len(), 2);
                }
            }
            server.shutdown().await;
        }
    }
}

#[tokio::test]
async fn end_turn_hands_control_to_the_next_sub_agent() {
    let server = mock(json!({"talker": {"replies": [
        {"text": "Over to the next one.", "tool_call": {"name": "end_turn", "arguments": {}}},
        "The talker was asked again.",
    ]}}))
    .await;
    let ledger = Arc::new(Ledger::default());
    let talker = LlmAgent::builder(
        "talker",
        endpoint(&server, Provider::OpenAi, "talker", &ledger),
    )
    .tool(builtin_tool("end_turn").expect("a built-in"))
    .output_key("said")
    .build()
    .expect("valid tools");
    let next = FnAgent::new("next", |ctx| {
        trace(ctx, "next");
        Ok(Control::Continue)
    });
    let root = Graph::sequential("root", vec![Arc::new(talker), Arc::new(next)]).expect("valid");
    let (report, _) = run_with(&root, invocation(State::default(), &ledger)).await;
    assert_eq!(report.outcome(), RunOutcome::Completed);
    assert_eq!(traced(&report.state), ["next"]);
    assert_eq!(
        report.state.get("said"),
        Some(&json!("Over to the next one."))
    );
    assert_eq!(ledger.records().len(), 1);
}

#[tokio::test]
async fn include_contents_default_shows_the_conversation_and_none_only_the_input() {
    let server = mock(json!({"*": {"replies": ["reply of {{model}}"]}})).await;
    let ledger = Arc::new(Ledger::default());
    let agent = |name: &str, include| {
        Arc::new(
            LlmAgent::builder(name, endpoint(&server, Provider::OpenAi, name, &ledger))
                .instruction(format!("You are {name}."))
                .include_contents(include)
                .build()
                .expect("no tools"),
        ) as Arc<dyn Agent>
    };
    use engine::flow::file::IncludeContents;
    let root = Graph::sequential(
        "root",
        vec![
            agent("first", IncludeContents::Default),
            agent("second", IncludeContents::Default),
            agent("third", IncludeContents::None),
        ],
    )
    .expect("valid graph");
    let sink = engine::flow::MemorySink::new();
    let report = engine::flow::run_workflow(
        &root,
        invocation(State::default(), &ledger).with_sink(Arc::new(sink)),
        Some("Compare the regions."),
    )
    .await;
    assert_eq!(report.outcome(), RunOutcome::Completed);
    let messages: Vec<Value> = server
        .log()
        .entries()
        .into_iter()
        .filter_map(|e| e.body)
        .map(|b| serde_json::from_str::<Value>(&b).expect("JSON")["messages"].clone())
        .collect();
    let texts = |m: &Value| -> Vec<String> {
        m.as_array()
            .expect("messages")
            .iter()
            .map(|m| {
                format!(
                    "{}: {}",
                    m["role"].as_str().unwrap_or(""),
                    m["content"].as_str().unwrap_or("")
                )
            })
            .collect()
    };
    assert_eq!(
        texts(&messages[1]),
        [
            "system: You are second.",
            "user: Compare the regions.",
            "user: [first] said: reply of first",
        ]
    );
    assert_eq!(
        texts(&messages[2]),
        ["system: You are third.", "user: Compare the regions."]
    );
}

#[tokio::test]
async fn another_agent_can_be_a_tool() {
    for provider in PROVIDERS {
        let server = mock(json!({
            "lead": {"replies": [
                call("researcher", json!({"request": "Which region grew?"})),
                "The researcher says: {{last_tool}}",
            ]},
            "researcher": {"replies": ["North ({{last_user}})"]},
        }))
        .await;
        let ledger = Arc::new(Ledger::default());
        let researcher = LlmAgent::builder(
            "researcher",
            endpoint(&server, provider, "researcher", &ledger),
        )
        .description("Finds facts in the data.")
        .output_key("facts")
        .build()
        .expect("no tools");
        let lead = LlmAgent::builder("lead", endpoint(&server, provider, "lead", &ledger))
            .agent_tool(Arc::new(researcher))
            .output_key("answer")
            .build()
            .expect("valid tools");
        let (report, events) = run_with(&lead, invocation(State::default(), &ledger)).await;
        assert_eq!(report.outcome(), RunOutcome::Completed, "{provider:?}");
        assert_eq!(
            report.state.get("facts"),
            Some(&json!("North (Which region grew?)"))
        );
        assert_eq!(
            report.state.get("answer"),
            Some(&json!("The researcher says: North (Which region grew?)"))
        );
        let branches: Vec<&str> = events
            .iter()
            .filter(|e| e.author == "researcher")
            .map(|e| e.branch.as_str())
            .collect();
        assert!(
            branches.iter().all(|b| *b == "lead/researcher"),
            "{branches:?}"
        );
        server.shutdown().await;
    }
}

/// A model answer made by a callback.
fn answer(content: String) -> ChatResponse {
    ChatResponse {
        content,
        tool_calls: Vec::new(),
        usage: bridge::Usage::default(),
        finish_reason: Some("stop".into()),
        model: "callback".into(),
        latency: Duration::ZERO,
        attempts: 0,
    }
}

/// Short-circuits and amendments at every model and tool point.
struct Guard;

impl Callback for Guard {
    fn before_model(
        &self,
        ctx: &CallbackContext,
        request: &mut ChatRequest,
    ) -> HookAction<ChatResponse> {
        match ctx.get_state("cached") {
            Some(Value::String(text)) => HookAction::Replace(answer(text)),
            _ => {
                request.messages[0].content.push_str(" Be brief.");
                HookAction::Continue
            }
        }
    }

    fn after_model(&self, _ctx: &CallbackContext, response: &mut ChatResponse) {
        if response.tool_calls.is_empty() {
            response.content = response.content.to_uppercase();
        }
    }

    fn before_tool(&self, ctx: &CallbackContext, call: &mut ToolInvocation) -> HookAction<Value> {
        if call.name == "set_note" && call.args["text"] == json!("secret") {
            ctx.set_state("blocked", json!(true));
            return HookAction::Replace(json!({"success": false, "error": "Blocked by policy"}));
        }
        HookAction::Continue
    }

    fn after_tool(&self, _ctx: &CallbackContext, call: &ToolInvocation, result: &mut Value) {
        // After-tool callbacks see every result, a before-tool replacement's too.
        if call.name == "set_note" && *result == json!({"success": true}) {
            *result = json!({"success": true, "checked": true});
        }
    }

    fn on_tool_error(
        &self,
        _ctx: &CallbackContext,
        _call: &ToolInvocation,
        error: &ToolCallError,
    ) -> HookAction<Value> {
        HookAction::Replace(json!({"recovered": error.to_string()}))
    }

    fn on_model_error(
        &self,
        _ctx: &CallbackContext,
        _error: &bridge::BridgeError,
    ) -> HookAction<ChatResponse> {
        HookAction::Replace(answer("fallback answer".into()))
    }
}

fn guarded() -> Callbacks {
    [Arc::new(Guard) as Arc<dyn Callback>].into_iter().collect()
}

#[tokio::test]
async fn model_and_tool_callbacks_change_or_short_circuit_each_call() {
    for provider in PROVIDERS {
        let server = mock(json!({"agent": {"replies": [
            {"tool_calls": [
                {"name": "set_note", "arguments": {"text": "secret"}},
                {"name": "read_note", "arguments": {}},
            ]},
            call("set_note", json!({"text": "public"})),
            "tools said {{last_tool}}",
        ]}}))
        .await;
        let ledger = Arc::new(Ledger::default());
        let agent = LlmAgent::builder("agent", endpoint(&server, provider, "agent", &ledger))
            .instruction("Take notes.")
            .tool(Arc::new(SetNote))
            .tool(Arc::new(ReadNote))
            .output_key("out")
            .callbacks(guarded())
            .build()
            .expect("valid tools");
        let (report, events) = run_with(&agent, invocation(State::default(), &ledger)).await;
        assert_eq!(report.outcome(), RunOutcome::Completed, "{provider:?}");
        // after_model upper-cased the answer; after_tool rewrote set_note's result.
        assert_eq!(
            report.state.get("out"),
            Some(&json!(r#"TOOLS SAID {"CHECKED":TRUE,"SUCCESS":TRUE}"#))
        );
        // before_tool blocked the secret note (the tool never ran) and its write is kept.
        assert_eq!(report.state.get("temp:note"), None);
        assert_eq!(report.state.get("blocked"), Some(&json!(true)));
        let results: Vec<Value> = events
            .iter()
            .flat_map(|e| e.tool_results.iter().map(|r| r.result.clone()))
            .collect();
        assert_eq!(
            results[0],
            json!({"success": false, "error": "Blocked by policy"})
        );
        // read_note failed (no note) and on_tool_error recovered with its own result.
        assert_eq!(results[1], json!({"recovered": "There is no note yet"}));
        // before_model amended every request.
        let body = server.log().entries()[0].body.clone().expect("a body");
        assert!(
            system_prompt(&body).ends_with("Take notes. Be brief."),
            "{provider:?}"
        );
        server.shutdown().await;
    }
}

/// Records each callback point it is asked at, and acts like a guard: `before_tool`
/// answers `set_note("secret")`, `on_tool_error` recovers every failure, `after_tool`
/// stamps every result it sees.
struct Recorder(std::sync::Mutex<Vec<String>>);

impl Recorder {
    fn note(&self, point: &str, tool: &str) {
        let mut seen = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        seen.push(format!("{point} {tool}").trim_end().to_owned());
    }
}

impl Callback for Recorder {
    fn before_model(&self, _: &CallbackContext, _: &mut ChatRequest) -> HookAction<ChatResponse> {
        self.note("before_model", "");
        HookAction::Continue
    }

    fn after_model(&self, _: &CallbackContext, _: &mut ChatResponse) {
        self.note("after_model", "");
    }

    fn before_tool(&self, _: &CallbackContext, call: &mut ToolInvocation) -> HookAction<Value> {
        self.note("before_tool", &call.name);
        if call.args["text"] == json!("secret") {
            return HookAction::Replace(json!({"success": false, "error": "Blocked"}));
        }
        HookAction::Continue
    }

    fn after_tool(&self, _: &CallbackContext, call: &ToolInvocation, result: &mut Value) {
        self.note("after_tool", &call.name);
        *result = json!({"seen": result.clone()});
    }

    fn on_tool_error(
        &self,
        _: &CallbackContext,
        call: &ToolInvocation,
        _: &ToolCallError,
    ) -> HookAction<Value> {
        self.note("on_tool_error", &call.name);
        HookAction::Replace(json!("recovered"))
    }
}

/// The order of the callback points around tool calls is ADK's: every `before_tool` first;
/// then per call its result — `on_tool_error` on a failure — and `after_tool` on the result
/// however it came (the tool's, a `before_tool` answer, an `on_tool_error` recovery), but not
/// for a tool that does not exist.
#[tokio::test]
async fn tool_callbacks_run_in_adks_order_and_after_tool_sees_every_result() {
    let server = mock(json!({"agent": {"replies": [
        {"tool_calls": [
            {"name": "set_note", "arguments": {"text": "secret"}},
            {"name": "read_note", "arguments": {}},
            {"name": "set_note", "arguments": {"text": "public"}},
            {"name": "no_such_tool", "arguments": {}},
        ]},
        "done",
    ]}}))
    .await;
    let ledger = Arc::new(Ledger::default());
    let recorder = Arc::new(Recorder(std::sync::Mutex::default()));
    let agent = LlmAgent::builder(
        "agent",
        endpoint(&server, Provider::OpenAi, "agent", &ledger),
    )
    .tool(Arc::new(SetNote))
    .tool(Arc::new(ReadNote))
    .callbacks(
        [recorder.clone() as Arc<dyn Callback>]
            .into_iter()
            .collect(),
    )
    .build()
    .expect("valid tools");
    let (report, events) = run_with(&agent, invocation(State::default(), &ledger)).await;
    assert_eq!(report.outcome(), RunOutcome::Completed);
    let seen = recorder
        .0
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    assert_eq!(
        seen,
        [
            "before_model",
            "after_model",
            "before_tool set_note",
            "before_tool read_note",
            "before_tool set_note",
            "before_tool no_such_tool",
            "after_tool set_note",
            "on_tool_error read_note",
            "after_tool read_note",
            "after_tool set_note",
            "on_tool_error no_such_tool",
            "before_model",
            "after_model",
        ]
    );
    let results: Vec<Value> = events
        .iter()
        .flat_map(|e| e.tool_results.iter().map(|r| r.result.clone()))
        .collect();
    assert_eq!(
        results,
        [
            json!({"seen": {"success": false, "error": "Blocked"}}),
            json!({"seen": "recovered"}),
            json!({"seen": {"success": true}}),
            json!("recovered"),
        ]
    );
    server.shutdown().await;
}

#[tokio::test]
async fn a_cached_answer_skips_the_model_and_a_model_error_can_be_recovered() {
    let server = mock(json!({"agent": {"replies": ["from the model"]}})).await;
    let ledger = Arc::new(Ledger::default());
    let agent = LlmAgent::builder(
        "agent",
        endpoint(&server, Provider::OpenAi, "agent", &ledger),
    )
    .output_key("out")
    .callbacks(guarded())
    .build()
    .expect("no tools");
    let mut state = State::default();
    state.set("cached", json!("from the cache"));
    let (report, events) = run_with(&agent, invocation(state, &ledger)).await;
    assert_eq!(report.state.get("out"), Some(&json!("FROM THE CACHE")));
    assert!(server.log().is_empty(), "no request reached the model");
    // The event log tells the callback's answer from a model call.
    let calls: Vec<_> = events
        .iter()
        .filter(|e| matches!(&e.kind, EventKind::Metadata { topic } if topic == "model_call"))
        .map(|e| e.metadata["replaced"].clone())
        .collect();
    assert_eq!(calls, [json!(true)]);

    // Nothing listens on port 1: the call fails to connect and the callback answers.
    let dead = EndpointConfig {
        retry: RetryPolicy {
            max_attempts: 1,
            ..RetryPolicy::default()
        },
        ..EndpointConfig::openai("dead", "http://127.0.0.1:1/v1", "dead")
    };
    let dead = Arc::new(Endpoint::new(dead, ledger.clone()).expect("valid endpoint"));
    let agent = LlmAgent::builder("agent", dead.clone())
        .output_key("out")
        .callbacks(guarded())
        .build()
        .expect("no tools");
    let (report, _) = run_with(&agent, invocation(State::default(), &ledger)).await;
    assert_eq!(report.outcome(), RunOutcome::Completed);
    assert_eq!(report.state.get("out"), Some(&json!("fallback answer")));
    // Without the callback the failure is the run's.
    let bare = LlmAgent::builder("agent", dead).build().expect("no tools");
    let (report, _) = run_with(&bare, invocation(State::default(), &ledger)).await;
    assert!(
        matches!(report.result, Err(FlowError::Model { .. })),
        "{:?}",
        report.result
    );
}

#[tokio::test]
async fn a_missing_template_key_fails_the_agent_with_its_name() {
    let server = mock(json!({"agent": {"replies": ["never"]}})).await;
    let ledger = Arc::new(Ledger::default());
    let agent = LlmAgent::builder(
        "agent",
        endpoint(&server, Provider::OpenAi, "agent", &ledger),
    )
    .instruction("Improve {draft}.")
    .build()
    .expect("no tools");
    let (report, _) = run_with(&agent, invocation(State::default(), &ledger)).await;
    let Err(FlowError::Setup { agent, message }) = report.result else {
        panic!("expected a setup error, got {:?}", report.result);
    };
    assert_eq!(agent, "agent");
    assert!(message.contains("`draft`"), "{message}");
    assert!(server.log().is_empty());
}

#[tokio::test]
async fn model_calls_of_every_agent_share_the_ledger_budget() {
    let server = mock(json!({"agent": {"replies": ["again"]}})).await;
    let ledger = Arc::new(Ledger::new(Budget {
        max_calls: Some(3),
        ..Budget::default()
    }));
    let agent = LlmAgent::builder(
        "agent",
        endpoint(&server, Provider::OpenAi, "agent", &ledger),
    )
    .output_key("last")
    .build()
    .expect("no tools");
    let idle = FnAgent::new("idle", |_| Ok(Control::Continue));
    let lp = Graph::looping("lp", vec![Arc::new(agent), Arc::new(idle)], iters(10))
        .expect("valid graph");
    let (report, _) = run_with(&lp, invocation(State::default(), &ledger)).await;
    assert_eq!(report.outcome(), RunOutcome::BudgetExceeded);
    assert_eq!(
        report.state.get("last"),
        Some(&json!("again")),
        "the state is kept"
    );
    assert_eq!(server.log().len(), 3);
}
