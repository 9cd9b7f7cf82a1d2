"""Python-side support of the kernel's Python-backed agent tools.

Loaded once per interpreter as the module `_rlm_agent_tools`, under the support module's
filename `<rlm-kernel>` so that its frames are filtered out of user tracebacks. The kernel
runs each entry point as a block of the session (so the block's time limit, interrupts,
output capture and `llm_query` all apply) and then pops the JSON text the entry point left
in `results` under the call's token: an entry point never returns data through the
session's namespace, which it leaves as it found it.

- `load_file(ns, path, token)`: runs a Python file in the namespace (like `%run`) and
  describes its public functions (`__all__`, else top-level `def`s not starting with `_`).
- `describe(ns, names, token)`: describes functions of the namespace by name.
- `describe_function(fn, name, where, token)`: describes one function object, which the
  kernel's block bound first (a session's function, a workflow file's `tools.py:lookup`).
- `call_function(fn, name, token, arguments_json, context_json)`: calls a tool with
  keyword arguments; the return value becomes JSON (falling back to `repr`). Arguments that
  do not fit the signature are reported, not raised; so is an exception of the function,
  with a traceback that starts at the function. Interrupts (time limit, cancellation) end
  the block.
- `call_flow(fn, name, kind, token, arg_json, kwargs_json, sync_json)`: calls a workflow's
  Python step (`kind` `step`), callback (`callback`) or state function (`state_function`),
  reported as `call_function` reports. With `sync_json`, the workflow's state is not in the
  arguments: the session keeps a copy of it (one per state, on the session's thread), and
  `sync_json` catches that copy up — the whole state the first time (`{"id", "to",
  "state"}`), then only the writes made since the copy's generation (`{"id", "from", "to",
  "writes"}`), so what a call sends does not grow with the run. A copy that is not at `from`
  (a new or restarted session) makes the call report `"stale"` without calling the function,
  and the kernel sends the whole state. The function never gets the kept copy itself: a step
  or callback taking a dict gets a copy of it, and a `Context`'s state copies a key when the
  function first reads it, so changing a value in place changes only the call's own copy.
- `forget_block()`: forgets the source of the block that calls it (its `linecache` entry
  and its session's record of its definitions), once the block's call is over: the
  arguments are literals in it, and a session keeps every block's source until it closes.

A description is `{"name", "description", "parameters", "takes_context", "takes_any"}`,
with a JSON Schema derived from the signature (type hints: str, int, float, bool,
list/tuple/set, dict, Optional/Union, Literal, Enum, Annotated; a parameter with a default
is not required) and the docstring (the prose before the first section is the description;
Google `Args:`, NumPy `Parameters`, and Sphinx `:param x:` entries describe the parameters).

One convention for every Python function of a workflow — a tool, a callback, a step — as in
Google ADK: the function gets a `Context` in a parameter named for its kind (`tool_context`
for a tool, which is left out of its schema; `callback_context` for a callback; `ctx` for a
step, as ADK's function nodes name it). `context.state` reads the workflow's state as the
call starts; assigning a key, deleting one (`del context.state["k"]`) and changing a value
in place are the call's writes — a list that only grew at its end is an append of the new
items — and `context.actions` takes the actions (`exit_loop`, `end_turn` or its ADK name
`skip_summarization`, `escalate`). The writes and actions go back with the return value as
`{"writes": [...], "actions": {...}}`; an exception discards them. The forms documented
before it — a step `(state) -> dict of updates` with `__actions__` and `__message__`, a
callback taking one `ctx` dict — still work and report their effects the same way.
"""

import ast
import collections.abc
import dataclasses
import enum
import inspect
import json
import linecache
import marshal
import math
import re
import sys
import threading
import traceback
import types
import typing

results = {}

_NONE = type(None)
_SIMPLE = {str: "string", int: "integer", float: "number", bool: "boolean"}
_SECTIONS = re.compile(
    r"^(Args|Arguments|Parameters|Params|Keyword Args|Keyword Arguments|Other Parameters|"
    r"Returns?|Yields?|Raises|Examples?|Notes?|See Also|Attributes|Warns|Warnings|"
    r"References|Todo)\s*:?\s*$"
)
_PARAM_SECTIONS = {
    "Args", "Arguments", "Parameters", "Params", "Keyword Args", "Keyword Arguments",
    "Other Parameters",
}
# The parameter that receives the `Context`, per kind of function, as Google ADK names it.
CONTEXT_PARAMETER = "tool_context"
CONTEXT_PARAMETERS = {"tool": "tool_context", "callback": "callback_context", "step": "ctx"}

# What a step that takes the state as a dict may return besides state keys.
ACTIONS_KEY = "__actions__"
MESSAGE_KEY = "__message__"
ACTION_NAMES = ("exit_loop", "end_turn", "escalate")


class ToolDefinitionError(Exception):
    """A function cannot be offered as a tool; the message says why."""


def _store(token, value):
    results[token] = json.dumps(value, ensure_ascii=False)


# The copies of workflow states this session keeps, `{state id: (generation, dict)}`, on the
# session's own thread (each session runs its blocks on a thread of its own); the most
# recently caught-up few are kept.
_kept = threading.local()
_KEPT_STATES = 4


def _copy(value):
    """A deep copy of a JSON value (`marshal` copies such values in C, several times faster
    than `copy.deepcopy` or a JSON round trip)."""
    try:
        return marshal.loads(marshal.dumps(value))
    except ValueError:
        return json.loads(json.dumps(value))


def _synced(sync):
    """The kept state once `sync` is applied to it, or None when the writes follow a copy this
    session does not have (then the kernel sends the whole state)."""
    states = getattr(_kept, "states", None)
    if states is None:
        states = _kept.states = {}
    # Out of the table while it changes: an interrupt leaves no half-written copy behind.
    kept = states.pop(sync["id"], None)
    if "state" in sync:
        state = sync["state"]
    elif kept is not None and kept[0] == sync["from"]:
        state = kept[1]
        for write in sync["writes"]:
            _apply_write(state, write)
    else:
        return None
    states[sync["id"]] = (sync["to"], state)
    while len(states) > _KEPT_STATES:
        del states[next(iter(states))]
    return state


def _apply_write(state, write):
    """Applies one write as the engine does: a replace sets the key, an append extends the
    list under it (a key that holds no list gets a list of the items), a delete removes it.
    Keys stay in the engine's order (sorted), so the state a function gets is the same dict
    in the same order as one sent whole."""
    key, op = write["key"], write["op"]
    if op == "delete":
        state.pop(key, None)
        return
    new = key not in state
    if op == "append":
        old = state.get(key)
        if isinstance(old, list):
            old.extend(write["items"])
        else:
            state[key] = write["items"]
    else:
        state[key] = write["value"]
    if new:
        ordered = sorted(state.items())
        state.clear()
        state.update(ordered)


def forget_block():
    """Forget the calling block's source: its `linecache` entry and the session's record of
    the definitions in it (a spawn worker re-creates those; the block's function is deleted
    once called, so it needs none of them)."""
    filename = sys._getframe(1).f_code.co_filename
    linecache.cache.pop(filename, None)
    session = getattr(threading.current_thread(), "_rlm_session", None)
    definitions = getattr(session, "definitions", None)
    if definitions:
        definitions[:] = [d for d in definitions if d[0] != filename]


# --- loading and describing ----------------------------------------------------------


def load_file(ns, path, token):
    with open(path, encoding="utf-8") as f:
        source = f.read()
    tree = ast.parse(source, filename=path)
    code = compile(tree, path, "exec")
    ns["__file__"] = path
    exec(code, ns)
    names = ns.get("__all__")
    if names is None:
        names = [
            node.name
            for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and not node.name.startswith("_")
        ]
    _store(token, [_describe(ns, str(name), path) for name in names])


def describe(ns, names, token):
    _store(token, [_describe(ns, name, None) for name in names])


def describe_function(fn, name, where, token):
    _store(token, _describe_function(fn, name, where))


def _describe(ns, name, path):
    where = f" in `{path}`" if path else " in the session"
    if name not in ns:
        raise ToolDefinitionError(f"No function `{name}` is defined{where}")
    return _describe_function(ns[name], name, where)


def _describe_function(fn, name, where):
    if not inspect.isfunction(fn) and not inspect.isbuiltin(fn):
        raise ToolDefinitionError(
            f"`{name}`{where} is a `{type(fn).__name__}`, not a function"
        )
    if inspect.iscoroutinefunction(fn):
        raise ToolDefinitionError(f"`{name}`{where} is `async`; tools call plain functions")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as e:
        raise ToolDefinitionError(f"The signature of `{name}`{where} cannot be read: {e}")
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception:
        hints = getattr(fn, "__annotations__", {}) or {}
    summary, documented = _parse_docstring(inspect.getdoc(fn) or "")
    properties = {}
    required = []
    takes_context = False
    takes_any = False
    for param in signature.parameters.values():
        if param.kind is param.VAR_KEYWORD:
            takes_any = True
            continue
        if param.kind is param.VAR_POSITIONAL:
            continue
        if param.kind is param.POSITIONAL_ONLY:
            raise ToolDefinitionError(
                f"Parameter `{param.name}` of `{name}`{where} is positional-only; tools are "
                "called with keyword arguments"
            )
        if param.name == CONTEXT_PARAMETER:
            takes_context = True
            continue
        schema = _schema(hints.get(param.name, param.annotation))
        if param.name in documented and "description" not in schema:
            schema["description"] = documented[param.name]
        if param.default is param.empty:
            required.append(param.name)
        else:
            default = _jsonable(param.default)
            if default is not _UNSET:
                schema["default"] = default
        properties[param.name] = schema
    parameters = {"type": "object", "properties": properties}
    if required:
        parameters["required"] = required
    return {
        "name": name,
        "description": summary or f"Calls the Python function `{name}`.",
        "parameters": parameters,
        "takes_context": takes_context,
        "takes_any": takes_any,
    }


_UNSET = object()


def _jsonable(value):
    if isinstance(value, enum.Enum):
        value = value.value
    try:
        json.dumps(value, allow_nan=False)
        return value
    except (TypeError, ValueError):
        return _UNSET


def _enum_arguments(fn, kwargs):
    """`kwargs` with values of parameters annotated with an `Enum` class made members."""
    try:
        hints = typing.get_type_hints(fn)
    except Exception:
        return kwargs
    out = dict(kwargs)
    for key, value in kwargs.items():
        hint = hints.get(key)
        if isinstance(hint, type) and issubclass(hint, enum.Enum) and not isinstance(value, hint):
            try:
                out[key] = hint(value)
            except ValueError:
                pass
    return out


def _schema(hint):
    """The JSON Schema of a type hint (`{}`, anything, when there is none or it is unknown)."""
    if hint is inspect.Parameter.empty or hint is typing.Any or hint is None:
        return {} if hint is not None else {"type": "null"}
    if hint is _NONE:
        return {"type": "null"}
    if hint in _SIMPLE:
        return {"type": _SIMPLE[hint]}
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        values = [m.value for m in hint]
        return _enum_schema(values)
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Annotated:
        schema = _schema(args[0])
        notes = [a for a in args[1:] if isinstance(a, str)]
        if notes:
            schema["description"] = " ".join(notes)
        return schema
    if origin is typing.Literal:
        return _enum_schema(list(args))
    if origin is typing.Union or origin is types.UnionType:
        members = [a for a in args if a is not _NONE]
        nullable = len(members) < len(args)
        schemas = [_schema(a) for a in members]
        if len(schemas) == 1:
            schema = schemas[0]
        else:
            schema = {"anyOf": schemas}
        if nullable:
            if set(schema) == {"type"} and isinstance(schema["type"], str):
                schema = {"type": [schema["type"], "null"]}
            else:
                schema = {"anyOf": [schema, {"type": "null"}]}
        return schema
    container = origin or hint
    if container in (list, tuple, set, frozenset) or (
        isinstance(container, type) and container.__module__ == "collections.abc"
        and container.__name__ in ("Sequence", "MutableSequence", "Iterable", "Set")
    ):
        schema = {"type": "array"}
        if container is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
            schema["prefixItems"] = [_schema(a) for a in args]
            schema["minItems"] = schema["maxItems"] = len(args)
        elif args:
            schema["items"] = _schema(args[0])
        if container in (set, frozenset):
            schema["uniqueItems"] = True
        return schema
    if container is dict or (
        isinstance(container, type) and container.__module__ == "collections.abc"
        and container.__name__ in ("Mapping", "MutableMapping")
    ):
        schema = {"type": "object"}
        if len(args) == 2 and args[1] is not typing.Any:
            schema["additionalProperties"] = _schema(args[1])
        return schema
    return {}


def _enum_schema(values):
    schema = {"enum": values}
    kinds = {_SIMPLE.get(type(v)) for v in values}
    if len(kinds) == 1 and None not in kinds:
        schema = {"type": kinds.pop(), "enum": values}
    return schema


def _parse_docstring(doc):
    """(description, {parameter: description}) of a cleaned docstring."""
    lines = doc.splitlines()
    prose = []
    params = {}
    i = 0
    while i < len(lines):
        stripped = lines[i].strip()
        numpy_header = i + 1 < len(lines) and set(lines[i + 1].strip()) == {"-"}
        if _SECTIONS.match(stripped) and (stripped.endswith(":") or numpy_header):
            section = stripped.rstrip(":").strip()
            i += 2 if numpy_header else 1
            body = []
            while i < len(lines):
                line = lines[i]
                nxt = lines[i + 1] if i + 1 < len(lines) else ""
                if line.strip() and not line[:1].isspace() and (
                    _SECTIONS.match(line.strip()) and (
                        line.strip().endswith(":") or set(nxt.strip()) == {"-"}
                    )
                ):
                    break
                body.append(line)
                i += 1
            if section in _PARAM_SECTIONS:
                params.update(
                    _numpy_params(body) if numpy_header else _google_params(body)
                )
            continue
        sphinx = re.match(r"^:param\s+(?:[^:]*\s)?(\w+)\s*:\s*(.*)$", stripped)
        if sphinx:
            params[sphinx.group(1)] = sphinx.group(2).strip()
        elif not stripped.startswith(":"):
            prose.append(stripped)
        i += 1
    paragraphs = []
    current = []
    for line in prose + [""]:
        if line:
            current.append(line)
        elif current:
            paragraphs.append(" ".join(current))
            current = []
    return "\n\n".join(paragraphs), params


def _google_params(body):
    params = {}
    current = None
    indent = None
    for line in body:
        if not line.strip():
            continue
        width = len(line) - len(line.lstrip())
        if indent is None:
            indent = width
        if width <= indent:
            m = re.match(r"^\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$", line.strip())
            if m:
                current = m.group(1)
                params[current] = m.group(2).strip()
                continue
        if current is not None:
            params[current] = (params[current] + " " + line.strip()).strip()
    return params


def _numpy_params(body):
    params = {}
    current = None
    for line in body:
        if not line.strip():
            continue
        if not line[:1].isspace():
            names = line.split(":", 1)[0]
            current = [n.strip() for n in names.split(",") if n.strip()]
            for n in current:
                params[n] = ""
        elif current:
            for n in current:
                params[n] = (params[n] + " " + line.strip()).strip()
    return params


# --- calling -------------------------------------------------------------------------


def call_function(fn, name, token, arguments_json, context_json):
    if not callable(fn):
        _store(token, {"invalid": f"The function `{name}` is no longer defined in the session"})
        return
    kwargs = json.loads(arguments_json)
    if not isinstance(kwargs, dict):
        _store(token, {"invalid": "The arguments must be a JSON object"})
        return
    context = None
    if context_json is not None:
        if CONTEXT_PARAMETER in kwargs:
            _store(token, {"invalid": f"`{CONTEXT_PARAMETER}` is given by the kernel, not as an argument"})
            return
        given = json.loads(context_json)
        context = Context(
            given.get("state") or {}, CONTEXT_PARAMETER,
            function_call_id=given.get("function_call_id"),
        )
        kwargs = dict(kwargs, **{CONTEXT_PARAMETER: context})
    try:
        inspect.signature(fn).bind(**kwargs)
    except TypeError as e:
        _store(token, {"invalid": str(e)})
        return
    except ValueError:
        pass
    try:
        value = fn(**_enum_arguments(fn, kwargs))
    except Exception as e:
        # Reported here rather than raised through the block, so the traceback starts at
        # the function, not at this call; interrupts (BaseException) still end the block.
        _store(token, {"raised": _describe_exception(e.with_traceback(e.__traceback__.tb_next))})
        return
    returned = {"value": to_json(value)}
    if context is not None:
        try:
            returned.update(context._effects())
        except _InvalidStep as e:
            _store(token, {"raised": {"type": "TypeError", "message": str(e), "traceback": ""}})
            return
    _store(token, {"returned": returned})


def _context_parameter(fn, kind):
    """The name of `fn`'s context parameter for `kind`, if it takes one."""
    wanted = CONTEXT_PARAMETERS.get(kind)
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return None
    return wanted if wanted in parameters else None


def _misnamed_context(fn, name, kind):
    """Why `fn` cannot be called as a `kind`: it takes another kind's context parameter."""
    wanted = CONTEXT_PARAMETERS[kind]
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return None
    # A callback's `ctx` is the one dict of the form documented first, not a misnamed context.
    others = [n for n in CONTEXT_PARAMETERS.values() if n != wanted and (kind, n) != ("callback", "ctx")]
    for other in others:
        if other in parameters and wanted not in parameters:
            return (
                f"`{name}` takes `{other}`, but a {kind} gets its context as `{wanted}`: write "
                f"`def {name}({wanted}, ...)` and use `{wanted}.state` and `{wanted}.actions`"
            )
    return None


def call_flow(fn, name, kind, token, arg_json, kwargs_json, sync_json=None):
    if not callable(fn):
        _store(token, {"invalid": f"The function `{name}` is no longer defined in the session"})
        return
    arg = json.loads(arg_json)
    kwargs = json.loads(kwargs_json)
    kept = None
    if sync_json is not None:
        kept = _synced(json.loads(sync_json))
        if kept is None:
            _store(token, "stale")
            return
        # A step and a state function get the state as their argument; a callback, in `ctx`.
        if kind == "callback":
            arg["state"] = kept
        else:
            arg = kept
    if kind in CONTEXT_PARAMETERS:
        misnamed = _misnamed_context(fn, name, kind)
        if misnamed is not None:
            _store(token, {"invalid": misnamed})
            return
    param = _context_parameter(fn, kind)
    if param is not None and param in kwargs:
        _store(token, {"invalid": f"`{param}` is given by the kernel, not as an argument"})
        return
    try:
        if kind == "step" and param is not None:
            context = Context(arg, param)
            value = fn(**{param: context}, **kwargs)
            if value is not None and not isinstance(value, str):
                _store(token, {"invalid": (
                    f"`{name}` takes `{param}` and returned {_kind_of(value)}: such a step writes "
                    f"the state through `{param}.state` and returns its message (a str) or None"
                )})
                return
            returned = {"value": value, "arg": None}
            returned.update(context._effects())
        elif kind == "step":
            returned = _dict_step(name, fn(_own(arg, kept), **kwargs))
        elif kind == "callback" and param is not None:
            about = {k: v for k, v in arg.items() if k not in ("state", "actions")}
            context = Context(arg.get("state") or {}, param, **about)
            value = fn(**{param: context}, **kwargs)
            returned = {"value": to_json(value), "arg": to_json(context._about)}
            returned.update(context._effects())
        elif kind == "callback":
            before = arg.get("state") or {}
            arg["state"] = _copy(before)
            value = fn(arg, **kwargs)
            state = arg.get("state")
            state = state if isinstance(state, dict) else before
            taken = arg.get("actions") if isinstance(arg.get("actions"), dict) else {}
            returned = {
                "value": to_json(value),
                # What the kernel reads back (`request`, `tool`); the state comes back as writes.
                "arg": to_json({k: v for k, v in arg.items() if k != "state"}),
                "writes": _writes(before, state, (), [k for k in before if k not in state]),
                "actions": {n: taken.get(n) is True for n in ACTION_NAMES},
            }
        else:
            returned = {"value": to_json(fn(_own(arg, kept), **kwargs)), "arg": None}
    except _InvalidStep as e:
        _store(token, {"invalid": str(e)})
        return
    except Exception as e:
        _store(token, {"raised": _describe_exception(e.with_traceback(e.__traceback__.tb_next))})
        return
    _store(token, {"returned": returned})


class _InvalidStep(Exception):
    pass


def _own(arg, kept):
    """The state as a function taking a dict gets it: a copy of the kept state (which it may
    change as it likes), or the argument itself when it was sent whole."""
    return _copy(kept) if kept is not None else arg


def _kind_of(value):
    if value is None:
        return "None"
    names = {bool: "a bool", int: "a number", float: "a number", str: "a str", list: "a list",
             tuple: "a list", dict: "a dict"}
    return names.get(type(value), f"a `{type(value).__name__}`")


def _dict_step(name, out):
    """What a step that takes the state as a dict reported: its dict of updates."""
    if out is None:
        out = {}
    if not isinstance(out, dict):
        raise _InvalidStep(
            f"Python step `{name}` returned {_kind_of(out)}, not a dict of state updates (or `None`)"
        )
    updates, actions, message = {}, {n: False for n in ACTION_NAMES}, None
    for key, value in out.items():
        if key == ACTIONS_KEY:
            names = [value] if isinstance(value, str) else value
            if not isinstance(names, (list, tuple)):
                raise _InvalidStep(
                    f"`{ACTIONS_KEY}` must list actions (`exit_loop`, `end_turn`, `escalate`), "
                    f"not {_kind_of(value)}"
                )
            for action in names:
                if action not in ACTION_NAMES:
                    raise _InvalidStep(
                        f"`{action}` in `{ACTIONS_KEY}` is not an action; expected `exit_loop`, "
                        "`end_turn` or `escalate`"
                    )
                actions[action] = True
        elif key == MESSAGE_KEY:
            if not isinstance(value, str):
                raise _InvalidStep(f"`{MESSAGE_KEY}` must be a str, not {_kind_of(value)}")
            message = value
        else:
            updates[str(key)] = value
    return {"value": message, "arg": None, "writes": _writes({}, updates, updates, ()),
            "actions": actions}


def _writes(before, values, written, deleted):
    """The writes that turn `before` into `values` where the function read or wrote keys
    (`values`), deleted keys (`deleted`, each in `before`) and wrote keys (`written`, which
    count as written even if unchanged): a deleted key is a delete, a list that only grew at
    its end an append of the new items, any other change a replace. Only what is written
    goes through JSON: a list that grew by one item costs that item, not the list."""
    missing = object()
    writes = [{"op": "delete", "key": key} for key in deleted]
    for key, value in values.items():
        old = before.get(key, missing)
        if key not in written and old == value:
            continue
        if _grew(old, value):
            items = _json_value(key, value[len(old):])
            writes.append({"op": "append", "key": str(key), "items": items})
            continue
        # Tuples and the like become what JSON gives back, then are compared again.
        value = _json_value(key, value)
        if _grew(old, value):
            writes.append({"op": "append", "key": str(key), "items": value[len(old):]})
        else:
            writes.append({"op": "replace", "key": str(key), "value": value})
    return writes


def _grew(old, value):
    """Whether list `value` is list `old` with items added at its end."""
    return isinstance(old, list) and isinstance(value, list) and len(value) > len(old) \
        and value[:len(old)] == old


def _json_value(key, value):
    """`value` as JSON gives it back (tuples become lists, ...), or why it has no JSON form."""
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as e:
        raise _InvalidStep(
            f"State key `{key}` holds a value that is not JSON ({e}); state values are "
            "str, numbers, bools, None, and lists and dicts of them"
        ) from None


class State(collections.abc.MutableMapping):
    """The workflow's state as a Python function sees it: a mapping of JSON values.

    Reads see the state as the call started; writes and deletes are visible at once to the
    function and become the call's writes, applied before the next step runs. A value
    changed in place (`state["seen"].append(x)`) counts as written.

    The state it starts from is never changed: a key is copied when the function first
    reads it, and only the keys it read or wrote are compared at the end, so a call costs
    what it touches, not the size of the whole state.
    """

    __slots__ = ("_kept", "_values", "_gone", "_written")

    def __init__(self, kept):
        self._kept = kept
        self._values = {}
        self._gone = set()
        self._written = set()

    def __getitem__(self, key):
        values = self._values
        if key in values:
            return values[key]
        if key in self._gone:
            raise KeyError(key)
        value = values[key] = _copy(self._kept[key])
        return value

    def __setitem__(self, key, value):
        if not isinstance(key, str):
            raise TypeError(f"State keys are strings, not `{type(key).__name__}`")
        self._values[key] = value
        self._gone.discard(key)
        self._written.add(key)

    def __delitem__(self, key):
        if key in self._values:
            del self._values[key]
        elif key in self._gone or key not in self._kept:
            raise KeyError(key)
        if key in self._kept:
            self._gone.add(key)
        self._written.discard(key)

    def __contains__(self, key):
        return key in self._values or (key not in self._gone and key in self._kept)

    def __iter__(self):
        kept = [k for k in self._kept if k not in self._gone]
        return iter(kept + [k for k in self._values if k not in self._kept])

    def __len__(self):
        return sum(1 for _ in self)

    def __repr__(self):
        return f"State({self.to_dict()!r})"

    def to_dict(self):
        """A copy of the state as a plain dict."""
        return {key: self[key] for key in self}

    def _writes(self):
        deleted = [key for key in self._kept if key in self._gone]
        return _writes(self._kept, self._values, self._written, deleted)


class Actions:
    """The actions a function may take, by setting them to `True`.

    `exit_loop` ends the nearest enclosing loop, `end_turn` ends the calling agent's turn (no
    further model call; ADK calls it `skip_summarization`), `escalate` stops the whole run.
    ADK code that ends a loop with `escalate` sets `exit_loop` here.
    """

    __slots__ = (*ACTION_NAMES, "_owner")

    def __init__(self, owner="context"):
        for name in ACTION_NAMES:
            object.__setattr__(self, name, False)
        object.__setattr__(self, "_owner", owner)

    @property
    def skip_summarization(self):
        return self.end_turn

    @skip_summarization.setter
    def skip_summarization(self, value):
        self.end_turn = value

    def __setattr__(self, name, value):
        if name not in ACTION_NAMES and name != "skip_summarization":
            raise AttributeError(
                f"`{self._owner}.actions.{name}` is not an action here; a function may set "
                "`exit_loop` (ends the nearest loop), `end_turn` (ADK's `skip_summarization`) "
                "and `escalate` (stops the whole run); there is no agent transfer (a "
                "`RouterAgent` picks the next agent)"
            )
        object.__setattr__(self, name, value)

    def __repr__(self):
        taken = ", ".join(f"{n}=True" for n in ACTION_NAMES if getattr(self, n))
        return f"Actions({taken})"

    def _taken(self):
        return {name: getattr(self, name) is True for name in ACTION_NAMES}


class Context:
    """What a Python function of a workflow gets, as in Google ADK: `state` and `actions`,
    and what its call is about (a tool's `function_call_id`; a callback's `point`, `agent`,
    `branch`, `args` and its point's `request`, `response`, `tool`, `result` or `error`)."""

    __slots__ = ("state", "actions", "_about")

    def __init__(self, state, name, **about):
        object.__setattr__(self, "state", State(state))
        object.__setattr__(self, "actions", Actions(name))
        object.__setattr__(self, "_about", about)

    def __getattr__(self, name):
        about = object.__getattribute__(self, "_about")
        if name in about:
            return about[name]
        has = ", ".join(f"`{n}`" for n in ("state", "actions", *about))
        raise AttributeError(f"`{name}` is not available here; this context has {has}")

    def __setattr__(self, name, value):
        about = object.__getattribute__(self, "_about")
        if name not in about:
            raise AttributeError(f"`{name}` cannot be set on the context; write state as `state[...]`")
        about[name] = value

    def __getitem__(self, key):
        raise TypeError(
            f"The context is not a dict: read and write the state as `.state[{key!r}]` and set "
            "actions as `.actions.exit_loop = True`"
        )

    def _effects(self):
        return {"writes": self.state._writes(), "actions": self.actions._taken()}


def _describe_exception(e):
    kernel = sys.modules.get("_rlm_kernel")
    if kernel is not None:
        type_name, message, text, _line = kernel.describe_exception(e, None)
    else:
        type_name, message = type(e).__name__, str(e)
        text = "".join(traceback.format_exception(e))
    return {"type": type_name, "message": message, "traceback": text}


def to_json(value, depth=0):
    """A JSON-compatible copy of `value`; what has no JSON form becomes its `repr`."""
    if depth > 64:
        return repr(value)
    if isinstance(value, enum.Enum):
        return to_json(value.value, depth + 1)
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, dict):
        return {str(k): to_json(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_json(v, depth + 1) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_json(dataclasses.asdict(value), depth + 1)
    for method in ("model_dump", "to_dict", "tolist"):
        convert = getattr(value, method, None)
        if callable(convert) and not isinstance(value, type):
            try:
                return to_json(convert(), depth + 1)
            except Exception:
                break
    return repr(value)
