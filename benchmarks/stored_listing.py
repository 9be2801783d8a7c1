"""What a listing costs next to many stored sessions: the headers `SessionStore.census` reads.

`python -m benchmarks stored_listing [--n N] [--quick] [--json]`. One runtime on a session store
in a temporary directory (`durability="none"`): one parent's N spawned children run to their
end and are disposed, so N session files sit in the store; then `list_children` of another
parent, which has none: the first call (every header read), then the median of rounds of calls
(headers read before are kept by inode and status-change time; each call still scans the
directory). The big parent's own listing is reported too (N rows: each row reads its child's
log for its descriptor). No peer: the figure of interest is the small parent's warm call against
its first, which `docs/performance.md` records before and after the headers were kept.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

from providers.inprocess import SpawnProvider
from subagent.runtime import Runtime
from subagent.types import SubagentStartRequest, text_block
from supervision.signal import AbortController

DEFAULT_N = 5_000
QUICK_N = 300
ROUNDS = 5


def _ms(call: Callable[[], object]) -> float:
    began = time.perf_counter()
    call()
    return (time.perf_counter() - began) * 1000


def run(n: int | None, args: argparse.Namespace) -> dict[str, Any]:
    n = n or (QUICK_N if getattr(args, "quick", False) else DEFAULT_N)
    with tempfile.TemporaryDirectory() as home, Runtime(store=home, durability="none") as rt:
        rt.subagents.register(SpawnProvider())
        big, small = rt.agent(), rt.agent()
        began = time.perf_counter()
        for _ in range(n):
            request = SubagentStartRequest(
                prompt=[text_block("hi")], parent=big, signal=AbortController().signal
            )
            handle = rt.subagents.start("spawn", request)
            handle.result.get()
            handle.dispose()
        filled = time.perf_counter() - began
        service = rt.subagents
        first = _ms(lambda: service.list_children(small.id))
        warm = [_ms(lambda: service.list_children(small.id)) for _ in range(ROUNDS)]
        assert service.list_children(small.id) == []
        big_rows = len(service.list_children(big.id))
        assert big_rows == n
        return {
            "n_stored": n,
            "fill_s": round(filled, 2),
            "small_list_children_first_ms": round(first, 1),
            "small_list_children_ms": round(statistics.median(warm), 1),
            "big_list_children_ms": round(_ms(lambda: service.list_children(big.id)), 1),
        }
