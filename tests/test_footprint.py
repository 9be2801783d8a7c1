"""What one live child costs the cyclic collector, and the GC policy the runtime owns.

Every tracked object of a live child is work for each full collection, so the count per parked
child is held under a bound (the redesign that made the child's own actor its run's actor took
it from ~148 to ~107, the start-path trims to ~88). The runtime's GC policy: a larger young
generation while a runtime is open, freezing after bursts of starts, both undone at close; a
host's own tuning is kept.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from seam_kit import Kit, kit, wait_until

from agent.models import scripted as S
from agent.store import MemoryStore
from subagent.runtime import Runtime
from supervision.gc_policy import DEFAULT_GEN0, DEFAULT_GEN1

# Tracked (gc.get_objects) objects per live child parked in a model call, measured: ~81 (~99
# before the start-path trims of h13f: actor start values as class defaults, waiter and listener
# lists made on first use, a run adopted by its supervisor without a spec, shared options; ~86
# before h13l's: the supervisor's entry and the actor child are their own exit listeners, no
# partial or bound method per child, and the turn worker carries no spawn-tree record).
MAX_TRACKED_PER_CHILD = 84


@pytest.fixture
def default_collector() -> Iterator[None]:
    """Each test starts and ends with CPython's default collector settings, nothing frozen."""
    saved = gc.get_threshold()
    gc.unfreeze()
    gc.set_threshold(700, 10, 10)
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*saved)


@pytest.mark.allow_hub_block(
    "the test's own gc.collect() calls (its measurement) rescan the whole unfrozen process"
)
def test_tracked_objects_per_live_child_stay_under_the_bound(default_collector: None) -> None:
    with kit(gc_policy=False) as k:
        parked = [0]

        def hang(request: object) -> S.Step:
            parked[0] += 1
            return S.hang()

        k.respond = hang  # type: ignore[assignment]
        parent = k.parent()
        warm = [k.start(parent) for _ in range(20)]
        wait_until(lambda: parked[0] == 20)
        k.events.clear()
        gc.collect()
        before = len(gc.get_objects())
        n = 300
        runs = [k.start(parent) for _ in range(n)]
        wait_until(lambda: parked[0] == 20 + n)
        k.events.clear()  # the test's own event log is not the child's cost
        gc.collect()
        per_child = (len(gc.get_objects()) - before) / n
        assert per_child <= MAX_TRACKED_PER_CHILD, f"{per_child:.1f} tracked objects per child"
        for run in warm + runs:
            run.dispose()


def test_the_runtime_owns_a_gc_policy_by_default_and_undoes_it(default_collector: None) -> None:
    rt = Runtime(store=MemoryStore())
    try:
        # A middle pass every DEFAULT_GEN1 young ones: a bounded scan, so a bounded hub pause.
        assert gc.get_threshold() == (DEFAULT_GEN0, DEFAULT_GEN1, 10)
        second = Runtime(store=MemoryStore())
        second.close()
        assert gc.get_threshold()[0] == DEFAULT_GEN0  # still held by the first runtime
    finally:
        rt.close()
    assert gc.get_threshold() == (700, 10, 10)


def test_a_host_tuned_collector_is_left_alone(default_collector: None) -> None:
    gc.set_threshold(5_000, 20, 20)
    with Runtime(store=MemoryStore()):
        assert gc.get_threshold() == (5_000, 20, 20)
    assert gc.get_threshold() == (5_000, 20, 20)


def test_gc_policy_false_opts_out(default_collector: None) -> None:
    with kit(gc_policy=False, gc_freeze_every=2) as k:
        assert gc.get_threshold() == (700, 10, 10)
        parent = k.parent()
        runs = [k.start(parent, str(i)) for i in range(3)]
        k.flush_events()
        assert gc.get_freeze_count() == 0
        for run in runs:
            run.dispose()


def test_the_default_policy_freezes_after_bursts_of_starts(default_collector: None) -> None:
    with kit(gc_freeze_every=5) as k:
        parent = k.parent()
        runs = [k.start(parent, str(i)) for i in range(4)]
        k.flush_events()
        assert gc.get_freeze_count() == 0
        runs.append(k.start(parent, "fifth"))
        k.flush_events()
        assert gc.get_freeze_count() > 0
        for run in runs:
            run.dispose()
    assert gc.get_freeze_count() == 0


def test_model_requests_view_the_history_without_copying_it() -> None:
    """Each step's request sees the conversation up to that step, and keeps seeing exactly
    that after later steps appended to it: a view of the one history, not a copy per step."""
    from agent.history import HistoryView
    from agent.tools import Tool

    with kit() as k:
        k.runtime.ctx.tools.register(
            Tool(
                name="noop", description="noop", parameters={"type": "object"}, fn=lambda a, c: "ok"
            )
        )
        steps = iter([S.tool_call("noop", {}), S.tool_call("noop", {}), S.text("done")])
        k.respond = lambda request: next(steps)
        agent = k.parent()
        agent.send("go").get(timeout=5)
        agent.when_idle().get(timeout=5)
        requests = k.model.requests_for(agent.id)
        assert [len(r.messages) for r in requests] == [1, 3, 5]
        assert all(isinstance(r.messages, HistoryView) for r in requests)
        assert [m["role"] for m in requests[0].messages] == ["user"]
        assert requests[2].messages[:3] == list(requests[1].messages)
        assert next(reversed(requests[1].messages))["role"] == "tool"


def _noop_kit_turn(k: Kit, steps: int) -> None:
    """One turn of `steps` tool steps (a trivial tool each), then a text answer."""
    from agent.tools import Tool

    k.runtime.ctx.tools.register(
        Tool(name="noop", description="noop", parameters={"type": "object"}, fn=lambda a, c: "ok")
    )
    k.respond = lambda r: S.tool_call("noop", {"n": r.step}) if r.step <= steps else S.text("ok")


def test_the_conversation_is_held_once_by_the_log() -> None:
    """A request's messages are read from the log's events (what the log holds, exactly), and
    each read is a fresh copy: mutating what one request was given changes neither the log nor
    what the next request sees (the history no longer shares its dicts with anyone)."""
    from agent.history import history_from_events

    with kit() as k:
        _noop_kit_turn(k, 2)
        agent = k.parent()
        agent.send("go").get(timeout=5)
        agent.when_idle().get(timeout=5)
        requests = k.model.requests_for(agent.id)
        assert [len(r.messages) for r in requests] == [1, 3, 5]
        first = requests[1].messages[1]
        first["content"].append({"type": "text", "text": "mutated"})
        first["tool_calls"][0]["arguments"]["n"] = 99
        assert requests[2].messages[1]["content"] == []
        assert requests[2].messages[1]["tool_calls"][0]["arguments"] == {"n": 1}
        logged = history_from_events(k.store.load(agent.id).events)
        assert list(requests[2].messages) == logged[:5]
        assert logged[1]["tool_calls"][0]["arguments"] == {"n": 1}


@pytest.mark.allow_hub_block(
    "the test's own gc.collect() calls (its measurement) rescan the whole unfrozen process"
)
def test_a_long_turn_adds_no_tracked_object_per_message(default_collector: None) -> None:
    """The conversation costs the cyclic collector nothing per message: a 60-step turn leaves
    the live agent holding no more tracked objects than a 2-step turn (a list of message dicts
    held ~6 per step)."""

    from agent.tools import Tool

    def tracked_after(steps: int) -> int:
        def respond(request: object) -> S.Step:
            step = request.step  # type: ignore[attr-defined]
            return S.tool_call("noop", {"n": step}) if step <= steps else S.text("ok")

        # record=False: the scripted model keeps no requests (each holds a view).
        model = S.ScriptedModel(respond, record=False)
        with Runtime(store=MemoryStore(), scripted=model, gc_policy=False) as rt:
            rt.ctx.tools.register(
                Tool(name="noop", description="", parameters={"type": "object"}, fn=lambda a, c: "")
            )
            agent = rt.agent()
            gc.collect()
            before = len(gc.get_objects())
            agent.send("go").get(timeout=5)
            agent.when_idle().get(timeout=5)
            gc.collect()
            return len(gc.get_objects()) - before

    tracked_after(2)  # warm every cache the path fills once
    short, long = tracked_after(2), tracked_after(60)
    assert long - short < 58, f"{(long - short) / 58:.1f} tracked objects per extra step"
