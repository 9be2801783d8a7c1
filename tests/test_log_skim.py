"""`frames.skim_frames`: a listing's read of a stored log, on good, torn, damaged and hostile
bytes. It reads whole only the frames of the types asked for; of every other frame, its prefix
and its first bytes. Also: a file that grows while it is read is read as it was when opened."""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path
from typing import Any

import msgpack
import pytest

from agent.errors import InvariantError
from agent.events import SessionHeader
from agent.frames import MAX_FRAME, CorruptSessionError, encode_header, skim_frames
from agent.store import SessionStore

REPLY = "assistant/message"
WANTED = frozenset({REPLY})


def frame(payload: bytes) -> bytes:
    return struct.pack(">II", len(payload), zlib.crc32(payload)) + payload


def event(seq: int, kind: str, data: dict[str, Any]) -> bytes:
    return frame(msgpack.packb({"type": kind, "seq": seq, "time": 1.0, "data": data}))


HEAD = encode_header(SessionHeader(id="s1", created_at=1.0, cwd="/w"))
BIG = 4 * 1024 * 1024


def good_body() -> bytes:
    return (
        event(0, "turn/start", {"turn": 1})
        + event(1, REPLY, {"n": 1})
        + event(2, "tool/result", {"content": "x" * BIG})
        + event(3, REPLY, {"n": 2})
    )


class Counted:
    """A `read_at` over bytes that counts what it hands out."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.read = 0

    def __call__(self, offset: int, size: int) -> bytes:
        piece = self.data[offset : offset + size]
        self.read += len(piece)
        return piece


def skim(data: bytes) -> Any:
    return skim_frames(Counted(data), len(data), "f", WANTED)


def test_only_the_wanted_frames_are_read_whole() -> None:
    data = HEAD + good_body()
    reader = Counted(data)
    skimmed = skim_frames(reader, len(data), "f", WANTED)
    assert [(e["seq"], e["data"]) for e in skimmed.events] == [(1, {"n": 1}), (3, {"n": 2})]
    assert skimmed.frames == 4 and not skimmed.torn
    assert reader.read < 3 * 65536 < BIG


@pytest.mark.parametrize("cut", [1, 7, 8, 100, BIG // 2])
def test_a_torn_tail_ends_the_skim(cut: int) -> None:
    data = HEAD + good_body()
    skimmed = skim(data[: len(data) - cut])
    assert skimmed.torn
    assert [e["seq"] for e in skimmed.events] == [1]


def test_a_zero_filled_tail_is_torn_and_a_zero_length_mid_file_is_corrupt() -> None:
    assert skim(HEAD + good_body() + bytes(100_000)).torn
    with pytest.raises(CorruptSessionError, match="zero-length"):
        skim(HEAD + struct.pack(">II", 0, 0) + b"junk" + good_body())


def test_a_length_of_4_gib_is_corrupt_and_nothing_that_size_is_read() -> None:
    data = HEAD + event(0, "turn/start", {"turn": 1}) + struct.pack(">II", 0xFFFFFFFF, 0) + b"x"
    reader = Counted(data)
    with pytest.raises(CorruptSessionError, match=f"exceeds {MAX_FRAME}"):
        skim_frames(reader, len(data), "f", WANTED)
    assert reader.read <= len(data)


def test_a_wanted_frame_nested_100_000_deep_is_corrupt() -> None:
    deep = b"\x84\xa4type\xb1assistant/message\xa3seq\x00\xa4data" + b"\x91" * 100_000 + b"\xc0"
    with pytest.raises(CorruptSessionError, match="nested too deeply"):
        skim(HEAD + frame(deep) + event(1, "turn/start", {"turn": 1}))


def test_a_payload_that_does_not_start_as_the_log_writes_one_is_decoded_to_learn_its_type() -> None:
    reordered = msgpack.packb({"seq": 0, "type": REPLY, "time": 1.0, "data": {"n": 9}})
    assert skim(HEAD + frame(reordered)).events[0]["data"] == {"n": 9}
    with pytest.raises(CorruptSessionError, match="not an event"):
        skim(HEAD + frame(msgpack.packb([1, 2])) + event(1, REPLY, {}))


def test_a_wanted_frame_with_a_bad_crc_is_corrupt_mid_file_and_torn_at_the_end() -> None:
    bad = bytearray(event(1, REPLY, {"n": 1}))
    bad[-1] ^= 0xFF
    start = event(0, "turn/start", {"turn": 1})
    with pytest.raises(CorruptSessionError, match="CRC"):
        skim(HEAD + start + bytes(bad) + event(2, REPLY, {}))
    assert skim(HEAD + start + bytes(bad)).torn


def test_a_wanted_event_out_of_place_is_refused() -> None:
    with pytest.raises(InvariantError, match="seq 5, expected 1"):
        skim(HEAD + event(0, "turn/start", {"turn": 1}) + event(5, REPLY, {}))


def test_a_file_that_grows_while_it_is_read_is_read_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another writer appending (a hostile one: a live log is locked) is not followed: each
    read stops at the size the file had when it was opened, and nothing is held beyond it."""
    store = SessionStore(tmp_path)
    log = store.create(SessionHeader(id="sgrow", created_at=1.0, cwd="/w"))
    log.append("turn/start", {"turn": 1})
    log.append("turn/end", {"turn": 1, "reason": "completed"})
    log.close()
    path = tmp_path / "sgrow.session"
    size = path.stat().st_size
    real = os.pread
    grown = [0]

    def pread(fd: int, length: int, offset: int) -> bytes:
        with path.open("ab") as out:  # every read finds the file longer than it was
            out.write(event(2 + grown[0], "turn/start", {"turn": 2 + grown[0]}))
        grown[0] += 1
        return real(fd, length, offset)

    monkeypatch.setattr(os, "pread", pread)
    assert len(store.inspect("sgrow").events) == 2
    before = grown[0]  # frames appended before the skim opens the file: it reads those
    assert before > 0 and path.stat().st_size > size
    [(_stamp, value)] = store.skim_logs({"sgrow": None}, {REPLY}, lambda s: s.frames).values()
    assert value == 2 + before < 2 + grown[0]
