"""A model probing ids: another agent's child and no child at all get the same answer.

`send_message` answered `UNAUTHORIZED` for another parent's child and `UNKNOWN_CHILD` for an id
nobody has, so a model could tell which ids exist (a sibling's children, say). The model-facing
tools now answer both alike, as the task tools do (`UNKNOWN_TASK`); the service keeps its
distinct codes for the host's own code.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_model_tools import Env, call, results, text_of

from agent.models import scripted as S
from agent.store import SessionStore
from subagent.errors import SubagentError
from subagent.tools import SubagentToolConfig, install_subagent_tools

MADE_UP = "s0123456789abcdef"


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    e = Env(SessionStore(tmp_path, durability="none"))
    install_subagent_tools(e.rt, tools=[SubagentToolConfig("spawn", background="continuable")])
    try:
        yield e
    finally:
        e.rt.close()


def _alices_child(env: Env) -> str:
    env.child = lambda request: S.text("done")
    alice = env.root(
        S.tool_call("subagent", call("job", "do it", run_in_background=True)),
        S.text("started"),
        session_id="alice",
    )
    assert env.turn(alice).reason == "completed"
    (row,) = env.rt.subagents.list_children("alice")
    return str(row["id"])


@pytest.mark.parametrize(
    ("tool", "arguments"),
    [
        ("send_message", lambda cid: {"subagent_id": cid, "message": "hello"}),
        ("interrupt_agent", lambda cid: {"agent_id": cid}),
    ],
)
def test_another_agents_child_and_no_child_get_the_same_answer(
    env: Env, tool: str, arguments: Any
) -> None:
    theirs = _alices_child(env)
    mallory = env.root(
        S.tool_call(tool, arguments(theirs)),
        S.tool_call(tool, arguments(MADE_UP)),
        S.text("end"),
        session_id="mallory",
    )
    assert env.turn(mallory).reason == "completed"
    first, second = results(mallory, tool)
    assert first["code"] == second["code"] == "UNKNOWN_CHILD"
    assert first["is_error"] and second["is_error"]
    assert text_of(first).replace(theirs, "ID") == text_of(second).replace(MADE_UP, "ID")
    # The library's own API still tells its caller which it was.
    with pytest.raises(SubagentError) as info:
        env.rt.subagents.interrupt(theirs, by=mallory)
    assert info.value.code == "UNAUTHORIZED"
    with pytest.raises(SubagentError) as info:
        env.rt.subagents.interrupt(MADE_UP, by=mallory)
    assert info.value.code == "UNKNOWN_CHILD"
