"""RLM completions over many rows on a Ray cluster: `map_completions`.

    import ray
    from rlm_kernel.ray import map_completions

    ray.init(address="auto")              # or "ray://head:10001"; none: a local cluster
    rows = [{"query": "Which errors recur?", "context": Path("/shared/logs/a.log")}, ...]
    results = map_completions(rows, model="gpt-4.1", sub_model="gpt-4.1-mini",
                              trajectories="/shared/runs/job-1")
    results[0]["answer"], results[0]["termination_reason"], results[0]["metrics"]
    results.summary["rows_failed_sub_calls"], results.summary.get("rows_retried")

How it works. The options are resolved once, here, by the package's one option schema
(`RLM(**rlm_options)`: keywords over `configure()` defaults over `RLM_*` over `rlm.toml`),
then shipped to an actor pool (Ray Data's `map` with an `ActorPoolStrategy`): each actor is
a Ray worker process with the kernel loaded, and runs one row at a time as one completion
(`_rows.RowRunner`: a fresh budget per row). Rows travel one per task (`_cluster`), so a
dead actor (a lost node, an OOM kill) loses only its row in progress, which Ray retries on
a restarted actor; every row's result appears once. A row whose run fails is a result row
with its `error`. `batch_concurrency` is the width of the whole job, split among the actors
and narrowed for all of them when a server pushes back (`_limits`). `serial=True` runs the
same rows here, one after another, without Ray. A list's job ends with its summary
(`_rows.job_summary`: the rows whose calls were retried, the gate's counts, the rows that
failed and the rows whose sub-calls failed), warned of and returned as the result's `summary`
(`_rows.JobResults`, a list: why there, see `_rows`). A Dataset's job runs when the Dataset
is consumed, after `map_completions` has returned: nothing ends it here to warn or count at,
and counting would run it. `summarize` counts the same from a materialised result
(`ds.materialize()`, whose rows are held and read back without running anything) and refuses
a lazy one, which it would run again.

`python -m rlm_kernel.ray eval` runs an evaluation job given as JSON (`__main__`, `_eval`):
the seam through which `rlm eval --ray` runs its grid on a cluster.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Union

from .._api import RLM
from ._rows import (
    RESULT_COLUMNS,
    Field,
    JobResults,
    RowRunner,
    check_fields,
    finish_job,
    job_summary,
)

__all__ = ["map_completions", "summarize", "JobResults", "RESULT_COLUMNS"]


def map_completions(
    items: Any,
    *,
    query: Field = "query",
    context: Optional[Field] = "context",
    name: Optional[Field] = None,
    trajectories: Union[str, "os.PathLike[str]", None] = None,
    trajectory_text: bool = False,
    actors: Optional[int] = None,
    num_cpus: float = 1.0,
    ray_remote_args: Optional[Dict[str, Any]] = None,
    serial: bool = False,
    **rlm_options: Any,
) -> Union[JobResults, Any]:
    """Runs one RLM completion per row of `items` on a Ray actor pool.

    `items` is a list of rows (dicts, or anything `query` and `context` can read) or a
    `ray.data.Dataset`. `query` and `context` name each row's field (default `"query"`
    and `"context"`) or are functions of the row; a context is a `pathlib.Path` (loaded
    as `rlm run --context` loads a file; relative to this folder), a `str`, a dict or
    list, or a polars or pandas frame; `context=None` runs with none. `name` gives each
    row's name (a field or a function; default: its position in the list), and with
    `trajectories=FOLDER` each row's trajectory is written to `FOLDER/NAME.jsonl` (the
    folder must be new or empty: nothing is replaced; on a cluster, on storage every node
    shares). `trajectory_text=True` also returns each trajectory's JSONL in the row.

    Every other keyword is an RLM option, as for `RLM(...)` (`model=`, `base_url=`,
    `max_iterations=`, `max_usd=` ...); budgets hold for each row, except
    `batch_concurrency` (default 128): the requests in flight to a server from the whole
    job, split among the actors, halved for all of them while calls are retried (429s).
    `actors` is the size of the pool (default: the cluster's CPUs over `num_cpus`, the CPUs
    each actor reserves; never more than the width); `ray_remote_args` go to each actor
    (`memory`, `resources`, `runtime_env`, `scheduling_strategy`, ...).

    Returns, for a list, a list (`JobResults`) of one dict per row in input order with
    `answer`, `termination_reason`, `error` (why the row failed, else None), `metrics`,
    `cost_usd` (with a price), `trajectory` (its path) and `node` (the Ray node that ran it);
    for a Dataset, a Dataset of the input rows with those columns added, in input order. A
    list's job ends with warnings (logger `rlm_kernel.ray`) of the rows whose calls were
    retried, of those that failed (`error`) and of those whose sub-calls failed
    (`metrics["sub_call_errors"]`: an answer to check though its `error` is None), the first
    of them named by position; the list's `summary` holds those counts (`rows`, `rows_failed`,
    `failed_rows`, `rows_failed_sub_calls`, `failed_sub_call_rows`, and on a cluster the
    gate's: `rows_retried`, `retries`, `pauses`, `lowest_width`, ...).
    `serial=True` runs a list's rows here, one after another, without Ray.
    """
    if "trajectory" in rlm_options:
        raise TypeError(
            "`map_completions` writes one trajectory per row: pass `trajectories=FOLDER` "
            "(each row's goes to `FOLDER/NAME.jsonl`), not `trajectory`"
        )
    # Resolved and checked here, once: a bad option raises before anything runs.
    options = RLM(**rlm_options).options
    folder = _trajectory_folder(trajectories)
    spec = {
        "options": options,
        "query": query,
        "context": context,
        "name": name,
        "trajectories": folder,
        "trajectory_text": trajectory_text,
        "base_dir": os.getcwd(),
    }
    fields = {"query": query, "context": context, "name": name}
    if serial:
        rows = _as_list(items, "`serial=True` takes a list of rows")
        check_fields(rows, fields)
        if folder is not None:
            os.makedirs(folder, exist_ok=True)
        runner = RowRunner(**spec)
        return finish_job([runner.run(row, index) for index, row in enumerate(rows)])

    from ._cluster import default_actors, import_ray, map_dataset, map_list

    ray = import_ray()
    if not ray.is_initialized():
        ray.init()
    remote_args = dict(ray_remote_args or {})
    remote_args["num_cpus"] = num_cpus
    is_dataset = isinstance(items, ray.data.Dataset)
    rows = None if is_dataset else _as_list(items, "`map_completions` takes a list of rows or a `ray.data.Dataset`")
    if rows is not None:
        check_fields(rows, fields)
    if actors is None:
        actors = default_actors(ray, num_cpus)
        if rows is not None:
            actors = max(1, min(actors, len(rows)))
    elif isinstance(actors, bool) or actors < 1:
        raise ValueError(f"`actors` must be a whole number ≥ 1, got {actors!r}")
    if rows is not None and not rows:
        return finish_job([])
    if is_dataset:
        return map_dataset(ray, items, spec, actors, remote_args)
    return map_list(ray, rows, spec, actors, remote_args)


def summarize(results: Any) -> Dict[str, Any]:
    """The summary of `map_completions` results, as a list's job has it in `.summary`
    (`rows`, `rows_failed`, `failed_rows`, `rows_failed_sub_calls`, `failed_sub_call_rows`),
    counted from the rows alone (no gate's counts): of a list of result rows, or of a result
    Dataset once materialised (`done = ds.materialize()`; use `done` for the rest too). A lazy
    Dataset is refused: reading it would run every completion again."""
    if isinstance(results, (list, tuple)):
        return job_summary(list(results))
    from ._cluster import import_ray, materialized_results

    ray = import_ray()
    if isinstance(results, ray.data.Dataset):
        return job_summary(materialized_results(results))
    raise TypeError(
        f"`summarize` takes the result rows of `map_completions` (a list) or its Dataset, "
        f"not a `{type(results).__name__}`"
    )


def _as_list(items: Any, takes: str) -> List[Any]:
    if isinstance(items, (list, tuple)):
        return list(items)
    raise TypeError(f"{takes}, not a `{type(items).__name__}`")


def _trajectory_folder(folder: Union[str, "os.PathLike[str]", None]) -> Optional[str]:
    """The folder as an absolute path (actors have other working folders), refused when it
    holds anything: a row's trajectory replaces no file."""
    if folder is None:
        return None
    path = os.path.abspath(os.fspath(folder))
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise ValueError(f"`trajectories` `{path}` is a file; pass a folder")
        if os.listdir(path):
            raise ValueError(
                f"`trajectories` folder `{path}` is not empty; pass a new or empty folder "
                "(a row's trajectory replaces no file)"
            )
    return path
