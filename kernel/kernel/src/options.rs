//! Run options: the settings of `rlm run` as plain data, resolved to the bridge's endpoints and
//! the kernel's session and loop configurations — one mapping for the `rlm` binary (flags,
//! environment, `rlm.toml`) and the Python package (keywords, `%rlm_config`).
//!
//! Each front end fills a [`RunOptions`] its own way and names options its own way in errors
//! ([`Spelling`]: `--sub-price` on the command line, `sub_price` in Python); everything between
//! the options and the configurations — defaults, the `root` and `sub` endpoints, prices,
//! budgets, limits, prompt files — happens here, once.
//!
//! ```
//! use kernel::options::{RunOptions, Spelling};
//!
//! let options = RunOptions {
//!     model: Some("qwen3".into()),
//!     base_url: Some("http://127.0.0.1:8000/v1".into()),
//!     max_iterations: Some(0),
//!     ..RunOptions::default()
//! };
//! let (configs, _budget) = options.endpoint_configs(Spelling::Flag)?;
//! assert_eq!(configs[1].name, kernel::options::SUB);
//! assert_eq!(
//!     options.rlm_config(Spelling::Keyword).unwrap_err().to_string(),
//!     "`max_iterations` must be at least 1, got 0"
//! );
//! # Ok::<(), kernel::options::OptionError>(())
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bridge::{
    BridgeError, Budget, Concurrency, EndpointConfig, Endpoints, Ledger, Price, Provider,
    SamplingParams, SettingNames,
};
use serde::Deserialize;

use crate::repl::{SessionConfig, SubCallErrorMode};
use crate::rlm::{CodeAndFinal, CompletionRules, Protocol, RlmConfig};

/// The root model's endpoint name.
pub const ROOT: &str = "root";
/// The sub-model's endpoint name (what `llm_query` calls unless told otherwise).
pub const SUB: &str = "sub";

/// The longest limit accepted: ten years, beyond which a limit is no limit.
const MAX_SECONDS: f64 = 10.0 * 365.0 * 86_400.0;

/// The options of a run, by their `rlm run` flag names in snake case; unset means the default.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunOptions {
    /// Root model name.
    pub model: Option<String>,
    /// Sub-model name (default: the root model).
    pub sub_model: Option<String>,
    /// Base URL of the root model's API (default: the provider's).
    pub base_url: Option<String>,
    /// Base URL of the sub-model's API (default: `base_url`).
    pub sub_base_url: Option<String>,
    /// More sub-models, as `NAME=MODEL` or `NAME=MODEL@BASE_URL`.
    #[serde(default)]
    pub extra_models: Vec<String>,
    /// Wire format of the model API.
    pub provider: Option<Provider>,
    /// Environment variable holding the API key (default: the provider's).
    pub api_key_env: Option<String>,
    /// Most tokens one model reply may have.
    pub max_output_tokens: Option<u32>,
    /// Sampling temperature of every model call.
    pub temperature: Option<f32>,
    /// Maximum root-model iterations.
    pub max_iterations: Option<u32>,
    /// Wall-clock limit of the run, in seconds.
    pub timeout: Option<f64>,
    /// Wall-clock limit of one code block, in seconds.
    pub cell_timeout: Option<f64>,
    /// Timeout of one sub-model HTTP attempt, in seconds.
    pub sub_timeout: Option<f64>,
    /// Budget: sub-model calls.
    pub max_sub_calls: Option<u64>,
    /// Budget: tokens of every call.
    pub max_tokens: Option<u64>,
    /// Budget: USD (needs prices).
    pub max_usd: Option<f64>,
    /// Price of the root model, `INPUT:OUTPUT` USD per million tokens.
    pub price: Option<String>,
    /// Price of the sub-model (default: `price`).
    pub sub_price: Option<String>,
    /// Sub-model requests in flight at once, or `auto`.
    pub batch_concurrency: Option<Concurrency>,
    /// What a failed sub-call gives the code.
    pub sub_call_errors: Option<SubCallErrorMode>,
    /// Characters of each sub-call's prompt and reply kept in the trajectory.
    pub sub_call_text_chars: Option<usize>,
    /// Which final-answer conventions count.
    pub protocol: Option<Protocol>,
    /// A reply with both code and a final line.
    pub code_and_final: Option<CodeAndFinal>,
    /// Characters of output shown to the root model per code block.
    pub output_limit: Option<usize>,
    /// Character budget of the conversation sent to the root model.
    pub max_history_chars: Option<usize>,
    /// Failing iterations in a row before the run stops (`0`: no limit).
    pub max_consecutive_failures: Option<u32>,
    /// A file whose text is appended to the system prompt.
    pub prompt_extension: Option<PathBuf>,
    /// A file whose text replaces the system prompt.
    pub system_prompt: Option<PathBuf>,
    /// Where the trajectory goes (the front end opens it).
    pub trajectory: Option<PathBuf>,
}

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
    fn option(self, name: &str) -> String {
        match (self, name) {
            // The flag is repeated once per model.
            (Self::Flag, "extra_models") => "`--extra-model`".to_owned(),
            (Self::Flag, _) => format!("`--{}`", name.replace('_', "-")),
            (Self::Keyword, _) => format!("`{name}`"),
        }
    }

    /// The option `name` given `value`, in backticks: `` `--price IN:OUT` ``.
    fn given(self, name: &str, value: &str) -> String {
        match self {
            Self::Flag => format!("`--{} {value}`", name.replace('_', "-")),
            Self::Keyword => format!("`{name}=\"{value}\"`"),
        }
    }

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

/// Why options do not make a run; the option is named as the front end spells it.
#[derive(Debug, thiserror::Error)]
pub enum OptionError {
    /// No root model.
    #[error("No root model given; pass {hint}")]
    NoModel {
        /// Where to name one.
        hint: &'static str,
    },
    /// A duration that is not a positive number of seconds (or is over ten years).
    #[error("{option} must be a positive number of seconds up to {MAX_SECONDS:.0}, got {value}")]
    Seconds {
        /// The option.
        option: String,
        /// What it was given.
        value: f64,
    },
    /// A count that must be at least 1.
    #[error("{option} must be at least 1, got 0")]
    Zero {
        /// The option.
        option: String,
    },
    /// A price that is not `INPUT:OUTPUT` USD per million tokens.
    #[error("{option} takes USD per million tokens as `INPUT:OUTPUT`, e.g. `2.5:10`; got `{text}`")]
    Price {
        /// The option.
        option: String,
        /// What it was given.
        text: String,
    },
    /// A USD budget that is not a positive amount.
    #[error("{option} must be a positive amount of USD, got {value}")]
    Usd {
        /// The option.
        option: String,
        /// What it was given.
        value: f64,
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
        !matches!(self, Self::PromptFile { .. } | Self::Endpoints(_))
    }
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
        let base_url = self
            .base_url
            .clone()
            .unwrap_or_else(|| provider.default_base_url().to_owned());
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
            base_url: url.to_owned(),
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
        for spec in &self.extra_models {
            configs.push(extra_model(spelling, spec, &configs)?);
        }
        let budget = Budget {
            max_calls: self.max_sub_calls,
            max_tokens: self.max_tokens,
            max_usd: self.max_usd,
            max_iterations: None,
        };
        if let Some(usd) = budget.max_usd
            && !(usd > 0.0 && usd.is_finite())
        {
            return Err(OptionError::Usd {
                option: spelling.option("max_usd"),
                value: usd,
            });
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
    /// with the budget.
    pub fn endpoints(&self, spelling: Spelling) -> Result<Arc<Endpoints>, OptionError> {
        let (configs, budget) = self.endpoint_configs(spelling)?;
        build_endpoints(configs, budget)
    }

    /// The fan-out width of a batch (`None`: all at once, capped by the endpoint's limiter,
    /// adaptive with `auto`).
    pub fn batch_width(&self) -> Option<usize> {
        self.batch_concurrency.and_then(Concurrency::batch_width)
    }

    /// The REPL session's settings.
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
        Ok(config)
    }

    /// The loop's settings (reads the prompt files).
    pub fn rlm_config(&self, spelling: Spelling) -> Result<RlmConfig, OptionError> {
        let mut config = RlmConfig {
            root_endpoint: ROOT.to_owned(),
            ..RlmConfig::default()
        };
        if let Some(n) = self.max_iterations {
            if n == 0 {
                return Err(OptionError::Zero {
                    option: spelling.option("max_iterations"),
                });
            }
            config.max_iterations = n;
        }
        config.run_timeout = self
            .timeout
            .map(|s| seconds(spelling, "timeout", s))
            .transpose()?;
        config.completion = CompletionRules {
            protocol: self.protocol.unwrap_or_default(),
            code_and_final: self
                .code_and_final
                .unwrap_or(config.completion.code_and_final),
        };
        if let Some(limit) = self.output_limit {
            config.feedback.block_limit = limit;
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
}

/// Endpoints over `configs`, sharing one ledger with `budget`.
pub fn build_endpoints(
    configs: Vec<EndpointConfig>,
    budget: Budget,
) -> Result<Arc<Endpoints>, OptionError> {
    let endpoints =
        Endpoints::new(configs, Arc::new(Ledger::new(budget))).map_err(OptionError::Endpoints)?;
    Ok(Arc::new(endpoints))
}

/// `value` seconds of option `name` as a duration: positive, at most ten years.
pub fn seconds(spelling: Spelling, name: &str, value: f64) -> Result<Duration, OptionError> {
    Duration::try_from_secs_f64(value)
        .ok()
        .filter(|d| !d.is_zero() && value <= MAX_SECONDS)
        .ok_or_else(|| OptionError::Seconds {
            option: spelling.option(name),
            value,
        })
}

fn parse_price(spelling: Spelling, name: &str, text: &str) -> Result<Price, OptionError> {
    let parsed = text.split_once(':').and_then(|(i, o)| {
        Some(Price {
            input_per_mtok: i.trim().parse().ok()?,
            output_per_mtok: o.trim().parse().ok()?,
        })
    });
    parsed
        .filter(|p| p.input_per_mtok >= 0.0 && p.output_per_mtok >= 0.0)
        .ok_or_else(|| OptionError::Price {
            option: spelling.option(name),
            text: text.to_owned(),
        })
}

/// `NAME=MODEL[@BASE_URL]`: an endpoint like `sub` (`configs[1]`) under another name.
fn extra_model(
    spelling: Spelling,
    spec: &str,
    configs: &[EndpointConfig],
) -> Result<EndpointConfig, OptionError> {
    let option = || spelling.option("extra_models");
    let parsed = spec
        .split_once('=')
        .filter(|(name, model)| !name.trim().is_empty() && !model.trim().is_empty());
    let (Some((name, rest)), Some(sub)) = (parsed, configs.get(1)) else {
        return Err(OptionError::ExtraModel {
            option: option(),
            spec: spec.to_owned(),
        });
    };
    let name = name.trim();
    if configs.iter().any(|c| c.name == name) {
        return Err(OptionError::TakenName {
            option: option(),
            spec: spec.to_owned(),
            name: name.to_owned(),
        });
    }
    let mut settings = sub.settings.clone();
    let (model, url) = match rest.split_once('@') {
        Some((model, url)) => {
            if spelling == Spelling::Flag {
                settings.base_url = Some(format!("the URL of `--extra-model {spec}`"));
            }
            (model, url)
        }
        None => (rest, sub.base_url.as_str()),
    };
    Ok(EndpointConfig {
        name: name.to_owned(),
        base_url: url.trim().to_owned(),
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

#[cfg(test)]
#[allow(clippy::unwrap_used)] // In tests an unwrap is an assertion.
mod tests {
    use super::*;

    fn options() -> RunOptions {
        RunOptions {
            model: Some("m".into()),
            base_url: Some("http://127.0.0.1:9/v1".into()),
            ..RunOptions::default()
        }
    }

    #[test]
    fn errors_name_the_option_as_each_front_end_spells_it() {
        let bad = RunOptions {
            sub_price: Some("1:-2".into()),
            ..options()
        };
        let message = |s| bad.endpoint_configs(s).unwrap_err().to_string();
        assert_eq!(
            message(Spelling::Flag),
            "`--sub-price` takes USD per million tokens as `INPUT:OUTPUT`, e.g. `2.5:10`; got `1:-2`"
        );
        assert_eq!(
            message(Spelling::Keyword),
            "`sub_price` takes USD per million tokens as `INPUT:OUTPUT`, e.g. `2.5:10`; got `1:-2`"
        );
        let unpriced = RunOptions {
            max_usd: Some(1.0),
            ..options()
        };
        assert_eq!(
            unpriced
                .endpoints(Spelling::Keyword)
                .unwrap_err()
                .to_string(),
            "`max_usd` needs prices to count cost; pass `price=\"INPUT:OUTPUT\"` (USD per million tokens)"
        );
        let extra = RunOptions {
            extra_models: vec!["sub=other".into()],
            ..options()
        };
        assert_eq!(
            extra.endpoints(Spelling::Flag).unwrap_err().to_string(),
            "`--extra-model` entry `sub=other`: the name `sub` is taken; pick another"
        );
        let none = RunOptions::default().endpoints(Spelling::Flag).unwrap_err();
        assert!(none.is_usage());
        assert_eq!(
            none.to_string(),
            "No root model given; pass `--model NAME` (or set `RLM_MODEL`, or `model` in rlm.toml)"
        );
    }

    #[test]
    fn root_sub_and_extra_endpoints_share_the_defaults() {
        let options = RunOptions {
            sub_model: Some("small".into()),
            price: Some("1:2".into()),
            sub_timeout: Some(5.0),
            max_sub_calls: Some(7),
            extra_models: vec![
                "judge=big@http://127.0.0.1:10/v1".into(),
                "cheap=tiny".into(),
            ],
            ..options()
        };
        let (configs, budget) = options.endpoint_configs(Spelling::Flag).unwrap();
        let names: Vec<(&str, &str, &str)> = configs
            .iter()
            .map(|c| (c.name.as_str(), c.model.as_str(), c.base_url.as_str()))
            .collect();
        assert_eq!(
            names,
            [
                ("root", "m", "http://127.0.0.1:9/v1"),
                ("sub", "small", "http://127.0.0.1:9/v1"),
                ("judge", "big", "http://127.0.0.1:10/v1"),
                ("cheap", "tiny", "http://127.0.0.1:9/v1"),
            ]
        );
        assert!(!configs[0].counts_toward_call_budget);
        assert_eq!(
            configs[1].price, configs[0].price,
            "`sub_price` defaults to `price`"
        );
        assert_eq!(configs[1].timeout, Duration::from_secs(5));
        assert_eq!(
            configs[3].timeout,
            Duration::from_secs(5),
            "extras are like `sub`"
        );
        assert_eq!(budget.max_calls, Some(7));
    }

    #[test]
    fn a_missing_prompt_file_is_not_a_usage_error() {
        let options = RunOptions {
            system_prompt: Some("/nonexistent/system.md".into()),
            ..options()
        };
        let err = options.rlm_config(Spelling::Flag).unwrap_err();
        assert!(!err.is_usage());
        assert_eq!(
            err.to_string(),
            "Could not read the `--system-prompt` file `/nonexistent/system.md`"
        );
    }
}
