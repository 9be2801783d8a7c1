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
from collections.abc import Iterator
from typing import Any, Final, cast

import msgpack

from agent.errors import CorruptSessionError
from agent.events import Event, SessionHeader
from agent.jsoncheck import explain, is_lossless

__all__ = [
    "FRAME_HEADER_SIZE",
    "MAGIC",
    "MAX_FRAME",
    "CorruptSessionError",
    "decode_frames",
    "encode_event",
    "encode_header",
    "iter_events",
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
_suspect = _SUSPECT.search


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


def decode_frames(
    data: bytes | bytearray | memoryview, name: str
) -> tuple[SessionHeader, list[Event], int, bool]:
    """Decode a whole session file: (header, events, good_length, torn).

    `good_length` is the byte length of the intact prefix; `torn` says bytes after it were
    dropped as an incomplete tail write.
    """
    view = memoryview(data)
    size = len(view)
    if size == 0:
        raise CorruptSessionError(name, 0, "empty file (no header frame)")
    end, payload, torn = _next_frame(view, 0, size, name)
    if torn or payload is None:
        raise CorruptSessionError(name, 0, "torn header frame")
    header = _decode_header(payload, name)
    events: list[Event] = []
    append = events.append
    unpackb = msgpack.unpackb
    offset = end
    while offset < size:
        # Fast path: a complete frame whose CRC matches.
        if size - offset >= 8:
            length, crc = _unpack_prefix(view, offset)
            stop = offset + 8 + length
            if 0 < length <= MAX_FRAME and stop <= size:
                payload = view[offset + 8 : stop]
                if _crc32(payload) == crc:
                    try:
                        event = unpackb(payload)
                    except Exception as exc:
                        raise CorruptSessionError(
                            name, offset, f"bad msgpack: {_why(exc)}"
                        ) from None
                    # The envelope's fields are checked by the invariant replay (by seq).
                    if type(event) is not dict:
                        raise CorruptSessionError(name, offset, "frame is not an event")
                    if _suspect(payload) is not None and not is_lossless(event):
                        raise _not_json(event, name, offset)
                    append(cast(Event, event))
                    offset = stop
                    continue
        end, payload, torn = _next_frame(view, offset, size, name)
        if torn:
            return header, events, offset, True
        raise AssertionError("unreachable: slow path accepted a frame the fast path refused")
    return header, events, offset, False


def decode_header(data: bytes | bytearray | memoryview, name: str) -> SessionHeader:
    """The header frame alone: readable even when later frames are damaged."""
    view = memoryview(data)
    size = len(view)
    if size == 0:
        raise CorruptSessionError(name, 0, "empty file (no header frame)")
    _end, payload, torn = _next_frame(view, 0, size, name)
    if torn or payload is None:
        raise CorruptSessionError(name, 0, "torn header frame")
    return _decode_header(payload, name)


# msgpack's marker for a 4-entry map: how every event envelope (type, seq, time, data) begins.
_ENVELOPE_MAP = 0x84
# CRC bytes the torn-tail search may spend before it gives up (see `_valid_frame_within`).
_SEARCH_BUDGET_MIN = 1 << 20


def iter_events(data: bytes | bytearray | memoryview, name: str, start: int = 0) -> Iterator[Event]:
    """The events of a session file, decoded one at a time as they are consumed.

    For scans that stop early (the first descriptor after a fork seed): frames before index
    `start` are CRC-checked but not unpacked, and nothing after the consumer stops is touched.
    Corruption met on the way raises `CorruptSessionError`; a torn tail ends the iteration.
    No invariant replay: a scan reads, it does not vouch for the log.
    """
    view = memoryview(data)
    size = len(view)
    offset, payload, torn = _next_frame(view, 0, size, name) if size else (0, None, True)
    if torn or payload is None:
        raise CorruptSessionError(name, 0, "torn or missing header frame")
    index = 0
    while offset < size:
        end, payload, torn = _next_frame(view, offset, size, name)
        if torn or payload is None:
            return
        if index >= start:
            try:
                event = msgpack.unpackb(payload)
            except Exception as exc:
                raise CorruptSessionError(name, offset, f"bad msgpack: {_why(exc)}") from None
            if type(event) is not dict:
                raise CorruptSessionError(name, offset, "frame is not an event")
            if _suspect(payload) is not None and not is_lossless(event):
                raise _not_json(event, name, offset)
            yield cast(Event, event)
        index += 1
        offset = end


def _next_frame(
    view: memoryview, offset: int, size: int, name: str
) -> tuple[int, memoryview | None, bool]:
    """Classify the frame at `offset`: (end, payload, False), (offset, None, True) or raise."""
    rest = size - offset
    if _all_zero(view, offset):
        return offset, None, True  # zero-filled tail (also covers a short all-zero prefix)
    if rest < 8:
        return offset, None, True
    length, crc = _unpack_prefix(view, offset)
    if length == 0:
        raise CorruptSessionError(name, offset, "zero-length frame")
    if length > MAX_FRAME:
        raise CorruptSessionError(name, offset, f"frame length {length} exceeds {MAX_FRAME}")
    stop = offset + 8 + length
    if stop > size:
        found = _valid_frame_within(view, offset + 1, size, name)
        if found is not None:
            raise CorruptSessionError(
                name,
                offset,
                f"frame length {length} runs past end of file, but a valid frame starts at "
                f"byte {found}",
            )
        return offset, None, True
    payload = view[offset + 8 : stop]
    if _crc32(payload) != crc:
        if stop == size:
            return offset, None, True
        raise CorruptSessionError(name, offset, "CRC mismatch")
    return stop, payload, False


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


def _valid_frame_within(view: memoryview, start: int, size: int, name: str) -> int | None:
    """First offset in [start, size) where a complete, CRC-valid frame begins, if any.

    A real torn tail is one partial frame whose bytes rarely even look like a frame, so the
    search is cheap: only offsets followed, 8 bytes on, by the event envelope's msgpack marker
    are candidates (found by a C-speed `find`). Crafted bytes could still offer a long candidate
    at every few offsets, so CRC work is capped; past the cap the tail cannot be told from a
    damaged length field, and that is reported as corruption rather than guessed.
    """
    raw = view.obj if isinstance(view.obj, bytes) and len(view.obj) == size else view.tobytes()
    budget = max(_SEARCH_BUDGET_MIN, 4 * (size - start))
    marker = bytes([_ENVELOPE_MAP])
    at = raw.find(marker, start + 8, size)
    while at >= 0:
        pos = at - 8
        length, crc = _unpack_prefix(view, pos)
        if length > 0 and pos + 8 + length <= size:
            budget -= length
            if budget < 0:
                raise CorruptSessionError(
                    name,
                    start - 1,
                    "a frame length runs past end of file over bytes that cannot be "
                    "classified cheaply",
                )
            if _crc32(view[pos + 8 : pos + 8 + length]) == crc:
                return pos
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
