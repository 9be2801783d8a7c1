"""The layers of DESIGN.md hold: no module reaches up a layer, and no import cycle exists.

Bottom up: supervision -> agent -> actors -> providers -> the face of `subagent` (runtime,
service, continuation, tools, CLI). `supervision/` is gevent only: it imports nothing of ours
outside itself. The seam vocabulary modules of `subagent` (types, errors, schema, descriptor) are
pure data and validation that every layer above supervision may use; they import nothing of ours
but `supervision.signal` and each other.

What counts as naming a module, so no route around the rule stays open:
- `import a.b` and `from a.b import c` (`a.b.c` when that is a module), anywhere in the file,
  including function bodies and `if TYPE_CHECKING:` blocks;
- relative imports (`from ..actors import x`), resolved against the importing module;
- `importlib.import_module("a.b")` and `__import__("a.b")` with a constant name (a name the
  checker cannot read is itself a violation below the face);
- any string constant that is a dotted path of one of our modules, `"a.b"` or `"a.b:attr"` (how
  factories are named in configuration).

`test_checker_catches_each_kind` proves each of these in a temporary copy of the tree.
"""

from __future__ import annotations

import ast
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

# Static analysis of source files: plain CPU and file reads, no greenlet to starve.
pytestmark = pytest.mark.allow_hub_block("static import analysis reads every source file")

ROOT = Path(__file__).resolve().parent.parent
RANK = {"supervision": 0, "agent": 1, "actors": 2, "providers": 3, "subagent": 4}
VOCABULARY = {"subagent.types", "subagent.errors", "subagent.schema", "subagent.descriptor"}
# What the vocabulary may import besides itself.
VOCABULARY_MAY_USE = {"supervision.signal", "supervision.errors"}

_TOPS = "|".join(RANK)
# `pkg.mod`, `pkg.mod.sub`, `pkg.mod:attr`, `pkg:attr` for one of our top-level packages (a bare
# `pkg` is a word, such as the event origin "subagent", not a path).
_DOTTED = re.compile(
    rf"^\.*(?:{_TOPS})(?:(?:\.[A-Za-z_]\w*)+(?::[A-Za-z_][\w.]*)?|:[A-Za-z_][\w.]*)$"
)
_DYNAMIC = {"import_module", "__import__"}


@dataclass(frozen=True)
class Ref:
    """One place where `source` names the module `target`."""

    source: str
    target: str
    how: str
    line: int

    def __str__(self) -> str:
        return f"{self.source}:{self.line} names {self.target} ({self.how})"


def modules(root: Path) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package) for every module of our layers."""
    found: dict[str, tuple[Path, bool]] = {}
    for top in RANK:
        for path in sorted((root / top).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            package = parts[-1] == "__init__"
            found[".".join(parts[:-1] if package else parts)] = (path, package)
    return found


def _resolve(dotted: str, known: dict[str, tuple[Path, bool]]) -> str | None:
    """The longest prefix of `dotted` that is one of our modules."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in known:
            return candidate
    return None


def _absolute(name: str, package: bool, relative: str) -> str:
    """`..x.y` seen from module `name` to an absolute dotted name."""
    level = len(relative) - len(relative.lstrip("."))
    base = name.split(".") if package else name.split(".")[:-1]
    base = base[: len(base) - (level - 1)] if level > 1 else base
    rest = relative[level:]
    return ".".join([*base, rest] if rest else base)


def _string_target(
    value: str, name: str, package: bool, known: dict[str, tuple[Path, bool]]
) -> str | None:
    """The module a dotted-path string names, or None when it names none of ours."""
    if not _DOTTED.match(value):
        return None
    module, colon, _ = value.partition(":")
    if module.startswith("."):
        module = _absolute(name, package, module)
    if colon or module in known:
        return module if module in known else None
    # `pkg.mod.attr`: the owner must be a module below a top-level package, so that event names
    # such as "agent.started" (a package plus a word) are not taken for module paths.
    owner = module.rpartition(".")[0]
    return owner if "." in owner and owner in known else None


def references(name: str, known: dict[str, tuple[Path, bool]]) -> list[Ref]:
    path, package = known[name]
    tree = ast.parse(path.read_text(), filename=str(path))
    refs: list[Ref] = []

    def add(target: str | None, how: str, node: ast.AST) -> None:
        if target is not None and target != name:
            refs.append(Ref(name, target, how, getattr(node, "lineno", 0)))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(_resolve(alias.name, known), "import", node)
        elif isinstance(node, ast.ImportFrom):
            how = "relative import" if node.level else "import"
            base = (
                _absolute(name, package, "." * node.level + (node.module or ""))
                if node.level
                else node.module or ""
            )
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                add(sub if sub in known else _resolve(base, known), how, node)
        elif isinstance(node, ast.Call):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if called in _DYNAMIC and node.args:
                first = node.args[0]
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    target = (
                        _absolute(name, package, first.value)
                        if first.value.startswith(".")
                        else first.value
                    )
                    add(_resolve(target, known), f"{called} string", node)
                else:
                    refs.append(
                        Ref(name, "?", f"{called} of a name the checker cannot read", node.lineno)
                    )
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            add(_string_target(node.value, name, package, known), "dotted-path string", node)
    return refs


def _layer(module: str) -> str:
    if module in VOCABULARY or any(module.startswith(v + ".") for v in VOCABULARY):
        return "vocabulary"
    return module.split(".")[0]


def layer_violations(ref: Ref) -> list[str]:
    """Why `ref` breaks the layer rules (empty when it does not)."""
    own = _layer(ref.source)
    if ref.target == "?":
        return [] if own == "subagent" else [f"{ref}: a lower layer may not import dynamically"]
    target = _layer(ref.target)
    if own == "supervision":
        ok = target == "supervision"
        return [] if ok else [f"{ref}: supervision/ is gevent only"]
    if own == "vocabulary":
        ok = target == "vocabulary" or ref.target in VOCABULARY_MAY_USE
        return [] if ok else [f"{ref}: the seam vocabulary is pure data"]
    if target == "vocabulary":
        return []
    ok = RANK[target] <= RANK[own]
    return [] if ok else [f"{ref}: {own} reaches up to {target}"]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, list[str]]] = [(start, sorted(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, todo = work[-1]
            if todo:
                nxt = todo.pop()
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(graph.get(nxt, ()))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def violations(root: Path) -> list[str]:
    """Every layer violation and every import cycle in the tree at `root`."""
    known = modules(root)
    problems: list[str] = []
    graph: dict[str, set[str]] = {name: set() for name in known}
    for name in known:
        for ref in references(name, known):
            problems.extend(layer_violations(ref))
            if ref.target != "?":
                graph[name].add(ref.target)
    problems.extend(f"import cycle: {' -> '.join(c)}" for c in cycles(graph))
    return problems


def test_the_tree_keeps_its_layers_and_has_no_cycle() -> None:
    assert violations(ROOT) == []


def test_every_top_level_package_is_checked() -> None:
    names = modules(ROOT)
    assert set(RANK) <= set(names)
    assert set(names) >= VOCABULARY


PLANTS = {
    # kind: (file to create or extend, code, what the report must name)
    "relative import": (
        "agent/_planted.py",
        "from ..actors import agent_actor\n",
        "agent reaches up to actors",
    ),
    "import_module string": (
        "actors/_planted.py",
        "import importlib\nimportlib.import_module('providers.inprocess')\n",
        "actors reaches up to providers",
    ),
    "__import__ string": (
        "agent/_planted.py",
        "__import__('subagent.runtime')\n",
        "agent reaches up to subagent",
    ),
    "dynamic import": (
        "providers/_planted.py",
        "import importlib\nNAME = 'x'\nimportlib.import_module(NAME)\n",
        "may not import dynamically",
    ),
    "dotted-path string": (
        "providers/_planted.py",
        "FACTORY = 'subagent.runtime:Runtime'\n",
        "providers reaches up to subagent",
    ),
    "supervision uses the vocabulary": (
        "supervision/_planted.py",
        "from subagent.errors import SubagentError\n",
        "supervision/ is gevent only",
    ),
    "cycle": (
        "agent/_planted_a.py",
        "import agent._planted_b\n",
        "import cycle: agent._planted_a -> agent._planted_b",
    ),
    "deferred import in a function": (
        "agent/_planted.py",
        "def later() -> None:\n    import actors.agent_actor\n",
        "agent reaches up to actors",
    ),
}


@pytest.fixture(scope="module")
def tree_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One copy of the package sources; each case plants into and removes from it."""
    copy = tmp_path_factory.mktemp("layers")
    for top in RANK:
        shutil.copytree(ROOT / top, copy / top, ignore=shutil.ignore_patterns("__pycache__"))
    assert violations(copy) == []
    return copy


@pytest.mark.parametrize("kind", sorted(PLANTS))
def test_checker_catches_each_kind(tree_copy: Path, kind: str) -> None:
    relative, code, expected = PLANTS[kind]
    planted = [tree_copy / relative]
    planted[0].write_text(code)
    if kind == "cycle":
        planted.append(tree_copy / "agent/_planted_b.py")
        planted[1].write_text("from agent import _planted_a\n")
    try:
        found = violations(tree_copy)
    finally:
        for path in planted:
            path.unlink()
    assert any(expected in problem for problem in found), found


def test_checker_catches_the_vocabulary_importing_a_layer(tree_copy: Path) -> None:
    types = tree_copy / "subagent/types.py"
    original = types.read_text()
    types.write_text(original + "\nfrom agent.options import AgentOptions\n")
    try:
        found = violations(tree_copy)
    finally:
        types.write_text(original)
    assert any("subagent.types" in p and "the seam vocabulary is pure data" in p for p in found), (
        found
    )
