//! Chat clients: the [`LmClient`] trait and its two wire protocols.
//!
//! - [`OpenAiClient`] speaks OpenAI chat completions (`POST {base_url}/chat/completions`),
//!   which vLLM, SGLang, llama.cpp, Ollama and OpenRouter also serve.
//! - [`AnthropicClient`] speaks the Anthropic Messages API (`POST {base_url}/v1/messages`).
//!
//! Each protocol says only what its wire format is: headers, JSON body, how to read a whole
//! answer and how to fold one SSE event. One call skeleton (`call.rs`) runs both: it builds
//! the body, sends it through one `Transport` (URL, headers, per-attempt timeout, error
//! mapping) over the process-wide [`shared_http_client`], and reads the JSON answer, or folds
//! the SSE stream, into a [`ChatResponse`]. A client makes exactly one attempt; retries,
//! limits and accounting live
//! in [`crate::Endpoint`]. Whole bodies are read up to [`MAX_ANSWER_BYTES`] (error bodies up
//! to [`MAX_ERROR_BYTES`]), so a broken or hostile server cannot exhaust memory.
//!
//! ```no_run
//! # async fn demo() -> Result<(), bridge::BridgeError> {
//! use bridge::{ChatRequest, EndpointConfig, LmClient, OpenAiClient};
//! let config = EndpointConfig::openai("sub", "http://127.0.0.1:8000/v1", "qwen3");
//! let client = OpenAiClient::new(&config)?;
//! let answer = client.chat(&ChatRequest::from_prompt("Say hi")).await?;
//! println!("{} ({} tokens)", answer.content, answer.usage.total());
//! # Ok(()) }
//! ```

/// A public client type over `call::WireClient` for one protocol, answering [`LmClient`]
/// through it (each protocol module declares its own).
macro_rules! wire_client {
    ($(#[$meta:meta])* $name:ident($protocol:ident)) => {
        $(#[$meta])*
        #[derive(Debug, Clone)]
        pub struct $name(super::call::WireClient<$protocol>);

        #[async_trait::async_trait]
        impl super::LmClient for $name {
            async fn chat(
                &self,
                req: &crate::chat::ChatRequest,
            ) -> Result<crate::chat::ChatResponse, crate::error::BridgeError> {
                self.0.chat(req).await
            }

            async fn chat_stream(
                &self,
                req: &crate::chat::ChatRequest,
                on_delta: &mut (dyn for<'s> FnMut(&'s str) + Send),
            ) -> Result<crate::chat::ChatResponse, crate::error::BridgeError> {
                self.0.chat_stream(req, on_delta).await
            }

            async fn listed_context_window(&self, model: &str) -> Option<u64> {
                self.0.listed_context_window(model).await
            }

            async fn warm_up(&self, connections: usize) -> usize {
                self.0.warm_up(connections).await
            }
        }
    };
}

mod anthropic;
mod call;
mod openai;

use std::sync::OnceLock;
use std::time::Duration;

use async_trait::async_trait;
use eventsource_stream::{Event, EventStreamError};
use futures::{Stream, StreamExt};
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use serde::Deserialize;
use serde::de::DeserializeOwned;

pub use anthropic::{ANTHROPIC_DEFAULT_MAX_TOKENS, ANTHROPIC_VERSION, AnthropicClient};
pub use openai::OpenAiClient;

use crate::chat::{ChatRequest, ChatResponse};
use crate::config::{EndpointConfig, SettingNames};
use crate::error::BridgeError;
use crate::secret::{self, Secret};

/// The largest answer body read (a JSON answer, or a whole body sent instead of a stream);
/// a larger one fails as a [`BridgeError::Decode`].
pub const MAX_ANSWER_BYTES: usize = 64 << 20;

/// How much of an error body is read for the message; the rest is left unread.
pub const MAX_ERROR_BYTES: usize = 64 << 10;

/// A chat model reachable over HTTP; one call is one attempt.
#[async_trait]
pub trait LmClient: Send + Sync + std::fmt::Debug {
    /// Send `req` and wait for the whole answer.
    async fn chat(&self, req: &ChatRequest) -> Result<ChatResponse, BridgeError>;

    /// Send `req` as an SSE stream, calling `on_delta` with each piece of text as it arrives.
    async fn chat_stream(
        &self,
        req: &ChatRequest,
        on_delta: &mut (dyn for<'s> FnMut(&'s str) + Send),
    ) -> Result<ChatResponse, BridgeError>;

    /// `model`'s context window in tokens, as the server's model listing gives it
    /// ([`crate::window::listed_window`]); `None` when it does not say (the default).
    async fn listed_context_window(&self, _model: &str) -> Option<u64> {
        None
    }

    /// Open up to `connections` keep-alive connections to the server without calling a
    /// model, so that calls made next do not pay connection set-up (TCP, TLS); returns how
    /// many requests were answered. The wire clients send that many concurrent `GET`s of
    /// the provider's model list; a client without such a request opens none (the default).
    async fn warm_up(&self, connections: usize) -> usize {
        let _ = connections;
        0
    }
}

/// The process-wide HTTP client: keep-alive pool, `TCP_NODELAY`, HTTP/2 where TLS offers
/// it, and no proxies from the environment (model servers are usually local).
pub fn shared_http_client() -> reqwest::Client {
    static CLIENT: OnceLock<reqwest::Client> = OnceLock::new();
    CLIENT
        .get_or_init(|| {
            reqwest::Client::builder()
                .no_proxy()
                .tcp_nodelay(true)
                .pool_max_idle_per_host(usize::MAX)
                .pool_idle_timeout(Duration::from_secs(90))
                .tcp_keepalive(Duration::from_secs(60))
                .connect_timeout(Duration::from_secs(30))
                .user_agent(concat!("rlm-kernel/", env!("CARGO_PKG_VERSION")))
                .build()
                .unwrap_or_else(|_| reqwest::Client::new())
        })
        .clone()
}

/// Where and how one client sends its requests; shared by both protocols.
#[derive(Debug, Clone)]
pub(crate) struct Transport {
    endpoint: String,
    /// How messages name the settings of the endpoint.
    settings: SettingNames,
    url: String,
    /// `GET` here lists the server's models (`{base_url}/models`).
    models_url: String,
    /// `url` parsed once; reqwest takes a `Url` without re-parsing it.
    parsed_url: reqwest::Url,
    /// The provider's model list (its own path per protocol), what [`Transport::warm_up`]
    /// requests.
    list_url: reqwest::Url,
    headers: HeaderMap,
    timeout: Duration,
    /// The longest `Retry-After` worth keeping: the retry policy's `max_delay`.
    max_retry_after: Duration,
    /// [`MAX_ANSWER_BYTES`], lowered by tests.
    max_answer_bytes: usize,
    auth_hint: String,
    http: reqwest::Client,
}

/// Where the API key came from, for the 401 hint.
pub(crate) enum KeySource {
    Inline(Secret),
    Env { var: String, value: Secret },
    MissingEnv(String),
    None,
}

impl KeySource {
    /// Resolve the key of `config`: inline `api_key` first, then `api_key_env` (read through
    /// [`secret::env_secret`], so a key still resolves after its variable left the
    /// environment). Either way the key is registered for redaction.
    pub(crate) fn resolve(config: &EndpointConfig) -> Self {
        if let Some(key) = config.api_key.as_ref().filter(|k| !k.is_empty()) {
            secret::register(key);
            return Self::Inline(key.clone());
        }
        match &config.api_key_env {
            Some(var) => match secret::env_secret(var) {
                Some(value) => Self::Env {
                    var: var.clone(),
                    value,
                },
                None => Self::MissingEnv(var.clone()),
            },
            None => Self::None,
        }
    }

    /// The key to send, if any.
    pub(crate) fn key(&self) -> Option<&str> {
        match self {
            Self::Inline(k) | Self::Env { value: k, .. } => Some(k.expose()),
            Self::MissingEnv(_) | Self::None => None,
        }
    }

    fn hint(&self, endpoint: &str, settings: &SettingNames, example_var: &str) -> String {
        let key_setting = settings.api_key_env(endpoint);
        match self {
            Self::Inline(_) => format!("check `api_key` of endpoint `{endpoint}`"),
            Self::Env { var, .. } => format!(
                "check the key in the environment variable `{var}` (named by {key_setting})"
            ),
            Self::MissingEnv(var) => format!(
                "the environment variable `{var}` is not set; export it with your API key \
                 (named by {key_setting})"
            ),
            Self::None => format!(
                "no API key is sent; export one in `{example_var}`, or name its variable with \
                 {key_setting}"
            ),
        }
    }
}

impl Transport {
    /// Build the transport of `config` posting to `url`, with the protocol's own headers.
    pub(crate) fn new(
        config: &EndpointConfig,
        (url, models_url): (String, String),
        mut headers: HeaderMap,
        key: &KeySource,
        example_var: &str,
    ) -> Result<Self, BridgeError> {
        let parse = |url: &str| {
            reqwest::Url::parse(url).map_err(|e| {
                BridgeError::Config(format!(
                    "`base_url` of endpoint `{}` gives the invalid URL `{url}` ({e}); use e.g. \
                     `http://127.0.0.1:8000/v1`",
                    config.name
                ))
            })
        };
        let parsed = parse(&url)?;
        let models_url = parse(&models_url)?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(BridgeError::Config(format!(
                "`base_url` of endpoint `{}` must start with `http://` or `https://`, got `{url}`",
                config.name
            )));
        }
        if config.timeout.is_zero() {
            return Err(BridgeError::Config(format!(
                "`timeout` of endpoint `{}` must be positive",
                config.name
            )));
        }
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        for (name, value) in &config.headers {
            let bad = |what: &str| {
                BridgeError::Config(format!(
                    "header `{name}` of endpoint `{}` has an invalid {what}",
                    config.name
                ))
            };
            let name_h = HeaderName::from_bytes(name.as_bytes()).map_err(|_| bad("name"))?;
            let value_h = HeaderValue::from_str(value).map_err(|_| bad("value"))?;
            headers.insert(name_h, value_h);
        }
        Ok(Self {
            endpoint: config.name.clone(),
            url,
            models_url: join_url(&config.base_url, "models"),
            parsed_url: parsed,
            list_url: models_url,
            headers,
            timeout: config.timeout,
            max_retry_after: config.retry.max_delay,
            max_answer_bytes: MAX_ANSWER_BYTES,
            auth_hint: key.hint(&config.name, &config.settings, example_var),
            settings: config.settings.clone(),
            http: shared_http_client(),
        })
    }

    /// `model`'s window as the server's model listing gives it; `None` when the listing
    /// fails, is not JSON or does not say (a few seconds at most: it is only a hint).
    pub(crate) async fn listed_context_window(&self, model: &str) -> Option<u64> {
        let mut headers = self.headers.clone();
        headers.remove(CONTENT_TYPE);
        let response = self
            .http
            .get(&self.models_url)
            .headers(headers)
            .timeout(self.timeout.min(Duration::from_secs(5)))
            .send()
            .await
            .ok()?;
        if !response.status().is_success() {
            return None;
        }
        // A listing is small; one far over this is not a listing worth reading.
        let body = read_capped(response, 4 << 20).await?;
        let listing: serde_json::Value = serde_json::from_slice(&body).ok()?;
        crate::window::listed_window(&listing, model)
    }

    /// POST `body` and wait for a 2xx status; error statuses become [`BridgeError`]s.
    async fn send(&self, body: Vec<u8>, sse: bool) -> Result<reqwest::Response, BridgeError> {
        let mut request = self
            .http
            .post(self.parsed_url.clone())
            .headers(self.headers.clone())
            .body(body);
        if sse {
            request = request.header(reqwest::header::ACCEPT, "text/event-stream");
        }
        let response = request.send().await.map_err(|e| self.map_reqwest(&e))?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let retry_after = crate::retry::retry_after(response.headers(), self.max_retry_after);
        let text = read_error_body(response).await;
        Err(self.status_error(status.as_u16(), &text, retry_after))
    }

    /// `connections` concurrent `GET`s of the model list; returns how many the server
    /// answered, whatever the status. No answer is read before all have arrived: an unread
    /// answer keeps its connection busy, so no request can take over another's connection
    /// and each one opens its own. Then the bodies are read (up to [`MAX_ERROR_BYTES`]) and
    /// the connections go back to the pool, open.
    pub(crate) async fn warm_up(&self, connections: usize) -> usize {
        let send = || {
            let request = self
                .http
                .get(self.list_url.clone())
                .headers(self.headers.clone())
                .send();
            async move {
                match tokio::time::timeout(self.timeout, request).await {
                    Ok(Ok(response)) => Some(response),
                    Ok(Err(_)) | Err(_) => None,
                }
            }
        };
        let answers: Vec<reqwest::Response> =
            futures::future::join_all((0..connections).map(|_| send()))
                .await
                .into_iter()
                .flatten()
                .collect();
        let answered = answers.len();
        let read = futures::future::join_all(answers.into_iter().map(read_error_body));
        let _ = tokio::time::timeout(self.timeout, read).await;
        answered
    }

    /// The whole body of an answer, up to `max_answer_bytes`.
    async fn read_answer(&self, mut response: reqwest::Response) -> Result<Vec<u8>, BridgeError> {
        let cap = self.max_answer_bytes;
        let announced = response.content_length();
        if let Some(length) = announced.filter(|&n| n > cap as u64) {
            return Err(self.decode(format!(
                "the answer is larger than the {} limit (`Content-Length: {length}`)",
                fmt_bytes(cap)
            )));
        }
        let mut body = Vec::with_capacity(announced.map_or(0, |n| n as usize));
        while let Some(chunk) = response.chunk().await.map_err(|e| self.map_reqwest(&e))? {
            if body.len() + chunk.len() > cap {
                return Err(self.decode(format!(
                    "the answer is larger than the {} limit",
                    fmt_bytes(cap)
                )));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }

    /// One non-streaming attempt: send, read the whole body, decode it, all within `timeout`.
    pub(crate) async fn post_json<T: DeserializeOwned>(
        &self,
        body: Vec<u8>,
    ) -> Result<T, BridgeError> {
        let attempt = async {
            let response = self.send(body, false).await?;
            let bytes = self.read_answer(response).await?;
            serde_json::from_slice::<T>(&bytes).map_err(|e| self.decode_error(e, &bytes))
        };
        tokio::time::timeout(self.timeout, attempt)
            .await
            .map_err(|_| self.timeout_error())?
    }

    /// One streaming attempt: send and return the SSE events; `timeout` bounds the wait for
    /// the headers and then each event separately. A server that answers in another
    /// `Content-Type` (it does not stream) has its whole body read, within `timeout`, for the
    /// client to decode as a non-streamed answer. A missing `Content-Type` is read as SSE.
    pub(crate) async fn post_sse(
        &self,
        body: Vec<u8>,
    ) -> Result<
        StreamReply<impl Stream<Item = Result<Event, EventStreamError<reqwest::Error>>>>,
        BridgeError,
    > {
        use eventsource_stream::Eventsource;
        let attempt = async {
            let response = self.send(body, true).await?;
            let content_type = response
                .headers()
                .get(CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            match content_type {
                Some(ct) if !is_event_stream(&ct) => Ok(StreamReply::Whole {
                    content_type: ct,
                    body: self.read_answer(response).await?,
                }),
                _ => Ok(StreamReply::Events(response.bytes_stream().eventsource())),
            }
        };
        tokio::time::timeout(self.timeout, attempt)
            .await
            .map_err(|_| self.timeout_error())?
    }

    /// Decode the whole body a server sent instead of a stream.
    pub(crate) fn decode_whole<T: DeserializeOwned>(
        &self,
        content_type: &str,
        body: &[u8],
    ) -> Result<T, BridgeError> {
        serde_json::from_slice(body).map_err(|e| {
            self.decode(format!(
                "a streaming request was answered with `Content-Type: {content_type}` instead \
                 of `text/event-stream`, and the body is no answer either ({e}); the body \
                 starts with {:?}",
                body_snippet(body)
            ))
        })
    }

    /// The next SSE event, `None` at the end of the stream. `received` counts the stream's
    /// event data so far: a stream is held to the same [`MAX_ANSWER_BYTES`] as a whole body.
    pub(crate) async fn next_event<S>(
        &self,
        events: &mut S,
        received: &mut usize,
    ) -> Result<Option<Event>, BridgeError>
    where
        S: Stream<Item = Result<Event, EventStreamError<reqwest::Error>>> + Unpin,
    {
        match tokio::time::timeout(self.timeout, events.next()).await {
            Err(_) => Err(self.timeout_error()),
            Ok(None) => Ok(None),
            Ok(Some(Ok(event))) => {
                *received = received.saturating_add(event.data.len());
                if *received > self.max_answer_bytes {
                    return Err(self.decode(format!(
                        "the streamed answer is larger than the {} bytes limit",
                        self.max_answer_bytes
                    )));
                }
                Ok(Some(event))
            }
            Ok(Some(Err(EventStreamError::Transport(e)))) => Err(self.map_reqwest(&e)),
            Ok(Some(Err(e))) => Err(self.decode(format!("invalid SSE stream: {e}"))),
        }
    }

    pub(crate) fn decode(&self, detail: impl Into<String>) -> BridgeError {
        BridgeError::Decode {
            endpoint: self.endpoint.clone(),
            url: self.url.clone(),
            detail: detail.into(),
        }
    }

    fn decode_error(&self, e: serde_json::Error, bytes: &[u8]) -> BridgeError {
        self.decode(format!(
            "{e}; the body starts with {:?}",
            body_snippet(bytes)
        ))
    }

    pub(crate) fn network(&self, detail: impl Into<String>) -> BridgeError {
        BridgeError::Network {
            url: self.url.clone(),
            detail: detail.into(),
        }
    }

    fn timeout_error(&self) -> BridgeError {
        BridgeError::Timeout {
            endpoint: self.endpoint.clone(),
            timeout_setting: self.settings.timeout(&self.endpoint),
            url: self.url.clone(),
            timeout: self.timeout,
        }
    }

    /// An error status, or an error event inside a stream, as a [`BridgeError`].
    pub(crate) fn status_error(
        &self,
        status: u16,
        body: &str,
        retry_after: Option<std::time::Duration>,
    ) -> BridgeError {
        let message = error_message(body, status);
        if matches!(status, 401 | 403) {
            return BridgeError::Unauthorized {
                endpoint: self.endpoint.clone(),
                url: self.url.clone(),
                status,
                message,
                hint: self.auth_hint.clone(),
            };
        }
        BridgeError::Http {
            endpoint: self.endpoint.clone(),
            base_url_setting: self.settings.base_url(&self.endpoint),
            url: self.url.clone(),
            status,
            message,
            retry_after,
        }
    }

    fn map_reqwest(&self, e: &reqwest::Error) -> BridgeError {
        let detail = root_cause(e);
        // A connect timeout is both; "could not connect" is the one that helps.
        if e.is_connect() {
            BridgeError::Connect {
                endpoint: self.endpoint.clone(),
                base_url_setting: self.settings.base_url(&self.endpoint),
                url: self.url.clone(),
                detail: if e.is_timeout() {
                    format!("the connection attempt timed out: {detail}")
                } else {
                    detail
                },
            }
        } else if e.is_timeout() {
            self.timeout_error()
        } else if e.is_builder() {
            BridgeError::Config(format!(
                "could not build the request for `{}`: {detail}",
                self.url
            ))
        } else {
            self.network(detail)
        }
    }
}

/// The start of an error body (at most [`MAX_ERROR_BYTES`]) as text. If reading fails, what
/// arrived is kept: the status alone still says enough.
async fn read_error_body(mut response: reqwest::Response) -> String {
    let mut body = Vec::new();
    while body.len() < MAX_ERROR_BYTES {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                let room = MAX_ERROR_BYTES - body.len();
                body.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
            Ok(None) | Err(_) => break,
        }
    }
    String::from_utf8_lossy(&body).into_owned()
}

/// `64 MiB`, or a byte count when it is not whole mebibytes.
fn fmt_bytes(n: usize) -> String {
    if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{} MiB", n >> 20)
    } else {
        format!("{n} bytes")
    }
}

/// What a streaming request got back.
pub(crate) enum StreamReply<S> {
    /// The SSE events asked for.
    Events(S),
    /// A whole body in another `Content-Type`: the server does not stream.
    Whole {
        /// The `Content-Type` it came with.
        content_type: String,
        /// The body.
        body: Vec<u8>,
    },
}

/// Whether a `Content-Type` is SSE (`text/event-stream`, parameters allowed).
fn is_event_stream(content_type: &str) -> bool {
    content_type
        .split(';')
        .next()
        .is_some_and(|essence| essence.trim().eq_ignore_ascii_case("text/event-stream"))
}

/// For fields some servers send as `null` where the spec has a list or an object.
pub(crate) fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + serde::Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Option::unwrap_or_default)
}

/// The innermost cause of an error chain, which is the one that names the problem
/// (e.g. `Connection refused (os error 111)`).
fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = e;
    while let Some(next) = cause.source() {
        cause = next;
    }
    cause.to_string()
}

/// The server's own words from an error body: OpenAI `{"error":{"message"}}`, Anthropic
/// `{"error":{"type","message"}}`, `{"error":"…"}`, `{"message"|"detail":"…"}`, or the text.
pub(crate) fn error_message(body: &str, status: u16) -> String {
    let from_json = serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| {
            let error = v.get("error").unwrap_or(&v);
            error
                .get("message")
                .or_else(|| error.get("detail"))
                .or_else(|| error.get("msg"))
                .and_then(|m| m.as_str().map(str::to_owned))
                .or_else(|| error.as_str().map(str::to_owned))
                .or_else(|| v.get("detail").map(|d| d.to_string()))
        });
    match from_json {
        Some(m) if !m.trim().is_empty() => snippet(m.trim(), 2000),
        _ if body.trim().is_empty() => reqwest::StatusCode::from_u16(status)
            .ok()
            .and_then(|s| s.canonical_reason())
            .unwrap_or("no message")
            .to_owned(),
        _ => snippet(body.trim(), 500),
    }
}

/// The start of a body, for error messages.
fn body_snippet(body: &[u8]) -> String {
    // 200 characters are at most 800 bytes of UTF-8; a cut character becomes `�`.
    let head = &body[..body.len().min(800)];
    snippet(&String::from_utf8_lossy(head), 200)
}

fn snippet(s: &str, max_chars: usize) -> String {
    match s.char_indices().nth(max_chars) {
        Some((cut, _)) => format!("{}…", &s[..cut]),
        None => s.to_owned(),
    }
}

/// Join a base URL and a path with exactly one slash between them.
/// The body of `response`, unless it is longer than `limit` bytes or breaks off.
async fn read_capped(response: reqwest::Response, limit: usize) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    let mut stream = response.bytes_stream();
    while let Some(chunk) = stream.next().await {
        body.extend_from_slice(&chunk.ok()?);
        if body.len() > limit {
            return None;
        }
    }
    Some(body)
}

pub(crate) fn join_url(base: &str, path: &str) -> String {
    format!(
        "{}/{}",
        base.trim_end_matches('/'),
        path.trim_start_matches('/')
    )
}

/// Sampling parameters of one request merged over the endpoint's defaults, borrowed.
///
/// `extra` keys win over typed fields: a typed field is left out when either `extra` map
/// has its wire name, so a body never carries the same key twice.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Params<'a> {
    pub(crate) temperature: Option<f32>,
    pub(crate) top_p: Option<f32>,
    pub(crate) max_tokens: Option<u32>,
    pub(crate) stop: &'a [String],
    pub(crate) seed: Option<u64>,
    pub(crate) extra: Extra<'a>,
}

impl<'a> Params<'a> {
    /// `req` over `defaults`; `stop_key` is the protocol's name for stop sequences.
    pub(crate) fn merge(
        req: &'a crate::chat::SamplingParams,
        defaults: &'a crate::chat::SamplingParams,
        stop_key: &str,
    ) -> Self {
        let extra = Extra {
            primary: &req.extra,
            fallback: &defaults.extra,
        };
        let stop = if req.stop.is_empty() {
            &defaults.stop
        } else {
            &req.stop
        };
        Self {
            temperature: req
                .temperature
                .or(defaults.temperature)
                .filter(|_| !extra.has("temperature")),
            top_p: req.top_p.or(defaults.top_p).filter(|_| !extra.has("top_p")),
            max_tokens: req
                .max_tokens
                .or(defaults.max_tokens)
                .filter(|_| !extra.has("max_tokens")),
            stop: if extra.has(stop_key) { &[] } else { stop },
            seed: req.seed.or(defaults.seed).filter(|_| !extra.has("seed")),
            extra,
        }
    }
}

/// The request's `extra` map over the endpoint's, serialized as one flat map.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Extra<'a> {
    primary: &'a serde_json::Map<String, serde_json::Value>,
    fallback: &'a serde_json::Map<String, serde_json::Value>,
}

impl Extra<'_> {
    pub(crate) fn has(&self, key: &str) -> bool {
        self.primary.contains_key(key) || self.fallback.contains_key(key)
    }
}

impl serde::Serialize for Extra<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(None)?;
        for (k, v) in self.primary {
            map.serialize_entry(k, v)?;
        }
        for (k, v) in self.fallback {
            if !self.primary.contains_key(k) {
                map.serialize_entry(k, v)?;
            }
        }
        map.end()
    }
}

/// Serialize a request body; typed fields never fail, so an error here is a bug in `extra`.
pub(crate) fn to_body<T: serde::Serialize>(body: &T) -> Result<Vec<u8>, BridgeError> {
    serde_json::to_vec(body)
        .map_err(|e| BridgeError::InvalidRequest(format!("could not encode the request: {e}")))
}

/// A tool call assembled from stream fragments.
#[derive(Debug, Default)]
pub(crate) struct PartialToolCall {
    pub(crate) key: usize,
    pub(crate) id: String,
    pub(crate) name: String,
    pub(crate) arguments: String,
}

/// The entry for stream index `key`, created on first sight (linear: there are few).
pub(crate) fn partial_call(calls: &mut Vec<PartialToolCall>, key: usize) -> &mut PartialToolCall {
    let pos = match calls.iter().position(|c| c.key == key) {
        Some(pos) => pos,
        None => {
            calls.push(PartialToolCall {
                key,
                ..PartialToolCall::default()
            });
            calls.len() - 1
        }
    };
    &mut calls[pos]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A listener whose accept queue is full: Linux drops further SYNs, so a connection to
    /// it times out instead of being refused. `None` if the queue never filled.
    #[cfg(target_os = "linux")]
    async fn unconnectable() -> Option<(String, tokio::net::TcpListener, Vec<tokio::net::TcpStream>)>
    {
        let socket = tokio::net::TcpSocket::new_v4().ok()?;
        socket.bind("127.0.0.1:0".parse().ok()?).ok()?;
        let listener = socket.listen(0).ok()?;
        let addr = listener.local_addr().ok()?;
        let mut queued = Vec::new();
        for _ in 0..16 {
            let connect = tokio::net::TcpStream::connect(addr);
            match tokio::time::timeout(Duration::from_millis(200), connect).await {
                Ok(Ok(stream)) => queued.push(stream),
                Ok(Err(_)) => return None,
                Err(_) => return Some((addr.to_string(), listener, queued)),
            }
        }
        None
    }

    /// A transport posting to `http://{addr}/v1/chat/completions`.
    fn transport(addr: &str) -> Transport {
        let config = EndpointConfig::openai("sub", format!("http://{addr}/v1"), "m");
        Transport::new(
            &config,
            (
                join_url(&config.base_url, "chat/completions"),
                join_url(&config.base_url, "models"),
            ),
            HeaderMap::new(),
            &KeySource::None,
            "OPENAI_API_KEY",
        )
        .expect("valid config")
    }

    /// A one-connection HTTP server on loopback: reads one small request (head and `{}`
    /// body), then hands the socket to `respond`. Returns its address.
    async fn serve_once<F, Fut>(respond: F) -> String
    where
        F: FnOnce(tokio::net::TcpStream) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send,
    {
        use tokio::io::AsyncReadExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        tokio::spawn(async move {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            // The request is small: its head and `{}` body come in one read or two.
            let mut request = Vec::new();
            let mut buf = [0u8; 4096];
            while !request.ends_with(b"\r\n\r\n{}") {
                match socket.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => request.extend_from_slice(&buf[..n]),
                }
            }
            respond(socket).await;
        });
        addr
    }

    #[tokio::test]
    async fn an_answer_past_the_cap_without_content_length_is_refused() {
        use tokio::io::AsyncWriteExt;
        let addr = serve_once(|mut socket| async move {
            let head =
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n";
            let _ = socket.write_all(head.as_bytes()).await;
            // Just past the cap, then the connection stays open: only the cap ends the read.
            let _ = socket.write_all(&[b' '; 1025]).await;
            tokio::time::sleep(Duration::from_secs(60)).await;
        })
        .await;
        let mut transport = transport(&addr);
        transport.max_answer_bytes = 1024;
        transport.timeout = Duration::from_secs(5);
        let err = transport
            .post_json::<serde_json::Value>(b"{}".to_vec())
            .await
            .expect_err("too large");
        assert!(matches!(err, BridgeError::Decode { .. }), "{err:?}");
        assert!(
            err.to_string()
                .contains("the answer is larger than the 1024 bytes limit"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_stream_past_the_cap_is_refused() {
        use tokio::io::AsyncWriteExt;
        let addr = serve_once(|mut socket| async move {
            let head =
                "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n";
            let _ = socket.write_all(head.as_bytes()).await;
            // Events without end: only the cap stops the reader.
            for _ in 0..10_000 {
                if socket
                    .write_all(b"data: 0123456789abcdef\n\n")
                    .await
                    .is_err()
                {
                    return;
                }
            }
        })
        .await;
        let mut transport = transport(&addr);
        transport.max_answer_bytes = 1024;
        transport.timeout = Duration::from_secs(5);
        let StreamReply::Events(mut events) = transport
            .post_sse(b"{}".to_vec())
            .await
            .expect("the stream starts")
        else {
            panic!("an event stream");
        };
        let mut received = 0;
        let err = loop {
            match transport.next_event(&mut events, &mut received).await {
                Ok(Some(_)) => {}
                Ok(None) => panic!("the stream ended before the cap"),
                Err(err) => break err,
            }
        };
        assert!(matches!(err, BridgeError::Decode { .. }), "{err:?}");
        assert!(
            err.to_string().contains("larger than the 1024 bytes limit"),
            "{err}"
        );
        assert!(received > 1024 && received < 1024 + 64, "{received}");
    }

    // Only Linux is known to drop (rather than refuse) connections to a full accept queue.
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn a_connect_timeout_is_a_connect_error_naming_the_url() {
        let (addr, _listener, _queued) = unconnectable()
            .await
            .expect("Linux drops connections to a full accept queue");
        let mut transport = transport(&addr);
        transport.http = reqwest::Client::builder()
            .no_proxy()
            .connect_timeout(Duration::from_millis(200))
            .build()
            .expect("client");
        let started = std::time::Instant::now();
        let err = transport
            .post_json::<serde_json::Value>(b"{}".to_vec())
            .await
            .expect_err("cannot connect");
        assert!(started.elapsed() >= Duration::from_millis(200), "timed out");
        assert!(matches!(err, BridgeError::Connect { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(
            msg.starts_with(&format!(
                "Could not connect to `http://{addr}/v1/chat/completions`"
            )),
            "{msg}"
        );
        assert!(
            msg.contains("timed out") && !msg.contains("`timeout`"),
            "{msg}"
        );
    }
}
