"""`rlm eval --ray`: the CLI's evaluation grid run on a Ray cluster through `map_completions`.

The `rlm` binary holds no Ray: it starts `python -m rlm_kernel.ray eval` (see `__main__`),
writes the job to its standard input and reads one result a line from its standard output.
The job names each run by its task family, size and instance seed; each actor makes the
run's context where it runs, with the same generator as the CLI (`kernel::eval` through
`_native.eval_task`), so no context crosses the network. The CLI scores the answers, writes
the trajectories, `results.json`, the plot and the table, as for a local run.

The job, one JSON document:

    {"address": "auto" | "HOST:PORT" | "ray://HOST:PORT" | null,
     "options": {"model": ..., ...},          # RLM keyword options
     "actors": null | N,
     "runs": [{"name": "needle-8k-000", "task": "needle", "size_tokens": 8000,
               "seed": 123, "needles": 1}, ...]}

A result line: `{"name", "answer", "termination_reason", "error", "metrics",
"trajectory_jsonl", "node"}`, in the order of `runs`.
"""

from __future__ import annotations

import functools
import json
from typing import Any, Dict, Iterator, Mapping, Tuple

from .. import _native

#: The fields of a run of the job.
RUN_FIELDS = ("name", "task", "size_tokens", "seed", "needles")


@functools.lru_cache(maxsize=1)
def _instance(task: str, size_tokens: int, seed: int, needles: int) -> Tuple[str, str]:
    return _native.eval_task(task, size_tokens, seed, needles)


def _of(run: Mapping[str, Any]) -> Tuple[str, str]:
    return _instance(run["task"], int(run["size_tokens"]), int(run["seed"]), int(run["needles"]))


def query_of(run: Mapping[str, Any]) -> str:
    """The query of a run of the grid (generated once for its query and its context)."""
    return _of(run)[0]


def context_of(run: Mapping[str, Any]) -> str:
    """The context of a run of the grid."""
    return _of(run)[1]


def name_of(run: Mapping[str, Any]) -> str:
    """The run's name, `TASK-SIZE-NNN`."""
    return run["name"]


def check_job(job: Any) -> None:
    """Refuses a job that is not what the CLI sends, saying what is wrong."""
    if not isinstance(job, dict):
        raise ValueError("The job must be a JSON object")
    for key, kind in (("options", dict), ("runs", list)):
        if not isinstance(job.get(key), kind):
            raise ValueError(f"The job's `{key}` must be a JSON {kind.__name__}")
    for index, run in enumerate(job["runs"]):
        missing = [f for f in RUN_FIELDS if not isinstance(run, dict) or f not in run]
        if missing:
            raise ValueError(f"Run {index} of the job lacks {', '.join(missing)}")


def run_job(job: Dict[str, Any]) -> Iterator[Dict[str, Any]]:
    """The result of each run of `job`, in order (see the module docs)."""
    from . import map_completions
    from ._cluster import import_ray

    check_job(job)
    ray = import_ray()
    if not ray.is_initialized():
        ray.init(address=job.get("address"), log_to_driver=False)
    results = map_completions(
        job["runs"],
        query=query_of,
        context=context_of,
        name=name_of,
        trajectory_text=True,
        actors=job.get("actors"),
        **job["options"],
    )
    for run, result in zip(job["runs"], results):
        yield {
            "name": run["name"],
            "answer": result["answer"],
            "termination_reason": result["termination_reason"],
            "error": result["error"],
            "metrics": result["metrics"],
            "trajectory_jsonl": result.get("trajectory_jsonl"),
            "node": result["node"],
        }


def dumps(result: Dict[str, Any]) -> str:
    """One result line."""
    return json.dumps(result, ensure_ascii=False)
