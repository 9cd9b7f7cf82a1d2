//! The options of a run: one schema for every front end, layered sources, one resolution.
//!
//! The `rlm` command (flags), the Python package (keywords, `%rlm_config`, `%%rlm` flags),
//! the environment (`RLM_*`) and `rlm.toml` (its `[run]` table) all set the same options,
//! declared once in the list of `options/schema.rs`: each entry is a field of [`RunOptions`] (every field an
//! `Option`: "not set" is told from a value) with its [`OptionSpec`] in [`OPTIONS`] — its
//! kind of value, its [`Group`], its environment variable, its flag when that is not the
//! name in kebab case, and its help text (the field's doc comment).
//!
//! How data flows, as uv's `Options` and `Combine` do it:
//! 1. Each source is read into a `RunOptions` of its own, every value checked by its spec on
//!    the way in ([`OptionSpec::parse_text`], [`OptionSpec::parse_json`]), so an error names
//!    the option as that source spells it ([`Source`]): `--max-iterations` on the command
//!    line, `RLM_MAX_ITERATIONS`, `max-iterations` in `rlm.toml`, `max_iterations` in
//!    Python. [`RunOptions::from_env`], [`RunOptions::from_file`] (and [`config_file`] to
//!    find it), [`RunOptions::from_text`] (flags) and [`RunOptions::from_json`] (keywords).
//! 2. [`RunOptions::combine`] merges the layers, the first set value winning (lists add
//!    up): keywords or flags > session defaults (Python) > environment > file > built-in
//!    defaults. [`RunOptions::layered`] does the environment and file part for both front
//!    ends.
//! 3. `resolve` turns the merged options into the run's configurations: the endpoints and
//!    budget ledger, the REPL session, how contexts load and the RLM loop, with the defaults,
//!    once. Errors there name options by the front end's [`Spelling`].
//!
//! A front end maps only its own spelling onto the schema and holds no list of options: the
//! CLI builds one flag per [`OPTIONS`] entry (offering the [`Group`]s a command uses), the
//! Python package one keyword per entry (and one `%%rlm` flag).
//!
//! # Adding an option
//!
//! One entry in the list in `options/schema.rs`:
//! ```text
//! /// Most rows a table context keeps, e.g. `1000` [default: all].
//! max_rows: u64 = OptionSpec::new(Kind::Whole { min: 1 }, Group::Load)
//!     .env("RLM_MAX_ROWS")
//!     .value_name("ROWS")
//!     .example("1000");
//! ```
//! then read the field where it takes effect (in `options/resolve.rs`, e.g. into the
//! [`LoadOptions`](crate::repl::LoadOptions)). That is all: `--max-rows` appears in
//! the `--help` of every command that offers the group, `max_rows=` in Python,
//! `max-rows` in `rlm.toml`, `RLM_MAX_ROWS` in the environment, and the tests that
//! every option works in every source and front end cover it from its `example`. A new
//! kind of value is a [`Kind`] variant with its parse; a switch is `--name` or
//! `--name=false` on the command line.
//!
//! ```
//! use kernel::options::{Keys, RunOptions, Source, Spelling};
//!
//! let flags = RunOptions::from_text(&Source::Flag, [("max_iterations", vec!["9".into()])])?;
//! let env = RunOptions::from_env_with(|var| match var {
//!     "RLM_MODEL" => Some("qwen3".into()),
//!     "RLM_MAX_ITERATIONS" => Some("20".into()),
//!     _ => None,
//! })?;
//! let options = flags.combine(env);
//! assert_eq!((options.model.as_deref(), options.max_iterations), (Some("qwen3"), Some(9)));
//! let endpoints = RunOptions { base_url: Some("http://127.0.0.1:9/v1".into()), ..options }
//!     .endpoints(Spelling::Flag, Keys::Required)?;
//! assert_eq!(endpoints.get(kernel::options::SUB)?.config().model, "qwen3");
//! let zero = |var: &str| (var == "RLM_MAX_ITERATIONS").then(|| "0".to_owned());
//! assert_eq!(
//!     RunOptions::from_env_with(zero).unwrap_err().to_string(),
//!     "`RLM_MAX_ITERATIONS` must be ≥ 1, got 0"
//! );
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod error;
mod resolve;
mod schema;
mod source;
mod spec;

pub use error::{OptionError, Source, Spelling};
pub use resolve::{Keys, ROOT, SUB, seconds};
pub use schema::{OPTIONS, RunOptions, spec};
pub use source::{CONFIG_FILE, CONFIG_VARIABLE, config_file};
pub use spec::{ALL_GROUPS, Choice, Group, Groups, Kind, OptionSpec};

use std::path::{Path, PathBuf};

impl RunOptions {
    /// `self` (the flags or keywords: the highest layer) over the environment over the
    /// configuration file ([`config_file`]`(config)`), and the file read, if any.
    pub fn layered(self, config: Option<&Path>) -> Result<(Self, Option<PathBuf>), OptionError> {
        let file = config_file(config);
        let from_file = match &file {
            Some(path) => Self::from_file(path)?,
            None => Self::default(),
        };
        Ok((self.combine(Self::from_env()?).combine(from_file), file))
    }
}

#[cfg(test)]
mod tests;
