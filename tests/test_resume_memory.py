"""A resumed or forked session holds its events as the file holds them, not as dicts.

A live log kept the events it was created with (a resumed session's whole history, a fork's
seed) as decoded dicts and lists: about twice the file for typical events (six times for small
ones), and hundreds of objects per turn for the cyclic collector to rescan for the life of the
child. These tests resume (`SessionStore.open`) and fork (`create` with a seed) real logs written
through `SessionLog`, and measure with `tracemalloc` and the collector what the log holds after.
"""

from __future__ import annotations

import gc
import itertools
import struct
import threading
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import gevent
import msgpack
import pytest
from decode_count import count_decodes
from test_agent_loop import Kit

import agent.log
import agent.loop
import agent.store
from actors.agents import pending_inbox, resume_agent
from agent.errors import SessionLogError
from agent.events import Event, SessionHeader
from agent.frames import encode_event, encode_header
from agent.history import Conversation, last_turn_number
from agent.log import (
    EventView,
    SessionLog,
    completed_turn_prefix,
    event_positions,
    events_of_types,
)
from agent.models import scripted as S
from agent.store import MemoryStore, SessionStore
from agent.usage import usage_of_events
from supervision.offload import offload

AnyStore = SessionStore | MemoryStore
# A tool result that reads a file: most of a long session's bytes.
BIG = "lorem ipsum dolor sit amet, consectetur adipiscing elit. " * 400
SMALL = "The quick brown fox jumps over the lazy dog. " * 4
# What a resumed log may hold beyond its file's size: its events are the payloads (the file less
# 8 bytes of frame prefix each) plus 5 bytes each; then its header, view and replay objects,
# and the replay's state, which keeps every inbox message id it saw (~80 bytes a prompt).
SLACK = 64 * 1024
STATE = 0.03


def _bound(size: int) -> float:
    return size * (1 + STATE) + SLACK


def _turn(log: SessionLog, turn: int, big: bool) -> None:
    """A turn as the loop writes it (format 3): a prompt, four tool steps, the end."""
    log.append("turn/start", {"turn": turn})
    message_id = f"m{turn}"
    content = [{"type": "text", "text": SMALL}]
    source = {"kind": "user"}
    log.append(
        "inbox/accepted",
        {"message_id": message_id, "kind": "send", "content": content, "source": source},
    )
    log.append("inbox/claimed", {"message_id": message_id})
    prompt = {"id": f"u{turn}", "role": "user", "content": content, "source": source}
    log.append("user/message", {"message": prompt})
    for step in range(4):
        call = {"id": f"c{turn}.{step}", "name": "read_file", "arguments": {"path": "m.py"}}
        reply = {"id": f"a{turn}.{step}", "role": "assistant", "content": content}
        log.append(
            "assistant/message",
            {
                "message": {**reply, "tool_calls": [call]},
                "finish": "tool_calls",
                "usage": {"input": 100, "output": 10},
            },
        )
        text = BIG if big and step == 3 else "ok"
        result = {"call_id": call["id"], "name": "read_file", "is_error": False}
        log.append("tool/result", {**result, "content": [{"type": "text", "text": text}]})
    log.append("turn/end", {"turn": turn, "reason": "completed"})
    log.checkpoint("turn")


def _write(store: AnyStore, sid: str, turns: int, big: bool) -> int:
    """A closed session of `turns` turns; returns its file's size."""
    log = store.create(SessionHeader(id=sid, created_at=1.0, cwd="/w"))
    for turn in range(1, turns + 1):
        _turn(log, turn, big)
        if turn % 50 == 0:
            gevent.sleep(0)  # a long write: let the hub breathe
    log.close()
    return _size(store, sid)


def _size(store: AnyStore, sid: str) -> int:
    if isinstance(store, SessionStore):
        return (store.root / f"{sid}.session").stat().st_size
    return len(store.files[sid].data)


# Where a log's memory is allocated: the agent layer's code (the log, its view and replay, the
# store). Counting only that keeps out what other greenlets of the suite's process allocate
# while `make` waits on the thread pool (under load, enough to fail the bound).
AGENT_CODE = tracemalloc.Filter(True, str(Path(agent.log.__file__).parent / "*"))


def _held(make: Callable[[], SessionLog]) -> tuple[int, SessionLog]:
    """(bytes the agent layer's code still holds once `make` returned its log, the log)."""
    gc.collect()
    # No collection meanwhile: in the whole suite's process one can hold the hub past the
    # blocking monitor's limit, and its report would be allocated inside the measurement.
    with agent.store.gc_paused():
        tracemalloc.start()
        try:
            before = tracemalloc.take_snapshot().filter_traces([AGENT_CODE])
            log = make()
            # The hub releases a pool thread's result (its watcher) on its next turn.
            gevent.sleep(0)
            after = tracemalloc.take_snapshot().filter_traces([AGENT_CODE])
        finally:
            tracemalloc.stop()
    held = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    return held, log


# ~3 MB each: typical turns (a 23 KB tool result in each), and turns of small events only,
# where the old dicts cost six times the file.
SHAPES = {"typical": (130, True), "small-events": (1_200, False)}


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> tuple[SessionStore, dict[str, int]]:
    store = SessionStore(tmp_path_factory.mktemp("resume") / "sessions", durability="none")
    sizes = {name: _write(store, name, *shape) for name, shape in SHAPES.items()}
    for name in sizes:
        store.open(name).close()  # first-use costs (the thread pool's modules) are not the log's
    return store, sizes


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_a_resumed_session_holds_about_its_file_not_twice_it(
    stored: tuple[SessionStore, dict[str, int]], shape: str
) -> None:
    store, sizes = stored
    held, log = _held(lambda: store.open(shape))
    try:
        size = sizes[shape]
        assert held <= _bound(size), f"{held / size:.2f} x the file"
        assert log.events[-1]["type"] == "turn/end" and log.turn_open is False
        assert len(log.events) == log.next_seq == SHAPES[shape][0] * 13
    finally:
        log.close()


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_a_forked_child_holds_about_its_seed_file_not_twice_it(
    stored: tuple[SessionStore, dict[str, int]], shape: str
) -> None:
    store, _sizes = stored
    # The stored events as dicts, decoded in the pool (15,600 of them would hold the hub).
    seed = offload(list, store.load(shape).events)
    child = SessionHeader(id=f"fork-{shape}", created_at=2.0, cwd="/w", parent_session=shape)

    def fork() -> SessionLog:
        # A fork hands over a seed of its own (decoded from the parent's log), then drops it.
        # (Made in the pool: 15,600 events decoded under tracemalloc would block the hub.)
        fresh = offload(lambda: [msgpack.unpackb(msgpack.packb(e)) for e in seed])
        return store.create(child, fresh)

    held, log = _held(fork)
    try:
        size = _size(store, child.id)
        assert held <= _bound(size), f"{held / size:.2f} x the file"
        assert log.header.seed_length == len(log.events) == len(seed)
        assert log.events == seed
    finally:
        log.close()
        store.delete(child.id)


def _tracked_from(root: object) -> int:
    """How many objects the collector tracks among those reachable from `root` (classes,
    modules and functions are not followed: they are shared, not held)."""
    seen: set[int] = set()
    todo = [root]
    count = 0
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, type):
            continue
        seen.add(id(obj))
        if gc.is_tracked(obj):
            count += 1
        todo.extend(gc.get_referents(obj))
    return count


def _tracked_held_by_open(store: AnyStore, sid: str) -> tuple[int, int]:
    """(tracked objects the process gained by opening `sid`, those reachable from its events)."""
    store.open(sid).close()  # first-use caches are not the log's
    gc.collect()
    before = len(gc.get_objects())
    log = store.open(sid)
    gc.collect()
    gained = len(gc.get_objects()) - before
    reachable = _tracked_from(log.events)
    log.close()
    return gained, reachable


@pytest.mark.allow_hub_block("the test's gc.collect() calls (its measurement) scan the process")
def test_the_tracked_objects_of_a_resumed_session_do_not_grow_with_its_events(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Decoded on the hub (no pool thread, whose frame may still hold the last result).
    monkeypatch.setattr(agent.store, "_THREADPOOL_READ", 1 << 40)
    store = MemoryStore(durability="none")
    _write(store, "short", 5, big=False)
    _write(store, "long", 100, big=False)  # 1,200 events
    short, short_reachable = _tracked_held_by_open(store, "short")
    long, long_reachable = _tracked_held_by_open(store, "long")
    assert long - short <= 3, (short, long)
    assert long_reachable == short_reachable <= 5
    assert long <= 40


def _two_turns() -> tuple[MemoryStore, SessionLog]:
    """A memory store holding session "s" with two turns written, and its live log."""
    store = MemoryStore()
    log = store.create(SessionHeader(id="s", created_at=1.0, cwd="/w"))
    for turn in (1, 2):
        _turn(log, turn, big=False)
    return store, log


def test_every_read_of_a_loaded_or_seeded_event_is_a_fresh_copy() -> None:
    """The log never hands out its own state: a caller's mutation changes nothing it holds."""
    store, log = _two_turns()
    log.close()
    opened = store.open("s")
    seeded = store.create(
        SessionHeader(id="f", created_at=2.0, cwd="/w", parent_session="s"),
        completed_turn_prefix(opened.events),
    )
    for view in (opened.events, seeded.events):
        first = view[3]
        first["data"]["message"]["content"].append({"type": "text", "text": "injected"})
        first["data"]["message"]["id"] = "changed"
        view[4]["data"].clear()
        for event in view:
            event["data"]["turn"] = 99
        view[:2][0]["type"] = "x/changed"
        assert view[3]["data"]["message"]["id"] == "u1"
        assert view[3]["data"]["message"]["content"] == [{"type": "text", "text": SMALL}]
        assert view[4]["data"]["message"]["tool_calls"][0]["id"] == "c1.0"
        assert (view[0]["type"], view[0]["data"]) == ("turn/start", {"turn": 1})
        assert view[3] is not view[3]
    assert opened.events == store.load("s").events == seeded.events
    opened.close()
    seeded.close()


def test_a_resumed_view_reads_as_the_file_and_continues_with_appends() -> None:
    """Indexing, negative indexes, slices, iteration and equality across the events it was
    opened with and those appended since."""
    store, log = _two_turns()
    log.close()
    loaded = list(store.load("s").events)
    opened = store.open("s")
    view = opened.events
    assert isinstance(view, EventView)
    assert view == loaded and list(view) == loaded and view != loaded[:-1]
    assert [view[i] for i in range(-len(view), len(view))] == loaded + loaded
    assert view[5:30:4] == loaded[5:30:4] and view[-3:] == loaded[-3:]
    with pytest.raises(IndexError):
        view[len(view)]
    with pytest.raises(IndexError):
        view[-len(view) - 1]
    _turn(opened, 3, big=False)
    opened.close()
    now = store.load("s").events
    assert view == now and view[len(loaded)] == now[len(loaded)] and view[-1] == now[-1]
    assert view[len(loaded) - 2 : len(loaded) + 2] == now[len(loaded) - 2 : len(loaded) + 2]


def _frame_payloads(data: bytes | bytearray) -> list[bytes]:
    """Every event frame's payload, as the file holds it."""
    offset = 8 + struct.unpack_from(">I", data, 0)[0]
    out = []
    while offset < len(data):
        length = struct.unpack_from(">I", data, offset)[0]
        out.append(bytes(data[offset + 8 : offset + 8 + length]))
        offset += 8 + length
    return out


def test_the_payloads_kept_are_the_files_which_are_what_the_live_log_encoded() -> None:
    """The frame payload of an event the live log appended is the msgpack it kept; `open`
    keeps the file's payloads as read (not decoded and encoded again)."""
    store, log = _two_turns()
    live = [event for event in log.events]
    log.close()
    payloads = _frame_payloads(store.files["s"].data)
    strict = msgpack.Packer(use_bin_type=True, strict_types=True)
    assert payloads == [strict.pack(event) for event in live]
    opened = store.open("s")
    assert bytes(opened.events._blob) == b"".join(payloads)
    opened.close()


def _outcome(read: Callable[[], Any]) -> Any:
    try:
        return ("ok", read())
    except SessionLogError as exc:
        return (type(exc).__name__, str(exc))


def _variants(data: bytes) -> Iterator[tuple[str, bytes]]:
    """The log damaged as the tail rules and the replay tell apart (plus both at once)."""
    starts = []
    offset = 8 + struct.unpack_from(">I", data, 0)[0]
    while offset < len(data):
        starts.append(offset)
        offset += 8 + struct.unpack_from(">I", data, offset)[0]
    yield "whole", data
    for cut in range(starts[-2], len(data), 7):
        yield f"cut at {cut}", data[:cut]
    yield "zero-filled", data + bytes(100)
    for start in starts[1::9]:
        flipped = bytearray(data)
        flipped[start + 12] ^= 0x55
        yield f"crc at {start}", bytes(flipped)
    stray: Event = {"type": "step/end", "seq": 1, "time": 0.0, "data": {"turn": 1, "step": 1}}
    early = data[: starts[1]] + encode_event(stray) + data[starts[2] :]
    yield "a broken rule", early
    late_damage = bytearray(early)
    late_damage[starts[-3] + 12] ^= 0x55
    yield "a broken rule, then a bad crc", bytes(late_damage)
    yield "an open tail turn", data[: starts[-1]]
    other = SessionHeader(id="other", created_at=1.0, cwd="/w")
    yield "another session's header", encode_header(other) + early[starts[0] :]


def test_open_reads_every_damaged_log_as_load_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """`open` replays as it decodes and keeps payloads; `load` decodes the file, then replays.
    Same events, same repair written, same error (corruption outranks a wrong header, which
    outranks a broken rule)."""
    store, log = _two_turns()
    log.close()
    data = bytes(store.files["s"].data)
    # The events a repair appends carry the time of the load: the same for both reads here.
    monkeypatch.setattr(agent.store, "time", SimpleNamespace(time=lambda: 5.0))
    seen = set()
    for what, variant in _variants(data):
        gevent.sleep(0)
        by_load, by_open = MemoryStore(), MemoryStore()
        for each in (by_load, by_open):
            each.create(SessionHeader(id="s", created_at=1.0, cwd="/w")).close()
            each.files["s"].data[:] = variant
        loaded = _outcome(lambda: by_load.load("s").events)  # noqa: B023
        opened = _outcome(lambda: _events_of(by_open.open("s")))  # noqa: B023
        assert opened == loaded, what
        assert by_open.files["s"].data == by_load.files["s"].data, what
        seen.add(loaded[0])
    assert seen == {"ok", "CorruptSessionError", "InvariantError"}


def _events_of(log: SessionLog) -> list[Event]:
    try:
        return list(log.events)
    finally:
        log.close()


def test_positions_and_select_decode_only_the_events_of_their_types(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store, log = _two_turns()
    log.append("x/note", {"ignorable": True, "text": "a note"})
    log.close()
    opened = store.open("s")
    opened.append("turn/start", {"turn": 3})
    opened.append("x/note", {"ignorable": True, "text": "a later note"})
    opened.append("turn/end", {"turn": 3, "reason": "completed"})
    every = list(opened.events)
    decodes = count_decodes(monkeypatch)
    view = opened.events
    loaded = len(every) - 3
    for types, start in [
        ({"assistant/message"}, 0),
        ({"user/message", "tool/result"}, 5),
        ({"turn/start", "turn/end"}, loaded - 3),
        ({"x/note"}, 0),
        ({"x/note", "turn/end"}, loaded),
        ({"nothing/such"}, 0),
        ({"assistant/message"}, len(every) + 4),
    ]:
        want = [i for i, e in enumerate(every) if i >= start and e["type"] in types]
        decodes[0] = 0
        found = view.positions(types, start)
        # Loaded and appended events alike are found by their codes (an appended one's from
        # its payload's first bytes), one of a type outside the vocabulary by its name's bytes:
        # nothing is decoded to find them, and `select` decodes what it returns, no more.
        assert list(found) == want, types
        assert decodes[0] == 0
        assert list(view.select(types, start)) == [every[i] for i in want]
        assert decodes[0] == len(want)
        assert list(event_positions(every, types, start)) == want
        assert list(events_of_types(view, types, start)) == [every[i] for i in want]
        assert list(events_of_types(every, types, start)) == [every[i] for i in want]
    assert list(events_of_types(EventView(), {"turn/start"})) == []
    assert list(event_positions(EventView(), {"turn/start"})) == []
    opened.close()


def test_a_resume_decodes_each_stored_event_once_and_its_scans_only_their_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Building the agent reads the log for its conversation (by type codes: no decode), its
    turn number, its usage and its pending inbox: only those events are decoded again."""
    monkeypatch.setattr(agent.loop, "_message_ids", itertools.count(1))
    first = Kit(SessionStore(tmp_path))
    a = first.agent()
    first.model.script(a.id, [S.text(f"reply {i}") for i in range(6)])
    for i in range(6):
        a.send(f"prompt {i}").get()
    a.when_idle().get()
    sid = a.id
    first.close()
    stored = SessionStore(tmp_path).load(sid).events
    wanted = {"assistant/message", "turn/start", "inbox/accepted", "inbox/claimed"}
    rescanned = sum(1 for e in stored if e["type"] in wanted)

    decodes = count_decodes(monkeypatch)
    monkeypatch.setattr(agent.loop, "_message_ids", itertools.count(100))
    second = Kit(SessionStore(tmp_path))
    try:
        b = resume_agent(second.ctx, sid)
        assert decodes[0] <= 1 + len(stored) + rescanned  # + the header frame
        assert b.core.turn == last_turn_number(stored) == 6
        assert list(b.core.history) == list(Conversation(stored))
        assert b.core.usage.own == usage_of_events(stored)
        assert pending_inbox(b.core.log.events) == pending_inbox(stored) == []
    finally:
        second.close()


def test_payload_offsets_widen_past_four_gib() -> None:
    """Ends are 4 bytes each until the payloads pass 4 GiB, then 8 (none is lost)."""
    payloads = agent.log.Payloads()
    payloads.add(b"\x80", "turn/start")
    at = [2**32 - 1, 2**32 + 7]
    payloads._tell = lambda: at.pop(0)  # as if 4 GiB had been written
    payloads.add(b"\x80", "turn/end")
    payloads.add(b"\x80", "x/other")
    _blob, ends, kinds = payloads.take()
    assert (ends.typecode, list(ends)) == ("Q", [1, 2**32 - 1, 2**32 + 7])
    codes = agent.log._KIND_OF
    assert list(kinds) == [codes["turn/start"], codes["turn/end"], agent.log._OTHER]
    with pytest.raises(ValueError, match="already taken"):
        payloads.take()


@pytest.mark.parametrize("turns", [10, 200])
def test_a_long_seed_is_checked_and_encoded_in_the_thread_pool(
    monkeypatch: pytest.MonkeyPatch, turns: int
) -> None:
    """A fork of a long session (here 2,600 events) does its CPU work off the hub; a short one
    (130 events) stays where it is, as a small log's read does."""
    store = MemoryStore()
    _write(store, "parent", turns, big=False)
    seed = store.load("parent").events
    threads: list[int] = []
    real = agent.store.check_json

    def check_json(value: Any, where: str = "value") -> None:
        threads.append(threading.get_ident())
        real(value, where=where)

    monkeypatch.setattr(agent.store, "check_json", check_json)
    child = SessionHeader(id="fork", created_at=2.0, cwd="/w", parent_session="parent")
    log = store.create(child, seed)
    assert log.events == seed and len(threads) == len(seed)
    on_hub = threading.main_thread().ident
    if len(seed) < 2_000:
        assert set(threads) == {on_hub}
    else:
        assert on_hub not in threads
    log.close()
    assert store.load("fork").events == seed
