"""Endpoint limits across the cluster: one width for all the actors, and a back-off they all
take when the server pushes back.

A run's `batch_concurrency` (default: the endpoint's 128) is how many requests one process
sends a server at once. On a cluster it is the width of the whole job: 20 actors must not send
20 times the width. Every actor runs one row at a time, and a row's requests in flight are at
most its batch width (its root call and its code's sub-calls never overlap), so each actor's
rows get a share, `width // actors`; there are never more actors than the width.

The width is kept by `EndpointGate`, a small Ray actor of the job (on the driver's node, with
no CPU). Before each row an actor asks it for its share and waits out any pause; after each
row it reports how many of the row's calls were retried (429s, 5xx, timeouts: the bridge
retries those, honouring `Retry-After`). A retry halves the width (to one per actor at
least) and pauses every actor's next row, 1 s doubling up to 30 s while the retries go on; a
row without retries grows it back by one, up to the ceiling. `auto` (`batch_concurrency=
"auto"`) starts at 16 and grows up to 256 the same way. In-flight calls are not interrupted:
the back-off is per row, which is what a job of many rows needs; within a row the bridge's
own limiter and retries act as on one machine.

The gate is a convenience, not a point of failure: when it cannot be reached (its node lost),
an actor runs with its static share and no pause, and a restarted gate starts over.
"""

from __future__ import annotations

import time
from typing import Any, Dict, Optional, Tuple

#: The width `auto` starts at and its ceiling (the bridge's adaptive limit's own).
AUTO_START = 16
AUTO_CEILING = 256
#: The endpoint's default width (the bridge's `DEFAULT_MAX_IN_FLIGHT`) when none is given.
DEFAULT_WIDTH = 128
#: The first pause after a retry, and the longest.
PAUSE_FIRST_S = 1.0
PAUSE_MAX_S = 30.0
#: How long an actor waits for the gate before running with its static share.
GATE_TIMEOUT_S = 10.0


def job_width(batch_concurrency: Any) -> Tuple[int, int]:
    """`(start, ceiling)` of the job's width for a `batch_concurrency` option value."""
    if batch_concurrency is None:
        return DEFAULT_WIDTH, DEFAULT_WIDTH
    if isinstance(batch_concurrency, str) and batch_concurrency.strip().lower() == "auto":
        return AUTO_START, AUTO_CEILING
    width = int(batch_concurrency)
    return width, width


class Width:
    """The job's width and pause: the state of `EndpointGate`, here so that it is testable
    without Ray."""

    def __init__(self, start: int, ceiling: int, actors: int, clock=time.monotonic):
        self.actors = max(1, actors)
        self.ceiling = max(ceiling, self.actors)
        self.width = min(max(start, self.actors), self.ceiling)
        self.clock = clock
        self.paused_until = 0.0
        self.pause_s = 0.0
        self.lowest = self.width
        self.rows = 0
        self.rows_retried = 0
        self.retries = 0
        self.pauses = 0

    def share(self) -> Tuple[int, float]:
        """`(width of one actor's next row, seconds to wait before starting it)`."""
        return max(1, self.width // self.actors), max(0.0, self.paused_until - self.clock())

    def report(self, retries: int) -> None:
        """A row ended; `retries` of its calls' attempts were retries."""
        self.rows += 1
        if retries > 0:
            self.rows_retried += 1
            self.retries += retries
            self.width = max(self.actors, self.width // 2)
            self.lowest = min(self.lowest, self.width)
            self.pause_s = min(PAUSE_MAX_S, self.pause_s * 2 if self.pause_s else PAUSE_FIRST_S)
            now = self.clock()
            if self.paused_until <= now:
                self.pauses += 1
            self.paused_until = max(self.paused_until, now + self.pause_s)
        else:
            self.pause_s = 0.0
            self.width = min(self.ceiling, self.width + 1)

    def stats(self) -> Dict[str, Any]:
        """What the gate saw: rows, rows with retries, retries, pauses, widths."""
        return {
            "rows": self.rows,
            "rows_retried": self.rows_retried,
            "retries": self.retries,
            "pauses": self.pauses,
            "width": self.width,
            "lowest_width": self.lowest,
            "ceiling": self.ceiling,
            "actors": self.actors,
        }


def retries_of(data: Dict[str, Any]) -> int:
    """Attempts beyond the first over a run's calls (root and sub), from its result."""
    calls = list(data.get("sub_calls") or [])
    calls += [i["root_call"] for i in data.get("iterations") or [] if i.get("root_call")]
    return sum(max(0, int(c.get("attempts") or 0) - 1) for c in calls)


def start_gate(ray, start: int, ceiling: int, actors: int):
    """The job's `EndpointGate`, on this (the driver's) node, restarted if it dies."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    gate = ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1)(EndpointGate)
    here = ray.get_runtime_context().get_node_id()
    return gate.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=here, soft=True)
    ).remote(start, ceiling, actors)


class EndpointGate:
    """The Ray actor that holds the job's `Width` (see the module docs)."""

    def __init__(self, start: int, ceiling: int, actors: int):
        self.state = Width(start, ceiling, actors)

    def share(self) -> Tuple[int, float]:
        return self.state.share()

    def report(self, retries: int) -> None:
        self.state.report(retries)

    def stats(self) -> Dict[str, Any]:
        return self.state.stats()


class GateClient:
    """An actor's side of the gate: its share (waiting out a pause), and its reports; the
    static share when the gate cannot be reached."""

    def __init__(self, gate, static_share: int):
        self.gate = gate
        self.static_share = static_share

    def admit(self) -> int:
        """The width of the next row, after any pause."""
        import ray

        try:
            width, pause = ray.get(self.gate.share.remote(), timeout=GATE_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - the gate is advisory: run on the static share
            return self.static_share
        if pause > 0:
            time.sleep(pause)
        return width

    def report(self, retries: int) -> None:
        try:
            self.gate.report.remote(retries)
        except Exception:  # noqa: BLE001 - as above
            pass


def gate_stats(ray, gate) -> Optional[Dict[str, Any]]:
    """The gate's stats, or None when it cannot be reached."""
    try:
        return ray.get(gate.stats.remote(), timeout=GATE_TIMEOUT_S)
    except Exception:  # noqa: BLE001
        return None
