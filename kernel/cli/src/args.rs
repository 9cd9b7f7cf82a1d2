//! Command-line arguments.
//!
//! Every `rlm run` option is an `Option` so that a value can come, in order of precedence,
//! from a flag, from its environment variable (clap's `env`), from `rlm.toml`, or from the
//! built-in default. [`RunOptions`] is both the clap argument group and the serde shape of
//! the `[run]` table in `rlm.toml`, so the two cannot drift apart.

use std::path::PathBuf;

use std::str::FromStr;

use bridge::{Concurrency, Provider};
use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use clap::{Args, Parser, Subcommand};
use kernel::repl::SubCallErrorMode;
use kernel::rlm::{CodeAndFinal, Protocol};
use serde::Deserialize;

use crate::contexts::ContextArgs;

/// `rlm`: a Recursive Language Model runtime.
#[derive(Debug, Parser)]
#[command(
    name = "rlm",
    version,
    about = "Recursive Language Model runtime: a root model, a Python REPL holding a huge context, and sub-models",
    long_about = None,
)]
pub(crate) struct Cli {
    /// Configuration file (default: `./rlm.toml` when it exists).
    #[arg(long, global = true, env = "RLM_CONFIG", value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,

    /// More output on stderr: `-v` shows the run's trace (as `--trace`) and info logs (retries,
    /// interrupts), `-vv` debug logs. `RUST_LOG` sets the log filter itself.
    #[arg(long, short = 'v', global = true, action = clap::ArgAction::Count)]
    pub(crate) verbose: u8,

    #[command(subcommand)]
    pub(crate) command: Command,
}

/// Every exit code of `rlm run`, one cause each (also in the README).
const EXIT_CODES: &str = "\
Exit codes:
  0    the model gave a final answer
  1    an error: bad input, an unreachable endpoint, a failed run
  2    a usage error: a bad option or argument
  3    a limit stopped the run (iterations, time, budget, repeated failures); a partial
       answer may still be printed
  4    the process crashed in a cell (a fatal signal in C code, e.g. a segfault); one line
       on stderr and the trajectory's last line name the block
  101  a bug in rlm (a panic)
  130  Ctrl-C stopped the run (its best answer printed, the trajectory closed)
A SIGKILL (e.g. the OOM killer) leaves no code of rlm's own (shells show 137); the
trajectory's last line still names the block that was running.";

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Answer a query over one or more contexts with the RLM loop.
    #[command(allow_negative_numbers = true, after_help = EXIT_CODES)]
    Run(Box<RunArgs>),
    /// Ask one question after another about contexts loaded once; each question runs in the
    /// same Python session, so variables made for one are there for the next.
    #[command(allow_negative_numbers = true)]
    Chat(Box<ChatArgs>),
    /// Talk with a persona agent of an agent bundle (`agents/NAME.md`): it loads its files
    /// through tools, only when a command needs them.
    #[command(allow_negative_numbers = true)]
    Agent(Box<crate::agent::AgentArgs>),
    /// Run a complete RLM analysis on generated logs against scripted mock models (no API key needed).
    #[command(allow_negative_numbers = true)]
    Demo(Box<DemoArgs>),
    /// Measure sub-call throughput of an endpoint (or the built-in mock) over a sweep of widths.
    #[command(allow_negative_numbers = true)]
    Bench(Box<crate::bench::BenchArgs>),
    /// Score RLM runs on generated long-context tasks (needle, aggregate, pairs) at chosen
    /// context sizes, optionally against the model with the context in its prompt.
    #[command(allow_negative_numbers = true)]
    Eval(Box<crate::eval::EvalArgs>),
    /// Serve the mock LM server (OpenAI and Anthropic wire formats) on 127.0.0.1.
    MockLm(MockLmArgs),
    /// Print a saved trajectory (`--trajectory FILE`) as the readable trace `--trace` shows.
    Show(ShowArgs),
    /// Render a trajectory (`--trajectory` JSONL) or a workflow's event log as one
    /// self-contained HTML page.
    View(ViewArgs),
    /// Workflows of agents from YAML files: run, list the built-ins, draw as Mermaid.
    #[command(after_help = EXIT_CODES)]
    Flow(crate::flow::FlowArgs),
}

/// Arguments of `rlm show`.
#[derive(Debug, Args)]
pub(crate) struct ShowArgs {
    /// The trajectory file (JSONL) written by `rlm run --trajectory`.
    #[arg(value_name = "FILE")]
    pub(crate) trajectory: PathBuf,
}

/// Arguments of `rlm view`.
#[derive(Debug, Args)]
pub(crate) struct ViewArgs {
    /// The trajectory file written by `rlm run --trajectory`.
    #[arg(value_name = "TRAJECTORY")]
    pub(crate) trajectory: PathBuf,

    /// Where to write the page (default: the trajectory's path with `.html`).
    #[arg(long, short = 'o', value_name = "FILE")]
    pub(crate) output: Option<PathBuf>,
}

/// Arguments of `rlm run`.
#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    #[command(flatten)]
    pub(crate) context: ContextArgs,

    /// The question to answer about the context.
    #[arg(long, short = 'q')]
    pub(crate) query: String,

    /// Load the contexts and print the exact first request to the root model (system prompt,
    /// context description, query), then stop: no model is called.
    #[arg(long)]
    pub(crate) dry_run: bool,

    #[command(flatten)]
    pub(crate) options: RunOptions,
}

/// Arguments of `rlm chat`.
#[derive(Debug, Args)]
pub(crate) struct ChatArgs {
    // Loaded once; `-` is refused (questions come from standard input).
    #[command(flatten)]
    pub(crate) context: ContextArgs,

    /// Characters of the summary of earlier questions and answers the root model sees with
    /// each new question (the most recent that fit; 0 for none) [default: 4000].
    #[arg(long, value_name = "CHARS", value_parser = at_least::<usize>(0))]
    pub(crate) summary_chars: Option<usize>,

    #[command(flatten)]
    pub(crate) options: RunOptions,
}

/// Options shared by `rlm run` and `rlm demo`, also readable from the `[run]` table of `rlm.toml`.
#[derive(Debug, Default, Clone, Args, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct RunOptions {
    /// Root model name.
    #[arg(long, env = "RLM_MODEL")]
    pub(crate) model: Option<String>,

    /// Sub-model name for `llm_query` (default: the root model).
    #[arg(long, env = "RLM_SUB_MODEL")]
    pub(crate) sub_model: Option<String>,

    /// Base URL of the root model's API (OpenAI: including `/v1`).
    #[arg(long, env = "RLM_BASE_URL", value_name = "URL")]
    pub(crate) base_url: Option<String>,

    /// Base URL of the sub-model's API (default: `--base-url`).
    #[arg(long, env = "RLM_SUB_BASE_URL", value_name = "URL")]
    pub(crate) sub_base_url: Option<String>,

    /// Another sub-model the code may pick with `llm_query(..., model="NAME")`, as
    /// `NAME=MODEL` or `NAME=MODEL@BASE_URL` (default URL: the sub-model's). Repeatable.
    #[arg(long = "extra-model", value_name = "NAME=MODEL[@URL]")]
    #[serde(default, rename = "extra-models")]
    pub(crate) extra_models: Vec<String>,

    /// Wire format of the model API.
    #[arg(long, env = "RLM_PROVIDER", value_parser = library_enum::<Provider>([
        PossibleValue::new("openai").help("OpenAI-compatible chat completions (OpenAI, vLLM, SGLang, llama.cpp, Ollama, OpenRouter)"),
        PossibleValue::new("anthropic").help("Anthropic Messages API"),
    ]))]
    pub(crate) provider: Option<Provider>,

    /// Environment variable holding the API key (default: `OPENAI_API_KEY` or `ANTHROPIC_API_KEY`).
    /// Like every `*_API_KEY` variable, it is removed from the environment before the model's
    /// code runs.
    #[arg(long, env = "RLM_API_KEY_ENV", value_name = "VAR")]
    pub(crate) api_key_env: Option<String>,

    /// An environment variable whose value is secret: the code may still read it, but it is
    /// `[redacted]` in every output (what the model reads, the trajectory, `--json`, stderr).
    /// Repeatable.
    #[arg(long = "secret", value_name = "VAR")]
    #[serde(default)]
    pub(crate) secrets: Vec<String>,

    /// Most tokens one model reply may have (sent as `max_tokens`; default: the server's).
    #[arg(long, env = "RLM_MAX_OUTPUT_TOKENS", value_parser = at_least::<u32>(1))]
    pub(crate) max_output_tokens: Option<u32>,

    /// Sampling temperature of every model call (default: the server's).
    #[arg(long, env = "RLM_TEMPERATURE")]
    pub(crate) temperature: Option<f32>,

    /// Maximum root-model iterations before a last "answer now" call [default: 30].
    #[arg(long, env = "RLM_MAX_ITERATIONS", value_parser = at_least::<u32>(1))]
    pub(crate) max_iterations: Option<u32>,

    /// Wall-clock limit for the whole run, in seconds.
    #[arg(long, env = "RLM_TIMEOUT", value_name = "SECONDS")]
    pub(crate) timeout: Option<f64>,

    /// Wall-clock limit for one code block, in seconds [default: 120].
    #[arg(long, env = "RLM_CELL_TIMEOUT", value_name = "SECONDS")]
    pub(crate) cell_timeout: Option<f64>,

    /// Timeout of one sub-model HTTP attempt, in seconds [default: 300].
    #[arg(long, env = "RLM_SUB_TIMEOUT", value_name = "SECONDS")]
    pub(crate) sub_timeout: Option<f64>,

    /// Budget: the most sub-model calls the run may make.
    #[arg(long, env = "RLM_MAX_SUB_CALLS", value_parser = at_least::<u64>(0))]
    pub(crate) max_sub_calls: Option<u64>,

    /// Budget: the most tokens (prompt + completion, all models) the run may use.
    #[arg(long, env = "RLM_MAX_TOKENS", value_parser = at_least::<u64>(1))]
    pub(crate) max_tokens: Option<u64>,

    /// Budget: the most USD the run may spend (needs prices).
    #[arg(long, env = "RLM_MAX_USD")]
    pub(crate) max_usd: Option<f64>,

    /// Price of the root model, USD per million tokens, as `INPUT:OUTPUT`.
    #[arg(long, env = "RLM_PRICE", value_name = "IN:OUT")]
    pub(crate) price: Option<String>,

    /// Price of the sub-model, USD per million tokens, as `INPUT:OUTPUT` (default: `--price`).
    #[arg(long, env = "RLM_SUB_PRICE", value_name = "IN:OUT")]
    pub(crate) sub_price: Option<String>,

    /// Sub-model requests in flight at once (for `llm_query_batched` and across threads), or
    /// `auto`: a limit that grows while latency stays flat and backs off on 429s, timeouts and
    /// rising latency, up to 256 [default: 128].
    #[arg(long, env = "RLM_BATCH_CONCURRENCY", value_name = "N|auto", value_parser = concurrency)]
    pub(crate) batch_concurrency: Option<Concurrency>,

    /// What a failed sub-call gives the code: an `"Error: ..."` string, or a raised `LlmQueryError`.
    #[arg(long, env = "RLM_SUB_CALL_ERRORS", value_parser = library_enum::<SubCallErrorMode>([
        PossibleValue::new("string").help("Return `\"Error: <reason>\"` in the reply's place"),
        PossibleValue::new("raise").help("Raise `LlmQueryError`"),
    ]))]
    pub(crate) sub_call_errors: Option<SubCallErrorMode>,

    /// Characters of each sub-call's prompt and of its reply kept in the trajectory (head and
    /// tail; 0 keeps none) [default: 600].
    #[arg(long, env = "RLM_SUB_CALL_TEXT_CHARS", value_name = "CHARS", value_parser = at_least::<usize>(0))]
    pub(crate) sub_call_text_chars: Option<usize>,

    /// Which final-answer conventions count.
    #[arg(long, env = "RLM_PROTOCOL", value_parser = library_enum::<Protocol>([
        PossibleValue::new("auto").help("All conventions: the `answer` dict, `FINAL_VAR(...)` and `FINAL(...)`"),
        PossibleValue::new("final").help("Only `FINAL(...)` / `FINAL_VAR(...)` (reply lines and in-code `FINAL_VAR`)"),
        PossibleValue::new("answer").help("Only the `answer` dict (`answer[\"ready\"] = True`)"),
    ]))]
    pub(crate) protocol: Option<Protocol>,

    /// A reply with both code and a `FINAL`/`FINAL_VAR` line: run the code, then accept the line
    /// unless a block raised (the default), always wait until the model has seen the output and
    /// confirms, or accept it even after an error.
    #[arg(long, env = "RLM_CODE_AND_FINAL", value_parser = library_enum::<CodeAndFinal>([
        PossibleValue::new("accept-unless-error").help("Run the code, then accept the final line unless a block raised [default]"),
        PossibleValue::new("see-output-first").alias("see-output").help("Run the code, show its output, and let the model confirm its answer"),
        PossibleValue::new("accept").help("Run the code, then accept the final line even when a block raised"),
    ]))]
    pub(crate) code_and_final: Option<CodeAndFinal>,

    /// Characters of output shown to the root model per code block (head and tail kept) [default: 20000].
    #[arg(long, env = "RLM_OUTPUT_LIMIT", value_name = "CHARS", value_parser = at_least::<usize>(1))]
    pub(crate) output_limit: Option<usize>,

    /// Keep the conversation sent to the root model under this many characters by eliding the
    /// oldest block outputs (the model's replies and the last two outputs are always kept)
    /// [default: no limit].
    #[arg(long, env = "RLM_MAX_HISTORY_CHARS", value_name = "CHARS", value_parser = at_least::<usize>(1))]
    pub(crate) max_history_chars: Option<usize>,

    /// Stop after this many iterations in a row whose code failed [default: 5].
    #[arg(long, env = "RLM_MAX_CONSECUTIVE_FAILURES", value_parser = at_least::<u32>(0))]
    pub(crate) max_consecutive_failures: Option<u32>,

    /// Append the text of FILE to the system prompt (domain instructions).
    #[arg(long, value_name = "FILE")]
    pub(crate) prompt_extension: Option<PathBuf>,

    /// Replace the system prompt with the text of FILE.
    #[arg(long, value_name = "FILE")]
    pub(crate) system_prompt: Option<PathBuf>,

    /// Write the trajectory (JSONL, one line per iteration) to FILE.
    #[arg(long, value_name = "FILE")]
    pub(crate) trajectory: Option<PathBuf>,

    /// Write the exact final answer to FILE.
    #[arg(long, value_name = "FILE")]
    pub(crate) answer_file: Option<PathBuf>,

    /// Print the whole result with metrics as JSON on stdout (`--json=false` overrides rlm.toml).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub(crate) json: Option<bool>,

    /// No progress line and no closing summary on stderr; errors still print (`--quiet=false`
    /// overrides rlm.toml).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub(crate) quiet: Option<bool>,

    /// Print the run as it goes on stderr: the model's text, each block's code and output,
    /// sub-calls, the answer (as `rlm demo` does; `-v` also turns it on).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub(crate) trace: Option<bool>,

    /// Overwrite an existing `--trajectory` file (outputs that are inputs are refused even so).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub(crate) force: Option<bool>,
}

impl RunOptions {
    /// `--json`, off unless set.
    pub(crate) fn json(&self) -> bool {
        self.json.unwrap_or(false)
    }

    /// `--quiet`, off unless set.
    pub(crate) fn quiet(&self) -> bool {
        self.quiet.unwrap_or(false)
    }

    /// `--trace`, off unless set.
    pub(crate) fn trace(&self) -> bool {
        self.trace.unwrap_or(false)
    }

    /// `--force`, off unless set.
    pub(crate) fn force(&self) -> bool {
        self.force.unwrap_or(false)
    }
}

/// A whole number of at least `min`. With negative numbers allowed as values, `-1` gets
/// "must be ≥ 1, got -1" instead of clap's "unexpected argument '-1'".
fn at_least<T>(min: i64) -> impl Fn(&str) -> Result<T, String> + Clone + Send + Sync + 'static
where
    T: TryFrom<i64> + Clone + Send + Sync + 'static,
{
    move |text| {
        let n: i64 = text
            .trim()
            .parse()
            .map_err(|_| format!("must be a whole number ≥ {min}, got `{text}`"))?;
        if n < min {
            return Err(format!("must be ≥ {min}, got {n}"));
        }
        T::try_from(n).map_err(|_| format!("must be at most {}, got {n}", i64::MAX))
    }
}

/// `--batch-concurrency`: a whole number ≥ 1 or `auto`.
fn concurrency(text: &str) -> Result<Concurrency, bridge::InvalidConcurrency> {
    text.parse()
}

/// A parser for one of the library's own enums: clap checks the spelling against `values` (and
/// lists them in `--help`), the type's `FromStr` makes the value. `rlm.toml` reads the same
/// spellings through the type's serde aliases.
fn library_enum<T>(
    values: impl IntoIterator<Item = PossibleValue>,
) -> impl TypedValueParser<Value = T>
where
    T: FromStr + Clone + Send + Sync + 'static,
    T::Err: std::error::Error + Send + Sync + 'static,
{
    PossibleValuesParser::new(values).try_map(|name| name.parse::<T>())
}

/// Arguments of `rlm demo`.
#[derive(Debug, Args)]
pub(crate) struct DemoArgs {
    /// Size of the generated log context in MB.
    #[arg(long, default_value_t = 4.0, value_name = "MB")]
    pub(crate) size_mb: f64,

    /// Seed of the generated logs.
    #[arg(long, default_value_t = 7)]
    pub(crate) seed: u64,

    /// Keep the generated context at PATH instead of a temporary file.
    #[arg(long, value_name = "PATH")]
    pub(crate) keep_context: Option<PathBuf>,

    /// Model options; with `--base-url` and `--model` the demo runs against a real endpoint.
    #[command(flatten)]
    pub(crate) options: RunOptions,
}

/// Arguments of `rlm mock-lm`.
#[derive(Debug, Args)]
pub(crate) struct MockLmArgs {
    /// Port on 127.0.0.1 (0 picks a free one).
    #[arg(long, default_value_t = 8000)]
    pub(crate) port: u16,

    /// Script file (JSON) describing the models' behaviour (default: echo every prompt):
    /// replies by turn, regex rules (also on the last tool result), tool calls; the format is
    /// in the `bridge::mock` docs.
    #[arg(long, value_name = "FILE")]
    pub(crate) script: Option<PathBuf>,

    /// Latency per request in milliseconds: fixed, or the minimum with `--latency-max-ms`,
    /// or the mean with `--latency-sd-ms`.
    #[arg(long, value_name = "MS")]
    pub(crate) latency_ms: Option<f64>,

    /// Uniform latency between `--latency-ms` and this, in milliseconds.
    #[arg(
        long,
        value_name = "MS",
        requires = "latency_ms",
        conflicts_with = "latency_sd_ms"
    )]
    pub(crate) latency_max_ms: Option<f64>,

    /// Normal latency around `--latency-ms` with this standard deviation, in milliseconds.
    #[arg(long, value_name = "MS", requires = "latency_ms")]
    pub(crate) latency_sd_ms: Option<f64>,

    /// Share of chat requests that fail with an injected fault (0.0 – 1.0).
    #[arg(long, default_value_t = 0.0)]
    pub(crate) fault_rate: f64,

    /// Faults to draw from, comma-separated: 429, 500, 503, hang, reset, malformed, truncated.
    #[arg(long, default_value = "429,500,503")]
    pub(crate) faults: String,

    /// Seconds announced in `Retry-After` of injected 429s.
    #[arg(long, value_name = "SECONDS")]
    pub(crate) retry_after: Option<f64>,

    /// Seconds an injected hang lasts.
    #[arg(long, value_name = "SECONDS")]
    pub(crate) hang: Option<f64>,

    /// Require this API key (`Authorization: Bearer` or `x-api-key`).
    #[arg(long, env = "RLM_MOCK_API_KEY", hide_env_values = true)]
    pub(crate) api_key: Option<String>,

    /// Seed of the fault and latency draws.
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,

    /// Serve at most N chat requests at once, like a rate-limited API: one more is answered
    /// 429 at once, with `Retry-After` (`--retry-after`, default 1 s).
    #[arg(long, value_name = "N", value_parser = at_least::<usize>(1))]
    pub(crate) capacity: Option<usize>,
}
