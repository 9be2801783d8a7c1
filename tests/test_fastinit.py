"""`agent.fastinit.fast_init`: the step path's frozen dataclasses keep their dataclass
signature and behaviour with the cheaper `__init__` (no timing here: benchmarks/)."""

from __future__ import annotations

import dataclasses
import inspect
import os
from typing import Any

import pytest

from actors.agent_messages import Send
from actors.registry_actor import Start
from agent.events import SessionHeader
from agent.fastinit import fast_init
from agent.model import ModelRequest, ModelResponse, ToolCall
from agent.tools import ToolContext, ToolResult
from subagent.types import MessageSource
from supervision.signal import AbortController

CLASSES: list[type[Any]] = [
    ModelRequest,
    ModelResponse,
    ToolCall,
    ToolContext,
    ToolResult,
    Send,  # once per child: the activation prompt
    Start,
    SessionHeader,
]


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_the_signature_is_the_dataclass_one(cls: type[Any]) -> None:
    params = list(inspect.signature(cls).parameters.values())
    fields = dataclasses.fields(cls)
    assert [p.name for p in params if p.kind is not p.VAR_KEYWORD] == [f.name for f in fields]
    for p, f in zip(params, fields, strict=True):
        kind = p.KEYWORD_ONLY if f.kw_only else p.POSITIONAL_OR_KEYWORD
        assert p.kind is kind
        if f.default is not dataclasses.MISSING:
            assert p.default is f.default
        elif f.default_factory is dataclasses.MISSING:
            assert p.default is p.empty, f.name


def test_values_defaults_factories_and_post_init() -> None:
    signal = AbortController().signal
    request = ModelRequest("s", "m", "sys", [], (), signal, step=3)
    assert (request.session_id, request.turn, request.step, request.max_tokens) == ("s", 1, 3, None)
    assert request == ModelRequest(
        session_id="s", model="m", system="sys", messages=[], tools=(), signal=signal, step=3
    )
    a, b = ModelResponse(()), ModelResponse(())
    assert a.usage == {} and a.usage is not b.usage  # default_factory: a fresh dict each
    assert (a.tool_calls, a.finish) == ((), "stop")
    # __post_init__ still screens a model's arguments.
    bad = ToolCall("c", "t", {"x": float("nan")})
    assert bad.arguments == {} and bad.invalid is not None and "finite" in bad.invalid
    assert ToolResult([]).is_error is False and ToolResult([]).code is None
    ctx = ToolContext(None, "s", "c", signal)
    assert ctx.trace is None and ctx.on_child is None
    with pytest.raises(TypeError):
        ToolResult()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        ToolResult([], False, None, "extra")  # type: ignore[call-arg]
    # The per-child classes: defaults, factories (a header's time and cwd) and its checks.
    send = Send([], MessageSource.user())
    assert (send.message_id, send.trace, send.run) == (None, None, None)
    header = SessionHeader(id="s1", delegation_depth=2)
    assert header.cwd == os.getcwd() and header.created_at > 0 and header.delegation_depth == 2
    assert header == SessionHeader(id="s1", delegation_depth=2, created_at=header.created_at)
    with pytest.raises(ValueError, match="invalid session id"):
        SessionHeader(id="../x")
    with pytest.raises(ValueError, match="delegation_depth"):
        SessionHeader(id="s1", delegation_depth=-1)
    with pytest.raises(TypeError):
        SessionHeader("s1")  # type: ignore[misc]  # keyword-only


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_still_frozen_and_replaceable(cls: type[Any]) -> None:
    signal = AbortController().signal
    samples: dict[type[Any], Any] = {
        ModelRequest: ModelRequest("s", "m", "sys", [], (), signal),
        ModelResponse: ModelResponse([]),
        ToolCall: ToolCall("c", "t", {}),
        ToolContext: ToolContext(None, "s", "c", signal),
        ToolResult: ToolResult([]),
        Send: Send([], MessageSource.user()),
        Start: Start("spawn", None, 1, None, None),  # type: ignore[arg-type]
        SessionHeader: SessionHeader(id="s1"),
    }
    obj = samples[cls]
    first = dataclasses.fields(cls)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(obj, first, None)
    assert dataclasses.replace(obj) == obj
    assert not hasattr(obj, "__dict__")


def test_it_refuses_what_it_cannot_rewrite() -> None:
    @dataclasses.dataclass
    class Plain:
        x: int

    with pytest.raises(TypeError, match="frozen, slotted"):
        fast_init(Plain)

    @dataclasses.dataclass(frozen=True, slots=True)
    class Late:
        x: int
        y: int = dataclasses.field(init=False, default=0)

    with pytest.raises(TypeError, match="not a plain init field"):
        fast_init(Late)

    @dataclasses.dataclass(frozen=True, slots=True)
    class WithInitVar:
        x: int
        scale: dataclasses.InitVar[int] = 1

    with pytest.raises(TypeError, match="InitVar"):
        fast_init(WithInitVar)


def test_keyword_only_fields_stay_keyword_only() -> None:
    @fast_init
    @dataclasses.dataclass(frozen=True, slots=True)
    class K:
        x: int
        y: int = dataclasses.field(default=2, kw_only=True)

    assert K(1).y == 2 and K(1, y=3).y == 3
    with pytest.raises(TypeError):
        K(1, 3)  # type: ignore[misc]
