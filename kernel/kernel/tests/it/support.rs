//! Shared helpers.

use std::sync::Arc;
use std::time::Duration;

use kernel::repl::{ContextSource, Endpoints, ExecutionResult, ReplSession, SessionConfig};

/// An endpoint registry with no endpoints (sessions that make no sub-calls).
pub(crate) fn no_endpoints() -> Arc<Endpoints> {
    Arc::new(
        Endpoints::new(
            Vec::new(),
            Arc::new(bridge::Ledger::new(bridge::Budget::default())),
        )
        .expect("an empty registry is valid"),
    )
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

/// The mock LM server with a `sub` endpoint (model `sub-model`) and an `other` endpoint
/// (model `other-model`), retries off so that injected faults surface as errors.
pub(crate) struct Mock {
    pub(crate) server: bridge::mock::MockServer,
    pub(crate) endpoints: Arc<Endpoints>,
}

impl Mock {
    pub(crate) fn start(config: bridge::mock::MockConfig, budget: bridge::Budget) -> Self {
        let server = kernel::runtime::shared()
            .block_on(bridge::mock::MockServer::start(config))
            .expect("mock server starts");
        let endpoint = |name: &str, model: &str| bridge::EndpointConfig {
            retry: bridge::RetryPolicy {
                max_attempts: 1,
                ..bridge::RetryPolicy::default()
            },
            timeout: Duration::from_secs(60),
            ..bridge::EndpointConfig::openai(name, server.openai_base_url(), model)
        };
        let endpoints = Endpoints::new(
            vec![
                endpoint("sub", "sub-model"),
                endpoint("other", "other-model"),
            ],
            Arc::new(bridge::Ledger::new(budget)),
        )
        .expect("endpoints");
        Self {
            server,
            endpoints: Arc::new(endpoints),
        }
    }
}
