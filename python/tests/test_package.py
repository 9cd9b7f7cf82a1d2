"""The package as pip installs it: its namespace, its extras, and what it says when an
optional dependency is missing."""

import importlib.metadata
import os
import re
import subprocess
import sys
import textwrap

import rlm_kernel


def test_the_namespace_exports_only_its_api():
    public = {name for name in dir(rlm_kernel) if not name.startswith("_")}
    assert public == set(rlm_kernel.__all__), (
        f"names that are not API: {sorted(public - set(rlm_kernel.__all__))}; "
        f"API not there: {sorted(set(rlm_kernel.__all__) - public)}"
    )
    assert len(rlm_kernel.__all__) == len(set(rlm_kernel.__all__))
    namespace = {}
    exec("from rlm_kernel import *", namespace)
    assert set(namespace) - {"__builtins__"} == set(rlm_kernel.__all__)


def _extras():
    """`{extra: {requirement name, ...}}` from the installed metadata."""
    extras = {}
    for requirement in importlib.metadata.requires("rlm-kernel") or []:
        match = re.search(r"""extra\s*==\s*["']([^"']+)["']""", requirement)
        if match:
            name = re.match(r"[A-Za-z0-9_.-]+", requirement).group(0).lower()
            extras.setdefault(match.group(1), set()).add(name)
    return extras


def test_extras_install_what_each_use_needs():
    extras = _extras()
    assert set(importlib.metadata.metadata("rlm-kernel").get_all("Provides-Extra")) >= {
        "polars", "pandas", "excel", "notebook", "ray"
    }
    assert "polars" in extras["polars"]
    assert "pandas" in extras["pandas"]
    assert {"fastexcel", "polars"} <= extras["excel"]
    assert {"ipython", "ipykernel"} <= extras["notebook"]
    assert "ray" in extras["ray"]
    # A plain `pip install rlm-kernel` pulls nothing: the optional packages stay optional.
    plain = [r for r in importlib.metadata.requires("rlm-kernel") or [] if "extra ==" not in r]
    assert plain == []


def test_a_missing_polars_names_the_extra_to_install(tmp_path):
    # A `polars` that cannot be imported shadows the installed one, in a fresh interpreter.
    fake = tmp_path / "hide"
    (fake / "polars").mkdir(parents=True)
    (fake / "polars" / "__init__.py").write_text(
        "raise ImportError(\"No module named 'polars' (hidden by the test)\")\n"
    )
    table = tmp_path / "sales.csv"
    table.write_text("region,amount\nnorth,1\n")
    program = textwrap.dedent(
        f"""
        import pathlib
        from rlm_kernel import RLM, MockServer

        with MockServer({{"models": {{"*": {{"replies": ["FINAL(done)"]}}}}}}) as mock:
            try:
                RLM(model="root", base_url=mock.base_url).completion(
                    "q", context=pathlib.Path({str(table)!r}))
            except Exception as error:
                print(type(error).__name__, error)
            else:
                print("no error")
        """
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(fake), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run(
        [sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    said = done.stdout
    assert "`polars`" in said and "sales.csv" in said, said
    assert "pip install 'rlm-kernel[polars]'" in said, said
    assert ".ci/setup" not in said, said
