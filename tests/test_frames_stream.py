"""Decoding a session file a chunk at a time reads exactly as decoding it whole.

The store reads a file through a window that moves forward a chunk at a time (a frame bigger
than a chunk gets a window of its own). Every tail rule (torn prefix, zero-filled extent, a
length past the end with or without a valid frame behind it, a CRC mismatch at or before the
end) must come out the same wherever the chunk edges fall.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.events import Event, SessionHeader
from agent.frames import (
    _SUSPECT,
    CorruptSessionError,
    _suspect,
    decode_frames,
    encode_event,
    encode_header,
    iter_events,
    iter_frames,
    read_frames,
)
from agent.log import SessionLog
from agent.store import MemoryStore, SessionNotFoundError, SessionStore

CHUNKS = [1, 5, 8, 9, 13, 31, 64, 100, 257, 1 << 20]


def _event(seq: int, etype: str, data: dict[str, Any]) -> Event:
    return cast(Event, {"type": etype, "seq": seq, "time": 1.0, "data": data})


def _log() -> tuple[bytes, list[int]]:
    """A small log with frames of assorted sizes, and each frame's start offset."""
    header = encode_header(SessionHeader(id="s1", created_at=1.0, cwd="/"))
    frames = [
        encode_event(_event(0, "turn/start", {"turn": 1})),
        encode_event(_event(1, "x/note", {"ignorable": True, "text": "a" * 70})),
        encode_event(_event(2, "x/note", {"ignorable": True, "text": "b" * 3})),
        encode_event(_event(3, "turn/end", {"turn": 1, "reason": "completed"})),
    ]
    starts = []
    offset = len(header)
    for frame in frames:
        starts.append(offset)
        offset += len(frame)
    return header + b"".join(frames), starts


def _file_reader(data: bytes) -> Callable[[int, int], bytes]:
    """Reads as a file does: fresh bytes each time, fewer only at the end."""
    return lambda offset, size: data[offset : offset + size]


def _outcome(decode: Callable[..., Any], *args: Any) -> Any:
    try:
        return decode(*args)
    except CorruptSessionError as exc:
        return ("corrupt", exc.offset, exc.message)


def _streamed(data: bytes, chunk: int) -> tuple[Any, ...]:
    return tuple(read_frames(_file_reader(data), len(data), "s", chunk))[:4]


def _kept(data: bytes, chunk: int) -> tuple[Any, ...]:
    """`read_frames` with a sink: what the sink was handed, where the list would have it."""
    got: list[tuple[Event, bytes]] = []
    headers: list[SessionHeader] = []

    def sink(header: SessionHeader) -> Callable[[Event, memoryview], None]:
        headers.append(header)
        return lambda event, payload: got.append((event, bytes(payload)))

    decoded = read_frames(_file_reader(data), len(data), "s", chunk, sink=sink)
    assert decoded.events == [] and headers == [decoded.header]
    # Each payload is its frame's, as the file holds it, and decodes to the event handed over.
    offset = 8 + struct.unpack_from(">I", data, 0)[0]
    for event, payload in got:
        length = struct.unpack_from(">I", data, offset)[0]
        assert payload == data[offset + 8 : offset + 8 + length]
        assert msgpack.unpackb(payload) == event
        offset += 8 + length
    return (decoded.header, [event for event, _payload in got], *decoded[2:4])


def _scanned(data: bytes, chunk: int) -> list[Event]:
    return list(iter_frames(_file_reader(data), len(data), "s", 1, chunk))


def _variants() -> list[tuple[str, bytes]]:
    """The log damaged every way the tail rules tell apart."""
    log, starts = _log()
    out = [("whole", log)]
    out += [(f"cut at {n}", log[:n]) for n in range(len(log))]
    for start in starts:
        out.append((f"zeros from {start}", log[:start] + bytes(len(log) - start)))
        flipped = bytearray(log)
        flipped[start + 9] ^= 0xFF  # payload byte: a CRC mismatch
        out.append((f"crc at {start}", bytes(flipped)))
        longer = bytearray(log)
        struct.pack_into(">I", longer, start, struct.unpack_from(">I", log, start)[0] + 40)
        out.append((f"length past at {start}", bytes(longer)))
        past_end = bytearray(log)
        struct.pack_into(">I", past_end, start, len(log))  # over any valid frames behind it
        out.append((f"length past the end at {start}", bytes(past_end)))
        zero = bytearray(log)
        struct.pack_into(">I", zero, start, 0)
        out.append((f"zero length at {start}", bytes(zero)))
    out.append(("zeros then a byte", log + bytes(300) + b"\x01"))
    return out


@pytest.mark.parametrize(("what", "data"), _variants(), ids=[v[0] for v in _variants()])
def test_every_chunk_size_decodes_as_the_whole_buffer_does(what: str, data: bytes) -> None:
    whole = _outcome(decode_frames, data, "s")
    scanned_whole = _outcome(lambda: list(iter_events(data, "s", 1)))
    for chunk in CHUNKS:
        assert _outcome(_streamed, data, chunk) == whole, (what, chunk)
        assert _outcome(_kept, data, chunk) == whole, (what, chunk)
        assert _outcome(_scanned, data, chunk) == scanned_whole, (what, chunk)


def test_the_outcomes_are_the_tail_rules() -> None:
    """The comparison above is against the tail rules, not against itself."""
    log, starts = _log()
    assert decode_frames(log, "s")[2:] == (len(log), False)
    assert decode_frames(log[:-1], "s")[2:] == (starts[-1], True)
    assert decode_frames(log[: starts[2]] + bytes(500), "s")[2:] == (starts[2], True)
    flipped = bytearray(log)
    flipped[starts[1] + 9] ^= 0xFF
    with pytest.raises(CorruptSessionError, match="CRC mismatch") as info:
        decode_frames(bytes(flipped), "s")
    assert info.value.offset == starts[1]
    past_end = bytearray(log)
    struct.pack_into(">I", past_end, starts[1], len(log))
    with pytest.raises(CorruptSessionError, match=f"valid frame starts at byte {starts[2]}"):
        decode_frames(bytes(past_end), "s")


def test_a_file_that_shrinks_while_read_ends_where_the_reads_end() -> None:
    """Its size was taken first; a later read that comes back short is the end of the file."""
    log, starts = _log()
    cut = starts[2] + 5  # inside a frame: that frame is a torn tail
    for chunk in CHUNKS:
        decoded = read_frames(_file_reader(log[:cut]), len(log), "s", chunk=chunk)
        assert (decoded.good_length, decoded.torn, decoded.size) == (starts[2], True, cut)
        assert len(decoded.events) == 2


def test_a_frame_bigger_than_a_chunk_gets_a_window_of_its_own() -> None:
    header = encode_header(SessionHeader(id="s1", created_at=1.0, cwd="/"))
    big = encode_event(_event(0, "x/note", {"ignorable": True, "text": "z" * 5000}))
    small = encode_event(_event(1, "x/note", {"ignorable": True}))
    data = header + big + small
    reads: list[int] = []

    def read_at(offset: int, size: int) -> bytes:
        reads.append(size)
        return data[offset : offset + size]

    decoded = read_frames(read_at, len(data), "s", chunk=256)
    assert [e["seq"] for e in decoded.events] == [0, 1]
    assert max(reads) == len(big)  # that frame, not the file
    assert sum(reads) < 2 * len(data)


def _session(store: SessionStore | MemoryStore, sid: str = "s1") -> SessionLog:
    log = store.create(SessionHeader(id=sid, created_at=1.0, cwd="/"))
    log.append("turn/start", {"turn": 1})
    log.append("turn/end", {"turn": 1, "reason": "completed"})
    log.checkpoint("turn")
    return log


def _with_tail(tmp_path: Path, tail: bytes) -> tuple[SessionStore, Path, int]:
    """A stored session "s1" with `tail` appended: (store, its file, its size before)."""
    store = SessionStore(tmp_path)
    _session(store).close()
    path = tmp_path / "s1.session"
    good = path.stat().st_size
    with path.open("ab") as f:
        f.write(tail)
    return store, path, good


def test_a_zero_filled_tail_longer_than_a_chunk_is_torn_and_repaired(tmp_path: Path) -> None:
    store, path, good = _with_tail(tmp_path, bytes(3 << 20))
    loaded = store.load("s1")
    assert loaded.repaired and loaded.torn_bytes == 3 << 20
    assert path.stat().st_size == good


def test_a_nonzero_byte_chunks_into_a_zero_tail_is_corruption(tmp_path: Path) -> None:
    store, path, good = _with_tail(tmp_path, bytes(3 << 20) + b"\x01")
    with pytest.raises(CorruptSessionError, match="zero-length frame") as info:
        store.load("s1")
    assert info.value.offset == good
    assert path.stat().st_size == good + (3 << 20) + 1  # refused, not repaired


def test_a_frame_bigger_than_the_read_chunk_loads_from_a_file(tmp_path: Path) -> None:
    store = SessionStore(tmp_path)
    log = _session(store)
    log.append("turn/start", {"turn": 2})
    log.append("x/note", {"ignorable": True, "text": "q" * (3 << 20)})
    log.append("turn/end", {"turn": 2, "reason": "completed"})
    log.close()
    loaded = store.load("s1")
    assert not loaded.repaired
    assert len(loaded.events[3]["data"]["text"]) == 3 << 20


@pytest.mark.parametrize("kind", ["file", "memory"])
def test_a_scan_of_a_missing_session_raises_when_asked_for(tmp_path: Path, kind: str) -> None:
    """As before: the file is opened by `scan` itself, not by the first `next`."""
    store = SessionStore(tmp_path) if kind == "file" else MemoryStore()
    with pytest.raises(SessionNotFoundError):
        store.scan("nope")


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_scan_closes_its_file_when_done_or_dropped(tmp_path: Path) -> None:
    store = SessionStore(tmp_path)
    _session(store).close()
    before = _open_fds()
    events = store.scan("s1")
    assert _open_fds() == before + 1
    assert next(events)["type"] == "turn/start"
    del events  # dropped half-way
    assert _open_fds() == before
    assert [e["type"] for e in store.scan("s1")] == ["turn/start", "turn/end"]
    assert _open_fds() == before
    store.scan("s1")  # never iterated at all
    assert _open_fds() == before


# Bytes that matter to the JSON-suspect check, often, among any others.
_SUSPECT_BYTES = st.sampled_from([0xC4, 0xC6, 0xC9, 0xCA, 0xCB, 0xD4, 0xD8, 0x7F, 0xFF, 0xF0, 0x80])


@given(st.lists(st.one_of(_SUSPECT_BYTES, st.integers(0, 255)), max_size=40).map(bytes))
def test_the_suspect_check_is_the_pattern(data: bytes) -> None:
    """A byte class first, the alternation only where it can match: the same answer."""
    assert _suspect(memoryview(data)) == (_SUSPECT.search(data) is not None)


def test_values_json_cannot_hold_are_still_refused() -> None:
    """NaN, infinities and bin values, in the envelope or deep in data, at any chunk size."""
    header = encode_header(SessionHeader(id="s1", created_at=1.0, cwd="/"))
    for bad in (float("nan"), float("inf"), float("-inf"), b"raw", {"deep": [1.5, float("nan")]}):
        for where in ("data", "time"):
            event: dict[str, Any] = {"type": "x/note", "seq": 0, "time": 1.0}
            event["data"] = {"ignorable": True, "value": bad} if where == "data" else {}
            if where == "time":
                if not isinstance(bad, float):
                    continue
                event["time"] = bad
            frame = encode_event(cast(Event, event))
            for chunk in CHUNKS:
                with pytest.raises(CorruptSessionError, match="JSON cannot") as info:
                    read_frames(_file_reader(header + frame), len(header + frame), "s", chunk)
                assert info.value.offset == len(header)
