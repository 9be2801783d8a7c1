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

# No key and no endpoint for either model route, whatever the environment running the tests.
NO_MODEL = {
    "OPENAI_API_KEY": "",
    "OPENAI_BASE_URL": "",
    "ANTHROPIC_API_KEY": "",
    "ANTHROPIC_BASE_URL": "",
}

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
    (("mcp", "--acp", "=gemini"), 2, "--acp '=gemini' names no agent before '='"),
    (("acp", "--acp", "my.agent=gemini"), 2, "'my.agent' is not a valid agent name"),
    # A malformed session id is a bad argument (it can name no session), not a failed lookup.
    (("ls", "../x"), 2, "argument PARENT: invalid session id '../x'"),
    (("tree", "../x"), 2, "argument ROOT: invalid session id '../x'"),
    (("log", "../x"), 2, "argument SESSION: invalid session id '../x'"),
    (("send", "../x", "hi"), 2, "argument CHILD: invalid session id '../x'"),
    (("ls", "nosuch"), 1, "no session 'nosuch'"),
    (("log", "nosuch"), 1, "no session 'nosuch'"),
    (("send", "nosuch", "hi"), 1, "no session 'nosuch'"),
    (("send", "nosuch", "hi", "--model", "m"), 2, "--model 'm' needs --base-url URL"),
]


@pytest.mark.allow_hub_block(
    "only forks CLI processes (the runtime under test runs in them, each on its own hub): "
    "fork() of the suite's full-grown process copies its page tables on this hub, and the "
    "suite's last CLI test forks 20 times (CI saw 0.1 s once in two runs)"
)
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
    jobs = [gevent.spawn(cli, *argv, home=home, timeout=60, env=NO_MODEL) for argv in argvs]
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


@pytest.mark.parametrize(
    ("model", "words"),
    [
        ("m", "--model 'm' needs --base-url URL (or $OPENAI_BASE_URL), or $OPENAI_API_KEY"),
        ("openai:gpt-4o", "needs --base-url URL (or $OPENAI_BASE_URL), or $OPENAI_API_KEY"),
        ("anthropic:claude", "--model 'anthropic:claude' needs $ANTHROPIC_API_KEY"),
    ],
)
def test_run_with_a_model_it_cannot_reach_is_a_usage_error_and_stores_nothing(
    tmp_path: Path, model: str, words: str
) -> None:
    """No key and no base URL: no call could succeed, so nothing is created (it was a root
    session, then exit 1 from the first model call)."""
    home = tmp_path / "home"
    proc = cli("run", "hi", "--model", model, "--no-live", home=home, env=NO_MODEL)
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("subagent run: error: ") and words in line, line
    assert proc.stdout == ""
    stored = sorted(p.name for p in home.rglob("*")) if home.exists() else []
    assert stored == []


def test_run_with_a_base_url_and_no_key_is_ready(tmp_path: Path) -> None:
    """A base URL is enough (a local server needs no key): the run starts and fails only at
    the endpoint, which refuses the connection."""
    import socket

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    home = tmp_path / "home"
    argv = ("run", "hi", "--model", "m", "--base-url", f"http://127.0.0.1:{port}/v1")
    proc = cli(*argv, "--no-live", "--max-retries", "0", home=home, env=NO_MODEL)
    assert proc.returncode == 1, proc.stderr
    assert "needs --base-url" not in proc.stderr
    assert list((home / "sessions").glob("*.session"))  # the root session was made
