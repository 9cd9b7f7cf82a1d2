"""The Ray cluster tests (`ray_cluster/`), run where Ray may run: inside a private network
namespace with only loopback, and a PID namespace whose end ends every Ray process.

Ray finds its own address by probing an outside one, and nothing a test does may leave the
machine, so the cluster, the mock LM server and the tests all run in the namespace:
`unshare -rn --pid --fork --mount-proc`, then `ip link set lo up`. The suite's pytest is the
namespace's first process: when it ends (or is killed at the time limit), the kernel ends
every process left in it.
"""

import os
import shutil
import subprocess
import sys

import pytest

from conftest import REPO

#: The whole suite's bound, cluster start included (a loaded 2-core machine is slow).
SUITE_TIMEOUT_S = 1200


def test_the_ray_cluster_suite_passes_in_a_private_network_namespace():
    unshare = shutil.which("unshare")
    ip = shutil.which("ip") or "/usr/sbin/ip"
    if unshare is None or not os.path.exists(ip):
        pytest.fail("`unshare` and `ip` are needed (`apt-get install util-linux iproute2`)")
    inner = (
        f"{ip} link set lo up && exec {sys.executable} -m pytest "
        f"{REPO / 'python' / 'tests' / 'ray_cluster'} -q -p no:cacheprovider -x --durations=10"
    )
    # No usage statistics: Ray would query a metrics server that is not there, and log each try.
    env = dict(os.environ, RLM_RAY_TEST_NETNS="1", RAY_USAGE_STATS_ENABLED="0")
    try:
        done = subprocess.run(
            [unshare, "-rn", "--pid", "--fork", "--mount-proc", "--kill-child", "sh", "-c", inner],
            env=env,
            capture_output=True,
            text=True,
            timeout=SUITE_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as expired:
        said = (expired.stdout or b"").decode(errors="replace")[-20000:]
        pytest.fail(f"the cluster suite took over {SUITE_TIMEOUT_S}s:\n{said}")
    said = done.stdout + done.stderr
    log = REPO / "target" / "ray-cluster-tests.log"
    log.write_text(said)
    print(said[-3000:])
    assert done.returncode == 0, f"(the whole output is in `{log}`)\n{_failures(said)}"
    assert " passed" in done.stdout and " failed" not in done.stdout, _failures(said)


def _failures(said: str) -> str:
    """The head of pytest's failure reports and the summary (Ray's logs make the rest long)."""
    at = said.find("= FAILURES =")
    head = said[at : at + 12000] if at >= 0 else ""
    return f"{head}\n[...]\n{said[-3000:]}"
