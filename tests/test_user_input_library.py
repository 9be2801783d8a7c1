"""Bad input to the library as a user types it: a typed error at once, never a half-made child.

Each case is a mistake a newcomer makes with `Runtime(...)`, `rt.agent(...)` or a start
request: a value of the wrong type is a `TypeError` naming the argument, a value out of range a
`ValueError`, and a request the seam refuses a `SubagentError` with its stable code. None of them
leaves an agent, a run or a log behind.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from subagent import (
    AbortController,
    AgentOptions,
    MemoryStore,
    MessageSource,
    Runtime,
    SessionStore,
    SpawnProvider,
    SubagentError,
    SubagentStartRequest,
    ToolRestriction,
    text_block,
)


@pytest.fixture
def rt(tmp_path: Path) -> Iterator[Runtime]:
    with Runtime(store=SessionStore(tmp_path / "sessions")) as runtime:
        runtime.subagents.register(SpawnProvider())
        runtime.agent()  # the parent of every request
        yield runtime


def _request(rt: Runtime, **changes: Any) -> SubagentStartRequest:
    (parent,) = rt.ctx.agents.values()
    fields: dict[str, Any] = {
        "prompt": [text_block("work")],
        "parent": parent,
        "signal": AbortController().signal,
    }
    fields.update(changes)
    return SubagentStartRequest(**fields)


def _refused(
    rt: Runtime, start: Callable[[], object], error: type[BaseException], words: str
) -> None:
    """`start` raises `error` saying `words`, and nothing new exists: no agent, run or log."""
    agents, logs = set(rt.ctx.agents), set(rt.store.list())
    with pytest.raises(error, match=words):
        start()
    assert set(rt.ctx.agents) == agents
    assert rt.subagents.runs() == []
    assert set(rt.store.list()) == logs


@pytest.mark.parametrize(
    ("changes", "error", "words"),
    [
        ({"signal": None}, TypeError, "signal must be an AbortSignal"),
        ({"signal": AbortController()}, TypeError, "signal must be an AbortSignal"),
        ({"tool_filter": ["read"]}, TypeError, "tool_filter must be a ToolRestriction"),
        ({"tool_filter": {"allow": ["read"]}}, TypeError, "tool_filter must be a ToolRestriction"),
        ({"prompt": []}, ValueError, "prompt holds no content block"),
        ({"prompt": "do it"}, TypeError, "content block"),
        ({"max_depth": "2"}, TypeError, "max_depth"),
        ({"persona": 3}, TypeError, "persona must be a string"),
        ({"agent_options": {"model": "scripted:x"}}, TypeError, "agent_options"),
    ],
    ids=lambda value: repr(value)[:40],
)
def test_a_start_request_of_the_wrong_shape_is_refused_before_any_child(
    rt: Runtime, changes: dict[str, Any], error: type[BaseException], words: str
) -> None:
    request = _request(rt, **changes)
    _refused(rt, lambda: rt.subagents.start("spawn", request), error, words)


@pytest.mark.parametrize(
    ("changes", "error", "words"),
    [
        ({"signal": None}, TypeError, "signal must be an AbortSignal"),
        ({"tool_filter": ["read"]}, TypeError, "tool_filter must be a ToolRestriction"),
        ({"prompt": []}, ValueError, "prompt holds no content block"),
    ],
    ids=lambda value: repr(value)[:40],
)
def test_a_continuable_start_of_the_wrong_shape_is_refused_before_any_child(
    rt: Runtime, changes: dict[str, Any], error: type[BaseException], words: str
) -> None:
    request = _request(rt, **changes)
    _refused(
        rt,
        lambda: rt.subagents.start_continuable("spawn", request, label="worker"),
        error,
        words,
    )


@pytest.mark.parametrize(
    ("name", "code"),
    [("nope", "NO_PROVIDER"), ("Spawn", "NO_PROVIDER")],
)
def test_an_unknown_provider_name_is_no_provider(rt: Runtime, name: str, code: str) -> None:
    request = _request(rt)
    with pytest.raises(SubagentError) as caught:
        rt.subagents.start(name, request)
    assert caught.value.code == code
    assert name in str(caught.value)
    assert rt.subagents.runs() == []


@pytest.mark.parametrize(
    ("restriction", "words"),
    [
        (ToolRestriction(allow=("nosuch",)), "unknown tool name"),
        (ToolRestriction(deny=("nosuch",)), "unknown tool name"),
        (ToolRestriction(), "names no tool"),
    ],
)
def test_a_tool_filter_naming_unknown_tools_is_invalid(
    rt: Runtime, restriction: ToolRestriction, words: str
) -> None:
    request = _request(rt, tool_filter=restriction)
    with pytest.raises(SubagentError, match=words) as caught:
        rt.subagents.start("spawn", request)
    assert caught.value.code == "INVALID_TOOL_FILTER"
    assert rt.subagents.runs() == []


@pytest.mark.parametrize(
    ("persona", "words"),
    [
        ("You review {{ projekt }}.", "unknown template variable 'projekt'"),
        ("You review {{Project}}.", "malformed template group '{{Project}}'"),
        ("You review {{ a b }}.", "malformed template group"),
    ],
)
def test_a_persona_template_error_fails_start_with_nothing_left(
    rt: Runtime, persona: str, words: str
) -> None:
    """A persona is a template like any section: a typo in it is START_FAILED, whichever typo."""
    request = _request(rt, persona=persona)
    _refused(rt, lambda: rt.subagents.start("spawn", request), SubagentError, words)
    with pytest.raises(SubagentError) as caught:
        rt.subagents.start("spawn", request)
    assert caught.value.code == "START_FAILED"


def test_a_tool_whose_persona_is_malformed_answers_start_failed_not_a_crash() -> None:
    """Through the model-facing tool the same typo is an error result the model can read, with
    the start's code, not a tool crash."""
    from subagent import scripted as S
    from subagent.tools import SubagentToolConfig, install_subagent_tools

    def model(request: Any) -> Any:
        if request.messages[-1]["role"] == "tool":
            return S.text("done")
        return S.tool_call("subagent", {"description": "review", "prompt": "review it"})

    with Runtime(store=MemoryStore(), scripted=S.ScriptedModel(model)) as rt:
        rt.subagents.register(SpawnProvider())
        install_subagent_tools(
            rt, tools=[SubagentToolConfig(provider="spawn", persona="You are {{Reviewer}}.")]
        )
        parent = rt.agent()
        parent.send("go").get()
        parent.when_idle().get()
        (result,) = [
            e["data"] for e in rt.store.load(parent.id).events if e["type"] == "tool/result"
        ]
        assert result["is_error"] and result["code"] == "START_FAILED"
        assert "malformed template group '{{Reviewer}}'" in result["content"][0]["text"]
        assert list(rt.ctx.agents) == [parent.id]


@pytest.mark.parametrize(
    ("options", "error", "words"),
    [
        ({"model": "gpt-4o"}, ValueError, "route 'prefix:model'"),
        ({"model": "nosuch:x"}, ValueError, "unknown model prefix 'nosuch'"),
    ],
)
def test_an_unknown_model_route_is_refused_before_any_child(
    rt: Runtime, options: dict[str, Any], error: type[BaseException], words: str
) -> None:
    _refused(
        rt,
        lambda: rt.subagents.start("spawn", _request(rt, agent_options=AgentOptions(**options))),
        error,
        words,
    )


def test_agent_options_of_the_wrong_type_is_a_type_error() -> None:
    with Runtime(store=MemoryStore()) as rt:
        with pytest.raises(TypeError, match="options must be an AgentOptions"):
            rt.agent(options={"model": "scripted:x"})  # type: ignore[arg-type]
        assert rt.ctx.agents == {}


@pytest.mark.parametrize(
    ("arguments", "error", "words"),
    [
        ({"models": {}}, TypeError, "models must be a ModelRegistry"),
        ({"gc_policy": "no"}, TypeError, "gc_policy must be a bool"),
        ({"durability": "always", "store": None}, ValueError, "durability"),
        ({"max_children": 0}, ValueError, "max_children"),
        ({"max_pending_steers": 1.5}, TypeError, "steers"),
        ({"keep_settled": -1}, ValueError, "keep_settled"),
        ({"prices": {"gpt": {"input": 1}}}, ValueError, "route"),
        ({"store": 5}, TypeError, "store must be"),
    ],
    ids=lambda value: repr(value)[:40],
)
def test_runtime_arguments_of_the_wrong_type_or_range(
    arguments: dict[str, Any], error: type[BaseException], words: str
) -> None:
    arguments.setdefault("store", MemoryStore())
    with pytest.raises(error, match=words):
        Runtime(**arguments).close()


def test_a_store_path_that_is_a_file_is_refused_when_the_runtime_is_made(tmp_path: Path) -> None:
    a_file = tmp_path / "notes.txt"
    a_file.write_text("not a directory")
    with pytest.raises(ValueError, match="not a directory"):
        Runtime(store=a_file).close()
    with pytest.raises(ValueError, match="not a directory"):
        Runtime(store=a_file / "sessions").close()
    assert a_file.read_text() == "not a directory"


@pytest.fixture
def stored_child(rt: Runtime) -> str:
    """A continuable child of the fixture's parent, settled and stored."""
    started = rt.subagents.start_continuable("spawn", _request(rt), label="worker")
    rt.tasks.wait(started.task_id)
    return started.child_id


@pytest.mark.parametrize(
    ("change", "error", "words"),
    [
        ({"content": []}, ValueError, "the message holds nothing"),
        ({"content": ""}, ValueError, "the message holds nothing"),
        ({"content": 5}, TypeError, "content must be"),
        ({"source": "user"}, TypeError, "source must be a MessageSource"),
        ({"parent": None}, TypeError, "parent must be an agent"),
        ({"signal": "stop"}, TypeError, "signal must be an AbortSignal or None"),
        ({"child_id": "../x"}, ValueError, "invalid session id"),
    ],
    ids=lambda value: repr(value)[:40],
)
def test_send_message_of_the_wrong_shape_is_refused_and_the_child_untouched(
    rt: Runtime, stored_child: str, change: dict[str, Any], error: type[BaseException], words: str
) -> None:
    (parent,) = [a for a in rt.ctx.agents.values() if a.id != stored_child]
    arguments: dict[str, Any] = {
        "parent": parent,
        "child_id": stored_child,
        "content": "go on",
        "source": MessageSource.user(),
        "signal": None,
    }
    arguments.update(change)
    before = len(rt.store.load(stored_child).events)
    tasks = len(rt.tasks.list(parent.id))
    with pytest.raises(error, match=words):
        rt.subagents.send_message(**arguments)
    assert len(rt.store.load(stored_child).events) == before
    assert stored_child not in rt.ctx.agents
    assert len(rt.tasks.list(parent.id)) == tasks


@pytest.mark.parametrize("bad", [5, None, "../x"])
def test_listing_the_children_of_something_that_is_not_a_session_id_is_refused(
    rt: Runtime, bad: Any
) -> None:
    error = ValueError if isinstance(bad, str) else TypeError
    with pytest.raises(error):
        rt.subagents.list_children(bad)
    with pytest.raises(error):
        rt.subagents.list_descendants(bad)
