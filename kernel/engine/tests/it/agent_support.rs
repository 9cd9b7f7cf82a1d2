//! Shared helpers: a mock LM server running a script, endpoints on it, and small tools.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bridge::mock::{MockConfig, MockServer, Script};
use bridge::{Budget, Endpoint, EndpointConfig, Ledger, Provider, RetryPolicy};
use engine::agent::{AgentLoop, LoopConfig, Toolbox};
use engine::{Tool, ToolContext, ToolError};
use serde_json::{Value, json};

/// A mock server whose every model replies `replies` by turn (JSON values of the script
/// format), recording request bodies.
pub(crate) async fn mock(replies: Value) -> MockServer {
    let script = Script::from_json_value(json!({"models": {"*": {"replies": replies}}}))
        .expect("valid script");
    MockServer::start(MockConfig {
        script,
        record_requests: true,
        ..MockConfig::default()
    })
    .await
    .expect("mock server starts")
}

/// An endpoint on `server` speaking `provider`, with its own ledger enforcing `budget`.
pub(crate) fn endpoint(server: &MockServer, provider: Provider, budget: Budget) -> Arc<Endpoint> {
    let config = match provider {
        Provider::OpenAi => EndpointConfig::openai("root", server.openai_base_url(), "mock"),
        Provider::Anthropic => {
            EndpointConfig::anthropic("root", server.anthropic_base_url(), "mock")
        }
    };
    let config = EndpointConfig {
        timeout: Duration::from_secs(20),
        retry: RetryPolicy {
            max_attempts: 1,
            ..RetryPolicy::default()
        },
        ..config
    };
    Arc::new(Endpoint::new(config, Arc::new(Ledger::new(budget))).expect("valid endpoint"))
}

/// A loop over OpenAI on `server` with `tools`.
pub(crate) fn agent(
    server: &MockServer,
    tools: Vec<Arc<dyn Tool>>,
    config: LoopConfig,
) -> AgentLoop {
    let mut toolbox = Toolbox::new();
    for tool in tools {
        toolbox.add(tool).expect("tool is accepted");
    }
    AgentLoop::new(
        endpoint(server, Provider::OpenAi, Budget::default()),
        toolbox,
        config,
    )
}

/// `add(a, b)`: the sum of two integers.
pub(crate) struct Add;

#[async_trait]
impl Tool for Add {
    fn name(&self) -> &str {
        "add"
    }
    fn description(&self) -> &str {
        "Adds two integers."
    }
    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "required": ["a", "b"],
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "additionalProperties": false
        })
    }
    async fn call(&self, args: Value, _ctx: &ToolContext) -> Result<Value, ToolError> {
        let a = args["a"].as_i64().unwrap_or_default();
        let b = args["b"].as_i64().unwrap_or_default();
        Ok(json!(a + b))
    }
}

/// `sleep(ms)`: waits, ignoring cancellation, then returns `ms`; counts calls in flight.
#[derive(Default)]
pub(crate) struct Sleep {
    pub(crate) in_flight: AtomicUsize,
    pub(crate) peak: AtomicUsize,
}

#[async_trait]
impl Tool for Sleep {
    fn name(&self) -> &str {
        "sleep"
    }
    fn description(&self) -> &str {
        "Waits `ms` milliseconds."
    }
    fn parameters(&self) -> Value {
        json!({"type": "object", "properties": {"ms": {"type": "integer", "minimum": 0}}})
    }
    async fn call(&self, args: Value, _ctx: &ToolContext) -> Result<Value, ToolError> {
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(now, Ordering::SeqCst);
        let ms = args["ms"].as_u64().unwrap_or_default();
        tokio::time::sleep(Duration::from_millis(ms)).await;
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        Ok(json!(ms))
    }
}

/// `fail(message)`: always fails with `message`.
pub(crate) struct Fail;

#[async_trait]
impl Tool for Fail {
    fn name(&self) -> &str {
        "fail"
    }
    fn description(&self) -> &str {
        "Fails."
    }
    fn parameters(&self) -> Value {
        json!({"type": "object", "properties": {"message": {"type": "string"}}})
    }
    async fn call(&self, args: Value, _ctx: &ToolContext) -> Result<Value, ToolError> {
        Err(ToolError::Failed(
            args["message"].as_str().unwrap_or("failed").to_owned(),
        ))
    }
}

/// `crash()`: panics.
pub(crate) struct Crash;

#[async_trait]
impl Tool for Crash {
    fn name(&self) -> &str {
        "crash"
    }
    fn description(&self) -> &str {
        "Panics."
    }
    fn parameters(&self) -> Value {
        json!({"type": "object"})
    }
    async fn call(&self, _args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        ctx.set_state("temp:crashed", json!(true));
        panic!("index out of bounds")
    }
}

/// `hang()`: never returns; its own timeout is 50 ms.
pub(crate) struct Hang;

#[async_trait]
impl Tool for Hang {
    fn name(&self) -> &str {
        "hang"
    }
    fn description(&self) -> &str {
        "Never returns."
    }
    fn parameters(&self) -> Value {
        json!({"type": "object"})
    }
    fn timeout(&self) -> Option<Duration> {
        Some(Duration::from_millis(50))
    }
    async fn call(&self, _args: Value, _ctx: &ToolContext) -> Result<Value, ToolError> {
        std::future::pending().await
    }
}
