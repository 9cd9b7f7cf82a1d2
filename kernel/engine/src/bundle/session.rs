//! What the bundle tools of one agent share: its roots, its variables, its sandbox, the
//! config files loaded so far, and its skills — the catalog, the skills loaded (whose
//! folders a bare relative path is read from first, the last loaded first) and what
//! rendering their files needs (the central config and each skill's customization, read
//! once).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::customize::{Layers, load_central_config, load_customization};
use super::error::{BundleError, VariableError};
use super::render::{RenderValues, render};
use super::sandbox::{FileLog, Sandbox};
use super::skill::{SKILL_FILE, Skill, SkillSet};
use super::vars::Variables;
use super::yaml::{self, Entries};

/// The folders of an agent bundle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Roots {
    /// The user's project (`{project-root}`); relative paths start here.
    pub project: PathBuf,
    /// The agent's module: the folder above `agents/` (`{bundle-root}`).
    pub bundle: PathBuf,
    /// The shared `core` module beside it, or the bundle root (`{core-root}`).
    pub core: PathBuf,
}

impl Roots {
    /// The roots of the agent file at `agent` (canonical), in project `project`.
    pub(crate) fn of_agent(agent: &Path, project: &Path) -> Self {
        let folder = agent.parent().unwrap_or(agent);
        let bundle = if folder.file_name().is_some_and(|n| n == "agents") {
            folder.parent().unwrap_or(folder)
        } else {
            folder
        };
        let core = bundle
            .parent()
            .map(|install| install.join("core"))
            .filter(|core| core.is_dir())
            .unwrap_or_else(|| bundle.to_owned());
        Self {
            project: project.to_owned(),
            bundle: bundle.to_owned(),
            core,
        }
    }

    /// The variables every agent has: the roots (`{project_root}` too, a spelling some
    /// instructions use) and today's `{date}`.
    pub(crate) fn variables(&self, date: &str) -> Variables {
        let mut vars = Variables::new();
        let text = |p: &Path| p.display().to_string();
        vars.set("project-root", text(&self.project));
        vars.set("project_root", text(&self.project));
        vars.set("bundle-root", text(&self.bundle));
        vars.set("core-root", text(&self.core));
        vars.set("date", date);
        vars
    }
}

/// The shared state of one agent's bundle tools.
#[derive(Debug)]
pub struct BundleSession {
    roots: Roots,
    variables: Variables,
    sandbox: Sandbox,
    configs: Mutex<HashMap<PathBuf, Arc<Entries>>>,
    skills: SkillSet,
    /// Folders of the skills loaded, the last loaded first.
    active_skills: Mutex<Vec<PathBuf>>,
    /// The central config, once read (`None` inside: the project has none).
    central: Mutex<Option<Option<Arc<Layers>>>>,
    /// Each skill's customization, once read, by folder.
    customizations: Mutex<HashMap<PathBuf, Option<Arc<Layers>>>>,
}

impl BundleSession {
    /// A session over `roots` with `variables`, reading and writing through `sandbox`.
    pub(crate) fn new(roots: Roots, variables: Variables, sandbox: Sandbox) -> Self {
        Self {
            roots,
            variables,
            sandbox,
            configs: Mutex::new(HashMap::new()),
            skills: SkillSet::new(),
            active_skills: Mutex::new(Vec::new()),
            central: Mutex::new(None),
            customizations: Mutex::new(HashMap::new()),
        }
    }

    /// The same session with `skills` to load.
    pub(crate) fn with_skills(mut self, skills: SkillSet) -> Self {
        self.skills = skills;
        self
    }

    /// The skills the agent may load.
    pub fn skills(&self) -> &SkillSet {
        &self.skills
    }

    /// Marks the skill in `dir` as loaded: its folder is where bare relative paths are read
    /// from first, before those of skills loaded earlier.
    pub(crate) fn activate_skill(&self, dir: &Path) {
        let mut active = lock(&self.active_skills);
        active.retain(|d| d != dir);
        active.insert(0, dir.to_owned());
    }

    /// `path` as `read_file` reads it: a bare relative path (`references/guide.md`) names
    /// the file in the folder of the last loaded skill that has it, else a file of the
    /// project.
    pub(crate) fn skill_relative(&self, path: &str) -> String {
        let relative = Path::new(path);
        if relative.is_absolute() || path.trim().is_empty() {
            return path.to_owned();
        }
        let active = lock(&self.active_skills).clone();
        active
            .iter()
            .map(|dir| dir.join(relative))
            .find(|candidate| {
                self.sandbox
                    .is_readable_file(&candidate.display().to_string())
            })
            .map_or_else(|| path.to_owned(), |found| found.display().to_string())
    }

    /// The project's central config (`_bmad/config.toml` and its layers), read once.
    pub(crate) fn central_config(&self, by: &str) -> Result<Option<Arc<Layers>>, BundleError> {
        let mut central = lock(&self.central);
        if let Some(loaded) = central.as_ref() {
            return Ok(loaded.clone());
        }
        let loaded = load_central_config(&self.sandbox, &self.roots.project, by)?.map(Arc::new);
        *central = Some(loaded.clone());
        Ok(loaded)
    }

    /// Uses `layers` as the central config (already read at start-up).
    pub(crate) fn remember_central_config(&self, layers: Option<Arc<Layers>>) {
        *lock(&self.central) = Some(layers);
    }

    /// The customization of `skill` (its `customize.toml` and the overrides), read once.
    pub(crate) fn customization(
        &self,
        skill: &Skill,
        by: &str,
    ) -> Result<Option<Arc<Layers>>, BundleError> {
        if let Some(loaded) = lock(&self.customizations).get(&skill.dir) {
            return Ok(loaded.clone());
        }
        let loaded =
            load_customization(&self.sandbox, &skill.dir, &self.roots.project, by)?.map(Arc::new);
        lock(&self.customizations).insert(skill.dir.clone(), loaded.clone());
        Ok(loaded)
    }

    /// The text of the file at `path` (canonical) as the model sees it: a Markdown file of a
    /// skill that BMAD renders has its placeholders filled in (see `render`); any other
    /// file is returned as it is.
    pub(crate) fn present(
        &self,
        path: &Path,
        text: String,
        by: &str,
    ) -> Result<String, BundleError> {
        let Some(skill) = self.skills.containing(path).filter(|s| s.rendered) else {
            return Ok(text);
        };
        let markdown = path.extension().is_some_and(|e| e == "md");
        if !markdown || path.file_name().is_some_and(|n| n == SKILL_FILE) {
            return Ok(text);
        }
        self.render(skill, &text, by)
    }

    /// `text`, a file of the rendered `skill`, with its placeholders filled in.
    pub(crate) fn render(
        &self,
        skill: &Skill,
        text: &str,
        by: &str,
    ) -> Result<String, BundleError> {
        let central = self.central_config(by)?;
        let customization = self.customization(skill, by)?;
        let values = RenderValues {
            skill_dir: &skill.dir,
            project: &self.roots.project,
            config: central.as_deref().map(|c| &c.merged),
            customization: customization.as_deref(),
        };
        render(text, &values).map_err(|problem| BundleError::Render {
            skill: skill.name.clone(),
            problem,
        })
    }

    /// The bundle's folders.
    pub fn roots(&self) -> &Roots {
        &self.roots
    }

    /// The agent's variables (roots, date, config values).
    pub fn variables(&self) -> &Variables {
        &self.variables
    }

    /// The sandbox all file access goes through.
    pub fn sandbox(&self) -> &Sandbox {
        &self.sandbox
    }

    /// The log of files read and written.
    pub fn file_log(&self) -> &FileLog {
        self.sandbox.log()
    }

    /// The entries of the YAML config at `path` (resolved, sandboxed), read once per session.
    pub(crate) fn config(
        &self,
        path: &str,
        by: &str,
    ) -> Result<(PathBuf, Arc<Entries>), BundleError> {
        let resolved = self.sandbox.check_read(path)?;
        if let Some(entries) = self.lock_configs().get(&resolved) {
            return Ok((resolved, Arc::clone(entries)));
        }
        let (resolved, text) = self.sandbox.read_text(path, by)?;
        let entries = Arc::new(yaml::parse_mapping(&resolved, &text)?);
        self.lock_configs()
            .insert(resolved.clone(), Arc::clone(&entries));
        Ok((resolved, entries))
    }

    /// Looks up `key` in the config at `config` (a `{config_source}:key` reference, written
    /// `reference`), resolving the variables in its value.
    pub(crate) fn config_value(
        &self,
        config: &str,
        key: &str,
        reference: &str,
        by: &str,
    ) -> Result<String, BundleError> {
        let (path, entries) = self.config(config, by)?;
        let value = entries
            .iter()
            .find(|(k, _)| k == key)
            .and_then(|(_, v)| yaml::scalar_text(v))
            .ok_or_else(|| VariableError::MissingConfigKey {
                reference: reference.to_owned(),
                config: path.clone(),
                key: key.to_owned(),
                available: entries.iter().map(|(k, _)| k.clone()).collect(),
            })?;
        let value = self.variables.resolve(&value)?;
        Ok(if key == "output_folder" {
            self.absolute(&value)
        } else {
            value
        })
    }

    /// `path` made absolute against the project root.
    pub(crate) fn absolute(&self, path: &str) -> String {
        if Path::new(path).is_absolute() {
            path.to_owned()
        } else {
            self.roots.project.join(path).display().to_string()
        }
    }

    fn lock_configs(&self) -> std::sync::MutexGuard<'_, HashMap<PathBuf, Arc<Entries>>> {
        lock(&self.configs)
    }

    pub(crate) fn remember_config(&self, path: PathBuf, entries: Arc<Entries>) {
        self.lock_configs().insert(path, entries);
    }
}

/// Locks `mutex`; each update under it is one whole value, so a poisoned lock still holds
/// consistent data.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
