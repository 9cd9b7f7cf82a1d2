//! The session: state, output, display, exceptions, timeouts, reserved names, final answers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kernel::repl::{ContextSource, FinalSource, ReplSession};

use crate::support::{config, no_endpoints, ok, session, session_with};

#[test]
fn state_persists_across_blocks() {
    let s = session();
    ok(&s, "x = 40\ndef add(a, b):\n    return a + b");
    let r = ok(&s, "print(add(x, 2))");
    assert_eq!(r.stdout, "42\n");
    assert_eq!(
        s.variable_as_string("x").expect("reads"),
        Some("40".to_owned())
    );
    assert_eq!(s.variable_as_string("nope").expect("reads"), None);
}

#[test]
fn final_bare_expression_is_displayed_like_ipython() {
    let s = session();
    let r = ok(&s, "a = [1, 2]\na + [3]");
    assert_eq!(r.stdout, "[1, 2, 3]\n");
    let r = ok(&s, "'text'");
    assert_eq!(r.stdout, "'text'\n");
    let r = ok(&s, "None");
    assert_eq!(r.stdout, "");
    // Only the last statement is displayed, and only if it is an expression.
    let r = ok(&s, "1\nb = 2");
    assert_eq!(r.stdout, "");
    let r = ok(&s, "print('hi')");
    assert_eq!(r.stdout, "hi\n");
}

#[test]
fn stdout_and_stderr_are_captured_per_block() {
    let s = session();
    let r = ok(
        &s,
        "import sys\nprint('out')\nprint('err', file=sys.stderr)",
    );
    assert_eq!(r.stdout, "out\n");
    assert_eq!(r.stderr, "err\n");
    let r = ok(&s, "print('again')");
    assert_eq!(r.stdout, "again\n");
    assert_eq!(r.stderr, "");
}

#[test]
fn variables_assigned_before_an_exception_survive() {
    let s = session();
    let r = s
        .exec("kept = 'yes'\nnums = [1, 2]\n1 / 0\nnever = 1")
        .expect("kernel works");
    let err = r.error.expect("ZeroDivisionError reported");
    assert_eq!(err.type_name, "ZeroDivisionError");
    assert_eq!(err.line, Some(3));
    assert!(r.new_variables.contains(&"kept".to_owned()));
    let r = ok(&s, "print(kept, nums)");
    assert_eq!(r.stdout, "yes [1, 2]\n");
    assert_eq!(s.variable_as_string("never").expect("reads"), None);
}

#[test]
fn traceback_points_at_the_users_line_without_kernel_frames() {
    let s = session();
    ok(&s, "def inner(d):\n    return d['missing']");
    let r = s
        .exec("data = {}\n\nvalue = inner(data)\nprint(value)")
        .expect("kernel works");
    let err = r.error.expect("KeyError reported");
    assert_eq!(err.type_name, "KeyError");
    assert_eq!(err.line, Some(3));
    assert!(err.traceback.contains("line 3"), "{}", err.traceback);
    assert!(
        err.traceback.contains("value = inner(data)"),
        "{}",
        err.traceback
    );
    assert!(
        err.traceback.contains("return d['missing']"),
        "{}",
        err.traceback
    );
    assert!(!err.traceback.contains("rlm-kernel"), "{}", err.traceback);
    assert!(r.stderr.contains("KeyError: 'missing'"), "{}", r.stderr);
}

#[test]
fn syntax_errors_point_at_the_line() {
    let s = session();
    let r = s.exec("x = 1\ny = (2 +\n").expect("kernel works");
    let err = r.error.expect("SyntaxError reported");
    assert_eq!(err.type_name, "SyntaxError");
    assert!(err.line.is_some());
    assert!(!r.stderr.is_empty());
}

#[test]
fn blocks_compiled_from_their_source_or_their_tree_warn_once_and_fail_alike() {
    let s = session();
    // The first is compiled from its source (it ends with an assignment), the second from its
    // tree (it ends with a bare expression, shown): the compiler's warning once in each.
    for (code, shown) in [("x = (1 is 1)", ""), ("x = (1 is 1)\nx", "True\n")] {
        let r = ok(&s, code);
        assert_eq!(r.stdout, shown, "{code:?}");
        assert_eq!(
            r.stderr.matches("SyntaxWarning").count(),
            1,
            "{code:?}: {}",
            r.stderr
        );
    }
    // An error of the compiler (not the parser), either way: the same report (but for the
    // block's file name).
    let reports: Vec<(String, String, Option<u32>)> = ["y = 1\nreturn y", "y = 1\nreturn y\ny"]
        .into_iter()
        .map(|code| {
            let r = s.exec(code).expect("kernel works");
            let err = r.error.expect("SyntaxError reported");
            let message = err.message.replace("block-4>", "block-N>");
            (
                err.type_name,
                message.replace("block-3>", "block-N>"),
                err.line,
            )
        })
        .collect();
    let expected = "'return' outside function (<repl-block-N>, line 2)";
    assert_eq!(
        reports[0],
        ("SyntaxError".to_owned(), expected.to_owned(), Some(2))
    );
    assert_eq!(reports[1], reports[0]);
    // Each block has a stop event of its own, unset, made before it started.
    let r = ok(
        &s,
        "import _rlm_kernel\nfirst = _rlm_kernel._current_session().stop",
    );
    assert_eq!(r.stderr, "");
    let r = ok(
        &s,
        "second = _rlm_kernel._current_session().stop\nprint(first is second, second.is_set())",
    );
    assert_eq!(r.stdout, "False False\n");
}

#[test]
fn sys_exit_and_keyboard_interrupt_do_not_end_the_kernel() {
    let s = session();
    let r = s
        .exec("import sys\nbefore = 1\nsys.exit(3)")
        .expect("kernel works");
    assert_eq!(r.error.expect("reported").type_name, "SystemExit");
    let r = s.exec("exit()").expect("kernel works");
    assert_eq!(r.error.expect("reported").type_name, "SystemExit");
    let r = s.exec("raise KeyboardInterrupt").expect("kernel works");
    assert_eq!(r.error.expect("reported").type_name, "KeyboardInterrupt");
    let r = s.exec("input('name? ')").expect("kernel works");
    assert_eq!(r.error.expect("no stdin").type_name, "EOFError");
    let r = ok(&s, "before + 1");
    assert_eq!(r.stdout, "2\n");
}

#[test]
fn calls_that_would_end_the_process_end_only_the_block() {
    let s = session();
    ok(&s, "import os, signal\nkept = 'state'");
    let cases = [
        ("os._exit(3)", "os._exit(3) would end the whole rlm process"),
        ("os._exit(0)", "like sys.exit(0)"),
        ("os.abort()", "os.abort() would end the whole rlm process"),
        ("os.kill(os.getpid(), signal.SIGTERM)", "SIGTERM) would end"),
        ("os.kill(os.getpid(), signal.SIGKILL)", "SIGKILL) would end"),
        ("os.kill(os.getpid(), signal.SIGSEGV)", "SIGSEGV) would end"),
        ("os.kill(0, signal.SIGTERM)", "os.kill(0, SIGTERM)"),
        (
            "signal.raise_signal(signal.SIGABRT)",
            "signal.raise_signal(SIGABRT)",
        ),
        // `except Exception` does not keep the block going, as with sys.exit().
        (
            "try:\n    os._exit(5)\nexcept Exception:\n    print('swallowed')",
            "os._exit(5)",
        ),
    ];
    for (code, message) in cases {
        let r = s.exec(code).expect("kernel works");
        let err = r.error.unwrap_or_else(|| panic!("{code}: no error"));
        assert_eq!(err.type_name, "ProcessExit", "{code}");
        assert!(err.message.contains(message), "{code}: {}", err.message);
        assert!(
            err.message.contains("the session keeps its variables"),
            "{code}"
        );
        assert!(r.stdout.is_empty(), "{code}: {}", r.stdout);
    }
    assert_eq!(ok(&s, "kept").stdout, "'state'\n");
    // Signal 0 only checks that a process exists; other processes are not ours to guard.
    assert_eq!(ok(&s, "os.kill(os.getpid(), 0)").stdout, "");
}

fn assert_interrupted_in_time(s: &ReplSession, code: &str, limit: Duration) {
    let started = Instant::now();
    let r = s
        .exec(code)
        .unwrap_or_else(|e| panic!("{code}: kernel broke: {e}"));
    let elapsed = started.elapsed();
    assert!(r.timed_out, "{code}: not timed out: {r:?}");
    assert_eq!(r.error.as_ref().expect("error").type_name, "CellTimeout");
    // The code never ends on its own, so returning at all proves the interrupt; the bound only
    // catches an interrupt that lands very late. It is loose on purpose: a loaded 2-core
    // machine delays the watchdog thread by hundreds of milliseconds (speed is benchmarked).
    assert!(
        elapsed < limit + Duration::from_secs(5),
        "{code}: took {elapsed:?} for a limit of {limit:?}"
    );
}

#[test]
fn runaway_loops_and_sleeps_are_interrupted_and_the_session_answers() {
    let limit = Duration::from_millis(500);
    let s = ReplSession::new(config(limit), no_endpoints(), &[]).expect("starts");
    ok(&s, "kept = 'state'");
    assert_interrupted_in_time(&s, "n = 0\nwhile True:\n    n += 1", limit);
    assert_interrupted_in_time(&s, "import time\ntime.sleep(3600)", limit);
    assert_interrupted_in_time(
        &s,
        "while True:\n    try:\n        sum(range(1000))\n    except Exception:\n        pass",
        limit,
    );
    assert_interrupted_in_time(
        &s,
        "while True:\n    try:\n        time.sleep(0.01)\n    except BaseException:\n        pass",
        limit,
    );
    assert_interrupted_in_time(
        &s,
        "def spin():\n    while True:\n        try:\n            pass\n        except:\n            pass\nspin()",
        limit,
    );
    let r = ok(&s, "print(kept, n > 0)");
    assert_eq!(r.stdout, "state True\n");
}

#[test]
fn sleeping_threads_started_by_a_block_are_woken_too() {
    let limit = Duration::from_millis(400);
    let s = ReplSession::new(config(limit), no_endpoints(), &[]).expect("starts");
    let code = "import threading, time\nt = threading.Thread(target=time.sleep, args=(3600,))\nt.start()\nt.join()";
    assert_interrupted_in_time(&s, code, limit);
    let r = ok(&s, "t.join(5)\nt.is_alive()");
    assert_eq!(r.stdout, "False\n");
}

#[test]
fn cancelling_the_session_token_interrupts_the_block() {
    let s = ReplSession::new(config(Duration::from_secs(30)), no_endpoints(), &[]).expect("starts");
    let token = s.cancel_token();
    // Cancel once the block runs (a token cancelled before the block starts does not stop it).
    let dir = tempfile::tempdir().expect("temp dir");
    let started_flag = dir.path().join("started");
    let canceller = {
        let started_flag = started_flag.clone();
        std::thread::spawn(move || {
            while !started_flag.exists() {
                std::thread::sleep(Duration::from_millis(10));
            }
            token.cancel();
        })
    };
    let started = Instant::now();
    let code = format!(
        "import time\nopen({:?}, 'w').close()\ntime.sleep(60)",
        started_flag.display().to_string()
    );
    let r = s.exec(&code).expect("kernel works");
    canceller.join().expect("joins");
    // Well under the block's 60 s: it was stopped, not waited out (not a speed check).
    assert!(started.elapsed() < Duration::from_secs(30));
    assert_eq!(r.error.expect("stopped").type_name, "CellCancelled");
    assert!(!r.timed_out);
    // Later blocks still run.
    assert_eq!(ok(&s, "1 + 1").stdout, "2\n");
}

#[test]
fn interrupt_stops_only_the_running_block() {
    let s = Arc::new(
        ReplSession::new(config(Duration::from_secs(30)), no_endpoints(), &[]).expect("starts"),
    );
    assert!(!s.interrupt(), "nothing is running");
    ok(&s, "kept = 'state'");
    let handle = Arc::clone(&s);
    // Interrupts as soon as a block runs: `interrupt` says whether one was (no fixed sleep).
    let interrupter = std::thread::spawn(move || {
        while !handle.interrupt() {
            std::thread::sleep(Duration::from_millis(10));
        }
    });
    let started = Instant::now();
    let r = s.exec("import time\ntime.sleep(60)").expect("kernel works");
    interrupter.join().expect("joins");
    // Well under the block's 60 s: it was stopped, not waited out (not a speed check).
    assert!(started.elapsed() < Duration::from_secs(30));
    assert_eq!(r.error.expect("stopped").type_name, "CellCancelled");
    // Unlike the session token, an interrupt does not outlive its block.
    assert!(!s.cancel_token().is_cancelled());
    assert_eq!(ok(&s, "kept").stdout, "'state'\n");
    let r = ok(&s, "time.sleep(0.3)\n'slept'");
    assert_eq!(r.stdout, "'slept'\n", "the next block is not interrupted");
}

#[test]
fn output_is_bounded_head_and_tail() {
    let s = ReplSession::new(
        kernel::repl::SessionConfig {
            max_output_chars: 1000,
            ..config(Duration::from_secs(60))
        },
        no_endpoints(),
        &[],
    )
    .expect("starts");
    // ~200 MB of output through print: memory stays bounded, head and tail are kept.
    let r = ok(
        &s,
        "line = 'x' * 9999\nprint('FIRST')\nfor i in range(20000):\n    print(line)\nprint('LAST')",
    );
    assert!(r.stdout.starts_with("FIRST\n"), "{}", &r.stdout[..50]);
    assert!(r.stdout.ends_with("LAST\n"));
    assert!(r.stdout.contains("characters omitted"));
    assert!(r.stdout.chars().count() < 1100);
    assert_eq!(r.stdout_omitted_chars, 6 + 20000 * 10000 + 5 - 1000);
}

#[test]
fn reserved_names_are_restored_and_user_names_untouched() {
    let s = session_with(&[ContextSource::Text("the context".into())]);
    let r = ok(
        &s,
        "context = 'mine'\nllm_query = None\ndel FINAL_VAR\nanswer = 5\nmy_var = 1\ncontext_0 = 2",
    );
    for name in ["context", "llm_query", "FINAL_VAR", "context_0"] {
        assert!(
            r.stderr.contains(&format!("`{name}` is reserved")),
            "{}",
            r.stderr
        );
    }
    assert!(
        r.stderr.contains("`answer` must stay a dict; it was int"),
        "{}",
        r.stderr
    );
    let r = ok(
        &s,
        "print(context, context_0 is context, callable(llm_query), callable(FINAL_VAR), answer['ready'], my_var)",
    );
    assert_eq!(r.stdout, "the context True True True False 1\n");
    assert!(r.stderr.is_empty(), "{}", r.stderr);
}

#[test]
fn answer_dict_records_the_final_answer_when_ready() {
    let s = session();
    let r = ok(&s, "answer['content'] = 'draft'");
    assert_eq!(r.final_answer(), None);
    let r = ok(
        &s,
        "answer['content'] = [1, 2]\nanswer['ready'] = True\nx = 1",
    );
    let fa = r.final_answer().expect("recorded");
    assert_eq!(fa.value, "[1, 2]");
    assert_eq!(fa.source, FinalSource::AnswerDict);
    // Later changes in the same block do not alter the recorded answer.
    let s = session();
    let r = ok(
        &s,
        "answer['content'] = 'at that moment'\nanswer['ready'] = True\nanswer['content'] = 'later'",
    );
    assert_eq!(r.final_answer().expect("recorded").value, "at that moment");
    // Ready first, content after: the first content written while ready counts.
    let s = session();
    let r = ok(&s, "answer['ready'] = True\nanswer['content'] = 'late'");
    assert_eq!(r.final_answer().expect("recorded").value, "late");
    // update() bypasses __setitem__; checked after the block.
    let s = session();
    let r = ok(&s, "answer.update(content='via update', ready=True)");
    assert_eq!(r.final_answer().expect("recorded").value, "via update");
}

#[test]
fn a_rebound_answer_mapping_is_the_answer_slot() {
    // Name, blocks in order, the answer recorded by the last block, a note the blocks print.
    type Case<'a> = (&'a str, &'a [&'a str], Option<&'a str>, Option<&'a str>);
    let cases: &[Case<'_>] = &[
        (
            "rebound, then ready in a later block",
            &[
                "answer = {'content': 'later', 'ready': False}",
                "answer['ready'] = True",
            ],
            Some("later"),
            None,
        ),
        (
            "rebound with ready already true",
            &["answer = {'content': 'now', 'ready': True}"],
            Some("now"),
            None,
        ),
        (
            "rebound to a dict the code keeps another name for",
            &[
                "d = {'content': '', 'ready': False}\nanswer = d",
                "d['content'] = 'via d'\nd['ready'] = True",
            ],
            Some("via d"),
            None,
        ),
        (
            "rebound to another kind of mapping",
            &[
                "import collections\nanswer = collections.OrderedDict(content='ordered')",
                "answer['ready'] = 1",
            ],
            Some("ordered"),
            None,
        ),
        (
            "an adopted dict that was ready is not recorded again",
            &["answer = {'content': 'once', 'ready': True}", "x = 1"],
            None,
            None,
        ),
        (
            "deleting an adopted dict puts it back",
            &[
                "answer = {'content': 'kept', 'ready': False}",
                "del answer",
                "answer['ready'] = True",
            ],
            Some("kept"),
            Some("`answer` is reserved by the REPL and was restored"),
        ),
        (
            "rebound to a non-mapping: a fresh dict and a note",
            &[
                "answer['content'] = 'old'\nanswer = 'done'",
                "answer['ready'] = True",
            ],
            Some(""),
            Some("`answer` must stay a dict; it was str, so it was reset"),
        ),
        (
            "after the reset the fresh dict finishes as usual",
            &[
                "answer = 5",
                "answer['content'] = 'fresh'\nanswer['ready'] = True",
            ],
            Some("fresh"),
            Some("`answer` must stay a dict; it was int"),
        ),
    ];
    for (name, blocks, want, note) in cases {
        let s = session();
        let results: Vec<_> = blocks.iter().map(|code| ok(&s, code)).collect();
        let last = results.last().expect("one block at least");
        let got = last
            .final_answers
            .iter()
            .find(|a| a.source == FinalSource::AnswerDict)
            .map(|a| a.value.as_str());
        assert_eq!(got, *want, "case: {name}");
        let stderr: String = results.iter().map(|r| r.stderr.as_str()).collect();
        match note {
            Some(note) => assert!(stderr.contains(note), "case: {name}: {stderr}"),
            None => assert!(stderr.is_empty(), "case: {name}: {stderr}"),
        }
    }
}

#[test]
fn a_new_run_gets_the_sessions_own_answer_dict_back() {
    let s = session();
    ok(&s, "answer = {'content': 'old run', 'ready': True}");
    s.reset_answer().expect("reset");
    let r = ok(&s, "print(type(answer).__name__, answer)");
    assert_eq!(r.stdout, "AnswerDict {'content': '', 'ready': False}\n");
    let r = ok(&s, "x = 1");
    assert_eq!(r.final_answer(), None);
}

#[test]
fn each_convention_keeps_its_own_final_answer() {
    let s = session();
    let r = ok(
        &s,
        "FINAL_VAR(1)\nanswer['content'] = 'dict'\nanswer['ready'] = True\nFINAL_VAR(2)",
    );
    let got: Vec<(FinalSource, &str)> = r
        .final_answers
        .iter()
        .map(|a| (a.source, a.value.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            (FinalSource::FinalVar, "2"),
            (FinalSource::AnswerDict, "dict")
        ],
        "FINAL_VAR keeps its last value, in the slot it first took"
    );
    assert_eq!(
        ok(&s, "x = 1").final_answers,
        [],
        "a new block starts empty"
    );
}

#[test]
fn final_var_records_a_value_or_a_named_variable() {
    // Code, the answer recorded, what the call returned (printed), a text on stderr.
    let cases: &[(&str, Option<&str>, &str, Option<&str>)] = &[
        (
            "FINAL_VAR('result')",
            Some("{'total': 3}"),
            "{'total': 3}",
            None,
        ),
        (
            "FINAL_VAR(' result ')",
            Some("{'total': 3}"),
            "{'total': 3}",
            None,
        ),
        (
            "FINAL_VAR('\"result\"')",
            Some("{'total': 3}"),
            "{'total': 3}",
            None,
        ),
        (
            "FINAL_VAR(result)",
            Some("{'total': 3}"),
            "{'total': 3}",
            None,
        ),
        ("FINAL_VAR(6 * 7)", Some("42"), "42", None),
        ("FINAL_VAR(None)", Some("None"), "None", None),
        // A str variable passed itself (not its name) is its value.
        (
            "FINAL_VAR(words)",
            Some("three little words"),
            "three little words",
            None,
        ),
        (
            "FINAL_VAR('reslt')",
            None,
            "Error: FINAL_VAR('reslt') names no variable `reslt`, so no final answer was recorded. \
             Your variables: `result`, `other`, `words`. Assign the answer to a variable first, then call \
             FINAL_VAR with its name.",
            Some("names no variable `reslt`"),
        ),
        (
            "FINAL_VAR('plain words')",
            None,
            "Error: FINAL_VAR('plain words') names no variable `plain words`",
            Some("Your variables: `result`, `other`, `words`."),
        ),
        (
            "FINAL_VAR('')",
            None,
            "Error: FINAL_VAR('') names no variable ``",
            Some("no final answer was recorded"),
        ),
    ];
    for (call, recorded, returned, stderr) in cases {
        let s = session();
        ok(
            &s,
            "result = {'total': 3}\nother = 1\nwords = 'three little words'",
        );
        let r = ok(&s, &format!("print({call})"));
        assert_eq!(
            r.final_answer().map(|a| a.value.as_str()),
            *recorded,
            "{call}"
        );
        if let Some(fa) = r.final_answer() {
            assert_eq!(fa.source, FinalSource::FinalVar);
        }
        assert!(r.stdout.starts_with(returned), "{call}: {}", r.stdout);
        match stderr {
            Some(text) => assert!(r.stderr.contains(text), "{call}: {}", r.stderr),
            None => assert!(r.stderr.is_empty(), "{call}: {}", r.stderr),
        }
    }
}

#[test]
fn a_block_end_notes_the_answer_first_restores_reserved_names_and_lists_new_variables() {
    let s = session();
    let r = ok(&s, "llm_query = 1\nanswer = 2\nkept = 3");
    let answer = r
        .stderr
        .find("`answer` must stay a dict; it was int")
        .expect("the answer's note");
    let other = r
        .stderr
        .find("`llm_query` is reserved by the REPL and was restored")
        .expect("the other reserved name's note");
    assert!(answer < other, "{}", r.stderr);
    assert_eq!(r.new_variables, ["kept"]);
    let names: Vec<_> = r.variables.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(names, ["kept"]);
    let r = ok(
        &s,
        "answer['content'] = 'done'\nanswer['ready'] = True\nprint(callable(llm_query))",
    );
    assert_eq!(r.stdout, "True\n");
    assert!(r.new_variables.is_empty(), "{:?}", r.new_variables);
    let finals: Vec<_> = r
        .final_answers
        .iter()
        .map(|a| (a.source, a.value.as_str()))
        .collect();
    assert_eq!(finals, [(FinalSource::AnswerDict, "done")]);
}

#[test]
fn show_vars_and_variables_list_user_variables() {
    let s = session_with(&[ContextSource::Text("ctx".into())]);
    let r = ok(
        &s,
        "import json\nnames = ['a', 'b', 'c']\n_hidden = 1\ncount = 3\nSHOW_VARS()",
    );
    assert!(r.stdout.contains("names"), "{}", r.stdout);
    assert!(r.stdout.contains("len=3"), "{}", r.stdout);
    assert!(!r.stdout.contains("_hidden"));
    assert!(!r.stdout.contains("context"));
    assert!(!r.stdout.contains("json"));
    let names: Vec<_> = r.variables.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(names, ["names", "count"]);
    assert_eq!(r.new_variables, ["names", "count"]);
    let names_var = &r.variables[0];
    assert_eq!(names_var.type_name, "list");
    assert_eq!(names_var.size, Some(3));
    assert_eq!(names_var.preview, "['a', 'b', 'c']");
    assert_eq!(s.variables().expect("lists"), r.variables);
    let big = ok(&s, "big = 'z' * 10_000_000");
    let info = big
        .variables
        .iter()
        .find(|v| v.name == "big")
        .expect("listed");
    assert_eq!(info.size, Some(10_000_000));
    assert!(info.preview.len() < 100);
}

#[test]
fn sessions_are_independent_and_run_concurrently() {
    let limit = Duration::from_millis(600);
    let slow = ReplSession::new(config(limit), no_endpoints(), &[]).expect("starts");
    let fast = session();
    ok(&fast, "who = 'fast'");
    ok(&slow, "who = 'slow'");
    std::thread::scope(|scope| {
        let handle = scope.spawn(|| slow.exec("while True: pass").expect("kernel works"));
        // The other session keeps answering while one spins.
        for _ in 0..5 {
            assert_eq!(ok(&fast, "who").stdout, "'fast'\n");
        }
        let r = handle.join().expect("joins");
        assert!(r.timed_out);
    });
    assert_eq!(ok(&slow, "who").stdout, "'slow'\n");
}

#[test]
fn a_caller_holding_the_gil_does_not_deadlock() {
    use pyo3::prelude::*;
    let _ = session(); // initialises the interpreter
    // Like a Python extension calling into the kernel: the GIL is held throughout.
    let s = Python::attach(|_py| session());
    let out = Python::attach(|_py| s.exec("6 * 7").expect("kernel works").stdout);
    assert_eq!(out, "42\n");
    Python::attach(|_py| drop(s));
}

#[test]
fn hostile_objects_never_break_the_session() {
    let limit = Duration::from_millis(500);
    let s = ReplSession::new(config(limit), no_endpoints(), &[]).expect("starts");
    // Non-str keys in the namespace are not variables, and do not break later blocks.
    ok(&s, "globals().update({1: 'one'})\nkept = 'state'");
    assert_eq!(ok(&s, "kept").stdout, "'state'\n");
    assert!(
        s.variables()
            .expect("lists")
            .iter()
            .any(|v| v.name == "kept")
    );

    // An exception whose __str__ raises is still described.
    let r = s
        .exec("class E(Exception):\n    def __str__(self):\n        raise RuntimeError('no')\nraise E()")
        .expect("kernel works");
    assert_eq!(r.error.expect("raised").type_name, "E");

    // A `ready` whose truth value raises: an error in the user's block, not the kernel's.
    let r = s
        .exec("class B:\n    def __bool__(self):\n        raise ValueError('ambiguous')\nanswer['content'] = 'x'\nanswer['ready'] = B()")
        .expect("kernel works");
    assert_eq!(r.final_answer(), None);
    assert_eq!(r.error.expect("raised").type_name, "ValueError");

    // __repr__ and __str__ that never return: listing skips them, str() is interrupted.
    ok(
        &s,
        "class Loop:\n    def __repr__(self):\n        while True: pass\n    __str__ = __repr__\nitems = [Loop()]\nloop = Loop()",
    );
    let listed = s.variables().expect("lists");
    let items = listed.iter().find(|v| v.name == "items").expect("items");
    assert_eq!(items.preview, "[<Loop object>]");
    let started = Instant::now();
    let text = s
        .variable_as_string("loop")
        .expect("kernel works")
        .expect("set");
    assert!(text.contains("failed"), "{text}");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(
        ok(&s, "kept").stdout,
        "'state'\n",
        "the session still answers"
    );
}

#[test]
fn exception_text_is_bounded() {
    let s = session();
    let r = s.exec("float('x' * 5_000_000)").expect("kernel works");
    let error = r.error.expect("raised");
    assert!(error.message.len() < 3_000, "{}", error.message.len());
    assert!(error.traceback.len() < 25_000, "{}", error.traceback.len());
    assert!(error.message.contains("characters omitted"));
}

#[test]
fn an_internal_failure_mid_block_still_ends_the_block() {
    let s = session();
    // Break the support code the kernel calls after user code, from inside a block: the block
    // fails with an internal error after its output was routed to the block's capture.
    let err = s
        .exec(
            "import sys, _rlm_kernel\n\
             sys._probe_session = _rlm_kernel._current_session()\n\
             sys._saved_check = _rlm_kernel.settle_answer\n\
             def _boom(*args):\n    raise RuntimeError('support code broke')\n\
             _rlm_kernel.settle_answer = _boom",
        )
        .expect_err("the support code failed");
    assert!(err.to_string().contains("support code broke"), "{err}");
    // Output is no longer routed to the dead block's capture.
    pyo3::Python::attach(|py| {
        use pyo3::types::PyAnyMethods as _;
        let routed = py
            .import("sys")
            .and_then(|sys| sys.getattr("_probe_session"))
            .and_then(|session| session.getattr("stdout"))
            .expect("probe");
        assert!(routed.is_none(), "stdout still routed to the failed block");
    });
    // The session still works once the support code is repaired.
    ok(
        &s,
        "import sys, _rlm_kernel\n_rlm_kernel.settle_answer = sys._saved_check",
    );
    assert_eq!(ok(&s, "print('fine')").stdout, "fine\n");
}

/// A host interpreter (the Python package) has threads that hold the GIL when they first ask
/// for the kernel. Two of them racing to set it up must not deadlock: with a plain `OnceLock`
/// the one holding the GIL waited for the other, which waited for the GIL.
#[test]
fn two_threads_racing_to_set_up_the_kernel_do_not_deadlock() {
    // CPython runs, the kernel is not set up yet (nextest runs each test in its own process).
    pyo3::Python::initialize();
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let outcome = pyo3::Python::attach(|_py| {
            let other = std::thread::spawn(|| session().exec("1 + 1").map(|r| r.stdout));
            // Let the other thread enter the set-up, then ask for the kernel while still
            // holding the GIL.
            std::thread::sleep(Duration::from_millis(300));
            let mine = session().exec("2 + 2").map(|r| r.stdout);
            (mine, other)
        });
        let (mine, other) = outcome;
        let other = other.join().expect("the other thread finishes");
        let _ = done_tx.send((mine, other));
    });
    let (mine, other) = done_rx
        .recv_timeout(Duration::from_secs(60))
        .expect("both threads got the kernel: no deadlock");
    assert_eq!(mine.expect("runs"), "4\n");
    assert_eq!(other.expect("runs"), "2\n");
}

#[test]
fn the_namespace_is_its_own_module_so_definitions_pickle_by_reference() {
    let s = session();
    ok(
        &s,
        "import pickle, sys\ndef f(x):\n    return x + 1\ng = lambda y: y * 2\nclass C:\n    pass",
    );
    let r = ok(
        &s,
        "same = [pickle.loads(pickle.dumps(o)) is o for o in (f, g, C, C())[:3]]\n\
         own = sys.modules[__name__] is not sys.modules['__main__'] and __name__.startswith('__rlm_session_')\n\
         guard = __name__ == '__main__'\n\
         print(same, own, guard, g.__name__, g(4))",
    );
    assert_eq!(r.stdout, "[True, True, True] True True g 8\n");
    // Written another way, the comparison still holds: `__name__` in letters that normalise
    // to it (the compiler's NFKC), and `__main__` written with an escape.
    let r = ok(
        &s,
        "print(__\u{ff4e}\u{ff41}\u{ff4d}\u{ff45}__ == '__main__')",
    );
    assert_eq!(r.stdout, "True\n");
    let r = ok(&s, "print('\\x5f_main__' != __name__)");
    assert_eq!(r.stdout, "False\n");
}

/// Whether `pid` is a live process (a zombie has ended).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        let state = stat.rsplit_once(") ").map(|(_, rest)| rest.chars().next());
        !matches!(state, Some(Some('Z' | 'X')))
    })
}

#[test]
fn end_processes_stops_what_blocks_started_and_nothing_else() {
    let mut host = std::process::Command::new("sleep")
        .arg("300")
        .spawn()
        .expect("sleep starts");
    let s = session();
    let r = ok(
        &s,
        "import subprocess\nsleeper = subprocess.Popen(['sleep', '300'])\nprint(sleeper.pid)",
    );
    let pid: u32 = r.stdout.trim().parse().expect("a pid");
    assert!(running(pid));
    s.end_processes().expect("ends");
    assert!(!running(pid), "the block's subprocess still runs");
    assert!(running(host.id()), "the host's own process was touched");
    let _ = host.kill();
    let _ = host.wait();
}

#[test]
fn every_way_a_block_starts_a_process_is_tracked_though_quiet_blocks_scan_nothing() {
    let s = session();
    // Blocks that start nothing come first and in between: tracking must not depend on a
    // scan at the start of every block.
    ok(&s, "x = 1");
    let code = r#"
import ctypes, os, subprocess, threading
pids = [subprocess.Popen(["sleep", "300"]).pid]
pids.append(os.posix_spawn("/bin/sleep", ["sleep", "300"], os.environ))
child = os.fork()
if child == 0:
    os.execv("/bin/sleep", ["sleep", "300"])
pids.append(child)
libc = ctypes.CDLL(None)
raw = libc.fork()
if raw == 0:
    os.execv("/bin/sleep", ["sleep", "300"])
pids.append(raw)
def start():
    pids.append(subprocess.Popen(["sleep", "300"]).pid)
t = threading.Thread(target=start)
t.start()
t.join()
print(" ".join(map(str, pids)))
"#;
    let r = ok(&s, code);
    let pids: Vec<u32> = r
        .stdout
        .split_whitespace()
        .map(|p| p.parse().expect("a pid"))
        .collect();
    assert_eq!(pids.len(), 5, "{}", r.stdout);
    ok(&s, "y = 2");
    assert!(pids.iter().all(|&pid| running(pid)), "{pids:?}");
    s.end_processes().expect("ends");
    let left: Vec<u32> = pids.into_iter().filter(|&pid| running(pid)).collect();
    assert!(left.is_empty(), "still running: {left:?}");
}

/// Python for the two tests below: `mid_scan.arm(tid, release)` makes the thread `tid` (which
/// waits on the event `release`) leave the process in the middle of the next scan of `/proc`,
/// at its second open of a `/proc` file, and waits (at most 10 s) until it has. A child that
/// thread started then moves to another thread of the process, possibly one already read.
const MID_SCAN: &str = r#"
import os, sys, threading, time
class MidScan:
    def __init__(self):
        self.armed, self.opens, self.fired = None, 0, False
        sys.addaudithook(self.hook)
    def arm(self, tid, release):
        self.opens, self.fired, self.armed = 0, False, (tid, release)
    def hook(self, event, args):
        if event != 'open' or self.armed is None or not str(args[0]).startswith('/proc/'):
            return
        self.opens += 1
        if self.opens < 2:
            return
        (tid, release), self.armed = self.armed, None
        release.set()
        deadline, pause = time.monotonic() + 10, threading.Event()
        while os.path.exists(f'/proc/self/task/{tid}') and time.monotonic() < deadline:
            pause.wait(0.005)
        self.fired = not os.path.exists(f'/proc/self/task/{tid}')
mid_scan = MidScan()
box, started, release = {}, threading.Event(), threading.Event()
def start_and_wait():
    import subprocess
    box['tid'] = threading.get_native_id()
    box['pid'] = subprocess.Popen(['sleep', '300']).pid
    started.set()
    release.wait(30)
"#;

/// Kills and reaps `pid` if it still runs (a test's own clean-up, whatever the product did).
const REAP: &str = "import os, signal\ntry:\n    os.kill(PID, signal.SIGKILL)\n    \
                    os.waitpid(PID, 0)\nexcept OSError:\n    pass";

#[test]
fn a_process_whose_thread_exits_while_the_block_is_settled_is_still_tracked() {
    let s = session();
    ok(&s, MID_SCAN);
    // A thread of the block starts a process, and exits while the block's processes are
    // being listed: its child moves to the process's first thread, already read by then.
    let r = ok(
        &s,
        "t = threading.Thread(target=start_and_wait)\nt.start()\nstarted.wait(30)\n\
         mid_scan.arm(box['tid'], release)\nprint(box['pid'])",
    );
    let pid: u32 = r.stdout.trim().parse().expect("a pid");
    let fired = ok(&s, "t.join(30)\nprint(mid_scan.fired, t.is_alive())").stdout;
    assert!(running(pid));
    s.end_processes().expect("ends");
    let left = running(pid);
    ok(&s, &REAP.replace("PID", &pid.to_string()));
    assert_eq!(fired, "True False\n", "the thread did not exit mid-scan");
    assert!(
        !left,
        "the process {pid} of the block still runs after `end_processes`"
    );
}

#[test]
fn a_host_process_whose_thread_exits_while_a_block_lists_processes_is_left_alone() {
    let s = session();
    ok(&s, MID_SCAN);
    // A thread that is not the session's (the host's: no session owns it) starts a process.
    let r = ok(
        &s,
        "import _thread\n_thread.start_new_thread(start_and_wait, ())\nstarted.wait(30)\n\
         print(box['pid'])",
    );
    let host: u32 = r.stdout.trim().parse().expect("a pid");
    // A block about to start a process notes the processes that exist; the host's thread
    // exits in the middle of that and its child moves to a thread already read.
    let fired = ok(
        &s,
        "import subprocess\nmid_scan.arm(box['tid'], release)\nsubprocess.run(['true'])\n\
         print(mid_scan.fired)",
    )
    .stdout;
    s.end_processes().expect("ends");
    let alive = running(host);
    ok(&s, &REAP.replace("PID", &host.to_string()));
    assert_eq!(fired, "True\n", "the thread did not exit mid-scan");
    assert!(
        alive,
        "the host's process {host} was taken for the block's and ended"
    );
}

/// A session that used multiprocessing's locks releases their named semaphores when it
/// closes, though they sit in a reference cycle: its close collects them (a session that
/// never ran a block with those locks loaded skips that full collection).
#[test]
fn a_closed_session_releases_the_semaphores_its_namespace_held_in_a_cycle() {
    let s = session();
    let r = ok(
        &s,
        "import multiprocessing as mp\nlock = mp.get_context('spawn').Lock()\n\
         cycle = [lock]\ncycle.append(cycle)\nprint(lock._semlock.name)",
    );
    let name = r.stdout.trim().trim_start_matches('/');
    assert!(!name.is_empty(), "{r:?}");
    let semaphore = std::path::Path::new("/dev/shm").join(format!("sem.{name}"));
    assert!(semaphore.exists(), "{} is missing", semaphore.display());
    drop(s);
    assert!(
        !semaphore.exists(),
        "{} is still there after the session closed",
        semaphore.display()
    );
}

/// A session whose code started multiprocessing's forkserver preloading a module of `dir` that sleeps `seconds` at the forkserver's exit, then leaves `exited` in
/// `dir` (`atexit` runs last in, first out), so that the last session's close takes that long
/// to end multiprocessing.
fn session_with_a_slow_forkserver(dir: &std::path::Path, seconds: u32) -> ReplSession {
    std::fs::write(
        dir.join("rlm_slow_exit.py"),
        format!(
            "import atexit, pathlib, time\n\
             atexit.register(pathlib.Path(__file__).with_name('exited').touch)\n\
             atexit.register(time.sleep, {seconds})\n"
        ),
    )
    .expect("module written");
    let s = session();
    // Python 3.11's forkserver does not take the parent's `sys.path`: `PYTHONPATH` finds it.
    ok(
        &s,
        &format!(
            "import multiprocessing, os\nos.environ['PYTHONPATH'] = {:?}\n\
             forkserver = multiprocessing.get_context('forkserver')\n\
             forkserver.set_forkserver_preload(['rlm_slow_exit'])\n\
             with forkserver.Pool(1) as pool:\n    assert pool.map(abs, [-1]) == [1]\n\
             forkserver.set_forkserver_preload(['__main__'])\ndel os.environ['PYTHONPATH']",
            dir.to_str().expect("utf-8")
        ),
    );
    s
}

/// The last session's close stops multiprocessing's forkserver and runs its exit finalizers
/// (which terminate every pool still registered and remove its folder from `TMPDIR`): a
/// session created meanwhile waits for that end instead of losing its pool to it. The window
/// is widened: the forkserver takes 2 s to exit (a module it preloads sleeps at its exit),
/// and the second session, created 0.5 s into the first one's close, maps on a pool of its
/// own for 4 s.
#[test]
fn a_session_created_while_the_last_one_ends_multiprocessing_keeps_its_pool() {
    let dir = tempfile::tempdir().expect("tempdir");
    let first = session_with_a_slow_forkserver(dir.path(), 2);
    let closing = std::thread::spawn(move || drop(first));
    std::thread::sleep(Duration::from_millis(500));
    let second = session();
    let r = ok(
        &second,
        "import multiprocessing, time\nmaps = 0\n\
         with multiprocessing.get_context('spawn').Pool(2) as pool:\n\
         \x20   until = time.monotonic() + 4\n\
         \x20   while time.monotonic() < until and maps < 100_000:\n\
         \x20       assert pool.map_async(abs, range(-8, 0)).get(timeout=10) == list(range(8, 0, -1))\n\
         \x20       maps += 1\n\
         print(maps > 0)",
    );
    assert_eq!(r.stdout, "True\n");
    closing.join().expect("the first session closed");
}

/// Whether `done` holds within `limit`, looking every 20 ms.
fn within(limit: Duration, done: impl Fn() -> bool) -> bool {
    let until = Instant::now() + limit;
    while !done() {
        if Instant::now() >= until {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// Whether process `pid` is gone (or a zombie, holding nothing), as `/proc` shows it.
fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit(") ")
            .next()
            .is_some_and(|state| state.starts_with('Z')),
        Err(_) => true,
    }
}

/// The wait of a session's start for the last one's end of multiprocessing is bounded: an end
/// that runs long (here a finalizer the user's code registered waits 6 s; the end bounds only
/// its own waits, see the next tests) does not hold up every session started meanwhile.
#[test]
fn a_session_start_waits_a_bounded_time_for_the_last_ones_end_of_multiprocessing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ended = dir.path().join("ended");
    let first = session();
    ok(
        &first,
        &format!(
            "import multiprocessing.util, pathlib, sys, threading\n\
             sys.modules['_rlm_kernel']._END_WAIT_S = 0.5\n\
             # Finalizers of one priority run last in, first out.\n\
             multiprocessing.util.Finalize(None, pathlib.Path({ended:?}).touch, exitpriority=0)\n\
             pause = threading.Event().wait\n\
             multiprocessing.util.Finalize(None, pause, args=(6,), exitpriority=0)"
        ),
    );
    let closing = std::thread::spawn(move || drop(first));
    std::thread::sleep(Duration::from_millis(500));
    let started = Instant::now();
    let second = session();
    let waited = started.elapsed();
    // The end takes ~6 s from the first close; the start gives up after 0.5 s.
    assert!(
        waited < Duration::from_secs(4),
        "the start waited {waited:?}"
    );
    ok(
        &second,
        "import sys\nsys.modules['_rlm_kernel']._END_WAIT_S = 30.0",
    );
    closing.join().expect("the first session closed");
    assert!(
        within(Duration::from_secs(20), || ended.exists()),
        "the slow end never finished"
    );
}

/// The last session's end of multiprocessing waits a bounded time for the forkserver to exit.
/// A process forked after the forkserver started holds a copy of the pipe whose closing ends
/// it: here a double fork's daemon, which no session tracks (its parent ended in the block),
/// kept the forkserver running for ever, and the end waiting on it (the close's caller gives
/// up after 2 s; the forkserver and its folder were left, and every later session's start
/// waited `_END_WAIT_S` for that end). The daemon holds the resource tracker's pipe too.
/// After `_END_WAIT_S` (0.5 s here) both are killed and reaped, the folder removed, and stderr
/// names the daemon (the user's: it runs on); the next session starts at once, and starts
/// helpers of its own.
#[test]
fn the_last_sessions_close_kills_a_forkserver_that_a_forgotten_process_keeps_running() {
    let dir = tempfile::tempdir().expect("tempdir");
    let said = dir.path().join("stderr");
    let first = session();
    let r = ok(
        &first,
        &format!(
            "import multiprocessing.forkserver, multiprocessing.resource_tracker\n\
             import multiprocessing.util, os, sys, time\n\
             sys.modules['_rlm_kernel']._END_WAIT_S = 0.5\n\
             sys.rlm_test_stderr = sys.__stderr__\n\
             sys.__stderr__ = open({said:?}, 'w', buffering=1)\n\
             with multiprocessing.get_context('forkserver').Pool(1) as pool:\n\
             \x20   assert pool.map(abs, [-1]) == [1]\n\
             r, w = os.pipe()\n\
             child = os.fork()\n\
             if child == 0:\n\
             \x20   daemon = os.fork()\n\
             \x20   if daemon == 0:\n\
             \x20       time.sleep(60)\n\
             \x20   else:\n\
             \x20       os.write(w, str(daemon).encode())\n\
             else:\n\
             \x20   os.close(w)\n\
             \x20   os.waitpid(child, 0)\n\
             \x20   daemon = int(os.read(r, 32))\n\
             \x20   tracker = multiprocessing.resource_tracker._resource_tracker._pid\n\
             \x20   print(daemon, multiprocessing.forkserver._forkserver._forkserver_pid, tracker)\n\
             \x20   print(multiprocessing.util.get_temp_dir())"
        ),
    );
    let mut lines = r.stdout.lines();
    let pids: Vec<u32> = lines
        .next()
        .expect("pids printed")
        .split(' ')
        .map(|pid| pid.parse().expect("a pid"))
        .collect();
    let (daemon, forkserver, tracker) = (pids[0], pids[1], pids[2]);
    let folder = std::path::PathBuf::from(lines.next().expect("folder printed"));
    assert!(folder.is_dir(), "{r:?}");
    drop(first);
    // 0.5 s for the forkserver, 1 s for it to die of SIGTERM; on a busy machine, far more.
    assert!(
        within(Duration::from_secs(15), || {
            gone(forkserver) && gone(tracker) && !folder.exists()
        }),
        "the forkserver {forkserver}, the resource tracker {tracker} or the folder {} is left",
        folder.display()
    );
    let second = session();
    let r = ok(
        &second,
        &format!(
            "import multiprocessing, os, sys\n\
             sys.__stderr__.close()\n\
             sys.__stderr__ = sys.rlm_test_stderr\n\
             os.kill({daemon}, 9)\n\
             with multiprocessing.get_context('forkserver').Pool(1) as pool:\n\
             \x20   print(pool.map(abs, [-2]))"
        ),
    );
    assert_eq!(r.stdout, "[2]\n");
    // One line: the end's; the second session's start did not wait for it (that says so).
    let said = std::fs::read_to_string(&said).expect("stderr file");
    assert_eq!(said.matches("rlm: ").count(), 1, "{said}");
    assert!(
        said.contains(&format!(
            "forkserver (pid {forkserver}) and resource tracker (pid {tracker}) did not exit \
             within 0.5 s"
        )) && said.contains(&format!("still held by pid {daemon} "))
            && said.contains(&format!("`kill {daemon}`")),
        "{said}"
    );
    // The daemon is init's child: a zombie once killed, holding nothing.
    assert!(
        within(Duration::from_secs(10), || gone(daemon)),
        "the daemon {daemon} still runs"
    );
}

/// A session's close terminates the pools its blocks left open through their own finalizer,
/// which sends the workers SIGTERM and then joins them without a bound: a worker that ignores
/// SIGTERM (here a task that does, then sleeps 60 s, after which the worker waits for ever for
/// a next task, on the pool's queue lock that the finalizer took) held the close, and the
/// thread that dropped the session, for ever. It is killed after 1 s, and the next session's
/// pools work.
#[test]
fn a_sessions_close_kills_a_pool_worker_that_ignores_sigterm() {
    let first = session();
    let r = ok(
        &first,
        "import multiprocessing, select, signal\n\
         fork = multiprocessing.get_context('fork')\n\
         deaf = fork.Event()\n\
         def stuck(_):\n\
         \x20   signal.signal(signal.SIGTERM, signal.SIG_IGN)\n\
         \x20   deaf.set()\n\
         \x20   select.select([], [], [], 60)\n\
         pool = fork.Pool(1)\n\
         pending = pool.map_async(stuck, [0])\n\
         assert deaf.wait(20)\n\
         print(pool._pool[0].pid)",
    );
    let worker: u32 = r.stdout.trim().parse().expect("the worker's pid");
    let (closed, closing) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        drop(first);
        closed.send(()).expect("the test waits");
    });
    closing
        .recv_timeout(Duration::from_secs(15))
        .expect("the session was dropped within 15 s");
    // Its parent reaps it: then it is not even a zombie.
    assert!(
        within(Duration::from_secs(15), || !std::path::Path::new(&format!(
            "/proc/{worker}"
        ))
        .exists()),
        "the pool worker {worker} was not killed and reaped"
    );
    let second = session();
    let r = ok(
        &second,
        "import multiprocessing\n\
         with multiprocessing.get_context('fork').Pool(1) as pool:\n\
         \x20   print(pool.map(abs, [-3]))",
    );
    assert_eq!(r.stdout, "[3]\n");
}

/// The last session's end of multiprocessing joins the feeder threads of its queues, as an
/// interpreter's exit does: a queue holding more than its pipe takes, which no process will
/// read (the block filled it and left it), keeps its feeder blocked, and Python's own exit
/// (and the end, which left multiprocessing's folder in `TMPDIR`) waited on it for ever.
/// After `_END_WAIT_S` (0.5 s here) the end gives it up and goes on; the next session's
/// queues work.
#[test]
fn the_last_sessions_close_gives_up_a_queue_that_no_process_reads() {
    let first = session();
    let r = ok(
        &first,
        "import multiprocessing.util, sys\n\
         sys.modules['_rlm_kernel']._END_WAIT_S = 0.5\n\
         unread = multiprocessing.get_context('spawn').Queue()\n\
         unread.put(b'x' * 1_000_000)\n\
         print(multiprocessing.util.get_temp_dir())",
    );
    let folder = std::path::PathBuf::from(r.stdout.trim());
    assert!(folder.is_dir(), "{r:?}");
    drop(first);
    assert!(
        within(Duration::from_secs(15), || !folder.exists()),
        "{} is left: the end did not finish",
        folder.display()
    );
    let second = session();
    let r = ok(
        &second,
        "import multiprocessing, sys\n\
         sys.modules['_rlm_kernel']._END_WAIT_S = 30.0\n\
         queue = multiprocessing.get_context('spawn').Queue()\n\
         queue.put(b'y' * 1_000_000)\n\
         print(len(queue.get(timeout=20)))",
    );
    assert_eq!(r.stdout, "1000000\n");
}

/// Every spawn or forkserver start writes the module of every session with definitions (see
/// `_REPLAY` in the support module): starts in two sessions at once (a flow's parallel
/// steps) neither fail on each other's writes nor leave a folder behind. The window is
/// widened: each session asks for a start's preparation data 200 times, as every start does,
/// and its module carries a table by value.
#[test]
fn sessions_starting_spawn_workers_at_once_share_one_folder_of_modules() {
    let sessions = [session(), session()];
    for s in &sessions {
        ok(
            s,
            "TABLE = list(range(20_000))\ndef pick(i):\n    return TABLE[i]",
        );
    }
    let starts = "import multiprocessing.spawn\nfolders, failures = set(), []\n\
                  for _ in range(200):\n\
                  \x20   try:\n\
                  \x20       data = multiprocessing.spawn.get_preparation_data('w')\n\
                  \x20       folders.add(data['sys_path'][-1])\n\
                  \x20   except OSError as error:\n\
                  \x20       failures.append(repr(error))\n\
                  with multiprocessing.get_context('spawn').Pool(1) as pool:\n\
                  \x20   assert pool.map(pick, [7]) == [7]\n\
                  print(len(failures), failures[:2])\nprint(*folders)";
    let outputs: Vec<String> = std::thread::scope(|scope| {
        let runs: Vec<_> = sessions
            .iter()
            .map(|s| scope.spawn(move || ok(s, starts).stdout))
            .collect();
        runs.into_iter()
            .map(|run| run.join().expect("joins"))
            .collect()
    });
    let folders: std::collections::BTreeSet<&str> = outputs
        .iter()
        .map(|out| {
            let (failures, folders) = out.split_once('\n').expect("two lines");
            assert_eq!(failures, "0 []", "{out}");
            folders.trim()
        })
        .collect();
    assert_eq!(folders.len(), 1, "{outputs:?}");
    let folder = std::path::PathBuf::from(*folders.first().expect("a folder"));
    assert!(folder.is_dir(), "{}", folder.display());
    drop(sessions);
    assert!(!folder.exists(), "{} is left", folder.display());
}

#[test]
fn blocks_that_start_no_process_read_nothing_in_proc() {
    let s = session();
    // An audit hook of the test's own (it stays for the interpreter's life: it only counts)
    // sees every listing of a folder of `/proc`, which the scan for children starts with.
    ok(
        &s,
        "import sys\nscans = []\nsys.addaudithook(lambda event, args: scans.append(1) \
         if event in ('os.listdir', 'os.scandir') and str(args[0]).startswith('/proc') else None)",
    );
    ok(&s, "x = sum(range(10))");
    ok(&s, "import json\ny = json.dumps({'x': x})");
    assert_eq!(ok(&s, "print(len(scans))").stdout, "0\n");
    // A block that starts one is scanned (just before the start, and after the block).
    ok(&s, "import subprocess\nsubprocess.run(['true'])");
    let scanned: usize = ok(&s, "print(len(scans))")
        .stdout
        .trim()
        .parse()
        .expect("a count");
    assert!(scanned >= 2, "{scanned}");
}

#[test]
fn known_secrets_are_redacted_in_everything_a_block_reports() {
    // The code builds the value itself: redaction does not depend on where it came from.
    let secret = "repl-secret-0123456789";
    bridge::secret::register(&bridge::Secret::new(secret));
    let s = session();
    let code = "token = 'repl-secret-' + '0123456789'\nprint('out', token)\nimport sys\n\
                print('err', token, file=sys.stderr)\nFINAL_VAR(token)\n\
                raise ValueError('bad ' + token)";
    let r = s.exec(code).expect("kernel works");
    assert_eq!(r.stdout, "out [redacted]\n");
    assert!(r.stderr.starts_with("err [redacted]\n"), "{}", r.stderr);
    let error = r.error.as_ref().expect("raised");
    assert_eq!(error.message, "bad [redacted]");
    assert!(!error.traceback.contains(secret), "{}", error.traceback);
    assert_eq!(r.final_answers[0].value, "[redacted]");
    let token = r
        .variables
        .iter()
        .find(|v| v.name == "token")
        .expect("listed");
    assert!(token.preview.contains("[redacted]"), "{token:?}");
    let shown = ok(&s, "SHOW_VARS()\ntoken");
    assert!(!shown.stdout.contains(secret), "{}", shown.stdout);
    assert_eq!(
        s.variable_as_string("token").expect("reads"),
        Some("[redacted]".to_owned())
    );
    ok(&s, "answer['content'] = 'partial ' + token");
    assert_eq!(
        s.answer_content().expect("reads"),
        Some("partial [redacted]".to_owned())
    );
    assert!(
        s.variables()
            .expect("lists")
            .iter()
            .all(|v| !v.preview.contains(secret))
    );
}
