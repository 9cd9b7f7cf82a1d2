//! Checkpoint stores: database growth and time per checkpoint for a large state that changes
//! a little per step, in an SQLite file and in a PostgreSQL database.
//!
//! ```text
//! cargo bench -p rlm-benches --bench checkpoints             # 1 000 steps over a 10 MB state
//! cargo bench -p rlm-benches --bench checkpoints -- --quick  # 200 steps (or RLM_BENCH_QUICK=1)
//! ```
//!
//! The state holds 10 000 channels of 1 KB each (about 10 MB of JSON); every step replaces one
//! of them with a fresh 1 KB value and writes a checkpoint. Each store is measured the same
//! way, SQLite first (a file), then PostgreSQL (a throwaway server on 127.0.0.1 started by
//! `rlm-test-postgres`, as the tests start it; the same machine, so its times are a loopback
//! round trip's, not a network's). Reported per store: the size of the first checkpoint (the
//! snapshot), the growth of the database over the steps (target: at most 3 MB for 1 000
//! steps; SQLite: the file and its WAL; PostgreSQL: `pg_total_relation_size` of the store's
//! tables, indexes and out-of-line values included), p50 / p99 time per checkpoint, and the
//! time to read the last checkpoint's state back. The baseline, measured in the same run, is a
//! full snapshot per step (what LangGraph's SQLite saver stores): its size and time per
//! checkpoint are those of the first checkpoint, and the ratios compare the two.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use engine::durable::{NewCheckpoint, NewRun, Owner, PostgresStore, SqliteStore, Store};
use engine::{State, StateDelta};
use rlm_benches::percentile;
use serde_json::json;
use tokio::runtime::Runtime;

const CHANNELS: usize = 10_000;
const VALUE_BYTES: usize = 1_000;
const TARGET_GROWTH_BYTES: u64 = 3_000_000;

fn main() -> anyhow::Result<()> {
    let quick = std::env::args().any(|a| a == "--quick")
        || std::env::var("RLM_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
    let steps = if quick { 200 } else { 1_000 };
    println!(
        "# checkpoint benchmark{}: {steps} steps over {CHANNELS} channels x {VALUE_BYTES} B, \
         one channel replaced per step",
        if quick { " (--quick)" } else { "" }
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;

    let dir = tempfile::tempdir()?;
    let path = dir.path().join("bench.db");
    let sqlite = Sizes::Sqlite(path.clone());
    let open_sqlite =
        || -> anyhow::Result<Arc<dyn Store>> { Ok(Arc::new(SqliteStore::open(&path)?)) };
    let sqlite_ms = measure("SQLite", &rt, steps, &open_sqlite, &sqlite)?;

    let db = test_postgres::server().database();
    let engine::durable::Location::Postgres(url) = engine::durable::Location::parse(&db.url())?
    else {
        anyhow::bail!("the test server's URL is not a PostgreSQL URL");
    };
    let postgres = rt.block_on(PostgresStore::connect(&url))?;
    let open_postgres = || -> anyhow::Result<Arc<dyn Store>> { Ok(Arc::new(postgres.clone())) };
    let postgres_ms = measure(
        "PostgreSQL",
        &rt,
        steps,
        &open_postgres,
        &Sizes::Postgres(postgres.clone()),
    )?;
    println!(
        "\nPostgreSQL / SQLite time per checkpoint (mean)  {:.1}x",
        postgres_ms / sqlite_ms
    );
    Ok(())
}

/// How a store's size is measured.
enum Sizes {
    /// The file and its WAL (the store is closed first, so the WAL is folded in).
    Sqlite(std::path::PathBuf),
    /// `pg_total_relation_size` of the store's tables.
    Postgres(PostgresStore),
}

impl Sizes {
    fn bytes(&self, rt: &Runtime) -> anyhow::Result<u64> {
        Ok(match self {
            Self::Sqlite(path) => db_bytes(path),
            Self::Postgres(store) => u64::try_from(rt.block_on(store.size_bytes())?)?,
        })
    }
}

/// Measures the store `open` opens (each call: a new handle on the same database) and prints
/// the report under `name`; its mean time per checkpoint in ms.
fn measure(
    name: &str,
    rt: &Runtime,
    steps: usize,
    open: &dyn Fn() -> anyhow::Result<Arc<dyn Store>>,
    sizes: &Sizes,
) -> anyhow::Result<f64> {
    let mut state = State::default();
    for i in 0..CHANNELS {
        state.set(format!("doc_{i:05}"), json!(value(i, 0)));
    }
    let state_bytes = serde_json::to_string(&state)?.len() as u64;
    let size_before = sizes.bytes(rt)?;

    let store = open()?;
    let lease =
        rt.block_on(store.create_run(&NewRun::new("bench", "synthetic"), &Owner::current()))?;
    let started = Instant::now();
    let first = rt.block_on(store.put(&lease, NewCheckpoint::new("start", &state.to_writes())))?;
    let snapshot_ms = started.elapsed().as_secs_f64() * 1000.0;
    drop(store); // closing an SQLite file folds the WAL into it, so its size is all there is
    let size_after_snapshot = sizes.bytes(rt)?;

    let store = open()?;
    let mut parent = first;
    let mut times_ms = Vec::with_capacity(steps);
    for step in 1..=steps {
        let channel = (step * 7_919) % CHANNELS;
        let mut writes = StateDelta::new();
        writes.set(format!("doc_{channel:05}"), json!(value(channel, step)));
        state.apply(&writes);
        let started = Instant::now();
        parent = rt.block_on(store.put(
            &lease,
            NewCheckpoint::new("worker", &writes).parent(Some(parent)),
        ))?;
        times_ms.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    let started = Instant::now();
    let read_back = rt.block_on(store.state_at(parent))?;
    let read_ms = started.elapsed().as_secs_f64() * 1000.0;
    anyhow::ensure!(
        read_back.state == state,
        "the last checkpoint read back differently"
    );
    let snapshots = rt
        .block_on(store.history("bench"))?
        .iter()
        .filter(|c| c.snapshot)
        .count();
    drop(store);
    let growth = sizes.bytes(rt)?.saturating_sub(size_after_snapshot);

    times_ms.sort_by(f64::total_cmp);
    let p50 = percentile(&times_ms, 0.5);
    let p99 = percentile(&times_ms, 0.99);
    let mean = times_ms.iter().sum::<f64>() / times_ms.len() as f64;
    let full_per_step = state_bytes * steps as u64;
    println!("\n## {name}");
    println!(
        "state (JSON)                     {:>10.2} MB",
        mb(state_bytes)
    );
    println!(
        "first snapshot                   {:>10.2} MB",
        mb(size_after_snapshot.saturating_sub(size_before))
    );
    println!(
        "growth over {steps:>5} steps          {:>10.2} MB  ({:.0} B/step; target <= {:.1} MB for \
         1 000 steps: {})",
        mb(growth),
        growth as f64 / steps as f64,
        mb(TARGET_GROWTH_BYTES),
        if growth * 1_000 <= TARGET_GROWTH_BYTES * steps as u64 {
            "met"
        } else {
            "MISSED"
        }
    );
    println!("snapshots taken                  {snapshots:>10}");
    println!("time per checkpoint p50 / p99    {p50:>10.3} / {p99:.3} ms (mean {mean:.3} ms)");
    println!("read back the last checkpoint    {read_ms:>10.1} ms");
    println!(
        "baseline: full snapshot per step {:>10.2} MB growth, {snapshot_ms:.1} ms per checkpoint",
        mb(full_per_step)
    );
    println!(
        "ratios (baseline / deltas)       {:>10.0}x smaller, {:.0}x faster per checkpoint",
        full_per_step as f64 / growth.max(1) as f64,
        snapshot_ms / mean
    );
    Ok(mean)
}

/// A 1 KB value that differs by channel and step.
fn value(channel: usize, step: usize) -> String {
    let head = format!("channel {channel} step {step} ");
    let mut text = head.repeat(VALUE_BYTES / head.len() + 1);
    text.truncate(VALUE_BYTES);
    text
}

/// The database file plus its WAL, in bytes.
fn db_bytes(path: &Path) -> u64 {
    let wal = path.with_extension("db-wal");
    [path, wal.as_path()]
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .sum()
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1e6
}
