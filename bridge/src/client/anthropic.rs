//! Anthropic Messages: `POST {base_url}/v1/messages`, JSON or SSE.
//!
//! System messages become the top-level `system` field; tool calls and tool results become
//! `tool_use` / `tool_result` content blocks; consecutive messages of the same role are merged
//! because the API wants user and assistant turns to alternate.

use std::time::Instant;

use async_trait::async_trait;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{
    KeySource, LmClient, Params, PartialToolCall, StreamReply, Transport, join_url,
    null_as_default, partial_call, to_body,
};
use crate::chat::{ChatRequest, ChatResponse, Message, Role, SamplingParams, ToolCall, Usage};
use crate::config::EndpointConfig;
use crate::error::BridgeError;

/// The API version this client speaks.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// `max_tokens` is mandatory in the Messages API; this is used when none is set.
pub const ANTHROPIC_DEFAULT_MAX_TOKENS: u32 = 4096;

/// A client for the Anthropic Messages API.
#[derive(Debug, Clone)]
pub struct AnthropicClient {
    transport: Transport,
    model: String,
    defaults: SamplingParams,
}

impl AnthropicClient {
    /// A client for `config` (`base_url` without `/v1`); the key is read once, here.
    pub fn new(config: &EndpointConfig) -> Result<Self, BridgeError> {
        let key = KeySource::resolve(config);
        let mut headers = HeaderMap::new();
        headers.insert(
            HeaderName::from_static("anthropic-version"),
            HeaderValue::from_static(ANTHROPIC_VERSION),
        );
        if let Some(k) = key.key() {
            let mut value = HeaderValue::from_str(k).map_err(|_| {
                BridgeError::Config(format!(
                    "the API key of endpoint `{}` contains characters not allowed in a header",
                    config.name
                ))
            })?;
            value.set_sensitive(true);
            headers.insert(HeaderName::from_static("x-api-key"), value);
        }
        let url = join_url(&config.base_url, "v1/messages");
        Ok(Self {
            transport: Transport::new(config, url, headers, &key, "ANTHROPIC_API_KEY")?,
            model: config.model.clone(),
            defaults: config.params.clone(),
        })
    }

    fn body(&self, req: &ChatRequest, stream: bool) -> Result<Vec<u8>, BridgeError> {
        let params = Params::merge(&req.params, &self.defaults, "stop_sequences");
        let system: Vec<&str> = req
            .messages
            .iter()
            .filter(|m| m.role == Role::System)
            .map(|m| m.content.as_str())
            .collect();
        let body = Body {
            model: req.model.as_deref().unwrap_or(&self.model),
            max_tokens: (!params.extra.has("max_tokens"))
                .then(|| params.max_tokens.unwrap_or(ANTHROPIC_DEFAULT_MAX_TOKENS)),
            system: (!system.is_empty()).then(|| system.join("\n\n")),
            messages: wire_messages(&req.messages)?,
            temperature: params.temperature,
            top_p: params.top_p,
            stop_sequences: params.stop,
            tools: req
                .tools
                .iter()
                .map(|t| WireTool {
                    name: &t.name,
                    description: &t.description,
                    input_schema: &t.parameters,
                })
                .collect(),
            stream,
            extra: params.extra,
        };
        to_body(&body)
    }

    fn model_or_default(&self, req: &ChatRequest, reported: Option<String>) -> String {
        super::response_model(reported, req, &self.model)
    }

    /// A whole (non-streamed) response as an answer, or as the error it carries.
    fn answer(
        &self,
        req: &ChatRequest,
        response: WireResponse,
        start: Instant,
    ) -> Result<ChatResponse, BridgeError> {
        if let Some(error) = response.error {
            return Err(self.error_in_body(&error));
        }
        let mut content = String::new();
        let mut tool_calls = Vec::new();
        for block in response.content {
            match block {
                WireBlock::Text { text } => content.push_str(&text),
                WireBlock::ToolUse { id, name, input } => tool_calls.push(ToolCall {
                    id,
                    name,
                    arguments: input.to_string(),
                }),
                WireBlock::Other => {}
            }
        }
        let mut answer = ChatResponse {
            content,
            tool_calls,
            usage: Usage::default(),
            finish_reason: response.stop_reason,
            model: self.model_or_default(req, response.model),
            latency: start.elapsed(),
            attempts: 1,
        };
        answer.usage = match response.usage {
            Some(u) => u.into_usage(),
            None => Usage::estimate(req.prompt_chars(), answer.response_chars()),
        };
        Ok(answer)
    }

    /// An `error` object sent with status 200 (a stream's `error` event, or a whole
    /// `{"type": "error"}` body), with the HTTP status its `type` stands for.
    fn error_in_body(&self, error: &Value) -> BridgeError {
        let status = match error.get("type").and_then(Value::as_str) {
            Some("overloaded_error") => 529,
            Some("rate_limit_error") => 429,
            Some("api_error") => 500,
            Some("authentication_error") => 401,
            Some("permission_error") => 403,
            Some("not_found_error") => 404,
            _ => 400,
        };
        self.transport
            .status_error(status, &error.to_string(), None)
    }
}

#[async_trait]
impl LmClient for AnthropicClient {
    async fn chat(&self, req: &ChatRequest) -> Result<ChatResponse, BridgeError> {
        let body = self.body(req, false)?;
        let start = Instant::now();
        let response: WireResponse = self.transport.post_json(body).await?;
        self.answer(req, response, start)
    }

    async fn chat_stream(
        &self,
        req: &ChatRequest,
        on_delta: &mut (dyn for<'s> FnMut(&'s str) + Send),
    ) -> Result<ChatResponse, BridgeError> {
        let body = self.body(req, true)?;
        let start = Instant::now();
        let events = match self.transport.post_sse(body).await? {
            StreamReply::Events(events) => events,
            StreamReply::Whole { content_type, body } => {
                let response = self.transport.decode_whole(&content_type, &body)?;
                let answer = self.answer(req, response, start)?;
                if !answer.content.is_empty() {
                    on_delta(&answer.content);
                }
                return Ok(answer);
            }
        };
        let mut events = std::pin::pin!(events);
        let mut content = String::new();
        let mut calls: Vec<PartialToolCall> = Vec::new();
        let mut finish_reason = None;
        let mut model = None;
        let mut usage: Option<WireUsage> = None;
        let mut stopped = false;
        let mut received = 0;
        while let Some(event) = self
            .transport
            .next_event(&mut events, &mut received)
            .await?
        {
            if event.data.trim().is_empty() {
                continue;
            }
            let parsed: WireEvent = serde_json::from_str(&event.data).map_err(|e| {
                self.transport
                    .decode(format!("invalid stream event ({e}): {:.200}", event.data))
            })?;
            match parsed {
                WireEvent::MessageStart { message } => {
                    model = message.model;
                    usage = message.usage;
                }
                WireEvent::ContentBlockStart {
                    index,
                    content_block,
                } => match content_block {
                    WireBlock::Text { text } if !text.is_empty() => {
                        on_delta(&text);
                        content.push_str(&text);
                    }
                    WireBlock::ToolUse { id, name, input } => {
                        let entry = partial_call(&mut calls, index);
                        entry.id = id;
                        entry.name = name;
                        // The input normally streams as `input_json_delta`; a non-empty
                        // object here is a complete input.
                        if input.as_object().is_some_and(|o| !o.is_empty()) {
                            entry.arguments = input.to_string();
                        }
                    }
                    _ => {}
                },
                WireEvent::ContentBlockDelta { index, delta } => match delta {
                    WireDelta::TextDelta { text } => {
                        on_delta(&text);
                        content.push_str(&text);
                    }
                    WireDelta::InputJsonDelta { partial_json } => {
                        partial_call(&mut calls, index)
                            .arguments
                            .push_str(&partial_json);
                    }
                    WireDelta::Other => {}
                },
                WireEvent::MessageDelta {
                    delta,
                    usage: delta_usage,
                } => {
                    if delta.stop_reason.is_some() {
                        finish_reason = delta.stop_reason;
                    }
                    if let Some(d) = delta_usage {
                        let u = usage.get_or_insert_with(WireUsage::default);
                        u.output_tokens = d.output_tokens.or(u.output_tokens);
                        if d.input_tokens.is_some() {
                            u.input_tokens = d.input_tokens;
                        }
                    }
                }
                WireEvent::MessageStop => {
                    stopped = true;
                    break;
                }
                WireEvent::Error { error } => return Err(self.error_in_body(&error)),
                WireEvent::Other => {}
            }
        }
        if !stopped && finish_reason.is_none() {
            return Err(self
                .transport
                .network("the stream ended before `message_stop`"));
        }
        let mut answer = ChatResponse {
            content,
            tool_calls: calls
                .into_iter()
                .map(|c| ToolCall {
                    id: c.id,
                    name: c.name,
                    arguments: if c.arguments.is_empty() {
                        "{}".to_owned()
                    } else {
                        c.arguments
                    },
                })
                .collect(),
            usage: Usage::default(),
            finish_reason,
            model: self.model_or_default(req, model),
            latency: start.elapsed(),
            attempts: 1,
        };
        answer.usage = match usage {
            Some(u) => u.into_usage(),
            None => Usage::estimate(req.prompt_chars(), answer.response_chars()),
        };
        Ok(answer)
    }
}

/// Turn the conversation (minus system messages) into alternating user/assistant turns.
fn wire_messages(messages: &[Message]) -> Result<Vec<WireMessage<'_>>, BridgeError> {
    let mut out: Vec<WireMessage<'_>> = Vec::with_capacity(messages.len());
    for m in messages {
        let (role, blocks) = match m.role {
            Role::System => continue,
            Role::User => ("user", vec![OutBlock::Text { text: &m.content }]),
            Role::Tool => {
                let id = m.tool_call_id.as_deref().ok_or_else(|| {
                    BridgeError::InvalidRequest(
                        "a `tool` message needs `tool_call_id` for the Anthropic API".into(),
                    )
                })?;
                (
                    "user",
                    vec![OutBlock::ToolResult {
                        tool_use_id: id,
                        content: &m.content,
                    }],
                )
            }
            Role::Assistant => {
                let mut blocks = Vec::with_capacity(1 + m.tool_calls.len());
                if !m.content.is_empty() || m.tool_calls.is_empty() {
                    blocks.push(OutBlock::Text { text: &m.content });
                }
                for call in &m.tool_calls {
                    let input: Value = if call.arguments.trim().is_empty() {
                        Value::Object(serde_json::Map::new())
                    } else {
                        serde_json::from_str(&call.arguments).map_err(|e| {
                            BridgeError::InvalidRequest(format!(
                                "the arguments of tool call `{}` are not valid JSON ({e}); \
                                 the Anthropic API needs an object",
                                call.id
                            ))
                        })?
                    };
                    blocks.push(OutBlock::ToolUse {
                        id: &call.id,
                        name: &call.name,
                        input,
                    });
                }
                ("assistant", blocks)
            }
        };
        match out.last_mut() {
            Some(last) if last.role == role => last.content.0.extend(blocks),
            _ => out.push(WireMessage {
                role,
                content: Content(blocks),
            }),
        }
    }
    Ok(out)
}

#[derive(Serialize)]
struct Body<'a> {
    model: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    system: Option<String>,
    messages: Vec<WireMessage<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f32>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    stop_sequences: &'a [String],
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<WireTool<'a>>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    stream: bool,
    #[serde(flatten)]
    extra: super::Extra<'a>,
}

#[derive(Serialize)]
struct WireMessage<'a> {
    role: &'static str,
    content: Content<'a>,
}

/// A single text block goes out as a plain string (accepted everywhere), anything else as
/// an array of blocks.
struct Content<'a>(Vec<OutBlock<'a>>);

impl Serialize for Content<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0.as_slice() {
            [OutBlock::Text { text }] => s.serialize_str(text),
            blocks => s.collect_seq(blocks),
        }
    }
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum OutBlock<'a> {
    Text {
        text: &'a str,
    },
    ToolUse {
        id: &'a str,
        name: &'a str,
        input: Value,
    },
    ToolResult {
        tool_use_id: &'a str,
        content: &'a str,
    },
}

#[derive(Serialize)]
struct WireTool<'a> {
    name: &'a str,
    description: &'a str,
    input_schema: &'a Value,
}

#[derive(Deserialize)]
struct WireResponse {
    #[serde(default)]
    model: Option<String>,
    #[serde(default, deserialize_with = "null_as_default")]
    content: Vec<WireBlock>,
    #[serde(default)]
    stop_reason: Option<String>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WireBlock {
    Text {
        #[serde(default)]
        text: String,
    },
    ToolUse {
        #[serde(default)]
        id: String,
        #[serde(default)]
        name: String,
        #[serde(default)]
        input: Value,
    },
    #[serde(other)]
    Other,
}

#[derive(Deserialize, Default)]
struct WireUsage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
}

impl WireUsage {
    fn into_usage(self) -> Usage {
        Usage {
            prompt_tokens: self
                .input_tokens
                .unwrap_or(0)
                .saturating_add(self.cache_creation_input_tokens.unwrap_or(0))
                .saturating_add(self.cache_read_input_tokens.unwrap_or(0)),
            completion_tokens: self.output_tokens.unwrap_or(0),
            estimated: false,
        }
    }
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WireEvent {
    MessageStart {
        message: WireStartMessage,
    },
    ContentBlockStart {
        #[serde(default)]
        index: usize,
        content_block: WireBlock,
    },
    ContentBlockDelta {
        #[serde(default)]
        index: usize,
        delta: WireDelta,
    },
    MessageDelta {
        #[serde(default)]
        delta: WireMessageDelta,
        #[serde(default)]
        usage: Option<WireUsage>,
    },
    MessageStop,
    Error {
        error: Value,
    },
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
struct WireStartMessage {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    usage: Option<WireUsage>,
}

#[derive(Deserialize, Default)]
struct WireMessageDelta {
    #[serde(default)]
    stop_reason: Option<String>,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WireDelta {
    TextDelta {
        #[serde(default)]
        text: String,
    },
    InputJsonDelta {
        #[serde(default)]
        partial_json: String,
    },
    #[serde(other)]
    Other,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn body_has_system_field_blocks_and_default_max_tokens() {
        let config = EndpointConfig::anthropic("root", "http://127.0.0.1:1", "claude");
        let client = AnthropicClient::new(&config).expect("valid config");
        let mut assistant = Message::assistant("let me run it");
        assistant.tool_calls.push(ToolCall {
            id: "t1".into(),
            name: "python".into(),
            arguments: r#"{"code":"1+1"}"#.into(),
        });
        let mut req = ChatRequest {
            messages: vec![
                Message::system("be terse"),
                Message::user("compute"),
                assistant,
                Message::tool_result("t1", "2"),
                Message::user("and now?"),
            ],
            ..ChatRequest::default()
        };
        req.params.stop = vec!["END".into()];
        let body: Value =
            serde_json::from_slice(&client.body(&req, false).expect("encodable")).expect("json");
        assert_eq!(
            body,
            json!({
                "model": "claude",
                "max_tokens": 4096,
                "system": "be terse",
                "messages": [
                    {"role": "user", "content": "compute"},
                    {"role": "assistant", "content": [
                        {"type": "text", "text": "let me run it"},
                        {"type": "tool_use", "id": "t1", "name": "python", "input": {"code": "1+1"}},
                    ]},
                    {"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": "t1", "content": "2"},
                        {"type": "text", "text": "and now?"},
                    ]},
                ],
                "stop_sequences": ["END"],
            })
        );
    }

    #[test]
    fn invalid_tool_arguments_are_a_clear_error() {
        let mut assistant = Message::assistant("");
        assistant.tool_calls.push(ToolCall {
            id: "t1".into(),
            name: "python".into(),
            arguments: "not json".into(),
        });
        let err = wire_messages(&[assistant]).err().expect("rejected");
        assert!(err.to_string().contains("`t1`"), "{err}");
    }
}
