//! The texts an agent's model and its user see: the system prompt (persona, the rule that
//! loading means calling a tool, the commands, how to run a workflow, the catalog of skills),
//! the start-up message, the message a picked command sends, and the menu — for a BMAD 6.0
//! agent file, for a BMAD 6.1+ agent skill (its instructions, and a start-up message saying
//! which activation steps rlm ran and with what result), and for any other skill played as
//! an agent. The wording lives in `prompts/agent/`, compiled in; `{{name}}` placeholders are
//! filled in one pass (unknown ones stay, so the prompts can mention template placeholders
//! such as `{{story_key}}`).

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::activate::Activation;
use super::agent::{AgentDefinition, AgentFormat, HandlerKind};
use super::facts::{Fact, facts_text};
use super::skill::SkillSet;
use super::vars::Variables;

const SYSTEM: &str = include_str!("../../../../prompts/agent/system.md");
const STARTUP: &str = include_str!("../../../../prompts/agent/startup.md");
const COMMAND: &str = include_str!("../../../../prompts/agent/command.md");
const MENU: &str = include_str!("../../../../prompts/agent/menu.md");
const PERSONA: &str = include_str!("../../../../prompts/agent/persona.md");
const PERSONA_SKILL: &str = include_str!("../../../../prompts/agent/persona-skill.md");
const SKILLS: &str = include_str!("../../../../prompts/agent/skills.md");
const SKILL_AGENT: &str = include_str!("../../../../prompts/agent/skill-agent.md");
const SKILL_AGENT_STARTUP: &str = include_str!("../../../../prompts/agent/skill-agent-startup.md");
const SKILL_PLAY: &str = include_str!("../../../../prompts/agent/skill-play.md");
const SKILL_PLAY_STARTUP: &str = include_str!("../../../../prompts/agent/skill-play-startup.md");

/// A file loaded at start-up and the variables it set.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LoadedFile {
    /// Its canonical path.
    pub path: PathBuf,
    /// The variables it defined, in file order (a YAML file).
    pub(crate) variables: Vec<String>,
    /// Its text, shown to the model (any other file).
    #[serde(skip)]
    pub(crate) content: Option<String>,
}

/// The system prompt of `agent`, whose documents go to `output_folder`, with `skills` to
/// load.
pub(crate) fn system_prompt(
    agent: &AgentDefinition,
    vars: &Variables,
    output_folder: &str,
    skills: &SkillSet,
) -> String {
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
            ("skills", &skills_section(skills)),
        ],
    )
}

/// The catalog of `skills` (names and descriptions) with how to use them; empty when there
/// are none.
pub(crate) fn skills_section(skills: &SkillSet) -> String {
    if skills.is_empty() {
        return String::new();
    }
    let catalog = skills
        .iter()
        .map(|skill| format!("- `{}`: {}", skill.name, one_line(&skill.description)))
        .collect::<Vec<_>>()
        .join("\n");
    fill(SKILLS, &[("catalog", &catalog)])
}

/// The system prompt of a BMAD agent skill: its persona, its instructions (`SKILL.md`), its
/// commands and the skills it may load.
pub(crate) fn skill_agent_prompt(
    agent: &AgentDefinition,
    activation: &Activation,
    output_folder: &str,
    skills: &SkillSet,
) -> String {
    let principles = bullets(agent.persona.principles.lines());
    fill_persona(
        SKILL_AGENT,
        agent,
        &[
            ("principles", &principles),
            ("output_folder", output_folder),
            ("skill_file", &activation.skill.file.display().to_string()),
            ("instructions", &activation.instructions),
            ("commands", &command_list(agent)),
            ("skills", &skills_section(skills)),
        ],
    )
    .trim_end()
    .to_owned()
}

/// The start-up message of a BMAD agent skill: the activation steps rlm ran (the resolved
/// `agent` block, the persistent facts, the config files and values) and what is left.
pub(crate) fn skill_agent_startup(
    activation: &Activation,
    block: &serde_json::Map<String, Value>,
    configs: &[std::path::PathBuf],
    vars: &Variables,
) -> String {
    let listed = |paths: &[std::path::PathBuf]| {
        if paths.is_empty() {
            "no file (none was found)".to_owned()
        } else {
            paths
                .iter()
                .map(|p| format!("`{}`", p.display()))
                .collect::<Vec<_>>()
                .join(", ")
        }
    };
    let layers = activation
        .customization
        .as_ref()
        .map(|c| listed(&c.files))
        .unwrap_or_default();
    let steps = |key: &str| {
        let items: Vec<String> = block
            .get(key)
            .and_then(Value::as_array)
            .map(|items| {
                items
                    .iter()
                    .enumerate()
                    .map(|(i, step)| {
                        let text = step
                            .as_str()
                            .map_or_else(|| step.to_string(), str::to_owned);
                        format!("{}. {}", i + 1, indent(&vars.resolve_lenient(&text)))
                    })
                    .collect()
            })
            .unwrap_or_default();
        if items.is_empty() {
            "(none)".to_owned()
        } else {
            items.join("\n")
        }
    };
    let json = serde_json::to_string_pretty(block).unwrap_or_default();
    fill(
        SKILL_AGENT_STARTUP,
        &[
            ("skill_file", &activation.skill.file.display().to_string()),
            ("layers", &layers),
            ("configs", &listed(configs)),
            ("prepend", &steps("activation_steps_prepend")),
            ("append", &steps("activation_steps_append")),
            ("block", &json),
            ("facts", &facts_text(&activation.facts)),
            ("variables", &session_values(vars)),
        ],
    )
    .trim_end()
    .to_owned()
}

/// The system prompt of a skill played as an agent (a skill without an `[agent]` block).
pub(crate) fn skill_play_prompt(
    activation: &Activation,
    output_folder: &str,
    skills: &SkillSet,
) -> String {
    fill(
        SKILL_PLAY,
        &[
            ("name", &activation.skill.name),
            ("description", &one_line(&activation.skill.description)),
            ("skill_dir", &activation.skill.dir.display().to_string()),
            ("skill_file", &activation.skill.file.display().to_string()),
            ("output_folder", output_folder),
            ("instructions", &activation.instructions),
            ("skills", &skills_section(skills)),
        ],
    )
    .trim_end()
    .to_owned()
}

/// The start-up message of a skill played as an agent: what rlm resolved and loaded for it.
pub(crate) fn skill_play_startup(activation: &Activation, vars: &Variables) -> String {
    let mut sections = String::new();
    if let Some(layers) = &activation.customization {
        let json = serde_json::to_string_pretty(&layers.merged).unwrap_or_default();
        sections.push_str(&format!("\n## Customization\n\n```json\n{json}\n```\n"));
    }
    if !activation.facts.is_empty() {
        sections.push_str(&format!(
            "\n## Persistent facts\n\n{}\n",
            facts_text(&activation.facts)
        ));
    }
    if let Some((path, content)) = &activation.workflow {
        sections.push_str(&format!(
            "\n## Workflow (`{}`)\n\n{}\n",
            path.display(),
            content.trim_end()
        ));
    }
    if !activation.resources.is_empty() {
        sections.push_str(&format!(
            "\n## Other files of the skill\n\n{}\n",
            bullets(activation.resources.iter().map(|r| format!("`{r}`")))
        ));
    }
    fill(
        SKILL_PLAY_STARTUP,
        &[
            ("note", &activation.note()),
            ("sections", &sections),
            ("variables", &session_values(vars)),
        ],
    )
    .trim_end()
    .to_owned()
}

/// `- item` lines, indented under a list item (`  - `), or `  (none)`.
fn bullets<I, S>(items: I) -> String
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let lines: Vec<String> = items
        .into_iter()
        .map(|item| item.as_ref().trim().to_owned())
        .filter(|item| !item.is_empty())
        .map(|item| format!("  - {item}"))
        .collect();
    if lines.is_empty() {
        "  (none)".to_owned()
    } else {
        lines.join("\n")
    }
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
    // `more` first: it may give a field its own shape (principles as a list).
    let mut values: Vec<(&str, &str)> = more.to_vec();
    values.extend(own.iter().map(|(k, v)| (*k, v.as_str())));
    fill(template, &values)
}

/// The persona of `agent` as a workflow agent plays it: who it is, its bundle's workflows
/// (paths relative to `bundle_root`) or, for a skill, the skills and prompts of its menu and
/// its persistent `facts`, and the session's values. Placed before the workflow agent's own
/// instruction.
pub(crate) fn persona_prompt(
    agent: &AgentDefinition,
    vars: &Variables,
    bundle_root: &Path,
    facts: &[Fact],
) -> String {
    if agent.format == AgentFormat::Skill {
        let items: Vec<String> = agent
            .commands
            .iter()
            .map(|command| {
                let runs = match (
                    command.handler(HandlerKind::Skill),
                    command.handler(HandlerKind::Action),
                ) {
                    (Some(skill), _) => format!("the skill `{skill}`"),
                    (None, Some(prompt)) => {
                        format!("the prompt \"{}\"", one_line(&vars.resolve_lenient(prompt)))
                    }
                    (None, None) => "nothing".to_owned(),
                };
                format!(
                    "- `*{}`: {} (runs {runs})",
                    command.trigger,
                    one_line(&command.description)
                )
            })
            .collect();
        let items = if items.is_empty() {
            "(This agent's menu is empty.)".to_owned()
        } else {
            items.join("\n")
        };
        return fill_persona(
            PERSONA_SKILL,
            agent,
            &[
                ("principles", &bullets(agent.persona.principles.lines())),
                ("workflows", &items),
                ("facts", &facts_text(facts)),
                ("variables", &session_values(vars)),
            ],
        )
        .trim_end()
        .to_owned();
    }
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
pub(crate) fn startup_message(
    agent: &AgentDefinition,
    vars: &Variables,
    loaded: &[LoadedFile],
) -> String {
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
pub(crate) fn command_message(
    agent: &AgentDefinition,
    index: usize,
    vars: &Variables,
) -> Option<String> {
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
pub(crate) fn menu(agent: &AgentDefinition) -> String {
    let icon = agent
        .icon
        .as_ref()
        .map(|i| format!("{i} "))
        .unwrap_or_default();
    let title = title_suffix(agent);
    if agent.commands.is_empty() {
        return format!("{icon}{}{title}\n\nType a message to start.", agent.name);
    }
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
