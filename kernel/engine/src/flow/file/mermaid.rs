//! The agent tree (and graph edges) as Mermaid flowchart text, for `rlm flow graph`.
//!
//! Composite agents are subgraphs: a sequence chains its sub-agents, a loop adds a dotted
//! "next iteration" edge from its last sub-agent to its first, a parallel group fans out
//! from its name, and a graph draws its declared edges (labelled with their tests).

use std::fmt::Write;

use super::load::AgentSpec;
use super::spec::{AgentConfig, END, StateTest};

/// The Mermaid `flowchart` text of the workflow rooted at `root`.
pub fn render_mermaid(root: &AgentSpec) -> String {
    let mut out = String::from("flowchart TD\n");
    render(root, "", 1, &mut out);
    out
}

fn id(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_owned()
    } else {
        format!("{prefix}__{name}")
    }
}

fn label(spec: &AgentSpec) -> String {
    let class = spec.config.class().as_str();
    let extra = match &spec.config {
        AgentConfig::Loop(c) => format!(", max {}", c.max_iterations),
        AgentConfig::Llm(c) => {
            let persona = c.persona.as_ref().map(|p| format!(" as persona {p}"));
            let output = c.output_key.as_ref().map(|k| format!(" → {k}"));
            persona.unwrap_or_default() + &output.unwrap_or_default()
        }
        AgentConfig::Rlm(c) => c
            .output_key
            .as_ref()
            .map(|k| format!(" → {k}"))
            .unwrap_or_default(),
        _ => String::new(),
    };
    // Mermaid labels are quoted; a quote inside one is written as an entity.
    format!("{}<br/>{class}{extra}", spec.config.name()).replace('"', "#quot;")
}

fn test_label(test: &StateTest) -> String {
    let text = match (&test.equals, test.exists) {
        (Some(value), _) => format!("{} == {value}", test.key),
        (None, Some(true)) => format!("{} set", test.key),
        (None, _) => format!("{} unset", test.key),
    };
    text.replace('"', "#quot;")
}

fn render(spec: &AgentSpec, prefix: &str, depth: usize, out: &mut String) {
    let pad = "  ".repeat(depth);
    let me = id(prefix, spec.config.name());
    if spec.sub_agents.is_empty() {
        let _ = writeln!(out, "{pad}{me}[\"{}\"]", label(spec));
        return;
    }
    let _ = writeln!(out, "{pad}subgraph {me}[\"{}\"]", label(spec));
    let _ = writeln!(out, "{pad}  direction TB");
    for sub in &spec.sub_agents {
        render(sub, &me, depth + 1, out);
    }
    let child = |name: &str| id(&me, name);
    let names: Vec<&str> = spec.sub_agents.iter().map(|s| s.config.name()).collect();
    match &spec.config {
        AgentConfig::Sequential(_) | AgentConfig::Loop(_) => {
            for pair in names.windows(2) {
                let _ = writeln!(out, "{pad}  {} --> {}", child(pair[0]), child(pair[1]));
            }
            if let (AgentConfig::Loop(_), Some(first), Some(last)) =
                (&spec.config, names.first(), names.last())
            {
                let _ = writeln!(
                    out,
                    "{pad}  {} -. next iteration .-> {}",
                    child(last),
                    child(first)
                );
            }
        }
        AgentConfig::Parallel(_) => {
            let fan = format!("{me}__fork");
            let _ = writeln!(out, "{pad}  {fan}((\" \"))");
            for name in &names {
                let _ = writeln!(out, "{pad}  {fan} --> {}", child(name));
            }
        }
        AgentConfig::Graph(graph) => {
            let end = format!("{me}__end");
            let _ = writeln!(
                out,
                "{pad}  {me}__start((start)) --> {}",
                child(&graph.start)
            );
            let mut ends = false;
            for edge in &graph.edges {
                let to = if edge.to == END {
                    ends = true;
                    end.clone()
                } else {
                    child(&edge.to)
                };
                match &edge.when {
                    Some(test) => {
                        let _ = writeln!(
                            out,
                            "{pad}  {} -- \"{}\" --> {to}",
                            child(&edge.from),
                            test_label(test)
                        );
                    }
                    None => {
                        let _ = writeln!(out, "{pad}  {} --> {to}", child(&edge.from));
                    }
                }
            }
            if ends {
                let _ = writeln!(out, "{pad}  {end}((end))");
            }
        }
        AgentConfig::Llm(_) | AgentConfig::Rlm(_) | AgentConfig::Python(_) => {}
    }
    let _ = writeln!(out, "{pad}end");
}
