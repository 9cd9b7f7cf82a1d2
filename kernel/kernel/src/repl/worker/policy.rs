//! What confines a session's worker, as the parent builds it: the sandbox's defaults, the
//! session's settings (readable folders, memory limit, level), its file contexts, and the
//! Python variables its worker keeps. Workers confined ahead of need (`pool.rs`) are
//! confined with the same policy, their own scratch directory aside.

use std::path::{Path, PathBuf};

use super::spawn::{WorkerProgram, python_env};
use super::transfer::readable;
use crate::repl::config::SessionConfig;

/// What confines a worker of a session configured by `config` whose scratch directory is
/// `scratch`, before its contexts and its Python's own files are added: the sandbox's
/// defaults, the session's extra readable folders, its memory limit (`rlm doctor` shows
/// what this policy would get here).
pub fn worker_policy(config: &SessionConfig, scratch: &Path) -> sandbox::Policy {
    let mut policy = sandbox::Policy::new(scratch);
    for path in &config.read_paths {
        policy = policy.allow_read(readable(path));
    }
    policy.limits.memory_bytes = Some(
        config
            .memory_limit
            .unwrap_or_else(sandbox::default_memory_limit),
    );
    policy
}

/// The whole policy of a session of `config` whose scratch directory is `scratch` and whose
/// file contexts are `contexts`: [`worker_policy`], the contexts readable, the Python
/// variables of `program`'s start environment kept.
pub(crate) fn session_policy(
    config: &SessionConfig,
    scratch: &Path,
    program: &WorkerProgram,
    contexts: &[PathBuf],
) -> sandbox::Policy {
    let mut policy = worker_policy(config, scratch);
    for path in contexts {
        policy = policy.allow_read(path.clone());
    }
    for (name, value) in python_env(program) {
        policy = policy.set_env(name, value);
    }
    policy
}

/// How hard the sessions of `config` insist on confinement.
pub(crate) fn level_of(config: &SessionConfig) -> sandbox::Level {
    match config.isolation {
        crate::repl::config::Isolation::Strict => sandbox::Level::Strict,
        _ => sandbox::Level::BestEffort,
    }
}
