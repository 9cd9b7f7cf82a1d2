//! Benchmarks live in `benches/benches/` (`bridge`, `repl`, `rlm`, `checkpoints`, `flow`,
//! `agent`, `routed`, `routed_run`, `tree`; what each measures is in
//! `kernel/cli/docs/bench-and-eval.md`); the helpers they share live here: reading this process's memory counters,
//! percentiles, a synthetic log-like text context, and serving as an isolated session's
//! worker ([`serve_as_worker`]).

use std::io::{BufWriter, Write};
use std::path::Path;

/// A bench binary is its own sessions' worker program (as `rlm` is): when started as one
/// (`BIN __worker`), serves the session and exits; else registers itself. Call it first
/// thing in `main`.
pub fn serve_as_worker() {
    if std::env::args().nth(1).as_deref() == Some(kernel::repl::WORKER_ARG) {
        std::process::exit(i32::from(kernel::repl::worker_main()));
    }
    kernel::repl::set_worker_program(kernel::repl::WorkerProgram::this_executable());
}

/// A field of `/proc/self/status` in KiB (`"VmHWM:"` = peak RSS, `"VmRSS:"` = current RSS);
/// 0 when it cannot be read.
pub fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

/// The `q`-quantile (0..=1, nearest rank) of an ascending slice; NaN when empty.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

/// The median (nearest rank) of `samples`, in any order; NaN when empty.
pub fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    percentile(&samples, 0.5)
}

/// Writes at least `target_bytes` of log-like ASCII lines to `path`.
pub fn generate_text(path: &Path, target_bytes: u64) -> anyhow::Result<()> {
    let mut out = BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?);
    let mut written = 0u64;
    let mut i: u64 = 0;
    while written < target_bytes {
        let line = format!(
            "2025-01-01T00:00:{:02} service-{} user {} did something interesting #{}\n",
            i % 60,
            i % 13,
            i.wrapping_mul(7919) % 100_000,
            i
        );
        out.write_all(line.as_bytes())?;
        written += line.len() as u64;
        i += 1;
    }
    out.flush()?;
    Ok(())
}
