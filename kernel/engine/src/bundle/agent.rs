//! Agent definitions: who an agent is (name, title, icon, persona), its start-up steps and the
//! commands of its menu, whatever file it came from. BMAD 6.0 agent files — a markdown file
//! holding one `<agent>` XML block (usually in a ```` ```xml ```` fence) — parse here; agents
//! that are skills (BMAD 6.1 and later: `SKILL.md` and `customize.toml`) are read by
//! `skill_agent`, their menu items running a skill or a prompt.
//!
//! Two forms load. The hand-written form has `<persona>`, a `<critical-actions>` list of
//! `<i>` start-up steps and a `<cmds>` list of `<c cmd="*name">` commands (an installer may
//! add a generic `<activation>` with `<init>` steps). The compiled form has a numbered
//! `<activation>` whose `<step>`s hold the start-up actions, `<rules>`, and a `<menu>` of
//! `<item cmd="XX or fuzzy match on name">[XX] description</item>`. Commands carry handler
//! attributes: `workflow` (or `run-workflow`), `validate-workflow`, `exec`, `tmpl`, `data`
//! and `action`.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::error::BundleError;
use super::xml::{self, Element};

/// The form an agent came in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AgentFormat {
    /// A markdown file with an `<agent>` XML block (BMAD 6.0, hand-written or compiled).
    AgentXml,
    /// An Agent Skill (`SKILL.md`): a BMAD 6.1+ agent (with an `[agent]` customization) or
    /// any skill, played as an agent.
    Skill,
}

/// A parsed agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AgentDefinition {
    /// The file it came from (its `SKILL.md` for a skill).
    pub path: PathBuf,
    /// The form it came in.
    pub format: AgentFormat,
    /// The `id` attribute, if any.
    pub(crate) id: Option<String>,
    /// The agent's name (`name` attribute).
    pub name: String,
    /// Its title.
    pub title: String,
    /// Its icon (an emoji), if any.
    pub icon: Option<String>,
    /// Who it is.
    pub persona: Persona,
    /// The steps of its `<activation>` block (empty when it has none).
    pub activation: Vec<Step>,
    /// Its `<critical-actions>` (empty in the compiled form, which folds them into the
    /// activation steps).
    pub critical_actions: Vec<Step>,
    /// Standing rules (`<rules>`).
    pub rules: Vec<String>,
    /// The commands the user can pick, in menu order.
    pub commands: Vec<AgentCommand>,
    /// `<prompt id="...">` texts that `action="#id"` commands refer to.
    pub(crate) prompts: Vec<(String, String)>,
}

/// The persona an agent plays.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Persona {
    /// Its role.
    pub role: String,
    /// Its background.
    pub identity: String,
    /// How it talks.
    pub(crate) communication_style: String,
    /// What it believes in.
    pub principles: String,
}

/// A start-up step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Step {
    /// Its number (`n` attribute) or position from 1.
    pub(crate) label: String,
    /// Its text, lines trimmed.
    pub text: String,
    /// The line of the file it starts on.
    pub line: usize,
}

/// What a command does when picked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum HandlerKind {
    /// Run the `workflow.yaml` at the path (`workflow` or `run-workflow`).
    Workflow,
    /// Check a document against a workflow's checklist.
    ValidateWorkflow,
    /// Load a file and carry out what it says.
    Exec,
    /// Load a template.
    Tmpl,
    /// Load a data file for the other handlers.
    Data,
    /// Carry out a text, or the `<prompt>` with the id after `#`.
    Action,
    /// Load the skill of this name and follow it (a BMAD 6.1+ menu item's `skill`).
    Skill,
}

impl HandlerKind {
    /// The attribute names, as written in agent files.
    const ATTRIBUTES: [(&'static str, HandlerKind); 7] = [
        ("workflow", HandlerKind::Workflow),
        ("run-workflow", HandlerKind::Workflow),
        ("validate-workflow", HandlerKind::ValidateWorkflow),
        ("exec", HandlerKind::Exec),
        ("tmpl", HandlerKind::Tmpl),
        ("data", HandlerKind::Data),
        ("action", HandlerKind::Action),
    ];

    /// The attribute name (`run-workflow` is written `workflow`).
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Workflow => "workflow",
            Self::ValidateWorkflow => "validate-workflow",
            Self::Exec => "exec",
            Self::Tmpl => "tmpl",
            Self::Data => "data",
            Self::Action => "action",
            Self::Skill => "skill",
        }
    }
}

/// One command of an agent's menu.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AgentCommand {
    /// What the user types after `*`: `design`, or `SP` for `SP or fuzzy match on …`.
    pub trigger: String,
    /// Other names it answers to (`sprint-planning`).
    pub aliases: Vec<String>,
    /// What it does.
    pub description: String,
    /// Its handlers and their values (paths or text), in attribute order.
    pub handlers: Vec<(HandlerKind, String)>,
    /// The line of the file it is on (0 for a menu item merged from customization files).
    pub line: usize,
}

impl AgentCommand {
    /// Whether `name` (without `*`) picks this command: its trigger or an alias, any case.
    pub(crate) fn answers_to(&self, name: &str) -> bool {
        let name = name.trim().trim_start_matches('*');
        self.trigger.eq_ignore_ascii_case(name)
            || self.aliases.iter().any(|a| a.eq_ignore_ascii_case(name))
    }

    /// The value of its first handler of `kind`.
    pub fn handler(&self, kind: HandlerKind) -> Option<&str> {
        self.handlers
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|(_, v)| v.as_str())
    }
}

impl AgentDefinition {
    /// Parses the agent file `text`, read from `path`.
    pub(crate) fn parse(path: &Path, text: &str) -> Result<Self, BundleError> {
        let malformed = |line: usize, problem: String| BundleError::Malformed {
            path: path.to_owned(),
            line,
            problem,
        };
        let (block, first_line) = agent_block(text).map_err(|(line, p)| malformed(line, p))?;
        let root = xml::parse(block, first_line).map_err(|e| malformed(e.line, e.message))?;
        if root.name != "agent" {
            return Err(malformed(
                root.line,
                format!("Expected an `<agent>` element, found `<{}>`", root.name),
            ));
        }
        let name = root
            .attribute("name")
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .ok_or_else(|| {
                malformed(
                    root.line,
                    "The `<agent>` element has no `name` attribute".to_owned(),
                )
            })?;
        let persona = root.child("persona").ok_or_else(|| {
            malformed(
                root.line,
                "The `<agent>` element has no `<persona>`; add one with `<role>`, `<identity>`, \
                 `<communication_style>` and `<principles>`"
                    .to_owned(),
            )
        })?;
        let field = |name: &str| persona.child(name).map(Element::text).unwrap_or_default();
        let persona = Persona {
            role: field("role"),
            identity: field("identity"),
            communication_style: field("communication_style"),
            principles: field("principles"),
        };
        let activation = root.child("activation");
        let activation_steps = activation
            .map(|a| match a.child("init") {
                Some(init) => steps(init, "step"),
                None => steps(a, "step"),
            })
            .unwrap_or_default();
        let rules = activation
            .and_then(|a| a.child("rules"))
            .map(|rules| {
                let items: Vec<String> = rules.children_named("r").map(Element::text).collect();
                if items.is_empty() {
                    rules.text().lines().map(str::to_owned).collect()
                } else {
                    items
                }
            })
            .unwrap_or_default();
        let critical_actions = root
            .child("critical-actions")
            .map(|c| steps(c, "i"))
            .unwrap_or_default();
        let mut commands = Vec::new();
        let items = root
            .child("cmds")
            .map(|c| c.children_named("c").collect::<Vec<_>>())
            .or_else(|| {
                root.child("menu")
                    .map(|m| m.children_named("item").collect())
            })
            .unwrap_or_default();
        for item in items {
            commands.push(command(item).map_err(|p| malformed(item.line, p))?);
        }
        let prompts = root
            .child("prompts")
            .map(|p| {
                p.children_named("prompt")
                    .filter_map(|p| Some((p.attribute("id")?.to_owned(), p.text())))
                    .collect()
            })
            .unwrap_or_default();
        Ok(Self {
            path: path.to_owned(),
            format: AgentFormat::AgentXml,
            id: root.attribute("id").map(str::to_owned),
            name: name.to_owned(),
            title: root
                .attribute("title")
                .unwrap_or_default()
                .trim()
                .to_owned(),
            icon: root.attribute("icon").map(str::to_owned),
            persona,
            activation: activation_steps,
            critical_actions,
            rules,
            commands,
            prompts,
        })
    }

    /// The steps that run at start-up: the critical actions when the agent has them (the
    /// hand-written form's activation is generic), else the activation steps.
    pub fn startup_steps(&self) -> &[Step] {
        if self.critical_actions.is_empty() {
            &self.activation
        } else {
            &self.critical_actions
        }
    }

    /// The command `input` picks: a menu number (from 1), or a trigger or alias with or
    /// without `*`.
    pub fn find_command(&self, input: &str) -> Option<(usize, &AgentCommand)> {
        let input = input.trim();
        if let Ok(n) = input.parse::<usize>() {
            return n
                .checked_sub(1)
                .and_then(|i| self.commands.get(i).map(|c| (i, c)));
        }
        self.commands
            .iter()
            .enumerate()
            .find(|(_, c)| c.answers_to(input))
    }
}

/// The `<agent>` XML of an agent file and the line it starts on: the ```` ```xml ```` fence
/// that holds `<agent`, else the text from the first `<agent` on.
fn agent_block(text: &str) -> Result<(&str, usize), (usize, String)> {
    let mut offset = 0;
    let mut fence: Option<(usize, usize)> = None; // (byte offset of content, its line)
    for (index, line) in text.split_inclusive('\n').enumerate() {
        let trimmed = line.trim();
        match fence {
            None if trimmed.starts_with("```xml") => fence = Some((offset + line.len(), index + 2)),
            Some((start, first_line)) if trimmed.starts_with("```") => {
                let block = &text[start..offset];
                if block.contains("<agent") {
                    return Ok((block, first_line));
                }
                fence = None;
            }
            _ => {}
        }
        offset += line.len();
    }
    if let Some((start, first_line)) = fence
        && text[start..].contains("<agent")
    {
        return Err((
            first_line - 1,
            "The ```xml block is never closed; end it with a line of ```".to_owned(),
        ));
    }
    let start = text.find("<agent").ok_or((
        1,
        "No `<agent>` element found; an agent file holds one `<agent>` XML block, usually \
         in a ```xml fence"
            .to_owned(),
    ))?;
    let end = text
        .rfind("</agent>")
        .map_or(text.len(), |end| end + "</agent>".len())
        .max(start);
    let first_line = 1 + text[..start].matches('\n').count();
    Ok((&text[start..end], first_line))
}

fn steps(parent: &Element, tag: &str) -> Vec<Step> {
    parent
        .children_named(tag)
        .enumerate()
        .map(|(i, step)| Step {
            label: step
                .attribute("n")
                .map_or_else(|| (i + 1).to_string(), str::to_owned),
            text: step.text(),
            line: step.line,
        })
        .collect()
}

fn command(item: &Element) -> Result<AgentCommand, String> {
    let cmd = item
        .attribute("cmd")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .ok_or_else(|| format!("The `<{}>` command has no `cmd` attribute", item.name))?;
    // `SP or fuzzy match on sprint-planning`, `DA or fuzzy match on exit, leave or dismiss`.
    let (trigger, aliases) = match cmd.split_once(" or fuzzy match on ") {
        Some((trigger, rest)) => (
            trigger,
            rest.split([','])
                .flat_map(|part| part.split(" or "))
                .map(str::trim)
                .filter(|a| !a.is_empty())
                .map(str::to_owned)
                .collect(),
        ),
        None => (cmd, Vec::new()),
    };
    let trigger = trigger.trim().trim_start_matches('*').to_owned();
    let text = item.text();
    // `[SP] Sprint Planning` shows the trigger again; the menu shows it once.
    let description = match text.strip_prefix('[').and_then(|t| t.split_once(']')) {
        Some((code, rest)) if code.eq_ignore_ascii_case(&trigger) => rest.trim().to_owned(),
        _ => text,
    };
    let mut handlers = Vec::new();
    for (key, value) in &item.attributes {
        if let Some((_, kind)) = HandlerKind::ATTRIBUTES.iter().find(|(name, _)| name == key) {
            handlers.push((*kind, value.clone()));
        }
    }
    Ok(AgentCommand {
        trigger,
        aliases,
        description,
        handlers,
        line: item.line,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<AgentDefinition, BundleError> {
        AgentDefinition::parse(Path::new("agents/x.md"), text)
    }

    const MINIMAL: &str = "# X\n\n```xml\n<agent name=\"Ada\" title=\"Analyst\">\n  <persona><role>R</role></persona>\n  <cmds><c cmd=\"*go\" run-workflow=\"{project-root}/w.yaml\" data=\"d.csv\">Go [fast]</c></cmds>\n</agent>\n```\n";

    #[test]
    fn a_minimal_agent_parses() {
        let agent = parse(MINIMAL).expect("succeeds");
        assert_eq!(agent.name, "Ada");
        assert_eq!(agent.persona.role, "R");
        let go = &agent.commands[0];
        assert_eq!(go.trigger, "go");
        assert_eq!(go.line, 6);
        assert_eq!(go.description, "Go [fast]");
        assert_eq!(
            go.handlers,
            [
                (HandlerKind::Workflow, "{project-root}/w.yaml".to_owned()),
                (HandlerKind::Data, "d.csv".to_owned())
            ]
        );
        assert_eq!(agent.find_command("1").map(|(i, _)| i), Some(0));
        assert_eq!(agent.find_command("*GO").map(|(i, _)| i), Some(0));
        assert!(agent.find_command("2").is_none() && agent.find_command("0").is_none());
    }

    #[test]
    fn malformed_agents_name_file_line_and_problem() {
        let cases = [
            (
                "no xml here",
                "`agents/x.md` line 1: No `<agent>` element found; an agent file holds one `<agent>` XML block, usually in a ```xml fence",
            ),
            (
                "```xml\n<agent name=\"A\">\n<persona>\n</agent>\n```\n",
                "`agents/x.md` line 4: The XML is malformed",
            ),
            (
                "text\n```xml\n<agent title=\"T\">\n<persona/>\n</agent>\n```\n",
                "`agents/x.md` line 3: The `<agent>` element has no `name` attribute",
            ),
            (
                "```xml\n<agent name=\"A\">\n</agent>\n```\n",
                "`agents/x.md` line 2: The `<agent>` element has no `<persona>`",
            ),
            (
                "```xml\n<agent name=\"A\"><persona/>\n<menu>\n<item>x</item>\n</menu></agent>\n```\n",
                "`agents/x.md` line 4: The `<item>` command has no `cmd` attribute",
            ),
            (
                "```xml\n<agent name=\"A\"><persona/>\n",
                "`agents/x.md` line 1: The ```xml block is never closed",
            ),
            (
                "```xml\n<bot name=\"A\"/>\n```\n```xml\n<agent name=\"A\" a=\"&nope;\"><persona/></agent>\n```\n",
                "`agents/x.md` line 5: A bad attribute value on `<agent>`",
            ),
        ];
        for (text, expected) in cases {
            let err = parse(text).expect_err("fails").to_string();
            assert!(
                err.starts_with(expected),
                "{text:?}\n  got: {err}\n want: {expected}"
            );
        }
    }
}
