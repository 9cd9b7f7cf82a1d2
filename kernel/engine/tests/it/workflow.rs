//! Workflow files built into agents and run against the mock LM server: a refinement loop
//! that exits when its evaluator is satisfied, a graph with declared edges, kernel-provided
//! classes and callbacks by name, and build errors that point at their line.

use std::sync::{Arc, Mutex};

use bridge::mock::{MockConfig, MockServer, Script};
use bridge::{EndpointConfig, Endpoints, Ledger, Provider, RetryPolicy};
use engine::HookAction;
use engine::flow::file::{AgentClass, AgentConfig, EmbeddedFiles, load_workflow_from};
use engine::flow::{
    Agent, Callback, CallbackContext, Control, EndStatus, Event, EventKind, FnAgent, Invocation,
    MemorySink, Registry, RunOutcome, run_workflow,
};
use engine::{SharedState, State};
use serde_json::{Value, json};

use crate::support::ends;

pub(crate) async fn mock(models: Value) -> MockServer {
    let script = Script::from_json_value(json!({ "models": models })).expect("valid script");
    MockServer::start(MockConfig {
        script,
        ..MockConfig::default()
    })
    .await
    .expect("mock server starts")
}

/// Endpoints `names` on `server` (each asking for the model of its own name).
pub(crate) fn endpoints(server: &MockServer, provider: Provider, names: &[&str]) -> Arc<Endpoints> {
    let configs = names
        .iter()
        .map(|name| {
            let config = match provider {
                Provider::OpenAi => EndpointConfig::openai(*name, server.openai_base_url(), *name),
                Provider::Anthropic => {
                    EndpointConfig::anthropic(*name, server.anthropic_base_url(), *name)
                }
            };
            EndpointConfig {
                retry: RetryPolicy {
                    max_attempts: 1,
                    ..RetryPolicy::default()
                },
                ..config
            }
        })
        .collect();
    Arc::new(Endpoints::new(configs, Arc::new(Ledger::default())).expect("valid endpoints"))
}

pub(crate) async fn run(
    root: &dyn Agent,
    registry_ledger: &Arc<Endpoints>,
    input: &str,
) -> (engine::flow::RunReport, Vec<Event>) {
    let sink = MemorySink::new();
    let invocation = Invocation::new(SharedState::new(State::default()))
        .with_ledger(registry_ledger.ledger().clone())
        .with_sink(Arc::new(sink.clone()));
    let report = run_workflow(root, invocation, Some(input)).await;
    (report, sink.events())
}

/// Agent names in the order they started.
pub(crate) fn started(events: &[Event]) -> Vec<&str> {
    events
        .iter()
        .filter(|e| e.kind == EventKind::Start)
        .map(|e| e.author.as_str())
        .collect()
}

fn refine_files() -> EmbeddedFiles {
    EmbeddedFiles::new()
        .with(
            "refine/root.yaml",
            "agent_class: SequentialAgent
name: root
sub_agents:
  - config_path: loop.yaml
  - config_path: agents/finisher.yaml
",
        )
        .with(
            "refine/loop.yaml",
            "agent_class: LoopAgent
name: refine_loop
max_iterations: 5
sub_agents:
  - config_path: agents/writer.yaml
  - config_path: agents/evaluator.yaml
",
        )
        .with(
            "refine/agents/writer.yaml",
            "name: writer
model: writer
instruction: Write the draft. Apply this feedback if any - {refinement_feedback?}
output_key: draft
",
        )
        .with(
            "refine/agents/evaluator.yaml",
            "name: evaluator
model: evaluator
instruction: 'Evaluate this draft: {draft}'
tools:
  - name: exit_loop
output_key: refinement_feedback
",
        )
        .with(
            "refine/agents/finisher.yaml",
            "name: finisher
model: finisher
instruction: 'Format: {draft}'
include_contents: none
output_key: final
",
        )
}

#[tokio::test]
async fn a_refinement_loop_from_yaml_exits_when_its_evaluator_is_satisfied() {
    for provider in [Provider::OpenAi, Provider::Anthropic] {
        let server = mock(json!({
            // The writer sees its earlier drafts, so TURN counts its iterations.
            "writer": {"replies": ["draft v1", "draft v2", "draft v3"]},
            "evaluator": {"rules": [
                {"system": "draft v2", "reply": {"tool_call": {"name": "exit_loop", "arguments": {}}}},
                {"reply": "Add the numbers."},
            ]},
            "finisher": {"replies": ["FINAL: {{system}}"]},
        }))
        .await;
        let endpoints = endpoints(&server, provider, &["writer", "evaluator", "finisher"]);
        let spec = load_workflow_from(&refine_files(), "refine/root.yaml").expect("valid files");
        let root = Registry::new(endpoints.clone(), "writer")
            .build(&spec)
            .expect("builds");
        let (report, events) = run(root.as_ref(), &endpoints, "Refine the template.").await;
        assert_eq!(report.outcome(), RunOutcome::Completed, "{provider:?}");
        assert_eq!(
            started(&events),
            [
                "root",
                "refine_loop",
                "writer",
                "evaluator",
                "writer",
                "evaluator",
                "finisher"
            ]
        );
        assert_eq!(ends(&events, "refine_loop"), [EndStatus::ExitedLoop]);
        assert_eq!(report.state.get("draft"), Some(&json!("draft v2")));
        assert_eq!(
            report.state.get("refinement_feedback"),
            Some(&json!("Add the numbers.")),
            "the exit turn wrote no feedback"
        );
        assert_eq!(
            report.state.get("final"),
            Some(&json!("FINAL: Format: draft v2"))
        );
        server.shutdown().await;
    }
}

#[tokio::test]
async fn a_graph_from_yaml_follows_its_declared_edges() {
    let files = EmbeddedFiles::new()
        .with(
            "g.yaml",
            "agent_class: GraphAgent
name: g
start: check
edges:
  - {from: check, to: publish, when: {key: ready, equals: 'yes'}}
  - {from: check, to: check}
  - {from: publish, to: END}
sub_agents:
  - config_path: check.yaml
  - config_path: publish.yaml
",
        )
        .with(
            "check.yaml",
            "name: check\nmodel: check\noutput_key: ready\n",
        )
        .with(
            "publish.yaml",
            "name: publish\nmodel: publish\noutput_key: done\n",
        );
    let server = mock(json!({
        "check": {"replies": ["no", "no", "yes"]},
        "publish": {"replies": ["published"]},
    }))
    .await;
    let endpoints = endpoints(&server, Provider::OpenAi, &["check", "publish"]);
    let spec = load_workflow_from(&files, "g.yaml").expect("valid files");
    let root = Registry::new(endpoints.clone(), "check")
        .build(&spec)
        .expect("builds");
    let (report, events) = run(root.as_ref(), &endpoints, "Go.").await;
    assert_eq!(report.outcome(), RunOutcome::Completed);
    assert_eq!(
        started(&events),
        ["g", "check", "check", "check", "publish"]
    );
    assert_eq!(report.state.get("done"), Some(&json!("published")));
}

/// Counts calls at every point (named in the file under one point only).
#[derive(Default)]
struct Counter(Mutex<Vec<&'static str>>);

impl Callback for Counter {
    fn before_agent(&self, _ctx: &CallbackContext) -> HookAction<String> {
        self.0.lock().expect("not poisoned").push("before_agent");
        HookAction::Continue
    }
    fn after_agent(&self, ctx: &CallbackContext) -> HookAction<String> {
        self.0.lock().expect("not poisoned").push("after_agent");
        ctx.set_state("noted", json!(true));
        HookAction::Continue
    }
}

#[tokio::test]
async fn kernel_classes_and_named_callbacks_plug_into_the_registry() {
    let files = EmbeddedFiles::new()
        .with(
            "root.yaml",
            "agent_class: SequentialAgent
name: root
after_agent_callbacks:
  - name: audit.note
sub_agents:
  - config_path: step.yaml
",
        )
        .with(
            "step.yaml",
            "agent_class: PythonAgent
name: step
function: steps.py:double
args: {value: 21}
",
        );
    let server = mock(json!({})).await;
    let endpoints = endpoints(&server, Provider::OpenAi, &["root"]);
    let counter = Arc::new(Counter::default());
    let registry = Registry::new(endpoints.clone(), "root")
        .with_callback("audit.note", counter.clone())
        // What the kernel does for Python: here a Rust step reads the file's args.
        .with_class(AgentClass::PythonAgent, |spec, _| {
            let AgentConfig::Python(c) = &spec.config else {
                unreachable!("registered for PythonAgent");
            };
            let value = c.args.get("value").and_then(Value::as_i64).unwrap_or(0);
            Ok(Arc::new(FnAgent::new(c.name.as_str(), move |ctx| {
                ctx.set_state("doubled", json!(value * 2));
                Ok(Control::Continue)
            })))
        });
    let spec = load_workflow_from(&files, "root.yaml").expect("valid files");
    let root = registry.build(&spec).expect("builds");
    let (report, _) = run(root.as_ref(), &endpoints, "Go.").await;
    assert_eq!(report.outcome(), RunOutcome::Completed);
    assert_eq!(report.state.get("doubled"), Some(&json!(42)));
    assert_eq!(report.state.get("noted"), Some(&json!(true)));
    // Named under `after_agent_callbacks` only, it is not called before the agent.
    assert_eq!(*counter.0.lock().expect("not poisoned"), ["after_agent"]);
}

#[tokio::test]
async fn unknown_names_are_build_errors_at_their_line() {
    let server = mock(json!({})).await;
    let endpoints = endpoints(&server, Provider::OpenAi, &["root", "sub"]);
    let registry = Registry::new(endpoints, "root");
    let cases = [
        ("unknown model", "name: a\nmodel: gpt9\n"),
        (
            "unknown tool",
            "name: a\ntools:\n  - name: exit_loop\n  - name: web_search\n",
        ),
        (
            "unknown callback",
            "name: a\nbefore_tool_callbacks:\n  - name: guards.block\n",
        ),
        (
            "agent tool without a file",
            "name: a\ntools:\n  - name: AgentTool\n    args: {}\n",
        ),
        (
            "kernel class",
            "agent_class: RlmAgent\nname: a\ninstruction: Count {x}.\n",
        ),
    ];
    let mut report = String::new();
    for (what, text) in cases {
        let files = EmbeddedFiles::new().with("a.yaml", text);
        let err = match load_workflow_from(&files, "a.yaml") {
            Ok(spec) => registry.build(&spec).map(|_| ()).expect_err(what),
            Err(e) => e,
        };
        report.push_str(&format!("{what} ({:?}):\n  {err}\n", err.kind));
    }
    insta::assert_snapshot!(report);
}
