"""`%%rlm` and `%rlm_config`: the IPython extension.

    %%rlm [-c VAR ...] [-o OUT] [--model M] [--sub-model S] [--base-url URL] [limits]
    <the query: the cell body, verbatim>

Contexts are variables of the notebook (`-c df`), bound into a fresh REPL namespace by
reference; the model's code cannot rebind the notebook's names. Progress shows live in one
display (created with `display_id=True`, then updated); the result renders as the answer,
the trajectory view and the metrics, and `-o ans` stores it in the notebook's namespace.
"""

from __future__ import annotations

import argparse
import html
import shlex
from typing import Any, Dict, List, Optional

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class, no_var_expand
from IPython.display import display

from . import _config
from ._api import RLM

# Most characters of the last code block shown in the progress display.
_CODE_PREVIEW_CHARS = 1_500


class _ArgumentError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse would exit the kernel
        raise _ArgumentError(message)


def _option_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per option of the kernel's schema, as `rlm run` spells it; values are
    passed on as text and checked by the kernel."""
    for spec in _config.SPECS:
        flag = "--" + spec["flag"]
        if spec["repeated"]:
            parser.add_argument(flag, dest=spec["name"], action="append", metavar="VALUE")
        elif spec["kind"] == "switch":
            parser.add_argument(flag, dest=spec["name"], nargs="?", const="true", metavar="BOOL")
        else:
            parser.add_argument(flag, dest=spec["name"], metavar=spec["name"].upper())


def _rlm_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="%%rlm", add_help=False)
    parser.add_argument("-c", "--context", dest="contexts", nargs="+", action="extend", default=[])
    parser.add_argument("-o", "--out", dest="out")
    _option_flags(parser)
    return parser


def _config_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="%rlm_config", add_help=False)
    parser.add_argument("--reset", action="store_true")
    _option_flags(parser)
    return parser


def _parse(parser: argparse.ArgumentParser, line: str) -> argparse.Namespace:
    try:
        return parser.parse_args(shlex.split(line))
    except (_ArgumentError, ValueError) as e:
        raise UsageError(f"{parser.prog}: {e}") from None


def _given_options(args: argparse.Namespace) -> Dict[str, Any]:
    return {
        spec["name"]: getattr(args, spec["name"])
        for spec in _config.SPECS
        if getattr(args, spec["name"], None) is not None
    }


def _cost(usd: Optional[float]) -> str:
    """A cost as every view shows it: `None` (no price given) is not `$0`."""
    return "no price given" if usd is None else f"${usd:.4f}"


class _ProgressView:
    """What the live display shows: one line of counters and the last code block."""

    def __init__(self, event: Dict[str, Any]):
        self.event = event

    def _line(self) -> str:
        e = self.event
        phase = e.get("phase", {}).get("phase", "")
        return (
            f"RLM · iteration {e.get('iteration', 0)}/{e.get('max_iterations', 0)} · {phase} · "
            f"sub-calls {e.get('sub_calls_done', 0)} done, {e.get('calls_in_flight', 0)} in flight · "
            f"{e.get('tokens', 0):,} tokens · {_cost(e.get('cost_usd'))} · "
            f"{e.get('elapsed_s', 0.0):.1f}s"
        )

    def _code(self) -> Optional[str]:
        code = self.event.get("last_code")
        if code and len(code) > _CODE_PREVIEW_CHARS:
            code = code[:_CODE_PREVIEW_CHARS] + "\n…"
        return code

    def _repr_mimebundle_(self, include=None, exclude=None):
        line, code = self._line(), self._code()
        text = line if not code else f"{line}\nlast code block:\n{code}"
        markup = f"<div class='rlm-progress'><code>{html.escape(line)}</code>"
        if code:
            markup += (
                "<details><summary>last code block</summary>"
                f"<pre>{html.escape(code)}</pre></details>"
            )
        markup += "</div>"
        return {"text/plain": text, "text/html": markup}


class LiveProgress:
    """One display handle, updated from the run's progress events."""

    def __init__(self):
        self.handle = display(_ProgressView({"phase": {"phase": "starting"}}), display_id=True)
        self.updates = 0

    def __call__(self, event: Dict[str, Any]) -> None:
        if self.handle is not None:
            self.handle.update(_ProgressView(event))
            self.updates += 1


@magics_class
class RlmMagics(Magics):
    """`%%rlm` and `%rlm_config`."""

    @no_var_expand
    @cell_magic
    def rlm(self, line: str, cell: str):
        """Answer the cell's text with an RLM over notebook variables.

        %%rlm [-c VAR ...] [-o OUT] [--model M] [--sub-model S] [--base-url URL] [--max-iterations N] ...

        Options are the `rlm run` flags; `%rlm_config` sets defaults for the session.
        """
        args = _parse(_rlm_parser(), line)
        query = cell.strip("\n")
        if not query.strip():
            raise UsageError("%%rlm: the cell body is the query, and it is empty")
        options = _given_options(args)
        namespace = self.shell.user_ns
        contexts: List[Any] = []
        for name in args.contexts:
            if name not in namespace:
                raise UsageError(
                    f"%%rlm: no variable `{name}` in the notebook; `-c` takes names of variables "
                    "holding a str, dict, list, DataFrame or pathlib.Path"
                )
            contexts.append(namespace[name])
        rlm = RLM(**options)
        progress = LiveProgress()
        result = rlm.completion(
            query, contexts=contexts, labels=list(args.contexts), on_progress=progress
        )
        if args.out:
            namespace[args.out] = result
        return result

    @line_magic
    def rlm_config(self, line: str):
        """Set session defaults for `%%rlm` and `RLM(...)`, or show the effective options.

        %rlm_config --model M --base-url URL --max-iterations 10
        %rlm_config --reset
        %rlm_config            (show what a run would use: flags > these > RLM_* > rlm.toml)
        """
        args = _parse(_config_parser(), line)
        given = _config.checked(_given_options(args), "%rlm_config")
        if args.reset:
            _config.defaults.clear()
        _config.defaults.update(given)
        effective = RLM().options
        lines = [f"{name} = {value!r}" for name, value in sorted(effective.items())]
        print("\n".join(lines) if lines else "(no options set)")


def register(ipython) -> None:
    ipython.register_magics(RlmMagics)
