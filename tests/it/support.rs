//! Running `rlm` against an in-process mock LM server.

use std::io::Read;
use std::os::fd::{FromRawFd as _, OwnedFd};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use bridge::mock::{MockConfig, MockServer, RequestLog, RequestRecord, Script};

/// One tokio runtime for every mock server of this test binary.
fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("tokio runtime")
    })
}

/// `future`'s output, on the test binary's runtime (e.g. a run database's reads).
pub(crate) fn block_on<F: std::future::Future>(future: F) -> F::Output {
    runtime().block_on(future)
}

/// A mock server for one test; stops when dropped.
pub(crate) struct Mock {
    server: MockServer,
}

impl Mock {
    /// Serves `script` (JSON).
    pub(crate) fn start(script: serde_json::Value) -> Self {
        Self::start_with(MockConfig {
            script: Script::from_json_value(script).expect("valid script"),
            ..MockConfig::default()
        })
    }

    pub(crate) fn start_with(config: MockConfig) -> Self {
        let server = runtime()
            .block_on(MockServer::start(config))
            .expect("mock server starts");
        Self { server }
    }

    pub(crate) fn url(&self) -> String {
        self.server.openai_base_url()
    }

    /// The base URL of the Anthropic wire format.
    pub(crate) fn anthropic_url(&self) -> String {
        self.server.anthropic_base_url()
    }

    pub(crate) fn log(&self) -> RequestLog {
        self.server.log()
    }

    /// How many requests the root model received.
    pub(crate) fn root_requests(&self) -> usize {
        self.requests_to("root-model")
    }

    /// How many requests named `model`.
    pub(crate) fn requests_to(&self, model: &str) -> usize {
        self.log()
            .entries()
            .iter()
            .filter(|r| r.model == model)
            .count()
    }

    /// `rlm run --query q` over `context` with a trajectory, as a child process left
    /// running (stdout and stderr piped), for tests that signal or kill it.
    pub(crate) fn spawn_run(&self, context: &Path, trajectory: &Path) -> std::process::Child {
        self.spawn_run_with(context, trajectory, &[], &[])
    }

    /// [`Mock::spawn_run`] plus `extra` arguments and environment variables.
    pub(crate) fn spawn_run_with(
        &self,
        context: &Path,
        trajectory: &Path,
        extra: &[&str],
        envs: &[(&str, &Path)],
    ) -> std::process::Child {
        Command::new(env!("CARGO_BIN_EXE_rlm"))
            .args([
                "run",
                "--base-url",
                &self.url(),
                "--model",
                "root-model",
                "--query",
                "q",
            ])
            .arg("--context")
            .arg(context)
            .arg("--trajectory")
            .arg(trajectory)
            .args(extra)
            .envs(envs.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("rlm starts")
    }

    /// `rlm run` against this server with `root-model` / `sub-model`, plus `args`.
    pub(crate) fn run(&self, args: &[&str]) -> Run {
        self.run_env(args, &[])
    }

    /// Like [`Mock::run`], with extra environment variables.
    pub(crate) fn run_env(&self, args: &[&str], envs: &[(&str, &str)]) -> Run {
        rlm_with(&self.run_args(args), None, envs)
    }

    /// The arguments of [`Mock::run`]: `rlm run` against this server with `root-model` /
    /// `sub-model`, plus `args`.
    pub(crate) fn run_args(&self, args: &[&str]) -> Vec<String> {
        let mut full = vec![
            "run",
            "--base-url",
            &self.url(),
            "--model",
            "root-model",
            "--sub-model",
            "sub-model",
        ]
        .into_iter()
        .map(str::to_owned)
        .collect::<Vec<_>>();
        full.extend(args.iter().map(|s| s.to_string()));
        full
    }
}

/// The outcome of one `rlm` process.
#[derive(Debug)]
pub(crate) struct Run {
    pub(crate) code: Option<i32>,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

impl Run {
    /// The last non-empty stdout line.
    pub(crate) fn last_line(&self) -> &str {
        self.stdout
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or_default()
    }

    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "stdout is not JSON ({e}):\n{}\n{}",
                self.stdout, self.stderr
            )
        })
    }

    #[track_caller]
    pub(crate) fn assert_code(&self, code: i32) -> &Self {
        assert_eq!(
            self.code,
            Some(code),
            "exit code\n--- stdout\n{}\n--- stderr\n{}",
            self.stdout,
            self.stderr
        );
        self
    }
}

/// Runs `rlm` with `args` (and `stdin` piped in, if given), with a clean environment for the
/// variables `rlm` reads.
pub(crate) fn rlm(args: &[String], stdin: Option<&[u8]>) -> Run {
    rlm_with(args, stdin, &[])
}

/// Like [`rlm`], with extra environment variables.
pub(crate) fn rlm_with(args: &[String], stdin: Option<&[u8]>, envs: &[(&str, &str)]) -> Run {
    let mut cmd = rlm_command(args);
    cmd.envs(envs.iter().copied());
    finish(cmd, stdin)
}

/// Like [`rlm`], run in the folder `dir`.
pub(crate) fn rlm_in(dir: &Path, args: &[String], stdin: Option<&[u8]>) -> Run {
    let mut cmd = rlm_command(args);
    cmd.current_dir(dir);
    finish(cmd, stdin)
}

/// Whether this machine gives transparent huge pages (their mode is not `never`); if not, a
/// test that needs them is skipped (it says so), except in CI.
pub(crate) fn transparent_huge_pages_here() -> bool {
    let mode = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled");
    if mode.as_ref().is_ok_and(|m| !m.contains("[never]")) {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "CI runs where transparent huge pages can be had: {mode:?}"
    );
    eprintln!("skipped: no transparent huge pages here ({mode:?})");
    false
}

/// Has `command` start with transparent huge pages turned off for it (`PR_SET_THP_DISABLE`,
/// which its children inherit).
pub(crate) fn without_transparent_huge_pages(command: &mut Command) {
    // SAFETY: one prctl in the forked child before exec (async-signal-safe).
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
}

/// Runs `cmd` (with `stdin` piped in, if given) to its end.
pub(crate) fn finish(mut cmd: Command, stdin: Option<&[u8]>) -> Run {
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        });
    let mut child = cmd.spawn().expect("rlm starts");
    if let Some(input) = stdin {
        use std::io::Write;
        let mut pipe = child.stdin.take().expect("stdin pipe");
        pipe.write_all(input).expect("write stdin");
    }
    let Output {
        status,
        stdout,
        stderr,
    } = child.wait_with_output().expect("rlm finishes");
    Run {
        code: status.code(),
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
    }
}

/// How long [`signal_and_wait`] gives a signalled `rlm` to end.
const STOP_BOUND: Duration = Duration::from_secs(10);

/// Sends `signal` to `child` (an `rlm` left running, its stdout and stderr piped) and waits
/// for it to end: its output. One still running 10 s after the signal is killed, and the
/// test fails, naming `what` and showing what it wrote to stderr.
#[track_caller]
pub(crate) fn signal_and_wait(child: Child, signal: libc::c_int, what: &str) -> Output {
    let pid = libc::pid_t::try_from(child.id()).expect("pid");
    // SAFETY: sends a signal to our own child process, not reaped yet.
    let sent = unsafe { libc::kill(pid, signal) };
    assert_eq!(sent, 0, "{what}: signal {signal} sent");
    wait_bounded(child, STOP_BOUND, &format!("{what}, after signal {signal}"))
}

/// Waits for `child` (an `rlm` left running, its stdout and stderr piped) to end: its
/// output. One still running after `bound` is killed, and the test fails, naming `what` and
/// showing what it wrote to stderr.
#[track_caller]
pub(crate) fn wait_bounded(mut child: Child, bound: Duration, what: &str) -> Output {
    let (stdout, stderr) = (drain(child.stdout.take()), drain(child.stderr.take()));
    let deadline = Instant::now() + bound;
    let status = loop {
        if let Some(status) = child.try_wait().expect("rlm's status") {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{what}: rlm did not end within {bound:?} (killed); its stderr:\n{}",
                String::from_utf8_lossy(&stderr.wait(what))
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: stdout.wait(what),
        stderr: stderr.wait(what),
    }
}

/// A thread reading a child's output pipe to its end.
struct Drained(Option<std::thread::JoinHandle<Vec<u8>>>);

/// Reads `pipe` (if any) on a thread of its own, so that the child never blocks on a full pipe.
fn drain(pipe: Option<impl Read + Send + 'static>) -> Drained {
    Drained(pipe.map(|mut pipe| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            bytes
        })
    }))
}

impl Drained {
    /// Everything read, once the pipe closed (bounded: a process the child started and left
    /// running could hold it open).
    #[track_caller]
    fn wait(self, what: &str) -> Vec<u8> {
        let Some(reader) = self.0 else {
            return Vec::new();
        };
        let deadline = Instant::now() + STOP_BOUND;
        while !reader.is_finished() {
            assert!(
                Instant::now() < deadline,
                "{what}: rlm ended, but its output stayed open: a process it started still runs"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        reader.join().expect("the pipe's reader")
    }
}

/// `rlm` with `args`, with a clean environment for the variables `rlm` reads.
pub(crate) fn rlm_command(args: &[String]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rlm"));
    cmd.args(args)
        .env_remove("OPENAI_API_KEY")
        .env_remove("ANTHROPIC_API_KEY")
        .env("NO_COLOR", "1");
    for (key, _) in std::env::vars() {
        if key.starts_with("RLM_") {
            cmd.env_remove(key);
        }
    }
    cmd
}

/// A temporary directory holding `name` with `contents`.
pub(crate) fn file(dir: &Path, name: &str, contents: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, contents).expect("write test file");
    path
}

/// A root model whose replies are `replies` by turn, and a sub-model that echoes.
pub(crate) fn script(replies: &[&str]) -> serde_json::Value {
    serde_json::json!({
        "models": {
            "root-model": {"replies": replies},
            "sub-model": {"replies": [{"behaviour": "echo"}]}
        }
    })
}

/// A ```repl block.
pub(crate) fn repl(code: &str) -> String {
    format!("```repl\n{code}\n```")
}

/// `text` with what changes between runs replaced (times, token counts — prompts hold
/// temporary paths —, temporary paths), for snapshots and comparisons.
pub(crate) fn redacted(text: &str) -> String {
    static RULES: OnceLock<Vec<(regex::Regex, &'static str)>> = OnceLock::new();
    let rules = RULES.get_or_init(|| {
        [
            (r"\(\d+ ms\)", "([ms] ms)"),
            (r"\d+(\.\d+)?s\b", "[secs]s"),
            (r"\d+ tokens", "[n] tokens"),
            (r"/[^\s`']*/\.tmp[^\s`'/]*", "[tmp]"),
        ]
        .into_iter()
        .map(|(pattern, with)| (regex::Regex::new(pattern).expect("valid regex"), with))
        .collect()
    });
    rules.iter().fold(text.to_owned(), |text, (pattern, with)| {
        pattern.replace_all(&text, *with).into_owned()
    })
}

/// `rlm run --query q` over a small text context, against a mock serving `replies`, plus
/// `extra` arguments.
pub(crate) fn run_replies(replies: &[&str], extra: &[&str]) -> (Mock, Run) {
    let mock = Mock::start(script(replies));
    let dir = tempfile::tempdir().expect("tempdir");
    let context = file(dir.path(), "ctx.txt", "alpha beta gamma");
    let mut args = vec![
        "--context",
        context.to_str().expect("utf-8"),
        "--query",
        "q",
    ];
    args.extend_from_slice(extra);
    let run = mock.run(&args);
    (mock, run)
}

/// [`run_replies`] with `--trajectory`: also every line of the trajectory.
pub(crate) fn run_replies_traced(
    replies: &[&str],
    extra: &[&str],
) -> (Mock, Run, Vec<serde_json::Value>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("t.jsonl");
    let mut args = vec!["--trajectory", path.to_str().expect("utf-8")];
    args.extend_from_slice(extra);
    let (mock, run) = run_replies(replies, &args);
    let lines = std::fs::read_to_string(&path)
        .expect("trajectory")
        .lines()
        .map(|l| serde_json::from_str(l).expect("every trajectory line is JSON"))
        .collect();
    (mock, run, lines)
}

/// The live processes (zombies left out) whose command line contains `mark`: what a test
/// started with a unique marker and must not find left behind.
pub(crate) fn marked(mark: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|s| s.rsplit_once(") ").is_some_and(|(_, r)| r.starts_with('Z')));
            !zombie && String::from_utf8_lossy(&cmdline).contains(mark)
        })
        .collect()
}

/// The whole last user message (with text) of a request the mock recorded with its body
/// (`record_requests`), on either wire format: the log's `last_user` keeps only its first
/// 200 characters, which a temporary path early in the message can fill.
pub(crate) fn last_user_message(record: &RequestRecord) -> String {
    let body = record
        .body
        .as_deref()
        .expect("a recorded body (`record_requests`)");
    let body: serde_json::Value = serde_json::from_str(body).expect("a JSON body");
    let messages = body["messages"].as_array().expect("`messages`");
    let text = |content: &serde_json::Value| match content {
        serde_json::Value::String(text) => Some(text.clone()),
        parts => {
            let texts: Vec<&str> = parts
                .as_array()?
                .iter()
                .filter_map(|part| part["text"].as_str())
                .collect();
            (!texts.is_empty()).then(|| texts.join("\n"))
        }
    };
    messages
        .iter()
        .rev()
        .filter(|m| m["role"] == "user")
        .find_map(|m| text(&m["content"]))
        .unwrap_or_default()
}

/// What `rlm` wrote to a terminal, its stdout and its exit code.
pub(crate) struct TerminalRun {
    pub(crate) code: Option<i32>,
    pub(crate) stdout: String,
    pub(crate) terminal: String,
}

/// A pseudo-terminal of 120 × 40: its master end (not inherited by a process this one
/// starts, so that the terminal goes when this process closes it) and its slave end.
pub(crate) fn pseudo_terminal() -> (OwnedFd, OwnedFd) {
    let (mut master, mut slave) = (0, 0);
    let size = libc::winsize {
        ws_row: 40,
        ws_col: 120,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: openpty writes two new descriptors through the pointers; the rest are
    // optional inputs (null) or point to a live winsize.
    let opened = unsafe {
        libc::openpty(
            &raw mut master,
            &raw mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            &raw const size,
        )
    };
    assert_eq!(opened, 0, "a pseudo-terminal");
    // SAFETY: sets a flag of a descriptor just opened.
    let cloexec = unsafe { libc::fcntl(master, libc::F_SETFD, libc::FD_CLOEXEC) };
    assert_eq!(cloexec, 0);
    // SAFETY: both descriptors were just opened and belong to nobody else.
    unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) }
}

/// Has the process `cmd` starts lead a session of its own whose controlling terminal is its
/// stderr (a pseudo-terminal's end), as a shell's command on that terminal.
pub(crate) fn lead_a_session_on_stderr(cmd: &mut Command) {
    // SAFETY: async-signal-safe calls between fork and exec: a new session, and stderr (the
    // terminal) as its controlling terminal.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 || libc::ioctl(2, libc::TIOCSCTTY, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Runs `rlm` with stderr on a pseudo-terminal of 120 × 40 (stdout piped, `CI` unset) in a
/// temporary working directory (its run database goes there); `during` gets its pid while it
/// runs, and the terminal's keyboard: what it writes there is typed (`\x03`: Ctrl-C). As
/// from a shell, `rlm` leads a session whose controlling terminal is that one.
pub(crate) fn rlm_on_terminal(
    all: &[String],
    envs: &[(&str, &str)],
    during: impl FnOnce(libc::pid_t, &mut std::fs::File),
) -> TerminalRun {
    let (master, slave) = pseudo_terminal();
    let cwd = tempfile::tempdir().expect("tempdir");
    let mut cmd = crate::support::rlm_command(all);
    cmd.current_dir(cwd.path())
        .env_remove("CI")
        .env("TERM", "xterm-256color")
        .envs(envs.iter().copied())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(slave);
    lead_a_session_on_stderr(&mut cmd);
    let child = cmd.spawn().expect("rlm starts");
    // Only the child holds the terminal now: reading ends when it exits.
    drop(cmd);
    let mut keyboard = std::fs::File::from(master.try_clone().expect("the terminal's keyboard"));
    let reader = std::thread::spawn(move || {
        let mut terminal = std::fs::File::from(master);
        let mut bytes = Vec::new();
        let mut chunk = [0u8; 4096];
        // Linux answers EIO once the last writer is gone.
        while let Ok(n @ 1..) = terminal.read(&mut chunk) {
            bytes.extend_from_slice(&chunk[..n]);
        }
        String::from_utf8_lossy(&bytes).into_owned()
    });
    during(
        libc::pid_t::try_from(child.id()).expect("pid"),
        &mut keyboard,
    );
    drop(keyboard);
    let output = child.wait_with_output().expect("rlm exits");
    TerminalRun {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        terminal: reader.join().expect("reader"),
    }
}
