"""Session defaults, and the options the kernel's schema offers the Python package.

The options are the kernel's own (`rlm_kernel._native.option_specs()`): every `rlm run`
flag with `_` for `-`, checked and merged in Rust as the CLI merges them. Precedence,
highest first: keyword arguments (or `%%rlm` flags) > these session defaults (`%rlm_config`,
`configure`) > `RLM_*` environment variables > the `[run]` table of `rlm.toml` (the file
`RLM_CONFIG` names, else `./rlm.toml`). This module lists no option itself.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List

from . import _native

#: Every option the package takes, as the kernel describes it: `name`, `key` (in rlm.toml),
#: `flag`, `help`, `kind`, `choices`, `repeated`, `env`, `example`.
SPECS: List[Dict[str, Any]] = _native.option_specs()

#: The names of the options `RLM`, `llm_query`, `configure` and `%%rlm` take: the `rlm run`
#: flags with `_` for `-` (`SPECS` describes each).
OPTIONS = tuple(spec["name"] for spec in SPECS)

#: Session defaults set by `%rlm_config` (or `rlm_kernel.configure`), checked and in the
#: kernel's canonical form.
defaults: Dict[str, Any] = {}


def to_json(options: Dict[str, Any]) -> str:
    """`options` as the JSON the kernel reads: paths as strings, tuples as lists; `None`
    left out (unset)."""

    def plain(value: Any) -> Any:
        if isinstance(value, os.PathLike):
            return os.fspath(value)
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        return value

    return json.dumps({k: plain(v) for k, v in options.items() if v is not None})


def checked(options: Dict[str, Any], where: str) -> Dict[str, Any]:
    """`options` checked by the kernel (unknown names raise `TypeError`, bad values
    `ValueError`), in canonical form."""
    return json.loads(_native.check_options(to_json(options), where))
