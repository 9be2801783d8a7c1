"""Session stores: create/open/load/inspect/list/delete, torn-tail repair, corruption, durability.

Every behavioural test runs over both stores (the `store` fixture), so the memory store stays a
faithful stand-in for the directory store.
"""

from __future__ import annotations

import os
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gevent
import pytest

from agent.events import Event, SessionHeader
from agent.frames import MAX_FRAME, CorruptSessionError, decode_frames, encode_event
from agent.log import InvariantError, SessionLog, completed_turn_prefix
from agent.store import (
    LoadedSession,
    MemoryStore,
    SessionBusyError,
    SessionExistsError,
    SessionNotFoundError,
    SessionStore,
    default_root,
)

AnyStore = SessionStore | MemoryStore
TEXT = [{"type": "text", "text": "hello"}]


@pytest.fixture(params=["file", "memory"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> AnyStore:
    if request.param == "file":
        return SessionStore(tmp_path / "sessions")
    return MemoryStore()


def raw(store: AnyStore, sid: str) -> bytes:
    if isinstance(store, SessionStore):
        return (store.root / f"{sid}.session").read_bytes()
    return bytes(store.files[sid].data)


def set_raw(store: AnyStore, sid: str, data: bytes) -> None:
    if isinstance(store, SessionStore):
        (store.root / f"{sid}.session").write_bytes(data)
    else:
        store.files[sid].data[:] = data


def header(sid: str = "s1", created_at: float = 1.0, **kw: Any) -> SessionHeader:
    # Version 1: these tests write format-1 events (tool/call, step/end) by hand.
    kw.setdefault("version", 1)
    return SessionHeader(id=sid, created_at=created_at, cwd="/work", **kw)


def full_turn(log: SessionLog, turn: int) -> None:
    log.append("turn/start", {"turn": turn})
    log.append(
        "user/message",
        {
            "message": {
                "id": f"u{turn}",
                "role": "user",
                "content": TEXT,
                "source": {"kind": "user"},
            }
        },
    )
    log.append("step/start", {"turn": turn, "step": 1})
    log.append(
        "assistant/message",
        {
            "message": {
                "id": f"a{turn}",
                "role": "assistant",
                "content": TEXT,
                "tool_calls": [{"id": "c1", "name": "read", "arguments": {"p": "x"}}],
            },
            "finish": "tool_calls",
            "usage": {"input": 10, "output": 3},
        },
    )
    log.append("tool/call", {"call_id": "c1", "name": "read", "arguments": {"p": "x"}})
    log.append("tool/result", {"call_id": "c1", "name": "read", "content": TEXT, "is_error": False})
    log.append("step/end", {"turn": turn, "step": 1})
    log.checkpoint("step")
    log.append("turn/end", {"turn": turn, "reason": "completed"})
    log.checkpoint("turn")


def open_tail(log: SessionLog, turn: int) -> None:
    """A turn cut off mid-step: one tool call dispatched, no result."""
    log.append("turn/start", {"turn": turn})
    log.append("step/start", {"turn": turn, "step": 1})
    log.append("tool/call", {"call_id": "c9", "name": "bash", "arguments": {"cmd": "sleep 9"}})
    log.checkpoint("step")


def types(events: list[Event]) -> list[str]:
    return [e["type"] for e in events]


# -- basics -----------------------------------------------------------------------------------


def test_round_trip_and_reopen_continues_the_seq(store: AnyStore) -> None:
    with store.create(header()) as log:
        full_turn(log, 1)
        written = list(log.events)
    loaded = store.load("s1")
    assert loaded == LoadedSession(header(), written, repaired=False)
    log = store.open("s1")
    assert log.events == written and log.header == header()
    full_turn(log, 2)
    log.close()
    events = store.load("s1").events
    assert [e["seq"] for e in events] == list(range(len(events))) and len(events) == 16


def test_persistent_flags() -> None:
    assert SessionStore.persistent is True and MemoryStore.persistent is False


def test_create_refuses_an_existing_id(store: AnyStore) -> None:
    store.create(header()).close()
    with pytest.raises(SessionExistsError):
        store.create(header(created_at=2.0))
    assert store.load("s1").header.created_at == 1.0


def test_unknown_and_invalid_ids(store: AnyStore) -> None:
    for op in (store.load, store.open, store.inspect, store.delete):
        with pytest.raises(SessionNotFoundError) as info:
            op("missing")
        assert isinstance(info.value, KeyError) and "missing" in str(info.value)
        with pytest.raises(ValueError):
            op("../escape")
    with pytest.raises(ValueError):
        store.exists("a/b")
    assert not store.exists("missing")


def test_list_is_sorted_by_created_at_and_delete_removes(store: AnyStore) -> None:
    for sid, created in (("b", 3.0), ("a", 2.0), ("c", 1.0)):
        store.create(header(sid, created)).close()
    assert [h.id for h in store.list()] == ["c", "a", "b"]
    store.delete("a")
    assert not store.exists("a") and store.exists("b")
    assert [h.id for h in store.list()] == ["c", "b"]
    with pytest.raises(SessionNotFoundError):
        store.delete("a")


def test_list_skips_an_unreadable_session(
    store: AnyStore, caplog: pytest.LogCaptureFixture
) -> None:
    store.create(header("good")).close()
    store.create(header("bad")).close()
    set_raw(store, "bad", b"\x00\x00\x00\x05garbage")
    assert [h.id for h in store.list()] == ["good"]
    assert "bad" in caplog.text


def test_a_live_session_is_held_exclusively(store: AnyStore) -> None:
    log = store.create(header())
    full_turn(log, 1)
    with pytest.raises(SessionBusyError):
        store.open("s1")
    with pytest.raises(SessionBusyError):
        store.delete("s1")
    # Between turns a live session loads (nothing to repair); mid-turn it does not.
    assert not store.load("s1").repaired
    open_tail(log, 2)
    with pytest.raises(SessionBusyError):
        store.load("s1")
    assert store.inspect("s1").needs_repair
    log.close()
    assert store.load("s1").repaired
    store.open("s1").close()
    store.delete("s1")


def test_header_must_name_its_own_session(store: AnyStore) -> None:
    store.create(header("a")).close()
    store.create(header("b")).close()
    set_raw(store, "b", raw(store, "a"))
    with pytest.raises(CorruptSessionError, match="names session 'a'") as info:
        store.load("b")
    assert info.value.offset == 0


def test_a_crc_valid_log_that_breaks_an_invariant_is_refused(store: AnyStore) -> None:
    store.create(header()).close()
    bad: Event = {"type": "step/start", "seq": 0, "time": 0.0, "data": {"turn": 1, "step": 1}}
    set_raw(store, "s1", raw(store, "s1") + encode_event(bad))
    with pytest.raises(InvariantError, match=r"s1.*outside a turn") as info:
        store.load("s1")
    assert info.value.seq == 0


def test_open_then_close_without_appends_keeps_bytes(store: AnyStore) -> None:
    with store.create(header()) as log:
        full_turn(log, 1)
    before = raw(store, "s1")
    store.open("s1").close()
    assert raw(store, "s1") == before


# -- seeds -------------------------------------------------------------------------------------


def test_create_with_a_seed_copies_the_completed_prefix(store: AnyStore) -> None:
    with store.create(header("parent")) as parent:
        full_turn(parent, 1)
        open_tail(parent, 2)
        seed = completed_turn_prefix(parent.events)
    child = store.create(header("child", parent_session="parent", origin="subagent"), seed)
    assert child.header.seed_length == len(seed) == 8
    assert child.events == seed and child.events[0] is not seed[0]
    child.append("session/end-seed", {"length": 8})
    full_turn(child, 2)
    child.close()
    loaded = store.load("child")
    assert loaded.header.seed_length == 8 and len(loaded.events) == 17


def test_bad_seeds_are_refused(store: AnyStore) -> None:
    with store.create(header("parent")) as parent:
        full_turn(parent, 1)
        open_tail(parent, 2)
        events = list(parent.events)
    with pytest.raises(ValueError, match="open turn"):
        store.create(header("c1"), events)
    with pytest.raises(ValueError, match="invalid seed"):
        store.create(header("c2"), events[1:8])
    with pytest.raises(ValueError, match="seed_length"):
        store.create(header("c3", seed_length=3), events[:8])
    lossy = [dict(e) for e in events[:8]]
    lossy[0] = {**lossy[0], "data": {"turn": 1, "bad": {1, 2}}}
    with pytest.raises(TypeError, match=r"seed\[0\]\.data\.bad"):
        store.create(header("c4"), lossy)  # type: ignore[arg-type]
    assert not any(store.exists(s) for s in ("c1", "c2", "c3", "c4"))


# -- torn tails --------------------------------------------------------------------------------


def frame_starts(data: bytes) -> list[int]:
    starts, offset = [], 0
    while offset < len(data):
        starts.append(offset)
        offset += 8 + struct.unpack_from(">I", data, offset)[0]
    return starts


@pytest.mark.parametrize("tail", ["mid-turn", "after-turn"])
def test_torn_tail_is_repaired_at_every_offset_of_the_last_frame(
    store: AnyStore, tail: str
) -> None:
    with store.create(header()) as log:
        full_turn(log, 1)
        if tail == "mid-turn":
            open_tail(log, 2)
        events = list(log.events)
    data = raw(store, "s1")
    last = frame_starts(data)[-1]
    kept = events[:-1]
    for cut in range(last, len(data)):
        gevent.sleep(0)  # a long CPU loop: let the hub run between iterations
        set_raw(store, "s1", data[:cut])
        seen = store.inspect("s1")
        assert seen.events == kept and seen.torn_bytes == cut - last and seen.needs_repair
        assert raw(store, "s1") == data[:cut]  # inspect never writes
        loaded = store.load("s1")
        assert loaded.repaired and loaded.torn_bytes == cut - last
        assert loaded.events[: len(kept)] == kept
        closing = loaded.events[len(kept) :]
        if tail == "mid-turn":  # tool/call c9 was lost, so nothing to settle
            assert types(closing) == ["step/end", "turn/end"]
        else:  # turn/end was lost
            assert types(closing) == ["turn/end"]
        assert closing[-1]["data"]["reason"] == "interrupted"
        assert raw(store, "s1")[:last] == data[:last]
        again = store.load("s1")
        assert not again.repaired and again.events == loaded.events


def test_an_open_tail_turn_is_closed_with_synthetic_results(store: AnyStore) -> None:
    with store.create(header()) as log:
        full_turn(log, 1)
        open_tail(log, 2)
    loaded = store.load("s1")
    closing = loaded.events[8 + 3 :]
    assert types(closing) == ["tool/result", "step/end", "turn/end"]
    result = closing[0]["data"]
    assert result["call_id"] == "c9" and result["name"] == "bash"
    assert result["is_error"] is True and result["code"] == "INTERRUPTED"
    assert closing[2]["data"] == {
        "turn": 2,
        "reason": "interrupted",
        "message": closing[2]["data"]["message"],
    }
    assert not store.load("s1").repaired
    # The repaired session continues with turn 3.
    with store.open("s1") as log:
        full_turn(log, 3)


def test_a_crc_mismatch_in_the_final_frame_is_a_torn_tail(store: AnyStore) -> None:
    with store.create(header()) as log:
        full_turn(log, 1)
    data = bytearray(raw(store, "s1"))
    data[-1] ^= 0xFF
    set_raw(store, "s1", bytes(data))
    loaded = store.load("s1")
    assert loaded.repaired and types(loaded.events)[-2:] == ["step/end", "turn/end"]
    assert loaded.events[-1]["data"]["reason"] == "interrupted"


def test_a_zero_filled_tail_is_torn(store: AnyStore) -> None:
    with store.create(header()) as log:
        full_turn(log, 1)
    data = raw(store, "s1")
    set_raw(store, "s1", data + bytes(4096))
    loaded = store.load("s1")
    assert loaded.repaired and loaded.torn_bytes == 4096 and len(loaded.events) == 8
    assert raw(store, "s1") == data


def test_a_torn_or_missing_header_is_corrupt() -> None:
    with pytest.raises(CorruptSessionError, match="empty"):
        decode_frames(b"", "x")
    with pytest.raises(CorruptSessionError, match="torn header"):
        decode_frames(b"\x00\x00\x00\x10abc", "x")
    bogus = encode_event({"type": "t", "seq": 0, "time": 0.0, "data": {}})
    with pytest.raises(CorruptSessionError, match="magic"):
        decode_frames(bogus, "x")


# -- corruption --------------------------------------------------------------------------------


def three_turns(store: AnyStore) -> tuple[bytes, list[int]]:
    with store.create(header()) as log:
        for turn in (1, 2, 3):
            full_turn(log, turn)
    data = raw(store, "s1")
    return data, frame_starts(data)


def test_every_flipped_byte_before_the_tail_is_reported_with_its_offset(store: AnyStore) -> None:
    data, starts = three_turns(store)
    start, end = starts[10], starts[11]  # a frame in the middle (turn 2)
    for position in range(start + 4, end):  # CRC field and payload
        gevent.sleep(0)  # a long CPU loop: let the hub run between iterations
        broken = bytearray(data)
        broken[position] ^= 0x41
        set_raw(store, "s1", bytes(broken))
        for op in (store.load, store.inspect, store.open):
            with pytest.raises(CorruptSessionError) as info:
                op("s1")
            assert info.value.offset == start and "s1" in info.value.name
        assert raw(store, "s1") == bytes(broken)  # never truncated silently


@pytest.mark.parametrize("length", [0, MAX_FRAME + 1, "past-eof", "misaligned"])
def test_a_damaged_length_field_mid_file_is_corrupt(store: AnyStore, length: Any) -> None:
    data, starts = three_turns(store)
    start = starts[10]
    if length == "past-eof":
        length = len(data)
    elif length == "misaligned":
        length = struct.unpack_from(">I", data, start)[0] + 3
    broken = bytearray(data)
    struct.pack_into(">I", broken, start, length)
    set_raw(store, "s1", bytes(broken))
    with pytest.raises(CorruptSessionError) as info:
        store.load("s1")
    assert info.value.offset == start
    assert raw(store, "s1") == bytes(broken)


# -- durability (file store) -------------------------------------------------------------------


@pytest.fixture
def fsyncs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Record the thread of every os.fsync call."""
    calls: list[int] = []
    real = os.fsync

    def counting(fd: int) -> None:
        calls.append(threading.get_ident())
        real(fd)

    monkeypatch.setattr(os, "fsync", counting)
    yield calls


@pytest.mark.parametrize(
    ("durability", "after_step", "after_turn", "repair"),
    [("turn", 0, 1, 1), ("step", 1, 2, 1), ("none", 0, 0, 0)],
)
def test_fsync_per_durability_setting(
    tmp_path: Path,
    fsyncs: list[int],
    durability: Any,
    after_step: int,
    after_turn: int,
    repair: int,
) -> None:
    store = SessionStore(tmp_path, durability=durability)
    log = store.create(header())
    created = len(fsyncs)
    assert created == (0 if durability == "none" else 2)  # the file, then its directory
    log.append("turn/start", {"turn": 1})
    log.checkpoint("step")
    assert len(fsyncs) - created == after_step
    log.append("step/start", {"turn": 1, "step": 1})
    log.checkpoint("turn")
    assert len(fsyncs) - created == after_turn
    before_close = len(fsyncs)
    log._sink.close()  # simulate a crash: the open turn stays on disk  # type: ignore[attr-defined]
    assert len(fsyncs) == before_close
    store.load("s1")
    assert len(fsyncs) - before_close == repair
    assert threading.get_ident() not in fsyncs  # always through the thread pool


def test_a_failed_fsync_raises_and_poisons_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = SessionStore(tmp_path).create(header())
    log.append("turn/start", {"turn": 1})

    def failing(fd: int) -> None:
        raise OSError(5, "EIO")

    monkeypatch.setattr(os, "fsync", failing)
    with pytest.raises(OSError, match="EIO"):
        log.checkpoint("turn")
    with pytest.raises(OSError, match="unusable"):
        log.append("turn/end", {"turn": 1, "reason": "completed"})
    log.close()


def test_fsync_does_not_block_the_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake fsync waits for a greenlet: only possible if it runs off the hub thread."""
    released = threading.Event()
    real = os.fsync

    def slow(fd: int) -> None:
        assert released.wait(10), "the hub was blocked while fsync ran"
        real(fd)

    log = SessionStore(tmp_path).create(header())
    log.append("turn/start", {"turn": 1})
    monkeypatch.setattr(os, "fsync", slow)
    helper = gevent.spawn(released.set)
    log.checkpoint("turn")
    helper.join()
    log.close()


def test_concurrent_appends_during_a_checkpoint_are_kept(tmp_path: Path) -> None:
    store = SessionStore(tmp_path)
    log = store.create(header())
    log.append("turn/start", {"turn": 1})
    others = gevent.spawn(log.append, "step/start", {"turn": 1, "step": 1})
    log.checkpoint("turn")  # yields to the hub during fsync; the greenlet appends meanwhile
    others.join()
    log.close()
    assert types(store.inspect("s1").events) == ["turn/start", "step/start"]


def test_create_is_atomic_and_leaves_no_temp_files(tmp_path: Path) -> None:
    store = SessionStore(tmp_path)
    store.create(header()).close()
    assert sorted(os.listdir(tmp_path)) == ["s1.session"]
    with pytest.raises(SessionExistsError):
        store.create(header())
    assert sorted(os.listdir(tmp_path)) == ["s1.session"]


def test_memory_store_counts_sync_points() -> None:
    store = MemoryStore(durability="step")
    log = store.create(header())
    log.append("turn/start", {"turn": 1})
    log.checkpoint("step")
    assert store.files["s1"].syncs == 1


def test_default_root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SUBAGENT_HOME", str(tmp_path))
    assert default_root() == tmp_path / "sessions"
    assert SessionStore().root == tmp_path / "sessions"
    monkeypatch.delenv("SUBAGENT_HOME")
    assert default_root().name == "sessions"
    with pytest.raises(ValueError):
        SessionStore(tmp_path, durability="always")  # type: ignore[arg-type]


def test_a_big_log_loads_through_the_thread_pool(store: AnyStore) -> None:
    big = "x" * (1 << 20)  # over the 1 MiB threshold: read and decode off the hub
    with store.create(header()) as log:
        full_turn(log, 1)
        log.append("turn/start", {"turn": 2})
        log.append("step/start", {"turn": 2, "step": 1})
        log.append("tool/call", {"call_id": "c", "name": "cat", "arguments": {"blob": big}})
    loaded = store.load("s1")
    assert loaded.repaired and loaded.events[10]["data"]["arguments"]["blob"] == big
    assert types(loaded.events[11:]) == ["tool/result", "step/end", "turn/end"]


def test_scan_decodes_lazily_from_an_index_and_header_reads_alone(store: AnyStore) -> None:
    with store.create(header()) as log:
        full_turn(log, 1)
        full_turn(log, 2)
        everything = list(log.events)
    assert store.header("s1").id == "s1"
    assert list(store.scan("s1")) == everything
    assert list(store.scan("s1", start=5)) == everything[5:]
    first = next(store.scan("s1", start=3))
    assert first == everything[3]


def test_scan_stops_at_a_torn_tail_and_raises_on_mid_file_damage(store: AnyStore) -> None:
    with store.create(header()) as log:
        full_turn(log, 1)
        count = len(log.events)
    data = raw(store, "s1")
    set_raw(store, "s1", data[:-3])  # torn last frame
    assert len(list(store.scan("s1"))) == count - 1
    damaged = bytearray(data)
    damaged[len(data) // 2] ^= 0xFF
    set_raw(store, "s1", bytes(damaged))
    with pytest.raises(CorruptSessionError):
        list(store.scan("s1"))
    # The header alone is still readable: listings and authorization can name the session.
    assert store.header("s1").id == "s1"


def test_a_caller_killed_during_fsync_waits_for_it_before_a_close_can_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    import gevent

    import agent.store as store_module

    store = SessionStore(tmp_path / "sessions", durability="step")
    log = store.create(header())
    full_turn(log, 1)
    log.append("turn/start", {"turn": 2})  # something new for the next checkpoint to sync
    entered, release = threading.Event(), threading.Event()
    real_fsync = store_module.os.fsync
    calls: list[int] = []

    def slow_fsync(fd: int) -> None:
        calls.append(fd)
        entered.set()
        release.wait(10)
        real_fsync(fd)  # EBADF here if the descriptor had been closed under us

    monkeypatch.setattr(store_module.os, "fsync", slow_fsync)
    syncing = gevent.spawn(log.checkpoint, "step")
    for _ in range(
        10_000
    ):  # the pool thread is inside fsync (bounded yield loop, no sleep-and-hope)
        if entered.is_set():
            break
        gevent.sleep(0.001)
    assert entered.is_set()
    syncing.kill(block=False)
    closing = gevent.spawn(log.close)
    closing.join(0.05)
    assert not closing.dead  # the close waits for the fsync still in flight
    release.set()
    closing.join(10)
    syncing.join(10)
    assert closing.successful(), closing.exception
    monkeypatch.setattr(store_module.os, "fsync", real_fsync)
    assert store.load("s1").header.id == "s1"
