//! Workers confined ahead of need: while a run with `rlm_query` children lives, a few workers
//! forked from the template wait already confined with the policy its children's sessions
//! get, their session's namespace built with the children's settings and a thread of `rlm`
//! reading their own stdout/stderr, so that a child's start is only its start frame and its
//! contexts.
//!
//! ```text
//!  run starts (a ReadyWorkers lease)      pool thread                    ready worker
//!  ─ refill ▸                             template fork, its output read,
//!                                         fresh scratch
//!                                         ─ Confine {policy, cwd, ────▸ confines itself,
//!                                             session settings}         builds the namespace
//!                                         ◂──────────── Confined ───────  waits, idle
//!  child's session: take ◂─ the ready one ───────────────────────────────
//!  ─ memfds, Start ─────────────────────────────────────────────────────▸ adds the contexts
//!  ◂─ Ready; refill ▸ (the next one confines itself while this child runs)
//!  run ends (lease dropped): the idle ones are told to exit (their link closes) and reaped
//! ```
//!
//! - **Which sessions.** A ready worker serves a session whose policy has the same *shape*
//!   ([`Shape`]): the same worker program, working directory, level and policy once the
//!   scratch directory is set aside (each ready worker has its own, fresh, and the session
//!   takes it over) and the largest-file limit (computed from the free space when the worker
//!   was confined). Its children's sessions share the run's settings, and take their workers
//!   by the shape the run's lease worked out when the run started (not worked out again on
//!   each child's path: the policy built, the environment and `/proc/meminfo` read); a
//!   session with file contexts (which its policy must let it read) starts its worker the
//!   usual way.
//! - **One use.** A ready worker leaves the pool when a session takes it, and ends with that
//!   session; a worker of a template that was replaced since, or of a shape no run wants any
//!   more, is ended instead of served.
//! - **Bounded.** Refills happen only while a run holds a lease for their shape: two when the
//!   run starts (while its root model thinks), one each time a session of the shape has
//!   started (on a worker taken from the pool or not), counted by the session and held
//!   until a run of the process waits for a model (`quiet.rs`; at once when a session waits
//!   for it), then handed to the pool's threads, which check the memory and fork and
//!   confine it there (where they could not start, the order is dropped there: sessions
//!   start their own workers). Ordered any earlier, or run at once, the next worker's fork and
//!   confinement would take the cores the session's start frame, its `Ready` and its
//!   request to the model wait for; handed to a thread at once, the order would wake it on
//!   the session's path. Ready and confining workers together stay within the
//!   children's width (`--batch-concurrency`) and [`MAX_READY`], and none is added when the
//!   machine has less than [`MIN_AVAILABLE`] memory available.
//! - **Two at once** ([`CONFINING_AT_ONCE`]). A confinement is a chain of steps each in one
//!   process (the fork, the namespaces, Landlock and seccomp, Python's start), ~7 ms of CPU
//!   on one core at a time. With one confined at a time, children that follow one another
//!   faster than that (a model that answers at once) each waited for their worker while the
//!   second core was idle; with two ordered at the run's start and two threads confining,
//!   two are under way whenever children wait for them. With model time to hide them in,
//!   each child still has one confined while it runs, as before.
//! - **Nothing left.** When the last lease of a shape goes (its run ended), its ready workers
//!   are ended and reaped, confining ones as soon as they are confined, and the sessions
//!   closed meanwhile are waited for (`closer.rs`).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use super::closer;
use super::lock::lock;
use super::policy::{level_of, session_policy};
use super::protocol::{
    Confine, FromWorker, NoSigPipe, ToWorker, read_frame, worker_settings, write_frame,
};
use super::quiet::{self, Urgent};
use super::scratch::Scratch;
use super::spawn::{SpawnJob, Spawned, WorkerProgram, job_threads, reap, worker_program};
use super::template;
use crate::repl::config::SessionConfig;

/// The most workers ready or being confined at once, whatever the width.
pub(crate) const MAX_READY: usize = 8;
/// Workers confined at once, and ordered when a run starts (see the [module docs](self)).
const CONFINING_AT_ONCE: usize = 2;
/// No refill while the machine has less memory available than this.
const MIN_AVAILABLE: u64 = 1 << 30;
/// How long a session waits for a worker being confined for it before it starts its own.
const TAKE_WAIT: Duration = Duration::from_secs(2);
/// How long a refill waits for the worker template to start.
const TEMPLATE_WAIT: Duration = Duration::from_secs(10);
/// How long a refill waits for its worker to be confined.
const CONFINE_WAIT: Duration = Duration::from_secs(30);
/// How long the end of a run waits for its workers still being confined.
const DRAIN_WAIT: Duration = Duration::from_secs(5);

static ENABLED: AtomicBool = AtomicBool::new(true);

/// Whether runs with `rlm_query` children keep workers confined ahead of need (the default)
/// or start each child's worker when its session starts (forked from the template, then
/// confined), as before the pool existed. For benchmarks that measure one way against the
/// other, and hosts that want no process kept ahead of need. Workers come from the worker
/// template, so [`use_worker_template`](super::use_worker_template)`(false)` turns this off
/// too.
pub fn use_worker_pool(enabled: bool) {
    ENABLED.store(enabled, Ordering::Relaxed);
}

/// What a session's worker is confined with, as far as a ready worker can match it (see the
/// [module docs](self)). Shared, not copied: a run's lease, its children's sessions and the
/// workers confined for them hold one, so that the pool's look-ups on a child's path compare
/// a pointer; only shapes made apart are compared field by field. (Compared field by field,
/// the policy's path lists and environment, not touched since the last child's start, took
/// 3–8 µs a comparison by median and 70–350 µs for up to a third of the children: bench guide.)
#[derive(Debug, Clone)]
pub(crate) struct Shape(Arc<ShapeOf>);

#[derive(Debug, Clone, PartialEq, Eq)]
struct ShapeOf {
    program: WorkerProgram,
    cwd: PathBuf,
    level: sandbox::Level,
    /// The policy, its scratch directory and largest-file limit set aside.
    policy: sandbox::Policy,
}

impl PartialEq for Shape {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0 == other.0
    }
}

impl Eq for Shape {}

impl Shape {
    /// The shape of the sessions of `config` without file contexts, in this process now.
    pub(crate) fn of(config: &SessionConfig, program: &WorkerProgram) -> Option<Self> {
        let cwd = std::env::current_dir().ok()?;
        let policy = session_policy(config, &std::env::temp_dir(), program, &[]);
        Some(Self::with(program, cwd, level_of(config), &policy))
    }

    /// The shape of `policy`.
    pub(crate) fn with(
        program: &WorkerProgram,
        cwd: PathBuf,
        level: sandbox::Level,
        policy: &sandbox::Policy,
    ) -> Self {
        let mut policy = policy.clone();
        if let Some(scratch) = policy.write_paths.first_mut() {
            let dir = scratch.to_string_lossy().into_owned();
            *scratch = PathBuf::new();
            for value in policy.env.values_mut() {
                if *value == dir {
                    value.clear();
                }
            }
        }
        policy.limits.file_size_bytes = None;
        Self(Arc::new(ShapeOf {
            program: program.clone(),
            cwd,
            level,
            policy,
        }))
    }
}

/// A worker confined ahead of need, idle.
#[derive(Debug)]
pub(crate) struct Ready {
    pub(crate) spawned: Spawned,
    /// Its scratch directory (the session takes it over).
    pub(crate) scratch: Scratch,
    /// Exactly what it is confined with.
    pub(crate) policy: sandbox::Policy,
    /// What is in force.
    pub(crate) confinement: sandbox::Report,
    /// The settings its session's namespace was built with (those of the run's children).
    pub(crate) settings: Arc<SessionConfig>,
    shape: Shape,
    /// The template it was forked from.
    template: i32,
}

/// A run's hold on the pool: while one lives for a shape, workers of that shape are kept
/// ready; dropping the last ends them (see the [module docs](self)).
#[derive(Debug)]
pub(crate) struct ReadyWorkers {
    shape: Shape,
}

impl ReadyWorkers {
    /// The shape of the workers kept ready: that of the run's children's sessions, worked
    /// out once, when the run started.
    pub(crate) fn shape(&self) -> &Shape {
        &self.shape
    }
}

#[derive(Debug)]
struct Lease {
    shape: Shape,
    count: usize,
    /// The settings the workers are confined for.
    config: Arc<SessionConfig>,
    /// Ready and confining workers allowed at once.
    target: usize,
}

#[derive(Debug, Default)]
struct Pool {
    /// The process whose children the workers are (a fork of it finds a copy of this).
    owner: u32,
    ready: Vec<Ready>,
    leases: Vec<Lease>,
    /// Workers being confined, by shape.
    confining: Vec<Shape>,
    /// Sessions waiting for one of them, by shape.
    waiting: Vec<Shape>,
}

impl Pool {
    /// This process's pool: in a fork of the process that filled it, the copy is forgotten
    /// (its workers are not this process's children, and their scratch directories not its
    /// own), without touching them.
    fn own(mut pool: MutexGuard<'_, Self>) -> MutexGuard<'_, Self> {
        let me = std::process::id();
        if pool.owner != me {
            for ready in std::mem::take(&mut pool.ready) {
                ready.scratch.keep();
            }
            pool.leases.clear();
            pool.confining.clear();
            pool.waiting.clear();
            pool.owner = me;
        }
        pool
    }

    fn lease(&self, shape: &Shape) -> Option<&Lease> {
        self.leases.iter().find(|l| l.shape == *shape)
    }

    fn count(list: &[Shape], shape: &Shape) -> usize {
        list.iter().filter(|s| *s == shape).count()
    }

    fn remove(list: &mut Vec<Shape>, shape: &Shape) {
        if let Some(i) = list.iter().position(|s| s == shape) {
            list.swap_remove(i);
        }
    }
}

fn pool() -> &'static (Mutex<Pool>, Condvar) {
    static POOL: OnceLock<(Mutex<Pool>, Condvar)> = OnceLock::new();
    POOL.get_or_init(Default::default)
}

/// Keeps workers of `config`'s sessions ready while the returned lease lives (`None` when
/// sessions of `config` run in this process, or no worker program or pool is on), and has
/// [`CONFINING_AT_ONCE`] confined now (within the run's width).
pub(crate) fn keep_ready(config: &SessionConfig) -> Option<ReadyWorkers> {
    if !config.isolation.in_worker() || !ENABLED.load(Ordering::Relaxed) || !template::enabled() {
        return None;
    }
    let program = worker_program()?;
    let shape = Shape::of(config, &program)?;
    {
        let mut pool = Pool::own(lock(&pool().0));
        match pool.leases.iter_mut().find(|l| l.shape == shape) {
            Some(lease) => lease.count += 1,
            None => pool.leases.push(Lease {
                shape: shape.clone(),
                count: 1,
                config: Arc::new(config.clone()),
                target: config
                    .batch_concurrency
                    .unwrap_or(MAX_READY)
                    .clamp(1, MAX_READY),
            }),
        }
    }
    for _ in 0..CONFINING_AT_ONCE {
        order_refill(&shape);
    }
    Some(ReadyWorkers { shape })
}

/// Whether a run keeps workers ready in this process (then sessions closed are ended off
/// the closing thread, and the run's end waits for them).
pub(crate) fn in_use() -> bool {
    !Pool::own(lock(&pool().0)).leases.is_empty()
}

impl Drop for ReadyWorkers {
    fn drop(&mut self) {
        let (mutex, changed) = pool();
        let mut pool = Pool::own(lock(mutex));
        let Some(i) = pool.leases.iter().position(|l| l.shape == self.shape) else {
            return;
        };
        pool.leases[i].count -= 1;
        if pool.leases[i].count > 0 {
            return;
        }
        pool.leases.swap_remove(i);
        let (gone, kept): (Vec<Ready>, Vec<Ready>) = std::mem::take(&mut pool.ready)
            .into_iter()
            .partition(|r| r.shape == self.shape);
        pool.ready = kept;
        // Those being confined end themselves once confined (no lease): wait for them, and
        // have those still held for a model call (`quiet.rs`) go now (not under the pool's
        // lock: what is held takes it if its thread is gone).
        drop(pool);
        let _urgent = Urgent::begin();
        let mut pool = lock(mutex);
        let deadline = Instant::now() + DRAIN_WAIT;
        while Pool::count(&pool.confining, &self.shape) > 0 && Instant::now() < deadline {
            let left = deadline.saturating_duration_since(Instant::now());
            pool = changed
                .wait_timeout(pool, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        let last = pool.leases.is_empty();
        drop(pool);
        end_all(gone);
        if last {
            closer::flush();
        }
    }
}

/// Ends idle workers: their links close first (each exits when it reads the end), then each
/// is reaped.
fn end_all(workers: Vec<Ready>) {
    let pids: Vec<(i32, Scratch)> = workers
        .into_iter()
        .map(|r| {
            let Spawned { pid, link, .. } = r.spawned;
            drop(link);
            (pid, r.scratch)
        })
        .collect();
    for (pid, scratch) in pids {
        reap(pid);
        drop(scratch);
    }
}

/// A ready worker for a session of `shape`: one waiting, or one being confined (waited for
/// up to [`TAKE_WAIT`]); `None` when there is none (the session starts its own worker).
pub(crate) fn take(shape: &Shape) -> Option<Ready> {
    let (mutex, changed) = pool();
    let mut pool = Pool::own(lock(mutex));
    pool.lease(shape)?;
    let deadline = Instant::now() + TAKE_WAIT;
    let mut stale = Vec::new();
    let mut urgent = None;
    let found = loop {
        let current = template::current();
        if let Some(i) = pool.ready.iter().position(|r| r.shape == *shape) {
            let ready = pool.ready.swap_remove(i);
            if Some(ready.template) == current {
                break Some(ready);
            }
            // Its template was replaced: not what a worker is forked from now.
            stale.push(ready);
            continue;
        }
        let confining = Pool::count(&pool.confining, shape);
        let waiting = Pool::count(&pool.waiting, shape);
        let left = deadline.saturating_duration_since(Instant::now());
        if confining <= waiting || left.is_zero() {
            break None;
        }
        if urgent.is_none() {
            // The worker being confined for us may still be held for a model call: not any
            // more (not under the pool's lock, see `ReadyWorkers`' drop; then looked again).
            drop(pool);
            urgent = Some(Urgent::begin());
            pool = lock(mutex);
            continue;
        }
        pool.waiting.push(shape.clone());
        pool = changed
            .wait_timeout(pool, left)
            .unwrap_or_else(PoisonError::into_inner)
            .0;
        Pool::remove(&mut pool.waiting, shape);
    };
    drop(pool);
    drop(urgent);
    end_all(stale);
    found
}

/// Once a session of `shape` started (on a worker taken from the pool or not), has one more
/// worker of `shape` confined on the pool's thread if the run that holds `shape`'s lease wants
/// one more (fewer than its target ready or being confined, within [`MAX_READY`]): the
/// session pays the count and the job, held until a run waits for a model (`quiet.rs`: no
/// thread is woken on the session's path), the pool's thread the memory check and the fork.
/// Nothing when no run keeps workers of `shape` ready.
pub(crate) fn order_refill(shape: &Shape) {
    let mut pool = Pool::own(lock(&pool().0));
    let Some(lease) = pool.lease(shape) else {
        return;
    };
    let target = lease.target;
    let have = pool.ready.iter().filter(|r| r.shape == *shape).count()
        + Pool::count(&pool.confining, shape);
    let total = pool.ready.len() + pool.confining.len();
    if have >= target || total >= MAX_READY {
        return;
    }
    let config = Arc::clone(&lease.config);
    // Counted now, so that a session starting meanwhile waits for it rather than start its own.
    pool.confining.push(shape.clone());
    drop(pool);
    let (queued, ordered) = (shape.clone(), shape.clone());
    let job: SpawnJob = Box::new(move || {
        let program = queued.0.program.clone();
        confine_one(&config, &program, queued);
    });
    quiet::when_slack(Box::new(move || {
        if lock(refiller()).send(job).is_err() {
            not_confined(&ordered);
        }
    }));
}

/// A refill the pool's threads could not take (none could start): uncounted, so that a
/// session waiting for it starts its own worker at once, as without a pool. Not confined on
/// the thread that released it, which may be a model call's timer on the shared runtime
/// (`quiet.rs`), held there for up to [`TEMPLATE_WAIT`] and [`CONFINE_WAIT`].
fn not_confined(shape: &Shape) {
    static SAID: AtomicBool = AtomicBool::new(false);
    if !SAID.swap(true, Ordering::Relaxed) {
        tracing::error!(
            "the worker pool's threads could not start; the children's sessions start their own workers"
        );
    }
    let (mutex, changed) = pool();
    Pool::remove(&mut lock(mutex).confining, shape);
    changed.notify_all();
}

/// On the pool thread: forks a worker from the template and has it confined for `shape`;
/// kept if a run still wants it, else ended before the end of the run hears it is done.
fn confine_one(config: &Arc<SessionConfig>, program: &WorkerProgram, shape: Shape) {
    let ready = if memory_allows() {
        make_ready(config, program, &shape)
    } else {
        Err(format!(
            "less than {} MiB of memory available",
            MIN_AVAILABLE >> 20
        ))
    };
    let (mutex, changed) = pool();
    let mut pool = lock(mutex);
    match ready {
        Ok(ready) if pool.lease(&shape).is_some() => {
            tracing::debug!(
                "the worker {} was confined ahead of need and waits for a session",
                ready.spawned.pid
            );
            pool.ready.push(ready);
        }
        Ok(unwanted) => {
            drop(pool);
            end_all(vec![unwanted]);
            pool = lock(mutex);
        }
        Err(e) => tracing::debug!("could not confine a worker ahead of need: {e}"),
    }
    Pool::remove(&mut pool.confining, &shape);
    changed.notify_all();
}

fn make_ready(
    config: &Arc<SessionConfig>,
    program: &WorkerProgram,
    shape: &Shape,
) -> Result<Ready, String> {
    let forked = template::fork_worker(program).or_else(|| {
        // The run's first worker: its template may still be starting.
        template::prepare_next(program);
        let deadline = Instant::now() + TEMPLATE_WAIT;
        while template::current().is_none()
            && Instant::now() < deadline
            && lock(&pool().0).lease(shape).is_some()
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        template::fork_worker(program)
    });
    let Some((mut spawned, template)) = forked else {
        return Err("no worker template is running".to_owned());
    };
    // Read from now on, here: the session that takes it does not start that thread.
    spawned.read_output();
    let scratch = Scratch::create().map_err(|e| format!("no scratch directory: {e}"));
    let scratch = match scratch {
        Ok(scratch) => scratch,
        Err(e) => {
            drop(spawned.link);
            reap(spawned.pid);
            return Err(e);
        }
    };
    let policy = session_policy(config, scratch.path(), program, &[]);
    let confine = Confine {
        cwd: shape.0.cwd.clone(),
        policy: policy.clone(),
        level: shape.0.level,
        session: worker_settings(config),
    };
    let confined = confine_spawned(&spawned, &confine);
    match confined {
        Ok(confinement) => Ok(Ready {
            spawned,
            scratch,
            policy,
            confinement,
            settings: Arc::clone(config),
            shape: shape.clone(),
            template,
        }),
        Err(e) => {
            drop(spawned.link);
            reap(spawned.pid);
            Err(e)
        }
    }
}

/// Sends `confine` and waits (up to [`CONFINE_WAIT`]) for the worker to say it is confined.
fn confine_spawned(spawned: &Spawned, confine: &Confine) -> Result<sandbox::Report, String> {
    let link = &spawned.link;
    write_frame(
        &mut NoSigPipe(link),
        &ToWorker::Confine(Box::new(confine.clone())),
    )
    .map_err(|e| format!("the worker could not be sent its policy: {e}"))?;
    link.set_read_timeout(Some(CONFINE_WAIT))
        .map_err(|e| e.to_string())?;
    let answer = read_frame::<FromWorker>(&mut &*link, &mut Vec::new());
    link.set_read_timeout(None).map_err(|e| e.to_string())?;
    match answer {
        Ok(FromWorker::Confined(report)) => Ok(report),
        Ok(FromWorker::Failed(error)) => Err(error.to_string()),
        Ok(other) => Err(format!("the worker answered its policy with {other:?}")),
        Err(e) => Err(format!("the worker {e} while confining itself")),
    }
}

/// Whether the machine has [`MIN_AVAILABLE`] memory available (or does not say).
fn memory_allows() -> bool {
    let Ok(meminfo) = std::fs::read_to_string("/proc/meminfo") else {
        return true;
    };
    meminfo
        .lines()
        .find(|l| l.starts_with("MemAvailable:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .is_none_or(|kib| kib * 1024 >= MIN_AVAILABLE)
}

/// The threads that confine the pool's workers, [`CONFINING_AT_ONCE`] at a time.
static REFILLER: OnceLock<Mutex<Sender<SpawnJob>>> = OnceLock::new();

fn refiller() -> &'static Mutex<Sender<SpawnJob>> {
    REFILLER.get_or_init(|| job_threads("rlm-worker-pool", CONFINING_AT_ONCE))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn program() -> WorkerProgram {
        WorkerProgram::this_executable()
    }

    fn shape(config: &SessionConfig, scratch: &str, contexts: &[PathBuf]) -> Shape {
        let policy = session_policy(config, std::path::Path::new(scratch), &program(), contexts);
        Shape::with(&program(), PathBuf::from("/w"), level_of(config), &policy)
    }

    #[test]
    fn sessions_that_differ_only_by_their_scratch_directory_have_one_shape() {
        let config = SessionConfig::default();
        let a = shape(&config, "/tmp/rlm-scratch-a", &[]);
        let mut b = shape(&config, "/tmp/rlm-scratch-b", &[]);
        assert_eq!(a, b);
        // The scratch directory is set aside everywhere it appears.
        assert!(
            !format!("{a:?}").contains("rlm-scratch-a"),
            "{a:?} still names its scratch directory"
        );
        // So is the largest-file limit (computed from the free space at the time).
        Arc::make_mut(&mut b.0).policy.limits.file_size_bytes = Some(1);
        let mut c = shape(&config, "/tmp/rlm-scratch-c", &[]);
        Arc::make_mut(&mut c.0).policy.limits.file_size_bytes = Some(1);
        assert_eq!(b, c);
    }

    /// With the pool's threads unable to start (a channel nobody reads stands for them), a
    /// refill is not confined on the thread that releases it (here a session's that waits
    /// for it; in a run, possibly a model call's timer on the shared runtime): it is
    /// uncounted there, and the waiting session starts its own worker at once.
    #[test]
    fn a_refill_the_pools_threads_cannot_take_is_uncounted_where_it_is_released() {
        let (nobody, _) = std::sync::mpsc::channel::<SpawnJob>();
        assert!(
            REFILLER.set(Mutex::new(nobody)).is_ok(),
            "the pool's threads started already"
        );
        let program = WorkerProgram {
            program: PathBuf::from("/nonexistent/rlm-test-worker"),
            args: Vec::new(),
            env: Vec::new(),
        };
        let config = SessionConfig::default();
        let policy = session_policy(&config, std::path::Path::new("/tmp/s"), &program, &[]);
        let shape = Shape::with(&program, PathBuf::from("/w"), level_of(&config), &policy);
        Pool::own(lock(&pool().0)).leases.push(Lease {
            shape: shape.clone(),
            count: 1,
            config: Arc::new(config),
            target: 2,
        });
        // Held (no model call is in flight), and counted: a session waits for it. Counted as
        // the run's shape itself, not a copy (what a child's look-ups compare is a pointer).
        order_refill(&shape);
        assert_eq!(Pool::count(&lock(&pool().0).confining, &shape), 1);
        assert!(
            lock(&pool().0)
                .confining
                .iter()
                .all(|counted| Arc::ptr_eq(&counted.0, &shape.0)),
            "the refill was counted under a copy of the run's shape"
        );
        let started = Instant::now();
        let taken = take(&shape);
        let took = started.elapsed();
        assert!(taken.is_none());
        assert!(
            took < Duration::from_secs(1),
            "the session's thread was held {took:?}: the refill was confined there"
        );
        assert_eq!(Pool::count(&lock(&pool().0).confining, &shape), 0);
    }

    #[test]
    fn a_file_to_read_another_level_or_limit_is_another_shape() {
        let config = SessionConfig::default();
        let base = shape(&config, "/tmp/s", &[]);
        assert_ne!(
            base,
            shape(&config, "/tmp/s", &[PathBuf::from("/data/ctx.json")])
        );
        let strict = SessionConfig {
            isolation: crate::repl::config::Isolation::Strict,
            ..SessionConfig::default()
        };
        assert_ne!(base, shape(&strict, "/tmp/s", &[]));
        let smaller = SessionConfig {
            memory_limit: Some(1 << 30),
            ..SessionConfig::default()
        };
        assert_ne!(base, shape(&smaller, "/tmp/s", &[]));
        let reads = SessionConfig {
            read_paths: vec![PathBuf::from("/data")],
            ..SessionConfig::default()
        };
        assert_ne!(base, shape(&reads, "/tmp/s", &[]));
    }
}
