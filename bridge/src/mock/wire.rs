//! Wire formats: rendering replies, SSE streams and error bodies in each provider's shape
//! (requests are read in `request.rs`). Private serde structs only.

use serde::Serialize;
use serde_json::Value;

use super::script::ScriptedToolCall;

/// Which API a request came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Provider {
    OpenAi,
    Anthropic,
}

/// The documented token estimate: UTF-8 bytes / 4, rounded up.
pub(crate) fn estimate_tokens(bytes: usize) -> u64 {
    u64::try_from(bytes.div_ceil(4)).unwrap_or(u64::MAX)
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

    /// The id of call `i` of this reply: `call_{TURN}_{i}` / `toolu_{TURN}_{i}`.
    fn call_id(&self, provider: Provider, i: usize) -> String {
        match provider {
            Provider::OpenAi => format!("call_{}_{}", self.turn, i),
            Provider::Anthropic => format!("toolu_{}_{}", self.turn, i),
        }
    }

    fn openai_tool_calls(&self) -> Vec<OpenAiToolCall<'_>> {
        self.tool_calls
            .iter()
            .enumerate()
            .map(|(i, c)| OpenAiToolCall {
                index: i,
                id: self.call_id(Provider::OpenAi, i),
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
    tool_calls: Option<[OpenAiDeltaCall<'a>; 1]>,
}

/// A tool call's piece of a stream: the first names it, the rest add to its arguments.
#[derive(Serialize)]
struct OpenAiDeltaCall<'a> {
    index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<String>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    kind: Option<&'static str>,
    function: OpenAiDeltaFunction<'a>,
}

#[derive(Serialize)]
struct OpenAiDeltaFunction<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    arguments: &'a str,
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
    for (index, call) in a.tool_calls.iter().enumerate() {
        let delta = OpenAiDelta {
            tool_calls: Some([OpenAiDeltaCall {
                index,
                id: Some(a.call_id(Provider::OpenAi, index)),
                kind: Some("function"),
                function: OpenAiDeltaFunction {
                    name: Some(&call.name),
                    arguments: "",
                },
            }]),
            ..OpenAiDelta::default()
        };
        push_data(&mut out, &chunk(choice(delta, None), None));
    }
    for (index, piece) in interleaved_arguments(a.tool_calls) {
        let delta = OpenAiDelta {
            tool_calls: Some([OpenAiDeltaCall {
                index,
                id: None,
                kind: None,
                function: OpenAiDeltaFunction {
                    name: None,
                    arguments: piece,
                },
            }]),
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
            id: a.call_id(Provider::Anthropic, i),
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
    let text_block = !a.text.is_empty() || a.tool_calls.is_empty();
    if text_block {
        emit(AnthropicEvent::ContentBlockStart {
            index: 0,
            content_block: AnthropicBlockStart::Text { text: "" },
        });
        for piece in split_text(a.text) {
            emit(AnthropicEvent::ContentBlockDelta {
                index: 0,
                delta: AnthropicDelta::TextDelta { text: piece },
            });
        }
        emit(AnthropicEvent::ContentBlockStop { index: 0 });
    }
    // Every tool block opens before any input streams, and the inputs arrive interleaved,
    // so a client must key the pieces by block index.
    let first_tool = usize::from(text_block);
    for (i, c) in a.tool_calls.iter().enumerate() {
        emit(AnthropicEvent::ContentBlockStart {
            index: first_tool + i,
            content_block: AnthropicBlockStart::ToolUse {
                id: a.call_id(Provider::Anthropic, i),
                name: &c.name,
                input: Value::Object(Default::default()),
            },
        });
    }
    for (i, piece) in interleaved_arguments(a.tool_calls) {
        emit(AnthropicEvent::ContentBlockDelta {
            index: first_tool + i,
            delta: AnthropicDelta::InputJsonDelta {
                partial_json: piece,
            },
        });
    }
    for i in 0..a.tool_calls.len() {
        emit(AnthropicEvent::ContentBlockStop {
            index: first_tool + i,
        });
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
    split_pieces(text, text.len().div_ceil(256).max(16))
}

/// The argument JSON of every call cut in up to four pieces, dealt round-robin: call 0's
/// first piece, call 1's first piece, …, call 0's second piece, … (as `(call, piece)`).
fn interleaved_arguments(calls: &[ScriptedToolCall]) -> Vec<(usize, &str)> {
    let mut pieces: Vec<_> = calls
        .iter()
        .map(|c| split_pieces(&c.arguments_json, c.arguments_json.len().div_ceil(4).max(1)))
        .collect();
    let mut out = Vec::new();
    loop {
        let before = out.len();
        for (i, split) in pieces.iter_mut().enumerate() {
            if let Some(piece) = split.next() {
                out.push((i, piece));
            }
        }
        if out.len() == before {
            return out;
        }
    }
}

/// `text` in pieces of about `size` bytes, cut at character boundaries.
fn split_pieces(text: &str, size: usize) -> impl Iterator<Item = &str> {
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
    fn arguments_are_dealt_round_robin_in_pieces() {
        let call = |json: &str| ScriptedToolCall {
            name: "f".into(),
            arguments_json: json.into(),
            arguments: Value::Null,
        };
        let calls = [call(r#"{"a":"xxxxxxxx"}"#), call("{}")];
        let pieces = interleaved_arguments(&calls);
        assert_eq!(pieces[0].0, 0);
        assert_eq!(pieces[1].0, 1);
        assert_eq!(pieces[2].0, 0);
        let first: String = pieces.iter().filter(|p| p.0 == 0).map(|p| p.1).collect();
        assert_eq!(first, calls[0].arguments_json);
        assert_eq!(pieces.iter().filter(|p| p.0 == 0).count(), 4);
    }
}
