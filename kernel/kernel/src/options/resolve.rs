//! From merged options to the configurations a run is made of: the `root`, `sub` and extra
//! endpoints with one budget ledger, the REPL session, how contexts load, the RLM loop.
//! Defaults are applied here; values are checked again (a `RunOptions` can be built in Rust
//! without going through a source), and errors name the option as the front end spells it.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bridge::{
    Budget, BudgetNames, Concurrency, EndpointConfig, Endpoints, Ledger, Price, SamplingParams,
    Secret, SettingNames,
};

use super::error::{OptionError, Spelling};
use super::schema::{RunOptions, spec};
use crate::repl::{FrameLibrary, Isolation, LoadOptions, SessionConfig, check_encoding};
use crate::rlm::{CompletionRules, RlmConfig};

/// The root model's endpoint name.
pub const ROOT: &str = "root";
/// The sub-model's endpoint name (what `llm_query` calls unless told otherwise).
pub const SUB: &str = "sub";

/// Whether a server off this machine must have an API key to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keys {
    /// It must: the run calls models. A local server often needs none.
    Required,
    /// It need not: nothing is sent (a dry run).
    Optional,
}

/// `value` of option `name` checked as its schema entry says, or the error naming it.
fn check(spelling: Spelling, name: &str, text: &str) -> Result<serde_json::Value, OptionError> {
    match spec(name) {
        Some(spec) => spec.parse_text(text).map_err(|problem| OptionError::Value {
            option: spelling.option(name),
            problem,
            in_file: false,
        }),
        None => Ok(serde_json::Value::from(text)),
    }
}

/// `value` seconds of option `name` as a duration: positive, at most ten years.
pub fn seconds(spelling: Spelling, name: &str, value: f64) -> Result<Duration, OptionError> {
    check(spelling, name, &value.to_string())?;
    Ok(Duration::from_secs_f64(value))
}

fn parse_price(spelling: Spelling, name: &str, text: &str) -> Result<Price, OptionError> {
    check(spelling, name, text)?;
    let (input, output) = text.trim().split_once(':').unwrap_or_default();
    Ok(Price {
        input_per_mtok: input.trim().parse().unwrap_or_default(),
        output_per_mtok: output.trim().parse().unwrap_or_default(),
    })
}

impl RunOptions {
    /// The `root`, `sub` and extra endpoints' configurations and the run's budget, checked.
    pub fn endpoint_configs(
        &self,
        spelling: Spelling,
    ) -> Result<(Vec<EndpointConfig>, Budget), OptionError> {
        let provider = self.provider.unwrap_or_default();
        let Some(model) = self.model.clone() else {
            return Err(OptionError::NoModel {
                hint: spelling.model_hint(),
            });
        };
        let base_url = match &self.base_url {
            Some(url) => check(spelling, "base_url", url).map(|_| url.trim().to_owned())?,
            None => provider.default_base_url().to_owned(),
        };
        if let Some(url) = &self.sub_base_url {
            check(spelling, "sub_base_url", url)?;
        }
        let api_key_env = self
            .api_key_env
            .clone()
            .unwrap_or_else(|| provider.default_api_key_env().to_owned());
        let price = self
            .price
            .as_deref()
            .map(|p| parse_price(spelling, "price", p))
            .transpose()?;
        let sub_price = match &self.sub_price {
            Some(p) => Some(parse_price(spelling, "sub_price", p)?),
            None => price,
        };
        let sub_timeout = self
            .sub_timeout
            .map(|s| seconds(spelling, "sub_timeout", s))
            .transpose()?;
        // Bridge errors name the setting to change; the Python package keeps the bridge's
        // own names (`base_url` of endpoint `root`).
        let named = |name: &str| (spelling == Spelling::Flag).then(|| spelling.option(name));

        // Unset fields stay off the wire, so each server applies its own defaults (the
        // Anthropic client fills in the `max_tokens` its API requires).
        let params = SamplingParams {
            max_tokens: self.max_output_tokens,
            temperature: self.temperature,
            ..SamplingParams::default()
        };
        let config = |name: &str, url: &str, model: &str| EndpointConfig {
            name: name.to_owned(),
            provider,
            base_url: url.trim().to_owned(),
            model: model.to_owned(),
            api_key_env: Some(api_key_env.clone()),
            params: params.clone(),
            settings: SettingNames {
                base_url: named("base_url"),
                timeout: None,
                api_key_env: named("api_key_env"),
            },
            ..EndpointConfig::default()
        };
        let mut root = config(ROOT, &base_url, &model);
        root.price = price;
        // Root calls are iterations, bounded by `max_iterations`; `max_sub_calls` counts
        // only what the code asks of sub-models. Tokens and USD count every call.
        root.counts_toward_call_budget = false;
        let mut sub = config(
            SUB,
            self.sub_base_url.as_deref().unwrap_or(&base_url),
            self.sub_model.as_deref().unwrap_or(&model),
        );
        sub.price = sub_price;
        sub.settings.timeout = named("sub_timeout");
        if self.sub_base_url.is_some() {
            sub.settings.base_url = named("sub_base_url");
        }
        if let Some(t) = sub_timeout {
            sub.timeout = t;
        }
        if let Some(width) = self.batch_concurrency {
            width.apply(&mut sub);
        }
        let mut configs = vec![root, sub];
        for entry in self.extra_models.iter().flatten() {
            configs.push(extra_model(spelling, entry, &configs)?);
        }
        // The sub-model's alone: an `--extra-model` is another model, with a window of its own.
        if let Some(tokens) = self.sub_context_window {
            check(spelling, "sub_context_window", &tokens.to_string())?;
            configs[1].context_window = Some(tokens);
        }
        let budget = Budget {
            max_calls: self.max_sub_calls,
            max_tokens: self.max_tokens,
            max_usd: self.max_usd,
            max_iterations: None,
        };
        if let Some(usd) = budget.max_usd {
            check(spelling, "max_usd", &usd.to_string())?;
        }
        if budget.max_usd.is_some() && configs.iter().all(|c| c.price.is_none()) {
            return Err(OptionError::Unpriced {
                option: spelling.option("max_usd"),
                price: spelling.given("price", "INPUT:OUTPUT"),
            });
        }
        Ok((configs, budget))
    }

    /// The endpoints of [`endpoint_configs`](Self::endpoint_configs), sharing one ledger
    /// with the budget, after checking that each server off this machine has an API key to
    /// send when `keys` requires one (its variable is read through the bridge, which keeps
    /// and redacts it).
    pub fn endpoints(&self, spelling: Spelling, keys: Keys) -> Result<Arc<Endpoints>, OptionError> {
        let (configs, budget) = self.endpoint_configs(spelling)?;
        if keys == Keys::Required {
            check_keys(&configs, spelling)?;
        }
        // Refused calls name the options that set the limits.
        let names = BudgetNames {
            max_calls: Some(spelling.option("max_sub_calls")),
            max_tokens: Some(spelling.option("max_tokens")),
            max_usd: Some(spelling.option("max_usd")),
            max_iterations: Some(spelling.option("max_iterations")),
        };
        let ledger = Ledger::new(budget).with_names(names);
        let endpoints =
            Endpoints::new(configs, Arc::new(ledger)).map_err(OptionError::Endpoints)?;
        endpoints.sub_calls().set_caching(self.sub_call_cache());
        Ok(Arc::new(endpoints))
    }

    /// The endpoints of a run that may call no model (a workflow of Python steps): those of
    /// [`endpoints`](Self::endpoints) when `needed` or a root model is named, else none — a
    /// sub-call the code makes then fails, saying how to name a model in `spelling`.
    pub fn endpoints_if_needed(
        &self,
        spelling: Spelling,
        keys: Keys,
        needed: bool,
    ) -> Result<Arc<Endpoints>, OptionError> {
        if needed || self.model.is_some() {
            return self.endpoints(spelling, keys);
        }
        let hint = format!(
            "name one with {}, and {} for a different sub-model",
            spelling.model_hint(),
            spelling.option("sub_model")
        );
        let ledger = Ledger::new(Budget::default());
        Ok(Arc::new(Endpoints::none(Arc::new(ledger), hint)))
    }

    /// Whether identical sub-calls of a run are answered from its record (the sub-call
    /// cache): on unless `no_sub_call_cache`.
    pub fn sub_call_cache(&self) -> bool {
        !self.no_sub_call_cache.unwrap_or(false)
    }

    /// The fan-out width of a batch (`None`: all at once, capped by the endpoint's limiter,
    /// adaptive with `auto`).
    pub fn batch_width(&self) -> Option<usize> {
        self.batch_concurrency.and_then(Concurrency::batch_width)
    }

    /// How context files load; the encoding is looked up in Python (which starts it).
    pub fn load_options(&self, spelling: Spelling) -> Result<LoadOptions, OptionError> {
        if let Some(encoding) = &self.encoding {
            check_encoding(encoding).map_err(|e| OptionError::Encoding {
                option: spelling.option("encoding"),
                problem: e.to_string(),
            })?;
        }
        Ok(LoadOptions {
            csv_separator: match self.csv_sep {
                Some(c) => {
                    check(spelling, "csv_sep", &c.to_string())?;
                    u8::try_from(c).ok()
                }
                None => None,
            },
            skip_bad_rows: self.csv_skip_bad_rows.unwrap_or(false),
            encoding: self.encoding.clone(),
            frames: self.frames.unwrap_or(FrameLibrary::Polars),
        })
    }

    /// The REPL session's settings (contexts load as [`load_options`](Self::load_options)
    /// say).
    pub fn session_config(&self, spelling: Spelling) -> Result<SessionConfig, OptionError> {
        let mut config = SessionConfig::default();
        if let Some(s) = self.cell_timeout {
            config.cell_timeout = seconds(spelling, "cell_timeout", s)?;
        }
        config.batch_concurrency = self.batch_width();
        if let Some(mode) = self.sub_call_errors {
            config.sub_call_errors = mode;
        }
        if let Some(chars) = self.sub_call_text_chars {
            config.sub_call_text_chars = chars;
        }
        config.sub_endpoint = SUB.to_owned();
        config.load = self.load_options(spelling)?;
        config.cell_timeout_setting = spelling.option("cell_timeout");
        // Model code is untrusted: confined in a worker unless asked otherwise.
        config.isolation = self.isolation.unwrap_or(Isolation::Process);
        if let Some(bytes) = self.memory_limit {
            check(spelling, "memory_limit", &bytes.to_string())?;
        }
        config.memory_limit = self.memory_limit;
        config.on_crash = self.on_crash.unwrap_or_default();
        Ok(config)
    }

    /// The whole run's wall-clock limit.
    pub fn run_timeout(&self, spelling: Spelling) -> Result<Option<Duration>, OptionError> {
        self.timeout
            .map(|s| seconds(spelling, "timeout", s))
            .transpose()
    }

    /// The loop's settings (reads the prompt files).
    pub fn rlm_config(&self, spelling: Spelling) -> Result<RlmConfig, OptionError> {
        let mut config = RlmConfig {
            root_endpoint: ROOT.to_owned(),
            ..RlmConfig::default()
        };
        if let Some(n) = self.max_iterations {
            check(spelling, "max_iterations", &n.to_string())?;
            config.max_iterations = n;
        }
        if let Some(n) = self.max_depth {
            check(spelling, "max_depth", &n.to_string())?;
            config.max_depth = n;
        }
        config.run_timeout = self.run_timeout(spelling)?;
        config.completion = CompletionRules {
            protocol: self.protocol.unwrap_or_default(),
            code_and_final: self
                .code_and_final
                .unwrap_or(config.completion.code_and_final),
        };
        if let Some(limit) = self.output_limit {
            check(spelling, "output_limit", &limit.to_string())?;
            config.feedback.block_limit = limit;
        }
        if let Some(chars) = self.max_history_chars {
            check(spelling, "max_history_chars", &chars.to_string())?;
        }
        config.max_history_chars = self.max_history_chars;
        if let Some(n) = self.max_consecutive_failures {
            config.max_consecutive_failures = (n > 0).then_some(n);
        }
        if let Some(path) = &self.prompt_extension {
            config.prompts.extension = Some(read_prompt_file(spelling, "prompt_extension", path)?);
        }
        if let Some(path) = &self.system_prompt {
            config.prompts.system_override =
                Some(read_prompt_file(spelling, "system_prompt", path)?);
        }
        Ok(config)
    }

    /// Registers the values of the `secrets` variables with the bridge, which redacts them
    /// from everything it writes from now on; the variables stay set (the code may need
    /// them).
    pub fn register_secrets(&self, spelling: Spelling) -> Result<(), OptionError> {
        for var in self.secrets.iter().flatten() {
            let option = || spelling.given("secrets", var);
            check(spelling, "secrets", var)?;
            let problem = match std::env::var(var) {
                Ok(value) if !value.is_empty() => {
                    let value = Secret::new(value);
                    if value.is_redactable() {
                        bridge::secret::register(&value);
                        continue;
                    }
                    format!(
                        "its value is shorter than {} characters; a value that short cannot be \
                         redacted without garbling ordinary output",
                        bridge::secret::MIN_REDACTED_CHARS
                    )
                }
                Ok(_) | Err(std::env::VarError::NotPresent) => format!(
                    "the environment variable `{var}` is not set; export it, or stop naming it as a secret"
                ),
                Err(std::env::VarError::NotUnicode(_)) => format!(
                    "the value of `{var}` is not valid UTF-8, so it cannot be found in text to \
                     redact"
                ),
            };
            return Err(OptionError::Secret {
                option: option(),
                problem,
            });
        }
        Ok(())
    }
}

impl Spelling {
    /// Where a root model can be named.
    fn model_hint(self) -> &'static str {
        match self {
            Self::Flag => "`--model NAME` (or set `RLM_MODEL`, or `model` in rlm.toml)",
            Self::Keyword => {
                "`model=\"NAME\"` (or `%rlm_config --model NAME`, `RLM_MODEL`, or `model` in rlm.toml)"
            }
        }
    }
}

/// Every server off this machine has an API key to send (a local server often needs none).
fn check_keys(configs: &[EndpointConfig], spelling: Spelling) -> Result<(), OptionError> {
    for config in configs {
        let Some(var) = config.api_key_env.as_deref() else {
            continue;
        };
        let rest = config
            .base_url
            .split_once("://")
            .map_or(config.base_url.as_str(), |(_, rest)| rest);
        // Through the bridge, which holds the key from now on (the `rlm` command removes the
        // variable from its environment before the model's code runs).
        let has_key =
            bridge::secret::env_secret(var).is_some_and(|key| !key.expose().trim().is_empty());
        if !has_key && !is_loopback(rest) {
            return Err(OptionError::NoKey {
                url: config.base_url.clone(),
                var: var.to_owned(),
                option: spelling.given("api_key_env", "VAR"),
            });
        }
    }
    Ok(())
}

/// Whether the host of `rest` (a URL after its scheme) is this machine.
fn is_loopback(rest: &str) -> bool {
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host_port = authority.rsplit('@').next().unwrap_or_default();
    let host = match host_port.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => host_port.split(':').next().unwrap_or_default(),
    };
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// `NAME=MODEL[@BASE_URL]`: an endpoint like `sub` (`configs[1]`) under another name.
fn extra_model(
    spelling: Spelling,
    entry: &str,
    configs: &[EndpointConfig],
) -> Result<EndpointConfig, OptionError> {
    let option = || spelling.option("extra_models");
    let parsed = entry
        .split_once('=')
        .filter(|(name, model)| !name.trim().is_empty() && !model.trim().is_empty());
    let (Some((name, rest)), Some(sub)) = (parsed, configs.get(1)) else {
        return Err(OptionError::ExtraModel {
            option: option(),
            spec: entry.to_owned(),
        });
    };
    let name = name.trim();
    if configs.iter().any(|c| c.name == name) {
        return Err(OptionError::TakenName {
            option: option(),
            spec: entry.to_owned(),
            name: name.to_owned(),
        });
    }
    let mut settings = sub.settings.clone();
    let (model, url) = match rest.split_once('@') {
        Some((model, url)) => {
            let url = url.trim();
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(OptionError::Url {
                    option: format!("The URL of {}", spelling.given("extra_models", entry)),
                    url: url.to_owned(),
                });
            }
            if spelling == Spelling::Flag {
                settings.base_url = Some(format!("the URL of `--extra-model {entry}`"));
            }
            (model, url)
        }
        None => (rest, sub.base_url.as_str()),
    };
    Ok(EndpointConfig {
        name: name.to_owned(),
        base_url: url.to_owned(),
        model: model.trim().to_owned(),
        settings,
        ..sub.clone()
    })
}

fn read_prompt_file(spelling: Spelling, name: &str, path: &Path) -> Result<String, OptionError> {
    std::fs::read_to_string(path).map_err(|source| OptionError::PromptFile {
        option: spelling.option(name),
        path: path.to_owned(),
        source,
    })
}
