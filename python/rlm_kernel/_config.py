"""Options by their `rlm run` flag names, resolved as the CLI resolves them.

Precedence, highest first: keyword arguments (or `%%rlm` flags) > `%rlm_config` defaults of
this session > `RLM_*` environment variables > the `[run]` table of `rlm.toml` (the file
named by `RLM_CONFIG`, else `./rlm.toml`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Dict, Optional

PathLike = "path"
# A whole number or the word `auto` (`batch_concurrency`).
Width = "width"

# name -> type; names are the `rlm run` flags with `_` for `-`.
OPTIONS: Dict[str, Any] = {
    "model": str,
    "sub_model": str,
    "base_url": str,
    "sub_base_url": str,
    "extra_models": list,
    "provider": str,
    "api_key_env": str,
    "max_output_tokens": int,
    "temperature": float,
    "max_iterations": int,
    "timeout": float,
    "cell_timeout": float,
    "sub_timeout": float,
    "max_sub_calls": int,
    "max_tokens": int,
    "max_usd": float,
    "price": str,
    "sub_price": str,
    "batch_concurrency": Width,
    "sub_call_errors": str,
    "protocol": str,
    "code_and_final": str,
    "output_limit": int,
    "max_history_chars": int,
    "max_consecutive_failures": int,
    "prompt_extension": PathLike,
    "system_prompt": PathLike,
    "trajectory": PathLike,
}

# Options the CLI reads from no environment variable.
_NO_ENV = {"extra_models", "prompt_extension", "system_prompt", "trajectory"}

#: Session defaults set by `%rlm_config` (or `rlm_kernel.configure`).
defaults: Dict[str, Any] = {}


def check_names(options: Dict[str, Any], where: str) -> None:
    """Refuse names that are not `rlm run` flags, naming the known ones."""
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        known = ", ".join(sorted(OPTIONS))
        raise TypeError(
            f"{where} got unknown option(s) {', '.join(f'`{n}`' for n in unknown)}; "
            f"the options are the `rlm run` flags with `_` for `-`: {known}"
        )


def convert(name: str, value: Any, source: str) -> Any:
    """`value` as the option's type (strings from the environment or a magic's line)."""
    kind = OPTIONS[name]
    if value is None:
        return None
    try:
        if kind is list:
            return [value] if isinstance(value, str) else [str(v) for v in value]
        if kind == PathLike:
            return os.fspath(value)
        if kind == Width and not isinstance(value, bool):
            if isinstance(value, str) and value.strip().lower() == "auto":
                return "auto"
            return int(value)
        if kind is int and not isinstance(value, bool):
            return int(value)
        if kind is float and not isinstance(value, bool):
            return float(value)
        if kind is str:
            return str(value)
    except (TypeError, ValueError):
        pass
    type_name = {
        int: "an integer",
        float: "a number",
        str: "a string",
        Width: "an integer or `auto`",
    }.get(kind, "a path")
    raise ValueError(f"Option `{name}` from {source} must be {type_name}, got {value!r}")


def _env_options() -> Dict[str, Any]:
    found = {}
    for name in OPTIONS:
        if name in _NO_ENV:
            continue
        var = "RLM_" + name.upper()
        if var in os.environ:
            found[name] = convert(name, os.environ[var], f"`{var}`")
    return found


def config_file() -> Optional[Path]:
    """The configuration file in use: `RLM_CONFIG`, else `./rlm.toml` when it exists."""
    explicit = os.environ.get("RLM_CONFIG")
    if explicit:
        return Path(explicit)
    path = Path("rlm.toml")
    return path if path.exists() else None


def _toml_loader() -> Optional[Callable[[bytes], Dict[str, Any]]]:
    try:
        import tomllib  # Python 3.11+
    except ImportError:
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ImportError:
            return None
    return lambda data: tomllib.loads(data.decode("utf-8"))


def _file_options() -> Dict[str, Any]:
    path = config_file()
    if path is None:
        return {}
    loads = _toml_loader()
    if loads is None:
        raise RuntimeError(
            f"Cannot read `{path}`: Python before 3.11 needs the `tomli` package "
            "(`pip install tomli`) to read rlm.toml"
        )
    try:
        table = loads(path.read_bytes()).get("run", {})
    except OSError as e:
        raise RuntimeError(f"Could not read the configuration file `{path}`: {e}") from None
    except ValueError as e:
        raise RuntimeError(f"Configuration file `{path}` is not valid TOML: {e}") from None
    options = {}
    for key, value in table.items():
        name = "extra_models" if key == "extra-models" else key.replace("-", "_")
        if name in ("json", "quiet", "force", "answer_file"):
            continue  # CLI output switches: nothing to do in Python
        if name not in OPTIONS:
            raise RuntimeError(
                f"Configuration file `{path}`: unknown option `{key}` in `[run]`; "
                "options use the flag names, e.g. `max-iterations = 20`"
            )
        value = convert(name, value, f"`{path}`")
        if OPTIONS[name] == PathLike and not os.path.isabs(value):
            value = os.fspath(path.parent / value)  # relative to the file, as in the CLI
        options[name] = value
    return options


def resolve(explicit: Dict[str, Any], where: str) -> Dict[str, Any]:
    """The effective options: explicit > session defaults > environment > rlm.toml."""
    check_names(explicit, where)
    merged: Dict[str, Any] = {}
    for layer in (_file_options(), _env_options(), defaults, explicit):
        for name, value in layer.items():
            if value is not None:
                merged[name] = convert(name, value, where)
    return merged
