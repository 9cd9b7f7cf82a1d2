//! Anthropic Messages: `POST {base_url}/v1/messages`, JSON or SSE.
//!
//! System messages become the top-level `system` field; tool calls and tool results become
//! `tool_use` / `tool_result` content blocks; consecutive messages of the same role are merged
//! because the API wants user and assistant turns to alternate (so the results of parallel
//! calls go back as one user message). A call's arguments go out as the `input` object the
//! API requires, whatever the model wrote (see `tool_input`); `tool_choice` and
//! `parallel_tool_calls: false` become one `tool_choice` object.

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::call::{Defaults, Draft, Fault, Flow, Protocol, StreamState, WireClient, secret_header};
use super::{Params, PartialToolCall, null_as_default, to_body};
use crate::chat::{ChatRequest, Message, Role, ToolCall, ToolChoice, Usage};
use crate::config::EndpointConfig;
use crate::error::BridgeError;

/// The API version this client speaks.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// `max_tokens` is mandatory in the Messages API; this is used when none is set.
pub const ANTHROPIC_DEFAULT_MAX_TOKENS: u32 = 4096;

wire_client! {
    /// A client for the Anthropic Messages API.
    AnthropicClient(Anthropic)
}

impl AnthropicClient {
    /// A client for `config` (`base_url` without `/v1`); the key is read once, here.
    pub fn new(config: &EndpointConfig) -> Result<Self, BridgeError> {
        WireClient::new(config, Anthropic).map(Self)
    }
}

/// The Anthropic Messages wire format.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Anthropic;

impl Protocol for Anthropic {
    type Answer = WireResponse;
    type WireUsage = WireUsage;

    const PATH: &'static str = "v1/messages";
    const MODELS_PATH: &'static str = "v1/models";
    const KEY_VAR: &'static str = "ANTHROPIC_API_KEY";
    const STREAM_END: &'static str = "`message_stop`";

    fn headers(
        &self,
        config: &EndpointConfig,
        key: Option<&str>,
    ) -> Result<HeaderMap, BridgeError> {
        let mut headers = HeaderMap::new();
        headers.insert(
            HeaderName::from_static("anthropic-version"),
            HeaderValue::from_static(ANTHROPIC_VERSION),
        );
        if let Some(k) = key {
            headers.insert(
                HeaderName::from_static("x-api-key"),
                secret_header(config, k)?,
            );
        }
        Ok(headers)
    }

    fn body(
        &self,
        req: &ChatRequest,
        defaults: &Defaults,
        stream: bool,
    ) -> Result<Vec<u8>, BridgeError> {
        let params = Params::merge(&req.params, &defaults.params, "stop_sequences");
        let system: Vec<&str> = req
            .messages
            .iter()
            .filter(|m| m.role == Role::System)
            .map(|m| m.content.as_str())
            .collect();
        let body = Body {
            model: req.model.as_deref().unwrap_or(&defaults.model),
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
            tool_choice: (!req.tools.is_empty() && !params.extra.has("tool_choice"))
                .then(|| wire_tool_choice(req.tool_choice.as_ref(), req.parallel_tool_calls))
                .flatten(),
            stream,
            extra: params.extra,
        };
        to_body(&body)
    }

    fn read_answer(&self, response: WireResponse) -> Result<Draft, Fault> {
        if let Some(error) = response.error {
            return Err(error_in_body(error));
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
        Ok(Draft {
            content,
            tool_calls,
            finish_reason: response.stop_reason,
            model: response.model,
            usage: response.usage.and_then(|u| self.usage(u)),
        })
    }

    fn fold_event(
        &self,
        data: &str,
        stream: &mut StreamState<'_, WireUsage>,
    ) -> Result<Flow, Fault> {
        let event: WireEvent = serde_json::from_str(data)
            .map_err(|e| Fault::Decode(format!("invalid stream event ({e}): {data:.200}")))?;
        match event {
            WireEvent::MessageStart { message } => {
                stream.model = message.model;
                stream.usage = message.usage;
            }
            WireEvent::ContentBlockStart {
                index,
                content_block,
            } => match content_block {
                WireBlock::Text { text } => stream.text(&text),
                WireBlock::ToolUse { id, name, input } => {
                    let entry = stream.call(index);
                    entry.id = id;
                    entry.name = name;
                    // The input normally streams as `input_json_delta`; a non-empty
                    // object here is a complete input.
                    if input.as_object().is_some_and(|o| !o.is_empty()) {
                        entry.arguments = input.to_string();
                    }
                }
                WireBlock::Other => {}
            },
            WireEvent::ContentBlockDelta { index, delta } => match delta {
                WireDelta::TextDelta { text } => stream.text(&text),
                WireDelta::InputJsonDelta { partial_json } => {
                    stream.call(index).arguments.push_str(&partial_json);
                }
                WireDelta::Other => {}
            },
            WireEvent::MessageDelta { delta, usage } => {
                if delta.stop_reason.is_some() {
                    stream.finish_reason = delta.stop_reason;
                }
                if let Some(d) = usage {
                    let u = stream.usage_mut();
                    u.output_tokens = d.output_tokens.or(u.output_tokens);
                    if d.input_tokens.is_some() {
                        u.input_tokens = d.input_tokens;
                    }
                }
            }
            WireEvent::MessageStop => return Ok(Flow::End),
            WireEvent::Error { error } => return Err(error_in_body(error)),
            WireEvent::Other => {}
        }
        Ok(Flow::More)
    }

    fn usage(&self, usage: WireUsage) -> Option<Usage> {
        Some(Usage {
            prompt_tokens: usage
                .input_tokens
                .unwrap_or(0)
                .saturating_add(usage.cache_creation_input_tokens.unwrap_or(0))
                .saturating_add(usage.cache_read_input_tokens.unwrap_or(0)),
            completion_tokens: usage.output_tokens.unwrap_or(0),
            estimated: false,
        })
    }

    /// Anthropic sends a tool's input as an object: an input never streamed is `{}`.
    fn tool_call(&self, call: PartialToolCall) -> ToolCall {
        ToolCall {
            id: call.id,
            name: call.name,
            arguments: if call.arguments.is_empty() {
                "{}".to_owned()
            } else {
                call.arguments
            },
        }
    }
}

/// An `error` object sent with status 200 (a stream's `error` event, or a whole
/// `{"type": "error"}` body), with the HTTP status its `type` stands for.
fn error_in_body(error: Value) -> Fault {
    let status = match error.get("type").and_then(Value::as_str) {
        Some("overloaded_error") => 529,
        Some("rate_limit_error") => 429,
        Some("api_error") => 500,
        Some("authentication_error") => 401,
        Some("permission_error") => 403,
        Some("not_found_error") => 404,
        _ => 400,
    };
    Fault::Reported { status, error }
}

/// The `input` object of a `tool_use` block. The API takes only an object, but a model on
/// another provider may have written anything: an empty text is `{}`, and text that is not
/// a JSON object is kept verbatim under `_raw_arguments` so the model still sees it.
fn tool_input(arguments: &str) -> Value {
    if arguments.trim().is_empty() {
        return Value::Object(serde_json::Map::new());
    }
    match serde_json::from_str::<Value>(arguments) {
        Ok(object @ Value::Object(_)) => object,
        _ => serde_json::json!({ RAW_ARGUMENTS_KEY: arguments }),
    }
}

/// The key under which [`tool_input`] keeps arguments that are not a JSON object.
const RAW_ARGUMENTS_KEY: &str = "_raw_arguments";

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
                    let input = tool_input(&call.arguments);
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
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<WireToolChoice<'a>>,
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

/// `{"type": "auto" | "any" | "tool" | "none", "name"?, "disable_parallel_tool_use"?}`.
#[derive(Debug, Serialize)]
struct WireToolChoice<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    disable_parallel_tool_use: bool,
}

/// The tool choice to send, if any: parallel calls are switched off through the choice
/// object (an `auto` one when no choice is given); `none` takes no such flag.
fn wire_tool_choice(
    choice: Option<&ToolChoice>,
    parallel: Option<bool>,
) -> Option<WireToolChoice<'_>> {
    let disable_parallel_tool_use = parallel == Some(false);
    let (kind, name) = match choice {
        None if !disable_parallel_tool_use => return None,
        None | Some(ToolChoice::Auto) => ("auto", None),
        Some(ToolChoice::Required) => ("any", None),
        Some(ToolChoice::Tool(name)) => ("tool", Some(name.as_str())),
        Some(ToolChoice::None) => {
            return Some(WireToolChoice {
                kind: "none",
                name: None,
                disable_parallel_tool_use: false,
            });
        }
    };
    Some(WireToolChoice {
        kind,
        name,
        disable_parallel_tool_use,
    })
}

#[derive(Serialize)]
struct WireTool<'a> {
    name: &'a str,
    description: &'a str,
    input_schema: &'a Value,
}

#[derive(Deserialize)]
pub(crate) struct WireResponse {
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
pub(crate) struct WireUsage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
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
        let body: Value = serde_json::from_slice(
            &Anthropic
                .body(&req, &Defaults::of(&config), false)
                .expect("encodable"),
        )
        .expect("json");
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
    fn tool_input_is_always_an_object() {
        assert_eq!(tool_input(r#"{"a": 1}"#), json!({"a": 1}));
        assert_eq!(tool_input("  "), json!({}));
        assert_eq!(
            tool_input("not json"),
            json!({"_raw_arguments": "not json"})
        );
        assert_eq!(tool_input("[1, 2]"), json!({"_raw_arguments": "[1, 2]"}));
    }

    fn tool_choice_json(choice: Option<ToolChoice>, parallel: Option<bool>) -> Value {
        serde_json::to_value(wire_tool_choice(choice.as_ref(), parallel)).expect("json")
    }

    #[test]
    fn tool_choice_maps_to_anthropic_objects() {
        assert_eq!(tool_choice_json(None, None), Value::Null);
        assert_eq!(tool_choice_json(None, Some(true)), Value::Null);
        assert_eq!(
            tool_choice_json(None, Some(false)),
            json!({"type": "auto", "disable_parallel_tool_use": true})
        );
        assert_eq!(
            tool_choice_json(Some(ToolChoice::Auto), None),
            json!({"type": "auto"})
        );
        assert_eq!(
            tool_choice_json(Some(ToolChoice::Required), Some(false)),
            json!({"type": "any", "disable_parallel_tool_use": true})
        );
        assert_eq!(
            tool_choice_json(Some(ToolChoice::Tool("python".into())), None),
            json!({"type": "tool", "name": "python"})
        );
        assert_eq!(
            tool_choice_json(Some(ToolChoice::None), Some(false)),
            json!({"type": "none"})
        );
    }
}
