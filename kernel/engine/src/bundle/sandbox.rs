//! The path sandbox: which files an agent may read and write, and the log of what it did.
//!
//! Every path is checked on its canonical form: relative paths join the base folder (the
//! project root), symbolic links and `..` are resolved by the operating system
//! (`fs::canonicalize`), and the result must lie under one of the read roots (reading) or
//! under the write root (writing). A path that does not exist yet (an output document) is
//! checked as its deepest existing ancestor, canonicalized, plus the rest of the path
//! normalized lexically — safe, because components that do not exist cannot be links.
//!
//! Files are then opened at the checked canonical path with `O_NOFOLLOW` (a link swapped in
//! after the check is refused, not followed) and `O_NONBLOCK` (a named pipe cannot hang the
//! agent), and must be regular files within the size limit. Reads must be UTF-8 text.
//!
//! Every successful read and write is recorded in the [`FileLog`], which is how tests prove
//! that start-up reads only what it must.

use std::fs::{self, File, OpenOptions};
use std::io::{Read as _, Write as _};
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::Serialize;

use super::error::{Access, FileKind, PathError};

/// The default limit on the size of a file read or written: 2 MiB.
pub const DEFAULT_MAX_FILE_BYTES: u64 = 2 * 1024 * 1024;

/// What a file access did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FileOp {
    /// Read a whole file.
    Read,
    /// Wrote (created or replaced) a file.
    Write,
    /// Appended to a file.
    Append,
}

/// One file the agent read or wrote.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FileAccess {
    /// Read, write or append.
    pub op: FileOp,
    /// The canonical path.
    pub path: PathBuf,
    /// Bytes read or written.
    pub bytes: u64,
    /// Who asked: `agent`, `start-up`, or the tool's name.
    pub by: String,
}

/// The files an agent read and wrote, in order; clones share one log.
#[derive(Debug, Clone, Default)]
pub struct FileLog(Arc<Mutex<Vec<FileAccess>>>);

impl FileLog {
    /// A copy of every access so far.
    pub fn entries(&self) -> Vec<FileAccess> {
        self.lock().clone()
    }

    /// The number of accesses so far.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether nothing was accessed yet.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    pub(crate) fn record(&self, op: FileOp, path: &Path, bytes: u64, by: &str) {
        self.lock().push(FileAccess {
            op,
            path: path.to_owned(),
            bytes,
            by: by.to_owned(),
        });
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<FileAccess>> {
        // Each push is one whole entry, so a poisoned lock still holds consistent data.
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The folders an agent may read and write.
#[derive(Debug, Clone)]
pub struct Sandbox {
    read_roots: Vec<PathBuf>,
    write_root: PathBuf,
    base: PathBuf,
    max_bytes: u64,
    log: FileLog,
}

impl Sandbox {
    /// Reads under `read_roots`, writes under `write_root`; relative paths join `base`.
    ///
    /// Roots are canonicalized here; a write root that does not exist yet is allowed (it is
    /// created with the first document saved in it).
    pub fn new(read_roots: &[PathBuf], write_root: &Path, base: &Path) -> Result<Self, PathError> {
        let mut roots = Vec::with_capacity(read_roots.len());
        for root in read_roots {
            let root = fs::canonicalize(root).map_err(|e| PathError::io(root, &e))?;
            if !roots.contains(&root) {
                roots.push(root);
            }
        }
        let base = fs::canonicalize(base).map_err(|e| PathError::io(base, &e))?;
        let write_root = locate(&absolute(write_root, &base))?;
        Ok(Self {
            read_roots: roots,
            write_root,
            base,
            max_bytes: DEFAULT_MAX_FILE_BYTES,
            log: FileLog::default(),
        })
    }

    /// The same sandbox with a different size limit for files read and written.
    pub fn with_max_bytes(mut self, max_bytes: u64) -> Self {
        self.max_bytes = max_bytes;
        self
    }

    /// The same sandbox recording into `log`.
    pub fn with_log(mut self, log: FileLog) -> Self {
        self.log = log;
        self
    }

    /// The same sandbox writing under `write_root` instead.
    pub fn with_write_root(mut self, write_root: &Path) -> Result<Self, PathError> {
        self.write_root = locate(&absolute(write_root, &self.base))?;
        Ok(self)
    }

    /// The size limit of a file read or written, in bytes.
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// The log of files read and written.
    pub fn log(&self) -> &FileLog {
        &self.log
    }

    /// The folder writes must stay under (canonical).
    pub fn write_root(&self) -> &Path {
        &self.write_root
    }

    /// The folders reads must stay under (canonical).
    pub fn read_roots(&self) -> &[PathBuf] {
        &self.read_roots
    }

    /// The canonical path of `path` if it may be read (it need not exist).
    pub fn check_read(&self, path: &str) -> Result<PathBuf, PathError> {
        let resolved = locate(&absolute(Path::new(check_text(path)?), &self.base))?;
        if self
            .read_roots
            .iter()
            .any(|root| resolved.starts_with(root))
        {
            Ok(resolved)
        } else {
            Err(PathError::Outside {
                path: resolved,
                access: Access::Read,
                roots: self.read_roots.clone(),
            })
        }
    }

    /// The canonical path of `path` if it may be written (it need not exist).
    pub fn check_write(&self, path: &str) -> Result<PathBuf, PathError> {
        let resolved = locate(&absolute(Path::new(check_text(path)?), &self.base))?;
        self.check_under_write_root(resolved)
    }

    /// Whether `path` is a regular file that may be read (nothing is read or logged).
    pub fn is_readable_file(&self, path: &str) -> bool {
        self.check_read(path)
            .is_ok_and(|p| fs::metadata(p).is_ok_and(|m| m.is_file()))
    }

    /// The text of the file at `path`, with its canonical path; `by` goes into the log.
    pub fn read_text(&self, path: &str, by: &str) -> Result<(PathBuf, String), PathError> {
        let resolved = self.check_read(path)?;
        let file = open_existing(&resolved, OpenOptions::new().read(true))?;
        let size = checked_size(&file, &resolved, self.max_bytes)?;
        let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
        // `take` guards against a file that grows after the size check.
        file.take(self.max_bytes.saturating_add(1))
            .read_to_end(&mut bytes)
            .map_err(|e| PathError::io(&resolved, &e))?;
        if bytes.len() as u64 > self.max_bytes {
            return Err(PathError::TooLarge {
                path: resolved,
                size: bytes.len() as u64,
                limit: self.max_bytes,
            });
        }
        let text = String::from_utf8(bytes).map_err(|_| PathError::NotText {
            path: resolved.clone(),
        })?;
        self.log
            .record(FileOp::Read, &resolved, text.len() as u64, by);
        Ok((resolved, text))
    }

    /// Writes (or appends) `content` to `path`, creating folders; returns the canonical path.
    pub fn write_text(
        &self,
        path: &str,
        content: &str,
        append: bool,
        by: &str,
    ) -> Result<PathBuf, PathError> {
        let resolved = self.check_write(path)?;
        let bytes = content.len() as u64;
        if bytes > self.max_bytes {
            return Err(PathError::TooLarge {
                path: resolved,
                size: bytes,
                limit: self.max_bytes,
            });
        }
        match fs::symlink_metadata(&resolved) {
            Ok(meta) if !meta.is_file() => {
                return Err(PathError::NotAFile {
                    path: resolved,
                    kind: kind_of(&meta),
                });
            }
            Ok(_) | Err(_) => {}
        }
        let parent = resolved.parent().unwrap_or(&self.write_root);
        fs::create_dir_all(parent).map_err(|e| PathError::io(parent, &e))?;
        // The folders now exist: check again on the canonical form, in case a link was
        // swapped in while they were made.
        let resolved = self.check_under_write_root(locate(&resolved)?)?;
        let mut options = OpenOptions::new();
        options.write(true).create(true);
        if append {
            options.append(true);
        } else {
            options.truncate(true);
        }
        let mut file = open_existing(&resolved, &mut options)?;
        file.write_all(content.as_bytes())
            .map_err(|e| PathError::io(&resolved, &e))?;
        let op = if append {
            FileOp::Append
        } else {
            FileOp::Write
        };
        self.log.record(op, &resolved, bytes, by);
        Ok(resolved)
    }

    fn check_under_write_root(&self, resolved: PathBuf) -> Result<PathBuf, PathError> {
        if resolved.starts_with(&self.write_root) {
            Ok(resolved)
        } else {
            Err(PathError::Outside {
                path: resolved,
                access: Access::Write,
                roots: vec![self.write_root.clone()],
            })
        }
    }
}

fn check_text(path: &str) -> Result<&str, PathError> {
    if path.contains('\0') {
        return Err(PathError::Nul);
    }
    if path.trim().is_empty() {
        return Err(PathError::Empty);
    }
    Ok(path)
}

fn absolute(path: &Path, base: &Path) -> PathBuf {
    if path.is_absolute() {
        path.to_owned()
    } else {
        base.join(path)
    }
}

/// The canonical form of `path`: its deepest existing ancestor canonicalized, plus the
/// components below it normalized lexically (`.` dropped, `..` taking one off).
fn locate(path: &Path) -> Result<PathBuf, PathError> {
    let components: Vec<Component<'_>> = path.components().collect();
    for split in (0..=components.len()).rev() {
        let prefix: PathBuf = components[..split].iter().collect();
        if prefix.as_os_str().is_empty() {
            continue;
        }
        match fs::canonicalize(&prefix) {
            Ok(mut resolved) => {
                for component in &components[split..] {
                    match component {
                        Component::ParentDir => {
                            resolved.pop();
                        }
                        Component::Normal(name) => resolved.push(name),
                        Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
                    }
                }
                return Ok(resolved);
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // A link whose target is missing exists itself: following it lexically
                // would write wherever it points.
                if fs::symlink_metadata(&prefix).is_ok() {
                    return Err(PathError::NotAFile {
                        path: prefix,
                        kind: FileKind::DanglingLink,
                    });
                }
            }
            Err(e) => return Err(PathError::io(&prefix, &e)),
        }
    }
    Err(PathError::NotFound {
        path: path.to_owned(),
    })
}

/// Opens `path` (already canonical) without following a link and without blocking on a
/// pipe; only a regular file is accepted.
fn open_existing(path: &Path, options: &mut OpenOptions) -> Result<File, PathError> {
    use std::os::unix::fs::OpenOptionsExt as _;
    options.custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK);
    if let Ok(meta) = fs::symlink_metadata(path)
        && !meta.is_file()
    {
        return Err(PathError::NotAFile {
            path: path.to_owned(),
            kind: kind_of(&meta),
        });
    }
    let file = options.open(path).map_err(|e| PathError::io(path, &e))?;
    let meta = file.metadata().map_err(|e| PathError::io(path, &e))?;
    if !meta.is_file() {
        return Err(PathError::NotAFile {
            path: path.to_owned(),
            kind: kind_of(&meta),
        });
    }
    Ok(file)
}

fn checked_size(file: &File, path: &Path, limit: u64) -> Result<u64, PathError> {
    let size = file.metadata().map_err(|e| PathError::io(path, &e))?.len();
    if size > limit {
        return Err(PathError::TooLarge {
            path: path.to_owned(),
            size,
            limit,
        });
    }
    Ok(size)
}

fn kind_of(meta: &fs::Metadata) -> FileKind {
    use std::os::unix::fs::FileTypeExt as _;
    let kind = meta.file_type();
    if kind.is_dir() {
        FileKind::Directory
    } else if kind.is_char_device() || kind.is_block_device() {
        FileKind::Device
    } else if kind.is_fifo() {
        FileKind::Fifo
    } else if kind.is_socket() {
        FileKind::Socket
    } else if kind.is_symlink() {
        FileKind::DanglingLink
    } else {
        FileKind::Other
    }
}
