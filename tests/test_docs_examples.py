"""Every Python example of the reference docs runs as written, each in its own interpreter.

The examples assert what they show, so a doc that drifts from the code fails here. Whole files
are run for the references written as runnable (`RUNNABLE`); in other docs a block runs when the
line before it is `<!-- runnable -->`.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from supervision.offload import offload

DOCS = Path(__file__).resolve().parent.parent / "docs"
RUNNABLE = ["tools.md", "models.md", "runtime.md", "events.md"]
MARKED = ["providers.md"]
_BLOCK = re.compile(r"(<!-- runnable -->\n)?```python\n(.*?)```", flags=re.S)


def _examples() -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    for name in RUNNABLE + MARKED:
        for index, match in enumerate(_BLOCK.finditer((DOCS / name).read_text())):
            if name in RUNNABLE or match.group(1):
                found.append((f"{name}#{index}", match.group(2)))
    return found


EXAMPLES = _examples()


def test_each_reference_has_examples() -> None:
    names = {label.split("#")[0] for label, _ in EXAMPLES}
    assert names == set(RUNNABLE + MARKED)


@pytest.mark.parametrize(("label", "code"), EXAMPLES, ids=[label for label, _ in EXAMPLES])
def test_example_runs(label: str, code: str, tmp_path: Path) -> None:
    # The standard library's spawn in a worker thread: it can vfork, where gevent's `Popen`
    # forks the whole (large) pytest process on the hub, for longer than the suite's limit
    # on a loaded machine. The wait is off the hub too.
    run = functools.partial(
        subprocess.run,
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
        env={**os.environ, "SUBAGENT_HOME": str(tmp_path / "home")},
    )
    done: subprocess.CompletedProcess[str] = offload(run)
    assert done.returncode == 0, f"{label}:\n{done.stderr}"
