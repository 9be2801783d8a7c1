"""The asyncio floors of the fan-out table: the least any runtime could do for each figure.

Each runs its own event loop to completion (`asyncio.run`), in its own process (see
`_isolated`). No framework: dicts, tasks, futures and events only.
"""

from __future__ import annotations

import asyncio
import gc
import statistics
import time
from typing import Any

from benchmarks._measure import pct
from benchmarks._peers import cpu_s

__all__ = ["cancel_floor", "fanout_floor", "starts_floor", "steer_floor"]


def starts_floor(n: int) -> dict[str, Any]:
    """A registry entry, a start and an end event, and a task parked on a future per child."""

    async def main() -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        registry: dict[int, tuple[asyncio.Event, asyncio.Event, asyncio.Future[None]]] = {}

        async def child(started: asyncio.Event, parked: asyncio.Future[None]) -> None:
            started.set()
            await parked

        t0 = time.perf_counter()
        tasks = []
        for k in range(n):
            started, ended = asyncio.Event(), asyncio.Event()
            parked: asyncio.Future[None] = loop.create_future()
            registry[k] = (started, ended, parked)
            tasks.append(loop.create_task(child(started, parked)))
        await asyncio.sleep(0)
        wall = time.perf_counter() - t0
        for _started, ended, parked in registry.values():
            parked.set_result(None)
            ended.set()
        await asyncio.gather(*tasks)
        return {"n": n, "starts_per_s": round(n / wall)}

    return asyncio.run(main())


def fanout_floor(n: int, steps: int, latency: float) -> dict[str, Any]:
    """N tasks, each sleeping `latency` `steps` times: no per-step work at all."""

    async def main() -> dict[str, Any]:
        async def child() -> int:
            for _ in range(steps):
                await asyncio.sleep(latency)
            return steps

        gc.collect()
        t0 = time.perf_counter()
        c0 = cpu_s()
        await asyncio.gather(*(child() for _ in range(n)))
        gc.collect()
        wall = time.perf_counter() - t0
        cpu = cpu_s() - c0
        return {
            "n": n,
            "wall_s": round(wall, 4),
            "cpu_s": round(cpu, 4),
            "cpu_per_step_us": round(cpu / (n * steps) * 1e6, 2),
        }

    return asyncio.run(main())


def steer_floor(n: int) -> dict[str, Any]:
    """N tasks parked on their own queue; latency from put_nowait to the task holding it."""

    async def main() -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        queues: list[asyncio.Queue[float]] = [asyncio.Queue() for _ in range(n)]
        acks: list[float] = []
        done = loop.create_future()

        async def child(queue: asyncio.Queue[float]) -> None:
            sent = await queue.get()
            acks.append(time.perf_counter() - sent)
            if len(acks) == n:
                done.set_result(None)

        tasks = [loop.create_task(child(q)) for q in queues]
        await asyncio.sleep(0)
        gc.collect()
        for queue in queues:
            queue.put_nowait(time.perf_counter())
            await asyncio.sleep(0)  # one at a time, as the steers go out
        await done
        await asyncio.gather(*tasks)
        us = [a * 1e6 for a in acks]
        return {
            "n": n,
            "ack_p50_us": round(statistics.median(us), 2),
            "ack_p99_us": round(pct(us, 0.99), 2),
        }

    return asyncio.run(main())


def cancel_floor(n: int) -> dict[str, Any]:
    """N parked tasks cancelled and awaited."""

    async def main() -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        tasks = [loop.create_task(asyncio.sleep(3600)) for _ in range(n)]
        await asyncio.sleep(0)
        t0 = time.perf_counter()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return {"n": n, "cancel_s": round(time.perf_counter() - t0, 4)}

    return asyncio.run(main())
