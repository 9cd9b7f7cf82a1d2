//! Language models over HTTP: the bridge between rlm-kernel and model servers.
//!
//! The pieces, in the order a call meets them:
//!
//! - [`chat`]: provider-neutral request and response types ([`ChatRequest`], [`ChatResponse`]).
//! - [`config`]: how to reach a model ([`EndpointConfig`]), its [`Price`], its [`RetryPolicy`].
//! - [`Endpoints`] / [`Endpoint`] ([`endpoint`]): named models; each endpoint owns a limiter
//!   shared by all its callers ([`limiter`]: a fixed width, or an adaptive one with
//!   [`Concurrency::Auto`]), runs retries ([`RetryPolicy`], honouring `Retry-After`; a 429
//!   that sets it is waited out for up to a minute without using up an attempt) and
//!   records every call in the [`Ledger`].
//! - [`Endpoint::batch`] ([`batch`]): ordered, bounded fan-out with a result per slot.
//! - [`client`]: one HTTP attempt in the OpenAI or Anthropic wire format, over the process-wide
//!   [`shared_http_client`].
//! - [`ledger`]: [`SubCallMetadata`] per call, usage per model, cost, and the [`Budget`]
//!   (one for a whole tree of runs).
//! - [`record`]: the run's [`SubCallRecord`] of sub-call answers keyed by what was asked
//!   (model, messages, settings): the sub-call cache, and what a crashed worker's blocks are
//!   replayed from.
//! - [`window`]: the context-window check of sub-calls (a setting, a table of well-known
//!   models, or the server's model listing).
//! - [`secret`]: API keys held as [`Secret`]s (read once, kept after their variables are
//!   gone) and the [`Redactor`] of every secret the process knows. No model receives a known
//!   secret: [`Endpoint::call`] redacts each request's messages before sending it.
//! - `mock` (feature `mock`): an in-process mock LM server for tests, benchmarks and demos.
//!
//! Data flows `ChatRequest → Endpoint::call → (budget, permit, client attempt, backoff)* →
//! ChatResponse`, with one `SubCallMetadata` pushed to the ledger at the end, success or not
//! (a call whose future is dropped is recorded as cancelled); [`Endpoint::call_recorded`]
//! also hands the caller that record. A failure's kind is a [`FailureKind`] (a budget
//! refusal carries its [`BudgetLimit`]): code matches on it, never on a message.
//!
//! ```no_run
//! # async fn demo() -> Result<(), bridge::BridgeError> {
//! use std::sync::Arc;
//! use bridge::{BatchPolicy, Budget, CallOptions, ChatRequest, EndpointConfig, Endpoints, Ledger};
//!
//! let ledger = Arc::new(Ledger::new(Budget { max_calls: Some(100), ..Budget::default() }));
//! let endpoints = Endpoints::new(
//!     vec![EndpointConfig::openai("sub", "http://127.0.0.1:8000/v1", "qwen3")],
//!     ledger,
//! )?;
//! let sub = endpoints.get("sub")?;
//! let one = sub.call(ChatRequest::from_prompt("Hi"), &CallOptions::default()).await?;
//! let many = sub
//!     .batch(
//!         (0..10).map(|i| ChatRequest::from_prompt(format!("Item {i}"))).collect(),
//!         BatchPolicy::bounded(4),
//!         &Default::default(),
//!     )
//!     .await;
//! assert_eq!(many.len(), 10);
//! println!("{} / {} calls recorded", one.content, endpoints.ledger().records().len());
//! # Ok(()) }
//! ```

pub mod batch;
pub mod chat;
pub mod client;
pub mod config;
pub mod endpoint;
pub mod error;
pub mod ledger;
pub mod limiter;
pub mod record;
pub mod retry;
pub mod secret;
pub mod window;

#[cfg(feature = "mock")]
pub mod mock;

pub use batch::BatchPolicy;
pub use chat::{
    ChatRequest, ChatResponse, Message, Role, SamplingParams, ToolCall, ToolChoice, ToolDefinition,
    Usage,
};
pub use client::{AnthropicClient, LmClient, OpenAiClient, shared_http_client};
pub use config::{
    AUTO_CEILING, AdaptivePolicy, Concurrency, EndpointConfig, InvalidConcurrency, Price, Provider,
    RetryPolicy, SettingNames,
};
pub use endpoint::{CallOptions, Endpoint, Endpoints, RecordedCall};
pub use error::{BridgeError, BudgetExceeded, BudgetLimit, FailureKind};
pub use ledger::{Budget, BudgetNames, Ledger, ModelUsage, SubCallMetadata, add_cost};
pub use limiter::{AdaptiveLimit, LimiterStats};
pub use record::{AnswerRef, CacheUse, RecordKey, SubCallRecord};
pub use secret::{REDACTED, Redactor, Secret};
pub use tokio_util::sync::CancellationToken;
