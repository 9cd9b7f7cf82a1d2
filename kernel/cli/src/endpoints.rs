//! From settings to the kernel: the `root`, `sub` and `--extra-model` endpoints with their
//! shared budget ledger, the REPL session's and the loop's configurations — through
//! `kernel::options`, the mapping the Python package uses too — and the checks only a
//! command line makes before any call (every base URL is `http(s)://`, a server off this
//! machine has an API key). Option errors are usage errors (exit 2) naming the flag.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use bridge::{EndpointConfig, Endpoints};
use kernel::options::{self, OptionError, ROOT, SUB, Spelling};
use kernel::repl::SessionConfig;
use kernel::rlm::RlmConfig;
use serde_json::{Map, Value};

use crate::exit::UsageError;
use crate::settings::RunOptions;

/// A mistake in the options: exit code 2.
fn usage(message: impl Into<String>) -> anyhow::Error {
    UsageError::new(message).into()
}

/// An option error as the binary reports it: wrong options are a usage error (exit 2).
fn option_error(error: OptionError) -> anyhow::Error {
    if error.is_usage() {
        UsageError::new(error.to_string()).into()
    } else {
        error.into()
    }
}

/// The model and loop options, as the kernel resolves them (the same mapping as the Python
/// package's).
fn kernel_options(opts: &RunOptions) -> options::RunOptions {
    options::RunOptions {
        model: opts.model.clone(),
        sub_model: opts.sub_model.clone(),
        base_url: opts.base_url.clone(),
        sub_base_url: opts.sub_base_url.clone(),
        extra_models: opts.extra_models.clone(),
        provider: opts.provider,
        api_key_env: opts.api_key_env.clone(),
        max_output_tokens: opts.max_output_tokens,
        temperature: opts.temperature,
        max_iterations: opts.max_iterations,
        timeout: opts.timeout,
        cell_timeout: opts.cell_timeout,
        sub_timeout: opts.sub_timeout,
        max_sub_calls: opts.max_sub_calls,
        max_tokens: opts.max_tokens,
        max_usd: opts.max_usd,
        price: opts.price.clone(),
        sub_price: opts.sub_price.clone(),
        batch_concurrency: opts.batch_concurrency,
        sub_call_errors: opts.sub_call_errors,
        sub_call_text_chars: opts.sub_call_text_chars,
        protocol: opts.protocol,
        code_and_final: opts.code_and_final,
        output_limit: opts.output_limit,
        max_history_chars: opts.max_history_chars,
        max_consecutive_failures: opts.max_consecutive_failures,
        prompt_extension: opts.prompt_extension.clone(),
        system_prompt: opts.system_prompt.clone(),
        trajectory: opts.trajectory.clone(),
    }
}

/// The model and loop options as the Python package's keywords, for runs made through it
/// (`rlm eval --ray`): `rlm run`'s options by the same names, paths made absolute (the runs
/// happen in other folders). `--trajectory` is left out: each command names its own files.
pub(crate) fn keyword_options(opts: &RunOptions) -> Result<Map<String, Value>> {
    let o = kernel_options(opts);
    if o.sub_call_text_chars.is_some() {
        return Err(usage(
            "`--sub-call-text-chars` is not an option of the Python package, which makes the runs of `--ray`; leave it out with `--ray`",
        ));
    }
    let absolute =
        |path: &Option<std::path::PathBuf>| path.as_deref().map(std::path::absolute).transpose();
    let value = serde_json::json!({
        "model": o.model,
        "sub_model": o.sub_model,
        "base_url": o.base_url,
        "sub_base_url": o.sub_base_url,
        "extra_models": (!o.extra_models.is_empty()).then_some(&o.extra_models),
        "provider": o.provider,
        "api_key_env": o.api_key_env,
        "max_output_tokens": o.max_output_tokens,
        "temperature": o.temperature,
        "max_iterations": o.max_iterations,
        "timeout": o.timeout,
        "cell_timeout": o.cell_timeout,
        "sub_timeout": o.sub_timeout,
        "max_sub_calls": o.max_sub_calls,
        "max_tokens": o.max_tokens,
        "max_usd": o.max_usd,
        "price": o.price,
        "sub_price": o.sub_price,
        "batch_concurrency": o.batch_concurrency,
        "sub_call_errors": o.sub_call_errors,
        "protocol": o.protocol,
        "code_and_final": o.code_and_final,
        "output_limit": o.output_limit,
        "max_history_chars": o.max_history_chars,
        "max_consecutive_failures": o.max_consecutive_failures,
        "prompt_extension": absolute(&o.prompt_extension)?,
        "system_prompt": absolute(&o.system_prompt)?,
    });
    let map = value.as_object().cloned().unwrap_or_default();
    Ok(map.into_iter().filter(|(_, v)| !v.is_null()).collect())
}

/// `value` seconds of `--{flag}`: positive, at most ten years.
pub(crate) fn seconds(flag: &str, value: f64) -> Result<Duration> {
    options::seconds(Spelling::Flag, flag, value).map_err(option_error)
}

/// Builds the `root`, `sub` and `--extra-model` endpoints, sharing one ledger with the run's budget.
pub(crate) fn build_endpoints(opts: &RunOptions) -> Result<Arc<Endpoints>> {
    endpoints(opts, Keys::Required)
}

/// Whether a server off this machine must have an API key to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Keys {
    /// It must: the run calls models.
    Required,
    /// It need not: nothing is sent (`--dry-run`).
    Optional,
}

pub(crate) fn endpoints(opts: &RunOptions, keys: Keys) -> Result<Arc<Endpoints>> {
    let (configs, budget) = kernel_options(opts)
        .endpoint_configs(Spelling::Flag)
        .map_err(option_error)?;
    check_urls_and_keys(&configs, opts, keys)?;
    options::build_endpoints(configs, budget).map_err(option_error)
}

/// Before any call: every base URL is an `http(s)://` URL, and a server off this machine has
/// an API key to send (a local server often needs none). Each message names the flag or the
/// variable to set.
fn check_urls_and_keys(configs: &[EndpointConfig], opts: &RunOptions, keys: Keys) -> Result<()> {
    for config in configs {
        let flag = match config.name.as_str() {
            ROOT => "--base-url",
            SUB if opts.sub_base_url.is_some() => "--sub-base-url",
            SUB => "--base-url",
            _ => "--extra-model",
        };
        let url = config.base_url.as_str();
        let Some(rest) = url
            .strip_prefix("http://")
            .or_else(|| url.strip_prefix("https://"))
        else {
            return Err(usage(format!(
                "`{flag}` must start with `http://` or `https://`, got `{url}`"
            )));
        };
        let Some(var) = config
            .api_key_env
            .as_deref()
            .filter(|_| keys == Keys::Required)
        else {
            continue;
        };
        // Through the bridge: the variable itself has left the environment by now.
        let has_key =
            bridge::secret::env_secret(var).is_some_and(|key| !key.expose().trim().is_empty());
        if !has_key && !is_loopback(rest) {
            return Err(usage(format!(
                "`{url}` needs an API key and `{var}` is not set; export `{var}` with your key, or \
                 name the variable that holds it with `--api-key-env VAR`"
            )));
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

/// The REPL session's settings.
pub(crate) fn session_config(opts: &RunOptions) -> Result<SessionConfig> {
    kernel_options(opts)
        .session_config(Spelling::Flag)
        .map_err(option_error)
}

/// The RLM loop's settings (reads the prompt files).
pub(crate) fn rlm_config(opts: &RunOptions) -> Result<RlmConfig> {
    kernel_options(opts)
        .rlm_config(Spelling::Flag)
        .map_err(option_error)
}
