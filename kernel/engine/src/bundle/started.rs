//! An agent after start-up, whatever form it came in: its definition, the session its tools
//! share, what start-up loaded, and its opening messages; plus what both ways of starting
//! share (the options, the working directory, the output folder).
//!
//! [`StartedAgent::start`] (in `startup`) reads the agent and hands it to the start-up of its
//! form: a BMAD 6.0 agent file (`startup`) or a skill (`skill_agent`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bridge::Message;

use super::agent::{AgentDefinition, AgentFormat, HandlerKind};
use super::error::{BundleError, PathError, list_names};
use super::facts::Fact;
use super::prompt::{self, LoadedFile};
use super::sandbox::{FileLog, SandboxPolicy, locate};
use super::session::BundleSession;
use super::skill_tools::skill_tools;
use super::tools::{ReadFile, SaveOutput, file_tools};
use super::vars::Variables;
use crate::tool::Tool;

/// How to start an agent.
#[derive(Debug, Clone, Default)]
pub struct StartOptions {
    /// `{project-root}`; by default the working directory, or the nearest folder inside it
    /// above the agent in which the first `{project-root}/…` file of its start-up steps
    /// exists (for a skill: the nearest that holds `_bmad/`).
    pub project_root: Option<PathBuf>,
    /// The user's working directory (default: the current directory); a project root found
    /// from the start-up files is never above it.
    pub working_dir: Option<PathBuf>,
    /// What the tools may do beyond the default (broad roots, hard-linked files).
    pub policy: SandboxPolicy,
    /// The size limit of a file read or written (default
    /// [`DEFAULT_MAX_FILE_BYTES`](super::sandbox::DEFAULT_MAX_FILE_BYTES)).
    pub max_file_bytes: Option<u64>,
    /// `{date}` (default: today, UTC).
    pub date: Option<String>,
    /// The log to record file accesses in (default: a new one); agents that call each other
    /// share one.
    pub file_log: Option<FileLog>,
    /// Folders of skills the user names (`--skills DIR`): each a skill folder or a folder of
    /// skills, searched before the project's own skill folders and readable by the tools.
    pub skill_folders: Vec<PathBuf>,
}

impl StartOptions {
    /// The working directory, canonical.
    pub(crate) fn working_dir(&self) -> Result<PathBuf, PathError> {
        let here = match &self.working_dir {
            Some(dir) => dir.clone(),
            None => std::env::current_dir().map_err(|e| PathError::io(Path::new("."), &e))?,
        };
        std::fs::canonicalize(&here).map_err(|e| PathError::io(&here, &e))
    }

    /// The `--skills` folders, canonical; one that does not exist is an error.
    pub(crate) fn skill_folders(&self) -> Result<Vec<PathBuf>, PathError> {
        self.skill_folders
            .iter()
            .map(|folder| std::fs::canonicalize(folder).map_err(|e| PathError::io(folder, &e)))
            .collect()
    }
}

/// An agent after start-up, ready for its first message.
#[derive(Debug, Clone)]
pub struct StartedAgent {
    /// Who it is: parsed from its agent file, or from its skill and customization.
    pub definition: AgentDefinition,
    /// What its tools share.
    pub session: Arc<BundleSession>,
    /// The files its start-up loaded.
    pub loaded: Vec<LoadedFile>,
    /// The system prompt: persona, tool rules, commands, how to run workflows, the skills.
    pub system_prompt: String,
    /// The start-up message: what was loaded and what is left to do, values filled in.
    pub startup_message: String,
    /// The persistent facts its start-up loaded (a BMAD agent skill's `persistent_facts`).
    pub(crate) facts: Vec<Fact>,
}

impl StartedAgent {
    /// The conversation's opening messages: the system prompt and the start-up message.
    pub fn messages(&self) -> Vec<Message> {
        vec![
            Message::system(self.system_prompt.clone()),
            Message::system(self.startup_message.clone()),
        ]
    }

    /// Its tools: for a BMAD 6.0 agent the file tools (`read_file`, `execute_workflow`,
    /// `save_output`), for a skill `read_file` and `save_output`; then, when there are
    /// skills, `load_skill` and `run_skill_script` (which refuses: no Python tool given).
    pub fn tools(&self) -> Vec<Arc<dyn Tool>> {
        self.tools_with_python(None)
    }

    /// [`tools`](Self::tools), skill scripts running through `python` (the `python` tool the
    /// user allowed) when given.
    pub fn tools_with_python(&self, python: Option<Arc<dyn Tool>>) -> Vec<Arc<dyn Tool>> {
        let session = &self.session;
        let mut tools: Vec<Arc<dyn Tool>> = match self.definition.format {
            AgentFormat::AgentXml => file_tools(session),
            AgentFormat::Skill => vec![
                Arc::new(ReadFile::new(Arc::clone(session))),
                Arc::new(SaveOutput::new(Arc::clone(session))),
            ],
        };
        tools.extend(skill_tools(session, python));
        tools
    }

    /// What the user should hear of before the first message: the skills discovery left
    /// out or found twice, and menu items that run a skill that is not installed (a typo in
    /// an override, a skill removed), which the model could not load.
    pub fn warnings(&self) -> Vec<String> {
        let skills = self.session.skills();
        let mut warnings: Vec<String> = skills.notes().iter().map(ToString::to_string).collect();
        for command in &self.definition.commands {
            if let Some(skill) = command.handler(HandlerKind::Skill)
                && skills.get(skill).is_none()
            {
                warnings.push(format!(
                    "The menu item `{}` runs the skill `{skill}`, which is not installed, so \
                     the model cannot load it: correct its `skill` (in the agent's \
                     `customize.toml` or its override in `_bmad/custom/`) or install the \
                     skill. The skills are: {}",
                    command.trigger,
                    list_names(&skills.names())
                ));
            }
        }
        warnings
    }

    /// The menu shown as the agent starts.
    pub fn menu(&self) -> String {
        prompt::menu(&self.definition)
    }

    /// The user message for `input` when it picks a command (`*name` or a menu number; for
    /// a skill's menu also its bare code, `PRD`, as BMAD's menus show them).
    pub fn command_message(&self, input: &str) -> Option<String> {
        let input = input.trim();
        let bare_code = self.definition.format == AgentFormat::Skill
            && !input.is_empty()
            && !input.contains(char::is_whitespace);
        let (index, _) = if input.starts_with('*') || bare_code {
            self.definition.find_command(input)?
        } else {
            self.definition
                .find_command(input)
                .filter(|_| input.parse::<usize>().is_ok())?
        };
        prompt::command_message(&self.definition, index, self.session.variables())
    }
}

/// `{output_folder}` made absolute (a bare relative folder is under the project root) and
/// stored back; the project root when the config has none. A folder outside the project is
/// refused: a bundle may narrow where the tools write, not widen it.
pub(crate) fn output_folder(
    vars: &mut Variables,
    project: &Path,
    loaded: &[LoadedFile],
) -> Result<String, BundleError> {
    let Some(folder) = vars.value("output_folder") else {
        return Ok(project.display().to_string());
    };
    let folder = folder?;
    let absolute = if Path::new(&folder).is_absolute() {
        PathBuf::from(&folder)
    } else {
        project.join(&folder)
    };
    // Compared on the canonical form, so that `..` or a link cannot lead out.
    if !locate(&absolute)?.starts_with(project) {
        let file = loaded
            .iter()
            .rev()
            .find(|f| f.variables.iter().any(|v| v == "output_folder"))
            .map_or_else(|| "The bundle".to_owned(), |f| f.path.display().to_string());
        return Err(BundleError::WidensRoot {
            file,
            key: "output_folder".to_owned(),
            value: folder,
            project: project.to_owned(),
        });
    }
    let folder = absolute.display().to_string();
    vars.set("output_folder", folder.clone());
    Ok(folder)
}

/// The folders at or above `folder` that may become the project root by themselves (found
/// from what the agent names, not given by the user), nearest first: for an agent inside the
/// working directory `here`, none above `here`; for one elsewhere, none as broad as `/` or
/// the home directory (or a folder holding it).
pub(crate) fn project_candidates<'a>(
    folder: &'a Path,
    here: &'a Path,
) -> impl Iterator<Item = &'a Path> + 'a {
    let home = std::env::var_os("HOME").and_then(|h| std::fs::canonicalize(h).ok());
    let inside = folder.starts_with(here);
    folder.ancestors().filter(move |a| {
        if inside {
            a.starts_with(here)
        } else {
            a.parent().is_some() && !home.as_deref().is_some_and(|h| h.starts_with(a))
        }
    })
}
