"""The session file format: length-prefixed, CRC-checked msgpack frames.

Frame: 4-byte big-endian payload length, 4-byte big-endian CRC32 of the payload, payload. The
first frame holds `{"magic": MAGIC, "header": SessionHeader.to_json()}`; every later frame
holds one event dict. See docs/durability.md for why the tail rules below are what they are.

Tail rules (a SIGKILL mid-write leaves a prefix of what was written, so it must read as torn):
- fewer than 8 bytes left, or a payload that runs past end of file: torn, unless a complete
  CRC-valid frame starts inside that region (then a length field was damaged: corrupt);
- a complete frame ending exactly at end of file whose CRC does not match: torn (power loss
  can leave the last block's extent written but not its data);
- everything from some frame boundary to end of file is zero bytes: torn (zero-filled extent);
- any other CRC mismatch, a CRC-valid payload that is not a well-formed event, a zero or
  oversized length: `CorruptSessionError` with the frame's byte offset.
"""

from __future__ import annotations

import re
import struct
import zlib
from collections.abc import Callable, Iterator
from typing import Any, Final, NamedTuple, Protocol, cast

import msgpack

from agent.errors import CorruptSessionError, InvariantError
from agent.events import Event, SessionHeader
from agent.jsoncheck import explain, is_lossless

__all__ = [
    "FRAME_HEADER_SIZE",
    "MAGIC",
    "MAX_FRAME",
    "READ_CHUNK",
    "CorruptSessionError",
    "Decoded",
    "EventSink",
    "ReadAt",
    "Skimmed",
    "decode_frames",
    "encode_event",
    "encode_header",
    "iter_events",
    "iter_frames",
    "read_frames",
    "skim_frames",
]

MAGIC: Final = "subagent-session/1"
FRAME_HEADER_SIZE: Final = 8
# A bigger payload is refused at append and read as corruption at load.
MAX_FRAME: Final = 64 * 1024 * 1024

_prefix = struct.Struct(">II")
_pack_prefix = _prefix.pack
_unpack_prefix = _prefix.unpack_from
_crc32 = zlib.crc32
_packb = msgpack.Packer(use_bin_type=True, autoreset=True).pack

# Bytes that may start a value JSON cannot hold: bin (c4-c6), ext (c7-c9, d4-d8), or a float
# whose exponent is all ones (NaN, inf). They also occur inside UTF-8 text and other values, so
# a match only sends the decoded event to the full lossless-JSON walk; no match rules them out.
_SUSPECT = re.compile(rb"[\xc4-\xc9\xd4-\xd8]|\xcb[\x7f\xff][\xf0-\xff]|\xca[\x7f\xff][\x80-\xff]")
_suspect_at = _SUSPECT.search
# A byte every match above holds, as one character class: `re` scans for a lone class in C,
# while the alternation is tried at every byte (1.5 us for a typical event, as much as
# unpacking it). Most payloads hold none of these bytes and skip the alternation.
_suspect_byte = re.compile(rb"[\xc4-\xc9\xd4-\xd8\x7f\xff]").search


def _suspect(payload: memoryview) -> bool:
    """Whether the payload may hold a value JSON cannot (then the decoded event is walked)."""
    return _suspect_byte(payload) is not None and _suspect_at(payload) is not None


def _why(exc: Exception) -> str:
    """msgpack's reason, or its name where it gives none (a `StackError` says nothing)."""
    if isinstance(exc, msgpack.StackError):
        return "values nested too deeply"
    return str(exc) or type(exc).__name__


def _not_json(event: object, name: str, offset: int) -> CorruptSessionError:
    """Only JSON-native values are valid in a log: anything else is corruption here."""
    why = explain(event, "event")
    return CorruptSessionError(name, offset, f"frame holds a value JSON cannot: {why}")


def encode_header(header: SessionHeader) -> bytes:
    return _frame(_packb({"magic": MAGIC, "header": header.to_json()}))


def encode_event(event: Event) -> bytes:
    """One event frame. The data must already have passed `check_json`."""
    return _frame(_packb(event))


def _frame(payload: bytes) -> bytes:
    if len(payload) > MAX_FRAME:
        raise ValueError(f"frame of {len(payload)} bytes exceeds the {MAX_FRAME}-byte limit")
    return _pack_prefix(len(payload), _crc32(payload)) + payload


class ReadAt(Protocol):
    """Up to `size` bytes of a session file from `offset`; fewer only where the file ends."""

    def __call__(self, offset: int, size: int, /) -> bytes | bytearray | memoryview: ...


class Decoded(NamedTuple):
    """A decoded session file. `good_length` is the byte length of the intact prefix; `torn`
    says bytes after it were dropped as an incomplete tail write; `size` is how many bytes the
    file had as read (less than asked for when it shrank meanwhile)."""

    header: SessionHeader
    events: list[Event]
    good_length: int
    torn: bool
    size: int


# How much of a file a streaming read holds at once (more only for a frame that is bigger):
# a load's transient memory is this, not the file's size (docs/performance.md, "load memory").
READ_CHUNK: Final = 1 << 20
_EMPTY: Final = memoryview(b"")


class _Window:
    """A session file seen through one window of its bytes at a time.

    The window moves forward as frames are consumed, so reading a file of any size holds one
    chunk (or one frame, when a frame is bigger), not the file. Over a buffer already in memory
    the window is the whole buffer, as a view: nothing is copied.
    """

    __slots__ = ("base", "chunk", "read_at", "size", "view")

    def __init__(self, read_at: ReadAt, size: int, chunk: int) -> None:
        self.read_at = read_at
        self.size = size
        self.chunk = max(chunk, 1)
        self.view = _EMPTY
        self.base = 0

    def at(self, offset: int, need: int) -> tuple[memoryview, int]:
        """(window, index of `offset` in it): the window holds `need` bytes from `offset`, or
        every byte up to the end of the file when fewer are left."""
        view = self.view
        rel = offset - self.base
        if rel >= 0 and (rel + need <= len(view) or self.base + len(view) >= self.size):
            return view, rel
        del view
        self.view = _EMPTY  # the old window goes before the next is read: one held at a time
        want = min(max(need, self.chunk), self.size - offset)
        data = self.read_at(offset, want)
        if len(data) < want:  # the file shrank since its size was taken: it ends here now
            self.size = offset + len(data)
        self.view = memoryview(data)
        self.base = offset
        return self.view, 0


def _slices(view: memoryview) -> ReadAt:
    """A reader over a buffer in memory: views of it, never copies."""

    def read_at(offset: int, size: int) -> memoryview:
        return view[offset : offset + size]

    return read_at


def decode_frames(
    data: bytes | bytearray | memoryview, name: str
) -> tuple[SessionHeader, list[Event], int, bool]:
    """Decode a whole session file held in memory: (header, events, good_length, torn)."""
    view = memoryview(data)
    decoded = read_frames(_slices(view), len(view), name, chunk=len(view))
    return decoded.header, decoded.events, decoded.good_length, decoded.torn


class EventSink(Protocol):
    """Where `read_frames` hands each event it decodes, with the payload it was decoded from: a
    view of the reader's window, valid during the call only (copy what is kept)."""

    def __call__(self, event: Event, payload: memoryview, /) -> None: ...


def _open(read_at: ReadAt, size: int, name: str, chunk: int) -> tuple[_Window, int, SessionHeader]:
    """A window on the file, where its header frame ends, and the header: a file without one
    is corrupt."""
    if size <= 0:
        raise CorruptSessionError(name, 0, "empty file (no header frame)")
    src = _Window(read_at, size, chunk)
    end, frame, torn = _next_frame(src, 0, name)
    if torn or frame is None:
        raise CorruptSessionError(name, 0, "torn header frame")
    return src, end, _decode_header(frame, name)


def read_frames(
    read_at: ReadAt,
    size: int,
    name: str,
    chunk: int = READ_CHUNK,
    sink: Callable[[SessionHeader], EventSink] | None = None,
) -> Decoded:
    """Decode a session file of `size` bytes, read through `read_at` a chunk at a time.

    Blocking wherever `read_at` blocks: the store calls this in the hub's thread pool for a
    file of any size that matters. Holds one chunk of the file at a time, plus the events.

    With `sink`, it is called with the header, and the event sink it returns gets each event
    (with its payload) in order instead of the returned list (`Decoded.events` is empty): a
    reader that keeps events encoded holds one decoded event at a time, not all of them.
    """
    src, end, header = _open(read_at, size, name, chunk)
    events: list[Event] = []
    append = events.append
    keep = sink(header) if sink is not None else None
    unpackb = msgpack.unpackb
    offset = end
    while offset < src.size:
        # Fast path: the complete, CRC-valid frames the window holds.
        view = src.view
        base = src.base
        limit = len(view)
        rel = offset - base
        while rel + 8 <= limit:
            length, crc = _unpack_prefix(view, rel)
            stop = rel + 8 + length
            if length == 0 or length > MAX_FRAME or stop > limit:
                break
            payload = view[rel + 8 : stop]
            if _crc32(payload) != crc:
                break
            try:
                event = unpackb(payload)
            except Exception as exc:
                raise CorruptSessionError(name, base + rel, f"bad msgpack: {_why(exc)}") from None
            # The envelope's fields are checked by the invariant replay (by seq).
            if type(event) is not dict:
                raise CorruptSessionError(name, base + rel, "frame is not an event")
            if (
                _suspect_byte(payload) is not None
                and _suspect_at(payload) is not None
                and not is_lossless(event)
            ):
                raise _not_json(event, name, base + rel)
            if keep is None:
                append(cast(Event, event))
            else:
                keep(cast(Event, event), payload)
            rel = stop
        offset = base + rel
        if offset >= src.size:
            break
        # A frame the window cuts, or one that is not a plain good frame: classified against
        # the whole file (the window moves on to hold it).
        view = payload = _EMPTY
        end, frame, torn = _next_frame(src, offset, name)
        if torn or frame is None:
            return Decoded(header, events, offset, True, src.size)
        if keep is None:
            append(_event(frame, name, offset))
        else:
            keep(_event(frame, name, offset), frame)
        del frame
        offset = end
    return Decoded(header, events, offset, False, src.size)


def _event(payload: memoryview, name: str, offset: int) -> Event:
    """One event frame's payload, decoded and checked (the envelope's fields are the replay's)."""
    try:
        event = msgpack.unpackb(payload)
    except Exception as exc:
        raise CorruptSessionError(name, offset, f"bad msgpack: {_why(exc)}") from None
    if type(event) is not dict:
        raise CorruptSessionError(name, offset, "frame is not an event")
    if _suspect(payload) and not is_lossless(event):
        raise _not_json(event, name, offset)
    return cast(Event, event)


class Skimmed(NamedTuple):
    """A session file skimmed for a few types of event (`skim_frames`): its header, the events
    of those types in order (each one's `seq` checked to be its place in the log), how many
    frames the intact prefix holds, and whether a torn tail follows it."""

    header: SessionHeader
    events: list[Event]
    frames: int
    torn: bool


# How much of a file a skim reads at once: a frame it skips is read no further than this.
SKIM_CHUNK: Final = 1 << 16
# Enough of a payload to read its type from, as the log writes it: `{"type": <fixstr>, ...`.
_PEEK: Final = 40
_ENVELOPE_HEAD: Final = b"\x84\xa4type"


def _peeked_type(head: memoryview) -> str | None:
    """The type an event payload starts with, when it starts as the log writes one (a map of
    four whose first key is "type", then a fixstr); None otherwise (then it is decoded)."""
    if len(head) < 7 or head[:6].tobytes() != _ENVELOPE_HEAD or not 0xA0 <= head[6] <= 0xBF:
        return None
    size = head[6] & 0x1F
    if len(head) < 7 + size:
        return None
    try:
        return bytes(head[7 : 7 + size]).decode("utf-8")
    except UnicodeDecodeError:
        return None


def skim_frames(
    read_at: ReadAt,
    size: int,
    name: str,
    wanted: frozenset[str],
    chunk: int = SKIM_CHUNK,
) -> Skimmed:
    """The header and the events of the `wanted` types of a session file, reading only those
    frames whole: of every other frame, its prefix and the first bytes of its payload (its
    type), one small window at a time. For a listing, whose rows need a few events of each log
    (the descriptor, the replies' usage), never a log's tool results.

    What it vouches for: the header frame; the chain of frame lengths to the end of the file
    (a zero or oversized length is corruption, one running past the end a torn tail); each
    frame it decodes (CRC, msgpack, lossless JSON, a dict whose `seq` is its index). Not the
    bytes it skips, nor the event rules: a resume (`load`) checks all of it.
    """
    src, end, header = _open(read_at, size, name, chunk)
    events: list[Event] = []
    offset = end
    index = 0
    while offset < src.size:
        view, rel = src.at(offset, 8 + _PEEK)
        if src.size - offset < 8:
            return Skimmed(header, events, index, True)
        length, crc = _unpack_prefix(view, rel)
        if length == 0:
            del view
            if _zero_to_end(src, offset):
                return Skimmed(header, events, index, True)
            raise CorruptSessionError(name, offset, "zero-length frame")
        if length > MAX_FRAME:
            raise CorruptSessionError(name, offset, f"frame length {length} exceeds {MAX_FRAME}")
        stop = offset + 8 + length
        if stop > src.size:
            return Skimmed(header, events, index, True)
        kind = _peeked_type(view[rel + 8 : rel + 8 + min(length, _PEEK)])
        del view
        if kind is None or kind in wanted:
            view, rel = src.at(offset, 8 + length)
            payload = view[rel + 8 : rel + 8 + length]
            del view
            if _crc32(payload) != crc:
                if stop == src.size:
                    return Skimmed(header, events, index, True)
                raise CorruptSessionError(name, offset, "CRC mismatch")
            event = _event(payload, name, offset)
            del payload
            if event.get("type") in wanted:
                seq = event.get("seq")
                if type(seq) is not int or seq != index:
                    raise InvariantError(index, f"{name}: seq {seq!r}, expected {index}")
                events.append(event)
        offset = stop
        index += 1
    return Skimmed(header, events, index, False)


def decode_header(data: bytes | bytearray | memoryview, name: str) -> SessionHeader:
    """The header frame alone: readable even when later frames are damaged."""
    view = memoryview(data)
    size = len(view)
    if size == 0:
        raise CorruptSessionError(name, 0, "empty file (no header frame)")
    _end, payload, torn = _next_frame(_Window(_slices(view), size, size), 0, name)
    if torn or payload is None:
        raise CorruptSessionError(name, 0, "torn header frame")
    return _decode_header(payload, name)


# msgpack's marker for a 4-entry map: how every event envelope (type, seq, time, data) begins.
_ENVELOPE_MAP = 0x84
# CRC bytes the torn-tail search may spend before it gives up (see `_valid_frame_within`).
_SEARCH_BUDGET_MIN = 1 << 20


def iter_events(data: bytes | bytearray | memoryview, name: str, start: int = 0) -> Iterator[Event]:
    """The events of a session file held in memory, decoded one at a time as consumed."""
    view = memoryview(data)
    return iter_frames(_slices(view), len(view), name, start, chunk=len(view))


def iter_frames(
    read_at: ReadAt, size: int, name: str, start: int = 0, chunk: int = READ_CHUNK
) -> Iterator[Event]:
    """The events of a session file, read a chunk at a time and decoded as they are consumed.

    For scans that stop early (the first descriptor after a fork seed): frames before index
    `start` are CRC-checked but not unpacked, and nothing after the consumer stops is read.
    Corruption met on the way raises `CorruptSessionError`; a torn tail ends the iteration.
    No invariant replay: a scan reads, it does not vouch for the log.
    """
    src = _Window(read_at, size, chunk)
    offset, payload, torn = _next_frame(src, 0, name) if size > 0 else (0, None, True)
    if torn or payload is None:
        raise CorruptSessionError(name, 0, "torn or missing header frame")
    index = 0
    while offset < src.size:
        end, payload, torn = _next_frame(src, offset, name)
        if torn or payload is None:
            return
        event = _event(payload, name, offset) if index >= start else None
        payload = None  # not held while suspended: the window may move on the next read
        if event is not None:
            yield event
        index += 1
        offset = end


def _next_frame(src: _Window, offset: int, name: str) -> tuple[int, memoryview | None, bool]:
    """Classify the frame at `offset`: (end, payload, False), (offset, None, True) or raise."""
    view, rel = src.at(offset, 8)
    if src.size - offset < 8:
        return offset, None, True  # a prefix shorter than a frame's (zero-filled or not)
    length, crc = _unpack_prefix(view, rel)
    if length == 0:
        if _zero_to_end(src, offset):
            return offset, None, True  # zero-filled tail
        raise CorruptSessionError(name, offset, "zero-length frame")
    if length > MAX_FRAME:
        raise CorruptSessionError(name, offset, f"frame length {length} exceeds {MAX_FRAME}")
    del view
    view, rel = src.at(offset, 8 + length)
    stop = offset + 8 + length
    if stop > src.size:
        del view
        found = _valid_frame_within(src, offset, name)
        if found is not None:
            raise CorruptSessionError(
                name,
                offset,
                f"frame length {length} runs past end of file, but a valid frame starts at "
                f"byte {found}",
            )
        return offset, None, True
    payload = view[rel + 8 : rel + 8 + length]
    if _crc32(payload) != crc:
        if stop == src.size:
            return offset, None, True
        raise CorruptSessionError(name, offset, "CRC mismatch")
    return stop, payload, False


def _zero_to_end(src: _Window, start: int) -> bool:
    """Whether every byte of the file from `start` on is zero, read a chunk at a time (a
    zero-filled extent can be hundreds of MB: it is checked, never held whole)."""
    step = 64  # a frame, whose prefix has a nonzero byte within 8, is told at once
    while start < src.size:
        chunk = src.read_at(start, min(step, src.size - start))
        if not chunk:
            src.size = start  # the file shrank meanwhile: it ends here now
            break
        if not _all_zero(memoryview(chunk), 0):
            return False
        start += len(chunk)
        step = src.chunk
    return True


def _all_zero(view: memoryview, start: int) -> bool:
    """Whether every byte from `start` on is zero, compared a chunk at a time in C: `any()` over
    a memoryview is a loop over Python ints (6 s for a 300 MB zero-filled tail). The first
    chunk is small, so a frame, whose prefix has a nonzero byte within 8, is told at once."""
    size = len(view)
    step = 64
    while start < size:
        chunk = view[start : start + step].tobytes()
        if chunk.count(0) != len(chunk):
            return False
        start += step
        step = 1 << 16
    return True


def _valid_frame_within(src: _Window, offset: int, name: str) -> int | None:
    """First offset after `offset` where a complete, CRC-valid frame begins, if any.

    Called when the frame at `offset` claims a length that runs past the end of the file, so
    the rest of the file is shorter than one frame (at most `MAX_FRAME` + 8 bytes): it is read
    whole. A real torn tail is one partial frame whose bytes rarely even look like a frame, so
    the search is cheap: only offsets followed, 8 bytes on, by the event envelope's msgpack
    marker are candidates (found by a C-speed `find`). Crafted bytes could still offer a long
    candidate at every few offsets, so CRC work is capped; past the cap the tail cannot be told
    from a damaged length field, and that is reported as corruption rather than guessed.
    """
    window, rel = src.at(offset, src.size - offset)
    tail = window[rel : rel + src.size - offset]
    del window
    obj = tail.obj
    raw = obj if rel == 0 and isinstance(obj, bytes) and len(obj) == len(tail) else tail.tobytes()
    view = memoryview(raw)
    size = len(raw)
    budget = max(_SEARCH_BUDGET_MIN, 4 * (size - 1))
    marker = bytes([_ENVELOPE_MAP])
    at = raw.find(marker, 1 + 8, size)
    while at >= 0:
        pos = at - 8
        length, crc = _unpack_prefix(view, pos)
        if length > 0 and pos + 8 + length <= size:
            budget -= length
            if budget < 0:
                raise CorruptSessionError(
                    name,
                    offset,
                    "a frame length runs past end of file over bytes that cannot be "
                    "classified cheaply",
                )
            if _crc32(view[pos + 8 : pos + 8 + length]) == crc:
                return offset + pos
        at = raw.find(marker, at + 1, size)
    return None


def _decode_header(payload: memoryview, name: str) -> SessionHeader:
    try:
        obj: Any = msgpack.unpackb(payload)
    except Exception as exc:
        raise CorruptSessionError(name, 0, f"bad header msgpack: {_why(exc)}") from None
    if type(obj) is not dict or obj.get("magic") != MAGIC:
        raise CorruptSessionError(name, 0, "not a session file (bad magic)")
    if not is_lossless(obj):
        raise _not_json(obj, name, 0)
    try:
        return SessionHeader.from_json(obj.get("header"))
    except (TypeError, ValueError) as exc:
        raise CorruptSessionError(name, 0, f"bad header: {exc}") from None
