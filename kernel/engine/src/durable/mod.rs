//! Durable runs: checkpoints of a run's state in a run database — an embedded SQLite file
//! (the default, `.rlm/runs.db`) or a PostgreSQL database shared by many hosts.
//!
//! A run (a thread) is a chain of checkpoints, one after every node, each naming its parent;
//! time travel (re-running from an earlier checkpoint) adds a branch under the same run.
//! A checkpoint stores the **writes** of its step ([`StateWrite`]s — replace, append,
//! delete — exactly as the step made them and its events carried them), not the whole
//! state: the first checkpoint of a chain stores a full snapshot, and a new snapshot is
//! taken only when the writes since the last one outweigh it (`SnapshotPolicy`); the store
//! builds it from the previous snapshot and the writes since, so nobody keeps a copy of the
//! state to compare against. The database grows with what changed, not with the size of the
//! state, and reading any checkpoint back replays at most one snapshot's worth of writes.
//! Each channel's version is the step that last wrote it. A delete is stored as a delete
//! (its value SQL `NULL`), never confused with a key set to JSON `null`. Values are JSON
//! text, never a binary object format. [`Store::prune`] keeps the last N checkpoints of a
//! run, snapshotting the oldest kept one first where needed so each stays readable.
//!
//! The pieces, from the bottom up:
//! - `record`: what a store keeps (runs, checkpoints, the snapshot policy) and the logic
//!   both stores share (rows, snapshots, when a lease holder may be replaced);
//! - `lease`: who drives a run ([`Owner`], [`Lease`]) and whether its holder still runs;
//! - `error`: [`StoreError`], what went wrong in either store and what to do;
//! - `location`: where the database is, as `--db` names it ([`Location`]: a path or a
//!   `postgres://` URL, its password a secret from the moment it is read);
//! - `store`: the [`Store`] trait every caller uses;
//! - `sqlite` ([`SqliteStore`]) and `postgres` ([`PostgresStore`]): the two stores, each with
//!   its versioned schema and migrations;
//! - `run`: [`run_durable`], which drives a graph with a checkpoint after every node;
//! - here: [`open`] and [`open_read_only`], the store a [`Location`] names.
//!
//! One process writes a run at a time: it holds the run's [`Lease`], and every put and status
//! change checks it in the same transaction, so a process that lost the run (taken over after
//! it was thought dead) cannot write into its chain. A PostgreSQL lease also expires unless
//! its driver renews it (a heartbeat), which is how a host that disappeared loses its runs.
//!
//! ```
//! use engine::durable::{NewCheckpoint, NewRun, Owner, RunStatus, SqliteStore, Store};
//! use engine::StateDelta;
//! use serde_json::json;
//!
//! # tokio::runtime::Builder::new_current_thread().build()?.block_on(async {
//! let store = SqliteStore::open_in_memory()?;
//! let lease = store.create_run(&NewRun::new("run-1", "team.yaml"), &Owner::current()).await?;
//! let mut parent = None;
//! for step in 0..3 {
//!     let mut writes = StateDelta::new();
//!     writes.append("log", vec![json!(step)]);
//!     let checkpoint = NewCheckpoint::new("worker", &writes).parent(parent);
//!     parent = Some(store.put(&lease, checkpoint).await?);
//! }
//! store.finish_run(&lease, &RunStatus::Completed).await?;
//! let head = store.run("run-1").await?.and_then(|run| run.head).expect("three checkpoints");
//! assert_eq!(store.state_at(head).await?.state.get("log"), Some(&json!([0, 1, 2])));
//! # Ok::<(), engine::durable::StoreError>(())
//! # })?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod error;
mod lease;
mod location;
mod postgres;
mod record;
mod run;
mod sqlite;
mod store;
#[cfg(test)]
mod tests;

pub use error::StoreError;
pub use lease::{Claim, Lease, LeaseHolder, Liveness, Owner};
pub use location::{Location, PostgresUrl};
pub use postgres::PostgresStore;
pub use record::{
    CheckpointId, CheckpointRecord, CheckpointState, NewCheckpoint, NewRun, PruneReport, RunRecord,
    RunStatus,
};
pub(crate) use run::HUMAN_INPUT;
pub use run::{
    DurableError, DurableReport, DurableRoot, Start, checkpoint_path, resume_point, run_durable,
};
pub use sqlite::SqliteStore;
pub use store::Store;

use std::sync::Arc;

#[cfg(doc)]
use crate::state::StateWrite;

/// Opens the run database at `location` for writing (created, or upgraded, as needed).
/// `lease_expiry` is how long a PostgreSQL lease lasts without a heartbeat
/// (`DEFAULT_LEASE_EXPIRY` when `None`; at least a second); an SQLite lease has none.
pub async fn open(
    location: &Location,
    lease_expiry: Option<std::time::Duration>,
) -> Result<Arc<dyn Store>, StoreError> {
    Ok(match location {
        Location::Sqlite(path) => {
            let path = path.clone();
            Arc::new(off_thread(location, move || SqliteStore::open(path)).await?)
        }
        Location::Postgres(url) => {
            let store = PostgresStore::connect(url).await?;
            Arc::new(match lease_expiry {
                Some(expiry) => store.with_lease_expiry(expiry),
                None => store,
            })
        }
    })
}

/// Opens the existing run database at `location` only to read it (an older schema is
/// upgraded first, as before any read); [`StoreError::Missing`] when there is none.
pub async fn open_read_only(location: &Location) -> Result<Arc<dyn Store>, StoreError> {
    Ok(match location {
        Location::Sqlite(path) => {
            let path = path.clone();
            Arc::new(off_thread(location, move || SqliteStore::open_read_only(path)).await?)
        }
        Location::Postgres(url) => Arc::new(PostgresStore::connect_read_only(url).await?),
    })
}

/// Opens an SQLite file on a blocking thread (its pages are checked: O(file)).
async fn off_thread(
    location: &Location,
    open: impl FnOnce() -> Result<SqliteStore, StoreError> + Send + 'static,
) -> Result<SqliteStore, StoreError> {
    tokio::task::spawn_blocking(open).await.unwrap_or_else(|e| {
        Err(StoreError::Interrupted {
            db: location.to_string(),
            reason: e.to_string(),
        })
    })
}
