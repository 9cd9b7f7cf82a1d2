//! The session store: `user:` and `app:` keys outlive a session, session keys outlive an
//! invocation, `temp:` keys never persist.

use engine::flow::{
    Control, FileSessionStore, FnAgent, Invocation, SessionKey, SessionStore, StoreError,
    run_session,
};
use engine::{SharedState, State};
use serde_json::json;

fn key(user: &str, session: &str) -> SessionKey {
    SessionKey {
        app: "planner".into(),
        user: user.into(),
        session: session.into(),
    }
}

/// Counts its runs in every scope.
fn counter() -> FnAgent {
    FnAgent::new("counter", |ctx| {
        for k in ["app:runs", "user:runs", "runs", "temp:runs"] {
            let n = ctx.get_state(k).and_then(|v| v.as_u64()).unwrap_or(0);
            ctx.set_state(k, json!(n + 1));
        }
        Ok(Control::Continue)
    })
}

async fn run_as(store: &FileSessionStore, user: &str, session: &str) -> State {
    let invocation = Invocation::new(SharedState::new(State::default()));
    let report = run_session(&counter(), store, &key(user, session), invocation, None)
        .await
        .expect("the store works");
    report.state
}

#[tokio::test]
async fn scoped_keys_persist_where_they_belong() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let store = FileSessionStore::new(dir.path());
    run_as(&store, "ada", "s1").await;
    let again = run_as(&store, "ada", "s1").await;
    assert_eq!(again.get("runs"), Some(&json!(2)));
    assert_eq!(again.get("user:runs"), Some(&json!(2)));
    assert_eq!(again.get("temp:runs"), None);
    let new_session = run_as(&store, "ada", "s2").await;
    assert_eq!(new_session.get("runs"), Some(&json!(1)));
    assert_eq!(new_session.get("user:runs"), Some(&json!(3)));
    let other_user = run_as(&store, "bob", "s1").await;
    assert_eq!(other_user.get("user:runs"), Some(&json!(1)));
    assert_eq!(other_user.get("app:runs"), Some(&json!(4)));
    let stored = store.load(&key("ada", "s1")).expect("loads");
    assert_eq!(stored.get("temp:runs"), None);
}

#[test]
fn names_that_could_escape_the_store_are_refused() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let store = FileSessionStore::new(dir.path());
    for bad in ["../x", "", ".hidden", "a/b"] {
        let err = store.load(&key(bad, "s")).expect_err("refused");
        assert!(
            matches!(err, StoreError::BadName { what: "user", .. }),
            "{bad}: {err}"
        );
    }
    let corrupt = dir.path().join("planner/app.json");
    std::fs::create_dir_all(corrupt.parent().expect("a parent")).expect("mkdir");
    std::fs::write(&corrupt, "[1, 2]").expect("write");
    let err = store.load(&key("ada", "s")).expect_err("corrupt");
    assert!(err.to_string().contains("is not a JSON object"), "{err}");
}
