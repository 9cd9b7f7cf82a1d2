//! `rlm mock-lm`: the mock LM server in the foreground until Ctrl-C.

use std::io::Write as _;

use std::path::PathBuf;

use anyhow::{Context, Result};
use bridge::mock::{FaultKind, MockConfig, MockOptions, MockServer, Script};
use clap::Args;

use kernel::options::RunOptions;

use crate::settings::at_least;

/// Arguments of `rlm mock-lm`.
#[derive(Debug, Args)]
pub(crate) struct MockLmArgs {
    /// Port on 127.0.0.1 (0 picks a free one).
    #[arg(long, default_value_t = 8000)]
    pub(crate) port: u16,

    /// Script file (JSON) describing the models' behaviour (default: echo every prompt):
    /// replies by turn, regex rules (also on the last tool result), tool calls; the format is
    /// in the `bridge::mock` docs.
    #[arg(long, value_name = "FILE")]
    pub(crate) script: Option<PathBuf>,

    /// Latency per request in milliseconds: fixed, or the minimum with `--latency-max-ms`,
    /// or the mean with `--latency-sd-ms`.
    #[arg(long, value_name = "MS")]
    pub(crate) latency_ms: Option<f64>,

    /// Uniform latency between `--latency-ms` and this, in milliseconds.
    #[arg(
        long,
        value_name = "MS",
        requires = "latency_ms",
        conflicts_with = "latency_sd_ms"
    )]
    pub(crate) latency_max_ms: Option<f64>,

    /// Normal latency around `--latency-ms` with this standard deviation, in milliseconds.
    #[arg(long, value_name = "MS", requires = "latency_ms")]
    pub(crate) latency_sd_ms: Option<f64>,

    /// Share of chat requests that fail with an injected fault (0.0 – 1.0).
    #[arg(long, default_value_t = 0.0)]
    pub(crate) fault_rate: f64,

    /// Faults to draw from, comma-separated: 429, 500, 503, hang, reset, malformed, truncated.
    #[arg(long, default_value = "429,500,503")]
    pub(crate) faults: String,

    /// Seconds announced in `Retry-After` of injected 429s.
    #[arg(long, value_name = "SECONDS")]
    pub(crate) retry_after: Option<f64>,

    /// Seconds an injected hang lasts.
    #[arg(long, value_name = "SECONDS")]
    pub(crate) hang: Option<f64>,

    /// Require this API key (`Authorization: Bearer` or `x-api-key`).
    #[arg(long, env = "RLM_MOCK_API_KEY", hide_env_values = true)]
    pub(crate) api_key: Option<String>,

    /// Seed of the fault and latency draws.
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,

    /// Serve at most N chat requests at once, like a rate-limited API: one more is answered
    /// 429 at once, with `Retry-After` (`--retry-after`, default 1 s).
    #[arg(long, value_name = "N", value_parser = at_least::<usize>(1))]
    pub(crate) capacity: Option<usize>,
}

/// Starts the mock LM server in-process with `script` and points `opts` at it (OpenAI wire
/// format, root model `root`, sub-model `sub`): the scripted models of `rlm demo` and `rlm eval`.
pub(crate) fn start_scripted(
    script: Script,
    opts: &mut RunOptions,
    root: &str,
    sub: &str,
) -> Result<MockServer> {
    let server = kernel::runtime::shared()
        .block_on(MockServer::start(MockConfig {
            script,
            ..MockConfig::default()
        }))
        .context("Could not start the mock LM server on 127.0.0.1")?;
    opts.base_url = Some(server.openai_base_url());
    opts.sub_base_url = None;
    opts.provider = Some(bridge::Provider::OpenAi);
    opts.model = Some(root.to_owned());
    opts.sub_model = Some(sub.to_owned());
    Ok(server)
}

pub(crate) async fn serve(args: MockLmArgs) -> Result<()> {
    let faults = if args.fault_rate > 0.0 {
        FaultKind::parse_list(&args.faults)?
    } else {
        Vec::new()
    };
    let options = MockOptions {
        script: args.script,
        port: Some(args.port),
        latency_ms: args.latency_ms,
        latency_max_ms: args.latency_max_ms,
        latency_sd_ms: args.latency_sd_ms,
        fault_rate: args.fault_rate,
        faults,
        retry_after_secs: args.retry_after,
        hang_secs: args.hang,
        seed: args.seed,
        api_key: args.api_key,
        capacity: args.capacity,
        ..MockOptions::default()
    };
    let config = options.into_config()?;
    let server = MockServer::start(config).await.with_context(|| {
        format!(
            "Could not listen on 127.0.0.1:{}; is the port in use? Try `--port 0`",
            args.port
        )
    })?;
    // The URLs alone on stdout, one a line (OpenAI-compatible, then Anthropic), for scripts
    // that start it in the background with stdout in a file (it serves until Ctrl-C, so
    // `$(rlm mock-lm | head -1)` would wait for ever). Written, not `println!`ed: a server
    // whose output was closed keeps serving.
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(
        stdout,
        "{}\n{}",
        server.openai_base_url(),
        server.anthropic_base_url()
    );
    let _ = stdout.flush();
    drop(stdout);
    let _ = writeln!(
        std::io::stderr(),
        "mock LM server listening (scripted models, not a real language model)\n  \
         OpenAI-compatible: {}\n  Anthropic:         {}\nPress Ctrl-C to stop.",
        server.openai_base_url(),
        server.anthropic_base_url()
    );
    tokio::signal::ctrl_c()
        .await
        .context("Could not wait for Ctrl-C")?;
    let log = server.log();
    server.shutdown().await;
    let _ = writeln!(
        std::io::stderr(),
        "mock LM server stopped after {} requests",
        log.len()
    );
    Ok(())
}
