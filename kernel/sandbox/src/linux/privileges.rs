//! No privileges: no capabilities (none now, none after an `execve`, not even as root), no
//! new privileges through set-uid files, and not dumpable (no core file; other processes of
//! the user cannot attach to it or read its memory through `/proc`).

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
    let not_dumpable =
        rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
            .is_ok();
    Privileges {
        no_capabilities,
        no_new_privs,
        not_dumpable,
    }
}
