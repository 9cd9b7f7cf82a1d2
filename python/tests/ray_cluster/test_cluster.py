"""`rlm_kernel.ray` on a real two-node Ray cluster (see `harness.py`), against the mock LM
server in this process: results equal a serial run, rows spread over both nodes, and killed
workers lose no row and repeat none."""

import json
import logging
import os
import socket
import subprocess
import sys
import threading

import pytest
import ray

from rlm_kernel import MockServer
from rlm_kernel.ray import map_completions, summarize

from conftest import repl, rlm_binary, wait_until
from harness import Cluster, free_port, refuse_outside_namespace

#: Every row runs this: the context's words counted, two sub-calls echoed, both in the answer.
ROOT_CODE = (
    "words = context.split()\n"
    "echoed = llm_query_batched(words[:2])\n"
    "result = f'{len(words)}:' + '|'.join(echoed)\n"
    "print(result)"
)


def scripted(latency_ms: int) -> dict:
    latency = {"kind": "fixed", "ms": latency_ms}
    return {
        "models": {
            "root": {"replies": [repl(ROOT_CODE), "FINAL_VAR(result)"], "latency": latency},
            "sub": {"replies": [{"behaviour": "echo"}], "latency": latency},
        }
    }


def expected_answer(context: str) -> str:
    words = context.split()
    return f"{len(words)}:" + "|".join(words[:2])


def rows(count: int) -> list:
    return [
        {"query": f"Count the words of row {i}.", "context": " ".join(f"w{i}-{j}" for j in range(i % 7 + 1))}
        for i in range(count)
    ]


@pytest.fixture(scope="module")
def cluster():
    refuse_outside_namespace()
    cluster = Cluster()
    try:
        cluster.start()
        ray.init(address=cluster.address, _node_ip_address="127.0.0.1", log_to_driver=False)
        yield cluster
    finally:
        ray.shutdown()
        cluster.stop()


def comparable(result: dict) -> dict:
    """A result without what differs between two runs of the same row: timings, the node,
    and prompt tokens (the root model is told each block's run time, `ok · 21 ms`)."""
    metrics = {
        k: v
        for k, v in (result["metrics"] or {}).items()
        if not k.endswith("_ms") and k not in ("models", "prompt_tokens")
    }
    return dict(result, metrics=metrics, node=None, trajectory=None)


def test_rows_spread_over_both_nodes_and_equal_a_serial_run(cluster, tmp_path):
    with MockServer(scripted(latency_ms=20)) as mock:
        options = dict(model="root", sub_model="sub", base_url=mock.base_url)
        given = rows(200)
        results = map_completions(given, trajectories=tmp_path / "runs", **options)
        serial = map_completions(given, serial=True, **options)
    assert len(results) == 200
    for row, result in zip(given, results):
        assert result["error"] is None, result
        assert result["answer"] == expected_answer(row["context"]), result
    assert [comparable(r) for r in results] == [comparable(r) for r in serial]
    nodes = {r["node"] for r in results}
    assert nodes == set(cluster.node_ids().values()), nodes
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == [
        f"{i:06d}.jsonl" for i in range(200)
    ]


def test_killed_workers_lose_no_row_and_repeat_none(cluster):
    count = 60
    given = [dict(row, id=f"r{i:03d}") for i, row in enumerate(rows(count))]
    killed = []
    with MockServer(scripted(latency_ms=300)) as mock:
        dataset = ray.data.from_items(given, override_num_blocks=count)
        mapped = map_completions(
            dataset, name="id", model="root", sub_model="sub", base_url=mock.base_url
        )

        def kill_when_running():
            # Rows in progress on both nodes: each row makes 3 calls of 300 ms.
            wait_until(lambda: mock.requests >= 40, "rows were running", timeout=600)
            killed.extend(cluster.kill_workers("b"))

        killer = threading.Thread(target=kill_when_running, daemon=True)
        killer.start()
        results = mapped.take_all()
        killer.join(timeout=5)
    assert any("MapWorker" in title for title in killed), f"no actor of node b was killed: {killed}"
    ids = [r["id"] for r in results]
    assert sorted(ids) == [row["id"] for row in given], "each row exactly once"
    assert ids == [row["id"] for row in given], "in input order"
    for row, result in zip(given, results):
        assert result["error"] is None, result
        assert result["answer"] == expected_answer(row["context"]), result


def fan_out(latency_ms: int, prompts: int) -> dict:
    """Every row sends one batch of `prompts` sub-calls, then answers how many came back."""
    latency = {"kind": "fixed", "ms": latency_ms}
    code = (
        f"echoed = llm_query_batched([f'p{{i}}' for i in range({prompts})])\n"
        "result = str(sum(1 for e in echoed if not e.startswith('Error')))\n"
        "print(result)"
    )
    return {
        "models": {
            "root": {"replies": [repl(code), "FINAL_VAR(result)"], "latency": latency},
            "sub": {"replies": [{"behaviour": "echo"}], "latency": latency},
        }
    }


def test_the_width_is_the_whole_clusters_not_each_actors(cluster):
    # 4 actors (two a node), each row a batch of 6: without the split, 4 × 4 = 16 at once.
    with MockServer(fan_out(latency_ms=150, prompts=6)) as mock:
        results = map_completions(
            rows(16), actors=4, batch_concurrency=4,
            model="root", sub_model="sub", base_url=mock.base_url,
        )
        most = mock.max_concurrency()
    assert [r["answer"] for r in results] == ["6"] * 16, results
    assert most <= 4, f"{most} requests were in flight at once; the width was 4"


@pytest.fixture
def rate_limited_server(tmp_path):
    """`rlm mock-lm --capacity 4` (a 5th request at once is answered 429, `Retry-After: 1`)."""
    script = tmp_path / "script.json"
    script.write_text(json.dumps(fan_out(latency_ms=200, prompts=8)))
    port = free_port()
    server = subprocess.Popen(
        [str(rlm_binary()), "mock-lm", "--script", str(script), "--port", str(port), "--capacity", "4"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_until(lambda: port_open(port) or server.poll() is not None, "the mock listened", 120)
        assert server.poll() is None, server.stderr.read().decode(errors="replace")
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.kill()
        server.wait(timeout=30)


def port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_429s_narrow_the_width_and_pause_every_actor(cluster, rate_limited_server, caplog):
    # Width 8 over 4 actors: 2 each, 8 at once against a capacity of 4 until the gate narrows
    # the width to one request per actor. The bridge waits out each 429 after its `Retry-After`
    # without using up one of a call's 4 attempts (for up to a minute), so however the actors'
    # calls meet, every sub-call is answered: a row that counted 7 lost one (session 16).
    caplog.set_level(logging.WARNING, logger="rlm_kernel.ray")
    results = map_completions(
        rows(24), actors=4, batch_concurrency=8,
        model="root", sub_model="sub", base_url=rate_limited_server,
    )
    assert [r["error"] for r in results] == [None] * 24, results
    assert [r["answer"] for r in results] == ["8"] * 24, results
    said = caplog.text
    assert "went down to 4 (of 8)" in said, said
    assert "paused" in said and "paused 0 time" not in said, said


def eval_command(tmp_path, name: str, *extra: str, tasks: str = "needle,aggregate,pairs") -> list:
    return [
        str(rlm_binary()), "eval", "--scripted", "--tasks", tasks,
        "--sizes", "8k", "--n", "3", "--baseline-window", "1k",
        "--out", str(tmp_path / name), "--json", *extra,
    ]


def same_everywhere(document: dict) -> dict:
    """What a local and a cluster evaluation must share: every run's task, size, seed, method,
    score, exactness, outcome, answer and counts (not timings, prompt tokens or file paths)."""
    keep = ("task", "size_tokens", "index", "seed", "method", "depth", "context_tokens",
            "score", "exact", "outcome", "iterations", "sub_calls", "model_calls", "child_runs",
            "answer")
    return {
        "depths": document["depths"],
        "runs": [{k: run[k] for k in keep} for run in document["runs"]],
        "summary": [
            {k: row[k] for k in ("task", "size_tokens", "method", "depth", "runs", "score",
                                 "exact", "iterations", "sub_calls", "model_calls",
                                 "child_runs", "failures")}
            for row in document["summary"]
        ],
    }


def test_rlm_eval_on_the_cluster_writes_what_a_local_eval_writes(cluster, tmp_path):
    env = dict(os.environ, RLM_PYTHON=sys.executable)
    local = subprocess.run(eval_command(tmp_path, "local"), capture_output=True, text=True,
                           timeout=600, env=env)
    assert local.returncode == 0, local.stderr
    on_ray = subprocess.run(eval_command(tmp_path, "ray", "--ray", cluster.address),
                            capture_output=True, text=True, timeout=900, env=env)
    assert on_ray.returncode == 0, on_ray.stderr[-6000:]
    assert "every scripted run scored 1" in on_ray.stderr, on_ray.stderr[-6000:]
    assert same_everywhere(json.loads(on_ray.stdout)) == same_everywhere(json.loads(local.stdout))
    files = lambda name: sorted(p.name for p in (tmp_path / name).iterdir())  # noqa: E731
    assert files("ray") == files("local")
    assert len(files("ray")) == 3 * 3 + 1, files("ray")
    # A trajectory written from the cluster reads back as a local one does.
    shown = subprocess.run([str(rlm_binary()), "show", str(tmp_path / "ray" / "needle-8k-000.jsonl")],
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr


def test_rlm_eval_sweeps_depths_on_the_cluster_as_here(cluster, tmp_path):
    # `linked` at depths 1 and 2: at depth 2 each run's root starts `rlm_query` children (each
    # a loop of its own in a worker process of its own, on the actor's node) — scores, calls
    # and children per depth as a local sweep has them.
    env = dict(os.environ, RLM_PYTHON=sys.executable)
    sweep = ("--depths", "1,2")
    local = subprocess.run(eval_command(tmp_path, "local", *sweep, tasks="linked"),
                           capture_output=True, text=True, timeout=600, env=env)
    assert local.returncode == 0, local.stderr
    on_ray = subprocess.run(
        eval_command(tmp_path, "ray", *sweep, "--ray", cluster.address, tasks="linked"),
        capture_output=True, text=True, timeout=900, env=env,
    )
    assert on_ray.returncode == 0, on_ray.stderr[-6000:]
    assert "every scripted run scored as its script says" in on_ray.stderr, on_ray.stderr[-6000:]
    here, there = json.loads(local.stdout), json.loads(on_ray.stdout)
    assert same_everywhere(there) == same_everywhere(here)
    by_depth = {
        row["depth"]: row for row in there["summary"] if row["method"] == "rlm"
    }
    assert sorted(by_depth) == [1, 2], there["summary"]
    # Depth 1 cannot relate the records (0, as scripted); depth 2's children can (1).
    assert (by_depth[1]["score"], by_depth[2]["score"]) == (0.0, 1.0), by_depth
    assert by_depth[1]["child_runs"] == 0 and by_depth[2]["child_runs"] > 0, by_depth
    assert by_depth[2]["model_calls"] > by_depth[1]["model_calls"], by_depth
    files = lambda name: sorted(p.name for p in (tmp_path / name).iterdir())  # noqa: E731
    assert files("ray") == files("local")
    assert files("ray") == [
        f"linked-8k-d{depth}-{i:03d}.jsonl" for depth in (1, 2) for i in range(3)
    ] + ["results.json"], files("ray")
    # The tree a child run made on the cluster reads back: its children under their block.
    shown = subprocess.run([str(rlm_binary()), "show", str(tmp_path / "ray" / "linked-8k-d2-000.jsonl")],
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert "rlm_query children ×4" in shown.stdout and "#3 sub · 2 iterations" in shown.stdout, shown.stdout


def test_rlm_eval_ray_without_the_package_says_what_to_install(tmp_path):
    # An interpreter without `rlm_kernel`: the system's, with no site packages of ours.
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nexec {sys.executable} -I -S \"$@\"\n")
    python.chmod(0o755)
    done = subprocess.run(eval_command(tmp_path, "none", "--ray"), capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, RLM_PYTHON=str(python)))
    said = done.stdout + done.stderr  # with `--json` the error is a document on stdout
    assert done.returncode == 1, said
    assert "No module named 'rlm_kernel'" in said, said
    assert "pip install 'rlm-kernel[ray]'" in said and "RLM_PYTHON" in said, said
    assert not (tmp_path / "none" / "results.json").exists()


def test_a_failing_row_is_a_row_with_its_error_and_budgets_hold_per_row_as_here(
    cluster, tmp_path, caplog
):
    caplog.set_level(logging.WARNING, logger="rlm_kernel.ray")
    given = rows(7)
    given[2] = {"query": "Count the words.", "context": tmp_path / "missing.txt"}
    given[4] = {"query": 42, "context": "a b"}
    # A word too long for the sub-model's window: its sub-call fails, the row does not.
    given[6] = {"query": "Count the words.", "context": "short " + "x" * 12_000}
    with MockServer(scripted(latency_ms=10)) as mock:
        options = dict(model="root", sub_model="sub", base_url=mock.base_url)
        results = map_completions(given, actors=2, sub_context_window=2000, **options)
        # Two sub-calls a row (rows of two words or more) against a budget of one: each row
        # stops on its budget, on the cluster as here.
        limited = map_completions(rows(5)[1:], actors=2, max_sub_calls=1, **options)
        limited_here = map_completions(rows(5)[1:], serial=True, max_sub_calls=1, **options)
    assert "missing.txt" in results[2]["error"], results[2]
    assert results[2]["answer"] is None
    assert "The query must be a `str`" in results[4]["error"], results[4]
    for i in (0, 1, 3, 5):
        assert results[i]["error"] is None and results[i]["answer"] == expected_answer(given[i]["context"])
    assert results[6]["error"] is None and results[6]["metrics"]["sub_call_errors"] == 1, results[6]
    assert results[6]["answer"].startswith("2:short|Error: Prompt of"), results[6]
    # The job's summary names the rows that failed and the row to distrust, and the caller has
    # it as data, with the gate's counts.
    assert "2 of 7 rows failed: rows 2, 4;" in caplog.text, caplog.text
    assert "1 of 7 rows had sub-calls that failed" in caplog.text, caplog.text
    assert "rows 6;" in caplog.text, caplog.text
    summary = results.summary
    assert (summary["rows"], summary["rows_failed"], summary["failed_rows"]) == (7, 2, [2, 4])
    assert (summary["rows_failed_sub_calls"], summary["failed_sub_call_rows"]) == (1, [6]), summary
    assert (summary["rows_retried"], summary["actors"]) == (0, 2), summary
    for result in limited:
        assert result["termination_reason"] == "call_budget", result
        assert "1 of 1 sub-calls used" in result["error"], result
    assert [comparable(r) for r in limited] == [comparable(r) for r in limited_here]


def test_a_datasets_summary_counts_its_materialised_rows_and_a_lazy_one_is_refused(cluster):
    given = rows(4) + [{"query": "Count the words.", "context": "short " + "x" * 12_000}]
    with MockServer(scripted(latency_ms=10)) as mock:
        lazy = map_completions(
            ray.data.from_items(given), actors=2, sub_context_window=2000,
            model="root", sub_model="sub", base_url=mock.base_url,
        )
        # Counting a lazy Dataset would run it: refused, and nothing ran.
        with pytest.raises(ValueError, match=r"not materialised.*ds\.materialize\(\)"):
            summarize(lazy)
        assert mock.arrived == 0, mock.arrived
        done = lazy.materialize()
        ran = mock.arrived
        summary = summarize(done)
        assert summarize(done) == summary and mock.arrived == ran, "counting ran nothing again"
    assert ran > 0
    assert summary == {"rows": 5, "rows_failed": 0, "failed_rows": [], "rows_failed_sub_calls": 1,
                       "failed_sub_call_rows": [4]}
    # As a list's job counts the same rows.
    assert summary == summarize(done.take_all())
    with pytest.raises(ValueError, match="no `error` and `metrics` columns"):
        summarize(ray.data.from_items(given).materialize())
