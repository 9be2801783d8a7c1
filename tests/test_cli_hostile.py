"""The reading commands on crafted session files: a store is data, and one hostile file must
neither crash a listing nor reach the terminal as markup or escapes."""

from __future__ import annotations

import struct
import sys
import zlib
from pathlib import Path
from typing import Any

import msgpack
import pytest
from test_cli import cli, one_error_line

from subagent.tools import SubagentToolConfig

ESC = "\x1b[2J\x1b]0;pwned\x07[bold red]BOOM[/]\u202e\x9b31m"


def _frame(obj: object = None, raw: bytes | None = None) -> bytes:
    payload = raw if raw is not None else msgpack.packb(obj, use_bin_type=True)
    return struct.pack(">II", len(payload), zlib.crc32(payload)) + payload


def _header(sid: str, **fields: Any) -> bytes:
    header = {
        "id": sid,
        "created_at": 1_796_170_021.9,
        "cwd": "/tmp",
        "parent_session": None,
        "origin": None,
        "delegation_depth": 0,
        "seed_length": 0,
        "version": 2,
    }
    header.update(fields)
    return _frame({"magic": "subagent-session/1", "header": header})


def _event(seq: int, kind: str, data: dict[str, Any]) -> bytes:
    return _frame({"type": kind, "seq": seq, "time": 1_796_170_022.0 + seq, "data": data})


def _store(tmp_path: Path, files: dict[str, bytes]) -> Path:
    sessions = tmp_path / "sessions"
    sessions.mkdir()
    for sid, data in files.items():
        (sessions / f"{sid}.session").write_bytes(data)
    return tmp_path


def _no_raw_controls(text: str) -> None:
    raw = [c for c in text if (ord(c) < 0x20 and c not in "\n\t") or 0x7F <= ord(c) <= 0x9F]
    assert not raw and "\u202e" not in text, text


def test_a_header_time_the_platform_cannot_show_does_not_break_the_listing(
    tmp_path: Path,
) -> None:
    """`created_at` of 2**64-1 or 1e300 is a number, so the header is valid; `ls` used to fail
    whole (`OverflowError: timestamp out of range`), hiding every good session with it."""
    home = _store(
        tmp_path,
        {
            "sgood": _header("sgood"),
            "sbigint": _header("sbigint", created_at=2**64 - 1),
            "sbigfloat": _header("sbigfloat", created_at=1e300),
        },
    )
    listing = cli("ls", home=home)
    assert listing.returncode == 0, listing.stderr
    for sid in ("sgood", "sbigint", "sbigfloat"):
        assert sid in listing.stdout
    assert "Traceback" not in listing.stderr
    log = cli("log", "sbigint", home=home)
    assert log.returncode == 0, log.stderr
    assert "time out of range: 18446744073709551615" in log.stdout


def test_deeply_nested_msgpack_is_reported_as_corruption_that_says_why(tmp_path: Path) -> None:
    deep = b"\x84\xa4type" + b"\x91" * 200_000 + b"\xc0"
    home = _store(tmp_path, {"sdeep": _header("sdeep") + _frame(raw=deep)})
    log = cli("log", "sdeep", home=home)
    assert log.returncode == 1
    assert "Traceback" not in log.stderr
    assert log.stderr.rstrip().endswith("bad msgpack: values nested too deeply"), log.stderr


def test_markup_and_escapes_in_a_stored_session_are_shown_as_text(tmp_path: Path) -> None:
    """Text in a header or an event is data: escaped, never markup, in every reading command."""
    accepted = {
        "message_id": "m0",
        "kind": "send",
        "content": [{"type": "text", "text": ESC}],
        "source": {"kind": "user"},
    }
    home = _store(
        tmp_path,
        {
            "smarkup": _header("smarkup", cwd="/tmp/" + ESC)
            + _event(0, "inbox/accepted", accepted),
            "stype": _header("stype") + _event(0, ESC, {"x": ESC}),
        },
    )
    for args in (
        ("ls",),
        ("log", "smarkup"),
        ("tree", "smarkup"),
        ("log", "stype"),
        ("gc", "--dry-run", "--all"),
    ):
        proc = cli(*args, home=home)
        assert "Traceback" not in proc.stderr, (args, proc.stderr)
        _no_raw_controls(proc.stdout + proc.stderr)
    shown = cli("log", "smarkup", home=home).stdout
    assert "[bold red]BOOM[/]" in shown and "\\x1b[2J" in shown


@pytest.mark.parametrize(
    "args",
    [
        # An int too big for the code that uses it: was `OverflowError` (exit 1) for the demo,
        # and for the retries a run that never ended (backoff between a billion attempts).
        ("demo", "--children", "99999999999999999999"),
        ("demo", "--children", "10001"),
        ("run", "x", "--model", "m", "--max-retries", "99999999999999999999"),
        ("run", "x", "--model", "m", "--max-retries", "101"),
        ("run", "x", "--model", "m", "--max-depth", str(2**53)),
        # A URL urlsplit cannot read, or with no host: was `ValueError: Invalid IPv6 URL`, exit 1.
        ("run", "x", "--model", "m", "--base-url", "http://[::1"),
        ("run", "x", "--model", "m", "--base-url", "notaurl"),
        ("run", "x", "--model", "m", "--base-url", "http://h:99999/v1"),
        ("send", "s1", "x", "--base-url", "ftp://h/v1"),
        ("mcp", "--base-url", "http://[::1"),
    ],
)
def test_out_of_range_values_are_bad_arguments(args: tuple[str, ...]) -> None:
    proc = cli(*args, timeout=30)
    assert proc.returncode == 2, proc.stderr
    assert one_error_line(proc).endswith("(see --help)")


def test_a_tool_config_refuses_a_depth_cap_every_start_would_refuse() -> None:
    """The registry refuses `max_depth` past 2**53-1 at each start; the config said nothing, so
    every call of the tool failed instead of the install."""
    with pytest.raises(ValueError, match="max_depth"):
        SubagentToolConfig(provider="spawn", max_depth=2**53)
    assert SubagentToolConfig(provider="spawn", max_depth=2**53 - 1).max_depth == 2**53 - 1


def test_ls_reads_headers_only_unless_asked_for_usage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The table shows no usage, so it must not read every stored log whole (a 300 MB log made
    `ls` take 6 s and 650 MB); `ls --json`, whose rows carry usage, skims each log for its
    replies (tests/test_cli_reads.py counts the bytes), never reading one whole."""
    from agent.store import SessionStore
    from subagent.cli import main

    home = _store(tmp_path, {"sone": _header("sone"), "stwo": _header("stwo")})
    read: list[str] = []
    skimmed: list[str] = []
    real_inspect, real_skim = SessionStore.inspect, SessionStore.skim_logs

    def inspect(self: SessionStore, session_id: str) -> Any:
        read.append(session_id)
        return real_inspect(self, session_id)

    def skim_logs(self: SessionStore, known: Any, *args: Any) -> Any:
        skimmed.extend(known)
        return real_skim(self, known, *args)

    monkeypatch.setattr(SessionStore, "inspect", inspect)
    monkeypatch.setattr(SessionStore, "skim_logs", skim_logs)
    assert main(["--home", str(home), "ls"]) in (0, None)
    assert "sone" in capsys.readouterr().out
    assert read == skimmed == []
    assert main(["--home", str(home), "ls", "--json"]) in (0, None)
    assert read == []
    assert sorted(skimmed) == ["sone", "stwo"]


@pytest.mark.parametrize("at", [None, 0, 7, 63, 64, 65, 70_000, 199_999])
def test_the_zero_tail_check_agrees_with_any_at_every_chunk_edge(at: int | None) -> None:
    """The zero-tail check compares chunks in C (`any()` over a memoryview walked a 300 MB tail
    as Python ints, 6 s); a nonzero byte in the first small chunk, across a chunk edge or in the
    last still counts, from any start."""
    from agent.frames import _all_zero

    tail = bytearray(200_000)
    if at is not None:
        tail[at] = 1
    view = memoryview(bytes(tail))
    for start in (0, 1, 64, 65_600, 199_999, 200_000):
        assert _all_zero(view, start) == (not any(view[start:])), start


SDK_AGENT = str(Path(__file__).with_name("acp_peers") / "sdk_agent.py")


@pytest.mark.parametrize(
    ("mode", "why"),
    [
        ("big_number", "Diagnostic: protocol error: a JSON number has more than 4,300 digits"),
        ("escape_garbage", "Diagnostic: protocol error: malformed JSON"),
        ("crash", "Diagnostic: the agent closed its stdout; exit code 3; stderr tail: boom"),
    ],
)
def test_run_acp_says_why_the_agent_failed_in_its_one_error_line(
    tmp_path: Path, mode: str, why: str
) -> None:
    """`run --acp` used to print only the headline (`Subagent failed with an error.`): the
    diagnostic, escaped, is what tells the user what was wrong."""
    command = f"{sys.executable} {SDK_AGENT} {mode}"
    proc = cli("run", "hi", "--no-live", "--acp", command, home=tmp_path)
    line = one_error_line(proc)
    assert line.startswith("subagent: error: Subagent failed with an error. " + why), line
    _no_raw_controls(proc.stdout + proc.stderr)


def test_an_endless_or_oversized_prompt_is_refused_without_reading_it_all(tmp_path: Path) -> None:
    """`--prompt-file /dev/zero` used to read until memory ran out; a prompt past what a log
    frame can hold failed late with `ValueError: inbox/accepted event of ... bytes`."""
    endless = cli("run", "--prompt-file", "/dev/zero", "--model", "m", home=tmp_path)
    assert endless.returncode == 2
    assert (
        one_error_line(endless)
        == "subagent run: error: the prompt is larger than 32 MiB (see --help)"
    )
    big = "x" * (32 * 1024 * 1024 + 1)
    piped = cli("send", "s1", "-", home=tmp_path, stdin=big)
    assert piped.returncode == 2
    assert "the message is larger than 32 MiB" in one_error_line(piped)


@pytest.mark.parametrize("command", [("ls",), ("demo", "--no-live"), ("log", "sa0")])
@pytest.mark.parametrize("where", ["home", "sessions"])
def test_a_home_that_is_not_a_directory_is_a_bad_argument(
    tmp_path: Path, command: tuple[str, ...], where: str
) -> None:
    """A `--home` (or its `sessions`) that is a regular file is refused, not read as an empty
    store (`ls` said "no sessions", exit 0) or failed on deep inside (`demo`: FileExistsError)."""
    home = tmp_path / "home"
    if where == "home":
        home.write_text("not a directory")
    else:
        home.mkdir()
        (home / "sessions").write_text("not a directory")
    proc = cli(*command, home=home, timeout=60)
    assert proc.returncode == 2, proc.stderr
    line = one_error_line(proc)
    assert "is not a directory" in line and line.endswith("(see --help)")


def test_tree_of_a_root_whose_body_is_corrupt_still_shows_its_children(tmp_path: Path) -> None:
    """The root's row needs its header, which is readable on its own: a damaged body costs
    the root's spend figures, not the whole tree (and the log is not decoded twice)."""
    child = _header("schild", parent_session="sroot", origin="subagent", delegation_depth=1)
    home = _store(
        tmp_path,
        {
            "sroot": _header("sroot") + _frame(raw=b"\x84\xa4type" + b"\xc1" * 40),
            "schild": child + _event(0, "turn/start", {"turn": 1}),
        },
    )
    tree = cli("tree", "sroot", home=home)
    assert tree.returncode == 0, tree.stderr
    assert "schild" in tree.stdout
