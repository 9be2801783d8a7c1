"""The layers of DESIGN.md hold: no module imports from a layer above its own.

Bottom up: supervision -> agent -> actors -> providers -> the face of `subagent` (runtime,
service, continuation, tools, CLI). The seam vocabulary modules of `subagent` (types, errors,
schema, descriptor, tasks' value types) are pure data and validation that every layer may use.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RANK = {"supervision": 0, "agent": 1, "actors": 2, "providers": 3, "subagent": 4}
VOCABULARY = {"subagent.types", "subagent.errors", "subagent.schema", "subagent.descriptor"}


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
    return found


def _layer(module: str) -> str | None:
    top = module.split(".")[0]
    if top not in RANK:
        return None
    if module in VOCABULARY or any(module.startswith(v + ".") for v in VOCABULARY):
        return "vocabulary"
    return top


MODULES = sorted(p for top in RANK for p in (ROOT / top).rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_reaches_up_a_layer(path: Path) -> None:
    name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    own = _layer(name)
    assert own is not None
    for imported in _imports(path):
        target = _layer(imported)
        if target is None or target == "vocabulary":
            continue
        if own == "vocabulary":
            # Pure data: only the signal of supervision and each other.
            assert imported.startswith("supervision.signal"), f"{name} imports {imported}"
            continue
        assert RANK[target] <= RANK[own], f"{name} ({own}) imports {imported} ({target})"
