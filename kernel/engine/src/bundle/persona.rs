//! Personas for workflow agents: a workflow's LLM agent plays an agent of a bundle.
//!
//! A [`PersonaBundle`] is where personas come from: a BMAD 6.0 bundle folder (persona `NAME`
//! is its `agents/NAME.md`), a folder of skills (its `NAME/SKILL.md`, e.g. `.claude/skills`)
//! or a project (the skill `NAME` of its skill folders, e.g. `bmad-agent-pm`); or one agent
//! file or one skill folder, which then plays every persona a workflow names (so any
//! installed agent can stand in). [`PersonaBundle::start`] starts the agent the usual way
//! ([`StartedAgent::start`]: only its start-up files are read) and gives a [`PersonaAgent`]:
//! the persona text that goes before the workflow agent's instruction (who it is, its
//! bundle's workflows or its menu's skills, its persistent facts, the values its start-up
//! files set), and the tools it may name (`load_workflow_file`, `read_file`,
//! `execute_workflow`, `save_output`, and `load_skill` when it has skills).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::error::{BundleError, PathError};
use super::prompt::persona_prompt;
use super::skill::{SKILL_FILE, is_skill_dir, project_skill_folders, skill_dirs};
use super::skill_tools::LoadSkill;
use super::started::{StartOptions, StartedAgent};
use super::tools::{LoadWorkflowFile, file_tools};
use crate::tool::Tool;

/// The tools a persona agent may name under `tools`.
pub(crate) const PERSONA_TOOLS: [&str; 5] = [
    "load_workflow_file",
    "read_file",
    "execute_workflow",
    "save_output",
    "load_skill",
];

/// Where a workflow's personas come from; see the module docs.
#[derive(Debug, Clone)]
pub struct PersonaBundle {
    path: PathBuf,
    options: StartOptions,
}

impl PersonaBundle {
    /// Personas from `path` (a bundle, skills or project folder, one agent file or one skill
    /// folder), started with `options`.
    pub fn new(path: impl Into<PathBuf>, options: StartOptions) -> Self {
        Self {
            path: path.into(),
            options,
        }
    }

    /// The folder or agent file.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The agent file or skill folder that plays persona `name`.
    pub(crate) fn agent_path(&self, name: &str) -> Result<PathBuf, BundleError> {
        if self.path.is_file() || is_skill_dir(&self.path) {
            return Ok(self.path.clone());
        }
        let plain = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            && !name.starts_with('.');
        if plain {
            let file = self.path.join("agents").join(format!("{name}.md"));
            if file.is_file() {
                return Ok(file);
            }
            let skill = std::iter::once(self.path.clone())
                .chain(project_skill_folders(&self.path))
                .map(|folder| folder.join(name))
                .find(|dir| dir.join(SKILL_FILE).is_file());
            if let Some(skill) = skill {
                return Ok(skill);
            }
        }
        if !self.path.is_dir() {
            return Err(PathError::NotFound {
                path: self.path.clone(),
            }
            .into());
        }
        Err(BundleError::NoPersona {
            name: name.to_owned(),
            bundle: self.path.clone(),
            available: self.agents(),
        })
    }

    /// Starts the agent that plays persona `name`.
    pub fn start(&self, name: &str) -> Result<PersonaAgent, BundleError> {
        let started = StartedAgent::start(&self.agent_path(name)?, &self.options)?;
        Ok(PersonaAgent { started })
    }

    /// The names of the agents and skills the folder holds, sorted.
    fn agents(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.path.join("agents"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|entry| {
                let name = entry.file_name().to_string_lossy().into_owned();
                name.strip_suffix(".md").map(str::to_owned)
            })
            .collect();
        let folders = std::iter::once(self.path.clone()).chain(project_skill_folders(&self.path));
        names.extend(
            folders
                .flat_map(|folder| skill_dirs(&folder))
                .filter_map(|dir| Some(dir.file_name()?.to_string_lossy().into_owned())),
        );
        names.sort();
        names.dedup();
        names
    }
}

/// A started bundle agent, as a workflow agent plays it.
#[derive(Debug, Clone)]
pub struct PersonaAgent {
    /// The agent after start-up.
    pub(crate) started: StartedAgent,
}

impl PersonaAgent {
    /// The text that goes before the workflow agent's instruction: the persona, its
    /// bundle's workflows and the session's values (those of the start-up files too). The
    /// start-up steps and menu rules are left out: they are about chatting with a user
    /// (greet, show the menu, wait), which a workflow agent does not do.
    pub fn preamble(&self) -> String {
        let session = &self.started.session;
        persona_prompt(
            &self.started.definition,
            session.variables(),
            &session.roots().bundle,
            &self.started.facts,
        )
    }

    /// The bundle tool called `name` (one of `load_workflow_file`, `read_file`,
    /// `execute_workflow`, `save_output`, `load_skill`), if it is one.
    pub fn tool(&self, name: &str) -> Option<Result<Arc<dyn Tool>, BundleError>> {
        let session = &self.started.session;
        match name {
            "load_workflow_file" => Some(
                LoadWorkflowFile::new(Arc::clone(session))
                    .map(|tool| Arc::new(tool) as Arc<dyn Tool>)
                    .map_err(BundleError::from),
            ),
            "load_skill" if !session.skills().is_empty() => {
                Some(Ok(Arc::new(LoadSkill::new(Arc::clone(session)))))
            }
            _ => file_tools(session)
                .into_iter()
                .find(|tool| tool.name() == name)
                .map(Ok),
        }
    }
}
