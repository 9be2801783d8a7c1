"""What a listing costs next to many stored sessions: the headers `SessionStore.census` reads,
and the stored children's logs a big parent's own listing reads.

`python -m benchmarks stored_listing [--n N] [--quick] [--json]`. One runtime on a session store
in a temporary directory (`durability="none"`): one parent's N continuable children each run
three turns (a start and two cold resumes, a priced usage on every reply) and are released, so
N session files of a few turns sit in the store. Then, in this process:

- `list_children` of another parent, which has none: the first call (every header read), then
  the median of rounds of calls (headers read before are kept by their file's stamp; each call
  still scans the directory);
- the big parent's own listing (N rows): the first call, then the median of later ones, each
  with its wall time, the process CPU it took (every thread's) and the longest time it held
  the gevent hub (a ticker greenlet's longest gap while the call ran: what every other
  greenlet of the process waited).

With `STORED_LISTING_OLD=/path/to/a/worktree` in the environment, the big parent's listing is
also measured over the same store by that tree's code and by this one, each in a fresh
interpreter (this file's `measure`, with the tree first on `PYTHONPATH`), alternating, and
their rows are checked to be the same. No peer: the figures of interest are the later listing
against the first, and the new code against the old, which `docs/performance.md` records.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gevent

from agent.model import ModelRequest
from agent.models import scripted as S
from agent.usage import PriceTable
from providers.inprocess import SpawnProvider
from subagent.runtime import Runtime
from subagent.types import MessageSource, SubagentStartRequest, text_block
from supervision.signal import AbortController

DEFAULT_N = 5_000
QUICK_N = 300
ROUNDS = 5
OLD_TREE_ROUNDS = 2  # measurements of each tree, alternating
TURNS = 3
# What every reply reports: a cached prompt, a short answer (priced, so rows carry a cost).
REPLY_USAGE = {"input_tokens": 1_200, "output_tokens": 80, "cache_read_input_tokens": 900}
PRICES = {"scripted:*": {"input": 3, "output": 15, "cache_read": 0.3}}
# Logs younger than this are read again at every listing (the store's racy-clean window,
# `agent.store._RACY_NS`): the later listings are measured once every log is older.
SETTLE_S = 2.1
_SCRIPT = Path(__file__).resolve()
# What a fresh interpreter runs to measure a tree (its root first on `sys.path`): this file's
# `measure`, loaded by path, so the old tree needs none of this file's code.
_MEASURE = (
    "import json, runpy, sys; script, home, parent, rounds = sys.argv[1:]; "
    "figures = runpy.run_path(script)['measure'](home, parent, int(rounds)); "
    "print(json.dumps(figures))"
)


def _ms(call: Callable[[], object]) -> float:
    began = time.perf_counter()
    call()
    return (time.perf_counter() - began) * 1000


class _HubWatch:
    """A greenlet that wakes every half millisecond and records its longest gap: how long
    the hub was held by something else (the listing) while it ran."""

    def __init__(self) -> None:
        self.longest = 0.0
        self._ticker = gevent.spawn(self._tick)
        gevent.sleep(0.002)  # running before the first measure

    def _tick(self) -> None:
        last = time.perf_counter()
        while True:
            gevent.sleep(0.0005)
            now = time.perf_counter()
            self.longest = max(self.longest, now - last)
            last = now

    def measure(self, call: Callable[[], object]) -> dict[str, float]:
        """Wall ms, process CPU ms (every thread's) and the longest hub hold (ms) of `call`."""
        gevent.sleep(0.002)
        self.longest = 0.0
        cpu, wall = time.process_time(), time.perf_counter()
        call()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        gevent.sleep(0.002)  # the ticker's gap that spans the call's end is counted
        return {
            "wall_ms": round(wall * 1000, 1),
            "cpu_ms": round(cpu * 1000, 1),
            "hub_held_ms": round(self.longest * 1000, 1),
        }

    def stop(self) -> None:
        self._ticker.kill()


def _median(samples: list[dict[str, float]]) -> dict[str, float]:
    return {key: round(statistics.median(s[key] for s in samples), 1) for key in samples[0]}


def _fill(rt: Runtime, big: Any, n: int) -> None:
    """`n` continuable children of `big`, each run for `TURNS` turns and released."""
    parent_id = big.id
    service = rt.subagents
    for i in range(n):
        request = SubagentStartRequest(
            prompt=[text_block(f"task {i}")], parent=big, signal=AbortController().signal
        )
        started = service.start_continuable("spawn", request, label=f"worker {i}")
        rt.tasks.wait(started.task_id)
        for turn in range(1, TURNS):
            while started.child_id in rt.ctx.agents:  # released before it is resumed
                gevent.sleep(0.0005)
            sent = service.send_message(
                big,
                started.child_id,
                [text_block(f"and then {turn}")],
                MessageSource.coordinator(parent_id),
            )
            if sent.task_id is not None:
                rt.tasks.wait(sent.task_id)
        while started.child_id in rt.ctx.agents:
            gevent.sleep(0.0005)


def _reply(request: ModelRequest) -> S.Step:
    return S.text("done: a short answer of a few words", usage=REPLY_USAGE)


def measure(home: str, parent_id: str, rounds: int) -> dict[str, Any]:
    """The big parent's listing over the store at `home` by the code this interpreter
    imports: the first call and the median of `rounds` later ones, and the rows' hash."""
    with Runtime(store=home, durability="none") as rt:
        watch = _HubWatch()
        try:
            service = rt.subagents
            first = watch.measure(lambda: service.list_children(parent_id))
            rows = service.list_children(parent_id)
            later = _median(
                [watch.measure(lambda: service.list_children(parent_id)) for _ in range(rounds)]
            )
        finally:
            watch.stop()
    text = json.dumps(rows, sort_keys=True).encode()
    return {
        "rows": len(rows),
        "rows_sha256": hashlib.sha256(text).hexdigest(),
        "first": first,
        "later": later,
    }


def _measure_in(tree: Path, home: str, parent_id: str, rounds: int) -> dict[str, Any]:
    """`measure` in a fresh interpreter importing the code of `tree`."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tree), env.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(_SCRIPT), home, parent_id, str(rounds)],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"measuring in {tree} exited {proc.returncode}: {tail}")
    figures: dict[str, Any] = json.loads(lines[-1])
    return figures


def _against_old(old: Path, home: str, parent_id: str) -> dict[str, Any]:
    """The big parent's listing by the old tree's code and this one's, alternating."""
    new = _SCRIPT.parents[1]
    runs: dict[str, list[dict[str, Any]]] = {"old": [], "new": []}
    for _ in range(OLD_TREE_ROUNDS):
        for name, tree in (("old", old), ("new", new)):
            runs[name].append(_measure_in(tree, home, parent_id, ROUNDS))
    hashes = {r["rows_sha256"] for rs in runs.values() for r in rs}
    out: dict[str, Any] = {"old_tree": str(old), "same_rows": len(hashes) == 1}
    for name, measured in runs.items():
        out[name] = {
            "first": [m["first"] for m in measured],
            "later": [m["later"] for m in measured],
        }
    return out


def run(n: int | None, args: argparse.Namespace) -> dict[str, Any]:
    n = n or (QUICK_N if getattr(args, "quick", False) else DEFAULT_N)
    model = S.ScriptedModel(_reply)
    with tempfile.TemporaryDirectory() as home:
        with Runtime(
            store=home, durability="none", scripted=model, prices=PriceTable(PRICES)
        ) as rt:
            rt.subagents.register(SpawnProvider())
            big, small = rt.agent(), rt.agent()
            big_id = big.id
            began = time.perf_counter()
            _fill(rt, big, n)
            filled = time.perf_counter() - began
            gevent.sleep(SETTLE_S)
            service = rt.subagents
            first = _ms(lambda: service.list_children(small.id))
            warm = [_ms(lambda: service.list_children(small.id)) for _ in range(ROUNDS)]
            assert service.list_children(small.id) == []
            watch = _HubWatch()
            try:
                big_first = watch.measure(lambda: service.list_children(big_id))
                rows = service.list_children(big_id)
                assert len(rows) == n and all(r["activity"] == "stored" for r in rows)
                assert all(r.get("cost_usd") for r in rows)
                big_later = _median(
                    [watch.measure(lambda: service.list_children(big_id)) for _ in range(ROUNDS)]
                )
            finally:
                watch.stop()
        figures: dict[str, Any] = {
            "n_stored": n,
            "turns_each": TURNS,
            "fill_s": round(filled, 2),
            "small_list_children_first_ms": round(first, 1),
            "small_list_children_ms": round(statistics.median(warm), 1),
            "big_list_children_first": big_first,
            "big_list_children_later": big_later,
        }
        old = os.environ.get("STORED_LISTING_OLD")
        if old:
            figures["against_old"] = _against_old(Path(old).resolve(), home, big_id)
        return figures
