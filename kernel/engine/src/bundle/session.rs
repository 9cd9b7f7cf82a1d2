//! What the bundle tools of one agent share: its roots, its variables, its sandbox and the
//! config files loaded so far.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::error::{BundleError, VariableError};
use super::sandbox::{FileLog, Sandbox};
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
    pub fn of_agent(agent: &Path, project: &Path) -> Self {
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
    pub fn variables(&self, date: &str) -> Variables {
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
}

impl BundleSession {
    /// A session over `roots` with `variables`, reading and writing through `sandbox`.
    pub fn new(roots: Roots, variables: Variables, sandbox: Sandbox) -> Self {
        Self {
            roots,
            variables,
            sandbox,
            configs: Mutex::new(HashMap::new()),
        }
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
    pub fn config(&self, path: &str, by: &str) -> Result<(PathBuf, Arc<Entries>), BundleError> {
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
    pub fn config_value(
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
    pub fn absolute(&self, path: &str) -> String {
        if Path::new(path).is_absolute() {
            path.to_owned()
        } else {
            self.roots.project.join(path).display().to_string()
        }
    }

    fn lock_configs(&self) -> std::sync::MutexGuard<'_, HashMap<PathBuf, Arc<Entries>>> {
        // Each insert is one whole entry, so a poisoned lock still holds consistent data.
        self.configs
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(crate) fn remember_config(&self, path: PathBuf, entries: Arc<Entries>) {
        self.lock_configs().insert(path, entries);
    }
}
