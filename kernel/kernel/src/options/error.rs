//! Why options do not make a run, with the option named as its source spells it: `--sub-price`
//! on the command line, `RLM_SUB_PRICE` in the environment, `sub-price` in `rlm.toml`,
//! `sub_price` as a Python keyword.

use std::path::PathBuf;

use bridge::BridgeError;

use super::spec::OptionSpec;

/// How a front end names its options in messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spelling {
    /// Command-line flags: `` `--sub-price` ``.
    Flag,
    /// Keyword arguments: `` `sub_price` ``.
    Keyword,
}

impl Spelling {
    /// The option `name` (snake case) as its users write it, in backticks.
    pub fn option(self, name: &str) -> String {
        match self {
            Self::Flag => format!("`--{}`", flag_of(name)),
            Self::Keyword => format!("`{name}`"),
        }
    }

    /// The option `name` given `value`, in backticks: `` `--price IN:OUT` ``.
    pub fn given(self, name: &str, value: &str) -> String {
        match self {
            Self::Flag => format!("`--{} {value}`", flag_of(name)),
            Self::Keyword => format!("`{name}=\"{value}\"`"),
        }
    }
}

/// The flag of option `name`, without `--`.
fn flag_of(name: &str) -> String {
    super::schema::spec(name).map_or_else(|| name.replace('_', "-"), OptionSpec::flag_name)
}

/// Where an option's value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A command-line flag.
    Flag,
    /// An environment variable.
    Environment,
    /// The `[run]` table of a configuration file.
    File(PathBuf),
    /// A keyword argument (or a session default of the Python package).
    Keyword,
}

impl Source {
    /// The option `spec` as this source spells it, in backticks.
    pub fn name(&self, spec: &OptionSpec) -> String {
        match self {
            Self::Flag => format!("`--{}`", spec.flag_name()),
            Self::Environment => format!("`{}`", spec.env.unwrap_or(spec.name)),
            Self::File(path) => format!("`{}` in `{}`", spec.file_key(), path.display()),
            Self::Keyword => format!("`{}`", spec.name),
        }
    }
}

/// Why options do not make a run; the option is named as the front end spells it.
#[derive(Debug, thiserror::Error)]
pub enum OptionError {
    /// No option of that name.
    #[error("Unknown option {given} in {where_}; the options are {known}")]
    Unknown {
        /// Where the name was given.
        where_: String,
        /// The name, as given.
        given: String,
        /// The known names, as that source spells them.
        known: String,
    },
    /// A value the option does not take.
    #[error("{option} {problem}")]
    Value {
        /// The option, as its source spells it.
        option: String,
        /// What is wrong ("must be …").
        problem: String,
        /// Whether it came from a configuration file (not a usage error of the command).
        in_file: bool,
    },
    /// A configuration file that cannot be read or is not TOML with a `[run]` table.
    #[error("Could not read the configuration file `{}`{}", path.display(), problem.as_deref().map(|p| format!(": {p}")).unwrap_or_default())]
    File {
        /// The file.
        path: PathBuf,
        /// What is wrong with its text, if it could be read.
        problem: Option<String>,
        /// Why it could not be read.
        #[source]
        source: Option<std::io::Error>,
    },
    /// No root model.
    #[error("No root model given; pass {hint}")]
    NoModel {
        /// Where to name one.
        hint: &'static str,
    },
    /// A USD budget without a price to count it by.
    #[error("{option} needs prices to count cost; pass {price} (USD per million tokens)")]
    Unpriced {
        /// The budget option.
        option: String,
        /// The price option with its form.
        price: String,
    },
    /// An extra model that is not `NAME=MODEL[@BASE_URL]`.
    #[error("{option} takes `NAME=MODEL` or `NAME=MODEL@BASE_URL`; got `{spec}`")]
    ExtraModel {
        /// The option.
        option: String,
        /// What it was given.
        spec: String,
    },
    /// An extra model under a name already taken.
    #[error("{option} entry `{spec}`: the name `{name}` is taken; pick another")]
    TakenName {
        /// The option.
        option: String,
        /// The entry.
        spec: String,
        /// The name.
        name: String,
    },
    /// A base URL that is not `http(s)://`.
    #[error("{option} must start with `http://` or `https://`, got `{url}`")]
    Url {
        /// What sets it.
        option: String,
        /// The URL.
        url: String,
    },
    /// A server off this machine with no API key to send.
    #[error(
        "`{url}` needs an API key and `{var}` is not set; export `{var}` with your key, or name the variable that holds it with {option}"
    )]
    NoKey {
        /// The base URL.
        url: String,
        /// The variable the key should be in.
        var: String,
        /// The option that names another variable, with its form.
        option: String,
    },
    /// A `secrets` variable whose value cannot be redacted.
    #[error("{option}: {problem}")]
    Secret {
        /// The option with the variable.
        option: String,
        /// What is wrong.
        problem: String,
    },
    /// A text encoding Python does not know.
    #[error("{option}: {problem}")]
    Encoding {
        /// The option.
        option: String,
        /// What the kernel said.
        problem: String,
    },
    /// A prompt file that could not be read.
    #[error("Could not read the {option} file `{}`", path.display())]
    PromptFile {
        /// The option.
        option: String,
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The endpoints refused their configurations.
    #[error("Could not set up the model endpoints")]
    Endpoints(#[source] BridgeError),
}

impl OptionError {
    /// Whether the options themselves are wrong (a usage error), rather than a file or the
    /// endpoints failing them.
    pub fn is_usage(&self) -> bool {
        match self {
            Self::Value { in_file, .. } => !in_file,
            Self::File { .. } | Self::PromptFile { .. } | Self::Endpoints(_) => false,
            _ => true,
        }
    }

    /// A bad `value` of `spec` from `source`.
    pub(crate) fn value(source: &Source, spec: &OptionSpec, problem: String) -> Self {
        Self::Value {
            option: source.name(spec),
            problem,
            in_file: matches!(source, Source::File(_)),
        }
    }
}
