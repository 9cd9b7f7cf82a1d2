#!/usr/bin/env python3
"""Fails when modules of a crate import each other in a circle.

The rule (STYLE.md): within a crate, modules import downward; no two modules import each
other, directly or through others. This checks it for every crate of the workspace: every
target `cargo metadata` lists (libraries, the `rlm` binary, the Python extension, benches,
integration tests, build scripts), each from its root file through its whole `mod` tree,
inline modules included.

What counts as an import of module B by module A: any path in A's code that names B or an
item of B — in a `use` declaration (`use crate::run::{self, Display}`), or fully qualified
anywhere (`crate::run::ROOT`, `super::print(..)`, `run::merge(..)` after `use crate::run`,
`args::Cli` for a child module). Comments, strings, `macro_rules!` bodies (their paths
belong to where they expand) and `#[cfg(test)]` / `#[cfg(doc)]` items do not count. A name
a module imports (`pub use x::Foo`, or a private `use` a child reaches through `super::`) is
followed to the module that defines it; a `pub use` of a module's own descendant is its
folder's public face, not an import.

Cycles are looked for at every level of the tree: an import from `crate::a::x` of
`crate::b::y` is an arrow `a -> b` between the top-level modules `a` and `b`; one from
`crate::flow::records` of an item defined in `flow/mod.rs` itself is an arrow
`flow::records -> flow` (the parent module's own items are a node beside its children, so a
crate root that holds what every module uses and also calls them is a cycle). Each cycle (a
strongly connected component of more than one node) is printed with one line of code for
each arrow, and the script exits 1.

    python3 .ci/module-cycles.py             # every crate of the workspace
    python3 .ci/module-cycles.py FILE.rs ... # the crates rooted at these files
    python3 .ci/module-cycles.py --self-test # the checker against small crates of its own
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def blank(text: str) -> str:
    """`text` with comments, string and character literals replaced by spaces (newlines kept,
    so that offsets and line numbers stay those of the file)."""
    out = list(text)
    i, n = 0, len(text)

    def wipe(start, end):
        for k in range(start, end):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            end = text.find("\n", i)
            end = n if end < 0 else end
            wipe(i, end)
            i = end
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            wipe(i, j)
            i = j
        elif (m := re.compile(r'b?r(#*)"').match(text, i)) and (
            i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")
        ):
            close = '"' + m.group(1)
            end = text.find(close, m.end())
            end = n if end < 0 else end + len(close)
            wipe(i, end)
            i = end
        elif c == '"' or (c == "b" and text.startswith('b"', i)
                          and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_"))):
            j = i + (2 if c == "b" else 1)
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            wipe(i, j + 1)
            i = j + 1
        elif c == "'":
            # A character literal (`'x'`, `'\n'`, `'\u{1F600}'`), else a lifetime or label.
            m = re.compile(r"'(\\(u\{[0-9a-fA-F]+\}|x[0-9a-fA-F]{2}|.)|[^\\'\n])'").match(text, i)
            if m:
                wipe(i, m.end())
                i = m.end()
            else:
                i += 1
        else:
            i += 1
    return "".join(out)


PAIRS = {"{": "}", "[": "]", "(": ")"}


def closing(text: str, start: int) -> int:
    """The offset just past the bracket that closes the one at `start` (`{`, `[` or `(`)."""
    open_ch, close_ch, depth = text[start], PAIRS[text[start]], 0
    for j in range(start, len(text)):
        if text[j] == open_ch:
            depth += 1
        elif text[j] == close_ch:
            depth -= 1
            if depth == 0:
                return j + 1
    return len(text)


def item_end(text: str, start: int) -> int:
    """The end of the item starting at `start`: its first `;` or its braced body, whichever
    comes first outside brackets and parentheses."""
    j = start
    while j < len(text):
        ch = text[j]
        if ch in "([":
            j = closing(text, j)
            continue
        if ch == ";":
            return j + 1
        if ch == "{":
            return closing(text, j)
        j += 1
    return len(text)


def wiped(text: str, start: int, end: int) -> str:
    """`text` with `[start, end)` blanked, newlines kept."""
    return text[:start] + re.sub(r"[^\n]", " ", text[start:end]) + text[end:]


# Items only tests or the docs compile.
CFG_TEST = re.compile(r"#\s*\[\s*cfg\s*\(\s*(test|doc)\s*\)\s*\]")
ATTRIBUTE = re.compile(r"\s*#\s*\[")
MACRO_RULES = re.compile(r"\bmacro_rules\s*!\s*" + IDENT + r"\s*")


def strip_macro_bodies(text: str) -> str:
    """`text` with the bodies of `macro_rules!` blanked: their paths are resolved where the
    macro is expanded, not where it is written."""
    while m := MACRO_RULES.search(text):
        text = wiped(text, m.start(), item_end(text, m.end()))
    return text


def strip_test_items(text: str) -> str:
    """`text` with every `#[cfg(test)]` or `#[cfg(doc)]` item blanked (a test module, an
    import only a doc link needs)."""
    while m := CFG_TEST.search(text):
        j = m.end()
        while a := ATTRIBUTE.match(text, j):  # further attributes of the same item
            j = closing(text, a.end() - 1)
        text = wiped(text, m.start(), item_end(text, j))
    return text


class Module:
    """One module: its path in the crate, its file, and its own code (inline child modules
    cut out)."""

    def __init__(self, path, file, parent, mod_rs):
        self.path = path  # ("crate", "flow", "run")
        self.file = file
        self.parent = parent
        self.mod_rs = mod_rs  # whether child files live in this file's folder
        self.children = {}
        self.code = ""  # blanked text, other modules' bodies removed
        self.offset_lines = None  # the file's text, for line numbers

    def name(self) -> str:
        return "::".join(self.path[1:]) or "(crate root)"


MOD_DECL = re.compile(r"\bmod\s+(" + IDENT + r")\s*([;{])")


def load_module(module: Module, text: str, modules: list) -> None:
    """Fills `module.code` from `text` (already blanked) and loads its child modules."""
    modules.append(module)
    pieces, last, depth, i = [], 0, 0, 0
    # Walk depth-0 `mod` declarations; inline bodies become modules of their own.
    while i < len(text):
        ch = text[i]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        elif depth == 0 and (m := MOD_DECL.match(text, i)) and (
            i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")
        ):
            name = m.group(1)
            child_path = module.path + (name,)
            if m.group(2) == ";":
                folder = module.file.parent if module.mod_rs else module.file.with_suffix("")
                for candidate, mod_rs in ((folder / f"{name}.rs", False), (folder / name / "mod.rs", True)):
                    if candidate.exists():
                        child = Module(child_path, candidate, module, mod_rs)
                        module.children[name] = child
                        child_text = strip_macro_bodies(strip_test_items(blank(candidate.read_text())))
                        load_module(child, child_text, modules)
                        break
                i = m.end()
                continue
            body_end = closing(text, m.end() - 1)
            child = Module(child_path, module.file, module, module.mod_rs)
            module.children[name] = child
            body = text[m.end(): body_end - 1]
            load_module(child, " " * m.end() + body, modules)
            pieces.append(text[last:m.end()])
            pieces.append(re.sub(r"[^\n]", " ", body))
            last = body_end - 1
            i = body_end - 1
            continue
        i += 1
    pieces.append(text[last:])
    module.code = "".join(pieces)


USE = re.compile(r"(?<![A-Za-z0-9_])use\s+([^;]+);")
# A visibility right before `use` (searched in the text before it).
PUB_BEFORE = re.compile(r"\bpub\s*(\([^)]*\))?\s*$")


def use_paths(tree: str) -> list:
    """The paths of one `use` tree, each as (segments, bound name or None): `a::{self, b as
    c, d::*}` gives (a, "a"), (a::b, "c"), (a::d, None)."""
    tree = re.sub(r"\s+", "", tree).lstrip(":")
    out = []

    def expand(prefix, text):
        # Split `text` at depth-0 commas.
        parts, depth, start = [], 0, 0
        for k, ch in enumerate(text):
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            elif ch == "," and depth == 0:
                parts.append(text[start:k])
                start = k + 1
        parts.append(text[start:])
        for part in filter(None, parts):
            brace = part.find("{")
            if brace >= 0 and part.endswith("}"):
                head = [s for s in part[:brace].split("::") if s]
                expand(prefix + head, part[brace + 1: -1])
                continue
            segs = [s for s in part.split("::") if s]
            if segs == ["self"]:
                out.append((prefix, prefix[-1] if prefix else None))
            elif segs and segs[-1] == "*":
                out.append((prefix + segs[:-1], None))
            else:
                out.append((prefix + segs, segs[-1] if segs else None))

    expand([], tree)
    return out


def use_trees(code: str):
    """Every `use` declaration of `code`: (offset, tree text with ` as ` aliases resolved to
    `path@alias`)."""
    for m in USE.finditer(code):
        tree = re.sub(r"\s+as\s+(" + IDENT + r")", r"@\1", m.group(1))
        yield m.start(), tree


def parse_use(tree: str) -> list:
    """(segments, bound name) pairs of a `use` tree whose aliases are `path@alias`."""
    result = []
    for segs, bound in use_paths(tree):
        if segs and "@" in segs[-1]:
            last, alias = segs[-1].split("@", 1)
            segs = segs[:-1] + [last]
            bound = alias if alias != "_" else None
        result.append((segs, bound))
    return result


class Crate:
    def __init__(self, root_file: Path):
        self.root_file = root_file
        self.modules = []
        self.root = Module(("crate",), root_file, None, True)
        load_module(self.root, strip_macro_bodies(strip_test_items(blank(root_file.read_text()))), self.modules)
        for module in self.modules:
            module.bindings = {}
            module.globs = []
            for _, tree in use_trees(module.code):
                for segs, bound in parse_use(tree):
                    if bound is None:
                        module.globs.append(segs)
                    elif bound != "self":
                        module.bindings[bound] = segs

    def resolve(self, start: Module, segs: list, seen=None):
        """The module a path written in `start` names (the module of the item it names), or
        None for a path into another crate."""
        seen = seen or set()
        if not segs:
            return None
        first = segs[0]
        if first == "crate":
            node, rest = self.root, segs[1:]
        elif first in ("super", "self"):
            node, rest = start, segs
        elif first in start.children:
            node, rest = start.children[first], segs[1:]
        elif first in start.bindings and (start.path, first) not in seen:
            seen.add((start.path, first))
            return self.resolve(start, start.bindings[first] + segs[1:], seen)
        else:
            return None
        for seg in rest:
            if seg == "super":
                if node.parent is None:
                    return None
                node = node.parent
            elif seg == "self":
                continue
            elif seg in node.children:
                node = node.children[seg]
            elif seg in node.bindings and (node.path, seg) not in seen:
                # A name this module imports: follow it to where it is defined.
                seen.add((node.path, seg))
                target = self.resolve(node, node.bindings[seg], seen)
                return target if target is not None else node
            else:
                return node
        return node


PATH = re.compile(
    r"(?<![A-Za-z0-9_:$.])((?:" + IDENT + r")(?:\s*::\s*(?:" + IDENT + r"))+|(?:crate|super|self)(?=\s*::))"
)


def references(crate: Crate, module: Module):
    """(target module, offset) for every path in `module`'s code that names a module of the
    crate."""
    code = re.sub(r"pub\s*\(\s*in\s+[^)]*\)", lambda m: " " * len(m.group(0)), module.code)
    use_spans = []
    for start, tree in use_trees(code):
        end = code.find(";", start)
        use_spans.append((start, end))
        facade = PUB_BEFORE.search(code, 0, start) is not None
        for segs, _ in parse_use(tree):
            if segs and segs[0] not in ("crate", "super", "self") and segs[0] not in module.children:
                # `use x::y` of a name in scope: an import binding or another crate.
                if segs[0] not in module.bindings:
                    continue
            target = crate.resolve(module, segs)
            if target is None or (facade and module in ancestors(target)):
                # A `pub use` of a module's own descendant is its folder's public face, not
                # an import.
                continue
            yield target, start
    inside_use = lambda k: any(s <= k < e for s, e in use_spans)
    for m in PATH.finditer(code):
        if inside_use(m.start()):
            continue
        segs = [s for s in re.split(r"\s*::\s*", m.group(1)) if s]
        if segs[0] not in ("crate", "super", "self") and segs[0] not in module.children \
                and segs[0] not in module.bindings:
            continue
        target = crate.resolve(module, segs)
        if target is not None:
            yield target, m.start()


def ancestors(module: Module) -> list:
    chain = []
    while module is not None:
        chain.append(module)
        module = module.parent
    return chain[::-1]


def lift(a: Module, b: Module):
    """The arrow between the nodes under the lowest common ancestor of `a` and `b`: (level,
    from, to), where a node is that ancestor itself or one of its children."""
    pa, pb = ancestors(a), ancestors(b)
    k = 0
    while k < len(pa) and k < len(pb) and pa[k] is pb[k]:
        k += 1
    level = pa[k - 1]
    src = pa[k] if k < len(pa) else level
    dst = pb[k] if k < len(pb) else level
    return level, src, dst


def line_of(module: Module, offset: int) -> str:
    text = module.file.read_text()
    # The code of an inline module is padded to the offsets of its body in the file.
    line_no = text.count("\n", 0, offset) + 1
    line = text.splitlines()[line_no - 1].strip() if text else ""
    return f"{os.path.relpath(module.file)}:{line_no}: {line}"


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
            out.append(comp)

    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def cycles(crate: Crate) -> list:
    """Every cycle of the crate, as (level, nodes, evidence lines)."""
    graphs, evidence = {}, {}
    for module in crate.modules:
        for target, offset in references(crate, module):
            if target is module:
                continue
            level, src, dst = lift(module, target)
            if src is dst:
                continue
            graph = graphs.setdefault(level.path, {})
            graph.setdefault(src.path, set()).add(dst.path)
            evidence.setdefault((src.path, dst.path), line_of(module, offset))
    found = []
    for level, graph in graphs.items():
        for comp in sccs(graph):
            if len(comp) < 2:
                continue
            members = set(comp)
            arrows = sorted((s, d) for s in comp for d in graph.get(s, ()) if d in members)
            found.append((level, sorted(comp), [(s, d, evidence[(s, d)]) for s, d in arrows]))
    return found


def label(path: tuple, level: tuple) -> str:
    return "::".join(path[len(level):]) or f"{'::'.join(level[1:]) or 'crate'} (own items)"


def crate_roots(root: Path) -> list:
    """The root file of every target of every workspace package."""
    out = subprocess.run(
        ["cargo", "metadata", "--no-deps", "--format-version", "1", "--offline"],
        cwd=root, check=True, capture_output=True, text=True,
    ).stdout
    files = []
    for package in json.loads(out)["packages"]:
        for target in package["targets"]:
            path = Path(target["src_path"]).resolve()
            if path not in files:
                files.append(path)
    return files


# Small crates and the cycles the checker must find in them (as sorted node labels).
SELF_TESTS = {
    "a use line each way": (
        {"main.rs": "mod a;\nmod b;\nfn main() {}",
         "a.rs": "use crate::b::B;\npub struct A;",
         "b.rs": "use crate::a::A;\npub struct B;"},
        [["a", "b"]],
    ),
    "fully qualified paths, no use line": (
        {"lib.rs": "mod a;\nmod b;",
         "a.rs": "pub fn f() { crate::b::g() }",
         "b.rs": "pub fn g() { let _ = crate::a::f; }"},
        [["a", "b"]],
    ),
    "through a third module and an imported module name": (
        {"lib.rs": "mod a;\nmod b;\nmod c;",
         "a.rs": "use crate::b;\npub fn f() { b::g() }",
         "b.rs": "pub fn g() { crate::c::h() }",
         "c.rs": "use crate::a as first;\npub fn h() { first::f() }"},
        [["a", "b", "c"]],
    ),
    "the crate root's own items used by the modules it calls": (
        {"main.rs": "mod run;\npub struct UsageError;\nfn main() { run::go() }",
         "run.rs": "use crate::UsageError;\npub fn go() {}"},
        [["crate (own items)", "run"]],
    ),
    "super:: between nested modules, lifted to their top-level modules": (
        {"lib.rs": "mod x;\nmod y;",
         "x/mod.rs": "mod inner;",
         "x/inner.rs": "pub fn f() { super::super::y::deep::g() }",
         "y/mod.rs": "pub mod deep;",
         "y/deep.rs": "pub fn g() { crate::x::inner::f() }"},
        [["x", "y"]],
    ),
    "an inline module": (
        {"lib.rs": "mod a;\nmod b { pub fn g() { crate::a::f() } }",
         "a.rs": "pub fn f() { crate::b::g() }"},
        [["a", "b"]],
    ),
    "a name the root re-exports, followed to its module": (
        {"lib.rs": "mod a;\nmod b;\npub use a::A;",
         "a.rs": "pub struct A;\npub fn f() { crate::b::g() }",
         "b.rs": "pub fn g() { let _ = crate::A; }"},
        [["a", "b"]],
    ),
    "no cycle: a facade, tests, docs, comments, strings, macros": (
        {"lib.rs": "pub mod a;\npub mod b;\npub use a::A;\n/// [`crate::b::B`]\npub struct Root;",
         "a.rs": "pub struct A;\npub fn f() -> crate::b::B { crate::b::B }\n"
                 "#[cfg(test)]\nmod tests { use crate::b::*; }",
         "b.rs": "pub struct B;\n#[cfg(doc)]\nuse crate::a::A;\n// crate::a::f()\n"
                 "const S: &str = \"crate::a::f()\";\nconst R: &str = r#\"crate::a\"#;\n"
                 "macro_rules! m { () => { crate::a::f() } }\nfn uses_root() -> crate::Root { crate::Root }"},
        [],
    ),
}


def self_test() -> int:
    """Runs the checker on `SELF_TESTS`; 1 when it misses a cycle or finds one too many."""
    import tempfile

    failed = 0
    for name, (files, expected) in SELF_TESTS.items():
        with tempfile.TemporaryDirectory() as tmp:
            for rel, text in files.items():
                (Path(tmp) / rel).parent.mkdir(parents=True, exist_ok=True)
                (Path(tmp) / rel).write_text(text)
            root_file = Path(tmp) / ("main.rs" if "main.rs" in files else "lib.rs")
            found = sorted(sorted(label(p, level) for p in comp)
                           for level, comp, _ in cycles(Crate(root_file)))
        if found != sorted(expected):
            failed += 1
            print(f"self-test `{name}`: expected {expected}, found {found}")
    print(f"self-test: {len(SELF_TESTS) - failed} of {len(SELF_TESTS)} passed")
    return 1 if failed else 0


def main() -> int:
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    root = Path(__file__).resolve().parent.parent
    files = [Path(a).resolve() for a in sys.argv[1:]] or crate_roots(root)
    bad, count = False, 0
    for file in files:
        crate = Crate(file)
        count += len(crate.modules)
        for level, comp, arrows in cycles(crate):
            bad = True
            where = file.relative_to(root) if file.is_relative_to(root) else file
            print(f"import cycle in {where} under `{'::'.join(level)}`: "
                  + " <-> ".join(label(p, level) for p in comp))
            for s, d, line in arrows:
                print(f"  {label(s, level)} -> {label(d, level)}: {line}")
    if not bad:
        print(f"no import cycles in {len(files)} crates ({count} modules)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
