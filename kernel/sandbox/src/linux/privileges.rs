//! No privileges: no capabilities (none now, none after an `execve`, not even as root), no
//! new privileges through set-uid files, and not dumpable (no core file; other processes of
//! the user cannot attach to it or read its memory through `/proc`).
//!
//! Not dumpable comes first, for the whole tree: the supervisor turns it off as soon as it has
//! written its own id maps ([`not_dumpable`], called by [`enter`](crate::enter)), the last
//! step that needs it (a process that is not dumpable has its `/proc/self` files owned by
//! root, and an unprivileged user could not write its `uid_map`). Init and the confined
//! process, forked after, inherit it. What it adds where the other layers are in force is
//! nothing the code can reach today: init keeps capabilities the code dropped (which the
//! kernel's ptrace check refuses the code), and Landlock scopes `ptrace` and `/proc/PID/mem`
//! to the code's own domain. Where neither user namespaces nor Landlock exist, the
//! supervisor is the code's parent, in the machine's `/proc`, with nothing but this flag
//! between the code and its memory: a process of the user outside every layer.

use rustix::thread::{CapabilitiesSecureBits, CapabilitySet, CapabilitySets};

/// What [`drop_all`] achieved, for the report.
#[derive(Debug)]
pub(crate) struct Privileges {
    /// No effective or permitted capability is left.
    pub(crate) no_capabilities: bool,
    /// `PR_SET_NO_NEW_PRIVS` holds.
    pub(crate) no_new_privs: bool,
    /// `PR_SET_DUMPABLE` is 0.
    pub(crate) not_dumpable: bool,
}

/// Drops every capability and sets `no_new_privs` and not-dumpable.
pub(crate) fn drop_all() -> Privileges {
    // With CAP_SETPCAP (root, or anyone inside the new user namespace): empty the bounding
    // set and lock "root has no capabilities", so that an `execve` as uid 0 gains none.
    // Without it these fail, and there is nothing to drop.
    for cap in CapabilitySet::all().iter() {
        let _ = rustix::thread::remove_capability_from_bounding_set(cap);
    }
    let _ = rustix::thread::set_capabilities_secure_bits(
        CapabilitiesSecureBits::NO_ROOT
            | CapabilitiesSecureBits::NO_ROOT_LOCKED
            | CapabilitiesSecureBits::NO_SETUID_FIXUP
            | CapabilitiesSecureBits::NO_SETUID_FIXUP_LOCKED,
    );
    let _ = rustix::thread::clear_ambient_capability_set();
    let empty = CapabilitySet::empty();
    let _ = rustix::thread::set_capabilities(
        None,
        CapabilitySets {
            effective: empty,
            permitted: empty,
            inheritable: empty,
        },
    );
    let no_capabilities = rustix::thread::capabilities(None)
        .is_ok_and(|c| c.effective.is_empty() && c.permitted.is_empty());
    let no_new_privs = rustix::thread::set_no_new_privs(true).is_ok()
        && rustix::thread::no_new_privs().unwrap_or(false);
    let not_dumpable = not_dumpable();
    Privileges {
        no_capabilities,
        no_new_privs,
        not_dumpable,
    }
}

/// Makes this process not dumpable (see the [module docs](self)); whether it is now.
pub(crate) fn not_dumpable() -> bool {
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable).is_ok()
}
