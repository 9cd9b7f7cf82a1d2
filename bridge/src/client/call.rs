//! The one call skeleton both wire formats share.
//!
//! A [`Protocol`] knows its wire format and nothing else: the headers that identify and
//! authenticate a request, the JSON body, how to read a whole answer, and how to fold one
//! stream event. [`WireClient`] runs the attempt around it, the same for every protocol:
//!
//! ```text
//! body ─ post ─┬─ JSON answer ─────────── read_answer ─┬─ draft ─ model, usage ─ ChatResponse
//!              ├─ SSE events ─ fold_event* ─ ended? ───┤
//!              └─ a whole body (no streaming) ─────────┘
//! ```
//!
//! A protocol reports what it finds wrong as a [`Fault`]; the client turns it into a
//! [`BridgeError`] naming the endpoint and the URL. Adding a feature to the wire (tool calls,
//! say) touches each protocol's body, answer and fold once, and this loop not at all.

use std::time::Instant;

use reqwest::header::{HeaderMap, HeaderValue};
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::{KeySource, PartialToolCall, StreamReply, Transport, join_url, partial_call};
use crate::chat::{ChatRequest, ChatResponse, SamplingParams, ToolCall, Usage};
use crate::config::EndpointConfig;
use crate::error::BridgeError;

/// One wire format: how a request is written and an answer read.
pub(crate) trait Protocol: Send + Sync + std::fmt::Debug {
    /// A whole (non-streamed) answer as the server sends it.
    type Answer: DeserializeOwned + Send;
    /// Usage as the server reports it (streams merge it across events).
    type WireUsage: Default + Send;

    /// The path requests are posted to, after `base_url`.
    const PATH: &'static str;
    /// The path of the model list (`GET`), after `base_url`: what
    /// [`LmClient::warm_up`](super::LmClient::warm_up) requests.
    const MODELS_PATH: &'static str;
    /// The environment variable an API key usually comes from, for the hint on a 401.
    const KEY_VAR: &'static str;
    /// What ends a stream properly, for the error when a stream stops before it.
    const STREAM_END: &'static str;

    /// The headers sent with every request (the API key, the API version).
    fn headers(&self, config: &EndpointConfig, key: Option<&str>)
    -> Result<HeaderMap, BridgeError>;

    /// The JSON body of `req` over the endpoint's `defaults`.
    fn body(
        &self,
        req: &ChatRequest,
        defaults: &Defaults,
        stream: bool,
    ) -> Result<Vec<u8>, BridgeError>;

    /// A whole answer, or the error it reports.
    fn read_answer(&self, answer: Self::Answer) -> Result<Draft, Fault>;

    /// Fold the data of one stream event (never empty) into `stream`.
    fn fold_event(
        &self,
        data: &str,
        stream: &mut StreamState<'_, Self::WireUsage>,
    ) -> Result<Flow, Fault>;

    /// Usage in tokens, or `None` when the server reported too little (it is then estimated).
    fn usage(&self, usage: Self::WireUsage) -> Option<Usage>;

    /// A tool call assembled from stream fragments.
    fn tool_call(&self, call: PartialToolCall) -> ToolCall {
        ToolCall {
            id: call.id,
            name: call.name,
            arguments: call.arguments,
        }
    }
}

/// What the endpoint fills in when a request leaves it out.
#[derive(Debug, Clone)]
pub(crate) struct Defaults {
    /// The model sent when a request names none.
    pub(crate) model: String,
    /// Sampling parameters, overridden field by field by each request.
    pub(crate) params: SamplingParams,
}

impl Defaults {
    /// The defaults of `config`.
    pub(crate) fn of(config: &EndpointConfig) -> Self {
        Self {
            model: config.model.clone(),
            params: config.params.clone(),
        }
    }
}

/// An answer as a protocol reads it; the client fills in the rest.
#[derive(Debug, Default)]
pub(crate) struct Draft {
    pub(crate) content: String,
    pub(crate) tool_calls: Vec<ToolCall>,
    pub(crate) finish_reason: Option<String>,
    /// The model the server names, if any.
    pub(crate) model: Option<String>,
    /// `None`: the server reported no usage, so it is estimated from characters.
    pub(crate) usage: Option<Usage>,
}

/// What a protocol finds wrong with an answer.
#[derive(Debug)]
pub(crate) enum Fault {
    /// The answer is not what the protocol promises; the text says what.
    Decode(String),
    /// The server sent an error object with a 2xx status (in a body or a stream event), read
    /// as the HTTP status it stands for.
    Reported {
        /// The status the error stands for.
        status: u16,
        /// The error object.
        error: Value,
    },
}

/// Whether a stream goes on after an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flow {
    /// More events may follow.
    More,
    /// The protocol's end marker arrived.
    End,
}

/// What a stream has said so far. Text goes through [`text`](Self::text), which also hands
/// it to the caller's delta callback as it arrives.
pub(crate) struct StreamState<'a, U> {
    on_delta: &'a mut (dyn for<'s> FnMut(&'s str) + Send),
    content: String,
    calls: Vec<PartialToolCall>,
    /// Why the model stopped, once the stream says so.
    pub(crate) finish_reason: Option<String>,
    /// The model the stream names.
    pub(crate) model: Option<String>,
    /// The usage reported so far.
    pub(crate) usage: Option<U>,
}

impl<'a, U: Default> StreamState<'a, U> {
    fn new(on_delta: &'a mut (dyn for<'s> FnMut(&'s str) + Send)) -> Self {
        Self {
            on_delta,
            content: String::new(),
            calls: Vec::new(),
            finish_reason: None,
            model: None,
            usage: None,
        }
    }

    /// A piece of the answer's text.
    pub(crate) fn text(&mut self, text: &str) {
        if !text.is_empty() {
            (self.on_delta)(text);
            self.content.push_str(text);
        }
    }

    /// The tool call at stream index `key`, created on first sight.
    pub(crate) fn call(&mut self, key: usize) -> &mut PartialToolCall {
        partial_call(&mut self.calls, key)
    }

    /// The usage reported so far, created empty on first use.
    pub(crate) fn usage_mut(&mut self) -> &mut U {
        self.usage.get_or_insert_with(U::default)
    }
}

/// A chat client speaking protocol `P`: one attempt per call.
#[derive(Debug, Clone)]
pub(crate) struct WireClient<P> {
    protocol: P,
    transport: Transport,
    defaults: Defaults,
}

impl<P: Protocol> WireClient<P> {
    /// A client for `config`; the key is read once, here.
    pub(crate) fn new(config: &EndpointConfig, protocol: P) -> Result<Self, BridgeError> {
        let key = KeySource::resolve(config);
        let headers = protocol.headers(config, key.key())?;
        let urls = (
            join_url(&config.base_url, P::PATH),
            join_url(&config.base_url, P::MODELS_PATH),
        );
        Ok(Self {
            transport: Transport::new(config, urls, headers, &key, P::KEY_VAR)?,
            defaults: Defaults::of(config),
            protocol,
        })
    }

    /// `model`'s window as the server's model listing gives it.
    pub(crate) async fn listed_context_window(&self, model: &str) -> Option<u64> {
        self.transport.listed_context_window(model).await
    }

    /// See [`LmClient::warm_up`](super::LmClient::warm_up).
    pub(crate) async fn warm_up(&self, connections: usize) -> usize {
        self.transport.warm_up(connections).await
    }

    /// Send `req` and read the whole answer.
    pub(crate) async fn chat(&self, req: &ChatRequest) -> Result<ChatResponse, BridgeError> {
        let body = self.protocol.body(req, &self.defaults, false)?;
        let start = Instant::now();
        let answer: P::Answer = self.transport.post_json(body).await?;
        let draft = self.read_answer(answer)?;
        Ok(self.respond(req, draft, start))
    }

    /// Send `req` as a stream and fold its events, passing text to `on_delta` as it comes.
    pub(crate) async fn chat_stream(
        &self,
        req: &ChatRequest,
        on_delta: &mut (dyn for<'s> FnMut(&'s str) + Send),
    ) -> Result<ChatResponse, BridgeError> {
        let body = self.protocol.body(req, &self.defaults, true)?;
        let start = Instant::now();
        let events = match self.transport.post_sse(body).await? {
            StreamReply::Events(events) => events,
            StreamReply::Whole { content_type, body } => {
                let answer = self.transport.decode_whole(&content_type, &body)?;
                let draft = self.read_answer(answer)?;
                if !draft.content.is_empty() {
                    on_delta(&draft.content);
                }
                return Ok(self.respond(req, draft, start));
            }
        };
        let mut events = std::pin::pin!(events);
        let mut state = StreamState::new(on_delta);
        let mut ended = false;
        let mut received = 0;
        while let Some(event) = self
            .transport
            .next_event(&mut events, &mut received)
            .await?
        {
            let data = event.data.trim();
            if data.is_empty() {
                continue;
            }
            let flow = self
                .protocol
                .fold_event(data, &mut state)
                .map_err(|fault| self.error(fault))?;
            if flow == Flow::End {
                ended = true;
                break;
            }
        }
        if !ended && state.finish_reason.is_none() {
            return Err(self
                .transport
                .network(format!("the stream ended before {}", P::STREAM_END)));
        }
        // Calls complete in the order the stream numbered them, however it interleaved them.
        state.calls.sort_by_key(|c| c.key);
        let draft = Draft {
            content: state.content,
            tool_calls: state
                .calls
                .into_iter()
                .map(|c| self.protocol.tool_call(c))
                .collect(),
            finish_reason: state.finish_reason,
            model: state.model,
            usage: state.usage.and_then(|u| self.protocol.usage(u)),
        };
        Ok(self.respond(req, draft, start))
    }

    fn read_answer(&self, answer: P::Answer) -> Result<Draft, BridgeError> {
        self.protocol
            .read_answer(answer)
            .map_err(|fault| self.error(fault))
    }

    fn error(&self, fault: Fault) -> BridgeError {
        match fault {
            Fault::Decode(detail) => self.transport.decode(detail),
            Fault::Reported { status, error } => {
                self.transport
                    .status_error(status, &error.to_string(), None)
            }
        }
    }

    /// The answer with what the server left out filled in: the model name (the one
    /// requested, else the endpoint's) and usage estimated from characters.
    fn respond(&self, req: &ChatRequest, draft: Draft, start: Instant) -> ChatResponse {
        let model = draft
            .model
            .filter(|m| !m.is_empty())
            .or_else(|| req.model.clone())
            .unwrap_or_else(|| self.defaults.model.clone());
        let mut answer = ChatResponse {
            content: draft.content,
            tool_calls: draft.tool_calls,
            usage: Usage::default(),
            finish_reason: draft.finish_reason,
            model,
            latency: start.elapsed(),
            attempts: 1,
        };
        answer.usage = draft
            .usage
            .unwrap_or_else(|| Usage::estimate(req.prompt_chars(), answer.response_chars()));
        answer
    }
}

/// An API key as a header value, never printed in debug output.
pub(crate) fn secret_header(
    config: &EndpointConfig,
    value: &str,
) -> Result<HeaderValue, BridgeError> {
    let mut header = HeaderValue::from_str(value).map_err(|_| {
        BridgeError::Config(format!(
            "the API key of endpoint `{}` contains characters not allowed in a header",
            config.name
        ))
    })?;
    header.set_sensitive(true);
    Ok(header)
}
