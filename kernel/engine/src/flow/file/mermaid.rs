//! The agent tree (and graph edges) as Mermaid flowchart text, for `rlm flow graph`.
//!
//! Composite agents are subgraphs: a sequence chains its sub-agents, a loop adds a dotted
//! "next iteration" edge from its last sub-agent to its first, a parallel group fans out
//! from its name, a graph draws its declared edges (labelled with their tests), and a router
//! its natural successors plus a dotted edge from each gate's node to the gate's recovery
//! node.

use std::fmt::Write;

use super::load::AgentSpec;
use super::spec::{AgentConfig, END, RoutingMode, SuccessorConfig};
use crate::condition::Condition;

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
        AgentConfig::Router(c) => match c.mode {
            RoutingMode::Active => ", active".to_owned(),
            RoutingMode::Passive => ", passive".to_owned(),
        },
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

fn test_label(test: &Condition) -> String {
    let json = |v: &serde_json::Value| v.to_string();
    let mut parts: Vec<String> = Vec::new();
    let key = test.key.as_deref().unwrap_or("?");
    let mut part = |what: String| parts.push(format!("{key} {what}"));
    if let Some(v) = &test.equals {
        part(format!("== {}", json(v)));
    }
    if let Some(v) = &test.not_equals {
        part(format!("!= {}", json(v)));
    }
    if let Some(e) = test.exists {
        part(if e { "set" } else { "unset" }.to_owned());
    }
    if let Some(t) = test.truthy {
        part(if t { "truthy" } else { "falsy" }.to_owned());
    }
    if let Some(v) = &test.one_of {
        part(format!("in {}", json(&serde_json::Value::Array(v.clone()))));
    }
    if let Some(v) = &test.contains {
        part(format!("contains {}", json(v)));
    }
    for (op, bound) in [
        (">", test.gt),
        (">=", test.gte),
        ("<", test.lt),
        ("<=", test.lte),
    ] {
        if let Some(b) = bound {
            part(format!("{op} {b}"));
        }
    }
    if let Some(function) = &test.python {
        parts.push(format!("python {function}"));
    }
    if test.all.is_some() || test.any.is_some() || test.not.is_some() {
        let nested = Condition {
            all: test.all.clone(),
            any: test.any.clone(),
            not: test.not.clone(),
            ..Condition::default()
        };
        parts.push(serde_json::to_string(&nested).unwrap_or_default());
    }
    parts.join(" and ").replace('"', "#quot;")
}

/// One edge line, labelled with `when` if there is one.
fn edge(out: &mut String, pad: &str, from: &str, to: &str, when: Option<&Condition>) {
    let _ = match when {
        Some(test) => writeln!(out, "{pad}  {from} -- \"{}\" --> {to}", test_label(test)),
        None => writeln!(out, "{pad}  {from} --> {to}"),
    };
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
            for e in &graph.edges {
                let to = if e.to == END {
                    ends = true;
                    end.clone()
                } else {
                    child(&e.to)
                };
                edge(out, &pad, &child(&e.from), &to, e.when.as_ref());
            }
            if ends {
                let _ = writeln!(out, "{pad}  {end}((end))");
            }
        }
        AgentConfig::Router(router) => {
            let end = format!("{me}__end");
            let _ = writeln!(
                out,
                "{pad}  {me}__start((start)) --> {}",
                child(&router.start)
            );
            let mut ends = false;
            let mut to = |name: &str| {
                if name == END {
                    ends = true;
                    end.clone()
                } else {
                    child(name)
                }
            };
            for (from, next) in &router.successors {
                match next {
                    SuccessorConfig::Node(name) => edge(out, &pad, &child(from), &to(name), None),
                    SuccessorConfig::Branches(branches) => {
                        for b in branches {
                            edge(out, &pad, &child(from), &to(&b.to), b.when.as_ref());
                        }
                    }
                }
            }
            for (node, sub) in router.sub_agents.iter().zip(&spec.sub_agents) {
                for gate in &node.gates {
                    if let Some(recovery) = router.recovery.get(&gate.name) {
                        let _ = writeln!(
                            out,
                            "{pad}  {} -. \"gate {} blocked\" .-> {}",
                            child(sub.config.name()),
                            gate.name.replace('"', "#quot;"),
                            child(recovery)
                        );
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
