"""Run one benchmark phase in a fresh interpreter, so no phase inherits another's heap, GC
generations, imported frameworks or hub state (shared-process order effects used to make the
tree-cancel and spawn figures miss targets they meet in isolation).

`run("benchmarks.fanout:_starts", 2000)` starts `python -m benchmarks._isolated` with the target
and its JSON arguments; the child prints one JSON object as its last stdout line.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["run"]

_ROOT = Path(__file__).resolve().parents[1]


def run(target: str, *args: Any, timeout: float = 1800.0) -> dict[str, Any]:
    """The phase's figures, or `{"available": False, "reason": ...}` if it failed."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_ROOT), env.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks._isolated", target, json.dumps(list(args))],
        cwd=_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"available": False, "reason": f"{target} exited {proc.returncode}: {tail}"}
    figures: dict[str, Any] = json.loads(lines[-1])
    return figures


def _main(argv: list[str]) -> int:
    target, raw = argv
    module_name, func_name = target.split(":")
    func = getattr(importlib.import_module(module_name), func_name)
    figures = func(*json.loads(raw))
    sys.stdout.write(json.dumps(figures) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
