//! The one output guard: every file `rlm` writes is declared here and opened through what
//! this module hands out, after it was checked against everything the command reads.
//!
//! A command first lists its [`Inputs`] — contexts (a folder counts with every file in it,
//! and any new one), `@FILE` inputs, workflow and Python files, bundle folders, the
//! configuration and prompt files — and builds a [`Guard`] with them and `--force`. Then it
//! declares each output, getting back the only handle that can write it:
//!
//! - [`Document`]: a whole file written at once (`--answer-file`, `--plot`, `rlm view`'s page,
//!   `--state`, `results.json`). It goes to a temporary file beside the target that is then
//!   renamed over it, so a run that fails or is killed leaves the old file as it was.
//! - [`LogFile`]: a log that grows line by line while the command runs (`--trajectory`,
//!   `--events`, an eval run's trajectory). It cannot wait for the end — it must show how far
//!   a killed run got — so it is not a whole document: an existing one is refused without
//!   `--force` (like a document), and a new one is made by the same rename when the command
//!   starts (a file of that name that appeared meanwhile is not replaced; a replaced file's
//!   other hard links keep their content). [`LogStart::Append`] — a resumed run continuing its
//!   event log — opens an existing one for appending and never truncates it.
//! - [`Database`]: the run database; SQLite writes it, together with its `-wal`, `-shm` and
//!   `-journal` companions, which count as the same output.
//! - [`Scratch`]: a private temporary folder for what `rlm` makes for itself (a built-in
//!   workflow's files, a demo's generated context); no user path is involved.
//!
//! Each declaration is checked at once, before anything is written: an output that is an
//! input — compared by device and inode, so `./x`, `dir/../x`, a symlink (even a dangling one,
//! followed to where the write would land) and a hard link all count — is a usage error
//! (exit 2); so is a new or existing file under a context folder, two outputs on one file,
//! and an existing, non-empty output without `--force` (a [`LogStart::Append`] log, the
//! database and `--state`, which is read and written back, excepted). Whether the folder
//! takes new files and an existing file can be written is probed without changing either,
//! so a read-only place (exit 1) is named before any model is paid for. Nothing is written
//! until every output of the command is declared: the handles only write when used. A device
//! or a pipe (`/dev/null`, `/dev/stdout`, a shell's `>(…)`) holds nothing to lose and is
//! written in place, never renamed over.
//!
//! The guard lives in the binary, which owns the user's paths; the libraries take a file it
//! opened (`EventLog::from_file`, `TrajectoryWriter::from_file`) or a path it cleared.
//! `kernel/cli/clippy.toml` forbids the other ways of writing a file in the binary, so an
//! undeclared write fails `cargo clippy`.
//!
//! ```text
//! let mut inputs = Inputs::new();
//! inputs.context(Path::new("data.txt"));
//! let mut guard = Guard::new(inputs, force);
//! let events = guard.log(Output::new("--events", path), LogStart::Fresh)?; // refused: exit 2
//! let file = events.open()?; // a `File` for `EventLog::from_file`
//! ```

// The one module allowed to create, rename and open files for writing (see clippy.toml).
#![allow(clippy::disallowed_methods)]

use std::ffi::OsString;
use std::fs::{File, OpenOptions, Permissions};
use std::io::{self, Read as _, Seek as _, SeekFrom, Write as _};
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Component, Path, PathBuf};

use anyhow::{Context as _, Result};

use crate::exit::UsageError;

/// The identity of an existing file or folder: (device, inode).
type FileId = (u64, u64);

fn file_id(path: &Path) -> Option<FileId> {
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// What a command reads, to be kept safe from its outputs.
#[derive(Debug, Default)]
pub(crate) struct Inputs {
    items: Vec<Input>,
}

#[derive(Debug)]
struct Input {
    /// What it is, for messages: `the context`, `the workflow file`, …
    role: String,
    /// As the user named it.
    path: PathBuf,
    scope: Scope,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scope {
    /// One file.
    File,
    /// A context folder: every file under it is read, and so would a new one be.
    Folder,
    /// A folder whose files are read by name (an agent bundle): its existing files count.
    Tree,
}

impl Inputs {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// A file the command reads (`role` names it in messages); a missing one is passed over.
    pub(crate) fn file(&mut self, role: impl Into<String>, path: impl Into<PathBuf>) -> &mut Self {
        self.items.push(Input {
            role: role.into(),
            path: path.into(),
            scope: Scope::File,
        });
        self
    }

    /// A context: a file, or a folder all of whose files (and any new one) are read.
    pub(crate) fn context(&mut self, path: impl Into<PathBuf>) -> &mut Self {
        let path = path.into();
        let scope = if path.is_dir() {
            Scope::Folder
        } else {
            Scope::File
        };
        self.items.push(Input {
            role: "the context".into(),
            path,
            scope,
        });
        self
    }

    /// A folder whose existing files are read by name (an agent bundle's module folder).
    pub(crate) fn tree(&mut self, role: impl Into<String>, path: impl Into<PathBuf>) -> &mut Self {
        self.items.push(Input {
            role: role.into(),
            path: path.into(),
            scope: Scope::Tree,
        });
        self
    }
}

/// An input as the guard compares it.
#[derive(Debug)]
struct Resolved {
    role: String,
    path: PathBuf,
    scope: Scope,
    id: FileId,
}

/// An output to declare: the flag that names it (or a label) and its path.
#[derive(Debug, Clone)]
pub(crate) struct Output {
    label: String,
    path: PathBuf,
    new_folders: bool,
}

impl Output {
    /// The output `path` of `flag` (shown as `` `--events` ``).
    pub(crate) fn new(flag: &str, path: impl Into<PathBuf>) -> Self {
        Self {
            label: format!("`{flag}`"),
            path: path.into(),
            new_folders: false,
        }
    }

    /// An output no flag names, e.g. `the page` of `rlm view` (the label as it is).
    pub(crate) fn named(label: &str, path: impl Into<PathBuf>) -> Self {
        Self {
            label: label.to_owned(),
            path: path.into(),
            new_folders: false,
        }
    }

    /// Its missing folders are made when it is first written (`rlm eval --out DIR`).
    pub(crate) fn creating_folders(mut self) -> Self {
        self.new_folders = true;
        self
    }
}

/// How a [`LogFile`] starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LogStart {
    /// A new log; an existing non-empty file is replaced only with `--force`.
    Fresh,
    /// The continuation of this log (a resumed run's event log): an existing file is
    /// appended to, never truncated; a missing one is made.
    Append,
}

/// An output declared so far.
#[derive(Debug)]
struct Declared {
    label: String,
    path: PathBuf,
    /// Where writes land, and the other files that are part of it (a database's `-wal`).
    landings: Vec<PathBuf>,
    id: Option<FileId>,
    database: bool,
}

/// The guard of one command: its inputs, `--force`, and the outputs declared so far.
#[derive(Debug)]
pub(crate) struct Guard {
    inputs: Vec<Resolved>,
    declared: Vec<Declared>,
    force: bool,
}

/// What the checks of one declaration found out.
#[derive(Debug)]
struct Cleared {
    label: String,
    path: PathBuf,
    landing: PathBuf,
    existed: bool,
    /// A device or a pipe (`/dev/null`, `/dev/stdout`): written in place, never replaced.
    special: bool,
}

impl Guard {
    /// A guard for a command reading `inputs`; `force` is its `--force`.
    pub(crate) fn new(inputs: Inputs, force: bool) -> Self {
        let inputs = inputs
            .items
            .into_iter()
            .filter_map(|input| {
                Some(Resolved {
                    id: file_id(&input.path)?,
                    role: input.role,
                    path: input.path,
                    scope: input.scope,
                })
            })
            .collect();
        Self {
            inputs,
            declared: Vec::new(),
            force,
        }
    }

    /// A whole document, written at once by [`Document::write`].
    pub(crate) fn document(&mut self, output: Output) -> Result<Document> {
        let cleared = self.clear(&output, Existing::NeedsForce, &[])?;
        Ok(Document {
            replace: cleared.existed,
            cleared,
            new_folders: output.new_folders,
        })
    }

    /// A file the command reads and writes back whole (`--state`): it may exist without
    /// `--force`, but no other input or output may be it.
    pub(crate) fn read_and_written(&mut self, output: Output) -> Result<Document> {
        let cleared = self.clear(&output, Existing::Allowed, &[])?;
        Ok(Document {
            replace: true,
            cleared,
            new_folders: output.new_folders,
        })
    }

    /// A log written line by line, opened by [`LogFile::open`].
    pub(crate) fn log(&mut self, output: Output, start: LogStart) -> Result<LogFile> {
        let existing = match start {
            LogStart::Fresh => Existing::NeedsForce,
            LogStart::Append => Existing::Allowed,
        };
        let cleared = self.clear(&output, existing, &[])?;
        Ok(LogFile {
            append: start == LogStart::Append && cleared.existed,
            cleared,
            new_folders: output.new_folders,
        })
    }

    /// The run database at `path` (`--db`): it and its `-wal`, `-shm` and `-journal` files.
    pub(crate) fn database(&mut self, output: Output) -> Result<Database> {
        let landing = landing(&output.path)?;
        let companions: Vec<PathBuf> = ["-wal", "-shm", "-journal"]
            .iter()
            .map(|suffix| {
                let mut name = landing.as_os_str().to_owned();
                name.push(suffix);
                PathBuf::from(name)
            })
            .collect();
        let output = output.creating_folders();
        let cleared = self.clear(&output, Existing::Allowed, &companions)?;
        if let Some(last) = self.declared.last_mut() {
            last.database = true;
        }
        Ok(Database {
            path: cleared.path,
            landing: cleared.landing,
        })
    }

    /// Refuses, without `--force`, a group of outputs of which some exist already (`rlm eval
    /// --out DIR`), naming the first and counting the rest as `more` (`outputs of this
    /// evaluation`); declare them afterwards.
    pub(crate) fn refuse_existing(&self, outputs: &[Output], more: &str) -> Result<()> {
        if self.force {
            return Ok(());
        }
        let existing: Vec<&Output> = outputs.iter().filter(|o| holds_data(&o.path)).collect();
        let Some(first) = existing.first() else {
            return Ok(());
        };
        let others = match existing.len() {
            1 => String::new(),
            n => format!(" (and {} more {more})", n - 1),
        };
        Err(usage(format!(
            "{} `{}` already exists{others}; pass `--force` to overwrite, or choose another path",
            first.label,
            first.path.display()
        )))
    }

    /// The checks of every declaration; `companions` are files that belong to the output.
    fn clear(
        &mut self,
        output: &Output,
        existing: Existing,
        companions: &[PathBuf],
    ) -> Result<Cleared> {
        let Output { label, path, .. } = output;
        let landing = landing(path)?;
        let meta = std::fs::metadata(&landing).ok();
        if meta.as_ref().is_some_and(|m| m.is_dir()) {
            return Err(usage(format!(
                "{label} `{}` is a folder; name a file in it",
                path.display()
            )));
        }
        let id = meta.as_ref().map(|m| (m.dev(), m.ino()));
        let special = meta.as_ref().is_some_and(|m| !m.is_file());
        let mut landings = vec![landing.clone()];
        landings.extend_from_slice(companions);
        for input in &self.inputs {
            check_input(label, path, &landings, id, input)?;
        }
        // A device or a pipe holds nothing to lose: two outputs may share `/dev/null`.
        for other in self.declared.iter().filter(|_| !special) {
            let same = other.landings.iter().any(|l| landings.contains(l))
                || (id.is_some() && other.id == id);
            if !same {
                continue;
            }
            return Err(usage(if other.database {
                format!(
                    "{label} `{}` is the run database `{}` (or one of its files); writing it would \
                     destroy every run in it. Choose another path",
                    path.display(),
                    other.path.display()
                )
            } else {
                format!(
                    "{} and {label} name the same file `{}`; give each its own path",
                    other.label,
                    path.display()
                )
            }));
        }
        let existed = meta.is_some();
        if existing == Existing::NeedsForce && !self.force && holds_data(&landing) {
            return Err(usage(format!(
                "{label} `{}` already exists; pass `--force` to overwrite it, or choose another path",
                path.display()
            )));
        }
        if !special {
            check_writable(label, path, &landing, existed, output.new_folders)?;
        }
        self.declared.push(Declared {
            label: label.clone(),
            path: path.clone(),
            landings,
            id,
            database: false,
        });
        Ok(Cleared {
            label: label.clone(),
            path: path.clone(),
            landing,
            existed,
            special,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Existing {
    NeedsForce,
    Allowed,
}

/// Whether an output at `path` would replace something: an existing regular file that is not
/// empty.
fn holds_data(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.len() > 0)
}

fn usage(message: String) -> anyhow::Error {
    UsageError::new(message).into()
}

/// Refuses an output (landing on `landings`, identity `id`) that is `input` or, for a
/// folder input, under it.
fn check_input(
    label: &str,
    path: &Path,
    landings: &[PathBuf],
    id: Option<FileId>,
    input: &Resolved,
) -> Result<()> {
    let shown = path.display();
    let theirs = input.path.display();
    let role = &input.role;
    let named = id == Some(input.id)
        || landings
            .iter()
            .skip(1)
            .any(|companion| file_id(companion) == Some(input.id));
    if named {
        return Err(usage(format!(
            "{label} `{shown}` is {role} `{theirs}`; writing it would destroy the input. Choose \
             another path"
        )));
    }
    if input.scope == Scope::File {
        return Ok(());
    }
    let under = landings.iter().any(|landing| {
        landing
            .ancestors()
            .skip(1)
            .any(|folder| file_id(folder) == Some(input.id))
    });
    if !under {
        return Ok(());
    }
    match (input.scope, id.is_some()) {
        (Scope::Folder, true) => Err(usage(format!(
            "{label} `{shown}` is a file inside the context directory `{theirs}`; writing it would \
             change the input. Choose a path outside that directory"
        ))),
        (Scope::Folder, false) => Err(usage(format!(
            "{label} `{shown}` would be a new file inside the context directory `{theirs}`, and the \
             next run over it would read it as part of the context. Choose a path outside that \
             directory"
        ))),
        (_, true) => Err(usage(format!(
            "{label} `{shown}` is a file of {role} `{theirs}`; writing it would destroy the input. \
             Choose another path"
        ))),
        (_, false) => Ok(()),
    }
}

/// Probes, changing nothing, that the output can be written: an existing file opens for
/// writing, and its folder (or, when missing folders are made, the nearest existing one)
/// takes a new file.
fn check_writable(
    label: &str,
    path: &Path,
    landing: &Path,
    existed: bool,
    new_folders: bool,
) -> Result<()> {
    let shown = path.display();
    let mut folder = parent_folder(landing);
    if !folder.is_dir() {
        if !new_folders {
            anyhow::bail!(
                "Cannot write {label} `{shown}`: the folder `{}` does not exist; create it or \
                 choose another path",
                folder.display()
            );
        }
        let missing = folder.clone();
        while std::fs::symlink_metadata(&folder).is_err() {
            match folder.parent() {
                Some(parent) => folder = parent.to_path_buf(),
                None => break,
            }
        }
        if !folder.is_dir() {
            return Err(
                anyhow::Error::new(io::Error::from_raw_os_error(libc::ENOTDIR)).context(format!(
                    "Could not create the folder `{}`",
                    missing.display()
                )),
            );
        }
    }
    let unwritable = |what: String, e: io::Error| -> anyhow::Error {
        let why = if e.kind() == io::ErrorKind::ReadOnlyFilesystem {
            "is on a read-only file system".to_owned()
        } else if e.kind() == io::ErrorKind::PermissionDenied {
            "is read-only to this user".to_owned()
        } else {
            format!("cannot be written ({e})")
        };
        anyhow::anyhow!("Cannot write {label} `{shown}`: {what} {why}; choose another path")
    };
    if existed {
        OpenOptions::new()
            .append(true)
            .open(landing)
            .map_err(|e| unwritable(format!("the file `{}`", landing.display()), e))?;
    }
    tempfile::Builder::new()
        .prefix(".rlm-probe-")
        .tempfile_in(&folder)
        .map_err(|e| unwritable(format!("its folder `{}`", folder.display()), e))?;
    Ok(())
}

/// Where a write to `path` lands: an absolute path whose existing folders are canonical, with
/// symlinks on the file itself followed (a dangling one too, to where it would create a file).
/// A device or a pipe (`/dev/null`, `/dev/stdout`) keeps its name: it is written in place.
fn landing(path: &Path) -> Result<PathBuf> {
    let mut path = std::path::absolute(path)
        .with_context(|| format!("Cannot resolve the path `{}`", path.display()))?;
    // As many links as the kernel follows before it gives up (ELOOP).
    for _ in 0..40 {
        let Some(name) = path.file_name().map(OsString::from) else {
            return Ok(canonical_prefix(&path));
        };
        let folder = canonical_prefix(&parent_folder(&path));
        let candidate = folder.join(&name);
        // What the kernel reaches through the links: a regular file by its canonical path;
        // anything else (a device, a pipe like `/dev/stdout`) by the name it was given.
        match std::fs::metadata(&candidate) {
            Ok(meta) if meta.is_file() => return Ok(candidate.canonicalize().unwrap_or(candidate)),
            Ok(_) => return Ok(candidate),
            Err(_) => {}
        }
        match std::fs::symlink_metadata(&candidate) {
            Ok(meta) if meta.file_type().is_symlink() => {
                let target = std::fs::read_link(&candidate).with_context(|| {
                    format!("Cannot read the symlink `{}`", candidate.display())
                })?;
                path = folder.join(target);
            }
            _ => return Ok(candidate),
        }
    }
    Err(usage(format!(
        "`{}` is a chain of too many symlinks; name the file itself",
        path.display()
    )))
}

/// `path` (absolute) with its existing folders resolved as the kernel resolves them
/// (symlinks followed, `..` from where a link led) and the missing rest appended as written.
fn canonical_prefix(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    let mut exists = true;
    for part in path.components() {
        match part {
            Component::Prefix(_) | Component::RootDir => out.push(part),
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(name) => {
                out.push(name);
                if exists {
                    match out.canonicalize() {
                        Ok(canonical) => out = canonical,
                        Err(_) => exists = false,
                    }
                }
            }
        }
    }
    out
}

fn parent_folder(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// A whole document the guard cleared; [`Document::write`] puts it in place at once.
#[derive(Debug)]
pub(crate) struct Document {
    cleared: Cleared,
    /// Whether an existing file may be replaced (it was there and `--force` or read-and-written).
    replace: bool,
    new_folders: bool,
}

impl Document {
    /// The path as the user gave it.
    pub(crate) fn path(&self) -> &Path {
        &self.cleared.path
    }

    /// Writes `bytes` to a temporary file beside the target and renames it over the target
    /// (a symlink's target is replaced, not the link). A new file gets mode 0644 less the
    /// umask; a replaced one keeps its mode. A file that appeared since the declaration is not
    /// replaced: the document is kept beside it and the error says where.
    pub(crate) fn write(&self, bytes: &[u8]) -> Result<()> {
        let Cleared {
            label,
            path,
            landing,
            ..
        } = &self.cleared;
        let failed = || format!("Could not write {label} `{}`", path.display());
        if self.cleared.special {
            let mut out = OpenOptions::new()
                .write(true)
                .open(landing)
                .with_context(failed)?;
            return out.write_all(bytes).with_context(failed);
        }
        let folder = parent_folder(landing);
        if self.new_folders {
            std::fs::create_dir_all(&folder).with_context(failed)?;
        }
        let mode = std::fs::metadata(landing).map_or(0o644, |m| m.mode() & 0o7777);
        let mut tmp = tempfile::Builder::new()
            .prefix(".rlm-output-")
            .permissions(Permissions::from_mode(mode))
            .tempfile_in(&folder)
            .with_context(failed)?;
        tmp.write_all(bytes).with_context(failed)?;
        tmp.as_file().sync_all().with_context(failed)?;
        if self.replace {
            tmp.persist(landing)
                .map_err(|e| e.error)
                .with_context(failed)?;
        } else if let Err(e) = tmp.persist_noclobber(landing) {
            if e.error.kind() != io::ErrorKind::AlreadyExists {
                return Err(e.error).with_context(failed);
            }
            let (_, kept) = e.file.keep().with_context(failed)?;
            anyhow::bail!(
                "{label} `{}` appeared while rlm ran, so it was not replaced; the output is in `{}`",
                path.display(),
                kept.display()
            );
        }
        sync_folder(&folder);
        Ok(())
    }
}

/// Makes a rename durable.
fn sync_folder(folder: &Path) {
    if let Ok(dir) = File::open(folder) {
        let _ = dir.sync_all();
    }
}

/// A log the guard cleared, opened by [`LogFile::open`] when the command starts writing.
#[derive(Debug)]
pub(crate) struct LogFile {
    cleared: Cleared,
    append: bool,
    new_folders: bool,
}

impl LogFile {
    /// Opens the log: appending to the existing file (after ending its last line, if a
    /// killed writer left it torn), or as a new file renamed into place — a replaced file's
    /// other hard links keep the old content.
    pub(crate) fn open(self) -> Result<OpenedLog> {
        let Cleared {
            label,
            path,
            landing,
            existed,
            special,
        } = self.cleared;
        let failed = || format!("Could not open {label} `{}`", path.display());
        let file = if special {
            OpenOptions::new()
                .write(true)
                .open(&landing)
                .with_context(failed)?
        } else if self.append {
            let mut file = OpenOptions::new()
                .read(true)
                .append(true)
                .open(&landing)
                .with_context(failed)?;
            end_last_line(&mut file).with_context(failed)?;
            file
        } else {
            let folder = parent_folder(&landing);
            if self.new_folders {
                std::fs::create_dir_all(&folder).with_context(failed)?;
            }
            let tmp = tempfile::Builder::new()
                .prefix(".rlm-output-")
                .permissions(Permissions::from_mode(0o644))
                .tempfile_in(&folder)
                .with_context(failed)?;
            let file = if existed {
                tmp.persist(&landing)
                    .map_err(|e| e.error)
                    .with_context(failed)?
            } else {
                tmp.persist_noclobber(&landing).map_err(|e| {
                    anyhow::anyhow!(
                        "{label} `{}` appeared after it was checked ({}); it was left as it is. \
                         Run again (with `--force` to replace it)",
                        path.display(),
                        e.error
                    )
                })?
            };
            sync_folder(&folder);
            file
        };
        Ok(OpenedLog { file, path })
    }
}

/// Adds a newline when `file` is not empty and does not end with one.
fn end_last_line(file: &mut File) -> io::Result<()> {
    let len = file.metadata()?.len();
    if len == 0 {
        return Ok(());
    }
    file.seek(SeekFrom::Start(len - 1))?;
    let mut last = [0u8];
    file.read_exact(&mut last)?;
    if last[0] != b'\n' {
        file.write_all(b"\n")?;
    }
    Ok(())
}

/// An opened log: the file, and its path as the user gave it (for messages).
#[derive(Debug)]
pub(crate) struct OpenedLog {
    pub(crate) file: File,
    pub(crate) path: PathBuf,
}

/// The run database the guard cleared.
#[derive(Debug)]
pub(crate) struct Database {
    path: PathBuf,
    landing: PathBuf,
}

impl Database {
    /// Makes the database's folder when it is missing; returns the path to open.
    pub(crate) fn prepare(&self) -> Result<&Path> {
        let folder = parent_folder(&self.landing);
        std::fs::create_dir_all(&folder).with_context(|| {
            format!(
                "Could not create `{}` for the run database; pass `--db PATH`",
                folder.display()
            )
        })?;
        Ok(&self.path)
    }
}

/// A private temporary folder for files `rlm` makes for itself, removed when dropped.
#[derive(Debug)]
pub(crate) struct Scratch {
    dir: tempfile::TempDir,
}

impl Scratch {
    pub(crate) fn new() -> Result<Self> {
        Ok(Self {
            dir: tempfile::tempdir().context("Could not create a temporary directory")?,
        })
    }

    /// Where `relative` is in the folder.
    pub(crate) fn path(&self, relative: impl AsRef<Path>) -> PathBuf {
        self.dir.path().join(relative)
    }

    /// Writes `bytes` to `relative` (its folders made as needed); returns its path.
    pub(crate) fn write(&self, relative: impl AsRef<Path>, bytes: &[u8]) -> Result<PathBuf> {
        let path = self.path(relative);
        if let Some(folder) = path.parent() {
            std::fs::create_dir_all(folder)
                .with_context(|| format!("Could not create `{}`", folder.display()))?;
        }
        std::fs::write(&path, bytes)
            .with_context(|| format!("Could not write `{}`", path.display()))?;
        Ok(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(result: Result<impl std::fmt::Debug>) -> String {
        match result {
            Ok(handle) => panic!("expected a refusal, got {handle:?}"),
            Err(e) => {
                assert!(
                    e.downcast_ref::<UsageError>().is_some(),
                    "a usage error: {e}"
                );
                e.to_string()
            }
        }
    }

    fn guard(inputs: &[&Path], force: bool) -> Guard {
        let mut list = Inputs::new();
        for input in inputs {
            list.context(*input);
        }
        Guard::new(list, force)
    }

    #[test]
    fn an_output_that_is_an_input_is_refused_however_it_is_spelled() {
        let dir = tempfile::tempdir().expect("tempdir");
        let input = dir.path().join("ctx.txt");
        std::fs::write(&input, "data").expect("write");
        let link = dir.path().join("link.txt");
        std::os::unix::fs::symlink(&input, &link).expect("symlink");
        let hard = dir.path().join("hard.txt");
        std::fs::hard_link(&input, &hard).expect("hard link");
        std::fs::create_dir(dir.path().join("sub")).expect("mkdir");
        let dotted = dir.path().join(".").join("sub/../ctx.txt");
        for out in [&input, &link, &hard, &dotted] {
            let mut guard = guard(&[&input], true);
            let msg = refused(guard.document(Output::new("--answer-file", out)));
            assert!(msg.contains("`--answer-file`"), "{msg}");
            assert!(msg.contains("would destroy the input"), "{msg}");
            let msg = refused(guard.log(Output::new("--events", out), LogStart::Append));
            assert!(msg.contains("would destroy the input"), "{msg}");
        }
        assert_eq!(std::fs::read_to_string(&input).expect("read"), "data");
    }

    #[test]
    fn a_dangling_symlink_is_followed_to_where_the_file_would_be_made() {
        let dir = tempfile::tempdir().expect("tempdir");
        let docs = dir.path().join("docs");
        std::fs::create_dir(&docs).expect("mkdir");
        std::fs::write(docs.join("a.md"), "a").expect("write");
        let link = dir.path().join("out.jsonl");
        std::os::unix::fs::symlink(docs.join("new.jsonl"), &link).expect("symlink");
        let msg =
            refused(guard(&[&docs], true).log(Output::new("--events", &link), LogStart::Fresh));
        assert!(
            msg.contains("new file inside the context directory"),
            "{msg}"
        );
        assert!(!docs.join("new.jsonl").exists());
    }

    #[test]
    fn files_inside_a_context_folder_new_or_old_are_refused_but_not_beside_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let docs = dir.path().join("docs");
        std::fs::create_dir_all(docs.join("deep")).expect("mkdir");
        std::fs::write(docs.join("a.md"), "a").expect("write");
        let mut guard = guard(&[&docs], true);
        let msg = refused(guard.document(Output::new("--trajectory", docs.join("a.md"))));
        assert!(
            msg.contains("is a file inside the context directory"),
            "{msg}"
        );
        let msg = refused(guard.document(Output::new("--trajectory", docs.join("deep/new"))));
        assert!(
            msg.contains("new file inside the context directory"),
            "{msg}"
        );
        guard
            .document(Output::new("--trajectory", dir.path().join("beside.jsonl")))
            .expect("beside the folder is fine");
    }

    #[test]
    fn a_bundle_tree_protects_its_files_but_takes_new_ones() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("config.yaml"), "a: 1").expect("write");
        let mut inputs = Inputs::new();
        inputs.tree("the agent bundle", dir.path());
        let mut guard = Guard::new(inputs, true);
        let msg =
            refused(guard.document(Output::new("--file-log", dir.path().join("config.yaml"))));
        assert!(msg.contains("is a file of the agent bundle"), "{msg}");
        guard
            .document(Output::new("--file-log", dir.path().join("files.jsonl")))
            .expect("a new file");
    }

    #[test]
    fn two_outputs_on_one_file_and_the_database_files_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut guard = guard(&[], false);
        guard
            .database(Output::new("--db", dir.path().join(".rlm/runs.db")))
            .expect("a new database");
        for name in [".rlm/runs.db", ".rlm/./runs.db-wal", ".rlm/runs.db-journal"] {
            let msg = refused(guard.log(
                Output::new("--events", dir.path().join(name)),
                LogStart::Fresh,
            ));
            assert!(msg.contains("is the run database"), "{msg}");
        }
        guard
            .document(Output::new("--answer-file", dir.path().join("out.txt")))
            .expect("first");
        let msg =
            refused(guard.document(Output::new("--trajectory", dir.path().join("./out.txt"))));
        assert!(msg.contains("name the same file"), "{msg}");
    }

    #[test]
    fn an_existing_output_needs_force_unless_it_is_empty_or_appended_to() {
        let dir = tempfile::tempdir().expect("tempdir");
        let t = dir.path().join("t.jsonl");
        std::fs::write(&t, "{}\n").expect("write");
        let empty = dir.path().join("empty");
        std::fs::write(&empty, "").expect("write");
        assert!(
            refused(guard(&[], false).log(Output::new("--trajectory", &t), LogStart::Fresh))
                .contains("--force")
        );
        guard(&[], false)
            .document(Output::new("--answer-file", &empty))
            .expect("empty");
        guard(&[], false)
            .log(Output::new("--events", &t), LogStart::Append)
            .expect("appended");
        guard(&[], true)
            .log(Output::new("--trajectory", &t), LogStart::Fresh)
            .expect("forced");
    }

    #[test]
    fn a_document_is_replaced_whole_and_keeps_its_mode() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("answer.txt");
        std::fs::write(&path, "old answer, longer than the new one").expect("write");
        std::fs::set_permissions(&path, Permissions::from_mode(0o640)).expect("chmod");
        let doc = guard(&[], true)
            .document(Output::new("--answer-file", &path))
            .expect("cleared");
        assert_eq!(
            std::fs::read_to_string(&path).expect("read"),
            "old answer, longer than the new one",
            "declaring must not truncate"
        );
        doc.write(b"42").expect("written");
        assert_eq!(std::fs::read_to_string(&path).expect("read"), "42");
        assert_eq!(
            std::fs::metadata(&path).expect("meta").mode() & 0o777,
            0o640
        );
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .expect("ls")
            .filter_map(|e| e.ok())
            .map(|e| e.file_name())
            .collect();
        assert_eq!(
            names.len(),
            1,
            "no temporary file is left behind: {names:?}"
        );
    }

    #[test]
    fn a_document_does_not_replace_a_file_that_appeared_meanwhile() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("plot.svg");
        let doc = guard(&[], false)
            .document(Output::new("--plot", &path))
            .expect("new");
        std::fs::write(&path, "someone else's").expect("write");
        let err = doc.write(b"<svg/>").expect_err("not replaced");
        assert!(err.to_string().contains("appeared while rlm ran"), "{err}");
        assert_eq!(
            std::fs::read_to_string(&path).expect("read"),
            "someone else's"
        );
    }

    #[test]
    fn an_appended_log_keeps_its_lines_and_ends_a_torn_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("events.jsonl");
        std::fs::write(&path, "{\"a\":1}\n{\"b\":").expect("write");
        let mut log = guard(&[], false)
            .log(Output::new("--events", &path), LogStart::Append)
            .expect("cleared")
            .open()
            .expect("opened");
        log.file.write_all(b"{\"c\":3}\n").expect("append");
        assert_eq!(
            std::fs::read_to_string(&path).expect("read"),
            "{\"a\":1}\n{\"b\":\n{\"c\":3}\n"
        );
    }

    #[test]
    fn a_replaced_log_leaves_other_hard_links_as_they_were() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("t.jsonl");
        std::fs::write(&path, "old\n").expect("write");
        let other = dir.path().join("kept.jsonl");
        std::fs::hard_link(&path, &other).expect("link");
        let mut log = guard(&[], true)
            .log(Output::new("--trajectory", &path), LogStart::Fresh)
            .expect("cleared")
            .open()
            .expect("opened");
        log.file.write_all(b"new\n").expect("write");
        assert_eq!(std::fs::read_to_string(&path).expect("read"), "new\n");
        assert_eq!(std::fs::read_to_string(&other).expect("read"), "old\n");
    }

    #[test]
    fn a_pipe_is_written_in_place_never_replaced() {
        use std::io::Read as _;
        use std::os::unix::fs::FileTypeExt as _;
        let dir = tempfile::tempdir().expect("tempdir");
        let fifo = dir.path().join("pipe");
        let c_path = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).expect("path");
        // SAFETY: `c_path` is a valid NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0, "mkfifo");
        let reader = {
            let fifo = fifo.clone();
            std::thread::spawn(move || {
                let mut text = String::new();
                File::open(fifo)
                    .expect("open")
                    .read_to_string(&mut text)
                    .expect("read");
                text
            })
        };
        let mut guard = guard(&[], false);
        let answer = guard
            .document(Output::new("--answer-file", &fifo))
            .expect("a pipe");
        guard
            .log(Output::new("--trajectory", &fifo), LogStart::Fresh)
            .expect("a pipe may take two outputs");
        answer.write(b"42\n").expect("written");
        assert_eq!(reader.join().expect("reader"), "42\n");
        let meta = std::fs::symlink_metadata(&fifo).expect("still there");
        assert!(
            meta.file_type().is_fifo(),
            "still a pipe, not a file put in its place"
        );
        let names = std::fs::read_dir(dir.path()).expect("ls").count();
        assert_eq!(names, 1, "no temporary file beside it");
    }

    #[test]
    fn a_missing_folder_is_reported_unless_it_is_made() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("missing/answer.txt");
        let err = guard(&[], false)
            .document(Output::new("--answer-file", &path))
            .expect_err("a missing folder");
        assert!(err.to_string().contains("does not exist"), "{err}");
        let doc = guard(&[], false)
            .document(Output::new("--out", &path).creating_folders())
            .expect("made on write");
        assert!(
            !path.parent().expect("folder").exists(),
            "not before the write"
        );
        doc.write(b"x").expect("written");
        assert_eq!(std::fs::read_to_string(&path).expect("read"), "x");
    }
}
