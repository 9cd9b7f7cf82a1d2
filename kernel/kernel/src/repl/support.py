"""Python-side support of the rlm kernel REPL.

Loaded once per interpreter as the module `_rlm_kernel` (filename `<rlm-kernel>`); frames
from this file are filtered out of user tracebacks. It holds what is easier to say in Python
than through the C API: per-thread routing of `sys.stdout`/`sys.stderr` to the capture of
the session that owns the thread, the interruptible `time.sleep`, cell compilation with
IPython-style display of a final bare expression, traceback formatting, the `answer` dict,
`FINAL_VAR`, `SHOW_VARS` and variable summaries. Cell execution itself, the watchdog and the
sub-model natives live in Rust.
"""

import ast
import gc
import io
import itertools
import json
import linecache
import reprlib
import sys
import threading
import time
import traceback

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

    `kind` is a short stable tag (e.g. `timeout`, `budget`, `http`); for a batch,
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
        "finals",
        "globals",
        "killing",
        "thread_ident",
        "__weakref__",
    )

    def __init__(self, sid, globals_):
        self.sid = sid
        self.killing = None  # the interrupt class while a block is being stopped
        self.thread_ident = None  # the session thread
        self.stdout = None
        self.stderr = None
        self.stop = threading.Event()
        # Final answers recorded during the current block, one per convention, in the
        # order first recorded: {"answer": text, "final_var": text}.
        self.finals = {}
        self.globals = globals_

    def begin_block(self, stdout, stderr):
        self.stdout = stdout
        self.stderr = stderr
        self.stop = threading.Event()
        self.finals = {}

    def end_block(self):
        self.stdout = None
        self.stderr = None


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
        if session is None and self._fallback is not None:
            self._fallback.flush()


class _NoInput(io.TextIOBase):
    """`sys.stdin`: the REPL has no terminal; reading gives end-of-file at once."""

    @property
    def encoding(self):
        return "utf-8"

    @property
    def name(self):
        return "<stdin>"

    def readable(self):
        return True

    def read(self, size=-1):
        return ""

    def readline(self, size=-1):
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


def install(sys_module):
    """Patch the interpreter once: routed stdio, no stdin, interruptible sleep."""
    sys_module.stdout = _RoutedStream("stdout", sys_module.__stdout__)
    sys_module.stderr = _RoutedStream("stderr", sys_module.__stderr__)
    sys_module.stdin = _NoInput()
    time.sleep = _interruptible_sleep
    threading.Thread.start = _thread_start


# --- compiling a block ---------------------------------------------------------------


def compile_block(source, filename):
    """Compile a block; returns (body_code, last_expression_code_or_None).

    Like IPython: if the last statement is a bare expression, it is compiled separately in
    `eval` mode so that its value can be shown (repr, unless None)."""
    lines = source.splitlines(True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    linecache.cache[filename] = (len(source), None, lines, filename)
    tree = ast.parse(source, filename, "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    body = compile(tree, filename, "exec", dont_inherit=True)
    expr = compile(last, filename, "eval", dont_inherit=True) if last is not None else None
    return body, expr


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


def answer_version(answer):
    return getattr(answer, "_version", None)


def check_answer_after_block(session, answer, current, version_before):
    """After a block: record a ready answer that bypassed the hooks.

    `current` is what the namespace's `answer` is now (the user may have rebound it to a
    plain dict); `answer` is the session's own AnswerDict."""
    if "answer" in session.finals:
        return
    # The user's objects decide truth and text here; their failure means "not ready".
    try:
        if current is not answer:
            if hasattr(current, "get") and current.get("ready"):
                _record(session, "answer", str(current.get("content", "")))
        elif answer._version != version_before and answer.get("ready"):
            _record(session, "answer", str(answer.get("content", "")))
    except Exception:
        pass


def make_final_var(session, globals_):
    def FINAL_VAR(value):
        """Record the final answer: a value, or the name (a str) of a variable whose str()
        is the answer. Returns the recorded text."""
        if isinstance(value, str) and value.strip().isidentifier() and value.strip() in globals_:
            text = str(globals_[value.strip()])
        else:
            text = str(value)
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
