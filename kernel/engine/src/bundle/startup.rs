//! Starting an agent: [`StartedAgent::start`] finds what the path names (`format`) and starts
//! it in its form — a skill in `skill_agent`, a BMAD 6.0 agent file here: read and parse it,
//! find its roots, load only the files its start-up steps name (a YAML file's values become
//! variables), list the skills of the project and of `--skills`, and write its system
//! messages.
//!
//! The roots are the user's: the project root is the one given, else the working directory
//! — or, narrower, the folder inside it above the agent where the start-up files are (a
//! bundle installed in a sub-folder); for an agent named outside the working directory, the
//! folder above it where they are, never `/` or the home directory. A bundle's text can narrow a root, never widen it: a
//! start-up step naming `{project-root}/etc/host.conf` cannot make `/` the project, and an
//! `output_folder` outside the project stops start-up with an error naming the file and the
//! value.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::agent::{AgentDefinition, Step};
use super::error::{BundleError, PathError};
use super::format::{AgentSource, identify};
use super::prompt::{self, LoadedFile};
use super::sandbox::{DEFAULT_MAX_FILE_BYTES, Sandbox, SandboxPolicy};
use super::session::{BundleSession, Roots};
use super::skill::{SkillSet, project_skill_folders};
use super::skill_agent;
use super::started::{StartOptions, StartedAgent, output_folder, project_candidates};
use super::vars::{today, variable_names};
use super::yaml;

/// The variables a path found in a start-up step may start with.
const ROOT_VARIABLES: [&str; 4] = ["project-root", "project_root", "bundle-root", "core-root"];

impl StartedAgent {
    /// Starts the agent at `agent`: a BMAD 6.0 agent file (`agents/NAME.md`), a skill
    /// folder (or its `SKILL.md`), or the name of a skill of the project or of the
    /// `--skills` folders. Anything else is an error saying what was found.
    pub fn start(agent: &Path, options: &StartOptions) -> Result<Self, BundleError> {
        match identify(agent, options)? {
            AgentSource::AgentFile(file) => start_agent_file(&file, options),
            AgentSource::Skill(dir) => skill_agent::start(&dir, options),
        }
    }
}

/// Starts the BMAD 6.0 agent in the file at `agent`.
fn start_agent_file(agent: &Path, options: &StartOptions) -> Result<StartedAgent, BundleError> {
    let max_bytes = options.max_file_bytes.unwrap_or(DEFAULT_MAX_FILE_BYTES);
    let log = options.file_log.clone().unwrap_or_default();
    let agent_path = std::fs::canonicalize(agent).map_err(|e| PathError::io(agent, &e))?;
    let folder = agent_path.parent().unwrap_or(&agent_path).to_owned();
    // The agent file itself is the user's choice, wherever it is.
    let reader = Sandbox::new(std::slice::from_ref(&folder), &folder, &folder)?
        .with_max_bytes(max_bytes)
        .with_policy(SandboxPolicy {
            allow_broad_roots: true,
            ..options.policy
        })
        .with_log(log.clone());
    let (_, text) = reader.read_text(&agent_path.display().to_string(), "agent")?;
    let definition = match AgentDefinition::parse(&agent_path, &text) {
        Err(error) if !text.contains("<agent") => {
            return Err(super::format::without_agent_block(&agent_path, &text).unwrap_or(error));
        }
        parsed => parsed?,
    };

    let project = match &options.project_root {
        Some(root) => std::fs::canonicalize(root).map_err(|e| PathError::io(root, &e))?,
        None => infer_project_root(&definition, &folder, &options.working_dir()?),
    };
    let roots = Roots::of_agent(&agent_path, &project);
    let mut vars = roots.variables(&options.date.clone().unwrap_or_else(today));
    let user_skills = options.skill_folders()?;
    let mut read_roots = vec![
        roots.bundle.clone(),
        roots.core.clone(),
        roots.project.clone(),
    ];
    read_roots.extend(user_skills.iter().cloned());
    let sandbox = Sandbox::new(&read_roots, &project, &project)?
        .with_max_bytes(max_bytes)
        .with_policy(options.policy)
        .with_log(log);

    let mut loaded = Vec::new();
    let mut configs = Vec::new();
    for step in definition.startup_steps() {
        for reference in startup_files(step) {
            let optional = is_optional(&step.text);
            let fail = |error: BundleError| BundleError::StartupFile {
                agent: agent_path.clone(),
                step: step.label.clone(),
                file: reference.clone(),
                error: Box::new(error),
            };
            let result = vars
                .resolve(&reference)
                .map_err(BundleError::from)
                .and_then(|path| Ok(sandbox.read_text(&path, "start-up")?));
            let (path, text) = match result {
                Ok(read) => read,
                Err(_) if optional => continue,
                Err(e) => return Err(fail(e)),
            };
            let mut file = LoadedFile {
                path: path.clone(),
                variables: Vec::new(),
                content: None,
            };
            if is_yaml(&path) {
                let entries = yaml::parse_mapping(&path, &text).map_err(fail)?;
                for (key, value) in &entries {
                    if let Some(value) = yaml::scalar_text(value)
                        && !roots_variable(key)
                    {
                        vars.set(key.clone(), value);
                        file.variables.push(key.clone());
                    }
                }
                configs.push((path, Arc::new(entries)));
            } else {
                file.content = Some(text);
            }
            loaded.push(file);
        }
    }

    let output_folder = output_folder(&mut vars, &project, &loaded)?;
    let sandbox = sandbox.with_write_root(Path::new(&output_folder))?;
    let startup_message = prompt::startup_message(&definition, &vars, &loaded);
    let mut folders = user_skills;
    folders.extend(project_skill_folders(&project));
    let skills = SkillSet::discover(&folders, &[], &sandbox, "skills");
    let system_prompt = prompt::system_prompt(&definition, &vars, &output_folder, &skills);
    let session = Arc::new(BundleSession::new(roots, vars, sandbox).with_skills(skills));
    for (path, entries) in configs {
        session.remember_config(path, entries);
    }
    Ok(StartedAgent {
        definition,
        session,
        loaded,
        system_prompt,
        startup_message,
        facts: Vec::new(),
    })
}

/// The files a start-up step loads: paths starting with a root variable, in a step that
/// says to load or read.
fn startup_files(step: &Step) -> Vec<String> {
    let lower = step.text.to_lowercase();
    if !(lower.contains("load") || lower.contains("read")) {
        return Vec::new();
    }
    step.text
        .split(|c: char| c.is_whitespace() || "\"'`(),;<>".contains(c))
        .map(|token| token.trim_end_matches(['.', ':', '!']))
        .filter(|token| {
            let starts_at_root = ROOT_VARIABLES
                .iter()
                .any(|root| token.starts_with(&format!("{{{root}}}/")));
            let has_extension = Path::new(token).extension().is_some_and(|e| !e.is_empty());
            starts_at_root && has_extension
        })
        .map(str::to_owned)
        .collect()
}

fn is_optional(text: &str) -> bool {
    let lower = text.to_lowercase();
    ["if exists", "if it exists", "if present"]
        .iter()
        .any(|p| lower.contains(p))
}

fn is_yaml(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("yaml") || e.eq_ignore_ascii_case("yml"))
}

fn roots_variable(name: &str) -> bool {
    ROOT_VARIABLES.contains(&name) || name == "date"
}

/// The nearest folder at or above `folder` in which the first `{project-root}/…` start-up
/// file exists (or, failing that, its folder); the working directory `here` when there is
/// none. Only folders the user's choices bound are candidates: for an agent inside the
/// working directory, none above it; for one elsewhere (named by its path), none as broad
/// as `/` or the home directory. A bundle thus never makes `/` the project.
fn infer_project_root(agent: &AgentDefinition, folder: &Path, here: &Path) -> PathBuf {
    let first = agent
        .startup_steps()
        .iter()
        .flat_map(startup_files)
        .find_map(|file| {
            let rest = file
                .strip_prefix("{project-root}/")
                .or_else(|| file.strip_prefix("{project_root}/"))?
                .to_owned();
            variable_names(&rest).is_empty().then_some(rest)
        });
    let Some(rest) = first else {
        return here.to_owned();
    };
    let candidates = || project_candidates(folder, here);
    // The file itself, else its folder (so that a missing file is reported where it belongs
    // rather than in the working directory).
    candidates()
        .find(|a| a.join(&rest).is_file())
        .or_else(|| {
            let parent = Path::new(&rest).parent()?.to_owned();
            let parent = Some(parent).filter(|p| !p.as_os_str().is_empty())?;
            candidates().find(|a| a.join(&parent).is_dir())
        })
        .unwrap_or(here)
        .to_owned()
}
