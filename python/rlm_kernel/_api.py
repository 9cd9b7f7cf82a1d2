"""The plain Python API: `RLM(...).completion(query, context=obj)`, `llm_query`,
`llm_query_batched`, the result object, `render_trajectory` and `configure`."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections import OrderedDict
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence

from . import _config, _native

_MISSING = object()

#: The clients of the module-level `llm_query` / `llm_query_batched`, one per set of
#: effective options (keywords, session defaults, `RLM_*`, `rlm.toml`) and API keys, the most
#: recently used last: repeated calls share connections, the concurrency limit and one budget
#: ledger instead of building new ones per call.
_SHARED: "OrderedDict[str, Any]" = OrderedDict()
_SHARED_LOCK = threading.Lock()
#: How many option sets keep a client (a sweep over many settings drops the oldest).
_SHARED_MAX = 16


class RLMResult:
    """The outcome of one RLM run.

    `answer` (the final or best partial answer, or None), `termination_reason`
    (`final_answer`, `max_iterations`, `timeout`, `interrupted`, ...), `metrics` (iterations,
    sub-calls, tokens, cost, timings), `trajectory` (one dict per iteration: the model's reply,
    each block's code and output, its sub-calls), `error`, and the trajectory as JSONL in
    `trajectory_jsonl`. In a notebook it renders as the answer (`text/plain`), the trajectory
    view (`text/html`) and the metrics (`application/json`).
    """

    def __init__(self, data: Dict[str, Any], trajectory_jsonl: str):
        self._data = data
        self.answer: Optional[str] = data.get("answer")
        self.answer_kind: Optional[str] = data.get("answer_kind")
        self.termination_reason: str = data.get("termination_reason", "unknown")
        self.error: Optional[str] = data.get("error")
        self.metrics: Dict[str, Any] = data.get("metrics", {})
        self.trajectory: List[Dict[str, Any]] = data.get("iterations", [])
        self.sub_calls: List[Dict[str, Any]] = data.get("sub_calls", [])
        self.contexts: List[Dict[str, Any]] = data.get("contexts", [])
        self.trajectory_jsonl = trajectory_jsonl

    @property
    def succeeded(self) -> bool:
        """Whether the model gave a final answer."""
        return self.termination_reason == "final_answer"

    def to_dict(self) -> Dict[str, Any]:
        """The whole result, as `rlm run --json` prints it."""
        return self._data

    def to_html(self, collapsed: bool = False) -> str:
        """The trajectory view (`rlm view`): a full page, or a collapsed fragment."""
        return _native.render_trajectory(self.trajectory_jsonl, collapsed)

    def save_html(self, path: "os.PathLike[str] | str") -> None:
        """Writes the trajectory view as one self-contained HTML file."""
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.to_html())

    def __str__(self) -> str:
        return self.answer or ""

    def __repr__(self) -> str:
        return (
            f"RLMResult(termination_reason={self.termination_reason!r}, "
            f"iterations={self.metrics.get('iterations')}, answer={self.answer!r})"
        )

    def _repr_mimebundle_(self, include=None, exclude=None):
        text = self.answer if self.answer is not None else f"(no answer: {self.termination_reason})"
        return {
            "text/plain": text,
            "text/html": self.to_html(collapsed=True),
            "application/json": self.metrics,
        }


def _contexts(context: Any, contexts: Optional[Sequence[Any]], labels: Optional[Sequence[str]]):
    values: List[Any] = []
    if context is not _MISSING:
        values.append(context)
    if contexts is not None:
        if isinstance(contexts, (str, bytes)) or not isinstance(contexts, (list, tuple)):
            raise TypeError("`contexts` takes a list of contexts; pass one object as `context=`")
        values.extend(contexts)
    if labels is not None and len(labels) != len(values):
        raise ValueError(f"{len(labels)} label(s) for {len(values)} context(s)")
    args = []
    for i, value in enumerate(values):
        if isinstance(value, os.PathLike):
            args.append((os.fspath(value),))
        else:
            label = labels[i] if labels is not None else f"context_{i}"
            args.append((value, label))
    return args


def _interrupted(exc: BaseException, result: RLMResult) -> BaseException:
    exc.result = result  # type: ignore[attr-defined]
    exc.partial_answer = result.answer  # type: ignore[attr-defined]
    if isinstance(exc, KeyboardInterrupt) and not exc.args:
        exc.args = (
            f"RLM run interrupted after {result.metrics.get('iterations', 0)} iteration(s); "
            f"best partial answer: {result.answer!r} (also in `.result`)",
        )
    return exc


class RLM:
    """A Recursive Language Model: a root model that works on contexts through a Python REPL
    and sub-models.

    Keyword options are the `rlm run` flags with `_` for `-` (`max_iterations=10`,
    `cell_timeout=60`, `max_usd=2, price="2:8"`, `isolation="none"`, ...); unset ones come
    from `%rlm_config`, `RLM_*` environment variables and `rlm.toml`, as in the CLI. They are
    resolved when the object is made (a bad one raises here). Its endpoints and budget ledger
    are built on its first call and kept: the budget (`max_sub_calls`, `max_tokens`, `max_usd`) covers every
    completion and direct call this object makes.
    """

    def __init__(
        self,
        model: Optional[str] = None,
        sub_model: Optional[str] = None,
        base_url: Optional[str] = None,
        **options: Any,
    ):
        explicit = dict(options, model=model, sub_model=sub_model, base_url=base_url)
        self._explicit = {k: v for k, v in explicit.items() if v is not None}
        self._client = _native.Client(
            _config.to_json(self._explicit), json.dumps(_config.defaults), "RLM()"
        )

    @property
    def options(self) -> Dict[str, Any]:
        """The effective options (after defaults, environment and rlm.toml)."""
        return json.loads(self._client.options_json())

    def completion(
        self,
        query: str,
        context: Any = _MISSING,
        *,
        contexts: Optional[Sequence[Any]] = None,
        labels: Optional[Sequence[str]] = None,
        on_progress: Optional[Callable[[Dict[str, Any]], None]] = None,
    ) -> RLMResult:
        """Answers `query` over the context(s) and returns an `RLMResult`.

        `context` is a live object (`str`, `bytes`, `dict`, `list`, `polars.DataFrame`,
        `pandas.DataFrame`, an Arrow table; any picklable object), handed once through shared
        memory to the worker process the model's code runs in (`isolation="process"`, the
        default), or bound into the REPL session by reference with `isolation="none"`; or a
        `pathlib.Path` loaded as by the CLI (`encoding`, `csv_sep`, `frames` ... apply).
        Several go in `contexts=[...]` (`context_0 …`). `on_progress(event)` is called on
        this thread as the run advances. Interrupting (Ctrl-C, Jupyter's stop button) stops
        the run within a moment and raises `KeyboardInterrupt` with the partial result in
        `.result` (`None` when it came before the run started, while a context was handed to
        the worker).
        """
        if not isinstance(query, str):
            raise TypeError(f"`query` must be a str, not {type(query).__name__}")
        args = _contexts(context, contexts, labels)
        callback = None
        if on_progress is not None:
            callback = lambda event: on_progress(json.loads(event))  # noqa: E731
        try:
            data, trajectory, interrupt = self._client.completion(query, args, callback)
        except KeyboardInterrupt as exc:
            # Before the run started (a context being handed to the worker): no result.
            exc.result = None  # type: ignore[attr-defined]
            exc.partial_answer = None  # type: ignore[attr-defined]
            raise
        result = RLMResult(json.loads(data), trajectory)
        if interrupt is not None:
            raise _interrupted(interrupt, result)
        return result

    def llm_query(self, prompt: str, model: Optional[str] = None) -> str:
        """One sub-model call (`model` names an endpoint: `sub` by default, or an
        `extra_models` name)."""
        return self._client.llm_query(prompt, model)

    def llm_query_batched(self, prompts: Iterable[str], model: Optional[str] = None) -> List[str]:
        """Many sub-model calls in parallel; answers in input order, `"Error: ..."` for a
        failed one."""
        return self._client.llm_query_batched(list(prompts), model)

    def __repr__(self) -> str:
        return f"RLM({', '.join(f'{k}={v!r}' for k, v in sorted(self._explicit.items()))})"


def _keys_fingerprint(options: Dict[str, Any]) -> str:
    """A digest of the API keys a client would read (its endpoints keep the key they were
    built with), so that a changed key gets a new client."""
    names = sorted(n for n in os.environ if n.endswith("_API_KEY"))
    if options.get("api_key_env"):
        names.append(options["api_key_env"])
    digest = hashlib.sha256()
    for name in names:
        digest.update(f"{name}={os.environ.get(name, '')}\0".encode("utf-8", "surrogatepass"))
    return digest.hexdigest()


def _shared_client(options: Dict[str, Any], where: str) -> Any:
    """The client of the module-level calls for `options`: made (and checked) anew each time,
    which is cheap, but its endpoints and ledger are those of the first call with the same
    effective options."""
    explicit = {k: v for k, v in options.items() if v is not None}
    client = _native.Client(_config.to_json(explicit), json.dumps(_config.defaults), where)
    effective = client.options_json()
    key = effective + "\0" + _keys_fingerprint(json.loads(effective))
    with _SHARED_LOCK:
        kept = _SHARED.get(key)
        if kept is None:
            _SHARED[key] = kept = client
            while len(_SHARED) > _SHARED_MAX:
                _SHARED.popitem(last=False)
        else:
            _SHARED.move_to_end(key)
    return kept


def llm_query(prompt: str, **options: Any) -> str:
    """Asks a model one question directly: `llm_query("...", model="gpt-4.1-mini",
    base_url=...)`. Options as for `RLM` (the sub-model is called: `sub_model`, else `model`).
    Calls with the same effective options share one set of connections and one budget ledger
    for the life of the process (`max_sub_calls=100` caps them all); an `RLM` object has a
    budget of its own."""
    return _shared_client(options, "llm_query()").llm_query(prompt, None)


def llm_query_batched(prompts: Iterable[str], **options: Any) -> List[str]:
    """Asks a model many questions in parallel (`batch_concurrency` at once); answers in
    input order, `"Error: ..."` for a failed one. Shares connections and budget as
    `llm_query` does."""
    return _shared_client(options, "llm_query_batched()").llm_query_batched(list(prompts), None)


def render_trajectory(jsonl: str, collapsed: bool = False) -> str:
    """The HTML view of a trajectory (the JSONL of `rlm run --trajectory`), as `rlm view`
    writes it: one self-contained page, or a collapsed fragment."""
    return _native.render_trajectory(jsonl, collapsed)


def configure(**options: Any) -> None:
    """Sets session defaults for `RLM`, `llm_query` and `%%rlm` (what `%rlm_config` does);
    `None` removes one. Objects already made keep their options."""
    given = _config.checked(options, "configure()")
    for name, value in options.items():
        if value is None:
            _config.defaults.pop(name, None)
    _config.defaults.update(given)
