"""The Ray cluster tests (`ray_cluster/`), run where Ray may run: inside a private network
namespace with only loopback, and a PID namespace whose end ends every Ray process.

Ray finds its own address by probing an outside one, and nothing a test does may leave the
machine, so the cluster, the mock LM server and the tests all run in the namespace:
`unshare -rn --pid --fork --mount-proc`, then `ip link set lo up`. The namespace's first
process is `namespace_init.py`, which runs the suite's pytest and reaps the orphans the kernel
hands it (the worker templates of hosts that ended); when pytest ends (or the first process is
killed at the time limit), the kernel ends every process left in it.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import REPO

#: The whole suite's bound, cluster start included (a loaded 2-core machine is slow).
SUITE_TIMEOUT_S = 1200


def in_namespace(*argv: str) -> list:
    """The command that runs `argv` in a private network and PID namespace with loopback up,
    under `namespace_init.py` as the namespace's first process."""
    unshare = shutil.which("unshare")
    ip = shutil.which("ip") or "/usr/sbin/ip"
    if unshare is None or not os.path.exists(ip):
        pytest.fail("`unshare` and `ip` are needed (`apt-get install util-linux iproute2`)")
    init = REPO / "python" / "tests" / "namespace_init.py"
    inner = f'{ip} link set lo up && exec {sys.executable} {init} "$@"'
    return [unshare, "-rn", "--pid", "--fork", "--mount-proc", "--kill-child",
            "sh", "-c", inner, "sh", *argv]


def test_the_ray_cluster_suite_passes_in_a_private_network_namespace():
    command = in_namespace(
        sys.executable, "-m", "pytest", str(REPO / "python" / "tests" / "ray_cluster"),
        "-q", "-p", "no:cacheprovider", "-x", "--durations=10",
    )
    # No usage statistics: Ray would query a metrics server that is not there, and log each try.
    env = dict(os.environ, RLM_RAY_TEST_NETNS="1", RAY_USAGE_STATS_ENABLED="0")
    try:
        done = subprocess.run(
            command,
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


#: A host of the test below, run as a process of its own: `runs` isolated runs, each after a
#: variable Python reads at its start changed (so each run replaces the template the last one
#: prepared), and after each, this process's children (pid, name, state) once the template
#: for the next run is up and no child is a zombie (the run's session closes on the run's
#: thread after its answer is handed back: its worker, which exits as soon as it is told, is
#: a zombie until that thread reaps it; one left for a minute is one never reaped).
HOST = r'''
import json, os, sys, time
from rlm_kernel import MockServer, RLM
from namespace_procs import processes

runs = int(sys.argv[1])
script = {"models": {
    "root": {"replies": ["```repl\nprint(6 * 7)\n```", "FINAL(done)"]},
    "sub": {"replies": [{"behaviour": "echo"}]},
}}
with MockServer(script) as mock:
    for i in range(runs):
        os.environ["LC_RLM_TEMPLATE_TEST"] = f"{os.getpid()}-{i}"
        result = RLM(model="root", base_url=mock.base_url).completion("q", context="c")
        # The run's end prepares the template of the next run's environment (this one's).
        deadline = time.monotonic() + 60
        while True:
            children = [p for p in processes() if p["ppid"] == os.getpid()]
            template = any(c["name"] == "rlm-template" for c in children)
            zombies = any(c["state"] == "Z" for c in children)
            if (template and not zombies) or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        print(json.dumps({"answer": result.answer, "children": children}), flush=True)
    if sys.argv[2:] == ["kill"]:
        # Its template killed from outside between runs: reaped (and another started) with
        # no session asking for a worker.
        (template,) = [c["pid"] for c in children if c["name"] == "rlm-template"]
        os.kill(template, 9)
        deadline = time.monotonic() + 30
        while True:
            children = [p for p in processes() if p["ppid"] == os.getpid()]
            zombies = [c for c in children if c["state"] == "Z"]
            others = [c for c in children if c["name"] == "rlm-template" and c["pid"] != template]
            if (not zombies and others) or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        print(json.dumps({"killed": template, "children": children}), flush=True)
'''

#: The driver, the namespace's second process: two hosts one after the other, then every
#: process left in the namespace once their templates had time to end (at most 10 s).
DRIVER = r'''
import json, subprocess, sys, time
from namespace_procs import processes

for args in (["3"], ["1", "kill"]):
    subprocess.run([sys.executable, sys.argv[1], *args], check=True, timeout=120)
deadline = time.monotonic() + 10
while True:
    left = [p for p in processes() if p["state"] == "Z" or p["name"] == "rlm-template"]
    if not left or time.monotonic() > deadline:
        break
    time.sleep(0.05)
print(json.dumps({"left": left}), flush=True)
'''

#: Every process of this PID namespace, as the two programs above list them.
PROCS = r'''
import json
import os

def processes():
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        state, ppid = stat[stat.rindex(")") + 2 :].split()[:2]
        found.append({"pid": int(pid), "ppid": int(ppid), "name": name, "state": state})
    return found
'''


def test_hosts_that_replace_their_template_and_end_leave_no_zombie_and_no_template(tmp_path):
    # In the namespace the suite above runs in: a host replacing its worker template at each
    # run keeps no zombie and at most one template; a template killed between runs is reaped
    # by its host at once; once hosts end, nothing of them is left (their templates die with
    # them and the namespace's first process reaps them).
    for name, text in (("host.py", HOST), ("driver.py", DRIVER), ("namespace_procs.py", PROCS)):
        (tmp_path / name).write_text(text)
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    done = subprocess.run(
        in_namespace(sys.executable, str(tmp_path / "driver.py"), str(tmp_path / "host.py")),
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    reports = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    killed = [r for r in reports if "killed" in r]
    runs = [r for r in reports if "answer" in r]
    end = reports[-1]
    assert len(runs) == 4 and len(killed) == 1, done.stdout + done.stderr
    templates = []
    for run in runs:
        assert run["answer"] == "done", run
        assert [c for c in run["children"] if c["state"] == "Z"] == [], run
        live = [c["pid"] for c in run["children"] if c["name"] == "rlm-template"]
        assert len(live) <= 1, run
        templates.extend(live)
    # Each run took a new template: the variable changed is one Python reads at its start.
    assert len(set(templates)) == 4, runs
    # A template killed between runs is reaped at once, and another started.
    (after,) = killed
    assert [c for c in after["children"] if c["state"] == "Z"] == [], after
    assert [c for c in after["children"] if c["name"] == "rlm-template"] != [], after
    assert end["left"] == [], end
