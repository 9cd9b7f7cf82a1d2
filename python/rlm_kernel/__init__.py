"""rlm-kernel in Python: Recursive Language Models over live objects, from scripts and
notebooks.

    from rlm_kernel import RLM
    result = RLM(model="gpt-4.1", sub_model="gpt-4.1-mini").completion(
        "Which region grew fastest?", context=df)   # df is passed by reference, not copied
    result.answer, result.metrics, result.trajectory

In IPython / Jupyter: `%load_ext rlm_kernel`, then `%%rlm -c df -o ans` with the query as
the cell body, and `%rlm_config` for session defaults.
"""

from ._api import RLM, RLMResult, configure, llm_query, llm_query_batched, render_trajectory
from ._config import OPTIONS
from ._mock import MockServer

__all__ = [
    "RLM",
    "RLMResult",
    "llm_query",
    "llm_query_batched",
    "MockServer",
    "render_trajectory",
    "configure",
    "OPTIONS",
    "load_ipython_extension",
]


def load_ipython_extension(ipython) -> None:
    """`%load_ext rlm_kernel`: registers `%%rlm` and `%rlm_config`."""
    from ._magic import register

    register(ipython)
