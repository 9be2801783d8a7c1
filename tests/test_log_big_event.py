"""A session-log event of tens of MiB is appended without holding the gevent hub.

The hub monitor in conftest.py fails any test whose hub is blocked for more than 0.1 s; packing
and checksumming a 63 MiB event in one go takes about 0.25 s there. These tests also assert
that other greenlets ran while the big event was appended and written, and that what reached
the file is exactly the event, in order.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gevent
import gevent.event
import pytest

from agent import events as ev
from agent.events import SessionHeader
from agent.frames import MAX_FRAME
from agent.log import InvariantError, SessionLog
from agent.store import MemoryStore, SessionStore

BIG = 63 * 1024 * 1024


def header(sid: str = "big") -> SessionHeader:
    return SessionHeader(id=sid, created_at=1.0, cwd="/work")


def reply(calls: list[str]) -> dict[str, Any]:
    return {
        "message": {
            "id": "a",
            "role": "assistant",
            "content": [],
            "tool_calls": [{"id": c, "name": "t", "arguments": {}} for c in calls],
        },
        "finish": "tool_calls",
    }


def result(call_id: str, text: str) -> dict[str, Any]:
    return {
        "call_id": call_id,
        "name": "t",
        "content": [{"type": "text", "text": text}],
        "is_error": False,
    }


class Ticker:
    """A greenlet that counts how often it ran: proof the hub was not held."""

    def __init__(self) -> None:
        self.ticks = 0
        self._greenlet = gevent.spawn(self._run)

    def _run(self) -> None:
        while True:
            self.ticks += 1
            gevent.sleep(0)

    def stop(self) -> int:
        self._greenlet.kill()
        return self.ticks


@pytest.fixture
def ticker() -> Iterator[Ticker]:
    t = Ticker()
    gevent.sleep(0)
    yield t
    t.stop()


def _opened(tmp_path: Path) -> tuple[SessionStore, SessionLog]:
    store = SessionStore(tmp_path)
    log = store.create(header())
    log.append(ev.TURN_START, {"turn": 1})
    log.append(ev.ASSISTANT_MESSAGE, reply(["c1", "c2"]))
    return store, log


def test_a_63_mib_tool_result_is_appended_and_written_cooperatively(
    tmp_path: Path, ticker: Ticker
) -> None:
    store, log = _opened(tmp_path)
    text = "x" * BIG
    before = ticker.ticks
    log.append(ev.TOOL_RESULT, result("c1", text))
    appended = ticker.ticks
    log.append(ev.TOOL_RESULT, result("c2", "small"))
    log.append(ev.TURN_END, {"turn": 1, "reason": "completed"})
    log.checkpoint("turn")
    written = ticker.ticks
    log.close()
    assert appended > before  # other greenlets ran during the append
    assert written > appended  # and during the write
    loaded = store.load("big")
    events = list(loaded.events)
    assert [e["type"] for e in events] == [
        ev.TURN_START,
        ev.ASSISTANT_MESSAGE,
        ev.TOOL_RESULT,
        ev.TOOL_RESULT,
        ev.TURN_END,
    ]
    assert [e["seq"] for e in events] == [0, 1, 2, 3, 4]
    assert events[2]["data"] == result("c1", text)
    assert events[3]["data"]["content"][0]["text"] == "small"


def test_a_big_model_reply_of_non_ascii_text_and_many_items(tmp_path: Path, ticker: Ticker) -> None:
    """A reply of 40 MiB of non-ASCII text and a tool call with 600,000 small arguments."""
    store, log = _opened(tmp_path)
    log.append(ev.TOOL_RESULT, result("c1", "a"))
    log.append(ev.TOOL_RESULT, result("c2", "b"))
    text = "é€😀" * (4 * 1024 * 1024)
    arguments = {"items": list(range(600_000)), "nested": [{"k": [1.5, None, True]}] * 1000}
    data = reply(["c3"])
    data["message"]["content"] = [{"type": "text", "text": text}]
    data["message"]["tool_calls"][0]["arguments"] = arguments
    data["usage"] = {"input_tokens": 3}
    before = ticker.ticks
    event = log.append(ev.ASSISTANT_MESSAGE, data)
    assert ticker.ticks > before
    assert event["seq"] == 4
    log.append(ev.TURN_END, {"turn": 1, "reason": "completed"})
    log.close()
    events = list(store.load("big").events)
    assert events[4]["data"] == data


def test_a_big_event_is_identical_to_the_small_path_encoding() -> None:
    """The sliced encoder writes the bytes msgpack would: the payload's first bytes still name
    its type (the view finds events by them) and a reader sees no difference."""
    import msgpack

    store = MemoryStore()
    log = store.create(header())
    log.append(ev.TURN_START, {"turn": 1})
    log.append(ev.ASSISTANT_MESSAGE, reply(["c1"]))
    data = result("c1", "y" * (3 * 1024 * 1024))
    data["content"].append({"type": "text", "text": "z" * 40})
    event = log.append(ev.TOOL_RESULT, data)
    expected = msgpack.packb(event, use_bin_type=True)
    raw = log.events.runs(3)[3][2]
    assert bytes(raw) == expected
    assert list(log.events.positions([ev.TOOL_RESULT])) == [2]


def test_big_appends_refuse_as_small_ones_do_and_change_nothing(tmp_path: Path) -> None:
    store, log = _opened(tmp_path)
    big = "x" * (2 * 1024 * 1024)
    bad = result("c1", big)
    bad["content"].append({"type": "text", "text": {1, 2}})
    with pytest.raises(TypeError, match=r"content\[1\]"):
        log.append(ev.TOOL_RESULT, bad)
    with pytest.raises(InvariantError):
        log.append(ev.TOOL_RESULT, result("nope", big))  # no such call
    with pytest.raises(ValueError, match="exceeds"):
        log.append(ev.TOOL_RESULT, result("c1", "x" * (MAX_FRAME + 1)))
    lone = result("c1", big + "\ud83d")
    with pytest.raises(UnicodeEncodeError):
        log.append(ev.TOOL_RESULT, lone, repair=False)
    assert lone["content"][0]["text"].endswith("\ud83d")  # unchanged
    assert log.next_seq == 2 and len(log.events) == 2
    event = log.append(ev.TOOL_RESULT, lone)  # repaired in place, as a small append is
    assert event["seq"] == 2
    assert lone["content"][0]["text"].endswith("\ufffd")
    log.close()
    assert list(store.load("big").events)[2]["data"] == lone


def test_appends_during_a_big_one_keep_their_order(tmp_path: Path) -> None:
    """Another greenlet appending while a big event is being encoded waits its turn: seqs
    follow the order the appends were made in, and the file holds them so."""
    store, log = _opened(tmp_path)
    order: list[int] = []

    def small() -> None:
        order.append(log.append(ev.TOOL_RESULT, result("c2", "small"))["seq"])

    other = gevent.spawn_later(0, small)
    order.append(log.append(ev.TOOL_RESULT, result("c1", "x" * (16 * 1024 * 1024)))["seq"])
    other.join()
    assert order == [2, 3]
    log.append(ev.TURN_END, {"turn": 1, "reason": "completed"})
    log.close()
    calls = [e["data"]["call_id"] for e in list(store.load("big").events)[2:4]]
    assert calls == ["c1", "c2"]


def test_a_big_append_killed_midway_leaves_the_log_as_it_was(tmp_path: Path) -> None:
    store, log = _opened(tmp_path)
    started = gevent.event.Event()

    def big() -> None:
        started.set()
        log.append(ev.TOOL_RESULT, result("c1", "x" * (32 * 1024 * 1024)))

    worker = gevent.spawn(big)
    started.wait()
    gevent.sleep(0)
    worker.kill()
    assert log.next_seq == 2 and len(log.events) == 2
    log.append(ev.TOOL_RESULT, result("c1", "after"))
    log.close()
    assert list(store.load("big").events)[2]["data"]["content"][0]["text"] == "after"
