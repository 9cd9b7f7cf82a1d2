//! Model code in a worker process (`--isolation process`, the default): a crash, a C-level
//! `exit()` or the memory limit ends the worker, not the run; a block stuck in native code is
//! stopped within a second of its limit (cell timeout, run timeout, Ctrl-C); the model is told
//! what happened, and a fresh worker restores the session's variables by replaying the blocks
//! that ran before — every sub-call answered from the run's record, none sent again.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bridge::mock::{Latency, MockConfig, Script};

use crate::support::{
    Mock, Run, file, marked, repl, rlm, rlm_on_terminal, signal_and_wait, wait_bounded,
};

/// A mock recording request bodies: `root-model` replies `replies` by turn, `sub-model` echoes.
fn mock(replies: &[&str]) -> Mock {
    Mock::start_with(MockConfig {
        script: Script::from_json_value(serde_json::json!({
            "models": {
                "root-model": {"replies": replies},
                "sub-model": {"replies": [{"behaviour": "echo"}]}
            }
        }))
        .expect("valid script"),
        record_requests: true,
        ..MockConfig::default()
    })
}

/// The arguments of `rlm run` against `mock` over a small context in `dir`, with a
/// trajectory there, plus `args`; and the trajectory's path.
fn traced_args(mock: &Mock, dir: &Path, args: &[&str]) -> (Vec<String>, PathBuf) {
    let context = file(dir, "ctx.txt", "alpha beta gamma");
    let trajectory = dir.join("t.jsonl");
    let mut all = mock.run_args(&["--query", "q"]);
    for (flag, path) in [("--context", &context), ("--trajectory", &trajectory)] {
        all.extend([flag.to_owned(), path.display().to_string()]);
    }
    all.extend(args.iter().map(|a| (*a).to_owned()));
    (all, trajectory)
}

/// `rlm run` over a small context with a trajectory, plus `args`; the run, its trajectory
/// lines and how long it took.
fn run(mock: &Mock, args: &[&str]) -> (Run, Vec<serde_json::Value>, Duration) {
    let dir = tempfile::tempdir().expect("tempdir");
    let (all, trajectory) = traced_args(mock, dir.path(), args);
    let started = Instant::now();
    let run = rlm(&all, None);
    let took = started.elapsed();
    (run, trajectory_lines(&trajectory), took)
}

/// Every line of the trajectory at `path` (none if there is none).
fn trajectory_lines(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("every trajectory line is JSON"))
        .collect()
}

/// The blocks of every iteration of a trajectory, in order.
fn blocks(lines: &[serde_json::Value]) -> Vec<&serde_json::Value> {
    lines
        .iter()
        .filter(|l| l["type"] == "iteration")
        .flat_map(|l| l["blocks"].as_array().expect("blocks"))
        .collect()
}

/// Requests the sub-model received.
fn sub_calls(mock: &Mock) -> usize {
    mock.log()
        .entries()
        .iter()
        .filter(|r| r.model == "sub-model")
        .count()
}

/// What the root model was sent in its `n`-th request (from 0).
fn root_request(mock: &Mock, n: usize) -> String {
    mock.log()
        .entries()
        .iter()
        .filter(|r| r.model == "root-model")
        .nth(n)
        .and_then(|r| r.body.clone())
        .unwrap_or_default()
}

/// Sets `x` and asks a sub-model once; a later block answers with both.
const SETUP: &str = "x = 41\nr = llm_query('remember me')\nprint('set up')";
const ANSWER: &str = "answer_text = f'{x + 1} {r}'\nFINAL_VAR(answer_text)";

#[test]
fn a_crash_ends_the_worker_not_the_run_and_the_session_comes_back_without_new_sub_calls() {
    let crashes = [
        ("import ctypes\nctypes.string_at(0)", "crashed", "SIGSEGV"),
        (
            "import ctypes\nctypes.CDLL(None).abort()",
            "crashed",
            "SIGABRT",
        ),
        (
            "import ctypes\nctypes.CDLL(None).exit(3)",
            "exited",
            "exit status 3",
        ),
        (
            "import ctypes, os, signal\nctypes.CDLL(None).kill(os.getpid(), signal.SIGKILL)",
            "killed",
            "killed (SIGKILL)",
        ),
    ];
    for (crash, kind, told) in crashes {
        let code = format!("print('before the crash')\n{crash}");
        let mock = mock(&[&repl(SETUP), &repl(&code), &repl(ANSWER)]);
        let (run, lines, _) = run(&mock, &[]);
        run.assert_code(0);
        assert_eq!(
            run.last_line(),
            "42 remember me",
            "{crash}: the variables are back"
        );
        assert_eq!(
            sub_calls(&mock),
            1,
            "{crash}: the replay sent no sub-call again"
        );
        // The model is told what happened, and what the session holds now.
        let told_model = root_request(&mock, 2);
        assert!(told_model.contains(told), "{crash}: {told_model}");
        assert!(
            told_model.contains("restored by running its 1 earlier block(s) again"),
            "{crash}: {told_model}"
        );
        assert!(
            told_model.contains("before the crash"),
            "{crash}: output kept"
        );
        // The trajectory records the crash and the restore.
        let crashed = blocks(&lines)[1];
        assert_eq!(crashed["restart"]["cause"]["kind"], kind, "{crashed}");
        assert_eq!(crashed["restart"]["restore"]["kind"], "replayed");
        assert_eq!(crashed["restart"]["restore"]["blocks"], 1);
        assert!(crashed["restart"]["restore_ms"].as_f64() > Some(0.0));
    }
}

/// What a block flushed just before its worker crashed is kept whole: a flush sends the
/// output the worker was batching (its first write went at once, the rest would have waited
/// a few milliseconds and died with the worker).
#[test]
fn what_a_block_flushed_the_moment_before_its_worker_crashed_is_kept() {
    let code = "import ctypes\n\
                print('kept', 'to', 'the', 'end', flush=True)\n\
                ctypes.CDLL(None).abort()";
    let mock = mock(&[&repl(code), "FINAL(done)"]);
    let (run, lines, _) = run(&mock, &[]);
    run.assert_code(0);
    let crashed = blocks(&lines)[0];
    assert_eq!(crashed["restart"]["cause"]["kind"], "crashed", "{crashed}");
    assert_eq!(crashed["stdout"], "kept to the end\n", "{crashed}");
}

/// A block whose worker crashes still counts the errors its code got instead of answers
/// before the crash (its parent's count: the worker's ended with it), each once: a model name
/// with no endpoint (a call, and each slot of a batch) and a prompt refused as too long for
/// the sub-model's window; the answered call counts none.
#[test]
fn a_block_whose_worker_crashed_counts_the_sub_call_errors_its_code_got() {
    let code = "a = llm_query('one', model='nope')\n\
                b = llm_query_batched(['two', 'three'], model='nope')\n\
                c = llm_query('x ' * 6000)\n\
                d = llm_query('four')\n\
                import ctypes\n\
                ctypes.CDLL(None).abort()";
    let mock = mock(&[&repl(code), "FINAL(done)"]);
    let (run, lines, _) = run(&mock, &["--sub-context-window", "2000"]);
    run.assert_code(0);
    let crashed = blocks(&lines)[0];
    assert_eq!(crashed["restart"]["cause"]["kind"], "crashed", "{crashed}");
    let result = lines.last().expect("the result line");
    assert_eq!(result["type"], "result", "{result}");
    assert_eq!(result["metrics"]["sub_call_errors"], 4, "{result}");
    assert_eq!(
        result["metrics"]["sub_calls"], 2,
        "refused and `four`: {result}"
    );
    assert_eq!(sub_calls(&mock), 1, "`four` only");
}

/// A block whose worker is killed says what its code asked and got before (its parent's
/// account: the worker's counts and texts ended with it): 3 `llm_query` calls (one answered,
/// one to a model name with no endpoint, one still in flight when the worker died) and a batch
/// of 2, what each call but the one in flight asked and got, and the one error the code got,
/// in the block's and the iteration's records, the run's metrics and `rlm show`. The call in
/// flight was asked but never answered: its cancellation after the worker's end is neither an
/// error nor a text.
#[test]
fn a_block_whose_worker_was_killed_keeps_the_sub_calls_its_code_made() {
    let code = "import ctypes, os, signal, threading, time\n\
                a = llm_query('one')\n\
                b = llm_query_batched(['two', 'three'])\n\
                c = llm_query('four', model='nope')\n\
                threading.Thread(target=llm_query, args=('late',), kwargs={'model': 'slow'}).start()\n\
                time.sleep(1)\n\
                ctypes.CDLL(None).kill(os.getpid(), signal.SIGKILL)";
    let mock = Mock::start_with(MockConfig {
        script: Script::from_json_value(serde_json::json!({
            "models": {
                "root-model": {"replies": [repl(code), "FINAL(done)"]},
                "sub-model": {"replies": [{"behaviour": "echo"}]},
                "slow-model": {
                    "replies": [{"behaviour": "echo"}],
                    "latency": {"kind": "fixed", "ms": 60_000}
                }
            }
        }))
        .expect("valid script"),
        ..MockConfig::default()
    });
    let dir = tempfile::tempdir().expect("tempdir");
    let (args, trajectory) = traced_args(&mock, dir.path(), &["--extra-model", "slow=slow-model"]);
    let run = rlm(&args, None);
    run.assert_code(0);
    let lines = trajectory_lines(&trajectory);
    let iteration = lines
        .iter()
        .find(|l| l["type"] == "iteration")
        .expect("the iteration");
    let killed = &iteration["blocks"][0];
    assert_eq!(killed["restart"]["cause"]["kind"], "killed", "{killed}");
    let counts = |record: &serde_json::Value| {
        [
            record["llm_query_calls"].clone(),
            record["llm_query_batched_calls"].clone(),
            record["sub_call_errors"].clone(),
        ]
    };
    let expected = [3, 1, 1].map(serde_json::Value::from);
    assert_eq!(counts(killed), expected, "the block: {killed:#}");
    assert_eq!(counts(iteration), expected, "the iteration: {iteration:#}");
    let result = lines.last().expect("the result line");
    assert_eq!(counts(&result["metrics"]), expected, "the run: {result:#}");
    let texts: Vec<(&str, &str)> = killed["sub_call_texts"]
        .as_array()
        .expect("the block's sub-call texts")
        .iter()
        .filter_map(|t| {
            let reply = t["reply"].as_str()?.split(';').next()?;
            Some((t["prompt"].as_str()?, reply))
        })
        .collect();
    assert_eq!(
        texts,
        [
            ("one", "one"),
            ("two", "two"),
            ("three", "three"),
            ("four", "Error: Unknown endpoint `nope`")
        ],
        "{killed:#}"
    );
    let show = rlm(&["show".into(), trajectory.display().to_string()], None);
    show.assert_code(0);
    for line in [
        "  ├ llm_query ×3, llm_query_batched ×1: ",
        "  │ `one` → `one`\n",
        "  │ `three` → `three`\n",
    ] {
        assert!(show.stdout.contains(line), "{line}: {}", show.stdout);
    }
}

#[test]
fn the_memory_limit_raises_memory_error_and_the_worker_survives() {
    let hog = "blob = bytearray(2 * 1024 ** 3)";
    let mock = mock(&[&repl(SETUP), &repl(hog), &repl(ANSWER)]);
    let (run, lines, _) = run(&mock, &["--memory-limit", "512M"]);
    run.assert_code(0);
    assert_eq!(run.last_line(), "42 remember me");
    let hogged = blocks(&lines)[1];
    assert_eq!(hogged["error"]["type_name"], "MemoryError", "{hogged}");
    assert!(
        hogged["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("memory limit is 0.5 GB")),
        "{hogged}"
    );
    assert!(hogged["restart"].is_null(), "no worker ended: {hogged}");
}

/// A memory cgroup of a test's own, limited to `limit` bytes with no swap: cgroup v2 where its
/// root hands the `memory` controller down, else v1's `memory` hierarchy. `rlm` started
/// through [`MemoryGroup::enter`] runs in it, and so do the workers it starts. Dropped, it
/// kills what is left in it and removes it, also when the test fails.
struct MemoryGroup {
    path: PathBuf,
    /// The file whose `oom_kill N` line counts the kills of its out-of-memory killer
    /// (`memory.events` in v2, `memory.oom_control` in v1).
    events: PathBuf,
}

impl MemoryGroup {
    /// Makes one, or says why none can be made here (not root, a read-only or missing
    /// cgroup file system, no memory controller).
    fn make(limit: u64) -> Result<Self, String> {
        // One name per group: `cargo test` runs the tests of a binary in one process.
        static MADE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let made = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("rlm-test-oom-{}-{made}", std::process::id());
        let v2 = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
            .into_iter()
            .map(Path::new)
            .find(|root| {
                std::fs::read_to_string(root.join("cgroup.subtree_control"))
                    .is_ok_and(|on| on.split_whitespace().any(|c| c == "memory"))
            });
        let (root, events, limits) = match v2 {
            Some(root) => (
                root,
                "memory.events",
                [("memory.max", limit), ("memory.swap.max", 0)],
            ),
            None => (
                Path::new("/sys/fs/cgroup/memory"),
                "memory.oom_control",
                [
                    ("memory.limit_in_bytes", limit),
                    ("memory.memsw.limit_in_bytes", limit),
                ],
            ),
        };
        if !root.join("cgroup.procs").exists() {
            return Err(format!(
                "no cgroup v2 hierarchy with the `memory` controller enabled, and no v1 memory hierarchy at `{}`",
                root.display()
            ));
        }
        let path = root.join(name);
        std::fs::create_dir(&path).map_err(|e| format!("cannot make `{}`: {e}", path.display()))?;
        let group = Self {
            events: path.join(events),
            path,
        };
        for (file, bytes) in limits {
            let file = group.path.join(file);
            // No swap file without swap accounting: the machine's swap, if any, then counts.
            if file.exists() {
                std::fs::write(&file, bytes.to_string())
                    .map_err(|e| format!("cannot write `{}`: {e}", file.display()))?;
            }
        }
        Ok(group)
    }

    /// Has the process `cmd` starts join the group before it runs anything.
    fn enter(&self, cmd: &mut std::process::Command) {
        use std::os::unix::ffi::OsStringExt as _;
        use std::os::unix::process::CommandExt as _;
        let procs =
            std::ffi::CString::new(self.path.join("cgroup.procs").into_os_string().into_vec())
                .expect("no NUL in a cgroup path");
        // SAFETY: between fork and exec, only async-signal-safe calls on a path made before
        // the fork; `0` written to `cgroup.procs` moves the writing process.
        unsafe {
            cmd.pre_exec(move || {
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                let written = fd >= 0 && libc::write(fd, b"0".as_ptr().cast(), 1) == 1;
                if fd >= 0 {
                    libc::close(fd);
                }
                if !written {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }

    /// The kills its out-of-memory killer made.
    fn oom_kills(&self) -> u64 {
        std::fs::read_to_string(&self.events)
            .unwrap_or_default()
            .lines()
            .find_map(|line| line.strip_prefix("oom_kill "))
            .and_then(|count| count.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Kills every process in the group with `SIGKILL`.
    fn kill_all(&self) {
        let procs = std::fs::read_to_string(self.path.join("cgroup.procs")).unwrap_or_default();
        for pid in procs
            .lines()
            .filter_map(|p| p.trim().parse::<libc::pid_t>().ok())
        {
            // SAFETY: a process of the test's own group, listed just now.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

impl Drop for MemoryGroup {
    fn drop(&mut self) {
        // A group can only be removed once empty; bounded.
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::fs::remove_dir(&self.path).is_err() && Instant::now() < deadline {
            self.kill_all();
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A [`MemoryGroup`] of `limit` bytes; `None` (the test is skipped, saying why) where none can
/// be made, except in CI (`CI` set), which runs as root where one can: there it fails.
fn memory_group(limit: u64) -> Option<MemoryGroup> {
    match MemoryGroup::make(limit) {
        Ok(group) => Some(group),
        Err(why) if std::env::var_os("CI").is_none() => {
            eprintln!("skipped: no memory cgroup can be made here: {why}");
            None
        }
        Err(why) => panic!("CI runs as root where a memory cgroup can be made: {why}"),
    }
}

/// The out-of-memory killer of a memory cgroup ends the worker (the biggest process of the
/// group `rlm` runs in), for real: the model is told the worker ran out of memory, the session
/// comes back in a fresh worker, the trajectory records it, and `rlm` itself lives on and
/// answers. Where no memory cgroup can be made (not root, no controller) it is skipped,
/// saying why, except in CI (`CI` set), which runs as root where one can.
#[test]
fn the_oom_killer_of_a_memory_cgroup_ends_the_worker_and_the_run_goes_on() {
    const LIMIT: u64 = 300 << 20;
    let Some(group) = memory_group(LIMIT) else {
        return;
    };
    // 10 MB at a time, each page written, up to 2 GB: far past the group's limit.
    let hog = "print('hogging')\nx = []\nfor _ in range(200):\n    x.append(bytearray(b'\\x01') * (10 << 20))";
    let mock = mock(&[&repl(SETUP), &repl(hog), &repl(ANSWER)]);
    let dir = tempfile::tempdir().expect("tempdir");
    let (all, trajectory) = traced_args(&mock, dir.path(), &["--isolation", "process"]);
    let mut cmd = crate::support::rlm_command(&all);
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    group.enter(&mut cmd);
    let started = Instant::now();
    let child = cmd.spawn().expect("rlm starts in the group");
    // Bounded: past a minute `rlm` is killed (the group's Drop kills what it left).
    let output = wait_bounded(
        child,
        Duration::from_secs(60),
        "the run whose worker is killed",
    );
    let took = started.elapsed();
    let run = Run {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    };
    // `rlm` survived the killer and answered from the restored session.
    run.assert_code(0);
    assert_eq!(run.last_line(), "42 remember me", "the variables are back");
    assert!(group.oom_kills() >= 1, "the group's killer killed");
    assert_eq!(sub_calls(&mock), 1, "the replay sent no sub-call again");
    let lines = trajectory_lines(&trajectory);
    let hogged = blocks(&lines)[1];
    assert_eq!(
        hogged["error"]["type_name"], "WorkerOutOfMemory",
        "{hogged}"
    );
    let told = hogged["error"]["message"].as_str().unwrap_or_default();
    assert!(
        told.starts_with("The worker process was killed (SIGKILL) holding ")
            && told.contains("while the system's out-of-memory killer was ending processes")
            && told.ends_with("so most likely for its memory; use less memory per block"),
        "{hogged}"
    );
    let cause = &hogged["restart"]["cause"];
    assert_eq!(cause["kind"], "out_of_memory", "{hogged}");
    assert_eq!(cause["signal"], libc::SIGKILL, "{hogged}");
    assert!(cause["oom_kills"].as_u64() >= Some(1), "{hogged}");
    // It held most of the group's limit when it was killed.
    assert!(cause["peak_bytes"].as_u64() > Some(LIMIT / 2), "{hogged}");
    assert_eq!(hogged["restart"]["restore"]["kind"], "replayed", "{hogged}");
    assert_eq!(hogged["restart"]["restore"]["blocks"], 1, "{hogged}");
    // The model is told what happened, and what the session holds now.
    let told_model = root_request(&mock, 2);
    assert!(told_model.contains("out-of-memory killer"), "{told_model}");
    assert!(
        told_model.contains("restored by running its 1 earlier block(s) again"),
        "{told_model}"
    );
    assert!(told_model.contains("hogging"), "output kept: {told_model}");
    eprintln!("the run took {took:?}");
}

/// A `kill -9` of the worker while the out-of-memory killer of another memory cgroup on the
/// machine ends a process is told as a kill, not as memory: the kills `rlm` counts are those
/// of the group it and its workers run in, not the machine's.
#[test]
fn a_kill_of_the_worker_while_another_groups_killer_kills_is_told_a_kill() {
    let Some(other) = memory_group(64 << 20) else {
        return;
    };
    let waits = "import ctypes, os, signal, time\nprint('waiting')\ntime.sleep(4)\nctypes.CDLL(None).kill(os.getpid(), signal.SIGKILL)";
    let mock = mock(&[&repl(waits), "FINAL(after)"]);
    let dir = tempfile::tempdir().expect("tempdir");
    let (all, trajectory) = traced_args(&mock, dir.path(), &["--isolation", "process"]);
    let rlm = crate::support::rlm_command(&all)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("rlm starts");
    // The block is about to run once the trajectory has it (bounded).
    let deadline = Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(&trajectory).is_ok_and(|t| t.contains("time.sleep(4)"))
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    let block_started = Instant::now();
    // Meanwhile a process of the other group outgrows it and is killed.
    let mut hog = std::process::Command::new("python3");
    hog.args([
        "-c",
        "x = [bytearray(b'\\x01') * (10 << 20) for _ in range(200)]",
    ]);
    hog.stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    other.enter(&mut hog);
    let hogged = hog.status().expect("python3 runs in the other group");
    let hog_took = block_started.elapsed();
    let output = wait_bounded(
        rlm,
        Duration::from_secs(60),
        "the run whose worker is killed",
    );
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&hogged),
        Some(libc::SIGKILL),
        "the other group's killer killed"
    );
    assert!(other.oom_kills() >= 1, "the other group counted its kill");
    assert!(
        hog_took < Duration::from_secs(3),
        "the other group's kill came {hog_took:?} after the block started: maybe after the worker's"
    );
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let lines = trajectory_lines(&trajectory);
    let killed = blocks(&lines)[0];
    assert_eq!(killed["restart"]["cause"]["kind"], "killed", "{killed}");
    assert_eq!(killed["restart"]["cause"]["oom_kills"], 0, "{killed}");
    assert_eq!(killed["error"]["type_name"], "WorkerKilled", "{killed}");
}

#[test]
fn a_regex_stuck_in_c_is_stopped_within_a_second_of_the_cell_timeout() {
    let stuck = "import re\nre.match(r'(a+)+$', 'a' * 32 + 'b')";
    let mock = mock(&[&repl(SETUP), &repl(stuck), &repl(ANSWER)]);
    let (run, lines, _) = run(&mock, &["--cell-timeout", "2"]);
    run.assert_code(0);
    assert_eq!(run.last_line(), "42 remember me");
    let stopped = blocks(&lines)[1];
    assert_eq!(stopped["timed_out"], true, "{stopped}");
    assert_eq!(stopped["error"]["type_name"], "CellTimeout");
    let ms = stopped["duration_ms"].as_f64().expect("duration");
    assert!(ms <= 3_000.0, "stopped {ms:.0} ms into a 2 s limit");
    assert_eq!(stopped["restart"]["cause"]["kind"], "stopped");
    assert_eq!(sub_calls(&mock), 1);
}

#[test]
fn a_runaway_block_stopped_by_the_run_timeout_is_interrupted_in_a_worker_that_lives_on() {
    // The worker's session thread takes each block from the link itself; its main thread reads
    // while the block runs: the first block's sub-call answer, then the stop `rlm` sends when
    // the run's time is up, which interrupts the loop. The worker is not ended (as it is when
    // nobody reads the stop: half a second later).
    let runaway = "n = 0\nwhile True:\n    n += 1";
    let mock = mock(&[&repl(SETUP), &repl(runaway), "FINAL(never)"]);
    let (run, lines, took) = run(&mock, &["--timeout", "4", "--cell-timeout", "60"]);
    run.assert_code(3);
    let ran = blocks(&lines);
    assert_eq!(ran[0]["stdout"], "set up\n", "{}", ran[0]);
    let stopped = ran[1];
    assert_eq!(stopped["error"]["type_name"], "CellCancelled", "{stopped}");
    assert!(
        stopped["restart"].is_null(),
        "its worker was ended: {stopped}"
    );
    assert_eq!(sub_calls(&mock), 1);
    assert!(took < Duration::from_secs(30), "the run ended ({took:?})");
}

/// `stopped` (a block's trajectory record) ended within a second of a 4 s run limit, and its
/// run, which `took` so long, did not wait for anything longer.
fn stopped_by_a_4_s_run_timeout(stopped: &serde_json::Value, took: Duration) {
    let ms = stopped["duration_ms"].as_f64().expect("duration");
    assert!(
        ms <= 5_000.0,
        "stopped {ms:.0} ms into a run limited to 4 s"
    );
    assert!(took < Duration::from_secs(30), "the run ended ({took:?})");
}

/// A mock whose `sub-model` takes a minute to echo: a block's sub-call waits.
fn slow_sub_model(replies: &[&str]) -> Mock {
    Mock::start_with(MockConfig {
        script: Script::from_json_value(serde_json::json!({
            "models": {
                "root-model": {"replies": replies},
                "sub-model": {
                    "replies": [{"behaviour": "echo"}],
                    "latency": {"kind": "fixed", "ms": 60_000}
                }
            }
        }))
        .expect("valid script"),
        ..MockConfig::default()
    })
}

#[test]
fn a_block_waiting_on_a_sub_call_is_stopped_by_the_run_timeout_in_a_worker_that_lives_on() {
    // The thread that waits for the sub-call's answer reads the worker's link meanwhile: the
    // stop `rlm` sends when the run's time is up goes from it to the main thread, which has
    // the watchdog interrupt the block (the sub-call given up, then the loop after it). The
    // worker is not ended (as it is when nobody acts on the stop: half a second later).
    let waits = "r = llm_query('slow')\nwhile True:\n    pass";
    let mock = slow_sub_model(&[&repl(waits), "FINAL(never)"]);
    let (run, lines, took) = run(&mock, &["--timeout", "4", "--cell-timeout", "60"]);
    run.assert_code(3);
    let stopped = blocks(&lines)[0];
    assert_eq!(stopped["error"]["type_name"], "CellCancelled", "{stopped}");
    assert!(
        stopped["restart"].is_null(),
        "its worker was ended: {stopped}"
    );
    stopped_by_a_4_s_run_timeout(stopped, took);
}

#[test]
fn a_worker_killed_while_a_sub_call_waits_ends_the_block_not_the_run() {
    // SIGABRT (SIGKILL reads as the out-of-memory killer); `os.kill` of its own process is
    // refused in the REPL: the C library's `kill`.
    let killed = "import ctypes, os, threading\nkill = ctypes.CDLL(None).kill\nthreading.Timer(1.0, kill, (os.getpid(), 6)).start()\nr = llm_query('slow')";
    let after = "answer_text = 'survived'\nFINAL_VAR(answer_text)";
    let mock = slow_sub_model(&[&repl(killed), &repl(after)]);
    let (run, lines, took) = run(&mock, &[]);
    run.assert_code(0);
    assert_eq!(run.last_line(), "survived");
    let ended = blocks(&lines)[0];
    assert_eq!(ended["restart"]["cause"]["kind"], "crashed", "{ended}");
    assert!(ended.to_string().contains("SIGABRT"), "{ended}");
    assert!(took < Duration::from_secs(30), "the run ended ({took:?})");
}

#[test]
fn a_c_sleep_is_stopped_within_a_second_of_the_run_timeout() {
    let stuck = "import ctypes\nctypes.CDLL(None).sleep(40)";
    let mock = mock(&[&repl(stuck), "FINAL(never)"]);
    let (run, lines, took) = run(&mock, &["--timeout", "4", "--json"]);
    run.assert_code(3);
    assert_eq!(run.json()["termination_reason"], "timeout");
    let stopped = blocks(&lines)[0];
    stopped_by_a_4_s_run_timeout(stopped, took);
}

#[test]
fn ctrl_c_stops_a_block_stuck_in_c_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let stuck = "import ctypes\nctypes.CDLL(None).sleep(60)";
    let mock = mock(&[&repl(stuck), "FINAL(never)"]);
    let context = file(dir.path(), "ctx.txt", "some context");
    let child = mock.spawn_run(&context, &dir.path().join("t.jsonl"));
    let deadline = Instant::now() + Duration::from_secs(30);
    while root_request(&mock, 0).is_empty() {
        assert!(Instant::now() < deadline, "the run asked its model");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The block starts right after the model's reply; give it time to be in `sleep`.
    std::thread::sleep(Duration::from_millis(1_000));
    let output = signal_and_wait(child, libc::SIGINT, "Ctrl-C during a 60 s sleep in C");
    assert_eq!(output.status.code(), Some(130));
}

/// Ctrl-C typed on the terminal `rlm` runs on (the byte the key sends, through the
/// terminal, not a signal sent by hand), while a confined worker's block waits with a
/// process it started: the run stops at once, prints its best answer, keeps its trajectory
/// closed and says the block was interrupted; nothing the block started is left.
#[test]
fn ctrl_c_typed_on_the_terminal_stops_a_confined_run_and_keeps_its_logs() {
    let mark = format!("rlm-ctrl-c-{}", std::process::id());
    let waiting = format!(
        "import subprocess, time\nsleeper = subprocess.Popen(['sh', '-c', 'sleep 60; : {mark}'])\ntime.sleep(60)"
    );
    let mock = mock(&[
        &format!(
            "{}\nFINAL(draft answer)",
            repl("print('working')\nraise ValueError('not yet')")
        ),
        &repl(&waiting),
        "FINAL(never)",
    ]);
    let dir = tempfile::tempdir().expect("tempdir");
    let (all, trajectory) = traced_args(&mock, dir.path(), &["--isolation", "process"]);
    let mut typed = None;
    let run = rlm_on_terminal(&all, &[], |pid, keyboard| {
        // The second block runs once its process does.
        let deadline = Instant::now() + Duration::from_secs(30);
        while marked(&mark).is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if marked(&mark).is_empty() {
            // SAFETY: our own unreaped child: the test fails below on its exit code.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            return;
        }
        std::io::Write::write_all(keyboard, b"\x03").expect("Ctrl-C typed");
        typed = Some(Instant::now());
        // Bounded: killed past the deadline (the run then fails the test).
        let deadline = Instant::now() + Duration::from_secs(30);
        let exited = || {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
                stat.rsplit_once(") ")
                    .is_none_or(|(_, r)| r.starts_with('Z'))
            })
        };
        while !exited() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        // SAFETY: our own unreaped child (a no-op when it has exited).
        unsafe { libc::kill(pid, libc::SIGKILL) };
    });
    let took = typed.map(|t| t.elapsed());
    let screen = &run.terminal;
    assert_eq!(run.code, Some(130), "{screen}");
    assert!(
        took.is_some_and(|t| t < Duration::from_secs(10)),
        "Ctrl-C took {took:?}: {screen}"
    );
    assert_eq!(run.stdout.trim_end(), "draft answer", "{screen}");
    assert!(screen.contains("Interrupted"), "{screen}");
    crate::run::assert_closed_as_interrupted(&trajectory);
    let deadline = Instant::now() + Duration::from_secs(3);
    while !marked(&mark).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(marked(&mark), Vec::<u32>::new(), "left after Ctrl-C");
}

#[test]
fn on_crash_fresh_starts_over_with_the_contexts_only() {
    let check = "print('x' in globals(), len(context))\nchecked = 'yes'\nFINAL_VAR(checked)";
    let mock = mock(&[
        &repl(SETUP),
        &repl("import ctypes\nctypes.string_at(0)"),
        &repl(check),
    ]);
    let (run, lines, _) = run(&mock, &["--on-crash", "fresh"]);
    run.assert_code(0);
    let after = blocks(&lines)[2];
    assert!(
        after["stdout"]
            .as_str()
            .is_some_and(|s| s.starts_with("False 16\n")),
        "{after}"
    );
    assert!(
        root_request(&mock, 2).contains("earlier variables are gone"),
        "the model is told"
    );
    assert_eq!(blocks(&lines)[1]["restart"]["restore"]["kind"], "fresh");
}

#[test]
fn a_replay_answers_every_recorded_sub_call_and_says_which_it_could_not() {
    // The batch replays from the record; a prompt built from a random number cannot.
    let setup = "import random\nrs = llm_query_batched(['a', 'b', 'c'])\n\
                 z = llm_query(f'n{random.random()}')";
    let answer = "answer_text = f\"{rs} {z.startswith('Error')}\"\nFINAL_VAR(answer_text)";
    let mock = mock(&[
        &repl(setup),
        &repl("import ctypes\nctypes.string_at(0)"),
        &repl(answer),
    ]);
    let (run, lines, _) = run(&mock, &[]);
    run.assert_code(0);
    assert_eq!(run.last_line(), "['a', 'b', 'c'] True");
    assert_eq!(
        sub_calls(&mock),
        4,
        "three in the batch, one alone: none again"
    );
    let restore = &blocks(&lines)[1]["restart"]["restore"];
    assert_eq!(restore["unanswered"], 1, "{restore}");
    assert!(
        root_request(&mock, 2).contains("asked something not asked the first time"),
        "the model is told"
    );
}

#[test]
fn no_process_the_code_starts_outlives_the_run() {
    // Marked so that this test finds them among the machine's processes, whatever their
    // pid in the worker's namespace.
    let mark = format!("300.{}", std::process::id());
    let code = format!(
        "import os, subprocess\n\
         sleeper = subprocess.Popen(['sleep', '{mark}'])\n\
         pid = os.fork()\n\
         if pid == 0:\n    os.execvp('sleep', ['sleep', '{mark}'])\n\
         print('started')"
    );
    let mock = mock(&[&repl(&code), "FINAL(done)"]);
    let (run, _, _) = run(&mock, &[]);
    run.assert_code(0);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = marked(&mark);
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "still running: {left:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_run_whose_blocks_hold_no_process_asks_its_worker_nothing_at_its_end() {
    // The block returns, then a thread it left behind holds the worker's GIL (a regex stuck
    // in C) while the model writes its answer: the worker can answer no request that needs
    // Python. The run's end must not ask it to end processes its blocks did not leave (that
    // request waited 30 s); its close then kills it.
    let code = "import re, threading\n\
                stuck = lambda: re.match(r'(a+)+$', 'a' * 64 + 'b')\n\
                threading.Timer(0.2, stuck).start()\n\
                print('armed')";
    let mock = Mock::start_with(MockConfig {
        script: Script::from_json_value(serde_json::json!({
            "models": {"root-model": {"replies": [repl(code), "FINAL(done)"]}}
        }))
        .expect("valid script"),
        latency: Latency::fixed(Duration::from_millis(1000)),
        ..MockConfig::default()
    });
    let (run, lines, took) = run(&mock, &[]);
    run.assert_code(0);
    assert_eq!(run.stdout.trim(), "done", "{}", run.stderr);
    let ran = blocks(&lines);
    assert_eq!(ran.len(), 1, "{lines:?}");
    assert_eq!(ran[0]["stdout"], "armed\n", "{lines:?}");
    assert!(took < Duration::from_secs(20), "the run took {took:?}");
}

#[test]
fn every_line_a_block_writes_reaches_its_own_result_in_order() {
    // After its first line, the block writes in a burst, which the worker batches (sent at
    // 32 KiB or 10 ms after): what is still buffered when the block ends goes out before its
    // reply, so nothing is lost and nothing spills into the next block's output.
    let first = "import sys\n\
                 for i in range(2000):\n    print('line', i)\n\
                 print('to stderr', file=sys.stderr)\n\
                 print('last')";
    let mock = mock(&[&repl(first), &repl("print('second')"), "FINAL(done)"]);
    let (run, lines, _) = run(&mock, &[]);
    run.assert_code(0);
    let ran = blocks(&lines);
    assert_eq!(ran.len(), 2, "{lines:?}");
    let expected: String = (0..2000)
        .map(|i| format!("line {i}\n"))
        .chain(["last\n".to_owned()])
        .collect();
    let stdout = ran[0]["stdout"].as_str().unwrap_or_default();
    assert!(
        stdout == expected,
        "{} of {} characters, ending {:?}",
        stdout.len(),
        expected.len(),
        &stdout[stdout.len().saturating_sub(40)..]
    );
    assert_eq!(ran[0]["stderr"], "to stderr\n");
    assert_eq!(ran[1]["stdout"], "second\n", "{:?}", ran[1]);
}

#[test]
fn debug_logs_say_what_confines_the_code_and_none_says_nothing_does() {
    let mock = mock(&["FINAL(done)"]);
    let (run, _, _) = run(&mock, &["-vv"]);
    run.assert_code(0);
    assert!(
        run.stderr
            .lines()
            .any(|l| l.contains("model code runs in a worker process")),
        "{}",
        run.stderr
    );
    let mock = self::mock(&["FINAL(done)"]);
    let (run, _, _) = self::run(&mock, &["-vv", "--isolation", "none"]);
    run.assert_code(0);
    assert!(run.stderr.contains("nothing confines it"), "{}", run.stderr);
}
