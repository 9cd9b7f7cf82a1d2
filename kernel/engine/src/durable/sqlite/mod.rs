//! The SQLite store: one database file (`.rlm/runs.db` by default), embedded in the process.
//!
//! Every put is one SQLite transaction in WAL mode, so a process killed between two writes
//! (`kill -9`) leaves the database at the last whole checkpoint. The schema carries a version
//! (`PRAGMA user_version`); a database written by a newer schema is refused rather than
//! misread. Each open checks the file's pages (`PRAGMA quick_check`), so a damaged file is
//! refused before anything is written into it; a reader ([`SqliteStore::open_read_only`])
//! opens it read-only, so listing runs works on a read-only file, folder or mount.
//!
//! Leases have no expiry here: the holder is a process on this machine (or on a shared disk),
//! whose pid is checked. The connection is one, behind a mutex; the [`Store`] methods run
//! their SQLite calls on tokio's blocking threads (`spawn_blocking`), never on an async
//! worker.

pub(super) mod schema;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::{Connection, MAIN_DB, OpenFlags, OptionalExtension, TransactionBehavior, params};

use super::StoreError;
use super::lease::{Claim, Lease, LeaseHolder, Owner};
use super::location::Location;
use super::record::{
    CheckpointColumns, CheckpointId, CheckpointRecord, CheckpointState, Failure, NewCheckpoint,
    NewRun, ParentRow, Planned, PruneReport, RowError, RunColumns, RunRecord, RunStatus,
    SnapshotPolicy, now_ms, parse_write, replaceable, replay,
};
use super::store::Store;
use crate::state::StateDelta;

/// Checkpoints of runs in one SQLite database file; cheap to clone (clones share the
/// connection).
#[derive(Debug, Clone)]
pub struct SqliteStore {
    db: Arc<Database>,
    policy: SnapshotPolicy,
}

/// The open file.
#[derive(Debug)]
struct Database {
    conn: Mutex<Connection>,
    path: PathBuf,
    location: Location,
}

impl StoreError {
    /// SQLite's `source` on `path`, as the kind of failure it is.
    pub(in crate::durable) fn sqlite(path: PathBuf, source: rusqlite::Error) -> Self {
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

impl From<rusqlite::Error> for Failure<rusqlite::Error> {
    fn from(e: rusqlite::Error) -> Self {
        Self::Driver(e)
    }
}

type Res<T> = Result<T, Failure<rusqlite::Error>>;

/// A read-only connection to `path` whose pages passed `quick_check`; `immutable` reads the
/// file as it is, without the WAL index (SQLite's `immutable=1`).
fn read_only_connection(path: &Path, immutable: bool) -> Result<Connection, StoreError> {
    let fail = |source| StoreError::sqlite(path.to_owned(), source);
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY
        | OpenFlags::SQLITE_OPEN_NO_MUTEX
        | OpenFlags::SQLITE_OPEN_URI;
    let conn = if immutable {
        Connection::open_with_flags(file_uri(path, "immutable=1"), flags)
    } else {
        Connection::open_with_flags(path, flags - OpenFlags::SQLITE_OPEN_URI)
    }
    .map_err(fail)?;
    conn.busy_timeout(schema::BUSY_TIMEOUT).map_err(fail)?;
    quick_check(&conn, path)?;
    Ok(conn)
}

/// Whether `path` has a write-ahead log with commits that are not in the file yet (which an
/// `immutable` read would miss).
fn has_pending_log(path: &Path) -> bool {
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    std::fs::metadata(PathBuf::from(wal)).is_ok_and(|m| m.len() > 0)
}

/// `file:` URI of `path` with `query`, every byte but unreserved ones and `/` percent-encoded.
fn file_uri(path: &Path, query: &str) -> String {
    use std::os::unix::ffi::OsStrExt as _;
    let mut uri = String::from("file:");
    for &byte in path.as_os_str().as_bytes() {
        if byte.is_ascii_alphanumeric() || b"/-._~".contains(&byte) {
            uri.push(char::from(byte));
        } else {
            uri.push_str(&format!("%{byte:02X}"));
        }
    }
    uri.push('?');
    uri.push_str(query);
    uri
}

/// SQLite's `quick_check` of every page's structure (O(pages), without the index checks of
/// `integrity_check`): a damaged file is [`StoreError::NotADatabase`], whichever way SQLite
/// reports it.
fn quick_check(conn: &Connection, path: &Path) -> Result<(), StoreError> {
    let found = conn
        .prepare("PRAGMA quick_check")
        .and_then(|mut stmt| {
            stmt.query_map([], |row| row.get::<_, String>(0))?
                .collect::<Result<Vec<_>, _>>()
        })
        .map_err(|source| StoreError::sqlite(path.to_owned(), source))?;
    if found.len() == 1 && found[0] == "ok" {
        return Ok(());
    }
    let problems = found.len();
    let first = found.into_iter().next().unwrap_or_default();
    Err(StoreError::NotADatabase {
        path: path.to_owned(),
        source: rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CORRUPT),
            Some(format!(
                "`PRAGMA quick_check` found {problems} problem(s), the first: {first}"
            )),
        ),
    })
}

impl SqliteStore {
    /// Opens (or creates) the database at `path` for writing. Its pages are checked first
    /// (`PRAGMA quick_check`): a damaged file is refused before anything is written to it, and
    /// one SQLite could only open read-only is refused as [`StoreError::ReadOnly`].
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        let path = path.as_ref().to_path_buf();
        let fail = |source| StoreError::sqlite(path.clone(), source);
        let conn = Connection::open(&path).map_err(fail)?;
        // SQLite falls back to reading a file it may not write; a writer wants to know now.
        if conn.is_readonly(MAIN_DB).map_err(fail)? {
            return Err(StoreError::ReadOnly { path });
        }
        conn.busy_timeout(schema::BUSY_TIMEOUT).map_err(fail)?;
        quick_check(&conn, &path)?;
        Self::with_connection(conn, path)
    }

    /// Opens the existing database at `path` only to read it (`rlm flow runs`, `history`):
    /// nothing is written, so it works on a read-only file, folder or mount. Its pages are
    /// checked as [`open`](Self::open) does. A database of an older schema is upgraded in
    /// place through [`open`](Self::open), as before any read; a missing file is
    /// [`StoreError::Missing`].
    pub(crate) fn open_read_only(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        let path = path.as_ref().to_path_buf();
        if !path.exists() {
            return Err(StoreError::Missing {
                db: path.display().to_string(),
            });
        }
        let conn = match read_only_connection(&path, false) {
            // A WAL database needs its `-shm` index, which a read-only folder cannot take
            // when its last writer closed cleanly (and so left no `-wal` either): read the
            // file as it is.
            Err(StoreError::Sqlite { source, .. })
                if source.sqlite_error_code() == Some(rusqlite::ErrorCode::CannotOpen)
                    && !has_pending_log(&path) =>
            {
                read_only_connection(&path, true)?
            }
            other => other?,
        };
        match schema::version(&conn).map_err(|source| StoreError::sqlite(path.clone(), source))? {
            found if found > schema::VERSION => Err(StoreError::NewerSchema {
                db: path.display().to_string(),
                found,
                supported: schema::VERSION,
            }),
            found if found < schema::VERSION => {
                drop(conn);
                Self::open(path)
            }
            _ => Ok(Self::new(conn, path)),
        }
    }

    /// A store that lives in memory (for tests and dry runs).
    pub fn open_in_memory() -> Result<Self, StoreError> {
        let path = PathBuf::from(":memory:");
        let conn = Connection::open_in_memory().map_err(|source| StoreError::Sqlite {
            path: path.clone(),
            source,
        })?;
        Self::with_connection(conn, path)
    }

    fn with_connection(conn: Connection, path: PathBuf) -> Result<Self, StoreError> {
        match schema::prepare(&conn) {
            Ok(Ok(())) => Ok(Self::new(conn, path)),
            Ok(Err(found)) => Err(StoreError::NewerSchema {
                db: path.display().to_string(),
                found,
                supported: schema::VERSION,
            }),
            Err(source) => Err(StoreError::sqlite(path, source)),
        }
    }

    fn new(conn: Connection, path: PathBuf) -> Self {
        Self {
            db: Arc::new(Database {
                conn: Mutex::new(conn),
                location: Location::Sqlite(path.clone()),
                path,
            }),
            policy: SnapshotPolicy::default(),
        }
    }

    /// With this snapshot policy.
    #[cfg(test)]
    pub(crate) fn with_policy(mut self, policy: SnapshotPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// SQLite's integrity check: `ok`, or what it found wrong.
    pub fn integrity_check(&self) -> Result<String, StoreError> {
        self.db.call(|conn| {
            let found = conn
                .prepare("PRAGMA integrity_check")?
                .query_map([], |row| row.get::<_, String>(0))?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(found.join("\n"))
        })
    }

    /// Runs `work` on the connection on a blocking thread, off the async workers.
    async fn blocking<T: Send + 'static>(
        &self,
        work: impl FnOnce(&mut Connection) -> Res<T> + Send + 'static,
    ) -> Result<T, StoreError> {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || db.call(work))
            .await
            .unwrap_or_else(|e| {
                Err(StoreError::Interrupted {
                    db: self.db.path.display().to_string(),
                    reason: e.to_string(),
                })
            })
    }
}

impl Database {
    fn lock(&self) -> MutexGuard<'_, Connection> {
        // Every use of the connection is a whole transaction or one statement; a panic in
        // one leaves SQLite to roll it back, so a poisoned lock still guards a sound database.
        self.conn
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs `work` on the connection, its failure as the store error it is.
    fn call<T>(&self, work: impl FnOnce(&mut Connection) -> Res<T>) -> Result<T, StoreError> {
        let mut conn = self.lock();
        work(&mut conn).map_err(|failure| match failure {
            Failure::Driver(source) => StoreError::sqlite(self.path.clone(), source),
            Failure::Row(e) => e.into_store_error(self.path.display().to_string()),
            Failure::Store(e) => e,
        })
    }
}

#[async_trait]
impl Store for SqliteStore {
    fn location(&self) -> &Location {
        &self.db.location
    }

    fn lease_expiry(&self) -> Option<Duration> {
        None
    }

    async fn create_run(&self, run: &NewRun, owner: &Owner) -> Result<Lease, StoreError> {
        let (run, owner) = (run.clone(), owner.clone());
        self.blocking(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            if run_exists(&tx, &run.run_id)? {
                return Err(StoreError::DuplicateRun(run.run_id.clone()).into());
            }
            let now = now_ms();
            tx.execute(
                "INSERT INTO runs (run_id, workflow, status, detail, input, head, created_ms, \
                 updated_ms) VALUES (?1, ?2, 'running', NULL, ?3, NULL, ?4, ?4)",
                params![run.run_id, run.workflow, run.input.to_string(), now],
            )?;
            let lease = insert_lease(&tx, &run.run_id, &owner)?;
            tx.commit()?;
            Ok(lease)
        })
        .await
    }

    async fn claim(
        &self,
        run_id: &str,
        owner: &Owner,
        take_over: bool,
    ) -> Result<Claim, StoreError> {
        let (run_id, owner) = (run_id.to_owned(), owner.clone());
        self.blocking(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            if !run_exists(&tx, &run_id)? {
                return Err(StoreError::UnknownRun(run_id).into());
            }
            let replaced = match lease_of(&tx, &run_id)? {
                Some((id, holder)) => {
                    let holder = replaceable(&run_id, holder, take_over)?;
                    tx.execute("DELETE FROM leases WHERE id = ?1", [id])?;
                    Some(holder)
                }
                None => None,
            };
            let lease = insert_lease(&tx, &run_id, &owner)?;
            tx.commit()?;
            Ok(Claim { lease, replaced })
        })
        .await
    }

    async fn check_claim(
        &self,
        run_id: &str,
        take_over: bool,
    ) -> Result<Option<LeaseHolder>, StoreError> {
        let run_id = run_id.to_owned();
        self.blocking(move |conn| {
            if !run_exists(conn, &run_id)? {
                return Err(StoreError::UnknownRun(run_id).into());
            }
            Ok(lease_of(conn, &run_id)?
                .map(|(_, holder)| replaceable(&run_id, holder, take_over))
                .transpose()?)
        })
        .await
    }

    async fn heartbeat(&self, lease: &Lease) -> Result<(), StoreError> {
        // Nothing to renew (no expiry): only whether the lease is still the run's.
        let lease = lease.clone();
        self.blocking(move |conn| fence(conn, &lease)).await
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        let id = lease.id;
        self.blocking(move |conn| {
            conn.execute("DELETE FROM leases WHERE id = ?1", [id])?;
            Ok(())
        })
        .await
    }

    async fn write_status(
        &self,
        lease: &Lease,
        status: &RunStatus,
        release: bool,
    ) -> Result<(), StoreError> {
        let (lease, status) = (lease.clone(), status.clone());
        self.blocking(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            fence(&tx, &lease)?;
            tx.execute(
                "UPDATE runs SET status = ?2, detail = ?3, updated_ms = ?4 WHERE run_id = ?1",
                params![lease.run_id, status.name(), status.detail(), now_ms()],
            )?;
            if release {
                tx.execute("DELETE FROM leases WHERE id = ?1", [lease.id])?;
            }
            tx.commit()?;
            Ok(())
        })
        .await
    }

    async fn put_chain(
        &self,
        lease: &Lease,
        checkpoints: Vec<NewCheckpoint<'_>>,
    ) -> Result<Vec<CheckpointId>, StoreError> {
        // Owned for the blocking thread: a delta's clone shares its writes.
        let lease = lease.clone();
        let owned: Vec<_> = checkpoints
            .into_iter()
            .map(|checkpoint| {
                let writes = checkpoint.writes.clone();
                let NewCheckpoint {
                    parent,
                    node,
                    next,
                    metadata,
                    ..
                } = checkpoint;
                (parent, node, next, writes, metadata)
            })
            .collect();
        let policy = self.policy;
        self.blocking(move |conn| {
            let checkpoints: Vec<NewCheckpoint<'_>> = owned
                .iter()
                .map(|(parent, node, next, writes, metadata)| NewCheckpoint {
                    parent: *parent,
                    node: node.clone(),
                    next: next.clone(),
                    writes,
                    metadata: metadata.clone(),
                })
                .collect();
            put_chain(conn, &lease, &checkpoints, policy)
        })
        .await
    }

    async fn run(&self, run_id: &str) -> Result<Option<RunRecord>, StoreError> {
        let run_id = run_id.to_owned();
        self.blocking(move |conn| {
            let mut stmt = conn.prepare_cached(&format!("{RUN_SELECT} WHERE r.run_id = ?1"))?;
            let row = stmt.query_row([run_id], run_columns).optional()?;
            Ok(row.map(RunColumns::into_record).transpose()?)
        })
        .await
    }

    async fn runs(&self) -> Result<Vec<RunRecord>, StoreError> {
        self.blocking(move |conn| {
            let mut stmt =
                conn.prepare_cached(&format!("{RUN_SELECT} ORDER BY r.created_ms, r.run_id"))?;
            let rows = stmt
                .query_map([], run_columns)?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(rows
                .into_iter()
                .map(RunColumns::into_record)
                .collect::<Result<_, _>>()?)
        })
        .await
    }

    async fn history(&self, run_id: &str) -> Result<Vec<CheckpointRecord>, StoreError> {
        let run_id = run_id.to_owned();
        self.blocking(move |conn| {
            if !run_exists(conn, &run_id)? {
                return Err(StoreError::UnknownRun(run_id).into());
            }
            let ids = conn
                .prepare_cached("SELECT id FROM checkpoints WHERE run_id = ?1 ORDER BY id")?
                .query_map([run_id], |row| row.get::<_, i64>(0))?
                .collect::<Result<Vec<_>, _>>()?;
            ids.into_iter()
                .map(|id| checkpoint_record(conn, id))
                .collect()
        })
        .await
    }

    async fn checkpoint(&self, id: CheckpointId) -> Result<CheckpointRecord, StoreError> {
        self.blocking(move |conn| checkpoint_record(conn, id)).await
    }

    async fn writes(&self, id: CheckpointId) -> Result<StateDelta, StoreError> {
        self.blocking(move |conn| {
            parent_row(conn, id)?;
            let rows = write_rows(conn, id)?;
            Ok(rows
                .into_iter()
                .map(|(key, op, value)| parse_write(key, &op, value))
                .collect::<Result<_, _>>()?)
        })
        .await
    }

    async fn state_at(&self, id: CheckpointId) -> Result<CheckpointState, StoreError> {
        self.blocking(move |conn| state_at(conn, id)).await
    }

    async fn prune(&self, run_id: &str, keep_last: usize) -> Result<PruneReport, StoreError> {
        let run_id = run_id.to_owned();
        self.blocking(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let run_id = run_id.as_str();
            if !run_exists(&tx, run_id)? {
                return Err(StoreError::UnknownRun(run_id.to_owned()).into());
            }
            if let Some((_, holder)) = lease_of(&tx, run_id)? {
                replaceable(run_id, holder, false)?;
            }
            let keep = i64::try_from(keep_last.max(1)).unwrap_or(i64::MAX);
            let oldest_kept: Option<i64> = tx
                .query_row(
                    "SELECT id FROM checkpoints WHERE run_id = ?1 ORDER BY id DESC \
                     LIMIT 1 OFFSET ?2",
                    params![run_id, keep - 1],
                    |row| row.get(0),
                )
                .optional()?;
            let Some(oldest_kept) = oldest_kept else {
                return Ok(PruneReport::default());
            };
            // Kept checkpoints whose parent goes: each starts a chain of its own from now on.
            let orphans = tx
                .prepare(
                    "SELECT c.id, EXISTS (SELECT 1 FROM snapshots s WHERE s.checkpoint_id = c.id) \
                     FROM checkpoints c WHERE c.run_id = ?1 AND c.id >= ?2 \
                     AND c.parent_id IS NOT NULL AND c.parent_id < ?2 ORDER BY c.id",
                )?
                .query_map(params![run_id, oldest_kept], |row| {
                    Ok((row.get::<_, i64>(0)?, row.get::<_, bool>(1)?))
                })?
                .collect::<Result<Vec<_>, _>>()?;
            let mut report = PruneReport::default();
            for (id, has_snapshot) in orphans {
                if !has_snapshot {
                    let at = state_at(&tx, id)?;
                    let text = serde_json::to_string(&at.state)?;
                    let bytes = i64::try_from(text.len()).unwrap_or(i64::MAX);
                    tx.execute(
                        "INSERT INTO snapshots (checkpoint_id, state, versions) \
                         VALUES (?1, ?2, ?3)",
                        params![id, text, serde_json::to_string(&at.versions)?],
                    )?;
                    tx.execute(
                        "UPDATE checkpoints SET chain_bytes = 0, chain_len = 0, base_bytes = ?2 \
                         WHERE id = ?1",
                        params![id, bytes],
                    )?;
                    report.snapshotted.push(id);
                }
                tx.execute(
                    "UPDATE checkpoints SET parent_id = NULL WHERE id = ?1",
                    params![id],
                )?;
            }
            let doomed = "SELECT id FROM checkpoints WHERE run_id = ?1 AND id < ?2";
            tx.execute(
                &format!("DELETE FROM writes WHERE checkpoint_id IN ({doomed})"),
                params![run_id, oldest_kept],
            )?;
            tx.execute(
                &format!("DELETE FROM snapshots WHERE checkpoint_id IN ({doomed})"),
                params![run_id, oldest_kept],
            )?;
            let removed = tx.execute(
                "DELETE FROM checkpoints WHERE run_id = ?1 AND id < ?2",
                params![run_id, oldest_kept],
            )?;
            report.removed = removed as u64;
            tx.commit()?;
            Ok(report)
        })
        .await
    }
}

/// Writes `checkpoints` of the run of `lease` as one chain in one transaction (see
/// [`Store::put_chain`]).
fn put_chain(
    conn: &mut Connection,
    lease: &Lease,
    checkpoints: &[NewCheckpoint<'_>],
    policy: SnapshotPolicy,
) -> Res<Vec<CheckpointId>> {
    let run_id = lease.run_id.as_str();
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    fence(&tx, lease)?;
    let now = now_ms();
    let mut ids: Vec<CheckpointId> = Vec::with_capacity(checkpoints.len());
    for checkpoint in checkpoints {
        let parent = ids.last().copied().or(checkpoint.parent);
        ids.push(insert_checkpoint(
            &tx, run_id, checkpoint, parent, policy, now,
        )?);
    }
    if let Some(head) = ids.last() {
        tx.prepare_cached("UPDATE runs SET head = ?2, updated_ms = ?3 WHERE run_id = ?1")?
            .execute(params![run_id, head, now])?;
    }
    tx.commit()?;
    Ok(ids)
}

/// Inserts `checkpoint` of run `run_id` after `parent` (its writes, and a snapshot when it
/// takes one), inside the caller's transaction.
fn insert_checkpoint(
    tx: &Connection,
    run_id: &str,
    checkpoint: &NewCheckpoint<'_>,
    parent: Option<CheckpointId>,
    policy: SnapshotPolicy,
    now: i64,
) -> Res<CheckpointId> {
    let parent_row = parent.map(|id| parent_row(tx, id)).transpose()?;
    let planned = Planned::new(checkpoint, parent, run_id, parent_row, policy)?;
    // The state is rebuilt and serialised only when this checkpoint takes a snapshot: the
    // parent's (its snapshot and the writes since) with this step's writes.
    let base = planned
        .snapshot_base()
        .map(|id| state_at(tx, id))
        .transpose()?;
    let chained = planned.chained(base)?;
    // Cached, as the other statements of a put are: in a profile of the routed bench a tenth
    // of the samples parsed SQL (this INSERT and the head's UPDATE, BEGIN and COMMIT).
    tx.prepare_cached(
        "INSERT INTO checkpoints (run_id, parent_id, step, node, next, metadata, \
         created_ms, write_bytes, chain_bytes, chain_len, base_bytes) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
    )?
    .execute(params![
        run_id,
        parent,
        planned.step,
        checkpoint.node,
        serde_json::to_string(&checkpoint.next)?,
        checkpoint.metadata.to_string(),
        now,
        planned.write_bytes,
        chained.chain_bytes,
        chained.chain_len,
        chained.base_bytes,
    ])?;
    let id = tx.last_insert_rowid();
    {
        let mut insert = tx.prepare_cached(
            "INSERT INTO writes (checkpoint_id, seq, key, op, value) VALUES (?1, ?2, ?3, ?4, ?5)",
        )?;
        for (seq, (key, op, value)) in planned.rows.iter().enumerate() {
            insert.execute(params![id, seq as i64, key, op, value])?;
        }
    }
    if let Some((state, versions)) = &chained.snapshot {
        tx.execute(
            "INSERT INTO snapshots (checkpoint_id, state, versions) VALUES (?1, ?2, ?3)",
            params![id, state, versions],
        )?;
    }
    Ok(id)
}

const RUN_SELECT: &str = "SELECT r.run_id, r.workflow, r.status, r.detail, r.input, r.head, \
     (SELECT COUNT(*) FROM checkpoints c WHERE c.run_id = r.run_id), r.created_ms, r.updated_ms, \
     l.pid, l.host, l.started, l.claimed_ms \
     FROM runs r LEFT JOIN leases l ON l.run_id = r.run_id";

fn run_columns(row: &rusqlite::Row<'_>) -> rusqlite::Result<RunColumns> {
    Ok(RunColumns {
        run_id: row.get(0)?,
        workflow: row.get(1)?,
        status: row.get(2)?,
        detail: row.get(3)?,
        input: row.get(4)?,
        head: row.get(5)?,
        checkpoints: row.get(6)?,
        created_ms: row.get(7)?,
        updated_ms: row.get(8)?,
        lease: holder_columns(row, 9)?,
    })
}

/// The lease holder in the columns from `first` on (pid, host, started, claimed_ms), if any.
fn holder_columns(row: &rusqlite::Row<'_>, first: usize) -> rusqlite::Result<Option<LeaseHolder>> {
    let Some(pid) = row.get::<_, Option<i64>>(first)? else {
        return Ok(None);
    };
    Ok(Some(LeaseHolder {
        owner: Owner {
            pid: u32::try_from(pid).unwrap_or(0),
            host: row.get(first + 1)?,
            started: row.get(first + 2)?,
        },
        since_ms: row.get(first + 3)?,
        expires_ms: None,
        expired: false,
    }))
}

/// The lease on run `run_id`, if one is held: its id and holder.
fn lease_of(conn: &Connection, run_id: &str) -> Res<Option<(i64, LeaseHolder)>> {
    let row = conn
        .prepare_cached("SELECT id, pid, host, started, claimed_ms FROM leases WHERE run_id = ?1")?
        .query_row([run_id], |row| {
            let holder = holder_columns(row, 1)?;
            Ok((row.get::<_, i64>(0)?, holder))
        })
        .optional()?;
    Ok(row.and_then(|(id, holder)| holder.map(|holder| (id, holder))))
}

fn insert_lease(conn: &Connection, run_id: &str, owner: &Owner) -> Res<Lease> {
    conn.execute(
        "INSERT INTO leases (run_id, pid, host, started, claimed_ms) VALUES (?1, ?2, ?3, ?4, ?5)",
        params![run_id, owner.pid, owner.host, owner.started, now_ms()],
    )?;
    Ok(Lease {
        run_id: run_id.to_owned(),
        id: conn.last_insert_rowid(),
    })
}

/// Fencing: fails unless `lease` is still the lease of its run.
fn fence(conn: &Connection, lease: &Lease) -> Res<()> {
    let held = conn
        .prepare_cached("SELECT 1 FROM leases WHERE id = ?1 AND run_id = ?2")?
        .exists(params![lease.id, lease.run_id])?;
    if held {
        return Ok(());
    }
    if !run_exists(conn, &lease.run_id)? {
        return Err(StoreError::UnknownRun(lease.run_id.clone()).into());
    }
    Err(StoreError::LeaseLost {
        run_id: lease.run_id.clone(),
        holder: lease_of(conn, &lease.run_id)?.map(|(_, holder)| holder),
    }
    .into())
}

fn run_exists(conn: &Connection, run_id: &str) -> Res<bool> {
    Ok(conn
        .prepare_cached("SELECT 1 FROM runs WHERE run_id = ?1")?
        .exists([run_id])?)
}

fn parent_row(conn: &Connection, id: CheckpointId) -> Res<ParentRow> {
    conn.prepare_cached(
        "SELECT run_id, step, chain_bytes, chain_len, base_bytes FROM checkpoints WHERE id = ?1",
    )?
    .query_row([id], |row| {
        Ok(ParentRow {
            run_id: row.get(0)?,
            step: row.get(1)?,
            chain_bytes: row.get(2)?,
            chain_len: row.get(3)?,
            base_bytes: row.get(4)?,
        })
    })
    .optional()?
    .ok_or(Failure::Store(StoreError::UnknownCheckpoint(id)))
}

fn checkpoint_record(conn: &Connection, id: CheckpointId) -> Res<CheckpointRecord> {
    let written = conn
        .prepare_cached("SELECT key FROM writes WHERE checkpoint_id = ?1 ORDER BY seq")?
        .query_map([id], |row| row.get::<_, String>(0))?
        .collect::<Result<Vec<_>, _>>()?;
    let columns = conn
        .prepare_cached(
            "SELECT run_id, parent_id, step, node, next, metadata, created_ms, write_bytes, \
             EXISTS (SELECT 1 FROM snapshots s WHERE s.checkpoint_id = c.id) \
             FROM checkpoints c WHERE id = ?1",
        )?
        .query_row([id], |row| {
            Ok(CheckpointColumns {
                id,
                run_id: row.get(0)?,
                parent: row.get(1)?,
                step: row.get(2)?,
                node: row.get(3)?,
                next: row.get(4)?,
                metadata: row.get(5)?,
                created_ms: row.get(6)?,
                written,
                write_bytes: row.get(7)?,
                snapshot: row.get(8)?,
            })
        })
        .optional()?
        .ok_or(Failure::Store(StoreError::UnknownCheckpoint(id)))?;
    Ok(columns.into_record()?)
}

/// The rows of checkpoint `id`'s writes, in order: key, op, value.
fn write_rows(conn: &Connection, id: CheckpointId) -> Res<Vec<(String, String, Option<String>)>> {
    Ok(conn
        .prepare_cached("SELECT key, op, value FROM writes WHERE checkpoint_id = ?1 ORDER BY seq")?
        .query_map([id], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))?
        .collect::<Result<Vec<_>, _>>()?)
}

/// The checkpoints from the nearest snapshot down to `id`, oldest first: (id, step).
fn chain(conn: &Connection, id: CheckpointId) -> Res<Vec<(CheckpointId, i64)>> {
    parent_row(conn, id)?;
    let chain = conn
        .prepare_cached(
            "WITH RECURSIVE chain(id, parent_id, step, snap) AS ( \
               SELECT id, parent_id, step, \
                 EXISTS (SELECT 1 FROM snapshots s WHERE s.checkpoint_id = c.id) \
               FROM checkpoints c WHERE c.id = ?1 \
               UNION ALL \
               SELECT c.id, c.parent_id, c.step, \
                 EXISTS (SELECT 1 FROM snapshots s WHERE s.checkpoint_id = c.id) \
               FROM checkpoints c JOIN chain ON c.id = chain.parent_id WHERE chain.snap = 0 \
             ) SELECT id, step, snap FROM chain ORDER BY id",
        )?
        .query_map([id], |row| {
            Ok((
                row.get::<_, i64>(0)?,
                row.get::<_, i64>(1)?,
                row.get::<_, bool>(2)?,
            ))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    match chain.first() {
        Some((_, _, true)) => Ok(chain.into_iter().map(|(id, step, _)| (id, step)).collect()),
        _ => Err(RowError::Damaged(format!("checkpoint {id} has no snapshot before it")).into()),
    }
}

fn state_at(conn: &Connection, id: CheckpointId) -> Res<CheckpointState> {
    let chain = chain(conn, id)?;
    let (base, _) = chain[0];
    let (state, versions) = conn
        .prepare_cached("SELECT state, versions FROM snapshots WHERE checkpoint_id = ?1")?
        .query_row([base], |row| {
            Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?))
        })?;
    let later = chain[1..]
        .iter()
        .map(|&(id, step)| Ok((step, write_rows(conn, id)?)))
        .collect::<Res<Vec<_>>>()?;
    Ok(replay((&state, &versions), later)?)
}
