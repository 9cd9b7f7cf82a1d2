//! Files opened and replaced beneath a directory handle, never through a link: the ground
//! the [`Sandbox`](super::Sandbox) stands on.
//!
//! A path the sandbox accepted (canonical, under a root) can change between the check and
//! the use: a folder in the middle swapped for a symbolic link to elsewhere. So no file is
//! opened by its path string. Each root is opened once as a directory handle, and a file is
//! opened relative to it with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
//! RESOLVE_NO_MAGICLINKS)`: the kernel refuses a link (or `..`) anywhere on the way, so a
//! swap makes the open fail — closed — and never leads outside. Where `openat2` is missing
//! (Linux before 5.6, or a seccomp filter that answers ENOSYS), the same walk is made one
//! component at a time with `openat(O_NOFOLLOW | O_DIRECTORY)` from the verified parent,
//! which refuses a link at every step just the same.
//!
//! A write walks that way to its folder, creating missing folders with `mkdirat` relative to
//! the verified parent, writes a temporary file created there with `O_CREAT | O_EXCL`, and
//! `renameat`s it over the target. A rename replaces a name: it never writes through a link,
//! and never into the inode that another hard link (maybe outside) shares.
//!
//! Paths come in as plain names only (the sandbox resolves `.` and `..` before), so the
//! kernel never sees a `..`.

use std::ffi::OsStr;
use std::io::Write as _;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags, Stat};
use rustix::io::Errno;

/// Set once `openat2` answered ENOSYS: the walk is used from then on.
static NO_OPENAT2: AtomicBool = AtomicBool::new(false);

/// Numbers the temporary files of this process.
static NEXT_TEMPORARY: AtomicU64 = AtomicU64::new(0);

/// How a file beneath a root is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resolver {
    /// `openat2` where the kernel has it, else the walk.
    Best,
    /// One `openat(O_NOFOLLOW)` per component (what runs without `openat2`).
    #[cfg_attr(not(test), allow(dead_code))]
    Walk,
}

/// Opens the directory at `path` (canonical) as a handle to resolve beneath.
pub(crate) fn open_root(path: &Path) -> std::io::Result<OwnedFd> {
    Ok(rustix::fs::open(
        path,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// Opens `names` (plain names) beneath `root` with `flags`, following no link.
pub(crate) fn open_beneath(
    root: BorrowedFd<'_>,
    names: &[&OsStr],
    flags: OFlags,
    resolver: Resolver,
) -> Result<OwnedFd, Errno> {
    let flags = flags | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    if resolver == Resolver::Best && !NO_OPENAT2.load(Ordering::Relaxed) {
        let mut joined = std::path::PathBuf::new();
        joined.extend(names);
        if joined.as_os_str().is_empty() {
            joined.push(".");
        }
        match rustix::fs::openat2(
            root,
            &joined,
            flags,
            Mode::empty(),
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
        ) {
            Err(Errno::NOSYS) => NO_OPENAT2.store(true, Ordering::Relaxed),
            // A seccomp filter may answer EPERM for a call it does not know.
            Err(Errno::PERM) => {}
            // A race can make a resolution retry until the kernel gives up; the walk below
            // then decides, failing closed just the same.
            Err(Errno::AGAIN) => {}
            other => return other,
        }
    }
    let Some((last, folders)) = names.split_last() else {
        return rustix::fs::openat(root, ".", flags, Mode::empty());
    };
    let parent = walk(root, folders, false)?;
    rustix::fs::openat(parent.as_fd(), *last, flags, Mode::empty())
}

/// The folder `names` beneath `root`, each component opened with `O_NOFOLLOW`; with
/// `create`, missing folders are made on the way.
fn walk(root: BorrowedFd<'_>, names: &[&OsStr], create: bool) -> Result<OwnedFd, Errno> {
    let mut dir = rustix::io::dup(root)?;
    for name in names {
        if create {
            match rustix::fs::mkdirat(dir.as_fd(), *name, Mode::from_raw_mode(0o777)) {
                Ok(()) | Err(Errno::EXIST) => {}
                Err(e) => return Err(e),
            }
        }
        dir = match rustix::fs::openat(
            dir.as_fd(),
            *name,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(next) => next,
            // A link is refused as not a folder; say it was a link, as `openat2` does.
            Err(Errno::NOTDIR) if is_link(dir.as_fd(), name) => return Err(Errno::LOOP),
            Err(e) => return Err(e),
        };
    }
    Ok(dir)
}

/// Whether `name` in `dir` is a symbolic link.
fn is_link(dir: BorrowedFd<'_>, name: &OsStr) -> bool {
    rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
        .is_ok_and(|stat| file_type(&stat) == FileType::Symlink)
}

/// What stands at a name a write is about to replace.
#[derive(Debug)]
pub(crate) enum Existing {
    /// Nothing yet.
    Nothing,
    /// Something, as `lstat` sees it.
    Found(Stat),
}

/// Why a replacement did not happen.
#[derive(Debug)]
pub(crate) enum ReplaceError {
    /// The system refused a step.
    Os(Errno),
    /// The check of what stands at the name refused it.
    Refused(super::PathError),
}

impl From<Errno> for ReplaceError {
    fn from(errno: Errno) -> Self {
        Self::Os(errno)
    }
}

/// Replaces the file `name` in the folder `folders` beneath `root` (folders created as
/// needed) with `content`, through a temporary file and a rename. `check` sees what stands
/// at the name first and may refuse it.
pub(crate) fn replace(
    root: BorrowedFd<'_>,
    folders: &[&OsStr],
    name: &OsStr,
    content: &[u8],
    check: impl FnOnce(&Existing) -> Result<(), super::PathError>,
) -> Result<(), ReplaceError> {
    // An `O_PATH` handle is enough for the `*at` calls below.
    let dir = walk(root, folders, true)?;
    let existing = match rustix::fs::statat(dir.as_fd(), name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(stat) => Existing::Found(stat),
        Err(Errno::NOENT) => Existing::Nothing,
        Err(e) => return Err(e.into()),
    };
    check(&existing).map_err(ReplaceError::Refused)?;
    let mode = match &existing {
        // Keep the permission bits of the file replaced (not set-id bits).
        Existing::Found(stat) => Mode::from_raw_mode(stat.st_mode & 0o777),
        Existing::Nothing => Mode::from_raw_mode(0o666),
    };
    let temporary = format!(
        ".{}.rlm-{}-{}.tmp",
        name.to_string_lossy(),
        std::process::id(),
        NEXT_TEMPORARY.fetch_add(1, Ordering::Relaxed)
    );
    let fd = rustix::fs::openat(
        dir.as_fd(),
        temporary.as_str(),
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        mode,
    )?;
    let written = (|| {
        if matches!(existing, Existing::Found(_)) {
            // The umask applied at creation; the replaced file's bits win.
            rustix::fs::fchmod(&fd, mode)?;
        }
        let mut file = std::fs::File::from(fd);
        file.write_all(content).map_err(io_errno)?;
        file.flush().map_err(io_errno)?;
        rustix::fs::renameat(dir.as_fd(), temporary.as_str(), dir.as_fd(), name)
    })();
    if let Err(e) = written {
        let _ = rustix::fs::unlinkat(dir.as_fd(), temporary.as_str(), AtFlags::empty());
        return Err(e.into());
    }
    Ok(())
}

/// The type of the file a `stat` describes.
pub(crate) fn file_type(stat: &Stat) -> FileType {
    FileType::from_raw_mode(stat.st_mode)
}

fn io_errno(err: std::io::Error) -> Errno {
    err.raw_os_error()
        .map_or(Errno::IO, Errno::from_raw_os_error)
}
