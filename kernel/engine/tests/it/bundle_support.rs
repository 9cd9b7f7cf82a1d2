//! Fixture trees copied into temporary project folders.

use std::path::{Path, PathBuf};

use engine::bundle::{FileOp, StartOptions, StartedAgent};
use engine::{SharedState, State, ToolContext};

/// The date start-up gets in tests, so that prompts and file names are stable.
pub(crate) const DATE: &str = "2026-11-26";

/// `shared/fixtures/bmad`, found in the nearest folder above the workspace that has it.
pub(crate) fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .map(|a| a.join("shared/fixtures/bmad"))
        .find(|p| p.is_dir())
        .expect("shared/fixtures/bmad beside the workspace")
}

/// A fixture tree (`v6-alpha0`, `v6-installed`) copied into a temporary project folder.
pub(crate) struct Project {
    pub(crate) dir: tempfile::TempDir,
}

impl Project {
    pub(crate) fn copy(tree: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        copy_tree(&fixtures().join(tree), dir.path());
        Self { dir }
    }

    /// The project root, canonical (as the sandbox reports paths).
    pub(crate) fn root(&self) -> PathBuf {
        std::fs::canonicalize(self.dir.path()).expect("canonical root")
    }

    pub(crate) fn path(&self, rel: &str) -> PathBuf {
        self.root().join(rel)
    }

    /// Starts the agent at `rel` with the test date and this project root.
    pub(crate) fn start(&self, rel: &str) -> StartedAgent {
        StartedAgent::start(&self.path(rel), &self.options()).expect("agent starts")
    }

    pub(crate) fn options(&self) -> StartOptions {
        StartOptions {
            project_root: Some(self.root()),
            date: Some(DATE.to_owned()),
            ..StartOptions::default()
        }
    }

    /// `text` with the project root replaced by `[project]`.
    pub(crate) fn redact(&self, text: &str) -> String {
        text.replace(&self.root().display().to_string(), "[project]")
    }
}

/// Copies `from` into `to`, files writable (the fixtures are read-only).
pub(crate) fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read fixture dir") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("type").is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::write(&target, std::fs::read(entry.path()).expect("read")).expect("write");
        }
    }
}

/// A context for one tool call.
pub(crate) fn ctx() -> ToolContext {
    ToolContext::new("call_1", SharedState::new(State::default()))
}

/// The agent's tool called `name`.
pub(crate) fn tool(agent: &StartedAgent, name: &str) -> std::sync::Arc<dyn engine::Tool> {
    agent
        .tools()
        .into_iter()
        .find(|t| t.name() == name)
        .expect("tool exists")
}

/// Every file access of `agent` as (path, by), paths redacted; each must be a read.
pub(crate) fn reads(agent: &StartedAgent, project: &Project) -> Vec<(String, String)> {
    agent
        .session
        .file_log()
        .entries()
        .into_iter()
        .map(|a| {
            assert_eq!(a.op, FileOp::Read);
            (project.redact(&a.path.display().to_string()), a.by)
        })
        .collect()
}

/// `(a, b)` pairs as owned strings.
pub(crate) fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
    items
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}
