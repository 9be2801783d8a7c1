"""A spawn started with a session id its starter minted (a Ray host names a one-shot child's
log with the run id its parent was told): the child's log is under that id, under its parent;
one that contradicts the continuation's id is refused before any child exists."""

from __future__ import annotations

import pytest

from agent.store import MemoryStore
from providers.inprocess import SpawnProvider
from subagent.runtime import Runtime
from subagent.types import SubagentContinuation, SubagentStartRequest, text_block
from supervision.signal import AbortController


def request(
    parent: object, continuation: SubagentContinuation | None = None
) -> SubagentStartRequest:
    return SubagentStartRequest(
        prompt=[text_block("hello")],
        parent=parent,
        signal=AbortController().signal,
        continuation=continuation,
    )


def test_a_one_shot_child_is_made_under_the_id_given() -> None:
    with Runtime(store=MemoryStore()) as rt:
        parent = rt.agent()
        child_id = f"{parent.id}.ray-0123456789abcdef"
        run = SpawnProvider().start(request(parent), session_id=child_id)
        try:
            assert run.id == child_id
            run.result.get(timeout=30)
            assert rt.store.header(child_id).parent_session == parent.id
            assert [r["id"] for r in rt.subagents.list_children(parent.id)] == [child_id]
        finally:
            run.dispose()


def test_an_id_that_contradicts_the_continuation_is_refused_before_any_child() -> None:
    with Runtime(store=MemoryStore()) as rt:
        parent = rt.agent()
        continuation = SubagentContinuation("child-1", descriptor=None)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="continuation"):
            SpawnProvider().start(request(parent, continuation), session_id="child-2")
        assert rt.store.ids() == [parent.id]
        assert set(rt.ctx.agents) == {parent.id}
