//! The schema: every option of a run, once. [`run_options!`] turns the list below into the
//! typed [`RunOptions`] (one `Option` field per option), the [`OPTIONS`] table front ends build
//! their flags and keywords from, and [`RunOptions::combine`].

use std::path::PathBuf;

use bridge::{Concurrency, Provider};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::spec::{Choice, Group, Kind, OptionSpec};
use crate::repl::{FrameLibrary, Isolation, OnCrash, SubCallErrorMode};
use crate::rlm::{CodeAndFinal, Protocol};

/// Declares the options: each entry is the field's doc comment (the help users see), its
/// name and value type, and its [`OptionSpec`] (kind, group, environment variable, …).
macro_rules! run_options {
    ($(
        $(#[doc = $doc:literal])+
        $name:ident: $ty:ty = $spec:expr;
    )+) => {
        /// The options of a run, one field per entry of [`OPTIONS`]; `None` is "not set", and
        /// what is not set anywhere takes the built-in default when the options are resolved.
        #[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct RunOptions {
            $(
                $(#[doc = $doc])+
                #[serde(default, skip_serializing_if = "Option::is_none")]
                pub $name: Option<$ty>,
            )+
        }

        /// Every option, in the order `--help` lists them.
        pub const OPTIONS: &[OptionSpec] = &[$(
            OptionSpec {
                name: stringify!($name),
                help: concat!($($doc, "\n"),+),
                ..$spec
            },
        )+];

        impl RunOptions {
            /// `self`'s values, and `other`'s where `self` has none; lists add up (`self`'s
            /// first). Layers combine from the highest precedence down:
            /// `flags.combine(env).combine(file)`.
            #[must_use]
            pub fn combine(self, other: Self) -> Self {
                Self {
                    $($name: Combine::combine(self.$name, other.$name),)+
                }
            }
        }
    };
}

const PROVIDERS: &[Choice] = &[
    Choice {
        name: "openai",
        aliases: &["open_ai", "openai-compatible"],
        help: "OpenAI-compatible chat completions (OpenAI, vLLM, SGLang, llama.cpp, Ollama, OpenRouter)",
    },
    Choice {
        name: "anthropic",
        aliases: &[],
        help: "Anthropic Messages API",
    },
];

const SUB_CALL_ERRORS: &[Choice] = &[
    Choice {
        name: "string",
        aliases: &["return_string"],
        help: "Return `\"Error: <reason>\"` in the reply's place",
    },
    Choice {
        name: "raise",
        aliases: &[],
        help: "Raise `LlmQueryError`",
    },
];

const PROTOCOLS: &[Choice] = &[
    Choice {
        name: "auto",
        aliases: &[],
        help: "All conventions: the `answer` dict, `FINAL_VAR(...)` and `FINAL(...)`",
    },
    Choice {
        name: "final",
        aliases: &[],
        help: "Only `FINAL(...)` / `FINAL_VAR(...)` (reply lines and in-code `FINAL_VAR`)",
    },
    Choice {
        name: "answer",
        aliases: &[],
        help: "Only the `answer` dict (`answer[\"ready\"] = True`)",
    },
];

const CODE_AND_FINAL: &[Choice] = &[
    Choice {
        name: "accept-unless-error",
        aliases: &["accept_unless_error"],
        help: "Run the code, then accept the final line unless a block raised [default]",
    },
    Choice {
        name: "see-output-first",
        aliases: &["see-output", "see_output_first"],
        help: "Run the code, show its output, and let the model confirm its answer",
    },
    Choice {
        name: "accept",
        aliases: &[],
        help: "Run the code, then accept the final line even when a block raised",
    },
];

const FRAME_LIBRARIES: &[Choice] = &[
    Choice {
        name: "polars",
        aliases: &[],
        help: "`polars.DataFrame`",
    },
    Choice {
        name: "pandas",
        aliases: &[],
        help: "`pandas.DataFrame` (converted from polars)",
    },
];

const ISOLATIONS: &[Choice] = &[
    Choice {
        name: "process",
        aliases: &[],
        help: "A confined worker process; crashes and stuck cells end the worker, not the run [default]",
    },
    Choice {
        name: "strict",
        aliases: &[],
        help: "Like `process`, but refuse to run unless every confinement layer is in force",
    },
    Choice {
        name: "none",
        aliases: &[],
        help: "In this process: no confinement, no copy (a crash in C code ends the run)",
    },
];

const ON_CRASH: &[Choice] = &[
    Choice {
        name: "restore",
        aliases: &[],
        help: "Replay the blocks that ran before; variables come back [default]",
    },
    Choice {
        name: "fresh",
        aliases: &[],
        help: "A fresh worker with the contexts only",
    },
];

/// The least `memory_limit`: below it not even the interpreter starts.
const MIN_MEMORY_LIMIT: u64 = 1 << 20;

use Group::{
    Agent, Answer, Budget, Database, Iterations, Lease, Load, Loop, Models, Output, Session,
    Timeout, Trace, Trajectory,
};

run_options! {
    /// CSV field separator, one character (`tab` for a tab) [default: sniffed from `,` `;`
    /// tab `|`].
    csv_sep: char = OptionSpec::new(Kind::Character, Load).value_name("CHAR");
    /// Leave out CSV rows with more fields than the header (and say how many) instead of
    /// failing.
    csv_skip_bad_rows: bool = OptionSpec::new(Kind::Switch, Load);
    /// Encoding of text, JSON and CSV files, e.g. `latin-1`, `cp1252`, `utf-16` [default:
    /// UTF-8].
    encoding: String = OptionSpec::new(Kind::Text, Load).value_name("CODEC").example("latin-1");
    /// The library of the data frames tables load as [default: polars].
    frames: FrameLibrary = OptionSpec::new(Kind::Choice(FRAME_LIBRARIES), Load)
        .flag("as")
        .value_name("LIBRARY");
    /// Root model name.
    model: String = OptionSpec::new(Kind::Text, Models).env("RLM_MODEL").example("qwen3");
    /// Sub-model name for `llm_query` (default: the root model).
    sub_model: String = OptionSpec::new(Kind::Text, Models)
        .env("RLM_SUB_MODEL")
        .example("qwen3-small");
    /// Base URL of the root model's API (OpenAI: including `/v1`).
    base_url: String = OptionSpec::new(Kind::Url, Models).env("RLM_BASE_URL").value_name("URL");
    /// Base URL of the sub-model's API (default: the root model's).
    sub_base_url: String = OptionSpec::new(Kind::Url, Models)
        .env("RLM_SUB_BASE_URL")
        .value_name("URL");
    /// Another sub-model the code may pick with `llm_query(..., model="NAME")`, as
    /// `NAME=MODEL` or `NAME=MODEL@BASE_URL` (default URL: the sub-model's). Repeatable.
    extra_models: Vec<String> = OptionSpec::new(Kind::Text, Models)
        .repeated()
        .flag("extra-model")
        .value_name("NAME=MODEL[@URL]")
        .example("judge=big-model");
    /// Wire format of the model API.
    provider: Provider = OptionSpec::new(Kind::Choice(PROVIDERS), Models).env("RLM_PROVIDER");
    /// Environment variable holding the API key (default: `OPENAI_API_KEY` or
    /// `ANTHROPIC_API_KEY`). Like every `*_API_KEY` variable, the `rlm` command removes it
    /// from the environment before the model's code runs.
    api_key_env: String = OptionSpec::new(Kind::Variable, Models)
        .env("RLM_API_KEY_ENV")
        .value_name("VAR");
    /// An environment variable whose value is secret: the code may still read it, but it is
    /// `[redacted]` in every output (what the model reads, the trajectory, `--json`,
    /// stderr). Repeatable.
    secrets: Vec<String> = OptionSpec::new(Kind::Variable, Models)
        .repeated()
        .flag("secret")
        .value_name("VAR");
    /// The sub-model's context window, in tokens: a sub-call whose prompt plus
    /// `--max-output-tokens` cannot fit is refused before it is sent [default: known for
    /// well-known models, else what the server's model listing says, else unchecked].
    sub_context_window: u64 = OptionSpec::new(Kind::Whole { min: 1 }, Models)
        .env("RLM_SUB_CONTEXT_WINDOW")
        .value_name("TOKENS")
        .example("128000");
    /// Most tokens one model reply may have (sent as `max_tokens`; default: the server's).
    max_output_tokens: u32 = OptionSpec::new(Kind::Whole { min: 1 }, Models)
        .env("RLM_MAX_OUTPUT_TOKENS");
    /// Sampling temperature of every model call (default: the server's).
    temperature: f32 = OptionSpec::new(Kind::Number, Models).env("RLM_TEMPERATURE");
    /// Maximum root-model iterations before a last "answer now" call [default: 30].
    max_iterations: u32 = OptionSpec::new(Kind::Whole { min: 1 }, Iterations)
        .env("RLM_MAX_ITERATIONS");
    /// Wall-clock limit for the whole run, in seconds.
    timeout: f64 = OptionSpec::new(Kind::Seconds, Timeout)
        .env("RLM_TIMEOUT")
        .value_name("SECONDS");
    /// Wall-clock limit for one code block, in seconds [default: 120].
    cell_timeout: f64 = OptionSpec::new(Kind::Seconds, Session)
        .env("RLM_CELL_TIMEOUT")
        .value_name("SECONDS");
    /// Timeout of one sub-model HTTP attempt, in seconds [default: 300].
    sub_timeout: f64 = OptionSpec::new(Kind::Seconds, Models)
        .env("RLM_SUB_TIMEOUT")
        .value_name("SECONDS");
    /// Budget: the most sub-model calls the run may make.
    max_sub_calls: u64 = OptionSpec::new(Kind::Whole { min: 0 }, Budget)
        .env("RLM_MAX_SUB_CALLS");
    /// Budget: the most tokens (prompt + completion, all models) the run may use.
    max_tokens: u64 = OptionSpec::new(Kind::Whole { min: 1 }, Budget).env("RLM_MAX_TOKENS");
    /// Budget: the most USD the run may spend (needs prices).
    max_usd: f64 = OptionSpec::new(Kind::Usd, Budget).env("RLM_MAX_USD");
    /// Price of the root model, USD per million tokens, as `INPUT:OUTPUT`.
    price: String = OptionSpec::new(Kind::Price, Models).env("RLM_PRICE").value_name("IN:OUT");
    /// Price of the sub-model, USD per million tokens, as `INPUT:OUTPUT` (default: the root
    /// model's).
    sub_price: String = OptionSpec::new(Kind::Price, Models)
        .env("RLM_SUB_PRICE")
        .value_name("IN:OUT");
    /// Sub-model requests in flight at once (for `llm_query_batched` and across threads), or
    /// `auto`: a limit that grows while latency stays flat and backs off on 429s, timeouts and
    /// rising latency, up to 256 [default: 128].
    batch_concurrency: Concurrency = OptionSpec::new(Kind::Width, Session)
        .env("RLM_BATCH_CONCURRENCY")
        .value_name("N|auto");
    /// What a failed sub-call gives the code: an `"Error: ..."` string, or a raised
    /// `LlmQueryError`.
    sub_call_errors: SubCallErrorMode = OptionSpec::new(Kind::Choice(SUB_CALL_ERRORS), Session)
        .env("RLM_SUB_CALL_ERRORS");
    /// Characters of each sub-call's prompt and of its reply kept in the trajectory (head and
    /// tail; 0 keeps none) [default: 600].
    sub_call_text_chars: usize = OptionSpec::new(Kind::Whole { min: 0 }, Session)
        .env("RLM_SUB_CALL_TEXT_CHARS")
        .value_name("CHARS");
    /// Where model-written code runs: in a worker process confined by every layer this
    /// system supports (the default; one line names any layer that is missing), in one that
    /// must be fully confined, or in this process (nothing confined; a crash ends the run).
    isolation: Isolation = OptionSpec::new(Kind::Choice(ISOLATIONS), Session)
        .env("RLM_ISOLATION");
    /// Memory limit of the worker process, e.g. `4G` or `512M` [default: half the RAM].
    memory_limit: u64 = OptionSpec::new(Kind::Size { min: MIN_MEMORY_LIMIT }, Session)
        .env("RLM_MEMORY_LIMIT")
        .value_name("SIZE")
        .example("2G");
    /// After the worker crashed: restore the session's variables by replaying its earlier
    /// blocks (sub-calls answered from the run's record, no new model calls), or start
    /// fresh.
    on_crash: OnCrash = OptionSpec::new(Kind::Choice(ON_CRASH), Session).env("RLM_ON_CRASH");
    /// Send every sub-call, even one identical (model, messages, settings) to an earlier one
    /// of the run; by default such repeats get the recorded answer without a request
    /// (`--no-sub-call-cache=false` overrides rlm.toml).
    no_sub_call_cache: bool = OptionSpec::new(Kind::Switch, Session).env("RLM_NO_SUB_CALL_CACHE");
    /// Which final-answer conventions count.
    protocol: Protocol = OptionSpec::new(Kind::Choice(PROTOCOLS), Loop).env("RLM_PROTOCOL");
    /// A reply with both code and a `FINAL`/`FINAL_VAR` line: run the code, then accept the
    /// line unless a block raised (the default), always wait until the model has seen the
    /// output and confirms, or accept it even after an error.
    code_and_final: CodeAndFinal = OptionSpec::new(Kind::Choice(CODE_AND_FINAL), Loop)
        .env("RLM_CODE_AND_FINAL");
    /// Characters of output shown to the root model per code block (head and tail kept)
    /// [default: 20000].
    output_limit: usize = OptionSpec::new(Kind::Whole { min: 1 }, Loop)
        .env("RLM_OUTPUT_LIMIT")
        .value_name("CHARS");
    /// Keep the conversation sent to the root model under this many characters by eliding
    /// the oldest block outputs (the model's replies and the last two outputs are always
    /// kept) [default: no limit].
    max_history_chars: usize = OptionSpec::new(Kind::Whole { min: 1 }, Loop)
        .env("RLM_MAX_HISTORY_CHARS")
        .value_name("CHARS")
        .example("50000");
    /// Levels of RLM runs the tree may have, the root's included: at 1, `rlm_query` in the
    /// code behaves as `llm_query`; at 2 it starts child RLM runs, each with a REPL of its own
    /// [default: 1].
    max_depth: u32 = OptionSpec::new(Kind::Whole { min: 1 }, Loop)
        .env("RLM_MAX_DEPTH")
        .example("2");
    /// Stop after this many iterations in a row whose code failed (0: never) [default: 5].
    max_consecutive_failures: u32 = OptionSpec::new(Kind::Whole { min: 0 }, Loop)
        .env("RLM_MAX_CONSECUTIVE_FAILURES");
    /// Append the text of FILE to the system prompt (domain instructions).
    prompt_extension: PathBuf = OptionSpec::new(Kind::Path, Loop).value_name("FILE");
    /// Replace the system prompt with the text of FILE.
    system_prompt: PathBuf = OptionSpec::new(Kind::Path, Loop).value_name("FILE");
    /// Write the trajectory (JSONL, one line per iteration) to FILE.
    trajectory: PathBuf = OptionSpec::new(Kind::Path, Trajectory)
        .value_name("FILE")
        .example("trajectory.jsonl");
    /// Print the run as it goes on stderr: the model's text, each block's code and output,
    /// sub-calls, the answer.
    trace: bool = OptionSpec::new(Kind::Switch, Trace);
    /// Write the exact final answer to FILE.
    answer_file: PathBuf = OptionSpec::new(Kind::Path, Answer)
        .value_name("FILE")
        .example("answer.txt");
    /// Print the whole result with metrics as JSON on stdout (`--json=false` overrides
    /// rlm.toml).
    json: bool = OptionSpec::new(Kind::Switch, Output);
    /// No progress line and no closing summary on stderr; errors still print
    /// (`--quiet=false` overrides rlm.toml).
    quiet: bool = OptionSpec::new(Kind::Switch, Output);
    /// Overwrite an existing output file (`--trajectory`, `--answer-file`, `--plot`, …);
    /// outputs that are inputs are refused even so.
    force: bool = OptionSpec::new(Kind::Switch, Output);
    /// The project the bundle is installed in (`{project-root}`): the tools read under it
    /// (and the bundle) and write under it. Default: the current directory, or the folder
    /// inside it above the agent where its start-up files are found.
    project_root: PathBuf = OptionSpec::new(Kind::Path, Agent)
        .value_name("DIR")
        .example("project");
    /// Let the tools use a root as broad as `/`, your home directory or a folder above the
    /// project (by default a path only under such a root is refused).
    allow_broad_root: bool = OptionSpec::new(Kind::Switch, Agent);
    /// Let the tools read files with more than one hard link (another name, maybe outside
    /// the project, points at the same file). Such files are never written.
    allow_hard_links: bool = OptionSpec::new(Kind::Switch, Agent);
    /// The run database of `rlm flow`: an SQLite file (`PATH` or `sqlite:PATH`) or a
    /// PostgreSQL database many hosts share (`postgres://USER[:PASSWORD]@HOST[:PORT]/DB`; the
    /// password never shows in any output) [default: .rlm/runs.db].
    db: String = OptionSpec::new(Kind::Database, Database)
        .env("RLM_DB")
        .value_name("PATH|URL");
    /// PostgreSQL only: how long a driver's lease on its run lasts without a heartbeat, in
    /// seconds (at least 1; it renews it every third of that). A host that stops
    /// heartbeating (killed, frozen, cut off) loses the run after it, to the next resume from
    /// any host [default: 30].
    lease_expiry: f64 = OptionSpec::new(Kind::Seconds, Lease)
        .env("RLM_LEASE_EXPIRY")
        .value_name("SECONDS")
        .example("30");
}

/// How two layers' values of one option combine: the first set value wins.
trait Combine {
    fn combine(self, other: Self) -> Self;
}

/// A value one layer sets as a whole.
trait Scalar {}

impl<T: Scalar> Combine for Option<T> {
    fn combine(self, other: Self) -> Self {
        self.or(other)
    }
}

/// Lists add up, the higher layer's items first.
impl Combine for Option<Vec<String>> {
    fn combine(self, other: Self) -> Self {
        match (self, other) {
            (Some(mut first), Some(second)) => {
                first.extend(second);
                Some(first)
            }
            (first, second) => first.or(second),
        }
    }
}

impl Scalar for String {}
impl Scalar for PathBuf {}
impl Scalar for char {}
impl Scalar for bool {}
impl Scalar for u32 {}
impl Scalar for u64 {}
impl Scalar for usize {}
impl Scalar for f32 {}
impl Scalar for f64 {}
impl Scalar for Provider {}
impl Scalar for Concurrency {}
impl Scalar for SubCallErrorMode {}
impl Scalar for Protocol {}
impl Scalar for CodeAndFinal {}
impl Scalar for FrameLibrary {}
impl Scalar for Isolation {}
impl Scalar for OnCrash {}

/// The option called `name` (snake case).
pub fn spec(name: &str) -> Option<&'static OptionSpec> {
    OPTIONS.iter().find(|spec| spec.name == name)
}

impl RunOptions {
    /// Options from canonical values by name (what [`OptionSpec::parse_text`] and
    /// [`OptionSpec::parse_json`] give).
    pub(crate) fn from_canonical(values: Map<String, Value>) -> Result<Self, serde_json::Error> {
        serde_json::from_value(Value::Object(values))
    }

    /// The options that are set, by name, in canonical form (choices by the names users
    /// write, which are not always the types' serde names).
    pub fn to_map(&self) -> Map<String, Value> {
        let Ok(Value::Object(mut map)) = serde_json::to_value(self) else {
            return Map::new();
        };
        for (name, value) in &mut map {
            if let Some(canonical) = spec(name).and_then(|s| s.parse_json(value).ok()) {
                *value = canonical;
            }
        }
        map
    }

    /// These options without those of the groups not in `groups` (a set of
    /// [`Group::bit`]s): what a command or front end that has no use for them keeps.
    #[must_use]
    pub fn only(self, groups: super::spec::Groups) -> Self {
        let mut map = self.to_map();
        map.retain(|name, _| spec(name).is_some_and(|s| groups & s.group.bit() != 0));
        Self::from_canonical(map).unwrap_or_default()
    }
}
