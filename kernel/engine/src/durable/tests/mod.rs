//! The store conformance suite: every behaviour of [`Store`] checked against both stores —
//! an SQLite file of its own and a PostgreSQL database of its own on the test server
//! (`rlm-test-postgres`: a real server, started for the test run) — through one set of
//! generic tests that `conformance!` instantiates per store (`sqlite_store::NAME`,
//! `postgres_store::NAME`). What only one store has lives in `sqlite` and `postgres`.

#![allow(clippy::unwrap_used)] // In tests an unwrap is an assertion.

mod postgres;
mod sqlite;

use std::sync::Arc;

use serde_json::{Value, json};

use super::lease::HOST_ID_VARIABLE;
use super::record::SnapshotPolicy;
use super::*;
use crate::state::{State, StateDelta, StateWrite};

/// The stores the suite runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Backend {
    Sqlite,
    Postgres,
}

/// One test's database: an SQLite file in a folder of its own, or a PostgreSQL database of
/// its own on the test server (dropped with it).
pub(super) struct Fixture {
    pub(super) backend: Backend,
    /// How `--db` would name it (a PostgreSQL URL with its password).
    pub(super) text: String,
    pub(super) location: Location,
    _dir: Option<tempfile::TempDir>,
    pub(super) pg: Option<test_postgres::Database>,
}

impl Fixture {
    pub(super) fn new(backend: Backend) -> Self {
        let (text, dir, pg) = match backend {
            Backend::Sqlite => {
                let dir = tempfile::tempdir().unwrap();
                let path = dir.path().join("runs.db").display().to_string();
                (path, Some(dir), None)
            }
            Backend::Postgres => {
                let db = test_postgres::server().database();
                (db.url(), None, Some(db))
            }
        };
        Self {
            backend,
            location: Location::parse(&text).unwrap(),
            text,
            _dir: dir,
            pg,
        }
    }

    /// A store on it, with the default snapshot policy.
    pub(super) async fn store(&self) -> Arc<dyn Store> {
        self.store_with(SnapshotPolicy::default()).await
    }

    /// A store on it with `policy` (each call opens another: another connection or pool).
    pub(super) async fn store_with(&self, policy: SnapshotPolicy) -> Arc<dyn Store> {
        open_with(&self.location, policy).await
    }

    /// Marks the database as written by schema version `version`.
    pub(super) fn set_schema_version(&self, version: i64) {
        match (&self.location, &self.pg) {
            (Location::Sqlite(path), _) => {
                let conn = rusqlite::Connection::open(path).unwrap();
                conn.pragma_update(None, "user_version", version).unwrap();
            }
            (Location::Postgres(_), Some(db)) => {
                db.psql(&format!(
                    "UPDATE rlm.schema_version SET version = {version}"
                ));
            }
            (Location::Postgres(_), None) => unreachable!("a PostgreSQL fixture has a database"),
        }
    }
}

/// A store on `location` with `policy`.
pub(super) async fn open_with(location: &Location, policy: SnapshotPolicy) -> Arc<dyn Store> {
    match location {
        Location::Sqlite(path) => Arc::new(SqliteStore::open(path).unwrap().with_policy(policy)),
        Location::Postgres(url) => Arc::new(
            PostgresStore::connect(url)
                .await
                .unwrap()
                .with_policy(policy),
        ),
    }
}

/// Instantiates each generic test `NAME(fx: Fixture)` once per store.
macro_rules! conformance {
    ($($test:ident),+ $(,)?) => {
        /// The conformance suite against an SQLite file.
        mod sqlite_store {
            $(
                #[tokio::test]
                async fn $test() {
                    super::$test(super::Fixture::new(super::Backend::Sqlite)).await;
                }
            )+
        }

        /// The conformance suite against a PostgreSQL database.
        mod postgres_store {
            $(
                #[tokio::test]
                async fn $test() {
                    super::$test(super::Fixture::new(super::Backend::Postgres)).await;
                }
            )+
        }
    };
}

conformance!(
    every_checkpoint_reads_back_its_state_and_channel_versions,
    storage_grows_with_the_writes_not_with_the_state,
    a_snapshot_is_taken_when_the_writes_outweigh_the_last_one,
    time_travel_branches_under_the_same_run,
    retention_keeps_the_last_checkpoints_readable,
    runs_keep_their_status_and_inputs,
    puts_are_checked_against_their_run_and_parent,
    a_chain_of_checkpoints_is_written_whole_or_not_at_all,
    a_database_reopens_and_a_newer_schema_is_refused,
    a_killed_writer_leaves_a_valid_database,
    a_second_claim_on_a_driven_run_is_refused_and_changes_nothing,
    a_dead_owner_is_taken_over_and_its_writes_are_fenced_off,
    an_owner_on_another_host_is_taken_over_only_when_asked,
);

pub(super) fn replace(key: &str, value: Value) -> StateWrite {
    StateWrite::Replace {
        key: key.to_owned().into(),
        value,
    }
}

pub(super) fn append(key: &str, item: Value) -> StateWrite {
    StateWrite::Append {
        key: key.to_owned().into(),
        items: vec![item],
    }
}

/// The writes `writes` as a delta.
pub(super) fn delta(writes: Vec<StateWrite>) -> StateDelta {
    writes.into_iter().collect()
}

/// Run `run_id` (of workflow `w`) created in `store`, leased to `owner`.
pub(super) async fn new_run(store: &dyn Store, run_id: &str, owner: &Owner) -> Lease {
    store
        .create_run(&NewRun::new(run_id, "w"), owner)
        .await
        .unwrap()
}

/// Writes `steps` checkpoints in a chain from `parent`, each step writing `writes(i)` to
/// `state` (a new chain's first checkpoint writes the whole of `state` first).
pub(super) async fn write_chain(
    store: &dyn Store,
    run: &Lease,
    state: &mut State,
    mut parent: Option<CheckpointId>,
    steps: std::ops::Range<usize>,
    writes: impl Fn(usize) -> Vec<StateWrite>,
) -> Vec<CheckpointId> {
    let mut ids = Vec::new();
    for i in steps {
        let w = delta(writes(i));
        let mut stored = match parent {
            None => state.to_writes(),
            Some(_) => StateDelta::new(),
        };
        stored.extend(w.clone());
        state.apply(&w);
        let id = store
            .put(
                run,
                NewCheckpoint::new(format!("n{i}"), &stored).parent(parent),
            )
            .await
            .unwrap();
        ids.push(id);
        parent = Some(id);
    }
    ids
}

/// An owner on this host whose process is gone (a reaped child's pid).
pub(super) fn dead_owner() -> Owner {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    Owner {
        pid,
        ..Owner::current()
    }
}

#[test]
fn this_process_is_alive_and_a_gone_or_reused_pid_is_dead() {
    let me = Owner::current();
    assert_eq!(me.pid, std::process::id());
    assert!(!me.host.is_empty());
    if !cfg!(target_os = "linux") {
        assert_eq!(me.liveness(), Liveness::Unchecked);
        return;
    }
    assert_eq!(me.liveness(), Liveness::Alive);
    assert_eq!(dead_owner().liveness(), Liveness::Dead);
    // This pid with another start: the pid now names another process.
    let reused = Owner {
        started: format!("{}0", me.started),
        ..me.clone()
    };
    assert_eq!(reused.liveness(), Liveness::Dead);
    let elsewhere = Owner {
        host: format!("{}-elsewhere", me.host),
        ..me
    };
    assert_eq!(elsewhere.liveness(), Liveness::Unchecked);
}

#[test]
fn a_lease_with_an_expiry_is_dead_once_expired_on_any_host() {
    let holder = |owner: Owner, expires_ms: Option<i64>, expired: bool| LeaseHolder {
        owner,
        since_ms: 0,
        expires_ms,
        expired,
    };
    let me = Owner::current();
    let elsewhere = Owner {
        host: format!("{}-elsewhere", me.host),
        ..me.clone()
    };
    // Renewed elsewhere: checked by its heartbeat; without an expiry: nothing to check.
    assert_eq!(
        holder(elsewhere.clone(), Some(1), false).liveness(),
        Liveness::Renewed
    );
    assert_eq!(
        holder(elsewhere.clone(), None, false).liveness(),
        Liveness::Unchecked
    );
    assert_eq!(holder(elsewhere, Some(1), true).liveness(), Liveness::Dead);
    if cfg!(target_os = "linux") {
        // Here, the pid wins while the lease runs; an expired lease is dead even so (the
        // process stopped renewing it: frozen, or cut off from the database).
        assert_eq!(
            holder(me.clone(), Some(1), false).liveness(),
            Liveness::Alive
        );
        assert_eq!(holder(me, Some(1), true).liveness(), Liveness::Dead);
        assert_eq!(
            holder(dead_owner(), Some(1), false).liveness(),
            Liveness::Dead
        );
    }
}

#[test]
fn the_host_id_variable_names_this_host() {
    // A child process, so this process's environment stays as it is.
    if let Ok(id) = std::env::var("RLM_TEST_EXPECT_HOST_ID") {
        assert_eq!(Owner::current().host, id);
        return;
    }
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "durable::tests::the_host_id_variable_names_this_host",
        ])
        .env(HOST_ID_VARIABLE, "ci-runner-7")
        .env("RLM_TEST_EXPECT_HOST_ID", "ci-runner-7")
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
}

async fn a_database_reopens_and_a_newer_schema_is_refused(fx: Fixture) {
    {
        let store = fx.store().await;
        let r = new_run(store.as_ref(), "r", &Owner::current()).await;
        let mut state = State::default();
        write_chain(store.as_ref(), &r, &mut state, None, 0..3, |i| {
            vec![append("log", json!(i))]
        })
        .await;
    }
    let store = open(&fx.location, None).await.unwrap();
    let head = store.run("r").await.unwrap().unwrap().head.unwrap();
    assert_eq!(
        store.state_at(head).await.unwrap().state.get("log"),
        Some(&json!([0, 1, 2]))
    );
    drop(store);
    fx.set_schema_version(99);
    for err in [
        open(&fx.location, None).await.unwrap_err(),
        open_read_only(&fx.location).await.unwrap_err(),
    ] {
        assert!(
            matches!(err, StoreError::NewerSchema { found: 99, .. }),
            "{err}"
        );
        assert!(
            err.to_string().starts_with(&format!(
                "Checkpoint database `{}` has schema version 99, newer than the ",
                fx.location
            )),
            "{err}"
        );
    }
}

/// The database a `writer_until_killed` child writes to (as `--db` names it).
const CRASH_DB: &str = "RLM_TEST_CRASH_WRITER_DB";

fn crash_step(i: usize) -> Vec<StateWrite> {
    vec![
        append("log", json!(i)),
        replace("doc", json!(format!("{i}").repeat(2_000))),
    ]
}

/// Not a test on its own: the child process of `a_killed_writer_leaves_a_valid_database`
/// (it does nothing unless that test sets `RLM_TEST_CRASH_WRITER_DB`).
#[test]
fn writer_until_killed() {
    let Ok(db) = std::env::var(CRASH_DB) else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        // Frequent snapshots make the kill likely to land inside a large transaction.
        let policy = SnapshotPolicy {
            max_delta_ratio: 0.5,
            max_chain_len: 10_000,
        };
        let store = open_with(&Location::parse(&db).unwrap(), policy).await;
        let r = new_run(store.as_ref(), "r", &Owner::current()).await;
        let mut state = State::default();
        state.set("base", json!("z".repeat(100_000)));
        write_chain(
            store.as_ref(),
            &r,
            &mut state,
            None,
            0..1_000_000,
            crash_step,
        )
        .await;
    });
}

async fn a_killed_writer_leaves_a_valid_database(fx: Fixture) {
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "durable::tests::writer_until_killed",
            "--nocapture",
        ])
        .env(CRASH_DB, &fx.text)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Wait (bounded) until the child has written a few dozen checkpoints, then SIGKILL it.
    let mut written = 0;
    let mut store = None;
    for _ in 0..600 {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        if store.is_none() {
            store = open_read_only(&fx.location).await.ok();
        }
        if let Some(store) = &store {
            written = store
                .run("r")
                .await
                .ok()
                .flatten()
                .map_or(0, |run| run.checkpoints);
        }
        if written >= 40 {
            break;
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(written >= 40, "the writer wrote only {written} checkpoints");

    let store = open(&fx.location, None).await.unwrap();
    if let Location::Sqlite(path) = &fx.location {
        let check = SqliteStore::open(path).unwrap().integrity_check().unwrap();
        assert_eq!(check, "ok");
    }
    let history = store.history("r").await.unwrap();
    let run = store.run("r").await.unwrap().unwrap();
    assert_eq!(
        run.head,
        history.last().map(|c| c.id),
        "the head is the last whole checkpoint"
    );
    let mut expected = State::default();
    expected.set("base", json!("z".repeat(100_000)));
    for (i, checkpoint) in history.iter().enumerate() {
        expected.apply(&delta(crash_step(i)));
        assert_eq!(
            store.state_at(checkpoint.id).await.unwrap().state,
            expected,
            "step {i}"
        );
    }
}

async fn every_checkpoint_reads_back_its_state_and_channel_versions(fx: Fixture) {
    let store = fx
        .store_with(SnapshotPolicy {
            max_delta_ratio: f64::INFINITY,
            max_chain_len: 4,
        })
        .await;
    let r = store
        .create_run(&NewRun::new("r", "team.yaml"), &Owner::current())
        .await
        .unwrap();
    let mut state = State::default();
    let mut expected = Vec::new();
    let ids = write_chain(store.as_ref(), &r, &mut state, None, 0..11, |i| {
        let mut w = vec![append("messages", json!({"n": i}))];
        if i % 3 == 0 {
            w.push(replace("doc", json!(format!("v{i}"))));
        }
        if i == 5 {
            w.push(StateWrite::Delete { key: "doc".into() });
        }
        w
    })
    .await;
    // Replay by hand to get each expected state.
    let mut replay = State::default();
    for i in 0..11 {
        let mut w = vec![append("messages", json!({"n": i}))];
        if i % 3 == 0 {
            w.push(replace("doc", json!(format!("v{i}"))));
        }
        if i == 5 {
            w.push(StateWrite::Delete { key: "doc".into() });
        }
        replay.apply(&delta(w));
        expected.push(replay.clone());
    }
    for (i, id) in ids.iter().enumerate() {
        let at = store.state_at(*id).await.unwrap();
        assert_eq!(at.state, expected[i], "state at step {i}");
        assert_eq!(at.versions.get("messages"), Some(&(i as i64)));
    }
    let last = store.state_at(ids[10]).await.unwrap();
    assert_eq!(last.versions.get("doc"), Some(&9));
    // The chain cap snapshots every fifth step; the others store only their writes.
    let history = store.history("r").await.unwrap();
    let snapshots: Vec<i64> = history
        .iter()
        .filter(|c| c.snapshot)
        .map(|c| c.step)
        .collect();
    assert_eq!(snapshots, vec![0, 5, 10]);
    assert_eq!(history[3].written, vec!["messages", "doc"]);
    assert_eq!(history[4].parent, Some(history[3].id));
    assert_eq!(
        store.writes(ids[5]).await.unwrap(),
        delta(vec![
            append("messages", json!({"n": 5})),
            StateWrite::Delete { key: "doc".into() }
        ])
    );
}

async fn storage_grows_with_the_writes_not_with_the_state(fx: Fixture) {
    let store = fx.store().await;
    let r = new_run(store.as_ref(), "r", &Owner::current()).await;
    let mut state = State::default();
    for i in 0..100 {
        state.set(format!("doc{i}"), json!("x".repeat(1000)));
    }
    let ids = write_chain(store.as_ref(), &r, &mut state, None, 0..50, |i| {
        vec![replace(
            &format!("doc{}", i % 100),
            json!(format!("{i:0>100}")),
        )]
    })
    .await;
    let history = store.history("r").await.unwrap();
    assert!(history[0].snapshot);
    assert!(
        history[1..]
            .iter()
            .all(|c| !c.snapshot && c.write_bytes < 200)
    );
    assert_eq!(store.state_at(ids[49]).await.unwrap().state, state);
}

async fn a_snapshot_is_taken_when_the_writes_outweigh_the_last_one(fx: Fixture) {
    let store = fx.store().await;
    let r = new_run(store.as_ref(), "r", &Owner::current()).await;
    let mut state = State::default();
    // Each step replaces a 100-byte value; the first snapshot is about as big, so the
    // second step's writes already outweigh it.
    write_chain(store.as_ref(), &r, &mut state, None, 0..4, |i| {
        vec![replace("doc", json!(format!("{i:0>100}")))]
    })
    .await;
    let snapshots: Vec<bool> = store
        .history("r")
        .await
        .unwrap()
        .iter()
        .map(|c| c.snapshot)
        .collect();
    assert_eq!(snapshots, vec![true, false, true, false]);
}

async fn time_travel_branches_under_the_same_run(fx: Fixture) {
    let store = fx.store().await;
    let r = new_run(store.as_ref(), "r", &Owner::current()).await;
    let mut state = State::default();
    let ids = write_chain(store.as_ref(), &r, &mut state, None, 0..3, |i| {
        vec![append("log", json!(i))]
    })
    .await;
    let mut branch = store.state_at(ids[0]).await.unwrap().state;
    let forked = write_chain(store.as_ref(), &r, &mut branch, Some(ids[0]), 10..12, |i| {
        vec![append("log", json!(i))]
    })
    .await;
    assert_eq!(
        store.state_at(forked[1]).await.unwrap().state.get("log"),
        Some(&json!([0, 10, 11]))
    );
    assert_eq!(
        store.state_at(ids[2]).await.unwrap().state.get("log"),
        Some(&json!([0, 1, 2]))
    );
    assert_eq!(store.checkpoint(forked[0]).await.unwrap().step, 1);
    assert_eq!(store.run("r").await.unwrap().unwrap().head, Some(forked[1]));
}

async fn retention_keeps_the_last_checkpoints_readable(fx: Fixture) {
    let store = fx.store().await;
    let r = new_run(store.as_ref(), "r", &Owner::current()).await;
    let other_run = new_run(store.as_ref(), "other", &Owner::current()).await;
    let mut state = State::default();
    state.set("big", json!("y".repeat(10_000)));
    let ids = write_chain(store.as_ref(), &r, &mut state, None, 0..10, |i| {
        vec![append("log", json!(i))]
    })
    .await;
    let mut other = State::default();
    let other_ids = write_chain(store.as_ref(), &other_run, &mut other, None, 0..2, |i| {
        vec![append("log", json!(i))]
    })
    .await;
    let mut expected: Vec<State> = Vec::new();
    for id in &ids[7..] {
        expected.push(store.state_at(*id).await.unwrap().state);
    }
    // Not while this process drives the run: its chain is not for another to cut.
    assert!(matches!(
        store.prune("r", 3).await,
        Err(StoreError::Driven { .. })
    ));
    store.finish_run(&r, &RunStatus::Completed).await.unwrap();
    let report = store.prune("r", 3).await.unwrap();
    assert_eq!(report.removed, 7);
    assert_eq!(report.snapshotted, vec![ids[7]]);
    let history = store.history("r").await.unwrap();
    assert_eq!(
        history.iter().map(|c| c.id).collect::<Vec<_>>(),
        ids[7..].to_vec()
    );
    assert_eq!(history[0].parent, None);
    for (id, state) in ids[7..].iter().zip(&expected) {
        assert_eq!(&store.state_at(*id).await.unwrap().state, state);
    }
    assert!(matches!(
        store.state_at(ids[0]).await,
        Err(StoreError::UnknownCheckpoint(_))
    ));
    assert_eq!(store.history("other").await.unwrap().len(), other_ids.len());
    assert_eq!(store.prune("r", 5).await.unwrap(), PruneReport::default());
    assert_eq!(store.run("r").await.unwrap().unwrap().checkpoints, 3);
}

async fn runs_keep_their_status_and_inputs(fx: Fixture) {
    let store = fx.store().await;
    let me = Owner::current();
    let a = store
        .create_run(
            &NewRun::new("a", "team").input(json!({"goal": "ship"})),
            &me,
        )
        .await
        .unwrap();
    let b = store
        .create_run(&NewRun::new("b", "refine"), &me)
        .await
        .unwrap();
    assert!(matches!(
        store.create_run(&NewRun::new("a", "team"), &me).await,
        Err(StoreError::DuplicateRun(id)) if id == "a"
    ));
    let waiting = RunStatus::AwaitingHuman {
        question: "Which test framework?".into(),
    };
    store.finish_run(&a, &waiting).await.unwrap();
    store
        .set_status(
            &b,
            &RunStatus::Failed {
                error: "boom".into(),
            },
        )
        .await
        .unwrap();
    let runs = store.runs().await.unwrap();
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[0].status, waiting);
    assert_eq!(runs[0].input, json!({"goal": "ship"}));
    assert_eq!(runs[0].head, None);
    assert_eq!(runs[1].status.name(), "failed");
    // Released at the end; held while running, with this process as the owner.
    assert_eq!(runs[0].lease, None);
    assert_eq!(runs[1].lease.as_ref().map(|h| &h.owner), Some(&me));
    assert!(matches!(
        store.claim("nope", &me, false).await,
        Err(StoreError::UnknownRun(_))
    ));
    assert!(store.run("nope").await.unwrap().is_none());
}

async fn puts_are_checked_against_their_run_and_parent(fx: Fixture) {
    let store = fx.store().await;
    let none = StateDelta::new();
    let forged = Lease {
        run_id: "r".into(),
        id: 1,
    };
    assert!(matches!(
        store.put(&forged, NewCheckpoint::new("n", &none)).await,
        Err(StoreError::UnknownRun(_))
    ));
    let r = new_run(store.as_ref(), "r", &Owner::current()).await;
    let s = new_run(store.as_ref(), "s", &Owner::current()).await;
    let first = store.put(&r, NewCheckpoint::new("n", &none)).await.unwrap();
    assert!(matches!(
        store
            .put(&r, NewCheckpoint::new("n", &none).parent(Some(first + 100)))
            .await,
        Err(StoreError::UnknownCheckpoint(_))
    ));
    assert!(matches!(
        store
            .put(&s, NewCheckpoint::new("n", &none).parent(Some(first)))
            .await,
        Err(StoreError::WrongRun { .. })
    ));
    let record = store
        .put(
            &r,
            NewCheckpoint::new("dev", &none)
                .parent(Some(first))
                .next(vec!["tea".into()])
                .metadata(json!({"attempts": 2})),
        )
        .await
        .unwrap();
    let record = store.checkpoint(record).await.unwrap();
    assert_eq!(record.next, vec!["tea"]);
    assert_eq!(record.metadata, json!({"attempts": 2}));
}

/// A routed step (a node's checkpoint and its decision's) as one transaction: linked in
/// order, the last the head, and a chain whose second checkpoint is refused leaves nothing of
/// its first.
async fn a_chain_of_checkpoints_is_written_whole_or_not_at_all(fx: Fixture) {
    let store = fx.store().await;
    let r = new_run(store.as_ref(), "r", &Owner::current()).await;
    let start = delta(vec![replace("steps", json!(0))]);
    let first = store
        .put(&r, NewCheckpoint::new("__start__", &start))
        .await
        .unwrap();
    let node = delta(vec![
        replace("steps", json!(1)),
        append("messages", json!("a")),
    ]);
    let decision = delta(vec![append("decisions", json!("a → b"))]);
    let ids = store
        .put_chain(
            &r,
            vec![
                NewCheckpoint::new("a", &node).parent(Some(first)),
                // The parent a later checkpoint names is not read: it follows the one before.
                NewCheckpoint::new("router", &decision)
                    .parent(Some(first))
                    .next(vec!["b".into()]),
            ],
        )
        .await
        .unwrap();
    assert_eq!(ids.len(), 2);
    let (node_id, router_id) = (ids[0], ids[1]);
    assert_eq!(store.checkpoint(node_id).await.unwrap().parent, Some(first));
    let router = store.checkpoint(router_id).await.unwrap();
    assert_eq!(router.parent, Some(node_id));
    assert_eq!(router.next, vec!["b"]);
    assert_eq!(store.run("r").await.unwrap().unwrap().head, Some(router_id));
    let state = store.state_at(router_id).await.unwrap().state;
    assert_eq!(state.get("steps"), Some(&json!(1)));
    assert_eq!(state.get("decisions"), Some(&json!(["a → b"])));
    assert_eq!(store.writes(router_id).await.unwrap(), decision);

    // A chain refused (its first checkpoint after another run's) writes none of it.
    let s = new_run(store.as_ref(), "s", &Owner::current()).await;
    let other = store
        .put(&s, NewCheckpoint::new("x", &start))
        .await
        .unwrap();
    let refused = store
        .put_chain(
            &r,
            vec![
                NewCheckpoint::new("b", &node).parent(Some(other)),
                NewCheckpoint::new("router", &decision),
            ],
        )
        .await;
    assert!(matches!(refused, Err(StoreError::WrongRun { .. })));
    assert_eq!(store.history("r").await.unwrap().len(), 3);
    assert_eq!(store.run("r").await.unwrap().unwrap().head, Some(router_id));
    // A lease that is not the run's writes no part of a chain.
    let forged = Lease {
        run_id: "r".into(),
        id: r.id + 1000,
    };
    let fenced = store
        .put_chain(
            &forged,
            vec![
                NewCheckpoint::new("b", &node).parent(Some(router_id)),
                NewCheckpoint::new("router", &decision),
            ],
        )
        .await;
    assert!(fenced.is_err());
    assert_eq!(store.history("r").await.unwrap().len(), 3);
    assert_eq!(
        store.put_chain(&r, Vec::new()).await.unwrap(),
        Vec::<CheckpointId>::new()
    );
}

async fn a_second_claim_on_a_driven_run_is_refused_and_changes_nothing(fx: Fixture) {
    let store = fx.store().await;
    let me = Owner::current();
    let lease = store.create_run(&NewRun::new("r", "w"), &me).await.unwrap();
    let head = store
        .put(&lease, NewCheckpoint::new("a", &StateDelta::new()))
        .await
        .unwrap();
    if !cfg!(target_os = "linux") {
        return;
    }
    let err = store.claim("r", &me, false).await.unwrap_err();
    let StoreError::Driven { run_id, holder } = &err else {
        panic!("{err}");
    };
    assert_eq!((run_id.as_str(), &holder.owner), ("r", &me));
    let text = err.to_string();
    assert!(
        text.starts_with(&format!(
            "Run `r` is being driven by pid {} on host `{}` since ",
            me.pid, me.host
        )) && text.ends_with(
            "; wait for it to finish, or stop that process and resume again (a dead process's \
             run is taken over)"
        ),
        "{text}"
    );
    // `--take-over` does not take a run from a live process on this host.
    assert!(matches!(
        store.claim("r", &me, true).await,
        Err(StoreError::Driven { .. })
    ));
    assert!(matches!(
        store.check_claim("r", false).await,
        Err(StoreError::Driven { .. })
    ));
    // The first owner still writes.
    let next = store
        .put(
            &lease,
            NewCheckpoint::new("b", &StateDelta::new()).parent(Some(head)),
        )
        .await
        .unwrap();
    assert_eq!(store.run("r").await.unwrap().unwrap().head, Some(next));
}

async fn a_dead_owner_is_taken_over_and_its_writes_are_fenced_off(fx: Fixture) {
    let store = fx.store().await;
    let mut state = State::default();
    // The first process, as it looks once it died (on Linux the pid is free).
    let ghost = dead_owner();
    let old = new_run(store.as_ref(), "r", &ghost).await;
    let ids = write_chain(store.as_ref(), &old, &mut state, None, 0..2, |i| {
        vec![append("log", json!(i))]
    })
    .await;
    let take_over = !cfg!(target_os = "linux"); // elsewhere nobody can tell it is dead
    assert_eq!(
        store
            .check_claim("r", take_over)
            .await
            .unwrap()
            .unwrap()
            .owner,
        ghost
    );
    let claim = store
        .claim("r", &Owner::current(), take_over)
        .await
        .unwrap();
    assert_eq!(claim.replaced.map(|h| h.owner), Some(ghost));
    assert_eq!(claim.lease.run_id(), "r");

    // The old process wakes up: none of its writes reach the run.
    let late = delta(vec![append("log", json!("late"))]);
    let err = store
        .put(&old, NewCheckpoint::new("late", &late).parent(Some(ids[1])))
        .await
        .unwrap_err();
    let StoreError::LeaseLost { run_id, holder } = &err else {
        panic!("{err}");
    };
    assert_eq!(run_id, "r");
    assert_eq!(holder.as_ref().map(|h| &h.owner), Some(&Owner::current()));
    assert!(
        err.to_string().starts_with(&format!(
            "This process no longer drives run `r` (taken over by pid {} on host `",
            std::process::id()
        )),
        "{err}"
    );
    assert!(matches!(
        store.set_status(&old, &RunStatus::Completed).await,
        Err(StoreError::LeaseLost { .. })
    ));
    assert!(matches!(
        store.finish_run(&old, &RunStatus::Completed).await,
        Err(StoreError::LeaseLost { .. })
    ));
    // Releasing a lost lease leaves the new owner's alone.
    store.release(&old).await.unwrap();
    let run = store.run("r").await.unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Running);
    assert_eq!(run.head, Some(ids[1]));
    assert_eq!(run.lease.map(|h| h.owner), Some(Owner::current()));

    // The new owner continues the chain; the history holds one line of writes.
    let mut resumed = store.state_at(ids[1]).await.unwrap().state;
    let more = write_chain(
        store.as_ref(),
        &claim.lease,
        &mut resumed,
        Some(ids[1]),
        2..3,
        |i| vec![append("log", json!(i))],
    )
    .await;
    store
        .finish_run(&claim.lease, &RunStatus::Completed)
        .await
        .unwrap();
    assert_eq!(
        store.state_at(more[0]).await.unwrap().state.get("log"),
        Some(&json!([0, 1, 2]))
    );
    assert_eq!(store.history("r").await.unwrap().len(), 3);
    // A finished run is free again, and an old lease id is never handed out twice.
    let run = store.run("r").await.unwrap().unwrap();
    assert_eq!((run.status, run.lease), (RunStatus::Completed, None));
    let again = store.claim("r", &Owner::current(), false).await.unwrap();
    assert_eq!(again.replaced, None);
    assert!(again.lease.id > claim.lease.id);
    assert!(matches!(
        store.set_status(&claim.lease, &RunStatus::Running).await,
        Err(StoreError::LeaseLost { .. })
    ));
}

async fn an_owner_on_another_host_is_taken_over_only_when_asked(fx: Fixture) {
    let store = fx.store().await;
    let remote = Owner {
        host: format!("{}-elsewhere", Owner::current().host),
        ..Owner::current()
    };
    new_run(store.as_ref(), "r", &remote).await;
    let err = store
        .claim("r", &Owner::current(), false)
        .await
        .unwrap_err();
    let text = err.to_string();
    match fx.backend {
        // Nothing tells whether it still runs.
        Backend::Sqlite => {
            assert!(
                matches!(&err, StoreError::DrivenElsewhere { holder, .. } if holder.owner == remote),
                "{err}"
            );
            assert!(
                text.ends_with(
                    ", which cannot be checked from here; if that process is gone, resume with \
                     `--take-over`"
                ),
                "{err}"
            );
        }
        // Its lease says it did a moment ago.
        Backend::Postgres => {
            assert!(
                matches!(&err, StoreError::Renewed { holder, .. } if holder.owner == remote),
                "{err}"
            );
            assert!(
                text.contains(", which renews its lease (last until "),
                "{err}"
            );
            assert!(
                text.ends_with("or resume with `--take-over` once you know it is gone"),
                "{err}"
            );
        }
    }
    assert_eq!(
        store
            .run("r")
            .await
            .unwrap()
            .unwrap()
            .lease
            .unwrap()
            .liveness(),
        match fx.backend {
            Backend::Sqlite => Liveness::Unchecked,
            Backend::Postgres => Liveness::Renewed,
        }
    );
    assert!(matches!(
        store.prune("r", 1).await,
        Err(StoreError::DrivenElsewhere { .. } | StoreError::Renewed { .. })
    ));
    let claim = store.claim("r", &Owner::current(), true).await.unwrap();
    assert_eq!(claim.replaced.map(|h| h.owner), Some(remote));
}
