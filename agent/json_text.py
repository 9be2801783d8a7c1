"""Parsing JSON a peer sent (a JSON-RPC line, a model's answer) without holding the gevent hub.

`json.loads` is C code that keeps the GIL for the whole parse: a 16 MiB line of tiny objects
takes a fraction of a second to seconds, and running it in a thread does not help, since the
hub's thread cannot run until the parse gives the GIL back (measured: a 0.18 s parse in the
hub's thread pool froze the hub for 0.18 s). So:

- a line up to `ON_HUB_BYTES` is parsed on the hub by `json.loads`: at most a few milliseconds
  even for the worst shape (docs/decisions.md has the measurements), less than a thread hop;
- a longer line is parsed in the hub's thread pool by the standard library's pure-Python
  scanner (`json.scanner.py_make_scanner`): it walks the document in bytecode, so the
  interpreter hands the GIL back to the hub every switch interval (5 ms). It is slower, but
  only the peer that sent the huge line waits. Each string is still read by the C
  `scanstring` in one call (about 4 ns a byte even when every character is an escape: a
  16 MiB string holds the GIL some 65 ms; the pure-Python one's regular expression took
  longer);
- such a line may hold at most `MAX_CONTAINERS` arrays and objects: every one is a tracked
  object the cyclic collector scans in one pass once it is back on, a pause on the hub that
  grows with their number (5 million empty arrays: 1.4 s). A real message is large because of
  its strings (a file's text), never because of millions of containers.
"""

from __future__ import annotations

import json
import json.decoder
import json.scanner
from collections.abc import Callable
from typing import Any

from agent.errors import TooManyContainers
from agent.store import gc_paused
from supervision.offload import offload

__all__ = ["MAX_CONTAINERS", "ON_HUB_BYTES", "parse_json"]

ON_HUB_BYTES = 64 * 1024
MAX_CONTAINERS = 100_000

# The standard library's pure-Python pieces (public names typeshed does not declare).
_parse_object: Callable[..., Any] = vars(json.decoder)["JSONObject"]
_parse_array: Callable[..., Any] = vars(json.decoder)["JSONArray"]
_py_make_scanner: Callable[[json.JSONDecoder], Any] = vars(json.scanner)["py_make_scanner"]


class _BoundedDecoder(json.JSONDecoder):
    """The standard decoder, walking in Python and counting the containers it makes."""

    def __init__(self) -> None:
        super().__init__()
        self._left = MAX_CONTAINERS

        def counted_object(*args: Any) -> Any:
            self._spend()
            return _parse_object(*args)

        def counted_array(*args: Any) -> Any:
            self._spend()
            return _parse_array(*args)

        # What `py_make_scanner` reads off its decoder.
        self.parse_object = counted_object
        self.parse_array = counted_array
        self.scan_once = _py_make_scanner(self)

    def _spend(self) -> None:
        self._left -= 1
        if self._left < 0:
            raise TooManyContainers(MAX_CONTAINERS)


def _parse_off_hub(line: bytes | str) -> object:
    if isinstance(line, bytes):
        line = line.decode(json.detect_encoding(line), "surrogatepass")  # as json.loads does
    # Nothing parsed is garbage: the collector, held off, does not rescan the heap meanwhile.
    with gc_paused():
        return _BoundedDecoder().decode(line)


def parse_json(line: bytes | str) -> Any:
    """`json.loads(line)`, without holding the hub; `TooManyContainers` (a `ValueError`) for a
    long text that holds too many arrays and objects."""
    if len(line) <= ON_HUB_BYTES:
        return json.loads(line)
    return offload(_parse_off_hub, line)
