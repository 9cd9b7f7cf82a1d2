#![allow(clippy::unwrap_used)] // In tests an unwrap is an assertion.

//! `agent_class: RouterAgent` in workflow files: loading (settings, errors with positions),
//! each routing priority of a YAML-built router with LLM agents on the mock LM server
//! (escalation flag, circular logic at 3 vs 4 exchanges, gate recovery, passive vs active),
//! and the LLM-router pattern (an LLM agent's `output_key` tested by conditional edges).

use std::sync::Arc;

use bridge::Provider;
use engine::flow::file::{
    AgentConfig, EmbeddedFiles, RoutingMode, SuccessorConfig, load_workflow_from,
};
use engine::flow::{Registry, RunOutcome};
use engine::route::file::register;
use serde_json::json;

use crate::control::summaries;
use crate::workflow::{endpoints, mock, run, started};

/// An LLM agent file: `name` asks the model of its own name, answers to `output_key`.
fn llm(name: &str, output_key: &str) -> String {
    format!(
        "name: {name}\nmodel: {name}\ninstruction: You are {name}; the last review says {{review?}}\noutput_key: {output_key}\n"
    )
}

/// A router over `dev` and `tea` (plus `extra` nodes' files) with `settings` above its nodes.
fn router_files(settings: &str, nodes: &[(&str, &str)]) -> EmbeddedFiles {
    let mut root = format!("agent_class: RouterAgent\nname: team\n{settings}sub_agents:\n");
    let mut files = EmbeddedFiles::new();
    for (name, text) in nodes {
        root.push_str(&format!("  - config_path: {name}.yaml\n"));
        files = files.with(format!("{name}.yaml"), *text);
    }
    files.with("team.yaml", root)
}

#[test]
fn a_router_file_reads_into_its_settings() {
    let files = EmbeddedFiles::new()
        .with(
            "flows/team.yaml",
            "agent_class: RouterAgent
name: team
description: The team.
mode: passive
start: dev
topic: {state_key: story}
max_exchanges: 5
max_steps: 30
sub_agents:
  - config_path: agents/dev.yaml
    retry: {attempts: 2, initial: 0.5, max: 4}
  - config_path: agents/tea.yaml
    gates:
      - {name: reviewed, when: {key: review, exists: true}}
      - name: style
        blocking: false
        python: checks.py:style
successors:
  tea:
    - {when: {key: review, contains: REJECTED}, to: dev}
    - to: END
  dev: tea
recovery: {reviewed: tea}
",
        )
        .with("flows/agents/dev.yaml", llm("dev", "code"))
        .with("flows/agents/tea.yaml", llm("tea", "review"));
    let spec = load_workflow_from(&files, "flows/team.yaml").unwrap();
    let AgentConfig::Router(router) = &spec.config else {
        panic!("a router: {:?}", spec.config);
    };
    assert_eq!(router.mode, RoutingMode::Passive);
    assert_eq!(router.start, "dev");
    assert_eq!(router.max_exchanges, Some(5));
    assert_eq!(router.max_steps, Some(30));
    assert_eq!(
        router.topic.as_ref().unwrap().state_key.as_deref(),
        Some("story")
    );
    // Successors keep their file order.
    assert_eq!(router.successors[0].0, "tea");
    assert!(matches!(&router.successors[0].1, SuccessorConfig::Branches(b) if b.len() == 2));
    assert_eq!(
        router.successors[1],
        ("dev".to_owned(), SuccessorConfig::Node("tea".into()))
    );
    assert_eq!(
        router.sub_agents[0].retry.attempts.map(|n| n.get()),
        Some(2)
    );
    let gates = &router.sub_agents[1].gates;
    assert_eq!(gates.len(), 2);
    assert!(gates[0].blocking && !gates[1].blocking);
    assert_eq!(gates[1].python.as_deref(), Some("checks.py:style"));
    assert_eq!(spec.sub_agents[1].config.name(), "tea");
    let graph = engine::flow::file::render_mermaid(&spec);
    assert!(
        graph.contains("team__tea -- \"review contains #quot;REJECTED#quot;\" --> team__dev"),
        "{graph}"
    );
    assert!(
        graph.contains("team__tea -. \"gate reviewed blocked\" .-> team__tea"),
        "{graph}"
    );

    // Building it needs Python for the `python` gate; the engine alone says so at its line
    // (no model is called while building).
    let configs = ["dev", "tea"]
        .map(|name| bridge::EndpointConfig::openai(name, "http://127.0.0.1:9/v1", name))
        .to_vec();
    let endpoints =
        Arc::new(bridge::Endpoints::new(configs, Arc::new(bridge::Ledger::default())).unwrap());
    let err = register(Registry::new(endpoints.clone(), "dev"))
        .build(&spec)
        .map(|_| ())
        .unwrap_err();
    assert!(
        err.to_string().starts_with(
            "flows/team.yaml:17:9: `python: checks.py:style` runs in the kernel's embedded Python"
        ),
        "{err}"
    );
    // Without the router's factory, the registry says where the class comes from.
    let err = Registry::new(endpoints, "dev")
        .build(&spec)
        .map(|_| ())
        .unwrap_err();
    assert!(
        err.to_string().contains("`engine::route::file::register`"),
        "{err}"
    );
}

/// One bad router file (plus good node files) per case; every message in one snapshot.
#[test]
fn router_file_errors_name_file_line_column_and_what_is_expected() {
    let nodes = |root: &str| {
        EmbeddedFiles::new()
            .with("team.yaml", root.to_owned())
            .with("dev.yaml", llm("dev", "code"))
            .with("tea.yaml", llm("tea", "review"))
    };
    let head = "agent_class: RouterAgent\nname: team\nsub_agents:\n  - config_path: dev.yaml\n  - config_path: tea.yaml\n";
    let cases: Vec<(&str, String)> = vec![
        ("unknown key", format!("{head}start: dev\nmax_exchange: 3\n")),
        ("unknown start", format!("{head}start: qa\n")),
        ("unknown successor", format!("{head}start: dev\nsuccessors:\n  dev: qa\n")),
        ("successor of an unknown node", format!("{head}start: dev\nsuccessors:\n  qa: dev\n")),
        (
            "unknown branch target",
            format!("{head}start: dev\nsuccessors:\n  tea:\n    - {{when: {{key: review, equals: no}}, to: qa}}\n    - to: END\n"),
        ),
        (
            "branches without a plain last one",
            format!("{head}start: dev\nsuccessors:\n  tea:\n    - {{when: {{key: review, equals: no}}, to: dev}}\n"),
        ),
        (
            "a branch condition that tests nothing",
            format!("{head}start: dev\nsuccessors:\n  tea:\n    - {{when: {{key: review}}, to: dev}}\n    - to: END\n"),
        ),
        ("a bad successor", format!("{head}start: dev\nsuccessors:\n  tea: [1, 2]\n")),
        ("unknown recovery node", format!("{head}start: dev\nrecovery:\n  reviewed: qa\n")),
        ("recovery of an unknown gate", format!("{head}start: dev\nrecovery:\n  reviewed: dev\n")),
        ("bad mode", format!("{head}start: dev\nmode: eager\n")),
        ("bad topic", format!("{head}start: dev\ntopic: {{state_key: a, reply_field: b}}\n")),
        (
            "gate with two checks",
            "agent_class: RouterAgent\nname: team\nstart: dev\nsub_agents:\n  - config_path: dev.yaml\n    gates:\n      - {name: g, when: {key: a, exists: true}, python: m.f}\n  - config_path: tea.yaml\n".to_owned(),
        ),
        (
            "two gates of one name",
            "agent_class: RouterAgent\nname: team\nstart: dev\nsub_agents:\n  - config_path: dev.yaml\n    gates:\n      - {name: g, python: m.f}\n  - config_path: tea.yaml\n    gates:\n      - {name: g, python: m.g}\n".to_owned(),
        ),
        (
            "negative retry wait",
            "agent_class: RouterAgent\nname: team\nstart: dev\nsub_agents:\n  - config_path: dev.yaml\n    retry: {attempts: 2, initial: -1}\n  - config_path: tea.yaml\n".to_owned(),
        ),
        (
            "unknown retry key",
            "agent_class: RouterAgent\nname: team\nstart: dev\nsub_agents:\n  - config_path: dev.yaml\n    retry: {tries: 2}\n  - config_path: tea.yaml\n".to_owned(),
        ),
        ("no nodes", "agent_class: RouterAgent\nname: team\nstart: dev\nsub_agents: []\n".to_owned()),
    ];
    let mut report = String::new();
    for (case, root) in cases {
        let err = load_workflow_from(&nodes(&root), "team.yaml").unwrap_err();
        report.push_str(&format!("{case}:\n  {err}\n"));
    }
    insta::assert_snapshot!(report);
}

/// dev writes `v1`, `v2`, … (it sees its own earlier answers); tea rejects every version
/// before `approved_at`. With `max_exchanges: 3`, approving `v2` ends after 3 exchanges
/// (`dev, tea, dev, tea`) and the run completes; approving `v3` needs a 4th and escalates.
async fn dev_and_tea(approved_at: &str, mode: &str) -> engine::flow::RunReport {
    let server = mock(json!({
        "dev": {"replies": ["v1", "v2", "v3", "v4"]},
        "tea": {"rules": [
            {"system": format!("^Review {approved_at}\\.$"), "reply": "APPROVED"},
            {"reply": "REJECTED: quote every field"},
        ]},
    }))
    .await;
    let files = router_files(
        &format!(
            "mode: {mode}\nstart: dev\nmax_exchanges: 3\ntopic: {{state_key: story}}\nsuccessors:\n  dev: tea\n  tea:\n    - {{when: {{key: review, contains: REJECTED}}, to: dev}}\n    - to: END\n"
        ),
        &[
            (
                "dev",
                &format!("{}include_contents: default\n", llm("dev", "code")),
            ),
            (
                "tea",
                "name: tea\nmodel: tea\ninstruction: Review {code}.\noutput_key: review\n",
            ),
        ],
    );
    let endpoints = endpoints(&server, Provider::OpenAi, &["dev", "tea"]);
    let spec = load_workflow_from(&files, "team.yaml").unwrap();
    let root = register(Registry::new(endpoints.clone(), "dev"))
        .build(&spec)
        .unwrap();
    let (report, events) = run(root.as_ref(), &endpoints, "Export the table as CSV.").await;
    assert_eq!(
        report.outcome(),
        RunOutcome::Completed,
        "{:?}",
        report.result
    );
    assert_eq!(started(&events)[0], "team");
    server.shutdown().await;
    report
}

#[tokio::test]
async fn three_exchanges_of_llm_agents_are_not_circular_and_four_escalate() {
    let three = dev_and_tea("v2", "active").await;
    let state = &three.state;
    assert_eq!(state.get("circular_logic_detected"), Some(&json!(false)));
    assert_eq!(state.get("exchange_count"), Some(&json!(3)));
    assert_eq!(state.get("routing_decision"), Some(&json!("END")));
    assert_eq!(state.get("review"), Some(&json!("APPROVED")));
    // The LLM agents' replies are on record, by author.
    let authors: Vec<&str> = state
        .get("messages")
        .unwrap()
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["author"].as_str().unwrap())
        .collect();
    assert_eq!(authors, ["dev", "tea", "dev", "tea"]);
    assert_eq!(
        summaries(state),
        ["dev → tea", "tea → dev", "dev → tea", "tea → end"]
    );

    let four = dev_and_tea("v3", "active").await;
    let state = &four.state;
    assert_eq!(state.get("circular_logic_detected"), Some(&json!(true)));
    assert_eq!(state.get("escalation_triggered"), Some(&json!(true)));
    assert_eq!(state.get("exchange_count"), Some(&json!(4)));
    assert_eq!(state.get("routing_decision"), Some(&json!("ESCALATE")));
    assert_eq!(state.get("code"), Some(&json!("v3")), "tea never saw v3");
    let rationale = state.get("routing_rationale").unwrap().as_str().unwrap();
    assert!(
        rationale.starts_with("Circular logic: `dev` and `tea` exchanged work 4 times"),
        "{rationale}"
    );
}

#[tokio::test]
async fn a_passive_router_lets_successors_route_and_decides_only_on_trouble() {
    let calm = dev_and_tea("v2", "passive").await;
    assert_eq!(calm.state.get("review"), Some(&json!("APPROVED")));
    assert_eq!(calm.state.get("decisions"), None, "no decision was needed");
    assert_eq!(calm.state.get("routing_decision"), None);

    let circular = dev_and_tea("v3", "passive").await;
    assert_eq!(
        circular.state.get("circular_logic_detected"),
        Some(&json!(true))
    );
    assert_eq!(summaries(&circular.state), ["dev → escalate to a human"]);
}

#[tokio::test]
async fn an_agent_setting_the_escalation_flag_stops_for_a_human() {
    let server = mock(json!({
        "analyst": {"replies": ["Which database do we target?"]},
        "dev": {"replies": ["never asked"]},
    }))
    .await;
    let files = router_files(
        "start: analyst\nsuccessors:\n  analyst: dev\n",
        &[
            ("analyst", &llm("analyst", "escalate_to_human")),
            ("dev", &llm("dev", "code")),
        ],
    );
    let endpoints = endpoints(&server, Provider::Anthropic, &["analyst", "dev"]);
    let spec = load_workflow_from(&files, "team.yaml").unwrap();
    let root = register(Registry::new(endpoints.clone(), "dev"))
        .build(&spec)
        .unwrap();
    let (report, events) = run(root.as_ref(), &endpoints, "Plan the export.").await;
    assert_eq!(started(&events), ["team", "analyst"]);
    assert_eq!(report.state.get("escalation_triggered"), Some(&json!(true)));
    assert_eq!(
        report.state.get("circular_logic_detected"),
        Some(&json!(false))
    );
    assert_eq!(
        report.state.get("routing_rationale"),
        Some(&json!(
            "`analyst` asked for a human: Which database do we target?"
        ))
    );
    assert_eq!(report.state.get("code"), None);
    server.shutdown().await;
}

#[tokio::test]
async fn a_blocked_gate_sends_the_work_to_its_recovery_node() {
    let server = mock(json!({
        // The writer sees its earlier answer, so its second draft follows the fix.
        "writer": {"replies": ["code", "code and tests"]},
        "fixer": {"replies": ["Add the tests."]},
    }))
    .await;
    let files = router_files(
        "start: writer\nsuccessors:\n  writer: END\n  fixer: writer\nrecovery:\n  has_tests: fixer\n",
        &[
            ("writer", &format!("{}include_contents: default\n", llm("writer", "draft"))),
            ("fixer", &llm("fixer", "advice")),
        ],
    )
    .with(
        "team.yaml",
        "agent_class: RouterAgent
name: team
start: writer
sub_agents:
  - config_path: writer.yaml
    gates:
      - {name: has_tests, when: {key: draft, contains: tests}}
      - {name: short, blocking: false, when: {key: draft, lt: 0}}
  - config_path: fixer.yaml
successors:
  writer: END
  fixer: writer
recovery:
  has_tests: fixer
",
    );
    let endpoints = endpoints(&server, Provider::OpenAi, &["writer", "fixer"]);
    let spec = load_workflow_from(&files, "team.yaml").unwrap();
    let root = register(Registry::new(endpoints.clone(), "writer"))
        .build(&spec)
        .unwrap();
    let (report, events) = run(root.as_ref(), &endpoints, "Write the exporter.").await;
    assert_eq!(started(&events), ["team", "writer", "fixer", "writer"]);
    let state = &report.state;
    assert_eq!(
        summaries(state),
        ["writer → fixer", "fixer → writer", "writer → end"]
    );
    let decisions = state.get("decisions").unwrap().as_array().unwrap();
    assert!(
        decisions[0]["rationale"]
            .as_str()
            .unwrap()
            .starts_with("Gate `has_tests` is blocked"),
        "{decisions:?}"
    );
    assert_eq!(decisions[0]["related_artifacts"], json!(["has_tests"]));
    // Cleared by a delete, not set to `null`.
    assert_eq!(state.get("gate_blocked"), None);
    assert_eq!(state.get("draft"), Some(&json!("code and tests")));
    // The advisory gate failed both times and only left a warning.
    assert_eq!(
        state.get("gate_warnings").unwrap()[0]["gate"],
        json!("short")
    );
    server.shutdown().await;
}

/// An LLM router: a classifier's `output_key`, tested by a graph's conditional edges (the
/// shared condition language: `contains`, `in`).
#[tokio::test]
async fn an_llm_router_is_an_output_key_followed_by_conditional_edges() {
    let files = EmbeddedFiles::new()
        .with(
            "desk.yaml",
            "agent_class: GraphAgent
name: desk
start: classify
edges:
  - {from: classify, to: billing, when: {key: route, contains: billing}}
  - {from: classify, to: tech, when: {key: route, in: [tech, technical]}}
  - {from: classify, to: human}
  - {from: billing, to: END}
  - {from: tech, to: END}
sub_agents:
  - config_path: classify.yaml
  - config_path: billing.yaml
  - config_path: tech.yaml
  - config_path: human.yaml
",
        )
        .with(
            "classify.yaml",
            "name: classify\nmodel: classify\ninstruction: Answer billing, tech or other.\noutput_key: route\n",
        )
        .with("billing.yaml", "name: billing\nmodel: desk\noutput_key: answer\n")
        .with("tech.yaml", "name: tech\nmodel: desk\noutput_key: answer\n")
        .with("human.yaml", "name: human\nmodel: desk\noutput_key: answer\n");
    let server = mock(json!({
        "classify": {"rules": [
            {"last_user": "invoice", "reply": "This is about billing."},
            {"last_user": "crash", "reply": "tech"},
            {"reply": "other"},
        ]},
        "desk": {"replies": ["handled"]},
    }))
    .await;
    let endpoints = endpoints(&server, Provider::OpenAi, &["classify", "desk"]);
    let spec = load_workflow_from(&files, "desk.yaml").unwrap();
    let root = Registry::new(endpoints.clone(), "desk")
        .build(&spec)
        .unwrap();
    for (input, expected) in [
        ("My invoice is wrong.", "billing"),
        ("The app crashes.", "tech"),
        ("Hello!", "human"),
    ] {
        let (report, events) = run(root.as_ref(), &endpoints, input).await;
        assert_eq!(started(&events), ["desk", "classify", expected], "{input}");
        // Outside a router, LLM agents leave `messages` alone.
        assert_eq!(report.state.get("messages"), None);
    }
    server.shutdown().await;
}

/// A node's `retry` from its file: a model that keeps failing is tried `attempts` times (no
/// wait with `initial: 0`), then the failure flag makes the router escalate.
#[tokio::test]
async fn a_node_that_keeps_failing_is_retried_as_its_file_says_then_escalates() {
    use bridge::mock::{FaultKind, FaultRule, Faults, MockConfig, MockServer, Script};
    let script =
        Script::from_json_value(json!({"models": {"tea": {"replies": ["never"]}}})).unwrap();
    let server = MockServer::start(MockConfig {
        script,
        faults: Faults {
            rules: vec![FaultRule {
                last_user: None,
                model: Some("^dev$".into()),
                fault: FaultKind::ServerError,
                times: None,
            }],
            ..Faults::none()
        },
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let files = EmbeddedFiles::new()
        .with(
            "team.yaml",
            "agent_class: RouterAgent
name: team
start: dev
sub_agents:
  - config_path: dev.yaml
    retry: {attempts: 2, initial: 0, max: 0}
  - config_path: tea.yaml
successors:
  dev: tea
",
        )
        .with("dev.yaml", llm("dev", "code"))
        .with("tea.yaml", llm("tea", "review"));
    let endpoints = endpoints(&server, Provider::OpenAi, &["dev", "tea"]);
    let spec = load_workflow_from(&files, "team.yaml").unwrap();
    let root = register(Registry::new(endpoints.clone(), "dev"))
        .build(&spec)
        .unwrap();
    let (report, events) = run(root.as_ref(), &endpoints, "Build it.").await;
    assert_eq!(started(&events), ["team", "dev"]);
    let state = &report.state;
    assert_eq!(state.get("agent_failure").unwrap()["attempts"], json!(2));
    assert_eq!(state.get("escalation_triggered"), Some(&json!(true)));
    let rationale = state.get("routing_rationale").unwrap().as_str().unwrap();
    assert!(
        rationale.starts_with("`dev` failed for good"),
        "{rationale}"
    );
    let calls: Vec<String> = server
        .log()
        .entries()
        .into_iter()
        .map(|r| r.model)
        .collect();
    assert_eq!(calls, ["dev", "dev"]);
    server.shutdown().await;
}

/// A node set up wrong (its instruction names a state key nobody set) fails for good at once:
/// no retry, no wait, no model call; the failure flag makes the router escalate.
#[tokio::test]
async fn a_template_error_is_not_retried_and_escalates_at_once() {
    use bridge::mock::{MockConfig, MockServer};
    let server = MockServer::start(MockConfig::default()).await.unwrap();
    let files = EmbeddedFiles::new()
        .with(
            "team.yaml",
            "agent_class: RouterAgent
name: team
start: dev
sub_agents:
  - config_path: dev.yaml
  - config_path: tea.yaml
successors:
  dev: tea
",
        )
        .with(
            "dev.yaml",
            "name: dev\nmodel: dev\ninstruction: Build {plan}\noutput_key: code\n",
        )
        .with("tea.yaml", llm("tea", "review"));
    let endpoints = endpoints(&server, Provider::OpenAi, &["dev", "tea"]);
    let spec = load_workflow_from(&files, "team.yaml").unwrap();
    let root = register(Registry::new(endpoints.clone(), "dev"))
        .build(&spec)
        .unwrap();
    let (report, events) = run(root.as_ref(), &endpoints, "Build it.").await;
    assert_eq!(started(&events), ["team", "dev"]);
    let state = &report.state;
    let failure = state.get("agent_failure").unwrap();
    assert_eq!(failure["attempts"], json!(1));
    assert!(
        failure["error"].as_str().unwrap().contains("`plan`"),
        "{failure}"
    );
    assert_eq!(state.get("escalation_triggered"), Some(&json!(true)));
    assert!(server.log().entries().is_empty());
    server.shutdown().await;
}
