//! Scratch directories: a worker's only writable place (`SCRATCH`, also its `HOME` and
//! `TMPDIR`), a fresh folder of mode `0700` under the temporary folder, made and removed by
//! [`Scratch`] alone: removed when the session that holds it closes, once its worker ended,
//! or, for a worker confined ahead of need (`pool.rs`), when the pool ends that worker.
//!
//! A process that ends without running that (`kill -9`, the out-of-memory killer, a second
//! Ctrl-C, a power cut) leaves its directories behind. The next process that makes one
//! removes, once, on a thread of its own ([`sweep`]), those that are provably ours and dead:
//!
//! - **Dead.** The process that makes a directory holds an exclusive `flock` on it for the
//!   directory's whole life, and gives it its sweepable name (`rlm-scratch-l-` and six
//!   letters or digits) only once it holds it: it makes the directory as `rlm-scratch-` and
//!   six, locks it, then renames it. The kernel drops the lock when the process ends,
//!   however it ends (and only when every fork that shares it has ended too), so a lock taken
//!   at once is the proof that the maker is gone. No pid is read: pids are reused, and a
//!   process in another PID namespace sharing the temporary folder has pids of its own.
//! - **Ours.** Only that name (older versions, which took no lock, made `rlm-scratch-` and
//!   six: never touched, since an unlocked one of theirs may be in use; nor is a directory
//!   whose lock or rename failed here); only a directory itself (opened without following a
//!   symbolic link), of this user, of mode `0700` as made here, in a temporary folder where
//!   no other user can rename an entry (sticky, as `/tmp`, or writable by this user alone).
//! - **Nothing lost.** Only an empty directory is removed (`rmdir`): one that holds
//!   anything, the files a killed run's code wrote or anything someone put there, stays. It
//!   is removed only if its name still names the directory that was locked.

use std::ffi::OsStr;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Once;

use rustix::fs::{AtFlags, FileType, FlockOperation, Mode, OFlags, RenameFlags};

/// What a directory is made as, before it is locked.
const MADE: &str = "rlm-scratch-";
/// What it is renamed to once locked: the only name [`sweep`] removes.
const LOCKED: &str = "rlm-scratch-l-";
/// The random part of both names (`tempfile`'s default length).
const RANDOM_CHARS: usize = 6;
/// The mode of a scratch directory.
const MODE: u32 = 0o700;

/// A scratch directory, removed when dropped (see the [module docs](self)).
#[derive(Debug)]
pub(crate) struct Scratch {
    path: PathBuf,
    /// The lock held on it while it lives (none where the file system refused one).
    lock: Option<OwnedFd>,
    /// Whether dropping it removes it.
    remove: bool,
}

impl Scratch {
    /// A fresh, empty scratch directory under the temporary folder, locked (and the first
    /// time in this process, a [`sweep`] of that folder started).
    pub(crate) fn create() -> io::Result<Self> {
        let tmp = std::env::temp_dir();
        static SWEEP: Once = Once::new();
        SWEEP.call_once(|| {
            let tmp = tmp.clone();
            // Off the session's path; a sweep that cannot start is only skipped.
            let _ = std::thread::Builder::new()
                .name("rlm-scratch-sweep".to_owned())
                .spawn(move || {
                    let removed = sweep(&tmp);
                    if removed > 0 {
                        tracing::debug!(
                            "removed {removed} empty scratch directories of ended processes from {}",
                            tmp.display()
                        );
                    }
                });
        });
        Self::create_in(&tmp)
    }

    fn create_in(tmp: &Path) -> io::Result<Self> {
        let made = tempfile::Builder::new()
            .prefix(MADE)
            .rand_bytes(RANDOM_CHARS)
            .permissions(std::fs::Permissions::from_mode(MODE))
            .tempdir_in(tmp)?
            .keep();
        let mut scratch = Self {
            path: made,
            lock: None,
            remove: true,
        };
        let Ok(lock) = rustix::fs::open(
            &scratch.path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) else {
            return Ok(scratch);
        };
        if rustix::fs::flock(&lock, FlockOperation::LockExclusive).is_err() {
            return Ok(scratch);
        }
        scratch.lock = Some(lock);
        let Some(random) = scratch
            .path
            .file_name()
            .and_then(|n| n.as_bytes().strip_prefix(MADE.as_bytes()))
        else {
            return Ok(scratch);
        };
        let mut name = LOCKED.as_bytes().to_vec();
        name.extend_from_slice(random);
        let locked = tmp.join(OsStr::from_bytes(&name));
        let renamed = rustix::fs::renameat_with(
            rustix::fs::CWD,
            &scratch.path,
            rustix::fs::CWD,
            &locked,
            RenameFlags::NOREPLACE,
        );
        if renamed.is_ok() {
            scratch.path = locked;
        }
        Ok(scratch)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Forgets the directory without removing it (in a fork of the process that made it,
    /// whose it is not); the maker's lock stays held.
    pub(crate) fn keep(mut self) {
        self.remove = false;
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // Removed while still locked: no sweep takes it for a dead process's meanwhile.
        if self.remove {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// Removes the empty scratch directories under `tmp` whose makers have ended (see the
/// [module docs](self)); how many.
pub(crate) fn sweep(tmp: &Path) -> usize {
    let Ok(folder) = rustix::fs::open(
        tmp,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    ) else {
        return 0;
    };
    if !renames_are_ours(&folder) {
        return 0;
    }
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .filter(|entry| is_sweepable_name(&entry.file_name()))
        .filter(|entry| remove_if_dead(&folder, &entry.file_name()))
        .count()
}

/// Whether no other user can rename an entry of `folder`: it is sticky, or only this user
/// may write it.
fn renames_are_ours(folder: &OwnedFd) -> bool {
    let Ok(stat) = rustix::fs::fstat(folder) else {
        return false;
    };
    let sticky = stat.st_mode & 0o1000 != 0;
    let only_ours = stat.st_uid == rustix::process::geteuid().as_raw() && stat.st_mode & 0o022 == 0;
    sticky || only_ours
}

fn is_sweepable_name(name: &OsStr) -> bool {
    name.as_bytes()
        .strip_prefix(LOCKED.as_bytes())
        .is_some_and(|random| {
            random.len() == RANDOM_CHARS && random.iter().all(u8::is_ascii_alphanumeric)
        })
}

/// Removes the directory `name` of `folder` if it is ours, its maker has ended and it is
/// empty (see the [module docs](self)).
fn remove_if_dead(folder: &OwnedFd, name: &OsStr) -> bool {
    // A symbolic link is not followed: opening it fails.
    let Ok(dir) = rustix::fs::openat(
        folder,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) else {
        return false;
    };
    let Ok(held) = rustix::fs::fstat(&dir) else {
        return false;
    };
    let ours = FileType::from_raw_mode(held.st_mode) == FileType::Directory
        && held.st_uid == rustix::process::geteuid().as_raw()
        && held.st_mode & 0o7777 == MODE;
    if !ours || rustix::fs::flock(&dir, FlockOperation::NonBlockingLockExclusive).is_err() {
        return false;
    }
    // Still the directory locked (no other user can rename it here: `renames_are_ours`).
    let Ok(named) = rustix::fs::statat(folder, name, AtFlags::SYMLINK_NOFOLLOW) else {
        return false;
    };
    if (named.st_dev, named.st_ino) != (held.st_dev, held.st_ino) {
        return false;
    }
    // Refused unless empty.
    rustix::fs::unlinkat(folder, name, AtFlags::REMOVEDIR).is_ok()
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader};
    use std::os::unix::fs::symlink;
    use std::process::{Command, Stdio};

    use super::*;

    /// A private folder standing for the temporary folder (only this user may write it).
    fn folder() -> tempfile::TempDir {
        let tmp = tempfile::tempdir().expect("a folder");
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o700))
            .expect("chmod");
        tmp
    }

    /// A directory as a scratch directory is named and made, whose maker has ended (no
    /// lock is held on it).
    fn left(tmp: &Path, random: &str) -> PathBuf {
        let dir = tmp.join(format!("{LOCKED}{random}"));
        std::fs::create_dir(&dir).expect("mkdir");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(MODE)).expect("chmod");
        dir
    }

    #[test]
    fn a_scratch_directory_is_private_locked_and_removed_when_dropped() {
        let tmp = folder();
        let scratch = Scratch::create_in(tmp.path()).expect("a scratch directory");
        let path = scratch.path().to_owned();
        assert!(
            is_sweepable_name(path.file_name().expect("a name")),
            "{path:?}"
        );
        let mode = std::fs::metadata(&path).expect("stat").permissions().mode();
        assert_eq!(mode & 0o7777, MODE, "{path:?}");
        // Locked: another open of it cannot lock it.
        let other = rustix::fs::open(&path, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())
            .expect("open");
        assert!(rustix::fs::flock(&other, FlockOperation::NonBlockingLockExclusive).is_err());
        assert_eq!(sweep(tmp.path()), 0, "a live directory was swept");
        assert!(path.is_dir());
        std::fs::write(path.join("out.csv"), "a,b\n").expect("a file of the code's");
        drop(scratch);
        assert!(!path.exists(), "{path:?} was left");
    }

    /// Another process holds the lock on a directory: kept while it lives, removed once it
    /// was killed (the kernel dropped its lock).
    #[test]
    fn a_directory_is_removed_only_once_the_process_that_locked_it_has_ended() {
        let tmp = folder();
        let dir = left(tmp.path(), "Live01");
        let mut holder = Command::new("python3")
            .args([
                "-c",
                "import fcntl, os, sys, time\nfd = os.open(sys.argv[1], os.O_RDONLY)\nfcntl.flock(fd, fcntl.LOCK_EX)\nprint('locked', flush=True)\ntime.sleep(60)",
            ])
            .arg(&dir)
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 starts");
        let mut line = String::new();
        BufReader::new(holder.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("the holder's line");
        let swept_while_alive = sweep(tmp.path());
        let kept = dir.is_dir();
        holder.kill().expect("kill");
        holder.wait().expect("reaped");
        assert_eq!(line.trim(), "locked");
        assert_eq!(swept_while_alive, 0);
        assert!(kept, "a live process's directory was removed");
        assert_eq!(sweep(tmp.path()), 1);
        assert!(!dir.exists());
    }

    /// Nothing that is not provably ours and dead and empty goes; one that is (the last)
    /// does, so the sweep did run.
    #[test]
    fn a_sweep_removes_nothing_not_provably_ours_dead_and_empty() {
        let tmp = folder();
        let t = tmp.path();
        // Holding what a killed run's code wrote, or anything someone put there.
        let with_file = left(t, "Files1");
        std::fs::write(with_file.join("notes.txt"), "keep me").expect("write");
        let with_dir = left(t, "Subdr1");
        std::fs::create_dir(with_dir.join("inner")).expect("mkdir");
        // A symbolic link with our name, to an empty directory of ours.
        let target = t.join("target");
        std::fs::create_dir(&target).expect("mkdir");
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(MODE)).expect("chmod");
        let link = t.join(format!("{LOCKED}Link01"));
        symlink(&target, &link).expect("symlink");
        // Made by an older version (no lock ever taken: it may be in use).
        let older = t.join(format!("{MADE}Older1"));
        std::fs::create_dir(&older).expect("mkdir");
        std::fs::set_permissions(&older, std::fs::Permissions::from_mode(MODE)).expect("chmod");
        // Not made here: another mode, a file, names that are not quite ours.
        let other_mode = left(t, "Mode01");
        std::fs::set_permissions(&other_mode, std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        let file = t.join(format!("{LOCKED}File01"));
        std::fs::write(&file, "").expect("write");
        let mut kept = vec![
            with_file.clone(),
            with_dir,
            link.clone(),
            older,
            other_mode,
            file,
        ];
        for name in ["Short", "TooLong1", "Dot.01"] {
            kept.push(left(t, name));
        }
        // Another user's (only root can make one here).
        if rustix::process::geteuid().is_root() {
            let theirs = left(t, "Their1");
            std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).expect("chown");
            kept.push(theirs);
        }
        let dead = left(t, "Dead01");
        assert_eq!(sweep(t), 1);
        assert!(!dead.exists(), "the dead, empty directory was kept");
        for path in &kept {
            assert!(
                std::fs::symlink_metadata(path).is_ok(),
                "{path:?} was removed"
            );
        }
        assert_eq!(
            std::fs::read_to_string(with_file.join("notes.txt")).expect("read"),
            "keep me"
        );
        assert!(target.is_dir() && link.is_symlink());
    }

    /// Where another user could rename an entry (a folder anyone may write, not sticky),
    /// nothing is swept: the name checked might not name the directory locked.
    #[test]
    fn nothing_is_swept_where_another_user_could_swap_an_entry() {
        let tmp = folder();
        let dead = left(tmp.path(), "Dead02");
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o777))
            .expect("chmod");
        assert_eq!(sweep(tmp.path()), 0);
        assert!(dead.is_dir());
        // Sticky, as `/tmp`: only an entry's owner may rename it.
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o1777))
            .expect("chmod");
        assert_eq!(sweep(tmp.path()), 1);
        assert!(!dead.exists());
    }
}
