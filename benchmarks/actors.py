"""Actors: GeventActor against Pykka's ThreadingActor and a bare asyncio task+queue floor.

`python -m benchmarks actors [--n N] [--quick] [--json]`. All three run in this process, one
after the other, with the same N (threads are capped, see THREAD_CAP). Figures: spawn rate,
ask round-trip p50/p99, tell throughput, RSS per idle actor, stop-all time, and for gevent a
3-level supervision tree of N actors disposed to quiescence. See docs/performance.md.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import time
from collections.abc import Callable
from typing import Any

import gevent
import pykka

from actors import gevent_actor
from actors.gevent_actor import GeventActor
from benchmarks._measure import pct as _pct
from benchmarks._measure import rss_bytes as _rss_bytes
from benchmarks._measure import us as _us

DEFAULT_N = 10_000
QUICK_N = 1_000
# One OS thread (8 MiB of reserved stack, real scheduling) per ThreadingActor: beyond a few
# thousand the machine, not Pykka, is being measured, and limits (ulimit -u) may refuse more.
THREAD_CAP = 2_000
QUICK_THREAD_CAP = 200
ASK_SAMPLES = 5_000
TELLS_PER_ACTOR = 10

TARGETS = {
    "ask_p50_gevent_over_asyncio": ("<=", 1.5),
    "ask_p50_gevent_over_threading": ("<=", 0.1),
    "spawn_rate_gevent_over_asyncio": (">=", 0.35),
    "rss_per_idle_gevent_actor_kib": ("<=", 16.0),
    "tree_cancel_s": ("<=", 0.3),
}


class _Echo(GeventActor):
    def on_receive(self, message: Any) -> Any:
        return message


class _ThreadEcho(pykka.ThreadingActor):
    use_daemon_thread = True

    def on_receive(self, message: Any) -> Any:
        return message


def _figures(
    n: int, spawn_s: float, samples: list[float], tells_per_s: float, rss_per: float, stop_s: float
) -> dict[str, Any]:
    """The figures every runtime of this benchmark reports, in one shape."""
    return {
        "n": n,
        "spawn_per_s": round(n / spawn_s),
        "ask_p50_us": _us(statistics.median(samples)),
        "ask_p99_us": _us(_pct(samples, 0.99)),
        "tell_per_s": round(tells_per_s),
        "rss_per_idle_actor_kib": round(rss_per / 1024, 2),
        "stop_all_s": round(stop_s, 4),
    }


def _pykka_figures(
    start: Callable[[], pykka.ActorRef[Any]],
    n: int,
    settle: Callable[[], None],
    stop_all: Callable[[list[pykka.ActorRef[Any]]], object],
) -> dict[str, Any]:
    """The same measurements for any Pykka runtime."""
    gc.collect()
    rss0 = _rss_bytes()
    t0 = time.perf_counter()
    refs = [start() for _ in range(n)]
    settle()  # every loop has run once and waits on its inbox
    spawn_s = time.perf_counter() - t0
    gc.collect()
    gc.freeze()  # the documented practice after a burst of starts (see freeze_gc)
    rss_per = (_rss_bytes() - rss0) / n
    samples = []
    for i in range(min(ASK_SAMPLES, 2 * n)):
        ref = refs[i % n]
        t = time.perf_counter()
        ref.ask(i)
        samples.append(time.perf_counter() - t)
    tells = n * TELLS_PER_ACTOR
    t0 = time.perf_counter()
    for i in range(tells):
        refs[i % n].tell(i)
    for ref in refs:  # an ask is answered after every earlier tell
        ref.ask(None)
    tell_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    stop_all(refs)
    stop_s = time.perf_counter() - t0
    gc.unfreeze()
    return _figures(n, spawn_s, samples, tells / tell_s, rss_per, stop_s)


def _gevent(n: int) -> dict[str, Any]:
    return _pykka_figures(
        _Echo.start,
        n,
        settle=lambda: gevent.sleep(0),
        stop_all=lambda refs: gevent_actor.stop_all(refs=refs),
    )


def _threading(n: int) -> dict[str, Any]:
    def settle_threads() -> None:
        pass  # each start() already returned after its thread started

    def stop(refs: list[pykka.ActorRef[Any]]) -> None:
        futures = [ref.stop(block=False) for ref in refs]
        pykka.get_all(futures)

    return _pykka_figures(_ThreadEcho.start, n, settle_threads, stop)


async def _asyncio_figures(n: int) -> dict[str, Any]:
    """The floor: one task and one asyncio.Queue per 'actor', futures for replies."""
    loop = asyncio.get_running_loop()

    async def actor(inbox: asyncio.Queue[Any]) -> None:
        while True:
            message, reply = await inbox.get()
            if message is StopAsyncIteration:
                break
            if reply is not None:
                reply.set_result(message)

    gc.collect()
    rss0 = _rss_bytes()
    t0 = time.perf_counter()
    inboxes: list[asyncio.Queue[Any]] = []
    tasks = []
    for _ in range(n):
        inbox: asyncio.Queue[Any] = asyncio.Queue()
        inboxes.append(inbox)
        tasks.append(loop.create_task(actor(inbox)))
    await asyncio.sleep(0)
    spawn_s = time.perf_counter() - t0
    gc.collect()
    gc.freeze()
    rss_per = (_rss_bytes() - rss0) / n

    async def ask(inbox: asyncio.Queue[Any], message: Any) -> Any:
        reply = loop.create_future()
        inbox.put_nowait((message, reply))
        return await reply

    samples = []
    for i in range(min(ASK_SAMPLES, 2 * n)):
        t = time.perf_counter()
        await ask(inboxes[i % n], i)
        samples.append(time.perf_counter() - t)
    tells = n * TELLS_PER_ACTOR
    t0 = time.perf_counter()
    for i in range(tells):
        inboxes[i % n].put_nowait((i, None))
    for inbox in inboxes:
        await ask(inbox, None)
    tell_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for inbox in inboxes:
        inbox.put_nowait((StopAsyncIteration, None))
    await asyncio.gather(*tasks)
    stop_s = time.perf_counter() - t0
    gc.unfreeze()
    return _figures(n, spawn_s, samples, tells / tell_s, rss_per, stop_s)


def _tree(n: int) -> dict[str, Any]:
    """Root supervisor -> sqrt(n) branch supervisors -> n actors; time dispose() of the root."""
    try:
        from supervision.supervisor import ChildSpec, Supervisor
    except ImportError as exc:
        return {"tree_cancel_s": None, "note": f"supervision.supervisor unavailable: {exc}"}
    from actors.supervised import spawn_actor_child

    branches = max(1, int(n**0.5))
    root = Supervisor("bench-root")
    t0 = time.perf_counter()
    made = 0
    for b in range(branches):
        branch = Supervisor(f"branch-{b}")
        root.start_child(ChildSpec(id=f"branch-{b}", start=_returns(branch), restart="temporary"))
        share = n // branches + (1 if b < n % branches else 0)
        for i in range(share):
            branch.start_child(
                ChildSpec(
                    id=f"leaf-{i}",
                    start=lambda: spawn_actor_child(_Echo),
                    restart="temporary",
                )
            )
            made += 1
    gevent.sleep(0)
    build_s = time.perf_counter() - t0
    gc.collect()
    gc.freeze()
    assert gevent_actor.live_count() >= made
    t0 = time.perf_counter()
    root.dispose("benchmark over")
    cancel_s = time.perf_counter() - t0
    gc.unfreeze()
    return {
        "tree_actors": made,
        "tree_branches": branches,
        "tree_build_s": round(build_s, 4),
        "tree_cancel_s": round(cancel_s, 4),
        "tree_quiescent": gevent_actor.live_count() == 0 and root.quiescent,
    }


def _returns(child: Any) -> Callable[[], Any]:
    return lambda: child


def _check(value: float | None, rule: tuple[str, float]) -> bool | None:
    if value is None:
        return None
    op, bound = rule
    return value <= bound if op == "<=" else value >= bound


def run(n: int | None, args: argparse.Namespace) -> dict[str, Any]:
    quick = bool(getattr(args, "quick", False))
    n = n or (QUICK_N if quick else DEFAULT_N)
    thread_n = min(n, QUICK_THREAD_CAP if quick else THREAD_CAP)

    figures_gevent = _gevent(n)  # first: its RSS delta must not reuse memory freed by others
    tree = _tree(n)
    figures_asyncio = asyncio.run(_asyncio_figures(n))
    figures_threading = _threading(thread_n)

    ratios: dict[str, float | None] = {
        "ask_p50_gevent_over_asyncio": round(
            figures_gevent["ask_p50_us"] / figures_asyncio["ask_p50_us"], 3
        ),
        "ask_p50_gevent_over_threading": round(
            figures_gevent["ask_p50_us"] / figures_threading["ask_p50_us"], 3
        ),
        "spawn_rate_gevent_over_asyncio": round(
            figures_gevent["spawn_per_s"] / figures_asyncio["spawn_per_s"], 3
        ),
        "rss_per_idle_gevent_actor_kib": figures_gevent["rss_per_idle_actor_kib"],
        "tree_cancel_s": tree.get("tree_cancel_s"),
    }
    meets = {key: _check(ratios[key], rule) for key, rule in TARGETS.items()}
    result: dict[str, Any] = {
        "n": n,
        "gevent": figures_gevent,
        "threading": figures_threading,
        "asyncio": figures_asyncio,
        "tree": tree,
        "ratios": ratios,
        "targets": {k: f"{op} {bound}" for k, (op, bound) in TARGETS.items()},
        "meets_target": meets,
        "fits_100k_idle_gevent_actors": (n >= 100_000) or None,
        "notes": [
            f"threading capped at {thread_n} actors (one OS thread each)",
            "gc.freeze() after each burst of starts, as recommended (actors.gevent_actor)",
            "fits_100k_idle_gevent_actors is null unless run with --n 100000",
        ],
    }
    return result
