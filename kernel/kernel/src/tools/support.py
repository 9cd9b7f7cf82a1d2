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
- `call_function(fn, name, token, arguments_json, context_json)`: calls a function with
  keyword arguments; the return value becomes JSON (falling back to `repr`). Arguments that
  do not fit the signature are reported, not raised; so is an exception of the function,
  with a traceback that starts at the function. Interrupts (time limit, cancellation) end
  the block.

A description is `{"name", "description", "parameters", "takes_context", "takes_any"}`,
with a JSON Schema derived from the signature (type hints: str, int, float, bool,
list/tuple/set, dict, Optional/Union, Literal, Enum, Annotated; a parameter with a default
is not required) and the docstring (the prose before the first section is the description;
Google `Args:`, NumPy `Parameters`, and Sphinx `:param x:` entries describe the parameters).

A parameter named `tool_context` (Google ADK's name) is not part of the schema: the call
passes a `ToolContext` there, whose `state` reads the workflow's state as the call starts
and records writes (the call's state delta), and whose `actions` the function may set
(`exit_loop`, `end_turn` or its ADK name `skip_summarization`, `escalate`). The delta and
actions go back with the return value; an exception discards them.
"""

import ast
import collections.abc
import dataclasses
import enum
import inspect
import json
import math
import re
import sys
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
# The parameter that receives the `ToolContext`, as in Google ADK.
CONTEXT_PARAMETER = "tool_context"


class ToolDefinitionError(Exception):
    """A function cannot be offered as a tool; the message says why."""


def _store(token, value):
    results[token] = json.dumps(value, ensure_ascii=False)


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
        context = ToolContext(json.loads(context_json))
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
        returned["state"] = context.state._delta()
        returned["actions"] = context.actions._taken()
    _store(token, {"returned": returned})


class ToolState(collections.abc.MutableMapping):
    """The workflow's state as a tool sees it: a mapping of JSON values.

    Reads see the state as the call started; writes are visible at once to the function and
    become the call's state delta, applied before the next tool runs. A value changed in
    place (`state["seen"].append(x)`) counts as written.
    """

    __slots__ = ("_values", "_before", "_written")

    def __init__(self, values, before):
        self._values = values
        self._before = before
        self._written = set()

    def __getitem__(self, key):
        return self._values[key]

    def __setitem__(self, key, value):
        if not isinstance(key, str):
            raise TypeError(f"State keys are strings, not `{type(key).__name__}`")
        self._values[key] = value
        self._written.add(key)

    def __delitem__(self, key):
        raise TypeError(f"State key `{key}` cannot be deleted; set it to `None` instead")

    def __iter__(self):
        return iter(self._values)

    def __len__(self):
        return len(self._values)

    def __repr__(self):
        return f"ToolState({self._values!r})"

    def to_dict(self):
        """A copy of the state as a plain dict."""
        return dict(self._values)

    def _delta(self):
        missing = object()
        return [
            [key, to_json(value)]
            for key, value in self._values.items()
            if key in self._written or self._before.get(key, missing) != value
        ]


class ToolActions:
    """The actions a tool may take, by setting them to `True`.

    `exit_loop` ends the nearest enclosing loop, `end_turn` ends the calling agent's turn (no
    further model call; ADK calls it `skip_summarization`), `escalate` stops the whole run.
    ADK code that ends a loop with `escalate` sets `exit_loop` here.
    """

    __slots__ = ("exit_loop", "end_turn", "escalate")

    def __init__(self):
        for name in self.__slots__:
            object.__setattr__(self, name, False)

    @property
    def skip_summarization(self):
        return self.end_turn

    @skip_summarization.setter
    def skip_summarization(self, value):
        self.end_turn = value

    def __setattr__(self, name, value):
        if name not in self.__slots__ and name != "skip_summarization":
            raise AttributeError(
                f"`tool_context.actions.{name}` is not an action here; a tool may set "
                "`exit_loop` (ends the nearest loop), `end_turn` (ADK's `skip_summarization`) "
                "and `escalate` (stops the whole run); there is no agent transfer "
                "(a `RouterAgent` picks the next agent)"
            )
        object.__setattr__(self, name, value)

    def __repr__(self):
        taken = ", ".join(f"{n}=True" for n in self.__slots__ if getattr(self, n))
        return f"ToolActions({taken})"

    def _taken(self):
        return {name: bool(getattr(self, name)) for name in self.__slots__}


class ToolContext:
    """What a tool's `tool_context` parameter receives: `state`, `actions` and
    `function_call_id`, as in Google ADK."""

    __slots__ = ("state", "actions", "function_call_id")

    def __init__(self, context):
        state = context.get("state") or {}
        self.state = ToolState(state, json.loads(json.dumps(state)))
        self.actions = ToolActions()
        self.function_call_id = context.get("function_call_id")

    def __getattr__(self, name):
        raise AttributeError(
            f"`tool_context.{name}` is not available here; a tool context has `state`, "
            "`actions` and `function_call_id`"
        )


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
