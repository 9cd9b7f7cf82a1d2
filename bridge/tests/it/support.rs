//! Shared helpers: start a mock server, build endpoints pointing at it.

use std::sync::Arc;
use std::time::Duration;

use bridge::mock::{Faults, Latency, MockConfig, MockServer, Script};
use bridge::{Budget, Endpoint, EndpointConfig, Ledger, RetryPolicy};

/// Start a mock server with `config`.
pub(crate) async fn start(config: MockConfig) -> MockServer {
    MockServer::start(config).await.expect("mock server starts")
}

/// Start an echoing mock server with `latency` and `faults`.
pub(crate) async fn start_with(latency: Latency, faults: Faults) -> MockServer {
    start(MockConfig {
        latency,
        faults,
        ..MockConfig::default()
    })
    .await
}

/// Start a mock server running `script` (JSON).
pub(crate) async fn start_script(script: &str) -> MockServer {
    start(MockConfig {
        script: Script::from_json_str(script).expect("valid script"),
        ..MockConfig::default()
    })
    .await
}

/// Quick retries so tests that exercise them stay fast.
pub(crate) fn fast_retry(max_attempts: u32) -> RetryPolicy {
    RetryPolicy {
        max_attempts,
        base_delay: Duration::from_millis(5),
        max_delay: Duration::from_secs(5),
    }
}

/// An OpenAI endpoint named `sub` on `server`.
pub(crate) fn openai_config(server: &MockServer) -> EndpointConfig {
    EndpointConfig {
        timeout: Duration::from_secs(20),
        retry: fast_retry(3),
        max_in_flight: 512,
        ..EndpointConfig::openai("sub", server.openai_base_url(), "sub-model")
    }
}

/// An Anthropic endpoint named `root` on `server`.
pub(crate) fn anthropic_config(server: &MockServer) -> EndpointConfig {
    EndpointConfig {
        timeout: Duration::from_secs(20),
        retry: fast_retry(3),
        ..EndpointConfig::anthropic("root", server.anthropic_base_url(), "claude-mock")
    }
}

/// An endpoint for `config` with its own ledger enforcing `budget`.
pub(crate) fn endpoint(config: EndpointConfig, budget: Budget) -> Endpoint {
    Endpoint::new(config, Arc::new(Ledger::new(budget))).expect("valid endpoint config")
}
