"""Mistakes a newcomer types at the `subagent` command: one error line each, never a traceback.

A bad argument (a wrong type, a value out of range, an unknown choice, a config file that cannot
be used) exits 2 with `subagent COMMAND: error: ... (see --help)`; a failure of the work itself
(no such session, a store that cannot be written) exits 1 with `subagent: error: ...`. Nothing is
left in the store by a refused command. The cases run as concurrent processes (cheap to wait on).
"""

from __future__ import annotations

import json
from pathlib import Path

import gevent
import pytest
from test_cli import cli

# (arguments after `--home HOME`, exit status, words of the one error line)
CASES: list[tuple[tuple[str, ...], int, str]] = [
    (("demo", "--children", "abc"), 2, "argument --children: invalid int value: 'abc'"),
    (("demo", "--children", "10001"), 2, "must be at most 10,000"),
    (("demo", "--seed", "x"), 2, "argument --seed: invalid int value"),
    (("nosuchcommand",), 2, "invalid choice: 'nosuchcommand'"),
    (("gc", "--older-than", "5x"), 2, "bad duration '5x'"),
    (("gc", "--status", "bogus"), 2, "argument --status: invalid choice: 'bogus'"),
    (("gc",), 2, "gc needs --older-than, --status or --all"),
    (("run", "hi", "--model", "m", "--timeout", "nan"), 2, "must be a positive number"),
    (("run", "hi", "--model", "m", "--max-cost", "-1"), 2, "must be a positive number of USD"),
    (("run", "hi", "--model", "m", "--base-url", "ftp://x"), 2, "must be an http(s) URL"),
    (("run", "hi", "--model", "m", "--max-depth", "-1"), 2, "must be at least 0"),
    (("run", "hi"), 2, "run needs --model NAME"),
    (("mcp", "--config", "{missing}"), 2, "cannot read config"),
    (("mcp", "--config", "{not_json}"), 2, "is not JSON"),
    (("mcp", "--config", "{unknown_key}"), 2, "unknown keys colour"),
    (("mcp", "--acp", "spawn=true"), 2, "ACP agent name 'spawn' is reserved"),
    (("acp", "--max-depth", "deep"), 2, "argument --max-depth: invalid int value"),
    (("ls", "nosuch"), 1, "no session 'nosuch'"),
    (("log", "nosuch"), 1, "no session 'nosuch'"),
    (("send", "nosuch", "hi"), 1, "no session 'nosuch'"),
]


def test_each_mistake_is_one_line_with_the_documented_status(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "sessions").mkdir(parents=True)  # an empty store: lookups fail as "no session"
    files = {
        "missing": str(tmp_path / "no-such-config.json"),
        "not_json": str(tmp_path / "broken.json"),
        "unknown_key": str(tmp_path / "colour.json"),
    }
    Path(files["not_json"]).write_text("{")
    Path(files["unknown_key"]).write_text(json.dumps({"colour": "blue"}))
    argvs = [tuple(arg.format(**files) for arg in args) for args, _, _ in CASES]
    jobs = [gevent.spawn(cli, *argv, home=home, timeout=60) for argv in argvs]
    gevent.joinall(jobs, raise_error=True)
    wrong = []
    for job, argv, (_, status, words) in zip(jobs, argvs, CASES, strict=True):
        proc = job.value
        lines = proc.stderr.strip().splitlines()
        prefix = f"subagent {argv[0]}: error: " if status == 2 else "subagent: error: "
        if argv[0] == "nosuchcommand":
            prefix = "subagent: error: "
        ok = (
            proc.returncode == status
            and len(lines) == 1
            and "Traceback" not in proc.stderr
            and lines[0].startswith(prefix)
            and words in lines[0]
            and (status != 2 or lines[0].endswith("(see --help)"))
        )
        if not ok:
            wrong.append(f"{argv}: exit {proc.returncode}, stderr {proc.stderr!r}")
    assert wrong == []
    # Nothing was written for a refused command.
    assert list((home / "sessions").iterdir()) == []


@pytest.mark.parametrize("where", ["a file", "below a file"])
def test_a_home_that_cannot_be_a_directory_is_a_bad_argument(tmp_path: Path, where: str) -> None:
    a_file = tmp_path / "notes.txt"
    a_file.write_text("keep me")
    home = a_file if where == "a file" else a_file / "deeper"
    proc = cli("demo", "--no-live", home=home)
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("subagent demo: error: ") and "not a directory" in line
    assert a_file.read_text() == "keep me"
