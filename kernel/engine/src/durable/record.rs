//! What a store keeps, in the form both stores read and write: runs, checkpoints, their
//! writes and snapshots, and the bookkeeping of the snapshot policy. The SQL differs per
//! store; how a row becomes a record, a write becomes a row, and when a checkpoint takes a
//! snapshot does not, and lives here once.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::StoreError;
use super::lease::{LeaseHolder, Liveness};
use crate::state::{State, StateDelta, StateWrite};

#[cfg(doc)]
use super::Store;

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

    pub(super) fn detail(&self) -> Option<&str> {
        match self {
            Self::Running | Self::Completed | Self::Interrupted => None,
            Self::Failed { error } => Some(error),
            Self::AwaitingHuman { question } => Some(question),
        }
    }

    pub(super) fn from_row(name: &str, detail: Option<String>) -> Option<Self> {
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
    pub(crate) run_id: String,
    /// The workflow it runs (a file path or a built-in name).
    pub(crate) workflow: String,
    /// Its inputs, for the record.
    pub(crate) input: Value,
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
    pub(crate) fn input(mut self, input: Value) -> Self {
        self.input = input;
        self
    }
}

/// A checkpoint to write: the writes of one step, after its parent's.
#[derive(Debug, Clone)]
pub struct NewCheckpoint<'a> {
    pub(super) parent: Option<CheckpointId>,
    pub(super) node: String,
    pub(super) next: Vec<String>,
    pub(super) writes: &'a StateDelta,
    pub(super) metadata: Value,
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
    /// The process driving it, if one holds its lease (check [`LeaseHolder::liveness`]: a killed
    /// process leaves its lease behind).
    pub lease: Option<LeaseHolder>,
}

/// A stored checkpoint, without its state.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CheckpointRecord {
    /// Its id.
    pub id: CheckpointId,
    /// Its run.
    pub(crate) run_id: String,
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
    pub(crate) versions: BTreeMap<String, i64>,
}

/// When a checkpoint stores a full snapshot instead of only its writes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct SnapshotPolicy {
    /// Snapshot when the writes since the last snapshot exceed its size times this.
    pub(crate) max_delta_ratio: f64,
    /// Snapshot when this many checkpoints followed the last snapshot.
    pub(crate) max_chain_len: i64,
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

/// What [`Store::prune`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PruneReport {
    /// Checkpoints removed.
    pub removed: u64,
    /// Kept checkpoints that took a snapshot so they stay readable.
    pub(crate) snapshotted: Vec<CheckpointId>,
}

/// A stored value this schema does not write (a damaged or hand-edited database).
#[derive(Debug)]
pub(super) enum RowError {
    /// Not valid JSON.
    Json(serde_json::Error),
    /// Valid, but not a value of its column.
    Damaged(String),
}

impl From<serde_json::Error> for RowError {
    fn from(e: serde_json::Error) -> Self {
        Self::Json(e)
    }
}

/// A failure inside a store's call, turned into a [`StoreError`] at the store's boundary,
/// where the database is known: its driver's error `E` (rusqlite's, the PostgreSQL pool's), a
/// stored value that does not read ([`RowError`]), or a store error as such.
#[derive(Debug)]
pub(super) enum Failure<E> {
    /// The database driver failed.
    Driver(E),
    /// A stored value is damaged.
    Row(RowError),
    /// Refused as such (an unknown run, a lost lease, …).
    Store(StoreError),
}

impl<E> From<RowError> for Failure<E> {
    fn from(e: RowError) -> Self {
        Self::Row(e)
    }
}

impl<E> From<serde_json::Error> for Failure<E> {
    fn from(e: serde_json::Error) -> Self {
        Self::Row(RowError::Json(e))
    }
}

impl<E> From<StoreError> for Failure<E> {
    fn from(e: StoreError) -> Self {
        Self::Store(e)
    }
}

impl RowError {
    /// As the store error of database `db`.
    pub(super) fn into_store_error(self, db: String) -> StoreError {
        let what = match self {
            Self::Json(e) => format!("a stored value is not valid JSON ({e})"),
            Self::Damaged(what) => what,
        };
        StoreError::Damaged { db, what }
    }
}

/// A `runs` row (with its lease, if one is held) before its JSON and status are checked.
pub(super) struct RunColumns {
    pub(super) run_id: String,
    pub(super) workflow: String,
    pub(super) status: String,
    pub(super) detail: Option<String>,
    pub(super) input: String,
    pub(super) head: Option<i64>,
    pub(super) checkpoints: i64,
    pub(super) created_ms: i64,
    pub(super) updated_ms: i64,
    pub(super) lease: Option<LeaseHolder>,
}

impl RunColumns {
    pub(super) fn into_record(self) -> Result<RunRecord, RowError> {
        let status = RunStatus::from_row(&self.status, self.detail).ok_or_else(|| {
            RowError::Damaged(format!(
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

/// A `checkpoints` row with its snapshot flag and written keys, before its JSON is checked.
pub(super) struct CheckpointColumns {
    pub(super) id: CheckpointId,
    pub(super) run_id: String,
    pub(super) parent: Option<CheckpointId>,
    pub(super) step: i64,
    pub(super) node: String,
    pub(super) next: String,
    pub(super) metadata: String,
    pub(super) created_ms: i64,
    pub(super) written: Vec<String>,
    pub(super) write_bytes: i64,
    pub(super) snapshot: bool,
}

impl CheckpointColumns {
    pub(super) fn into_record(self) -> Result<CheckpointRecord, RowError> {
        Ok(CheckpointRecord {
            id: self.id,
            run_id: self.run_id,
            parent: self.parent,
            step: self.step,
            node: self.node,
            next: serde_json::from_str(&self.next)?,
            metadata: serde_json::from_str(&self.metadata)?,
            created_ms: self.created_ms,
            written: self.written,
            write_bytes: self.write_bytes,
            snapshot: self.snapshot,
        })
    }
}

/// The row of one write: key, op, JSON value (SQL `NULL` for a delete; a replace with
/// `null` stores the JSON text `null`, so the two never meet).
pub(super) type WriteRow<'w> = (&'w str, &'static str, Option<String>);

/// [`WriteRow`] of `write`.
pub(super) fn write_row(write: &StateWrite) -> Result<WriteRow<'_>, RowError> {
    Ok(match write {
        StateWrite::Replace { key, value } => (key, "replace", Some(value.to_string())),
        StateWrite::Append { key, items } => (key, "append", Some(serde_json::to_string(items)?)),
        StateWrite::Delete { key } => (key, "delete", None),
    })
}

/// The write a [`WriteRow`] stored.
pub(super) fn parse_write(
    key: String,
    op: &str,
    value: Option<String>,
) -> Result<StateWrite, RowError> {
    let value = match &value {
        Some(text) => Some(serde_json::from_str::<Value>(text)?),
        None => None,
    };
    Ok(match (op, value) {
        ("replace", Some(value)) => StateWrite::Replace {
            key: key.into(),
            value,
        },
        ("append", Some(Value::Array(items))) => StateWrite::Append {
            key: key.into(),
            items,
        },
        ("delete", None) => StateWrite::Delete { key: key.into() },
        (op, _) => {
            return Err(RowError::Damaged(format!(
                "a write of `{key}` has the unknown form `{op}`"
            )));
        }
    })
}

/// Moves each channel `writes` wrote to version `step` (a delete drops its channel).
pub(super) fn bump_versions<'w>(
    versions: &mut BTreeMap<String, i64>,
    writes: impl Iterator<Item = &'w StateWrite>,
    step: i64,
) {
    for write in writes {
        match write {
            StateWrite::Delete { key } => {
                versions.remove(key.as_ref());
            }
            other => {
                versions.insert(other.key().to_owned(), step);
            }
        }
    }
}

/// The bookkeeping of a parent checkpoint that a put needs.
pub(super) struct ParentRow {
    pub(super) run_id: String,
    pub(super) step: i64,
    pub(super) chain_bytes: i64,
    pub(super) chain_len: i64,
    pub(super) base_bytes: i64,
}

impl ParentRow {
    /// Fails unless the parent `id` (this row) belongs to run `run_id`.
    pub(super) fn check_run(&self, id: CheckpointId, run_id: &str) -> Result<(), StoreError> {
        if self.run_id == run_id {
            return Ok(());
        }
        Err(StoreError::WrongRun {
            checkpoint: id,
            expected: run_id.to_owned(),
            actual: self.run_id.clone(),
        })
    }
}

/// A checkpoint about to be put: its rows and where it stands in its chain.
pub(super) struct Planned<'w> {
    /// Its writes as rows, in order.
    pub(super) rows: Vec<WriteRow<'w>>,
    /// Their size (bytes of key and JSON).
    pub(super) write_bytes: i64,
    /// Its step: its parent's plus one.
    pub(super) step: i64,
    /// Whether it takes a full snapshot.
    snapshot: bool,
    /// Its parent: the id and the row.
    parent: Option<(CheckpointId, ParentRow)>,
    /// Its writes.
    writes: &'w StateDelta,
}

/// What a put stores beside its writes: the snapshot it takes, if any (state and channel
/// versions as JSON text), and its chain bookkeeping.
pub(super) struct Chained {
    /// The snapshot, when it takes one.
    pub(super) snapshot: Option<(String, String)>,
    /// Bytes written since the last snapshot.
    pub(super) chain_bytes: i64,
    /// Checkpoints since the last snapshot.
    pub(super) chain_len: i64,
    /// The size of the last snapshot.
    pub(super) base_bytes: i64,
}

impl<'w> Planned<'w> {
    /// Plans `checkpoint` of run `run_id` after checkpoint `parent` (`row`: its row, as the
    /// store read it) under `policy`: a chain's first checkpoint snapshots, a later one when
    /// the writes since the last snapshot outweigh it (times the policy's ratio) or the chain
    /// grew too long. A parent of another run is refused.
    pub(super) fn new<E>(
        checkpoint: &NewCheckpoint<'w>,
        parent: Option<CheckpointId>,
        run_id: &str,
        row: Option<ParentRow>,
        policy: SnapshotPolicy,
    ) -> Result<Self, Failure<E>> {
        let parent = parent.zip(row);
        if let Some((id, row)) = &parent {
            row.check_run(*id, run_id)?;
        }
        let rows = checkpoint
            .writes
            .iter()
            .map(write_row)
            .collect::<Result<Vec<_>, RowError>>()?;
        let write_bytes: i64 = rows
            .iter()
            .map(|(key, _, value)| key.len() + value.as_ref().map_or(0, String::len))
            .sum::<usize>()
            .try_into()
            .unwrap_or(i64::MAX);
        let snapshot = match &parent {
            None => true,
            Some((_, p)) => {
                let chain_bytes = p.chain_bytes.saturating_add(write_bytes);
                chain_bytes as f64 > p.base_bytes as f64 * policy.max_delta_ratio
                    || p.chain_len + 1 > policy.max_chain_len
            }
        };
        Ok(Self {
            rows,
            write_bytes,
            step: parent.as_ref().map_or(0, |(_, p)| p.step + 1),
            snapshot,
            parent,
            writes: checkpoint.writes,
        })
    }

    /// The checkpoint whose state its snapshot builds on, when it takes one after a parent:
    /// the store reads that state ([`Store::state_at`](super::Store::state_at)) for
    /// [`chained`](Self::chained), and nothing otherwise.
    pub(super) fn snapshot_base(&self) -> Option<CheckpointId> {
        self.parent
            .as_ref()
            .filter(|_| self.snapshot)
            .map(|(id, _)| *id)
    }

    /// Its snapshot, if it takes one (`base`: the state at
    /// [`snapshot_base`](Self::snapshot_base), none for a chain's first, with its writes
    /// applied), and its chain bookkeeping.
    pub(super) fn chained(
        &self,
        base: Option<CheckpointState>,
    ) -> Result<Chained, serde_json::Error> {
        let snapshot = if self.snapshot {
            let mut base = base.unwrap_or_default();
            base.state.apply(self.writes);
            bump_versions(&mut base.versions, self.writes.iter(), self.step);
            Some((
                serde_json::to_string(&base.state)?,
                serde_json::to_string(&base.versions)?,
            ))
        } else {
            None
        };
        let (chain_bytes, chain_len, base_bytes) = match (&snapshot, &self.parent) {
            (Some((state, _)), _) => (0, 0, i64::try_from(state.len()).unwrap_or(i64::MAX)),
            (None, Some((_, p))) => (
                p.chain_bytes.saturating_add(self.write_bytes),
                p.chain_len + 1,
                p.base_bytes,
            ),
            (None, None) => (0, 0, 0),
        };
        Ok(Chained {
            snapshot,
            chain_bytes,
            chain_len,
            base_bytes,
        })
    }
}

/// The state at the end of a chain: `snapshot` (state and versions as stored) with the
/// writes of each later checkpoint (its step and its write rows) applied in order.
pub(super) fn replay(
    snapshot: (&str, &str),
    later: impl IntoIterator<Item = (i64, Vec<(String, String, Option<String>)>)>,
) -> Result<CheckpointState, RowError> {
    let mut state: State = serde_json::from_str(snapshot.0)?;
    let mut versions: BTreeMap<String, i64> = serde_json::from_str(snapshot.1)?;
    for (step, rows) in later {
        let writes = rows
            .into_iter()
            .map(|(key, op, value)| parse_write(key, &op, value))
            .collect::<Result<StateDelta, RowError>>()?;
        state.apply(&writes);
        bump_versions(&mut versions, writes.iter(), step);
    }
    Ok(CheckpointState { state, versions })
}

/// `holder` when a claim on `run_id` may replace it: one that is gone, or (`take_over`) one
/// that cannot be checked or renews its lease on another host; else why not.
pub(super) fn replaceable(
    run_id: &str,
    holder: LeaseHolder,
    take_over: bool,
) -> Result<LeaseHolder, StoreError> {
    let run_id = run_id.to_owned();
    match holder.liveness() {
        Liveness::Dead => Ok(holder),
        Liveness::Unchecked | Liveness::Renewed if take_over => Ok(holder),
        Liveness::Unchecked => Err(StoreError::DrivenElsewhere { run_id, holder }),
        Liveness::Renewed => Err(StoreError::Renewed { run_id, holder }),
        Liveness::Alive => Err(StoreError::Driven { run_id, holder }),
    }
}

/// This machine's clock in Unix milliseconds.
pub(super) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
