//! The report: what `enter` applies is what `probe` predicts, and on this machine it is
//! every layer.

use sandbox::{Layer, State};

use crate::support::Sandbox;

#[test]
fn probe_predicts_what_enter_applies_and_every_layer_holds_here() {
    let sandbox = Sandbox::new();
    let run = sandbox.run("print('ran', 1)", &[]);
    assert_eq!(run.expect("ran"), "1");
    let applied = run
        .report
        .clone()
        .unwrap_or_else(|| panic!("no report: {run:#?}"));
    assert_eq!(sandbox::probe(&sandbox.policy), applied);
    assert!(
        applied.is_fully_confined(),
        "this machine does not confine every layer, so the hostile tests cannot pass: {}",
        applied.summary()
    );
}

/// The worker is a process-group leader (the terminal's Ctrl-C then reaches only `rlm`), so
/// it cannot start a session itself: the code still gets one of its own, led inside the
/// sandbox (a leader outside its PID namespace would show as 0), and the report says so.
#[test]
fn a_group_leader_still_gets_a_session_of_its_own() {
    let mut sandbox = Sandbox::new();
    // `setsid` makes `rlm-confine` a session and process-group leader, as the worker is one.
    sandbox.wrapper = vec!["setsid".to_owned()];
    let run = sandbox.run_with(
        "import os\nprint('session', os.getsid(0), os.getpid())",
        &[],
        true,
        &[],
        |_| {},
    );
    let report = run
        .report
        .clone()
        .unwrap_or_else(|| panic!("no report: {run:#?}"));
    assert!(
        matches!(report.state(Layer::Lifetime), Some(State::Active { detail }) if detail.contains("a session of its own")),
        "{report}"
    );
    let session: Vec<i64> = run
        .expect("session")
        .split(' ')
        .filter_map(|n| n.parse().ok())
        .collect();
    assert!(
        matches!(session[..], [sid, pid] if sid == 1 || sid == pid),
        "{run:#?}"
    );
}

#[test]
fn an_unprivileged_user_is_capped_by_rlimit_nproc_in_its_user_namespace() {
    let Some(sandbox) = Sandbox::unprivileged() else {
        // Not root: the current user is the unprivileged case, checked by the test above.
        return;
    };
    let run = sandbox.run("print('ran', 1)", &[]);
    assert_eq!(run.expect("ran"), "1");
    let report = run
        .report
        .clone()
        .unwrap_or_else(|| panic!("no report: {run:#?}"));
    assert!(report.is_fully_confined(), "{}", report.summary());
    assert!(
        matches!(report.state(Layer::Processes), Some(State::Active { detail }) if detail.contains("RLIMIT_NPROC")),
        "{report}"
    );
}

#[test]
fn in_a_container_without_user_namespaces_root_still_gets_every_layer() {
    if !crate::support::is_root() {
        return;
    }
    // A user namespace of its own where no further one may be created, as in a container.
    let mut sandbox = Sandbox::new();
    sandbox.wrapper = ["unshare", "--user", "--map-root-user", "sh", "-c"]
        .iter()
        .map(|s| (*s).to_owned())
        .chain([r#"echo 0 > /proc/sys/user/max_user_namespaces && exec "$0" "$@""#.to_owned()])
        .collect();
    let run = sandbox.run(
        "import os\npids = []\ntry:\n    while len(pids) < 3000:\n        p = os.fork()\n        if p == 0:\n            os.execv('/bin/sleep', ['sleep', '60'])\n        pids.append(p)\nexcept OSError as e:\n    print('capped', len(pids), e.errno)\n",
        &[],
    );
    let report = run
        .report
        .clone()
        .unwrap_or_else(|| panic!("no report: {run:#?}"));
    assert!(report.is_fully_confined(), "{report}");
    let capped = run.expect("capped");
    let forked: usize = capped
        .split(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(usize::MAX);
    assert!(forked <= 300 && capped.ends_with(" 11"), "{run:#?}");
}
