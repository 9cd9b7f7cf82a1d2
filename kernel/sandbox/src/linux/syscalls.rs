//! seccomp: system calls the confined process never needs and an attacker would use,
//! refused with `EPERM` (compiled from rules by `seccompiler`; no hand-written BPF).
//!
//! - Other processes: `ptrace`, `process_vm_readv`/`writev`, `kcmp`, `pidfd_getfd`,
//!   `process_madvise`, `move_pages`, `migrate_pages`; `kill(-1, …)` (every process of the
//!   user).
//! - The kernel's larger attack surface: `bpf`, `perf_event_open`, `userfaultfd`,
//!   `io_uring_*` (which would also bypass the socket rules), keyrings, modules, `kexec_*`.
//! - The system: `mount` and the new mount API, `pivot_root`, `chroot`, `swapon`, `reboot`,
//!   clocks, `acct`, quotas, `open_by_handle_at`, `syslog`, `personality` changes.
//! - New namespaces after setup: `unshare`, `setns`, and `clone` with any `CLONE_NEW*` flag.
//!   `clone3` gets `ENOSYS` (its flags are in memory a filter cannot read), which makes
//!   the C library fall back to `clone`.
//! - No network unless the policy allows it: `socket` and `socketpair` only for `AF_UNIX`;
//!   no `connect`, `bind`, `listen`, `accept` at all (the worker talks to its parent over an
//!   inherited, already connected socket pair, so it never needs them; this also keeps it
//!   from a named Unix socket such as a desktop bus, an SSH agent or the Docker socket).
//! - Terminal injection: `ioctl(TIOCSTI)` and `TIOCLINUX`.
//!
//! On x86-64 a blacklist must also cover the x32 ABI, which reaches the same system calls
//! under numbers with bit 30 set: every refused call is refused under its x32 numbers too.
//! A call from another architecture (`int 0x80`) kills the process (`seccompiler`'s
//! architecture check).

use std::collections::BTreeMap;
use std::sync::OnceLock;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

use crate::error::SandboxError;

type Rules = BTreeMap<i64, Vec<SeccompRule>>;

#[cfg(target_arch = "x86_64")]
const ARCH: Option<TargetArch> = Some(TargetArch::x86_64);
#[cfg(target_arch = "aarch64")]
const ARCH: Option<TargetArch> = Some(TargetArch::aarch64);
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const ARCH: Option<TargetArch> = None;

/// System calls refused whatever their arguments.
const REFUSED: &[libc::c_long] = &[
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_kcmp,
    libc::SYS_pidfd_getfd,
    libc::SYS_process_madvise,
    libc::SYS_move_pages,
    libc::SYS_migrate_pages,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_userfaultfd,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_move_mount,
    libc::SYS_open_tree,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_mount_setattr,
    libc::SYS_pivot_root,
    libc::SYS_chroot,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_reboot,
    libc::SYS_settimeofday,
    libc::SYS_clock_settime,
    libc::SYS_clock_adjtime,
    libc::SYS_adjtimex,
    libc::SYS_acct,
    libc::SYS_quotactl,
    libc::SYS_open_by_handle_at,
    libc::SYS_name_to_handle_at,
    libc::SYS_syslog,
    libc::SYS_vhangup,
    libc::SYS_fanotify_init,
    libc::SYS_unshare,
    libc::SYS_setns,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_iopl,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_ioperm,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_uselib,
];

/// Socket calls refused whatever their arguments when the network is off.
const REFUSED_WITHOUT_NETWORK: &[libc::c_long] = &[
    libc::SYS_connect,
    libc::SYS_bind,
    libc::SYS_listen,
    libc::SYS_accept,
    libc::SYS_accept4,
];

/// Namespace flags `clone` may not carry.
const CLONE_NEW: &[u64] = &[
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWCGROUP as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
];

/// `__X32_SYSCALL_BIT`.
#[cfg(target_arch = "x86_64")]
const X32: i64 = 0x4000_0000;

/// x32-only numbers (512 and up) of refused calls whose x32 entry differs from x86-64's.
#[cfg(target_arch = "x86_64")]
const X32_ONLY: &[(i64, libc::c_long)] = &[
    (514, libc::SYS_ioctl),
    (521, libc::SYS_ptrace),
    (528, libc::SYS_kexec_load),
    (533, libc::SYS_move_pages),
    (539, libc::SYS_process_vm_readv),
    (540, libc::SYS_process_vm_writev),
];

/// What the filter refuses, for the report.
pub(crate) fn describe(network: bool) -> String {
    let mut text = format!(
        "seccomp refuses {} system calls (ptrace, process_vm_*, mount, bpf, perf_event_open, \
         io_uring, keyctl, kexec, unshare/setns, new namespaces, TIOCSTI, kill(-1), …)",
        REFUSED.len() + 4
    );
    if !network {
        text.push_str("; sockets only AF_UNIX, no connect/bind/listen/accept");
    }
    text
}

fn cond(arg: u8, op: SeccompCmpOp, value: u64) -> Result<SeccompCondition, SandboxError> {
    SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, value)
        .map_err(|e| SandboxError::Filter(e.to_string()))
}

fn rule(conditions: Vec<SeccompCondition>) -> Result<SeccompRule, SandboxError> {
    SeccompRule::new(conditions).map_err(|e| SandboxError::Filter(e.to_string()))
}

/// The rules whose match means `EPERM`.
pub(crate) fn refused_rules(network: bool) -> Result<Rules, SandboxError> {
    let mut rules = Rules::new();
    for nr in REFUSED {
        rules.insert(*nr, Vec::new());
    }
    // kill(-1, sig): every process the user may signal.
    rules.insert(
        libc::SYS_kill,
        vec![rule(vec![cond(0, SeccompCmpOp::Eq, u64::from(u32::MAX))?])?],
    );
    rules.insert(
        libc::SYS_ioctl,
        vec![
            rule(vec![cond(1, SeccompCmpOp::Eq, libc::TIOCSTI)?])?,
            rule(vec![cond(1, SeccompCmpOp::Eq, libc::TIOCLINUX)?])?,
        ],
    );
    let mut clone_rules = Vec::new();
    for flag in CLONE_NEW {
        clone_rules.push(rule(vec![cond(0, SeccompCmpOp::MaskedEq(*flag), *flag)?])?);
    }
    rules.insert(libc::SYS_clone, clone_rules);
    // personality(): reading it (0xffffffff) and the default (0) are fine; anything else
    // (e.g. turning address-space randomisation off for children) is not.
    rules.insert(
        libc::SYS_personality,
        vec![rule(vec![
            cond(0, SeccompCmpOp::Ne, 0)?,
            cond(0, SeccompCmpOp::Ne, u64::from(u32::MAX))?,
        ])?],
    );
    if !network {
        for nr in REFUSED_WITHOUT_NETWORK {
            rules.insert(*nr, Vec::new());
        }
        let not_unix = || -> Result<Vec<SeccompRule>, SandboxError> {
            Ok(vec![rule(vec![cond(
                0,
                SeccompCmpOp::Ne,
                libc::AF_UNIX as u64,
            )?])?])
        };
        rules.insert(libc::SYS_socket, not_unix()?);
        rules.insert(libc::SYS_socketpair, not_unix()?);
    }
    add_x32_aliases(&mut rules);
    Ok(rules)
}

#[cfg(target_arch = "x86_64")]
fn add_x32_aliases(rules: &mut Rules) {
    let native: Vec<(i64, Vec<SeccompRule>)> = rules.iter().map(|(n, r)| (*n, r.clone())).collect();
    for (nr, r) in &native {
        rules.insert(nr | X32, r.clone());
    }
    for (x32, native_nr) in X32_ONLY {
        if let Some(r) = rules.get(native_nr).cloned() {
            rules.insert(x32 | X32, r);
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn add_x32_aliases(_rules: &mut Rules) {}

/// The rules whose match means `ENOSYS`: `clone3`.
fn unimplemented_rules() -> Rules {
    let mut rules = Rules::new();
    rules.insert(libc::SYS_clone3, Vec::new());
    #[cfg(target_arch = "x86_64")]
    rules.insert(libc::SYS_clone3 | X32, Vec::new());
    rules
}

/// The two compiled filters (`EPERM` rules, `ENOSYS` rules), or why there are none.
pub(crate) fn compile(network: bool) -> Result<[BpfProgram; 2], SandboxError> {
    let Some(arch) = ARCH else {
        return Err(SandboxError::Filter(format!(
            "seccomp filters are built for x86-64 and aarch64, not `{}`",
            std::env::consts::ARCH
        )));
    };
    let program = |rules: Rules, errno: i32| -> Result<BpfProgram, SandboxError> {
        SeccompFilter::new(
            rules,
            SeccompAction::Allow,
            SeccompAction::Errno(errno as u32),
            arch,
        )
        .and_then(BpfProgram::try_from)
        .map_err(|e| SandboxError::Filter(e.to_string()))
    };
    Ok([
        program(refused_rules(network)?, libc::EPERM)?,
        program(unimplemented_rules(), libc::ENOSYS)?,
    ])
}

/// The filters of [`compile`], compiled once per process: the rules are fixed, so every call
/// of a process (and every process it forks afterwards, see [`crate::prepare`]) shares the
/// one compilation.
pub(crate) fn compiled(network: bool) -> Result<[BpfProgram; 2], SandboxError> {
    static COMPILED: [OnceLock<Result<[BpfProgram; 2], String>>; 2] =
        [const { OnceLock::new() }, const { OnceLock::new() }];
    COMPILED[usize::from(network)]
        .get_or_init(|| {
            compile(network).map_err(|e| match e {
                SandboxError::Filter(reason) => reason,
                other => other.to_string(),
            })
        })
        .clone()
        .map_err(SandboxError::Filter)
}

/// Whether this kernel offers seccomp filters (`SECCOMP_GET_ACTION_AVAIL` for `ERRNO`).
pub(crate) fn kernel_supports_filters() -> bool {
    let action: u32 = libc::SECCOMP_RET_ERRNO;
    // SAFETY: asks whether an action is available; reads `action` only.
    let r = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_GET_ACTION_AVAIL,
            0,
            &action as *const u32,
        )
    };
    r == 0
}

/// Installs the filters on the calling thread (inherited by every child). Needs
/// `no_new_privs`.
pub(crate) fn install(filters: &[BpfProgram; 2]) -> Result<(), SandboxError> {
    for filter in filters {
        seccompiler::apply_filter(filter).map_err(|e| SandboxError::Filter(e.to_string()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_refused_call_is_refused_under_its_x32_number_too() {
        let rules = refused_rules(false).unwrap_or_default();
        for nr in REFUSED.iter().chain(REFUSED_WITHOUT_NETWORK) {
            assert!(rules.contains_key(nr), "{nr} not refused");
            #[cfg(target_arch = "x86_64")]
            assert!(
                rules.contains_key(&(nr | X32)),
                "{nr} not refused under x32"
            );
        }
        #[cfg(target_arch = "x86_64")]
        for (x32, _) in X32_ONLY {
            assert!(rules.contains_key(&(x32 | X32)), "x32 {x32} not refused");
        }
    }

    #[test]
    fn the_network_rules_go_when_the_policy_allows_the_network() {
        let rules = refused_rules(true).unwrap_or_default();
        assert!(!rules.contains_key(&libc::SYS_connect));
        assert!(!rules.contains_key(&libc::SYS_socket));
        assert!(rules.contains_key(&libc::SYS_ptrace));
    }

    #[test]
    fn both_filters_compile_within_the_kernel_limit() {
        let filters = compile(false).unwrap_or_else(|e| panic!("{e}"));
        assert!(filters[0].len() < 4096 && filters[1].len() < 64);
    }

    #[test]
    fn each_network_setting_keeps_its_own_compiled_filters() {
        crate::prepare();
        // Asked in either order, each setting gets what compiling it gives: the filters
        // kept for a policy with the network never reach one without it.
        for network in [true, false, true] {
            let kept = compiled(network).unwrap_or_else(|e| panic!("{e}"));
            let fresh = compile(network).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(kept, fresh, "network {network}");
        }
        let closed = compiled(false).unwrap_or_else(|e| panic!("{e}"));
        let open = compiled(true).unwrap_or_else(|e| panic!("{e}"));
        assert_ne!(closed[0], open[0], "the socket rules must differ");
    }
}
