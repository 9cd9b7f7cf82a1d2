"""Python-side support of the rlm kernel REPL.

Loaded once per interpreter as the module `_rlm_kernel` (filename `<rlm-kernel>`); frames
from this file are filtered out of user tracebacks. It holds what is easier to say in Python
than through the C API: per-thread routing of `sys.stdout`/`sys.stderr` to the capture of
the session that owns the thread, the interruptible `time.sleep`, cell compilation with
IPython-style display of a final bare expression, traceback formatting, the `answer` dict,
`FINAL_VAR`, `SHOW_VARS` and variable summaries, the session module that makes the
namespace picklable, and the bookkeeping of the processes a session's code starts. Cell
execution itself, the watchdog and the sub-model natives live in Rust.
"""

import ast
import builtins
from collections.abc import Mapping
import gc
import io
import itertools
import json
import linecache
import multiprocessing.spawn
import multiprocessing.util
import os
import pickle
import reprlib
import signal
import sys
import tempfile
import threading
import time
import traceback
import types
import weakref

SUPPORT_FILE = "<rlm-kernel>"


class CellInterrupt(BaseException):
    """Raised into a running cell to stop it; derives from BaseException so that
    `except Exception:` in user code does not swallow it.

    Creating one in the session thread of a block that is being stopped also installs a
    trace function that raises again at the next line of the user's code, so that even a
    bare `except:` in a loop cannot keep the block alive. Only the session thread is traced:
    on CPython 3.11 a traced thread livelocks while an asynchronous exception is pending for
    another thread that is blocked in C (e.g. a cell thread in `Thread.join()`)."""

    def __init__(self, *args):
        super().__init__(*args)
        _arm_kill()


class CellTimeout(CellInterrupt):
    """The cell exceeded its wall-clock time limit."""


class CellCancelled(CellInterrupt):
    """The session's run was cancelled while the cell was running."""


class LlmQueryError(Exception):
    """A sub-model call made by `llm_query`/`llm_query_batched` failed.

    `kind` is a short stable tag (e.g. `timeout`, `http_429`, `budget_max_calls`); for a batch,
    `results` holds every slot (answers, or "Error: ..." strings) in input order.
    """

    def __init__(self, message, kind="error", results=None):
        super().__init__(message)
        self.kind = kind
        self.results = results


# --- sessions and thread routing ------------------------------------------------------


class Session:
    """The Python-side state of one REPL session."""

    __slots__ = (
        "sid",
        "stdout",
        "stderr",
        "stop",
        "next_stop",
        "finals",
        "globals",
        "module",
        "name",
        "definitions",
        "processes",
        "pool_processes",
        "block_children",
        "block_since",
        "block_pool",
        "children_lock",
        "killing",
        "thread_ident",
        "collect_on_close",
        "__weakref__",
    )

    def __init__(self, sid):
        self.sid = sid
        self.killing = None  # the interrupt class while a block is being stopped
        self.thread_ident = None  # the session thread
        self.stdout = None
        self.stderr = None
        self.stop = threading.Event()
        # The next block's stop event, made between blocks (`prepare_block`).
        self.next_stop = None
        # Final answers recorded during the current block, one per convention, in the
        # order first recorded: {"answer": text, "final_var": text}.
        self.finals = {}
        # The namespace is the dict of a real module registered in `sys.modules` under its
        # own name (never `__main__`: an embedding host keeps its own), so what a block
        # defines pickles by reference, as from a script's `__main__`.
        self.name = f"__rlm_session_{sid}__"
        self.module = types.ModuleType(self.name)
        self.module.__builtins__ = builtins
        self.globals = self.module.__dict__
        sys.modules[self.name] = self.module
        # (block filename, first line, source) of every top-level import, function, class
        # and named lambda, in order: what a spawn worker re-creates (see `_REPLAY`).
        self.definitions = []
        # Processes the session's blocks started: {pid: start time} of direct children,
        # and multiprocessing's own Process objects (also grandchildren, e.g. forkserver).
        self.processes = {}
        self.pool_processes = []
        # During a block: multiprocessing's processes when it began, and this process's
        # children just before the block's first call that may start one (None until then:
        # a block that starts no process costs no scan of `/proc`; see `_audit`).
        self.block_pool = None
        self.block_children = None
        # When they were noted (`_boot_ticks`): an orphan that started before is not the
        # block's, though it may have become an orphan during it.
        self.block_since = 0
        self.children_lock = threading.Lock()
        # Whether a block ran while multiprocessing's locks were loaded: only then may the
        # namespace hold a semaphore in a reference cycle that `close` must collect.
        self.collect_on_close = False
        with _LIFECYCLE:
            if not _LIFECYCLE.wait_for(lambda: not _ENDING, timeout=_END_WAIT_S):
                print(
                    f"rlm: the last session's end of multiprocessing (its helpers' stops, "
                    f"its pools' and queues' ends, its finalizers) is still running after "
                    f"{_END_WAIT_S:g} s; this session starts anyway, and a multiprocessing "
                    f"pool it starts before that end is over may be terminated by it",
                    file=sys.__stderr__,
                )
            _SESSIONS.add(self)

    def begin_block(self, stdout, stderr, globals_, reserved, slot):
        """A block starts, its output going to `stdout` and `stderr`. Returns what its end
        compares against: the user's names (`user_names`) and the answer's state
        (`answer_state` of `slot`)."""
        _ensure_routed(sys)
        self.stdout = stdout
        self.stderr = stderr
        stop, self.next_stop = self.next_stop, None
        self.stop = stop if stop is not None else threading.Event()
        self.finals = {}
        with self.children_lock:
            self.block_children = None
            self.block_pool = set(_mp_children())
        return user_names(globals_, reserved), answer_state(slot)

    def prepare_block(self):
        """Between blocks, off the next one's path: its stop event, fresh as ever."""
        if self.next_stop is None:
            self.next_stop = threading.Event()

    def may_start_process(self):
        """A thread of the session is about to call something that may start a process: the
        first time in a block, note this process's children as they are before it."""
        with self.children_lock:
            if self.block_pool is not None and self.block_children is None:
                self.block_since = _boot_ticks()
                self.block_children = _direct_children()

    def finish_block(self, own, globals_, reserved, before, interrupted):
        """A block's end in one call: `settle_answer`, then the final answers it recorded, the
        output routing ended (also when settling fails), `settle_processes` and the
        variables listing. Returns (slot, note, finals, held, variables): `settle_answer`'s
        two, the recorded [(convention, text)], whether the session holds processes, and
        `list_variables`."""
        try:
            slot, note = settle_answer(self, own, globals_, before)
            finals = list(self.finals.items())
        finally:
            self.end_block()
        held = self.settle_processes(interrupted)
        return slot, note, finals, held, list_variables(globals_, reserved)

    def end_block(self):
        self.stdout = None
        self.stderr = None
        if not self.collect_on_close:
            self.collect_on_close = "multiprocessing.synchronize" in sys.modules

    def settle_processes(self, interrupted):
        """After a block: the processes it started and that still run belong to the session;
        those of an interrupted block are terminated with it. Returns whether the session
        holds any (what `terminate_processes` would end: the list changes only here and
        there)."""
        with self.children_lock:
            children, pool = self.block_children, self.block_pool
            self.block_children = self.block_pool = None
        if pool is None:
            return bool(self.processes or self.pool_processes)
        mine = os.getpid()
        started = (
            {}
            if children is None
            else {
                pid: stat[1]
                for pid in _direct_children() - children
                if (stat := _stat(pid)) is not None
                and (stat[0] == mine or stat[1] >= self.block_since)
            }
        )
        started_pool = [p for p in _mp_children() if p not in pool]
        if interrupted:
            _terminate(started, started_pool)
            started, started_pool = {}, []
        if not (started or started_pool or self.processes or self.pool_processes):
            return False
        # Forget what has ended, so a long session's lists stay short.
        self.processes = {
            pid: since
            for pid, since in (self.processes | started).items()
            if _running(pid)
        }
        self.pool_processes = [p for p in self.pool_processes + started_pool if _alive(p)]
        return bool(self.processes or self.pool_processes)

    def terminate_processes(self):
        """Terminate every process the session's blocks started that still runs."""
        processes, pool = self.processes, self.pool_processes
        self.processes, self.pool_processes = {}, []
        _terminate(processes, pool)

    def close(self):
        self.terminate_processes()
        self.globals.clear()
        # Now, not at an interpreter exit that an embedding may never run: multiprocessing's
        # semaphores of the session's pools are released (else the resource tracker warns).
        # A full collection walks every object of the interpreter (~3 ms in a bare one, far
        # more with large frames loaded): only a session that may hold such a semaphore pays
        # it, not each of the many short sessions of `rlm_query` children.
        if self.collect_on_close:
            gc.collect()
        if sys.modules.get(self.name) is self.module:
            del sys.modules[self.name]
        global _ENDING
        with _LIFECYCLE:
            _SESSIONS.discard(self)
            _remove_session_module(self.name)
            last = _OWNS_INTERPRETER and not _SESSIONS and not _ENDING
            if last:
                _ENDING = True
        if last:
            try:
                _end_multiprocessing()
            finally:
                with _LIFECYCLE:
                    _ENDING = False
                    _LIFECYCLE.notify_all()


_SESSIONS = weakref.WeakSet()
# Whether the kernel started this interpreter (`install`): then nothing runs Python's exit.
_OWNS_INTERPRETER = False
# Sessions start and close on many threads at once (a flow's parallel steps, `rlm_query`
# children): they join and leave `_SESSIONS` under this lock, their modules for spawn workers
# are written and removed under it (`_write_session_modules`), and while `_ENDING` (the last
# session's close ends multiprocessing, see `_end_multiprocessing`) a session waits to start.
_LIFECYCLE = threading.Condition()
_ENDING = False
# How long the end waits for the forkserver to exit, and a session's start for that end, in
# seconds. The forkserver exits once every copy of its pipe is closed, which a process the
# sessions do not track can put off for ever: past this the end kills it (`_stop_helper`)
# and a session's start goes ahead, rather than the forkserver and its folder being left and
# every later session of the interpreter waiting for an end that never comes.
_END_WAIT_S = 30.0


def _end_multiprocessing():
    """The last session of an interpreter the kernel started has closed: end what
    multiprocessing ends at an interpreter's exit (from `atexit`), which `rlm` never runs.
    Its forkserver is stopped (it ends when its pipe closes; the session's own processes,
    which could hold a copy of the pipe, were ended before), then its finalizers run, as at an
    exit: those of priority 0 and up first, which terminate the pools still registered and
    tell the queues' feeder threads to finish, then the rest, which join those threads and
    remove its temporary folder (`pymp-*`, holding the forkserver's socket) from the user's
    `TMPDIR`; last its resource tracker is stopped, which at an exit ends after the process
    (when its pipe closes), removing what the process leaked. A session created meanwhile
    would lose its pools, helpers and folder to this: it waits until the end is over
    (`_ENDING`; at most `_END_WAIT_S`, then it starts anyway and says so), then starts the
    helpers and the folder again when it needs them. `_LIFECYCLE` is not held meanwhile: the
    stop waits for a process, under the forkserver's lock, which a forkserver's start holds
    while it takes `_LIFECYCLE` (`_write_session_modules`); the session's start waits with it
    released.

    Each of those waits may be held up for ever by what the user's code left behind, so each
    is bounded: the helpers' exits and the feeder threads' ends by `_END_WAIT_S` from the close
    in all (`_stop_helper`, `_drop_unsent_queues`), a pool's workers by `_TERMINATE_GRACE`
    (`_terminate_pool`); what held them up is killed or dropped, and stderr says so and what
    to do. The helpers' fields and the finalizers are multiprocessing's private ones: should a
    Python change them, the session still closes, and says what may be left."""
    deadline = time.monotonic() + _END_WAIT_S
    killed = []
    try:
        forkserver = sys.modules.get("multiprocessing.forkserver")
        if forkserver is not None:
            killed += _stop_forkserver(forkserver._forkserver, deadline)
        util = sys.modules.get("multiprocessing.util")
        if util is not None:
            for finalizer, workers in _pool_finalizers():
                _terminate_pool(finalizer, workers)
            util._run_finalizers(0)
            _drop_unsent_queues(util, deadline)
            util._run_finalizers()
        # Last: the pools' and queues' ends above unregister their semaphores with it.
        tracker = sys.modules.get("multiprocessing.resource_tracker")
        if tracker is not None:
            with tracker._resource_tracker._lock:
                killed += _stop_helper(
                    tracker._resource_tracker, "_pid", "_fd", deadline, "resource tracker"
                )
    except Exception as error:
        print(
            f"rlm: multiprocessing's forkserver, resource tracker or folder in TMPDIR (pymp-*) "
            f"may be left: {error!r}",
            file=sys.__stderr__,
        )
    _say_killed(killed)


def _stop_forkserver(server, deadline):
    """`_stop_helper` for the forkserver, which also removes its socket."""
    with server._lock:
        killed = _stop_helper(
            server, "_forkserver_pid", "_forkserver_alive_fd", deadline, "forkserver"
        )
        address, server._forkserver_address = server._forkserver_address, None
        if address is not None and not multiprocessing.util.is_abstract_socket_namespace(address):
            try:
                os.unlink(address)
            except FileNotFoundError:
                pass
    return killed


def _stop_helper(helper, pid_attr, fd_attr, deadline, name):
    """Stop one of multiprocessing's helpers, the forkserver or the resource tracker, as its own
    `_stop` does (close this process's end of the pipe it reads, reap it), except that the
    wait is bounded; its caller holds the helper's lock. Every process forked from this one
    since the helper started holds a copy of that end, and the helper exits only when all are
    closed: a process that no session tracks (a double fork's daemon, an orphan of a block's
    child, a process a thread started between blocks) can keep it running for ever, and
    multiprocessing's `waitpid` with it; left running, it would also hold `rlm`'s stdout and
    stderr open after `rlm` exits. At `deadline` the helper is killed (SIGKILL: the tracker
    ignores SIGTERM, and neither has anything to save that SIGTERM would let it) and reaped.
    Returns [(name, pid, pids that held its pipe)] if it was killed, for `_say_killed`; the
    holders are the user's processes, and run on."""
    pid = getattr(helper, pid_attr)
    if pid is None:
        return []
    alive = getattr(helper, fd_attr)
    pipe = os.fstat(alive).st_ino
    os.close(alive)
    setattr(helper, fd_attr, None)
    killed = []
    if not _reaped_within(pid, deadline - time.monotonic()):
        killed.append((name, pid, _pipe_holders(pipe) - {pid}))
        _signal_all([pid], signal.SIGKILL)
        _reaped_within(pid, _TERMINATE_GRACE)
    setattr(helper, pid_attr, None)
    return killed


def _say_killed(killed):
    """One line on stderr for the helpers `_stop_helper` killed, and what held them."""
    if not killed:
        return
    helpers = " and ".join(f"{name} (pid {pid})" for name, pid, _ in killed)
    holders = sorted(set().union(*(held for _, _, held in killed)))
    one = len(killed) == 1
    pids = ", ".join(map(str, holders))
    why = (
        f"{'its pipe is' if one else 'their pipes are'} still held by pid {pids} (forked by a "
        f"block, maybe as a daemon, and tracked by no session: `kill {pids.replace(', ', ' ')}` "
        f"ends it)"
        if holders
        else f"{'its' if one else 'their'} own exit is slow"
    )
    print(
        f"rlm: multiprocessing's {helpers} did not exit within {_END_WAIT_S:g} s of the last "
        f"session's close: {why}; {'it was' if one else 'they were'} killed. A block that "
        f"starts processes should end them before it finishes",
        file=sys.__stderr__,
    )


def _reaped_within(pid, seconds):
    """Wait at most `seconds` for child `pid` to end, reaping it: whether it has (or is not
    this process's child: reaped elsewhere). The pause between looks grows from 1 ms to 5 ms:
    a helper that exits at once costs the close no more than 1 ms past its exit, a slower one
    no more than 5 ms (a growth to 50 ms had the end see a resource tracker's ~55 ms exit, on
    a busy machine, at 63 or 113 ms), and one that never exits costs a `waitpid` every 5 ms
    until the deadline."""
    deadline = time.monotonic() + seconds
    pause = 0.001
    while True:
        try:
            if os.waitpid(pid, os.WNOHANG)[0]:
                return True
        except ChildProcessError:
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        _original_sleep(min(pause, left))
        pause = min(2 * pause, 0.005)


def _pipe_holders(inode):
    """Pids of the processes (those `/proc` lets this one read) with the pipe `inode` open."""
    link = f"pipe:[{inode}]"
    holders = set()
    try:
        entries = [entry for entry in os.listdir("/proc") if entry.isdigit()]
    except OSError:
        return holders
    for entry in entries:
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{entry}/fd/{fd}") == link:
                    holders.add(int(entry))
                    break
            except OSError:
                continue
    return holders


def _drop_unsent_queues(util, deadline):
    """Wait until `deadline` for the feeder threads of multiprocessing's queues to send what
    was put, then cancel the joins of those still sending, which the last finalizers would
    wait on for ever: a queue whose reader no process reads (the queue was dropped with the
    namespace; the process meant to read it ended) keeps its feeder blocked on a full pipe.
    Python's own exit hangs there; the close says what was dropped instead."""
    dropped = 0
    for finalizer in list(util._finalizer_registry.values()):
        callback = getattr(finalizer, "_callback", None)
        if getattr(callback, "__qualname__", "") != "Queue._finalize_join":
            continue
        thread = finalizer._args[0]()
        if thread is None:
            continue
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            finalizer.cancel()
            dropped += 1
    if dropped:
        print(
            f"rlm: {dropped} multiprocessing queue(s) still held data that no process read "
            f"{_END_WAIT_S:g} s after the last session's close: that data is dropped. A block "
            f"that puts into a queue should see it read, or call its `cancel_join_thread()`",
            file=sys.__stderr__,
        )


def _current_session():
    return getattr(threading.current_thread(), "_rlm_session", None)


def bind_thread(session):
    """Mark the calling (session) thread as owned by `session`."""
    threading.current_thread()._rlm_session = session
    session.thread_ident = threading.get_ident()


def unbind_thread(block_prefix):
    """Forget the calling thread (its ident may be reused by an unrelated thread) and the
    session's block sources in linecache."""
    ident = threading.get_ident()
    with threading._active_limbo_lock:
        threading._active.pop(ident, None)
    for name in [n for n in linecache.cache if n.startswith(block_prefix)]:
        linecache.cache.pop(name, None)


def _kill_tracer(frame, event, arg):
    session = _current_session()
    killing = session.killing if session is not None else None
    if killing is None:
        sys.settrace(None)
        return None
    # Raise only in the user's own code (blocks are compiled as `<repl-...>`): a raise from a
    # trace function switches tracing off, so it must land where the user's handler is.
    if event == "line" and frame.f_code.co_filename.startswith("<repl-"):
        raise killing("the block is being stopped")
    return _kill_tracer


def _arm_kill():
    session = _current_session()
    if session is None or session.killing is None or session.thread_ident != threading.get_ident():
        return
    sys.settrace(_kill_tracer)
    frame = sys._getframe(1)
    while frame is not None:
        frame.f_trace = _kill_tracer
        frame = frame.f_back


_original_thread_start = threading.Thread.start


def _thread_start(self):
    # Threads started by a cell belong to the cell's session: their output is captured
    # and their sleeps are interrupted with the cell.
    if getattr(self, "_rlm_session", None) is None:
        session = _current_session()
        if session is not None:
            self._rlm_session = session
    return _original_thread_start(self)


class _RoutedStream(io.TextIOBase):
    """`sys.stdout`/`sys.stderr`: writes go to the capture of the writing thread's session."""

    def __init__(self, which, fallback):
        super().__init__()
        self._which = which
        self._fallback = fallback

    @property
    def encoding(self):
        return "utf-8"

    @property
    def errors(self):
        return "strict"

    @property
    def name(self):
        return "<" + self._which + ">"

    def writable(self):
        return True

    def isatty(self):
        return False

    def write(self, s):
        if not isinstance(s, str):
            raise TypeError("write() argument must be str, not " + type(s).__name__)
        session = getattr(threading.current_thread(), "_rlm_session", None)
        if session is None:
            fallback = self._fallback
            return fallback.write(s) if fallback is not None else len(s)
        capture = getattr(session, self._which)
        if capture is None:
            # A thread left running by an earlier block: no block to report to.
            return len(s)
        return capture.write(s)

    def flush(self):
        session = _current_session()
        if session is None:
            if self._fallback is not None:
                self._fallback.flush()
            return
        capture = getattr(session, self._which)
        if capture is not None:
            # In a worker, what the code flushed leaves for the parent now, not after the
            # output's short batching delay: a crash right after it does not lose it.
            capture.flush()

    def __getattr__(self, name):
        # Anything else is the wrapped stream's (e.g. ipykernel's `set_parent`, which routes
        # a notebook cell's output to that cell).
        if name == "_fallback":
            raise AttributeError(name)
        return getattr(self._fallback, name)


class _NoInput(io.TextIOBase):
    """`sys.stdin`: a session has no terminal, so reading in a session's thread gives
    end-of-file at once; other threads read the interpreter's own stdin, if it had one."""

    def __init__(self, fallback):
        super().__init__()
        self._fallback = fallback

    @property
    def encoding(self):
        return "utf-8"

    @property
    def name(self):
        return "<stdin>"

    def readable(self):
        return True

    def read(self, size=-1):
        if _current_session() is None and self._fallback is not None:
            return self._fallback.read(size)
        return ""

    def readline(self, size=-1):
        if _current_session() is None and self._fallback is not None:
            return self._fallback.readline(size)
        return ""


_original_sleep = time.sleep


def _interruptible_sleep(secs):
    """time.sleep that a cell interrupt (timeout, cancellation) wakes up at once."""
    session = _current_session()
    if session is None:
        return _original_sleep(secs)
    if secs != secs or secs < 0:
        raise ValueError("sleep length must be non-negative")
    if secs == 0:
        return _original_sleep(0)
    stop = session.stop
    if stop.wait(secs):
        raise (session.killing or CellTimeout)("time.sleep interrupted: the block was stopped")
    return None


# --- calls that would end the process ---------------------------------------------------


class ProcessExit(SystemExit):
    """A cell called `os._exit`, `os.abort` or sent itself a terminating signal: in the REPL
    that ends the block, like `sys.exit()`, not the process that holds the session."""


# Signals whose default action ends the process (or stops it, which hangs the run).
_ENDING_SIGNALS = frozenset(
    getattr(signal, name)
    for name in (
        "SIGABRT", "SIGALRM", "SIGBUS", "SIGFPE", "SIGHUP", "SIGILL", "SIGINT", "SIGIO",
        "SIGKILL", "SIGPIPE", "SIGPOLL", "SIGPROF", "SIGPWR", "SIGQUIT", "SIGSEGV", "SIGSTKFLT",
        "SIGSTOP", "SIGSYS", "SIGTERM", "SIGTRAP", "SIGTSTP", "SIGTTIN", "SIGTTOU", "SIGUSR1",
        "SIGUSR2", "SIGVTALRM", "SIGXCPU", "SIGXFSZ",
    )
    if hasattr(signal, name)
) | frozenset(range(getattr(signal, "SIGRTMIN", 0), getattr(signal, "SIGRTMAX", -1) + 1))

# The process that holds the sessions; a forked child (a pool worker) exits for real.
_HOST_PID = os.getpid()
_original_exit = os._exit
_original_abort = os.abort
_original_kill = os.kill
_original_raise_signal = signal.raise_signal


def adopt_process():
    """This process holds the sessions from now on: a worker whose confinement forked it
    (the process that imported this module is gone)."""
    global _HOST_PID, _INIT_ADOPTS
    _HOST_PID = os.getpid()
    # Confined in a PID namespace of its own, whose `/proc` (its own too) numbers processes
    # as `os.kill` does, this process is the child of the namespace's init: the reaper of
    # every orphan there, which are all the session's.
    _INIT_ADOPTS = os.getppid() == 1 and _proc_self() == _HOST_PID


def _in_host_cell():
    return _current_session() is not None and os.getpid() == _HOST_PID


def _refuse(call, like):
    raise ProcessExit(
        f"{call} would end the whole rlm process, so in the REPL it ends only this block "
        f"(like {like}); the session keeps its variables"
    )


def _signal_name(sig):
    try:
        return signal.Signals(sig).name
    except ValueError:
        return str(sig)


def _exit(status):
    if _in_host_cell():
        _refuse(f"os._exit({status!r})", f"sys.exit({status!r})")
    _original_exit(status)


def _abort():
    if _in_host_cell():
        _refuse("os.abort()", "sys.exit(134)")
    _original_abort()


def _kill(pid, sig):
    # pid 0 and negative pids are process groups; ours is among them.
    if _in_host_cell() and (pid == _HOST_PID or pid <= 0) and sig in _ENDING_SIGNALS:
        _refuse(f"os.kill({pid}, {_signal_name(sig)})", "sys.exit()")
    return _original_kill(pid, sig)


def _raise_signal(sig):
    if _in_host_cell() and sig in _ENDING_SIGNALS:
        _refuse(f"signal.raise_signal({_signal_name(sig)})", "sys.exit()")
    return _original_raise_signal(sig)


def _ensure_routed(sys_module):
    """Route again if someone replaced `sys.stdout`/`sys.stderr` since (a test runner's
    capture, `contextlib.redirect_stdout`, a notebook's output stream): their stream becomes
    the fallback of threads outside any session."""
    if not isinstance(sys_module.stdout, _RoutedStream):
        sys_module.stdout = _RoutedStream("stdout", sys_module.stdout)
    if not isinstance(sys_module.stderr, _RoutedStream):
        sys_module.stderr = _RoutedStream("stderr", sys_module.stderr)


def install(sys_module, owns_interpreter):
    """Patch the interpreter once: routed stdio, no stdin, interruptible sleep, spawn workers
    that can import the session modules.

    `owns_interpreter`: the kernel initialised the interpreter (the `rlm` binary), so
    `sys.executable` is only a guess from `PATH`; spawn workers must run the Python whose
    library is embedded.

    Threads outside any session keep the streams the interpreter had when the kernel arrived:
    the terminal for `rlm`, the notebook's own output streams when the package is imported
    into a user's interpreter."""
    global _OWNS_INTERPRETER
    _OWNS_INTERPRETER = owns_interpreter
    if owns_interpreter:
        python = os.path.join(sys_module.base_exec_prefix, "bin", "python%d.%d" % sys_module.version_info[:2])
        if os.access(python, os.X_OK):
            sys_module.executable = python
            multiprocessing.spawn.set_executable(python)
    multiprocessing.spawn.get_preparation_data = _preparation_data
    _ensure_routed(sys_module)
    sys_module.stdin = _NoInput(sys_module.stdin)
    time.sleep = _interruptible_sleep
    threading.Thread.start = _thread_start
    os._exit = _exit
    os.abort = _abort
    os.kill = _kill
    signal.raise_signal = _raise_signal
    global _AUDITING
    if not _AUDITING:  # a hook cannot be removed: ours is added once per interpreter
        sys_module.addaudithook(_audit)
        _AUDITING = True


# --- compiling a block ---------------------------------------------------------------


def compile_block(session, source, filename):
    """Compile a block; returns (body_code, last_expression_code_or_None).

    Like IPython: if the last statement is a bare expression, it is compiled separately in
    `eval` mode so that its value can be shown (repr, unless None). A block is the main
    program: `__name__ == "__main__"` holds in it, though `__name__` names the session
    module. A top-level `name = lambda ...` becomes `def name(...)`, so it pickles by name.
    The block's definitions are recorded for spawn workers."""
    lines = source.splitlines(True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    linecache.cache[filename] = (len(source), None, lines, filename)
    tree = ast.parse(source, filename, "exec")
    _record_definitions(session, tree, lines, filename)
    if _may_name_main(source):
        tree = _MainGuard().visit(tree)
    tree.body = [_named_lambda(node) for node in tree.body]
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    body = compile(tree, filename, "exec", dont_inherit=True)
    expr = compile(last, filename, "eval", dont_inherit=True) if last is not None else None
    return body, expr


_DEFINITIONS = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _is_named_lambda(node):
    return (
        isinstance(node, ast.Assign)
        and len(node.targets) == 1
        and isinstance(node.targets[0], ast.Name)
        and isinstance(node.value, ast.Lambda)
    )


def _record_definitions(session, tree, lines, filename):
    for node in tree.body:
        if isinstance(node, _DEFINITIONS) or _is_named_lambda(node):
            first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", ())])
            text = "".join(lines[first - 1 : node.end_lineno])
            session.definitions.append((filename, first, text))


def _named_lambda(node):
    if not _is_named_lambda(node):
        return node
    function = ast.FunctionDef(
        name=node.targets[0].id,
        args=node.value.args,
        body=[ast.copy_location(ast.Return(node.value.body), node.value.body)],
        decorator_list=[],
        returns=None,
        type_comment=None,
    )
    return ast.copy_location(function, node)


def _may_name_main(source):
    """Whether the block may compare `__name__` at all: an ASCII source can name it only by
    spelling it out (other sources may spell it in characters that normalise to it). The
    guard walks every node in Python: in a worker's first block after an idle spell, ~45 us
    of a two-line block's ~0.4 ms (in the bench guide)."""
    return not source.isascii() or "__name__" in source


class _MainGuard(ast.NodeTransformer):
    """`__name__ == "__main__"` (either way round, `==` or `!=`) compares the constant."""

    def visit_Compare(self, node):
        self.generic_visit(node)
        if len(node.ops) != 1 or not isinstance(node.ops[0], (ast.Eq, ast.NotEq)):
            return node
        sides = [node.left, node.comparators[0]]
        names = [isinstance(x, ast.Name) and x.id == "__name__" for x in sides]
        mains = [isinstance(x, ast.Constant) and x.value == "__main__" for x in sides]
        if names[0] and mains[1]:
            node.left = ast.copy_location(ast.Constant("__main__"), node.left)
        elif mains[0] and names[1]:
            node.comparators[0] = ast.copy_location(ast.Constant("__main__"), sides[1])
        return node


# --- spawn and forkserver workers ----------------------------------------------------

# A worker started by `spawn` or `forkserver` is a fresh interpreter: to unpickle a function
# by reference it imports the session module by name. The kernel writes, when a worker
# starts, one file per session into a private directory that is on the worker's `sys.path`
# (never the parent's); the file re-creates the session's imports, functions, classes and
# named lambdas from their source, the way spawn re-imports a script's `__main__`, then the
# other globals those functions and classes name (constants, tables, compiled patterns),
# copied by value when they pickle within `_VALUE_LIMIT` bytes. Bigger data (a whole
# context) is not copied: a worker gets it as arguments.

_VALUE_LIMIT = 1 << 20

_spawn_dir = None

_REPLAY = '''"""Definitions of rlm REPL session {sid}, re-created in a spawn or forkserver worker."""


def _rlm_replay(definitions, namespace):
    import os

    # Like a forked child, a worker never writes to the run's terminal or stdout.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    os.close(devnull)
    for filename, line, source in definitions:
        try:
            exec(compile("\\n" * (line - 1) + source, filename, "exec"), namespace)
        except Exception:
            pass


_rlm_replay({definitions!r}, globals())
del _rlm_replay

def _rlm_values(values, namespace):
    import pickle

    for name, value in values:
        try:
            namespace[name] = pickle.loads(value)
        except Exception:
            pass


_rlm_values({values!r}, globals())
del _rlm_values
'''


def _global_names(code):
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def _referenced_values(session):
    """(name, pickled value) of the globals the session's functions and classes name that
    are data (not functions, classes or modules) and pickle small enough."""
    namespace = session.globals
    names = set()
    for value in list(namespace.values()):
        code = getattr(value, "__code__", None)
        if isinstance(code, types.CodeType) and getattr(value, "__module__", None) == session.name:
            names |= _global_names(code)
        elif isinstance(value, type) and value.__module__ == session.name:
            for member in vars(value).values():
                member = getattr(member, "__func__", member)
                if isinstance(getattr(member, "__code__", None), types.CodeType):
                    names |= _global_names(member.__code__)
    values = []
    for name in sorted(n for n in names if isinstance(n, str) and n in namespace):
        value = namespace[name]
        if callable(value) or isinstance(value, types.ModuleType):
            continue
        try:
            data = pickle.dumps(value)
        except Exception:
            continue
        if len(data) <= _VALUE_LIMIT:
            values.append((name, data))
    return values


def _write_session_modules():
    """Write the module of every session with definitions, for a worker about to start.

    Starts in several sessions at once each write every module: the files are written under
    `_LIFECYCLE` (one writer at a time, one folder, and no module of a session that closed
    meanwhile), the texts made before it (pickling the values runs the user's code)."""
    global _spawn_dir
    modules = [
        (
            session,
            _REPLAY.format(
                sid=session.sid,
                definitions=list(session.definitions),
                values=_referenced_values(session),
            ),
        )
        for session in list(_SESSIONS)
        if session.definitions
    ]
    if not modules:
        return _spawn_dir
    with _LIFECYCLE:
        if _spawn_dir is None:
            _spawn_dir = tempfile.mkdtemp(prefix="rlm-sessions-")
            # A file where `__pycache__` would go: a rewritten module is never read from a
            # stale bytecode cache (its mtime and size may not change).
            open(os.path.join(_spawn_dir, "__pycache__"), "w").close()
        for session, text in modules:
            if session not in _SESSIONS:
                continue
            path = os.path.join(_spawn_dir, session.name + ".py")
            with open(path + ".tmp", "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(path + ".tmp", path)
        return _spawn_dir


def _remove_session_module(name):
    """Delete a closed session's module file, and the directory with the last one (under
    `_LIFECYCLE`: no session starts between the check for the last one and the removal)."""
    global _spawn_dir
    if _spawn_dir is None:
        return
    leftovers = [name + ".py"] + ([] if _SESSIONS else ["__pycache__"])
    for leftover in leftovers:
        try:
            os.unlink(os.path.join(_spawn_dir, leftover))
        except OSError:
            pass
    if not _SESSIONS:
        try:
            os.rmdir(_spawn_dir)
        except OSError:
            pass
        _spawn_dir = None


_original_preparation_data = multiprocessing.spawn.get_preparation_data


def _preparation_data(name):
    data = _original_preparation_data(name)
    directory = _write_session_modules()
    if directory is not None:
        data["sys_path"] = list(data.get("sys_path", sys.path)) + [directory]
    return data


# --- processes the session's code starts ---------------------------------------------

# Audit events raised just before a call that starts a process (`subprocess`, `os.system`,
# `os.fork`, `os.posix_spawn`, `pty`, `os.popen`, asyncio's subprocesses, ...), and ctypes'
# lookups of C functions (which may fork). multiprocessing's own processes are tracked
# through its `active_children()` instead (spawn and forkserver start them below Python's
# audit events).
_PROCESS_EVENTS = frozenset(
    (
        "os.fork",
        "os.forkpty",
        "os.posix_spawn",
        "os.spawn",
        "os.system",
        "subprocess.Popen",
        "ctypes.dlopen",
        "ctypes.dlsym",
        "ctypes.dlsym/handle",
        "ctypes.call_function",
    )
)


_AUDITING = False

# Whether pid 1 is the sandbox's init and its other children are the session's (see
# `adopt_process`): a double fork's daemon ends up there.
_INIT_ADOPTS = False


def _audit(event, args):
    """The interpreter's audit hook: a session thread about to start a process makes its
    session note the children before it (`Session.may_start_process`)."""
    if event in _PROCESS_EVENTS:
        session = _current_session()
        if session is not None:
            session.may_start_process()



def _direct_children():
    """Pids of this process's children: every process in `/proc` whose parent is this one
    (Linux; elsewhere none are seen and only multiprocessing's own processes are tracked),
    and in a confined worker the other children of its init: orphans, such as a double
    fork's daemon (`_INIT_ADOPTS`).

    Not `/proc/self/task/*/children`, which is read a task at a time, each list piecewise
    (proc_tid_children(5): reliable only for frozen processes): a child whose thread exits
    during the scan moves to another thread, maybe one already read, and is missed (the
    block's process then outlives the session, or a host's process started before the
    block is later taken for the block's and ended). A process's parent in its `stat` is
    the parent's thread-group id, which a thread's exit does not change, and `/proc` lists
    processes in pid order, so every one that runs throughout the scan is seen.

    The pids are those of `/proc`: in a confined worker, the `/proc` of its own PID
    namespace (without it, none can be read)."""
    mine = _proc_self()
    if mine is None:
        return set()
    parents = _processes_by_parent()
    children = set(parents.get(mine, ()))
    if _INIT_ADOPTS:
        children.update(pid for pid in parents.get(1, ()) if pid != mine)
    return children


def _proc_self():
    """This process's pid as `/proc` numbers it, or None."""
    try:
        return int(os.readlink("/proc/self"))
    except (OSError, ValueError):
        return None


def _owners():
    """The parents of the processes a session starts: this process, and in a confined
    worker its init (orphans)."""
    return {os.getpid(), 1} if _INIT_ADOPTS else {os.getpid()}


def _boot_ticks():
    """Now, in the unit of a process's start time in `/proc/PID/stat`."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK"))


def _processes_by_parent():
    """{parent pid: [pids of its children]} of every process in `/proc`."""
    parents = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return parents
    for entry in entries:
        if entry.isdigit() and (stat := _stat(int(entry))) is not None:
            parents.setdefault(stat[0], []).append(int(entry))
    return parents


def _stat(pid):
    """(parent pid, start time, state) of a process, or None."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        text = os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)
    fields = text[text.rfind(b")") + 2 :].split()
    if len(fields) < 20:
        return None
    return int(fields[1]), int(fields[19]), fields[0].decode("ascii", "replace")


def _mp_children():
    """multiprocessing's live processes (pool workers of every start method)."""
    if "multiprocessing" not in sys.modules:
        return []
    # None was started (`active_children` would poll none): at each block's start and end,
    # the common case runs none of its Python.
    if not getattr(sys.modules.get("multiprocessing.process"), "_children", True):
        return []
    return sys.modules["multiprocessing"].active_children()


def _mp_helpers():
    """Pids of multiprocessing's long-lived helpers (forkserver, resource tracker): shared by
    the whole interpreter, they are left alone and end with it."""
    pids = set()
    for module, attr, pid_attr in (
        ("multiprocessing.forkserver", "_forkserver", "_forkserver_pid"),
        ("multiprocessing.resource_tracker", "_resource_tracker", "_pid"),
    ):
        helper = getattr(sys.modules.get(module), attr, None)
        pid = getattr(helper, pid_attr, None)
        if pid is not None:
            pids.add(pid)
    return pids


def _descendants(roots):
    parents = _processes_by_parent()
    found, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(parents.get(pid, ()))
    return found


_TERMINATE_GRACE = 1.0


def _terminate(processes, pool):
    """Stop processes: multiprocessing's own through their pools and `Process` objects (so
    they are reaped and a pool does not start replacements), the others (forks, subprocesses
    and everything below them) with SIGTERM, then SIGKILL after a grace period."""
    pool = [p for p in pool if _alive(p)]
    for p in pool:
        _terminate_owning_pool(p)
    for p in pool:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + _TERMINATE_GRACE
    for p in pool:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join(_TERMINATE_GRACE)
    skip = _mp_helpers() | {p.pid for p in pool}
    owners = _owners()
    # A pid is ours only while it is still our child (or, in a confined worker, init's)
    # started at the recorded time.
    roots = [
        pid
        for pid, since in processes.items()
        if pid not in skip
        and (stat := _stat(pid)) is not None
        and stat[0] in owners
        and stat[1] == since
    ]
    if not roots:
        return
    targets = _descendants(roots) - skip
    _signal_all(targets, signal.SIGTERM)
    deadline = time.monotonic() + _TERMINATE_GRACE
    while time.monotonic() < deadline:
        _reap(roots)
        if not any(_running(pid) for pid in targets):
            return
        _original_sleep(0.02)
    _signal_all([pid for pid in targets if _running(pid)], signal.SIGKILL)
    deadline = time.monotonic() + _TERMINATE_GRACE
    while time.monotonic() < deadline and any(_running(pid) for pid in roots):
        _original_sleep(0.02)
    _reap(roots)


def _alive(process):
    try:
        return process.is_alive()
    except ValueError:  # closed by its owner: nothing left to stop
        return False


def _terminate_owning_pool(process):
    # A `multiprocessing.Pool` replaces dead workers; its finalizer stops it for good.
    for finalizer, workers in _pool_finalizers():
        if any(worker is process for worker in workers):
            _terminate_pool(finalizer, workers)


def _pool_finalizers():
    """(finalizer, workers) of every `multiprocessing.Pool` not terminated yet."""
    registry = getattr(sys.modules.get("multiprocessing.util"), "_finalizer_registry", {})
    for finalizer in list(registry.values()):
        callback = getattr(finalizer, "_callback", None)
        args = getattr(finalizer, "_args", ())
        if getattr(callback, "__qualname__", "") == "Pool._terminate_pool" and len(args) > 3:
            yield finalizer, args[3]


def _terminate_pool(finalizer, workers):
    """Run a pool's finalizer, bounded. It sends its workers SIGTERM, then joins them without a
    bound: a worker that ignores SIGTERM (or a task stuck in a call that defers it) would hold
    the block's end or the session's close for ever. So it runs on a thread of its own, and
    the workers still running after `_TERMINATE_GRACE` get SIGKILL, which ends its joins."""
    ending = threading.Thread(target=finalizer, name="rlm-pool-end", daemon=True)
    ending.start()
    ending.join(_TERMINATE_GRACE)
    if ending.is_alive():
        running = [w.pid for w in workers if w.pid is not None and _running(w.pid)]
        _signal_all(running, signal.SIGKILL)
        ending.join(_TERMINATE_GRACE)


def _signal_all(pids, sig):
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def _running(pid):
    stat = _stat(pid)
    return stat is not None and stat[2] not in ("Z", "X")


def _reap(pids):
    for pid in pids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except OSError:
            pass


# --- forked children -----------------------------------------------------------------


def forked_child_status(exc):
    """The exit status of a forked child whose copy of a block ended with `exc` (None: the
    block finished), as Python's own exit would give it."""
    if exc is None:
        return 0
    if isinstance(exc, SystemExit):
        code = exc.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code & 0xFF
        return 1
    return 1


# --- exceptions ----------------------------------------------------------------------


def _strip_support_frames(te):
    seen = set()
    while te is not None and id(te) not in seen:
        seen.add(id(te))
        te.stack = traceback.StackSummary.from_list(
            [f for f in te.stack if f.filename != SUPPORT_FILE]
        )
        if te.__cause__ is not None:
            _strip_support_frames(te.__cause__)
        te = te.__context__


def describe_exception(exc, filename, message=None):
    """(type_name, message, traceback_text, line) of an exception raised by a block.

    Frames of this support module are removed; `line` is the line of the block (`filename`)
    where the exception happened, or None. `message`, when given, replaces the exception's
    own text (used for interrupts, whose text depends on the session's configuration)."""
    te = traceback.TracebackException.from_exception(exc, limit=None, compact=True)
    _strip_support_frames(te)
    if message is not None:
        te._str = message
    text = "".join(te.format())
    line = None
    if isinstance(exc, SyntaxError) and exc.filename == filename:
        line = exc.lineno
    else:
        tb = exc.__traceback__
        while tb is not None:
            if tb.tb_frame.f_code.co_filename == filename:
                line = tb.tb_lineno
            tb = tb.tb_next
    if message is not None:
        shown = message
    else:
        try:
            shown = str(exc)
        except BaseException:
            shown = f"<str() of the {type(exc).__name__} failed>"
    return type(exc).__name__, _cap(shown, MESSAGE_CAP), _cap(text, TRACEBACK_CAP), line


# An exception's text may hold a whole context (`float(context)`); what the kernel keeps of it
# is bounded, head and tail, like block output.
MESSAGE_CAP = 2_000
TRACEBACK_CAP = 20_000


def _cap(text, limit):
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half:,} characters omitted ...]\n{text[-half:]}"


# --- final answers -------------------------------------------------------------------


def _record(session, source, value):
    """The `answer` dict keeps the content of the moment `ready` turned true (first wins);
    `FINAL_VAR` keeps its last call. Each convention has its own slot, so the loop can honour
    whichever its protocol counts."""
    if source == "answer" and "answer" in session.finals:
        return
    session.finals[source] = value


class AnswerDict(dict):
    """The `answer` dict: `answer["content"]`, `answer["ready"]`.

    The final answer is recorded once, the moment `ready` becomes truthy, as `str(content)`
    at that moment; later changes to `content` in the same block do not alter it. When
    `content` is still empty at that moment (the model set `ready` first), the first
    non-empty `content` assigned while `ready` is truthy is recorded instead."""

    __slots__ = ("_session", "_version")

    def __init__(self, session):
        super().__init__(content="", ready=False)
        self._session = session
        self._version = 0

    def _check(self):
        if "answer" in self._session.finals or not self.get("ready"):
            return
        content = str(self.get("content", ""))
        if content:
            _record(self._session, "answer", content)

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        self._version += 1
        if key in ("ready", "content"):
            self._check()

    def reset(self):
        """Back to `{"content": "", "ready": False}` (a new run starts)."""
        dict.clear(self)
        dict.update(self, content="", ready=False)
        self._version += 1

    def __delitem__(self, key):
        super().__delitem__(key)
        self._version += 1

    def update(self, *args, **kwargs):
        super().update(*args, **kwargs)
        self._version += 1
        self._check()

    def __ior__(self, other):
        self.update(other)
        return self

    def setdefault(self, key, default=None):
        value = super().setdefault(key, default)
        self._version += 1
        self._check()
        return value

    def pop(self, *args):
        self._version += 1
        return super().pop(*args)

    def popitem(self):
        self._version += 1
        return super().popitem()

    def clear(self):
        self._version += 1
        super().clear()

    def __reduce__(self):
        return (dict, (dict(self),))


def answer_state(slot):
    """Before a block: what `settle_answer` compares against afterwards."""
    try:
        ready = bool(slot.get("ready"))
    except Exception:
        ready = False
    return slot, getattr(slot, "_version", None), ready


_UNSET = object()


def settle_answer(session, own, globals_, before):
    """After a block: decide what `answer` is and record a ready answer that bypassed the
    AnswerDict hooks. Returns (slot, note): the object that is the answer slot from now on,
    and a note for the block's stderr (or None).

    `own` is the session's AnswerDict; `before` is `answer_state` of the slot before the
    block. A block that rebinds `answer` to a mapping makes that mapping the slot (its
    `content` and `ready` are read from it, now and after later blocks); rebinding it to
    anything else puts back a fresh `{"content": "", "ready": False}`; deleting it puts the
    slot back."""
    slot, version_before, ready_before = before
    current = globals_.get("answer", _UNSET)
    note = None
    rebound = current is not slot
    if current is _UNSET:
        globals_["answer"] = slot
        note = "Note: `answer` is reserved by the REPL and was restored; keep your value under another name."
        rebound = False
    elif rebound and isinstance(current, Mapping):
        slot = current
    elif rebound:
        own.reset()
        slot = own
        globals_["answer"] = own
        note = (
            f"Note: `answer` must stay a dict; it was {type(current).__name__}, so it was reset to "
            '`{"content": "", "ready": False}`. To finish, set `answer["content"]` and then '
            '`answer["ready"] = True`.'
        )
        rebound = False
    if "answer" in session.finals:
        return slot, note
    # The user's objects decide truth and text here; their failure means "not ready".
    try:
        if slot is own:
            ready = own._version != version_before and own.get("ready")
        else:
            # A plain mapping has no hooks: ready now, and not already before this block.
            ready = slot.get("ready") and (rebound or not ready_before)
        if ready:
            _record(session, "answer", str(slot.get("content", "")))
    except Exception:
        pass
    return slot, note


def make_final_var(session, globals_, reserved):
    def FINAL_VAR(value):
        """Record the final answer: the name (a str) of a variable whose str() is the answer,
        a str variable itself, or a value that is not a str. Returns the recorded text, or an
        error text when no variable has that name (then nothing is recorded)."""
        if not isinstance(value, str):
            text = str(value)
        else:
            name = value.strip().strip("\"'`").strip()
            if name in globals_:
                text = str(globals_[name])
            elif _is_user_value(globals_, reserved, value):
                # `FINAL_VAR(summary)` with `summary` a str variable: the caller passed the
                # variable itself (the very object), not its name.
                text = value
            else:
                names = user_names(globals_, reserved)
                listed = ", ".join(f"`{n}`" for n in names) if names else "none yet"
                # A whole document passed by mistake must not flood the model's next message.
                shown = name if len(name) <= 60 else name[:57] + "..."
                error = (
                    f"Error: FINAL_VAR({_repr.repr(value)}) names no variable `{shown}`, so no final answer "
                    f"was recorded. Your variables: {listed}. Assign the answer to a variable "
                    "first, then call FINAL_VAR with its name."
                )
                print(error, file=sys.stderr)
                return error
        _record(session, "final_var", text)
        return text

    return FINAL_VAR


# --- variables -----------------------------------------------------------------------

class _SafeRepr(reprlib.Repr):
    """reprlib that never runs the user's `__repr__`: objects of other modules are named,
    not shown (a `__repr__` that loops or raises must not hang or break the listing)."""

    def repr_instance(self, x, level):
        module = type(x).__module__
        if module == "builtins":
            return super().repr_instance(x, level)
        if module == "collections":
            # defaultdict, Counter, OrderedDict, deque: shown by their contents.
            if isinstance(x, dict):
                return self.repr_dict(x, level)
            if hasattr(x, "__iter__"):
                return self.repr_list(list(itertools.islice(x, self.maxlist + 1)), level)
        return "<" + type(x).__name__ + " object>"


_repr = _SafeRepr()
_repr.maxstring = 60
_repr.maxother = 60
_repr.maxlist = 5
_repr.maxtuple = 5
_repr.maxset = 5
_repr.maxdict = 4
_repr.maxlevel = 2

_SIZED_MODULES = ("builtins", "collections")


def _summarize(value):
    cls = type(value)
    module = getattr(cls, "__module__", "") or ""
    size = None
    if module in _SIZED_MODULES or module.startswith("polars"):
        try:
            size = len(value)
        except Exception:
            size = None
    if module.startswith("polars") and hasattr(value, "shape"):
        try:
            preview = f"{cls.__name__} shape={tuple(value.shape)}"
            columns = getattr(value, "columns", None)
            if columns is not None:
                preview += " columns=" + _repr.repr(list(columns))
        except Exception:
            preview = "<" + cls.__name__ + ">"
    elif module in _SIZED_MODULES:
        try:
            preview = _repr.repr(value)
        except Exception:
            preview = "<" + cls.__name__ + ">"
    elif callable(value):
        preview = "<" + ("class " if isinstance(value, type) else "function ") + getattr(
            value, "__name__", cls.__name__
        ) + ">"
    else:
        preview = "<" + (module + "." if module else "") + cls.__name__ + " object>"
    return cls.__name__, size, preview


def list_variables(globals_, reserved):
    """[(name, type_name, size, preview)] of the user's variables, in definition order.

    Hidden: names starting with `_`, reserved names, and modules."""
    out = []
    for name, value in list(globals_.items()):
        if not _is_user_name(name, value, reserved):
            continue
        type_name, size, preview = _summarize(value)
        out.append((name, type_name, size, preview))
    return out


def make_show_vars(globals_, reserved):
    def SHOW_VARS():
        """Print the user's variables (name, type, size, preview); returns None."""
        rows = list_variables(globals_, reserved)
        if not rows:
            print("No user variables yet.")
            return None
        width = max(len(r[0]) for r in rows)
        twidth = max(len(r[1]) for r in rows)
        for name, type_name, size, preview in rows:
            size_text = f"len={size}" if size is not None else ""
            print(f"{name:<{width}}  {type_name:<{twidth}}  {size_text:<12} {preview}")
        return None

    return SHOW_VARS


def _is_user_name(name, value, reserved):
    # `globals().update({1: ...})` puts non-str keys in the namespace; they are not variables.
    return (
        type(name) is str
        and not name.startswith("_")
        and name not in reserved
        and type(value).__name__ != "module"
    )


def _is_user_value(globals_, reserved, value):
    return any(v is value and _is_user_name(n, v, reserved) for n, v in list(globals_.items()))


def user_names(globals_, reserved):
    return [n for n, v in list(globals_.items()) if _is_user_name(n, v, reserved)]


# --- contexts ------------------------------------------------------------------------


def _without_gc(build):
    # Building millions of containers triggers the cyclic GC over and over (2-3x the parse
    # time); nothing built here can form a cycle.
    enabled = gc.isenabled()
    gc.disable()
    try:
        return build()
    finally:
        if enabled:
            gc.enable()


def json_loads(text):
    return _without_gc(lambda: json.loads(text))


def jsonl_loads(text):
    loads = json.loads
    return _without_gc(lambda: [loads(line) for line in text.split("\n") if line.strip()])


def table_shape(frame):
    return frame.height, [(name, str(dtype)) for name, dtype in frame.schema.items()]


def encoding_name(name):
    """The codec's canonical name (`latin-1` → `iso8859-1`); LookupError if there is none."""
    import codecs

    return codecs.lookup(name).name


def read_text(path, data, encoding):
    """Text of a file (or of `data`, its decompressed bytes) in a legacy encoding, line
    endings kept as they are."""
    if data is not None:
        return str(data, encoding)
    with open(path, encoding=encoding, newline="") as f:
        return f.read()


def read_csv(pl, path, text, separator, infer_all):
    """polars.read_csv of a path (polars decompresses gzip/zstd itself) or `bytes` (a CSV held
    in memory), or of decoded text.

    `infer_all` infers the dtypes from every row, not the first 100: slower, but a column
    whose first rows look numeric and a later one does not loads as text."""
    source = io.StringIO(text) if text is not None else path
    return pl.read_csv(
        source, separator=separator, infer_schema_length=None if infer_all else 100
    )


def csv_bad_rows(text, separator, clean):
    """Scan CSV `text` for rows with more fields than the header, or broken quoting.

    Returns (count, first_line, first_fields, header_fields, cleaned): `first_fields` is
    None for a quoting error; `cleaned` (when `clean`) is the CSV without the bad rows."""
    import csv

    csv.field_size_limit(sys.maxsize)
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=separator, strict=True)
    out = io.StringIO() if clean else None
    writer = csv.writer(out, delimiter=separator, lineterminator="\n") if clean else None
    expected = None
    count = 0
    first = None
    while True:
        start = reader.line_num + 1
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error:
            count += 1
            if first is None:
                first = (start, None)
            if not clean:
                break
            continue
        if not row:
            continue
        if expected is None:
            expected = len(row)
        elif len(row) > expected:
            count += 1
            if first is None:
                first = (start, len(row))
            if not clean:
                break
            continue
        if writer is not None:
            writer.writerow(row)
    if first is None:
        return 0, None, None, expected, None
    return count, first[0], first[1], expected, out.getvalue() if clean else None


def read_excel(pl, path):
    """Every sheet of a workbook: {sheet name: DataFrame}, in workbook order."""
    import warnings

    # polars warns about a change of its Arrow hand-over in 2.0: nothing the user can act on.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return pl.read_excel(path, sheet_id=0, engine="calamine")


def to_pandas(frame):
    """A pandas DataFrame of a polars one, column by column through NumPy (no pyarrow
    needed): strings become `object`/`str` columns, integers with nulls `float64`."""
    import pandas

    return pandas.DataFrame(
        {name: frame.get_column(name).to_numpy() for name in frame.columns}
    )


def describe_object(value):
    """(kind, bytes, chars, rows, columns, items) of a live context object, measured without
    reading or copying it; kind is the qualified type name when the type is not supported."""
    cls = type(value)
    module = cls.__module__ or ""
    if isinstance(value, str):
        size = len(value) if value.isascii() else sys.getsizeof(value)
        return "text", size, len(value), None, None, None
    if isinstance(value, (dict, list)):
        return "json", sys.getsizeof(value), None, None, None, len(value)
    if cls.__name__ == "DataFrame" and module.startswith("polars"):
        rows, columns = table_shape(value)
        return "table", int(value.estimated_size()), None, rows, columns, None
    if cls.__name__ == "DataFrame" and module.startswith("pandas"):
        columns = [(str(name), str(dtype)) for name, dtype in value.dtypes.items()]
        size = int(value.memory_usage(index=True, deep=False).sum())
        return "pandas_table", size, None, len(value), columns, None
    return f"{module}.{cls.__qualname__}", 0, None, None, None, None
