"""`load` and `inspect` hand a stored log's events over as a view of their payloads (q11).

A caller pays for what it reads: the header and the last event of a long log cost one decode,
a scan by type decodes only what it returns, and what the result holds is about the file's
size, not a dict per event. A live log's appended events are found by type without decoding
either (their payloads' first bytes say it).
"""

from __future__ import annotations

import gc
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from decode_count import count_decodes

import agent.store
from agent.errors import SharedHeaderMissingError
from agent.events import SessionHeader
from agent.log import EventView, SessionLog, event_positions, events_of_types
from agent.store import MemoryStore, SessionStore
from subagent.descriptor import EventsByType, Unclassifiable, authoritative_descriptor

AnyStore = MemoryStore | SessionStore
TEXT = "The quick brown fox jumps over the lazy dog. " * 4
UNKNOWN = "x/a-newer-writers-note"


@pytest.fixture(params=["memory", "dir"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> AnyStore:
    if request.param == "memory":
        return MemoryStore(durability="none")
    return SessionStore(tmp_path / "sessions", durability="none")


def _header(sid: str, **kw: Any) -> SessionHeader:
    return SessionHeader(id=sid, created_at=1.0, cwd="/w", **kw)


def _turn(log: SessionLog, turn: int, descriptor: bool = False) -> None:
    """A turn as the loop writes it (format 3): a prompt, two tool steps, a reply, the end."""
    log.append("turn/start", {"turn": turn})
    content = [{"type": "text", "text": TEXT}]
    log.append("user/message", {"message": {"id": f"u{turn}", "role": "user", "content": content}})
    if descriptor:
        # A version no runtime reads: `Unclassifiable`, naming it (so which one was found shows).
        log.append("subagent/descriptor", {"descriptor": {"version": 900 + turn}})
    for step in range(2):
        call = {"id": f"c{turn}.{step}", "name": "read", "arguments": {"path": "m.py"}}
        reply = {"id": f"a{turn}.{step}", "role": "assistant", "content": content}
        log.append(
            "assistant/message",
            {"message": {**reply, "tool_calls": [call]}, "finish": "tool_calls"},
        )
        log.append(
            "tool/result",
            {"call_id": call["id"], "name": "read", "content": content, "is_error": False},
        )
    log.append(
        "assistant/message",
        {"message": {"id": f"z{turn}", "role": "assistant", "content": content}, "finish": "stop"},
    )
    log.append("turn/end", {"turn": turn, "reason": "completed"})


def _stored(store: AnyStore, sid: str, turns: int) -> list[Any]:
    """A closed session of `turns` turns (an unknown, ignorable event in the middle); returns
    its events as written."""
    log = store.create(_header(sid))
    for turn in range(1, turns + 1):
        _turn(log, turn)
        if turn == turns // 2:
            log.append(UNKNOWN, {"ignorable": True})
    log.close()
    return list(log.events)


@pytest.mark.parametrize("read", ["inspect", "load"])
def test_a_stored_logs_header_and_last_event_cost_one_decode(
    store: AnyStore, read: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    written = _stored(store, "s", 40)
    decodes = count_decodes(monkeypatch)
    loaded = getattr(store, read)("s")
    # Read: the header frame and each event once (the replay checks every event).
    assert decodes[0] == 1 + len(written)
    decodes[0] = 0
    assert isinstance(loaded.events, EventView) and isinstance(loaded.events, EventsByType)
    assert loaded.header.id == "s" and len(loaded.events) == len(written)
    assert loaded.events[-1] == written[-1] and decodes[0] == 1
    # By type: found without a decode, each one returned decoded once.
    ends = [i for i, e in enumerate(written) if e["type"] == "turn/end"]
    assert list(loaded.events.positions({"turn/end"})) == ends and decodes[0] == 1
    assert [e["seq"] for e in loaded.events.select({"turn/end"}, 100)] == [
        i for i in ends if i >= 100
    ]
    assert decodes[0] == 1 + sum(1 for i in ends if i >= 100)
    decodes[0] = 0
    unknown = [i for i, e in enumerate(written) if e["type"] == UNKNOWN]
    assert list(event_positions(loaded.events, {UNKNOWN, "turn/start"}, 5)) == sorted(
        unknown + [i for i, e in enumerate(written) if e["type"] == "turn/start" and i >= 5]
    )
    assert decodes[0] == 0  # the unknown type is told by its name's bytes
    monkeypatch.undo()
    assert loaded.events == written and list(loaded.events) == written
    assert loaded.events[3:6] == written[3:6] and next(reversed(loaded.events)) == written[-1]


def test_every_read_of_a_stored_event_is_a_fresh_copy(store: AnyStore) -> None:
    """The result is read-only: a caller's change to an event it read is its own copy's."""
    written = _stored(store, "s", 3)
    loaded = store.inspect("s")
    first = loaded.events[-1]
    first["data"]["reason"] = "changed"
    assert loaded.events[-1] == written[-1]
    picked = next(events_of_types(loaded.events, {"user/message"}))
    picked["data"]["message"]["content"].clear()
    assert next(events_of_types(loaded.events, {"user/message"})) == written[1]
    with pytest.raises(TypeError):
        loaded.events[0] = written[0]  # type: ignore[index]


def test_a_repaired_load_holds_its_closing_events_in_the_view(store: AnyStore) -> None:
    log = store.create(_header("s"))
    _turn(log, 1)
    log.append("turn/start", {"turn": 2})
    log.checkpoint("turn")
    log.close()  # closed inside turn 2: the load closes it
    loaded = store.load("s")
    assert loaded.repaired
    assert [e["type"] for e in loaded.events[-2:]] == ["turn/start", "turn/end"]
    assert loaded.events[-1]["data"]["reason"] == "interrupted"
    assert list(loaded.events.positions({"turn/end"})) == [7, 9]  # 8 events a turn
    assert store.load("s").events == loaded.events  # what was repaired is what is stored


def test_load_checks_the_shared_headers_the_log_names_without_reading_it_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = MemoryStore(durability="none")
    log = store.create(_header("s"))
    _turn(log, 1)
    log.append_request_header("You are a child.", ())
    _turn(log, 2)
    log.close()
    decodes = count_decodes(monkeypatch)
    loaded = store.load("s")
    assert decodes[0] == 1 + len(loaded.events)
    monkeypatch.undo()
    store.headers.clear()
    with pytest.raises(SharedHeaderMissingError):
        store.load("s")
    with pytest.raises(SharedHeaderMissingError):
        store.open("s")
    assert len(store.inspect("s").events) == len(loaded.events)  # inspect does not check


def _held(store: SessionStore, sid: str) -> tuple[int, Any]:
    """(bytes still allocated once `inspect` returned, its result)."""
    store.inspect(sid)  # first-use costs (the thread pool's modules) are not the result's
    gc.collect()
    with agent.store.gc_paused():
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            loaded = store.inspect(sid)
            held = tracemalloc.get_traced_memory()[0] - base
        finally:
            tracemalloc.stop()
    return held, loaded


def test_what_inspect_returns_holds_about_the_files_size(tmp_path: Path) -> None:
    """A dict per event held about five times the file for these events; the payloads hold
    about the file (less 8 bytes of frame prefix an event, plus 5 of offset and code)."""
    store = SessionStore(tmp_path / "sessions", durability="none")
    _stored(store, "s", 400)  # 3,201 events, ~1 MB
    size = (store.root / "s.session").stat().st_size
    held, loaded = _held(store, "s")
    assert len(loaded.events) == 3_201
    assert held <= size * 1.03 + 64 * 1024, f"{held / size:.2f} x the file"


def test_a_forked_childs_descriptor_is_read_without_decoding_its_seed(
    store: AnyStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The listings read a stored child's descriptor with `authoritative_descriptor` on what
    `inspect` returns: only the descriptors after the seed are decoded."""
    parent = store.create(_header("parent"))
    for turn in (1, 2, 3):
        _turn(parent, turn, descriptor=True)
    seed = parent.fork_seed()
    assert seed is not None
    child = store.create(_header("child", parent_session="parent"), seed)
    child.append("session/end-seed", {"length": len(seed)})
    _turn(child, 4, descriptor=True)
    child.close()
    decodes = count_decodes(monkeypatch)
    loaded = store.inspect("child")
    decodes[0] = 0
    found = authoritative_descriptor(loaded.events, loaded.header.seed_length)
    assert decodes[0] == 1
    monkeypatch.undo()
    assert isinstance(found, Unclassifiable) and "version 904 " in found.reason
    assert authoritative_descriptor(list(loaded.events), loaded.header.seed_length) == found


def test_a_live_logs_positions_and_select_decode_only_what_they_return(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A new child's log holds only appended events: they are found by the codes their
    payloads' first bytes give (kept once found), an unknown type by its name's bytes."""
    store = MemoryStore(durability="none")
    log = store.create(_header("live"))
    _turn(log, 1, descriptor=True)
    log.append(UNKNOWN, {"ignorable": True})
    _turn(log, 2)
    every = list(log.events)
    decodes = count_decodes(monkeypatch)
    view = log.events
    for types, start in [
        ({"assistant/message"}, 0),
        ({"user/message", "tool/result"}, 3),
        ({UNKNOWN}, 0),
        ({UNKNOWN, "turn/end"}, 7),
        ({"nothing/such"}, 0),
        ({"turn/start"}, len(every) + 1),
    ]:
        want = [i for i, e in enumerate(every) if i >= start and e["type"] in types]
        decodes[0] = 0
        assert list(view.positions(types, start)) == want, types
        assert decodes[0] == 0
        assert list(view.select(types, start)) == [every[i] for i in want]
        assert decodes[0] == len(want)
    # Events appended after a look-up are found too.
    log.append("turn/start", {"turn": 3})
    decodes[0] = 0
    assert list(view.positions({"turn/start"}))[-1] == len(every) and decodes[0] == 0
    log.close()
