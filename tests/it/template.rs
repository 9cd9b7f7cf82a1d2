//! The worker template (fork server) and the workers it confines ahead of need (the pool)
//! through the real binary, with isolation on: what a prompt-injected child could try against
//! its siblings, the idle workers, the template and the parent; a tree of children that
//! starts children without end; a flood of children against the pool's bound; what one
//! child leaves behind for the next; the namespace an idle worker built for its child; how
//! many are confined when a run starts; a template or an idle worker killed mid-run; and
//! that no worker that runs model code is dumpable.
//!
//! Bounded: each run has a deadline (killed past it), a budget of sub-calls and a batch
//! width, and the harness watches `rlm`'s children to check that none outlives the run.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read as _;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::{
    Mock, repl, rlm, rlm_command, transparent_huge_pages_here, without_transparent_huge_pages,
};

/// Deadline of one run.
const DEADLINE: Duration = Duration::from_secs(120);

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A direct child of `parent`: its pid, start time (to tell a reused pid) and name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Proc {
    pid: u32,
    start: u64,
    comm: String,
}

/// Field 22 of `/proc/PID/stat` (start time in clock ticks) and the process name.
fn stat(pid: u32) -> Option<(u64, String, char)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (head, rest) = stat.rsplit_once(") ")?;
    let comm = head.split_once(" (")?.1.to_owned();
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = fields.first()?.chars().next()?;
    Some((fields.get(19)?.parse().ok()?, comm, state))
}

fn children_of(parent: u32) -> Vec<Proc> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{parent}/task")) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for task in tasks.flatten() {
        let path = task.path().join("children");
        for pid in std::fs::read_to_string(path)
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
        {
            if let Some((start, comm, _)) = stat(pid) {
                out.push(Proc { pid, start, comm });
            }
        }
    }
    out
}

fn alive(p: &Proc) -> bool {
    stat(p.pid).is_some_and(|(start, _, state)| start == p.start && state != 'Z')
}

/// What the harness saw of one run.
#[derive(Debug)]
struct Watched {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    /// Every child `rlm` had.
    seen: BTreeSet<Proc>,
    /// The most it had at once.
    most: usize,
    /// Processes the harness killed (or stopped).
    killed: Vec<Proc>,
    /// What became of the process the harness stopped, if it did.
    paused: Paused,
    /// Each process's name when last seen.
    last_name: BTreeMap<u32, String>,
}

/// When the harness kills a process of the run (once), and which.
struct Kill<'a> {
    /// Decides from the mock's requests so far.
    when: &'a dyn Fn(&Mock) -> bool,
    target: Target,
    /// Instead of killing it: stop the target and every process under it (`SIGSTOP`) until
    /// this holds (decided from the mock's requests, at most [`PAUSE_BOUND`]), then go on.
    pause: Option<Pause<'a>>,
}

/// How long the harness keeps a process stopped at most.
const PAUSE_BOUND: Duration = Duration::from_secs(15);

struct Pause<'a> {
    until: &'a dyn Fn(&Mock) -> bool,
    /// Kill the stopped processes (`SIGKILL`) rather than let them go on (`SIGCONT`).
    then_kill: bool,
}

/// What became of a stopped process.
#[derive(Debug, Default)]
struct Paused {
    /// Whether its pause ended because its condition held (not at [`PAUSE_BOUND`]).
    by_condition: Option<bool>,
    /// Whether it and every process under it ended while `rlm` still ran (seen gone, or
    /// zombies, before `rlm` exited).
    ended_during_run: bool,
}

/// `pid` and every process under it (a worker's PID namespace: its init and the confined
/// process, which has a session of its own).
fn with_descendants(pid: u32) -> Vec<u32> {
    let mut all = vec![pid];
    let mut i = 0;
    while let Some(&p) = all.get(i) {
        all.extend(children_of(p).into_iter().map(|c| c.pid));
        i += 1;
    }
    all
}

fn signal_all(pids: &[u32], signal: libc::c_int) {
    for &pid in pids {
        // SAFETY: sends a signal to a process of this test's run.
        unsafe { libc::kill(pid as libc::pid_t, signal) };
    }
}

enum Target {
    /// The running template.
    Template,
    /// The newest worker: one confined ahead of need and still idle, when the run is
    /// between children.
    NewestWorker,
    /// The first worker `rlm`'s debug log says was confined ahead of need (and waits).
    FirstReady,
}

/// What `rlm` logs of a worker confined ahead of need, before its pid.
const READY_LINE: &str = "DEBUG the worker ";

/// The pid of the first worker `stderr` says was confined ahead of need.
fn first_ready(stderr: &str) -> Option<u32> {
    stderr
        .lines()
        .filter(|l| l.ends_with("was confined ahead of need and waits for a session"))
        .find_map(|l| l.split(READY_LINE).nth(1)?.split(' ').next()?.parse().ok())
}

impl Watched {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {self:#?}"))
    }

    fn templates(&self) -> Vec<&Proc> {
        self.seen
            .iter()
            .filter(|p| p.comm == "rlm-template")
            .collect()
    }

    /// Worker processes seen: every process but the templates, told by the name each had
    /// when last seen (a template renames itself `rlm-template` once started; a worker
    /// forked from it has that name until it takes back `rlm`'s, so both are seen under
    /// both names).
    fn workers(&self) -> usize {
        let pids: BTreeSet<u32> = self
            .seen
            .iter()
            .filter(|p| {
                self.last_name
                    .get(&p.pid)
                    .is_some_and(|c| c != "rlm-template")
            })
            .map(|p| p.pid)
            .collect();
        pids.len()
    }

    /// Sessions that took a worker confined ahead of need (from `rlm`'s debug log).
    fn took_ready(&self) -> usize {
        self.stderr.matches(", confined ahead of need").count()
    }
}

/// Runs `rlm run` against `mock` with `args`, watching its children every 5 ms (its worker
/// log at debug level on stderr); `kill` says when to kill which of them (once).
fn watched(mock: &Mock, args: &[&str], kill: Option<Kill<'_>>) -> Watched {
    watched_with(mock, args, kill, |_| {})
}

/// [`watched`], with `rlm`'s command prepared by `prepare` first.
fn watched_with(
    mock: &Mock,
    args: &[&str],
    kill: Option<Kill<'_>>,
    prepare: impl FnOnce(&mut Command),
) -> Watched {
    let dir = tempfile::tempdir().expect("tempdir");
    let context = crate::support::file(dir.path(), "ctx.txt", "alpha beta\n");
    let context = context.to_string_lossy();
    let mut all = vec!["--query", "q", "--context", &context];
    all.extend_from_slice(args);
    let mut command = rlm_command(&mock.run_args(&all));
    prepare(&mut command);
    let mut child = command
        .env(
            "RUST_LOG",
            // `spawn`: what the workers and the template write on their stderr.
            "warn,kernel::repl::worker::parent=debug,kernel::repl::worker::pool=debug,\
             kernel::repl::worker::spawn=debug",
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("rlm starts");
    let out = child.stdout.take().map(crate::hostile::reader);
    // Read as it comes: the harness looks for the pid of a worker there.
    let err = Arc::new(Mutex::new(Vec::new()));
    let err_reader = child.stderr.take().map(|mut pipe| {
        let err = Arc::clone(&err);
        std::thread::spawn(move || {
            let mut chunk = [0u8; 4096];
            while let Ok(n @ 1..) = pipe.read(&mut chunk) {
                let mut kept = lock(&err);
                if kept.len() < 8 << 20 {
                    kept.extend_from_slice(&chunk[..n]);
                }
            }
        })
    });
    let started = Instant::now();
    let (mut seen, mut most, mut killed) = (BTreeSet::new(), 0, Vec::new());
    let mut paused = Paused::default();
    let mut last_name = BTreeMap::new();
    // The processes stopped, and since when.
    let mut stopped: Option<(Vec<u32>, Instant)> = None;
    let status = loop {
        let now = children_of(child.id());
        most = most.max(now.len());
        if killed.is_empty()
            && let Some(kill) = &kill
            && (kill.when)(mock)
            && let Some(target) = match kill.target {
                Target::Template => now.iter().find(|p| p.comm == "rlm-template"),
                Target::NewestWorker => now
                    .iter()
                    .filter(|p| p.comm != "rlm-template" && alive(p))
                    .max_by_key(|p| (p.start, p.pid)),
                Target::FirstReady => first_ready(&String::from_utf8_lossy(&lock(&err)))
                    .and_then(|pid| now.iter().find(|p| p.pid == pid)),
            }
        {
            if kill.pause.is_some() {
                let pids = with_descendants(target.pid);
                signal_all(&pids, libc::SIGSTOP);
                stopped = Some((pids, Instant::now()));
            } else {
                signal_all(&[target.pid], libc::SIGKILL);
            }
            killed.push(target.clone());
        }
        if let (Some((pids, since)), Some(pause)) =
            (&stopped, kill.as_ref().and_then(|k| k.pause.as_ref()))
            && paused.by_condition.is_none()
        {
            let held = (pause.until)(mock);
            if held || since.elapsed() > PAUSE_BOUND {
                paused.by_condition = Some(held);
                signal_all(
                    pids,
                    if pause.then_kill {
                        libc::SIGKILL
                    } else {
                        libc::SIGCONT
                    },
                );
            }
        }
        if let Some((pids, _)) = &stopped
            && !paused.ended_during_run
            && pids
                .iter()
                .all(|&pid| stat(pid).is_none_or(|(_, _, state)| state == 'Z'))
        {
            paused.ended_during_run = true;
        }
        last_name.extend(now.iter().map(|p| (p.pid, p.comm.clone())));
        seen.extend(now);
        if let Ok(Some(status)) = child.try_wait() {
            break Some(status);
        }
        if started.elapsed() > DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let watched = Watched {
        code: status.and_then(|s| s.code()),
        stdout: out
            .map(|h| h.join().unwrap_or_default())
            .unwrap_or_default(),
        stderr: {
            if let Some(reader) = err_reader {
                let _ = reader.join();
            }
            String::from_utf8_lossy(&lock(&err)).into_owned()
        },
        seen,
        most,
        killed,
        paused,
        last_name,
    };
    // Nothing `rlm` started outlives it (the kernel ends a PID namespace asynchronously).
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut left: Vec<&Proc> = watched.seen.iter().filter(|p| alive(p)).collect();
    while !left.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        left.retain(|p| alive(p));
    }
    for p in &left {
        // SAFETY: kills a leftover of this test's run before failing it.
        unsafe { libc::kill(p.pid as libc::pid_t, libc::SIGKILL) };
    }
    assert!(left.is_empty(), "outlived the run: {left:?}\n{watched:#?}");
    watched
}

/// `root-model` replies `root`; `sub-model` plays each child RLM: `child` in its first turn,
/// `FINAL_VAR(result)` in its second; plain sub-calls are echoed.
fn script(root: &[&str], child: &str) -> Value {
    json!({"models": {
        "root-model": {"replies": root},
        "sub-model": {"rules": [
            {"system": "recursive language model", "turn": 0, "reply": repl(child)},
            {"system": "recursive language model", "turn": 1, "reply": "FINAL_VAR(result)"}
        ], "fallback": {"behaviour": "echo"}}
    }})
}

/// `rlm run --max-depth 2 --json` (and `args`) against a mock whose root model runs `root`,
/// which sets `answers`, and answers with it; each child runs `child` (see [`script`]). The run
/// must succeed; returns what the harness saw and the answer.
fn tree(root: &str, child: &str, args: &[&str]) -> (Watched, String) {
    let mock = Mock::start(script(&[&repl(root), "FINAL_VAR(answers)"], child));
    let mut all = vec!["--max-depth", "2", "--json"];
    all.extend_from_slice(args);
    let run = watched(&mock, &all, None);
    assert_eq!(run.code, Some(0), "{run:#?}");
    let answer = run.json()["answer"].as_str().unwrap_or_default().to_owned();
    (run, answer)
}

/// A child's probe, run by two siblings at once: which pids its `/proc` lists (its PID
/// namespace's own: no pid there leads to the template, its siblings or `rlm`); every
/// other process's memory, environment and descriptors (the template's link to `rlm` is its
/// fd 3), by pid up to past its own; and a signal to every pid its PID namespace could
/// name. Its own threads left out of both.
const PROBE: &str = r#"import os, time
time.sleep(0.3)
me = int(os.readlink('/proc/self'))
listed = sorted(int(e) for e in os.listdir('/proc') if e.isdigit())
own = {int(line.split()[-1]) for task in os.listdir('/proc/self/task')
       for line in open(f'/proc/self/task/{task}/status') if line.startswith('NSpid:')}
opened = {'mem': 0, 'environ': 0, 'fd/3': 0, 'fd': 0}
for pid in range(1, me + 2000):
    if pid in own:
        continue
    for what in opened:
        try:
            if what == 'fd':
                # What its descriptors are (as root their numbers show; they tell nothing).
                opened[what] += sum(1 for fd in os.listdir(f'/proc/{pid}/fd')
                                    if os.readlink(f'/proc/{pid}/fd/{fd}'))
            else:
                os.close(os.open(f'/proc/{pid}/{what}', os.O_RDONLY))
                opened[what] += 1
        except OSError:
            pass
signalled = []
for pid in range(1, 4096):
    if pid not in own:
        try:
            os.kill(pid, 0)
            signalled.append(pid)
        except OSError:
            pass
result = f"{opened} signalled {signalled} listed {listed} searched {me}""#;

#[test]
fn a_child_reaches_neither_its_siblings_nor_the_template_nor_rlm() {
    // A first child gives the template time to start (and workers to be confined ahead of
    // need) on a loaded machine: the two probes then run beside idle ones. Whether one was
    // ready in time is the scheduler's call, so a run where none was is run again (at most
    // three runs); every run's probes must find nothing either way.
    let mut beside_idle = false;
    for _ in 0..3 {
        let (run, answer) = tree(
            "rlm_query('probe')\nanswers = rlm_query_batched(['probe', 'probe'])",
            PROBE,
            &[],
        );
        let nothing = "{'mem': 0, 'environ': 0, 'fd/3': 0, 'fd': 0} signalled [] listed [1, 2]";
        assert_eq!(
            answer.matches(nothing).count(),
            2,
            "a child reached another process: {answer}\n{run:#?}"
        );
        // The probe searched every pid its `/proc` could name: that of its own namespace,
        // where only its init and itself live (`listed [1, 2]` above), so the template, the
        // siblings it ran beside and `rlm` have no pid there to search.
        let template = run.templates();
        assert!(!template.is_empty(), "no template ran: {run:#?}");
        let searched: Vec<u32> = answer
            .split("searched ")
            .skip(1)
            .filter_map(|s| s.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok())
            .collect();
        assert_eq!(searched, [2, 2], "{answer}");
        // Workers confined ahead of need waited, idle, beside the probes (the root's worker
        // and the three children's are four): they were not reachable either.
        if run.workers() > 4 && run.took_ready() >= 2 {
            beside_idle = true;
            break;
        }
        eprintln!("no idle worker lived beside the probes; running again: {run:#?}");
    }
    assert!(
        beside_idle,
        "in three runs, no idle worker lived beside the probes"
    );
}

#[test]
fn children_that_start_children_in_a_loop_are_capped_by_the_budget() {
    // The root starts 8 children; each asks for 8 grandchildren 100 times over (prompts all
    // different, the cache off). Past the tree's budget a child gets no session, so no
    // worker is forked for it, and the run stops.
    let mock = Mock::start(script(
        &[
            &repl("rlm_query_batched([f'go {i}' for i in range(8)])"),
            "FINAL(unreachable)",
        ],
        "for i in range(100):\n    rlm_query_batched([f'{i} {j} {context}' for j in range(8)])\nresult = 'looped'",
    ));
    let dir = tempfile::tempdir().expect("tempdir");
    let trajectory = dir.path().join("t.jsonl");
    let run = watched(
        &mock,
        &[
            "--max-depth",
            "3",
            "--max-sub-calls",
            "12",
            "--batch-concurrency",
            "3",
            "--no-sub-call-cache",
            "--cell-timeout",
            "60",
            "--trajectory",
            &trajectory.to_string_lossy(),
        ],
        None,
    );
    assert_eq!(run.code, Some(3), "the budget stops the tree: {run:#?}");
    let sent = mock.requests_to("sub-model");
    assert!(sent <= 12, "{sent} sub-model requests past a budget of 12");
    // The root's worker, a worker per child that could still call its model (12), those
    // started while the last calls were in flight (at most 3 batches of 3 at once), and the
    // workers confined ahead of need (at most the width, 3) that no child took.
    let workers = run.workers();
    assert!(workers <= 1 + 12 + 9 + 3, "{workers} workers: {run:#?}");
    // At once: the template, the root's worker, 3 children and their 9, 3 ready, and up to
    // 3 closed ones not yet reaped.
    assert!(
        run.most <= 1 + 1 + 3 + 9 + 3 + 3,
        "{} processes at once: {run:#?}",
        run.most
    );
    let recorded = std::fs::read_to_string(&trajectory).unwrap_or_default();
    assert!(
        recorded.contains("call_budget") && recorded.contains("the tree's budget is spent (calls)"),
        "the run stops at the budget, and a child past it says why it did not run: {run:#?}"
    );
}

#[test]
fn killing_the_template_mid_run_falls_back_to_new_workers_and_loses_nothing() {
    let mock = Mock::start(script(
        &[
            &repl(
                "kept = 'root state'\nfirst = rlm_query('one')\nimport time\ntime.sleep(1.5)\nrest = [rlm_query('two'), rlm_query('three')]\nresult = [kept, first, *rest]",
            ),
            "FINAL_VAR(result)",
        ],
        "result = 'ok'",
    ));
    // Killed once the first child's loop asked its model: the template has forked its
    // worker, and the next children must start without it.
    let after_first_child = |mock: &Mock| mock.requests_to("sub-model") > 0;
    let run = watched(
        &mock,
        &["--max-depth", "2", "--json"],
        Some(Kill {
            when: &after_first_child,
            target: Target::Template,
            pause: None,
        }),
    );
    assert_eq!(run.code, Some(0), "{run:#?}");
    assert_eq!(
        run.json()["answer"],
        "['root state', 'ok', 'ok', 'ok']",
        "{run:#?}"
    );
    assert_eq!(run.killed.len(), 1, "the template was killed: {run:#?}");
    assert!(!run.stderr.contains("panicked"), "{run:#?}");
    let killed = &run.killed[0];
    assert!(
        run.templates().iter().any(|t| t.pid != killed.pid),
        "a new template was started after the first was killed: {run:#?}"
    );
}

#[test]
fn siblings_forked_from_one_template_draw_different_random_numbers() {
    // Each fork runs Python's after-fork hooks: `random` reseeds from the kernel.
    let (run, answer) = tree(
        "answers = rlm_query_batched(['draw'] * 3)",
        "import random\nresult = str(random.getrandbits(64))",
        &[],
    );
    assert!(!run.templates().is_empty(), "no template ran: {run:#?}");
    let draws: BTreeSet<&str> = answer
        .trim_matches(|c| c == '[' || c == ']')
        .split(", ")
        .collect();
    assert_eq!(draws.len(), 3, "the same numbers in siblings: {answer}");
}

/// A child's look for what the child before it left (its path is this child's `context`):
/// a global of the interpreter, an environment variable, a file in its temporary folder,
/// that file read by path; then it leaves the same for the next.
const LEFT_BEHIND: &str = r#"import builtins, os
found = []
if getattr(builtins, 'rlm_mark', None):
    found.append('global')
if os.environ.get('RLM_MARK'):
    found.append('env')
if any(name.startswith('mark') for name in os.listdir(os.environ['TMPDIR'])):
    found.append('tmp')
before = str(context)
if before != 'none':
    try:
        found.append('file ' + open(before).read())
    except OSError:
        pass
builtins.rlm_mark = 1
os.environ['RLM_MARK'] = '1'
path = os.path.join(os.environ['TMPDIR'], 'mark')
open(path, 'w').write('child state')
result = f"{path} {found}""#;

#[test]
fn a_worker_confined_ahead_of_need_serves_one_child_and_keeps_nothing_of_another() {
    let (run, answer) = tree(
        "answers, before = [], 'none'\nfor i in range(4):\n    answers.append(rlm_query(f'mark {i}', context=before))\n    before = answers[-1].split(' ')[0]",
        LEFT_BEHIND,
        &[],
    );
    assert_eq!(
        answer.matches(" []").count(),
        4,
        "a child saw what another left: {answer}\n{run:#?}"
    );
    // Each child had a worker (and a scratch directory) of its own.
    let paths: BTreeSet<&str> = answer
        .split('\'')
        .filter(|s| s.ends_with(" []"))
        .map(|s| s.trim_end_matches(" []"))
        .collect();
    assert_eq!(paths.len(), 4, "children shared a worker: {answer}");
    // The children after the first took workers confined while the one before ran.
    assert!(
        run.took_ready() >= 3,
        "{} sessions took a worker confined ahead of need: {run:#?}",
        run.took_ready()
    );
}

/// A child's look at the namespace it was handed: every name in it, its `context`, the
/// session namespaces its interpreter holds, and what `SHOW_VARS` lists.
const NAMESPACE: &str = r#"names = sorted(k for k in globals() if not k.startswith('_'))
import sys, io, contextlib
mods = [m for m in sys.modules if m.startswith('__rlm_session_')]
with contextlib.redirect_stdout(io.StringIO()) as shown:
    SHOW_VARS()
listed = [line.split()[0] for line in shown.getvalue().splitlines()]
result = f"{context} | {names} | {len(mods)} | {listed}""#;

#[test]
fn a_namespace_built_while_its_worker_was_idle_holds_only_its_own_child_and_context() {
    // Each worker confined ahead of need builds its session's namespace while idle; the
    // child that takes it finds its own context there and nothing of another session.
    let (run, answer) = tree(
        "answers = [rlm_query('look', context=f'piece {i}') for i in range(4)]",
        NAMESPACE,
        &[],
    );
    let reserved = "['FINAL_VAR', 'LlmQueryError', 'SHOW_VARS', 'answer', 'context', \
                    'context_0', 'llm_query', 'llm_query_batched', 'rlm_query', 'rlm_query_batched']";
    for i in 0..4 {
        let expected = format!("piece {i} | {reserved} | 1 | ['names', 'mods', 'shown']");
        assert!(
            answer.contains(&expected),
            "child {i} did not see `{expected}`: {answer}\n{run:#?}"
        );
    }
    assert!(
        run.took_ready() >= 2,
        "{} sessions took a worker confined ahead of need: {run:#?}",
        run.took_ready()
    );
}

#[test]
fn a_flood_of_children_cannot_grow_the_ready_workers_past_the_width() {
    let (run, answer) = tree(
        "answers = rlm_query_batched([f'go {i}' for i in range(24)])",
        "result = 'ok'",
        &["--batch-concurrency", "4"],
    );
    assert_eq!(answer.matches("'ok'").count(), 24, "{answer}");
    // A worker per session (the root's, 24 children's) and at most the width (4) confined
    // ahead of need that no child took.
    let workers = run.workers();
    assert!(workers <= 1 + 24 + 4, "{workers} workers: {run:#?}");
    // At once: the template, the root's worker, 4 children (a child whose session closes on
    // its own thread still holds its place in the batch), 4 ready or being confined, and up to
    // 4 closed ones not yet reaped: those handed to the closer thread, at most its backlog
    // (`closer.rs`; before it had one, a loaded machine saw 8 waiting there, 15 at once).
    assert!(
        run.most <= 1 + 1 + 4 + 4 + 4,
        "{} processes at once: {run:#?}",
        run.most
    );
    assert!(run.took_ready() >= 1, "the pool served no child: {run:#?}");
}

#[test]
fn a_run_that_may_start_children_has_two_workers_confined_from_its_start() {
    // Children that follow one another faster than a worker is confined wait for theirs:
    // two are ordered when the run starts, and confined at once, while its root model
    // thinks. This run's code starts no child, so no other worker is ordered.
    let mock = Mock::start(slow_script(
        &[&repl("answers = 'none'"), "FINAL_VAR(answers)"],
        1500,
        "result = 'ok'",
        0,
    ));
    let run = watched(&mock, &["--max-depth", "2", "--json"], None);
    assert_eq!(run.code, Some(0), "{run:#?}");
    assert_eq!(run.json()["answer"], "none", "{run:#?}");
    let ready = run
        .stderr
        .lines()
        .filter(|l| l.ends_with("was confined ahead of need and waits for a session"))
        .count();
    assert_eq!(ready, 2, "{ready} workers confined ahead of need: {run:#?}");
    assert_eq!(run.took_ready(), 0, "{run:#?}");
}

#[test]
fn killing_an_idle_worker_before_a_child_takes_it_falls_back_and_loses_nothing() {
    let mock = Mock::start(script(
        &[
            &repl(
                "first = rlm_query('one')\nimport time\ntime.sleep(1.5)\nrest = [rlm_query('two'), rlm_query('three')]\nresult = [first, *rest]",
            ),
            "FINAL_VAR(result)",
        ],
        "result = 'ok'",
    ));
    // Once the first child is done (its two model calls) and the worker confined for the
    // next has had 300 ms to get ready, the newest worker is that idle one.
    let done_at = std::cell::Cell::new(None::<Instant>);
    let idle_next = |mock: &Mock| {
        if mock.requests_to("sub-model") < 2 {
            return false;
        }
        let at = *done_at.get().get_or_insert_with(Instant::now);
        done_at.set(Some(at));
        at.elapsed() > Duration::from_millis(300)
    };
    let run = watched(
        &mock,
        &["--max-depth", "2", "--json"],
        Some(Kill {
            when: &idle_next,
            target: Target::NewestWorker,
            pause: None,
        }),
    );
    assert_eq!(run.code, Some(0), "{run:#?}");
    assert_eq!(run.json()["answer"], "['ok', 'ok', 'ok']", "{run:#?}");
    assert_eq!(run.killed.len(), 1, "an idle worker was killed: {run:#?}");
    assert!(
        run.stderr
            .contains("confined ahead of need had ended; the session starts another"),
        "the next child took the killed worker and started another: {run:#?}"
    );
    assert!(!run.stderr.contains("panicked"), "{run:#?}");
}

#[test]
fn the_end_of_a_run_ends_its_idle_workers_while_rlm_lives_on() {
    // `rlm chat`: one process, one run per question; between two questions only the
    // template and the chat's own worker may live.
    let code = repl("answers = rlm_query_batched(['a', 'b'])");
    let mock = Mock::start(script(
        &[&code, "FINAL_VAR(answers)", &code, "FINAL_VAR(answers)"],
        "result = 'ok'",
    ));
    let dir = tempfile::tempdir().expect("tempdir");
    let context = crate::support::file(dir.path(), "ctx.txt", "alpha beta\n");
    let context = context.to_string_lossy();
    // `rlm chat` takes the options of `rlm run`.
    let mut args = mock.run_args(&["--context", &context, "--max-depth", "2"]);
    args[0] = "chat".to_owned();
    let mut child = rlm_command(&args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("rlm starts");
    let mut err = child.stderr.take().map(crate::hostile::reader);
    let mut stdin = child.stdin.take().expect("stdin");
    let mut stdout = std::io::BufReader::new(child.stdout.take().expect("stdout"));
    // Bounded: past the deadline rlm is killed, and the read of its answer fails.
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watchdog = {
        let (pid, done) = (child.id(), std::sync::Arc::clone(&done));
        std::thread::spawn(move || {
            let started = Instant::now();
            while started.elapsed() < DEADLINE {
                if done.load(std::sync::atomic::Ordering::SeqCst) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            // SAFETY: rlm of this test, not reaped yet (the test waits for this thread first).
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
        })
    };
    let mut line = String::new();
    let mut between = Vec::new();
    for question in ["first?\n", "second?\n"] {
        use std::io::{BufRead, Write};
        stdin
            .write_all(question.as_bytes())
            .expect("question written");
        line.clear();
        stdout.read_line(&mut line).expect("an answer");
        if line.trim() != "['ok', 'ok']" {
            let _ = child.kill();
            let _ = child.wait();
            let stderr = err.take().map(|h| h.join().unwrap_or_default());
            panic!("the answer to {question} is {line:?}; stderr: {stderr:?}");
        }
        between.push(
            children_of(child.id())
                .into_iter()
                .filter(alive)
                .collect::<Vec<_>>(),
        );
    }
    drop(stdin);
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let _ = watchdog.join();
    let status = child.wait().expect("rlm ends");
    let stderr = err
        .map(|h| h.join().unwrap_or_default())
        .unwrap_or_default();
    assert_eq!(status.code(), Some(0), "{stderr}");
    for live in &between {
        let workers: Vec<&Proc> = live.iter().filter(|p| p.comm != "rlm-template").collect();
        assert_eq!(
            workers.len(),
            1,
            "after a run only the chat's own worker lives: {between:#?}\n{stderr}"
        );
    }
}

/// [`script`] with the root model answering after `root_ms` and the children's after
/// `child_ms`.
fn slow_script(root: &[&str], root_ms: u64, child: &str, child_ms: u64) -> Value {
    let mut script = script(root, child);
    script["models"]["root-model"]["latency"] = json!({"kind": "fixed", "ms": root_ms});
    script["models"]["sub-model"]["latency"] = json!({"kind": "fixed", "ms": child_ms});
    script
}

/// `rlm run --max-depth 2 --json` (and `args`) against `mock`, with the run's first worker
/// confined ahead of need stopped before a child takes it, until `until` holds; then killed
/// or let go on. It is stopped as soon as `rlm`'s log names it: the pool confines it while
/// the root model thinks (2 s in these tests), and the child starts only once that model
/// answered. (Not once the mock has the root's request: the mock records a request once it
/// answered it, so that wait ended as the child started, and under load the child took the
/// worker and had its `Ready` before it was stopped.)
fn with_first_ready_stopped(
    mock: &Mock,
    args: &[&str],
    until: &dyn Fn(&Mock) -> bool,
    then_kill: bool,
) -> Watched {
    let mut all = vec!["--max-depth", "2", "--json"];
    all.extend_from_slice(args);
    let at_once = |_: &Mock| true;
    watched(
        mock,
        &all,
        Some(Kill {
            when: &at_once,
            target: Target::FirstReady,
            pause: Some(Pause { until, then_kill }),
        }),
    )
}

/// A run whose root code `root` starts one child, which replies `child` (a block setting
/// `result`) after 0 ms, its worker stopped before it takes it, until its first model call
/// was answered; then killed or let go on. The run must end with `answer`, the child's first
/// model call answered while its worker was stopped (and only its first: its second follows
/// its block, which waited). Returns the mock and what the harness saw.
fn one_child_with_its_worker_stopped(
    root: &str,
    child: &str,
    then_kill: bool,
    answer: &str,
) -> (Mock, Watched) {
    let mock = Mock::start(slow_script(
        &[&repl(root), "FINAL_VAR(answers)"],
        2000,
        child,
        0,
    ));
    let seen_at_resume = std::cell::Cell::new(None);
    let child_asked = |mock: &Mock| {
        let n = mock.requests_to("sub-model");
        if n >= 1 {
            seen_at_resume.set(Some(n));
        }
        n >= 1
    };
    let run = with_first_ready_stopped(&mock, &[], &child_asked, then_kill);
    assert_eq!(run.code, Some(0), "{run:#?}");
    assert_eq!(run.json()["answer"], answer, "{run:#?}");
    assert_eq!(
        run.paused.by_condition,
        Some(true),
        "the child's model call was not answered while its worker was stopped: {run:#?}"
    );
    assert_eq!(seen_at_resume.get(), Some(1), "{run:#?}");
    assert_eq!(mock.requests_to("sub-model"), 2, "{run:#?}");
    (mock, run)
}

/// The pid of the worker the harness stopped.
fn stopped_worker(run: &Watched) -> u32 {
    run.killed.first().expect("a worker was stopped").pid
}

#[test]
fn a_childs_first_model_call_is_answered_while_its_worker_is_still_starting() {
    // The idle worker the child will take is stopped before the child starts: it cannot
    // read its start frame nor say it is ready until it goes on. The child's first model
    // call must be answered all the same; its block (and so its second call) waits for it.
    let (_, run) = one_child_with_its_worker_stopped(
        "answers = [rlm_query('one')]",
        "result = 'ok'",
        false,
        "['ok']",
    );
    assert_took_the_stopped_worker(&run);
}

#[test]
fn a_worker_killed_while_its_child_asks_its_model_is_replaced_at_the_first_block() {
    // As above, but the stopped worker is killed once the child's model call is out: the
    // child's first block finds it gone and starts another, and nothing is lost.
    let (_, run) = one_child_with_its_worker_stopped(
        "kept = 'root state'\nanswers = [kept, rlm_query('one')]",
        "result = 'ok'",
        true,
        "['root state', 'ok']",
    );
    assert_replaced(&run);
}

/// That the child took the worker the harness stopped, one confined ahead of need.
fn assert_took_the_stopped_worker(run: &Watched) {
    let worker = stopped_worker(run);
    assert!(
        run.stderr
            .contains(&format!("took the worker {worker}, confined ahead of need")),
        "the child took the stopped worker: {run:#?}"
    );
}

/// That the child replaced the worker the harness stopped and killed.
fn assert_replaced(run: &Watched) {
    let worker = stopped_worker(run);
    assert!(
        run.stderr.contains(&format!(
            "worker {worker} confined ahead of need had ended; the session starts another"
        )),
        "the child replaced the killed worker: {run:#?}"
    );
}

/// The root's code of the tests of a child with a context: one child handed a piece of
/// text (120 000 characters), as a user's children are.
const ONE_CHILD_WITH_A_PIECE: &str =
    "piece = 'lorem ipsum ' * 10_000\nanswers = [rlm_query('one', context=piece)]";

/// What such a child's block answers: the piece's words.
const THE_PIECES_WORDS: &str = "result = str(len(context.split()))";

/// What such a child's first prompt says of its context.
const THE_PIECE_DESCRIBED: &str = "a Python `str` of 120,000 characters (120.0 KB), from `<text>`";

/// The first request the sub-model got, its last user message's head.
fn first_child_prompt(mock: &Mock) -> String {
    mock.log()
        .entries()
        .iter()
        .find(|r| r.model == "sub-model")
        .map(|r| r.last_user.clone())
        .unwrap_or_default()
}

#[test]
fn a_child_with_a_context_asks_its_model_while_its_worker_is_still_starting() {
    // As above for a child handed a piece of text: its first prompt describes the piece
    // (rlm describes what it hands over, as the worker would), so its first model call does
    // not wait for the stopped worker either; its block does, and sees the whole piece.
    let (mock, run) = one_child_with_its_worker_stopped(
        ONE_CHILD_WITH_A_PIECE,
        THE_PIECES_WORDS,
        false,
        "['20000']",
    );
    let prompt = first_child_prompt(&mock);
    assert!(prompt.contains(THE_PIECE_DESCRIBED), "{prompt}");
    assert!(
        !run.stderr.contains("described its contexts differently"),
        "{run:#?}"
    );
}

#[test]
fn a_child_handed_records_asks_its_model_while_its_worker_from_the_pool_is_still_starting() {
    // A child handed a list of dicts (as `rlm_query(q, context=records[i:j])` does): its JSON
    // goes in a sealed memfd, no file, so the child takes the worker confined ahead of need,
    // and rlm describes the JSON as the worker will, so its first model call does not wait
    // for that worker (stopped); its block does, and sees every record.
    let (mock, run) = one_child_with_its_worker_stopped(
        "records = [{'id': i, 'name': f'n{i}'} for i in range(1000)]\n\
         answers = [rlm_query('one', context=records)]",
        "result = str(sum(r['id'] for r in context))",
        false,
        "['499500']",
    );
    assert_took_the_stopped_worker(&run);
    let prompt = first_child_prompt(&mock);
    assert!(
        prompt.contains("parsed JSON, a `dict` or `list` (1,000 top-level items"),
        "{prompt}"
    );
    assert!(
        !run.stderr.contains("described its contexts differently"),
        "{run:#?}"
    );
}

#[test]
fn a_child_handed_a_frame_takes_a_worker_confined_ahead_of_need_and_waits_for_its_description() {
    // A polars frame goes as Parquet in a sealed memfd: no file to read, so the child takes
    // a worker of the pool; only the worker can describe a frame, so the child waits for its
    // `Ready` before its first model call, whose prompt carries the worker's description.
    let mock = Mock::start(slow_script(
        &[
            &repl(
                "import polars as pl\nframe = pl.DataFrame({'x': list(range(100))})\n\
                 answers = [rlm_query('one', context=frame)]",
            ),
            "FINAL_VAR(answers)",
        ],
        200,
        "result = str(context['x'].sum())",
        0,
    ));
    let run = watched(&mock, &["--max-depth", "2", "--json"], None);
    assert_eq!(run.code, Some(0), "{run:#?}");
    assert_eq!(run.json()["answer"], "['4950']", "{run:#?}");
    assert!(
        run.stderr.contains(", confined ahead of need"),
        "the child took a worker of the pool: {run:#?}"
    );
    let prompt = first_child_prompt(&mock);
    assert!(
        prompt.contains("a `polars.DataFrame` of 100 rows and 1 columns"),
        "{prompt}"
    );
}

#[test]
fn a_worker_killed_while_a_child_with_a_context_asks_its_model_is_replaced_with_the_context() {
    // The stopped worker is killed once the child's model call is out: the first block
    // starts another, which loads the same piece (kept by rlm), and nothing is lost.
    let (mock, run) = one_child_with_its_worker_stopped(
        ONE_CHILD_WITH_A_PIECE,
        THE_PIECES_WORDS,
        true,
        "['20000']",
    );
    assert_replaced(&run);
    assert!(first_child_prompt(&mock).contains(THE_PIECE_DESCRIBED));
}

#[test]
fn a_child_stopped_before_its_worker_was_ready_leaves_no_process_behind() {
    // The child's model call hangs while its worker, stopped, has not read its start frame;
    // the root's block reaches its time limit, which stops the child. Its session ends the
    // worker it never used while `rlm` runs on (the root's model takes 2 s to answer, then
    // its next block sleeps).
    let mock = Mock::start(slow_script(
        &[
            &repl("answers = [rlm_query('one')]"),
            &repl("import time\ntime.sleep(1)\nanswers = 'after'"),
            "FINAL_VAR(answers)",
        ],
        2000,
        "result = 'ok'",
        60_000,
    ));
    let never = |_: &Mock| false;
    let run = with_first_ready_stopped(&mock, &["--cell-timeout", "2"], &never, false);
    assert_eq!(run.code, Some(0), "{run:#?}");
    assert_eq!(run.json()["answer"], "after", "{run:#?}");
    assert_eq!(mock.requests_to("sub-model"), 1, "{run:#?}");
    assert!(
        run.paused.ended_during_run,
        "the stopped child's worker outlived its session: {run:#?}"
    );
}

/// A child's probe: from its worker's own `/proc/self/smaps`, how many of its executable
/// anonymous mappings are a huge page, and whether the interpreter's code is on one.
const HUGE_CODE_PROBE: &str = r#"import ctypes, re
windows = []
head = None
for line in open('/proc/self/smaps'):
    if re.match(r'[0-9a-f]+-[0-9a-f]+ ', line):
        head = line.split()
    elif (line.startswith('AnonHugePages:') and head[1] == 'r-xp' and len(head) == 5
          and int(line.split()[1]) >= 2048):
        windows.append([int(x, 16) for x in head[0].split('-')])
python = ctypes.cast(ctypes.pythonapi.PyEval_EvalCode, ctypes.c_void_p).value
result = f'{len(windows)} windows, python on one: {any(a <= python < b for a, b in windows)}'"#;

/// A child in a worker of the pool (forked from the template, which took the 1.5 s of the
/// root model's first answer to start) reports [`HUGE_CODE_PROBE`]; `prepare` readies `rlm`'s
/// command. Its answer, and what the template said it did (its stderr, which `rlm` logs).
fn huge_code_in_a_forked_worker(prepare: impl FnOnce(&mut Command)) -> (String, String) {
    let mock = Mock::start(slow_script(
        &[&repl("answers = rlm_query('probe')"), "FINAL_VAR(answers)"],
        1500,
        HUGE_CODE_PROBE,
        0,
    ));
    let run = watched_with(&mock, &["--max-depth", "2", "--json"], None, prepare);
    assert_eq!(run.code, Some(0), "{run:#?}");
    assert_eq!(
        run.took_ready(),
        1,
        "the child's worker came from the pool: {run:#?}"
    );
    assert!(!run.templates().is_empty(), "no template ran: {run:#?}");
    let said = run
        .stderr
        .lines()
        .find_map(|l| l.split_once("the worker template's code on huge pages: "))
        .map(|(_, said)| said.to_owned())
        .unwrap_or_else(|| panic!("the template did not say: {run:#?}"));
    let answer = run.json()["answer"].as_str().unwrap_or_default().to_owned();
    (answer, said)
}

/// The template's forks run the interpreter's code and `rlm`'s from huge pages (the
/// `huge_code` module: on a VM that maps idle memory back page by page, a worker idle
/// through a model call then wakes in a fraction of the time); a process started with
/// transparent huge pages turned off for it (`PR_SET_THP_DISABLE`, which its children
/// inherit) keeps its code where it was and runs as well. Where the system has no
/// transparent huge pages it is skipped, saying why, except in CI.
#[test]
fn workers_forked_from_the_template_run_their_code_from_huge_pages_unless_turned_off() {
    if !transparent_huge_pages_here() {
        return;
    }
    let (answer, said) = huge_code_in_a_forked_worker(|_| {});
    let windows: usize = answer
        .split_once(" windows")
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or_else(|| panic!("{answer}"));
    // Two of `libpython`'s ~4 MiB of code and read-only data, and most of `rlm`'s ~23 MiB.
    assert!(windows >= 5, "{answer}");
    assert!(answer.ends_with("python on one: True"), "{answer}");
    // The template says how many it moved: all it found, the executable ones and those of
    // read-only data only; `rlm doctor`, the same executable, finds as many, give or take one
    // an object (`libpython`, `rlm`): how many whole windows an object holds depends on where
    // the loader put it.
    let moved: Vec<usize> = said
        .split_once(" windows of 2 MiB")
        .map(|(counts, _)| {
            counts
                .split(" of ")
                .filter_map(|n| n.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    assert!(
        moved.len() == 2 && moved[0] == moved[1] && moved[0] >= windows,
        "{said} ({answer})"
    );
    let doctor = rlm(&["doctor".to_owned(), "--json".to_owned()], None).json();
    let found = doctor["huge_code"]["moved"].as_u64().unwrap_or_default();
    assert!(
        found.abs_diff(moved[0] as u64) <= 2 && doctor["huge_code"]["windows"] == found,
        "{said}: {doctor:#}"
    );

    let answer = huge_code_in_a_forked_worker(without_transparent_huge_pages);
    let (answer, said) = answer;
    assert_eq!(answer, "0 windows, python on one: False");
    assert_eq!(
        said,
        "none: transparent huge pages are off for this process (`PR_SET_THP_DISABLE`, \
         inherited from whatever started it)"
    );
}

/// What `prctl(PR_GET_DUMPABLE)` answers in the worker that runs the code.
const DUMPABLE_PROBE: &str = "import ctypes\ndumpable = ctypes.CDLL(None).prctl(3, 0, 0, 0, 0)";

/// Every worker that runs model code is not dumpable (no core file; another process of the
/// user can neither attach to it nor read its memory, its contexts, through `/proc`): the
/// root's and a child's from the pool, whose template forked it dumpable (`place`) before it
/// confined itself, at both isolation levels.
#[test]
fn the_workers_of_the_root_and_of_a_child_from_the_pool_are_not_dumpable() {
    for isolation in ["process", "strict"] {
        let root = format!(
            "{DUMPABLE_PROBE}\nanswers = f\"root {{dumpable}} child \" + rlm_query('probe')"
        );
        let child = format!("{DUMPABLE_PROBE}\nresult = str(dumpable)");
        let mock = Mock::start(slow_script(
            &[&repl(&root), "FINAL_VAR(answers)"],
            1500,
            &child,
            0,
        ));
        let run = watched(
            &mock,
            &["--max-depth", "2", "--json", "--isolation", isolation],
            None,
        );
        assert_eq!(run.code, Some(0), "{isolation}: {run:#?}");
        assert_eq!(
            run.took_ready(),
            1,
            "{isolation}: the child's worker came from the pool: {run:#?}"
        );
        assert_eq!(
            run.json()["answer"],
            "root 0 child 0",
            "{isolation}: {run:#?}"
        );
    }
}
