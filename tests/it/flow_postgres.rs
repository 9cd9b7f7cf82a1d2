//! Durable `rlm flow` runs in a PostgreSQL database (`--db postgres://…`), end to end through
//! the real binary against a real throwaway server (`rlm-test-postgres`): the team demo, two
//! "hosts" (processes with different `RLM_HOST_ID`) racing for one run, a `kill -9` of the
//! driver taken over by another host once its lease expired, `RLM_DB` and `rlm.toml`, and
//! connection errors that never show the password.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::flow_durable::{Background, Flows, nodes, portable, team_demo, wait_for};
use crate::support::{file, rlm, rlm_in, rlm_with};

/// `args` with `RLM_HOST_ID=host`: this process plays host `host`.
fn on_host(args: &[String], host: &str) -> std::process::Command {
    let mut command = crate::support::rlm_command(args);
    command.env("RLM_HOST_ID", host);
    command
}

/// Starts `args` as host `host`, its output piped.
fn spawn_on(args: &[String], host: &str) -> Background {
    Background::from_command(on_host(args, host))
}

#[test]
fn the_team_demo_runs_and_resumes_in_postgres_and_never_shows_the_password() {
    let db = test_postgres::server().database();
    let url = db.url();
    let password = test_postgres::server().password().to_owned();
    let run = team_demo(&url, "team-pg", None);
    run.assert_code(0);
    let shown = format!(
        "postgres://{}@127.0.0.1:{}/{}",
        test_postgres::ADMIN,
        test_postgres::server().port(),
        db.name()
    );
    assert!(
        run.stderr
            .contains(&format!("run `team-pg` (checkpoints in `{shown}`)"))
            && run.stderr.contains(&format!(
                "resuming run `team-pg` (checkpoints in `{shown}`)"
            )),
        "{}",
        run.stderr
    );
    // The resume command it prints names the database without its password.
    assert!(
        run.stdout
            .contains(&format!("rlm flow resume team-pg --db {shown} --input")),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.trim_end().ends_with(
            "APPROVED: every field is quoted, as decided; the export opens in every spreadsheet \
             we test."
        ),
        "{}",
        run.stdout
    );
    let history = rlm(
        &["flow", "history", "team-pg", "--db", &url, "--json"].map(String::from),
        None,
    );
    history.assert_code(0);
    let checkpoints = history.json().as_array().cloned().unwrap_or_default();
    assert_eq!(checkpoints.len(), 22, "{}", history.stdout);
    assert_eq!(nodes(&checkpoints)[0], "__start__");
    let decisions = rlm(
        &["flow", "decisions", "team-pg", "--db", &url, "--json"].map(String::from),
        None,
    );
    decisions.assert_code(0);
    assert_eq!(decisions.json().as_array().map(Vec::len), Some(10));
    let runs = rlm(&["flow", "runs", "--db", &url].map(String::from), None);
    runs.assert_code(0);
    assert!(
        runs.stdout.contains("team-pg  completed"),
        "{}",
        runs.stdout
    );
    for out in [&run, &history, &decisions, &runs] {
        assert!(!out.stdout.contains(&password) && !out.stderr.contains(&password));
    }
    // The tables hold the run: 22 checkpoints, one run, no lease left behind.
    assert_eq!(
        db.psql(
            "SELECT (SELECT count(*) FROM rlm.checkpoints) || ',' || \
             (SELECT count(*) FROM rlm.runs) || ',' || (SELECT count(*) FROM rlm.leases)"
        ),
        "22,1,0"
    );
}

#[test]
fn a_url_from_rlm_db_or_rlm_toml_names_the_database_and_bad_ones_say_what_is_wrong() {
    let db = test_postgres::server().database();
    let url = db.url();
    let flows = Flows::on(url.clone());
    file(flows.dir.path(), "go", "");
    rlm(&flows.run_pipeline("whole", &[]), None).assert_code(0);

    // `RLM_DB`, and `db` in `rlm.toml`'s `[run]` table, without `--db`.
    let listed = rlm_with(
        &["flow", "runs", "--json"].map(String::from),
        None,
        &[("RLM_DB", &url)],
    );
    listed.assert_code(0);
    assert_eq!(
        listed.json()[0]["run_id"],
        json!("whole"),
        "{}",
        listed.stdout
    );
    let project = tempfile::tempdir().expect("tempdir");
    file(
        project.path(),
        "rlm.toml",
        &format!("[run]\ndb = \"{url}\"\n"),
    );
    let listed = rlm_in(
        project.path(),
        &["flow", "history", "whole", "--json"].map(String::from),
        None,
    );
    listed.assert_code(0);
    assert_eq!(listed.json().as_array().map(Vec::len), Some(4));

    // Wrong credentials, a missing database, a server that is not there: exit 1, each saying
    // what to do, none showing the password.
    let server = test_postgres::server();
    let (user, port) = (test_postgres::ADMIN, server.port());
    let closed = std::net::TcpListener::bind(("127.0.0.1", 0))
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let secret = "Not-the-Passw0rd-42";
    for (db, expected) in [
        (
            format!("postgres://{user}:{secret}@127.0.0.1:{port}/postgres"),
            format!(
                "PostgreSQL refused the login of user `{user}` to \
                 `postgres://{user}@127.0.0.1:{port}/postgres`: password authentication failed"
            ),
        ),
        (
            format!("postgres://{user}:{secret}@127.0.0.1:{closed}/runs?connect_timeout=5"),
            format!(
                "Could not connect to the run database `postgres://{user}@127.0.0.1:{closed}/runs`"
            ),
        ),
        (
            format!(
                "postgres://{user}:{}@127.0.0.1:{port}/no_such_db",
                server.password()
            ),
            format!("There is no database `no_such_db` on the PostgreSQL server 127.0.0.1:{port}"),
        ),
    ] {
        let out = rlm(&["flow", "runs", "--db", &db].map(String::from), None);
        out.assert_code(1);
        assert!(out.stderr.contains(&expected), "{}", out.stderr);
        assert!(
            !out.stderr.contains(secret) && !out.stderr.contains(server.password()),
            "{}",
            out.stderr
        );
    }
}

/// The pipeline run `id` in `flows`' database, driven by host `host` with leases of `expiry`
/// seconds and killed (`kill -9`) while its `wait` step runs.
fn crash_on(flows: &Flows, id: &str, host: &str, expiry: &str) {
    let mut driver = spawn_on(&flows.run_pipeline(id, &["--lease-expiry", expiry]), host);
    wait_for(&flows.path("started"), driver.child());
    driver.child().kill().expect("kill -9");
    let _ = driver.finish();
}

/// Waits (bounded) until run `id` is shown as `interrupted`: nobody drives it any more.
fn wait_interrupted(flows: &Flows, id: &str) -> Duration {
    let start = Instant::now();
    loop {
        if flows.status(id) == "interrupted" {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "run `{id}` was never free: {}",
            flows.listed(id)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_killed_driver_is_taken_over_by_another_host_once_its_lease_expired() {
    let db = test_postgres::server().database();
    let flows = Flows::on(db.url());
    // The driver on host-a, renewing a 3 s lease, is refused to host-b while it runs.
    let mut driver = spawn_on(&flows.run_pipeline("k", &["--lease-expiry", "3"]), "host-a");
    wait_for(&flows.path("started"), driver.child());
    let pid = driver.child().id();
    // Past the first expiry: only the heartbeat keeps it.
    std::thread::sleep(Duration::from_secs(4));
    let listed = flows.listed("k");
    assert_eq!(
        (
            &listed["status"],
            &listed["owner"]["host"],
            &listed["owner"]["pid"]
        ),
        (&json!("running"), &json!("host-a"), &json!(pid)),
        "{listed}"
    );
    let refused = on_host_run(&flows.model_args(&["resume", "k"]), "host-b");
    assert_eq!(refused.0, Some(6), "{}", refused.1);
    assert!(
        refused.1.contains(&format!(
            "Run `k` is being driven by pid {pid} on host `host-a` since "
        )) && refused.1.contains("which renews its lease"),
        "{}",
        refused.1
    );

    // kill -9: nobody renews the lease; once it expired, host-b takes the run over.
    driver.child().kill().expect("kill -9");
    let _ = driver.finish();
    let free_after = wait_interrupted(&flows, "k");
    assert!(free_after < Duration::from_secs(30), "{free_after:?}");
    file(flows.dir.path(), "go", "");
    let resumed = on_host_run(&flows.model_args(&["resume", "k"]), "host-b");
    assert_eq!(resumed.0, Some(0), "{}", resumed.1);
    assert!(
        resumed.1.contains(&format!(
            "taking the run over from pid {pid} on host `host-a` since "
        )) && resumed
            .1
            .contains(" (its lease expired without a heartbeat)"),
        "{}",
        resumed.1
    );
    assert_eq!(flows.status("k"), "completed");
    assert_eq!(
        nodes(&flows.history("k")),
        ["__start__", "first", "wait", "last"]
    );
    // The same final state as an unbroken run.
    rlm(&flows.run_pipeline("whole", &[]), None).assert_code(0);
    assert_eq!(
        portable(flows.final_state("k")),
        portable(flows.final_state("whole"))
    );
    assert_eq!(
        portable(flows.final_state("k")),
        json!({"a": 1, "b": 2, "c": 20, "log": "first,wait,last"})
    );
}

#[test]
fn of_two_hosts_racing_to_resume_a_run_exactly_one_drives_it_and_the_other_exits_6() {
    let db = test_postgres::server().database();
    let flows = Flows::on(db.url());
    crash_on(&flows, "race", "host-a", "1");
    wait_interrupted(&flows, "race");
    // Both resume at once; `wait` blocks (no `go` file) so the winner still drives when the
    // loser claims.
    let racers: Vec<Background> = ["host-b", "host-c"]
        .iter()
        .map(|host| {
            spawn_on(
                &flows.model_args(&["resume", "race", "--lease-expiry", "30"]),
                host,
            )
        })
        .collect();
    // Until one has exited (refused) and the other runs `wait`; both outcomes are checked
    // below, with what each said.
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut racers: Vec<Option<Background>> = racers.into_iter().map(Some).collect();
    let mut refused = Vec::new();
    let lines = || std::fs::read_to_string(flows.path("started")).map_or(0, |t| t.lines().count());
    while refused.is_empty() || lines() < 2 {
        for racer in racers.iter_mut() {
            if racer
                .as_mut()
                .is_some_and(|r| matches!(r.child().try_wait(), Ok(Some(_))))
            {
                refused.push(racer.take().expect("a racer").finish());
            }
        }
        assert!(
            refused.len() < 2 && Instant::now() < deadline,
            "not one racer drove the run (`wait` started {} time(s) in all): {refused:?}",
            lines()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let (code, stderr) = &refused[0];
    assert_eq!(*code, Some(6), "{stderr}");
    assert!(
        stderr.contains("Run `race` is being driven by pid "),
        "{stderr}"
    );
    let listed = flows.listed("race");
    let winner_host = listed["owner"]["host"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        ["host-b", "host-c"].contains(&winner_host.as_str()),
        "{listed}"
    );
    // Its lease runs out 30 s after the last heartbeat unless renewed: `runs` says until when.
    let since = listed["owner"]["since"].as_str().unwrap_or_default();
    let until = listed["owner"]["lease_until"].as_str().unwrap_or_default();
    assert!(until.len() == since.len() && until > since, "{listed}");
    // (A heartbeat may have moved it on since.)
    let table = rlm(&flows.args(&["runs"]), None);
    assert!(
        table
            .stdout
            .contains(&format!("on {winner_host}, lease until {}", &until[..11])),
        "{}",
        table.stdout
    );
    // The loser was told who drives it: the winner.
    assert!(
        stderr.contains(&format!("on host `{winner_host}`")),
        "{stderr}"
    );

    file(flows.dir.path(), "go", "");
    let winner = racers.into_iter().flatten().next().expect("the winner");
    let (code, stderr) = winner.finish();
    assert_eq!(code, Some(0), "{stderr}");
    // `wait` ran once for the crash and once for the winner, never for the loser.
    let started = std::fs::read_to_string(flows.path("started")).expect("started file");
    assert_eq!(started.lines().count(), 2);
    assert_eq!(
        nodes(&flows.history("race")),
        ["__start__", "first", "wait", "last"]
    );
    assert_eq!(flows.status("race"), "completed");
    let done: Value = flows.final_state("race");
    assert_eq!(
        portable(done),
        json!({"a": 1, "b": 2, "c": 20, "log": "first,wait,last"})
    );
}

/// Runs `args` as host `host` to its end: its exit code and stderr.
fn on_host_run(args: &[String], host: &str) -> (Option<i32>, String) {
    Background::from_command(on_host(args, host)).finish()
}

#[test]
fn the_run_database_options_are_checked_and_belong_to_rlm_flow_only() {
    let flows = Flows::new();
    // A lease shorter than a second would heartbeat thrice a second: refused before anything
    // runs or is written.
    let short = rlm(
        &flows.run_pipeline("short", &["--lease-expiry", "0.5"]),
        None,
    );
    short.assert_code(2);
    assert!(
        short.stderr.contains("must be at least 1 second, got 0.5"),
        "{}",
        short.stderr
    );
    assert!(!flows.path("runs.db").exists());
    let soon = rlm_with(
        &flows.run_pipeline("soon", &[]),
        None,
        &[("RLM_LEASE_EXPIRY", "soon")],
    );
    soon.assert_code(2);
    assert!(
        soon.stderr
            .contains("`RLM_LEASE_EXPIRY` must be a positive number of seconds"),
        "{}",
        soon.stderr
    );
    // `rlm run` keeps no run database: it offers no `--db`, and ignores `db` in a shared
    // rlm.toml.
    let run = rlm(
        &["run", "--db", "x.db", "--query", "q"].map(String::from),
        None,
    );
    run.assert_code(2);
    assert!(run.stderr.contains("--db"), "{}", run.stderr);
    let project = tempfile::tempdir().expect("tempdir");
    file(project.path(), "c.txt", "text");
    file(project.path(), "rlm.toml", "[run]\ndb = \"elsewhere.db\"\n");
    let dry = rlm_in(
        project.path(),
        &[
            "run",
            "--dry-run",
            "--json",
            "--query",
            "q",
            "--context",
            "c.txt",
        ]
        .map(String::from),
        None,
    );
    dry.assert_code(0);
    assert_eq!(dry.json()["options"].get("db"), None, "{}", dry.stdout);
}
