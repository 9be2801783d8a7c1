"""An abort during `start()` is all or nothing, whichever hub switch it lands at.

Either the start is rejected and nothing is left behind (no child session, no live agent, no
run, no lifecycle event), or the run is published and its result settles `aborted` on its own
(before any `dispose()`), with exactly one `subagent/start` and one `subagent/end`.

The abort is injected after exactly k switches of the starting greenlet, for every k from 0 to
one past the number of switches an unaborted start makes.
"""

from __future__ import annotations

from typing import Any

import gevent
import greenlet
import pytest
from seam_kit import Kit, kit

from agent.models import scripted as S
from subagent.errors import SubagentError
from supervision.signal import AbortController


def _start_counting(k: Kit, parent: Any, abort_after: int | None, provider: str) -> Any:
    """Start a child in a fresh greenlet; abort its signal at the `abort_after`-th greenlet
    switch (of any greenlet) while the start runs. Returns (outcome, switches) where outcome is
    a handle or the start's `SubagentError`.

    The abort runs inside greenlet's trace hook, i.e. exactly at that switch: abort listeners
    must not block, and ours do not (they only queue messages)."""
    controller = AbortController()
    count = [0]
    starting = [True]

    def trace(event: str, args: Any) -> None:
        if event in ("switch", "throw") and starting[0]:
            count[0] += 1
            if count[0] == abort_after:
                controller.abort(f"aborted at switch {abort_after}")

    def start() -> Any:
        try:
            return k.start(parent, provider=provider, signal=controller.signal)
        except SubagentError as exc:
            return exc
        finally:
            starting[0] = False

    if abort_after == 0:
        controller.abort("aborted before the start")
    previous = greenlet.settrace(trace)
    try:
        outcome = gevent.spawn(start).get()
    finally:
        greenlet.settrace(previous)
    if abort_after is not None and not controller.signal.aborted:
        controller.abort("aborted after the start returned")  # k past the last switch
    return outcome, count[0]


def _assert_all_or_nothing(k: Kit, parent: Any, outcome: Any, where: str) -> None:
    if isinstance(outcome, SubagentError):
        assert outcome.code == "ABORTED", where
        k.flush_events()
        assert [h.id for h in k.store.list()] == [parent.id], where
        assert list(k.runtime.ctx.agents) == [parent.id], where
        assert k.service.runs() == [], where
        assert not k.events_of("subagent/start"), where
        return
    assert not isinstance(outcome, BaseException), f"{where}: {outcome!r}"
    # Published: the result settles by itself (no dispose yet), and settles aborted.
    result = outcome.result.get(timeout=5)
    assert result.stop_reason == "aborted", where
    k.flush_events()
    starts = [e for e in k.events_of("subagent/start") if e["run_id"] == outcome.run_id]
    ends = [e for e in k.events_of("subagent/end") if e["run_id"] == outcome.run_id]
    assert len(starts) == 1 and len(ends) == 1, where
    assert ends[0]["stop_reason"] == "aborted", where
    outcome.dispose()
    k.flush_events()
    assert len(k.events_of("subagent/end")) == 1, where


@pytest.mark.parametrize("provider", ["spawn", "fork"])
def test_abort_at_every_hub_switch_of_start_is_all_or_nothing(provider: str) -> None:
    with kit() as k:
        k.respond = lambda request: S.hang()
        parent = k.parent()
        handle, switches = _start_counting(k, parent, None, provider)
        assert not isinstance(handle, BaseException)
        handle.dispose()
    assert switches > 0
    rejected = published = 0
    for at in range(switches + 2):
        with kit() as k:
            k.respond = lambda request: S.hang()
            parent = k.parent()
            outcome, _ = _start_counting(k, parent, at, provider)
            _assert_all_or_nothing(k, parent, outcome, f"abort after {at} of {switches} switches")
            if isinstance(outcome, SubagentError):
                rejected += 1
            else:
                published += 1
    # Both sides of the rule were exercised.
    assert rejected and published


def test_a_steer_right_after_start_is_admitted_at_the_first_step() -> None:
    """start() returns before the child's actor ran (no round trip to it): a steer sent at once
    goes to a turn that is about to start, and is admitted at its first step boundary."""
    with kit() as k:
        parent = k.parent()
        run = k.start(parent, "first")
        assert run.steer("and second").get(timeout=5)
        result = run.result.get(timeout=5)
        assert result.stop_reason == "completed"
        assert result.output == [{"type": "text", "text": "done: and second"}]
        run.dispose()


def test_a_steer_for_a_turn_that_never_starts_is_rejected_not_left_pending() -> None:
    with kit() as k:
        k.respond = lambda request: S.hang()
        parent = k.parent()
        run = k.start(parent)
        steer = run.steer("never admitted")
        run.cancel("changed my mind")  # drops the unclaimed prompt: no turn will run
        with pytest.raises(SubagentError) as info:
            steer.get(timeout=5)
        assert info.value.code == "RUN_TERMINAL"
        assert run.result.get(timeout=5).stop_reason == "aborted"
        run.dispose()
