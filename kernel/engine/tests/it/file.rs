//! Workflow files: every class parses, unknown keys are refused, and every error names the
//! file, line and column and what was expected.

use engine::flow::file::{
    AgentConfig, ConfigErrorKind, EmbeddedFiles, IncludeContents, load_workflow_from,
    render_mermaid,
};
use serde_json::json;

fn tree() -> EmbeddedFiles {
    EmbeddedFiles::new()
        .with(
            "wf/root.yaml",
            "# The whole shape in one tree.
agent_class: SequentialAgent
name: root
description: Loads, refines, reviews.
sub_agents:
  - config_path: agents/loader.yaml
  - config_path: ./loops/refine.yaml
  - config_path: agents/fan.yaml
  - config_path: agents/route.yaml
",
        )
        .with(
            "wf/agents/loader.yaml",
            "agent_class: PythonAgent
name: loader
function: loaders.py:load
args: {limit: 3}
",
        )
        .with(
            "wf/loops/refine.yaml",
            "agent_class: LoopAgent
name: refine
max_iterations: 5
sub_agents:
  - config_path: ../agents/writer.yaml
  - config_path: ../agents/rlm.yaml
",
        )
        .with(
            "wf/agents/writer.yaml",
            "name: writer
model: root
instruction: |
  Improve {draft?} using {feedback?}.
tools:
  - name: exit_loop
  - name: search
    args: {top_k: 4}
output_key: draft
include_contents: none
generate_content_config:
  temperature: 0.2
  max_output_tokens: 400
before_model_callbacks:
  - name: guards.block_secrets
on_tool_error_callbacks:
  - name: guards.retry_note
    args: {tries: 2}
",
        )
        .with(
            "wf/agents/rlm.yaml",
            "agent_class: RlmAgent
name: analyst
instruction: Which regions grew in {period}?
output_key: findings
max_iterations: 8
",
        )
        .with(
            "wf/agents/fan.yaml",
            "agent_class: ParallelAgent
name: fan
on_branch_failure: continue
sub_agents:
  - config_path: a.yaml
  - config_path: b.yaml
",
        )
        .with("wf/agents/a.yaml", "name: a\ninstruction: A.\n")
        .with("wf/agents/b.yaml", "name: b\ninstruction: B.\n")
        .with(
            "wf/agents/route.yaml",
            "agent_class: GraphAgent
name: route
start: a
max_steps: 20
edges:
  - {from: a, to: b, when: {key: ready, equals: true}}
  - {from: a, to: a}
  - {from: b, to: END}
sub_agents:
  - config_path: a.yaml
  - config_path: b.yaml
",
        )
}

#[test]
fn every_class_parses_with_its_settings() {
    let spec = load_workflow_from(&tree(), "wf/root.yaml").expect("valid files");
    let names: Vec<(&str, &str)> = spec
        .walk()
        .iter()
        .map(|s| (s.config.name(), s.config.class().as_str()))
        .collect();
    assert_eq!(
        names,
        [
            ("root", "SequentialAgent"),
            ("loader", "PythonAgent"),
            ("refine", "LoopAgent"),
            ("writer", "LlmAgent"),
            ("analyst", "RlmAgent"),
            ("fan", "ParallelAgent"),
            ("a", "LlmAgent"),
            ("b", "LlmAgent"),
            ("route", "GraphAgent"),
            ("a", "LlmAgent"),
            ("b", "LlmAgent"),
        ]
    );
    let writer = &spec.sub_agents[1].sub_agents[0];
    assert_eq!(writer.file.to_str(), Some("wf/agents/writer.yaml"));
    let AgentConfig::Llm(llm) = &writer.config else {
        panic!("writer is an LlmAgent");
    };
    assert_eq!(llm.instruction, "Improve {draft?} using {feedback?}.\n");
    assert_eq!(llm.tools[1].args.get("top_k"), Some(&json!(4)));
    assert_eq!(llm.include_contents, IncludeContents::None);
    assert_eq!(llm.generate_content_config.sampling().max_tokens, Some(400));
    let callbacks: Vec<(&str, String)> = writer
        .config
        .callbacks()
        .all()
        .map(|(point, c)| (point, c.name.clone()))
        .collect();
    assert_eq!(
        callbacks,
        [
            ("before_model_callbacks", "guards.block_secrets".to_owned()),
            ("on_tool_error_callbacks", "guards.retry_note".to_owned()),
        ]
    );
    insta::assert_snapshot!(render_mermaid(&spec));
}

/// One bad file (plus the good ones it names) per case; every message in one snapshot.
#[test]
fn errors_name_file_line_column_and_what_is_expected() {
    let ok = "name: ok\n";
    let cases: Vec<(&str, Vec<(&str, &str)>)> = vec![
        (
            "unknown key",
            vec![("a.yaml", "name: a\nmodel: root\nmodle: root\n")],
        ),
        (
            "unknown key in a tool",
            vec![(
                "a.yaml",
                "name: a\ntools:\n  - name: search\n    arg: {k: 1}\n",
            )],
        ),
        (
            "loop without max_iterations",
            vec![
                (
                    "a.yaml",
                    "agent_class: LoopAgent\nname: a\nsub_agents:\n  - config_path: ok.yaml\n",
                ),
                ("ok.yaml", ok),
            ],
        ),
        (
            "zero iterations",
            vec![(
                "a.yaml",
                "agent_class: LoopAgent\nname: a\nmax_iterations: 0\nsub_agents: []\n",
            )],
        ),
        (
            "max_iterations on a sequence",
            vec![(
                "a.yaml",
                "agent_class: SequentialAgent\nname: a\nmax_iterations: 3\nsub_agents: []\n",
            )],
        ),
        (
            "unknown class",
            vec![("a.yaml", "agent_class: LopAgent\nname: a\n")],
        ),
        ("bad name", vec![("a.yaml", "name: my agent\n")]),
        (
            "bad include_contents",
            vec![("a.yaml", "name: a\ninclude_contents: all\n")],
        ),
        ("wrong type", vec![("a.yaml", "name: a\ntools: search\n")]),
        (
            "ADK code reference",
            vec![(
                "a.yaml",
                "agent_class: SequentialAgent\nname: a\nsub_agents:\n  - code: my.agents.x\n",
            )],
        ),
        (
            "missing sub-agent file",
            vec![
                (
                    "a.yaml",
                    "agent_class: SequentialAgent\nname: a\nsub_agents:\n  - config_path: ok.yaml\n  - config_path: gone.yaml\n",
                ),
                ("ok.yaml", ok),
            ],
        ),
        (
            "cycle",
            vec![
                (
                    "a.yaml",
                    "agent_class: SequentialAgent\nname: a\nsub_agents:\n  - config_path: b.yaml\n",
                ),
                (
                    "b.yaml",
                    "agent_class: LoopAgent\nname: b\nmax_iterations: 2\nsub_agents:\n  - config_path: a.yaml\n",
                ),
            ],
        ),
        (
            "duplicate names",
            vec![
                (
                    "a.yaml",
                    "agent_class: ParallelAgent\nname: a\nsub_agents:\n  - config_path: ok.yaml\n  - config_path: again.yaml\n",
                ),
                ("ok.yaml", ok),
                ("again.yaml", "# same name\nname: ok\n"),
            ],
        ),
        (
            "no sub-agents",
            vec![(
                "a.yaml",
                "agent_class: SequentialAgent\nname: a\nsub_agents: []\n",
            )],
        ),
        (
            "graph edge to an unknown node",
            vec![
                (
                    "a.yaml",
                    "agent_class: GraphAgent\nname: a\nstart: ok\nedges:\n  - from: ok\n    to: nowhere\nsub_agents:\n  - config_path: ok.yaml\n",
                ),
                ("ok.yaml", ok),
            ],
        ),
        (
            "graph test that tests nothing",
            vec![
                (
                    "a.yaml",
                    "agent_class: GraphAgent\nname: a\nstart: ok\nedges:\n  - from: ok\n    to: END\n    when:\n      key: done\nsub_agents:\n  - config_path: ok.yaml\n",
                ),
                ("ok.yaml", ok),
            ],
        ),
        (
            "YAML syntax",
            vec![("a.yaml", "name: a\ninstruction: [unclosed\n")],
        ),
        ("not a mapping", vec![("a.yaml", "- name: a\n")]),
        ("empty file", vec![("a.yaml", "")]),
    ];
    let mut report = String::new();
    for (what, files) in cases {
        let source = files
            .iter()
            .fold(EmbeddedFiles::new(), |acc, (path, text)| {
                acc.with(*path, *text)
            });
        let err = load_workflow_from(&source, "a.yaml").expect_err(what);
        report.push_str(&format!("{what} ({:?}):\n  {err}\n", err.kind));
    }
    insta::assert_snapshot!(report);
}

#[test]
fn a_missing_root_file_is_a_read_error() {
    let err = load_workflow_from(&EmbeddedFiles::new(), "nope.yaml").expect_err("missing");
    assert_eq!(err.kind, ConfigErrorKind::Read);
    assert_eq!((err.line, err.column), (1, 1));
}

/// An unknown key in a file of each class is refused at its line with that class's keys.
#[test]
fn every_class_refuses_an_unknown_key_at_its_line_with_its_own_keys() {
    let mut report = String::new();
    for class in [
        "LlmAgent",
        "LoopAgent",
        "SequentialAgent",
        "ParallelAgent",
        "GraphAgent",
        "RlmAgent",
        "PythonAgent",
        "RouterAgent",
    ] {
        let text = format!("agent_class: {class}\nname: a\n# a typo\ndescripton: x\n");
        let source = EmbeddedFiles::new().with("a.yaml", text.as_str());
        let err = load_workflow_from(&source, "a.yaml").expect_err(class);
        assert_eq!(err.kind, ConfigErrorKind::Schema, "{class}");
        assert_eq!((err.line, err.column), (4, 1), "{class}");
        report.push_str(&format!("{class}:\n  {err}\n"));
    }
    insta::assert_snapshot!(report);
}
