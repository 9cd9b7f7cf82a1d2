//! The Linux layers and the order [`enter`] applies them in:
//!
//! 1. environment (`env`): only the policy's variables;
//! 2. namespaces (`ns`): user, then network and PID; then the supervisor is not dumpable
//!    (`privileges`), nor is anything it forks;
//! 3. process tree (`lifetime`): supervisor → init → confined, in a session init leads
//!    (the supervisor, a process-group leader, cannot start one); init mounts the worker's
//!    view: everything read-only, a `/dev/shm` and a `/proc` of its own (`ns`);
//! 4. in the confined process: rlimits and the process cap (`limits`), no privileges
//!    (`privileges`), Landlock (`filesystem`), seccomp (`syscalls`) — seccomp last, as it
//!    refuses calls the steps before it make.
//!
//! [`probe`] answers what each layer would be without applying any: Landlock and seccomp
//! by asking the kernel, namespaces and the process cap by trying them in a throwaway child.

mod env;
mod filesystem;
mod lifetime;
mod limits;
mod ns;
mod privileges;
mod syscalls;

use rustix::io::Errno;

use crate::error::SandboxError;
use crate::policy::{Level, Policy};
use crate::report::{Layer, Report, State};

/// See [`crate::enter`].
pub(crate) fn enter(policy: &Policy, level: Level) -> Result<Report, SandboxError> {
    let threads = thread_count();
    if threads > 1 {
        return Err(SandboxError::Threaded { threads });
    }
    // Compiled before anything changes (or by `prepare`, before this process was forked), so
    // a broken filter fails in the caller's process.
    let filters = syscalls::compiled(policy.network);
    let root = rustix::process::geteuid().is_root();
    let environment = env::apply(&policy.env);
    lifetime::die_with_parent()?;

    let namespaces = ns::unshare_all(&ns::IdMaps::current(), policy.network);
    // Dumpable no longer than its id maps' write needed: nor are the processes it forks.
    privileges::not_dumpable();
    let own_userns = namespaces.user.is_ok();
    let pid_namespace = namespaces.pid.is_ok();
    // Only outside the initial user namespace may init touch `pid_max` (see `ns::cap_pids`).
    let cap_pids = (pid_namespace && (own_userns || !in_initial_user_namespace()))
        .then_some(policy.limits.processes)
        .flatten();
    let lifetime::Tree {
        binding,
        session,
        mounted: (read_only, proc),
    } = lifetime::split(pid_namespace, cap_pids, || {
        let read_only = read_only_mounts(policy, own_userns || root);
        // In init, the first process of the new PID namespace: the procfs it mounts shows
        // that namespace (without one, a procfs would show the machine's).
        let proc = pid_namespace.then(|| match &read_only {
            Ok(_) => ns::private_proc(),
            Err(e) => Err(*e),
        });
        (read_only, proc)
    })?;

    // In the confined process.
    let limits = limits::apply(&policy.limits);
    let processes = processes_state(policy, root, own_userns, &binding);
    let privileges = privileges::drop_all();
    let private_shm = matches!(read_only, Ok(true));
    let private_proc = matches!(proc, Some(Ok(())));
    let (filesystem, landlock_tcp) = filesystem::restrict(policy, private_shm, private_proc);
    let filesystem =
        filesystem::with_read_only_mounts(filesystem, read_only.map(drop).map_err(mount_reason));
    let seccomp = match filters {
        Ok(filters) if privileges.no_new_privs => syscalls::install(&filters).map(|()| true),
        Ok(_) => Ok(false),
        Err(e) => Err(e),
    };
    let syscalls_state = syscalls_state(&seccomp, &privileges);
    let network = network_state(
        policy,
        namespaces.net,
        matches!(seccomp, Ok(true)),
        landlock_tcp,
    );
    let report = Report::new([
        (Layer::Filesystem, filesystem),
        (Layer::Network, network),
        (Layer::Syscalls, syscalls_state),
        (Layer::Limits, limits),
        (Layer::Processes, processes),
        (
            Layer::Lifetime,
            lifetime_state(&binding, namespaces.pid, session, proc),
        ),
        (Layer::Environment, environment),
    ]);
    // `strict` is decided here, on what is in force, in the confined process before any code
    // of the caller runs: not on a probe beforehand, which forked two throwaway processes and
    // built a network namespace for each worker (~2.5 ms of CPU) to learn the same thing.
    if level == Level::Strict && !report.is_fully_confined() {
        return Err(SandboxError::NotConfined {
            report: Box::new(report),
        });
    }
    Ok(report)
}

/// Everything but the policy's writable paths read-only, in a mount namespace of our own,
/// with a private `/dev/shm` (see [`ns::private_shm`]) sized by the memory limit; returns
/// whether that `/dev/shm` was mounted (the filesystem layer then lets the process write it).
fn read_only_mounts(policy: &Policy, privileged: bool) -> Result<bool, Errno> {
    if !privileged {
        return Err(Errno::PERM);
    }
    let writable: Vec<std::ffi::CString> = policy
        .write_paths
        .iter()
        .filter(|p| p.exists())
        .filter_map(|p| std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).ok())
        .collect();
    let refs: Vec<&std::ffi::CStr> = writable.iter().map(|c| c.as_c_str()).collect();
    ns::read_only_except(&refs)?;
    // Semaphores take pages; a quarter of the memory limit leaves room for real data in
    // shared memory without letting it stand in for the heap.
    let shm = policy
        .limits
        .memory_bytes
        .map_or(64 << 20, |m| (m / 4).max(16 << 20));
    // A /dev/shm that cannot be mounted leaves the machine's read-only: nothing to refuse.
    Ok(ns::private_shm(shm).unwrap_or(false))
}

/// Why the namespace's own `/proc` ([`ns::private_proc`]) is missing.
fn proc_reason(e: Errno) -> String {
    match e {
        Errno::PERM | Errno::ACCESS => format!(
            "the kernel refused a procfs for the PID namespace: it needs a user namespace and \
             a `/proc` with nothing mounted over parts of it (a container's masked paths) ({e})"
        ),
        Errno::INVAL => "this kernel lacks procfs's `subset=pid` (Linux 5.8)".to_owned(),
        e => format!("mounting it failed: {e}"),
    }
}

fn mount_reason(e: Errno) -> String {
    match e {
        Errno::PERM | Errno::ACCESS => {
            "read-only mounts need a user namespace (see the network layer)".to_owned()
        }
        Errno::NOSYS => "read-only mounts need Linux 5.12 (`mount_setattr`)".to_owned(),
        e => format!("read-only mounts failed: {e}"),
    }
}

/// Whether this process is in the machine's initial user namespace (where `pid_max` is the
/// machine's own). Its `uid_map` maps every id to itself.
fn in_initial_user_namespace() -> bool {
    std::fs::read_to_string("/proc/self/uid_map").map_or(true, |map| {
        map.split_whitespace().collect::<Vec<_>>() == ["0", "0", "4294967295"]
    })
}

fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(1, |d| d.count())
}

fn processes_state(
    policy: &Policy,
    root: bool,
    own_userns: bool,
    binding: &lifetime::Binding,
) -> State {
    let Some(n) = policy.limits.processes else {
        return State::Unavailable {
            reason: "no process limit in the policy".into(),
        };
    };
    let nproc = limits::cap_processes(n, own_userns);
    if !root {
        return match nproc {
            Ok(limit) => State::Active {
                detail: format!("at most {n} processes and threads (`RLIMIT_NPROC` {limit})"),
            },
            Err(e) => State::Unavailable {
                reason: format!("`RLIMIT_NPROC` refused: {e}"),
            },
        };
    }
    match binding {
        lifetime::Binding::PidNamespace { pid_max: Some(max) } => State::Active {
            detail: pid_max_detail(*max),
        },
        _ => State::Unavailable {
            reason: root_process_cap_reason(),
        },
    }
}

fn pid_max_detail(pid_max: u64) -> String {
    format!(
        "at most {} processes and threads (`pid_max` {pid_max} of the PID namespace)",
        pid_max - 1
    )
}

fn root_process_cap_reason() -> String {
    "running as root, for whom the kernel does not enforce `RLIMIT_NPROC`, and no PID \
     namespace with its own `pid_max` (needs user namespaces and Linux 6.14); run as a \
     normal user"
        .into()
}

fn syscalls_state(
    seccomp: &Result<bool, SandboxError>,
    privileges: &privileges::Privileges,
) -> State {
    let mut held = Vec::new();
    let mut missing = Vec::new();
    match seccomp {
        Ok(true) => held.push(
            syscalls::describe(true)
                .split(';')
                .next()
                .unwrap_or("")
                .to_owned(),
        ),
        Ok(false) => missing.push("seccomp (no `no_new_privs`)".to_owned()),
        Err(e) => missing.push(format!("seccomp: {e}")),
    }
    for (ok, name) in [
        (privileges.no_new_privs, "no new privileges"),
        (privileges.not_dumpable, "not dumpable"),
        (privileges.no_capabilities, "no capabilities"),
    ] {
        if ok {
            held.push(name.to_owned())
        } else {
            missing.push(name.to_owned())
        }
    }
    match (seccomp, missing.is_empty()) {
        (Ok(true), true) => State::Active {
            detail: held.join("; "),
        },
        (Ok(true), false) => State::Partial {
            detail: held.join("; "),
            missing: missing.join("; "),
        },
        _ => State::Unavailable {
            reason: missing.join("; "),
        },
    }
}

fn network_state(
    policy: &Policy,
    netns: Option<Result<(), Errno>>,
    seccomp: bool,
    landlock_tcp: bool,
) -> State {
    if policy.network {
        return State::Unavailable {
            reason: "the policy allows the network".into(),
        };
    }
    let mut held = Vec::new();
    if let Some(Ok(())) = netns {
        held.push("an empty network namespace (no interface up)".to_owned());
    }
    if seccomp {
        held.push("seccomp: sockets only `AF_UNIX`, no `connect`/`bind`".to_owned());
    }
    if landlock_tcp {
        held.push("Landlock: no TCP bind/connect".to_owned());
    }
    let netns_missing = match netns {
        Some(Err(e)) => Some(namespace_reason("network", e)),
        _ => None,
    };
    match (held.is_empty(), netns_missing) {
        (true, reason) => State::Unavailable {
            reason: reason.unwrap_or_else(|| "no layer refuses the network".into()),
        },
        (false, None) => State::Active {
            detail: held.join("; "),
        },
        // Each of the others alone refuses IP sockets; the namespace would add a second wall.
        (false, Some(_)) if seccomp => State::Active {
            detail: held.join("; "),
        },
        (false, Some(reason)) => State::Partial {
            detail: held.join("; "),
            missing: reason,
        },
    }
}

/// `proc`: whether init mounted the namespace's own `/proc` (`None`: no PID namespace).
fn lifetime_state(
    binding: &lifetime::Binding,
    pid: Result<(), Errno>,
    session: Result<(), Errno>,
    proc: Option<Result<(), Errno>>,
) -> State {
    const SESSION: &str = "a session of its own: no controlling terminal";
    const INTERRUPTED: &str = "the processes of an interrupted block run on until the worker ends";
    let (mut detail, mut missing) = match binding {
        lifetime::Binding::PidNamespace { .. } => (
            "a PID namespace: when the worker ends, the kernel kills every process it \
             started (`setsid` and double forks included)"
                .to_owned(),
            Vec::new(),
        ),
        lifetime::Binding::Subreaper => (
            "a subreaper supervisor kills every process left when the worker ends".to_owned(),
            vec![pid.err().map_or_else(
                || format!("no PID namespace: {INTERRUPTED}"),
                |e| format!("{}: {INTERRUPTED}", namespace_reason("PID", e)),
            )],
        ),
    };
    match proc {
        Some(Ok(())) => {
            detail = format!(
                "{detail}; a `/proc` that shows only that namespace's processes, so those of \
                 an interrupted block are found and ended with it"
            )
        }
        Some(Err(e)) => missing.push(format!(
            "no `/proc` of its own ({}): {INTERRUPTED}",
            proc_reason(e)
        )),
        None => {}
    }
    match session {
        Ok(()) => detail = format!("{detail}; {SESSION}"),
        Err(e) => missing.push(format!(
            "no session of its own (`setsid`: {e}): the code may open the terminal rlm runs \
             on (`/dev/tty`)"
        )),
    }
    if missing.is_empty() {
        State::Active { detail }
    } else {
        State::Partial {
            detail,
            missing: missing.join("; "),
        }
    }
}

/// Why a namespace could not be created, in words a user can act on.
fn namespace_reason(kind: &str, e: Errno) -> String {
    let why = match e {
        Errno::PERM | Errno::ACCESS => {
            "unprivileged user namespaces are off here (`kernel.unprivileged_userns_clone`, \
             `kernel.apparmor_restrict_unprivileged_userns` or a container's seccomp profile)"
        }
        Errno::NOSPC | Errno::USERS => {
            "the user namespace limit is reached (`user.max_user_namespaces`)"
        }
        Errno::INVAL | Errno::NOSYS => "this kernel lacks the namespace",
        _ => "the kernel refused it",
    };
    format!("no {kind} namespace: {why} ({e})")
}

/// See [`crate::prepare`].
pub(crate) fn prepare() {
    for network in [false, true] {
        // A filter that cannot be built fails `enter` later, with the reason.
        let _ = syscalls::compiled(network);
    }
}

/// See [`crate::probe`].
pub(crate) fn probe(policy: &Policy) -> Report {
    let root = rustix::process::geteuid().is_root();
    let trial = ns_trial(policy.limits.processes.unwrap_or(0), policy.network);
    let abi = filesystem::kernel_abi();
    let seccomp = syscalls::kernel_supports_filters() && syscalls::compiled(policy.network).is_ok();
    let filesystem = filesystem::with_read_only_mounts(
        filesystem::expected(abi, policy),
        trial.read_only.map_err(mount_reason),
    );
    let syscalls_state = if seccomp {
        State::Active {
            detail: format!(
                "{}; no new privileges; not dumpable; no capabilities",
                syscalls::describe(true).split(';').next().unwrap_or("")
            ),
        }
    } else {
        State::Unavailable {
            reason: "this kernel or architecture has no seccomp filters (CONFIG_SECCOMP_FILTER)"
                .into(),
        }
    };
    let network = network_state(policy, trial.net, seccomp, abi >= 4);
    let binding = if trial.pid.is_ok() {
        lifetime::Binding::PidNamespace {
            pid_max: trial.pid_max,
        }
    } else {
        lifetime::Binding::Subreaper
    };
    let processes = match (policy.limits.processes, root, trial.pid_max) {
        (None, ..) => State::Unavailable {
            reason: "no process limit in the policy".into(),
        },
        (Some(n), false, _) => State::Active {
            detail: format!("at most {n} processes and threads (`RLIMIT_NPROC`)"),
        },
        (Some(_), true, Some(max)) => State::Active {
            detail: pid_max_detail(max),
        },
        (Some(_), true, None) => State::Unavailable {
            reason: root_process_cap_reason(),
        },
    };
    Report::new([
        (Layer::Filesystem, filesystem),
        (Layer::Network, network),
        (Layer::Syscalls, syscalls_state),
        (Layer::Limits, limits::describe(&policy.limits)),
        (Layer::Processes, processes),
        // A child of the supervisor is never a group leader: `setsid` cannot fail there.
        (
            Layer::Lifetime,
            lifetime_state(
                &binding,
                trial.pid,
                Ok(()),
                trial.pid.ok().map(|()| trial.proc),
            ),
        ),
        (Layer::Environment, env::describe(&policy.env)),
    ])
}

/// What a throwaway child could create.
struct Trial {
    net: Option<Result<(), Errno>>,
    pid: Result<(), Errno>,
    pid_max: Option<u64>,
    read_only: Result<(), Errno>,
    /// A `/proc` of the PID namespace ([`ns::private_proc`]).
    proc: Result<(), Errno>,
}

/// Forks a child that enters the namespaces (and, in a grandchild inside the PID namespace,
/// caps `pid_max` and mounts the namespace's `/proc` in a mount namespace of its own) and
/// writes the outcome to a pipe. The child makes raw system calls on
/// data prepared here only, so this is safe from a threaded process.
fn ns_trial(processes: u64, network: bool) -> Trial {
    let unknown = Errno::AGAIN;
    let failed = Trial {
        net: (!network).then_some(Err(unknown)),
        pid: Err(unknown),
        pid_max: None,
        read_only: Err(unknown),
        proc: Err(unknown),
    };
    let root = rustix::process::geteuid().is_root();
    let initial_userns = in_initial_user_namespace();
    let maps = ns::IdMaps::current();
    let mut fds = [0; 2];
    // SAFETY: creates a pipe into `fds`.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return failed;
    }
    let [read_end, write_end] = fds;
    // SAFETY: the child only makes async-signal-safe raw system calls and `_exit`s.
    let child = unsafe { libc::fork() };
    if child == 0 {
        let got = ns::unshare_all(&maps, network);
        let code = |r: Result<(), Errno>| r.err().map_or(0, |e| e.raw_os_error());
        let mut pid_max = 0;
        let mut proc = unknown.raw_os_error();
        if got.pid.is_ok() {
            let cap = (got.user.is_ok() || !initial_userns) && processes > 0;
            let mount = got.user.is_ok() || root;
            // SAFETY: as above; the grandchild is pid 1 of the new namespace.
            let grandchild = unsafe { libc::fork() };
            if grandchild == 0 {
                // Exit status: bit 0 the cap held, bits 1-7 the mount's errno (0: mounted).
                let capped = cap && ns::cap_pids(processes).is_ok();
                let mounted = if mount {
                    ns::read_only_except(&[]).and_then(|()| ns::private_proc())
                } else {
                    Err(Errno::PERM)
                };
                let errno = mounted.err().map_or(0, |e| e.raw_os_error().clamp(1, 127));
                // SAFETY: exits the grandchild.
                unsafe { libc::_exit(i32::from(capped) | (errno << 1)) };
            }
            let mut status = 0;
            // SAFETY: waits for our own child.
            let reaped = grandchild > 0
                && unsafe { libc::waitpid(grandchild, &mut status, 0) } == grandchild;
            if reaped && libc::WIFEXITED(status) {
                let code = libc::WEXITSTATUS(status);
                pid_max = code & 1;
                proc = code >> 1;
            }
        }
        let read_only = if got.user.is_ok() || root {
            ns::read_only_except(&[])
        } else {
            Err(Errno::PERM)
        };
        let words = [
            code(got.user),
            got.net.map_or(0, code),
            code(got.pid),
            pid_max,
            code(read_only),
            proc,
        ];
        let mut bytes = [0u8; 24];
        for (i, w) in words.iter().enumerate() {
            bytes[i * 4..i * 4 + 4].copy_from_slice(&w.to_ne_bytes());
        }
        // SAFETY: writes 24 bytes to the pipe and exits without the parent's destructors.
        unsafe {
            libc::write(write_end, bytes.as_ptr().cast(), bytes.len());
            libc::_exit(0);
        }
    }
    // SAFETY: closes our copy of the write end.
    unsafe { libc::close(write_end) };
    let mut bytes = [0u8; 24];
    let n = if child > 0 {
        // SAFETY: reads at most 24 bytes, then reaps our own child.
        unsafe {
            let n = libc::read(read_end, bytes.as_mut_ptr().cast(), bytes.len());
            libc::waitpid(child, std::ptr::null_mut(), 0);
            n
        }
    } else {
        -1
    };
    // SAFETY: closes the read end.
    unsafe { libc::close(read_end) };
    if n != 24 {
        return failed;
    }
    let word = |i: usize| {
        i32::from_ne_bytes([
            bytes[i * 4],
            bytes[i * 4 + 1],
            bytes[i * 4 + 2],
            bytes[i * 4 + 3],
        ])
    };
    let result = |i: usize| match word(i) {
        0 => Ok(()),
        e => Err(Errno::from_raw_os_error(e)),
    };
    Trial {
        net: (!network).then(|| result(1)),
        pid: result(2),
        pid_max: (word(3) == 1).then(|| processes.saturating_add(2).max(301)),
        read_only: result(4),
        proc: result(5),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> Policy {
        Policy::new("/tmp/rlm-test-scratch")
    }

    #[test]
    fn the_network_is_off_when_any_wall_holds_and_each_missing_one_says_why() {
        let p = policy();
        let all = network_state(&p, Some(Ok(())), true, true);
        assert!(all.is_active(), "{all:?}");
        // Without user namespaces, seccomp alone still refuses IP sockets.
        let seccomp_only = network_state(&p, Some(Err(Errno::PERM)), true, false);
        assert!(seccomp_only.is_active(), "{seccomp_only:?}");
        // Landlock alone covers TCP only: partial, with the namespace's reason.
        let State::Partial { missing, .. } = network_state(&p, Some(Err(Errno::PERM)), false, true)
        else {
            panic!("Landlock alone must be partial");
        };
        assert!(
            missing.contains("unprivileged user namespaces are off"),
            "{missing}"
        );
        let none = network_state(&p, Some(Err(Errno::NOSPC)), false, false);
        assert!(
            matches!(&none, State::Unavailable { reason } if reason.contains("max_user_namespaces")),
            "{none:?}"
        );
        let mut open = policy();
        open.network = true;
        assert!(!network_state(&open, None, true, true).is_active());
    }

    #[test]
    fn without_a_pid_namespace_its_proc_or_a_session_the_lifetime_is_partial() {
        let namespace = lifetime::Binding::PidNamespace { pid_max: None };
        let active = lifetime_state(&namespace, Ok(()), Ok(()), Some(Ok(())));
        assert!(
            matches!(&active, State::Active { detail } if detail.contains("no controlling terminal") && detail.contains("interrupted block are found and ended")),
            "{active:?}"
        );
        let partial = lifetime_state(
            &lifetime::Binding::Subreaper,
            Err(Errno::PERM),
            Ok(()),
            None,
        );
        assert!(
            matches!(&partial, State::Partial { missing, .. } if missing.starts_with("no PID namespace") && missing.contains("run on until the worker ends")),
            "{partial:?}"
        );
        // A namespace whose `/proc` could not be mounted: an interrupted block's processes
        // live on, a gap `strict` refuses, with the reason.
        for (e, reason) in [
            (Errno::PERM, "masked paths"),
            (Errno::INVAL, "`subset=pid` (Linux 5.8)"),
        ] {
            let no_proc = lifetime_state(&namespace, Ok(()), Ok(()), Some(Err(e)));
            assert!(
                matches!(&no_proc, State::Partial { missing, .. } if missing.starts_with("no `/proc` of its own") && missing.contains(reason) && missing.contains("run on until the worker ends")),
                "{no_proc:?}"
            );
        }
        // A session that could not be started is a gap `strict` refuses, named as such.
        for binding in [namespace, lifetime::Binding::Subreaper] {
            let no_session =
                lifetime_state(&binding, Err(Errno::PERM), Err(Errno::PERM), Some(Ok(())));
            assert!(
                matches!(&no_session, State::Partial { missing, .. } if missing.contains("no session of its own (`setsid`")),
                "{no_session:?}"
            );
        }
    }

    #[test]
    fn an_old_landlock_is_partial_and_no_landlock_is_unavailable() {
        let p = policy();
        let old = filesystem::expected(3, &p);
        assert!(
            matches!(&old, State::Partial { missing, .. } if missing.contains("TCP rules (ABI 4)") && !missing.contains("truncation")),
            "{old:?}"
        );
        assert!(matches!(
            filesystem::expected(0, &p),
            State::Unavailable { .. }
        ));
        assert!(filesystem::expected(7, &p).is_active());
        // Read-only mounts alone refuse writes but not reads.
        let mounts_only = filesystem::with_read_only_mounts(filesystem::expected(0, &p), Ok(()));
        assert!(
            matches!(mounts_only, State::Partial { .. }),
            "{mounts_only:?}"
        );
        let landlock_only = filesystem::with_read_only_mounts(
            filesystem::expected(7, &p),
            Err(mount_reason(Errno::NOSYS)),
        );
        assert!(
            matches!(&landlock_only, State::Partial { missing, .. } if missing.contains("mount_setattr")),
            "{landlock_only:?}"
        );
    }
}
