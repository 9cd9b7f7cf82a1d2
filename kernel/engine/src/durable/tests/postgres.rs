//! What only the PostgreSQL store does: leases that expire unless renewed, hosts racing for a
//! run, one schema for hosts that open a new database at once, read-only sessions, and the
//! errors of a connection (each clear, none showing the password).

use std::time::Duration;

use serde_json::json;

use super::{Backend, Fixture, append, new_run, write_chain};
use crate::durable::*;
use crate::state::{State, StateDelta};

/// A store on `fx` whose leases last `expiry` without a heartbeat.
async fn store_expiring(fx: &Fixture, expiry: Duration) -> PostgresStore {
    let Location::Postgres(url) = &fx.location else {
        unreachable!("a PostgreSQL fixture");
    };
    PostgresStore::connect(url)
        .await
        .unwrap()
        .with_lease_expiry(expiry)
}

/// This process as if it ran on host `host`.
fn on_host(host: &str) -> Owner {
    Owner {
        host: host.to_owned(),
        ..Owner::current()
    }
}

#[tokio::test]
async fn a_lease_that_is_not_renewed_expires_and_its_driver_is_fenced_off() {
    let fx = Fixture::new(Backend::Postgres);
    let store = store_expiring(&fx, Duration::from_secs(1)).await;
    let old = new_run(&store, "r", &on_host("host-a")).await;
    let mut state = State::default();
    let ids = write_chain(&store, &old, &mut state, None, 0..2, |i| {
        vec![append("log", json!(i))]
    })
    .await;
    // While it lasts, another host is refused.
    let err = store
        .claim("r", &on_host("host-b"), false)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Renewed { .. }), "{err}");
    tokio::time::sleep(Duration::from_millis(1_300)).await;

    // Expired: the driver writes nothing more, even before anyone took over, and cannot
    // renew it either.
    let late = super::delta(vec![append("log", json!("late"))]);
    let put = NewCheckpoint::new("late", &late).parent(Some(ids[1]));
    let err = store.put(&old, put.clone()).await.unwrap_err();
    assert!(matches!(err, StoreError::LeaseExpired { .. }), "{err}");
    assert!(
        err.to_string()
            .starts_with("This process no longer drives run `r`: its lease expired at "),
        "{err}"
    );
    assert!(matches!(
        store.heartbeat(&old).await,
        Err(StoreError::LeaseExpired { .. })
    ));
    let run = store.run("r").await.unwrap().unwrap();
    assert_eq!(
        run.lease.as_ref().map(LeaseHolder::liveness),
        Some(Liveness::Dead)
    );

    // Another host takes it over without being asked to, and the old driver stays fenced.
    let claim = store.claim("r", &on_host("host-b"), false).await.unwrap();
    assert_eq!(claim.replaced.map(|h| h.owner.host), Some("host-a".into()));
    let err = store.put(&old, put).await.unwrap_err();
    assert!(
        matches!(&err, StoreError::LeaseLost { holder: Some(h), .. } if h.owner.host == "host-b"),
        "{err}"
    );
    assert!(matches!(
        store.finish_run(&old, &RunStatus::Completed).await,
        Err(StoreError::LeaseLost { .. })
    ));
    let more = write_chain(&store, &claim.lease, &mut state, Some(ids[1]), 2..3, |i| {
        vec![append("log", json!(i))]
    })
    .await;
    assert_eq!(
        store.state_at(more[0]).await.unwrap().state.get("log"),
        Some(&json!([0, 1, 2]))
    );
}

#[tokio::test]
async fn a_heartbeat_keeps_the_lease_past_its_expiry() {
    let fx = Fixture::new(Backend::Postgres);
    let store = store_expiring(&fx, Duration::from_secs(1)).await;
    let lease = new_run(&store, "r", &on_host("host-a")).await;
    let mut parent = None;
    for step in 0..8 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        store.heartbeat(&lease).await.unwrap();
        let err = store
            .claim("r", &on_host("host-b"), false)
            .await
            .unwrap_err();
        assert!(
            matches!(err, StoreError::Renewed { .. }),
            "step {step}: {err}"
        );
        let none = StateDelta::new();
        parent = Some(
            store
                .put(&lease, NewCheckpoint::new("n", &none).parent(parent))
                .await
                .unwrap(),
        );
    }
    assert_eq!(store.history("r").await.unwrap().len(), 8);
    // `--take-over` does not wait for the expiry; the old driver is fenced from then on.
    let taken = store.claim("r", &on_host("host-b"), true).await.unwrap();
    assert_eq!(taken.replaced.map(|h| h.owner.host), Some("host-a".into()));
    assert!(matches!(
        store.heartbeat(&lease).await,
        Err(StoreError::LeaseLost { .. })
    ));
}

#[tokio::test]
async fn of_hosts_racing_for_a_run_exactly_one_drives_it() {
    let fx = Fixture::new(Backend::Postgres);
    let store = store_expiring(&fx, Duration::from_secs(1)).await;
    let gone = new_run(&store, "r", &on_host("host-gone")).await;
    let none = StateDelta::new();
    let head = store
        .put(&gone, NewCheckpoint::new("a", &none))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    // Eight hosts, each with a pool of its own, claim it at once.
    let mut racers = Vec::new();
    for host in 0..8 {
        let store = store_expiring(&fx, Duration::from_secs(30)).await;
        racers.push(tokio::spawn(async move {
            let owner = on_host(&format!("host-{host}"));
            let claim = store.claim("r", &owner, false).await;
            (owner, claim, store)
        }));
    }
    let mut winners = Vec::new();
    for racer in racers {
        let (owner, claim, store) = racer.await.unwrap();
        match claim {
            Ok(claim) => winners.push((owner, claim, store)),
            Err(err) => assert!(matches!(err, StoreError::Renewed { .. }), "{err}"),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one host drives the run");
    let (owner, claim, winner) = winners.pop().unwrap();
    let run = store.run("r").await.unwrap().unwrap();
    assert_eq!(run.lease.map(|h| h.owner), Some(owner));
    winner
        .put(
            &claim.lease,
            NewCheckpoint::new("b", &none).parent(Some(head)),
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn hosts_opening_a_new_database_at_once_find_one_schema() {
    let fx = Fixture::new(Backend::Postgres);
    let Location::Postgres(url) = fx.location.clone() else {
        unreachable!("a PostgreSQL fixture");
    };
    let opens: Vec<_> = (0..4)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { PostgresStore::connect(&url).await.map(drop) })
        })
        .collect();
    for open in opens {
        open.await.unwrap().unwrap();
    }
    let db = fx.pg.as_ref().unwrap();
    assert_eq!(db.psql("SELECT count(*) FROM rlm.schema_version"), "1");
}

#[tokio::test]
async fn a_read_only_session_lists_runs_and_writes_nothing() {
    let fx = Fixture::new(Backend::Postgres);
    let Location::Postgres(url) = &fx.location else {
        unreachable!("a PostgreSQL fixture");
    };
    let err = PostgresStore::connect_read_only(url).await.unwrap_err();
    assert!(matches!(err, StoreError::Missing { .. }), "{err}");
    let db = fx.pg.as_ref().unwrap();
    assert_eq!(
        db.psql("SELECT to_regclass('rlm.runs') IS NULL"),
        "t",
        "a read-only open creates nothing"
    );
    let writer = fx.store().await;
    let lease = writer
        .create_run(&NewRun::new("r", "w"), &Owner::current())
        .await
        .unwrap();
    writer.release(&lease).await.unwrap();
    let reader = PostgresStore::connect_read_only(url).await.unwrap();
    assert_eq!(reader.runs().await.unwrap().len(), 1);
    let err = reader
        .create_run(&NewRun::new("s", "w"), &Owner::current())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("read-only transaction"), "{err}");
    assert_eq!(db.psql("SELECT count(*) FROM rlm.runs"), "1");
}

#[tokio::test]
async fn connection_errors_say_what_is_wrong_and_never_show_the_password() {
    let server = test_postgres::server();
    let password = server.password();
    let port = server.port();
    let user = test_postgres::ADMIN;
    let wrong = "Wr0ng-pa55word-for-the-test";
    let closed = std::net::TcpListener::bind(("127.0.0.1", 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let cases = [
        (
            format!("postgres://{user}:{wrong}@127.0.0.1:{port}/postgres"),
            "PostgreSQL refused the login of user `rlm_test` to \
             `postgres://rlm_test@127.0.0.1:{port}/postgres`: password authentication failed",
        ),
        (
            format!("postgres://{user}:{password}@127.0.0.1:{port}/no_such_db"),
            "There is no database `no_such_db` on the PostgreSQL server 127.0.0.1:{port}; create \
             it",
        ),
        (
            format!("postgres://{user}:{password}@127.0.0.1:{closed}/postgres?connect_timeout=5"),
            "Could not connect to the run database `postgres://rlm_test@127.0.0.1:{closed}/\
             postgres`: ",
        ),
    ];
    for (text, expected) in &cases {
        let location = Location::parse(text).unwrap();
        let expected = expected
            .replace("{port}", &port.to_string())
            .replace("{closed}", &closed.to_string());
        for err in [
            open(&location, None).await.unwrap_err(),
            open_read_only(&location).await.unwrap_err(),
        ] {
            let shown = format!("{err} {err:?}");
            assert!(shown.starts_with(&expected), "{shown}");
            assert!(!shown.contains(password), "{shown}");
            assert!(!shown.contains(wrong), "{shown}");
        }
    }
    let refused = open(&Location::parse(&cases[0].0).unwrap(), None).await;
    assert!(matches!(refused, Err(StoreError::Refused { .. })));
    // Every form of the passwords met so far is redacted from what the process writes.
    let redactor = bridge::secret::redactor();
    assert_eq!(
        redactor.redact(&format!("a {password} b {wrong}")),
        "a [redacted] b [redacted]"
    );
}

#[tokio::test]
async fn a_user_who_may_not_create_the_schema_is_told_what_it_needs() {
    let fx = Fixture::new(Backend::Postgres);
    let db = fx.pg.as_ref().unwrap();
    let server = db.server();
    // A role of this test's own (roles belong to the whole server).
    let role = format!("{}_reader", db.name());
    db.psql(&format!(
        "CREATE ROLE {role} LOGIN PASSWORD 'reader-pass-4242'"
    ));
    let url = format!(
        "postgres://{role}:reader-pass-4242@127.0.0.1:{}/{}",
        server.port(),
        db.name()
    );
    let err = open(&Location::parse(&url).unwrap(), None)
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, StoreError::Permission { .. }), "{text}");
    assert!(text.contains("creates the schema `rlm`"), "{text}");
    assert!(!text.contains("reader-pass-4242"), "{text}");
    // Once the owner made it, the same user reads and writes runs with its privileges.
    drop(fx.store().await);
    db.psql(&format!(
        "GRANT USAGE ON SCHEMA rlm TO {role}; \
         GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA rlm TO {role}"
    ));
    let store = open(&Location::parse(&url).unwrap(), None).await.unwrap();
    let lease = new_run(store.as_ref(), "r", &Owner::current()).await;
    store
        .finish_run(&lease, &RunStatus::Completed)
        .await
        .unwrap();
    assert_eq!(store.runs().await.unwrap().len(), 1);
    drop(store);
    db.psql(&format!("DROP OWNED BY {role}"));
    drop(fx);
    server.psql("postgres", &format!("DROP ROLE {role}"));
}

#[tokio::test]
async fn the_size_of_the_tables_grows_with_the_writes() {
    let fx = Fixture::new(Backend::Postgres);
    let store = store_expiring(&fx, Duration::from_secs(30)).await;
    let empty = store.size_bytes().await.unwrap();
    let lease = new_run(&store, "r", &Owner::current()).await;
    let mut state = State::default();
    write_chain(&store, &lease, &mut state, None, 0..20, |i| {
        vec![append("log", json!("x".repeat(1_000 + i)))]
    })
    .await;
    let after = store.size_bytes().await.unwrap();
    assert!(after > empty + 20_000, "{empty} -> {after}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_whose_run_is_taken_over_writes_nothing_more_and_stops() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use crate::flow::{Agent, Control, FnAgent, Graph, Invocation, InvocationContext};
    use crate::{SharedState, State};

    let fx = Fixture::new(Backend::Postgres);
    // Renewed every 1.7 s: a loaded machine still renews it in time.
    let store: Arc<dyn Store> = Arc::new(store_expiring(&fx, Duration::from_secs(5)).await);
    let step = |name: &str| -> Arc<dyn Agent> {
        let key = name.to_owned();
        Arc::new(FnAgent::new(name, move |ctx: &InvocationContext| {
            ctx.set_state(&key, json!(true));
            Ok(Control::Continue)
        }))
    };
    // `slow` runs for 4 s, while another host takes the run over (its run's task busy all
    // along, as a step that blocks would keep it: the heartbeat goes on beside it).
    let slow: Arc<dyn Agent> = Arc::new(FnAgent::new("slow", |ctx: &InvocationContext| {
        tokio::task::block_in_place(|| std::thread::sleep(Duration::from_secs(4)));
        ctx.set_state("slow", json!(true));
        Ok(Control::Continue)
    }));
    let ran_last = Arc::new(AtomicBool::new(false));
    let flag = ran_last.clone();
    let last: Arc<dyn Agent> = Arc::new(FnAgent::new("last", move |_: &InvocationContext| {
        flag.store(true, Ordering::SeqCst);
        Ok(Control::Continue)
    }));
    let graph = Graph::sequential("g", vec![step("first"), slow, last]).unwrap();
    let driving = {
        let store = store.clone();
        tokio::spawn(async move {
            let invocation = Invocation::new(SharedState::new(State::default()));
            let start = Start::New {
                workflow: "g".into(),
                input: json!({}),
            };
            run_durable(&graph, None, &store, "r", start, invocation).await
        })
    };
    // Once `first` is checkpointed, host-b takes the run over (`--take-over`).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while store.history("r").await.map_or(0, |h| h.len()) < 2 {
        assert!(std::time::Instant::now() < deadline, "`first` never ran");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The driver as if on host-a (a live driver on this host is never taken over).
    fx.pg
        .as_ref()
        .unwrap()
        .psql("UPDATE rlm.leases SET host = 'host-a' WHERE run_id = 'r'");
    let other = store_expiring(&fx, Duration::from_secs(30)).await;
    let taken = other.claim("r", &on_host("host-b"), true).await.unwrap();
    assert!(
        taken.replaced.is_some(),
        "the driver no longer held it: {:?}",
        store.run("r").await
    );

    let err = tokio::time::timeout(Duration::from_secs(30), driving)
        .await
        .expect("the fenced driver stops")
        .unwrap()
        .unwrap_err();
    assert!(
        matches!(&err, DurableError::Store(StoreError::LeaseLost { holder: Some(h), .. }) if h.owner.host == "host-b"),
        "{err}"
    );
    assert!(
        !ran_last.load(Ordering::SeqCst),
        "the run stopped before `last`"
    );
    let history = store.history("r").await.unwrap();
    let nodes: Vec<&str> = history.iter().map(|c| c.node.as_str()).collect();
    assert_eq!(
        nodes,
        ["__start__", "first"],
        "nothing written after the takeover"
    );
    let run = store.run("r").await.unwrap().unwrap();
    assert_eq!(run.lease.map(|h| h.owner.host), Some("host-b".into()));
}
