"""`acp`: N concurrent ACP children started, run and disposed, against a bare spawn+exit baseline.

The child is `tests/acp_peers/minimal_agent.py` (standard library only), so the baseline — the
same interpreter spawned in its own process group and reaped, with no protocol — is the child's
own start-up; the difference is what the provider adds (pipes, JSON-RPC, handshake, prompt,
teardown). Targets: zero processes left, zero hub blocks.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import gevent
import gevent.events
import gevent.subprocess
import greenlet  # type: ignore[import-untyped]

from agent.options import AgentOptions
from providers.acp import AcpConfig, AcpProvider
from providers.acp_process import group_has_live_member
from subagent.types import SubagentStartRequest
from supervision.signal import AbortSignal

PEER = Path(__file__).resolve().parent.parent / "tests" / "acp_peers" / "minimal_agent.py"
MAX_BLOCKING_TIME = 0.1


class _Parent:
    """The seam's view of a parent agent (`subagent.types.AgentView`), all ACP reads of it."""

    def __init__(self, cwd: str) -> None:
        self.id = "bench"
        self.cwd = cwd
        self.depth = 0
        self.options = AgentOptions()
        self.session_id = "bench"


class _HubWatch:
    """gevent's monitor thread (blocks > 0.1 s) plus a greenlet switch tracer that finds the
    longest stretch any greenlet (the hub included) ran without switching."""

    def __init__(self) -> None:
        self.blocks = 0
        self.longest_run = 0.0
        self._last = time.perf_counter()
        self._lock = threading.Lock()
        gevent.config.max_blocking_time = MAX_BLOCKING_TIME
        gevent.config.print_blocking_reports = False
        gevent.events.subscribers.append(self._on_event)
        hub: Any = gevent.get_hub()
        if not gevent.config.monitor_thread:
            gevent.config.monitor_thread = True
            hub.start_periodic_monitoring_thread()
        self._previous_trace = greenlet.settrace(self._on_switch)

    def _on_event(self, event: object) -> None:
        if isinstance(event, gevent.events.EventLoopBlocked):
            with self._lock:
                self.blocks += 1

    def _on_switch(self, _event: str, _args: Any) -> None:
        now = time.perf_counter()
        self.longest_run = max(self.longest_run, now - self._last)
        self._last = now

    def close(self) -> None:
        greenlet.settrace(self._previous_trace)
        gevent.events.subscribers.remove(self._on_event)


def _our_children() -> int:
    """Live (non-zombie) processes whose parent is this process."""
    me = str(os.getpid()).encode()
    count = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == me and fields[0] not in (b"Z", b"X"):
            count += 1
    return count


def _baseline_one(latencies: list[float]) -> None:
    began = time.perf_counter()
    proc: Any = gevent.subprocess.Popen(
        [sys.executable, "-c", "pass"],
        stdin=gevent.subprocess.DEVNULL,
        stdout=gevent.subprocess.DEVNULL,
        stderr=gevent.subprocess.DEVNULL,
        start_new_session=True,
    )
    proc.wait()
    latencies.append(time.perf_counter() - began)


def _acp_one(
    provider: AcpProvider, parent: _Parent, latencies: list[float], groups: list[int]
) -> None:
    began = time.perf_counter()
    run = provider.start(
        SubagentStartRequest(
            prompt=[{"type": "text", "text": "ping"}], parent=parent, signal=AbortSignal.never()
        )
    )
    groups.append(run.pid)
    try:
        result = run.result.get(timeout=120)
        if result.stop_reason != "completed":
            raise RuntimeError(f"run ended {result.stop_reason}: {result.diagnostic}")
    finally:
        run.dispose()
    latencies.append(time.perf_counter() - began)


def _wave(n: int, fn: Any, *args: Any) -> float:
    began = time.perf_counter()
    greenlets = [gevent.spawn(fn, *args) for _ in range(n)]
    gevent.joinall(greenlets, raise_error=True)
    return time.perf_counter() - began


def run(n: int | None, options: Any) -> dict[str, Any]:
    n = n or (10 if getattr(options, "quick", False) else 100)
    serial = min(n, 10)
    watch = _HubWatch()
    workdir = tempfile.mkdtemp(prefix="acp-bench-")
    try:
        parent = _Parent(workdir)
        provider = AcpProvider(
            AcpConfig(command=sys.executable, args=[str(PEER)], eof_grace=5.0, terminate_grace=5.0)
        )
        groups: list[int] = []
        _wave(2, _baseline_one, [])  # warm the page cache and gevent's child watcher
        # One at a time: the latency a single run adds above the child's own start-up.
        base_serial: list[float] = []
        acp_serial: list[float] = []
        for _ in range(serial):
            _baseline_one(base_serial)
            _acp_one(provider, parent, acp_serial, groups)
        # All at once: what N concurrent children cost, the target's shape.
        base_lat: list[float] = []
        base_wall = _wave(n, _baseline_one, base_lat)
        acp_lat: list[float] = []
        acp_wall = _wave(n, _acp_one, provider, parent, acp_lat, groups)
        left_groups = sum(1 for pgid in groups if group_has_live_member(pgid))
        left_children = _our_children()
    finally:
        watch.close()
        os.rmdir(workdir)
    base_one = statistics.median(base_serial)
    acp_one = statistics.median(acp_serial)
    return {
        "n": n,
        "processes_left": left_groups + left_children,
        "hub_blocks": watch.blocks,
        # Wall time, so it includes the OS descheduling this process while N interpreters start.
        "longest_run_without_switch_ms": round(watch.longest_run * 1000, 1),
        "serial": {
            "runs": serial,
            "baseline_spawn_exit_ms": round(base_one * 1000, 1),
            "acp_start_run_dispose_ms": round(acp_one * 1000, 1),
            "overhead_per_run_ms": round((acp_one - base_one) * 1000, 1),
        },
        "concurrent": {
            "baseline_wall_s": round(base_wall, 3),
            "acp_wall_s": round(acp_wall, 3),
            "acp_p95_latency_ms": round(sorted(acp_lat)[int(0.95 * (n - 1))] * 1000, 1),
            "overhead_per_run_ms": round((acp_wall - base_wall) / n * 1000, 2),
            "ratio_wall_acp_vs_baseline": round(acp_wall / base_wall, 2),
        },
    }
