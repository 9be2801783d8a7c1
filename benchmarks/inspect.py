"""Reading a stored log for a few of its events: `inspect`, then the header and the last event.

`python -m benchmarks inspect [--n EVENTS] [--json] [--quick]` (q11). What a listing row, `subagent
gc` or `subagent show` pays per stored session: `SessionStore.inspect` of a log of EVENTS events
(default 10,000, the `load` benchmark's steps), then its header and its last event read. CPU is
`process_time` (every thread: a big log is read in the hub's pool), the median of the repeats;
memory is tracemalloc's peak during one inspect-and-read, and what the result holds after it.
"""

from __future__ import annotations

import gc
import statistics
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

from agent.events import SessionHeader
from agent.store import SessionStore
from benchmarks.load import _fill


def _inspect_and_read(store: SessionStore) -> tuple[Any, object]:
    loaded = store.inspect("bench")
    return loaded, (loaded.header.id, loaded.events[-1]["type"], len(loaded.events))


def run(n: int | None, options: Any) -> dict[str, Any]:
    quick = bool(getattr(options, "quick", False))
    n = n or (1000 if quick else 10_000)
    repeats = 3 if quick else 15
    with tempfile.TemporaryDirectory() as tmp:
        store = SessionStore(Path(tmp), durability="none")
        log = store.create(SessionHeader(id="bench", created_at=0.0, cwd=tmp))
        _fill(log, n)
        log.close()
        events_n = len(log.events)
        file_bytes = (Path(tmp) / "bench.session").stat().st_size
        del log
        times = []
        for _ in range(repeats):
            gc.collect()
            start = time.process_time()
            _inspect_and_read(store)
            times.append(time.process_time() - start)
        gc.collect()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        loaded, _read = _inspect_and_read(store)
        held, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        del loaded
    return {
        "events": events_n,
        "file_bytes": file_bytes,
        "inspect_and_read_ms": round(statistics.median(times) * 1e3, 2),
        "peak_bytes": peak - base,
        "held_bytes": held - base,
    }
