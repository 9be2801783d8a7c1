"""Reading a stored session holds one chunk of its file at a time, never the whole file.

Loading a log used to read the file into 16 MiB chunks, join them into one more copy and decode
from that: twice the file's size in memory before an event was decoded, the file's size held
through the decode. These tests write a real log of several MB through `SessionLog` and measure
with `tracemalloc` what a read allocates beyond what it returns.
"""

from __future__ import annotations

import gc
import threading
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any

import gevent
import pytest

from agent.events import SessionHeader
from agent.log import SessionLog
from agent.store import MemoryStore, SessionStore

AnyStore = SessionStore | MemoryStore
# What a tool returns when it reads a big file: most of a long session's bytes.
BIG = "lorem ipsum dolor sit amet, consectetur adipiscing elit. " * 400
SMALL = "The quick brown fox jumps over the lazy dog. " * 4
FILE_BYTES = 8_000_000
# What a read may allocate beyond its result, as a share of the file: one 1 MiB chunk, the
# frame being decoded and small change. Reading the file whole is 1.0 or more.
TRANSIENT_SHARE = 0.3


def _turn(log: SessionLog, turn: int) -> None:
    """A turn: a prompt, three steps of small tool results, one step reading a big file."""
    log.append("turn/start", {"turn": turn})
    prompt = {"id": f"u{turn}", "role": "user", "content": [{"type": "text", "text": SMALL}]}
    log.append("user/message", {"message": {**prompt, "source": {"kind": "user"}}})
    for step in range(4):
        call = {"id": f"c{turn}.{step}", "name": "read_file", "arguments": {"path": "m.py"}}
        reply = {
            "id": f"a{turn}.{step}",
            "role": "assistant",
            "content": [{"type": "text", "text": SMALL}],
            "tool_calls": [call],
        }
        log.append("assistant/message", {"message": reply, "finish": "tool_calls"})
        text = BIG if step == 3 else SMALL
        result = {"call_id": call["id"], "name": "read_file", "is_error": False}
        log.append("tool/result", {**result, "content": [{"type": "text", "text": text}]})
        log.checkpoint("step")
    log.append("turn/end", {"turn": turn, "reason": "completed"})
    log.checkpoint("turn")


def _write(store: AnyStore) -> int:
    """A closed session of about FILE_BYTES; returns its size."""
    log = store.create(SessionHeader(id="long", created_at=1.0, cwd="/w"))
    turn = 0
    size = 0
    while size < FILE_BYTES:
        turn += 1
        _turn(log, turn)
        gevent.sleep(0)  # a long write: let the hub breathe between turns
        size = _size(store)
    log.close()
    return size


def _size(store: AnyStore) -> int:
    if isinstance(store, SessionStore):
        return (store.root / "long.session").stat().st_size
    return len(store.files["long"].data)


@pytest.fixture(scope="module")
def file_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[SessionStore, int]:
    store = SessionStore(tmp_path_factory.mktemp("memory") / "sessions", durability="none")
    return store, _write(store)


@pytest.fixture(scope="module")
def memory_store() -> tuple[MemoryStore, int]:
    store = MemoryStore(durability="none")
    return store, _write(store)


def _scan_all(store: AnyStore) -> list[Any]:
    events = []
    for index, event in enumerate(store.scan("long")):
        events.append(event)
        if index % 500 == 0:
            gevent.sleep(0)  # a scan decodes on the hub as it is consumed
    return events


def _open(store: AnyStore) -> Any:
    log = store.open("long")
    log.close()
    return log


READS: dict[str, Callable[[AnyStore], Any]] = {
    "load": lambda store: store.load("long"),
    "inspect": lambda store: store.inspect("long"),
    "open": _open,
    "scan": _scan_all,
}


def _transient(read: Callable[[], Any]) -> tuple[int, Any]:
    """(bytes allocated at the peak beyond what the read returned and still holds, result)."""
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        result = read()
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert held > base  # the result is really counted (the events are in memory)
    return peak - held, result


def _events_read_in_a_chunk(store: AnyStore, size: int, how: str) -> list[Any]:
    """The events `READS[how]` returns, checked to have held less than `TRANSIENT_SHARE` of
    the file's `size` beyond them, and to end with the log's last event."""
    transient, result = _transient(lambda: READS[how](store))
    assert transient < TRANSIENT_SHARE * size, f"{how}: {transient / size:.2f} x the file"
    events: list[Any] = result if isinstance(result, list) else result.events
    assert events[-1]["type"] == "turn/end"
    return events


@pytest.mark.parametrize("how", sorted(READS))
def test_reading_a_stored_log_holds_a_chunk_of_it_not_the_whole_file(
    file_store: tuple[SessionStore, int], how: str
) -> None:
    events = _events_read_in_a_chunk(*file_store, how)
    assert len(events) > 1000


@pytest.mark.parametrize("how", ["load", "inspect"])
def test_the_memory_store_reads_a_chunk_at_a_time_too(
    memory_store: tuple[MemoryStore, int], how: str
) -> None:
    """It used to copy the whole bytearray out before decoding it."""
    _events_read_in_a_chunk(*memory_store, how)


@pytest.fixture
def reading_threads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The threads every read of a session file ran in."""
    from agent import store as store_module

    threads: list[int] = []
    real = store_module._pread_at

    def pread_at(fd: int, offset: int, size: int) -> bytes | bytearray:
        threads.append(threading.get_ident())
        return real(fd, offset, size)

    monkeypatch.setattr(store_module, "_pread_at", pread_at)
    yield threads


@pytest.mark.parametrize("how", sorted(READS))
def test_a_big_log_is_read_in_the_thread_pool_a_chunk_at_a_time(
    file_store: tuple[SessionStore, int], reading_threads: list[int], how: str
) -> None:
    """Reads stay off the hub (the file's bytes are read where they are decoded, in the hub's
    thread pool; a scan's, consumed on the hub, each in the pool), and are many, not one."""
    store, size = file_store
    READS[how](store)
    assert len(reading_threads) >= size // (1 << 20)
    assert threading.main_thread().ident not in reading_threads
