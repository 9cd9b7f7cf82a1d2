"""`.ci/setup` on a fresh machine: what the README's two commands start with. It says in one
line what it installs (no traceback first), then installs it."""

import os
import subprocess
import sys

from conftest import REPO


def test_setup_on_a_fresh_interpreter_says_in_one_line_what_it_installs(tmp_path):
    fresh = tmp_path / "fresh"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(fresh)], check=True,
                   timeout=120)
    # The fresh interpreter, with `python -m pip` stood in for: the test reads what setup says
    # before it installs, and installs nothing.
    python = tmp_path / "python"
    python.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then echo "(pip) $*"; exit 0; fi\n'
        f'exec "{fresh}/bin/python" "$@"\n'
    )
    python.chmod(0o755)
    done = subprocess.run(["bash", str(REPO / ".ci" / "setup")], capture_output=True, text=True,
                          env=dict(os.environ, PYO3_PYTHON=str(python)), timeout=120)
    said = done.stdout + done.stderr
    assert done.returncode == 0, said
    assert "Traceback" not in said, said
    lines = [line for line in said.splitlines() if "python3 (Debian)" not in line]
    pins = [l.strip() for l in (REPO / ".ci" / "requirements.txt").read_text().splitlines()
            if "==" in l]
    assert lines[0].startswith("Installing "), said
    assert all(pin in lines[0] for pin in pins), said
    assert lines[1].startswith("(pip) -m pip install") and ".ci/requirements.txt" in lines[1], said
