//! Runs Python code under `rlm-confine`, bounded, and finds what it left behind.

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use sandbox::{Limits, Policy, Report};
use tempfile::TempDir;

/// The unprivileged user the root-only variants run as.
pub(crate) const NOBODY: u32 = 65534;

/// Deadline of one confined run.
pub(crate) const DEADLINE: Duration = Duration::from_secs(60);

static RUNS: AtomicUsize = AtomicUsize::new(0);

/// Whether the tests run as root (then the user-dependent ones also run as [`NOBODY`]).
pub(crate) fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The Python the attacks are written in, and its installation prefix. The system Python
/// (readable by every user) when there is one.
pub(crate) fn python() -> (PathBuf, PathBuf) {
    let exe = if Path::new("/usr/bin/python3").exists() {
        PathBuf::from("/usr/bin/python3")
    } else {
        PathBuf::from("python3")
    };
    let out = Command::new(&exe)
        .args([
            "-c",
            "import sys; print(sys.base_prefix); print(sys.executable)",
        ])
        .output()
        .unwrap_or_else(|e| panic!("the hostile tests need python3: {e}"));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut lines = text.lines();
    let prefix = PathBuf::from(lines.next().unwrap_or("/usr"));
    let exe = PathBuf::from(lines.next().unwrap_or("/usr/bin/python3"));
    (exe, prefix)
}

/// A scratch directory, a policy over it and who runs it.
pub(crate) struct Sandbox {
    pub(crate) scratch: TempDir,
    pub(crate) policy: Policy,
    pub(crate) python: PathBuf,
    user: Option<u32>,
    /// A command the run is started under (e.g. `unshare …`), before `rlm-confine`.
    pub(crate) wrapper: Vec<String>,
    bin: PathBuf,
    _bin_dir: Option<TempDir>,
}

/// Small limits, so that a bomb is cheap.
pub(crate) fn test_limits() -> Limits {
    Limits {
        memory_bytes: Some(256 << 20),
        cpu_seconds: Some(30),
        file_size_bytes: Some(1 << 20),
        processes: Some(64),
        open_files: Some(256),
    }
}

impl Sandbox {
    /// Runs as the current user.
    pub(crate) fn new() -> Self {
        let scratch = tempfile::Builder::new()
            .prefix("rlm-scratch-")
            .tempdir()
            .unwrap_or_else(|e| panic!("scratch: {e}"));
        let (python, prefix) = python();
        let mut policy = Policy::new(scratch.path()).allow_exec(prefix);
        policy.limits = test_limits();
        Self {
            scratch,
            policy,
            python,
            user: None,
            wrapper: Vec::new(),
            bin: PathBuf::from(env!("CARGO_BIN_EXE_rlm-confine")),
            _bin_dir: None,
        }
    }

    /// Runs as [`NOBODY`]; `None` unless the tests run as root (then [`Sandbox::new`] is
    /// already an unprivileged run). The binary is copied where that user can execute it.
    pub(crate) fn unprivileged() -> Option<Self> {
        if !is_root() {
            return None;
        }
        let mut sandbox = Self::new();
        assert!(
            sandbox.python.starts_with("/usr"),
            "the unprivileged hostile tests need the system's python3 (`/usr/bin/python3`)"
        );
        let dir = tempfile::Builder::new()
            .prefix("rlm-confine-bin-")
            .tempdir()
            .unwrap_or_else(|e| panic!("{e}"));
        let bin = dir.path().join("rlm-confine");
        std::fs::copy(&sandbox.bin, &bin).unwrap_or_else(|e| panic!("{e}"));
        for path in [dir.path(), bin.as_path()] {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
                .unwrap_or_else(|e| panic!("{e}"));
        }
        let scratch = sandbox.scratch.path();
        std::os::unix::fs::chown(scratch, Some(NOBODY), Some(NOBODY))
            .unwrap_or_else(|e| panic!("{e}"));
        sandbox.bin = bin;
        sandbox._bin_dir = Some(dir);
        sandbox.user = Some(NOBODY);
        Some(sandbox)
    }

    /// Whether the code runs as the user who runs the tests (not as [`NOBODY`] for them).
    pub(crate) fn is_current_user(&self) -> bool {
        self.user.is_none()
    }

    /// Runs `code` under the policy; `sys.argv[1]` is the run's marker, `args` follow.
    pub(crate) fn run(&self, code: &str, args: &[&str]) -> Run {
        self.run_with(code, args, false, &[], |_| {})
    }

    /// [`Sandbox::run`] with strict mode, extra environment, and a hook called with the
    /// supervisor's pid once the code has printed `ready`.
    pub(crate) fn run_with(
        &self,
        code: &str,
        args: &[&str],
        strict: bool,
        env: &[(&str, &str)],
        on_ready: impl FnOnce(u32),
    ) -> Run {
        let marker = format!(
            "rlm-hostile-{}-{}",
            std::process::id(),
            RUNS.fetch_add(1, Ordering::Relaxed)
        );
        let policy = serde_json::to_string(&self.policy).unwrap_or_default();
        let mut cmd = match self.wrapper.split_first() {
            Some((program, args)) => {
                let mut cmd = Command::new(program);
                cmd.args(args).arg(&self.bin);
                cmd
            }
            None => Command::new(&self.bin),
        };
        if strict {
            cmd.arg("--strict");
        }
        cmd.args(["--policy", &policy, "--"])
            .arg(&self.python)
            .args(["-c", code, &marker])
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(uid) = self.user {
            cmd.uid(uid).gid(uid);
        }
        // SAFETY: only async-signal-safe setrlimit calls between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                // A backstop under the policy's own limits: a confinement bug must not take
                // the machine's memory or processes.
                let data = libc::rlimit {
                    rlim_cur: 2 << 30,
                    rlim_max: 2 << 30,
                };
                libc::setrlimit(libc::RLIMIT_DATA, &data);
                let nproc = libc::rlimit {
                    rlim_cur: 4096,
                    rlim_max: 4096,
                };
                libc::setrlimit(libc::RLIMIT_NPROC, &nproc);
                Ok(())
            });
        }
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawn rlm-confine: {e}"));
        let pid = child.id();
        let stdout = child.stdout.take().map(reader);
        let stderr = child.stderr.take().map(reader);
        let start = Instant::now();
        let mut on_ready = Some(on_ready);
        let mut timed_out = false;
        let status = loop {
            if let Ok(Some(status)) = child.try_wait() {
                break status;
            }
            if on_ready.is_some()
                && self.ready(&marker)
                && let Some(hook) = on_ready.take()
            {
                hook(pid);
            }
            if start.elapsed() > DEADLINE {
                timed_out = true;
                let _ = child.kill();
                break child.wait().unwrap_or_else(|e| panic!("{e}"));
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let stdout = stdout
            .map(|h| h.join().unwrap_or_default())
            .unwrap_or_default();
        let stderr = stderr
            .map(|h| h.join().unwrap_or_default())
            .unwrap_or_default();
        let report = stderr
            .lines()
            .find_map(|l| l.strip_prefix("rlm-confine: {"))
            .and_then(|json| serde_json::from_str(&format!("{{{json}")).ok());
        let leftovers = reap_marked(&marker);
        Run {
            status,
            stdout,
            stderr,
            report,
            timed_out,
            leftovers,
            marker,
        }
    }

    /// Whether the code has written its `ready` file into the scratch directory.
    fn ready(&self, marker: &str) -> bool {
        self.scratch.path().join(format!("{marker}.ready")).exists()
    }
}

fn reader(mut pipe: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = pipe.by_ref().take(4 << 20).read_to_end(&mut buf);
        String::from_utf8_lossy(&buf).into_owned()
    })
}

/// Pids of processes whose command line holds `marker`.
pub(crate) fn marked(marker: &str) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()))
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(marker))
        })
        .collect()
}

/// Waits up to 3 s for the marked processes to go; kills and returns those still there.
fn reap_marked(marker: &str) -> Vec<u32> {
    let start = Instant::now();
    loop {
        let left = marked(marker);
        if left.is_empty() {
            return left;
        }
        if start.elapsed() > Duration::from_secs(3) {
            for pid in &left {
                // SAFETY: kills a leftover of this test.
                unsafe { libc::kill(*pid as libc::pid_t, libc::SIGKILL) };
            }
            return left;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One confined run.
#[derive(Debug)]
pub(crate) struct Run {
    pub(crate) status: ExitStatus,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
    /// The report `enter` returned, from the first stderr line.
    pub(crate) report: Option<Report>,
    pub(crate) timed_out: bool,
    /// Processes with the marker still alive 3 s after the run (then killed).
    pub(crate) leftovers: Vec<u32>,
    pub(crate) marker: String,
}

impl Run {
    /// The value the code printed as `NAME value`.
    pub(crate) fn value(&self, name: &str) -> Option<&str> {
        self.stdout
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
    }

    /// Asserts the run ended in time, left nothing behind, and printed `NAME value`;
    /// returns the value.
    pub(crate) fn expect(&self, name: &str) -> &str {
        assert!(!self.timed_out, "the run outlived its deadline: {self:#?}");
        assert!(
            self.leftovers.is_empty(),
            "processes left behind: {self:#?}"
        );
        self.value(name)
            .unwrap_or_else(|| panic!("no `{name}` line: {self:#?}"))
    }

    /// The signal that ended the supervisor, if one did.
    pub(crate) fn signal(&self) -> Option<i32> {
        self.status.signal()
    }
}
