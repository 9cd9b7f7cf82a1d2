//! The confined environment: exactly the policy's variables. API keys, tokens, proxies and
//! whatever else the parent had never reach model code.
//!
//! Removing a variable does not erase it from memory: `/proc/self/environ` shows the block
//! the process was started with, and the strings stay there. So the removed variables'
//! bytes are overwritten with zeros as well. (The parent should still spawn the worker with
//! the policy's environment only, so no secret is ever in its memory.)

use std::collections::BTreeMap;
use std::ffi::CStr;

use crate::report::State;

unsafe extern "C" {
    /// The C library's environment array.
    static mut environ: *mut *mut libc::c_char;
}

/// Replaces the whole environment with `env`. Only called by `enter`, which has checked
/// that the process has one thread.
pub(crate) fn apply(env: &BTreeMap<String, String>) -> State {
    let allowed = |entry: &[u8]| {
        let name = entry.split(|b| *b == b'=').next().unwrap_or_default();
        std::str::from_utf8(name).is_ok_and(|n| env.contains_key(n))
    };
    // The entries to erase: pointers into the start-up block (or the heap, for variables
    // set later), which unsetting leaves in place.
    let mut erase: Vec<(*mut libc::c_char, usize)> = Vec::new();
    // SAFETY: single-threaded (checked by `enter`); `environ` is a NULL-terminated array of
    // NUL-terminated strings, read before anything changes it.
    unsafe {
        let mut entry = environ;
        while !entry.is_null() && !(*entry).is_null() {
            let bytes = CStr::from_ptr(*entry).to_bytes();
            if !allowed(bytes) {
                erase.push((*entry, bytes.len()));
            }
            entry = entry.add(1);
        }
    }
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_none_or(|n| !env.contains_key(n)) {
            // SAFETY: the process is single-threaded (checked by `enter`), so nothing reads
            // the environment concurrently.
            unsafe { std::env::remove_var(&name) };
        }
    }
    for (ptr, len) in erase {
        // SAFETY: each string is still allocated (unsetenv only drops the pointer from the
        // array) and `len` bytes long; nothing refers to it any more.
        unsafe { std::ptr::write_bytes(ptr, 0, len) };
    }
    for (name, value) in env {
        if !name.is_empty() && !name.contains(['=', '\0']) && !value.contains('\0') {
            // SAFETY: as above.
            unsafe { std::env::set_var(name, value) };
        }
    }
    describe(env)
}

/// The environment layer as `enter` would leave it.
pub(crate) fn describe(env: &BTreeMap<String, String>) -> State {
    let names: Vec<&str> = env.keys().map(String::as_str).collect();
    State::Active {
        detail: format!("{} variables only: {}", names.len(), names.join(", ")),
    }
}
