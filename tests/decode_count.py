"""Counting the log's msgpack decodes, for tests that check what a path decodes."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

import agent.log


def count_decodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """From now on (until `monkeypatch.undo()`), every `msgpack.unpackb`, the log's own
    included, adds one to the returned counter's only item."""
    decodes = [0]
    real = msgpack.unpackb

    def counting(payload: Any, **kwargs: Any) -> Any:
        decodes[0] += 1
        return real(payload, **kwargs)

    monkeypatch.setattr(msgpack, "unpackb", counting)
    monkeypatch.setattr(agent.log, "_unpackb", counting)
    return decodes
