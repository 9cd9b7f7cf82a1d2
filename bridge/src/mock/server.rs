//! The HTTP server: routing, auth, latency, faults, rendering and logging of each request.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::header::{
    CACHE_CONTROL, CONTENT_LENGTH, CONTENT_TYPE, HeaderMap, HeaderValue, RETRY_AFTER,
};
use axum::http::{HeaderName, StatusCode};
use axum::response::Response;
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use futures::StreamExt;
use serde::Serialize;
use tokio::net::TcpSocket;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::config::{FaultKind, MockConfig};
use super::error::MockError;
use super::faults::FaultPlan;
use super::latency::Latency;
use super::log::{RequestLog, RequestRecord};
use super::request;
use super::rng;
use super::script::Script;
use super::timer::Timers;
use super::validate;
use super::wire::{self, Answer, ErrorKind, Provider};

/// Largest accepted request body (sub-model prompts can be large).
const MAX_BODY_BYTES: usize = 256 * 1024 * 1024;
/// Characters of the last user message kept in the request log.
const LOGGED_PROMPT_CHARS: usize = 200;
/// Upper bound on a graceful shutdown; connections still open after it are dropped.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);
/// Logged status of a request whose client left before the response was ready (as nginx does).
const CLIENT_CLOSED_REQUEST: u16 = 499;
const REQUEST_ID: HeaderName = HeaderName::from_static("x-mock-request-id");
/// OpenAI's millisecond-precision companion of `Retry-After`.
const RETRY_AFTER_MS: HeaderName = HeaderName::from_static("retry-after-ms");

/// A running mock LM server on a loopback port. Dropping it stops the server in the background;
/// [`MockServer::shutdown`] stops it and waits.
#[derive(Debug)]
pub struct MockServer {
    addr: SocketAddr,
    log: RequestLog,
    /// Shared with the server state: the next request's id, i.e. requests arrived so far.
    next_id: Arc<AtomicU64>,
    /// TCP connections accepted so far.
    connections: Arc<AtomicU64>,
    /// Shared with the server state.
    timers: Arc<Timers>,
    shutdown: CancellationToken,
    task: Option<JoinHandle<()>>,
}

#[derive(Debug)]
struct ServerState {
    script: Script,
    latency: Latency,
    faults: FaultPlan,
    seed: u64,
    api_key: Option<String>,
    record_requests: bool,
    log: RequestLog,
    started: Instant,
    next_id: Arc<AtomicU64>,
    shutdown: CancellationToken,
    /// Chat requests served at most at once; more are answered 429 at once.
    capacity: Option<usize>,
    /// Chat requests being served now (admitted by `capacity`).
    serving: AtomicUsize,
    /// The requests' waits for their deadlines.
    timers: Arc<Timers>,
}

/// A chat request's place within the capacity; frees it when dropped.
struct Slot<'a>(&'a AtomicUsize);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl MockServer {
    /// Binds (default `127.0.0.1:0`) and starts serving on the current tokio runtime.
    /// Fails with `InvalidInput` for a non-loopback address or an invalid configuration.
    pub async fn start(config: MockConfig) -> io::Result<MockServer> {
        let addr = config
            .addr
            .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0)));
        if !addr.ip().is_loopback() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "Mock server address `{addr}` is not a loopback address; use `127.0.0.1` \
                     or `[::1]`"
                ),
            ));
        }
        let invalid = |e: MockError| io::Error::new(io::ErrorKind::InvalidInput, e);
        config.latency.validate().map_err(invalid)?;
        if config.capacity == Some(0) {
            return Err(invalid(MockError::InvalidConfig(
                "`capacity` must be at least 1 (or `None` for no limit)".into(),
            )));
        }
        let faults = FaultPlan::new(&config.faults).map_err(invalid)?;
        // A deep accept backlog: benchmarks open thousands of connections at once, and
        // tokio's default of 1024 would turn that burst into connect timeouts.
        let socket = if addr.is_ipv4() {
            TcpSocket::new_v4()?
        } else {
            TcpSocket::new_v6()?
        };
        socket.set_reuseaddr(true)?;
        socket.set_nodelay(true)?;
        socket.bind(addr)?;
        let listener = socket.listen(8192)?;
        let addr = listener.local_addr()?;
        let log = RequestLog::with_limit(config.log_limit);
        let shutdown = CancellationToken::new();
        let next_id = Arc::new(AtomicU64::new(0));
        // After the listener: a server short of descriptors still serves, on tokio's timer.
        let timers = Timers::start(shutdown.clone());
        let state = Arc::new(ServerState {
            script: config.script,
            latency: config.latency,
            faults,
            seed: config.seed,
            api_key: config.api_key,
            record_requests: config.record_requests,
            log: log.clone(),
            started: Instant::now(),
            next_id: Arc::clone(&next_id),
            shutdown: shutdown.clone(),
            capacity: config.capacity,
            serving: AtomicUsize::new(0),
            timers: Arc::clone(&timers),
        });
        let app = Router::new()
            .route("/v1/chat/completions", post(openai_chat))
            .route("/v1/messages", post(anthropic_messages))
            .route("/v1/models", get(list_models))
            .fallback(not_found)
            .method_not_allowed_fallback(method_not_allowed)
            .with_state(state);
        // Small responses must not wait for Nagle + delayed ACK.
        let connections = Arc::new(AtomicU64::new(0));
        let accepted = Arc::clone(&connections);
        let listener = listener.tap_io(move |tcp| {
            accepted.fetch_add(1, Ordering::Relaxed);
            let _ = tcp.set_nodelay(true);
        });
        let signal = shutdown.clone().cancelled_owned();
        let task = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app)
                .with_graceful_shutdown(signal)
                .await
            {
                tracing::warn!("mock LM server stopped with an error: {e}");
            }
        });
        Ok(MockServer {
            addr,
            log,
            next_id,
            connections,
            timers,
            shutdown,
            task: Some(task),
        })
    }

    /// The bound address (with the real port).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Base URL for OpenAI-compatible clients: `http://127.0.0.1:PORT/v1`.
    pub fn openai_base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Base URL for Anthropic clients: `http://127.0.0.1:PORT`.
    pub fn anthropic_base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A handle on the request log.
    pub fn log(&self) -> RequestLog {
        self.log.clone()
    }

    /// Requests that have arrived so far, answered or not (a request counts as soon as its
    /// headers are read, before its latency): tests wait on it to know a call is in flight,
    /// where the log only holds finished requests.
    pub fn arrived(&self) -> u64 {
        self.next_id.load(Ordering::Relaxed)
    }

    /// TCP connections accepted so far: with keep-alive, calls that found an idle connection
    /// in their client's pool opened none (tests check that a warm-up did its work).
    pub fn connections(&self) -> u64 {
        self.connections.load(Ordering::Relaxed)
    }

    /// Requests whose latency was waited on tokio's timer (whole milliseconds, up to ~2 ms
    /// late) because the server has no kernel timer (none could be made when it started, e.g.
    /// no file descriptor left; logged then with the reason).
    pub fn timer_fallbacks(&self) -> u64 {
        self.timers.fallbacks()
    }

    /// Stops accepting, ends sleeping and hanging requests (they answer 503), lets in-flight
    /// responses finish and waits for the server task (at most a few seconds).
    pub async fn shutdown(mut self) {
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            let abort = task.abort_handle();
            if tokio::time::timeout(SHUTDOWN_GRACE, task).await.is_err() {
                abort.abort();
            }
        }
    }

    /// Serves until `signal` completes, then shuts down (for a foreground `rlm mock-lm`).
    pub async fn run_until(self, signal: impl Future<Output = ()>) {
        signal.await;
        self.shutdown().await;
    }
}

impl Drop for MockServer {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

// ---- handlers -------------------------------------------------------------------------------

async fn openai_chat(State(st): State<Arc<ServerState>>, req: Request) -> Response {
    st.chat(Provider::OpenAi, req).await
}

async fn anthropic_messages(State(st): State<Arc<ServerState>>, req: Request) -> Response {
    st.chat(Provider::Anthropic, req).await
}

async fn list_models(State(st): State<Arc<ServerState>>, req: Request) -> Response {
    let mut draft = st.draft(&req);
    if !st.authorized(req.headers()) {
        return st.finish(draft, unauthorized(Provider::OpenAi));
    }
    // A real server's list takes a round trip too; so concurrent requests overlap, each on a
    // connection of its own (what a client's connection warm-up counts on).
    let mut rng = rng::for_request(st.seed, draft.id);
    draft.latency = st.latency.sample(&mut rng);
    if !st.wait_until(draft.deadline()).await {
        return st.finish(draft, shutting_down(Provider::OpenAi));
    }
    #[derive(Serialize)]
    struct ModelList<'a> {
        object: &'static str,
        data: Vec<ModelEntry<'a>>,
    }
    #[derive(Serialize)]
    struct ModelEntry<'a> {
        id: &'a str,
        object: &'static str,
        created: u64,
        owned_by: &'static str,
        #[serde(skip_serializing_if = "Option::is_none")]
        max_model_len: Option<u64>,
    }
    let names = st.script.model_names();
    let names: Vec<&str> = if names.is_empty() {
        vec!["mock"]
    } else {
        names.iter().map(String::as_str).collect()
    };
    let list = ModelList {
        object: "list",
        data: names
            .into_iter()
            .map(|id| ModelEntry {
                id,
                object: "model",
                created: 0,
                owned_by: "rlm-mock",
                max_model_len: st.script.context_window_for(id),
            })
            .collect(),
    };
    let body = serde_json::to_vec(&list).unwrap_or_default();
    st.finish(draft, Outcome::ok(body, false))
}

async fn not_found(State(st): State<Arc<ServerState>>, req: Request) -> Response {
    let draft = st.draft(&req);
    let message = format!(
        "Unknown path `{} {}`; the mock serves `POST /v1/chat/completions`, `POST /v1/messages` \
         and `GET /v1/models`",
        req.method(),
        req.uri().path()
    );
    let provider = provider_for_path(req.uri().path());
    st.finish(
        draft,
        Outcome::error(provider, ErrorKind::NotFound, &message),
    )
}

async fn method_not_allowed(State(st): State<Arc<ServerState>>, req: Request) -> Response {
    let draft = st.draft(&req);
    let message = format!(
        "Method `{}` is not allowed on `{}`",
        req.method(),
        req.uri().path()
    );
    let provider = provider_for_path(req.uri().path());
    st.finish(
        draft,
        Outcome::error(provider, ErrorKind::MethodNotAllowed, &message),
    )
}

fn provider_for_path(path: &str) -> Provider {
    if path.starts_with("/v1/messages") {
        Provider::Anthropic
    } else {
        Provider::OpenAi
    }
}

fn unauthorized(provider: Provider) -> Outcome {
    Outcome::error(
        provider,
        ErrorKind::Unauthorized,
        "Invalid or missing API key; send `Authorization: Bearer KEY` or `x-api-key: KEY`",
    )
}

// ---- one chat request -----------------------------------------------------------------------

/// What is known about a request before its response exists.
#[derive(Debug)]
struct Draft {
    id: u64,
    path: String,
    /// When its headers were read: its latency counts from here.
    arrival: Instant,
    arrived: Duration,
    /// The latency drawn for it (zero until drawn).
    latency: Duration,
    model: String,
    last_user: String,
    stream: bool,
    request_bytes: usize,
    fault: Option<FaultKind>,
    headers: Vec<(String, String)>,
    body: Option<String>,
    /// Where the record goes; taken when it is written.
    sink: Option<(RequestLog, Instant)>,
}

impl Draft {
    /// When its latency ends (`None`: past any clock, never).
    fn deadline(&self) -> Option<Instant> {
        self.arrival.checked_add(self.latency)
    }

    fn record(&mut self, status: u16, response_bytes: usize) {
        let Some((log, started)) = self.sink.take() else {
            return;
        };
        log.push(RequestRecord {
            id: self.id,
            path: std::mem::take(&mut self.path),
            model: std::mem::take(&mut self.model),
            arrived: self.arrived,
            latency: self.latency,
            finished: started.elapsed(),
            status,
            fault: self.fault.map(|f| f.name().to_owned()),
            request_bytes: self.request_bytes,
            response_bytes,
            last_user: std::mem::take(&mut self.last_user),
            stream: self.stream,
            headers: std::mem::take(&mut self.headers),
            body: self.body.take(),
        });
    }
}

impl Drop for Draft {
    /// hyper drops the handler when the client goes away (e.g. its timeout fired): log that too.
    fn drop(&mut self) {
        self.record(CLIENT_CLOSED_REQUEST, 0);
    }
}

/// A response plus the facts the log records about it.
#[derive(Debug)]
struct Outcome {
    response: Response,
    status: u16,
    response_bytes: usize,
}

impl ServerState {
    fn draft(&self, req: &Request) -> Draft {
        let arrival = Instant::now();
        Draft {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            path: req.uri().path().to_owned(),
            arrival,
            arrived: arrival.saturating_duration_since(self.started),
            latency: Duration::ZERO,
            model: String::new(),
            last_user: String::new(),
            stream: false,
            request_bytes: 0,
            fault: None,
            headers: if self.record_requests {
                req.headers()
                    .iter()
                    .map(|(k, v)| {
                        (
                            k.as_str().to_owned(),
                            String::from_utf8_lossy(v.as_bytes()).into_owned(),
                        )
                    })
                    .collect()
            } else {
                Vec::new()
            },
            body: None,
            sink: Some((self.log.clone(), self.started)),
        }
    }

    fn authorized(&self, headers: &HeaderMap) -> bool {
        let Some(key) = &self.api_key else {
            return true;
        };
        let bearer = headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        let x_api_key = headers.get("x-api-key").and_then(|v| v.to_str().ok());
        bearer.is_some_and(|b| b.trim() == key) || x_api_key.is_some_and(|k| k.trim() == key)
    }

    fn finish(&self, mut draft: Draft, outcome: Outcome) -> Response {
        let mut response = outcome.response;
        response
            .headers_mut()
            .insert(REQUEST_ID, HeaderValue::from(draft.id));
        draft.record(outcome.status, outcome.response_bytes);
        response
    }

    /// A place among the requests being served, or `None` when `capacity` are already.
    fn admit(&self) -> Option<Slot<'_>> {
        let serving = self.serving.fetch_add(1, Ordering::AcqRel);
        let slot = Slot(&self.serving);
        match self.capacity {
            Some(capacity) if serving >= capacity => None,
            _ => Some(slot),
        }
    }

    /// A 429 with `Retry-After` (whole seconds, rounded up) and `retry-after-ms`.
    fn rate_limited(&self, provider: Provider, message: &str) -> Outcome {
        let mut outcome = Outcome::error(provider, ErrorKind::RateLimited, message);
        let retry_after = self.faults.retry_after;
        let headers = outcome.response.headers_mut();
        headers.insert(
            RETRY_AFTER,
            HeaderValue::from(retry_after.as_secs_f64().ceil() as u64),
        );
        headers.insert(
            RETRY_AFTER_MS,
            HeaderValue::from(retry_after.as_millis() as u64),
        );
        outcome
    }

    /// Waits until `deadline` unless the server shuts down first; `false` = shutting down.
    async fn wait_until(&self, deadline: Option<Instant>) -> bool {
        if deadline.is_some_and(|d| d <= Instant::now()) {
            return true;
        }
        tokio::select! {
            () = self.timers.wait_until(deadline) => true,
            () = self.shutdown.cancelled() => false,
        }
    }

    async fn chat(&self, provider: Provider, req: Request) -> Response {
        let mut draft = self.draft(&req);
        if !self.authorized(req.headers()) {
            return self.finish(draft, unauthorized(provider));
        }
        let body = match axum::body::to_bytes(req.into_body(), MAX_BODY_BYTES).await {
            Ok(body) => body,
            Err(e) => {
                let message =
                    format!("Could not read the request body (limit {MAX_BODY_BYTES} bytes): {e}");
                return self.finish(
                    draft,
                    Outcome::error(provider, ErrorKind::PayloadTooLarge, &message),
                );
            }
        };
        draft.request_bytes = body.len();
        if self.record_requests {
            draft.body = Some(String::from_utf8_lossy(&body).into_owned());
        }
        let checked = request::parse_request(provider, &body)
            .and_then(|view| Ok((validate::check(provider, &view.traffic)?, view)));
        let (limits, view) = match checked {
            Ok(checked) => checked,
            Err(message) => {
                return self.finish(
                    draft,
                    Outcome::error(provider, ErrorKind::BadRequest, &message),
                );
            }
        };
        drop(body);
        draft.model.clone_from(&view.model);
        draft.last_user = truncate_chars(&view.last_user, LOGGED_PROMPT_CHARS).to_owned();
        draft.stream = view.stream;

        let Some(_slot) = self.admit() else {
            let message = format!(
                "Too many requests at once: the mock server serves {} at a time (`capacity`); \
                 retry after the `Retry-After` delay",
                self.capacity.unwrap_or_default()
            );
            return self.finish(draft, self.rate_limited(provider, &message));
        };
        let prompt = view.prompt();
        let mut rng = rng::for_request(self.seed, draft.id);
        let fault = self.faults.decide(&prompt, &mut rng);
        draft.fault = fault;
        let latency = self
            .script
            .latency_for(&view.model)
            .unwrap_or(&self.latency);
        // Counted from the arrival: reading and checking the body took part of it.
        draft.latency = latency.sample(&mut rng);
        if !self.wait_until(draft.deadline()).await {
            return self.finish(draft, shutting_down(provider));
        }
        match fault {
            Some(FaultKind::RateLimit) => {
                let outcome = self.rate_limited(
                    provider,
                    "Rate limit reached (injected by the mock server); retry after the \
                     `Retry-After` delay",
                );
                return self.finish(draft, outcome);
            }
            Some(FaultKind::ServerError) => {
                let msg = "Internal server error (injected by the mock server)";
                return self.finish(draft, Outcome::error(provider, ErrorKind::Internal, msg));
            }
            Some(FaultKind::Unavailable) => {
                let msg = "Service unavailable (injected by the mock server)";
                return self.finish(draft, Outcome::error(provider, ErrorKind::Unavailable, msg));
            }
            Some(FaultKind::Reset) => return self.finish(draft, Outcome::reset()),
            Some(FaultKind::Hang) => {
                let end = draft
                    .deadline()
                    .and_then(|d| d.checked_add(self.faults.hang));
                if !self.wait_until(end).await {
                    return self.finish(draft, shutting_down(provider));
                }
            }
            Some(FaultKind::MalformedJson | FaultKind::TruncatedBody) | None => {}
        }

        let mut scripted = self.script.reply(&prompt);
        // What a real model cannot do under the request's tool choice, the mock does not.
        if limits.no_tool_calls {
            scripted.tool_calls.clear();
        } else if limits.single_tool_call {
            scripted.tool_calls.truncate(1);
        }
        let answer = Answer {
            id: draft.id,
            created: unix_secs(),
            model: &view.model,
            turn: view.turn,
            text: &scripted.text,
            tool_calls: &scripted.tool_calls,
            finish_reason: scripted.finish_reason,
            prompt_tokens: view.prompt_tokens,
            completion_tokens: wire::completion_tokens(&scripted.text, &scripted.tool_calls),
        };
        let body = match (provider, view.stream) {
            (Provider::OpenAi, false) => wire::openai_json(&answer),
            (Provider::OpenAi, true) => wire::openai_sse(&answer, view.include_usage),
            (Provider::Anthropic, false) => wire::anthropic_json(&answer),
            (Provider::Anthropic, true) => wire::anthropic_sse(&answer),
        };
        let outcome = match fault {
            Some(FaultKind::MalformedJson) => Outcome::malformed(view.stream),
            Some(FaultKind::TruncatedBody) => Outcome::truncated(body, view.stream),
            _ => Outcome::ok(body, view.stream),
        };
        self.finish(draft, outcome)
    }
}

fn shutting_down(provider: Provider) -> Outcome {
    Outcome::error(
        provider,
        ErrorKind::Unavailable,
        "Mock server is shutting down",
    )
}

impl Outcome {
    fn with_body(status: StatusCode, body: Body, content_type: &'static str, bytes: usize) -> Self {
        let mut response = Response::new(body);
        *response.status_mut() = status;
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
        if content_type == SSE {
            headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        }
        Outcome {
            response,
            status: status.as_u16(),
            response_bytes: bytes,
        }
    }

    fn ok(body: Vec<u8>, stream: bool) -> Self {
        let len = body.len();
        let content_type = if stream { SSE } else { JSON };
        Self::with_body(StatusCode::OK, Body::from(body), content_type, len)
    }

    fn error(provider: Provider, kind: ErrorKind, message: &str) -> Self {
        let body = wire::error_body(provider, kind, message);
        let status =
            StatusCode::from_u16(kind.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let len = body.len();
        Self::with_body(status, Body::from(body), JSON, len)
    }

    /// A body that fails before its first byte: hyper drops the connection without a response.
    fn reset() -> Self {
        let failed = futures::stream::once(async {
            Err::<Bytes, _>(io::Error::new(
                io::ErrorKind::ConnectionReset,
                "connection reset (injected by the mock server)",
            ))
        });
        let mut outcome = Self::with_body(StatusCode::OK, Body::from_stream(failed), JSON, 0);
        outcome.status = 0;
        outcome
    }

    fn malformed(stream: bool) -> Self {
        let body: &[u8] = if stream {
            b"data: {\"id\": \"chatcmpl-mock\", \"choices\": [{\"delta\": {\"content\": \"unterminated\n\ndata: [DONE]\n\n"
        } else {
            b"{\"id\": \"mock-malformed\", \"choices\": [{\"message\": {\"content\": \"unterminated"
        };
        Self::ok(body.to_vec(), stream)
    }

    /// Sends half the body, then fails: a JSON body announces its full `Content-Length`,
    /// a stream is cut mid-event.
    fn truncated(body: Vec<u8>, stream: bool) -> Self {
        let full = body.len();
        let mut head = Bytes::from(body);
        head.truncate(full / 2);
        let failure = futures::stream::once(async {
            // Let the first half reach the client before the connection is dropped.
            tokio::time::sleep(Duration::from_millis(20)).await;
            Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "truncated body (injected by the mock server)",
            ))
        });
        let chunks = futures::stream::iter([Ok(head)]).chain(failure);
        let content_type = if stream { SSE } else { JSON };
        let mut outcome = Self::with_body(
            StatusCode::OK,
            Body::from_stream(chunks),
            content_type,
            full,
        );
        if !stream {
            outcome
                .response
                .headers_mut()
                .insert(CONTENT_LENGTH, HeaderValue::from(full));
        }
        outcome
    }
}

const JSON: &str = "application/json";
const SSE: &str = "text/event-stream";

fn unix_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn truncate_chars(s: &str, max_chars: usize) -> &str {
    match s.char_indices().nth(max_chars) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}
