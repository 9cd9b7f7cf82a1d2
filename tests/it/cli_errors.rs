//! Clear errors, not panics: bad input, unreachable or refusing endpoints, bad configuration.

use crate::support::{Mock, Run, file, rlm, script};

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[track_caller]
fn assert_clean_error(run: &Run, code: i32, needles: &[&str]) {
    run.assert_code(code);
    for needle in needles {
        assert!(
            run.stderr.contains(needle),
            "stderr lacks `{needle}`:\n{}",
            run.stderr
        );
    }
    assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
}

#[test]
fn missing_context_file_names_the_file() {
    let mock = Mock::start(script(&["FINAL(x)"]));
    let run = mock.run(&["--context", "/nonexistent/logs.txt", "--query", "q"]);
    assert_clean_error(&run, 1, &["/nonexistent/logs.txt"]);
    // The reason is said once, not again as a cause of its own.
    assert_eq!(
        run.stderr.matches("No such file or directory").count(),
        1,
        "{}",
        run.stderr
    );
    assert_eq!(
        mock.log().len(),
        0,
        "nothing was sent before the context loaded"
    );
}

#[test]
fn refused_connection_names_the_url() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("addr").port()
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let context = file(dir.path(), "c.txt", "text");
    let url = format!("http://127.0.0.1:{port}/v1");
    let run = rlm(
        &args(&[
            "run",
            "--base-url",
            &url,
            "--model",
            "m",
            "--quiet",
            "--context",
            context.to_str().expect("utf-8"),
            "--query",
            "q",
        ]),
        None,
    );
    // `--quiet` silences progress, not the reason the run failed.
    assert_clean_error(
        &run,
        1,
        &[
            &format!("127.0.0.1:{port}"),
            "Could not connect",
            "`--base-url` is right",
            "without an answer",
        ],
    );
    // The flag the user typed, not the configuration's internal names.
    assert!(!run.stderr.contains("of endpoint"), "{}", run.stderr);
}

#[test]
fn a_wrong_sub_model_url_names_its_flag_in_what_the_code_sees() {
    let mock = Mock::start(script(&[
        "```repl
print(llm_query('hi'))
```",
        "FINAL(done)",
    ]));
    let dir = tempfile::tempdir().expect("tempdir");
    let context = file(dir.path(), "c.txt", "text");
    // Forgot the `/v1`: the sub-model gets 404s.
    let wrong = mock.url().trim_end_matches("/v1").to_owned();
    let run = mock.run(&[
        "--context",
        context.to_str().expect("utf-8"),
        "--query",
        "q",
        "--sub-base-url",
        &wrong,
        "--trajectory",
        dir.path().join("t.jsonl").to_str().expect("utf-8"),
    ]);
    run.assert_code(0);
    let trajectory = std::fs::read_to_string(dir.path().join("t.jsonl")).expect("trajectory");
    assert!(
        trajectory.contains("HTTP 404") && trajectory.contains("check `--sub-base-url`"),
        "{trajectory}"
    );
    assert!(!trajectory.contains("of endpoint"), "{trajectory}");
}

#[test]
fn bad_api_key_says_which_variable() {
    let mock = Mock::start_with(bridge::mock::MockConfig {
        api_key: Some("right".into()),
        ..bridge::mock::MockConfig::default()
    });
    let dir = tempfile::tempdir().expect("tempdir");
    let context = file(dir.path(), "c.txt", "text");
    let run = mock.run_env(
        &[
            "--context",
            context.to_str().expect("utf-8"),
            "--query",
            "q",
        ],
        &[("OPENAI_API_KEY", "wrong")],
    );
    assert_clean_error(&run, 1, &["OPENAI_API_KEY"]);
    let run = mock.run(&[
        "--context",
        context.to_str().expect("utf-8"),
        "--query",
        "q",
    ]);
    assert_clean_error(&run, 1, &["OPENAI_API_KEY"]);
}

#[test]
fn unknown_provider_and_missing_options_are_usage_errors() {
    let run = rlm(&args(&["run", "--provider", "palm", "--query", "q"]), None);
    run.assert_code(2);
    insta::assert_snapshot!(run.stderr, @r"
    error: invalid value 'palm' for '--provider <PROVIDER>'
      [possible values: openai, anthropic]

    For more information, try '--help'.
    ");
    let run = rlm(&args(&["run", "--context", "x", "--query", "q"]), None);
    assert_clean_error(&run, 2, &["--model"]);
}

#[test]
fn bad_config_file_is_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = file(dir.path(), "rlm.toml", "[run]\nmax-iteratons = 3\n");
    let run = rlm(
        &args(&[
            "--config",
            config.to_str().expect("utf-8"),
            "run",
            "--query",
            "q",
            "--context",
            "x",
        ]),
        None,
    );
    // Not a snapshot: the list of known options in the message grows with every new flag.
    assert_clean_error(&run, 1, &["rlm.toml", "max-iteratons"]);
}

#[test]
fn config_file_supplies_defaults_and_flags_win() {
    let mock = Mock::start(script(&[
        "```repl\nprint(1)\n```",
        "```repl\nprint(2)\n```",
        "answered now",
    ]));
    let dir = tempfile::tempdir().expect("tempdir");
    let config = file(
        dir.path(),
        "rlm.toml",
        &format!(
            "[run]\nbase-url = \"{}\"\nmodel = \"root-model\"\nmax-iterations = 1\n",
            mock.url()
        ),
    );
    let context = file(dir.path(), "c.txt", "text");
    let base = [
        "--config",
        config.to_str().expect("utf-8"),
        "run",
        "--context",
        context.to_str().expect("utf-8"),
        "--query",
        "q",
        "--json",
    ];
    let run = rlm(&args(&base), None);
    run.assert_code(3);
    assert_eq!(
        run.json()["metrics"]["iterations"],
        1,
        "max-iterations from the file"
    );
    let mut with_flag = args(&base);
    with_flag.extend(args(&["--max-iterations", "2"]));
    let run = rlm(&with_flag, None);
    run.assert_code(3);
    assert_eq!(
        run.json()["metrics"]["iterations"],
        2,
        "the flag wins over the file"
    );
}

#[test]
fn bad_outputs_and_limits_fail_before_any_model_call() {
    let mock = Mock::start(script(&["FINAL(x)"]));
    let dir = tempfile::tempdir().expect("tempdir");
    let context = file(dir.path(), "c.txt", "text");
    let context = context.to_str().expect("utf-8");
    let run = mock.run(&[
        "--context",
        context,
        "--query",
        "q",
        "--answer-file",
        "/nonexistent/dir/answer.txt",
    ]);
    assert_clean_error(&run, 1, &["/nonexistent/dir/answer.txt"]);
    for flag in ["--timeout", "--cell-timeout", "--sub-timeout"] {
        let run = mock.run(&["--context", context, "--query", "q", flag, "1e19"]);
        assert_clean_error(&run, 2, &[flag]);
    }
    assert_eq!(mock.log().len(), 0, "no model was called");
    let run = rlm(&args(&["run", "--context", context]), None);
    assert_clean_error(&run, 2, &["--query"]);
}

#[test]
fn an_unwritable_trajectory_is_an_error_not_a_limit() {
    let mock = Mock::start(script(&["```repl\nprint(1)\n```", "FINAL(x)"]));
    let dir = tempfile::tempdir().expect("tempdir");
    let context = file(dir.path(), "c.txt", "text");
    let run = mock.run(&[
        "--context",
        context.to_str().expect("utf-8"),
        "--query",
        "q",
        "--trajectory",
        "/dev/full",
    ]);
    assert_clean_error(&run, 1, &["trajectory"]);
}

#[test]
fn paths_in_the_config_file_are_relative_to_it() {
    let mock = Mock::start(script(&["FINAL(done)"]));
    let dir = tempfile::tempdir().expect("tempdir");
    let config = file(
        dir.path(),
        "rlm.toml",
        &format!(
            "[run]\nbase-url = \"{}\"\nmodel = \"root-model\"\ntrajectory = \"t.jsonl\"\nanswer-file = \"out/answer.txt\"\n",
            mock.url()
        ),
    );
    std::fs::create_dir(dir.path().join("out")).expect("mkdir");
    let context = file(dir.path(), "c.txt", "text");
    let run = rlm(
        &args(&[
            "--config",
            config.to_str().expect("utf-8"),
            "run",
            "--context",
            context.to_str().expect("utf-8"),
            "--query",
            "q",
        ]),
        None,
    );
    run.assert_code(0);
    assert!(
        dir.path().join("t.jsonl").exists(),
        "trajectory beside the config"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("out/answer.txt")).expect("answer file"),
        "done"
    );
}

#[test]
fn flags_turn_off_switches_set_in_the_config_file() {
    let mock = Mock::start(script(&["FINAL(done)"]));
    let dir = tempfile::tempdir().expect("tempdir");
    let config = file(
        dir.path(),
        "rlm.toml",
        &format!(
            "[run]\nbase-url = \"{}\"\nmodel = \"root-model\"\njson = true\n",
            mock.url()
        ),
    );
    let context = file(dir.path(), "c.txt", "text");
    let base = args(&[
        "--config",
        config.to_str().expect("utf-8"),
        "run",
        "--context",
        context.to_str().expect("utf-8"),
        "--query",
        "q",
    ]);
    let run = rlm(&base, None);
    run.assert_code(0);
    assert_eq!(run.json()["answer"], "done", "json from the file");
    let mut off = base.clone();
    off.push("--json=false".to_owned());
    let run = rlm(&off, None);
    run.assert_code(0);
    assert_eq!(run.stdout, "done\n", "the flag turns it off");
}
