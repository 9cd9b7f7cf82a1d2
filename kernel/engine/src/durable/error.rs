//! Why a run database failed: [`StoreError`], one enum for both stores, each variant saying
//! what went wrong and what to do (a PostgreSQL URL shown without its password).

use std::path::PathBuf;

use super::lease::{self, LeaseHolder};

#[cfg(doc)]
use super::location::Location;

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
        "Checkpoint database `{db}` has schema version {found}, newer than the {supported} this \
         rlm reads; upgrade rlm or use another `--db`"
    )]
    NewerSchema {
        /// The database ([`Location`] as shown).
        db: String,
        /// Its schema version.
        found: i64,
        /// The newest this build reads.
        supported: i64,
    },
    /// There is no run database there (yet).
    #[error("There is no run database `{db}`; `rlm flow run` creates it, or pass another `--db`")]
    Missing {
        /// The database ([`Location`] as shown).
        db: String,
    },
    /// `--db` looks like a PostgreSQL URL but is not one.
    #[error(
        "`{url}` is not a PostgreSQL URL ({reason}); the form is \
         `postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE`"
    )]
    BadUrl {
        /// The URL, its password replaced by `[redacted]`.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The PostgreSQL server did not answer.
    #[error(
        "Could not connect to the run database `{db}`: {reason}; check that PostgreSQL runs \
         there and that the host and port in `--db` are right"
    )]
    Unreachable {
        /// The database ([`Location`] as shown).
        db: String,
        /// What happened.
        reason: String,
    },
    /// The PostgreSQL server has no database of that name.
    #[error(
        "There is no database `{name}` on the PostgreSQL server {servers}; create it (`createdb \
         {name}`, as a user who may) or name an existing one in `--db`"
    )]
    NoSuchDatabase {
        /// The database ([`Location`] as shown).
        db: String,
        /// The server(s), as `host:port`.
        servers: String,
        /// The database's name.
        name: String,
    },
    /// The PostgreSQL server refused the login.
    #[error(
        "PostgreSQL refused the login of user `{user}` to `{db}`: {reason}; check the user and \
         the password of `--db` (or `PGPASSWORD`) and that the server lets this host in \
         (`pg_hba.conf`)"
    )]
    Refused {
        /// The database ([`Location`] as shown).
        db: String,
        /// The user.
        user: String,
        /// The server's reason (never the password).
        reason: String,
    },
    /// The PostgreSQL user may not do what the store needs.
    #[error(
        "The user of `{db}` lacks a privilege the run database needs: {reason}; the first use \
         creates the schema `rlm` (it needs `CREATE` on the database, e.g. its owner), later \
         uses read and write its tables"
    )]
    Permission {
        /// The database ([`Location`] as shown).
        db: String,
        /// The server's message.
        reason: String,
    },
    /// PostgreSQL refused an operation.
    #[error("Run database `{db}`: {reason}")]
    Postgres {
        /// The database ([`Location`] as shown).
        db: String,
        /// The server's or the client's message.
        reason: String,
    },
    /// A call into the store did not finish (the thread running it failed or was stopped).
    #[error(
        "A call into the run database `{db}` did not finish ({reason}); its transaction was not \
         committed, so the database holds the last whole checkpoint"
    )]
    Interrupted {
        /// The database ([`Location`] as shown).
        db: String,
        /// What happened.
        reason: String,
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
    /// A process on another host drives the run and renews its lease (heartbeat).
    #[error(
        "Run `{run_id}` is being driven by {holder}, which renews its lease (last until {}); \
         wait for it to finish: if that host is gone, the run is free once the lease expires, \
         or resume with `--take-over` once you know it is gone",
        lease::time_of(holder.expires_ms.unwrap_or(holder.since_ms))
    )]
    Renewed {
        /// The run.
        run_id: String,
        /// Its lease holder.
        holder: LeaseHolder,
    },
    /// This process's lease on the run ran out before it was renewed (a heartbeat came too
    /// late: the process was stopped, or cut off from the database, for longer than the lease
    /// lasts): it may not write to the run any more.
    #[error(
        "This process no longer drives run `{run_id}`: its lease expired at {} without a \
         heartbeat (cut off from the database for too long?); nothing more of it was written, \
         resume it to go on",
        lease::time_of(*expired_ms)
    )]
    LeaseExpired {
        /// The run.
        run_id: String,
        /// When the lease ran out (Unix milliseconds, the database's clock).
        expired_ms: i64,
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
    #[error("Checkpoint database `{db}` is damaged: {what}")]
    Damaged {
        /// The database ([`Location`] as shown).
        db: String,
        /// What was found.
        what: String,
    },
}
