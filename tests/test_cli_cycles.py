"""Headers whose parent links form a cycle (a tampered store): `subagent ls` still shows every
session, `tree` of any of them ends, and the good sessions beside them are listed as before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.events import SessionHeader
from agent.store import SessionStore
from subagent.cli import main


def header(sid: str, parent: str | None, created_at: float) -> SessionHeader:
    return SessionHeader(
        id=sid,
        created_at=created_at,
        cwd="/w",
        parent_session=parent,
        origin="subagent" if parent else None,
        delegation_depth=1 if parent else 0,
    )


@pytest.fixture
def home(tmp_path: Path) -> Path:
    store = SessionStore(tmp_path / "sessions")
    for h in (
        header("sroot", None, 1.0),
        header("skid", "sroot", 2.0),
        header("sa", "sb", 3.0),  # sa -> sb -> sa
        header("sb", "sa", 4.0),
        header("sself", "sself", 5.0),  # its own parent
    ):
        store.create(h).close()
    return tmp_path


def test_ls_shows_the_sessions_of_a_parent_cycle(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--home", str(home), "ls", "--json"]) in (0, None)
    rows = {r["id"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["sroot"]["status"] == "stored" and rows["sroot"]["children"] == 1
    assert "skid" not in rows  # under its root, as before
    for sid in ("sa", "sb", "sself"):
        assert rows[sid]["status"].startswith("detached"), rows[sid]
        assert "cycle" in rows[sid]["status"]
    assert main(["--home", str(home), "ls"]) in (0, None)
    table = capsys.readouterr().out
    assert all(sid in table for sid in ("sroot", "sa", "sb", "sself"))


@pytest.mark.parametrize("root", ["sa", "sself"])
def test_tree_of_a_cycle_ends(root: str, home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--home", str(home), "tree", root, "--json"]) in (0, None)
    ids = [r["id"] for r in json.loads(capsys.readouterr().out)]
    assert ids[0] == root and len(ids) == len(set(ids))
