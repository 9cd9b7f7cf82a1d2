"""`MockServer`: the project's mock LM server, started in this process from the extension."""

from __future__ import annotations

import json
from typing import Any, Optional, Union

from . import _native


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
