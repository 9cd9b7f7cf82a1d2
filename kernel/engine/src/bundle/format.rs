//! What a path given as an agent is, before anything is read: a BMAD 6.0 agent file, a skill
//! (its folder, its `SKILL.md`, or its name), or something `rlm agent` cannot play — then
//! an error that says what was found and what to pass instead: a bundle or skills folder
//! lists its agents or skills, a BMAD agent source (`*.agent.yaml`) says the installer
//! compiles it, a workflow says which agent runs it, a BMAD v4 agent or install (YAML in
//! markdown under `.bmad-core/`) says to install BMAD 6.

use std::path::{Path, PathBuf};

use super::error::{BundleError, PathError, list_names};
use super::render::WORKFLOW_FILE;
use super::skill::{SKILL_FILE, is_skill_dir, project_skill_folders, skill_dirs};
use super::started::StartOptions;

/// What an agent path names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AgentSource {
    /// A markdown file meant to hold an `<agent>` XML block (BMAD 6.0).
    AgentFile(PathBuf),
    /// A skill folder (canonical).
    Skill(PathBuf),
}

/// What `path` names; see the module docs. A path that does not exist is looked up as a
/// skill's name in the `--skills` folders and the project's skill folders.
pub(crate) fn identify(path: &Path, options: &StartOptions) -> Result<AgentSource, BundleError> {
    let unsupported = |found: String, hint: String| BundleError::Unsupported {
        path: path.to_owned(),
        found,
        hint,
    };
    if !path.exists() {
        return by_name(path, options);
    }
    if path.is_dir() {
        if is_skill_dir(path) {
            return canonical_skill(path);
        }
        // `.bmad-core` itself, or a project with only a v4 install.
        if path.join("core-config.yaml").is_file()
            || (path.join(".bmad-core").is_dir() && !path.join("_bmad").is_dir())
        {
            return Err(unsupported(
                "a BMAD v4 install (`.bmad-core`)".to_owned(),
                V4_HINT.to_owned(),
            ));
        }
        let agents = agent_files(&path.join("agents"));
        if !agents.is_empty() {
            return Err(unsupported(
                "an agent bundle folder (BMAD 6.0)".to_owned(),
                format!("pass one of its agent files: {}", list_names(&agents)),
            ));
        }
        let skills = names(&skill_dirs(path));
        if !skills.is_empty() {
            return Err(unsupported(
                format!("a folder of {} skills", skills.len()),
                format!(
                    "pass one of them (`{}/NAME`), or its name: {}",
                    path.display(),
                    list_names(&skills)
                ),
            ));
        }
        let installed: Vec<String> = project_skill_folders(path)
            .iter()
            .flat_map(|folder| names(&skill_dirs(folder)))
            .collect();
        if !installed.is_empty() || path.join("_bmad").is_dir() {
            return Err(unsupported(
                "a project folder".to_owned(),
                format!(
                    "name one of its agents or skills (`rlm agent NAME` run in the project, or \
                     its folder): {}",
                    list_names(&installed)
                ),
            ));
        }
        return Err(unsupported(
            format!("a folder without a `{SKILL_FILE}`"),
            "pass a skill folder (one holding `SKILL.md`: BMAD 6.1 and later, or any Agent \
             Skill) or a BMAD 6.0 agent file (`agents/NAME.md`)"
                .to_owned(),
        ));
    }
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let parent = path.parent().unwrap_or(Path::new("."));
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    if name == SKILL_FILE
        || ((name == "customize.toml" || name == WORKFLOW_FILE) && is_skill_dir(parent))
    {
        return canonical_skill(parent);
    }
    if name.ends_with(".agent.yaml") {
        return Err(unsupported(
            "a BMAD agent source (`*.agent.yaml`), which BMAD's installer compiles".to_owned(),
            "install BMAD in the project and pass the installed agent: its skill folder (6.1 \
             and later, e.g. `.claude/skills/bmad-agent-pm`) or `_bmad/MODULE/agents/NAME.md` \
             (6.0)"
                .to_owned(),
        ));
    }
    if name == "workflow.yaml" || name == "workflow.yml" {
        return Err(unsupported(
            "a BMAD 6.0 workflow".to_owned(),
            "start the agent whose menu runs it (`agents/NAME.md`) and pick its command".to_owned(),
        ));
    }
    let markdown = Path::new(&name)
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("md"));
    if !markdown {
        return Err(unsupported(
            format!(
                "a `{}` file",
                Path::new(&name)
                    .extension()
                    .map_or_else(|| name.clone(), |e| format!(".{}", e.to_string_lossy()))
            ),
            "pass a skill folder (one holding `SKILL.md`) or a BMAD 6.0 agent file \
             (`agents/NAME.md`)"
                .to_owned(),
        ));
    }
    Ok(AgentSource::AgentFile(path.to_owned()))
}

/// What to do with a BMAD v4 agent or install, which `rlm agent` does not play.
const V4_HINT: &str = "`rlm agent` plays BMAD 6.0 and later: install BMAD 6 in the project \
                       (`npx bmad-method install`) and pass its agent skill (e.g. \
                       `.claude/skills/bmad-agent-pm`) or its name";

/// Whether `text` is a BMAD v4 agent: markdown holding a ```` ```yaml ```` block with
/// top-level `agent:` and `persona:` (as `.bmad-core/agents/pm.md` does).
fn is_v4_agent(text: &str) -> bool {
    let Some((_, fenced)) = text.split_once("```yaml") else {
        return false;
    };
    let block = fenced.split("```").next().unwrap_or_default();
    let top = |key: &str| block.lines().any(|line| line.trim_end() == key);
    top("agent:") && top("persona:")
}

/// The error for a markdown file with no `<agent>` block that is recognisably something
/// else (a BMAD v4 agent, a skill's instructions under another name); `None` when it is not.
pub(crate) fn without_agent_block(path: &Path, text: &str) -> Option<BundleError> {
    if is_v4_agent(text) {
        return Some(BundleError::Unsupported {
            path: path.to_owned(),
            found: "a BMAD v4 agent (a YAML block in markdown, as in `.bmad-core/agents/`)"
                .to_owned(),
            hint: V4_HINT.to_owned(),
        });
    }
    let front = text.strip_prefix("---")?;
    let end = front.find("\n---")?;
    let fields = &front[..end];
    let has = |key: &str| fields.lines().any(|l| l.starts_with(&format!("{key}:")));
    (has("name") && has("description")).then(|| BundleError::Unsupported {
        path: path.to_owned(),
        found: "a markdown file with skill front matter (`name`, `description`) and no \
                `<agent>` block"
            .to_owned(),
        hint: format!(
            "a skill is a folder whose instructions are in `{SKILL_FILE}`: pass that folder"
        ),
    })
}

fn canonical_skill(dir: &Path) -> Result<AgentSource, BundleError> {
    let dir = std::fs::canonicalize(dir).map_err(|e| PathError::io(dir, &e))?;
    Ok(AgentSource::Skill(dir))
}

/// The skill named `path` (a plain name) in the skill folders, or an error listing them.
fn by_name(path: &Path, options: &StartOptions) -> Result<AgentSource, BundleError> {
    let text = path.display().to_string();
    let plain = !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && !text.starts_with('.');
    if !plain {
        return Err(PathError::NotFound {
            path: path.to_owned(),
        }
        .into());
    }
    let project = match &options.project_root {
        Some(root) => root.clone(),
        None => options.working_dir()?,
    };
    let mut folders = options.skill_folders.clone();
    folders.extend(project_skill_folders(&project));
    let mut available = Vec::new();
    for folder in &folders {
        for dir in skill_dirs(folder) {
            if dir.file_name().is_some_and(|n| n.to_string_lossy() == text) {
                return canonical_skill(&dir);
            }
            available.extend(names(std::slice::from_ref(&dir)));
        }
    }
    available.sort();
    available.dedup();
    Err(BundleError::Unsupported {
        path: path.to_owned(),
        found: "neither a file nor the name of a skill of the project".to_owned(),
        hint: if available.is_empty() {
            format!(
                "no skills were found in `{}` (in `.agents/skills/`, `.claude/skills/` or \
                 another tool's skills folder) or in `--skills` folders; pass an agent file or \
                 a skill folder",
                project.display()
            )
        } else {
            format!("the skills are: {}", list_names(&available))
        },
    })
}

/// The `.md` files of the folder `agents` (names without `.md`), sorted.
fn agent_files(agents: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(agents)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            name.ends_with(".md").then(|| format!("agents/{name}"))
        })
        .collect();
    names.sort();
    names
}

/// The folder names of `dirs`.
fn names(dirs: &[PathBuf]) -> Vec<String> {
    dirs.iter()
        .filter_map(|d| Some(d.file_name()?.to_string_lossy().into_owned()))
        .collect()
}
