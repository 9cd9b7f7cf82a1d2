//! Outputs never destroy inputs, for every command that writes: an output naming an input
//! (a context or a file in a context folder, an `@FILE` input, a workflow file or a file it
//! references, a bundle file, the run database, the configuration) is refused with exit 2 and
//! nothing written; so is a new file inside a context folder; an existing output needs
//! `--force`; the answer file is never truncated up front; a resumed run appends to its event
//! log.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use serde_json::json;

use crate::agent::Project;
use crate::flow_durable::Flows;
use crate::support::{Mock, Run, file, repl, rlm, rlm_command, script};

const CONTEXT: &str = "line one\nline two: the data a user cannot lose\n";

fn assert_refused(run: &crate::support::Run, needle: &str) {
    run.assert_code(2);
    assert!(run.stderr.contains(needle), "stderr: {}", run.stderr);
    assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
}

#[test]
fn an_output_naming_the_context_is_refused_and_the_context_is_untouched() {
    let mock = Mock::start(script(&["FINAL(x)"]));
    let dir = tempfile::tempdir().expect("tempdir");
    let context = file(dir.path(), "data.txt", CONTEXT);
    let link = dir.path().join("link.txt");
    std::os::unix::fs::symlink(&context, &link).expect("symlink");
    let dotted = format!("{}/./data.txt", dir.path().display());
    for flag in ["--answer-file", "--trajectory"] {
        for out in [
            context.to_str().expect("utf-8"),
            link.to_str().expect("utf-8"),
            dotted.as_str(),
        ] {
            let run = mock.run(&[
                "--context",
                context.to_str().expect("utf-8"),
                "--query",
                "q",
                flag,
                out,
                "--force",
            ]);
            assert_refused(&run, "would destroy the input");
            assert_eq!(
                std::fs::read_to_string(&context).expect("context"),
                CONTEXT,
                "{flag} {out} left the context byte-identical"
            );
        }
    }
    assert_eq!(mock.log().len(), 0, "no model was called");
}

#[test]
fn an_output_naming_the_config_file_or_a_file_in_a_context_directory_is_refused() {
    let mock = Mock::start(script(&["FINAL(x)"]));
    let dir = tempfile::tempdir().expect("tempdir");
    let config = file(dir.path(), "rlm.toml", "[run]\nmax-iterations = 3\n");
    let docs = dir.path().join("docs");
    std::fs::create_dir(&docs).expect("mkdir");
    let note = file(&docs, "note.md", CONTEXT);
    let run = crate::support::rlm(
        &[
            "--config",
            config.to_str().expect("utf-8"),
            "run",
            "--base-url",
            &mock.url(),
            "--model",
            "root-model",
            "--context",
            docs.to_str().expect("utf-8"),
            "--query",
            "q",
            "--answer-file",
            config.to_str().expect("utf-8"),
        ]
        .map(str::to_owned),
        None,
    );
    assert_refused(&run, "would destroy the input");
    let run = mock.run(&[
        "--context",
        docs.to_str().expect("utf-8"),
        "--query",
        "q",
        "--trajectory",
        note.to_str().expect("utf-8"),
    ]);
    assert_refused(&run, "inside the context directory");
    assert_eq!(std::fs::read_to_string(&note).expect("note"), CONTEXT);
    assert_eq!(
        std::fs::read_to_string(&config).expect("config"),
        "[run]\nmax-iterations = 3\n"
    );
}

#[test]
fn the_answer_file_is_not_truncated_before_the_run_and_is_replaced_at_the_end() {
    let mock = Mock::start(script(&[&repl("x = 6 * 7"), "FINAL(42)"]));
    let dir = tempfile::tempdir().expect("tempdir");
    let context = file(dir.path(), "data.txt", CONTEXT);
    let answer = file(dir.path(), "answer.txt", "the previous answer");
    // An existing answer file is replaced only with `--force`.
    let run = mock.run(&[
        "--context",
        context.to_str().expect("utf-8"),
        "--query",
        "q",
        "--answer-file",
        answer.to_str().expect("utf-8"),
    ]);
    assert_refused(&run, "--force");
    // A run that fails before it starts leaves the old answer file alone.
    let run = mock.run(&[
        "--context",
        "/nonexistent/input.txt",
        "--query",
        "q",
        "--answer-file",
        answer.to_str().expect("utf-8"),
        "--force",
    ]);
    run.assert_code(1);
    assert_eq!(
        std::fs::read_to_string(&answer).expect("answer"),
        "the previous answer"
    );
    assert_eq!(mock.log().len(), 0, "no model was called");
    let run = mock.run(&[
        "--context",
        context.to_str().expect("utf-8"),
        "--query",
        "q",
        "--answer-file",
        answer.to_str().expect("utf-8"),
        "--force",
    ]);
    run.assert_code(0);
    assert_eq!(std::fs::read_to_string(&answer).expect("answer"), "42");
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .expect("ls")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 2, "no temporary file left behind: {names:?}");
}

#[test]
fn an_existing_trajectory_is_kept_unless_forced() {
    let mock = Mock::start(script(&["FINAL(a)", "FINAL(b)"]));
    let dir = tempfile::tempdir().expect("tempdir");
    let context = file(dir.path(), "data.txt", CONTEXT);
    let trajectory = file(dir.path(), "t.jsonl", "{\"earlier\": \"run\"}\n");
    let args = |force: bool| {
        let mut a = vec![
            "--context",
            context.to_str().expect("utf-8"),
            "--query",
            "q",
            "--trajectory",
            trajectory.to_str().expect("utf-8"),
        ];
        if force {
            a.push("--force");
        }
        a
    };
    let run = mock.run(&args(false));
    assert_refused(&run, "--force");
    assert_eq!(
        std::fs::read_to_string(&trajectory).expect("t"),
        "{\"earlier\": \"run\"}\n"
    );
    mock.run(&args(true)).assert_code(0);
    let text = std::fs::read_to_string(&trajectory).expect("t");
    assert!(!text.contains("earlier"), "replaced with --force: {text}");
}

#[test]
fn the_demo_never_overwrites_a_file_with_keep_context() {
    let dir = tempfile::tempdir().expect("tempdir");
    let precious = file(dir.path(), "precious.txt", CONTEXT);
    let run = crate::support::rlm(
        &[
            "demo",
            "--quiet",
            "--size-mb",
            "0.05",
            "--keep-context",
            precious.to_str().expect("utf-8"),
        ]
        .map(str::to_owned),
        None,
    );
    assert_refused(&run, "--force");
    assert_eq!(std::fs::read_to_string(&precious).expect("p"), CONTEXT);
}

/// Every file under `dir` (recursively) with its bytes: what "nothing touched" compares.
fn tree(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut files = BTreeMap::new();
    let mut folders = vec![dir.to_path_buf()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).expect("read_dir").flatten() {
            let path = entry.path();
            if entry.file_type().expect("file type").is_dir() {
                folders.push(path);
            } else {
                files.insert(path.clone(), std::fs::read(&path).unwrap_or_default());
            }
        }
    }
    files
}

fn text(path: &Path) -> String {
    path.display().to_string()
}

/// `command(false)` is refused for want of `--force` and leaves `path` holding `kept`;
/// `command(true)` replaces it with a file that contains `written`.
fn kept_unless_forced(command: impl Fn(bool) -> Run, path: &Path, kept: &str, written: &str) {
    assert_refused(&command(false), "--force");
    assert_eq!(std::fs::read_to_string(path).expect("kept"), kept);
    command(true).assert_code(0);
    let text = std::fs::read_to_string(path).expect("replaced");
    assert!(text.contains(written), "replaced with --force: {text}");
}

/// `rlm ARGS` in the working directory `cwd`.
fn rlm_in(cwd: &Path, args: &[String]) -> Run {
    let out = rlm_command(args)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .output()
        .expect("rlm runs");
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

#[test]
fn flow_run_refuses_an_event_log_or_state_file_that_is_an_input_and_writes_nothing() {
    let flows = Flows::new();
    let d = flows.dir.path();
    file(d, "go", "");
    let data = file(d, "data.txt", CONTEXT);
    let note = file(d, "note.txt", "a note the user keeps\n");
    let facts = file(d, "facts.json", "{\"a\": 1}\n");
    let docs = d.join("docs");
    std::fs::create_dir(&docs).expect("mkdir");
    file(&docs, "a.md", CONTEXT);
    let completion = |extra: &[&str]| {
        let mut args = vec!["run", "rlm-completion", "-c", data.to_str().expect("utf-8")];
        args.extend_from_slice(&["--input", "format=one line"]);
        args.extend_from_slice(extra);
        flows.model_args(&args)
    };
    let query_note = format!("query=@{}", text(&note));
    let cases: Vec<(Vec<String>, &str)> = vec![
        // The context, and an `--input KEY=@FILE` file.
        (
            completion(&["--input", "query=q", "--events", &text(&data)]),
            "would destroy the input",
        ),
        (
            completion(&["--input", &query_note, "--events", &text(&note)]),
            "would destroy the input",
        ),
        (
            flows.run_pipeline("p0", &["-c", &text(&facts), "--state", &text(&facts)]),
            "would destroy the input",
        ),
        // The workflow's own files: its root, a sub-workflow, its Python steps.
        (
            flows.run_pipeline("p1", &["--events", &text(&flows.path("pipeline.yaml"))]),
            "would destroy the input",
        ),
        (
            flows.run_pipeline("p2", &["--events", &text(&flows.path("wait.yaml"))]),
            "would destroy the input",
        ),
        (
            flows.run_pipeline("p3", &["--events", &text(&flows.path("steps.py"))]),
            "would destroy the input",
        ),
        // A new file inside a context folder would be read by the next run.
        (
            flows.run_pipeline(
                "p4",
                &[
                    "-c",
                    &text(&docs),
                    "--events",
                    &text(&docs.join("events.jsonl")),
                ],
            ),
            "inside the context directory",
        ),
    ];
    let before = tree(d);
    for (args, needle) in cases {
        let run = rlm(&args, None);
        assert_refused(&run, needle);
        assert_eq!(tree(d), before, "nothing written by {args:?}");
    }
    assert!(!flows.path("runs.db").exists(), "no run database was made");
}

#[test]
fn an_existing_event_log_is_replaced_only_with_force() {
    let flows = Flows::new();
    file(flows.dir.path(), "go", "");
    let events = file(flows.dir.path(), "events.jsonl", "a log the user keeps\n");
    let ev = text(&events);
    let run = |force: bool| {
        let (id, extra) = if force {
            ("two", "--force")
        } else {
            ("one", "--quiet")
        };
        rlm(&flows.run_pipeline(id, &["--events", &ev, extra]), None)
    };
    kept_unless_forced(
        run,
        &events,
        "a log the user keeps\n",
        "\"author\":\"last\"",
    );
}

#[test]
fn an_event_log_on_the_run_database_is_refused_and_every_earlier_run_stays_listed() {
    let flows = Flows::new();
    let d = flows.dir.path();
    file(d, "go", "");
    let go = format!("go_file={}", text(&flows.path("go")));
    let started = format!("started_file={}", text(&flows.path("started")));
    let pipeline = text(&flows.path("pipeline.yaml"));
    // The default database, `.rlm/runs.db` under the working directory.
    let run = |id: &str, extra: &[&str]| {
        let mut args: Vec<String> = [
            "flow",
            "run",
            &pipeline,
            "--run-id",
            id,
            "--input",
            &go,
            "--input",
            &started,
            "--model",
            "none",
            "--base-url",
            "http://127.0.0.1:9/v1",
            // The `wait` step marks where it is in a file beside the workflow, which a
            // confined worker may not write (as in `flow_durable`).
            "--isolation",
            "none",
        ]
        .map(String::from)
        .to_vec();
        args.extend(extra.iter().map(|s| s.to_string()));
        rlm_in(d, &args)
    };
    run("earlier", &[]).assert_code(0);
    let db = d.join(".rlm/runs.db");
    let bytes = std::fs::read(&db).expect("the run database");
    for target in [".rlm/runs.db", ".rlm/runs.db-wal", ".rlm/runs.db-shm"] {
        let refused = run("later", &["--events", target, "--force"]);
        assert_refused(&refused, "run database");
        assert_eq!(std::fs::read(&db).expect("db"), bytes, "{target}");
        assert!(!d.join(".rlm/runs.db-wal").exists() || target != ".rlm/runs.db-wal");
    }
    let runs = rlm_in(d, &["flow".into(), "runs".into(), "--json".into()]);
    runs.assert_code(0);
    let ids: Vec<String> = runs
        .json()
        .as_array()
        .expect("runs")
        .iter()
        .map(|r| r["run_id"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(ids, ["earlier"]);
}

#[test]
fn a_resumed_run_appends_to_its_event_log_and_keeps_the_part_before_the_crash() {
    let flows = Flows::new();
    let events = flows.path("events.jsonl");
    let ev = text(&events);
    flows.crash_in_wait("crash", &["--events", &ev]);
    let before = std::fs::read_to_string(&events).expect("the log so far");
    assert!(
        before.contains("\"author\":\"wait\""),
        "the log reached `wait`: {before}"
    );

    file(flows.dir.path(), "go", "");
    let resumed = rlm(
        &flows.model_args(&["resume", "crash", "--events", &ev]),
        None,
    );
    resumed.assert_code(0);
    let after = std::fs::read_to_string(&events).expect("the whole log");
    assert!(
        after.starts_with(&before),
        "the part before the crash is kept:\n--- before\n{before}\n--- after\n{after}"
    );
    let added = &after[before.len()..];
    assert!(added.contains("\"author\":\"last\""), "{added}");
    for line in after.lines() {
        let _: serde_json::Value = serde_json::from_str(line).expect("every line is an event");
    }
}

#[test]
fn agent_refuses_a_file_log_on_a_file_of_its_bundle() {
    let project = Project::copy("v6-installed");
    let mock = Mock::start(json!({"models": {"root-model": {"replies": ["Hello!"]}}}));
    let agent = project.path("_bmad/bmm/agents/sm.md");
    for target in ["_bmad/bmm/agents/sm.md", "_bmad/bmm/config.yaml"] {
        let path = project.root().join(target);
        let before = std::fs::read(&path).expect("bundle file");
        let run = rlm(
            &[
                "agent",
                &agent,
                "--model",
                "root-model",
                "--base-url",
                &mock.url(),
                "--message",
                "hi",
                "--file-log",
                &text(&path),
                "--force",
            ]
            .map(String::from),
            None,
        );
        assert_refused(&run, "would destroy the input");
        assert_eq!(std::fs::read(&path).expect("kept"), before, "{target}");
    }
    assert_eq!(mock.log().len(), 0, "no model was called");
}

#[test]
fn bench_keeps_an_existing_plot_unless_forced() {
    let dir = tempfile::tempdir().expect("tempdir");
    let plot = file(dir.path(), "chart.svg", "a chart the user keeps");
    let bench = |force: bool| {
        let mut args = vec![
            "bench",
            "--width",
            "1",
            "--calls",
            "2",
            "--latency-ms",
            "1",
            "--quiet",
            "--plot",
        ]
        .into_iter()
        .map(String::from)
        .collect::<Vec<_>>();
        args.push(text(&plot));
        if force {
            args.push("--force".into());
        }
        rlm(&args, None)
    };
    kept_unless_forced(bench, &plot, "a chart the user keeps", "<svg");
}

#[test]
fn a_new_output_inside_a_context_directory_is_refused() {
    let mock = Mock::start(script(&["FINAL(x)"]));
    let dir = tempfile::tempdir().expect("tempdir");
    let docs = dir.path().join("docs");
    std::fs::create_dir(&docs).expect("mkdir");
    file(&docs, "note.md", CONTEXT);
    for flag in ["--trajectory", "--answer-file"] {
        let target = docs.join("new-output.txt");
        let run = mock.run(&[
            "--context",
            &text(&docs),
            "--query",
            "q",
            flag,
            &text(&target),
        ]);
        assert_refused(&run, "inside the context directory");
        assert!(!target.exists(), "{flag} made no file");
    }
    assert_eq!(mock.log().len(), 0, "no model was called");
}

#[test]
fn view_keeps_an_existing_page_unless_forced() {
    let dir = tempfile::tempdir().expect("tempdir");
    let jsonl = "{\"type\":\"header\",\"version\":1,\"query\":\"q\"}\n\
                 {\"type\":\"result\",\"answer\":\"42\",\"termination_reason\":\"final_answer\",\"metrics\":{}}\n";
    let trajectory = file(dir.path(), "t.jsonl", jsonl);
    let page = file(dir.path(), "t.html", "a page the user keeps");
    let view = |force: bool| {
        let mut args = vec!["view".to_owned(), text(&trajectory)];
        if force {
            args.push("--force".into());
        }
        rlm(&args, None)
    };
    kept_unless_forced(view, &page, "a page the user keeps", "42");
}
