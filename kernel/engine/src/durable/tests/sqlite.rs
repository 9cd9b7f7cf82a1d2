//! What only the SQLite store does: read-only opens of a file, damaged pages, and files of
//! an earlier schema.

use serde_json::json;

use super::{append, new_run, write_chain};
use crate::durable::*;
use crate::state::{State, StateDelta};

#[tokio::test]
async fn a_read_only_open_reads_writes_nothing_and_a_write_says_read_only() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    {
        let store = SqliteStore::open(&path).unwrap();
        let r = new_run(&store, "r", &Owner::current()).await;
        let mut state = State::default();
        write_chain(&store, &r, &mut state, None, 0..2, |i| {
            vec![append("log", json!(i))]
        })
        .await;
        store.release(&r).await.unwrap();
    }
    let before = std::fs::read(&path).unwrap();
    let store = SqliteStore::open_read_only(&path).unwrap();
    assert_eq!(store.runs().await.unwrap().len(), 1);
    let err = store
        .create_run(&NewRun::new("s", "w"), &Owner::current())
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::ReadOnly { .. }), "{err}");
    assert!(err.to_string().contains("is read-only"), "{err}");
    drop(store);
    assert_eq!(std::fs::read(&path).unwrap(), before, "not a byte written");
}

#[tokio::test]
async fn damaged_pages_are_refused_by_every_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    {
        let store = SqliteStore::open(&path).unwrap();
        for i in 0..200 {
            let run =
                NewRun::new(format!("run-{i:03}"), "w").input(json!({"pad": "x".repeat(900)}));
            let lease = store.create_run(&run, &Owner::current()).await.unwrap();
            store.release(&lease).await.unwrap();
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
        SqliteStore::open(&path).unwrap_err(),
        SqliteStore::open_read_only(&path).unwrap_err(),
    ] {
        assert!(matches!(err, StoreError::NotADatabase { .. }), "{err}");
        assert!(err.to_string().contains("move it aside"), "{err}");
    }
    assert_eq!(std::fs::read(&path).unwrap(), bytes, "not a byte written");
}

#[tokio::test]
async fn a_version_1_database_is_migrated_in_place_and_keeps_its_runs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    {
        // The file as the previous rlm wrote it: the version 1 schema and its rows.
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(crate::durable::sqlite::schema::MIGRATIONS[0])
            .unwrap();
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
    let store = SqliteStore::open(&path).unwrap();
    let runs = store.runs().await.unwrap();
    assert_eq!(
        runs.iter().map(|r| r.run_id.as_str()).collect::<Vec<_>>(),
        ["old", "done"]
    );
    assert_eq!(runs[0].input, json!({"goal": 1}));
    assert_eq!(runs[0].lease, None);
    let at = store.state_at(2).await.unwrap();
    assert_eq!(at.state.get("y"), Some(&json!(2)));
    assert_eq!(at.versions.get("y"), Some(&1));
    // The killed run of the old version is claimed and continued as any other.
    let claim = store.claim("old", &Owner::current(), false).await.unwrap();
    assert_eq!(claim.replaced, None);
    store
        .put(
            &claim.lease,
            NewCheckpoint::new("b", &StateDelta::new()).parent(Some(2)),
        )
        .await
        .unwrap();
    drop(store);
    let conn = rusqlite::Connection::open(&path).unwrap();
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .unwrap();
    assert_eq!(version, crate::durable::sqlite::schema::VERSION);
    assert_eq!(version, 2);
    // Opening again migrates nothing twice.
    drop(conn);
    assert_eq!(
        SqliteStore::open(&path)
            .unwrap()
            .runs()
            .await
            .unwrap()
            .len(),
        2
    );
}
