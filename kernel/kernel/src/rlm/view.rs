//! The trajectory view: one self-contained HTML page (inline CSS and script, no network, no
//! external assets) rendered from a trajectory's JSONL, shared by `rlm view` and the notebook's
//! `text/html` result.
//!
//! The page shows the query, the models and contexts, the answer with its termination reason
//! and metrics, then every iteration as a collapsed `<details>`: the model's reply, each block's
//! code, output and error, and its sub-call counts and timings. A search box filters iterations
//! by their text (and opens the ones that match) and buttons expand or collapse them all, so a
//! run of hundreds of iterations stays readable. Without script the page still works: the
//! sections are plain `<details>`. A link ending in `#search=TEXT` opens the page filtered.
//!
//! The renderer reads the JSONL loosely (as [`serde_json::Value`]) so that it can show a
//! trajectory cut short (a run killed mid-write: the incomplete last line is reported, not
//! fatal) and fields that later format versions add. The `reply` and `block` lines written
//! before each iteration's record are what an `iteration` line later says in full; an
//! iteration that has them but no record of its own did not finish, and is shown from them:
//! its reply and the blocks that started, the last one as the block that was running when the
//! run stopped — in a run without a `result` line, the block that crashed it (or that a kill
//! stopped).
//!
//! ```
//! let jsonl = r#"{"type":"header","version":1,"query":"How many?"}
//! {"type":"result","answer":"42","termination_reason":"final_answer","metrics":{"iterations":0}}"#;
//! let html = kernel::rlm::render_trajectory_html(jsonl, false)?;
//! assert!(html.contains("How many?") && html.contains("42"));
//! # Ok::<(), kernel::rlm::ViewError>(())
//! ```

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::Value;

/// Why a trajectory could not be rendered.
#[derive(Debug, thiserror::Error)]
pub enum ViewError {
    /// No line of the input is a trajectory event.
    #[error(
        "The input holds no trajectory lines (JSON objects with a `type` of `header`, `iteration`, `error` or `result`); pass the file written by `rlm run --trajectory FILE`"
    )]
    NotATrajectory,
}

const STYLE: &str = include_str!("view.css");
const SCRIPT: &str = include_str!("view.js");

/// Renders a trajectory (JSONL text) as one self-contained HTML document. `collapsed` folds
/// the whole view into one `<details>` (the notebook's result) instead of a full page.
pub fn render_trajectory_html(jsonl: &str, collapsed: bool) -> Result<String, ViewError> {
    let mut header = None;
    let mut result = None;
    let mut iterations = Vec::new();
    let mut started = Started::default();
    let mut errors = Vec::new();
    let mut unreadable = Vec::new();
    for (number, line) in jsonl.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let Ok(value) = serde_json::from_str::<Value>(line) else {
            unreadable.push(number + 1);
            continue;
        };
        match value.get("type").and_then(Value::as_str) {
            Some("header") => header = Some(value),
            Some("iteration") => iterations.push(value),
            Some("reply" | "block") => started.add(value),
            Some("error") => errors.push(value),
            Some("result") => result = Some(value),
            _ => unreadable.push(number + 1),
        }
    }
    let unfinished = started.unfinished(&iterations);
    if header.is_none()
        && result.is_none()
        && iterations.is_empty()
        && unfinished.is_empty()
        && errors.is_empty()
    {
        return Err(ViewError::NotATrajectory);
    }
    static NEXT_VIEW: AtomicU64 = AtomicU64::new(1);
    let id = format!(
        "rlm-view-{}-{}",
        std::process::id(),
        NEXT_VIEW.fetch_add(1, Ordering::Relaxed)
    );
    let mut out = String::with_capacity(jsonl.len() / 2 + STYLE.len() + SCRIPT.len() + 4096);
    let title = header
        .as_ref()
        .and_then(|h| text(h, "query"))
        .map_or_else(|| "RLM trajectory".to_owned(), |q| shorten(q, 80));
    if !collapsed {
        let _ = write!(
            out,
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
             <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
             <title>{}</title></head><body>\n",
            escape(&title)
        );
    }
    let _ = write!(
        out,
        "<div class=\"rlm-view\" id=\"{id}\"><style>{STYLE}</style>"
    );
    if collapsed {
        let _ = write!(
            out,
            "<details class=\"rlm-all\"><summary>Trajectory: {} iteration(s)</summary>",
            iterations.len() + unfinished.len()
        );
    }
    out.push_str("<h1>RLM trajectory</h1>");
    if let Some(h) = &header {
        render_header(&mut out, h);
    }
    render_result(&mut out, result.as_ref());
    out.push_str(
        "<div class=\"rlm-tools\"><input type=\"search\" class=\"rlm-search\" \
         placeholder=\"Search iterations (code, output, replies)\" aria-label=\"Search iterations\">\
         <button type=\"button\" class=\"rlm-expand\">Expand all</button>\
         <button type=\"button\" class=\"rlm-collapse\">Collapse all</button>\
         <span class=\"rlm-count\"></span></div>",
    );
    let _ = write!(
        out,
        "<section class=\"rlm-iterations\"><h2>Iterations ({})</h2>",
        iterations.len() + unfinished.len()
    );
    for iteration in &iterations {
        render_iteration(&mut out, iteration);
    }
    for iteration in &unfinished {
        render_unfinished(&mut out, iteration, result.is_none());
    }
    out.push_str("</section>");
    if !errors.is_empty() {
        out.push_str("<section class=\"rlm-errors\"><h2>Errors</h2><ul>");
        for e in &errors {
            let _ = write!(
                out,
                "<li>iteration {}: <b>{}</b> {}</li>",
                e.get("iteration").and_then(Value::as_u64).unwrap_or(0),
                escape(text(e, "kind").unwrap_or("error")),
                escape(text(e, "message").unwrap_or(""))
            );
        }
        out.push_str("</ul></section>");
    }
    if !unreadable.is_empty() {
        let lines: Vec<String> = unreadable.iter().map(ToString::to_string).collect();
        let _ = write!(
            out,
            "<p class=\"rlm-note\">Skipped line(s) {} of the file: not complete trajectory events \
             (a run stopped while writing leaves an incomplete last line).</p>",
            lines.join(", ")
        );
    }
    if collapsed {
        out.push_str("</details>");
    }
    let _ = write!(
        out,
        "<script>(function(){{var root=document.getElementById(\"{id}\");{SCRIPT}}})();</script></div>"
    );
    if !collapsed {
        out.push_str("\n</body></html>\n");
    }
    Ok(out)
}

fn render_header(out: &mut String, header: &Value) {
    if let Some(query) = text(header, "query") {
        let _ = write!(
            out,
            "<section class=\"rlm-query\"><h2>Query</h2><pre>{}</pre></section>",
            escape(query)
        );
    }
    let mut facts = Vec::new();
    for endpoint in header
        .get("endpoints")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        facts.push(format!(
            "<li><b>{}</b>: {} <span class=\"rlm-dim\">({}, {})</span></li>",
            escape(text(endpoint, "name").unwrap_or("?")),
            escape(text(endpoint, "model").unwrap_or("?")),
            escape(text(endpoint, "provider").unwrap_or("?")),
            escape(text(endpoint, "base_url").unwrap_or("?")),
        ));
    }
    for context in header
        .get("contexts")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let mut shape = Vec::new();
        if let Some(rows) = context.get("rows").and_then(Value::as_u64) {
            shape.push(format!("{rows} rows"));
        }
        if let Some(items) = context.get("items").and_then(Value::as_u64) {
            shape.push(format!("{items} items"));
        }
        if let Some(chars) = context.get("chars").and_then(Value::as_u64) {
            shape.push(format!("{chars} characters"));
        }
        facts.push(format!(
            "<li><b>{}</b>: {} from <code>{}</code> <span class=\"rlm-dim\">{}</span></li>",
            escape(text(context, "name").unwrap_or("context")),
            escape(text(context, "kind").unwrap_or("?")),
            escape(text(context, "source").unwrap_or("?")),
            escape(&shape.join(", ")),
        ));
    }
    if !facts.is_empty() {
        let _ = write!(
            out,
            "<section class=\"rlm-setup\"><h2>Models and contexts</h2><ul>{}</ul></section>",
            facts.concat()
        );
    }
}

fn render_result(out: &mut String, result: Option<&Value>) {
    out.push_str("<section class=\"rlm-result\"><h2>Answer</h2>");
    let Some(result) = result else {
        out.push_str("<p class=\"rlm-note\">The trajectory has no result line: the run did not finish (or is still going).</p></section>");
        return;
    };
    let reason = text(result, "termination_reason").unwrap_or("unknown");
    let class = if reason == "final_answer" {
        "ok"
    } else {
        "stop"
    };
    let _ = write!(
        out,
        "<p><span class=\"rlm-badge rlm-{class}\">{}</span></p>",
        escape(reason)
    );
    match text(result, "answer") {
        Some(answer) => {
            let _ = write!(out, "<pre class=\"rlm-answer\">{}</pre>", escape(answer));
        }
        None => out.push_str("<p class=\"rlm-note\">No answer.</p>"),
    }
    if let Some(error) = text(result, "error") {
        let _ = write!(out, "<p class=\"rlm-error\">{}</p>", escape(error));
    }
    if let Some(m) = result.get("metrics") {
        let number = |key: &str| m.get(key).and_then(Value::as_f64).unwrap_or(0.0);
        let rows = [
            ("iterations", format!("{}", number("iterations"))),
            ("root calls", format!("{}", number("root_calls"))),
            ("code blocks", format!("{}", number("code_blocks"))),
            ("sub-calls", format!("{}", number("sub_calls"))),
            // Every error the code got instead of an answer, a call never sent (no endpoint)
            // included: not a part of the sub-calls.
            ("sub-call errors", format!("{}", number("sub_call_errors"))),
            (
                "tokens",
                format!(
                    "{} prompt + {} completion",
                    number("prompt_tokens"),
                    number("completion_tokens")
                ),
            ),
            ("cost", cost_text(m.get("cost_usd"))),
            ("time", format!("{:.2} s", number("total_ms") / 1e3)),
        ];
        out.push_str("<div class=\"rlm-metrics\">");
        for (name, value) in rows {
            let _ = write!(out, "<span><i>{name}</i> {}</span>", escape(&value));
        }
        out.push_str("</div>");
    }
    out.push_str("</section>");
}

/// A cost as the views show it: `null` (or absent) is "no price given", never `$0`.
fn cost_text(cost: Option<&Value>) -> String {
    match cost.and_then(Value::as_f64) {
        Some(usd) => format!("${usd:.4}"),
        None => "no price given".to_owned(),
    }
}

fn render_iteration(out: &mut String, it: &Value) {
    let n = it.get("iteration").and_then(Value::as_u64).unwrap_or(0);
    let blocks = it
        .get("blocks")
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice);
    let sub_calls = it
        .get("sub_calls")
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice);
    let status = it
        .get("execution")
        .and_then(|e| text(e, "status"))
        .unwrap_or(if blocks.is_empty() { "no code" } else { "?" });
    let final_found = it
        .get("final_answer_found")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let ms = |key: &str| it.get(key).and_then(Value::as_f64).unwrap_or(0.0);
    let _ = write!(
        out,
        "<details class=\"rlm-it\"><summary><b>Iteration {n}</b> · {} block(s) · {} sub-call(s){} · \
         model {:.0} ms · code {:.0} ms · <span class=\"rlm-status-{}\">{}</span>{}</summary>",
        blocks.len(),
        sub_calls.len(),
        sub_call_errors(it),
        ms("model_ms"),
        ms("execution_ms"),
        escape(status),
        escape(status),
        if final_found {
            " · <span class=\"rlm-badge rlm-ok\">final answer</span>"
        } else {
            ""
        }
    );
    if let Some(reply) = text(it, "reply") {
        let _ = write!(
            out,
            "<h4>Model reply</h4><pre class=\"rlm-reply\">{}</pre>",
            escape(reply)
        );
    }
    for block in blocks {
        render_block(out, block);
    }
    if !sub_calls.is_empty() {
        let latency: f64 = sub_calls
            .iter()
            .filter_map(|c| c.get("latency_ms").and_then(Value::as_f64))
            .sum();
        let failed = sub_calls
            .iter()
            .filter(|c| c.get("error").is_some_and(|e| !e.is_null()))
            .count();
        let _ = write!(
            out,
            "<p class=\"rlm-dim\">Sub-calls: {} ({} failed), {:.0} ms of model time in total.</p>",
            sub_calls.len(),
            failed,
            latency
        );
    }
    for note in it
        .get("notes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let note = note
            .as_str()
            .map_or_else(|| note.to_string(), ToOwned::to_owned);
        let _ = write!(out, "<p class=\"rlm-note\">{}</p>", escape(&note));
    }
    out.push_str("</details>");
}

/// The `reply` and `block` lines of each iteration, written as it went.
#[derive(Default)]
struct Started {
    /// By iteration, in file order: the reply and the blocks that started.
    iterations: Vec<(u64, Option<Value>, Vec<Value>)>,
}

impl Started {
    fn add(&mut self, line: Value) {
        let n = line.get("iteration").and_then(Value::as_u64).unwrap_or(0);
        let index = match self.iterations.iter().position(|(i, _, _)| *i == n) {
            Some(index) => index,
            None => {
                self.iterations.push((n, None, Vec::new()));
                self.iterations.len() - 1
            }
        };
        let entry = &mut self.iterations[index];
        if line.get("type").and_then(Value::as_str) == Some("reply") {
            entry.1 = Some(line);
        } else {
            entry.2.push(line);
        }
    }

    /// The iterations that started and have no `iteration` record: they did not finish.
    fn unfinished(self, records: &[Value]) -> Vec<(u64, Option<Value>, Vec<Value>)> {
        let recorded = |n: u64| {
            records
                .iter()
                .any(|r| r.get("iteration").and_then(Value::as_u64) == Some(n))
        };
        self.iterations
            .into_iter()
            .filter(|(n, _, _)| !recorded(*n))
            .collect()
    }
}

/// An iteration without its record: its reply and the blocks that started, the last one as
/// the block that was running when the run stopped (`crashed`: the run wrote no result, so
/// that block ended the process, or a kill did).
fn render_unfinished(
    out: &mut String,
    (n, reply, blocks): &(u64, Option<Value>, Vec<Value>),
    crashed: bool,
) {
    let stopped = if crashed {
        "the run stopped in it"
    } else {
        "no record of it was written"
    };
    let _ = write!(
        out,
        "<details class=\"rlm-it rlm-unfinished\" open><summary><b>Iteration {n}</b> · {} block(s) \
         started · <span class=\"rlm-badge rlm-stop\">did not finish</span> · {stopped}</summary>",
        blocks.len()
    );
    if let Some(reply) = reply.as_ref().and_then(|r| text(r, "reply")) {
        let _ = write!(
            out,
            "<h4>Model reply</h4><pre class=\"rlm-reply\">{}</pre>",
            escape(reply)
        );
    }
    for (i, block) in blocks.iter().enumerate() {
        let index = block.get("index").and_then(Value::as_u64).unwrap_or(0);
        let last = i + 1 == blocks.len();
        let (class, badge) = if last && crashed {
            (
                " rlm-crashed",
                " <span class=\"rlm-badge rlm-stop\">crashed</span>",
            )
        } else {
            ("", "")
        };
        let _ = write!(
            out,
            "<div class=\"rlm-block{class}\"><h4>Block {}{badge}</h4>",
            index + 1
        );
        if let Some(code) = text(block, "code") {
            let _ = write!(out, "<pre class=\"rlm-code\">{}</pre>", escape(code));
        }
        if last && crashed {
            out.push_str(
                "<p class=\"rlm-error\">The run stopped while this block was running: it crashed \
                 the process (a fatal signal in C code; exit code 4), or the process was killed. \
                 Its output was never recorded.</p>",
            );
        } else {
            out.push_str("<p class=\"rlm-note\">Its output was never recorded.</p>");
        }
        out.push_str("</div>");
    }
    out.push_str("</details>");
}

fn render_block(out: &mut String, block: &Value) {
    let index = block.get("index").and_then(Value::as_u64).unwrap_or(0);
    let duration = block
        .get("duration_ms")
        .and_then(Value::as_f64)
        .unwrap_or(0.0);
    let calls = |key: &str| block.get(key).and_then(Value::as_u64).unwrap_or(0);
    let _ = write!(
        out,
        "<div class=\"rlm-block\"><h4>Block {} <span class=\"rlm-dim\">{:.0} ms · {} sub-call(s) \
         ({} llm_query, {} llm_query_batched){}{}</span></h4>",
        index + 1,
        duration,
        calls("sub_calls"),
        calls("llm_query_calls"),
        calls("llm_query_batched_calls"),
        sub_call_errors(block),
        if block.get("timed_out").and_then(Value::as_bool) == Some(true) {
            " · timed out"
        } else {
            ""
        }
    );
    if let Some(code) = text(block, "code") {
        let _ = write!(out, "<pre class=\"rlm-code\">{}</pre>", escape(code));
    }
    for (stream, label) in [("stdout", "output"), ("stderr", "stderr")] {
        let Some(body) = text(block, stream).filter(|s| !s.is_empty()) else {
            continue;
        };
        let omitted = block
            .get(format!("{stream}_omitted_chars"))
            .and_then(Value::as_u64)
            .unwrap_or(0);
        let _ = write!(
            out,
            "<div class=\"rlm-label\">{label}{}</div><pre class=\"rlm-{stream}\">{}</pre>",
            if omitted > 0 {
                format!(" ({omitted} characters omitted)")
            } else {
                String::new()
            },
            escape(body)
        );
    }
    if let Some(error) = block.get("error").filter(|e| !e.is_null()) {
        let shown = text(error, "traceback")
            .or_else(|| text(error, "message"))
            .map_or_else(|| error.to_string(), ToOwned::to_owned);
        let _ = write!(out, "<pre class=\"rlm-error\">{}</pre>", escape(&shown));
    }
    render_children(out, block);
    out.push_str("</div>");
}

/// ` · N sub-call error(s)` for an iteration's or a block's `sub_call_errors`, when it has any:
/// the errors its code got instead of answers, a call never sent and a failed `rlm_query`
/// child included, so they are not a part of its sub-calls (nothing for a trajectory written
/// before blocks recorded them).
fn sub_call_errors(record: &Value) -> String {
    match record.get("sub_call_errors").and_then(Value::as_u64) {
        Some(errors) if errors > 0 => {
            format!(" · <span class=\"rlm-status-error\">{errors} sub-call error(s)</span>")
        }
        _ => String::new(),
    }
}

/// The `rlm_query` child runs a block started, each folded: its outcome on one line, its
/// iterations (with their own children) inside.
fn render_children(out: &mut String, block: &Value) {
    let children = block
        .get("children")
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice);
    if children.is_empty() {
        return;
    }
    let _ = write!(
        out,
        "<div class=\"rlm-label\">rlm_query children ({})</div>",
        children.len()
    );
    for child in children {
        let number = |key: &str| child.get(key).and_then(Value::as_u64).unwrap_or(0);
        let reason = text(child, "termination_reason").unwrap_or("?");
        let iterations = child
            .get("iterations")
            .and_then(Value::as_array)
            .map_or(&[][..], Vec::as_slice);
        let outcome = match (text(child, "answer"), reason) {
            (Some(answer), "final_answer" | "max_iterations") => {
                format!("→ {}", escape(&shorten(answer, 80)))
            }
            _ => format!(
                "<span class=\"rlm-status-error\">{}</span>{}",
                escape(reason),
                text(child, "error")
                    .map(|e| format!(": {}", escape(&shorten(e, 120))))
                    .unwrap_or_default()
            ),
        };
        let _ = write!(
            out,
            "<details class=\"rlm-it rlm-child\"><summary><b>Child #{}</b> · depth {} · {} · {} iteration(s) · {outcome}</summary>",
            number("index"),
            number("depth"),
            escape(text(child, "model").unwrap_or("?")),
            iterations.len(),
        );
        if let Some(prompt) = text(child, "prompt") {
            let _ = write!(
                out,
                "<h4>Query</h4><pre class=\"rlm-reply\">{}</pre>",
                escape(prompt)
            );
        }
        for iteration in iterations {
            render_iteration(out, iteration);
        }
        out.push_str("</details>");
    }
}

fn text<'a>(value: &'a Value, key: &str) -> Option<&'a str> {
    value.get(key).and_then(Value::as_str)
}

fn shorten(s: &str, max: usize) -> String {
    let line = s.lines().next().unwrap_or("");
    if line.chars().count() <= max {
        line.to_owned()
    } else {
        let cut: String = line.chars().take(max).collect();
        format!("{cut}…")
    }
}

/// HTML-escapes text for element content and attribute values.
pub(crate) fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const RUN: &str = r#"{"type":"header","version":1,"query":"Count <b>errors</b>","endpoints":[{"name":"root","provider":"openai","model":"m","base_url":"http://127.0.0.1:1/v1"}],"contexts":[{"index":0,"name":"context_0","kind":"table","source":"<python object: df>","rows":3}]}
{"type":"iteration","iteration":1,"reply":"Let me look.\n```repl\nprint(len(context))\n```","blocks":[{"index":0,"code":"print(len(context))","stdout":"3\n","stderr":"","error":null,"duration_ms":1.5,"sub_calls":0}],"sub_calls":[],"execution":{"status":"success"},"model_ms":10.0,"execution_ms":1.5}
{"type":"iteration","iteration":2,"reply":"FINAL(3)","blocks":[],"sub_calls":[],"final_answer_found":true}
{"type":"result","answer":"3 </pre><script>alert(1)</script>","termination_reason":"final_answer","metrics":{"iterations":2,"sub_calls":0}}
{"type":"iter"#;

    #[test]
    fn renders_every_part_and_escapes_model_text() {
        let html = render_trajectory_html(RUN, false).expect("renders");
        assert!(html.starts_with("<!DOCTYPE html>"));
        assert_eq!(html.matches("<details class=\"rlm-it\">").count(), 2);
        assert!(html.contains("Count &lt;b&gt;errors&lt;/b&gt;"));
        assert!(html.contains("print(len(context))"));
        assert!(html.contains("3 &lt;/pre&gt;&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert!(!html.contains("<script>alert(1)"));
        assert!(html.contains("final_answer"));
        assert!(html.contains("Skipped line(s) 5"));
        // Self-contained: nothing is fetched.
        assert!(!html.contains("src=") && !html.contains("href=\"http"));
    }

    #[test]
    fn children_are_folded_nodes_with_their_own_iterations_and_children() {
        let grandchild = r#"{"index":0,"depth":2,"model":"sub","prompt":"inner","answer":null,"termination_reason":"call_budget","error":"Budget <exhausted>","iterations":[]}"#;
        let child = format!(
            r#"{{"index":1,"depth":1,"model":"sub","prompt":"part <1>","answer":"42","termination_reason":"final_answer","iterations":[{{"iteration":1,"reply":"child reply","blocks":[{{"index":0,"code":"rlm_query('inner')","stdout":"","stderr":"","children":[{grandchild}]}}],"sub_calls":[]}}]}}"#
        );
        let run = format!(
            "{{\"type\":\"header\",\"query\":\"q\"}}\n{{\"type\":\"iteration\",\"iteration\":1,\"reply\":\"r\",\"blocks\":[{{\"index\":0,\"code\":\"x\",\"stdout\":\"\",\"stderr\":\"\",\"children\":[{child}]}}],\"sub_calls\":[]}}\n"
        );
        let html = render_trajectory_html(&run, false).expect("renders");
        assert_eq!(
            html.matches("class=\"rlm-it rlm-child\"").count(),
            2,
            "{html}"
        );
        assert!(html.contains("<b>Child #1</b> · depth 1 · sub · 1 iteration(s) · → 42"));
        assert!(html.contains("part &lt;1&gt;"));
        assert!(
            html.contains("child reply"),
            "a child's iterations are inside its node"
        );
        assert!(html.contains("<b>Child #0</b> · depth 2"));
        assert!(html.contains("call_budget</span>: Budget &lt;exhausted&gt;"));
    }

    #[test]
    fn sub_call_errors_are_shown_apart_from_the_sub_calls_they_can_outnumber() {
        // Three calls to a model name with no endpoint (never sent), one refused, one answered.
        let run = r#"{"type":"header","query":"q"}
{"type":"result","answer":"a","termination_reason":"final_answer","metrics":{"sub_calls":2,"sub_call_errors":4}}"#;
        let html = render_trajectory_html(run, false).expect("renders");
        assert!(
            html.contains("<span><i>sub-calls</i> 2</span><span><i>sub-call errors</i> 4</span>"),
            "{html}"
        );
    }

    #[test]
    fn a_blocks_sub_call_errors_are_shown_on_it_and_its_iteration_only_when_it_has_some() {
        // Block 1: a call with no endpoint and a batch of 2 refused (never sent), one answered;
        // block 2 clean; block 3 from a trajectory written before blocks recorded them.
        let run = r#"{"type":"header","query":"q"}
{"type":"iteration","iteration":1,"reply":"r","sub_call_errors":3,"blocks":[{"index":0,"code":"a","stdout":"","stderr":"","sub_calls":3,"llm_query_calls":2,"llm_query_batched_calls":1,"sub_call_errors":3},{"index":1,"code":"b","stdout":"","stderr":"","sub_calls":1,"llm_query_calls":1,"sub_call_errors":0},{"index":2,"code":"c","stdout":"","stderr":"","sub_calls":1,"llm_query_calls":1}],"sub_calls":[]}
{"type":"iteration","iteration":2,"reply":"FINAL(x)","sub_call_errors":0,"blocks":[],"sub_calls":[]}"#;
        let html = render_trajectory_html(run, false).expect("renders");
        let errors = " · <span class=\"rlm-status-error\">3 sub-call error(s)</span>";
        assert!(
            html.contains(&format!(
                "<b>Iteration 1</b> · 3 block(s) · 0 sub-call(s){errors} · model"
            )),
            "{html}"
        );
        assert!(
            html.contains(&format!(
                "0 ms · 3 sub-call(s) (2 llm_query, 1 llm_query_batched){errors}</span></h4>"
            )),
            "{html}"
        );
        assert!(
            html.contains("0 ms · 1 sub-call(s) (1 llm_query, 0 llm_query_batched)</span></h4>")
        );
        assert_eq!(html.matches("sub-call error(s)").count(), 2, "{html}");
        assert!(html.contains("<b>Iteration 2</b> · 0 block(s) · 0 sub-call(s) · model"));
    }

    #[test]
    fn collapsed_view_is_a_fragment_in_one_details() {
        let html = render_trajectory_html(RUN, true).expect("renders");
        assert!(html.starts_with("<div class=\"rlm-view\""));
        assert!(html.contains("<details class=\"rlm-all\"><summary>Trajectory: 2 iteration(s)"));
        assert!(!html.contains("<html"));
    }

    /// What a run writes: a `reply` and a `block` line before each iteration's record.
    const WRITTEN: &str = r#"{"type":"header","version":1,"query":"q"}
{"type":"reply","iteration":1,"reply":"```repl\nx = 1\n```"}
{"type":"block","iteration":1,"index":0,"code":"x = 1"}
{"type":"iteration","iteration":1,"reply":"```repl\nx = 1\n```","blocks":[{"index":0,"code":"x = 1","stdout":"","stderr":"","error":null,"duration_ms":1.0,"sub_calls":0}],"sub_calls":[]}
{"type":"reply","iteration":2,"reply":"Reading memory.\n```repl\nimport ctypes\n```\n```repl\nctypes.string_at(0)\n```"}
{"type":"block","iteration":2,"index":0,"code":"import ctypes"}
{"type":"block","iteration":2,"index":1,"code":"ctypes.string_at(0)"}"#;

    #[test]
    fn reply_and_block_lines_are_read_and_a_crashed_runs_last_block_is_shown_as_the_crash() {
        let html = render_trajectory_html(WRITTEN, false).expect("renders");
        assert!(!html.contains("Skipped line"), "{html}");
        assert_eq!(html.matches("<details class=\"rlm-it\">").count(), 1);
        assert!(html.contains("<h2>Iterations (2)</h2>"));
        let unfinished = &html[html
            .find("rlm-unfinished")
            .expect("the unfinished iteration")..];
        assert!(unfinished.contains("<b>Iteration 2</b> · 2 block(s) started"));
        assert!(unfinished.contains("Reading memory."));
        let first = unfinished.find("import ctypes").expect("block 1");
        let crashed = unfinished
            .find("rlm-block rlm-crashed")
            .expect("the crashed block");
        assert!(first < crashed, "the first block ran before the crash");
        assert!(unfinished[crashed..].contains("ctypes.string_at(0)"));
        assert!(unfinished[crashed..].contains("The run stopped while this block was running"));
        assert_eq!(html.matches("rlm-block rlm-crashed").count(), 1);
        // With a result line the run ended on its own: no block is called a crash.
        let ended = format!(
            "{WRITTEN}\n{}",
            r#"{"type":"result","answer":null,"termination_reason":"timeout","metrics":{"cost_usd":null}}"#
        );
        let html = render_trajectory_html(&ended, false).expect("renders");
        assert!(html.contains("rlm-unfinished") && !html.contains("rlm-block rlm-crashed"));
        assert!(html.contains("<i>cost</i> no price given"), "{html}");
        assert!(!html.contains("$0.0000"));
    }

    #[test]
    fn a_cost_is_shown_in_dollars_only_with_a_price() {
        let result = |cost: &str| {
            format!(
                r#"{{"type":"result","answer":"a","termination_reason":"final_answer","metrics":{{"cost_usd":{cost}}}}}"#
            )
        };
        for (cost, shown) in [
            ("null", "no price given"),
            ("0.0", "$0.0000"),
            ("0.01234", "$0.0123"),
        ] {
            let html = render_trajectory_html(&result(cost), false).expect("renders");
            assert!(html.contains(&format!("<i>cost</i> {shown}")), "{cost}");
        }
        let missing =
            r#"{"type":"result","answer":"a","termination_reason":"final_answer","metrics":{}}"#;
        let html = render_trajectory_html(missing, false).expect("renders");
        assert!(html.contains("<i>cost</i> no price given"));
    }

    #[test]
    fn refuses_input_that_is_not_a_trajectory() {
        let err = render_trajectory_html("hello\n{\"a\": 1}\n", false).expect_err("not a run");
        assert!(matches!(err, ViewError::NotATrajectory));
    }
}
