//! The SQLite checkpoint store.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, MAIN_DB, OpenFlags, OptionalExtension, TransactionBehavior, params};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::StoreError;
use super::lease::{Claim, Lease, LeaseHolder, Liveness, Owner};
use super::schema;
use crate::state::{State, StateDelta, StateWrite};

/// The id of a checkpoint (unique in its database, increasing with time).
pub type CheckpointId = i64;

/// Where a run stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum RunStatus {
    /// Running, or killed while running (resume continues it).
    Running,
    /// Finished.
    Completed,
    /// Stopped by an error.
    Failed {
        /// What went wrong.
        error: String,
    },
    /// Stopped to ask a human; resume with the answer.
    AwaitingHuman {
        /// The question.
        question: String,
    },
    /// Stopped by its caller (Ctrl-C, a cancelled token) with its state and checkpoints
    /// kept; resume continues it.
    Interrupted,
}

impl RunStatus {
    /// The status name as stored and shown (`running`, `completed`, `failed`,
    /// `awaiting_human`, `interrupted`).
    pub fn name(&self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Completed => "completed",
            Self::Failed { .. } => "failed",
            Self::AwaitingHuman { .. } => "awaiting_human",
            Self::Interrupted => "interrupted",
        }
    }

    fn detail(&self) -> Option<&str> {
        match self {
            Self::Running | Self::Completed | Self::Interrupted => None,
            Self::Failed { error } => Some(error),
            Self::AwaitingHuman { question } => Some(question),
        }
    }

    fn from_row(name: &str, detail: Option<String>) -> Option<Self> {
        let detail = detail.unwrap_or_default();
        Some(match name {
            "running" => Self::Running,
            "completed" => Self::Completed,
            "failed" => Self::Failed { error: detail },
            "awaiting_human" => Self::AwaitingHuman { question: detail },
            "interrupted" => Self::Interrupted,
            _ => return None,
        })
    }
}

/// A run to create.
#[derive(Debug, Clone, PartialEq)]
pub struct NewRun {
    /// Its id (the thread id).
    pub run_id: String,
    /// The workflow it runs (a file path or a built-in name).
    pub workflow: String,
    /// Its inputs, for the record.
    pub input: Value,
}

impl NewRun {
    /// A run `run_id` of `workflow` with no inputs.
    pub fn new(run_id: impl Into<String>, workflow: impl Into<String>) -> Self {
        Self {
            run_id: run_id.into(),
            workflow: workflow.into(),
            input: Value::Object(Map::new()),
        }
    }

    /// With these inputs.
    pub fn input(mut self, input: Value) -> Self {
        self.input = input;
        self
    }
}

/// A checkpoint to write: the writes of one step, after its parent's.
#[derive(Debug, Clone)]
pub struct NewCheckpoint<'a> {
    parent: Option<CheckpointId>,
    node: String,
    next: Vec<String>,
    writes: &'a StateDelta,
    metadata: Value,
}

impl<'a> NewCheckpoint<'a> {
    /// After `node` ran and wrote `writes` (to its parent's state; a chain's first
    /// checkpoint writes its whole state).
    pub fn new(node: impl Into<String>, writes: &'a StateDelta) -> Self {
        Self {
            parent: None,
            node: node.into(),
            next: Vec::new(),
            writes,
            metadata: Value::Object(Map::new()),
        }
    }

    /// Following `parent` (`None` starts a chain).
    pub fn parent(mut self, parent: Option<CheckpointId>) -> Self {
        self.parent = parent;
        self
    }

    /// The nodes that run next (what resuming from here runs).
    pub fn next(mut self, next: Vec<String>) -> Self {
        self.next = next;
        self
    }

    /// Extra facts about the step (timings, attempts), as JSON.
    pub fn metadata(mut self, metadata: Value) -> Self {
        self.metadata = metadata;
        self
    }
}

/// A stored run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunRecord {
    /// Its id.
    pub run_id: String,
    /// The workflow it runs.
    pub workflow: String,
    /// Where it stands.
    pub status: RunStatus,
    /// Its inputs.
    pub input: Value,
    /// Its latest checkpoint.
    pub head: Option<CheckpointId>,
    /// How many checkpoints it keeps.
    pub checkpoints: u64,
    /// When it was created (Unix milliseconds).
    pub created_ms: i64,
    /// When it last changed (Unix milliseconds).
    pub updated_ms: i64,
    /// The process driving it, if one holds its lease (check [`Owner::liveness`]: a killed
    /// process leaves its lease behind).
    pub lease: Option<LeaseHolder>,
}

/// A stored checkpoint, without its state.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CheckpointRecord {
    /// Its id.
    pub id: CheckpointId,
    /// Its run.
    pub run_id: String,
    /// The checkpoint before it (`None` for the first, or when retention removed it).
    pub parent: Option<CheckpointId>,
    /// Steps since the start of the run.
    pub step: i64,
    /// The node that ran.
    pub node: String,
    /// The nodes that run next.
    pub next: Vec<String>,
    /// Extra facts about the step.
    pub metadata: Value,
    /// When it was written (Unix milliseconds).
    pub created_ms: i64,
    /// The channels the step wrote, in order.
    pub written: Vec<String>,
    /// The size of those writes (bytes of JSON).
    pub write_bytes: i64,
    /// Whether it stores a full snapshot.
    pub snapshot: bool,
}

/// The state at a checkpoint.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CheckpointState {
    /// The state.
    pub state: State,
    /// Each channel's version: the step that last wrote it.
    pub versions: BTreeMap<String, i64>,
}

/// When a checkpoint stores a full snapshot instead of only its writes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SnapshotPolicy {
    /// Snapshot when the writes since the last snapshot exceed its size times this.
    pub max_delta_ratio: f64,
    /// Snapshot when this many checkpoints followed the last snapshot.
    pub max_chain_len: i64,
}

impl Default for SnapshotPolicy {
    /// Snapshot when the writes since the last snapshot outweigh it, or after 10 000 steps:
    /// reading a checkpoint back then costs at most about twice the state's size.
    fn default() -> Self {
        Self {
            max_delta_ratio: 1.0,
            max_chain_len: 10_000,
        }
    }
}

/// What [`CheckpointStore::prune`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PruneReport {
    /// Checkpoints removed.
    pub removed: u64,
    /// Kept checkpoints that took a snapshot so they stay readable.
    pub snapshotted: Vec<CheckpointId>,
}

/// Checkpoints of runs in one SQLite database file.
#[derive(Debug)]
pub struct CheckpointStore {
    conn: Mutex<Connection>,
    path: PathBuf,
    policy: SnapshotPolicy,
}

/// A failure inside a store call, given the database path at the boundary.
enum Failure {
    Sql(rusqlite::Error),
    Json(serde_json::Error),
    Store(StoreError),
    Damaged(String),
}

impl From<rusqlite::Error> for Failure {
    fn from(e: rusqlite::Error) -> Self {
        Self::Sql(e)
    }
}

impl From<serde_json::Error> for Failure {
    fn from(e: serde_json::Error) -> Self {
        Self::Json(e)
    }
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        Self::Store(e)
    }
}

type Res<T> = Result<T, Failure>;

/// The bookkeeping of a parent checkpoint that a put needs.
struct ParentRow {
    run_id: String,
    step: i64,
    chain_bytes: i64,
    chain_len: i64,
    base_bytes: i64,
}

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

impl CheckpointStore {
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
    /// place through [`open`](Self::open), as before any read.
    pub fn open_read_only(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        let path = path.as_ref().to_path_buf();
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
                path,
                found,
                supported: schema::VERSION,
            }),
            found if found < schema::VERSION => {
                drop(conn);
                Self::open(path)
            }
            _ => Ok(Self {
                conn: Mutex::new(conn),
                path,
                policy: SnapshotPolicy::default(),
            }),
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
            Ok(Ok(())) => Ok(Self {
                conn: Mutex::new(conn),
                path,
                policy: SnapshotPolicy::default(),
            }),
            Ok(Err(found)) => Err(StoreError::NewerSchema {
                path,
                found,
                supported: schema::VERSION,
            }),
            Err(source) => Err(StoreError::sqlite(path, source)),
        }
    }

    /// With this snapshot policy.
    pub fn with_policy(mut self, policy: SnapshotPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn lock(&self) -> MutexGuard<'_, Connection> {
        // Every use of the connection is a whole transaction or one statement; a panic in
        // one leaves SQLite to roll it back, so a poisoned lock still guards a sound database.
        self.conn
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn finish<T>(&self, result: Res<T>) -> Result<T, StoreError> {
        result.map_err(|failure| match failure {
            Failure::Sql(source) => StoreError::sqlite(self.path.clone(), source),
            Failure::Json(e) => StoreError::Damaged {
                path: self.path.clone(),
                what: format!("a stored value is not valid JSON ({e})"),
            },
            Failure::Store(e) => e,
            Failure::Damaged(what) => StoreError::Damaged {
                path: self.path.clone(),
                what,
            },
        })
    }

    /// Creates run `run.run_id` with status `running`, leased to `owner` in the same
    /// transaction.
    pub fn create_run(&self, run: &NewRun, owner: &Owner) -> Result<Lease, StoreError> {
        let mut conn = self.lock();
        let result = (|| -> Res<Lease> {
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
            let lease = insert_lease(&tx, &run.run_id, owner)?;
            tx.commit()?;
            Ok(lease)
        })();
        self.finish(result)
    }

    /// Claims run `run_id` for `owner`, in one transaction: granted when nobody holds it or
    /// its holder is dead (or cannot be checked and `take_over` is set, e.g. another host);
    /// refused ([`StoreError::Driven`], [`StoreError::DrivenElsewhere`]) otherwise. A live
    /// holder is never taken over: stop it first.
    pub fn claim(&self, run_id: &str, owner: &Owner, take_over: bool) -> Result<Claim, StoreError> {
        let mut conn = self.lock();
        let result = (|| -> Res<Claim> {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            if !run_exists(&tx, run_id)? {
                return Err(StoreError::UnknownRun(run_id.to_owned()).into());
            }
            let replaced = match lease_of(&tx, run_id)? {
                Some((id, holder)) => {
                    let holder = replaceable(run_id, holder, take_over)?;
                    tx.execute("DELETE FROM leases WHERE id = ?1", [id])?;
                    Some(holder)
                }
                None => None,
            };
            let lease = insert_lease(&tx, run_id, owner)?;
            tx.commit()?;
            Ok(Claim { lease, replaced })
        })();
        self.finish(result)
    }

    /// What [`claim`](Self::claim) would do, without writing: the holder it would replace, or
    /// its refusal (for a check before starting anything costly; the claim checks again).
    pub fn check_claim(
        &self,
        run_id: &str,
        take_over: bool,
    ) -> Result<Option<LeaseHolder>, StoreError> {
        let conn = self.lock();
        let result = (|| -> Res<Option<LeaseHolder>> {
            if !run_exists(&conn, run_id)? {
                return Err(StoreError::UnknownRun(run_id.to_owned()).into());
            }
            lease_of(&conn, run_id)?
                .map(|(_, holder)| replaceable(run_id, holder, take_over))
                .transpose()
        })();
        self.finish(result)
    }

    /// Gives `lease` up (nothing happens when it was lost already).
    pub fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        let conn = self.lock();
        let result = (|| -> Res<()> {
            conn.execute("DELETE FROM leases WHERE id = ?1", [lease.id])?;
            Ok(())
        })();
        self.finish(result)
    }

    /// Sets the status of the run of `lease`, if the lease still holds.
    pub fn set_status(&self, lease: &Lease, status: &RunStatus) -> Result<(), StoreError> {
        self.write_status(lease, status, false)
    }

    /// Sets the final status of the run of `lease` and releases it, in one transaction: the
    /// run stopped (completed, failed, waiting for a human, stopped by a limit or Ctrl-C).
    pub fn finish_run(&self, lease: &Lease, status: &RunStatus) -> Result<(), StoreError> {
        self.write_status(lease, status, true)
    }

    fn write_status(
        &self,
        lease: &Lease,
        status: &RunStatus,
        release: bool,
    ) -> Result<(), StoreError> {
        let mut conn = self.lock();
        let result = (|| -> Res<()> {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            fence(&tx, lease)?;
            tx.execute(
                "UPDATE runs SET status = ?2, detail = ?3, updated_ms = ?4 WHERE run_id = ?1",
                params![lease.run_id, status.name(), status.detail(), now_ms()],
            )?;
            if release {
                tx.execute("DELETE FROM leases WHERE id = ?1", [lease.id])?;
            }
            tx.commit()?;
            Ok(())
        })();
        self.finish(result)
    }

    /// Writes a checkpoint of the run of `lease` in one transaction, if the lease still holds,
    /// and makes it the run's head.
    pub fn put(
        &self,
        lease: &Lease,
        checkpoint: NewCheckpoint<'_>,
    ) -> Result<CheckpointId, StoreError> {
        let mut conn = self.lock();
        let policy = self.policy;
        let run_id = lease.run_id.as_str();
        let result = (|| -> Res<CheckpointId> {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            fence(&tx, lease)?;
            let parent = match checkpoint.parent {
                Some(id) => {
                    let row = parent_row(&tx, id)?;
                    if row.run_id != run_id {
                        return Err(StoreError::WrongRun {
                            checkpoint: id,
                            expected: run_id.to_owned(),
                            actual: row.run_id,
                        }
                        .into());
                    }
                    Some(row)
                }
                None => None,
            };
            let rows = checkpoint
                .writes
                .iter()
                .map(write_row)
                .collect::<Res<Vec<_>>>()?;
            let write_bytes: i64 = rows
                .iter()
                .map(|(key, _, value)| key.len() + value.as_ref().map_or(0, String::len))
                .sum::<usize>()
                .try_into()
                .unwrap_or(i64::MAX);
            let step = parent.as_ref().map_or(0, |p| p.step + 1);
            // The state is rebuilt and serialised only when this checkpoint takes a snapshot:
            // the parent's (its snapshot and the writes since) with this step's writes.
            let snapshot = match &parent {
                None => true,
                Some(p) => {
                    let chain_bytes = p.chain_bytes.saturating_add(write_bytes);
                    chain_bytes as f64 > p.base_bytes as f64 * policy.max_delta_ratio
                        || p.chain_len + 1 > policy.max_chain_len
                }
            };
            let snapshot_at = if snapshot {
                let mut at = match checkpoint.parent {
                    Some(parent) => state_at(&tx, parent)?,
                    None => CheckpointState::default(),
                };
                at.state.apply(checkpoint.writes);
                bump_versions(&mut at.versions, checkpoint.writes.iter(), step);
                Some((serde_json::to_string(&at.state)?, at.versions))
            } else {
                None
            };
            let snapshot_text = snapshot_at.as_ref().map(|(text, _)| text);
            let (chain_bytes, chain_len, base_bytes) = match (&snapshot_text, &parent) {
                (Some(text), _) => (0, 0, i64::try_from(text.len()).unwrap_or(i64::MAX)),
                (None, Some(p)) => (
                    p.chain_bytes.saturating_add(write_bytes),
                    p.chain_len + 1,
                    p.base_bytes,
                ),
                (None, None) => (0, 0, 0),
            };
            let now = now_ms();
            tx.execute(
                "INSERT INTO checkpoints (run_id, parent_id, step, node, next, metadata, \
                 created_ms, write_bytes, chain_bytes, chain_len, base_bytes) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
                params![
                    run_id,
                    checkpoint.parent,
                    step,
                    checkpoint.node,
                    serde_json::to_string(&checkpoint.next)?,
                    checkpoint.metadata.to_string(),
                    now,
                    write_bytes,
                    chain_bytes,
                    chain_len,
                    base_bytes,
                ],
            )?;
            let id = tx.last_insert_rowid();
            {
                let mut insert = tx.prepare_cached(
                    "INSERT INTO writes (checkpoint_id, seq, key, op, value) \
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                )?;
                for (seq, (key, op, value)) in rows.iter().enumerate() {
                    insert.execute(params![id, seq as i64, key, op, value])?;
                }
            }
            if let Some((text, versions)) = &snapshot_at {
                tx.execute(
                    "INSERT INTO snapshots (checkpoint_id, state, versions) VALUES (?1, ?2, ?3)",
                    params![id, text, serde_json::to_string(&versions)?],
                )?;
            }
            tx.execute(
                "UPDATE runs SET head = ?2, updated_ms = ?3 WHERE run_id = ?1",
                params![run_id, id, now],
            )?;
            tx.commit()?;
            Ok(id)
        })();
        self.finish(result)
    }

    /// SQLite's integrity check: `ok`, or what it found wrong.
    pub fn integrity_check(&self) -> Result<String, StoreError> {
        let conn = self.lock();
        let result = (|| -> Res<String> {
            let found = conn
                .prepare("PRAGMA integrity_check")?
                .query_map([], |row| row.get::<_, String>(0))?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(found.join("\n"))
        })();
        self.finish(result)
    }

    /// Run `run_id`, if it exists.
    pub fn run(&self, run_id: &str) -> Result<Option<RunRecord>, StoreError> {
        let conn = self.lock();
        let result = (|| -> Res<Option<RunRecord>> {
            let mut stmt = conn.prepare_cached(&format!("{RUN_SELECT} WHERE r.run_id = ?1"))?;
            let row = stmt.query_row([run_id], run_columns).optional()?;
            row.map(RunColumns::into_record).transpose()
        })();
        self.finish(result)
    }

    /// Every run, oldest first.
    pub fn runs(&self) -> Result<Vec<RunRecord>, StoreError> {
        let conn = self.lock();
        let result = (|| -> Res<Vec<RunRecord>> {
            let mut stmt =
                conn.prepare_cached(&format!("{RUN_SELECT} ORDER BY r.created_ms, r.run_id"))?;
            let rows = stmt
                .query_map([], run_columns)?
                .collect::<Result<Vec<_>, _>>()?;
            rows.into_iter().map(RunColumns::into_record).collect()
        })();
        self.finish(result)
    }

    /// The checkpoints of run `run_id`, oldest first.
    pub fn history(&self, run_id: &str) -> Result<Vec<CheckpointRecord>, StoreError> {
        let conn = self.lock();
        let result = (|| -> Res<Vec<CheckpointRecord>> {
            if !run_exists(&conn, run_id)? {
                return Err(StoreError::UnknownRun(run_id.to_owned()).into());
            }
            let ids = conn
                .prepare_cached("SELECT id FROM checkpoints WHERE run_id = ?1 ORDER BY id")?
                .query_map([run_id], |row| row.get::<_, i64>(0))?
                .collect::<Result<Vec<_>, _>>()?;
            ids.into_iter()
                .map(|id| checkpoint_record(&conn, id))
                .collect()
        })();
        self.finish(result)
    }

    /// Checkpoint `id`.
    pub fn checkpoint(&self, id: CheckpointId) -> Result<CheckpointRecord, StoreError> {
        let conn = self.lock();
        let result = checkpoint_record(&conn, id);
        self.finish(result)
    }

    /// The writes of checkpoint `id`, in order.
    pub fn writes(&self, id: CheckpointId) -> Result<StateDelta, StoreError> {
        let conn = self.lock();
        let result = (|| -> Res<StateDelta> {
            parent_row(&conn, id)?;
            read_writes(&conn, id)
        })();
        self.finish(result)
    }

    /// The state at checkpoint `id`: its chain's snapshot with the writes since replayed.
    pub fn state_at(&self, id: CheckpointId) -> Result<CheckpointState, StoreError> {
        let conn = self.lock();
        let result = state_at(&conn, id);
        self.finish(result)
    }

    /// Keeps the last `keep_last` (at least 1) checkpoints of run `run_id` and removes the
    /// older ones; a kept checkpoint whose chain would lose its snapshot takes one first.
    /// Refused while a live process drives the run (its chain is not ours to cut).
    pub fn prune(&self, run_id: &str, keep_last: usize) -> Result<PruneReport, StoreError> {
        let mut conn = self.lock();
        let result = (|| -> Res<PruneReport> {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
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
        })();
        self.finish(result)
    }
}

const RUN_SELECT: &str = "SELECT r.run_id, r.workflow, r.status, r.detail, r.input, r.head, \
     (SELECT COUNT(*) FROM checkpoints c WHERE c.run_id = r.run_id), r.created_ms, r.updated_ms, \
     l.pid, l.host, l.started, l.claimed_ms \
     FROM runs r LEFT JOIN leases l ON l.run_id = r.run_id";

/// A `runs` row before its JSON and status are checked.
struct RunColumns {
    run_id: String,
    workflow: String,
    status: String,
    detail: Option<String>,
    input: String,
    head: Option<i64>,
    checkpoints: i64,
    created_ms: i64,
    updated_ms: i64,
    lease: Option<LeaseHolder>,
}

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

/// `holder` when a claim on `run_id` may replace it (see [`CheckpointStore::claim`]).
fn replaceable(run_id: &str, holder: LeaseHolder, take_over: bool) -> Res<LeaseHolder> {
    let run_id = run_id.to_owned();
    match holder.owner.liveness() {
        Liveness::Dead => Ok(holder),
        Liveness::Unchecked if take_over => Ok(holder),
        Liveness::Unchecked => Err(StoreError::DrivenElsewhere { run_id, holder }.into()),
        Liveness::Alive => Err(StoreError::Driven { run_id, holder }.into()),
    }
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

impl RunColumns {
    fn into_record(self) -> Res<RunRecord> {
        let status = RunStatus::from_row(&self.status, self.detail).ok_or_else(|| {
            Failure::Damaged(format!(
                "run `{}` has the unknown status `{}`",
                self.run_id, self.status
            ))
        })?;
        Ok(RunRecord {
            input: serde_json::from_str(&self.input)?,
            run_id: self.run_id,
            workflow: self.workflow,
            status,
            head: self.head,
            checkpoints: u64::try_from(self.checkpoints).unwrap_or(0),
            created_ms: self.created_ms,
            updated_ms: self.updated_ms,
            lease: self.lease,
        })
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
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
    let row = conn
        .prepare_cached(
            "SELECT run_id, parent_id, step, node, next, metadata, created_ms, write_bytes, \
             EXISTS (SELECT 1 FROM snapshots s WHERE s.checkpoint_id = c.id) \
             FROM checkpoints c WHERE id = ?1",
        )?
        .query_row([id], |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, Option<i64>>(1)?,
                row.get::<_, i64>(2)?,
                row.get::<_, String>(3)?,
                row.get::<_, String>(4)?,
                row.get::<_, String>(5)?,
                row.get::<_, i64>(6)?,
                row.get::<_, i64>(7)?,
                row.get::<_, bool>(8)?,
            ))
        })
        .optional()?
        .ok_or(Failure::Store(StoreError::UnknownCheckpoint(id)))?;
    let (run_id, parent, step, node, next, metadata, created_ms, write_bytes, snapshot) = row;
    let written = conn
        .prepare_cached("SELECT key FROM writes WHERE checkpoint_id = ?1 ORDER BY seq")?
        .query_map([id], |row| row.get::<_, String>(0))?
        .collect::<Result<Vec<_>, _>>()?;
    Ok(CheckpointRecord {
        id,
        run_id,
        parent,
        step,
        node,
        next: serde_json::from_str(&next)?,
        metadata: serde_json::from_str(&metadata)?,
        created_ms,
        written,
        write_bytes,
        snapshot,
    })
}

/// The row of one write: key, op, JSON value (SQL `NULL` for a delete; a replace with
/// `null` stores the JSON text `null`, so the two never meet).
fn write_row(write: &StateWrite) -> Res<(&str, &str, Option<String>)> {
    Ok(match write {
        StateWrite::Replace { key, value } => (key, "replace", Some(value.to_string())),
        StateWrite::Append { key, items } => (key, "append", Some(serde_json::to_string(items)?)),
        StateWrite::Delete { key } => (key, "delete", None),
    })
}

fn parse_write(key: String, op: &str, value: Option<String>) -> Res<StateWrite> {
    let value = match &value {
        Some(text) => Some(serde_json::from_str::<Value>(text)?),
        None => None,
    };
    Ok(match (op, value) {
        ("replace", Some(value)) => StateWrite::Replace { key, value },
        ("append", Some(Value::Array(items))) => StateWrite::Append { key, items },
        ("delete", None) => StateWrite::Delete { key },
        (op, _) => {
            return Err(Failure::Damaged(format!(
                "a write of `{key}` has the unknown form `{op}`"
            )));
        }
    })
}

fn read_writes(conn: &Connection, id: CheckpointId) -> Res<StateDelta> {
    let rows = conn
        .prepare_cached("SELECT key, op, value FROM writes WHERE checkpoint_id = ?1 ORDER BY seq")?
        .query_map([id], |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, String>(1)?,
                row.get::<_, Option<String>>(2)?,
            ))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    rows.into_iter()
        .map(|(key, op, value)| parse_write(key, &op, value))
        .collect()
}

fn bump_versions<'w>(
    versions: &mut BTreeMap<String, i64>,
    writes: impl Iterator<Item = &'w StateWrite>,
    step: i64,
) {
    for write in writes {
        match write {
            StateWrite::Delete { key } => {
                versions.remove(key);
            }
            other => {
                versions.insert(other.key().to_owned(), step);
            }
        }
    }
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
        _ => Err(Failure::Damaged(format!(
            "checkpoint {id} has no snapshot before it"
        ))),
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
    let mut state: State = serde_json::from_str(&state)?;
    let mut versions: BTreeMap<String, i64> = serde_json::from_str(&versions)?;
    for &(id, step) in &chain[1..] {
        let writes = read_writes(conn, id)?;
        state.apply(&writes);
        bump_versions(&mut versions, writes.iter(), step);
    }
    Ok(CheckpointState { state, versions })
}
