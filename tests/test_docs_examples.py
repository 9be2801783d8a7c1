"""Every Python example of README.md and docs/*.md runs as written, each in its own interpreter.

A block runs unless the line before its fence is `<!-- not runnable: WHY -->`, so a new example
is tested by default and one that cannot run here (a Ray cluster, a shared mount) says why. The
examples assert what they show, so a doc that drifts from the code fails here. The external ACP
agents the configuration examples name (`gemini`, `codex-acp`, ...) are stand-in executables on
PATH: an `AcpConfig` resolves its command when it is made, and nothing here starts them.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from supervision.offload import offload

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(
    r"^(?P<mark><!-- not runnable: [^\n]+ -->\n)?```python\n(?P<code>.*?)^```", re.S | re.M
)
# The agents the ACP examples configure: found on PATH, never run by an example.
STAND_INS = ("gemini", "codex-acp", "claude-agent-acp")


def _examples() -> tuple[list[tuple[str, str]], list[str]]:
    runnable: list[tuple[str, str]] = []
    skipped: list[str] = []
    for path in DOCUMENTS:
        text = path.read_text()
        for match in _FENCE.finditer(text):
            line = text.count("\n", 0, match.start("code"))
            label = f"{path.relative_to(ROOT)}:{line}"
            if match.group("mark"):
                skipped.append(label)
            else:
                runnable.append((label, match.group("code")))
    return runnable, skipped


EXAMPLES, NOT_RUNNABLE = _examples()


def test_every_python_block_is_runnable_or_says_why() -> None:
    # The parser sees every ```python fence: none hides behind a malformed marker.
    fences = sum(path.read_text().count("```python\n") for path in DOCUMENTS)
    assert len(EXAMPLES) + len(NOT_RUNNABLE) == fences
    assert len(NOT_RUNNABLE) <= 2, NOT_RUNNABLE  # an exception, not a way out
    documents = {label.split(":")[0] for label, _ in EXAMPLES}
    assert {"README.md", "docs/runtime.md", "docs/providers.md", "docs/tools.md"} <= documents


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory of executables named like the ACP agents the examples configure."""
    folder = tmp_path_factory.mktemp("bin")
    for name in STAND_INS:
        path = folder / name
        path.write_text(
            "#!/bin/sh\necho 'a stand-in: the docs examples never start it' >&2\nexit 1\n"
        )
        path.chmod(0o755)
    return folder


@pytest.mark.parametrize(("label", "code"), EXAMPLES, ids=[label for label, _ in EXAMPLES])
def test_example_runs(label: str, code: str, tmp_path: Path, stand_ins: Path) -> None:
    path = os.pathsep.join([str(stand_ins), str(Path(sys.executable).parent), os.environ["PATH"]])
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
        env={**os.environ, "SUBAGENT_HOME": str(tmp_path / "home"), "PATH": path},
    )
    done: subprocess.CompletedProcess[str] = offload(run)
    assert done.returncode == 0, f"{label}:\n{done.stderr}"


def test_every_runtime_argument_is_in_the_table() -> None:
    """docs/runtime.md's table lists exactly `Runtime(...)`'s keywords."""
    from subagent import Runtime

    table = (ROOT / "docs" / "runtime.md").read_text().split("## `Runtime(...)`", 1)[1]
    rows = re.findall(r"^\| `(\w+)` \|", table.split("\n## ", 1)[0], flags=re.M)
    keywords = [name for name in inspect.signature(Runtime).parameters]
    assert sorted(rows) == sorted(keywords)


def test_every_test_the_seed_map_names_exists() -> None:
    """docs/seam.md maps each seed rule to tests: each one named is a test function there."""
    section = (
        (ROOT / "docs" / "seam.md").read_text().split("## The seed's rules and their tests")[1]
    )
    named = re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", section)
    assert len(named) >= 60
    missing = [
        f"{path}::{name}"
        for path, name in named
        if not re.search(rf"^\s*def {name}\(", (ROOT / path).read_text(), flags=re.M)
    ]
    assert missing == []


def test_the_serve_config_file_example_loads(
    stand_ins: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/serve.md's config file is one `subagent mcp --config` accepts, agents and all."""
    from subagent.serve.wiring import load_config

    section = (ROOT / "docs" / "serve.md").read_text().split("## The config file", 1)[1]
    (example,) = re.findall(r"```json\n(.*?)```", section, flags=re.S)
    (tmp_path / "config.json").write_text(example)
    monkeypatch.setenv("PATH", os.pathsep.join([str(stand_ins), os.environ["PATH"]]))
    # In a worker thread: it reads a file and searches PATH, off the hub.
    config = offload(functools.partial(load_config, tmp_path / "config.json"))
    assert [agent.name for agent in config.acp] == ["gemini", "claude"]
    assert config.ray == {"address": "auto", "pool_size": 4}


def test_the_cli_reference_shows_every_flag_of_every_command() -> None:
    """Each `### subagent COMMAND [...]` heading of docs/cli.md (and serve.md's synopsis for
    `mcp` and `acp`) names exactly the command's flags, but the global and `--json` ones."""
    from subagent.cli import build_parser

    parser = build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    shown: dict[str, str] = {}
    cli = (ROOT / "docs" / "cli.md").read_text()
    for match in re.finditer(r"^### `subagent ([a-z]+)([^`\n]*)`$", cli, flags=re.M):
        shown[match.group(1)] = match.group(2)
    serve = (ROOT / "docs" / "serve.md").read_text()
    (synopsis,) = re.findall(r"^subagent \[--home DIR\] \[--debug\] mcp (.*)$", serve, flags=re.M)
    shown["mcp"] = shown["acp"] = synopsis
    assert set(shown) == set(commands.choices)
    wrong = {}
    for name, text in shown.items():
        flags = {
            option
            for action in commands.choices[name]._actions
            for option in action.option_strings
            if option.startswith("--")
        } - {"--help", "--home", "--debug", "--json"}
        named = set(re.findall(r"--[a-z][a-z-]*", text))
        if named != flags:
            wrong[name] = (sorted(named - flags), sorted(flags - named))
    assert wrong == {}


def test_the_error_code_table_lists_exactly_the_codes() -> None:
    """docs/seam.md's table of `SubagentError` codes is `ERROR_CODES`, no more, no less."""
    from subagent.errors import ERROR_CODES

    section = (ROOT / "docs" / "seam.md").read_text().split("## Errors", 1)[1]
    table = section.split("### The exception tree", 1)[0]
    assert sorted(re.findall(r"^\| `([A-Z_]+)` \|", table, flags=re.M)) == sorted(ERROR_CODES)


def test_the_readme_points_at_every_doc() -> None:
    """A newcomer finds every page from the README's "Where to read next"."""
    section = (ROOT / "README.md").read_text().split("## Where to read next", 1)[1]
    named = set(re.findall(r"`docs/([\w-]+\.md)`", section))
    assert named == {path.name for path in (ROOT / "docs").glob("*.md")}


def test_every_module_qualified_name_the_docs_cite_exists() -> None:
    """A name such as `agent.history.with_tool_calls` or `subagent.listings.ChildRow` in the
    docs resolves: its module imports and has the attribute. Names whose only importable
    prefix is a top-level package (`agent.send`, a variable; `subagent.turn`, a span
    attribute) are not module references and are left alone."""
    from agent.tools import ToolScope

    cited = re.compile(r"`((?:supervision|agent|actors|providers|subagent)(?:\.\w+)+)[`(]")
    # `agent.tools.add(...)` is also an agent's tool scope (`agent` the variable): the docs
    # of tools use it so.
    aliases: dict[str, object] = {"agent.tools": ToolScope}
    missing: dict[str, list[str]] = {}
    for path in DOCUMENTS:
        for dotted in sorted(set(cited.findall(path.read_text()))):
            parts = dotted.split(".")
            for cut in range(len(parts), 1, -1):
                try:
                    found: object = importlib.import_module(".".join(parts[:cut]))
                except ImportError:
                    continue
                prefix = ".".join(parts[:cut])
                try:
                    for attribute in parts[cut:]:
                        found = getattr(found, attribute)
                except AttributeError:
                    alias = aliases.get(prefix)
                    if alias is None or not hasattr(alias, parts[cut]):
                        missing.setdefault(dotted, []).append(path.name)
                break
    assert missing == {}
