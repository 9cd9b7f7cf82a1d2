//! The event-log view: a workflow run's JSONL event log as one self-contained HTML page
//! (`rlm view` shows an event log this way, a trajectory as the RLM view).
//!
//! The page is the run's agent tree: each agent run is a `<details>` (open) titled with its
//! name and how it ended, holding its steps in order — messages, tool calls and results,
//! the state writes each step made, loop iterations and metadata records (an RLM agent's
//! iterations with their code blocks and outputs, and its sub-calls) — and its sub-agents'
//! runs nested where they ran. Events are
//! read loosely, so a log cut short by a killed run shows everything up to its last
//! complete line.

use std::fmt::Write as _;

use serde_json::Value;

use crate::rlm::escape_html as escape;

/// Why an event log could not be rendered.
#[derive(Debug, thiserror::Error)]
pub enum EventLogViewError {
    /// No line of the input is a workflow event.
    #[error(
        "The input holds no workflow events (JSON objects with `author`, `branch` and `kind`); \
         pass the event log written by `rlm flow run --events FILE`"
    )]
    NotAnEventLog,
}

const STYLE: &str = "body{font:14px/1.45 system-ui,sans-serif;margin:1.5em;color:#222}\
details{border-left:2px solid #ccd;margin:.3em 0 .3em .6em;padding-left:.6em}\
summary{cursor:pointer;font-weight:600}.dim{color:#777;font-weight:400}\
pre{background:#f6f6f8;padding:.4em .6em;white-space:pre-wrap;margin:.2em 0}.code{border-left:3px solid #99c}\
.ev{margin:.2em 0}.st-failed,.st-cancelled{color:#b00}.st-completed,.st-exited_loop{color:#070}\
.tag{display:inline-block;min-width:6em;color:#555}";

/// Whether `jsonl` looks like an event log (its first readable line is an event).
pub fn is_event_log(jsonl: &str) -> bool {
    jsonl
        .lines()
        .filter(|l| !l.trim().is_empty())
        .find_map(|l| serde_json::from_str::<Value>(l).ok())
        .is_some_and(|v| is_event(&v))
}

fn is_event(v: &Value) -> bool {
    v.get("author").is_some() && v.get("branch").is_some() && v.get("kind").is_some()
}

/// Renders an event log (JSONL text) as one self-contained HTML page.
pub fn render_event_log_html(jsonl: &str) -> Result<String, EventLogViewError> {
    let mut events = Vec::new();
    let mut unreadable = Vec::new();
    for (number, line) in jsonl.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Value>(line) {
            Ok(v) if is_event(&v) => events.push(v),
            _ => unreadable.push(number + 1),
        }
    }
    if events.is_empty() {
        return Err(EventLogViewError::NotAnEventLog);
    }
    let root = events
        .first()
        .and_then(|e| str_of(e, "author"))
        .unwrap_or("workflow")
        .to_owned();
    let mut out = format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>Workflow {}</title><style>{STYLE}</style></head><body>\n\
         <h1>Workflow run: {}</h1><p class=\"dim\">{} events</p>\n",
        escape(&root),
        escape(&root),
        events.len()
    );
    // Open agent runs, innermost last, by branch.
    let mut open: Vec<String> = Vec::new();
    for event in &events {
        let branch = str_of(event, "branch").unwrap_or("");
        let kind = event.pointer("/kind").and_then(Value::as_str).unwrap_or("");
        // Close runs this event is not inside of (a run cut short has no end event).
        while open
            .last()
            .is_some_and(|b| branch != b && !branch.starts_with(&format!("{b}/")))
        {
            open.pop();
            out.push_str("</details>\n");
        }
        match kind {
            "start" => {
                let _ = writeln!(
                    out,
                    "<details open><summary>{} <span class=\"dim\">{}</span></summary>",
                    escape(str_of(event, "author").unwrap_or("?")),
                    escape(branch)
                );
                open.push(branch.to_owned());
            }
            "end" => {
                let status = str_of(event, "status").unwrap_or("?");
                let _ = write!(
                    out,
                    "<div class=\"ev\"><span class=\"tag\">end</span><b class=\"st-{0}\">{0}</b>",
                    escape(status)
                );
                if let Some(content) = str_of(event, "content") {
                    let _ = write!(out, "<pre>{}</pre>", escape(content));
                }
                out.push_str("</div>");
                render_delta(&mut out, event);
                if open.last().is_some_and(|b| b == branch) {
                    open.pop();
                    out.push_str("</details>\n");
                }
            }
            _ => render_step(&mut out, kind, event),
        }
    }
    for _ in open {
        out.push_str("</details>\n");
    }
    if !unreadable.is_empty() {
        let lines: Vec<String> = unreadable.iter().map(ToString::to_string).collect();
        let _ = write!(
            out,
            "<p class=\"dim\">Skipped line(s) {} of the file: not complete events (a run stopped \
             while writing leaves an incomplete last line).</p>",
            lines.join(", ")
        );
    }
    out.push_str("</body></html>\n");
    Ok(out)
}

fn render_step(out: &mut String, kind: &str, event: &Value) {
    let tag = match kind {
        "iteration" => format!(
            "iteration {}",
            event.get("iteration").and_then(Value::as_u64).unwrap_or(0)
        ),
        "metadata" => str_of(event, "topic").unwrap_or("metadata").to_owned(),
        other => other.replace('_', " "),
    };
    let _ = write!(
        out,
        "<div class=\"ev\"><span class=\"tag\">{}</span>",
        escape(&tag)
    );
    if let Some(content) = str_of(event, "content") {
        let _ = write!(out, "<pre>{}</pre>", escape(content));
    }
    for call in event
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let _ = write!(
            out,
            "<pre>{}({})</pre>",
            escape(str_of(call, "name").unwrap_or("?")),
            escape(str_of(call, "arguments").unwrap_or(""))
        );
    }
    for result in event
        .get("tool_results")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let value = result
            .get("result")
            .map(Value::to_string)
            .unwrap_or_default();
        let _ = write!(
            out,
            "<pre>{} → {}</pre>",
            escape(str_of(result, "name").unwrap_or("?")),
            escape(&value)
        );
    }
    if let Some(metadata) = event.get("metadata").filter(|m| !m.is_null()) {
        if str_of(event, "topic") == Some("rlm_iteration") {
            render_rlm_iteration(out, metadata);
        } else {
            let _ = write!(out, "<pre>{}</pre>", escape(&metadata.to_string()));
        }
    }
    out.push_str("</div>");
    render_delta(out, event);
}

/// The state an event wrote: its writes (a replace `key = value`, an append `key += items`,
/// a delete), or the object of values logs written before writes had their own form hold.
fn render_delta(out: &mut String, event: &Value) {
    let line = |out: &mut String, key: &str, op: &str, value: Option<&Value>| {
        let shown = match value {
            Some(Value::String(s)) => format!(" <pre>{}</pre>", escape(s)),
            Some(other) => format!(" <pre>{}</pre>", escape(&other.to_string())),
            None => String::new(),
        };
        let _ = write!(
            out,
            "<div class=\"ev\"><span class=\"tag\">state</span><code>{}</code> {op}{shown}</div>",
            escape(key)
        );
    };
    match event.get("delta") {
        Some(Value::Array(writes)) => {
            for write in writes {
                let key = str_of(write, "key").unwrap_or("?");
                match str_of(write, "op") {
                    Some("append") => line(out, key, "+=", write.get("items")),
                    Some("delete") => line(out, key, "deleted", None),
                    _ => line(out, key, "=", write.get("value")),
                }
            }
        }
        Some(Value::Object(values)) => {
            for (key, value) in values {
                line(out, key, "=", Some(value));
            }
        }
        _ => {}
    }
}

/// An RLM agent's iteration: each block's code and what it printed (capped as the
/// trajectory caps it), then the rest of the record.
fn render_rlm_iteration(out: &mut String, metadata: &Value) {
    for block in metadata
        .get("blocks")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let _ = write!(
            out,
            "<pre class=\"code\">{}</pre>",
            escape(str_of(block, "code").unwrap_or(""))
        );
        for stream in ["stdout", "stderr"] {
            if let Some(text) = str_of(block, stream).filter(|t| !t.is_empty()) {
                let _ = write!(
                    out,
                    "<div><span class=\"dim\">{stream}</span><pre>{}</pre></div>",
                    escape(text)
                );
            }
        }
    }
    let mut rest = metadata.clone();
    if let Some(map) = rest.as_object_mut() {
        map.remove("blocks");
    }
    let _ = write!(out, "<pre>{}</pre>", escape(&rest.to_string()));
}

fn str_of<'a>(value: &'a Value, key: &str) -> Option<&'a str> {
    value.get(key).and_then(Value::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn page(events: &[Value]) -> String {
        let jsonl: String = events.iter().map(|e| format!("{e}\n")).collect();
        render_event_log_html(&jsonl).expect("an event log")
    }

    #[test]
    fn writes_show_as_replace_append_and_delete_and_old_logs_still_render() {
        let start = json!({"author": "a", "branch": "a", "kind": "start"});
        let update = json!({"author": "a", "branch": "a", "kind": "state_update", "delta": [
            {"op": "replace", "key": "plan", "value": "ship"},
            {"op": "append", "key": "messages", "items": [{"author": "a"}]},
            {"op": "delete", "key": "draft"},
        ]});
        let html = page(&[start.clone(), update]);
        assert!(
            html.contains("<code>plan</code> = <pre>ship</pre>"),
            "{html}"
        );
        assert!(html.contains("<code>messages</code> +="), "{html}");
        assert!(html.contains("<code>draft</code> deleted"), "{html}");
        let old = json!({"author": "a", "branch": "a", "kind": "state_update",
            "delta": {"plan": "ship"}});
        let html = page(&[start, old]);
        assert!(
            html.contains("<code>plan</code> = <pre>ship</pre>"),
            "{html}"
        );
    }

    #[test]
    fn an_rlm_iteration_shows_its_code_and_output() {
        let iteration = json!({"author": "rlm", "branch": "rlm", "kind": "metadata",
            "topic": "rlm_iteration", "metadata": {"blocks": [
                {"code": "print(1 < 2)", "stdout": "True\n", "stderr": ""}
            ], "model_ms": 3.0}});
        let html = page(&[
            json!({"author": "rlm", "branch": "rlm", "kind": "start"}),
            iteration,
        ]);
        assert!(
            html.contains("<pre class=\"code\">print(1 &lt; 2)</pre>"),
            "{html}"
        );
        assert!(html.contains("<pre>True\n</pre>"), "{html}");
        assert!(html.contains("model_ms"), "{html}");
    }
}
