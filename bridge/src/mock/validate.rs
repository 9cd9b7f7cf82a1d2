//! Request checks on tool traffic, as the real APIs make them: a client the mock accepts is
//! not refused by OpenAI or Anthropic for the shape of its tools, tool choice, calls and
//! results. Each failure is a message for a 400 in the provider's error shape.
//!
//! - Tools: a name matching `[a-zA-Z0-9_-]{1,64}`, unique; parameters (OpenAI, optional) or
//!   `input_schema` (Anthropic, required) an object schema (`"type": "object"`); OpenAI tools
//!   of `"type": "function"`. Anthropic server tools (another `type`) are not checked.
//! - Tool choice: a known form; a named tool among `tools`; OpenAI takes `tool_choice` and
//!   `parallel_tool_calls` only with `tools`.
//! - Calls and results: every tool result answers a call of the latest assistant message
//!   that is still unanswered (a result without a matching call id is refused); every call is
//!   answered before the next user or assistant turn and before the end of the conversation
//!   (Anthropic: in the very next user message).

use std::collections::HashSet;

use serde_json::Value;

use super::request::{CallRef, ToolSpec, ToolTraffic};
use super::wire::Provider;

/// What a request's tool choice asks of the reply.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ReplyLimits {
    /// `tool_choice: none`: the reply carries no tool calls.
    pub(crate) no_tool_calls: bool,
    /// Parallel calls switched off: at most one tool call.
    pub(crate) single_tool_call: bool,
}

/// Checks the tool traffic of a request; `Err` is the message of a 400.
pub(crate) fn check(provider: Provider, traffic: &ToolTraffic) -> Result<ReplyLimits, String> {
    let names = check_tools(provider, traffic.tools.as_deref().unwrap_or_default())?;
    let limits = check_choice(provider, traffic, &names)?;
    check_pairing(provider, traffic)?;
    Ok(limits)
}

/// The names of the tools, after checking each definition.
fn check_tools(provider: Provider, tools: &[ToolSpec]) -> Result<HashSet<&str>, String> {
    let mut names = HashSet::new();
    for (i, tool) in tools.iter().enumerate() {
        let at = match provider {
            Provider::OpenAi => format!("tools[{i}]"),
            Provider::Anthropic => format!("tools.{i}"),
        };
        match (provider, tool.kind.as_deref()) {
            (Provider::OpenAi, Some("function")) => {}
            (Provider::OpenAi, other) => {
                return Err(format!(
                    "Invalid value for `{at}.type`: expected `function`, found {}",
                    other.map_or("nothing".to_owned(), |k| format!("`{k}`"))
                ));
            }
            (Provider::Anthropic, None | Some("custom")) => {}
            // A server tool (`bash_20250124`, `web_search_…`): its shape is the server's.
            (Provider::Anthropic, Some(_)) => continue,
        }
        let name = tool.name.as_deref().unwrap_or_default();
        if !crate::chat::is_valid_tool_name(name) {
            return Err(format!(
                "Invalid `{at}` name `{name}`: a tool name must match `^[a-zA-Z0-9_-]{{1,64}}$`"
            ));
        }
        if !names.insert(name) {
            return Err(format!(
                "Tool names must be unique: `{name}` is defined twice (`{at}`)"
            ));
        }
        match (&tool.schema, provider) {
            (None, Provider::OpenAi) => {}
            (None, Provider::Anthropic) => {
                return Err(format!("`{at}.input_schema`: field required"));
            }
            (Some(schema), _) => {
                if schema.get("type").and_then(Value::as_str) != Some("object") {
                    return Err(format!(
                        "Invalid schema for tool `{name}`: the parameters must be a JSON Schema \
                         of `\"type\": \"object\"`, found `{}`",
                        short(&schema.to_string())
                    ));
                }
            }
        }
    }
    Ok(names)
}

fn check_choice(
    provider: Provider,
    traffic: &ToolTraffic,
    names: &HashSet<&str>,
) -> Result<ReplyLimits, String> {
    let has_tools = traffic.tools.as_ref().is_some_and(|t| !t.is_empty());
    let mut limits = ReplyLimits::default();
    if provider == Provider::OpenAi && !has_tools {
        for (field, present) in [
            ("tool_choice", traffic.tool_choice.is_some()),
            ("parallel_tool_calls", traffic.parallel_tool_calls.is_some()),
        ] {
            if present {
                return Err(format!(
                    "Invalid value for `{field}`: `{field}` is only allowed when `tools` are \
                     specified"
                ));
            }
        }
    }
    limits.single_tool_call = traffic.parallel_tool_calls == Some(false);
    let Some(choice) = &traffic.tool_choice else {
        return Ok(limits);
    };
    let named = match (provider, choice) {
        (Provider::OpenAi, Value::String(mode)) => match mode.as_str() {
            "auto" | "required" => None,
            "none" => {
                limits.no_tool_calls = true;
                None
            }
            other => {
                return Err(format!(
                    "Invalid value for `tool_choice`: `{other}`; expected `none`, `auto`, \
                     `required` or a named function"
                ));
            }
        },
        (Provider::OpenAi, Value::Object(o))
            if o.get("type").and_then(Value::as_str) == Some("function") =>
        {
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .ok_or("Missing required parameter: `tool_choice.function.name`")?;
            Some(name)
        }
        (Provider::Anthropic, Value::Object(o)) => {
            if o.get("disable_parallel_tool_use").and_then(Value::as_bool) == Some(true) {
                limits.single_tool_call = true;
            }
            match o.get("type").and_then(Value::as_str) {
                Some("auto" | "any") => None,
                Some("none") => {
                    limits.no_tool_calls = true;
                    None
                }
                Some("tool") => Some(
                    o.get("name")
                        .and_then(Value::as_str)
                        .ok_or("`tool_choice.name`: field required")?,
                ),
                _ => {
                    return Err(format!(
                        "`tool_choice`: expected `type` `auto`, `any`, `tool` or `none`, found \
                         `{}`",
                        short(&choice.to_string())
                    ));
                }
            }
        }
        _ => {
            return Err(format!(
                "Invalid value for `tool_choice`: `{}`",
                short(&choice.to_string())
            ));
        }
    };
    if let Some(name) = named.filter(|name| !names.contains(name)) {
        return Err(format!(
            "Invalid value for `tool_choice`: tool `{name}` is not among `tools`"
        ));
    }
    Ok(limits)
}

/// Every result answers a pending call; every call is answered in time.
fn check_pairing(provider: Provider, traffic: &ToolTraffic) -> Result<(), String> {
    // The calls of the latest assistant message not answered yet, and where it is.
    let mut pending: Vec<CallRef> = Vec::new();
    let mut asked_at = 0;
    for (i, message) in traffic.messages.iter().enumerate() {
        let closes_turn = match message.role.as_str() {
            "assistant" => true,
            "user" => provider == Provider::OpenAi || message.results.is_empty(),
            _ => false,
        };
        if closes_turn && !pending.is_empty() {
            return Err(unanswered(provider, asked_at, &pending));
        }
        for result in &message.results {
            let Some(id) = &result.id else {
                return Err(format!(
                    "Missing parameter `messages[{i}].tool_call_id`: messages with role `tool` \
                     must name the call they answer"
                ));
            };
            match pending.iter().position(|c| &c.id == id) {
                Some(pos) => {
                    pending.remove(pos);
                }
                None => return Err(unmatched(provider, i, result.block, id)),
            }
        }
        // Anthropic wants every result in the one user message after the calls.
        if provider == Provider::Anthropic && message.role == "user" && !pending.is_empty() {
            return Err(unanswered(provider, asked_at, &pending));
        }
        if message.role == "assistant" && !message.calls.is_empty() {
            pending.clone_from(&message.calls);
            asked_at = i;
        }
    }
    if pending.is_empty() {
        Ok(())
    } else {
        Err(unanswered(provider, asked_at, &pending))
    }
}

fn unmatched(provider: Provider, message: usize, block: usize, id: &str) -> String {
    match provider {
        Provider::OpenAi => format!(
            "Invalid parameter: `messages[{message}]` with role `tool` answers `tool_call_id` \
             `{id}`, which no preceding assistant `tool_calls` left unanswered; a tool message \
             must respond to a call of the assistant message before it"
        ),
        Provider::Anthropic => format!(
            "messages.{message}.content.{block}: unexpected `tool_use_id` found in \
             `tool_result` blocks: `{id}`; each `tool_result` block must have a corresponding \
             `tool_use` block in the previous message"
        ),
    }
}

fn unanswered(provider: Provider, message: usize, pending: &[CallRef]) -> String {
    let ids = pending
        .iter()
        .map(|c| format!("`{}`", c.id))
        .collect::<Vec<_>>()
        .join(", ");
    match provider {
        Provider::OpenAi => format!(
            "An assistant message with `tool_calls` (`messages[{message}]`) must be followed \
             by tool messages responding to each `tool_call_id`; these ids have no response: \
             {ids}"
        ),
        Provider::Anthropic => format!(
            "messages.{message}: `tool_use` ids were found without `tool_result` blocks \
             immediately after: {ids}; each `tool_use` block must have a corresponding \
             `tool_result` block in the next message"
        ),
    }
}

fn short(s: &str) -> &str {
    match s.char_indices().nth(60) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mock::request::parse_request;

    fn check_openai(body: &str) -> Result<ReplyLimits, String> {
        let view = parse_request(Provider::OpenAi, body.as_bytes())?;
        check(Provider::OpenAi, &view.traffic)
    }

    fn check_anthropic(body: &str) -> Result<ReplyLimits, String> {
        let view = parse_request(Provider::Anthropic, body.as_bytes())?;
        check(Provider::Anthropic, &view.traffic)
    }

    const CALL: &str = r#"{"role":"assistant","content":null,"tool_calls":[
        {"id":"a","type":"function","function":{"name":"f","arguments":"{}"}},
        {"id":"b","type":"function","function":{"name":"f","arguments":"{}"}}]}"#;

    fn openai(messages: &[&str], extra: &str) -> String {
        format!(
            r#"{{"model":"m","messages":[{{"role":"user","content":"go"}},{}]{extra}}}"#,
            messages.join(",")
        )
    }

    fn tool(id: &str) -> String {
        format!(r#"{{"role":"tool","tool_call_id":"{id}","content":"r"}}"#)
    }

    #[test]
    fn openai_results_must_answer_pending_calls() {
        let (a, b) = (tool("a"), tool("b"));
        assert_eq!(
            check_openai(&openai(&[CALL, &a, &b], "")),
            Ok(ReplyLimits::default())
        );
        let user = r#"{"role":"user","content":"next"}"#;
        assert!(check_openai(&openai(&[CALL, &b, &a, user], "")).is_ok());
        let err = check_openai(&openai(&[CALL, &a, &tool("zzz")], "")).expect_err("refused");
        assert!(
            err.contains("`zzz`") && err.contains("messages[3]"),
            "{err}"
        );
        let err = check_openai(&openai(&[CALL, &a, &a], "")).expect_err("refused");
        assert!(err.contains("`a`"), "{err}");
        let err = check_openai(&openai(&[CALL, &a, user], "")).expect_err("refused");
        assert!(err.contains("`b`") && err.contains("messages[1]"), "{err}");
        let err = check_openai(&openai(&[CALL, &a], "")).expect_err("refused");
        assert!(err.contains("`b`"), "{err}");
        let orphan = check_openai(&openai(&[&a], "")).expect_err("refused");
        assert!(orphan.contains("`a`"), "{orphan}");
    }

    #[test]
    fn anthropic_results_belong_in_the_next_user_message() {
        let call = r#"{"role":"assistant","content":[{"type":"text","text":"x"},
            {"type":"tool_use","id":"t1","name":"f","input":{}},
            {"type":"tool_use","id":"t2","name":"f","input":{}}]}"#;
        let results = |ids: &[&str]| {
            let blocks: Vec<String> = ids
                .iter()
                .map(|id| format!(r#"{{"type":"tool_result","tool_use_id":"{id}","content":"r"}}"#))
                .collect();
            format!(r#"{{"role":"user","content":[{}]}}"#, blocks.join(","))
        };
        let body = |messages: &[&str]| {
            format!(
                r#"{{"model":"m","max_tokens":9,"messages":[{{"role":"user","content":"go"}},{}]}}"#,
                messages.join(",")
            )
        };
        assert!(check_anthropic(&body(&[call, &results(&["t2", "t1"])])).is_ok());
        let err = check_anthropic(&body(&[call, &results(&["t1"])])).expect_err("refused");
        assert!(
            err.starts_with("messages.1:") && err.contains("`t2`"),
            "{err}"
        );
        let err = check_anthropic(&body(&[call, &results(&["t1", "t9"])])).expect_err("refused");
        assert!(
            err.starts_with("messages.2.content.1:") && err.contains("`t9`"),
            "{err}"
        );
        let err = check_anthropic(&body(&[call])).expect_err("refused");
        assert!(err.contains("`t1`, `t2`"), "{err}");
    }

    #[test]
    fn tools_and_tool_choice_are_checked() {
        let tools = |name: &str, params: &str| {
            format!(
                r#","tools":[{{"type":"function","function":{{"name":"{name}","parameters":{params}}}}}]"#
            )
        };
        let ok = tools("read_file", r#"{"type":"object"}"#);
        let plain = |extra: &str| {
            format!(r#"{{"model":"m","messages":[{{"role":"user","content":"go"}}]{extra}}}"#)
        };
        assert!(check_openai(&plain(&ok)).is_ok());
        for (extra, needle) in [
            (tools("bad name", "{}"), "`bad name`"),
            (tools(&"x".repeat(65), "{}"), "must match"),
            (
                tools("f", r#"{"type":"string"}"#),
                "Invalid schema for tool `f`",
            ),
            (format!(r#"{ok},"tool_choice":"sometimes""#), "`sometimes`"),
            (
                format!(r#"{ok},"tool_choice":{{"type":"function","function":{{"name":"g"}}}}"#),
                "tool `g`",
            ),
            (r#","tool_choice":"auto""#.to_owned(), "only allowed"),
            (r#","parallel_tool_calls":false"#.to_owned(), "only allowed"),
        ] {
            let err = check_openai(&plain(&extra)).expect_err("refused");
            assert!(err.contains(needle), "{extra}: {err}");
        }
        let limits = check_openai(&plain(&format!(
            r#"{ok},"tool_choice":"none","parallel_tool_calls":false"#
        )))
        .expect("valid");
        assert!(limits.no_tool_calls && limits.single_tool_call);
        let anthropic = |extra: &str| {
            format!(
                r#"{{"model":"m","max_tokens":9,"messages":[{{"role":"user","content":"go"}}]{extra}}}"#
            )
        };
        let err = check_anthropic(&anthropic(r#","tools":[{"name":"f"}]"#)).expect_err("refused");
        assert!(err.contains("`tools.0.input_schema`"), "{err}");
        let limits = check_anthropic(&anthropic(
            r#","tools":[{"name":"f","input_schema":{"type":"object"}}],
               "tool_choice":{"type":"tool","name":"f","disable_parallel_tool_use":true}"#,
        ))
        .expect("valid");
        assert!(limits.single_tool_call && !limits.no_tool_calls);
    }
}
