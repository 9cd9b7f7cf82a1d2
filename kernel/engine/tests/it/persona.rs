//! Bundle personas in workflow files and the plan-and-discover tools: a planner playing an
//! agent of each fixture bundle asks a discovery loop twice, loads a workflow file of its
//! bundle and writes its artifact; build errors point at the `persona` line.

use bridge::Provider;
use bridge::mock::MockServer;
use engine::bundle::PersonaBundle;
use engine::flow::file::{ConfigErrorKind, EmbeddedFiles, load_workflow_from};
use engine::flow::{EndStatus, Event, EventKind, Registry, RunOutcome, with_discovery};
use serde_json::{Value, json};

use crate::bundle_support::Project;
use crate::support::ends;
use crate::workflow::{endpoints, mock, started};

/// A plan-and-discover workflow of LLM agents only: the planner plays persona `persona`.
fn files(persona: &str) -> EmbeddedFiles {
    EmbeddedFiles::new()
        .with(
            "plan.yaml",
            "agent_class: LoopAgent
name: plan
max_iterations: 20
sub_agents:
  - config_path: planner.yaml
  - config_path: discovery.yaml
",
        )
        .with(
            "planner.yaml",
            format!(
                "name: planner
persona: {persona}
instruction: |
  You plan. Round: {{temp:discovery:round?}}
  Results: {{temp:discovery:results?}}
tools:
  - name: request_discovery
  - name: load_workflow_file
  - name: write_planning_artifact
  - name: exit_loop
"
            ),
        )
        .with(
            "discovery.yaml",
            "agent_class: LoopAgent
name: discovery
max_iterations: 10
before_agent_callbacks:
  - name: skip_unless_discovery_requested
sub_agents:
  - config_path: finder.yaml
  - config_path: processor.yaml
",
        )
        .with(
            "finder.yaml",
            "name: finder
include_contents: none
instruction: 'You find. Query: {temp:discovery:query}'
output_key: temp:discovery:findings
",
        )
        .with(
            "processor.yaml",
            "name: processor
include_contents: none
instruction: 'You process. Findings: {temp:discovery:findings}'
tools:
  - name: write_discovery_results_and_exit
",
        )
}

fn call(name: &str, arguments: Value) -> Value {
    json!({"tool_call": {"name": name, "arguments": arguments}})
}

/// The planner asks twice, then loads `workflow` and writes `plan.md` from the last results.
async fn scripted(workflow: &str) -> MockServer {
    mock(json!({"flow-model": {"rules": [
        {"tool_name": "write_planning_artifact", "reply": call("exit_loop", json!({}))},
        // The persona comes before the instruction: its role goes into the plan.
        {"tool_name": "load_workflow_file",
         "system": "(?s)- Role: (?P<role>[^\\n]*).*You plan.*?Results: (?P<r>[^\\n]*)",
         "reply": call("write_planning_artifact",
                       json!({"name": "plan.md", "content": "# Plan by {{role}}\n{{r}}"}))},
        {"system": "You plan. Round: 2", "reply": call("load_workflow_file", json!({"file_path": workflow}))},
        {"system": "You plan. Round: 1", "reply": call("request_discovery", json!({"query": "second"}))},
        {"system": "You plan", "reply": call("request_discovery", json!({"query": "first", "context": "none yet"}))},
        {"system": "You find. Query: (?P<q>\\w+)", "reply": "found {{q}}"},
        {"system": "You process. Findings: (?P<f>[^\\n]*)",
         "reply": call("write_discovery_results_and_exit", json!({"results": "{{f}}", "summary": "ok"}))},
    ]}}))
    .await
}

fn tool_calls<'a>(events: &'a [Event], author: &str) -> Vec<&'a str> {
    events
        .iter()
        .filter(|e| e.author == author && e.kind == EventKind::ToolCalls)
        .flat_map(|e| e.tool_calls.iter().map(|c| c.name.as_str()))
        .collect()
}

#[tokio::test]
async fn a_persona_planner_of_either_fixture_bundle_runs_two_discovery_rounds() {
    let cases = [
        (
            "v6-installed",
            "_bmad/bmm/agents/sm.md",
            "workflows/4-implementation/sprint-planning/workflow.yaml",
            "Technical Scrum Master",
        ),
        (
            "v6-alpha0",
            "bmad/cis/agents/design-thinking-coach.md",
            "{bundle-root}/workflows/design-thinking/workflow.yaml",
            "Human-Centered Design Expert",
        ),
    ];
    for (provider, (tree, agent, workflow, role)) in [Provider::OpenAi, Provider::Anthropic]
        .into_iter()
        .zip(cases)
    {
        let project = Project::copy(tree);
        let out = project.path("plans");
        let server = scripted(workflow).await;
        let endpoints = endpoints(&server, provider, &["flow-model"]);
        let spec = load_workflow_from(&files("planner"), "plan.yaml").expect("valid files");
        let registry = with_discovery(Registry::new(endpoints.clone(), "flow-model"))
            .with_bundle(PersonaBundle::new(project.path(agent), project.options()));
        let root = registry.build(&spec).expect("builds");
        let mut invocation_state = engine::State::default();
        invocation_state.set("output_dir", json!(out.display().to_string()));
        let sink = engine::flow::MemorySink::new();
        let report = engine::flow::run_workflow(
            root.as_ref(),
            engine::flow::Invocation::new(engine::SharedState::new(invocation_state))
                .with_sink(std::sync::Arc::new(sink.clone())),
            Some("Plan the release."),
        )
        .await;
        let events = sink.events();
        assert_eq!(
            report.outcome(),
            RunOutcome::Completed,
            "{tree}: {report:?}"
        );
        let round = ["finder", "processor"];
        let mut expected = vec!["plan", "planner", "discovery"];
        expected.extend(round);
        expected.extend(["planner", "discovery"]);
        expected.extend(round);
        expected.push("planner");
        assert_eq!(started(&events), expected, "{tree}");
        // The inner exit ended the discovery loop only; the planner's exit ended the run.
        assert_eq!(
            ends(&events, "discovery"),
            [EndStatus::ExitedLoop, EndStatus::ExitedLoop]
        );
        assert_eq!(ends(&events, "plan"), [EndStatus::ExitedLoop]);
        // A request ends the planner's turn: one model call in each of its first two turns.
        assert_eq!(
            tool_calls(&events, "planner"),
            [
                "request_discovery",
                "request_discovery",
                "load_workflow_file",
                "write_planning_artifact",
                "exit_loop"
            ]
        );
        let loaded = events
            .iter()
            .flat_map(|e| &e.tool_results)
            .find(|r| r.name == "load_workflow_file")
            .expect("a workflow file was loaded");
        assert!(!loaded.is_error, "{tree}: {:?}", loaded.result);
        assert!(
            loaded.result["content"]
                .as_str()
                .is_some_and(|c| c.contains("installed_path")),
            "{:?}",
            loaded.result
        );
        let plan = std::fs::read_to_string(out.join("plan.md")).expect("the artifact");
        assert!(plan.starts_with(&format!("# Plan by {role}")), "{plan}");
        assert!(plan.ends_with("\nfound second"), "{plan}");
        assert_eq!(
            report.state.get("temp:discovery:round"),
            None,
            "temp keys end"
        );
        server.shutdown().await;
    }
}

#[tokio::test]
async fn persona_mistakes_are_errors_at_their_line() {
    let server = mock(json!({})).await;
    let endpoints = endpoints(&server, Provider::OpenAi, &["flow-model"]);
    let project = Project::copy("v6-installed");
    let spec = load_workflow_from(&files("planner"), "plan.yaml").expect("valid files");
    let registry = with_discovery(Registry::new(endpoints.clone(), "flow-model"));

    let none = registry.build(&spec).expect_err("no bundle");
    assert_eq!(none.kind, ConfigErrorKind::Unknown);
    assert_eq!(
        (none.file.display().to_string(), none.line),
        ("planner.yaml".into(), 2)
    );
    assert!(none.message.contains("`--bundle PATH`"), "{none}");

    let folder = registry.clone().with_bundle(PersonaBundle::new(
        project.path("_bmad/bmm"),
        project.options(),
    ));
    let unknown = folder.build(&spec).expect_err("no agent `planner` there");
    assert_eq!((unknown.line, unknown.kind), (2, ConfigErrorKind::Unknown));
    assert!(
        unknown.message.contains("has no agent `planner`") && unknown.message.contains("`sm`"),
        "{unknown}"
    );
    let hostile = load_workflow_from(&files("../agents/sm"), "plan.yaml").expect("valid files");
    let refused = folder.build(&hostile).expect_err("not a plain agent name");
    assert_eq!(refused.kind, ConfigErrorKind::Unknown, "{refused}");
    let played = load_workflow_from(&files("sm"), "plan.yaml").expect("valid files");
    folder
        .build(&played)
        .expect("`sm` is an agent of the bundle");

    let without = EmbeddedFiles::new().with(
        "a.yaml",
        "name: a\ninstruction: Plan.\ntools:\n  - name: load_workflow_file\n",
    );
    let spec = load_workflow_from(&without, "a.yaml").expect("valid file");
    let err = folder
        .build(&spec)
        .expect_err("a bundle tool without a persona");
    assert_eq!((err.line, err.column), (4, 5));
    assert!(
        err.message.contains("give this agent `persona: NAME`"),
        "{err}"
    );

    let typo = EmbeddedFiles::new().with(
        "w.yaml",
        "name: w\ntools:\n  - name: write_planning_artifact\n    args: {folder: plans}\n",
    );
    let spec = load_workflow_from(&typo, "w.yaml").expect("valid file");
    let err = folder.build(&spec).expect_err("an unknown setting");
    assert_eq!((err.line, err.kind), (3, ConfigErrorKind::Invalid));
    assert!(
        err.message.contains("`folder`") && err.message.contains("`folder_key`"),
        "{err}"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn load_workflow_file_reads_only_the_bundle_folder() {
    let project = Project::copy("v6-installed");
    let persona = PersonaBundle::new(project.path("_bmad/bmm/agents/sm.md"), project.options())
        .start("planner")
        .expect("the agent file plays any persona");
    let tool = persona
        .tool("load_workflow_file")
        .expect("a bundle tool")
        .expect("made");
    let ctx = crate::bundle_support::ctx();
    let inside = tool
        .call(json!({"file_path": "config.yaml"}), &ctx)
        .await
        .expect("a file of the bundle");
    assert_eq!(inside["path"], json!("config.yaml"));
    for outside in [
        "../core/config.yaml",
        "{project-root}/_bmad/core/config.yaml",
        "/etc/hostname",
    ] {
        let refused = tool.call(json!({"file_path": outside}), &ctx).await;
        assert!(
            matches!(&refused, Err(engine::ToolError::Failed(m)) if m.contains("outside")),
            "{outside}: {refused:?}"
        );
    }
}

/// What the model of a persona agent reads before its workflow instruction.
#[test]
fn the_persona_preamble_names_the_persona_the_workflows_and_the_values() {
    let project = Project::copy("v6-installed");
    let persona = PersonaBundle::new(project.path("_bmad/bmm"), project.options())
        .start("sm")
        .expect("starts");
    insta::assert_snapshot!(project.redact(&persona.preamble()));
}
