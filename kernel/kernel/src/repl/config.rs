//! [`SessionConfig`]: the settings of one session, and where its Python runs ([`Isolation`],
//! [`OnCrash`]).

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::natives::SubCallErrorMode;
use super::source::LoadOptions;

/// Configuration of one session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SessionConfig {
    /// Wall-clock limit of one block.
    pub cell_timeout: Duration,
    /// Characters kept per stream per block (half from the head, half from the tail).
    pub max_output_chars: usize,
    /// Endpoint used by `llm_query`/`llm_query_batched` when no `model` is given.
    pub sub_endpoint: String,
    /// Fan-out width of `llm_query_batched` (`None`: unbounded, still capped by the
    /// endpoint's `max_in_flight`).
    pub batch_concurrency: Option<usize>,
    /// What a failed sub-call does in Python.
    pub sub_call_errors: SubCallErrorMode,
    /// Characters kept of each sub-call's prompt and of its reply in the block's record
    /// (head and tail; `0` keeps none), so a trajectory shows what sub-models were asked
    /// while its size stays bounded whatever the context's.
    pub sub_call_text_chars: usize,
    /// How context files are read.
    pub load: LoadOptions,
    /// What sets `cell_timeout`, as the front end's users write it (`` `--cell-timeout` ``),
    /// for the message of a block stopped at its limit.
    pub cell_timeout_setting: String,
    /// Where the session's Python runs: in this process, or in a worker process of its own.
    /// The library's default is [`Isolation::None`]; the run options (`rlm run`, the Python
    /// package) default to [`Isolation::Process`].
    pub isolation: Isolation,
    /// Memory limit of a worker process, in bytes (`None`: half the physical memory).
    pub memory_limit: Option<u64>,
    /// What a worker crash leaves of the session's variables.
    pub on_crash: OnCrash,
    /// Folders a worker's code may read besides its contexts and Python's own files (a
    /// workflow's folder, for its Python steps and tools).
    pub read_paths: Vec<PathBuf>,
}

impl Default for SessionConfig {
    fn default() -> Self {
        Self {
            cell_timeout: Duration::from_secs(120),
            max_output_chars: 100_000,
            sub_endpoint: "sub".to_owned(),
            batch_concurrency: None,
            sub_call_errors: SubCallErrorMode::ReturnString,
            sub_call_text_chars: 600,
            load: LoadOptions::default(),
            cell_timeout_setting: "`cell_timeout`".to_owned(),
            isolation: Isolation::None,
            memory_limit: None,
            on_crash: OnCrash::Restore,
            read_paths: Vec::new(),
        }
    }
}

/// Where a session's Python runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Isolation {
    /// In this process, on a thread of its own: no copy of anything, and nothing confined.
    #[default]
    None,
    /// In a worker process, confined by every layer the system supports (one line says
    /// which are missing); crashes and stuck native code end the worker, not the run.
    Process,
    /// Like [`Isolation::Process`], but the session refuses to start unless every
    /// confinement layer is in force.
    Strict,
}

impl Isolation {
    /// The name used on the command line and in `rlm.toml`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Process => "process",
            Self::Strict => "strict",
        }
    }

    /// Whether the session runs in a worker process.
    pub fn in_worker(self) -> bool {
        self != Self::None
    }
}

/// An unknown [`Isolation`] name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Unknown isolation `{0}`; use `process`, `strict` or `none`")]
pub struct UnknownIsolation(pub String);

impl std::str::FromStr for Isolation {
    type Err = UnknownIsolation;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "none" => Ok(Self::None),
            "process" => Ok(Self::Process),
            "strict" => Ok(Self::Strict),
            _ => Err(UnknownIsolation(s.to_owned())),
        }
    }
}

/// What a crashed worker leaves of the session.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnCrash {
    /// A fresh worker loads the contexts and replays the blocks that ran to completion
    /// before, their sub-calls answered from the session's record (no new model calls).
    #[default]
    Restore,
    /// A fresh worker loads the contexts; earlier variables are gone.
    Fresh,
}

impl OnCrash {
    /// The name used on the command line and in `rlm.toml`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Restore => "restore",
            Self::Fresh => "fresh",
        }
    }
}

/// An unknown [`OnCrash`] name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Unknown crash policy `{0}`; use `restore` or `fresh`")]
pub struct UnknownOnCrash(pub String);

impl std::str::FromStr for OnCrash {
    type Err = UnknownOnCrash;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "restore" => Ok(Self::Restore),
            "fresh" => Ok(Self::Fresh),
            _ => Err(UnknownOnCrash(s.to_owned())),
        }
    }
}
