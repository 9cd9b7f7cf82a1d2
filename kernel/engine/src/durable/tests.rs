#![allow(clippy::unwrap_used)] // In tests an unwrap is an assertion.

use serde_json::{Value, json};

use super::*;
use crate::state::{State, StateDelta, StateWrite};

fn replace(key: &str, value: Value) -> StateWrite {
    StateWrite::Replace {
        key: key.into(),
        value,
    }
}

fn append(key: &str, item: Value) -> StateWrite {
    StateWrite::Append {
        key: key.into(),
        items: vec![item],
    }
}

/// The writes `writes` as a delta.
fn delta(writes: Vec<StateWrite>) -> StateDelta {
    writes.into_iter().collect()
}

/// Writes `steps` checkpoints in a chain from `parent`, each step writing `writes(i)` to
/// `state` (a new chain's first checkpoint writes the whole of `state` first).
fn write_chain(
    store: &CheckpointStore,
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
            .unwrap();
        ids.push(id);
        parent = Some(id);
    }
    ids
}

#[test]
fn every_checkpoint_reads_back_its_state_and_channel_versions() {
    let store = CheckpointStore::open_in_memory()
        .unwrap()
        .with_policy(SnapshotPolicy {
            max_delta_ratio: f64::INFINITY,
            max_chain_len: 4,
        });
    let r = store
        .create_run(&NewRun::new("r", "team.yaml"), &Owner::current())
        .unwrap();
    let mut state = State::default();
    let mut expected = Vec::new();
    let ids = write_chain(&store, &r, &mut state, None, 0..11, |i| {
        let mut w = vec![append("messages", json!({"n": i}))];
        if i % 3 == 0 {
            w.push(replace("doc", json!(format!("v{i}"))));
        }
        if i == 5 {
            w.push(StateWrite::Delete { key: "doc".into() });
        }
        w
    });
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
        let at = store.state_at(*id).unwrap();
        assert_eq!(at.state, expected[i], "state at step {i}");
        assert_eq!(at.versions.get("messages"), Some(&(i as i64)));
    }
    let last = store.state_at(ids[10]).unwrap();
    assert_eq!(last.versions.get("doc"), Some(&9));
    // The chain cap snapshots every fifth step; the others store only their writes.
    let history = store.history("r").unwrap();
    let snapshots: Vec<i64> = history
        .iter()
        .filter(|c| c.snapshot)
        .map(|c| c.step)
        .collect();
    assert_eq!(snapshots, vec![0, 5, 10]);
    assert_eq!(history[3].written, vec!["messages", "doc"]);
    assert_eq!(history[4].parent, Some(history[3].id));
    assert_eq!(
        store.writes(ids[5]).unwrap(),
        delta(vec![
            append("messages", json!({"n": 5})),
            StateWrite::Delete { key: "doc".into() }
        ])
    );
}

#[test]
fn storage_grows_with_the_writes_not_with_the_state() {
    let store = CheckpointStore::open_in_memory().unwrap();
    let r = store
        .create_run(&NewRun::new("r", "w"), &Owner::current())
        .unwrap();
    let mut state = State::default();
    for i in 0..100 {
        state.set(format!("doc{i}"), json!("x".repeat(1000)));
    }
    let ids = write_chain(&store, &r, &mut state, None, 0..50, |i| {
        vec![replace(
            &format!("doc{}", i % 100),
            json!(format!("{i:0>100}")),
        )]
    });
    let history = store.history("r").unwrap();
    assert!(history[0].snapshot);
    assert!(
        history[1..]
            .iter()
            .all(|c| !c.snapshot && c.write_bytes < 200)
    );
    assert_eq!(store.state_at(ids[49]).unwrap().state, state);
}

#[test]
fn a_snapshot_is_taken_when_the_writes_outweigh_the_last_one() {
    let store = CheckpointStore::open_in_memory().unwrap();
    let r = store
        .create_run(&NewRun::new("r", "w"), &Owner::current())
        .unwrap();
    let mut state = State::default();
    // Each step replaces a 100-byte value; the first snapshot is about as big, so the
    // second step's writes already outweigh it.
    write_chain(&store, &r, &mut state, None, 0..4, |i| {
        vec![replace("doc", json!(format!("{i:0>100}")))]
    });
    let snapshots: Vec<bool> = store
        .history("r")
        .unwrap()
        .iter()
        .map(|c| c.snapshot)
        .collect();
    assert_eq!(snapshots, vec![true, false, true, false]);
}

#[test]
fn time_travel_branches_under_the_same_run() {
    let store = CheckpointStore::open_in_memory().unwrap();
    let r = store
        .create_run(&NewRun::new("r", "w"), &Owner::current())
        .unwrap();
    let mut state = State::default();
    let ids = write_chain(&store, &r, &mut state, None, 0..3, |i| {
        vec![append("log", json!(i))]
    });
    let mut branch = store.state_at(ids[0]).unwrap().state;
    let forked = write_chain(&store, &r, &mut branch, Some(ids[0]), 10..12, |i| {
        vec![append("log", json!(i))]
    });
    assert_eq!(
        store.state_at(forked[1]).unwrap().state.get("log"),
        Some(&json!([0, 10, 11]))
    );
    assert_eq!(
        store.state_at(ids[2]).unwrap().state.get("log"),
        Some(&json!([0, 1, 2]))
    );
    assert_eq!(store.checkpoint(forked[0]).unwrap().step, 1);
    assert_eq!(store.run("r").unwrap().unwrap().head, Some(forked[1]));
}

#[test]
fn retention_keeps_the_last_checkpoints_readable() {
    let store = CheckpointStore::open_in_memory().unwrap();
    let r = store
        .create_run(&NewRun::new("r", "w"), &Owner::current())
        .unwrap();
    let other_run = store
        .create_run(&NewRun::new("other", "w"), &Owner::current())
        .unwrap();
    let mut state = State::default();
    state.set("big", json!("y".repeat(10_000)));
    let ids = write_chain(&store, &r, &mut state, None, 0..10, |i| {
        vec![append("log", json!(i))]
    });
    let mut other = State::default();
    let other_ids = write_chain(&store, &other_run, &mut other, None, 0..2, |i| {
        vec![append("log", json!(i))]
    });
    let expected: Vec<State> = ids[7..]
        .iter()
        .map(|id| store.state_at(*id).unwrap().state)
        .collect();
    // Not while this process drives the run: its chain is not for another to cut.
    assert!(matches!(
        store.prune("r", 3),
        Err(StoreError::Driven { .. })
    ));
    store.finish_run(&r, &RunStatus::Completed).unwrap();
    let report = store.prune("r", 3).unwrap();
    assert_eq!(report.removed, 7);
    assert_eq!(report.snapshotted, vec![ids[7]]);
    let history = store.history("r").unwrap();
    assert_eq!(
        history.iter().map(|c| c.id).collect::<Vec<_>>(),
        ids[7..].to_vec()
    );
    assert_eq!(history[0].parent, None);
    for (id, state) in ids[7..].iter().zip(&expected) {
        assert_eq!(&store.state_at(*id).unwrap().state, state);
    }
    assert!(matches!(
        store.state_at(ids[0]),
        Err(StoreError::UnknownCheckpoint(_))
    ));
    assert_eq!(store.history("other").unwrap().len(), other_ids.len());
    assert_eq!(store.prune("r", 5).unwrap(), PruneReport::default());
    assert_eq!(store.run("r").unwrap().unwrap().checkpoints, 3);
}

#[test]
fn runs_keep_their_status_and_inputs() {
    let store = CheckpointStore::open_in_memory().unwrap();
    let me = Owner::current();
    let a = store
        .create_run(
            &NewRun::new("a", "team").input(json!({"goal": "ship"})),
            &me,
        )
        .unwrap();
    let b = store.create_run(&NewRun::new("b", "refine"), &me).unwrap();
    assert!(matches!(
        store.create_run(&NewRun::new("a", "team"), &me),
        Err(StoreError::DuplicateRun(id)) if id == "a"
    ));
    let waiting = RunStatus::AwaitingHuman {
        question: "Which test framework?".into(),
    };
    store.finish_run(&a, &waiting).unwrap();
    store
        .set_status(
            &b,
            &RunStatus::Failed {
                error: "boom".into(),
            },
        )
        .unwrap();
    let runs = store.runs().unwrap();
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[0].status, waiting);
    assert_eq!(runs[0].input, json!({"goal": "ship"}));
    assert_eq!(runs[0].head, None);
    assert_eq!(runs[1].status.name(), "failed");
    // Released at the end; held while running, with this process as the owner.
    assert_eq!(runs[0].lease, None);
    assert_eq!(runs[1].lease.as_ref().map(|h| &h.owner), Some(&me));
    assert!(matches!(
        store.claim("nope", &me, false),
        Err(StoreError::UnknownRun(_))
    ));
    assert!(store.run("nope").unwrap().is_none());
}

#[test]
fn puts_are_checked_against_their_run_and_parent() {
    let store = CheckpointStore::open_in_memory().unwrap();
    let none = StateDelta::new();
    let forged = Lease {
        run_id: "r".into(),
        id: 1,
    };
    assert!(matches!(
        store.put(&forged, NewCheckpoint::new("n", &none)),
        Err(StoreError::UnknownRun(_))
    ));
    let r = store
        .create_run(&NewRun::new("r", "w"), &Owner::current())
        .unwrap();
    let s = store
        .create_run(&NewRun::new("s", "w"), &Owner::current())
        .unwrap();
    let first = store.put(&r, NewCheckpoint::new("n", &none)).unwrap();
    assert!(matches!(
        store.put(&r, NewCheckpoint::new("n", &none).parent(Some(first + 100))),
        Err(StoreError::UnknownCheckpoint(_))
    ));
    assert!(matches!(
        store.put(&s, NewCheckpoint::new("n", &none).parent(Some(first))),
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
        .map(|id| store.checkpoint(id).unwrap())
        .unwrap();
    assert_eq!(record.next, vec!["tea"]);
    assert_eq!(record.metadata, json!({"attempts": 2}));
}

#[test]
fn a_file_database_reopens_and_a_newer_schema_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    {
        let store = CheckpointStore::open(&path).unwrap();
        let r = store
            .create_run(&NewRun::new("r", "w"), &Owner::current())
            .unwrap();
        let mut state = State::default();
        write_chain(&store, &r, &mut state, None, 0..3, |i| {
            vec![append("log", json!(i))]
        });
    }
    let store = CheckpointStore::open(&path).unwrap();
    let head = store.run("r").unwrap().unwrap().head.unwrap();
    assert_eq!(
        store.state_at(head).unwrap().state.get("log"),
        Some(&json!([0, 1, 2]))
    );
    drop(store);
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.pragma_update(None, "user_version", 99).unwrap();
    drop(conn);
    let err = CheckpointStore::open(&path).unwrap_err();
    assert!(
        matches!(err, StoreError::NewerSchema { found: 99, .. }),
        "{err}"
    );
    assert!(
        err.to_string().starts_with("Checkpoint database `"),
        "{err}"
    );
}

#[test]
fn a_read_only_open_reads_writes_nothing_and_a_write_says_read_only() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    {
        let store = CheckpointStore::open(&path).unwrap();
        let r = store
            .create_run(&NewRun::new("r", "w"), &Owner::current())
            .unwrap();
        let mut state = State::default();
        write_chain(&store, &r, &mut state, None, 0..2, |i| {
            vec![append("log", json!(i))]
        });
        store.release(&r).unwrap();
    }
    let before = std::fs::read(&path).unwrap();
    let store = CheckpointStore::open_read_only(&path).unwrap();
    assert_eq!(store.runs().unwrap().len(), 1);
    let err = store
        .create_run(&NewRun::new("s", "w"), &Owner::current())
        .unwrap_err();
    assert!(matches!(err, StoreError::ReadOnly { .. }), "{err}");
    assert!(err.to_string().contains("is read-only"), "{err}");
    drop(store);
    assert_eq!(std::fs::read(&path).unwrap(), before, "not a byte written");
}

#[test]
fn damaged_pages_are_refused_by_every_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    {
        let store = CheckpointStore::open(&path).unwrap();
        for i in 0..200 {
            let run =
                NewRun::new(format!("run-{i:03}"), "w").input(json!({"pad": "x".repeat(900)}));
            let lease = store.create_run(&run, &Owner::current()).unwrap();
            store.release(&lease).unwrap();
        }
    }
    // Flip the header of a leaf page in the middle of the `runs` table.
    let mut bytes = std::fs::read(&path).unwrap();
    let page = bytes
        .chunks(4096)
        .position(|page| page[0] == 0x0D && page.windows(7).any(|w| w == b"run-050"))
        .expect("a leaf page of `runs`");
    for byte in &mut bytes[page * 4096..page * 4096 + 8] {
        *byte ^= 0xFF;
    }
    std::fs::write(&path, &bytes).unwrap();
    for err in [
        CheckpointStore::open(&path).unwrap_err(),
        CheckpointStore::open_read_only(&path).unwrap_err(),
    ] {
        assert!(matches!(err, StoreError::NotADatabase { .. }), "{err}");
        assert!(err.to_string().contains("move it aside"), "{err}");
    }
    assert_eq!(std::fs::read(&path).unwrap(), bytes, "not a byte written");
}

/// The database a `writer_until_killed` child writes to.
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
    let Some(path) = std::env::var_os(CRASH_DB) else {
        return;
    };
    // Frequent snapshots make the kill likely to land inside a large transaction.
    let store = CheckpointStore::open(path)
        .unwrap()
        .with_policy(SnapshotPolicy {
            max_delta_ratio: 0.5,
            max_chain_len: 10_000,
        });
    let r = store
        .create_run(&NewRun::new("r", "w"), &Owner::current())
        .unwrap();
    let mut state = State::default();
    state.set("base", json!("z".repeat(100_000)));
    write_chain(&store, &r, &mut state, None, 0..1_000_000, crash_step);
}

#[test]
fn a_killed_writer_leaves_a_valid_database() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("crash.db");
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "durable::tests::writer_until_killed",
            "--nocapture",
        ])
        .env(CRASH_DB, &path)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Wait (bounded) until the child has written a few dozen checkpoints, then SIGKILL it.
    let mut written = 0;
    for _ in 0..600 {
        std::thread::sleep(std::time::Duration::from_millis(50));
        written = CheckpointStore::open(&path)
            .ok()
            .and_then(|store| store.run("r").ok().flatten())
            .map_or(0, |run| run.checkpoints);
        if written >= 40 {
            break;
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(written >= 40, "the writer wrote only {written} checkpoints");

    let store = CheckpointStore::open(&path).unwrap();
    let conn = rusqlite::Connection::open(&path).unwrap();
    let check: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok");
    let history = store.history("r").unwrap();
    let run = store.run("r").unwrap().unwrap();
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
            store.state_at(checkpoint.id).unwrap().state,
            expected,
            "step {i}"
        );
    }
}

/// An owner on this host whose process is gone (a reaped child's pid).
fn dead_owner() -> Owner {
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
fn a_second_claim_on_a_driven_run_is_refused_and_changes_nothing() {
    let store = CheckpointStore::open_in_memory().unwrap();
    let me = Owner::current();
    let lease = store.create_run(&NewRun::new("r", "w"), &me).unwrap();
    let head = store
        .put(&lease, NewCheckpoint::new("a", &StateDelta::new()))
        .unwrap();
    if !cfg!(target_os = "linux") {
        return;
    }
    let err = store.claim("r", &me, false).unwrap_err();
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
        store.claim("r", &me, true),
        Err(StoreError::Driven { .. })
    ));
    assert!(matches!(
        store.check_claim("r", false),
        Err(StoreError::Driven { .. })
    ));
    // The first owner still writes.
    let next = store
        .put(
            &lease,
            NewCheckpoint::new("b", &StateDelta::new()).parent(Some(head)),
        )
        .unwrap();
    assert_eq!(store.run("r").unwrap().unwrap().head, Some(next));
}

#[test]
fn a_dead_owner_is_taken_over_and_its_writes_are_fenced_off() {
    let store = CheckpointStore::open_in_memory().unwrap();
    let mut state = State::default();
    // The first process, as it looks once it died (on Linux the pid is free).
    let ghost = dead_owner();
    let old = store.create_run(&NewRun::new("r", "w"), &ghost).unwrap();
    let ids = write_chain(&store, &old, &mut state, None, 0..2, |i| {
        vec![append("log", json!(i))]
    });
    let take_over = !cfg!(target_os = "linux"); // elsewhere nobody can tell it is dead
    assert_eq!(
        store.check_claim("r", take_over).unwrap().unwrap().owner,
        ghost
    );
    let claim = store.claim("r", &Owner::current(), take_over).unwrap();
    assert_eq!(claim.replaced.map(|h| h.owner), Some(ghost));
    assert_eq!(claim.lease.run_id(), "r");

    // The old process wakes up: none of its writes reach the run.
    let late = delta(vec![append("log", json!("late"))]);
    let err = store
        .put(&old, NewCheckpoint::new("late", &late).parent(Some(ids[1])))
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
        store.set_status(&old, &RunStatus::Completed),
        Err(StoreError::LeaseLost { .. })
    ));
    assert!(matches!(
        store.finish_run(&old, &RunStatus::Completed),
        Err(StoreError::LeaseLost { .. })
    ));
    // Releasing a lost lease leaves the new owner's alone.
    store.release(&old).unwrap();
    let run = store.run("r").unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Running);
    assert_eq!(run.head, Some(ids[1]));
    assert_eq!(run.lease.map(|h| h.owner), Some(Owner::current()));

    // The new owner continues the chain; the history holds one line of writes.
    let mut resumed = store.state_at(ids[1]).unwrap().state;
    let more = write_chain(
        &store,
        &claim.lease,
        &mut resumed,
        Some(ids[1]),
        2..3,
        |i| vec![append("log", json!(i))],
    );
    store
        .finish_run(&claim.lease, &RunStatus::Completed)
        .unwrap();
    assert_eq!(
        store.state_at(more[0]).unwrap().state.get("log"),
        Some(&json!([0, 1, 2]))
    );
    assert_eq!(store.history("r").unwrap().len(), 3);
    // A finished run is free again, and an old lease id is never handed out twice.
    let run = store.run("r").unwrap().unwrap();
    assert_eq!((run.status, run.lease), (RunStatus::Completed, None));
    let again = store.claim("r", &Owner::current(), false).unwrap();
    assert_eq!(again.replaced, None);
    assert!(again.lease.id > claim.lease.id);
    assert!(matches!(
        store.set_status(&claim.lease, &RunStatus::Running),
        Err(StoreError::LeaseLost { .. })
    ));
}

#[test]
fn an_owner_on_another_host_is_taken_over_only_when_asked() {
    let store = CheckpointStore::open_in_memory().unwrap();
    let remote = Owner {
        host: format!("{}-elsewhere", Owner::current().host),
        ..Owner::current()
    };
    store.create_run(&NewRun::new("r", "w"), &remote).unwrap();
    let err = store.claim("r", &Owner::current(), false).unwrap_err();
    assert!(
        matches!(&err, StoreError::DrivenElsewhere { holder, .. } if holder.owner == remote),
        "{err}"
    );
    assert!(
        err.to_string().ends_with(
            ", which cannot be checked from here; if that process is gone, resume with \
             `--take-over`"
        ),
        "{err}"
    );
    assert!(matches!(
        store.prune("r", 1),
        Err(StoreError::DrivenElsewhere { .. })
    ));
    let claim = store.claim("r", &Owner::current(), true).unwrap();
    assert_eq!(claim.replaced.map(|h| h.owner), Some(remote));
}

#[test]
fn a_version_1_database_is_migrated_in_place_and_keeps_its_runs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    {
        // The file as the previous rlm wrote it: the version 1 schema and its rows.
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(super::schema::MIGRATIONS[0]).unwrap();
        conn.pragma_update(None, "user_version", 1).unwrap();
        conn.execute_batch(
            "INSERT INTO runs VALUES ('old', 'team.yaml', 'running', NULL, '{\"goal\":1}', 2, 10, 20);
             INSERT INTO runs VALUES ('done', 'w', 'completed', NULL, '{}', NULL, 11, 21);
             INSERT INTO checkpoints VALUES (1, 'old', NULL, 0, '__start__', '[\"a\"]', '{}', 10, 0, 0, 0, 9);
             INSERT INTO checkpoints VALUES (2, 'old', 1, 1, 'a', '[]', '{}', 20, 9, 9, 1, 9);
             INSERT INTO snapshots VALUES (1, '{\"x\":1}', '{\"x\":0}');
             INSERT INTO writes VALUES (2, 0, 'y', 'replace', '2');",
        )
        .unwrap();
    }
    let store = CheckpointStore::open(&path).unwrap();
    let runs = store.runs().unwrap();
    assert_eq!(
        runs.iter().map(|r| r.run_id.as_str()).collect::<Vec<_>>(),
        ["old", "done"]
    );
    assert_eq!(runs[0].input, json!({"goal": 1}));
    assert_eq!(runs[0].lease, None);
    let at = store.state_at(2).unwrap();
    assert_eq!(at.state.get("y"), Some(&json!(2)));
    assert_eq!(at.versions.get("y"), Some(&1));
    // The killed run of the old version is claimed and continued as any other.
    let claim = store.claim("old", &Owner::current(), false).unwrap();
    assert_eq!(claim.replaced, None);
    store
        .put(
            &claim.lease,
            NewCheckpoint::new("b", &StateDelta::new()).parent(Some(2)),
        )
        .unwrap();
    drop(store);
    let conn = rusqlite::Connection::open(&path).unwrap();
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .unwrap();
    assert_eq!(version, super::schema::VERSION);
    assert_eq!(version, 2);
    // Opening again migrates nothing twice.
    drop(conn);
    assert_eq!(
        CheckpointStore::open(&path).unwrap().runs().unwrap().len(),
        2
    );
}
