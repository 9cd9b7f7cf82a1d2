//! `rlm demo`: the README's main job.

use crate::support::rlm;

#[test]
fn demo_runs_the_scripted_analysis_and_checks_its_answer() {
    let dir = tempfile::tempdir().expect("tempdir");
    let trajectory = dir.path().join("demo.jsonl");
    let run = rlm(
        &[
            "demo".to_owned(),
            "--size-mb".to_owned(),
            "1".to_owned(),
            "--trajectory".to_owned(),
            trajectory.to_str().expect("utf-8").to_owned(),
        ],
        None,
    );
    run.assert_code(0);
    assert!(
        run.stderr.contains("SCRIPTED"),
        "says plainly that the models are scripted"
    );
    assert!(
        run.stderr.contains("llm_query_batched"),
        "the trace shows the fan-out code"
    );
    assert!(run.stderr.contains("matches"), "{}", run.stderr);
    let answer: serde_json::Value = serde_json::from_str(run.last_line()).expect("JSON answer");
    assert_eq!(
        answer.as_object().map(|o| o.len()),
        Some(8),
        "eight services"
    );
    let lines = std::fs::read_to_string(&trajectory).expect("trajectory");
    assert!(lines.lines().count() >= 5);
}
