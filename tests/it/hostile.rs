//! Hostile cells through `rlm run` (default isolation: a confined worker process), against
//! the mock LM server: what a prompt-injected model would make its code do.
//!
//! Every cell runs as the first block of a run whose next block prints `alive 42` and whose
//! last reply is `FINAL(done)`, and every cell must be
//! - contained: the run goes on (the next block runs, the answer is `done`, exit code 0);
//! - explained: what the model read about the block names what happened;
//! - harmless: a fake home holding an SSH key, a shell profile and notes, the context file
//!   and `rlm` itself are byte-for-byte and mode-for-mode as before, nothing is left in
//!   `/tmp`, and neither the key nor the API key shows up anywhere `rlm` wrote;
//! - clean: no process whose command line holds the cell's marker is left after the run.
//!
//! Bounded: each run has a deadline (killed past it), the cells cap themselves by the
//! worker's limits, and the harness lowers `RLIMIT_FSIZE` (256 MiB) and passes
//! `--memory-limit 512M`, so that a layer that fails costs a test, not the machine.

use std::collections::BTreeMap;
use std::io::Read;
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::support::{Mock, file, marked, repl, rlm_command, rlm_on_terminal, script};

/// An SSH key the code must never read.
const SSH_KEY: &str = "-----BEGIN OPENSSH PRIVATE KEY-----\nrlm-hostile-ssh-key-material\n";
/// The API key `rlm` holds in the parent; the worker must never see it.
const API_KEY: &str = "sk-rlm-hostile-api-key-0123456789";
/// Deadline of one run.
const DEADLINE: Duration = Duration::from_secs(120);

static CELLS: AtomicUsize = AtomicUsize::new(0);

/// What one hostile run left.
#[derive(Debug)]
struct Outcome {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    /// The trajectory's lines.
    lines: Vec<serde_json::Value>,
    /// What the model could read about the hostile block: its iteration line.
    first: String,
    elapsed: Duration,
}

/// A fake home with an SSH key, a profile and notes; its snapshot before and after.
struct Home {
    dir: tempfile::TempDir,
}

impl Home {
    fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("rlm-home-")
            .tempdir()
            .expect("home");
        let ssh = dir.path().join(".ssh");
        std::fs::create_dir(&ssh).expect("mkdir .ssh");
        std::fs::set_permissions(&ssh, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        std::fs::write(ssh.join("id_rsa"), SSH_KEY).expect("key");
        std::fs::set_permissions(ssh.join("id_rsa"), std::fs::Permissions::from_mode(0o600))
            .expect("chmod");
        std::fs::write(dir.path().join(".bashrc"), "export PATH=$PATH\n").expect("bashrc");
        std::fs::write(dir.path().join("notes.txt"), "my notes\n").expect("notes");
        Self { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// Every file and folder under `root`: mode, and contents for files.
fn snapshot(root: &Path) -> BTreeMap<PathBuf, (u32, Option<Vec<u8>>)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            let contents = meta
                .is_file()
                .then(|| std::fs::read(&path).unwrap_or_default());
            if meta.is_dir() {
                stack.push(path.clone());
            }
            out.insert(path, (meta.permissions().mode(), contents));
        }
    }
    out
}

/// Runs `cell` (placeholders `{HOME}`, `{MARKER}`, `{CONTEXT}`, `{PORT}`) as the first block
/// of a run, then checks everything the module docs promise. Returns the outcome for the
/// cell's own checks; `expect`: the model read at least one of these about the block.
fn hostile(cell: &str, expect: &[&str], extra: &[&str]) -> Outcome {
    hostile_with(cell, expect, extra, &[])
}

fn hostile_with(cell: &str, expect: &[&str], extra: &[&str], vars: &[(&str, &str)]) -> Outcome {
    let marker = format!(
        "rlm-cell-{}-{}",
        std::process::id(),
        CELLS.fetch_add(1, Ordering::Relaxed)
    );
    let home = Home::new();
    let work = tempfile::tempdir().expect("tempdir");
    let context = work.path().join("ctx.txt");
    std::fs::write(&context, "alpha beta gamma\n").expect("context");
    let rlm_binary = std::fs::read(env!("CARGO_BIN_EXE_rlm")).expect("rlm binary");
    let mut code = cell
        .replace("{HOME}", &home.path().to_string_lossy())
        .replace("{MARKER}", &marker)
        .replace("{CONTEXT}", &context.to_string_lossy());
    for (name, value) in vars {
        code = code.replace(&format!("{{{name}}}"), value);
    }
    let first = repl(&code);
    let second = repl("print('alive', 6 * 7)");
    let mock = Mock::start(script(&[&first, &second, "FINAL(done)"]));
    let before_home = snapshot(home.path());
    let before_work = snapshot(work.path());
    let trajectory = work.path().join("t.jsonl");
    let mut args: Vec<String> = [
        "run",
        "--base-url",
        &mock.url(),
        "--model",
        "root-model",
        "--sub-model",
        "sub-model",
        "--query",
        "q",
        "--memory-limit",
        "512M",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    args.push("--context".into());
    args.push(context.to_string_lossy().into_owned());
    args.push("--trajectory".into());
    args.push(trajectory.to_string_lossy().into_owned());
    if !extra.contains(&"--cell-timeout") {
        args.extend(["--cell-timeout".to_owned(), "5".to_owned()]);
    }
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    let mut cmd = rlm_command(&args);
    cmd.env("HOME", home.path())
        .env("OPENAI_API_KEY", API_KEY)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: only async-signal-safe setrlimit between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let fsize = libc::rlimit {
                rlim_cur: 256 << 20,
                rlim_max: 256 << 20,
            };
            libc::setrlimit(libc::RLIMIT_FSIZE, &fsize);
            Ok(())
        });
    }
    let start = Instant::now();
    let mut child = cmd.spawn().expect("rlm starts");
    let out = child.stdout.take().map(reader);
    let err = child.stderr.take().map(reader);
    let status = loop {
        if let Ok(Some(status)) = child.try_wait() {
            break Some(status);
        }
        if start.elapsed() > DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let elapsed = start.elapsed();
    let stdout = out
        .map(|h| h.join().unwrap_or_default())
        .unwrap_or_default();
    let stderr = err
        .map(|h| h.join().unwrap_or_default())
        .unwrap_or_default();
    let text = std::fs::read_to_string(&trajectory).unwrap_or_default();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let first = lines
        .iter()
        .find(|l| l["type"] == "iteration")
        .map(|l| l.to_string())
        .unwrap_or_default();
    let outcome = Outcome {
        code: status.and_then(|s| s.code()),
        stdout,
        stderr,
        lines,
        first,
        elapsed,
    };

    // No process left behind (wait a little: the kernel reaps a namespace asynchronously).
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut left = marked(&marker);
    while !left.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        left = marked(&marker);
    }
    for pid in &left {
        // SAFETY: kills a leftover of this test before failing it.
        unsafe { libc::kill(*pid as libc::pid_t, libc::SIGKILL) };
    }
    assert!(
        left.is_empty(),
        "processes outlived the run: {left:?}\n{outcome:#?}"
    );

    // Contained: the run went on.
    assert_eq!(outcome.code, Some(0), "{outcome:#?}");
    assert_eq!(outcome.stdout.lines().last(), Some("done"), "{outcome:#?}");
    assert!(
        text.contains("alive 42"),
        "the next block did not run: {outcome:#?}"
    );
    // Explained.
    assert!(
        expect.iter().any(|e| outcome.first.contains(e)),
        "the model was not told what happened (expected one of {expect:?}): {outcome:#?}"
    );
    // Harmless.
    assert!(
        snapshot(home.path()) == before_home,
        "the home folder changed: {outcome:#?}"
    );
    let mut after_work = snapshot(work.path());
    after_work.remove(&trajectory);
    let mut before = before_work;
    before.remove(&trajectory);
    assert!(
        after_work == before,
        "the context's folder changed: {outcome:#?}"
    );
    assert_eq!(
        std::fs::read(env!("CARGO_BIN_EXE_rlm")).unwrap_or_default(),
        rlm_binary,
        "the rlm binary changed"
    );
    let in_tmp: Vec<_> = std::fs::read_dir("/tmp")
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().contains(&marker))
                .count()
        })
        .into_iter()
        .collect();
    assert_eq!(in_tmp, [0], "something was written to /tmp");
    for secret in [SSH_KEY.lines().nth(1).unwrap_or(SSH_KEY), API_KEY] {
        for (what, written) in [
            ("stdout", &outcome.stdout),
            ("stderr", &outcome.stderr),
            ("trajectory", &text),
        ] {
            assert!(
                !written.contains(secret),
                "a secret reached the {what}: {outcome:#?}"
            );
        }
    }
    outcome
}

pub(crate) fn reader(mut pipe: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = pipe.by_ref().take(8 << 20).read_to_end(&mut buf);
        String::from_utf8_lossy(&buf).into_owned()
    })
}

// What each layer answers, as the model reads it: a probe refused for another reason (a
// missing folder, a typo) fails its test.
/// A write outside the scratch dir: everything else is a read-only mount to the worker.
const READ_ONLY: &[&str] = &["OSError: [Errno 30] Read-only file system"];
/// A read of a path outside the policy: Landlock.
const LANDLOCK: &[&str] = &["PermissionError: [Errno 13] Permission denied"];
/// A refused system call (seccomp), or a signal to init of the worker's PID namespace (its
/// parent there; `rlm` is not in it), which is outside the worker's Landlock domain.
const NOT_PERMITTED: &[&str] = &["PermissionError: [Errno 1] Operation not permitted"];

// Files.

#[test]
fn write_outside_the_scratch_dir() {
    hostile(
        r#"open("{HOME}/notes.txt", "w").write("pwned")"#,
        READ_ONLY,
        &[],
    );
}

#[test]
fn write_to_tmp() {
    hostile(
        r#"open("/tmp/{MARKER}", "w").write("pwned")"#,
        READ_ONLY,
        &[],
    );
}

#[test]
fn delete_a_file_in_home() {
    hostile(r#"import os; os.remove("{HOME}/.bashrc")"#, READ_ONLY, &[]);
}

#[test]
fn chmod_a_folder_in_home() {
    hostile(
        r#"import os; os.chmod("{HOME}/.ssh", 0o777)"#,
        READ_ONLY,
        &[],
    );
}

#[test]
fn append_to_the_context_file() {
    hostile(
        r#"open("{CONTEXT}", "a").write("injected")"#,
        READ_ONLY,
        &[],
    );
}

#[test]
fn read_a_file_under_home_that_is_not_a_context() {
    hostile(r#"print(open("{HOME}/.ssh/id_rsa").read())"#, LANDLOCK, &[]);
}

#[test]
fn list_home() {
    hostile(r#"import os; print(os.listdir("{HOME}"))"#, LANDLOCK, &[]);
}

#[test]
fn symlink_out_of_scratch() {
    hostile(
        r#"import os
link = os.path.join(os.environ["SCRATCH"], "key")
os.symlink("{HOME}/.ssh/id_rsa", link)
print(open(link).read())"#,
        LANDLOCK,
        &[],
    );
}

#[test]
fn overwrite_proc_self_exe() {
    // The kernel refuses a write to a running program before any layer could; changing the
    // file's inode (here to the mode it has: harmless were it let through) meets the
    // read-only mount.
    hostile(
        r#"import os
exe = os.readlink("/proc/self/exe")
for name, change in [("write", lambda: open("/proc/self/exe", "r+b").write(b"\0" * 64)),
                     ("chmod", lambda: os.chmod(exe, os.stat(exe).st_mode & 0o7777))]:
    try:
        change()
        print(name, "done")
    except OSError as e:
        print(name, e.strerror)"#,
        &["write Text file busy\\nchmod Read-only file system"],
        &[],
    );
}

#[test]
fn fill_the_disk() {
    hostile(
        r#"import os
f = open(os.path.join(os.environ["SCRATCH"], "fill"), "wb")
while True:
    f.write(b"\0" * (1 << 20))"#,
        &["File too large"],
        &[],
    );
}

#[test]
fn exhaust_file_descriptors() {
    hostile(
        r#"files = []
while True:
    files.append(open("/dev/null"))"#,
        &["Too many open files"],
        &[],
    );
}

// Other processes and the parent.

#[test]
fn read_every_proc_environ_for_the_api_key() {
    hostile(
        r#"import os
readable = []
for pid in range(1, 70000):
    try:
        data = open(f"/proc/{pid}/environ", "rb").read()
    except OSError:
        continue
    readable.append(pid)
    if b"sk-rlm-hostile" in data:
        raise SystemExit("KEY FOUND")
print("readable environs:", len(readable))"#,
        // Printed only when no environment held the key.
        &["readable environs:"],
        &[],
    );
}

#[test]
fn read_the_parents_memory() {
    hostile(
        r#"import os
own = set(os.listdir("/proc/self/task"))
readable, refused = 0, []
for pid in range(1, 70000):
    if str(pid) in own:
        continue
    try:
        mem = open(f"/proc/{pid}/mem", "rb")
    except FileNotFoundError:
        continue
    except OSError as e:
        refused.append((pid, e.errno))
        continue
    # At an address mapped in that process: address 0, never mapped, fails (EIO) anywhere.
    with mem, open(f"/proc/{pid}/maps") as maps:
        mem.seek(int(maps.readline().split("-")[0], 16))
        mem.read(8)
        readable += 1
print("readable memories:", readable, "refused:", refused)"#,
        // Only init of the worker's PID namespace is there to try (`rlm` is not), and it is
        // refused: outside the worker's Landlock domain, with the privileges it dropped.
        &["readable memories: 0 refused: [(1, 13)]"],
        &[],
    );
}

#[test]
fn read_the_api_key_from_the_environment() {
    hostile(
        r#"import os
print("key in os.environ:", any("sk-rlm-hostile" in v for v in os.environ.values()))
print("key in /proc/self/environ:", b"sk-rlm-hostile" in open("/proc/self/environ", "rb").read())
print("variables:", sorted(os.environ))"#,
        &["key in os.environ: False\\nkey in /proc/self/environ: False"],
        &[],
    );
}

#[test]
fn ptrace_the_parent() {
    hostile(
        r#"import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
r = libc.ptrace(16, os.getppid(), 0, 0)
print("ptrace:", r, os.strerror(ctypes.get_errno()))"#,
        &["ptrace: -1 Operation not permitted"],
        &[],
    );
}

/// The code's parent is its PID namespace's init (`rlm` has no pid there): outside the
/// code's Landlock domain, it cannot be signalled.
#[test]
fn signal_the_namespaces_init_its_parent() {
    let outcome = hostile(
        r#"import os, signal
print("parent:", os.getppid())
os.kill(os.getppid(), signal.SIGKILL)"#,
        NOT_PERMITTED,
        &[],
    );
    assert!(outcome.first.contains("parent: 1\\n"), "{outcome:#?}");
}

/// A process outside the worker's PID namespace (the test, `rlm`'s parent, of the same
/// user) by its pid as seen from outside: there is no such process in the namespace.
#[test]
fn signal_a_process_outside_by_its_pid() {
    hostile_with(
        r#"import os, signal; os.kill({PID}, signal.SIGKILL)"#,
        &["ProcessLookupError: [Errno 3] No such process"],
        &[],
        &[("PID", &std::process::id().to_string())],
    );
}

/// The worker is not dumpable (another process of the user can neither attach to it nor
/// read its memory), and neither is what it forks; a program it executes is dumpable again
/// (`execve` resets the flag) and its memory readable to the code, which shows the fork's is
/// refused for being not dumpable.
#[test]
fn the_worker_and_its_forks_are_not_dumpable() {
    hostile(
        r#"import ctypes, os, subprocess, time
libc = ctypes.CDLL(None, use_errno=True)
def mem(pid):
    # At an address mapped in that process: address 0, never mapped, fails (EIO) anywhere.
    try:
        with open(f"/proc/{pid}/mem", "rb") as f, open(f"/proc/{pid}/maps") as maps:
            f.seek(int(maps.readline().split("-")[0], 16))
            return f"read {len(f.read(8))}"
    except OSError as e:
        return f"refused {e.errno}"
forked = os.fork()
if forked == 0:
    time.sleep(10)
    os._exit(0)
# `Popen` returns once the program is executed (or failed to be).
executed = subprocess.Popen(["sleep", "10"])
print("dumpable:", libc.prctl(3, 0, 0, 0, 0), "fork:", mem(forked), "exec:", mem(executed.pid))
os.kill(forked, 9)
os.waitpid(forked, 0)
executed.kill()
_ = executed.wait()"#,
        &["dumpable: 0 fork: refused 13 exec: read 8"],
        &[],
    );
}

#[test]
fn signal_every_process() {
    hostile(
        r#"import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
print("kill(-1):", libc.kill(-1, 0), os.strerror(ctypes.get_errno()))"#,
        &["kill(-1): -1 Operation not permitted"],
        &[],
    );
}

#[test]
fn escape_into_new_namespaces() {
    hostile(
        r#"import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
print("unshare:", libc.unshare(0x10000000), os.strerror(ctypes.get_errno()))"#,
        &["unshare: -1 Operation not permitted"],
        &[],
    );
}

// The network.

#[test]
fn connect_to_a_tcp_listener_on_loopback() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("listener");
    listener.set_nonblocking(true).expect("nonblocking");
    let port = listener
        .local_addr()
        .map(|a| a.port())
        .unwrap_or_default()
        .to_string();
    hostile_with(
        r#"import socket; socket.create_connection(("127.0.0.1", {PORT}), timeout=3).sendall(b"data")"#,
        NOT_PERMITTED,
        &[],
        &[("PORT", &port)],
    );
    assert!(
        listener.accept().is_err(),
        "the cell connected to the listener"
    );
}

#[test]
fn connect_to_an_agent_socket_in_home() {
    // In `/tmp`: a socket's path has at most 107 bytes, whatever the suite's `TMPDIR`.
    let dir = tempfile::tempdir_in("/tmp").expect("tempdir");
    let path = dir.path().join("agent.sock");
    let listener = UnixListener::bind(&path).expect("unix listener");
    listener.set_nonblocking(true).expect("nonblocking");
    let path = path.to_string_lossy().into_owned();
    hostile_with(
        r#"import socket
s = socket.socket(socket.AF_UNIX)
s.connect("{SOCK}")"#,
        NOT_PERMITTED,
        &[],
        &[("SOCK", &path)],
    );
    assert!(
        listener.accept().is_err(),
        "the cell connected to the socket"
    );
}

// Processes.

#[test]
fn fork_bomb() {
    hostile(
        r#"import os
while True:
    if os.fork() == 0:
        os.execv("/bin/sh", ["sh", "-c", "sleep 600; : {MARKER}"])"#,
        &["Resource temporarily unavailable"],
        &[],
    );
}

#[test]
fn a_fork_bomb_under_an_interrupted_block_is_capped_and_ended_with_it() {
    // The bomb holds as many processes as the cap lets it, then waits for the cell timeout:
    // every one of them (a shell and its `sleep`) ends with the block, the worker lives on.
    let run = crate::processes::interrupted(
        r#"import os
n = 0
try:
    while True:
        if os.fork() == 0:
            os.execv("/bin/sh", ["sh", "-c", "sleep 600; : {MARK}"])
        n += 1
except OSError as e:
    capped = f"{n} then {e.strerror}""#,
        20,
        "process",
    );
    // The cap: `RLIMIT_NPROC` (256), or for root the namespace's `pid_max`, which the
    // kernel keeps at 301 at least.
    assert!((20..=300).contains(&run.found.len()), "{run:#?}");
    assert!(run.left.is_empty(), "the bomb outlived its block: {run:#?}");
    assert_eq!(run.code, Some(0), "{run:#?}");
    assert_eq!(
        run.stdout.lines().last(),
        Some("go same worker"),
        "{run:#?}"
    );
}

/// With a `/proc` of its own, the code sees its PID namespace's processes (init and
/// itself) and nothing of the machine: no other process, no machine-wide file, and of
/// init, outside its Landlock domain, nothing `ptrace` guards.
#[test]
fn list_every_process_and_machine_file_in_proc() {
    hostile(
        r#"import os
print("pids:", sorted(int(e) for e in os.listdir("/proc") if e.isdigit()), "self:", os.readlink("/proc/self") == str(os.getpid()))
for path in ("/proc/1/environ", "/proc/1/maps", "/proc/1/mem", "/proc/1/fd/0", "/proc/1/root/etc",
             "/proc/sys/kernel", "/proc/kallsyms", "/proc/cmdline", "/proc/sysvipc/shm",
             "/proc/meminfo", "/proc/net/tcp", "/proc/mounts"):
    try:
        if os.path.isdir(path):
            os.listdir(path)
        else:
            open(path, "rb").read(1)
        print(path, "read")
    except OSError as e:
        print(path, type(e).__name__)"#,
        // Init's files are refused (outside the worker's Landlock domain); the machine's are
        // not in the PID namespace's own `/proc` (`subset=pid`). Any other answer (a file
        // read, or refused otherwise) fails.
        &[concat!(
            "pids: [1, 2] self: True\\n",
            "/proc/1/environ PermissionError\\n/proc/1/maps PermissionError\\n",
            "/proc/1/mem PermissionError\\n/proc/1/fd/0 PermissionError\\n",
            "/proc/1/root/etc PermissionError\\n",
            "/proc/sys/kernel FileNotFoundError\\n/proc/kallsyms FileNotFoundError\\n",
            "/proc/cmdline FileNotFoundError\\n/proc/sysvipc/shm FileNotFoundError\\n",
            "/proc/meminfo FileNotFoundError\\n/proc/net/tcp FileNotFoundError\\n",
            "/proc/mounts FileNotFoundError\\n",
        )],
        &[],
    );
}

#[test]
fn memory_bomb() {
    hostile(
        r#"chunks = []
while True:
    chunks.append(bytearray(64 << 20))"#,
        &["MemoryError", "ran out of memory"],
        &[],
    );
}

/// A block that kills its own worker with `SIGKILL` through the C library (as `kill -9` from
/// outside would; `os.kill` of its own pid only ends the block): the
/// model is told the worker was killed, not that it ran out of memory, since the kernel
/// counted no out-of-memory kill while it ran.
#[test]
fn a_block_that_kills_its_worker_with_sigkill_is_told_a_kill_not_memory() {
    let outcome = hostile(
        "import ctypes, os, signal\nprint('going')\nctypes.CDLL(None).kill(os.getpid(), signal.SIGKILL)",
        &["killed (SIGKILL)"],
        &[],
    );
    let block = killed_block(&outcome, libc::SIGKILL);
    if std::fs::read_to_string("/proc/vmstat").is_ok_and(|v| v.contains("\noom_kill ")) {
        assert_eq!(block["restart"]["cause"]["oom_kills"], 0, "{block}");
    }
    for memory in ["WorkerOutOfMemory", "ran out of memory", "most likely"] {
        assert!(
            !outcome.first.contains(memory),
            "a kill was told as memory ({memory}): {block}"
        );
    }
}

/// The hostile block's trajectory entry, which says its worker was ended by `signal` from
/// outside the session (`WorkerKilled`, cause kind `killed`).
fn killed_block(outcome: &Outcome, signal: i32) -> &serde_json::Value {
    let block = &outcome
        .lines
        .iter()
        .find(|l| l["type"] == "iteration")
        .expect("an iteration")["blocks"][0];
    assert_eq!(block["restart"]["cause"]["kind"], "killed", "{block}");
    assert_eq!(block["restart"]["cause"]["signal"], signal, "{block}");
    assert_eq!(block["error"]["type_name"], "WorkerKilled", "{block}");
    block
}

/// A block that sends its own worker `SIGTERM` or `SIGHUP` through the C library (as a
/// `kill PID` from outside would; `os.kill` of its own pid only ends the block): the model is
/// told the worker was stopped by that signal from outside `rlm`, not that it crashed, and
/// the session goes on in a fresh worker.
#[test]
fn a_block_that_sends_its_worker_sigterm_or_sighup_is_told_a_stop_from_outside_not_a_crash() {
    for (signal, name) in [(libc::SIGTERM, "SIGTERM"), (libc::SIGHUP, "SIGHUP")] {
        let outcome = hostile(
            &format!(
                "import ctypes, os\nprint('going')\nctypes.CDLL(None).kill(os.getpid(), {signal})"
            ),
            &[&format!("stopped by {name} from outside rlm")],
            &[],
        );
        let block = killed_block(&outcome, signal);
        for wrong in ["WorkerCrashed", "crashed", "memory"] {
            assert!(
                !outcome.first.contains(wrong),
                "{name} was told as {wrong}: {block}"
            );
        }
    }
}

#[test]
fn setsid_double_fork_that_tries_to_outlive_the_run() {
    hostile(
        r#"import os
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv("/bin/sh", ["sh", "-c", "trap '' HUP TERM; sleep 600; : {MARKER}"])
    os._exit(0)
os.wait()
print("daemon started")"#,
        &["daemon started"],
        &[],
    );
}

/// On the terminal `rlm` runs on, as from a shell, the model's code is in a session whose
/// leader is inside the sandbox (itself, or init: pid 1 of its PID namespace; a leader
/// outside shows as 0), so it has no controlling terminal and `/dev/tty` opens nothing —
/// with the best-effort layers and with `strict`.
#[test]
fn the_code_has_no_controlling_terminal_when_rlm_runs_on_one() {
    let code = r#"import os
pid, sid = os.getpid(), os.getsid(0)
with open("/proc/self/stat") as f:
    tty = int(f.read().rsplit(")", 1)[1].split()[4])
try:
    open("/dev/tty", "rb").close()
    dev_tty = "opened"
except OSError as e:
    dev_tty = type(e).__name__
seen = f"pid={pid} sid={sid} tty={tty} dev_tty={dev_tty}"
print(seen)"#;
    for isolation in ["process", "strict"] {
        let mock = Mock::start(script(&[&repl(code), "FINAL_VAR(seen)"]));
        let dir = tempfile::tempdir().expect("tempdir");
        let context = file(dir.path(), "ctx.txt", "some context");
        let context = context.to_str().expect("utf-8");
        let all = mock.run_args(&[
            "--context",
            context,
            "--query",
            "q",
            "--isolation",
            isolation,
        ]);
        let mut rlm_pid = 0;
        let run = rlm_on_terminal(&all, &[], |pid, _| {
            rlm_pid = pid;
            // Bounded: killed past the deadline (the run then fails the test).
            let deadline = Instant::now() + DEADLINE;
            while Instant::now() < deadline {
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
                if stat
                    .rsplit(')')
                    .next()
                    .is_none_or(|rest| rest.trim_start().starts_with('Z'))
                {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            // SAFETY: our own unreaped child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        });
        assert_eq!(run.code, Some(0), "{isolation}: {}", run.terminal);
        let seen: BTreeMap<&str, &str> = run
            .stdout
            .split_whitespace()
            .filter_map(|pair| pair.split_once('='))
            .collect();
        let number = |key| {
            seen.get(key)
                .and_then(|v| v.parse::<i64>().ok())
                .unwrap_or_else(|| panic!("{isolation}: no {key} in {:?}", run.stdout))
        };
        let (pid, sid) = (number("pid"), number("sid"));
        assert!(
            sid != 0 && (sid == pid || sid == 1) && sid != i64::from(rlm_pid),
            "{isolation}: the code's session is led outside the sandbox: {:?}",
            run.stdout
        );
        assert_eq!(
            number("tty"),
            0,
            "{isolation}: a controlling terminal: {:?}",
            run.stdout
        );
        assert_ne!(
            seen.get("dev_tty"),
            Some(&"opened"),
            "{isolation}: {:?}",
            run.stdout
        );
    }
}

#[test]
fn threads_left_running() {
    let outcome = hostile(
        r#"import threading
def spin():
    while True:
        pass
for _ in range(4):
    threading.Thread(target=spin, daemon=True).start()
print("threads started")"#,
        &["threads started"],
        &[],
    );
    assert!(outcome.elapsed < Duration::from_secs(60), "{outcome:#?}");
}

// Crashes and exits.

#[test]
fn segfault() {
    hostile(r#"import ctypes; ctypes.string_at(0)"#, &["SIGSEGV"], &[]);
}

#[test]
fn abort() {
    hostile(
        r#"import ctypes; ctypes.CDLL(None).abort()"#,
        &["SIGABRT"],
        &[],
    );
}

#[test]
fn os_exit() {
    hostile(
        r#"import os; os._exit(3)"#,
        &["ProcessExit", "status 3", "exit code 3"],
        &[],
    );
}

#[test]
fn c_exit() {
    hostile(
        r#"import ctypes; ctypes.CDLL(None).exit(5)"#,
        &["status 5", "exit code 5", "ProcessExit"],
        &[],
    );
}

// Runaway cells.

#[test]
fn catastrophic_regex() {
    let outcome = hostile(
        r#"import re; re.match(r"(a+)+$", "a" * 40 + "b")"#,
        &["time limit"],
        &["--cell-timeout", "2"],
    );
    assert!(
        outcome.elapsed < Duration::from_secs(30),
        "not stopped in time: {outcome:#?}"
    );
}

#[test]
fn ctypes_sleep() {
    let outcome = hostile(
        r#"import ctypes; ctypes.CDLL(None).sleep(60)"#,
        &["time limit"],
        &["--cell-timeout", "2"],
    );
    assert!(
        outcome.elapsed < Duration::from_secs(30),
        "not stopped in time: {outcome:#?}"
    );
}

#[test]
fn endless_output() {
    let outcome = hostile(
        r#"while True:
    print("spam " * 100)"#,
        &["time limit"],
        &["--cell-timeout", "2"],
    );
    assert!(
        outcome.first.len() < 1 << 20,
        "the output was not bounded: {} bytes",
        outcome.first.len()
    );
    assert!(!outcome.lines.is_empty());
}
