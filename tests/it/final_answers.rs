//! The three final-answer conventions through the real binary, with their edge cases.

use serde_json::Value;

use crate::support::{repl, run_replies as run_script, run_replies_traced};

/// [`run_script`] with a trajectory: the run and the trajectory's `iteration` lines.
fn run_traced(
    replies: &[&str],
    extra: &[&str],
) -> (crate::support::Mock, crate::support::Run, Vec<Value>) {
    let (mock, run, lines) = run_replies_traced(replies, extra);
    let iterations = lines
        .into_iter()
        .filter(|l| l["type"] == "iteration")
        .collect();
    (mock, run, iterations)
}

#[test]
fn final_not_at_line_start_then_missing_variable_then_nested_parentheses() {
    let (mock, run) = run_script(
        &[
            "The answer is FINAL(42) if I had checked.",
            "FINAL_VAR(nope)",
            "Done.\nFINAL(func(a, b))",
        ],
        &[],
    );
    run.assert_code(0);
    assert_eq!(run.last_line(), "func(a, b)");
    assert_eq!(
        mock.root_requests(),
        3,
        "neither of the first two replies ended the run"
    );
    let second_feedback = &mock.log().entries()[2].last_user;
    assert!(
        second_feedback.contains("nope"),
        "the model is told the variable is missing: {second_feedback}"
    );
}

#[test]
fn final_keeps_quotes_and_spans_lines() {
    let dir = tempfile::tempdir().expect("tempdir");
    let answer_file = dir.path().join("answer.txt");
    let (_mock, run) = run_script(
        &["FINAL(\"first line\"\nsecond (line))"],
        &["--answer-file", answer_file.to_str().expect("utf-8")],
    );
    run.assert_code(0);
    assert_eq!(
        std::fs::read_to_string(&answer_file).expect("answer file"),
        "\"first line\"\nsecond (line)"
    );
    assert!(
        run.stdout.ends_with("\"first line\"\nsecond (line)\n"),
        "{}",
        run.stdout
    );
}

#[test]
fn answer_dict_gives_the_content_when_ready() {
    let code = repl(
        "answer['content'] = 'draft'\nanswer['content'] = {'n': 3}\nanswer['ready'] = True\nanswer['content'] = 'changed later'",
    );
    let (_mock, run) = run_script(&[&code], &[]);
    run.assert_code(0);
    assert_eq!(run.last_line(), "{'n': 3}");
}

#[test]
fn final_var_in_code_and_in_text() {
    let code = repl("words = context.split()\nFINAL_VAR(len(words))");
    let (_mock, run) = run_script(&[&code], &[]);
    run.assert_code(0);
    assert_eq!(run.last_line(), "3");

    let (_mock, run) = run_script(
        &[&repl("result = context.upper()"), "FINAL_VAR( \"result\" )"],
        &[],
    );
    run.assert_code(0);
    assert_eq!(run.last_line(), "ALPHA BETA GAMMA");
}

#[test]
fn protocol_answer_ignores_final_lines() {
    let code = repl("answer['content'] = 'from the dict'\nanswer['ready'] = True");
    let (mock, run) = run_script(&["FINAL(from the text)", &code], &["--protocol", "answer"]);
    run.assert_code(0);
    assert_eq!(run.last_line(), "from the dict");
    assert_eq!(mock.root_requests(), 2);

    let (_mock, run) = run_script(&[&code, "FINAL(text)"], &["--protocol", "final"]);
    run.assert_code(0);
    assert_eq!(
        run.last_line(),
        "text",
        "the dict does not count under `final`"
    );
}

#[test]
fn fence_tags_other_than_repl_do_not_run() {
    let reply = "```python\nprint('should not run')\nanswer['content'] = 'python'\nanswer['ready'] = True\n```";
    let (mock, run) = run_script(&[reply, "FINAL(only repl blocks run)"], &[]);
    run.assert_code(0);
    assert_eq!(run.last_line(), "only repl blocks run");
    assert_eq!(mock.root_requests(), 2);
}

#[test]
fn code_and_final_in_one_reply_finish_in_that_reply_unless_a_block_raised() {
    // The reference runtime's way: blocks first, then the line, one root call.
    let (mock, run) = run_script(
        &["```repl\nn = len(context.split())\nsummary = f'{n} words'\n```\nFINAL_VAR(summary)"],
        &[],
    );
    run.assert_code(0);
    assert_eq!(run.last_line(), "3 words");
    assert_eq!(mock.root_requests(), 1);

    let replies = [
        "```repl\nn = len(context.split())\nprint(n)\n```\nFINAL(3 words)",
        "I saw the output.\nFINAL(confirmed: 3 words)",
    ];
    let (mock, run) = run_script(&replies, &[]);
    run.assert_code(0);
    assert_eq!(run.last_line(), "3 words");
    assert_eq!(mock.root_requests(), 1);

    // A block that raised holds the answer back, and the model is told why.
    let raised = [
        "```repl\nn = len(context.split()) / 0\n```\nFINAL(3 words)",
        "FINAL(after the error)",
    ];
    let (mock, run, iterations) = run_traced(&raised, &[]);
    run.assert_code(0);
    assert_eq!(run.last_line(), "after the error");
    assert_eq!(mock.root_requests(), 2);
    assert_eq!(
        iterations[0]["blocks"][0]["error"]["type_name"],
        "ZeroDivisionError"
    );
    assert_eq!(
        iterations[0]["notes"],
        serde_json::json!([{"note": "held_back_by_error", "kind": "final_line"}])
    );
    let (mock, run) = run_script(&raised, &["--code-and-final", "accept"]);
    run.assert_code(0);
    assert_eq!(run.last_line(), "3 words");
    assert_eq!(mock.root_requests(), 1);

    // The stricter mode stays as an opt-in (also under its old name).
    for mode in ["see-output-first", "see-output"] {
        let (mock, run) = run_script(&replies, &["--code-and-final", mode]);
        run.assert_code(0);
        assert_eq!(run.last_line(), "confirmed: 3 words");
        assert_eq!(
            mock.root_requests(),
            2,
            "{mode}: the model saw its output first"
        );
    }
}

#[test]
fn a_rebound_answer_dict_is_the_answer_and_a_non_dict_is_reset() {
    let (mock, run) = run_script(
        &[
            &repl("answer = {'content': 'later', 'ready': False}"),
            &repl("answer['ready'] = True"),
        ],
        &[],
    );
    run.assert_code(0);
    assert_eq!(run.last_line(), "later");
    assert_eq!(mock.root_requests(), 2);

    let (_mock, run, iterations) = run_traced(
        &[
            &repl("answer = 'done'"),
            &repl("answer['content'] = 'fresh'\nanswer['ready'] = True"),
        ],
        &[],
    );
    run.assert_code(0);
    assert_eq!(run.last_line(), "fresh");
    let stderr = iterations[0]["blocks"][0]["stderr"]
        .as_str()
        .expect("stderr");
    assert!(
        stderr.contains("`answer` must stay a dict; it was str, so it was reset"),
        "{stderr}"
    );
}

#[test]
fn in_code_final_var_of_a_missing_variable_is_not_an_answer() {
    let (mock, run, iterations) = run_traced(
        &[&repl("total = 3\nFINAL_VAR('totl')"), "FINAL_VAR(total)"],
        &[],
    );
    run.assert_code(0);
    assert_eq!(run.last_line(), "3", "not the misspelt name");
    assert_eq!(mock.root_requests(), 2);
    let stderr = iterations[0]["blocks"][0]["stderr"]
        .as_str()
        .expect("stderr");
    assert!(
        stderr.contains("names no variable `totl`, so no final answer was recorded"),
        "{stderr}"
    );
    assert!(stderr.contains("Your variables: `total`"), "{stderr}");
}

#[test]
fn a_final_line_must_end_at_its_parenthesis() {
    let (mock, run) = run_script(&["FINAL(42) done", "FINAL(43)\n"], &[]);
    run.assert_code(0);
    assert_eq!(run.last_line(), "43");
    assert_eq!(mock.root_requests(), 2, "the first reply did not finish");
}

#[test]
fn the_protocol_picks_its_convention_when_a_block_uses_both() {
    let both = repl(
        "v = 'from final_var'\nFINAL_VAR('v')\nanswer['content'] = 'from the dict'\nanswer['ready'] = True",
    );
    let (_mock, run) = run_script(&[&both], &["--protocol", "answer"]);
    run.assert_code(0);
    assert_eq!(run.last_line(), "from the dict");
    let (_mock, run) = run_script(&[&both], &["--protocol", "final"]);
    run.assert_code(0);
    assert_eq!(run.last_line(), "from final_var");
}
