#!/usr/bin/env python3
"""Before and after: the same benchmarks built at a base commit and at the working tree, run
alternately in one session, each figure printed with both values and their ratio.

    python3 benches/compare.py --base main --bench routed
    python3 benches/compare.py --base 33dec8c --bench routed --bench flow --rounds 5 -- --quick

A figure measured on a shared machine means little on its own; what the load does to one
build it does to the other when they take turns. So the base commit is checked out in a git
worktree of its own under the target folder (`target/bench-compare/base`), both builds share
the target folder (dependencies compile once), each bench binary is copied aside as soon as
it is built, and the rounds run base, head, head, base, ... so neither side always goes
first. The worktree is removed when the script ends, however it ends.

Cargo names a workspace crate's artifacts by its path relative to the workspace root, so the
two checkouts' crates share artifact names in the shared target folder, and the base's,
built last, would look up to date to the working tree (whose sources are older): the head
build would silently reuse the base's code. So the workspace crates the base build compiled
are cleaned (`cargo clean -p`) as soon as its binaries are copied, and again when the script
ends, and a head binary identical to the base's is refused.

Every line a bench prints that holds numbers is a figure row; a row whose numbers differ
between the two builds (the median over the rounds, number by number) is printed in the
summary as `base → head (head/base)` for each number that changed. The benches print their
own baseline in the same run (the routed bench: routed vs plain), so a row's in-binary ratio
is compared too.

`--self-test` checks the summary's parsing and arithmetic without building anything.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")


def shape(line: str) -> str:
    """The line with each number replaced by `#` and each run of spaces by one (a column
    padded to a number's width): rows of the two builds pair up by it."""
    return " ".join(NUMBER.sub("#", line).split())


def numbers(line: str) -> list[float]:
    return [float(n) for n in NUMBER.findall(line)]


def figures(outputs: list[str]) -> dict[str, list[list[float]]]:
    """Per row shape, the numbers of each output that printed it (in order of first sight).
    Rows of one output that differ only by their numbers (the same row at 0 ms and at 50 ms
    of latency) are told apart by their order: the second is `shape [2]`, and so on."""
    rows: dict[str, list[list[float]]] = {}
    for output in outputs:
        seen: dict[str, int] = {}
        for line in output.splitlines():
            found = numbers(line)
            if found:
                key = shape(line)
                seen[key] = seen.get(key, 0) + 1
                if seen[key] > 1:
                    key = f"{key} [{seen[key]}]"
                rows.setdefault(key, []).append(found)
    return rows


def medians(samples: list[list[float]]) -> list[float] | None:
    """The median of each number over the samples; `None` when their counts differ."""
    if not samples or len({len(s) for s in samples}) != 1:
        return None
    return [statistics.median(column) for column in zip(*samples)]


def fmt(value: float) -> str:
    return f"{value:.4g}"


def summary(base: list[str], head: list[str]) -> list[str]:
    """One line per row whose median numbers differ between the builds."""
    base_rows, head_rows = figures(base), figures(head)
    lines = []
    for row, head_samples in head_rows.items():
        before, after = medians(base_rows.get(row, [])), medians(head_samples)
        if before is None or after is None or before == after:
            continue
        changes = []
        for i, (b, h) in enumerate(zip(before, after)):
            if b == h:
                continue
            ratio = f"{h / b:.2f}x" if b else "-"
            changes.append(f"#{i + 1}: {fmt(b)} → {fmt(h)} ({ratio})")
        lines.append(f"{row.strip()}\n    {'   '.join(changes)}")
    return lines


def self_test() -> None:
    base = [
        "event log + SQLite checkpoints: time    200.0 ms     100.0 ms      2.00x\n"
        "steps: 1000\n",
        "event log + SQLite checkpoints: time    220.0 ms     100.0 ms      2.20x\n"
        "steps: 1000\n",
        "event log + SQLite checkpoints: time    210.0 ms     105.0 ms      2.00x\n"
        "steps: 1000\n",
    ]
    head = [
        "event log + SQLite checkpoints: time    150.0 ms     100.0 ms      1.50x\n"
        "steps: 1000\nonly in head 3\n",
    ]
    lines = summary(base, head)
    assert len(lines) == 1, lines
    assert lines[0].startswith("event log + SQLite checkpoints: time # ms"), lines
    assert "#1: 210 → 150 (0.71x)" in lines[0], lines
    assert "#3: 2 → 1.5 (0.75x)" in lines[0], lines
    assert "#2" not in lines[0], "an unchanged number is left out"
    assert medians([[1.0], [1.0, 2.0]]) is None
    # The same row at two latencies stays two rows.
    twice = ["| process | 0 ms | 9.0 |\n| process | 50 ms | 5.0 |\n"] * 2
    assert summary(twice, ["| process | 0 ms | 8.0 |\n| process | 50 ms | 4.0 |\n"]) == [
        "| process | # ms | # |\n    #2: 9 → 8 (0.89x)",
        "| process | # ms | # | [2]\n    #2: 5 → 4 (0.80x)",
    ], summary(twice, ["| process | 0 ms | 8.0 |\n| process | 50 ms | 4.0 |\n"])
    assert shape("| a | 0.090 ms | -1 |") == "| a | # ms | # |"
    assert shape("time    14.4 ms      7.2 ms") == shape("time    9.4 ms       7.2 ms")
    assert package_name("path+file:///w/kernel/engine#rlm-engine@0.1.0") == "rlm-engine"
    assert package_name("path+file:///w/benches#0.1.0") == "benches"
    print("compare.py self-test: ok")


def run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, **kwargs)


def build(
    src: Path, target: Path, benches: list[str], into: Path, label: str, local: set[str]
) -> dict[str, Path]:
    """Builds `benches` in checkout `src` into `target`; copies each binary to `into`.

    Adds to `local` the checkout's packages whose artifacts the build wrote (a failed build
    too); returns the copies by bench.
    """
    cmd = ["cargo", "bench", "-p", "rlm-benches", "--no-run", "--locked"]
    for bench in benches:
        cmd += ["--bench", bench]
    cmd += ["--message-format", "json-render-diagnostics"]
    env = dict(os.environ, CARGO_TARGET_DIR=str(target))
    print(f"== building {', '.join(benches)} at {label} ({src})", flush=True)
    done = subprocess.run(cmd, cwd=src, env=env, stdout=subprocess.PIPE, text=True)
    binaries: dict[str, Path] = {}
    for line in done.stdout.splitlines():
        try:
            message = json.loads(line)
        except json.JSONDecodeError:
            continue
        target_info = message.get("target", {})
        package = message.get("package_id", "")
        if message.get("reason") == "compiler-artifact" and package.startswith("path+"):
            # `path+file:///...#name@version`: a crate of the checkout, not of a registry.
            local.add(package_name(package))
        if (
            message.get("reason") == "compiler-artifact"
            and "bench" in target_info.get("kind", [])
            and target_info.get("name") in benches
            and message.get("executable")
        ):
            copy = into / f"{label}-{target_info['name']}"
            shutil.copy2(message["executable"], copy)
            binaries[target_info["name"]] = copy
    if done.returncode != 0:
        sys.exit(f"error: the build at {label} failed (exit {done.returncode})")
    missing = [b for b in benches if b not in binaries]
    if missing:
        sys.exit(f"error: cargo built no bench binary for {missing} at {label}")
    return binaries


def package_name(package_id: str) -> str:
    """The name in a cargo package id: `path+file:///w/kernel/engine#rlm-engine@0.1.0` (or,
    when the name is the folder's, `path+file:///w/benches#0.1.0`: here `benches`)."""
    source, _, fragment = package_id.rpartition("#")
    name, at, _version = fragment.rpartition("@")
    return name if at else source.rstrip("/").rsplit("/", 1)[-1]


def forget(root: Path, target: Path, packages: set[str]) -> None:
    """Removes the artifacts of `packages` (the working tree's workspace packages among them)
    from the bench profile of `target`, so that the next build of the working tree compiles
    them from its own sources."""
    if not packages:
        return
    cmd = ["cargo", "clean", "--profile", "bench", "--quiet"]
    for package in sorted(packages):
        cmd += ["-p", package]
    env = dict(os.environ, CARGO_TARGET_DIR=str(target))
    run(cmd, cwd=root, env=env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="main", help="the commit to compare against (main)")
    parser.add_argument("--bench", action="append", default=[], help="a bench of rlm-benches")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each build (3)")
    parser.add_argument("--self-test", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("args", nargs="*", help="after `--`: arguments for every bench run")
    opts = parser.parse_args()
    if opts.self_test:
        self_test()
        return
    if not opts.bench:
        parser.error("name at least one bench: `--bench routed`")
    if opts.rounds < 1:
        parser.error("`--rounds` must be at least 1")

    root = Path(__file__).resolve().parent.parent
    metadata = json.loads(
        run(
            ["cargo", "metadata", "--format-version", "1", "--no-deps"],
            cwd=root,
            stdout=subprocess.PIPE,
            text=True,
        ).stdout
    )
    target = Path(metadata["target_directory"])
    members = {package["name"] for package in metadata["packages"]}
    work = target / "bench-compare"
    worktree = work / "base"
    base_rev = run(
        ["git", "rev-parse", "--short", f"{opts.base}^{{commit}}"],
        cwd=root,
        stdout=subprocess.PIPE,
        text=True,
    ).stdout.strip()
    head_rev = run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=root, stdout=subprocess.PIPE, text=True
    ).stdout.strip()
    dirty = run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=root,
        stdout=subprocess.PIPE,
        text=True,
    ).stdout.strip()
    head_label = f"{head_rev}{' + uncommitted changes' if dirty else ''}"

    work.mkdir(parents=True, exist_ok=True)
    if worktree.exists():
        subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=root)
    binaries = Path(tempfile.mkdtemp(prefix="bins-", dir=work))
    built_at_base: set[str] = set()
    try:
        run(["git", "worktree", "add", "--detach", "--quiet", str(worktree), base_rev], cwd=root)
        base = build(worktree, target, opts.bench, binaries, "base", built_at_base)
        forget(root, target, built_at_base & members)
        built_at_base.clear()
        head = build(root, target, opts.bench, binaries, "head", set())
        same = [b for b in opts.bench if base[b].read_bytes() == head[b].read_bytes()]
        if same:
            sys.exit(f"error: the head binary of {same} is the base's: cargo reused an artifact")
        outputs: dict[tuple[str, str], list[str]] = {}
        for round_ in range(opts.rounds):
            # Alternate who goes first, so a drifting load favours neither side.
            order = [("base", base), ("head", head)]
            if round_ % 2:
                order.reverse()
            for label, built in order:
                for bench in opts.bench:
                    print(f"== round {round_ + 1}/{opts.rounds}: {bench} at {label}", flush=True)
                    result = run(
                        [str(built[bench]), "--bench", *opts.args],
                        cwd=worktree if label == "base" else root,
                        stdout=subprocess.PIPE,
                        text=True,
                    )
                    print(result.stdout, end="", flush=True)
                    outputs.setdefault((bench, label), []).append(result.stdout)
        print()
        for bench in opts.bench:
            print(
                f"## {bench}: base {base_rev} → head {head_label}, median of {opts.rounds} "
                "alternated rounds (numbers that changed, by position in the row)"
            )
            lines = summary(outputs[(bench, "base")], outputs[(bench, "head")])
            print("\n".join(lines) if lines else "(no figure changed)")
    finally:
        # Stopped before the base's artifacts were cleaned: none may pass for the working tree's.
        forget(root, target, built_at_base & members)
        subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=root)
        subprocess.run(["git", "worktree", "prune"], cwd=root)
        shutil.rmtree(binaries, ignore_errors=True)


if __name__ == "__main__":
    main()
