"""Rows per minute and model calls per second of `rlm_kernel.ray.map_completions` on one Ray
node and on two, against the mock LM server with latency; the baseline, measured in the same
run, is the same rows run one after another in this process (`serial=True`).

    python python/benches/ray_scaling.py [--rows 120] [--latency-ms 100] [--prompts 8]

Each row is one RLM completion: a root call, a block that sends `--prompts` sub-calls in one
`llm_query_batched`, a root call with the final answer (2 + prompts calls). The cluster is
the test's (`python/tests/ray_cluster/harness.py`): nodes of 2 CPUs on 127.0.0.1, one actor a
CPU. Ray probes an outside address to find its own, so the script re-runs itself in a private
network namespace with only loopback (`unshare -rn`), as the test does.
"""

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1] / "tests"


def in_namespace() -> None:
    """Re-runs this script in a private network and PID namespace, unless it is in one."""
    sys.path[:0] = [str(TESTS), str(TESTS / "ray_cluster")]
    from harness import NAMESPACE_VARIABLE, outside_interfaces

    if os.environ.get(NAMESPACE_VARIABLE) == "1" and not outside_interfaces():
        return
    ip = shutil.which("ip") or "/usr/sbin/ip"
    inner = f"{ip} link set lo up && exec {sys.executable} {' '.join(map(repr, sys.argv))}"
    env = dict(os.environ, **{NAMESPACE_VARIABLE: "1", "RAY_USAGE_STATS_ENABLED": "0"})
    done = subprocess.run(
        ["unshare", "-rn", "--pid", "--fork", "--mount-proc", "--kill-child", "sh", "-c", inner],
        env=env,
    )
    sys.exit(done.returncode)


def script(latency_ms: int, prompts: int) -> dict:
    latency = {"kind": "fixed", "ms": latency_ms}
    code = (
        f"echoed = llm_query_batched([f'{{i}}: ' + context[:20] for i in range({prompts})])\n"
        "result = str(len(echoed))"
    )
    return {
        "models": {
            "root": {"replies": [f"```repl\n{code}\n```", "FINAL_VAR(result)"], "latency": latency},
            "sub": {"replies": [{"behaviour": "echo"}], "latency": latency},
        }
    }


def measure(label, run, rows, calls_per_row):
    started = time.perf_counter()
    results = run()
    wall = time.perf_counter() - started
    bad = [r for r in results if r["answer"] is None or r["error"]]
    if bad:
        sys.exit(f"{label}: {len(bad)} rows failed, e.g. {bad[0]}")
    print(
        f"{label:<24} {len(results):>5} {wall:>8.1f} {len(results) / wall * 60:>9.0f} "
        f"{len(results) * calls_per_row / wall:>8.1f}",
        flush=True,
    )
    return wall


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=120)
    parser.add_argument("--latency-ms", type=int, default=100)
    parser.add_argument("--prompts", type=int, default=8)
    args = parser.parse_args()
    in_namespace()

    import ray
    from harness import NODE_CPUS, Cluster
    from rlm_kernel import MockServer
    from rlm_kernel.ray import map_completions

    rows = [{"query": f"Row {i}", "context": f"text of row {i} " * 20} for i in range(args.rows)]
    calls = 2 + args.prompts
    print(f"{args.rows} rows of {calls} calls each, mock latency {args.latency_ms} ms, "
          f"{NODE_CPUS} CPUs (actors) a node, {os.cpu_count()} cores on this machine")
    print(f"{'setup':<24} {'rows':>5} {'wall s':>8} {'rows/min':>9} {'calls/s':>8}")
    cluster = Cluster()
    with MockServer(script(args.latency_ms, args.prompts)) as mock:
        options = dict(model="root", sub_model="sub", base_url=mock.base_url)
        serial = measure("serial (baseline)", lambda: map_completions(rows, serial=True, **options), rows, calls)
        try:
            cluster.start(nodes=1)
            ray.init(address=cluster.address, _node_ip_address="127.0.0.1", log_to_driver=False)
            one = measure("1 node, 2 actors", lambda: map_completions(rows, **options), rows, calls)
            cluster.add_node()
            two = measure("2 nodes, 4 actors", lambda: map_completions(rows, **options), rows, calls)
        finally:
            ray.shutdown()
            cluster.stop()
    print(f"speed-up over serial: 1 node {serial / one:.2f}x, 2 nodes {serial / two:.2f}x")


if __name__ == "__main__":
    main()
