//! A whole run: several iterations, batched fan-out, the answer on stdout, JSON and trajectory.

use crate::support::{Mock, file, repl, signal_and_wait};

fn fan_out_script() -> serde_json::Value {
    serde_json::json!({
        "models": {
            "root-model": {"replies": [
                format!("Let me split the context.\n{}", repl(
                    "chunks = [context[i:i + 100] for i in range(0, len(context), 100)]\nprint(len(chunks), 'chunks')"
                )),
                repl("replies = llm_query_batched(['How many? ' + c for c in chunks])\ntotal = sum(int(r) for r in replies)\nprint('total', total)"),
                "The total is computed.\nFINAL_VAR(total)",
            ]},
            "sub-model": {"replies": [{"behaviour": "count_word", "word": "x"}]}
        }
    })
}

#[test]
fn multi_iteration_run_with_batched_fan_out() {
    let mock = Mock::start(fan_out_script());
    let dir = tempfile::tempdir().expect("tempdir");
    // 1 000 characters, an `x` every 7th: 143 of them, spread over 10 chunks.
    let text: String = (0..1000)
        .map(|i| if i % 7 == 0 { 'x' } else { '.' })
        .collect();
    let context = file(dir.path(), "ctx.txt", &text);
    let trajectory = dir.path().join("t.jsonl");
    let run = mock.run(&[
        "--context",
        context.to_str().expect("utf-8"),
        "--query",
        "How many x?",
        "--trajectory",
        trajectory.to_str().expect("utf-8"),
        // Some chunks have the same text: each is still sent, as this test counts them.
        "--no-sub-call-cache",
    ]);
    run.assert_code(0);
    assert_eq!(run.last_line(), "143");

    let log = mock.log().entries();
    let sub: Vec<_> = log.iter().filter(|r| r.model == "sub-model").collect();
    assert_eq!(sub.len(), 10, "one sub-call per chunk");
    assert!(sub.iter().all(|r| r.last_user.starts_with("How many? ")));
    assert_eq!(mock.root_requests(), 3);

    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&trajectory)
        .expect("trajectory written")
        .lines()
        .map(|l| serde_json::from_str(l).expect("each trajectory line is JSON"))
        .collect();
    let count = |kind: &str| lines.iter().filter(|l| l["type"] == kind).count();
    assert_eq!(
        [
            count("header"),
            count("reply"),
            count("iteration"),
            count("result")
        ],
        [1, 3, 3, 1],
        "header, 3 replies and iterations (with their blocks), closing line: {lines:#?}"
    );
    let written = serde_json::to_string(&lines).expect("json");
    // Sub-call prompts are kept (each chunk is one), the context as a whole never.
    assert!(
        !written.contains(&text),
        "the context itself is never written"
    );
    let asked: usize = lines
        .iter()
        .filter(|l| l["type"] == "iteration")
        .flat_map(|l| l["blocks"].as_array().expect("blocks"))
        .map(|b| b["sub_call_texts"].as_array().map_or(0, Vec::len))
        .sum();
    assert_eq!(asked, 10, "what each sub-call was asked is recorded");
}

#[test]
fn json_output_carries_metrics() {
    let mock = Mock::start(fan_out_script());
    let dir = tempfile::tempdir().expect("tempdir");
    let text: String = (0..300)
        .map(|i| if i % 3 == 0 { 'x' } else { '-' })
        .collect();
    let context = file(dir.path(), "ctx.txt", &text);
    let run = mock.run(&[
        "--context",
        context.to_str().expect("utf-8"),
        "--query",
        "How many x?",
        "--json",
    ]);
    run.assert_code(0);
    let result = run.json();
    assert_eq!(result["answer"], "100");
    assert_eq!(result["termination_reason"], "final_answer");
    let metrics = &result["metrics"];
    assert_eq!(metrics["iterations"], 3);
    assert_eq!(metrics["sub_calls"], 3);
    assert_eq!(metrics["llm_query_batched_calls"], 1);
    assert_eq!(result["iterations"].as_array().map(Vec::len), Some(3));
}

#[test]
fn a_killed_run_leaves_a_valid_trajectory_prefix() {
    let code = repl("print('working')");
    let mock = Mock::start(serde_json::json!({
        "models": {"root-model": {
            "latency": {"kind": "fixed", "ms": 150},
            "replies": [code.clone(), code.clone(), code.clone(), code.clone(), code]
        }}
    }));
    let dir = tempfile::tempdir().expect("tempdir");
    let context = file(dir.path(), "ctx.txt", "some text");
    let trajectory = dir.path().join("t.jsonl");
    let mut child = mock.spawn_run(&context, &trajectory);
    // Wait for the header and two iterations, then kill -9 mid-run.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while std::fs::read_to_string(&trajectory).map_or(0, |t| t.lines().count()) < 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "the run made progress"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.kill().expect("SIGKILL");
    child.wait().expect("reaped");
    let text = std::fs::read_to_string(&trajectory).expect("trajectory");
    assert!(text.ends_with('\n'), "no half-written line");
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("every line is complete JSON"))
        .collect();
    assert!(lines.len() >= 3, "{} lines", lines.len());
    assert_eq!(lines[0]["type"], "header");
    assert!(
        lines[1..]
            .iter()
            .all(|l| ["reply", "block", "iteration"].contains(&l["type"].as_str().unwrap_or(""))),
        "{lines:?}"
    );
}

#[test]
fn the_anthropic_wire_format_runs_the_same_loop() {
    let mock = Mock::start(fan_out_script());
    let dir = tempfile::tempdir().expect("tempdir");
    let text: String = (0..500)
        .map(|i| if i % 5 == 0 { 'x' } else { '.' })
        .collect();
    let context = file(dir.path(), "ctx.txt", &text);
    let anthropic_url = mock.url().trim_end_matches("/v1").to_owned();
    let run = crate::support::rlm_with(
        &[
            "run",
            "--provider",
            "anthropic",
            "--base-url",
            &anthropic_url,
            "--model",
            "root-model",
            "--sub-model",
            "sub-model",
            "--context",
            context.to_str().expect("utf-8"),
            "--query",
            "How many x?",
            // The chunks have the same text: each is still sent, as this test counts them.
            "--no-sub-call-cache",
        ]
        .map(str::to_owned),
        None,
        &[("ANTHROPIC_API_KEY", "test-key")],
    );
    run.assert_code(0);
    assert_eq!(run.last_line(), "100");
    let log = mock.log().entries();
    assert!(log.iter().all(|r| r.path == "/v1/messages"), "{log:?}");
    assert_eq!(log.iter().filter(|r| r.model == "sub-model").count(), 5);
}

#[test]
fn extra_models_are_listed_for_the_root_and_picked_by_name() {
    let code =
        repl("pair = llm_query('which?', model='big') + ' ' + llm_query('which?')\nprint(pair)");
    let mock = Mock::start(serde_json::json!({
        "models": {
            "root-model": {
                "rules": [
                    {"turn": 0, "system": "`big` \\(big-model\\)", "reply": code},
                    {"turn": 0, "reply": "FINAL(the system prompt does not list `big`)"}
                ],
                "replies": ["", "FINAL_VAR(pair)"]
            },
            "sub-model": {"replies": ["small"]},
            "big-model": {"replies": ["large"]}
        }
    }));
    let dir = tempfile::tempdir().expect("tempdir");
    let context = file(dir.path(), "ctx.txt", "text");
    let context = context.to_str().expect("utf-8");
    let run = mock.run(&[
        "--context",
        context,
        "--query",
        "q",
        "--extra-model",
        "big=big-model",
    ]);
    run.assert_code(0);
    assert_eq!(run.last_line(), "large small");

    for (spec, needle) in [("big", "NAME=MODEL"), ("sub=other", "is taken")] {
        let run = mock.run(&["--context", context, "--query", "q", "--extra-model", spec]);
        run.assert_code(2);
        assert!(run.stderr.contains(needle), "{spec}: {}", run.stderr);
    }
}

/// Every answer the code gets as an error counts in `sub_call_errors`, whatever failed: a
/// model name with no endpoint (never sent, so not among `sub_calls`, in a call and in each
/// slot of a batch) as a prompt refused as too long for the sub-model's window (a sub-call
/// the ledger records, counted once); the run's closing line counts the same.
#[test]
fn every_error_the_code_gets_instead_of_an_answer_counts_as_a_failed_sub_call() {
    let code = repl(
        "a = llm_query('one', model='nope')\n\
         b = llm_query_batched(['two', 'three'], model='nope')\n\
         c = llm_query('x ' * 6000)\n\
         d = llm_query('four')\n\
         print([s[:7] for s in (a, *b, c)], d)",
    );
    let mock = Mock::start(serde_json::json!({
        "models": {
            "root-model": {"replies": [code, "FINAL_VAR(d)"]},
            "sub-model": {"replies": [{"behaviour": "echo"}]}
        }
    }));
    let dir = tempfile::tempdir().expect("tempdir");
    let context = file(dir.path(), "ctx.txt", "text");
    let context = context.to_str().expect("utf-8");
    // A worker process (its sub-calls answered by `rlm`) and this process (answered here).
    for isolation in ["process", "none"] {
        let run = mock.run(&[
            "--context",
            context,
            "--query",
            "q",
            "--sub-context-window",
            "2000",
            "--isolation",
            isolation,
            "--json",
        ]);
        run.assert_code(0);
        let result = run.json();
        assert_eq!(result["answer"], "four", "{isolation}: {result:#}");
        let stdout = result["iterations"][0]["blocks"][0]["stdout"].as_str();
        assert_eq!(
            stdout,
            Some("['Error: ', 'Error: ', 'Error: ', 'Error: '] four\n"),
            "{isolation}: {result:#}"
        );
        let metrics = &result["metrics"];
        assert_eq!(metrics["sub_call_errors"], 4, "{isolation}: {metrics:#}");
        assert_eq!(metrics["sub_calls"], 2, "{isolation}: {metrics:#}");
        assert_eq!(metrics["llm_query_calls"], 3, "{isolation}: {metrics:#}");
        // The closing line adds up to the same 4: 1 refused, 3 never sent.
        let closing = "final answer after 2 iteration(s), 1 sub-call(s) sent, 1 refused before \
                       sending, 3 more got an error without being sent, ";
        assert!(run.stderr.contains(closing), "{isolation}: {}", run.stderr);
    }
    assert_eq!(mock.requests_to("sub-model"), 2, "`four`, once a run");
}

/// Each block's record (and its iteration's) carries the sub-call errors its code got, so the
/// block whose calls failed can be found, in `--json`, the trajectory and `rlm show`: of two
/// blocks, the second's code got 3 (a call and a batch of 2 to a model name with no endpoint,
/// never sent), the first's none. Its sub-call texts say what each of those calls got, as for
/// a call that was sent.
#[test]
fn each_blocks_record_says_how_many_sub_call_errors_its_code_got() {
    let reply = format!(
        "{}\n{}",
        repl("d = llm_query('four')"),
        repl(
            "a = llm_query('one', model='nope')\nb = llm_query_batched(['two', 'three'], model='nope')"
        )
    );
    let mock = Mock::start(serde_json::json!({
        "models": {
            "root-model": {"replies": [reply, "FINAL_VAR(d)"]},
            "sub-model": {"replies": [{"behaviour": "echo"}]}
        }
    }));
    let dir = tempfile::tempdir().expect("tempdir");
    let context = file(dir.path(), "ctx.txt", "text");
    for isolation in ["process", "none"] {
        let trajectory = dir.path().join(format!("{isolation}.jsonl"));
        let run = mock.run(&[
            "--context",
            context.to_str().expect("utf-8"),
            "--query",
            "q",
            "--isolation",
            isolation,
            "--trajectory",
            trajectory.to_str().expect("utf-8"),
            "--json",
        ]);
        run.assert_code(0);
        let result = run.json();
        let written: serde_json::Value = std::fs::read_to_string(&trajectory)
            .expect("trajectory")
            .lines()
            .map(|l| serde_json::from_str(l).expect("JSON line"))
            .find(|l: &serde_json::Value| l["type"] == "iteration")
            .expect("the first iteration");
        for (place, iteration) in [
            ("--json", &result["iterations"][0]),
            ("trajectory", &written),
        ] {
            let errors: Vec<_> = iteration["blocks"]
                .as_array()
                .expect("blocks")
                .iter()
                .map(|b| b["sub_call_errors"].clone())
                .collect();
            assert_eq!(errors, [0, 3], "{isolation}, {place}: {iteration:#}");
            let texts: Vec<(&str, bool)> = iteration["blocks"][1]["sub_call_texts"]
                .as_array()
                .map_or(&[][..], Vec::as_slice)
                .iter()
                .filter_map(|t| {
                    let reply = t["reply"].as_str()?;
                    Some((t["prompt"].as_str()?, reply.contains("`nope`")))
                })
                .collect();
            assert_eq!(
                texts,
                [("one", true), ("two", true), ("three", true)],
                "{isolation}, {place}: {iteration:#}"
            );
            assert_eq!(
                iteration["sub_call_errors"], 3,
                "{isolation}, {place}: {iteration:#}"
            );
        }
        let show = crate::support::rlm(
            &["show".into(), trajectory.to_str().expect("utf-8").into()],
            None,
        );
        show.assert_code(0);
        let lines: Vec<&str> = show
            .stdout
            .lines()
            .filter(|l| l.starts_with("  ├ llm_query"))
            .collect();
        assert_eq!(
            lines,
            [
                "  ├ llm_query ×1: 1 sub-call(s) sent",
                "  ├ llm_query ×1, llm_query_batched ×1: 0 sub-call(s) sent, 3 more got an error \
                 without being sent · 3 sub-call error(s)"
            ],
            "{isolation}: {}",
            show.stdout
        );
    }
}

#[test]
fn ctrl_c_stops_the_run_and_keeps_its_best_answer_and_trajectory() {
    let mock = Mock::start(serde_json::json!({
        "models": {"root-model": {"replies": [
            // A block that raised holds its reply's FINAL back: the best answer so far.
            format!("{}\nFINAL(draft answer)", repl("print('working')\nraise ValueError('not yet')")),
            repl("import time\ntime.sleep(60)"),
            "FINAL(never)"
        ]}}
    }));
    let dir = tempfile::tempdir().expect("tempdir");
    let context = file(dir.path(), "ctx.txt", "some text");
    let trajectory = dir.path().join("t.jsonl");
    let child = mock.spawn_run(&context, &trajectory);
    // Wait until the second reply's block is sleeping, then press Ctrl-C.
    wait_for_progress(|| mock.root_requests() >= 2, 300);
    let output = signal_and_wait(child, libc::SIGINT, "Ctrl-C (SIGINT)");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(130), "{stderr}");
    assert_eq!(
        stdout.trim_end(),
        "draft answer",
        "the best answer so far is printed"
    );
    assert!(stderr.contains("Interrupted"), "{stderr}");
    assert_closed_as_interrupted(&trajectory);
}

/// `kill PID` (`SIGTERM`) and a closed terminal (`SIGHUP`) stop a run as Ctrl-C does: its
/// best answer printed, its trajectory closed as interrupted, and its worker ended with its
/// scratch directory (the run's own `TMPDIR` is left empty); at depth 2 with a child's block
/// running, the child's worker and the workers kept ready for the next child too.
#[test]
fn sigterm_and_sighup_stop_the_run_as_ctrl_c_does_and_leave_no_scratch_directory() {
    let sleeping = repl("import time\ntime.sleep(60)");
    let draft = format!(
        "{}\nFINAL(draft answer)",
        repl("print('working')\nraise ValueError('not yet')")
    );
    let child = repl("r = rlm_query('look closer', 'a piece')\nprint(r)");
    // Flat: the root's second block sleeps. At depth 2: the root's second block asks a child
    // (the sub-model, recognised by the RLM system prompt), whose first block sleeps.
    let flat: Vec<&str> = vec![&draft, &sleeping, "FINAL(never)"];
    let deep: Vec<&str> = vec![&draft, &child, "FINAL(never)"];
    let deep_args = ["--max-depth", "2", "--sub-model", "sub-model"];
    for (signal, name) in [(libc::SIGTERM, "SIGTERM"), (libc::SIGHUP, "SIGHUP")] {
        for (replies, extra, children) in [(&flat, &[][..], 0), (&deep, &deep_args[..], 1)] {
            let mock = Mock::start(serde_json::json!({"models": {
                "root-model": {"replies": replies},
                "sub-model": {"rules": [
                    {"system": "recursive language model", "turn": 0, "reply": sleeping}
                ], "fallback": "FINAL(never)"}
            }}));
            let dir = tempfile::tempdir().expect("tempdir");
            let tmp = tempfile::tempdir().expect("the run's TMPDIR");
            let context = file(dir.path(), "ctx.txt", "some text");
            let trajectory = dir.path().join("t.jsonl");
            let run = mock.spawn_run_with(&context, &trajectory, extra, &[("TMPDIR", tmp.path())]);
            // The sleeping block started, and (at depth 2) the workers for the next child
            // were confined meanwhile.
            wait_for_progress(
                || mock.root_requests() >= 2 && mock.requests_to("sub-model") >= children,
                1_000,
            );
            // The root's worker's; at depth 2 also the child's and at least one kept ready.
            let scratch = scratch_directories(tmp.path());
            assert!(
                scratch.len() > 2 * children,
                "{name} {extra:?}: the workers' scratch directories are not under the run's TMPDIR: {scratch:?}"
            );
            let output = signal_and_wait(run, signal, &format!("{name} {extra:?}"));
            let stdout = String::from_utf8_lossy(&output.stdout);
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert_eq!(
                output.status.code(),
                Some(130),
                "{name} {extra:?}: {stderr}"
            );
            assert_eq!(stdout.trim_end(), "draft answer", "{name} {extra:?}");
            assert!(
                stderr.contains(&format!("Interrupted by {name}: stopping the run")),
                "{stderr}"
            );
            assert_closed_as_interrupted(&trajectory);
            assert_eq!(
                scratch_directories(tmp.path()),
                Vec::<std::path::PathBuf>::new(),
                "{name} {extra:?}: scratch directories were left (there were {scratch:?})"
            );
        }
    }
}

/// A run killed with `SIGKILL` cannot remove its worker's scratch directory; the next run
/// that uses the same temporary folder does (its maker is provably gone: the lock it held
/// went with it), and leaves an older version's directory (which held no lock) alone.
#[test]
fn a_scratch_directory_a_killed_run_left_is_removed_by_the_next_run() {
    let script = |replies: &[&str]| {
        Mock::start(serde_json::json!({"models": {"root-model": {"replies": replies}}}))
    };
    let mock = script(&[&repl("import time\ntime.sleep(60)")]);
    let dir = tempfile::tempdir().expect("tempdir");
    let tmp = tempfile::tempdir().expect("the runs' TMPDIR");
    let older = tmp.path().join("rlm-scratch-Older1");
    std::fs::create_dir(&older).expect("an older version's directory");
    let context = file(dir.path(), "ctx.txt", "some text");
    let envs = [("TMPDIR", tmp.path())];
    let mut killed = mock.spawn_run_with(&context, &dir.path().join("k.jsonl"), &[], &envs);
    wait_for_progress(|| mock.root_requests() >= 1, 1_000);
    killed.kill().expect("SIGKILL");
    killed.wait().expect("reaped");
    let left = scratch_directories(tmp.path());
    assert_eq!(
        left.len(),
        2,
        "the killed run's and the older one: {left:?}"
    );

    let mock = script(&[&repl("x = 1"), "FINAL(done)"]);
    let next = mock.spawn_run_with(&context, &dir.path().join("n.jsonl"), &[], &envs);
    let output = next.wait_with_output().expect("the next run ends");
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim_end(), "done");
    assert_eq!(
        scratch_directories(tmp.path()),
        vec![older],
        "the killed run's directory was not removed (or the older one was)"
    );
}

/// A closed terminal: `rlm` leads a session on a pseudo-terminal that holds its standard
/// output and error, and the terminal goes (its other end closed; the kernel sends `SIGHUP`).
/// The run stops as for Ctrl-C although it can print nothing any more: its best answer is
/// written to `--answer-file`, its trajectory closed, its worker's scratch directory removed.
#[test]
fn a_closed_terminal_stops_the_run_and_keeps_its_answer_file_and_trajectory() {
    let mock = Mock::start(serde_json::json!({"models": {"root-model": {"replies": [
        format!("{}\nFINAL(draft answer)", repl("raise ValueError('not yet')")),
        repl("import time\ntime.sleep(60)"),
        "FINAL(never)"
    ]}}}));
    let dir = tempfile::tempdir().expect("tempdir");
    let tmp = tempfile::tempdir().expect("the run's TMPDIR");
    let context = file(dir.path(), "ctx.txt", "some text");
    let trajectory = dir.path().join("t.jsonl");
    let answer = dir.path().join("answer.txt");
    let (master, slave) = crate::support::pseudo_terminal();
    let mut cmd = crate::support::rlm_command(&mock.run_args(&[
        "--context",
        context.to_str().expect("utf-8"),
        "--query",
        "q",
        "--quiet",
        "--trajectory",
        trajectory.to_str().expect("utf-8"),
        "--answer-file",
        answer.to_str().expect("utf-8"),
    ]));
    cmd.env("TMPDIR", tmp.path())
        .stdin(std::process::Stdio::null())
        .stdout(slave.try_clone().expect("the terminal"))
        .stderr(slave);
    crate::support::lead_a_session_on_stderr(&mut cmd);
    let mut child = cmd.spawn().expect("rlm starts");
    drop(cmd);
    wait_for_progress(|| mock.root_requests() >= 2, 1_000);
    // The terminal goes.
    drop(master);
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if started.elapsed() > std::time::Duration::from_secs(10) {
            let _ = child.kill();
            panic!("rlm did not stop within 10 s of its terminal's hangup");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(130), "{status:?}");
    assert_eq!(
        std::fs::read_to_string(&answer).expect("the answer file"),
        "draft answer"
    );
    assert_closed_as_interrupted(&trajectory);
    assert_eq!(
        scratch_directories(tmp.path()),
        Vec::<std::path::PathBuf>::new()
    );
}

/// `nohup rlm ...` (`SIGHUP` ignored when `rlm` starts): a `SIGHUP` does not stop the run.
#[test]
fn a_run_started_with_sighup_ignored_runs_on_through_a_sighup() {
    use std::os::unix::process::CommandExt as _;

    let mock = Mock::start(serde_json::json!({"models": {"root-model": {"replies": [
        repl("import time\ntime.sleep(2)\nx = 'done'"),
        "FINAL_VAR(x)"
    ]}}}));
    let dir = tempfile::tempdir().expect("tempdir");
    let context = file(dir.path(), "ctx.txt", "some text");
    let mut cmd = crate::support::rlm_command(&mock.run_args(&[
        "--context",
        context.to_str().expect("utf-8"),
        "--query",
        "q",
    ]));
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    // SAFETY: `signal` is async-signal-safe; as `nohup` does before it runs the command.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGHUP, libc::SIG_IGN);
            Ok(())
        });
    }
    let child = cmd.spawn().expect("rlm starts");
    wait_for_progress(|| mock.root_requests() >= 1, 500);
    let output = signal_and_wait(child, libc::SIGHUP, "SIGHUP ignored");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim_end(), "done");
    assert!(!stderr.contains("Interrupted"), "{stderr}");
}

/// Waits (up to 30 s) until `progressed`, then `settle_ms` more (a block it started is under
/// way).
fn wait_for_progress(progressed: impl Fn() -> bool, settle_ms: u64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !progressed() {
        assert!(
            std::time::Instant::now() < deadline,
            "the run made progress"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    std::thread::sleep(std::time::Duration::from_millis(settle_ms));
}

/// The scratch directories of workers under `tmp`.
fn scratch_directories(tmp: &std::path::Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(tmp)
        .expect("TMPDIR")
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("rlm-scratch-"))
        })
        .collect()
}

/// The trajectory of a run stopped by Ctrl-C is closed, and its replayed trace says the
/// block was interrupted, not that it failed.
pub(crate) fn assert_closed_as_interrupted(trajectory: &std::path::Path) {
    let show = crate::support::rlm(
        &["show".into(), trajectory.to_str().expect("utf-8").into()],
        None,
    );
    show.assert_code(0);
    assert!(
        show.stdout
            .contains("  ├ interrupted by Ctrl-C (or a stop request)\n"),
        "{}",
        show.stdout
    );
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(trajectory)
        .expect("trajectory")
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    let last = lines.last().expect("lines");
    assert_eq!(last["type"], "result", "the trajectory is closed: {last}");
    assert_eq!(last["termination_reason"], "interrupted");
}
