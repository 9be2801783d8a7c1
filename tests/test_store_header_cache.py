"""A listing of a session store reads only the headers it has not read before: a header is
written once, at create, so the store keeps what `census` read by each file's inode and
status-change time. A listing used to open and decode every stored session's header on every
call, on the hub (~110 ms for 5,000 sessions, every `list_agents`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from agent import store as store_module
from agent.events import SessionHeader
from agent.store import SessionStore


def _header(session_id: str, created_at: float = 1.0, cwd: str = "/work") -> SessionHeader:
    return SessionHeader(id=session_id, created_at=created_at, cwd=cwd)


def _make(store: SessionStore, session_id: str, **kw: Any) -> None:
    store.create(_header(session_id, **kw)).close()


class _Reads:
    """Counts the header reads of one store (each id read, in order)."""

    def __init__(self, store: SessionStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.ids: list[str] = []
        real = store._read_header_bytes

        def counted(session_id: str) -> bytes:
            self.ids.append(session_id)
            return real(session_id)

        monkeypatch.setattr(store, "_read_header_bytes", counted)

    def taken(self) -> list[str]:
        ids, self.ids = sorted(self.ids), []
        return ids


def test_a_listing_reads_each_header_once_then_only_new_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SessionStore(tmp_path, durability="none")
    for i in range(5):
        _make(store, f"s{i}", created_at=float(i))
    reads = _Reads(store, monkeypatch)
    assert [h.id for h in store.list()] == ["s0", "s1", "s2", "s3", "s4"]
    assert reads.taken() == ["s0", "s1", "s2", "s3", "s4"]
    assert [h.id for h in store.list()] == ["s0", "s1", "s2", "s3", "s4"]
    assert reads.taken() == []  # nothing new: nothing read
    _make(store, "s5", created_at=5.0)
    store.delete("s1")
    assert [h.id for h in store.list()] == ["s0", "s2", "s3", "s4", "s5"]
    assert reads.taken() == ["s5"]


def test_what_another_process_made_or_remade_is_read_anew(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another store on the same directory (as another process is) creates a session, and
    deletes one and makes it again under its id with another header: both are seen."""
    ours = SessionStore(tmp_path, durability="none")
    theirs = SessionStore(tmp_path, durability="none")
    _make(ours, "kept", created_at=1.0)
    _make(ours, "remade", created_at=2.0, cwd="/first")
    assert {h.id: h.cwd for h in ours.list()} == {"kept": "/work", "remade": "/first"}
    reads = _Reads(ours, monkeypatch)
    _make(theirs, "new", created_at=3.0)
    theirs.delete("remade")
    _make(theirs, "remade", created_at=4.0, cwd="/second")
    listed = {h.id: h.cwd for h in ours.list()}
    assert listed == {"kept": "/work", "new": "/work", "remade": "/second"}
    assert reads.taken() == ["new", "remade"]


def test_a_live_log_s_header_is_read_again_after_an_append_and_is_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SessionStore(tmp_path, durability="none")
    log = store.create(_header("live"))
    try:
        assert [h.id for h in store.list()] == ["live"]
        reads = _Reads(store, monkeypatch)
        log.append("turn/start", {"turn": 1})
        log.checkpoint("turn")
        assert [h.id for h in store.list()] == ["live"]
        assert reads.taken() in ([], ["live"])  # an append may change the file's stamp
    finally:
        log.close()


def test_an_unreadable_entry_is_reported_every_time(tmp_path: Path) -> None:
    store = SessionStore(tmp_path, durability="none")
    _make(store, "good")
    (tmp_path / "bad.session").write_bytes(b"\x00\x00\x00\x05junk")
    for _ in range(2):
        headers, unreadable = store.census()
        assert [h.id for h in headers] == ["good"]
        assert [u.id for u in unreadable] == ["bad"]


def test_many_unread_headers_are_read_off_the_hub(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    offloaded: list[int] = []
    real = store_module.offload

    def counting(fn: Any, *args: Any) -> Any:
        if getattr(fn, "__name__", "") == "_read_headers":
            offloaded.append(len(args[0]))
        return real(fn, *args)

    monkeypatch.setattr(store_module, "offload", counting)
    store = SessionStore(tmp_path, durability="none")
    many = store_module._HEADERS_READ_ON_HUB + 1
    for i in range(many):
        _make(store, f"s{i:04d}", created_at=float(i))
    assert len(store.list()) == many
    assert offloaded == [many]
    _make(store, "one-more", created_at=float(many))
    assert len(store.list()) == many + 1
    assert offloaded == [many]  # one new header: read in place
    assert os.path.exists(tmp_path / "one-more.session")
