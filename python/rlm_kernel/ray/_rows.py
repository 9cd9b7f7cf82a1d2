"""One row, one completion: how a row names its query, context and name, and the result row
it becomes, and the summary of a job's result rows. No Ray here: the actors of `_cluster` and
the serial path run rows through `RowRunner` alike, so both give the same result for the same
row, and end a list's job the same way (`finish_job`): its summary (`job_summary`: the rows
that failed, those whose sub-calls failed, the gate's counts) warned of (`warn_summary`) and
handed back with the rows (`JobResults`).

Why a list with a `summary` attribute: the rows stay a `list` for every caller that takes one
(indexing, `len`, `==`, `json.dumps`, pickling), and the counts travel with the rows they
count, as a pandas frame carries its `attrs`. A second return value behind a keyword would
make the result's shape depend on an argument, and a function returning the last job's
summary would be state shared by every job of the process.
"""

from __future__ import annotations

import logging
import os
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Union

from .._api import RLM
from ._limits import retries_of

#: How a row gives a value: the name of one of its fields, or a function of the row.
Field = Union[str, Callable[[Any], Any]]

#: The columns of every result row; `trajectory_jsonl` joins them with `trajectory_text=True`.
RESULT_COLUMNS = (
    "answer",
    "termination_reason",
    "error",
    "metrics",
    "cost_usd",
    "trajectory",
    "node",
)

#: Characters of a failure's traceback kept in a result row (its head and tail).
_TRACEBACK_CHARS = 4_000

#: How many rows of each kind (failed, with failed sub-calls) a job's summary names (the
#: first, by position).
NAMED_ROWS = 10

_log = logging.getLogger("rlm_kernel.ray")


class RowError(Exception):
    """A row that cannot be read as a query and a context (a field missing, a wrong type)."""


def read_field(row: Any, field: Field, what: str) -> Any:
    """The value `field` names in `row`: a key of a mapping, or what the function returns."""
    if callable(field):
        return field(row)
    if not isinstance(row, Mapping):
        raise RowError(
            f"The row is a `{type(row).__name__}`, not a mapping, so it has no field "
            f"`{field}` for the {what}; pass `{what}=` a function of the row, e.g. "
            f"`{what}=lambda row: row`"
        )
    if field not in row:
        known = ", ".join(f"`{k}`" for k in list(row)[:12])
        raise RowError(
            f"The row has no field `{field}` for the {what} (it has {known or 'none'}); "
            f"pass `{what}=` the field's name or a function of the row"
        )
    return row[field]


def check_fields(rows: List[Any], fields: Mapping[str, Optional[Field]]) -> None:
    """Refuses, before anything runs, a list whose rows lack a named field (functions are
    called where the row runs, not here)."""
    for what, field in fields.items():
        if field is None or callable(field):
            continue
        for index, row in enumerate(rows):
            try:
                read_field(row, field, what)
            except RowError as error:
                raise ValueError(f"Row {index}: {error}") from None


def _plain(value: Any) -> Any:
    """A scalar of a Ray Dataset row (numpy) as the Python value it stands for."""
    item = getattr(value, "item", None)
    if item is not None and getattr(value, "shape", None) == ():
        return item()
    return value


def _name_of(value: Any) -> str:
    """A row's name as a file name: its own characters where they are safe, else refused."""
    name = str(_plain(value))
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise RowError(
            f"The row's name {name!r} cannot name a trajectory file; names are used as "
            "`NAME.jsonl` and may not be empty or hold `/`"
        )
    return name


class RowRunner:
    """Runs rows: the query and context each names, through one `RLM` per row (so that
    `max_sub_calls`, `max_tokens` and `max_usd` hold for each row), into result rows.

    `options` are the effective RLM options, resolved once where the job started;
    `trajectories` is the folder each row's trajectory goes to (`NAME.jsonl`), if any;
    `base_dir` is the folder a relative `Path` context is relative to (where the job
    started: a Ray worker's own working folder is another one). `run(row, width=N)` runs
    the row with a batch width of `N` (its share of the cluster's, see `_limits`);
    `last_retries` is then how many of its calls' attempts were retries.
    """

    def __init__(
        self,
        options: Mapping[str, Any],
        query: Field,
        context: Optional[Field],
        name: Optional[Field],
        trajectories: Optional[str],
        trajectory_text: bool,
        base_dir: str,
        node: Optional[str] = None,
    ):
        self.options = dict(options)
        self.query = query
        self.context = context
        self.name = name
        self.trajectories = trajectories
        self.trajectory_text = trajectory_text
        self.base_dir = base_dir
        self.node = node
        self.last_retries = 0

    @staticmethod
    def result_columns(trajectory_text: bool) -> Tuple[str, ...]:
        """The columns of a result row."""
        return RESULT_COLUMNS + (("trajectory_jsonl",) if trajectory_text else ())

    def row_name(self, row: Any, index: Optional[int]) -> str:
        """The name of the row's trajectory: its `name` field, else its position in the
        list, else (a Dataset row with no name) a random one, shown in the result."""
        if self.name is not None:
            return _name_of(read_field(row, self.name, "name"))
        if index is not None:
            return f"{index:06d}"
        return f"row-{os.urandom(8).hex()}"

    def rlm(self, **extra: Any) -> RLM:
        """A fresh `RLM` for one row: its own budget ledger."""
        return RLM(**dict(self.options, **extra))

    def run(
        self, row: Any, index: Optional[int] = None, width: Optional[int] = None
    ) -> Dict[str, Any]:
        """The result row of `row`; a failure is a row with its `error`, never an exception."""
        result: Dict[str, Any] = dict.fromkeys(self.result_columns(self.trajectory_text))
        result["node"] = self.node
        self.last_retries = 0
        try:
            name = self.row_name(row, index)
            extra: Dict[str, Any] = {}
            if width is not None:
                extra["batch_concurrency"] = width
            if self.trajectories is not None:
                extra["trajectory"] = result["trajectory"] = os.path.join(
                    self.trajectories, f"{name}.jsonl"
                )
            query = _plain(read_field(row, self.query, "query"))
            if not isinstance(query, str):
                raise RowError(f"The query must be a `str`, not `{type(query).__name__}`")
            args = {}
            if self.context is not None:
                args["context"] = self._context(read_field(row, self.context, "context"))
            outcome = self.rlm(**extra).completion(query, **args)
        except Exception as error:  # noqa: BLE001 - a row's failure is its result
            result["error"] = _describe(error)
            return result
        self.last_retries = retries_of(outcome.to_dict())
        result["answer"] = outcome.answer
        result["termination_reason"] = outcome.termination_reason
        result["error"] = outcome.error
        result["metrics"] = outcome.metrics
        result["cost_usd"] = outcome.metrics.get("cost_usd")  # None without a price
        if self.trajectory_text:
            result["trajectory_jsonl"] = outcome.trajectory_jsonl
        return result

    def _context(self, value: Any) -> Any:
        """A row's context as `RLM.completion` takes it: a `Path` loads a file (a relative
        one from `base_dir`), anything else is a live object (a Dataset's text comes as
        `str`, its numbers as numpy scalars)."""
        if isinstance(value, os.PathLike):
            return Path(self.base_dir, os.fspath(value))
        return _plain(value)


def job_summary(
    results: List[Dict[str, Any]], gate: Optional[Dict[str, Any]] = None
) -> Dict[str, Any]:
    """The counts of a list's job from its result rows (in input order) and, on a cluster,
    its gate's (`_limits.Width.stats`; None when the gate could not be reached): `rows`;
    `rows_failed`, the rows that failed outright (their `error` is not None: the row could
    not be read, its run raised or stopped on a budget), of which `failed_rows` are the first
    `NAMED_ROWS` positions; and `rows_failed_sub_calls`, the rows with a sub-call that failed
    (`metrics["sub_call_errors"] > 0`: their code got an error string instead of an answer, so
    their answer may be wrong while their `error` is None), of which `failed_sub_call_rows`
    are the first `NAMED_ROWS` positions. The gate's are `rows_retried` (rows with a call
    retried: 429s, server errors, timeouts), `retries`, `pauses`, `width` (at the end),
    `lowest_width`, `ceiling` and `actors`."""
    failed = [index for index, result in enumerate(results) if result.get("error") is not None]
    failed_sub_calls = [
        index
        for index, result in enumerate(results)
        if (result.get("metrics") or {}).get("sub_call_errors")
    ]
    return dict(
        gate or {},
        rows=len(results),
        rows_failed=len(failed),
        failed_rows=failed[:NAMED_ROWS],
        rows_failed_sub_calls=len(failed_sub_calls),
        failed_sub_call_rows=failed_sub_calls[:NAMED_ROWS],
    )


class JobResults(list):
    """A list job's result rows, in input order, and its `summary` (see `job_summary`): a
    `list` in every other way. A slice or a copy by `list(...)` is a plain list."""

    summary: Dict[str, Any]

    def __init__(self, rows: List[Dict[str, Any]], summary: Dict[str, Any]):
        super().__init__(rows)
        self.summary = summary


def finish_job(
    results: List[Dict[str, Any]], gate: Optional[Dict[str, Any]] = None
) -> JobResults:
    """The end of a list's job: its summary, warned of and returned with its rows."""
    summary = job_summary(results, gate)
    warn_summary(summary)
    return JobResults(results, summary)


#: The kinds of rows a summary names, as `warn_summary` says them: the count's key, the
#: named positions' key, what such a row did, and what tells more of each.
_NAMED_KINDS = (
    ("rows_failed", "failed_rows", "failed", "each row's `error` says why"),
    (
        "rows_failed_sub_calls",
        "failed_sub_call_rows",
        "had sub-calls that failed (their code got an error string instead of an answer, so "
        "their answer may be wrong even without an `error`)",
        '`metrics["sub_call_errors"]` counts each row\'s',
    ),
)


def warn_summary(summary: Mapping[str, Any]) -> None:
    """Warns (logger `rlm_kernel.ray`) of what a job's `summary` holds that the user should
    know: rows whose calls were retried, rows that failed, and rows whose sub-calls failed,
    named."""
    if summary.get("rows_retried"):
        _log.warning(
            "%d of %d rows had calls retried (429s, server errors, timeouts): the job's width "
            "went down to %d (of %d) and new rows paused %d time(s)",
            summary["rows_retried"],
            summary["rows"],
            summary["lowest_width"],
            summary["ceiling"],
            summary["pauses"],
        )
    for count_key, rows_key, did, more_of_each in _NAMED_KINDS:
        count = summary[count_key]
        if not count:
            continue
        named = summary[rows_key]
        more = f" and {count - len(named)} more" if count > len(named) else ""
        _log.warning(
            "%d of %d rows %s: rows %s%s; %s",
            count,
            summary["rows"],
            did,
            ", ".join(map(str, named)),
            more,
            more_of_each,
        )


def _describe(error: BaseException) -> str:
    """`Type: message`, and for a bug-like failure (not ours) the traceback's tail."""
    text = f"{type(error).__name__}: {error}"
    if isinstance(error, (RowError, TypeError, ValueError, RuntimeError, OSError)):
        return text
    trace = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    if len(trace) > _TRACEBACK_CHARS:
        half = _TRACEBACK_CHARS // 2
        trace = f"{trace[:half]}\n[...]\n{trace[-half:]}"
    return f"{text}\n{trace}"


