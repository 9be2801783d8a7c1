"""The README's library quick start runs as written, and its quick start holds exactly two
set-up commands."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from gevent import subprocess

README = Path(__file__).resolve().parent.parent / "README.md"


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README.read_text(), flags=re.S)


def test_quick_start_holds_exactly_the_two_commands() -> None:
    section = README.read_text().split("## Quick start", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```sh\n(.*?)```", section, flags=re.S)
    assert [c.strip() for c in commands] == [
        "pip install . && subagent demo",
        "pip install '.[test]' && pytest",
    ]


def test_library_quick_start_runs() -> None:
    (code,) = _blocks("python")
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 3
    assert all(" completed " in line for line in lines)
    # Every steer was admitted while its child still worked, and shaped its answer.
    answers = [line.split(" completed ", 1)[1] for line in lines]
    assert answers == [
        "summarise A, in one line",
        "summarise B, in French",
        "summarise C, as a haiku",
    ]
