//! The settings of a run: the model and loop options of `rlm run` and every command that
//! calls models, as flags (clap), environment variables (clap's `env`) and the `[run]` table
//! of `rlm.toml`, merged with the precedence flag > environment > file > built-in default.
//!
//! Every option is an `Option` so that "not given" can be told from a value. [`RunOptions`]
//! is both the clap argument group and the serde shape of the `[run]` table, so the two
//! cannot drift apart. The bottom of the CLI with `exit`: commands read their settings from
//! here, and `endpoints` turns them into the kernel's configurations.

use std::path::{Path, PathBuf};
use std::str::FromStr;

use anyhow::{Context, Result};
use bridge::{Concurrency, Provider};
use clap::Args;
use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use kernel::repl::SubCallErrorMode;
use kernel::rlm::{CodeAndFinal, Protocol};
use serde::Deserialize;

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

    /// Overwrite an existing output file (`--trajectory`, `--answer-file`, `--plot`, …); outputs
    /// that are inputs are refused even so.
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
pub(crate) fn at_least<T>(
    min: i64,
) -> impl Fn(&str) -> Result<T, String> + Clone + Send + Sync + 'static
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

/// The `rlm.toml` file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    #[serde(default)]
    run: RunOptions,
}

/// The configuration file in use: the explicit `--config` path, else `./rlm.toml` if present.
pub(crate) fn config_file_path(explicit: Option<&Path>) -> Option<PathBuf> {
    match explicit {
        Some(p) => Some(p.to_path_buf()),
        None => Some(PathBuf::from("rlm.toml")).filter(|p| p.exists()),
    }
}

/// Reads `rlm.toml`: the explicit `--config` path (must exist), else `./rlm.toml` if present.
pub(crate) fn load_config_file(explicit: Option<&Path>) -> Result<RunOptions> {
    let Some(path) = config_file_path(explicit) else {
        return Ok(RunOptions::default());
    };
    let text = engine::document::read_to_string(&path)
        .with_context(|| format!("Could not read the configuration file `{}`", path.display()))?;
    let file: ConfigFile = engine::document::from_toml(&text).map_err(|e| {
        let hint = if e.limit {
            String::new()
        } else {
            "; options go in a `[run]` table with the flag names, e.g. `max-iterations = 20`"
                .to_owned()
        };
        anyhow::anyhow!(
            "Configuration file `{}` is not valid (line {}, column {}): {}{hint}",
            path.display(),
            e.line,
            e.column,
            e.message
        )
    })?;
    // Paths in the file are relative to the file, as a reader of it would expect.
    let mut run = file.run;
    if let Some(dir) = path.parent() {
        for p in [
            &mut run.prompt_extension,
            &mut run.system_prompt,
            &mut run.trajectory,
            &mut run.answer_file,
        ]
        .into_iter()
        .flatten()
        {
            if p.is_relative() {
                *p = dir.join(&*p);
            }
        }
    }
    Ok(run)
}

/// Flag/env values win over the file's.
pub(crate) fn merge(cli: RunOptions, file: RunOptions) -> RunOptions {
    RunOptions {
        model: cli.model.or(file.model),
        sub_model: cli.sub_model.or(file.sub_model),
        base_url: cli.base_url.or(file.base_url),
        sub_base_url: cli.sub_base_url.or(file.sub_base_url),
        extra_models: if cli.extra_models.is_empty() {
            file.extra_models
        } else {
            cli.extra_models
        },
        provider: cli.provider.or(file.provider),
        api_key_env: cli.api_key_env.or(file.api_key_env),
        // Secrets add up: a value the file marks secret stays secret.
        secrets: file.secrets.into_iter().chain(cli.secrets).collect(),
        max_output_tokens: cli.max_output_tokens.or(file.max_output_tokens),
        temperature: cli.temperature.or(file.temperature),
        max_iterations: cli.max_iterations.or(file.max_iterations),
        timeout: cli.timeout.or(file.timeout),
        cell_timeout: cli.cell_timeout.or(file.cell_timeout),
        sub_timeout: cli.sub_timeout.or(file.sub_timeout),
        max_sub_calls: cli.max_sub_calls.or(file.max_sub_calls),
        max_tokens: cli.max_tokens.or(file.max_tokens),
        max_usd: cli.max_usd.or(file.max_usd),
        price: cli.price.or(file.price),
        sub_price: cli.sub_price.or(file.sub_price),
        batch_concurrency: cli.batch_concurrency.or(file.batch_concurrency),
        sub_call_errors: cli.sub_call_errors.or(file.sub_call_errors),
        sub_call_text_chars: cli.sub_call_text_chars.or(file.sub_call_text_chars),
        protocol: cli.protocol.or(file.protocol),
        code_and_final: cli.code_and_final.or(file.code_and_final),
        output_limit: cli.output_limit.or(file.output_limit),
        max_history_chars: cli.max_history_chars.or(file.max_history_chars),
        max_consecutive_failures: cli
            .max_consecutive_failures
            .or(file.max_consecutive_failures),
        prompt_extension: cli.prompt_extension.or(file.prompt_extension),
        system_prompt: cli.system_prompt.or(file.system_prompt),
        trajectory: cli.trajectory.or(file.trajectory),
        answer_file: cli.answer_file.or(file.answer_file),
        json: cli.json.or(file.json),
        quiet: cli.quiet.or(file.quiet),
        trace: cli.trace.or(file.trace),
        force: cli.force.or(file.force),
    }
}
