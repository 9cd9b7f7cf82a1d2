//! The keyword options of `RLM(...)`, `llm_query(...)` and `%%rlm`: the `rlm run` flags with
//! `_` for `-` (`max_iterations` is `--max-iterations`) and their command-line values (the
//! library's enums read them), resolved to the kernel's endpoints, session and loop settings as
//! `rlm run` resolves its flags (a copy of `kernel/cli/src/run.rs`; moving one mapping into the
//! kernel library for both is open work).
//!
//! The Python layer merges `%rlm_config` defaults, `RLM_*` variables and `rlm.toml` first and
//! sends the result as JSON; unknown names are refused here with the list of known ones.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bridge::{
    Budget, Concurrency, EndpointConfig, Endpoints, Ledger, Price, Provider, SamplingParams,
};
use kernel::repl::{SessionConfig, SubCallErrorMode};
use kernel::rlm::{CodeAndFinal, Protocol, RlmConfig};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use serde::Deserialize;

/// Endpoint names in the registry (as in `rlm run`).
const ROOT: &str = "root";
const SUB: &str = "sub";

/// The longest limit accepted: ten years, beyond which a limit is no limit.
const MAX_SECONDS: f64 = 10.0 * 365.0 * 86_400.0;

/// Options by their `rlm run` flag names (snake case).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Options {
    pub(crate) model: Option<String>,
    sub_model: Option<String>,
    base_url: Option<String>,
    sub_base_url: Option<String>,
    #[serde(default)]
    extra_models: Vec<String>,
    provider: Option<Provider>,
    api_key_env: Option<String>,
    max_output_tokens: Option<u32>,
    temperature: Option<f32>,
    max_iterations: Option<u32>,
    timeout: Option<f64>,
    cell_timeout: Option<f64>,
    sub_timeout: Option<f64>,
    max_sub_calls: Option<u64>,
    max_tokens: Option<u64>,
    max_usd: Option<f64>,
    price: Option<String>,
    sub_price: Option<String>,
    batch_concurrency: Option<Concurrency>,
    sub_call_errors: Option<SubCallErrorMode>,
    protocol: Option<Protocol>,
    code_and_final: Option<CodeAndFinal>,
    output_limit: Option<usize>,
    max_history_chars: Option<usize>,
    max_consecutive_failures: Option<u32>,
    prompt_extension: Option<PathBuf>,
    system_prompt: Option<PathBuf>,
    pub(crate) trajectory: Option<PathBuf>,
}

fn invalid(message: String) -> PyErr {
    PyValueError::new_err(message)
}

impl Options {
    /// Parses the JSON the Python layer sends.
    pub(crate) fn from_json(json: &str) -> PyResult<Self> {
        serde_json::from_str(json).map_err(|e| invalid(format!("Invalid RLM option: {e}")))
    }

    /// `root`, `sub` and the `extra_models`, sharing one ledger with the budget.
    pub(crate) fn endpoints(&self) -> PyResult<Arc<Endpoints>> {
        let provider = self.provider.unwrap_or_default();
        let Some(model) = self.model.clone() else {
            return Err(invalid(
                "No root model given; pass `model=\"NAME\"` (or `%rlm_config --model NAME`, `RLM_MODEL`, or `model` in rlm.toml)".to_owned(),
            ));
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
            .map(|p| parse_price("price", p))
            .transpose()?;
        let sub_price = match &self.sub_price {
            Some(p) => Some(parse_price("sub_price", p)?),
            None => price,
        };
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
            ..EndpointConfig::default()
        };
        let mut root = config(ROOT, &base_url, &model);
        root.price = price;
        root.counts_toward_call_budget = false;
        let mut sub = config(
            SUB,
            self.sub_base_url.as_deref().unwrap_or(&base_url),
            self.sub_model.as_deref().unwrap_or(&model),
        );
        sub.price = sub_price;
        if let Some(s) = self.sub_timeout {
            sub.timeout = seconds("sub_timeout", s)?;
        }
        if let Some(width) = self.batch_concurrency {
            width.apply(&mut sub);
        }
        let mut configs = vec![root, sub];
        for spec in &self.extra_models {
            let extra = extra_model(spec, &configs)?;
            configs.push(extra);
        }
        let budget = Budget {
            max_calls: self.max_sub_calls,
            max_tokens: self.max_tokens,
            max_usd: self.max_usd,
        };
        if budget.max_usd.is_some() && configs.iter().all(|c| c.price.is_none()) {
            return Err(invalid(
                "`max_usd` needs prices to count cost; pass `price=\"INPUT:OUTPUT\"` (USD per million tokens)".to_owned(),
            ));
        }
        let endpoints = Endpoints::new(configs, Arc::new(Ledger::new(budget)))
            .map_err(|e| invalid(format!("Could not set up the model endpoints: {e}")))?;
        Ok(Arc::new(endpoints))
    }

    /// The fan-out width of a batch (`None`: all at once, capped by the endpoint's limiter,
    /// adaptive with `batch_concurrency="auto"`).
    pub(crate) fn batch_concurrency(&self) -> Option<usize> {
        self.batch_concurrency.and_then(Concurrency::batch_width)
    }

    /// The REPL session's settings.
    pub(crate) fn session_config(&self) -> PyResult<SessionConfig> {
        let mut config = SessionConfig::default();
        if let Some(s) = self.cell_timeout {
            config.cell_timeout = seconds("cell_timeout", s)?;
        }
        config.batch_concurrency = self.batch_concurrency();
        if let Some(mode) = self.sub_call_errors {
            config.sub_call_errors = mode;
        }
        config.sub_endpoint = SUB.to_owned();
        Ok(config)
    }

    /// The loop's settings.
    pub(crate) fn rlm_config(&self) -> PyResult<RlmConfig> {
        let mut config = RlmConfig {
            root_endpoint: ROOT.to_owned(),
            ..RlmConfig::default()
        };
        if let Some(n) = self.max_iterations {
            if n == 0 {
                return Err(invalid("`max_iterations` must be at least 1".to_owned()));
            }
            config.max_iterations = n;
        }
        config.run_timeout = self.timeout.map(|s| seconds("timeout", s)).transpose()?;
        config.completion.protocol = self.protocol.unwrap_or_default();
        if let Some(policy) = self.code_and_final {
            config.completion.code_and_final = policy;
        }
        if let Some(limit) = self.output_limit {
            config.feedback.block_limit = limit;
        }
        config.max_history_chars = self.max_history_chars;
        if let Some(n) = self.max_consecutive_failures {
            config.max_consecutive_failures = (n > 0).then_some(n);
        }
        if let Some(path) = &self.prompt_extension {
            config.prompts.extension = Some(read_prompt_file("prompt_extension", path)?);
        }
        if let Some(path) = &self.system_prompt {
            config.prompts.system_override = Some(read_prompt_file("system_prompt", path)?);
        }
        Ok(config)
    }
}

fn seconds(name: &str, value: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(value)
        .ok()
        .filter(|d| !d.is_zero() && value <= MAX_SECONDS)
        .ok_or_else(|| {
            invalid(format!(
                "`{name}` must be a positive number of seconds up to {MAX_SECONDS:.0}, got {value}"
            ))
        })
}

fn parse_price(name: &str, text: &str) -> PyResult<Price> {
    let parsed = text.split_once(':').and_then(|(i, o)| {
        Some(Price {
            input_per_mtok: i.trim().parse().ok()?,
            output_per_mtok: o.trim().parse().ok()?,
        })
    });
    parsed.ok_or_else(|| {
        invalid(format!(
            "`{name}` takes USD per million tokens as `INPUT:OUTPUT`, e.g. `2.5:10`; got `{text}`"
        ))
    })
}

/// `NAME=MODEL[@BASE_URL]`: an endpoint like `sub` (`configs[1]`) under another name.
fn extra_model(spec: &str, configs: &[EndpointConfig]) -> PyResult<EndpointConfig> {
    let parsed = spec
        .split_once('=')
        .filter(|(name, model)| !name.trim().is_empty() && !model.trim().is_empty());
    let (Some((name, rest)), Some(sub)) = (parsed, configs.get(1)) else {
        return Err(invalid(format!(
            "`extra_models` entries take `NAME=MODEL` or `NAME=MODEL@BASE_URL`; got `{spec}`"
        )));
    };
    let name = name.trim();
    if configs.iter().any(|c| c.name == name) {
        return Err(invalid(format!(
            "`extra_models` entry `{spec}`: the name `{name}` is taken; pick another"
        )));
    }
    let (model, url) = rest.split_once('@').unwrap_or((rest, &sub.base_url));
    Ok(EndpointConfig {
        name: name.to_owned(),
        base_url: url.trim().to_owned(),
        model: model.trim().to_owned(),
        ..sub.clone()
    })
}

fn read_prompt_file(name: &str, path: &std::path::Path) -> PyResult<String> {
    std::fs::read_to_string(path).map_err(|e| {
        invalid(format!(
            "Could not read the `{name}` file `{}`: {e}",
            path.display()
        ))
    })
}
