//! Chat requests as the mock reads them: an OpenAI or Anthropic body parsed into a
//! [`ChatView`] (what scripts see) and its tool traffic (what `validate.rs` checks). Private
//! serde structs only; a body that does not parse is a 400.

use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde_json::Value;

use super::prompt::Prompt;
use super::wire::{Provider, estimate_tokens};

/// The parts of a chat request the mock needs.
#[derive(Debug)]
pub(crate) struct ChatView {
    pub(crate) model: String,
    pub(crate) system: String,
    pub(crate) last_user: String,
    /// The content of the most recent tool result, if the request has one.
    pub(crate) last_tool: Option<String>,
    /// The name of the call that result answers (empty when no call matches).
    pub(crate) tool_name: String,
    pub(crate) turn: u64,
    pub(crate) stream: bool,
    pub(crate) include_usage: bool,
    pub(crate) prompt_tokens: u64,
    /// Tool definitions, calls, results and the tool choice, for validation.
    pub(crate) traffic: ToolTraffic,
}

impl ChatView {
    pub(crate) fn prompt(&self) -> Prompt<'_> {
        Prompt {
            model: &self.model,
            system: &self.system,
            last_user: &self.last_user,
            last_tool: self.last_tool.as_deref(),
            tool_name: &self.tool_name,
            turn: self.turn,
        }
    }
}

/// Everything about tools in one request, in either wire format.
#[derive(Debug, Default)]
pub(crate) struct ToolTraffic {
    /// The `tools` array, if the request has one.
    pub(crate) tools: Option<Vec<ToolSpec>>,
    /// The `tool_choice` as sent.
    pub(crate) tool_choice: Option<Value>,
    /// OpenAI's `parallel_tool_calls`, if sent.
    pub(crate) parallel_tool_calls: Option<bool>,
    /// The conversation, reduced to roles, tool calls and tool results.
    pub(crate) messages: Vec<Exchange>,
}

/// One tool definition as sent (OpenAI `{type, function: {name, parameters}}` or Anthropic
/// `{name, input_schema}`, optionally with a server-tool `type`).
#[derive(Debug, Default)]
pub(crate) struct ToolSpec {
    pub(crate) kind: Option<String>,
    pub(crate) name: Option<String>,
    /// OpenAI `function.parameters` / Anthropic `input_schema`.
    pub(crate) schema: Option<Value>,
}

/// One message's part in the tool traffic.
#[derive(Debug)]
pub(crate) struct Exchange {
    pub(crate) role: String,
    /// Tool calls an assistant message makes.
    pub(crate) calls: Vec<CallRef>,
    /// Tool results it carries (an OpenAI `tool` message carries one).
    pub(crate) results: Vec<ResultRef>,
}

/// A tool call: its id and the function it calls.
#[derive(Debug, Clone)]
pub(crate) struct CallRef {
    pub(crate) id: String,
    pub(crate) name: String,
}

/// A tool result: the call id it answers and, for Anthropic, its content block index.
#[derive(Debug)]
pub(crate) struct ResultRef {
    /// `None` when an OpenAI `tool` message has no `tool_call_id`.
    pub(crate) id: Option<String>,
    pub(crate) block: usize,
}

/// Message content: a string, `null`, or a list of parts. Text parts are joined with `\n`;
/// `tool_use` and `tool_result` parts (Anthropic) are kept apart.
#[derive(Debug, Default)]
struct Content {
    text: String,
    /// Whether the content has any text (a string, or a text part), as opposed to only
    /// tool results.
    has_text: bool,
    uses: Vec<CallRef>,
    /// `(tool_use_id, block index, content)`.
    results: Vec<(Option<String>, usize, String)>,
}

impl<'de> Deserialize<'de> for Content {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ContentVisitor;
        impl<'de> Visitor<'de> for ContentVisitor {
            type Value = Content;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string, null or a list of content parts")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Content, E> {
                self.visit_string(v.to_owned())
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Content, E> {
                Ok(Content {
                    text: v,
                    has_text: true,
                    ..Content::default()
                })
            }
            fn visit_unit<E: de::Error>(self) -> Result<Content, E> {
                Ok(Content::default())
            }
            fn visit_none<E: de::Error>(self) -> Result<Content, E> {
                Ok(Content::default())
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Content, A::Error> {
                let mut out = Content::default();
                let mut block = 0;
                while let Some(part) = seq.next_element::<Part>()? {
                    match part.kind.as_deref() {
                        Some("tool_result") => out.results.push((
                            part.tool_use_id,
                            block,
                            part.content.map(|c| c.text).unwrap_or_default(),
                        )),
                        Some("tool_use") => out.uses.push(CallRef {
                            id: part.id.unwrap_or_default(),
                            name: part.name.unwrap_or_default(),
                        }),
                        _ => {
                            if let Some(text) = part.text {
                                if out.has_text {
                                    out.text.push('\n');
                                }
                                out.text.push_str(&text);
                                out.has_text = true;
                            }
                        }
                    }
                    block += 1;
                }
                Ok(out)
            }
        }
        d.deserialize_any(ContentVisitor)
    }
}

#[derive(Debug, Deserialize)]
struct Part {
    #[serde(default, rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    content: Option<Content>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    tool_use_id: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Message {
    role: String,
    #[serde(default)]
    content: Content,
    /// OpenAI: the calls of an assistant message.
    #[serde(default)]
    tool_calls: Option<Vec<OpenAiCallIn>>,
    /// OpenAI: the call a `tool` message answers.
    #[serde(default)]
    tool_call_id: Option<String>,
}

#[derive(Debug, Deserialize)]
struct OpenAiCallIn {
    #[serde(default)]
    id: String,
    #[serde(default)]
    function: Option<OpenAiFunctionIn>,
}

#[derive(Debug, Deserialize)]
struct OpenAiFunctionIn {
    #[serde(default)]
    name: String,
}

#[derive(Debug, Deserialize)]
struct OpenAiToolIn {
    #[serde(default, rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    function: Option<OpenAiToolFunctionIn>,
}

#[derive(Debug, Deserialize)]
struct OpenAiToolFunctionIn {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    parameters: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct AnthropicToolIn {
    #[serde(default, rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    input_schema: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct OpenAiRequest {
    model: Option<String>,
    messages: Option<Vec<Message>>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    #[serde(default)]
    tools: Option<Vec<OpenAiToolIn>>,
    #[serde(default)]
    tool_choice: Option<Value>,
    #[serde(default)]
    parallel_tool_calls: Option<bool>,
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
    system: Content,
    max_tokens: Option<u64>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    tools: Option<Vec<AnthropicToolIn>>,
    #[serde(default)]
    tool_choice: Option<Value>,
}

/// Parses a request body; `Err` is a message for a 400 response.
pub(crate) fn parse_request(provider: Provider, body: &[u8]) -> Result<ChatView, String> {
    let bad_json = |e: serde_json::Error| format!("Request body is not a valid chat request: {e}");
    let mut traffic = ToolTraffic::default();
    let (model, messages, mut system, stream, include_usage) = match provider {
        Provider::OpenAi => {
            let r: OpenAiRequest = serde_json::from_slice(body).map_err(bad_json)?;
            let include_usage = r.stream_options.is_some_and(|o| o.include_usage);
            traffic.tools = r.tools.map(|tools| {
                tools
                    .into_iter()
                    .map(|t| {
                        let (name, schema) = t
                            .function
                            .map(|f| (f.name, f.parameters))
                            .unwrap_or_default();
                        ToolSpec {
                            kind: t.kind,
                            name,
                            schema,
                        }
                    })
                    .collect()
            });
            traffic.tool_choice = r.tool_choice;
            traffic.parallel_tool_calls = r.parallel_tool_calls;
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
            traffic.tools = r.tools.map(|tools| {
                tools
                    .into_iter()
                    .map(|t| ToolSpec {
                        kind: t.kind,
                        name: t.name,
                        schema: t.input_schema,
                    })
                    .collect()
            });
            traffic.tool_choice = r.tool_choice;
            (
                r.model,
                r.messages,
                r.system.text,
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
    let mut last_tool = None;
    traffic.messages.reserve(messages.len());
    for (i, m) in messages.iter().enumerate() {
        prompt_bytes += m.content.text.len()
            + m.content
                .results
                .iter()
                .map(|(_, _, text)| text.len())
                .sum::<usize>();
        match m.role.as_str() {
            "assistant" => turn += 1,
            "user" if m.content.has_text => last_user_idx = Some(i),
            "system" | "developer" if provider == Provider::OpenAi => {
                if !system.is_empty() {
                    system.push('\n');
                }
                system.push_str(&m.content.text);
            }
            _ => {}
        }
        let mut calls = m.content.uses.clone();
        calls.extend(m.tool_calls.iter().flatten().map(|c| {
            CallRef {
                id: c.id.clone(),
                name: c
                    .function
                    .as_ref()
                    .map(|f| f.name.clone())
                    .unwrap_or_default(),
            }
        }));
        let mut results: Vec<ResultRef> = m
            .content
            .results
            .iter()
            .map(|(id, block, _)| ResultRef {
                id: id.clone(),
                block: *block,
            })
            .collect();
        if !m.content.results.is_empty() {
            last_tool = Some((i, m.content.results.len() - 1));
        }
        if m.role == "tool" && provider == Provider::OpenAi {
            results.push(ResultRef {
                id: m.tool_call_id.clone(),
                block: 0,
            });
            last_tool = Some((i, usize::MAX));
        }
        traffic.messages.push(Exchange {
            role: m.role.clone(),
            calls,
            results,
        });
    }
    let mut messages = messages;
    let (last_tool, tool_name) = match last_tool {
        Some((i, part)) => {
            let message = &mut messages[i];
            let (id, text) = if part == usize::MAX {
                (
                    message.tool_call_id.clone(),
                    std::mem::take(&mut message.content.text),
                )
            } else {
                let (id, _, text) = &mut message.content.results[part];
                (id.clone(), std::mem::take(text))
            };
            (
                Some(text),
                id.map(|id| name_of_call(&traffic.messages[..i], &id)),
            )
        }
        None => (None, None),
    };
    let last_user = match last_user_idx {
        Some(i) => std::mem::take(&mut messages[i].content.text),
        None => String::new(),
    };
    Ok(ChatView {
        model,
        system,
        last_user,
        last_tool,
        tool_name: tool_name.unwrap_or_default(),
        turn,
        stream,
        include_usage,
        prompt_tokens: estimate_tokens(prompt_bytes),
        traffic,
    })
}

/// The function name of the latest call `id` among `earlier` messages (empty if none).
fn name_of_call(earlier: &[Exchange], id: &str) -> String {
    earlier
        .iter()
        .rev()
        .flat_map(|m| m.calls.iter())
        .find(|c| c.id == id)
        .map(|c| c.name.clone())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_content_parts_and_counts_turns() {
        let body = br#"{"model":"m","messages":[
            {"role":"system","content":"sys"},
            {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
            {"role":"assistant","content":null,"tool_calls":[{"id":"x","type":"function","function":{"name":"f","arguments":"{}"}}]},
            {"role":"tool","content":"r","tool_call_id":"x"},
            {"role":"user","content":"last"}]}"#;
        let v = parse_request(Provider::OpenAi, body).expect("valid request");
        assert_eq!(
            (v.system.as_str(), v.last_user.as_str(), v.turn),
            ("sys", "last", 1)
        );
        assert_eq!(
            (v.last_tool.as_deref(), v.tool_name.as_str()),
            (Some("r"), "f")
        );
    }

    #[test]
    fn anthropic_tool_results_are_not_user_text() {
        let v = parse_request(
            Provider::Anthropic,
            br#"{"model":"m","max_tokens":5,"system":[{"type":"text","text":"s"}],
                 "messages":[
                   {"role":"user","content":"go"},
                   {"role":"assistant","content":[{"type":"tool_use","id":"t","name":"read","input":{}}]},
                   {"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"out"}]}]}]}"#,
        )
        .expect("valid request");
        assert_eq!(
            (
                v.system.as_str(),
                v.last_user.as_str(),
                v.last_tool.as_deref(),
                v.tool_name.as_str()
            ),
            ("s", "go", Some("out"), "read")
        );
        assert_eq!(v.traffic.messages[1].calls[0].id, "t");
        assert_eq!(v.traffic.messages[2].results[0].id.as_deref(), Some("t"));
    }
}
