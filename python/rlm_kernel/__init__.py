"""rlm-kernel in Python: Recursive Language Models over live objects, from scripts and
notebooks.

    from rlm_kernel import RLM
    result = RLM(model="gpt-4.1", sub_model="gpt-4.1-mini").completion(
        "Which region grew fastest?", context=df)   # df is passed by reference, not copied
    result.answer, result.metrics, result.trajectory

In IPython / Jupyter: `%load_ext rlm_kernel`, then `%%rlm -c df -o ans` with the query as
the cell body, and `%rlm_config` for session defaults.
"""

from __future__ import annotations

import json
from typing import Any, Optional, Union

from . import _native
from ._api import RLM, RLMResult, llm_query, llm_query_batched
from ._config import OPTIONS

__all__ = [
    "RLM",
    "RLMResult",
    "llm_query",
    "llm_query_batched",
    "MockServer",
    "render_trajectory",
    "configure",
    "OPTIONS",
]


def render_trajectory(jsonl: str, collapsed: bool = False) -> str:
    """The HTML view of a trajectory (the JSONL of `rlm run --trajectory`), as `rlm view`
    writes it: one self-contained page, or a collapsed fragment."""
    return _native.render_trajectory(jsonl, collapsed)


def configure(**options: Any) -> None:
    """Sets session defaults for `RLM`, `llm_query` and `%%rlm` (what `%rlm_config` does);
    `None` removes one."""
    from . import _config

    _config.check_names(options, "configure()")
    for name, value in options.items():
        if value is None:
            _config.defaults.pop(name, None)
        else:
            _config.defaults[name] = _config.convert(name, value, "configure()")


class MockServer:
    """The project's mock LM server on 127.0.0.1 (scripted replies, no API key, not a real
    model), in this process: `with MockServer(script) as mock: RLM(model="m",
    base_url=mock.base_url)`. `script` is the mock's JSON script (a dict or JSON text)."""

    def __init__(self, script: Union[dict, str, None] = None, latency_ms: Optional[float] = None):
        text = json.dumps(script) if isinstance(script, dict) else script
        self._server = _native.MockServer(text, latency_ms)

    @property
    def base_url(self) -> str:
        """The OpenAI-compatible base URL (`http://127.0.0.1:PORT/v1`)."""
        return self._server.base_url

    @property
    def requests(self) -> int:
        """Requests served so far."""
        return self._server.requests

    @property
    def arrived(self) -> int:
        """Requests arrived so far, answered or not: with `requests`, shows a call in flight."""
        return self._server.arrived

    def max_concurrency(self) -> int:
        """The most requests that were in flight at once, among those served so far."""
        return self._server.max_concurrency()

    def request_log(self):
        """`[(model, last_user_message), ...]` of the requests served so far."""
        return self._server.request_log()

    def close(self) -> None:
        """Stops the server."""
        self._server.close()

    def __enter__(self) -> "MockServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def load_ipython_extension(ipython) -> None:
    """`%load_ext rlm_kernel`: registers `%%rlm` and `%rlm_config`."""
    from ._magic import register

    register(ipython)
