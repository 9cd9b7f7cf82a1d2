//! What can go wrong loading an agent bundle and using its files.
//!
//! [`PathError`] is what the sandbox refuses (the tools hand it to the model as a tool
//! error); [`VariableError`] is a `{name}` that names nothing; [`BundleError`] covers the rest
//! and wraps both.

use std::fmt;
use std::path::{Path, PathBuf};

/// Whether a path is read or written; the sandbox has different roots for each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Access {
    /// Reading a file of the bundle or the project.
    Read,
    /// Writing an output document.
    Write,
}

impl fmt::Display for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Read => "read",
            Self::Write => "write to",
        })
    }
}

/// What a path points at when it is not a regular file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    /// A directory.
    Directory,
    /// A character or block device.
    Device,
    /// A named pipe.
    Fifo,
    /// A Unix socket.
    Socket,
    /// A symbolic link that points nowhere.
    DanglingLink,
    /// A symbolic link.
    Link,
    /// Anything else.
    Other,
}

impl fmt::Display for FileKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Directory => "a directory",
            Self::Device => "a device",
            Self::Fifo => "a named pipe",
            Self::Socket => "a socket",
            Self::DanglingLink => "a symbolic link to nothing",
            Self::Link => "a symbolic link",
            Self::Other => "not a regular file",
        })
    }
}

/// Why a root is too broad to use without the user's leave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BroadRoot {
    /// `/`.
    FilesystemRoot,
    /// The home directory, or a folder above it.
    Home,
    /// A folder above the project.
    ParentOfProject,
}

impl fmt::Display for BroadRoot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::FilesystemRoot => "the root of the file system",
            Self::Home => "your home directory (or a folder holding it)",
            Self::ParentOfProject => "a folder above the project",
        })
    }
}

/// Why the sandbox refused a path, or could not use it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// The path is empty.
    #[error("The path is empty; pass the path of a file")]
    Empty,
    /// The path holds a NUL byte, which no file name can.
    #[error("The path contains a NUL byte; pass a plain file path")]
    Nul,
    /// The path leads (after `..` and symbolic links) outside the allowed folders.
    #[error(
        "`{path}` is outside the folders this agent may {access}: {}",
        list_paths(roots)
    )]
    Outside {
        /// The path as resolved (canonical where it exists).
        path: PathBuf,
        /// Reading or writing.
        access: Access,
        /// The allowed folders.
        roots: Vec<PathBuf>,
    },
    /// The path lies only under a root that is too broad to use without the user's leave.
    #[error(
        "`{path}` is only under `{}`, {broad}: a root that broad would open any of your \
         files to the tools, so it is not used unless you allow it (`rlm agent \
         --allow-broad-root`); better, name the project folder itself (`--project-root DIR`, or \
         run from it)",
        root.display()
    )]
    Broad {
        /// The path as resolved.
        path: PathBuf,
        /// The root it is under.
        root: PathBuf,
        /// Why that root is broad.
        broad: BroadRoot,
    },
    /// A regular file with more than one hard link: its other names may be anywhere.
    #[error(
        "`{path}` has {links} hard links: the same file has another name, maybe outside the \
         folders this agent may use, so it is not {}{}",
        match access { Access::Read => "read", Access::Write => "written" },
        match access {
            Access::Read => "; copy it instead of linking it, or allow such files \
                             (`rlm agent --allow-hard-links`)",
            Access::Write => "; write the document under a new name, or remove the other link",
        }
    )]
    HardLink {
        /// The path as resolved.
        path: PathBuf,
        /// How many names the file has.
        links: u64,
        /// Reading or writing.
        access: Access,
    },
    /// A write into a version-control folder.
    #[error(
        "`{path}` is inside `{}`, a version-control folder: tools never write there (a hook or \
         setting written there would run at your next commit); write the document elsewhere",
        folder.display()
    )]
    VersionControl {
        /// The path as resolved.
        path: PathBuf,
        /// The version-control folder (`.git`).
        folder: PathBuf,
    },
    /// The path changed between its check and its use: a link appeared on its way.
    #[error(
        "`{path}` changed while it was being opened (a symbolic link appeared on its way), so \
         it was not used; try again once nothing else is changing that folder"
    )]
    Changed {
        /// The path as checked.
        path: PathBuf,
    },
    /// Nothing is at the path.
    #[error("`{path}` does not exist")]
    NotFound {
        /// The path asked for.
        path: PathBuf,
    },
    /// The path is a directory, device, pipe, socket or dangling link.
    #[error("`{path}` is {kind}; only regular files can be read or written")]
    NotAFile {
        /// The path asked for.
        path: PathBuf,
        /// What is there instead.
        kind: FileKind,
    },
    /// The file, or the text to write, is over the size limit.
    #[error("`{path}` is {size} bytes, over the limit of {limit} bytes")]
    TooLarge {
        /// The path asked for.
        path: PathBuf,
        /// Its size (at least; a growing file is not read to the end).
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// The file is not UTF-8 text.
    #[error("`{path}` is not UTF-8 text; only text files can be read")]
    NotText {
        /// The path asked for.
        path: PathBuf,
    },
    /// The operating system refused.
    #[error("Could not use `{path}`: {message}")]
    Io {
        /// The path asked for.
        path: PathBuf,
        /// The kind of I/O error.
        kind: std::io::ErrorKind,
        /// The system's message.
        message: String,
    },
}

impl PathError {
    pub(crate) fn io(path: &Path, err: &std::io::Error) -> Self {
        if err.kind() == std::io::ErrorKind::NotFound {
            return Self::NotFound {
                path: path.to_owned(),
            };
        }
        Self::Io {
            path: path.to_owned(),
            kind: err.kind(),
            message: err.to_string(),
        }
    }
}

/// A `{name}` that cannot be resolved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VariableError {
    /// The variable is not defined.
    #[error(
        "Unknown variable `{{{name}}}` in `{text}`; the variables available are: {}",
        list_variables(available)
    )]
    Unknown {
        /// The variable's name.
        name: String,
        /// The text it appears in.
        text: String,
        /// Every defined name, sorted.
        available: Vec<String>,
    },
    /// The variable's value refers back to itself.
    #[error("Variable `{{{name}}}` refers to itself (through {chain})")]
    Cycle {
        /// The variable's name.
        name: String,
        /// The chain of names, e.g. `` `{a}` → `{b}` → `{a}` ``.
        chain: String,
    },
    /// A path still holds a template value the model was meant to fill in.
    #[error(
        "`{text}` still holds the template value `{{{{{name}}}}}`; put its value in the path first"
    )]
    TemplateValue {
        /// The template value's name.
        name: String,
        /// The path.
        text: String,
    },
    /// A `{config_source}:key` reference names a key the config does not have.
    #[error(
        "`{reference}`: the config `{config}` has no key `{key}`; its keys are: {}",
        list_names(available)
    )]
    MissingConfigKey {
        /// The reference as written.
        reference: String,
        /// The config file.
        config: PathBuf,
        /// The key asked for.
        key: String,
        /// The keys the config has.
        available: Vec<String>,
    },
}

/// Loading an agent, its start-up files or a workflow failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BundleError {
    /// A file of the bundle is not in the shape its kind needs.
    #[error("`{path}` line {line}: {problem}")]
    Malformed {
        /// The file.
        path: PathBuf,
        /// The line (from 1) where the problem is.
        line: usize,
        /// What is wrong.
        problem: String,
    },
    /// A variable could not be resolved.
    #[error(transparent)]
    Variable(#[from] VariableError),
    /// The sandbox refused a path, or the file could not be read.
    #[error(transparent)]
    Path(#[from] PathError),
    /// A file a start-up step loads could not be loaded, so the agent does not start.
    #[error("Start-up step {step} of `{agent}` loads `{file}`, which failed: {error}")]
    StartupFile {
        /// The agent file.
        agent: PathBuf,
        /// The step's label (its number).
        step: String,
        /// The file as the step names it.
        file: String,
        /// Why it failed (in the message, not as a separate cause: the model reads only the
        /// message).
        error: Box<BundleError>,
    },
    /// A persona names no agent of the bundle.
    #[error(
        "The agent bundle `{bundle}` has no agent `{name}` (`agents/{name}.md`, or a skill \
         `{name}/SKILL.md`); its agents are: {}. Name one of them, or use one agent file or \
         skill folder as the bundle",
        list_names(available)
    )]
    NoPersona {
        /// The persona's name.
        name: String,
        /// The bundle folder.
        bundle: PathBuf,
        /// The agents it has.
        available: Vec<String>,
    },
    /// A value of the bundle would widen the folders the tools may use.
    #[error(
        "`{file}` sets `{key}` to `{value}`, which is outside the project `{}`: a bundle may \
         only choose folders inside the project. Change the value, or pass the project that \
         holds that folder (`--project-root DIR`)",
        project.display()
    )]
    WidensRoot {
        /// The file that set it (the bundle's config).
        file: String,
        /// The key (`output_folder`).
        key: String,
        /// Its value, resolved.
        value: String,
        /// The project root.
        project: PathBuf,
    },
    /// A value of a workflow has the wrong type.
    #[error("`{path}`: `{key}` {problem}")]
    WorkflowValue {
        /// The workflow file.
        path: PathBuf,
        /// The key.
        key: String,
        /// What is wrong with it.
        problem: String,
    },
    /// No skill has this name.
    #[error(
        "There is no skill `{name}`; the skills are: {}",
        list_names(available)
    )]
    NoSkill {
        /// The name asked for.
        name: String,
        /// The names of the skills found.
        available: Vec<String>,
    },
    /// The path holds something `rlm agent` cannot play; says what was found.
    #[error("`{path}` is {found}; {hint}")]
    Unsupported {
        /// The path given.
        path: PathBuf,
        /// What it is (a format, a kind of file or folder).
        found: String,
        /// What to pass instead.
        hint: String,
    },
    /// A skill's customization (`customize.toml` and its overrides) cannot be merged or used.
    #[error(
        "The customization of `{skill}` ({}) cannot be used: {problem}",
        list_paths(files)
    )]
    Customization {
        /// The skill's name.
        skill: String,
        /// The files merged.
        files: Vec<PathBuf>,
        /// What is wrong.
        problem: String,
    },
    /// A skill's workflow could not be rendered with the project's values.
    #[error("The workflow of skill `{skill}` could not be prepared: {problem}")]
    Render {
        /// The skill's name.
        skill: String,
        /// What is missing or wrong.
        problem: String,
    },
}

/// `` `a`, `b` `` (or "none").
pub(crate) fn list_names(names: &[String]) -> String {
    if names.is_empty() {
        return "none".to_owned();
    }
    names
        .iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `` `{a}`, `{b}` `` (or "none").
fn list_variables(names: &[String]) -> String {
    if names.is_empty() {
        return "none".to_owned();
    }
    names
        .iter()
        .map(|n| format!("`{{{n}}}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn list_paths(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| format!("`{}`", p.display()))
        .collect::<Vec<_>>()
        .join(", ")
}
