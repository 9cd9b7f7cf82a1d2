//! The sources of options, each read into a [`RunOptions`] of its own: the environment
//! (`RLM_*`), a configuration file's `[run]` table, command-line flags (text) and keyword
//! arguments (JSON). Every value is checked by its [`OptionSpec`] on the way in, so an error
//! names the option as that source spells it.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use super::error::{OptionError, Source};
use super::schema::{OPTIONS, RunOptions};
use super::spec::{Kind, OptionSpec};

/// The variable naming the configuration file when no `--config` does.
pub const CONFIG_VARIABLE: &str = "RLM_CONFIG";

/// The configuration file looked for in the working directory.
pub const CONFIG_FILE: &str = "rlm.toml";

/// The configuration file in use: `explicit` (`--config`), else the file `RLM_CONFIG` names,
/// else `./rlm.toml` when it exists. A named file must exist; reading it says so.
pub fn config_file(explicit: Option<&Path>) -> Option<PathBuf> {
    if let Some(path) = explicit {
        return Some(path.to_path_buf());
    }
    if let Some(named) = std::env::var_os(CONFIG_VARIABLE).filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(named));
    }
    Some(PathBuf::from(CONFIG_FILE)).filter(|p| p.exists())
}

impl RunOptions {
    /// The options the environment sets (`RLM_MODEL`, …; see [`OptionSpec::env`]). A
    /// variable set to the empty string counts as unset.
    pub fn from_env() -> Result<Self, OptionError> {
        Self::from_env_with(|var| std::env::var(var).ok())
    }

    /// [`from_env`](Self::from_env) with the variables `get` gives.
    pub fn from_env_with(get: impl Fn(&str) -> Option<String>) -> Result<Self, OptionError> {
        let mut values = Map::new();
        for spec in OPTIONS {
            let Some(text) = spec.env.and_then(&get).filter(|t| !t.is_empty()) else {
                continue;
            };
            let value = spec
                .parse_json(&Value::String(text))
                .map_err(|problem| OptionError::value(&Source::Environment, spec, problem))?;
            values.insert(spec.name.to_owned(), value);
        }
        canonical(values, &Source::Environment)
    }

    /// The `[run]` table of the configuration file `path` (keys are the option names in
    /// kebab case, `max-iterations = 20`); a relative path in it is relative to the file.
    pub fn from_file(path: &Path) -> Result<Self, OptionError> {
        let file_error = |problem: String| OptionError::File {
            path: path.to_path_buf(),
            problem: Some(problem),
            source: None,
        };
        // Within the size and nesting limits of every document the runtime reads.
        let text = engine::document::read_to_string(path).map_err(|e| OptionError::File {
            path: path.to_path_buf(),
            problem: None,
            source: Some(e),
        })?;
        let mut document: toml::Table = engine::document::from_toml(&text).map_err(|e| {
            if e.limit {
                file_error(e.message)
            } else {
                file_error(format!(
                    "it is not valid TOML (line {}, column {}): {}",
                    e.line, e.column, e.message
                ))
            }
        })?;
        if let Some(other) = document.keys().find(|k| *k != "run") {
            return Err(file_error(format!(
                "unknown table `{other}`; options go in a `[run]` table, e.g. `[run]` then `max-iterations = 20`"
            )));
        }
        let table = match document.remove("run") {
            None => toml::Table::new(),
            Some(toml::Value::Table(table)) => table,
            Some(_) => return Err(file_error("`run` must be a table: `[run]`".to_owned())),
        };
        let source = Source::File(path.to_path_buf());
        let dir = path.parent().unwrap_or(Path::new(""));
        let mut values = Map::new();
        for (key, value) in table {
            let Some(spec) = find(&key.replace('-', "_")) else {
                return Err(file_error(format!(
                    "unknown option `{key}` in `[run]`; the options are the flag names: {}",
                    known(|spec| spec.file_key())
                )));
            };
            let json = serde_json::to_value(&value).unwrap_or(Value::Null);
            let mut value = spec
                .parse_json(&json)
                .map_err(|problem| OptionError::value(&source, spec, problem))?;
            let path = match spec.kind {
                Kind::Path => value.as_str().map(PathBuf::from),
                // An SQLite file's path (without `sqlite:`); a URL stays as it is.
                Kind::Database => match value.as_str().map(engine::durable::Location::parse) {
                    Some(Ok(engine::durable::Location::Sqlite(path))) => Some(path),
                    _ => None,
                },
                _ => None,
            };
            if let Some(relative) = path.filter(|p| p.is_relative()) {
                value = Value::from(dir.join(relative).to_string_lossy().into_owned());
            }
            values.insert(spec.name.to_owned(), value);
        }
        canonical(values, &source)
    }

    /// Options given as text by name (snake case): each entry holds every use of one
    /// option, as command-line flags or a magic's line give them.
    pub fn from_text<'a>(
        source: &Source,
        given: impl IntoIterator<Item = (&'a str, Vec<String>)>,
    ) -> Result<Self, OptionError> {
        let mut values = Map::new();
        for (name, texts) in given {
            let spec = find(name).ok_or_else(|| unknown(source, name))?;
            let value = if spec.repeated {
                Value::Array(texts.into_iter().map(Value::String).collect())
            } else {
                match texts.into_iter().last() {
                    Some(text) => Value::String(text),
                    None => continue,
                }
            };
            let value = spec
                .parse_json(&value)
                .map_err(|problem| OptionError::value(source, spec, problem))?;
            values.insert(spec.name.to_owned(), value);
        }
        canonical(values, source)
    }

    /// Options given as JSON values by name (snake case): keyword arguments. `null` is unset.
    pub fn from_json(source: &Source, given: &Map<String, Value>) -> Result<Self, OptionError> {
        let mut values = Map::new();
        for (name, value) in given {
            let spec = find(name).ok_or_else(|| unknown(source, name))?;
            if value.is_null() {
                continue;
            }
            let value = spec
                .parse_json(value)
                .map_err(|problem| OptionError::value(source, spec, problem))?;
            values.insert(spec.name.to_owned(), value);
        }
        canonical(values, source)
    }
}

fn find(name: &str) -> Option<&'static OptionSpec> {
    super::schema::spec(name)
}

fn known(spell: impl Fn(&OptionSpec) -> String) -> String {
    OPTIONS
        .iter()
        .map(|spec| format!("`{}`", spell(spec)))
        .collect::<Vec<_>>()
        .join(", ")
}

fn unknown(source: &Source, name: &str) -> OptionError {
    let (where_, given, known) = match source {
        Source::Flag => (
            "the command line".to_owned(),
            format!("`--{}`", name.replace('_', "-")),
            known(|spec| format!("--{}", spec.flag_name())),
        ),
        Source::Environment => (
            "the environment".to_owned(),
            format!("`{name}`"),
            known(|spec| spec.env.unwrap_or_default().to_owned()),
        ),
        Source::File(path) => (
            format!("`{}`", path.display()),
            format!("`{name}`"),
            known(OptionSpec::file_key),
        ),
        Source::Keyword => (
            "the keyword arguments".to_owned(),
            format!("`{name}`"),
            known(|spec| spec.name.to_owned()),
        ),
    };
    OptionError::Unknown {
        where_,
        given,
        known,
    }
}

/// The typed options of checked values (a failure here is a schema whose kind and field type
/// disagree, which the schema's tests rule out).
fn canonical(values: Map<String, Value>, source: &Source) -> Result<RunOptions, OptionError> {
    let names: Vec<String> = values.keys().cloned().collect();
    RunOptions::from_canonical(values).map_err(|e| OptionError::Value {
        option: format!("{} (one of {})", source_label(source), names.join(", ")),
        problem: format!("could not be read: {e}; please report this as a bug"),
        in_file: matches!(source, Source::File(_)),
    })
}

fn source_label(source: &Source) -> String {
    match source {
        Source::Flag => "a flag".to_owned(),
        Source::Environment => "a variable".to_owned(),
        Source::File(path) => format!("an option in `{}`", path.display()),
        Source::Keyword => "a keyword".to_owned(),
    }
}
