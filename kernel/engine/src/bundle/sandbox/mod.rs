//! The path sandbox: which files an agent's tools may read and write, and the log of what
//! they did — roots and a policy in, a handle out that opens files only beneath the roots.
//!
//! The roots come from the user (the command line, the working directory), never from what
//! a bundle says; [`SandboxPolicy`] holds what the user allows beyond the default.
//!
//! A path is first checked on its canonical form: relative paths join the base folder (the
//! project root), `..` and symbolic links are resolved (`fs::canonicalize`; a link inside
//! the roots may be used), and the result must lie under a read root (reading) or the write
//! root (writing). A path that does not exist yet (an output document) is checked as its
//! deepest existing ancestor, canonicalized, plus the rest normalized lexically.
//!
//! The file is then reached from a handle on the root, never by the path string
//! (`beneath.rs`): every component is resolved beneath the root without following a link,
//! so a folder swapped for a link between the check and the open makes the call fail, not
//! escape. Reads open with `O_NONBLOCK` (a named pipe cannot hang the agent) and accept only
//! regular files within the size limit, UTF-8 text. Writes replace the whole file through a
//! temporary file and a rename in the verified folder.
//!
//! Refused besides what lies outside: a regular file with more than one hard link (its other
//! name may be outside: never written, read only when the policy allows it); anything in a
//! version-control folder (`.git`, `.hg`, `.svn`, `.jj`, …) for writing, since a hook written
//! there runs at the next commit; and a path only under a broad root — `/`, the home
//! directory (or a folder above it), or a parent of the base folder — unless the policy
//! allows broad roots.
//!
//! Every successful read and write is recorded in the [`FileLog`], which is how tests prove
//! that start-up reads only what it must.

mod beneath;

use std::ffi::OsStr;
use std::fs::{self, File};
use std::io::Read as _;
use std::os::fd::{AsFd as _, OwnedFd};
use std::os::unix::fs::MetadataExt as _;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};

use rustix::fs::{FileType, OFlags};
use rustix::io::Errno;
use serde::Serialize;

use self::beneath::{Existing, ReplaceError, Resolver};
use super::error::{Access, BroadRoot, FileKind, PathError};

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

/// What the user allows the tools beyond the default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SandboxPolicy {
    /// Read regular files with more than one hard link (their other names may be outside
    /// the roots). Such files are never written.
    pub allow_hard_links: bool,
    /// Use a broad root: `/`, the home directory (or a folder above it), or a parent of the
    /// base folder.
    pub allow_broad_roots: bool,
}

/// Folders of version-control systems: never written by tools.
const VCS_FOLDERS: [&str; 8] = [
    ".git", ".hg", ".svn", ".jj", ".bzr", "_darcs", ".pijul", "CVS",
];

/// A root: its canonical path, a handle to resolve beneath, and whether it is broad.
#[derive(Debug, Clone)]
struct Root {
    path: PathBuf,
    fd: Arc<OwnedFd>,
    broad: Option<BroadRoot>,
}

impl Root {
    fn open(path: PathBuf, base: &Path, home: Option<&Path>) -> Result<Self, PathError> {
        let fd = beneath::open_root(&path).map_err(|e| PathError::io(&path, &e))?;
        let broad = broad_root(&path, base, home);
        Ok(Self {
            path,
            fd: Arc::new(fd),
            broad,
        })
    }
}

/// The write root: its canonical path (it need not exist) and the deepest existing folder at
/// or above it, which writes start from.
#[derive(Debug, Clone)]
struct WriteRoot {
    path: PathBuf,
    anchor: Root,
    broad: Option<BroadRoot>,
}

/// The folders an agent may read and write (see the module docs).
#[derive(Debug, Clone)]
pub struct Sandbox {
    read_roots: Vec<Root>,
    read_paths: Vec<PathBuf>,
    write: WriteRoot,
    base: PathBuf,
    home: Option<PathBuf>,
    max_bytes: u64,
    policy: SandboxPolicy,
    resolver: Resolver,
    log: FileLog,
}

impl Sandbox {
    /// Reads under `read_roots`, writes under `write_root`; relative paths join `base`.
    ///
    /// Roots are canonicalized and opened here; a write root that does not exist yet is
    /// allowed (it is created with the first document saved in it).
    pub(crate) fn new(
        read_roots: &[PathBuf],
        write_root: &Path,
        base: &Path,
    ) -> Result<Self, PathError> {
        let base = fs::canonicalize(base).map_err(|e| PathError::io(base, &e))?;
        let home = std::env::var_os("HOME")
            .filter(|h| !h.is_empty())
            .and_then(|h| fs::canonicalize(h).ok());
        let mut roots: Vec<Root> = Vec::with_capacity(read_roots.len());
        for root in read_roots {
            let root = fs::canonicalize(root).map_err(|e| PathError::io(root, &e))?;
            if !roots.iter().any(|r| r.path == root) {
                roots.push(Root::open(root, &base, home.as_deref())?);
            }
        }
        let read_paths = roots.iter().map(|r| r.path.clone()).collect();
        let write = write_root_at(&absolute(write_root, &base), &base, home.as_deref())?;
        Ok(Self {
            read_roots: roots,
            read_paths,
            write,
            base,
            home,
            max_bytes: DEFAULT_MAX_FILE_BYTES,
            policy: SandboxPolicy::default(),
            resolver: Resolver::Best,
            log: FileLog::default(),
        })
    }

    /// The same sandbox with a different size limit for files read and written.
    pub(crate) fn with_max_bytes(mut self, max_bytes: u64) -> Self {
        self.max_bytes = max_bytes;
        self
    }

    /// The same sandbox recording into `log`.
    pub(crate) fn with_log(mut self, log: FileLog) -> Self {
        self.log = log;
        self
    }

    /// The same sandbox allowing what `policy` allows.
    pub(crate) fn with_policy(mut self, policy: SandboxPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// The same sandbox writing under `write_root` instead.
    pub(crate) fn with_write_root(mut self, write_root: &Path) -> Result<Self, PathError> {
        self.write = write_root_at(
            &absolute(write_root, &self.base),
            &self.base,
            self.home.as_deref(),
        )?;
        Ok(self)
    }

    /// The size limit of a file read or written, in bytes.
    pub(crate) fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// What the user allows beyond the default.
    pub(crate) fn policy(&self) -> SandboxPolicy {
        self.policy
    }

    /// The log of files read and written.
    pub(crate) fn log(&self) -> &FileLog {
        &self.log
    }

    /// The folder writes must stay under (canonical).
    pub fn write_root(&self) -> &Path {
        &self.write.path
    }

    /// The canonical path of `path` if it lies under a read root (it need not exist).
    pub(crate) fn check_read(&self, path: &str) -> Result<PathBuf, PathError> {
        let resolved = locate(&absolute(Path::new(check_text(path)?), &self.base))?;
        if self
            .read_roots
            .iter()
            .any(|root| resolved.starts_with(&root.path))
        {
            Ok(resolved)
        } else {
            Err(PathError::Outside {
                path: resolved,
                access: Access::Read,
                roots: self.read_paths.clone(),
            })
        }
    }

    /// The canonical path of `path` if it may be written (it need not exist): under the
    /// write root and in no version-control folder.
    pub(crate) fn check_write(&self, path: &str) -> Result<PathBuf, PathError> {
        let resolved = locate(&absolute(Path::new(check_text(path)?), &self.base))?;
        if !resolved.starts_with(&self.write.path) {
            return Err(PathError::Outside {
                path: resolved,
                access: Access::Write,
                roots: vec![self.write.path.clone()],
            });
        }
        // Below the project (or, outside it, below the write root): a version-control
        // folder above the project is the user's business.
        let inside = resolved
            .strip_prefix(&self.base)
            .or_else(|_| resolved.strip_prefix(&self.write.anchor.path))
            .unwrap_or(&resolved);
        if let Some(folder) = inside.components().find_map(|c| match c {
            Component::Normal(name) => is_vcs_folder(name).then(|| name.to_owned()),
            _ => None,
        }) {
            return Err(PathError::VersionControl {
                path: resolved,
                folder: PathBuf::from(folder),
            });
        }
        Ok(resolved)
    }

    /// Whether `path` is a regular file that may be read (nothing is read or logged).
    pub(crate) fn is_readable_file(&self, path: &str) -> bool {
        self.check_read(path)
            .is_ok_and(|p| fs::metadata(p).is_ok_and(|m| m.is_file()))
    }

    /// The text of the file at `path`, with its canonical path; `by` goes into the log.
    pub(crate) fn read_text(&self, path: &str, by: &str) -> Result<(PathBuf, String), PathError> {
        let resolved = self.check_read(path)?;
        let root = self.read_root_of(&resolved)?;
        // Refused before opening: opening a device may do something by itself.
        if let Ok(meta) = fs::symlink_metadata(&resolved)
            && !meta.is_file()
        {
            return Err(PathError::NotAFile {
                path: resolved,
                kind: kind_of(&meta),
            });
        }
        let names = names_below(&resolved, &root.path);
        let fd = beneath::open_beneath(
            root.fd.as_fd(),
            &names,
            OFlags::RDONLY | OFlags::NONBLOCK,
            self.resolver,
        )
        .map_err(|e| open_error(&resolved, e))?;
        let file = File::from(fd);
        let meta = file.metadata().map_err(|e| PathError::io(&resolved, &e))?;
        if !meta.is_file() {
            return Err(PathError::NotAFile {
                path: resolved,
                kind: kind_of(&meta),
            });
        }
        if meta.nlink() > 1 && !self.policy.allow_hard_links {
            return Err(PathError::HardLink {
                path: resolved,
                links: meta.nlink(),
                access: Access::Read,
            });
        }
        if meta.len() > self.max_bytes {
            return Err(PathError::TooLarge {
                path: resolved,
                size: meta.len(),
                limit: self.max_bytes,
            });
        }
        let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
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

    /// Writes `content` as the whole file at `path`, creating folders; returns the canonical
    /// path. The file is replaced at once (a temporary file renamed over it), so it never
    /// holds half of the text, and its size is at most the limit.
    pub(crate) fn write_text(
        &self,
        path: &str,
        content: &str,
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
        if let Some(broad) = self.write.broad.filter(|_| !self.policy.allow_broad_roots) {
            return Err(PathError::Broad {
                path: resolved,
                root: self.write.path.clone(),
                broad,
            });
        }
        let names = names_below(&resolved, &self.write.anchor.path);
        let Some((name, folders)) = names.split_last() else {
            return Err(PathError::NotAFile {
                path: resolved,
                kind: FileKind::Directory,
            });
        };
        let check = |existing: &Existing| match existing {
            Existing::Nothing => Ok(()),
            Existing::Found(stat) => {
                let kind = beneath::file_type(stat);
                if kind != FileType::RegularFile {
                    Err(PathError::NotAFile {
                        path: resolved.clone(),
                        kind: kind_of_type(kind),
                    })
                } else if stat.st_nlink > 1 {
                    Err(PathError::HardLink {
                        path: resolved.clone(),
                        links: stat.st_nlink,
                        access: Access::Write,
                    })
                } else {
                    Ok(())
                }
            }
        };
        beneath::replace(
            self.write.anchor.fd.as_fd(),
            folders,
            name,
            content.as_bytes(),
            check,
        )
        .map_err(|e| match e {
            ReplaceError::Refused(refused) => refused,
            ReplaceError::Os(Errno::ISDIR) => PathError::NotAFile {
                path: resolved.clone(),
                kind: FileKind::Directory,
            },
            ReplaceError::Os(errno) => open_error(&resolved, errno),
        })?;
        self.log.record(FileOp::Write, &resolved, bytes, by);
        Ok(resolved)
    }

    /// The root a read of `resolved` goes through: one that is not broad (unless the policy
    /// allows broad roots).
    fn read_root_of(&self, resolved: &Path) -> Result<&Root, PathError> {
        let mut broad = None;
        for root in &self.read_roots {
            if !resolved.starts_with(&root.path) {
                continue;
            }
            match root.broad {
                Some(why) if !self.policy.allow_broad_roots => {
                    broad.get_or_insert((root, why));
                }
                _ => return Ok(root),
            }
        }
        match broad {
            Some((root, why)) => Err(PathError::Broad {
                path: resolved.to_owned(),
                root: root.path.clone(),
                broad: why,
            }),
            None => Err(PathError::Outside {
                path: resolved.to_owned(),
                access: Access::Read,
                roots: self.read_paths.clone(),
            }),
        }
    }

    /// This sandbox resolving one component at a time, as it does without `openat2`.
    #[cfg(test)]
    fn walking(mut self) -> Self {
        self.resolver = Resolver::Walk;
        self
    }
}

/// The write root at `path` (absolute): canonical where it exists, anchored at its deepest
/// existing folder.
fn write_root_at(path: &Path, base: &Path, home: Option<&Path>) -> Result<WriteRoot, PathError> {
    let located = locate(path)?;
    let anchor = located
        .ancestors()
        .find(|a| fs::symlink_metadata(a).is_ok_and(|m| m.is_dir()))
        .unwrap_or(Path::new("/"))
        .to_owned();
    let broad = broad_root(&located, base, home);
    Ok(WriteRoot {
        path: located,
        anchor: Root::open(anchor, base, home)?,
        broad,
    })
}

/// Whether `root` is broad: `/`, the home directory or a folder above it, or a parent of
/// `base`.
fn broad_root(root: &Path, base: &Path, home: Option<&Path>) -> Option<BroadRoot> {
    if root.parent().is_none() {
        Some(BroadRoot::FilesystemRoot)
    } else if home.is_some_and(|home| home.starts_with(root)) {
        Some(BroadRoot::Home)
    } else if base.starts_with(root) && base != root {
        Some(BroadRoot::ParentOfProject)
    } else {
        None
    }
}

pub(crate) fn is_vcs_folder(name: &OsStr) -> bool {
    let name = name.to_string_lossy();
    VCS_FOLDERS.iter().any(|vcs| {
        if vcs.starts_with('.') || vcs.starts_with('_') {
            name.eq_ignore_ascii_case(vcs)
        } else {
            name == *vcs
        }
    })
}

/// The names of `path` below `root` (which it starts with; both canonical or normalized, so
/// every one is a plain name).
fn names_below<'p>(path: &'p Path, root: &Path) -> Vec<&'p OsStr> {
    path.strip_prefix(root)
        .map(|rest| {
            rest.components()
                .filter_map(|c| match c {
                    Component::Normal(name) => Some(name),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The error for a file that could not be opened or replaced beneath its root.
fn open_error(path: &Path, errno: Errno) -> PathError {
    match errno {
        // A link on the way: absent from the checked path, so it appeared since.
        Errno::LOOP | Errno::XDEV => PathError::Changed {
            path: path.to_owned(),
        },
        _ => PathError::io(path, &std::io::Error::from(errno)),
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
pub(crate) fn locate(path: &Path) -> Result<PathBuf, PathError> {
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

fn kind_of_type(kind: FileType) -> FileKind {
    match kind {
        FileType::Directory => FileKind::Directory,
        FileType::CharacterDevice | FileType::BlockDevice => FileKind::Device,
        FileType::Fifo => FileKind::Fifo,
        FileType::Socket => FileKind::Socket,
        FileType::Symlink => FileKind::Link,
        _ => FileKind::Other,
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::time::{Duration, Instant};

    use super::*;

    /// A swapper thread turns `root/mid` into a link to `outside/mid` and back while reads
    /// and writes go through `mid`: none may reach `outside`.
    fn race(sandbox: impl Fn(&Path) -> Sandbox) {
        let dir = tempfile::tempdir().expect("tempdir");
        let outer = fs::canonicalize(dir.path()).expect("canonical");
        let (root, outside) = (outer.join("root"), outer.join("outside"));
        fs::create_dir_all(root.join("mid")).expect("mkdir");
        fs::create_dir_all(outside.join("mid")).expect("mkdir");
        fs::write(root.join("mid/f.txt"), "inside").expect("write");
        fs::write(outside.join("mid/f.txt"), "OUTSIDE").expect("write");
        let sandbox = sandbox(&root);
        let stop = AtomicBool::new(false);
        let swaps = AtomicUsize::new(0);
        let (mut read_ok, mut write_ok, mut refused) = (0, 0, 0);
        let deadline = Instant::now() + Duration::from_secs(4);
        std::thread::scope(|scope| {
            scope.spawn(|| {
                // `mid` is always there: the folder and the link trade places atomically.
                symlink(outside.join("mid"), root.join("link")).expect("symlink");
                let exchange = || {
                    rustix::fs::renameat_with(
                        rustix::fs::CWD,
                        root.join("mid"),
                        rustix::fs::CWD,
                        root.join("link"),
                        rustix::fs::RenameFlags::EXCHANGE,
                    )
                    .expect("exchange")
                };
                // Each state holds a moment, so that calls start in both and some cross a swap.
                let pause = Duration::from_micros(20);
                while !stop.load(Ordering::Relaxed) {
                    exchange();
                    std::thread::sleep(pause);
                    exchange();
                    std::thread::sleep(pause);
                    swaps.fetch_add(1, Ordering::Relaxed);
                }
            });
            for i in 0..3_000 {
                if Instant::now() > deadline {
                    break;
                }
                match sandbox.read_text("mid/f.txt", "test") {
                    Ok((_, text)) => {
                        assert_eq!(text, "inside", "a read escaped after {i} reads");
                        read_ok += 1;
                    }
                    Err(_) => refused += 1,
                }
                match sandbox.write_text(&format!("mid/w{i}.txt"), "x", "test") {
                    Ok(_) => write_ok += 1,
                    Err(_) => refused += 1,
                }
            }
            stop.store(true, Ordering::Relaxed);
        });
        let escaped: Vec<_> = fs::read_dir(outside.join("mid"))
            .expect("read")
            .filter_map(Result::ok)
            .map(|e| e.file_name())
            .filter(|n| n != "f.txt")
            .collect();
        assert!(escaped.is_empty(), "writes escaped: {escaped:?}");
        assert_eq!(
            fs::read_to_string(outside.join("mid/f.txt")).expect("read"),
            "OUTSIDE"
        );
        // The race did run, and the calls between swaps went through.
        assert!(swaps.load(Ordering::Relaxed) > 10, "the swapper ran");
        assert!(
            read_ok > 0 && write_ok > 0,
            "{read_ok} reads, {write_ok} writes"
        );
        eprintln!(
            "{} swaps: {read_ok} reads and {write_ok} writes went through, {refused} refused",
            swaps.load(Ordering::Relaxed)
        );
    }

    fn plain(root: &Path) -> Sandbox {
        Sandbox::new(&[root.to_owned()], root, root).expect("sandbox")
    }

    #[test]
    fn a_folder_swapped_for_a_link_mid_call_never_leads_outside() {
        race(plain);
    }

    #[test]
    fn without_openat2_the_walk_holds_just_the_same() {
        race(|root| plain(root).walking());
    }

    #[test]
    fn a_link_on_the_way_is_refused_beneath_the_root_by_either_resolver() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = fs::canonicalize(dir.path()).expect("canonical");
        fs::create_dir(root.join("real")).expect("mkdir");
        fs::write(root.join("real/f.txt"), "x").expect("write");
        symlink(root.join("real"), root.join("link")).expect("symlink");
        let fd = beneath::open_root(&root).expect("root");
        for resolver in [Resolver::Best, Resolver::Walk] {
            let names = [OsStr::new("link"), OsStr::new("f.txt")];
            let err = beneath::open_beneath(fd.as_fd(), &names, OFlags::RDONLY, resolver)
                .expect_err("a link on the way");
            assert!(
                matches!(err, Errno::LOOP | Errno::XDEV),
                "{resolver:?}: {err}"
            );
            let names = [OsStr::new("real"), OsStr::new("f.txt")];
            assert!(
                beneath::open_beneath(fd.as_fd(), &names, OFlags::RDONLY, resolver).is_ok(),
                "{resolver:?}"
            );
        }
    }
}
