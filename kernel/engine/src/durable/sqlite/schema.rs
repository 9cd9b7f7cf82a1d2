//! The database layout and its version.
//!
//! `runs` holds one row per run (status, head checkpoint); `checkpoints` one row per step with
//! its parent, the node that ran, what runs next and the bookkeeping of the snapshot policy;
//! `writes` the channel writes of each checkpoint; `snapshots` the full state (and channel
//! versions) of the checkpoints that carry one; `leases` the process driving each run (at most
//! one row per run; its id, never reused, is the fencing token every write checks).
//!
//! The layout is the list of [`MIGRATIONS`]: a database at version N runs the steps after N,
//! in one transaction, so an older file is upgraded in place and keeps its runs.
//!
//! `writes` is a rowid table on purpose: a `WITHOUT ROWID` table moves any row over about a
//! quarter page into overflow pages, so every 1 KB write would cost a whole 4 KB page.

use rusqlite::{Connection, Transaction, TransactionBehavior};

/// The schema version this build writes and reads: one per migration.
pub(in crate::durable) const VERSION: i64 = MIGRATIONS.len() as i64;

/// The steps from an empty file to the current layout; step N leads to version N + 1. A step
/// is never edited once released (databases ran it already): a change is a new step.
pub(in crate::durable) const MIGRATIONS: [&str; 2] = [V1, V2_LEASES];

/// Version 1: runs and their checkpoints.
const V1: &str = "
CREATE TABLE runs (
    run_id      TEXT PRIMARY KEY,
    workflow    TEXT NOT NULL,
    status      TEXT NOT NULL,
    detail      TEXT,
    input       TEXT NOT NULL,
    head        INTEGER,
    created_ms  INTEGER NOT NULL,
    updated_ms  INTEGER NOT NULL
);
CREATE TABLE checkpoints (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id      TEXT NOT NULL REFERENCES runs(run_id),
    parent_id   INTEGER,
    step        INTEGER NOT NULL,
    node        TEXT NOT NULL,
    next        TEXT NOT NULL,
    metadata    TEXT NOT NULL,
    created_ms  INTEGER NOT NULL,
    write_bytes INTEGER NOT NULL,
    chain_bytes INTEGER NOT NULL,
    chain_len   INTEGER NOT NULL,
    base_bytes  INTEGER NOT NULL
);
CREATE INDEX checkpoints_by_run ON checkpoints(run_id, id);
CREATE TABLE writes (
    checkpoint_id INTEGER NOT NULL,
    seq           INTEGER NOT NULL,
    key           TEXT NOT NULL,
    op            TEXT NOT NULL,
    value         TEXT,
    PRIMARY KEY (checkpoint_id, seq)
);
CREATE TABLE snapshots (
    checkpoint_id INTEGER PRIMARY KEY,
    state         TEXT NOT NULL,
    versions      TEXT NOT NULL
);
";

/// Version 2: who drives each run. AUTOINCREMENT so a lease id is never handed out twice,
/// even after its row is deleted: a fenced-out process can never match a later lease.
const V2_LEASES: &str = "
CREATE TABLE leases (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id      TEXT NOT NULL UNIQUE,
    pid         INTEGER NOT NULL,
    host        TEXT NOT NULL,
    started     TEXT NOT NULL,
    claimed_ms  INTEGER NOT NULL
);
";

/// How long a statement waits for another process's lock before the database counts as
/// locked.
pub(super) const BUSY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// The schema version of the file (0 for a new one), read without writing.
pub(super) fn version(conn: &Connection) -> rusqlite::Result<i64> {
    conn.pragma_query_value(None, "user_version", |row| row.get(0))
}

/// Sets the connection up (WAL, foreign keys off by design: pruning cuts parent links) and
/// creates or checks the schema. Returns the version found when it is newer than ours.
pub(super) fn prepare(conn: &Connection) -> rusqlite::Result<Result<(), i64>> {
    // WAL: a reader never blocks the writer, and a crash mid-write leaves the last commit.
    // NORMAL sync is safe against a killed process (only power loss may lose the last commit).
    // The busy timeout first: switching to WAL itself waits for another process's lock.
    conn.busy_timeout(BUSY_TIMEOUT)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    let found = version(conn)?;
    if found > VERSION {
        return Ok(Err(found));
    }
    if found < VERSION {
        // IMMEDIATE takes the write lock first, so of two processes opening (or upgrading) a
        // file at once, the second sees the first one's schema instead of migrating it again.
        let tx = Transaction::new_unchecked(conn, TransactionBehavior::Immediate)?;
        let found: i64 = tx.pragma_query_value(None, "user_version", |row| row.get(0))?;
        if found > VERSION {
            return Ok(Err(found));
        }
        let done = usize::try_from(found).unwrap_or(0);
        for step in MIGRATIONS.iter().skip(done) {
            tx.execute_batch(step)?;
        }
        tx.pragma_update(None, "user_version", VERSION)?;
        tx.commit()?;
    }
    Ok(Ok(()))
}
