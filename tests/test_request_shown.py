"""What a model request shows (system prompt, tool specs) is kept between steps and remade
after any edit it depends on (issue 13, h13n; `AgentCore._show`, `agent.edits`).

Each test runs a real agent through the scripted model: the first step calls the `edit` tool,
which changes one input of the request while the turn runs; the second step's request must
show the change, and the log must carry a new `request/header` for it. With no edit, the
second request shows the very objects the first did and no second header is logged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest
from test_agent_loop import OBJECT, Kit, kit, of_type

from actors.agent_handle import Agent
from agent.models import scripted as S
from agent.tools import Tool, ToolContext

# (kit, agent, removers of the section "gone" and the tool "spare" made before the turn)
Edit = Callable[[Kit, Agent, list[Callable[[], None]]], None]


def _noop(arguments: Mapping[str, Any], ctx: ToolContext) -> str:
    return "ok"


def _section_here(k: Kit, a: Agent, removers: list[Callable[[], None]]) -> None:
    a.prompt.set_section("late", "a section added mid-turn")


def _section_above(k: Kit, a: Agent, removers: list[Callable[[], None]]) -> None:
    k.ctx.prompt.set_section("late", "a runtime section added mid-turn")


def _section_removed(k: Kit, a: Agent, removers: list[Callable[[], None]]) -> None:
    removers[0]()


def _variable(k: Kit, a: Agent, removers: list[Callable[[], None]]) -> None:
    k.ctx.variables["who"] = "the second value"


def _global_tool(k: Kit, a: Agent, removers: list[Callable[[], None]]) -> None:
    k.ctx.tools.register(Tool("late", "registered mid-turn", OBJECT, _noop))


def _global_tool_removed(k: Kit, a: Agent, removers: list[Callable[[], None]]) -> None:
    removers[1]()


def _scoped_tool(k: Kit, a: Agent, removers: list[Callable[[], None]]) -> None:
    a.tools.add(Tool("late", "added to the scope mid-turn", OBJECT, _noop))


def _restriction(k: Kit, a: Agent, removers: list[Callable[[], None]]) -> None:
    a.tools.restrict(deny=["spare"])


EDITS: dict[str, Edit] = {
    "a section of the agent's prompt": _section_here,
    "a section of the runtime's prompt": _section_above,
    "a section removed": _section_removed,
    "a variable the prompt uses": _variable,
    "a tool registered": _global_tool,
    "a tool unregistered": _global_tool_removed,
    "a tool added to the agent's scope": _scoped_tool,
    "a restriction of the agent's scope": _restriction,
}


def _turn(k: Kit, edit: Edit | None) -> tuple[Agent, list[Any]]:
    """One turn of two steps; the first step's tool runs `edit`. Returns the agent and the
    turn's two requests."""
    k.ctx.variables["who"] = "the first value"
    k.ctx.prompt.set_section("who", "you answer {{who}}")
    removers = [
        k.ctx.prompt.set_section("gone", "a section removed mid-turn"),
        k.ctx.tools.register(Tool("spare", "unregistered mid-turn", OBJECT, _noop)),
    ]
    a = k.agent()

    def run_edit(arguments: Mapping[str, Any], ctx: ToolContext) -> str:
        if edit is not None:
            edit(k, a, removers)
        return "edited"

    k.tool("edit", run_edit)
    k.model.script(a.id, [S.tool_call("edit", {}), S.text("done")])
    a.send("go").get()
    assert a.when_idle().get().reason == "completed"
    return a, k.model.requests_for(a.id)


def _shown(request: Any) -> tuple[str, list[str]]:
    return request.system, [t.name for t in request.tools]


@pytest.mark.parametrize("what", list(EDITS))
def test_an_edit_during_a_turn_shows_in_the_next_request_and_its_header(what: str) -> None:
    with kit() as k:
        a, (first, second) = _turn(k, EDITS[what])
        assert _shown(second) != _shown(first)
        # The same as a fresh agent made now would be shown (nothing stale survives the edit).
        assert second.system == a.prompt.render(k.ctx.variables)
        assert [t.name for t in second.tools] == [t.name for t in a.tools.specs()]
        headers = of_type(k.events(a), "request/header")
        assert len(headers) == 2
        system, tools = _stored_header(k, headers[1])
        assert (system, [t["name"] for t in tools]) == _shown(second)


def test_with_no_edit_the_next_request_shows_the_same_objects_and_no_new_header() -> None:
    with kit() as k:
        a, (first, second) = _turn(k, None)
        assert second.system is first.system
        assert second.tools is first.tools
        assert len(of_type(k.events(a), "request/header")) == 1


def test_a_variable_changed_between_turns_shows_in_the_next_turn() -> None:
    with kit() as k:
        a, _ = _turn(k, None)
        k.ctx.variables["who"] = "a value set between turns"
        k.model.script(a.id, [S.text("again")])
        a.send("again").get()
        a.when_idle().get()
        last = k.model.requests_for(a.id)[-1]
        assert "a value set between turns" in last.system
        assert len(of_type(k.events(a), "request/header")) == 2


def _stored_header(k: Kit, event: Mapping[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    content = k.store.request_header(event["data"]["ref"])
    return content["system"], content["tools"]
