//! The mock LM server: a real HTTP server on 127.0.0.1 that speaks the OpenAI chat-completions
//! and Anthropic Messages APIs, answers from a script, and injects latency and faults on demand.
//! Tests, benchmarks and `rlm demo` start it in-process; `rlm mock-lm` serves it in the
//! foreground.
//!
//! # Pieces and data flow
//!
//! - [`MockServer`] (`server.rs`): axum on the caller's tokio runtime. Routes
//!   `POST /v1/chat/completions` (JSON, or SSE with `"stream": true`), `POST /v1/messages`
//!   (JSON or SSE) and `GET /v1/models`; anything else gets a provider-shaped 404.
//! - For each chat request: auth check (only when [`MockConfig::api_key`] is set) → parse the
//!   body into a private view (`request.rs`; what scripts see of it is a `prompt.rs` `Prompt`:
//!   model, system prompt, last user message, last tool result and its tool's name, TURN) →
//!   tool-traffic checks (`validate.rs`, see *Validation*) → fault decision (`faults.rs`) →
//!   the latency drawn (`latency.rs`) and waited until its deadline (`timer.rs`, see
//!   *Latency*) → the [`Script`] picks and renders a reply
//!   (`script.rs`, `template.rs`) → rendered in the provider's format (`wire.rs`) → one
//!   [`RequestRecord`] is pushed to the [`RequestLog`] (with the request's headers and whole
//!   body when [`MockConfig::record_requests`] is on: tests check what a client sent).
//! - A request whose client leaves early (timeout) is still logged, with status `499`.
//! - All per-request randomness comes from a generator (`rand`'s `StdRng`, `rng.rs`) keyed by
//!   `(MockConfig::seed, request id)`; ids count arrivals from 0, so a sequential client sees
//!   the same latencies and faults on every run.
//! - With a [`MockConfig::capacity`], a chat request beyond it is answered 429 right after
//!   parsing (see Capacity below).
//!
//! # Example
//!
//! ```
//! use bridge::mock::{MockConfig, MockServer, Script};
//! use serde_json::{Value, json};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let script = Script::from_json_str(r#"{"models": {"*": {"replies": ["hello", "FINAL(42)"]}}}"#)?;
//! let server = MockServer::start(MockConfig { script, ..MockConfig::default() }).await?;
//!
//! let url = format!("{}/chat/completions", server.openai_base_url());
//! let request = json!({"model": "root", "messages": [{"role": "user", "content": "hi"}]});
//! let client = reqwest::Client::builder().no_proxy().build()?;
//! let reply: Value = client.post(&url).json(&request).send().await?.json().await?;
//! assert_eq!(reply["choices"][0]["message"]["content"], "hello"); // TURN 0
//!
//! assert_eq!(server.log().entries()[0].model, "root");
//! server.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! # Script format (JSON)
//!
//! ```json
//! {
//!   "description": "optional, ignored",
//!   "models": {
//!     "root": {
//!       "replies": ["turn 0 reply", "turn 1 reply", "FINAL(42)"],
//!       "fallback": {"behaviour": "echo"},
//!       "latency": {"kind": "fixed", "ms": 20}
//!     },
//!     "sub": {
//!       "rules": [
//!         {"last_user": "(?s)^Count (?P<word>\\w+) in:\\n(?P<body>.*)$",
//!          "reply": {"behaviour": "count_word", "word": "{{word}}", "input": "{{body}}"}},
//!         {"system": "terse", "model": "^sub$", "turn": 0, "reply": "ok"}
//!       ]
//!     },
//!     "*": {"replies": [{"behaviour": "echo"}]}
//!   }
//! }
//! ```
//!
//! A full sample lives in [`SAMPLE_SCRIPT`] (`bridge/src/mock/scripts/sample.json`).
//!
//! **Model selection**: the request's `model` names an entry; unknown names use `"*"`; with no
//! `"*"` the server echoes the last user message.
//!
//! **Reply selection** inside an entry, first that applies:
//! 1. `rules`, in order, first match wins. A rule matches when every condition it has holds:
//!    `last_user` (regex over the last user message), `last_tool` (regex over the content of
//!    the most recent tool result in the request: an OpenAI `role: tool` message or an
//!    Anthropic `tool_result` block), `tool_name` (regex over the name of the tool that result
//!    answers, looked up by call id), `system` (regex over the system prompt), `model` (regex
//!    over the requested model name), `turn` (exact TURN). A rule with `last_tool` or
//!    `tool_name` never matches a request without tool results. Regexes use the `regex` crate
//!    syntax: `.` does not cross newlines unless you write `(?s)`.
//! 2. `replies[TURN]`, where TURN = the number of assistant messages in the request. Stateless,
//!    so it is deterministic under any concurrency and for retries. An assistant message that
//!    only calls tools counts like any other, so a tool round is one TURN: `replies[0]` calls
//!    tools, `replies[1]` answers their results, and so on. The last user message is the last
//!    user message with text: an Anthropic user message holding only `tool_result` blocks is
//!    a tool result, not a user turn.
//! 3. past the end of `replies`: `fallback` if given, else the last reply.
//! 4. nothing at all: echo.
//!
//! **A reply** is a string (a template, see below) or an object:
//! - `{"text": "..."}` or `{"behaviour": "fixed", "text": "..."}`: the template.
//! - `{"behaviour": "echo"}`: the last user message (or the `input` template).
//! - `{"behaviour": "count_word", "word": "ERROR"}`: the number of non-overlapping,
//!   case-sensitive occurrences of `word` in the last user message (or in `input`), as decimal
//!   text only. `"whole_word": true` counts only occurrences not touching a letter, digit or `_`.
//! - `{"behaviour": "label", "table": [{"keyword": "disk", "label": "storage"}, ["timeout",
//!   "network"]], "default": "other"}`: the label of the first table entry (in table order) whose
//!   keyword occurs in the last user message (or `input`), else `default` (default
//!   `"unknown"`). `"case_insensitive": true` lower-cases both sides. `"per_line": true` labels
//!   each non-empty line instead, one label a line (a classifier over a chunk of entries).
//! - `{"behaviour": "extract", "pattern": "code for {{key}} is: (\\d+)", "default": "NONE"}`:
//!   the first match of the regex `pattern` in the last user message (or `input`): its group 1,
//!   else the whole match; `default` (default empty) when nothing matches. `pattern` is a
//!   template whose substituted values are regex-escaped, so a rule can look up what its
//!   question names.
//! - `{"tool_call": {"name": "python", "arguments": {"code": "1+1"}}}` (or `"tool_calls": [..]`
//!   for parallel calls), optionally with `text`: rendered as OpenAI `tool_calls` (ids
//!   `call_{TURN}_{i}`, `finish_reason: "tool_calls"`) or Anthropic `tool_use` blocks (ids
//!   `toolu_{TURN}_{i}`, `stop_reason: "tool_use"`). String values anywhere in `arguments`
//!   are templates. Under `tool_choice: none` the calls are dropped; with parallel calls
//!   switched off (`parallel_tool_calls: false`, `disable_parallel_tool_use: true`) only the
//!   first is kept, as a real model would. `required` and a named tool are checked, not
//!   enforced: the script decides what the model says.
//! - `"finish_reason"` overrides the finish/stop reason; OpenAI and Anthropic names are mapped
//!   (`stop`↔`end_turn`, `length`↔`max_tokens`, `tool_calls`↔`tool_use`).
//! - `word`, `input`, `pattern` and `default` are templates too; `behaviour` may be spelled `behavior`.
//!
//! **Templates** replace `{{last_user}}`, `{{last_tool}}`, `{{tool_name}}`, `{{system}}`,
//! `{{model}}`, `{{turn}}`, and, in a rule's reply, `{{N}}` (numbered group of the rule's
//! first regex among `last_user`, `last_tool`, `system`) and `{{name}}` (named group of any
//! of them). A group that did not participate renders empty. A placeholder naming nothing
//! known stays verbatim, so code such as `f"{{x}}"` survives.
//!
//! **Context window** per model: `"context_window": 8192` makes `GET /v1/models` list the
//! model with `"max_model_len": 8192`, as vLLM does (the bridge's context-window check reads
//! it).
//!
//! **Latency** per model: `"latency"` takes the same JSON as [`Latency`] and overrides the
//! server-wide setting for that model. `GET /v1/models` takes the server-wide latency, as a
//! real server's round trip: concurrent requests overlap, each on a connection of its own.
//! How it is waited: *Latency*, below.
//!
//! # Responses
//!
//! Usage is a deterministic estimate: tokens = UTF-8 bytes / 4, rounded up; prompt tokens count
//! the system prompt plus every message's text, completion tokens the reply text plus tool
//! names and argument JSON. Ids are `chatcmpl-mock-{id}` / `msg_mock_{id}` with the request
//! id, also sent as the `x-mock-request-id` header. `max_tokens` and sampling parameters are
//! accepted and ignored (Anthropic requests must still carry `max_tokens`, as with the real
//! API). Streams split the reply into at most ~256 deltas whose concatenation is the reply.
//! Tool calls stream the way real servers send them, and harder: each call's arguments come
//! in up to four pieces, and the pieces of parallel calls are interleaved (OpenAI: deltas
//! keyed by `index`; Anthropic: every `tool_use` block opens first, then `input_json_delta`s
//! alternate between block indices), so a client must assemble them by index.
//!
//! # Validation
//!
//! Besides the required fields (`model`, `messages`, Anthropic's `max_tokens`), tool traffic
//! is checked as the real APIs check it, with a 400 `invalid_request_error` in the
//! provider's shape: a tool result whose call id matches no unanswered call of the assistant
//! message before it; a tool call not answered before the next user or assistant turn or the
//! end of the conversation (Anthropic: in the very next user message); a tool name not
//! matching `[a-zA-Z0-9_-]{1,64}` or defined twice; parameters that are not an object schema;
//! an unknown `tool_choice` or one naming no tool; OpenAI `tool_choice` or
//! `parallel_tool_calls` without `tools`.
//!
//! # Capacity
//!
//! [`MockConfig::capacity`] (`rlm mock-lm --capacity N`) makes the server behave like a
//! rate-limited API: it serves at most N chat requests at once, and answers one more at once
//! with `429 Too Many Requests` and `Retry-After` ([`Faults::retry_after`], 1 s by default),
//! before any latency or fault. (It does not queue: a server that queues shows its limit as
//! rising latency, which [`Latency`] alone cannot model.) Benchmarks of adaptive fan-out run
//! against it.
//!
//! # Latency
//!
//! A request's latency is drawn once its body is parsed (the script may set it per model) and
//! counts from its arrival, when its headers were read: its deadline is the arrival plus the
//! latency, so the time its body took to come and be checked is part of the latency, not added
//! to it (a `hang` fault adds [`Faults::hang`] to that deadline). No response leaves before its
//! deadline ([`RequestRecord::latency`] is what was drawn), and it leaves as soon after it as
//! the kernel wakes the server: the server keeps its waiting requests by deadline and one timer
//! in the kernel armed for the earliest (`timer.rs`: a `timerfd` on the runtime's reactor), not
//! tokio's timer, whose 1 ms tick and whole-millisecond `epoll_wait` answered a 50 ms latency
//! 1–3 ms late, by where in a millisecond the request arrived (the figures: the bench guide,
//! *The mock's latency, exact*). A server that could not make its timer when it started (no
//! file descriptor left) waits on tokio's timer instead (logged then; every such wait is
//! counted: [`MockServer::timer_fallbacks`]). Shutdown ends every wait at once (503). A kernel
//! timer keeps real time: under tokio's paused clock (`start_paused`) the mock's latency is
//! waited for real.
//!
//! # Faults
//!
//! See [`Faults`] and [`FaultKind`]: deterministic rules (`fail_first`, regex over the last
//! user message, optional `times` limit) are checked first, then the random `rate`. Faults
//! apply to chat requests only, after the latency.

mod config;
mod error;
mod faults;
mod latency;
mod log;
mod prompt;
mod request;
mod rng;
mod script;
mod server;
mod template;
mod timer;
mod validate;
mod wire;

pub use config::{FaultKind, FaultRule, Faults, MockConfig, MockOptions};
pub use error::MockError;
pub use latency::Latency;
pub use log::{RequestLog, RequestRecord};
pub use script::Script;
pub use server::MockServer;

/// A sample script exercising every feature (`bridge/src/mock/scripts/sample.json`).
pub const SAMPLE_SCRIPT: &str = include_str!("scripts/sample.json");
