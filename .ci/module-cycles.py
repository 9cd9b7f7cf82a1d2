#!/usr/bin/env python3
"""Fails when modules of one folder import each other in a circle.

Checks the folders named on the command line (default: every module folder of the
workspace's library crates, found on disk). A module's imports are its `use super::X` / `use crate::a::X`
lines outside `#[cfg(test)]` blocks, mapped to sibling files of the same folder. Prints each
cycle (a strongly connected component of more than one module) and exits 1 if there is one.
"""
import re
import sys
from pathlib import Path

def default_folders(root: Path) -> list:
    """Every folder of Rust modules in the library crates (`bridge` and `kernel/*`)."""
    crates = [root / "bridge", *sorted(p for p in (root / "kernel").iterdir() if p.is_dir())]
    folders = []
    for crate in crates:
        src = crate / "src"
        if (src / "lib.rs").exists():
            folders += [d for d in [src, *sorted(src.rglob("*"))]
                        if d.is_dir() and any(d.glob("*.rs"))]
    return [str(d.relative_to(root)) for d in folders]


def production_text(path: Path) -> str:
    text = path.read_text()
    cut = text.find("#[cfg(test)]\nmod tests")
    return text if cut < 0 else text[:cut]


def module_name(folder: Path, path: Path) -> str:
    rel = path.relative_to(folder)
    return rel.parts[0].removesuffix(".rs")


def imports(folder: Path, crate_prefix: str, text: str, siblings: set) -> set:
    found = set()
    # Join multi-line `use` statements.
    for stmt in re.findall(r"\buse\s+([^;]+);", text):
        stmt = re.sub(r"\s+", "", stmt)
        for prefix in ("super::", crate_prefix):
            if stmt.startswith(prefix):
                rest = stmt[len(prefix):]
                head = re.split(r"::|\{|,", rest)[0]
                if head in siblings:
                    found.add(head)
                elif rest.startswith("{"):
                    for part in re.split(r"[{},]", rest):
                        part = part.split("::")[0]
                        if part in siblings:
                            found.add(part)
    return found


def check(folder: Path) -> list:
    files = [p for p in folder.glob("*.rs") if p.name not in ("mod.rs", "lib.rs")]
    files += [p / "mod.rs" for p in folder.iterdir() if (p / "mod.rs").exists()]
    siblings = {module_name(folder, p) for p in files}
    # `crate::rlm::x` style paths for modules below the crate root.
    src = next(p for p in [folder, *folder.parents] if p.name == "src")
    rel = folder.relative_to(src).parts
    crate_prefix = "crate::" + "".join(f"{p}::" for p in rel)
    graph = {}
    for p in files:
        name = module_name(folder, p)
        text = production_text(p)
        prefix_here = crate_prefix
        deps = imports(folder, prefix_here, text, siblings) - {name}
        if p.name == "mod.rs":
            # Inside `x/mod.rs`, `super::` is this folder's parent: only `crate::` paths count.
            deps = imports(folder, crate_prefix, text.replace("super::", "\0"), siblings) - {name}
        graph[name] = deps
    return [c for c in sccs(graph) if len(c) > 1]


def sccs(graph: dict) -> list:
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def main() -> int:
    root = Path(__file__).resolve().parent.parent
    folders = sys.argv[1:] or default_folders(root)
    bad = False
    for f in folders:
        for cycle in check(root / f):
            bad = True
            print(f"import cycle in {f}: {' <-> '.join(cycle)}")
    if not bad:
        print(f"no import cycles in {len(folders)} module folders")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
