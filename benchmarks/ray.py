"""The `ray` provider at scale: N scripted children over 2 local hosts vs in-process spawn.

`python -m benchmarks ray [--n 1000] [--json] [--quick]`. Needs the `ray` extra.

Three phases, all children started at once from one gevent hub:

1. peer: N one-shot children with the in-process `spawn` provider (same store kind, same
   scripted reply), wall time from the first start to the last result;
2. ray: the same job on a pool of 2 `ChildHost` actors of a local Ray (`num_cpus=2`); the
   difference over N is the per-child overhead of going remote;
3. host kill: N continuable children whose turn takes `KILL_LATENCY` s; once all are published,
   host 0 is killed (`ray.kill(no_restart=False)`); Ray restarts it and its children are
   re-established from their logs. Target: every continuable child completes (none lost).

Hub blocks (gevent's monitor thread, > 0.1 s) are counted over the whole run; target 0.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from typing import Any

import gevent
import gevent.events

from agent.models import scripted as S
from agent.store import SessionStore
from providers.inprocess import SpawnProvider
from providers.ray_runtime import ScriptedSetup
from subagent import RayConfig, RayProvider
from subagent.runtime import Runtime
from subagent.types import SubagentStartRequest, text_block
from supervision.signal import AbortController

KILL_LATENCY = 2.0
MAX_BLOCKING_TIME = 0.1


class _BlockCounter:
    def __init__(self) -> None:
        self.blocks = 0
        self._lock = threading.Lock()
        gevent.config.max_blocking_time = MAX_BLOCKING_TIME
        gevent.config.print_blocking_reports = False
        gevent.events.subscribers.append(self._on_event)
        if not gevent.config.monitor_thread:
            gevent.config.monitor_thread = True
            gevent.get_hub().start_periodic_monitoring_thread()

    def _on_event(self, event: object) -> None:
        if isinstance(event, gevent.events.EventLoopBlocked):
            with self._lock:
                self.blocks += 1

    def close(self) -> None:
        if self._on_event in gevent.events.subscribers:
            gevent.events.subscribers.remove(self._on_event)


def _request(parent: Any, i: int) -> SubagentStartRequest:
    return SubagentStartRequest(
        prompt=[text_block(f"task {i}")], parent=parent, signal=AbortController().signal
    )


def _one_shot_wave(runtime: Runtime, provider: str, parent: Any, n: int) -> tuple[float, int]:
    """Start n children at once, wait for every result, dispose; (wall seconds, completed)."""
    service = runtime.subagents

    def one(i: int) -> str:
        handle = service.start(provider, _request(parent, i))
        try:
            return str(handle.result.get(timeout=600).stop_reason)
        finally:
            handle.dispose()

    started = time.perf_counter()
    greenlets = [gevent.spawn(one, i) for i in range(n)]
    gevent.joinall(greenlets, raise_error=True)
    wall = time.perf_counter() - started
    return wall, sum(1 for g in greenlets if g.value == "completed")


def _kill_drill(runtime: Runtime, provider: RayProvider, parent: Any, n: int) -> dict[str, Any]:
    service = runtime.subagents

    def one(i: int) -> Any:
        return service.start_continuable("ray", _request(parent, i), label=f"c{i}")

    started = time.perf_counter()
    greenlets = [gevent.spawn(one, i) for i in range(n)]
    gevent.joinall(greenlets, raise_error=True)
    published = time.perf_counter() - started
    on_host_0 = provider.hosts()[0]["live"]
    provider.kill_host(0)
    statuses: dict[str, int] = {}
    for g in greenlets:
        task = runtime.tasks.wait(g.value.task_id, timeout=600)
        statuses[task.status] = statuses.get(task.status, 0) + 1
    wall = time.perf_counter() - started
    recoveries = provider.hosts()[0]["restarts"]
    return {
        "children": n,
        "on_killed_host": on_host_0,
        "completed": statuses.get("completed", 0),
        "lost": n - statuses.get("completed", 0),
        "statuses": statuses,
        "host_restarts_seen": recoveries,
        "all_published_s": round(published, 3),
        "wall_s": round(wall, 3),
    }


def run(n: int | None, options: Any) -> dict[str, Any]:
    quick = bool(getattr(options, "quick", False))
    n = n or (100 if quick else 1000)
    counter = _BlockCounter()
    figures: dict[str, Any] = {"children": n, "hosts": 2}
    reply = S.text("ok")
    try:
        local_dir = tempfile.mkdtemp(prefix="bench-spawn-")
        try:
            with Runtime(store=SessionStore(local_dir)) as runtime:
                runtime.scripted.script(S.DEFAULT, [reply], repeat=True)
                runtime.subagents.register(SpawnProvider())
                parent = runtime.agent(options=None)
                spawn_wall, spawn_ok = _one_shot_wave(runtime, "spawn", parent, n)
        finally:
            _remove(local_dir)
        figures["spawn"] = {"wall_s": round(spawn_wall, 3), "completed": spawn_ok}

        shared_dir = tempfile.mkdtemp(prefix="bench-ray-")
        try:
            config = RayConfig(
                store_dir=shared_dir,
                pool_size=2,
                host_setup=ScriptedSetup((reply,)),
                host_num_cpus=0.5,
                init_options={"num_cpus": 2, "include_dashboard": False, "log_to_driver": False},
            )
            provider = RayProvider(config)
            connect_started = time.perf_counter()
            provider.connect()
            figures["ray_connect_s"] = round(time.perf_counter() - connect_started, 3)
            try:
                with Runtime(store=SessionStore(shared_dir)) as runtime:
                    runtime.scripted.script(S.DEFAULT, [S.text("noted")], repeat=True)
                    runtime.subagents.register(provider)
                    parent = runtime.agent(options=None)
                    ray_wall, ray_ok = _one_shot_wave(runtime, "ray", parent, n)
                    figures["ray"] = {"wall_s": round(ray_wall, 3), "completed": ray_ok}
                    figures["ratio_ray_over_spawn"] = round(ray_wall / spawn_wall, 2)
                    figures["overhead_per_child_ms"] = round((ray_wall - spawn_wall) / n * 1e3, 3)
                    # The kill drill: slow turns, so the kill lands mid-run.
                    slow = ScriptedSetup((S.text("ok", latency=KILL_LATENCY),))
                    provider.run_setup(slow)
                    figures["kill"] = _kill_drill(runtime, provider, parent, n)
            finally:
                provider.close()
        finally:
            _remove(shared_dir)
    finally:
        counter.close()
    figures["hub_blocks"] = counter.blocks
    return figures


def _remove(path: str) -> None:
    """Thousands of session files: delete them in the hub's thread pool."""
    gevent.get_hub().threadpool.apply(shutil.rmtree, (path, True))
