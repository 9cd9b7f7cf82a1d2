//! What an attacker's code would try, one layer at a time.

use std::io::ErrorKind;
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::process::{Command, Stdio};

use sandbox::{Layer, State};

use crate::support::Sandbox;

/// Helpers every attack starts with: `attempt(name, f)` prints `name ok …` or
/// `name refused <Exception> <errno>`; `ready()` tells the harness the code is set up.
const PRELUDE: &str = r#"
import os, sys, time, signal, socket, ctypes, errno
MARKER = sys.argv[1]
SCRATCH = os.environ["SCRATCH"]
libc = ctypes.CDLL(None, use_errno=True)
def attempt(name, f):
    try:
        print(name, "ok", f(), flush=True)
    except BaseException as e:
        print(name, "refused", type(e).__name__, getattr(e, "errno", ""), flush=True)
def check(r):
    if r == -1:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return r
# Not dumpable, as rlm's worker is: `enter` made this process so, and the `execve` of python
# made it dumpable again (rlm's worker embeds Python, no exec).
check(libc.prctl(4, 0, 0, 0, 0))  # PR_SET_DUMPABLE
def ready():
    open(os.path.join(SCRATCH, MARKER + ".ready"), "w").close()
"#;

fn code(body: &str) -> String {
    format!("{PRELUDE}\n{body}")
}

/// The runs every user-dependent test makes: as the current user, and as root also as an
/// unprivileged one.
fn sandboxes() -> Vec<Sandbox> {
    let mut all = vec![Sandbox::new()];
    all.extend(Sandbox::unprivileged());
    all
}

/// A folder outside the scratch dir that the file permissions alone would let anyone
/// write, so only the sandbox stands in the way.
fn open_folder() -> tempfile::TempDir {
    open_folder_in(&std::env::temp_dir())
}

/// [`open_folder`] under `base`.
fn open_folder_in(base: &Path) -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("rlm-outside-")
        .tempdir_in(base)
        .unwrap_or_else(|e| panic!("{e}"));
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777))
        .unwrap_or_else(|e| panic!("{e}"));
    dir
}

/// Asserts that `attempt(name, …)` failed with `errno`: the answer of the layer that stands
/// in the way. Any other failure (a missing folder, a path too long, a typo in the probe)
/// fails the test, saying what the probe got.
fn refused(run: &crate::support::Run, name: &str, errno: i32) {
    let value = run.expect(name);
    let got = value
        .strip_prefix("refused ")
        .and_then(|rest| rest.rsplit(' ').next())
        .and_then(|n| n.parse::<i32>().ok());
    let want = std::io::Error::from_raw_os_error(errno);
    match got {
        Some(got) if got == errno => {}
        Some(got) => panic!(
            "`{name}` failed for another reason than the confinement: {value} ({}), not \
             errno {errno} ({want})\n{run:#?}",
            std::io::Error::from_raw_os_error(got)
        ),
        None => panic!("`{name}` was not refused with errno {errno} ({want}): {value}\n{run:#?}"),
    }
}

#[test]
fn writes_outside_the_scratch_dir_fail_and_change_nothing() {
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    for sandbox in sandboxes() {
        let outside = open_folder();
        let keep = outside.path().join("keep.txt");
        std::fs::write(&keep, "original").unwrap_or_else(|e| panic!("{e}"));
        std::fs::set_permissions(&keep, std::fs::Permissions::from_mode(0o666))
            .unwrap_or_else(|e| panic!("{e}"));
        let run = sandbox.run(
            &code(
                r#"
out, home = sys.argv[2:4]
attempt("create", lambda: open(out + "/new.txt", "w").write("x"))
attempt("overwrite", lambda: open(out + "/keep.txt", "w").write("x"))
attempt("append", lambda: open(out + "/keep.txt", "a").write("x"))
attempt("truncate", lambda: os.truncate(out + "/keep.txt", 0))
attempt("delete", lambda: os.remove(out + "/keep.txt"))
attempt("mkdir", lambda: os.mkdir(out + "/d"))
attempt("chmod", lambda: os.chmod(out + "/keep.txt", 0o600))
attempt("chown", lambda: os.chown(out + "/keep.txt", os.getuid(), os.getgid()))
attempt("utime", lambda: os.utime(out + "/keep.txt", (0, 0)))
attempt("setxattr", lambda: os.setxattr(out + "/keep.txt", "user.rlm", b"x"))
attempt("chmod_inside", lambda: (open(SCRATCH + "/m", "w").close(), os.chmod(SCRATCH + "/m", 0o700))[1])
def symlink_escape():
    os.symlink(out + "/keep.txt", SCRATCH + "/link")
    return open(SCRATCH + "/link", "w").write("x")
attempt("symlink_escape", symlink_escape)
def rename_out():
    open(SCRATCH + "/a", "w").write("a")
    return os.rename(SCRATCH + "/a", out + "/a")
attempt("rename_out", rename_out)
attempt("hardlink_in", lambda: os.link(out + "/keep.txt", SCRATCH + "/hard"))
attempt("tmp", lambda: open("/tmp/" + MARKER, "w").write("x"))
attempt("home", lambda: open(home + "/" + MARKER, "w").write("x"))
attempt("inside", lambda: open(SCRATCH + "/inside.txt", "w").write("fine"))
"#,
            ),
            &[&outside.path().to_string_lossy(), &home],
        );
        // Everything outside the scratch dir is a read-only mount to the code, which the
        // kernel checks before Landlock; a rename or link across it is one across mounts.
        let mut probes = vec![
            ("create", libc::EROFS),
            ("overwrite", libc::EROFS),
            ("append", libc::EROFS),
            ("truncate", libc::EROFS),
            ("delete", libc::EROFS),
            ("mkdir", libc::EROFS),
            ("chmod", libc::EROFS),
            ("chown", libc::EROFS),
            ("utime", libc::EROFS),
            ("setxattr", libc::EROFS),
            ("symlink_escape", libc::EROFS),
            ("rename_out", libc::EXDEV),
            ("hardlink_in", libc::EXDEV),
            ("tmp", libc::EROFS),
        ];
        // The test's own home, which its user may write: for another user the file
        // permissions would refuse it before the sandbox does.
        if sandbox.is_current_user() {
            probes.push(("home", libc::EROFS));
        }
        for (name, errno) in probes {
            refused(&run, name, errno);
        }
        assert_eq!(run.expect("inside"), "ok 4", "{run:#?}");
        assert_eq!(run.expect("chmod_inside"), "ok None", "{run:#?}");
        assert_eq!(
            std::fs::read_to_string(&keep).unwrap_or_default(),
            "original"
        );
        let meta = std::fs::metadata(&keep).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(meta.permissions().mode() & 0o777, 0o666, "the mode changed");
        assert!(
            meta.modified().is_ok_and(|t| t > std::time::UNIX_EPOCH),
            "the time changed"
        );
        let names: Vec<_> = std::fs::read_dir(outside.path())
            .map(|d| d.flatten().map(|e| e.file_name()).collect())
            .unwrap_or_default();
        assert_eq!(
            names,
            ["keep.txt"],
            "something appeared outside the scratch dir"
        );
        assert!(!std::path::Path::new(&format!("/tmp/{}", run.marker)).exists());
        assert!(!Path::new(&home).join(&run.marker).exists());
        let inside = sandbox.scratch.path().join("inside.txt");
        assert_eq!(std::fs::read_to_string(inside).unwrap_or_default(), "fine");
    }
}

#[test]
fn reads_of_home_and_other_processes_fail_but_the_context_is_readable() {
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let secret_dir = tempfile::Builder::new()
        .prefix(".rlm-secret-")
        .tempdir_in(&home)
        .unwrap_or_else(|e| panic!("{e}"));
    let token = format!("rlm-secret-token-{}", std::process::id());
    let secret = secret_dir.path().join("secret.txt");
    std::fs::write(&secret, &token).unwrap_or_else(|e| panic!("{e}"));
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644))
        .unwrap_or_else(|e| panic!("{e}"));
    std::fs::set_permissions(secret_dir.path(), std::fs::Permissions::from_mode(0o755))
        .unwrap_or_else(|e| panic!("{e}"));
    let context_dir = open_folder();
    let context = context_dir.path().join("context.txt");
    std::fs::write(&context, "the context").unwrap_or_else(|e| panic!("{e}"));
    std::fs::set_permissions(&context, std::fs::Permissions::from_mode(0o644))
        .unwrap_or_else(|e| panic!("{e}"));
    let mut sandbox = Sandbox::new();
    sandbox.policy = sandbox.policy.clone().allow_read(&context);
    let parent = std::process::id().to_string();
    let run = sandbox.run(
        &code(
            r#"
secret, context, parent, home = sys.argv[2:6]
attempt("read_secret", lambda: open(secret).read())
attempt("list_home", lambda: os.listdir(home))
attempt("list_root", lambda: os.listdir("/"))
def symlink_read():
    os.symlink(secret, SCRATCH + "/s")
    return open(SCRATCH + "/s").read()
attempt("symlink_read", symlink_read)
attempt("read_shadow", lambda: open("/etc/shadow").read())
attempt("proc_root_link", lambda: open("/proc/self/root" + secret).read())
attempt("proc_cwd_link", lambda: os.listdir("/proc/self/cwd/.."))
attempt("parent_environ", lambda: open(f"/proc/{parent}/environ", "rb").read())
attempt("parent_mem", lambda: open(f"/proc/{parent}/mem", "rb").read(1))
attempt("parent_cmdline", lambda: open(f"/proc/{parent}/cmdline", "rb").read())
attempt("host_init_environ", lambda: open("/proc/1/environ", "rb").read())
attempt("sibling_file_of_context", lambda: os.listdir(os.path.dirname(context)))
attempt("context", lambda: open(context).read())
"#,
        ),
        &[
            &secret.to_string_lossy(),
            &context.to_string_lossy(),
            &parent,
            &home,
        ],
    );
    // Landlock refuses paths outside the policy (EACCES); the parent is not in the PID
    // namespace's own `/proc` at all; init of that namespace is outside the code's Landlock
    // domain and keeps the privileges the code dropped.
    for (name, errno) in [
        ("read_secret", libc::EACCES),
        ("list_home", libc::EACCES),
        ("list_root", libc::EACCES),
        ("symlink_read", libc::EACCES),
        ("read_shadow", libc::EACCES),
        ("parent_environ", libc::ENOENT),
        ("parent_mem", libc::ENOENT),
        ("parent_cmdline", libc::ENOENT),
        ("host_init_environ", libc::EACCES),
        ("sibling_file_of_context", libc::EACCES),
    ] {
        refused(&run, name, errno);
    }
    assert_eq!(run.expect("context"), "ok the context");
    assert!(!run.stdout.contains(&token), "the secret leaked: {run:#?}");
}

#[test]
fn no_network_not_even_loopback_or_a_named_unix_socket() {
    for sandbox in sandboxes() {
        let tcp = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
        tcp.set_nonblocking(true).unwrap_or_else(|e| panic!("{e}"));
        let port = tcp
            .local_addr()
            .map(|a| a.port())
            .unwrap_or_default()
            .to_string();
        let tcp6 = TcpListener::bind("[::1]:0").ok();
        let port6 = tcp6
            .as_ref()
            .and_then(|l| l.local_addr().ok())
            .map_or_else(|| "0".to_owned(), |a| a.port().to_string());
        // A named socket the file permissions would let the confined code connect to (a
        // desktop bus, an SSH agent or the Docker socket stand like this), in `/tmp`: a
        // socket's path has at most 107 bytes, whatever the suite's `TMPDIR`.
        let sock_dir = open_folder_in(Path::new("/tmp"));
        let sock_path = sock_dir.path().join("agent.sock");
        let unix = UnixListener::bind(&sock_path).unwrap_or_else(|e| panic!("{e}"));
        unix.set_nonblocking(true).unwrap_or_else(|e| panic!("{e}"));
        std::fs::set_permissions(&sock_path, std::fs::Permissions::from_mode(0o777))
            .unwrap_or_else(|e| panic!("{e}"));
        let run = sandbox.run(
            &code(
                r#"
port, port6, path = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
def tcp(family, host, port):
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(3)
    return s.connect((host, port))
attempt("tcp4", lambda: tcp(socket.AF_INET, "127.0.0.1", port))
attempt("tcp6", lambda: tcp(socket.AF_INET6, "::1", port6))
attempt("udp", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("127.0.0.1", port)))
attempt("listen", lambda: socket.create_server(("127.0.0.1", 0)))
attempt("raw", lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW))
attempt("netlink", lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW))
def unix_named():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    return s.connect(path)
attempt("unix_named", unix_named)
def unix_bind():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    return s.bind(SCRATCH + "/mine.sock")
attempt("unix_bind", unix_bind)
def pair():
    a, b = socket.socketpair()
    a.sendall(b"ping")
    return b.recv(4).decode()
attempt("socketpair", pair)
print("netns", os.readlink("/proc/self/ns/net"))
"#,
            ),
            &[&port, &port6, &sock_path.to_string_lossy()],
        );
        // seccomp answers first: `socket` for anything but AF_UNIX, `connect` and `bind`.
        for name in [
            "tcp4",
            "tcp6",
            "udp",
            "listen",
            "raw",
            "netlink",
            "unix_named",
            "unix_bind",
        ] {
            refused(&run, name, libc::EPERM);
        }
        assert_eq!(
            run.expect("socketpair"),
            "ok ping",
            "AF_UNIX socket pairs must work"
        );
        let own = std::fs::read_link("/proc/self/ns/net").unwrap_or_default();
        assert_ne!(
            run.expect("netns"),
            own.to_string_lossy(),
            "no network namespace"
        );
        assert_eq!(
            tcp.accept().map(|_| ()).map_err(|e| e.kind()),
            Err(ErrorKind::WouldBlock)
        );
        if let Some(l) = tcp6 {
            l.set_nonblocking(true).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(
                l.accept().map(|_| ()).map_err(|e| e.kind()),
                Err(ErrorKind::WouldBlock)
            );
        }
        assert_eq!(
            unix.accept().map(|_| ()).map_err(|e| e.kind()),
            Err(ErrorKind::WouldBlock)
        );
    }
}

#[test]
fn other_processes_and_the_kernel_are_out_of_reach() {
    let mut sleeper = Command::new("sleep")
        .arg("30")
        .stdin(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    let sandbox = Sandbox::new();
    let run = sandbox.run(
        &code(
            r#"
sleeper = int(sys.argv[2])
child = os.fork()
if child == 0:
    time.sleep(20)
    os._exit(0)
class iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
buf = ctypes.create_string_buffer(8)
local = iovec(ctypes.cast(buf, ctypes.c_void_p), 8)
remote = iovec(ctypes.cast(buf, ctypes.c_void_p), 8)
attempt("ptrace_attach_child", lambda: check(libc.ptrace(16, child, 0, 0)))
attempt("ptrace_seize_child", lambda: check(libc.ptrace(0x4206, child, 0, 0)))
attempt("ptrace_traceme", lambda: check(libc.ptrace(0, 0, 0, 0)))
attempt("vm_readv", lambda: check(libc.process_vm_readv(child, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)))
attempt("vm_writev", lambda: check(libc.process_vm_writev(child, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)))
def mem(pid):
    # At an address mapped in that process: address 0, never mapped, fails (EIO) anywhere.
    with open(f"/proc/{pid}/mem", "rb") as f:
        with open(f"/proc/{pid}/maps") as maps:
            f.seek(int(maps.readline().split("-")[0], 16))
        return len(f.read(8))
attempt("self_mem", lambda: mem("self"))
attempt("child_mem", lambda: mem(child))
attempt("init_mem", lambda: mem(1))
attempt("signal_outside", lambda: os.kill(sleeper, signal.SIGTERM))
attempt("signal_everyone", lambda: check(libc.kill(-1, 0)))
attempt("signal_init", lambda: os.kill(1, signal.SIGKILL))
attempt("unshare_user", lambda: check(libc.unshare(0x10000000)))
def clone_newuser():
    r = check(libc.syscall(56, 0x10000000 | 17, 0, 0, 0, 0))
    if r == 0:
        os._exit(0)
    return r
attempt("clone_newuser", clone_newuser)
attempt("mount", lambda: check(libc.mount(b"none", SCRATCH.encode(), b"tmpfs", 0, None)))
attempt("bpf", lambda: check(libc.syscall(321, 0, 0, 0)))
attempt("perf_event_open", lambda: check(libc.syscall(298, 0, 0, -1, -1, 0)))
attempt("io_uring_setup", lambda: check(libc.syscall(425, 8, ctypes.create_string_buffer(120))))
attempt("keyctl", lambda: check(libc.syscall(250, 0, 0, 0, 0, 0)))
attempt("userfaultfd", lambda: check(libc.syscall(323, 0)))
attempt("personality_no_aslr", lambda: check(libc.personality(0x0040000)))
attempt("chroot", lambda: check(libc.chroot(SCRATCH.encode())))
"#,
        ),
        &[&sleeper.id().to_string()],
    );
    // seccomp refuses the calls (EPERM); the code's fork, not dumpable, cannot be read; init
    // of the PID namespace, outside the code's Landlock domain and keeping the privileges the
    // code dropped, can be neither read nor signalled; a process outside the namespace is not
    // there to signal.
    for (name, errno) in [
        ("ptrace_attach_child", libc::EPERM),
        ("ptrace_seize_child", libc::EPERM),
        ("ptrace_traceme", libc::EPERM),
        ("vm_readv", libc::EPERM),
        ("vm_writev", libc::EPERM),
        ("child_mem", libc::EACCES),
        ("init_mem", libc::EACCES),
        ("signal_outside", libc::ESRCH),
        ("signal_everyone", libc::EPERM),
        ("signal_init", libc::EPERM),
        ("unshare_user", libc::EPERM),
        ("clone_newuser", libc::EPERM),
        ("mount", libc::EPERM),
        ("bpf", libc::EPERM),
        ("perf_event_open", libc::EPERM),
        ("io_uring_setup", libc::EPERM),
        ("keyctl", libc::EPERM),
        ("userfaultfd", libc::EPERM),
        ("personality_no_aslr", libc::EPERM),
        ("chroot", libc::EPERM),
    ] {
        refused(&run, name, errno);
    }
    // The code's own memory is readable, which shows `mem` reaches memory when nothing
    // stands in the way: `child_mem` is refused because its fork is not dumpable (the code
    // has no capability that would override it), `init_mem` by the confinement.
    assert_eq!(run.expect("self_mem"), "ok 8", "{run:#?}");
    assert!(
        matches!(sleeper.try_wait(), Ok(None)),
        "the confined code killed a process outside"
    );
    let _ = sleeper.kill();
    let _ = sleeper.wait();
}

/// Starts `rlm-confine` on a machine that has neither user namespaces nor Landlock, as far as
/// it can tell: a seccomp filter of the test's own refuses `unshare` (`EPERM`) and
/// `landlock_create_ruleset` (`ENOSYS`, an older kernel's answer). Arguments of `python3 -c`.
const NO_NAMESPACES_NOR_LANDLOCK: &str = r#"
import ctypes, os, struct, sys
unshare, landlock = int(sys.argv[1]), int(sys.argv[2])
def insn(code, jt, jf, k):
    return struct.pack("HBBI", code, jt, jf, k)
ALLOW, ERRNO = 0x7FFF0000, 0x00050000
program = b"".join([
    insn(0x20, 0, 0, 0),                    # the system call's number
    insn(0x15, 0, 1, unshare),
    insn(0x06, 0, 0, ERRNO | 1),            # EPERM
    insn(0x15, 0, 1, landlock),
    insn(0x06, 0, 0, ERRNO | 38),           # ENOSYS
    insn(0x06, 0, 0, ALLOW),
])
class Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
code = ctypes.create_string_buffer(program, len(program))
filters = Program(len(program) // 8, ctypes.cast(code, ctypes.c_void_p))
libc = ctypes.CDLL(None, use_errno=True)
assert libc.prctl(38, 1, 0, 0, 0) == 0, "PR_SET_NO_NEW_PRIVS"
assert libc.prctl(22, 2, ctypes.byref(filters), 0, 0) == 0, "PR_SET_SECCOMP"
os.execv(sys.argv[3], sys.argv[3:])
"#;

/// Where the kernel gives neither user namespaces (so no PID namespace: the supervisor is
/// the code's parent, in the machine's `/proc`) nor Landlock, and the code's user is not root
/// (no capability on either side, which would refuse it), what keeps the code from the
/// supervisor's memory is that the supervisor is not dumpable: its `/proc/PID/mem` would let
/// the code rewrite a process of its user outside every layer (no seccomp filter, no rlimits),
/// and run anything there. Fails with the supervisor dumpable (the memory read, the
/// environment too). As root, the code runs as [`NOBODY`](crate::support::NOBODY).
#[test]
fn without_namespaces_or_landlock_the_supervisor_is_still_out_of_the_codes_reach() {
    let mut sandbox = Sandbox::unprivileged().unwrap_or_else(Sandbox::new);
    sandbox.wrapper = vec![
        sandbox.python.display().to_string(),
        "-c".to_owned(),
        NO_NAMESPACES_NOR_LANDLOCK.to_owned(),
        libc::SYS_unshare.to_string(),
        libc::SYS_landlock_create_ruleset.to_string(),
    ];
    let run = sandbox.run(
        &code(
            r#"
supervisor = os.getppid()
def mem(pid):
    with open(f"/proc/{pid}/mem", "rb") as f:
        with open(f"/proc/{pid}/maps") as maps:
            f.seek(int(maps.readline().split("-")[0], 16))
        return len(f.read(8))
print("parent", open(f"/proc/{supervisor}/comm").read().strip(), flush=True)
# The control: a fork of the code's that makes itself dumpable is read.
ready_r, ready_w = os.pipe()
child = os.fork()
if child == 0:
    libc.prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE
    os.write(ready_w, b"x")
    time.sleep(20)
    os._exit(0)
os.read(ready_r, 1)
attempt("dumpable_child_mem", lambda: mem(child))
os.kill(child, signal.SIGKILL)
attempt("supervisor_mem", lambda: mem(supervisor))
attempt("supervisor_environ", lambda: len(open(f"/proc/{supervisor}/environ", "rb").read()))
"#,
        ),
        &[],
    );
    let report = run
        .report
        .clone()
        .unwrap_or_else(|| panic!("no report: {run:#?}"));
    // The machine the test means: no Landlock, no PID namespace (the supervisor is the
    // subreaper and the code's parent), and `/proc/PID/mem` read where nothing else stands in
    // the way (a dumpable process of the code's user, holding no capability the code lacks).
    assert!(
        matches!(
            report.state(Layer::Filesystem),
            Some(State::Unavailable { .. })
        ),
        "{report}"
    );
    assert!(
        matches!(report.state(Layer::Lifetime), Some(State::Partial { .. })),
        "{report}"
    );
    assert_eq!(run.expect("parent"), "rlm-confine", "{run:#?}");
    assert_eq!(run.expect("dumpable_child_mem"), "ok 8", "{run:#?}");
    refused(&run, "supervisor_mem", libc::EACCES);
    refused(&run, "supervisor_environ", libc::EACCES);
}

#[test]
fn a_fork_bomb_is_capped_and_dies_with_the_worker() {
    for sandbox in sandboxes() {
        let run = sandbox.run(
            &code(
                r#"
pids, err = [], None
for i in range(3000):
    try:
        p = os.fork()
    except OSError as e:
        err = e.errno
        break
    if p == 0:
        time.sleep(60)
        os._exit(0)
    pids.append(p)
print("forked", len(pids), flush=True)
print("error", err, flush=True)
"#,
            ),
            &[],
        );
        let forked: usize = run.expect("forked").parse().unwrap_or(usize::MAX);
        assert_eq!(
            run.expect("error"),
            "11",
            "fork must fail with EAGAIN: {run:#?}"
        );
        // 64 processes for a user; for root the PID namespace's pid_max (at least 301).
        let by_pid_max = run
            .report
            .as_ref()
            .and_then(|r| r.state(Layer::Processes))
            .is_some_and(|s| matches!(s, State::Active { detail } if detail.contains("pid_max")));
        let cap = if by_pid_max { 300 } else { 64 };
        assert!(
            forked <= cap,
            "forked {forked} processes, cap {cap}: {run:#?}"
        );
        assert!(forked >= 8, "the cap is far too low: {forked}");
    }
}

#[test]
fn a_memory_bomb_hits_the_memory_limit() {
    for sandbox in sandboxes() {
        let run = sandbox.run(
            &code(
                r#"
chunks, total = [], 0
try:
    while total < (4 << 30):
        chunks.append(bytearray(16 << 20))
        total += 16 << 20
    print("allocated", total)
except MemoryError:
    print("memory_error", total)
"#,
            ),
            &[],
        );
        let total: u64 = run.expect("memory_error").parse().unwrap_or(u64::MAX);
        assert!(
            total <= 256 << 20,
            "allocated {total} bytes past a 256 MiB limit"
        );
    }
}

#[test]
fn a_file_past_the_size_limit_fails() {
    let run = Sandbox::new().run(
        &code(
            r#"attempt("big_file", lambda: open(SCRATCH + "/big", "wb").write(b"x" * (2 << 20)))"#,
        ),
        &[],
    );
    refused(&run, "big_file", libc::EFBIG);
}

#[test]
fn a_program_writing_past_the_file_size_limit_gets_an_error_not_a_signal() {
    let sandbox = Sandbox::new();
    let run = sandbox.run(
        &code(
            r#"
import subprocess
# As the worker's embedded Python, which installs no signal handling of its own.
r = subprocess.run(["/bin/sh", "-c", 'head -c 2097152 /dev/zero > "$SCRATCH/big"'],
                   capture_output=True, text=True, restore_signals=False)
print("returncode", r.returncode)
print("stderr", r.stderr.strip())
"#,
        ),
        &[],
    );
    assert_eq!(run.expect("returncode"), "1", "{run:#?}");
    assert!(run.expect("stderr").contains("File too large"), "{run:#?}");
}

#[test]
fn a_setsid_double_fork_does_not_outlive_the_worker() {
    for sandbox in sandboxes() {
        let run = sandbox.run(
            &code(
                r#"
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.setsid() if os.getsid(0) != os.getpid() else None
        os.write(w, b"%d" % os.getpid())
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        time.sleep(60)
        os._exit(0)
    os._exit(0)
print("daemon", os.read(r, 32).decode(), flush=True)
"#,
            ),
            &[],
        );
        run.expect("daemon");
    }
}

#[test]
fn killing_the_supervisor_kills_the_whole_tree() {
    for sandbox in sandboxes() {
        let run = sandbox.run_with(
            &code(
                r#"
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(60)
        os._exit(0)
    os._exit(0)
ready()
time.sleep(60)
"#,
            ),
            &[],
            false,
            &[],
            |pid| {
                // SAFETY: kills the supervisor this test spawned.
                unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            },
        );
        assert!(!run.timed_out, "{run:#?}");
        assert_eq!(run.signal(), Some(libc::SIGKILL));
        assert!(
            run.leftovers.is_empty(),
            "processes outlived their supervisor: {run:#?}"
        );
    }
}

#[test]
fn the_supervisor_ends_like_the_confined_process_and_relays_signals() {
    let sandbox = Sandbox::new();
    let segv = sandbox.run(&code("os.kill(os.getpid(), signal.SIGSEGV)"), &[]);
    assert_eq!(segv.signal(), Some(libc::SIGSEGV), "{segv:#?}");
    let abort = sandbox.run(&code("os.abort()"), &[]);
    assert_eq!(abort.signal(), Some(libc::SIGABRT), "{abort:#?}");
    let exit = sandbox.run(&code("sys.exit(7)"), &[]);
    assert_eq!(exit.status.code(), Some(7), "{exit:#?}");
    let interrupted = sandbox.run_with(
        &code(
            r#"
def on_int(sig, frame):
    print("got", sig, flush=True)
    os._exit(3)
signal.signal(signal.SIGINT, on_int)
ready()
time.sleep(30)
"#,
        ),
        &[],
        false,
        &[],
        |pid| {
            // SAFETY: interrupts the supervisor this test spawned.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGINT) };
        },
    );
    assert_eq!(interrupted.expect("got"), libc::SIGINT.to_string());
    assert_eq!(interrupted.status.code(), Some(3));
}

#[test]
fn the_environment_holds_only_the_policy() {
    let sandbox = Sandbox::new();
    let run = sandbox.run_with(
        &code(
            r#"
print("names", ",".join(sorted(k for k in os.environ if k not in ("LC_CTYPE",))))
print("leak", "sk-rlm-test" in open("/proc/self/environ", "rb").read().decode(errors="replace"))
"#,
        ),
        &[],
        false,
        &[
            ("OPENAI_API_KEY", "sk-rlm-test-secret"),
            ("AWS_SECRET_ACCESS_KEY", "sk-rlm-test-2"),
        ],
        |_| {},
    );
    let names: Vec<&str> = run.expect("names").split(',').collect();
    let mut expected: Vec<&str> = sandbox.policy.env.keys().map(String::as_str).collect();
    expected.retain(|k| *k != "LC_CTYPE");
    assert_eq!(names, expected);
    assert_eq!(run.expect("leak"), "False");
}

#[test]
fn python_works_under_the_default_policy() {
    let run = Sandbox::new().run(
        &code(
            r#"
import json, re, sqlite3, decimal, threading, subprocess, tempfile, hashlib, zlib
db = sqlite3.connect(SCRATCH + "/t.db"); db.execute("create table t(x)"); db.commit()
t = threading.Thread(target=lambda: None); t.start(); t.join()
with tempfile.NamedTemporaryFile(dir=None) as f:
    f.write(b"x")
out = subprocess.run(["ls", SCRATCH], capture_output=True, text=True).stdout.split()
print("files", ",".join(sorted(x for x in out if not x.endswith(".ready"))))
try:
    import numpy
    print("numpy", int(numpy.arange(10).sum()))
except ImportError:
    print("numpy", 45)
"#,
        ),
        &[],
    );
    assert_eq!(run.expect("files"), "t.db", "{run:#?}");
    assert_eq!(run.expect("numpy"), "45", "{run:#?}");
    assert!(run.status.success(), "{run:#?}");
}

#[test]
fn multiprocessing_gets_a_private_dev_shm_and_the_machines_stays_out_of_reach() {
    // A file in the machine's /dev/shm, which the confined code must neither see nor change.
    let host = std::path::Path::new("/dev/shm").join(format!("rlm-host-{}", std::process::id()));
    std::fs::write(&host, "host").unwrap_or_else(|e| panic!("{e}"));
    let run = Sandbox::new().run(
        &code(&format!(
            r#"
import multiprocessing as mp
def locked():
    lock = mp.get_context("fork").Lock()
    with lock:
        return "locked"
attempt("semaphore", locked)
def pool():
    with mp.get_context("fork").Pool(2) as p:
        return sum(p.map(abs, [-1, -2, 3]))
attempt("pool", pool)
attempt("host_file", lambda: open("{host}").read())
attempt("shm_write", lambda: open("/dev/shm/mine", "w").write("x"))
"#,
            host = host.display()
        )),
        &[],
    );
    let host_after = std::fs::read_to_string(&host).unwrap_or_default();
    let _ = std::fs::remove_file(&host);
    assert_eq!(run.expect("semaphore"), "ok locked", "{run:#?}");
    assert_eq!(run.expect("pool"), "ok 6", "{run:#?}");
    assert_eq!(run.expect("shm_write"), "ok 1", "{run:#?}");
    // Not there: `/dev/shm` is the sandbox's own.
    refused(&run, "host_file", libc::ENOENT);
    assert_eq!(host_after, "host");
    assert!(
        !std::path::Path::new("/dev/shm/mine").exists(),
        "the private /dev/shm stayed private"
    );
}

#[test]
fn strict_mode_refuses_a_policy_that_leaves_a_layer_out() {
    let mut sandbox = Sandbox::new();
    sandbox.policy.network = true;
    let run = sandbox.run_with(&code("print('ran', 1)"), &[], true, &[], |_| {});
    assert_eq!(run.status.code(), Some(125), "{run:#?}");
    assert!(
        run.value("ran").is_none(),
        "strict mode ran the code: {run:#?}"
    );
    assert!(
        run.stderr.contains(
            "Strict isolation refuses to run: not confined: network (the policy allows the network)"
        ),
        "{run:#?}"
    );
}
