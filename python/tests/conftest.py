"""Shared helpers: the project's mock LM server (from the extension) and scripted models."""

import os
import shutil
import time
from pathlib import Path

import pytest

from rlm_kernel import MockServer

REPO = Path(__file__).resolve().parents[2]


def repl(code: str) -> str:
    """A ```repl block, as a root model writes one."""
    return f"```repl\n{code}\n```"


def script(root_replies, sub=None, root_latency_ms=None, sub_latency_ms=None):
    """A mock script: model `root` answers `root_replies` by turn, `sub` echoes (or `sub`)."""
    root = {"replies": list(root_replies)}
    if root_latency_ms:
        root["latency"] = {"kind": "fixed", "ms": root_latency_ms}
    sub_entry = {"replies": [sub if sub is not None else {"behaviour": "echo"}]}
    if sub_latency_ms:
        sub_entry["latency"] = {"kind": "fixed", "ms": sub_latency_ms}
    return {"models": {"root": root, "sub": sub_entry}}


def wait_until(condition, what: str, timeout: float = 60.0) -> None:
    """Polls `condition` until it holds; fails naming `what` after `timeout` seconds (a bound
    for a hung run, not a timing assertion: on a loaded machine readiness takes what it takes)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting until {what}")
        time.sleep(0.02)


def sub_call_in_flight(mock) -> bool:
    """The root model has answered once and a second request (the sub-call) has arrived."""
    return mock.requests >= 1 and mock.arrived >= 2


@pytest.fixture
def mock_server():
    """`mock_server(script, latency_ms=None)` starts a mock server closed after the test."""
    servers = []

    def start(s, latency_ms=None):
        server = MockServer(s, latency_ms=latency_ms)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()


@pytest.fixture(autouse=True)
def _clean_rlm_environment(monkeypatch, tmp_path):
    """Tests see no `RLM_*` variables and no rlm.toml of the developer's."""
    for key in list(os.environ):
        if key.startswith("RLM_"):
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)


def rlm_binary() -> Path:
    """The `rlm` binary built by cargo (`RLM_BIN` overrides)."""
    path = Path(os.environ.get("RLM_BIN_PATH", REPO / "target" / "debug" / "rlm"))
    if not path.exists():
        pytest.fail(f"`{path}` is missing; build it with `cargo build -p rlm-cli`")
    return path


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    pytest.fail("Chromium is missing; install it with `apt-get install -y chromium`")


# The Ray cluster tests run only inside a private network namespace, started there by
# `test_ray.py` (see `ray_cluster/harness.py`).
collect_ignore = [] if os.environ.get("RLM_RAY_TEST_NETNS") == "1" else ["ray_cluster"]
