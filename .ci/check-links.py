#!/usr/bin/env python3
"""Fails when a relative link or `#anchor` in a tracked Markdown file does not resolve.

Checks every `.md` file `git ls-files` lists (or the files named on the command line):
inline links and images `[text](target)`, reference definitions `[name]: target` and
`href`/`src` attributes of inline HTML, outside fenced code blocks and code spans. A target
with a scheme (`https:`, `mailto:` ...) is left alone. A path must name a file or folder of
the repository (relative to the linking file; `/path` from the repository root); an anchor
into a Markdown file must name one of its headings, slugged as GitHub does (lower case,
everything but letters, digits, `_`, `-` and spaces dropped, each space a `-`, a repeated
heading `-1`, `-2` ...) or an explicit `id`/`name` of an HTML element.
Prints `file:line: ...` for each broken link and exits 1 if there is one.

`--self-test` checks the checker against a small tree with known good and broken links.
"""
import re
import subprocess
import sys
import tempfile
import unicodedata
from pathlib import Path
from urllib.parse import unquote

FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
CODE_SPAN = re.compile(r"(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.S)
HTML_ID = re.compile(r"<[a-zA-Z][^>]*?\s(?:id|name)\s*=\s*[\"']([^\"']+)[\"']")
HTML_LINK = re.compile(r"<[a-zA-Z][^>]*?\s(?:href|src)\s*=\s*[\"']([^\"']+)[\"']")
REF_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:[ \t]*<?([^\s>]+)>?")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:|^//")


def blank_fences(text: str) -> list:
    """The file's lines with fenced code blocks blanked (line numbers stay right)."""
    lines, out, fence = text.split("\n"), [], None
    for line in lines:
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)
            out.append("")
        elif fence is not None:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) \
                    and line.strip() == m.group(1):
                fence = None
            out.append("")
        else:
            out.append(line)
    return out


def blank_code_spans(lines: list) -> list:
    """Code spans replaced by spaces of the same length, per paragraph (they may wrap)."""
    text = "\n".join(lines)
    paragraphs = re.split(r"(\n[ \t]*\n)", text)
    blanked = [CODE_SPAN.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), p) for p in paragraphs]
    return "".join(blanked).split("\n")


def heading_text(raw: str) -> str:
    """A heading's rendered text: code spans keep their content, links their text, no tags."""
    text = CODE_SPAN.sub(lambda m: m.group(2).strip(), raw)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"<[^>]+>", "", text)
    return text


def slug(text: str) -> str:
    """GitHub's anchor for a heading's text (the rule of `github-slugger`)."""
    kept = "".join(c for c in text.lower()
                   if c in " -" or unicodedata.category(c)[0] in "LNM"
                   or unicodedata.category(c) == "Pc")
    return kept.replace(" ", "-")


def anchors(path: Path) -> set:
    """Every anchor a Markdown file offers: its headings' slugs and its HTML ids."""
    lines = blank_fences(path.read_text(encoding="utf-8"))
    found, counts = set(), {}
    for i, line in enumerate(lines):
        title = None
        m = ATX.match(line)
        if m:
            title = m.group(2) or ""
        elif i > 0 and lines[i - 1].strip() and SETEXT.match(line) \
                and not ATX.match(lines[i - 1]) and not lines[i - 1].lstrip().startswith(("-", "*", ">")):
            title = lines[i - 1].strip()
        if title is not None:
            base = slug(heading_text(title))
            n = counts.get(base, 0)
            found.add(base if n == 0 else f"{base}-{n}")
            counts[base] = n + 1
        found.update(HTML_ID.findall(line))
    return found


def link_targets(line: str) -> list:
    """The targets of inline links and images on one line: `](target)`, parentheses balanced."""
    targets, start = [], 0
    while (i := line.find("](", start)) >= 0:
        j, depth = i + 2, 1
        while j < len(line) and depth:
            depth += {"(": 1, ")": -1}.get(line[j], 0)
            j += 1
        inner = line[i + 2:j - 1 if depth == 0 else j].strip()
        if inner.startswith("<"):
            target = inner[1:inner.find(">")] if ">" in inner else inner[1:]
        else:
            target = inner.split()[0] if inner.split() else ""
        targets.append(target)
        start = j
    return targets


def check_file(root: Path, md: Path, tracked: set, cache: dict) -> list:
    """`file:line: ...` for each broken link of one Markdown file."""
    problems = []
    lines = blank_code_spans(blank_fences(md.read_text(encoding="utf-8")))
    rel = md.relative_to(root).as_posix()
    for number, line in enumerate(lines, 1):
        targets = link_targets(line) + HTML_LINK.findall(line)
        if m := REF_DEF.match(line):
            targets.append(m.group(1))
        for target in targets:
            if not target or SCHEME.match(target):
                continue
            path_part, _, anchor = target.partition("#")
            path_part = unquote(path_part.split("?")[0])
            if path_part:
                base = root if path_part.startswith("/") else md.parent
                dest = (base / path_part.lstrip("/")).resolve()
                try:
                    dest_rel = dest.relative_to(root.resolve()).as_posix()
                except ValueError:
                    problems.append(f"{rel}:{number}: `{target}` leads outside the repository")
                    continue
                if dest_rel not in tracked and not any(t.startswith(dest_rel + "/") for t in tracked) \
                        and dest_rel != ".":
                    problems.append(f"{rel}:{number}: `{target}`: no file `{dest_rel}` in the repository")
                    continue
            else:
                dest = md.resolve()
            if anchor and dest.suffix.lower() == ".md" and dest.is_file():
                if dest not in cache:
                    cache[dest] = anchors(dest)
                if unquote(anchor) not in cache[dest]:
                    problems.append(f"{rel}:{number}: `{target}`: no heading or id `#{anchor}` in "
                                    f"`{dest.relative_to(root.resolve()).as_posix()}`")
    return problems


def tracked_files(root: Path) -> list:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True)
    return [p for p in out.stdout.decode().split("\0") if p]


def check(root: Path, files: list) -> list:
    tracked = set(tracked_files(root))
    cache, problems = {}, []
    for f in files:
        problems += check_file(root, (root / f).resolve(), tracked, cache)
    return problems


def self_test() -> None:
    """The checker finds exactly the broken links of a small repository."""
    with tempfile.TemporaryDirectory() as d:
        root = Path(d).resolve()
        (root / "docs").mkdir()
        (root / "img.svg").write_text("<svg/>")
        (root / "README.md").write_text(
            "# Top\n\n## The `rlm flow` command: runs, history\n\n## Repeat\n\n## Repeat\n\n"
            "Setext title\n------------\n\n<a name=\"custom\"></a>\n\n"
            "[ok](docs/guide.md#the-guide) [ok](#the-rlm-flow-command-runs-history) "
            "[ok](#repeat-1) [ok](#setext-title) [ok](#custom) ![ok](img.svg) [ok](docs) "
            "[ok](https://example.com/x.md#nope)\n"
            "[bad](docs/missing.md)\n"
            "[bad](docs/guide.md#no-such-heading)\n"
            "`[not a link](nowhere.md)` and\n```\n[not a link](nowhere.md)\n```\n"
            "[bad](#repeat-2)\n"
            "[ref]: ../outside.md\n")
        (root / "docs" / "guide.md").write_text(
            "# The guide\n\n[ok](../README.md#top) [bad](../img.png) ![ok](../img.svg)\n")
        subprocess.run(["git", "init", "-q"], cwd=root, check=True)
        subprocess.run(["git", "add", "."], cwd=root, check=True)
        problems = check(root, ["README.md", "docs/guide.md"])
        lines = sorted(p.split(": `")[0] for p in problems)
        want = ["README.md:15", "README.md:16", "README.md:21", "README.md:22", "docs/guide.md:3"]
        if lines != want:
            sys.exit("check-links self-test failed: expected broken links at "
                     f"{want}, found:\n" + "\n".join(problems))
    print("check-links self-test: the broken links of the sample tree were all found, and only them")


def main() -> None:
    args = sys.argv[1:]
    if args == ["--self-test"]:
        self_test()
        return
    root = Path(subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True,
                               text=True, check=True).stdout.strip())
    files = args or [f for f in tracked_files(root) if f.endswith(".md")]
    problems = check(root, files)
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} broken link(s) in Markdown files; fix the path or the anchor "
              "(anchors are GitHub's heading slugs)", file=sys.stderr)
        sys.exit(1)
    print(f"links: every relative link and anchor in {len(files)} Markdown file(s) resolves")


if __name__ == "__main__":
    main()
