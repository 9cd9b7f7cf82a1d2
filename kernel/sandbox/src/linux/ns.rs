//! Namespaces: a user namespace first (so that an unprivileged user may create the others;
//! root takes the same path, so what is tested as root is what a user gets), then an empty
//! network namespace and a PID namespace whose init is the confined tree's reaper.
//!
//! Everything here is raw system calls on stack data, so that [`probe`](super::probe) can
//! run it in a child forked from a threaded process.

use rustix::fd::OwnedFd;
use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;
use rustix::thread::UnshareFlags;

/// The id maps written after `unshare(CLONE_NEWUSER)`: the caller's uid and gid map to
/// themselves (so files keep their owners and the process is not root inside unless it was
/// outside).
pub(crate) struct IdMaps {
    uid: [u8; 40],
    uid_len: usize,
    gid: [u8; 40],
    gid_len: usize,
}

impl IdMaps {
    /// Maps of the current real uid and gid.
    pub(crate) fn current() -> Self {
        let uid = rustix::process::getuid().as_raw();
        let gid = rustix::process::getgid().as_raw();
        let mut maps = Self {
            uid: [0; 40],
            uid_len: 0,
            gid: [0; 40],
            gid_len: 0,
        };
        maps.uid_len = identity_map(uid, &mut maps.uid);
        maps.gid_len = identity_map(gid, &mut maps.gid);
        maps
    }
}

/// Writes `"{id} {id} 1\n"` into `buf`; returns its length.
fn identity_map(id: u32, buf: &mut [u8; 40]) -> usize {
    let mut digits = [0u8; 10];
    let n = decimal(u64::from(id), &mut digits);
    let mut len = 0;
    for part in [&digits[..n], b" ", &digits[..n], b" 1\n"] {
        buf[len..len + part.len()].copy_from_slice(part);
        len += part.len();
    }
    len
}

/// Writes `value` in decimal into `buf` (at least 20 bytes for any u64); returns its length.
pub(crate) fn decimal(mut value: u64, buf: &mut [u8]) -> usize {
    let mut tmp = [0u8; 20];
    let mut n = 0;
    loop {
        tmp[n] = b'0' + (value % 10) as u8;
        n += 1;
        value /= 10;
        if value == 0 {
            break;
        }
    }
    for i in 0..n {
        buf[i] = tmp[n - 1 - i];
    }
    n
}

/// What [`unshare_all`] achieved: each step's outcome.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Namespaces {
    /// `unshare(CLONE_NEWUSER)` and the id maps.
    pub(crate) user: Result<(), Errno>,
    /// `unshare(CLONE_NEWNET)`; `None` when the policy allows the network.
    pub(crate) net: Option<Result<(), Errno>>,
    /// `unshare(CLONE_NEWPID)` (takes effect for the next child).
    pub(crate) pid: Result<(), Errno>,
}

/// Enters a new user namespace, then new network (unless `network`) and PID namespaces.
/// Must run in a single-threaded process.
pub(crate) fn unshare_all(maps: &IdMaps, network: bool) -> Namespaces {
    let user = unshare(UnshareFlags::NEWUSER).and_then(|()| write_maps(maps));
    let net = (!network).then(|| unshare(UnshareFlags::NEWNET));
    let pid = unshare(UnshareFlags::NEWPID);
    Namespaces { user, net, pid }
}

fn unshare(flags: UnshareFlags) -> Result<(), Errno> {
    // SAFETY: no `CLONE_FILES`: the file table is not unshared, so no thread could observe a
    // descriptor of another table (and the caller is single-threaded).
    unsafe { rustix::thread::unshare_unsafe(flags) }
}

fn write_maps(maps: &IdMaps) -> Result<(), Errno> {
    // `setgroups` must be denied before an unprivileged process may write its gid map.
    match write_file(c"/proc/self/setgroups", b"deny") {
        Ok(()) | Err(Errno::NOENT) => {}
        Err(e) => return Err(e),
    }
    write_file(c"/proc/self/uid_map", &maps.uid[..maps.uid_len])?;
    write_file(c"/proc/self/gid_map", &maps.gid[..maps.gid_len])
}

pub(crate) fn write_file(path: &core::ffi::CStr, data: &[u8]) -> Result<(), Errno> {
    let fd: OwnedFd = rustix::fs::open(path, OFlags::WRONLY | OFlags::CLOEXEC, Mode::empty())?;
    let written = rustix::io::write(&fd, data)?;
    if written == data.len() {
        Ok(())
    } else {
        Err(Errno::IO)
    }
}

/// `struct mount_attr` of `mount_setattr(2)`.
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

const MOUNT_ATTR_RDONLY: u64 = 0x1;
const AT_RECURSIVE: libc::c_uint = 0x8000;

fn set_read_only(path: &core::ffi::CStr, read_only: bool) -> Result<(), Errno> {
    let attr = MountAttr {
        attr_set: if read_only { MOUNT_ATTR_RDONLY } else { 0 },
        attr_clr: if read_only { 0 } else { MOUNT_ATTR_RDONLY },
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: `mount_setattr(AT_FDCWD, path, AT_RECURSIVE, &attr, sizeof attr)` reads the
    // path and the attribute struct only.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            path.as_ptr(),
            AT_RECURSIVE,
            &attr as *const MountAttr,
            core::mem::size_of::<MountAttr>(),
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(Errno::from_raw_os_error(
            std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO),
        ))
    }
}

/// In a new mount namespace (private: nothing propagates back), makes every mount
/// read-only except bind mounts of `writable` (existing files and folders). Landlock does
/// not cover metadata — modes, owners, times, extended attributes — so without this the
/// confined code could `chmod` a file outside the scratch dir; on a read-only mount that
/// fails with `EROFS`. Needs a user namespace (or root) and Linux 5.12 (`mount_setattr`).
pub(crate) fn read_only_except(writable: &[&core::ffi::CStr]) -> Result<(), Errno> {
    unshare(UnshareFlags::NEWNS)?;
    rustix::mount::mount_change(
        c"/",
        rustix::mount::MountPropagationFlags::REC | rustix::mount::MountPropagationFlags::PRIVATE,
    )?;
    for path in writable {
        rustix::mount::mount_bind_recursive(*path, *path)?;
    }
    set_read_only(c"/", true)?;
    for path in writable {
        set_read_only(path, false)?;
    }
    Ok(())
}

/// Mounts a fresh tmpfs of at most `size` bytes on `/dev/shm`, in the mount namespace
/// [`read_only_except`] made: POSIX shared memory and semaphores (`multiprocessing`'s locks,
/// pools and queues) work, and the machine's own `/dev/shm` — other programs' shared memory
/// — stays out of reach. It dies with the namespace. Returns whether it was mounted (there
/// may be no `/dev/shm`).
pub(crate) fn private_shm(size: u64) -> Result<bool, Errno> {
    if !std::path::Path::new("/dev/shm").is_dir() {
        return Ok(false);
    }
    let options =
        std::ffi::CString::new(format!("size={size},mode=1777")).map_err(|_| Errno::INVAL)?;
    rustix::mount::mount(
        c"tmpfs",
        c"/dev/shm",
        c"tmpfs",
        rustix::mount::MountFlags::NOSUID
            | rustix::mount::MountFlags::NODEV
            | rustix::mount::MountFlags::NOEXEC,
        options.as_c_str(),
    )?;
    Ok(true)
}

/// Mounts, on `/proc` of the mount namespace [`read_only_except`] made, a procfs of the
/// caller's PID namespace (the caller must be in it: init), read-only and holding only the
/// processes' folders (`subset=pid`, Linux 5.8): the confined code finds the processes it
/// started — the pids `os.kill` takes, with their parents and start times — and nothing
/// else. Not a process of the machine (the parent, other workers, the template), and none
/// of the machine-wide files (`/proc/sys`, `kallsyms`, `cmdline`, `meminfo`, …). A kernel
/// that mounts it without honouring `subset=pid` (`/proc/cpuinfo` is there) gets it
/// unmounted, and the error `EINVAL`.
pub(crate) fn private_proc() -> Result<(), Errno> {
    use rustix::mount::{MountFlags, UnmountFlags};
    rustix::mount::mount(
        c"proc",
        c"/proc",
        c"proc",
        MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
        c"subset=pid",
    )?;
    if rustix::fs::access(c"/proc/cpuinfo", rustix::fs::Access::EXISTS).is_ok() {
        rustix::mount::unmount(c"/proc", UnmountFlags::DETACH)?;
        return Err(Errno::INVAL);
    }
    Ok(())
}

/// Caps the processes and threads of the current PID namespace by its `pid_max` (per
/// namespace since Linux 6.14): the kernel refuses a `fork` or thread past it, for root as
/// for anyone. Call only from inside a new PID namespace owned by a new user namespace, so
/// that a kernel without per-namespace `pid_max` refuses the write (the global value needs
/// privileges in the initial namespace) instead of changing the machine's limit.
/// Returns the value written.
pub(crate) fn cap_pids(processes: u64) -> Result<u64, Errno> {
    // PIDs below 300 are not reused after the first wrap, and the kernel refuses a pid_max
    // below 301; init and the confined process take two.
    let pid_max = (processes + 2).max(301);
    let mut buf = [0u8; 20];
    let n = decimal(pid_max, &mut buf);
    write_file(c"/proc/sys/kernel/pid_max", &buf[..n])?;
    // Read back: a kernel that ignored the value must not be reported as capped.
    let fd = rustix::fs::open(
        c"/proc/sys/kernel/pid_max",
        OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let mut back = [0u8; 24];
    let len = rustix::io::read(&fd, &mut back)?;
    let value = back[..len]
        .iter()
        .take_while(|b| b.is_ascii_digit())
        .fold(0u64, |v, b| v * 10 + u64::from(b - b'0'));
    if value == pid_max {
        Ok(pid_max)
    } else {
        Err(Errno::INVAL)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_maps_are_written_in_proc_format() {
        let mut buf = [0u8; 40];
        let n = identity_map(1000, &mut buf);
        assert_eq!(&buf[..n], b"1000 1000 1\n");
        let n = identity_map(0, &mut buf);
        assert_eq!(&buf[..n], b"0 0 1\n");
        let n = identity_map(u32::MAX, &mut buf);
        assert_eq!(&buf[..n], b"4294967295 4294967295 1\n");
    }
}
