"""The Ray side of `map_completions`: rows into a Ray Dataset, an actor pool mapping it, and
the results back in input order.

A list becomes a Dataset of one row per block, each holding the row's position and the row
itself pickled (so any Python object, a frame too, travels as it is); a Dataset of the
user's is split into blocks of one row first (read and held in Ray's object store: the rows,
not their results, are computed before the actors start). One row per block makes one task per row: an actor
that dies takes only its rows in progress with it, Ray retries exactly those on a restarted
actor (`max_restarts` and `max_task_retries` are unbounded for Ray Data's actor pools, and a
restarted actor is placed on any node with room), and the outputs of a task that died are
never delivered. A list's results are then checked by position: each appears once, in order.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Dict, List, Optional

from ._limits import GateClient, gate_stats, job_width, start_gate
from ._rows import JobResults, RowRunner, finish_job

_log = logging.getLogger("rlm_kernel.ray")

# The fields of a list's rows in the Dataset built from it.
INDEX = "__rlm_index"
PAYLOAD = "__rlm_row"


def import_ray():
    """`ray`, or an error saying what to install."""
    try:
        import ray
        import ray.data  # noqa: F401 - Ray Data is the `data` extra of `ray`
    except ImportError as error:
        raise ImportError(
            f"`rlm_kernel.ray` needs Ray with Ray Data ({error}); install it with "
            "`pip install 'rlm-kernel[ray]'` on the driver and on every node of the cluster "
            "(or pass `serial=True` to run the rows here, one after another)"
        ) from None
    return ray


class CompletionActor:
    """One member of the actor pool: the kernel loaded in this worker process, the options
    resolved once, and the job's endpoint gate; each row it is handed runs as one completion
    (see `RowRunner`) within this actor's share of the width (see `_limits`)."""

    def __init__(self, spec: Dict[str, Any], gate: Any, static_share: int):
        import ray

        self.runner = RowRunner(**spec, node=ray.get_runtime_context().get_node_id())
        self.gate = GateClient(gate, static_share)
        if self.runner.trajectories is not None:
            os.makedirs(self.runner.trajectories, exist_ok=True)

    def _run(self, row: Any, index: Optional[int]) -> Dict[str, Any]:
        result = self.runner.run(row, index, width=self.gate.admit())
        self.gate.report(self.runner.last_retries)
        return result

    def __call__(self, row: Dict[str, Any]) -> Dict[str, Any]:
        if PAYLOAD in row:
            from ray import cloudpickle

            index = int(row[INDEX])
            result = self._run(cloudpickle.loads(row[PAYLOAD]), index)
            result[INDEX] = index
            return result
        taken = sorted(set(row) & set(RowRunner.result_columns(self.runner.trajectory_text)))
        if taken:
            raise ValueError(
                f"The Dataset has column(s) {', '.join(f'`{c}`' for c in taken)}, which the "
                "results use; rename them first (`ds.rename_columns({...})`)"
            )
        return dict(row, **self._run(row, None))


def _pool(ray, size: int):
    return ray.data.ActorPoolStrategy(size=size, max_tasks_in_flight_per_actor=1)


def default_actors(ray, num_cpus: float) -> int:
    """As many actors as the cluster's CPUs hold at `num_cpus` each."""
    cpus = ray.cluster_resources().get("CPU", 1.0)
    return max(1, int(cpus // num_cpus)) if num_cpus > 0 else max(1, int(cpus))


def _mapped(ray, dataset, spec: Dict[str, Any], actors: int, remote_args: Dict[str, Any]):
    """`dataset` mapped by an actor pool of `actors` sharing the job's width, and the gate.
    More actors than the width would only wait: the pool is cut to the width."""
    start, ceiling = job_width(spec["options"].get("batch_concurrency"))
    if actors > ceiling:
        _log.warning(
            "%d actors for a width of %d: using %d actors (each runs one row at a time and "
            "sends at least one request); raise `batch_concurrency` for more",
            actors,
            ceiling,
            ceiling,
        )
        actors = ceiling
    gate = start_gate(ray, start, ceiling, actors)
    mapped = dataset.map(
        CompletionActor,
        fn_constructor_kwargs={
            "spec": spec,
            "gate": gate,
            "static_share": max(1, start // actors),
        },
        compute=_pool(ray, actors),
        **remote_args,
    )
    return mapped, gate


def map_list(
    ray,
    rows: List[Any],
    spec: Dict[str, Any],
    actors: int,
    remote_args: Dict[str, Any],
) -> JobResults:
    """The result rows of `rows`, in their order, each exactly once, and the job's summary."""
    from ray import cloudpickle

    items = [{INDEX: i, PAYLOAD: cloudpickle.dumps(row)} for i, row in enumerate(rows)]
    dataset = ray.data.from_items(items, override_num_blocks=max(1, len(items)))
    mapped, gate = _mapped(ray, dataset, spec, actors, remote_args)
    results: Dict[int, Dict[str, Any]] = {}
    for result in mapped.take_all():
        index = int(result.pop(INDEX))
        if index in results:
            _log.warning("Row %d came back twice; kept the first result", index)
            continue
        results[index] = result
    missing = [i for i in range(len(rows)) if i not in results]
    if missing:
        raise RuntimeError(
            f"Ray returned no result for {len(missing)} row(s) (the first: {missing[:5]}); "
            "please report this as a bug of `rlm_kernel.ray`"
        )
    return finish_job([results[i] for i in range(len(rows))], gate_stats(ray, gate))


def map_dataset(ray, dataset, spec: Dict[str, Any], actors: int, remote_args: Dict[str, Any]):
    """`dataset` with the result columns added to each row, in input order (the rows are
    split first; the completions run when the result is consumed)."""
    schema = dataset.schema(fetch_if_missing=False)
    if schema is not None:
        taken = sorted(set(schema.names) & set(RowRunner.result_columns(spec["trajectory_text"])))
        if taken:
            raise ValueError(
                f"The Dataset has column(s) {', '.join(f'`{c}`' for c in taken)}, which the "
                "results use; rename them first (`ds.rename_columns({...})`)"
            )
    # Split into one-row blocks before the pool starts: the split's tasks need a CPU, which a
    # pool holding every CPU of the cluster would never leave them (the job would hang).
    rows = _in_order(ray, dataset).repartition(target_num_rows_per_block=1).materialize()
    mapped, _gate = _mapped(ray, _in_order(ray, rows), spec, actors, remote_args)
    return _in_order(ray, mapped)


def materialized_results(dataset) -> List[Dict[str, Any]]:
    """The `error` and `metrics` of each row of a result Dataset held in the object store, in
    its order; a lazy Dataset refused (reading it would run its completions again)."""
    from ray.data.dataset import MaterializedDataset

    if not isinstance(dataset, MaterializedDataset):
        raise ValueError(
            "The Dataset is not materialised: reading it to count its rows would run every "
            "completion again. Materialise it once and use that from then on: "
            "`done = ds.materialize(); summarize(done)` (`done.write_parquet(...)`, ...)"
        )
    names = dataset.schema().names
    if "metrics" not in names or "error" not in names:
        raise ValueError(
            "The Dataset has no `error` and `metrics` columns: pass the Dataset `map_completions` returned "
            f"(its columns: {', '.join(f'`{n}`' for n in names[:12])})"
        )
    # Rows read as held: a projection first would be a task a block, one a row here.
    return [{"error": row["error"], "metrics": row["metrics"]} for row in dataset.iter_rows()]


def _in_order(ray, dataset):
    """`dataset` executed in its rows' order, with a context of its own (a Dataset shares its
    parent's): the user's other Datasets keep theirs."""
    ordered = ray.data.Dataset.copy(dataset, _deep_copy=True)
    ordered.context.execution_options.preserve_order = True
    return ordered
