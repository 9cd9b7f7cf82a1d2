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
