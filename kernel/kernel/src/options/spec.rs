//! What an option is ([`OptionSpec`]) and what values it takes ([`Kind`]): every value, from
//! whatever source, is checked here and put in one canonical JSON form, which the typed
//! [`RunOptions`](super::RunOptions) field then reads.

use serde_json::Value;

/// The longest limit accepted: ten years, beyond which a limit is no limit.
pub(crate) const MAX_SECONDS: f64 = 10.0 * 365.0 * 86_400.0;

/// Where an option takes effect. A command offers the groups it uses (`rlm bench` measures
/// endpoints and runs no loop), so no flag is accepted and then ignored; a file or
/// environment value of a group a command or front end has no use for is ignored (one
/// `rlm.toml` serves them all).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Group {
    /// The models and their endpoints: names, URLs, provider, key, secrets, prices, sampling.
    Models,
    /// The budget shared by every call: sub-calls, tokens, USD.
    Budget,
    /// How many turns a loop may take.
    Iterations,
    /// The whole run's wall-clock limit.
    Timeout,
    /// The RLM loop: final-answer protocol, feedback, history, failures in a row, prompts.
    Loop,
    /// The REPL session: cell time limit, sub-calls from code.
    Session,
    /// How context files load: CSV separator, encoding, data-frame library.
    Load,
    /// The trajectory file.
    Trajectory,
    /// The live trace of a run.
    Trace,
    /// The `rlm` command's answer file. The Python package has no use for it.
    Answer,
    /// How the `rlm` command reports and writes: `--json`, `--quiet`, `--force`. The Python
    /// package has no use for them.
    Output,
    /// The roots of an agent bundle's tools and what they may touch (`rlm agent`): the
    /// project root, broad roots, hard links. The Python package runs no bundles.
    Agent,
    /// The run database of `rlm flow` (`--db`). The Python package runs no workflows.
    Database,
    /// How long a driver's lease on a run in a PostgreSQL database lasts without a heartbeat
    /// (`rlm flow run` and `resume`).
    Lease,
}

impl Group {
    /// This group as a bit of a [`Groups`] set.
    pub const fn bit(self) -> Groups {
        1 << self as u8
    }
}

/// A set of [`Group`]s, one bit each (see [`Group::bit`]).
pub type Groups = u16;

/// Every group.
pub const ALL_GROUPS: Groups = (1 << 14) - 1;

/// One value an option of [`Kind::Choice`] takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Choice {
    /// The name users write (and the canonical form).
    pub name: &'static str,
    /// Other spellings accepted.
    pub aliases: &'static [&'static str],
    /// One line on what it does.
    pub help: &'static str,
}

/// What values an option takes. Every parse gives one canonical JSON form (listed per kind).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Any text but the empty string: a string.
    Text,
    /// An `http://` or `https://` URL: a string.
    Url,
    /// A file path: a string (one from a configuration file is relative to that file).
    Path,
    /// A run database: an SQLite path (`PATH`, `sqlite:PATH`; one from a configuration file is
    /// relative to that file) or a `postgres://` URL, whose password no error repeats: a
    /// string.
    Database,
    /// The name of an environment variable (not empty, no `=` or NUL): a string.
    Variable,
    /// A whole number of at least `min`: a number.
    Whole {
        /// The least value accepted.
        min: u64,
    },
    /// A finite number: a number.
    Number,
    /// A positive number of seconds, at most ten years: a number.
    Seconds,
    /// A positive amount of USD: a number.
    Usd,
    /// A price in USD per million tokens, `INPUT:OUTPUT`: a string.
    Price,
    /// One ASCII character other than a quote or newline, or `tab`: a one-character string.
    Character,
    /// One of the listed names (or an alias): the name.
    Choice(&'static [Choice]),
    /// Requests in flight at once: a whole number ≥ 1 (a number) or `"auto"`.
    Width,
    /// On or off: `true` / `false` (also `1`/`0`, `yes`/`no`, `on`/`off` as text).
    Switch,
    /// An amount of memory of at least `min` bytes: a number of bytes, or a number with a
    /// unit `K`, `M`, `G` or `T` (powers of 1024; `MB` and `MiB` mean the same): a number
    /// of bytes.
    Size {
        /// The least number of bytes accepted.
        min: u64,
    },
}

/// One option of the schema: everything a front end needs to offer it, in its own spelling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionSpec {
    /// The name in snake case: the field, the Python keyword (`max_iterations`). The
    /// `rlm.toml` key is the same in kebab case (`max-iterations`).
    pub name: &'static str,
    /// What it does (the field's doc comment), as `--help` and Python show it.
    pub help: &'static str,
    /// The values it takes.
    pub kind: Kind,
    /// Where it takes effect.
    pub group: Group,
    /// Whether it is a list that each use adds to (`--extra-model a --extra-model b`); lists
    /// from several sources add up too (`secrets` in `rlm.toml` stay secret).
    pub repeated: bool,
    /// The environment variable that sets it, if any.
    pub env: Option<&'static str>,
    /// The command-line flag without `--`, when it is not the name in kebab case
    /// (`extra-model`, `secret`, `as`).
    pub flag: Option<&'static str>,
    /// The placeholder `--help` shows for its value (`SECONDS`, `URL`, …).
    pub value_name: Option<&'static str>,
    /// A value it accepts, as text (tests and docs use it).
    pub example: &'static str,
}

impl OptionSpec {
    /// An option of `kind` in `group`; the rest is set with the builder methods.
    pub const fn new(kind: Kind, group: Group) -> Self {
        Self {
            name: "",
            help: "",
            kind,
            group,
            repeated: false,
            env: None,
            flag: None,
            value_name: None,
            example: match kind {
                Kind::Text => "text",
                Kind::Url => "http://127.0.0.1:8000/v1",
                Kind::Path => "file.md",
                Kind::Database => "postgres://rlm@127.0.0.1:5432/runs",
                Kind::Variable => "MY_VARIABLE",
                Kind::Whole { .. } => "7",
                Kind::Number => "0.5",
                Kind::Seconds => "1.5",
                Kind::Usd => "0.25",
                Kind::Price => "2.5:10",
                Kind::Character => ";",
                Kind::Choice(choices) => match choices.first() {
                    Some(first) => first.name,
                    None => "",
                },
                Kind::Width => "auto",
                Kind::Switch => "true",
                Kind::Size { .. } => "512M",
            },
        }
    }

    /// Read from environment variable `var` too.
    pub const fn env(mut self, var: &'static str) -> Self {
        self.env = Some(var);
        self
    }

    /// Spelled `--flag` on the command line.
    pub const fn flag(mut self, flag: &'static str) -> Self {
        self.flag = Some(flag);
        self
    }

    /// `--help` shows its value as `name`.
    pub const fn value_name(mut self, name: &'static str) -> Self {
        self.value_name = Some(name);
        self
    }

    /// A list, added to by each use.
    pub const fn repeated(mut self) -> Self {
        self.repeated = true;
        self
    }

    /// `text` is a value it accepts (when the kind's own example is not).
    pub const fn example(mut self, text: &'static str) -> Self {
        self.example = text;
        self
    }

    /// The flag without `--`: `max-iterations`.
    pub fn flag_name(&self) -> String {
        self.flag
            .map_or_else(|| self.name.replace('_', "-"), str::to_owned)
    }

    /// The `rlm.toml` key: `max-iterations`.
    pub fn file_key(&self) -> String {
        self.name.replace('_', "-")
    }

    /// The help text on one line.
    pub fn help_text(&self) -> String {
        self.help.split_whitespace().collect::<Vec<_>>().join(" ")
    }

    /// `text` checked and in its canonical form; `Err` says what is wrong with it, in words
    /// that follow the option's name ("must be …").
    pub fn parse_text(&self, text: &str) -> Result<Value, String> {
        let trimmed = text.trim();
        let number = || trimmed.parse::<f64>().ok().filter(|x| x.is_finite());
        match self.kind {
            Kind::Text | Kind::Path => non_empty(text),
            Kind::Database => {
                non_empty(text)?;
                // Checked as the engine reads it (a URL's password is registered for
                // redaction there, before anything can fail); errors show no password.
                engine::durable::Location::parse(text)
                    .map(|_| Value::from(text))
                    .map_err(|e| format!("must be an SQLite path or a PostgreSQL URL: {e}"))
            }
            Kind::Url => {
                non_empty(text)?;
                if trimmed.starts_with("http://") || trimmed.starts_with("https://") {
                    Ok(Value::from(trimmed))
                } else {
                    Err(format!(
                        "must start with `http://` or `https://`, got `{text}`"
                    ))
                }
            }
            Kind::Variable => {
                if text.is_empty() || text.contains(['=', '\0']) {
                    Err(format!(
                        "takes the name of an environment variable, e.g. `OPENAI_API_KEY`; got `{text}`"
                    ))
                } else {
                    Ok(Value::from(text))
                }
            }
            Kind::Whole { min } => match trimmed.parse::<i64>() {
                Ok(n) if n >= 0 && n as u64 >= min => Ok(Value::from(n as u64)),
                Ok(n) => Err(format!("must be ≥ {min}, got {n}")),
                Err(_) => Err(format!("must be a whole number ≥ {min}, got `{text}`")),
            },
            Kind::Number => number()
                .map(Value::from)
                .ok_or_else(|| format!("must be a number, got `{text}`")),
            Kind::Seconds => number()
                .filter(|&s| s > 0.0 && s <= MAX_SECONDS)
                .map(Value::from)
                .ok_or_else(|| {
                    format!(
                        "must be a positive number of seconds up to {MAX_SECONDS:.0}, got `{text}`"
                    )
                }),
            Kind::Usd => number()
                .filter(|&usd| usd > 0.0)
                .map(Value::from)
                .ok_or_else(|| format!("must be a positive amount of USD, got `{text}`")),
            Kind::Price => {
                let valid = trimmed.split_once(':').is_some_and(|(i, o)| {
                    [i, o].iter().all(|p| {
                        p.trim()
                            .parse::<f64>()
                            .is_ok_and(|x| x >= 0.0 && x.is_finite())
                    })
                });
                if valid {
                    Ok(Value::from(trimmed))
                } else {
                    Err(format!(
                        "takes USD per million tokens as `INPUT:OUTPUT`, e.g. `2.5:10`; got `{text}`"
                    ))
                }
            }
            Kind::Character => match text {
                "tab" | "\\t" | "\t" => Ok(Value::from("\t")),
                _ => match text.as_bytes() {
                    [b] if b.is_ascii() && !matches!(b, b'"' | b'\n' | b'\r') => {
                        Ok(Value::from(text))
                    }
                    _ => Err(format!(
                        "takes one ASCII character other than a quote or newline (or `tab`), e.g. `;`; got `{text}`"
                    )),
                },
            },
            Kind::Choice(choices) => {
                let wanted = trimmed.to_ascii_lowercase();
                choices
                    .iter()
                    .find(|c| c.name == wanted || c.aliases.contains(&wanted.as_str()))
                    .map(|c| Value::from(c.name))
                    .ok_or_else(|| {
                        let names: Vec<String> =
                            choices.iter().map(|c| format!("`{}`", c.name)).collect();
                        format!("must be one of {}, got `{text}`", names.join(", "))
                    })
            }
            Kind::Width => {
                if trimmed.eq_ignore_ascii_case("auto") {
                    return Ok(Value::from("auto"));
                }
                match trimmed.parse::<u64>() {
                    Ok(n) if n >= 1 => Ok(Value::from(n)),
                    _ => Err(format!(
                        "must be a whole number ≥ 1 or `auto`, got `{trimmed}`"
                    )),
                }
            }
            Kind::Switch => match trimmed.to_ascii_lowercase().as_str() {
                "true" | "1" | "yes" | "on" => Ok(Value::Bool(true)),
                "false" | "0" | "no" | "off" => Ok(Value::Bool(false)),
                _ => Err(format!("must be `true` or `false`, got `{text}`")),
            },
            Kind::Size { min } => match bytes(trimmed) {
                Some(n) if n >= min => Ok(Value::from(n)),
                Some(_) => Err(format!("must be at least {}, got `{text}`", size_text(min))),
                None => Err(format!(
                    "must be a size such as `4G` or `512M` (or a number of bytes), got `{text}`"
                )),
            },
        }
    }

    /// `value` (from a configuration file or a keyword argument) checked and in its
    /// canonical form: a list for a repeated option (one item alone is a list of one).
    pub fn parse_json(&self, value: &Value) -> Result<Value, String> {
        if self.repeated {
            let items = match value {
                Value::Array(items) => items.as_slice(),
                one => std::slice::from_ref(one),
            };
            return items
                .iter()
                .map(|item| self.parse_scalar(item))
                .collect::<Result<Vec<_>, _>>()
                .map(Value::Array);
        }
        self.parse_scalar(value)
    }

    fn parse_scalar(&self, value: &Value) -> Result<Value, String> {
        match (self.kind, value) {
            (_, Value::String(text)) => self.parse_text(text),
            (Kind::Switch, Value::Bool(_)) => Ok(value.clone()),
            (
                Kind::Whole { .. }
                | Kind::Number
                | Kind::Seconds
                | Kind::Usd
                | Kind::Width
                | Kind::Size { .. },
                Value::Number(n),
            ) => self.parse_text(&n.to_string()),
            _ => Err(format!("must be {}, got `{value}`", self.kind.expected())),
        }
    }
}

impl Kind {
    /// What a value of this kind is, after "must be".
    fn expected(self) -> &'static str {
        match self {
            Kind::Text | Kind::Url | Kind::Path | Kind::Database | Kind::Variable | Kind::Price => {
                "a string"
            }
            Kind::Character => "a one-character string",
            Kind::Whole { .. } => "a whole number",
            Kind::Number | Kind::Seconds | Kind::Usd => "a number",
            Kind::Choice(_) => "one of its names as a string",
            Kind::Width => "a whole number or `auto`",
            Kind::Switch => "`true` or `false`",
            Kind::Size { .. } => "a size such as `4G` or a number of bytes",
        }
    }
}

/// `text` as a number of bytes: `4G`, `512 MiB`, `1.5g`, `2097152` (units are powers of
/// 1024); `None` when it is not one, or not below 2⁶² bytes.
fn bytes(text: &str) -> Option<u64> {
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().ok()?;
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return None,
    };
    let bytes = number * scale as f64;
    (bytes.is_finite() && bytes < 2f64.powi(62)).then_some(bytes as u64)
}

/// `bytes` as people write it: `1M`, `512K`, `1536` (whole units only).
fn size_text(bytes: u64) -> String {
    for (unit, scale) in [
        ("T", 1u64 << 40),
        ("G", 1 << 30),
        ("M", 1 << 20),
        ("K", 1 << 10),
    ] {
        if bytes >= scale && bytes.is_multiple_of(scale) {
            return format!("{}{unit}", bytes / scale);
        }
    }
    bytes.to_string()
}

fn non_empty(text: &str) -> Result<Value, String> {
    if text.trim().is_empty() {
        Err("must not be empty".to_owned())
    } else {
        Ok(Value::from(text))
    }
}
