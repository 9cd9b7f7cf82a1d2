//! Wire formats: parsing OpenAI / Anthropic chat requests into a [`ChatView`] and rendering
//! replies, SSE streams and error bodies in each provider's shape. Private serde structs only.

use std::fmt;

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::prompt::Prompt;
use super::script::ScriptedToolCall;

/// Which API a request came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Provider {
    OpenAi,
    Anthropic,
}

/// The parts of a chat request the mock needs.
#[derive(Debug)]
pub(crate) struct ChatView {
    pub(crate) model: String,
    pub(crate) system: String,
    pub(crate) last_user: String,
    pub(crate) turn: u64,
    pub(crate) stream: bool,
    pub(crate) include_usage: bool,
    pub(crate) prompt_tokens: u64,
}

impl ChatView {
    pub(crate) fn prompt(&self) -> Prompt<'_> {
        Prompt {
            model: &self.model,
            system: &self.system,
            last_user: &self.last_user,
            turn: self.turn,
        }
    }
}

/// The documented token estimate: UTF-8 bytes / 4, rounded up.
pub(crate) fn estimate_tokens(bytes: usize) -> u64 {
    u64::try_from(bytes.div_ceil(4)).unwrap_or(u64::MAX)
}

// ---- requests -------------------------------------------------------------------------------

/// Message content: a string, `null`, or a list of parts whose texts are joined with `\n`
/// (`text` parts, and the content of Anthropic `tool_result` parts).
#[derive(Debug, Default)]
struct Text(String);

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct TextVisitor;
        impl<'de> Visitor<'de> for TextVisitor {
            type Value = Text;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string, null or a list of content parts")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Text, E> {
                Ok(Text(v.to_owned()))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Text, E> {
                Ok(Text(v))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Text, E> {
                Ok(Text::default())
            }
            fn visit_none<E: de::Error>(self) -> Result<Text, E> {
                Ok(Text::default())
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Text, A::Error> {
                let mut out = String::new();
                while let Some(part) = seq.next_element::<Part>()? {
                    let text = part.text.or(part.content.map(|t| t.0));
                    if let Some(text) = text {
                        if !out.is_empty() {
                            out.push('\n');
                        }
                        out.push_str(&text);
                    }
                }
                Ok(Text(out))
            }
        }
        d.deserialize_any(TextVisitor)
    }
}

#[derive(Debug, Deserialize)]
struct Part {
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    content: Option<Text>,
}

#[derive(Debug, Deserialize)]
struct Message {
    role: String,
    #[serde(default)]
    content: Text,
}

#[derive(Debug, Deserialize)]
struct OpenAiRequest {
    model: Option<String>,
    messages: Option<Vec<Message>>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
}

#[derive(Debug, Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

#[derive(Debug, Deserialize)]
struct AnthropicRequest {
    model: Option<String>,
    messages: Option<Vec<Message>>,
    #[serde(default)]
    system: Text,
    max_tokens: Option<u64>,
    #[serde(default)]
    stream: Option<bool>,
}

/// Parses a request body; `Err` is a message for a 400 response.
pub(crate) fn parse_request(provider: Provider, body: &[u8]) -> Result<ChatView, String> {
    let bad_json = |e: serde_json::Error| format!("Request body is not a valid chat request: {e}");
    let (model, messages, mut system, stream, include_usage) = match provider {
        Provider::OpenAi => {
            let r: OpenAiRequest = serde_json::from_slice(body).map_err(bad_json)?;
            let include_usage = r.stream_options.is_some_and(|o| o.include_usage);
            (
                r.model,
                r.messages,
                String::new(),
                r.stream.unwrap_or(false),
                include_usage,
            )
        }
        Provider::Anthropic => {
            let r: AnthropicRequest = serde_json::from_slice(body).map_err(bad_json)?;
            if r.max_tokens.is_none() {
                return Err("`max_tokens`: field required".into());
            }
            (
                r.model,
                r.messages,
                r.system.0,
                r.stream.unwrap_or(false),
                false,
            )
        }
    };
    let model = model.ok_or("`model`: field required")?;
    let messages = messages.ok_or("`messages`: field required")?;
    if messages.is_empty() {
        return Err("`messages`: at least one message is required".into());
    }
    let mut prompt_bytes = system.len();
    let mut turn = 0;
    let mut last_user_idx = None;
    for (i, m) in messages.iter().enumerate() {
        prompt_bytes += m.content.0.len();
        match m.role.as_str() {
            "assistant" => turn += 1,
            "user" => last_user_idx = Some(i),
            "system" | "developer" if provider == Provider::OpenAi => {
                if !system.is_empty() {
                    system.push('\n');
                }
                system.push_str(&m.content.0);
            }
            _ => {}
        }
    }
    let mut messages = messages;
    let last_user = match last_user_idx {
        Some(i) => std::mem::take(&mut messages[i].content.0),
        None => String::new(),
    };
    Ok(ChatView {
        model,
        system,
        last_user,
        turn,
        stream,
        include_usage,
        prompt_tokens: estimate_tokens(prompt_bytes),
    })
}

// ---- replies --------------------------------------------------------------------------------

/// A reply ready to be rendered.
#[derive(Debug)]
pub(crate) struct Answer<'a> {
    pub(crate) id: u64,
    pub(crate) created: u64,
    pub(crate) model: &'a str,
    pub(crate) turn: u64,
    pub(crate) text: &'a str,
    pub(crate) tool_calls: &'a [ScriptedToolCall],
    /// Script override, in either vocabulary (`stop`/`end_turn`, `length`/`max_tokens`, ...).
    pub(crate) finish_reason: Option<&'a str>,
    pub(crate) prompt_tokens: u64,
    pub(crate) completion_tokens: u64,
}

impl Answer<'_> {
    fn openai_finish(&self) -> &str {
        match self.finish_reason {
            Some("end_turn" | "stop_sequence") => "stop",
            Some("max_tokens") => "length",
            Some("tool_use") => "tool_calls",
            Some(other) => other,
            None if self.tool_calls.is_empty() => "stop",
            None => "tool_calls",
        }
    }

    fn anthropic_stop(&self) -> &str {
        match self.finish_reason {
            Some("stop") => "end_turn",
            Some("length") => "max_tokens",
            Some("tool_calls") => "tool_use",
            Some(other) => other,
            None if self.tool_calls.is_empty() => "end_turn",
            None => "tool_use",
        }
    }

    fn openai_tool_calls(&self) -> Vec<OpenAiToolCall<'_>> {
        self.tool_calls
            .iter()
            .enumerate()
            .map(|(i, c)| OpenAiToolCall {
                index: i,
                id: format!("call_{}_{}", self.turn, i),
                kind: "function",
                function: OpenAiFunction {
                    name: &c.name,
                    arguments: &c.arguments_json,
                },
            })
            .collect()
    }
}

/// Tokens a reply costs under the documented estimate.
pub(crate) fn completion_tokens(text: &str, tool_calls: &[ScriptedToolCall]) -> u64 {
    let bytes = text.len()
        + tool_calls
            .iter()
            .map(|c| c.name.len() + c.arguments_json.len())
            .sum::<usize>();
    estimate_tokens(bytes)
}

#[derive(Serialize)]
struct OpenAiCompletion<'a> {
    id: String,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: [OpenAiChoice<'a>; 1],
    usage: OpenAiUsage,
}

#[derive(Serialize)]
struct OpenAiChoice<'a> {
    index: u32,
    message: OpenAiMessage<'a>,
    finish_reason: &'a str,
}

#[derive(Serialize)]
struct OpenAiMessage<'a> {
    role: &'static str,
    content: Option<&'a str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<OpenAiToolCall<'a>>,
}

#[derive(Serialize)]
struct OpenAiToolCall<'a> {
    index: usize,
    id: String,
    #[serde(rename = "type")]
    kind: &'static str,
    function: OpenAiFunction<'a>,
}

#[derive(Serialize)]
struct OpenAiFunction<'a> {
    name: &'a str,
    arguments: &'a str,
}

#[derive(Serialize)]
struct OpenAiUsage {
    prompt_tokens: u64,
    completion_tokens: u64,
    total_tokens: u64,
}

#[derive(Serialize)]
struct OpenAiChunk<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: Vec<OpenAiChunkChoice<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<OpenAiUsage>,
}

#[derive(Serialize)]
struct OpenAiChunkChoice<'a> {
    index: u32,
    delta: OpenAiDelta<'a>,
    finish_reason: Option<&'a str>,
}

#[derive(Serialize, Default)]
struct OpenAiDelta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_calls: Option<Vec<OpenAiToolCall<'a>>>,
}

fn openai_usage(a: &Answer<'_>) -> OpenAiUsage {
    OpenAiUsage {
        prompt_tokens: a.prompt_tokens,
        completion_tokens: a.completion_tokens,
        total_tokens: a.prompt_tokens + a.completion_tokens,
    }
}

/// `POST /v1/chat/completions` without streaming.
pub(crate) fn openai_json(a: &Answer<'_>) -> Vec<u8> {
    let content = if a.text.is_empty() && !a.tool_calls.is_empty() {
        None
    } else {
        Some(a.text)
    };
    let body = OpenAiCompletion {
        id: format!("chatcmpl-mock-{}", a.id),
        object: "chat.completion",
        created: a.created,
        model: a.model,
        choices: [OpenAiChoice {
            index: 0,
            message: OpenAiMessage {
                role: "assistant",
                content,
                tool_calls: a.openai_tool_calls(),
            },
            finish_reason: a.openai_finish(),
        }],
        usage: openai_usage(a),
    };
    to_vec(&body)
}

/// `POST /v1/chat/completions` with `"stream": true`.
pub(crate) fn openai_sse(a: &Answer<'_>, include_usage: bool) -> Vec<u8> {
    let id = format!("chatcmpl-mock-{}", a.id);
    let mut out = Vec::with_capacity(a.text.len() * 2 + 512);
    let chunk = |choices, usage| OpenAiChunk {
        id: &id,
        object: "chat.completion.chunk",
        created: a.created,
        model: a.model,
        choices,
        usage,
    };
    let choice = |delta, finish_reason| {
        vec![OpenAiChunkChoice {
            index: 0,
            delta,
            finish_reason,
        }]
    };
    let first = OpenAiDelta {
        role: Some("assistant"),
        content: Some(""),
        tool_calls: None,
    };
    push_data(&mut out, &chunk(choice(first, None), None));
    for piece in split_text(a.text) {
        let delta = OpenAiDelta {
            content: Some(piece),
            ..OpenAiDelta::default()
        };
        push_data(&mut out, &chunk(choice(delta, None), None));
    }
    if !a.tool_calls.is_empty() {
        let delta = OpenAiDelta {
            tool_calls: Some(a.openai_tool_calls()),
            ..OpenAiDelta::default()
        };
        push_data(&mut out, &chunk(choice(delta, None), None));
    }
    push_data(
        &mut out,
        &chunk(
            choice(OpenAiDelta::default(), Some(a.openai_finish())),
            None,
        ),
    );
    if include_usage {
        push_data(&mut out, &chunk(Vec::new(), Some(openai_usage(a))));
    }
    out.extend_from_slice(b"data: [DONE]\n\n");
    out
}

#[derive(Serialize)]
struct AnthropicMessage<'a> {
    id: String,
    #[serde(rename = "type")]
    kind: &'static str,
    role: &'static str,
    model: &'a str,
    content: Vec<AnthropicBlock<'a>>,
    stop_reason: Option<&'a str>,
    stop_sequence: Option<&'a str>,
    usage: AnthropicUsage,
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum AnthropicBlock<'a> {
    Text {
        text: &'a str,
    },
    ToolUse {
        id: String,
        name: &'a str,
        input: &'a Value,
    },
}

#[derive(Serialize)]
struct AnthropicUsage {
    input_tokens: u64,
    output_tokens: u64,
}

fn anthropic_blocks<'a>(a: &Answer<'a>) -> Vec<AnthropicBlock<'a>> {
    let mut blocks = Vec::with_capacity(1 + a.tool_calls.len());
    if !a.text.is_empty() || a.tool_calls.is_empty() {
        blocks.push(AnthropicBlock::Text { text: a.text });
    }
    for (i, c) in a.tool_calls.iter().enumerate() {
        blocks.push(AnthropicBlock::ToolUse {
            id: format!("toolu_{}_{}", a.turn, i),
            name: &c.name,
            input: &c.arguments,
        });
    }
    blocks
}

/// `POST /v1/messages` without streaming.
pub(crate) fn anthropic_json(a: &Answer<'_>) -> Vec<u8> {
    let body = AnthropicMessage {
        id: format!("msg_mock_{}", a.id),
        kind: "message",
        role: "assistant",
        model: a.model,
        content: anthropic_blocks(a),
        stop_reason: Some(a.anthropic_stop()),
        stop_sequence: None,
        usage: AnthropicUsage {
            input_tokens: a.prompt_tokens,
            output_tokens: a.completion_tokens,
        },
    };
    to_vec(&body)
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum AnthropicEvent<'a> {
    MessageStart {
        message: AnthropicMessage<'a>,
    },
    Ping,
    ContentBlockStart {
        index: usize,
        content_block: AnthropicBlockStart<'a>,
    },
    ContentBlockDelta {
        index: usize,
        delta: AnthropicDelta<'a>,
    },
    ContentBlockStop {
        index: usize,
    },
    MessageDelta {
        delta: AnthropicStop<'a>,
        usage: AnthropicOutputUsage,
    },
    MessageStop,
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum AnthropicBlockStart<'a> {
    Text {
        text: &'static str,
    },
    ToolUse {
        id: String,
        name: &'a str,
        input: Value,
    },
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum AnthropicDelta<'a> {
    TextDelta { text: &'a str },
    InputJsonDelta { partial_json: &'a str },
}

#[derive(Serialize)]
struct AnthropicStop<'a> {
    stop_reason: &'a str,
    stop_sequence: Option<&'a str>,
}

#[derive(Serialize)]
struct AnthropicOutputUsage {
    output_tokens: u64,
}

impl AnthropicEvent<'_> {
    fn name(&self) -> &'static str {
        match self {
            Self::MessageStart { .. } => "message_start",
            Self::Ping => "ping",
            Self::ContentBlockStart { .. } => "content_block_start",
            Self::ContentBlockDelta { .. } => "content_block_delta",
            Self::ContentBlockStop { .. } => "content_block_stop",
            Self::MessageDelta { .. } => "message_delta",
            Self::MessageStop => "message_stop",
        }
    }
}

/// `POST /v1/messages` with `"stream": true`.
pub(crate) fn anthropic_sse(a: &Answer<'_>) -> Vec<u8> {
    let mut out = Vec::with_capacity(a.text.len() * 2 + 1024);
    let mut emit = |event: AnthropicEvent<'_>| {
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(event.name().as_bytes());
        out.push(b'\n');
        push_data(&mut out, &event);
    };
    emit(AnthropicEvent::MessageStart {
        message: AnthropicMessage {
            id: format!("msg_mock_{}", a.id),
            kind: "message",
            role: "assistant",
            model: a.model,
            content: Vec::new(),
            stop_reason: None,
            stop_sequence: None,
            usage: AnthropicUsage {
                input_tokens: a.prompt_tokens,
                output_tokens: 1,
            },
        },
    });
    emit(AnthropicEvent::Ping);
    let mut index = 0;
    if !a.text.is_empty() || a.tool_calls.is_empty() {
        emit(AnthropicEvent::ContentBlockStart {
            index,
            content_block: AnthropicBlockStart::Text { text: "" },
        });
        for piece in split_text(a.text) {
            emit(AnthropicEvent::ContentBlockDelta {
                index,
                delta: AnthropicDelta::TextDelta { text: piece },
            });
        }
        emit(AnthropicEvent::ContentBlockStop { index });
        index += 1;
    }
    for (i, c) in a.tool_calls.iter().enumerate() {
        emit(AnthropicEvent::ContentBlockStart {
            index,
            content_block: AnthropicBlockStart::ToolUse {
                id: format!("toolu_{}_{}", a.turn, i),
                name: &c.name,
                input: Value::Object(Default::default()),
            },
        });
        emit(AnthropicEvent::ContentBlockDelta {
            index,
            delta: AnthropicDelta::InputJsonDelta {
                partial_json: &c.arguments_json,
            },
        });
        emit(AnthropicEvent::ContentBlockStop { index });
        index += 1;
    }
    emit(AnthropicEvent::MessageDelta {
        delta: AnthropicStop {
            stop_reason: a.anthropic_stop(),
            stop_sequence: None,
        },
        usage: AnthropicOutputUsage {
            output_tokens: a.completion_tokens,
        },
    });
    emit(AnthropicEvent::MessageStop);
    out
}

/// Splits a reply into stream deltas (their concatenation is the reply): pieces of at least
/// 16 bytes, at most ~256 pieces, cut at character boundaries.
fn split_text(text: &str) -> impl Iterator<Item = &str> {
    let size = text.len().div_ceil(256).max(16);
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut cut = size.min(rest.len());
        while !rest.is_char_boundary(cut) {
            cut += 1;
        }
        let (piece, tail) = rest.split_at(cut);
        rest = tail;
        Some(piece)
    })
}

fn push_data<T: Serialize>(out: &mut Vec<u8>, value: &T) {
    out.extend_from_slice(b"data: ");
    // Serialising our own plain structs into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, value);
    out.extend_from_slice(b"\n\n");
}

fn to_vec<T: Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).unwrap_or_default()
}

// ---- errors ---------------------------------------------------------------------------------

/// Error categories, rendered in each provider's error shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ErrorKind {
    BadRequest,
    Unauthorized,
    NotFound,
    MethodNotAllowed,
    PayloadTooLarge,
    RateLimited,
    Internal,
    Unavailable,
}

impl ErrorKind {
    pub(crate) fn status(self) -> u16 {
        match self {
            Self::BadRequest => 400,
            Self::Unauthorized => 401,
            Self::NotFound => 404,
            Self::MethodNotAllowed => 405,
            Self::PayloadTooLarge => 413,
            Self::RateLimited => 429,
            Self::Internal => 500,
            Self::Unavailable => 503,
        }
    }

    /// OpenAI's `error.type` and `error.code`.
    fn openai(self) -> (&'static str, &'static str) {
        match self {
            Self::BadRequest => ("invalid_request_error", "invalid_request"),
            Self::Unauthorized => ("invalid_request_error", "invalid_api_key"),
            Self::NotFound => ("invalid_request_error", "not_found"),
            Self::MethodNotAllowed => ("invalid_request_error", "method_not_allowed"),
            Self::PayloadTooLarge => ("invalid_request_error", "request_too_large"),
            Self::RateLimited => ("requests", "rate_limit_exceeded"),
            Self::Internal => ("server_error", "internal_error"),
            Self::Unavailable => ("server_error", "service_unavailable"),
        }
    }

    /// Anthropic's `error.type`.
    fn anthropic(self) -> &'static str {
        match self {
            Self::BadRequest | Self::MethodNotAllowed => "invalid_request_error",
            Self::Unauthorized => "authentication_error",
            Self::NotFound => "not_found_error",
            Self::PayloadTooLarge => "request_too_large",
            Self::RateLimited => "rate_limit_error",
            Self::Internal => "api_error",
            Self::Unavailable => "overloaded_error",
        }
    }
}

#[derive(Serialize)]
struct OpenAiErrorBody<'a> {
    error: OpenAiError<'a>,
}

#[derive(Serialize)]
struct OpenAiError<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    param: Option<&'a str>,
    code: &'static str,
}

#[derive(Serialize)]
struct AnthropicErrorBody<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    error: AnthropicError<'a>,
}

#[derive(Serialize)]
struct AnthropicError<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    message: &'a str,
}

/// An error body in the provider's shape.
pub(crate) fn error_body(provider: Provider, kind: ErrorKind, message: &str) -> Vec<u8> {
    match provider {
        Provider::OpenAi => {
            let (kind, code) = kind.openai();
            to_vec(&OpenAiErrorBody {
                error: OpenAiError {
                    message,
                    kind,
                    param: None,
                    code,
                },
            })
        }
        Provider::Anthropic => to_vec(&AnthropicErrorBody {
            kind: "error",
            error: AnthropicError {
                kind: kind.anthropic(),
                message,
            },
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_text_keeps_every_byte_and_char_boundaries() {
        let text = "héllo wörld ".repeat(300);
        let pieces: Vec<&str> = split_text(&text).collect();
        assert!(pieces.len() <= 257, "{} pieces", pieces.len());
        assert_eq!(pieces.concat(), text);
        assert_eq!(split_text("").count(), 0);
    }

    #[test]
    fn parses_content_parts_and_counts_turns() {
        let body = br#"{"model":"m","messages":[
            {"role":"system","content":"sys"},
            {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
            {"role":"assistant","content":null,"tool_calls":[]},
            {"role":"tool","content":"r","tool_call_id":"x"},
            {"role":"user","content":"last"}]}"#;
        let v = parse_request(Provider::OpenAi, body).expect("valid request");
        assert_eq!(
            (v.system.as_str(), v.last_user.as_str(), v.turn),
            ("sys", "last", 1)
        );
        let v = parse_request(
            Provider::Anthropic,
            br#"{"model":"m","max_tokens":5,"system":[{"type":"text","text":"s"}],
                 "messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"out"}]}]}"#,
        )
        .expect("valid request");
        assert_eq!((v.system.as_str(), v.last_user.as_str()), ("s", "out"));
    }
}
