//! Durable runs: checkpoints of a run's state in an embedded SQLite database.
//!
//! A run (a thread) is a chain of checkpoints, one after every node, each naming its parent;
//! time travel (re-running from an earlier checkpoint) adds a branch under the same run.
//! A checkpoint stores the **writes** of its step ([`StateWrite`]s — replace, append,
//! delete — exactly as the step made them and its events carried them), not the whole
//! state: the first checkpoint of a chain stores a full snapshot, and a new snapshot is
//! taken only when the writes since the last one outweigh it ([`SnapshotPolicy`]); the store
//! builds it from the previous snapshot and the writes since, so nobody keeps a copy of the
//! state to compare against. The database grows with what changed, not with the size of the
//! state, and reading any checkpoint back replays at most one snapshot's worth of writes.
//! Each channel's version is the step that last wrote it. A delete is stored as a delete
//! (its value SQL `NULL`), never confused with a key set to JSON `null`.
//!
//! Every put is one SQLite transaction in WAL mode, so a process killed between two writes
//! (`kill -9`) leaves the database at the last whole checkpoint. Values are JSON text, never a
//! binary object format. The schema carries a version (`PRAGMA user_version`); a database
//! written by a newer schema is refused rather than misread. [`CheckpointStore::prune`] keeps
//! the last N checkpoints of a run, snapshotting the oldest kept one first where needed so
//! each stays readable.
//!
//! One process writes a run at a time: it holds the run's [`Lease`], and every
//! put and status change checks it in the same transaction, so a process that lost the run
//! (taken over after it was thought dead) cannot write into its chain.
//!
//! ```
//! use engine::durable::{CheckpointStore, NewCheckpoint, NewRun, Owner, RunStatus};
//! use engine::StateDelta;
//! use serde_json::json;
//!
//! let store = CheckpointStore::open_in_memory()?;
//! let lease = store.create_run(&NewRun::new("run-1", "team.yaml"), &Owner::current())?;
//! let mut parent = None;
//! for step in 0..3 {
//!     let mut writes = StateDelta::new();
//!     writes.append("log", vec![json!(step)]);
//!     let checkpoint = NewCheckpoint::new("worker", &writes).parent(parent);
//!     parent = Some(store.put(&lease, checkpoint)?);
//! }
//! store.finish_run(&lease, &RunStatus::Completed)?;
//! let head = store.run("run-1")?.and_then(|run| run.head).expect("three checkpoints");
//! assert_eq!(store.state_at(head)?.state.get("log"), Some(&json!([0, 1, 2])));
//! # Ok::<(), engine::durable::StoreError>(())
//! ```

mod lease;
mod run;
mod schema;
mod store;
#[cfg(test)]
mod tests;

pub use lease::{Claim, Lease, LeaseHolder, Liveness, Owner};
pub use run::{
    Checkpointer, DurableError, DurableReport, DurableRoot, HUMAN_INPUT, HUMAN_NODE, START_NODE,
    Start, checkpoint_path, resume_point, run_durable,
};
pub use store::{
    CheckpointId, CheckpointRecord, CheckpointState, CheckpointStore, NewCheckpoint, NewRun,
    PruneReport, RunRecord, RunStatus, SnapshotPolicy,
};

#[cfg(doc)]
use crate::state::StateWrite;

impl StoreError {
    /// SQLite's `source` on `path`, as the kind of failure it is.
    fn sqlite(path: PathBuf, source: rusqlite::Error) -> Self {
        use rusqlite::ErrorCode;
        match source.sqlite_error_code() {
            Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => Self::Locked { path },
            Some(ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt) => {
                Self::NotADatabase { path, source }
            }
            Some(ErrorCode::ReadOnly) => Self::ReadOnly { path },
            _ => Self::Sqlite { path, source },
        }
    }
}

use std::path::PathBuf;

/// Why the checkpoint store failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// SQLite refused an operation.
    #[error("Checkpoint database `{path}`: {source}")]
    Sqlite {
        /// The database file (`:memory:` for an in-memory store).
        path: PathBuf,
        /// SQLite's error.
        #[source]
        source: rusqlite::Error,
    },
    /// Another process holds the database's write lock for longer than the busy timeout.
    #[error(
        "Checkpoint database `{path}` is locked by another process (a run still going?); wait \
         for it to finish, or use another `--db`"
    )]
    Locked {
        /// The database file.
        path: PathBuf,
    },
    /// The file is not an SQLite database, or its pages are damaged.
    #[error(
        "`{path}` is not a readable checkpoint database (not SQLite, or damaged); \
         move it aside or pass another `--db`"
    )]
    NotADatabase {
        /// The file.
        path: PathBuf,
        /// SQLite's error.
        #[source]
        source: rusqlite::Error,
    },
    /// The database (or its folder, which takes its journal) cannot be written.
    #[error(
        "Checkpoint database `{path}` is read-only (the file, its folder or the file system); \
         make it writable, or pass another `--db` to run or resume (listing it only reads)"
    )]
    ReadOnly {
        /// The database file.
        path: PathBuf,
    },
    /// The database was written by a newer version of rlm.
    #[error(
        "Checkpoint database `{path}` has schema version {found}, newer than the {supported} this \
         rlm reads; upgrade rlm or use another `--db`"
    )]
    NewerSchema {
        /// The database file.
        path: PathBuf,
        /// Its schema version.
        found: i64,
        /// The newest this build reads.
        supported: i64,
    },
    /// No run has this id.
    #[error("No run `{0}` in the checkpoint database; `rlm flow runs` lists the runs")]
    UnknownRun(String),
    /// A run with this id exists already.
    #[error("A run `{0}` exists already; pick another run id")]
    DuplicateRun(String),
    /// No checkpoint has this id.
    #[error("No checkpoint {0} in the checkpoint database; `rlm flow history RUN` lists them")]
    UnknownCheckpoint(i64),
    /// A checkpoint belongs to another run than the one named.
    #[error("Checkpoint {checkpoint} belongs to run `{actual}`, not `{expected}`")]
    WrongRun {
        /// The checkpoint.
        checkpoint: i64,
        /// The run named.
        expected: String,
        /// The run it belongs to.
        actual: String,
    },
    /// A live process on this host drives the run.
    #[error(
        "Run `{run_id}` is being driven by {holder}; wait for it to finish, or stop that process \
         and resume again (a dead process's run is taken over)"
    )]
    Driven {
        /// The run.
        run_id: String,
        /// Its lease holder.
        holder: LeaseHolder,
    },
    /// A process that cannot be checked from here (another host) drives the run.
    #[error(
        "Run `{run_id}` is being driven by {holder}, which cannot be checked from here; if that \
         process is gone, resume with `--take-over`"
    )]
    DrivenElsewhere {
        /// The run.
        run_id: String,
        /// Its lease holder.
        holder: LeaseHolder,
    },
    /// This process's lease on the run was taken over: it may not write to it any more.
    #[error(
        "This process no longer drives run `{run_id}` ({}); nothing more of it was written",
        match holder {
            Some(holder) => format!("taken over by {holder}"),
            None => "its lease was released".to_owned(),
        }
    )]
    LeaseLost {
        /// The run.
        run_id: String,
        /// Who holds it now, if anyone.
        holder: Option<LeaseHolder>,
    },
    /// A stored value is not what this schema writes (a damaged or hand-edited database).
    #[error("Checkpoint database `{path}` is damaged: {what}")]
    Damaged {
        /// The database file.
        path: PathBuf,
        /// What was found.
        what: String,
    },
}
