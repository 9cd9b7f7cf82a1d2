"""The example notebook runs top to bottom with `jupyter nbconvert --execute`."""

import json
import subprocess
import sys

from conftest import REPO


def test_quickstart_notebook_executes(tmp_path):
    notebook = REPO / "python" / "examples" / "quickstart.ipynb"
    run = subprocess.run(
        [sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute",
         "--output-dir", str(tmp_path), str(notebook)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    executed = json.loads((tmp_path / "quickstart.ipynb").read_text())
    outputs = [o for c in executed["cells"] if c["cell_type"] == "code" for o in c["outputs"]]
    assert not [o for o in outputs if o["output_type"] == "error"]
    assert any("final_answer" in "".join(o.get("text", "")) for o in outputs)
