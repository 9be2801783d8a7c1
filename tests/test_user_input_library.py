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
        ({"max_depth": -1}, ValueError, "max_depth must be at least 0 and at most 2"),
        ({"max_depth": True}, TypeError, "max_depth"),
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


def test_a_tool_whose_persona_fails_at_start_answers_start_failed_not_a_crash() -> None:
    """Through the model-facing tool a persona that fails when the child starts (here: its
    variable registered at install, never given a value) is an error result the model can
    read, with the start's code, not a tool crash. (A malformed group no longer gets this far:
    the config refuses it, below.)"""
    from subagent import scripted as S
    from subagent.tools import SubagentToolConfig, install_subagent_tools

    def model(request: Any) -> Any:
        if request.messages[-1]["role"] == "tool":
            return S.text("done")
        return S.tool_call("subagent", {"description": "review", "prompt": "review it"})

    with Runtime(store=MemoryStore(), scripted=S.ScriptedModel(model)) as rt:
        rt.subagents.register(SpawnProvider())
        rt.ctx.variables["reviewer"] = None  # known, its value to come
        install_subagent_tools(
            rt, tools=[SubagentToolConfig(provider="spawn", persona="You are {{ reviewer }}.")]
        )
        parent = rt.agent()
        parent.send("go").get()
        parent.when_idle().get()
        (result,) = [
            e["data"] for e in rt.store.load(parent.id).events if e["type"] == "tool/result"
        ]
        assert result["is_error"] and result["code"] == "START_FAILED"
        assert "'reviewer' is registered but has no value" in result["content"][0]["text"]
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
        # The type wrong is a TypeError, the value wrong a ValueError, for every numeric option.
        ({"max_children": "3"}, TypeError, "max_children must be an int or None, got str"),
        ({"max_children": True}, TypeError, "max_children must be an int or None, got bool"),
        ({"max_children": -1}, ValueError, "max_children must be at least 1"),
        ({"max_children_per_parent": 2.0}, TypeError, "max_children_per_parent must be an int"),
        ({"max_children_per_parent": 0}, ValueError, "max_children_per_parent must be at least"),
        ({"gc_freeze_every": "5"}, TypeError, "gc_freeze_every must be an int or None"),
        ({"gc_freeze_every": 0}, ValueError, "gc_freeze_every must be at least 1"),
        ({"keep_settled": "1"}, TypeError, "keep_settled must be an int, got str"),
        ({"keep_settled": True}, TypeError, "keep_settled must be an int, got bool"),
        ({"max_pending_steers": 0}, ValueError, "max_pending_steers must be at least 1"),
        ({"max_queued_sends": "9"}, TypeError, "max_queued_sends must be an int"),
        ({"max_queued_sends": -2}, ValueError, "max_queued_sends must be at least 1"),
        ({"max_tool_calls_per_reply": "3"}, TypeError, "max_tool_calls_per_reply must be an int"),
        ({"max_tool_calls_per_reply": 0}, ValueError, "max_tool_calls_per_reply must be at least"),
        ({"durability": 1}, TypeError, "durability must be a str"),
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


@pytest.mark.parametrize("source", ["user", {"kind": "user"}, 0])
def test_a_source_that_is_not_a_message_source_is_a_type_error_at_the_call(
    rt: Runtime, source: Any
) -> None:
    """`send` and `steer` refuse it where it is given, not as an `AttributeError` from the
    actor (or, for a falsy one, silently read as the user)."""
    (agent,) = rt.ctx.agents.values()
    events = len(rt.store.load(agent.id).events)
    with pytest.raises(TypeError, match="source must be a MessageSource or None"):
        agent.send("hi", source=source)
    with pytest.raises(TypeError, match="source must be a MessageSource or None"):
        agent.steer("hi", source=source)
    assert len(rt.store.load(agent.id).events) == events
    assert agent.status == "idle"


def test_a_run_handle_steer_takes_the_same_rule(rt: Runtime) -> None:
    from subagent.service import SteerableRunHandle

    run = rt.subagents.start("spawn", _request(rt))
    try:
        assert isinstance(run, SteerableRunHandle)
        with pytest.raises(TypeError, match="source must be a MessageSource or None"):
            run.steer("more", source="user")  # type: ignore[arg-type]
    finally:
        run.dispose()


@pytest.mark.parametrize(
    ("name", "error", "words"),
    [
        ("bad name", ValueError, "no spaces"),
        ("", ValueError, "must not be empty"),
        ("gemini:pro", ValueError, "no ':'"),
        ("gem\x1b[31mini", ValueError, "control"),
        ("gemini\n", ValueError, "control"),
        ("x" * 65, ValueError, "at most 64"),
        (5, TypeError, "name must be a str"),
    ],
    ids=repr,
)
def test_an_acp_agent_name_that_cannot_appear_in_routes_or_listings_is_refused(
    name: Any, error: type[BaseException], words: str
) -> None:
    """Names appear in tool names, listings, logs and `--acp NAME=...`: one with a space, a
    colon or a control character would be misread (or redraw the terminal) there."""
    import sys

    from providers.acp_config import AcpConfig

    with pytest.raises(error, match=words):
        AcpConfig(command=sys.executable, name=name)


@pytest.mark.parametrize("name", ["gemini", "claude-code", "codex_2", "agent.v2", "débogueur"])
def test_an_ordinary_acp_agent_name_is_accepted(name: str) -> None:
    import sys

    from providers.acp_config import AcpConfig

    assert AcpConfig(command=sys.executable, name=name).name == name


@pytest.mark.parametrize(
    ("persona", "words"),
    [
        ("You review {{Project}}.", "malformed template group '{{Project}}'"),
        ("You review {{ a b }}.", "malformed template group"),
    ],
)
def test_a_tool_config_with_a_malformed_persona_is_refused_when_made(
    persona: str, words: str
) -> None:
    """A malformed group is wrong whatever the runtime: refused by the config itself, not at
    every call of the tool."""
    from subagent.tools import SubagentToolConfig

    with pytest.raises(ValueError, match=words):
        SubagentToolConfig(provider="spawn", persona=persona)


def _installed(rt: Runtime) -> set[str]:
    return set(rt.ctx.tools.names())


def test_a_persona_naming_an_unknown_variable_is_refused_at_install(rt: Runtime) -> None:
    from subagent.tools import SubagentToolConfig, install_subagent_tools

    before = _installed(rt)
    config = SubagentToolConfig(provider="spawn", persona="You review {{ projekt }}.")
    with pytest.raises(ValueError, match="unknown template variable 'projekt'"):
        install_subagent_tools(rt, tools=[config])
    (parent,) = rt.ctx.agents.values()
    with pytest.raises(ValueError, match="unknown template variable 'projekt'"):
        install_subagent_tools(parent, tools=[config])
    assert _installed(rt) == before  # nothing half-installed
    assert set(parent.tools.names()) == before
    # Registered (even with no value yet: set before the first child), the persona installs.
    rt.ctx.variables["projekt"] = None
    install_subagent_tools(rt, tools=[config])()


@pytest.mark.parametrize(
    ("restriction", "words"),
    [
        (ToolRestriction(allow=("raed",)), "unknown tool name"),
        (ToolRestriction(deny=("nosuch",)), "unknown tool name"),
        (ToolRestriction(), "names no tool"),
    ],
)
def test_a_tool_filter_naming_unknown_tools_is_refused_at_install(
    rt: Runtime, restriction: ToolRestriction, words: str
) -> None:
    from subagent import Tool
    from subagent.tools import SubagentToolConfig, install_subagent_tools

    rt.ctx.tools.register(Tool("read", "Read.", {"type": "object"}, lambda a, c: "ok"))
    before = _installed(rt)
    config = SubagentToolConfig(provider="spawn", tool_filter=restriction)
    for target in (rt, next(iter(rt.ctx.agents.values()))):
        with pytest.raises(SubagentError, match=words) as caught:
            install_subagent_tools(target, tools=[config])  # type: ignore[arg-type]
        assert caught.value.code == "INVALID_TOOL_FILTER"
        assert "'subagent'" in str(caught.value)  # which tool's filter
        assert _installed(rt) == before


def test_a_tool_filter_may_name_the_tools_its_own_install_adds(rt: Runtime) -> None:
    """Runtime-wide, the delegation and task tools are in the registry a child's filter reads:
    a filter naming them is valid at install as at start."""
    from subagent.tools import SubagentToolConfig, install_subagent_tools

    config = SubagentToolConfig(
        provider="spawn", tool_filter=ToolRestriction(deny=("subagent", "task_output"))
    )
    uninstall = install_subagent_tools(rt, tools=[config])
    assert "subagent" in _installed(rt)
    uninstall()
