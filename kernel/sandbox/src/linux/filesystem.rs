//! Landlock: the confined process reads only the paths of its policy, executes only from
//! the executable ones, and writes only its scratch directory (and `/dev/null`). With the
//! same ruleset (Landlock ABI 4 and 6) it may not bind or connect TCP sockets, signal a
//! process outside its sandbox (the parent, the user's other processes) or connect to an
//! abstract Unix socket outside it (a desktop bus, an agent). Landlock also keeps it from
//! `ptrace` and from `/proc/<pid>/mem` or `environ` of any process outside the sandbox.
//!
//! Landlock applies to root as to anyone: it is not a permission check that privileges skip.

use landlock::{
    ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, Scope, path_beneath_rules,
};

use crate::policy::Policy;
use crate::report::State;

/// The Landlock ABI whose features the policy uses: file rights up to ABI 5 (device ioctls),
/// TCP (4) and scopes (6).
const TARGET_ABI: ABI = ABI::V6;

/// The kernel's Landlock ABI version (0: none), asked without creating anything.
pub(crate) fn kernel_abi() -> i32 {
    // SAFETY: `landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)` only
    // returns the ABI version.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            1u32, /* LANDLOCK_CREATE_RULESET_VERSION */
        )
    };
    i32::try_from(v).unwrap_or(0).max(0)
}

/// The filesystem layer this kernel would give (for `probe`).
pub(crate) fn expected(abi: i32, policy: &Policy) -> State {
    match abi {
        0 => State::Unavailable {
            reason: "this kernel has no Landlock (Linux 5.13 or later with `landlock` in the \
                     `lsm=` boot parameter)"
                .into(),
        },
        1..=5 => State::Partial {
            detail: detail(policy, abi),
            missing: missing_features(abi),
        },
        _ => State::Active {
            detail: detail(policy, abi),
        },
    }
}

fn detail(policy: &Policy, abi: i32) -> String {
    let scratch = policy
        .scratch()
        .map_or_else(|| "nothing".to_owned(), |p| format!("`{}`", p.display()));
    format!(
        "Landlock ABI {abi}: writes only {scratch}; reads {} system, Python and context paths",
        policy.read_paths.len() + policy.exec_paths.len()
    )
}

fn missing_features(abi: i32) -> String {
    let mut missing = Vec::new();
    if abi < 2 {
        missing.push("moving files between folders (ABI 2)");
    }
    if abi < 3 {
        missing.push("truncation (ABI 3)");
    }
    if abi < 4 {
        missing.push("TCP rules (ABI 4)");
    }
    if abi < 5 {
        missing.push("device ioctls (ABI 5)");
    }
    missing.push("signal and abstract-socket scopes (ABI 6, Linux 6.12)");
    format!(
        "this kernel's Landlock ABI {abi} lacks {}",
        missing.join(", ")
    )
}

/// Adds the read-only mounts (or why they are missing) to the Landlock state: without them
/// modes, owners and times of files outside the scratch dir can still change.
pub(crate) fn with_read_only_mounts(landlock: State, mounts: Result<(), String>) -> State {
    const RO: &str = "everything else mounted read-only";
    match (landlock, mounts) {
        (State::Active { detail }, Ok(())) => State::Active {
            detail: format!("{detail}; {RO}"),
        },
        (State::Active { detail }, Err(reason)) => State::Partial {
            detail,
            missing: format!("modes and times outside the scratch dir can change: {reason}"),
        },
        (State::Partial { detail, missing }, Ok(())) => State::Partial {
            detail: format!("{detail}; {RO}"),
            missing,
        },
        (State::Unavailable { reason }, Ok(())) => State::Partial {
            detail: format!("{RO} (writes refused, reads not)"),
            missing: reason,
        },
        (state, Err(_)) => state,
    }
}

/// Restricts the calling process (and its future children) for good; `private_shm`: the
/// process has a `/dev/shm` of its own, which it may write; `private_proc`: `/proc` is its
/// PID namespace's own (see `ns::private_proc`), which it may read whole (else only the
/// policy's `/proc` files of the machine's). Returns the filesystem layer's state and
/// whether TCP is refused.
pub(crate) fn restrict(policy: &Policy, private_shm: bool, private_proc: bool) -> (State, bool) {
    let abi = kernel_abi();
    match build_and_restrict(policy, private_shm, private_proc) {
        Ok(RulesetStatus::FullyEnforced) => (
            State::Active {
                detail: detail(policy, abi),
            },
            !policy.network && abi >= 4,
        ),
        Ok(RulesetStatus::PartiallyEnforced) => (
            State::Partial {
                detail: detail(policy, abi),
                missing: missing_features(abi),
            },
            !policy.network && abi >= 4,
        ),
        Ok(RulesetStatus::NotEnforced) => (expected(0, policy), false),
        Err(e) => (
            State::Unavailable {
                reason: format!("Landlock refused the ruleset: {e}"),
            },
            false,
        ),
    }
}

fn build_and_restrict(
    policy: &Policy,
    private_shm: bool,
    private_proc: bool,
) -> Result<RulesetStatus, landlock::RulesetError> {
    let read = AccessFs::ReadFile | AccessFs::ReadDir;
    let exec = read | AccessFs::Execute;
    let all = AccessFs::from_all(TARGET_ABI);
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(all)?;
    if !policy.network {
        ruleset = ruleset.handle_access(AccessNet::from_all(TARGET_ABI))?;
    }
    // The worker's own mounts (see `ns`): its `/dev/shm` written, its `/proc` read whole.
    let private = |mounted: bool, path: &'static str| mounted.then_some(path);
    let status = ruleset
        .scope(Scope::Signal | Scope::AbstractUnixSocket)?
        .create()?
        .add_rules(path_beneath_rules(&policy.read_paths, read))?
        .add_rules(path_beneath_rules(&policy.exec_paths, exec))?
        .add_rules(path_beneath_rules(&policy.write_paths, all))?
        .add_rules(path_beneath_rules(private(private_shm, "/dev/shm"), all))?
        .add_rules(path_beneath_rules(private(private_proc, "/proc"), read))?
        .restrict_self()?;
    Ok(status.ruleset)
}
