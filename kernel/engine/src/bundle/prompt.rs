//! The texts an agent's model and its user see: the system prompt (persona, the rule that
//! loading means calling a tool, the commands, how to run a workflow), the start-up message,
//! the message a picked command sends, and the menu. The wording lives in `prompts/agent/`,
//! compiled in; `{{name}}` placeholders are filled in one pass (unknown ones stay, so the
//! prompts can mention template placeholders such as `{{story_key}}`).

use std::path::{Path, PathBuf};

use super::agent::{AgentDefinition, HandlerKind};
use super::vars::Variables;

const SYSTEM: &str = include_str!("../../../../prompts/agent/system.md");
const STARTUP: &str = include_str!("../../../../prompts/agent/startup.md");
const COMMAND: &str = include_str!("../../../../prompts/agent/command.md");
const MENU: &str = include_str!("../../../../prompts/agent/menu.md");
const PERSONA: &str = include_str!("../../../../prompts/agent/persona.md");

/// A file loaded at start-up and the variables it set.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LoadedFile {
    /// Its canonical path.
    pub path: PathBuf,
    /// The variables it defined, in file order (a YAML file).
    pub variables: Vec<String>,
    /// Its text, shown to the model (any other file).
    #[serde(skip)]
    pub content: Option<String>,
}

/// The system prompt of `agent`, whose documents go to `output_folder`.
pub fn system_prompt(agent: &AgentDefinition, vars: &Variables, output_folder: &str) -> String {
    let mut prompts = String::new();
    if !agent.prompts.is_empty() {
        prompts.push_str("\n# Prompts\n");
        for (id, text) in &agent.prompts {
            prompts.push_str(&format!("\n## #{id}\n\n{}\n", vars.resolve_lenient(text)));
        }
    }
    let mut rules = String::new();
    if !agent.rules.is_empty() {
        rules.push_str("\n# Rules of this agent\n\n");
        for rule in &agent.rules {
            rules.push_str(&format!("- {}\n", vars.resolve_lenient(rule)));
        }
    }
    let commands = command_list(agent);
    fill_persona(
        SYSTEM,
        agent,
        &[
            ("output_folder", output_folder),
            ("commands", &commands),
            ("prompts", &prompts),
            ("rules", &rules),
        ],
    )
}

/// `, Title` (nothing when the agent has no title).
fn title_suffix(agent: &AgentDefinition) -> String {
    if agent.title.is_empty() {
        String::new()
    } else {
        format!(", {}", agent.title)
    }
}

/// `template` filled with `agent`'s name, title and persona, then `more`.
fn fill_persona(template: &str, agent: &AgentDefinition, more: &[(&str, &str)]) -> String {
    let title = title_suffix(agent);
    let persona = &agent.persona;
    let own = [
        ("name", agent.name.clone()),
        ("title", title),
        ("role", one_line(&persona.role)),
        ("identity", one_line(&persona.identity)),
        (
            "communication_style",
            one_line(&persona.communication_style),
        ),
        ("principles", one_line(&persona.principles)),
    ];
    let mut values: Vec<(&str, &str)> = own.iter().map(|(k, v)| (*k, v.as_str())).collect();
    values.extend_from_slice(more);
    fill(template, &values)
}

/// The persona of `agent` as a workflow agent plays it: who it is, its bundle's workflows
/// (paths relative to `bundle_root`) and the session's values. Placed before the workflow
/// agent's own instruction.
pub fn persona_prompt(agent: &AgentDefinition, vars: &Variables, bundle_root: &Path) -> String {
    let root = bundle_root.display().to_string();
    let workflows: Vec<String> = agent
        .commands
        .iter()
        .flat_map(|command| {
            command
                .handlers
                .iter()
                .filter(|(kind, _)| *kind == HandlerKind::Workflow)
                .map(move |(_, path)| (command, path))
        })
        .map(|(command, path)| {
            let path = vars.resolve_lenient(path);
            let shown = path
                .strip_prefix(&root)
                .map_or(path.as_str(), |rest| rest.trim_start_matches('/'));
            format!(
                "- `{shown}`: {} (`*{}`)",
                one_line(&command.description),
                command.trigger
            )
        })
        .collect();
    let workflows = if workflows.is_empty() {
        "(This bundle names no workflows.)".to_owned()
    } else {
        workflows.join("\n")
    };
    fill_persona(
        PERSONA,
        agent,
        &[
            ("bundle_root", &root),
            ("workflows", &workflows),
            ("variables", &session_values(vars)),
        ],
    )
    .trim_end()
    .to_owned()
}

/// The start-up message: what was loaded, the session's values, and the agent's start-up
/// steps with their values filled in.
pub fn startup_message(agent: &AgentDefinition, vars: &Variables, loaded: &[LoadedFile]) -> String {
    let loaded = if loaded.is_empty() {
        "No files were loaded at start-up.".to_owned()
    } else {
        loaded
            .iter()
            .map(|file| {
                if let Some(content) = &file.content {
                    return format!(
                        "Loaded `{}` at start-up:\n\n{}",
                        file.path.display(),
                        content.trim_end()
                    );
                }
                let names: Vec<String> = file
                    .variables
                    .iter()
                    .map(|v| format!("`{{{v}}}`"))
                    .collect();
                format!(
                    "Loaded `{}` at start-up; it set {}.",
                    file.path.display(),
                    if names.is_empty() {
                        "nothing".to_owned()
                    } else {
                        names.join(", ")
                    }
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    let variables = session_values(vars);
    let steps = agent
        .startup_steps()
        .iter()
        .map(|step| {
            format!(
                "{}. {}",
                step.label,
                indent(&vars.resolve_lenient(&step.text))
            )
        })
        .collect::<Vec<_>>()
        .join("\n");
    fill(
        STARTUP,
        &[
            ("loaded", &loaded),
            ("variables", &variables),
            ("steps", &steps),
        ],
    )
    .trim_end()
    .to_owned()
}

/// The message that runs command `index` of `agent` (as the user's turn).
pub fn command_message(agent: &AgentDefinition, index: usize, vars: &Variables) -> Option<String> {
    let command = agent.commands.get(index)?;
    let handlers = if command.handlers.is_empty() {
        "It has no handlers.".to_owned()
    } else {
        let lines: Vec<String> = command
            .handlers
            .iter()
            .map(|(kind, value)| {
                format!("- `{}`: `{}`", kind.as_str(), vars.resolve_lenient(value))
            })
            .collect();
        format!("Its handlers:\n{}", lines.join("\n"))
    };
    Some(
        fill(
            COMMAND,
            &[
                ("number", &(index + 1).to_string()),
                ("trigger", &command.trigger),
                ("description", &command.description),
                ("handlers", &handlers),
            ],
        )
        .trim_end()
        .to_owned(),
    )
}

/// The menu shown as the agent starts: who it is and its numbered commands.
pub fn menu(agent: &AgentDefinition) -> String {
    let icon = agent
        .icon
        .as_ref()
        .map(|i| format!("{i} "))
        .unwrap_or_default();
    let title = title_suffix(agent);
    fill(
        MENU,
        &[
            ("icon", &icon),
            ("name", &agent.name),
            ("title", &title),
            ("commands", &command_list(agent)),
        ],
    )
    .trim_end()
    .to_owned()
}

fn command_list(agent: &AgentDefinition) -> String {
    if agent.commands.is_empty() {
        return "(This agent has no commands.)".to_owned();
    }
    agent
        .commands
        .iter()
        .enumerate()
        .map(|(i, c)| format!("{}. *{}: {}", i + 1, c.trigger, one_line(&c.description)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// One `- `{name}`: value` line per variable.
fn session_values(vars: &Variables) -> String {
    vars.names()
        .into_iter()
        // The alias spells the same value again.
        .filter(|name| name != "project_root")
        .filter_map(|name| Some(format!("- `{{{name}}}`: {}", vars.value(&name)?.ok()?)))
        .collect::<Vec<_>>()
        .join("\n")
}

fn one_line(text: &str) -> String {
    text.lines().map(str::trim).collect::<Vec<_>>().join(" ")
}

/// Continuation lines of a numbered item, indented under it.
fn indent(text: &str) -> String {
    text.lines().collect::<Vec<_>>().join("\n   ")
}

/// `template` with each `{{key}}` of `values` replaced, in one pass.
fn fill(template: &str, values: &[(&str, &str)]) -> String {
    let mut out = String::with_capacity(template.len() * 2);
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let known = after.find("}}").and_then(|end| {
            let key = &after[..end];
            values
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| (v, end))
        });
        match known {
            Some((value, end)) => {
                out.push_str(value);
                rest = &after[end + 2..];
            }
            None => {
                out.push_str("{{");
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_replaces_known_placeholders_once_and_keeps_the_rest() {
        assert_eq!(
            fill(
                "{{a}} {{b}} {{story_key}} {{",
                &[("a", "{{b}}"), ("b", "2")]
            ),
            "{{b}} 2 {{story_key}} {{"
        );
    }
}
