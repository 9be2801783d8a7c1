"""How the `subagent` command takes its input and reports failure (issue 12, items 5, 9, 22):
prompts too long for argv come from stdin or a file, every failure exits non-zero, global
options work after the subcommand, `python -m subagent` is the same program."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from test_cli import REPO, cli, one_error_line

PEER = REPO / "tests" / "acp_peers" / "minimal_agent.py"
ACP = f"{sys.executable} {PEER}"
# Longer than one argument may be (MAX_ARG_STRLEN is 128 KiB): only stdin or a file can carry it.
HUGE = "begin [b]\n" + "lorem ipsum " * 20_000 + "\nend"


def last_line(proc_stdout: str) -> str:
    return proc_stdout.splitlines()[-1]


# -- item 9: prompts from stdin and from a file ---------------------------------------------


def test_a_prompt_longer_than_argv_allows_comes_from_a_pipe(tmp_path: Path) -> None:
    assert len(HUGE.encode()) > 128 * 1024
    proc = cli("run", "--acp", ACP, "--no-live", home=tmp_path, stdin=HUGE + "\n")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.endswith(f"echo: {HUGE}\n")


def test_dash_reads_the_prompt_from_stdin(tmp_path: Path) -> None:
    proc = cli("run", "-", "--acp", ACP, "--no-live", home=tmp_path, stdin="from stdin\n")
    assert proc.returncode == 0, proc.stderr
    assert last_line(proc.stdout) == "echo: from stdin"


def test_prompt_file_reads_the_prompt_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "prompt.txt"
    path.write_text(HUGE + "\n", encoding="utf-8")
    proc = cli("run", "--prompt-file", str(path), "--acp", ACP, "--no-live", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.endswith(f"echo: {HUGE}\n")


def test_an_inline_prompt_is_taken_as_is_even_with_stdin(tmp_path: Path) -> None:
    proc = cli("run", "@alice hi", "--acp", ACP, "--no-live", home=tmp_path, stdin="ignored")
    assert proc.returncode == 0, proc.stderr
    assert last_line(proc.stdout) == "echo: @alice hi"


def test_prompt_sources_that_cannot_be_used(tmp_path: Path) -> None:
    missing = cli("run", "--prompt-file", str(tmp_path / "nope"), "--acp", ACP, home=tmp_path)
    assert missing.returncode == 1
    assert "cannot read the prompt file" in one_error_line(missing)
    binary = tmp_path / "binary"
    binary.write_bytes(b"caf\xe9")
    bad = cli("run", "--prompt-file", str(binary), "--acp", ACP, home=tmp_path)
    assert bad.returncode == 1
    assert "not UTF-8" in one_error_line(bad)
    empty = cli("run", "-", "--acp", ACP, home=tmp_path, stdin="\n")
    assert empty.returncode == 2
    assert "empty" in one_error_line(empty)


def test_send_takes_its_message_from_stdin_too(tmp_path: Path) -> None:
    # Reading the message comes first: an unknown child still fails after it, with 1.
    proc = cli("send", "nope", "-", home=tmp_path, stdin="a long message\n")
    assert proc.returncode == 1 and "no session" in one_error_line(proc)
    usage = cli("send", "nope", "-", "--message-file", "f", home=tmp_path)
    assert usage.returncode == 2


# -- item 5: every failure exits non-zero ----------------------------------------------------


def test_an_acp_agent_that_cannot_start_fails_the_run(tmp_path: Path) -> None:
    proc = cli("run", "hi", "--acp", "false", "--no-live", home=tmp_path)
    assert proc.returncode == 1
    assert "START_FAILED" in one_error_line(proc)
    assert "START_FAILED" not in proc.stdout


def test_an_acp_agent_that_is_missing_fails_the_run(tmp_path: Path) -> None:
    proc = cli("run", "hi", "--acp", str(tmp_path / "no-such-agent"), "--no-live", home=tmp_path)
    assert proc.returncode == 1, proc.stdout
    one_error_line(proc)


# -- item 22: python -m subagent, global options anywhere, an empty store --------------------


def test_python_dash_m_subagent_is_the_command(tmp_path: Path) -> None:
    proc = cli("ls", "--json", home=tmp_path, module="subagent")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == []
    assert cli("--help", module="subagent").stdout.startswith("usage: subagent ")


def test_global_options_are_accepted_after_the_subcommand(tmp_path: Path) -> None:
    made = cli("demo", "--children", "2", "--no-live", "--home", str(tmp_path))
    assert made.returncode == 0, made.stderr
    assert f"store: {tmp_path / 'sessions'} (from --home)" in made.stdout
    after = cli("ls", "--json", "--home", str(tmp_path))
    before = cli("--home", str(tmp_path), "ls", "--json")
    assert after.returncode == 0, after.stderr
    assert json.loads(after.stdout) == json.loads(before.stdout) != []
    # Given in both places, the one after the subcommand wins; --debug works there too.
    both = cli("--home", str(tmp_path / "other"), "ls", "--json", "--home", str(tmp_path))
    assert json.loads(both.stdout) == json.loads(before.stdout)
    debug = cli("log", "nope", "--debug", "--home", str(tmp_path))
    assert debug.returncode == 1 and "Traceback" in debug.stderr


def test_ls_on_an_empty_store_lists_nothing(tmp_path: Path) -> None:
    home = tmp_path / "never-written"
    as_json = cli("ls", "--json", home=home)
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout) == []
    table = cli("ls", home=home)
    assert table.returncode == 0, table.stderr
    assert table.stdout.startswith("root sessions in ")
    assert not home.exists()  # listing does not create the store
