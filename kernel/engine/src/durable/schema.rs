//! The database layout and its version.
//!
//! `runs` holds one row per run (status, head checkpoint); `checkpoints` one row per step with
//! its parent, the node that ran, what runs next and the bookkeeping of the snapshot policy;
//! `writes` the channel writes of each checkpoint; `snapshots` the full state (and channel
//! versions) of the checkpoints that carry one.
//!
//! `writes` is a rowid table on purpose: a `WITHOUT ROWID` table moves any row over about a
//! quarter page into overflow pages, so every 1 KB write would cost a whole 4 KB page.

use rusqlite::{Connection, Transaction, TransactionBehavior};

/// The schema version this build writes and reads.
pub(super) const VERSION: i64 = 1;

const CREATE: &str = "
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

/// Sets the connection up (WAL, foreign keys off by design: pruning cuts parent links) and
/// creates or checks the schema. Returns the version found when it is newer than ours.
pub(super) fn prepare(conn: &Connection) -> rusqlite::Result<Result<(), i64>> {
    // WAL: a reader never blocks the writer, and a crash mid-write leaves the last commit.
    // NORMAL sync is safe against a killed process (only power loss may lose the last commit).
    // The busy timeout first: switching to WAL itself waits for another process's lock.
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    let found: i64 = conn.pragma_query_value(None, "user_version", |row| row.get(0))?;
    if found > VERSION {
        return Ok(Err(found));
    }
    if found == 0 {
        // IMMEDIATE takes the write lock first, so of two processes opening a new file at
        // once, the second sees the first one's schema instead of creating it again.
        let tx = Transaction::new_unchecked(conn, TransactionBehavior::Immediate)?;
        let found: i64 = tx.pragma_query_value(None, "user_version", |row| row.get(0))?;
        if found == 0 {
            tx.execute_batch(CREATE)?;
            tx.pragma_update(None, "user_version", VERSION)?;
        }
        tx.commit()?;
    }
    Ok(Ok(()))
}
