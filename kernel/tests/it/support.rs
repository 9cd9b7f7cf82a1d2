//! Shared helpers.

use std::sync::Arc;
use std::time::Duration;

use kernel::repl::{ContextSource, Endpoints, ExecutionResult, ReplSession, SessionConfig};

/// An endpoint registry with no endpoints (sessions that make no sub-calls).
pub(crate) fn no_endpoints() -> Arc<Endpoints> {
    Arc::new(Endpoints::default())
}

pub(crate) fn config(timeout: Duration) -> SessionConfig {
    SessionConfig {
        cell_timeout: timeout,
        ..SessionConfig::default()
    }
}

pub(crate) fn session() -> ReplSession {
    ReplSession::new(config(Duration::from_secs(30)), no_endpoints(), &[]).expect("session starts")
}

pub(crate) fn session_with(contexts: &[ContextSource]) -> ReplSession {
    ReplSession::new(config(Duration::from_secs(30)), no_endpoints(), contexts)
        .expect("session starts")
}

/// Run a block that must succeed.
pub(crate) fn ok(session: &ReplSession, code: &str) -> ExecutionResult {
    let result = session.exec(code).expect("kernel works");
    assert!(
        result.error.is_none(),
        "block failed: {:?}\nstderr: {}",
        result.error,
        result.stderr
    );
    result
}
