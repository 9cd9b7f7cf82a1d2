//! Model code that uses processes: pools over functions defined in earlier blocks, forked
//! children that end with their block, and no process left behind when the run ends. The
//! tests that follow processes by pid from inside the run use `--isolation none`: in a
//! worker, pids are those of its PID namespace (`isolation.rs` checks that nothing outlives
//! a worker's run). [`interrupted`] follows a confined worker's processes from this side,
//! by their pids on the machine, while the worker lives on.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::support::{Mock, Run, file, marked, repl, script, signal_and_wait};

const DEFINITIONS: &str = "\
OFFSET = 1
def sq(x):
    return x * x + OFFSET
cube = lambda x: x ** 3
class Box:
    def __init__(self, v):
        self.v = v
def boxed(x):
    return Box(x)";

/// Maps `sq`, `cube` and `boxed` over a `Pool` and a `ProcessPoolExecutor` of each start
/// method; `result` holds one line per method.
const POOLS: &str = "\
import multiprocessing as mp
import concurrent.futures as cf
lines = []
if __name__ == '__main__':
    for method in METHODS:
        ctx = mp.get_context(method)
        with ctx.Pool(2) as pool:
            a = pool.map(sq, range(10))
            c = pool.map(cube, range(4))
            b = [box.v for box in pool.map(boxed, range(3))]
        with cf.ProcessPoolExecutor(2, mp_context=ctx) as ex:
            d = list(ex.map(sq, range(10)))
        lines.append(f'{method}: {sum(a)} {c} {b} {sum(d)}')
result = '; '.join(lines)";

/// Runs `blocks`, then answers with `FINAL_VAR(result)`; returns the run and its trajectory.
fn run_blocks(blocks: &[String], args: &[&str]) -> (Run, String) {
    run_blocks_with(blocks, args, &[])
}

/// [`run_blocks`] with extra environment variables.
fn run_blocks_with(blocks: &[String], args: &[&str], envs: &[(&str, &str)]) -> (Run, String) {
    let mut replies: Vec<&str> = blocks.iter().map(String::as_str).collect();
    replies.push("FINAL_VAR(result)");
    let mock = Mock::start(script(&replies));
    let dir = tempfile::tempdir().expect("tempdir");
    let context = file(dir.path(), "ctx.txt", "some context");
    let trajectory = dir.path().join("t.jsonl");
    let mut all = vec![
        "--context",
        context.to_str().expect("utf-8"),
        "--query",
        "q",
        "--trajectory",
        trajectory.to_str().expect("utf-8"),
    ];
    all.extend_from_slice(args);
    let run = mock.run_env(&all, envs);
    let text = std::fs::read_to_string(&trajectory).unwrap_or_default();
    (run, text)
}

#[test]
fn pools_map_functions_classes_and_lambdas_from_earlier_blocks() {
    // In a worker (the default) `fork` and `spawn`; `forkserver` needs a listening socket,
    // which a confined worker may not bind: it runs in this process only. Its socket is a
    // file in multiprocessing's folder under `TMPDIR`, which the run removes when it ends
    // (Python's exit, which would, never runs in `rlm`). A short `TMPDIR` of the test's own:
    // a socket's path has at most 107 bytes, whatever the suite's `TMPDIR`.
    for (methods, args) in [
        (&["fork", "spawn"][..], &[][..]),
        (
            &["fork", "spawn", "forkserver"][..],
            &["--isolation", "none"][..],
        ),
    ] {
        let list = methods
            .iter()
            .map(|m| format!("'{m}'"))
            .collect::<Vec<_>>()
            .join(", ");
        let pools = POOLS.replace("METHODS", &format!("({list},)"));
        let tmp = tempfile::Builder::new()
            .prefix("rlm-pools-")
            .tempdir_in("/tmp")
            .expect("tempdir");
        let tmp_path = tmp.path().to_str().expect("utf-8");
        let (run, _) = run_blocks_with(
            &[repl(DEFINITIONS), repl(&pools)],
            args,
            &[("TMPDIR", tmp_path)],
        );
        run.assert_code(0);
        let left: Vec<_> = std::fs::read_dir(tmp.path())
            .expect("the run's TMPDIR")
            .map(|entry| entry.expect("an entry").file_name())
            .collect();
        assert!(left.is_empty(), "{args:?} left in TMPDIR: {left:?}");
        let expected = methods
            .iter()
            .map(|m| format!("{m}: 295 [0, 1, 8, 27] [0, 1, 2] 295"))
            .collect::<Vec<_>>()
            .join("; ");
        assert_eq!(
            run.last_line(),
            expected,
            "{args:?}, stderr:\n{}",
            run.stderr
        );
        // Workers never write to the run's stdout or stderr.
        assert_eq!(run.stdout.trim(), expected);
        assert!(!run.stderr.contains("Traceback"), "{}", run.stderr);
    }
}

#[test]
fn a_forked_child_ends_with_its_copy_of_the_block_and_its_status() {
    let code = "\
import os, sys
statuses = []
for how in ('finish', 'raise', 'exit 3'):
    pid = os.fork()
    if pid == 0:
        print('the child writes nowhere')
        if how == 'raise':
            raise ValueError('in the child')
        if how == 'exit 3':
            sys.exit(3)
        break
    statuses.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
result = ' '.join(map(str, statuses))";
    let (run, _) = run_blocks(&[repl(code)], &["--cell-timeout", "20"]);
    run.assert_code(0);
    assert_eq!(run.last_line(), "0 1 3");
    assert!(!run.stdout.contains("the child writes nowhere"));
    // A child that returned into the runtime would run the rest of the loop: one answer only.
    assert_eq!(run.stdout.trim(), "0 1 3");
}

#[test]
fn llm_query_in_a_forked_child_is_refused_not_hung() {
    let code = "\
import os
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(r)
    try:
        llm_query('hello')
        text = 'answered'
    except LlmQueryError as e:
        text = e.kind
    os.write(w, text.encode())
else:
    os.close(w)
    os.waitpid(pid, 0)
    result = os.read(r, 100).decode()";
    let (run, _) = run_blocks(&[repl(code)], &["--cell-timeout", "20"]);
    run.assert_code(0);
    assert_eq!(run.last_line(), "forked_child");
}

/// Whether `pid` is a live process (a zombie has ended).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        let state = stat.rsplit_once(") ").map(|(_, rest)| rest.chars().next());
        !matches!(state, Some(Some('Z' | 'X')))
    })
}

/// The pids a block printed as `pids: 1 2 3` (in the trajectory's block output).
fn printed_pids(trajectory: &str) -> Vec<u32> {
    let line = trajectory
        .split("pids: ")
        .nth(1)
        .and_then(|rest| rest.split("\\n").next())
        .expect("the block printed its pids");
    line.split_whitespace()
        .map(|p| p.parse().expect("a pid"))
        .collect()
}

#[test]
fn no_process_the_run_started_outlives_it() {
    // A bare fork whose child sleeps, a subprocess and a fork pool left open: all running
    // when the run answers.
    let code = "\
import os, subprocess, time
import multiprocessing as mp
pool = mp.get_context('fork').Pool(2)
sleeper = subprocess.Popen(['sleep', '300'])
pid = os.fork()
if pid == 0:
    time.sleep(300)
print('pids:', pid, sleeper.pid, *[p.pid for p in mp.active_children()])
result = 'started'";
    let (run, trajectory) = run_blocks(&[repl(code)], &["--isolation", "none"]);
    run.assert_code(0);
    assert_eq!(run.last_line(), "started");
    let pids = printed_pids(&trajectory);
    assert_eq!(pids.len(), 4, "{pids:?}");
    let left: Vec<u32> = pids.into_iter().filter(|&p| running(p)).collect();
    assert!(left.is_empty(), "still running after the run: {left:?}");
}

/// A daemon a block forked after the forkserver started (a double fork: no session tracks
/// it) holds the forkserver's pipe, so the forkserver never exits on its own. The run still
/// ends at once (the bound, `_END_WAIT_S`, is 0.5 s here; 30 s by default): the forkserver
/// and the resource tracker (whose pipe the daemon holds too) are killed, the forkserver's
/// folder removed from `TMPDIR`, stderr names the daemon, the answer and the trajectory are
/// whole. Both helpers used to be left, holding the run's stdout and stderr (and the folder):
/// whoever read them (here the test) waited as long as the daemon lived.
#[test]
fn a_forkserver_kept_running_by_a_forgotten_daemon_does_not_hold_up_the_runs_end() {
    let code = "\
import multiprocessing, os, select, sys
sys.modules['_rlm_kernel']._END_WAIT_S = 0.5
with multiprocessing.get_context('forkserver').Pool(1) as pool:
    assert pool.map(abs, [-1]) == [1]
child = os.fork()
if child == 0:
    if os.fork() == 0:
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        select.select([], [], [], 60)
else:
    os.waitpid(child, 0)
result = 'answered'";
    let tmp = tempfile::Builder::new()
        .prefix("rlm-daemon-")
        .tempdir_in("/tmp")
        .expect("tempdir");
    let started = Instant::now();
    let (run, trajectory) = run_blocks_with(
        &[repl(code)],
        &["--isolation", "none"],
        &[("TMPDIR", tmp.path().to_str().expect("utf-8"))],
    );
    let took = started.elapsed();
    let daemon: Option<u32> = run
        .stderr
        .split("still held by pid ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|pid| pid.parse().ok());
    if let Some(pid) = daemon {
        let _ = std::process::Command::new("kill")
            .arg(pid.to_string())
            .status();
    }
    run.assert_code(0);
    assert_eq!(run.last_line(), "answered");
    assert!(trajectory.contains("answered"), "{trajectory}");
    assert!(daemon.is_some(), "stderr names no daemon:\n{}", run.stderr);
    assert!(took < Duration::from_secs(30), "the run took {took:?}");
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .expect("the run's TMPDIR")
        .map(|entry| entry.expect("an entry").file_name())
        .collect();
    assert!(left.is_empty(), "left in TMPDIR: {left:?}");
}

#[test]
fn a_pool_left_open_at_a_cell_timeout_is_cleaned_up() {
    let stuck = "\
import multiprocessing as mp, os, time
def spin(x):
    while True:
        pass
pool = mp.get_context('fork').Pool(2)
pending = pool.map_async(spin, range(2))
workers = [p.pid for p in mp.active_children()]
print('pids:', *workers)
time.sleep(300)";
    let check = "\
def running(pid):
    try:
        with open(f'/proc/{pid}/stat') as f:
            return f.read().rsplit(') ', 1)[1][0] not in 'ZX'
    except OSError:
        return False
result = f'{sum(map(running, workers))} running, {len(mp.active_children())} children'";
    let (run, trajectory) = run_blocks(
        &[repl(stuck), repl(check)],
        &["--cell-timeout", "2", "--isolation", "none"],
    );
    run.assert_code(0);
    assert_eq!(run.last_line(), "0 running, 0 children");
    let pids = printed_pids(&trajectory);
    assert_eq!(pids.len(), 2, "{pids:?}");
    assert!(!pids.into_iter().any(running));
}

#[test]
fn ctrl_c_ends_the_processes_of_the_block_it_stops() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pids_file = dir.path().join("pids.txt");
    let code = format!(
        "\
import os, subprocess, time
sleeper = subprocess.Popen(['sleep', '300'])
pid = os.fork()
if pid == 0:
    time.sleep(300)
with open({path:?}, 'w') as f:
    f.write(f'{{pid}} {{sleeper.pid}}')
time.sleep(60)",
        path = pids_file.to_str().expect("utf-8")
    );
    let mock = Mock::start(script(&[&repl(&code), "FINAL(never)"]));
    let context = file(dir.path(), "ctx.txt", "some context");
    let child = mock.spawn_run_with(
        &context,
        &dir.path().join("t.jsonl"),
        &["--isolation", "none"],
        &[],
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let pids: Vec<u32> = loop {
        let text = std::fs::read_to_string(&pids_file).unwrap_or_default();
        let pids: Vec<u32> = text
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
        if pids.len() == 2 {
            break pids;
        }
        assert!(std::time::Instant::now() < deadline, "the block started");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let output = signal_and_wait(child, libc::SIGINT, "Ctrl-C");
    assert_eq!(output.status.code(), Some(130));
    let left: Vec<u32> = pids.into_iter().filter(|&p| running(p)).collect();
    assert!(left.is_empty(), "still running after Ctrl-C: {left:?}");
}

/// What [`interrupted`] saw.
#[derive(Debug)]
pub(crate) struct Interrupted {
    /// Every process of the block it found: {pid on the machine: start time}.
    pub(crate) found: BTreeMap<u32, u64>,
    /// Those still running when the wait for their end ran out, or when the run ended.
    pub(crate) left: Vec<u32>,
    pub(crate) code: Option<i32>,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

static MARKS: AtomicUsize = AtomicUsize::new(0);

/// The cell timeout of [`interrupted`]'s runs, in seconds.
const TIMEOUT: u64 = 5;

/// `(parent, start time, state)` of a process on the machine.
fn host_stat(pid: u32) -> Option<(u32, u64, char)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(") ")?.1.split_whitespace().collect();
    let state = fields.first()?.chars().next()?;
    Some((
        fields.get(1)?.parse().ok()?,
        fields.get(19)?.parse().ok()?,
        state,
    ))
}

/// `roots` and every process below them, with their start times.
fn tree(roots: &[u32]) -> BTreeMap<u32, u64> {
    let mut children: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    let mut starts = BTreeMap::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|p| p.parse().ok()) else {
            continue;
        };
        if let Some((parent, start, _)) = host_stat(pid) {
            children.entry(parent).or_default().push(pid);
            starts.insert(pid, start);
        }
    }
    let mut found = BTreeMap::new();
    let mut todo = roots.to_vec();
    while let Some(pid) = todo.pop() {
        if let Some(&start) = starts.get(&pid)
            && found.insert(pid, start).is_none()
        {
            todo.extend(children.get(&pid).into_iter().flatten());
        }
    }
    found
}

/// Whether the process `pid` that started at `start` still runs (a zombie has ended).
fn runs(pid: u32, start: u64) -> bool {
    host_stat(pid).is_some_and(|(_, s, state)| s == start && !matches!(state, 'Z' | 'X'))
}

/// Runs `cell` (`{MARK}` in it: a marker for the command lines of the processes it starts)
/// as the first block of a run in a confined worker (`isolation`), stuck until the cell
/// timeout interrupts it. From this side, by their pids on the machine: waits until at
/// least `least` marked processes run and their number holds still, takes them and every
/// process below them, and waits (bounded) for all of them to end. Only then does the
/// second block, waiting in the same worker, go on; it answers `go` and whether the first
/// block's variables are still there (`same worker`: no worker was restarted, whose end
/// would have ended the processes by itself).
pub(crate) fn interrupted(cell: &str, least: usize, isolation: &str) -> Interrupted {
    let dir = tempfile::tempdir().expect("tempdir");
    let contexts = dir.path().join("contexts");
    std::fs::create_dir(&contexts).expect("mkdir");
    file(&contexts, "ctx.txt", "some context");
    let go = contexts.join("go");
    let mark = format!(
        "rlm-interrupted-{}-{}",
        std::process::id(),
        MARKS.fetch_add(1, Ordering::Relaxed)
    );
    let first = format!(
        "started = True\n{}\nimport time\ntime.sleep(60)",
        cell.replace("{MARK}", &mark)
    );
    let second = format!(
        "\
import os, time
deadline = time.monotonic() + {wait}
while not os.path.exists({go:?}) and time.monotonic() < deadline:
    time.sleep(0.05)
result = ('go' if os.path.exists({go:?}) else 'no go') + (' same worker' if 'started' in globals() else ' new worker')",
        wait = TIMEOUT - 1,
        go = go.to_str().expect("utf-8"),
    );
    let mock = Mock::start(script(&[
        &repl(&first),
        &repl(&second),
        "FINAL_VAR(result)",
    ]));
    let timeout = TIMEOUT.to_string();
    let mut child = mock.spawn_run_with(
        &contexts,
        &dir.path().join("t.jsonl"),
        &["--cell-timeout", &timeout, "--isolation", isolation],
        &[],
    );
    // The block's processes: the marked ones and every process below them, once that set
    // holds still for 300 ms (a fork bomb's too). Not their number: a shell's fork is marked
    // (it has the shell's command line) until it execs `sleep`, so one that stopped being
    // marked as another started left the number as it was, and the newer one unseen.
    let deadline = Instant::now() + Duration::from_secs(TIMEOUT);
    let (mut found, mut since) = (BTreeMap::new(), Instant::now());
    while Instant::now() < deadline {
        let roots = marked(&mark);
        let now = tree(&roots);
        if now != found {
            (found, since) = (now, Instant::now());
        } else if roots.len() >= least && since.elapsed() > Duration::from_millis(300) {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // Their end: the interrupt at the cell timeout, SIGTERM, SIGKILL a second later.
    let deadline = Instant::now() + Duration::from_secs(TIMEOUT + 10);
    let mut left: Vec<u32> = found.keys().copied().collect();
    let mut status = None;
    while !left.is_empty() && Instant::now() < deadline {
        left.retain(|pid| runs(*pid, found[pid]));
        if let Ok(Some(ended)) = child.try_wait() {
            // Whatever still ran then ended with the worker, not with the block.
            status = Some(ended);
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    std::fs::write(&go, "").expect("go");
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = status {
            break Some(status);
        }
        if let Ok(Some(status)) = child.try_wait() {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // A few lines each, well within a pipe's buffer: read once the run has ended.
    let read = |pipe: Option<&mut dyn std::io::Read>| {
        let mut text = String::new();
        pipe.map(|p| p.read_to_string(&mut text));
        text
    };
    Interrupted {
        found,
        left,
        code: status.and_then(|s| s.code()),
        stdout: read(child.stdout.as_mut().map(|p| p as &mut dyn std::io::Read)),
        stderr: read(child.stderr.as_mut().map(|p| p as &mut dyn std::io::Read)),
    }
}

/// A subprocess (a `sleep 60` below its shell), a double-forked daemon and one in a session
/// of its own that ignores SIGTERM: all started by a block the cell timeout interrupts.
const THREE_WAYS: &str = r#"import os, subprocess
sleeper = subprocess.Popen(['sh', '-c', 'sleep 60; : {MARK}'])
if os.fork() == 0:
    if os.fork() == 0:
        os.execv('/bin/sh', ['sh', '-c', 'sleep 60; : {MARK}'])
    os._exit(0)
os.wait()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv('/bin/sh', ['sh', '-c', "trap '' HUP TERM; sleep 60; : {MARK}"])
    os._exit(0)
os.wait()"#;

fn every_process_of_an_interrupted_block_ends_in(isolation: &str) {
    let run = interrupted(THREE_WAYS, 3, isolation);
    // Three shells and a `sleep` below each.
    assert!(run.found.len() >= 6, "{isolation}: {run:#?}");
    assert!(
        run.left.is_empty(),
        "{isolation}: the interrupted block's processes still run: {run:#?}"
    );
    assert_eq!(run.code, Some(0), "{isolation}: {run:#?}");
    assert_eq!(
        run.stdout.lines().last(),
        Some("go same worker"),
        "{isolation}: {run:#?}"
    );
    assert!(
        run.stderr.contains("final answer after 3 iteration(s)"),
        "{isolation}: {run:#?}"
    );
}

#[test]
fn an_interrupted_blocks_processes_end_with_it_in_a_confined_worker() {
    every_process_of_an_interrupted_block_ends_in("process");
}

#[test]
fn an_interrupted_blocks_processes_end_with_it_in_a_strict_worker() {
    every_process_of_an_interrupted_block_ends_in("strict");
}
