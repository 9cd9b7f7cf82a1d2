#!/usr/bin/env python3
"""Exits 0 when this interpreter has every `name==version` of a requirements file; else says
in one line what is to be installed, and into which interpreter, and exits 1.

`.ci/setup` and `.ci/python-test` run it before `pip install -r FILE`, so a fresh machine sees
one line saying what comes next, not a traceback.

    python3 .ci/check-pins.py .ci/requirements.txt || python3 -m pip install -r .ci/requirements.txt
"""
import importlib.metadata as md
import sys


def pins(path: str) -> dict:
    """`{name: version}` of the file's `name==version` lines (comments and others skipped);
    `name[extra]==version` pins `name` (the extra's own packages are pinned on lines of
    their own)."""
    found = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.split("#")[0].strip()
            if "==" in line:
                name, version = (part.strip() for part in line.split("==", 1))
                found[name.split("[")[0].strip()] = version
    return found


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: check-pins.py REQUIREMENTS_FILE")
    path = sys.argv[1]
    wanted = pins(path)
    to_install = []
    for name, version in wanted.items():
        try:
            installed = md.version(name)
        except md.PackageNotFoundError:
            to_install.append(f"{name}=={version}")
            continue
        if installed != version:
            to_install.append(f"{name}=={version} (has {installed})")
    if to_install:
        print(f"Installing {', '.join(to_install)} from `{path}` into `{sys.executable}`",
              flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
