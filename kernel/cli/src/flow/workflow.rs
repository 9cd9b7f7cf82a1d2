//! A workflow named on the command line: a YAML file when one is there, else a built-in
//! (`rlm flow list`), read as a spec or put on disk for a run; and the files it reads, for
//! the output guard.

use std::path::{Path, PathBuf};
use std::sync::LazyLock;

use anyhow::Result;
use engine::flow::file::{AgentSpec, load_workflow, load_workflow_from};
use regex::Regex;

use super::builtin::{BUILTINS, Builtin};
use crate::exit::UsageError;
use crate::outputs::{Inputs, Scratch};

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
    scratch: Option<Scratch>,
}

impl Workflow {
    /// The workflow `name`: a file when one is there, else a built-in.
    pub(crate) fn find(name: &str) -> Result<Self> {
        let path = PathBuf::from(name);
        if path.exists() {
            return Ok(Self {
                root: path,
                scratch: None,
            });
        }
        let builtin = Builtin::find(name).ok_or_else(|| unknown(name))?;
        let dir = Scratch::new()?;
        for (path, text) in builtin.files {
            dir.write(path, text.as_bytes())?;
        }
        Ok(Self {
            root: dir.path(builtin.root),
            scratch: Some(dir),
        })
    }

    /// The root file.
    pub(crate) fn root(&self) -> &Path {
        &self.root
    }

    /// `path` (a file of this workflow) as a user knows it: a built-in's files by their
    /// place among the built-ins (`team/analyst.yaml`), a file as it was found.
    pub(crate) fn shown<'p>(&self, path: &'p Path) -> &'p Path {
        match &self.scratch {
            Some(dir) => path.strip_prefix(dir.path("")).unwrap_or(path),
            None => path,
        }
    }

    /// The root file's folder.
    pub(crate) fn dir(&self) -> &Path {
        self.root.parent().unwrap_or_else(|| Path::new("."))
    }

    /// Adds the files the workflow `spec` (read from this workflow) reads to `inputs`: every
    /// YAML file of its tree, and the Python files its code references name (`steps.py:fn`,
    /// or a module `steps:fn` / `pkg.steps.fn` found beside a file or the root), looked for
    /// in any string of the files so that no field is missed. Modules those files import are
    /// not followed.
    pub(crate) fn add_inputs(&self, spec: &AgentSpec, inputs: &mut Inputs) {
        static REFERENCE: LazyLock<Regex> = LazyLock::new(|| {
            Regex::new(
                r"([A-Za-z0-9_./-]+\.py)\b|\b([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)[:.][A-Za-z_][A-Za-z0-9_]*",
            )
            .expect("a valid pattern")
        });
        let mut specs = vec![spec];
        while let Some(spec) = specs.pop() {
            specs.extend(spec.sub_agents.iter().chain(&spec.tool_agents));
            inputs.file("the workflow file", &spec.file);
            let bases = [spec.file.parent().unwrap_or(Path::new("")), self.dir()];
            for found in REFERENCE.captures_iter(&spec.text) {
                let candidates: Vec<PathBuf> = match (found.get(1), found.get(2)) {
                    (Some(file), _) => vec![PathBuf::from(file.as_str())],
                    (None, Some(module)) => {
                        let module = module.as_str().replace('.', "/");
                        vec![
                            PathBuf::from(format!("{module}.py")),
                            PathBuf::from(module).join("__init__.py"),
                        ]
                    }
                    (None, None) => Vec::new(),
                };
                for base in bases {
                    for candidate in &candidates {
                        let path = base.join(candidate);
                        if path.is_file() {
                            inputs.file("a Python file of the workflow", path);
                        }
                    }
                }
            }
        }
    }
}
