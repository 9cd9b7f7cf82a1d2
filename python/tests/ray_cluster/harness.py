"""A real two-node Ray cluster on loopback, for the tests of this folder.

The head and a second node are each a `ray start --block` process of their own (the second
with a resource of its own, `node-b`), on free ports, at 127.0.0.1, with two CPUs and a small
object store each (the machine has 2 cores). Ray probes an outside address to find its own,
so this folder runs only inside a private network namespace with nothing but loopback:
`python/tests/test_ray.py` starts it there (`unshare -rn --pid --fork --mount-proc`); here,
`refuse_outside_namespace` fails fast anywhere else. The PID namespace ends every Ray process
when the suite's process ends, whatever happens; `Cluster.stop` ends them in order before.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

import psutil
import pytest

#: Set by `python/tests/test_ray.py` for the run inside the namespace (read at import:
#: each test runs without the `RLM_*` variables).
NAMESPACE_VARIABLE = "RLM_RAY_TEST_NETNS"
MARKED = os.environ.get(NAMESPACE_VARIABLE) == "1"

#: The CPUs of each node: the actors reserve one each.
NODE_CPUS = 2

#: Bytes of each node's object store (Ray's minimum is 75 MiB).
OBJECT_STORE_BYTES = 80 * 1024 * 1024

#: How long a node may take to join, on a loaded 2-core machine.
START_TIMEOUT_S = 240


def outside_interfaces() -> List[str]:
    """Network interfaces other than loopback (none in a fresh network namespace)."""
    return [name for _, name in socket.if_nameindex() if name != "lo"]


def refuse_outside_namespace() -> None:
    """Fails unless this process is in a network namespace with only loopback."""
    outside = outside_interfaces()
    if outside or not MARKED:
        pytest.fail(
            "The Ray cluster tests run only in a private network namespace with nothing but "
            f"loopback (Ray probes outside addresses); this one has {outside or 'no marker'}. "
            "Run them through `python/tests/test_ray.py`, which starts them under `unshare -rn`."
        )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray_command() -> str:
    return str(Path(sys.executable).with_name("ray"))


class Cluster:
    """The head and a second node, each its own `ray start --block` process."""

    def __init__(self) -> None:
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        # Short: Ray's socket paths below it must fit in 107 bytes.
        self.temp_dir = tempfile.mkdtemp(prefix="rlm-ray-", dir="/tmp")
        self.env = dict(
            os.environ,
            RAY_USAGE_STATS_ENABLED="0",
            # The shared disk may be nearly full; the object store lives in memory.
            RAY_local_fs_capacity_threshold="1.0",
        )
        self.nodes: Dict[str, subprocess.Popen] = {}

    def _start(self, label: str, args: List[str]) -> None:
        log = open(Path(self.temp_dir, f"{label}.log"), "w")
        common = [
            "--block",
            "--node-ip-address=127.0.0.1",
            f"--num-cpus={NODE_CPUS}",
            f"--object-store-memory={OBJECT_STORE_BYTES}",
            "--disable-usage-stats",
            f'--resources={{"node-{label}": 1}}',
        ]
        self.nodes[label] = subprocess.Popen(
            [_ray_command(), "start", *args, *common],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def start(self, nodes: int = 2) -> "Cluster":
        """Starts the head, then (with `nodes=2`) the second node; `add_node` adds it later."""
        self._start(
            "a",
            [
                "--head",
                f"--port={self.port}",
                "--include-dashboard=false",
                f"--temp-dir={self.temp_dir}",
            ],
        )
        self._wait_for_nodes(1)
        if nodes == 2:
            self.add_node()
        return self

    def add_node(self) -> None:
        """Starts the second node and waits until it has joined."""
        self._start("b", [f"--address={self.address}"])
        self._wait_for_nodes(2)

    def _wait_for_nodes(self, count: int) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            for label, process in self.nodes.items():
                if process.poll() is not None:
                    pytest.fail(f"Ray node {label} exited ({process.returncode}):\n{self.log(label)}")
            done = subprocess.run(
                [_ray_command(), "status", f"--address={self.address}"],
                env=self.env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            if done.returncode == 0 and done.stdout.count(" node_") >= count:
                return
            time.sleep(1)
        pytest.fail(f"{count} Ray node(s) did not come up in {START_TIMEOUT_S}s")

    def log(self, label: str) -> str:
        path = Path(self.temp_dir, f"{label}.log")
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def raylet(self, label: str) -> Optional[psutil.Process]:
        """The raylet of node `label`: a child of its `ray start` process."""
        starter = psutil.Process(self.nodes[label].pid)
        for child in starter.children(recursive=True):
            if child.name() == "raylet":
                return child
        return None

    def node_ids(self) -> Dict[str, str]:
        """`{label: Ray node id}` of the live nodes (after `ray.init`)."""
        import ray

        found = {}
        for node in ray.nodes():
            for label in self.nodes:
                if node["Alive"] and f"node-{label}" in node["Resources"]:
                    found[label] = node["NodeID"]
        return found

    def kill_workers(self, label: str) -> List[str]:
        """SIGKILLs node `label`'s worker processes (its actors among them), not its raylet
        or agents; returns their titles (`ray::MapWorker(...)`, `ray::IDLE`, ...)."""
        raylet = self.raylet(label)
        killed = []
        if raylet is None:
            return killed
        for child in raylet.children(recursive=True):
            try:
                line = " ".join(child.cmdline())
                if "default_worker.py" in line or (line.startswith("ray::") and "Agent" not in line):
                    child.kill()
                    killed.append(line[:80])
            except psutil.NoSuchProcess:
                continue
        return killed

    def stop(self) -> None:
        """Ends the second node, then the head (SIGTERM, then SIGKILL for their sessions)."""
        for label in ("b", "a"):
            process = self.nodes.get(label)
            if process is None or process.poll() is not None:
                continue
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait(timeout=30)
        shutil.rmtree(self.temp_dir, ignore_errors=True)
