//! OpenAI chat completions: `POST {base_url}/chat/completions`, JSON or SSE.

use reqwest::header::{AUTHORIZATION, HeaderMap};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::call::{Defaults, Draft, Fault, Flow, Protocol, StreamState, WireClient, secret_header};
use super::{Params, null_as_default, to_body};
use crate::chat::{ChatRequest, Message, ToolCall, ToolChoice, Usage};
use crate::config::EndpointConfig;
use crate::error::BridgeError;

wire_client! {
    /// A client for OpenAI-compatible chat-completions servers.
    OpenAiClient(OpenAi)
}

impl OpenAiClient {
    /// A client for `config` (`base_url` includes `/v1`); the key is read once, here.
    pub fn new(config: &EndpointConfig) -> Result<Self, BridgeError> {
        WireClient::new(config, OpenAi).map(Self)
    }
}

/// The OpenAI chat-completions wire format.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OpenAi;

impl Protocol for OpenAi {
    type Answer = WireResponse;
    type WireUsage = WireUsage;

    const PATH: &'static str = "chat/completions";
    const MODELS_PATH: &'static str = "models";
    const KEY_VAR: &'static str = "OPENAI_API_KEY";
    const STREAM_END: &'static str = "`[DONE]`";

    fn headers(
        &self,
        config: &EndpointConfig,
        key: Option<&str>,
    ) -> Result<HeaderMap, BridgeError> {
        let mut headers = HeaderMap::new();
        if let Some(k) = key {
            headers.insert(
                AUTHORIZATION,
                secret_header(config, &format!("Bearer {k}"))?,
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
        let params = Params::merge(&req.params, &defaults.params, "stop");
        let body = Body {
            model: req.model.as_deref().unwrap_or(&defaults.model),
            messages: Messages(&req.messages),
            temperature: params.temperature,
            top_p: params.top_p,
            max_tokens: params.max_tokens,
            stop: params.stop,
            seed: params.seed,
            tools: req
                .tools
                .iter()
                .map(|t| WireTool {
                    kind: "function",
                    function: WireFunctionDef {
                        name: &t.name,
                        description: &t.description,
                        parameters: &t.parameters,
                    },
                })
                .collect(),
            // With tools, an unset choice goes out as `auto`, OpenAI's default: llama.cpp's
            // Python server (`chatml-function-calling`) offers the model no tools without it.
            tool_choice: (!req.tools.is_empty() && !params.extra.has("tool_choice"))
                .then(|| WireToolChoice(req.tool_choice.as_ref().unwrap_or(&ToolChoice::Auto))),
            parallel_tool_calls: req
                .parallel_tool_calls
                .filter(|_| !req.tools.is_empty() && !params.extra.has("parallel_tool_calls")),
            stream,
            stream_options: (stream && !params.extra.has("stream_options")).then_some(
                StreamOptions {
                    include_usage: true,
                },
            ),
            extra: params.extra,
        };
        to_body(&body)
    }

    fn read_answer(&self, response: WireResponse) -> Result<Draft, Fault> {
        if let Some(error) = response.error {
            return Err(error_in_body(error));
        }
        let choice = response
            .choices
            .into_iter()
            .next()
            .ok_or_else(|| Fault::Decode("the answer has no `choices`".into()))?;
        let tool_calls = choice
            .message
            .tool_calls
            .unwrap_or_default()
            .into_iter()
            .map(|c| ToolCall {
                id: c.id,
                name: c.function.name,
                arguments: arguments_text(c.function.arguments),
            })
            .collect();
        Ok(Draft {
            content: choice.message.content.unwrap_or_default(),
            tool_calls,
            finish_reason: choice.finish_reason,
            model: response.model,
            usage: response.usage.and_then(|u| self.usage(u)),
        })
    }

    fn fold_event(
        &self,
        data: &str,
        stream: &mut StreamState<'_, WireUsage>,
    ) -> Result<Flow, Fault> {
        if data == "[DONE]" {
            return Ok(Flow::End);
        }
        let chunk: WireChunk = serde_json::from_str(data)
            .map_err(|e| Fault::Decode(format!("invalid stream chunk ({e}): {data:.200}")))?;
        if let Some(error) = chunk.error {
            return Err(error_in_body(error));
        }
        if chunk.model.is_some() {
            stream.model = chunk.model;
        }
        if chunk.usage.is_some() {
            stream.usage = chunk.usage;
        }
        for choice in chunk.choices {
            if let Some(text) = &choice.delta.content {
                stream.text(text);
            }
            let calls = choice.delta.tool_calls.unwrap_or_default();
            for (pos, call) in calls.into_iter().enumerate() {
                let entry = stream.call(call.index.unwrap_or(pos));
                if let Some(id) = call.id {
                    entry.id = id;
                }
                if let Some(f) = call.function {
                    // OpenAI sends the name whole, once; llama.cpp's Python server repeats
                    // it (and the id) in every piece, which must not double it.
                    if let Some(name) = f.name
                        && name != entry.name
                    {
                        entry.name.push_str(&name);
                    }
                    if let Some(args) = f.arguments {
                        entry.arguments.push_str(&args);
                    }
                }
            }
            if choice.finish_reason.is_some() {
                stream.finish_reason = choice.finish_reason;
            }
        }
        Ok(Flow::More)
    }

    fn usage(&self, usage: WireUsage) -> Option<Usage> {
        let prompt_tokens = usage.prompt_tokens?;
        Some(Usage {
            prompt_tokens,
            completion_tokens: usage.completion_tokens.unwrap_or(0),
            estimated: false,
        })
    }
}

/// An `error` object sent with status 200 (in a stream chunk or a whole body, as
/// OpenRouter and some proxies do): its `code` if it is an HTTP error status, else 500.
fn error_in_body(error: Value) -> Fault {
    let status = error
        .get("code")
        .and_then(Value::as_u64)
        .and_then(|c| u16::try_from(c).ok())
        .filter(|c| (400..600).contains(c))
        .unwrap_or(500);
    Fault::Reported { status, error }
}

/// Arguments arrive as JSON text per the spec; some servers send an object instead.
fn arguments_text(arguments: Value) -> String {
    match arguments {
        Value::String(s) => s,
        Value::Null => "{}".to_owned(),
        other => other.to_string(),
    }
}

#[derive(Serialize)]
struct Body<'a> {
    model: &'a str,
    messages: Messages<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    stop: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    seed: Option<u64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<WireTool<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<WireToolChoice<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    parallel_tool_calls: Option<bool>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream_options: Option<StreamOptions>,
    #[serde(flatten)]
    extra: super::Extra<'a>,
}

/// `"auto"`, `"none"`, `"required"` or `{"type": "function", "function": {"name": …}}`.
struct WireToolChoice<'a>(&'a ToolChoice);

impl Serialize for WireToolChoice<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Named<'a> {
            #[serde(rename = "type")]
            kind: &'static str,
            function: NamedFunction<'a>,
        }
        #[derive(Serialize)]
        struct NamedFunction<'a> {
            name: &'a str,
        }
        match self.0 {
            ToolChoice::Auto => s.serialize_str("auto"),
            ToolChoice::None => s.serialize_str("none"),
            ToolChoice::Required => s.serialize_str("required"),
            ToolChoice::Tool(name) => Named {
                kind: "function",
                function: NamedFunction { name },
            }
            .serialize(s),
        }
    }
}

#[derive(Serialize)]
struct StreamOptions {
    include_usage: bool,
}

struct Messages<'a>(&'a [Message]);

impl Serialize for Messages<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(|m| {
            WireMessage {
                role: m.role.as_str(),
                // A string even when a message only calls tools (`""`): OpenAI also takes
                // `null` there, llama.cpp's Python server refuses it.
                content: &m.content,
                tool_calls: m
                    .tool_calls
                    .iter()
                    .map(|c| WireToolCall {
                        id: &c.id,
                        kind: "function",
                        function: WireFunctionCall {
                            name: &c.name,
                            arguments: &c.arguments,
                        },
                    })
                    .collect(),
                tool_call_id: m.tool_call_id.as_deref(),
            }
        }))
    }
}

#[derive(Serialize)]
struct WireMessage<'a> {
    role: &'static str,
    content: &'a str,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<WireToolCall<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_call_id: Option<&'a str>,
}

#[derive(Serialize)]
struct WireToolCall<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: WireFunctionCall<'a>,
}

#[derive(Serialize)]
struct WireFunctionCall<'a> {
    name: &'a str,
    arguments: &'a str,
}

#[derive(Serialize)]
struct WireTool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    function: WireFunctionDef<'a>,
}

#[derive(Serialize)]
struct WireFunctionDef<'a> {
    name: &'a str,
    description: &'a str,
    parameters: &'a Value,
}

#[derive(Deserialize)]
pub(crate) struct WireResponse {
    #[serde(default)]
    model: Option<String>,
    #[serde(default, deserialize_with = "null_as_default")]
    choices: Vec<WireChoice>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Deserialize)]
struct WireChoice {
    message: WireAnswer,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct WireAnswer {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<WireAnswerCall>>,
}

#[derive(Deserialize)]
struct WireAnswerCall {
    #[serde(default)]
    id: String,
    function: WireAnswerFunction,
}

#[derive(Deserialize)]
struct WireAnswerFunction {
    #[serde(default)]
    name: String,
    #[serde(default)]
    arguments: Value,
}

#[derive(Deserialize, Default)]
pub(crate) struct WireUsage {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct WireChunk {
    #[serde(default)]
    model: Option<String>,
    #[serde(default, deserialize_with = "null_as_default")]
    choices: Vec<WireChunkChoice>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Deserialize)]
struct WireChunkChoice {
    #[serde(default, deserialize_with = "null_as_default")]
    delta: WireDelta,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize, Default)]
struct WireDelta {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<WireDeltaCall>>,
}

#[derive(Deserialize)]
struct WireDeltaCall {
    #[serde(default)]
    index: Option<usize>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<WireDeltaFunction>,
}

#[derive(Deserialize)]
struct WireDeltaFunction {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<String>,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::chat::ToolDefinition;

    fn body_json(config: &EndpointConfig, req: &ChatRequest, stream: bool) -> Value {
        let body = OpenAi.body(req, &Defaults::of(config), stream);
        serde_json::from_slice(&body.expect("encodable")).expect("json")
    }

    #[test]
    fn body_uses_max_tokens_defaults_and_extra() {
        let mut config = EndpointConfig::openai("sub", "http://127.0.0.1:1/v1", "m");
        config.params.temperature = Some(0.5);
        config.params.max_tokens = Some(100);
        config.params.extra.insert("top_k".into(), json!(20));
        config.params.extra.insert("seed".into(), json!(1));
        let mut req = ChatRequest::from_prompt("hi");
        req.params.max_tokens = Some(7);
        req.params.seed = Some(99);
        req.params.extra.insert("top_k".into(), json!(40));
        let body = body_json(&config, &req, false);
        assert_eq!(
            body,
            json!({
                "model": "m",
                "messages": [{"role": "user", "content": "hi"}],
                "temperature": 0.5,
                "max_tokens": 7,
                "top_k": 40,
                "seed": 1,
            })
        );
    }

    #[test]
    fn body_carries_tools_tool_calls_and_stream_options() {
        let config = EndpointConfig::openai("sub", "http://127.0.0.1:1/v1", "m");
        let mut assistant = Message::assistant("");
        assistant.tool_calls.push(ToolCall {
            id: "c1".into(),
            name: "python".into(),
            arguments: r#"{"code":"1"}"#.into(),
        });
        let req = ChatRequest {
            model: Some("other".into()),
            messages: vec![
                Message::system("sys"),
                Message::user("u"),
                assistant,
                Message::tool_result("c1", "1"),
            ],
            tools: vec![ToolDefinition {
                name: "python".into(),
                description: "run".into(),
                parameters: json!({"type": "object"}),
            }],
            tool_choice: Some(ToolChoice::Tool("python".into())),
            parallel_tool_calls: Some(false),
            ..ChatRequest::default()
        };
        let body = body_json(&config, &req, true);
        assert_eq!(
            body["tool_choice"],
            json!({"type": "function", "function": {"name": "python"}})
        );
        assert_eq!(body["parallel_tool_calls"], false);
        assert_eq!(body["model"], "other");
        assert_eq!(body["stream"], true);
        assert_eq!(body["stream_options"], json!({"include_usage": true}));
        assert_eq!(body["messages"][2]["content"], "");
        assert_eq!(
            body["messages"][2]["tool_calls"][0],
            json!({"id": "c1", "type": "function", "function": {"name": "python", "arguments": "{\"code\":\"1\"}"}})
        );
        assert_eq!(
            body["messages"][3],
            json!({"role": "tool", "content": "1", "tool_call_id": "c1"})
        );
        assert_eq!(body["tools"][0]["function"]["name"], "python");
    }

    #[test]
    fn tool_choice_goes_out_only_with_tools() {
        let config = EndpointConfig::openai("sub", "http://127.0.0.1:1/v1", "m");
        let mut req = ChatRequest {
            tool_choice: Some(ToolChoice::Required),
            parallel_tool_calls: Some(true),
            ..ChatRequest::from_prompt("hi")
        };
        let body = body_json(&config, &req, false);
        assert!(body.get("tool_choice").is_none() && body.get("parallel_tool_calls").is_none());
        req.tools.push(ToolDefinition {
            name: "f".into(),
            description: String::new(),
            parameters: json!({"type": "object"}),
        });
        for (choice, wire) in [
            (ToolChoice::Auto, "auto"),
            (ToolChoice::None, "none"),
            (ToolChoice::Required, "required"),
        ] {
            req.tool_choice = Some(choice);
            let body = body_json(&config, &req, false);
            assert_eq!(body["tool_choice"], wire);
            assert_eq!(body["parallel_tool_calls"], true);
        }
    }
}
