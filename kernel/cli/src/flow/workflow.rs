//! A workflow named on the command line: a YAML file when one is there, else a built-in
//! (`rlm flow list`), read as a spec or put on disk for a run.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use engine::flow::file::{AgentSpec, load_workflow, load_workflow_from};

use super::builtin::{BUILTINS, Builtin};
use crate::exit::UsageError;

/// Reads the workflow `name`: a file when one is there, else a built-in.
pub(super) fn read(name: &str) -> Result<AgentSpec> {
    let path = PathBuf::from(name);
    if path.exists() {
        return Ok(load_workflow(&path)?);
    }
    let builtin = Builtin::find(name).ok_or_else(|| unknown(name))?;
    Ok(load_workflow_from(&builtin.embedded(), builtin.root)?)
}

fn unknown(name: &str) -> anyhow::Error {
    UsageError::new(format!(
        "`{name}` is neither a workflow file nor a built-in workflow ({}); see `rlm flow list`",
        BUILTINS
            .iter()
            .map(|b| format!("`{}`", b.name))
            .collect::<Vec<_>>()
            .join(", ")
    ))
    .into()
}

/// A workflow on disk: a file, or a built-in written to a temporary folder (its Python
/// steps are loaded from files).
pub(crate) struct Workflow {
    root: PathBuf,
    _dir: Option<tempfile::TempDir>,
}

impl Workflow {
    /// The workflow `name`: a file when one is there, else a built-in.
    pub(crate) fn find(name: &str) -> Result<Self> {
        let path = PathBuf::from(name);
        if path.exists() {
            return Ok(Self {
                root: path,
                _dir: None,
            });
        }
        let builtin = Builtin::find(name).ok_or_else(|| unknown(name))?;
        let dir = tempfile::tempdir().context("Could not create a temporary directory")?;
        for (path, text) in builtin.files {
            let target = dir.path().join(path);
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent)
                    .with_context(|| format!("Could not create `{}`", parent.display()))?;
            }
            std::fs::write(&target, text)
                .with_context(|| format!("Could not write `{}`", target.display()))?;
        }
        Ok(Self {
            root: dir.path().join(builtin.root),
            _dir: Some(dir),
        })
    }

    /// The root file.
    pub(crate) fn root(&self) -> &Path {
        &self.root
    }

    /// The root file's folder.
    pub(crate) fn dir(&self) -> &Path {
        self.root.parent().unwrap_or_else(|| Path::new("."))
    }
}
