"""`subagent ls --json` and `subagent tree` read of each stored log only what their rows need.

A row needs a session's descriptor and its replies' usage and cost, never its tool results,
which are most of a log's bytes. These tests count the bytes the command reads from the
session files (every `os.pread`, in-process) against the files' sizes: no timing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from agent import events as ev
from agent.events import SessionHeader
from agent.store import SessionStore
from subagent.cli import main
from subagent.descriptor import SubagentDescriptor

RESULT = 2 * 1024 * 1024  # bytes of each tool result


def reply(call: str | None, tokens: int) -> dict[str, Any]:
    calls = [{"id": call, "name": "read", "arguments": {"path": "/x"}}] if call else []
    return {
        "message": {
            "id": f"a{tokens}",
            "role": "assistant",
            "content": [{"type": "text", "text": "done" if call is None else ""}],
            "tool_calls": calls,
        },
        "finish": "tool_calls" if call else "stop",
        "usage": {"input_tokens": tokens, "output_tokens": 1},
    }


def write_session(store: SessionStore, header: SessionHeader, turns: int) -> None:
    log = store.create(header)
    for turn in range(1, turns + 1):
        log.append(ev.TURN_START, {"turn": turn})
        call = f"c{turn}"
        log.append(ev.ASSISTANT_MESSAGE, reply(call, 10))
        text = chr(ord("a") + turn) * RESULT
        content = [{"type": "text", "text": text}]
        log.append(
            ev.TOOL_RESULT, {"call_id": call, "name": "read", "content": content, "is_error": False}
        )
        log.append(ev.ASSISTANT_MESSAGE, reply(None, 5))
        log.append(ev.TURN_END, {"turn": turn, "reason": "completed"})
    log.close()


@pytest.fixture
def home(tmp_path: Path) -> Path:
    store = SessionStore(tmp_path / "sessions")
    write_session(store, SessionHeader(id="sroot", created_at=1.0, cwd="/w"), 3)
    for n in range(2):
        child = SessionHeader(
            id=f"schild{n}",
            created_at=2.0 + n,
            cwd="/w",
            parent_session="sroot",
            origin="subagent",
            delegation_depth=1,
        )
        write_session(store, child, 2)
    return tmp_path


class Reads:
    """Every byte read with `os.pread` from now on (the store reads files with it alone)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.bytes = 0
        real = os.pread

        def pread(fd: int, size: int, offset: int) -> bytes:
            data = real(fd, size, offset)
            self.bytes += len(data)
            return data

        monkeypatch.setattr(os, "pread", pread)


def stored_bytes(home: Path) -> int:
    return sum(path.stat().st_size for path in (home / "sessions").glob("*.session"))


def run(home: Path, capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    capsys.readouterr()
    assert main(["--home", str(home), *args]) in (0, None)
    return json.loads(capsys.readouterr().out)


def test_ls_json_reads_the_replies_not_the_tool_results(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    total = stored_bytes(home)
    assert total > 7 * RESULT
    reads = Reads(monkeypatch)
    [root] = run(home, capsys, "ls", "--json")
    assert reads.bytes < total // 20, (reads.bytes, total)
    assert root["id"] == "sroot" and root["children"] == 2
    assert root["usage"] == {"input_tokens": 45, "output_tokens": 6}
    assert root["subtree_usage"] == {"input_tokens": 45 + 2 * 30, "output_tokens": 6 + 2 * 4}


def test_tree_reads_the_replies_not_the_tool_results(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    total = stored_bytes(home)
    reads = Reads(monkeypatch)
    top, *children = run(home, capsys, "tree", "sroot", "--json")
    assert reads.bytes < total // 20, (reads.bytes, total)
    assert top["usage"] == {"input_tokens": 45, "output_tokens": 6}
    assert top["subtree_usage"] == {"input_tokens": 105, "output_tokens": 14}
    assert [c["id"] for c in children] == ["schild0", "schild1"]
    assert [c["usage"] for c in children] == [{"input_tokens": 30, "output_tokens": 4}] * 2
    assert [c["activity"] for c in children] == ["stored", "stored"]
    # The table reads the same (its root line and rows carry the spend).
    reads.bytes = 0
    capsys.readouterr()
    assert main(["--home", str(home), "tree", "sroot"]) in (0, None)
    assert "schild1" in capsys.readouterr().out
    assert reads.bytes < total // 20, (reads.bytes, total)


def test_a_fork_seed_is_not_counted_and_a_descriptor_is_read(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What the skim gives the row is what a whole read gives: the seed's replies are the
    parent's, the descriptor after the seed labels the child."""
    store = SessionStore(home / "sessions")
    parent = store.load("sroot")
    seed = list(parent.events)
    header = SessionHeader(
        id="sfork",
        created_at=9.0,
        cwd="/w",
        parent_session="sroot",
        origin="subagent",
        delegation_depth=1,
    )
    log = store.create(header, seed)
    log.append(ev.SESSION_END_SEED, {"length": len(seed)})
    log.append(ev.TURN_START, {"turn": 4})
    descriptor = SubagentDescriptor(provider="fork", label="forked helper", model="a:b")
    log.append(ev.SUBAGENT_DESCRIPTOR, {"descriptor": descriptor.to_json()})
    log.append(ev.ASSISTANT_MESSAGE, reply(None, 7))
    log.append(ev.TURN_END, {"turn": 4, "reason": "completed"})
    log.close()
    rows = {r["id"]: r for r in run(home, capsys, "tree", "sroot", "--json")}
    assert rows["sfork"]["usage"] == {"input_tokens": 7, "output_tokens": 1}
    assert (rows["sfork"]["mode"], rows["sfork"]["label"]) == ("continuable", "forked helper")
    whole = run(home, capsys, "log", "sfork", "--json")
    assert len(whole["events"]) == len(seed) + 5
