"""The torn-tail search stays linear even on bytes crafted to look like frames everywhere."""

from __future__ import annotations

import struct

import gevent
import pytest

from agent.events import SessionHeader
from agent.frames import CorruptSessionError, decode_frames, encode_event, encode_header


def _log() -> bytes:
    header = SessionHeader(id="s1", created_at=1.0, cwd="/")
    event = {"type": "turn/start", "seq": 0, "time": 1.0, "data": {"turn": 1}}
    return encode_header(header) + encode_event(event)


def test_a_tail_that_looks_like_envelopes_everywhere_is_reported_not_searched_for_ever() -> None:
    # After a frame whose length runs past the end, a 5-byte pattern: every fifth offset reads
    # as a length that fits (0x00020084) with the envelope marker 8 bytes on, so a search that
    # CRC'd each candidate would do ~n/5 CRCs of 128 KiB.
    pattern = b"\x00\x02\x00\x84\x84"
    data = _log() + struct.pack(">II", 0x00FFFFFF, 0) + pattern * (150 * 1024)
    # In the hub's thread pool, as the store decodes anything this big: the point here is that
    # the work is bounded, not that a 750 KB scan fits in the hub's 0.1 s.
    with pytest.raises(CorruptSessionError, match="cannot be classified cheaply"):
        gevent.get_hub().threadpool.apply(decode_frames, (data, "crafted"))


def test_a_plain_torn_tail_is_still_torn() -> None:
    log = _log()
    extra = encode_event({"type": "turn/end", "seq": 1, "time": 1.0, "data": {"turn": 1}})
    _header, events, good, torn = decode_frames(log + extra[:-3], "torn")
    assert torn and good == len(log) and len(events) == 1
