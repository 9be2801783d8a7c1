"""Memory: many short children, one after another, leave the process as they found it.

Each child is started, completes, is disposed, and its session is deleted (a consumer that keeps
no transcripts), so anything still growing is ours: a session, an actor, a listener, a future, a
greenlet. Two measures:

- live objects of the runtime's own classes (counted through the garbage collector) are the same
  after the last child as after the warm-up: exact, not statistical;
- RSS, sampled every `window` children after the warm-up, has a least-squares slope below
  `MAX_SLOPE` bytes per child (allocator noise makes a single difference meaningless).

Task records (`ctx.tasks` keeps every settled task so a model can still ask about it) are the one
deliberate per-activation growth; they are counted and reported, not failed on.

CI runs 5,000 spawn children (and 1,000 continuable ones); the full run 100,000 (and 10,000).
"""

from __future__ import annotations

import gc
import os
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import gevent
import pytest
from reliability_kit import live_greenlets, size

from actors import gevent_actor
from agent.models import scripted as S
from agent.store import MemoryStore, SessionStore
from providers.inprocess import ForkProvider, SpawnProvider
from subagent.runtime import Runtime
from subagent.types import MessageSource, SubagentStartRequest, text_block
from supervision.signal import AbortController

CHILDREN = size(5_000, 100_000)
CONTINUABLE = size(1_000, 10_000)
# A leaked child (its agent, actor, log and futures) costs tens of KB: measured 40 KB. The
# allocator's warm-up still shows in a 5,000-child CI run (~200 B/child); over 100,000 children
# (a fifth of them as warm-up) the measured slope is ~3 B/child.
MAX_SLOPE = float(size(1024, 100))

WATCHED = (
    "Agent",
    "AgentActor",
    "AgentCore",
    "SessionLog",
    "LocalRun",
    "RunActor",
    "RunHandle",
    "SteerableRunHandle",
    "GeventFuture",
    "Deferred",
    "AbortController",
    "AbortSignal",
    "Greenlet",
    "ToolScope",
    "SystemPrompt",
    "_Child",
    "_Record",
    "ModelRequest",
)


class Bare:
    """A runtime with spawn and fork and no test-side listener (seam_kit's Kit keeps every
    lifecycle event, which is exactly the kind of growth measured here)."""

    def __init__(self, store: MemoryStore | SessionStore) -> None:
        self.store = store
        self.model = S.ScriptedModel(lambda request: S.text("ok"), record=False)
        self.runtime = Runtime(store=store, scripted=self.model)
        self.service = self.runtime.subagents
        self.service.register(SpawnProvider())
        self.service.register(ForkProvider())

    def request(self, parent: Any, prompt: str) -> SubagentStartRequest:
        return SubagentStartRequest(
            prompt=[text_block(prompt)], parent=parent, signal=AbortController().signal
        )

    def start(self, parent: Any, prompt: str, provider: str) -> Any:
        return self.service.start(provider, self.request(parent, prompt))


@contextmanager
def bare(store: MemoryStore | SessionStore) -> Iterator[Bare]:
    b = Bare(store)
    try:
        yield b
    finally:
        b.runtime.close()


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _count_types() -> Counter[str]:
    gc.collect()
    counts: Counter[str] = Counter()
    for obj in gc.get_objects():
        name = type(obj).__name__
        if name in WATCHED:
            counts[name] += 1
    return counts


def count_types() -> Counter[str]:
    """Instances of the runtime's classes, walked in the thread pool so the hub stays free."""
    result: Counter[str] = gevent.get_hub().threadpool.apply(_count_types)
    return result


def slope(points: list[tuple[int, int]]) -> float:
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    sxy = sum((x - mx) * (y - my) for x, y in points)
    return sxy / sxx


def report(kind: str, total: int, points: list[tuple[int, int]], grown: dict[str, int]) -> float:
    b = slope(points)
    print(
        f"\nmemory {kind}: {total} children, "
        f"RSS {points[0][1] >> 20} -> {points[-1][1] >> 20} MiB, "
        f"slope {b:.1f} B/child, object growth {grown or 'none'}"
    )
    return b


@pytest.mark.timeout(3600)
def test_short_children_in_sequence_leave_rss_and_objects_flat() -> None:
    with bare(MemoryStore(durability="none")) as k:
        parent = k.runtime.agent()
        greenlets_before = live_greenlets()
        actors_before = gevent_actor.live_count()

        def child(i: int) -> None:
            handle = k.start(parent, f"task {i}", "fork" if i % 4 == 0 else "spawn")
            assert handle.result.get().stop_reason == "completed"
            handle.dispose()
            k.store.delete(handle.id)

        warmup = CHILDREN // 5
        for i in range(warmup):
            child(i)
        baseline = count_types()
        window = max(CHILDREN // 50, 100)
        points: list[tuple[int, int]] = []
        for i in range(warmup, CHILDREN):
            child(i)
            if (i - warmup) % window == 0:
                points.append((i, rss()))
        after = count_types()
        grown = {t: after[t] - baseline[t] for t in WATCHED if after[t] > baseline[t]}
        b = report("spawn/fork", CHILDREN, points, grown)
        assert grown == {}, f"objects left behind by {CHILDREN - warmup} children: {grown}"
        assert gevent_actor.live_count() == actors_before
        assert live_greenlets() - greenlets_before == set()
        assert k.runtime.ctx.agents.keys() == {parent.id}
        assert k.service.runs() == []
        assert [h.id for h in k.store.list()] == [parent.id]
        assert b < MAX_SLOPE, f"RSS grows {b:.0f} bytes per child"


@pytest.mark.timeout(3600)
def test_continuable_children_in_sequence_leave_objects_flat(tmp_path: Path) -> None:
    with bare(SessionStore(tmp_path, durability="none")) as k:
        parent = k.runtime.agent()

        def child(i: int) -> None:
            started = k.service.start_continuable(
                "spawn", k.request(parent, f"task {i}"), label=f"c{i}"
            )
            k.runtime.tasks.wait(started.task_id)
            if i % 2 == 0:  # half of them get a follow-up (a cold resume)
                sent = k.service.send_message(
                    parent, started.child_id, [text_block("more")], MessageSource.user()
                )
                if sent.task_id is not None:
                    k.runtime.tasks.wait(sent.task_id)
            k.store.delete(started.child_id)

        warmup = min(200, CONTINUABLE // 5)
        for i in range(warmup):
            child(i)
        parent.when_idle().get()
        baseline = count_types()
        window = max(CONTINUABLE // 25, 20)
        points: list[tuple[int, int]] = []
        for i in range(warmup, CONTINUABLE):
            child(i)
            if (i - warmup) % window == 0:
                points.append((i, rss()))
        parent.when_idle().get()  # the settlement notices woke the parent: let it finish
        after = count_types()
        grown = {t: after[t] - baseline[t] for t in WATCHED if after[t] > baseline[t]}
        report("continuable", CONTINUABLE, points, grown)
        kept_tasks = grown.pop("_Record", 0)
        assert kept_tasks <= CONTINUABLE + CONTINUABLE // 2  # one per activation, by design
        assert grown == {}, f"objects left behind by {CONTINUABLE - warmup} children: {grown}"
