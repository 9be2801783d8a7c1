"""One exception tree, rooted once: every public exception class of the library derives from
`SubagentRuntimeError` or from the one cancellation `Cancelled`; each layer's part is documented
in its errors module; codes are a closed `Literal`; cancellation escapes `except Exception`."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Mapping
from types import ModuleType
from typing import Any, get_args

import pytest

import subagent
from agent.errors import SessionExistsError, SessionNotFoundError
from agent.model import ToolCall
from agent.tools import Tool, ToolContext, ToolRegistry, ToolScope
from subagent.errors import ERROR_CODES, DescriptorError, ErrorCode, UnknownTaskError
from supervision.errors import AbortError, Cancelled, ChildKilled, SubagentRuntimeError
from supervision.signal import AbortController

PACKAGES = ("supervision", "agent", "actors", "providers", "subagent")
ERRORS_MODULES = ("supervision.errors", "agent.errors", "providers.errors", "subagent.errors")


def _library_modules() -> list[ModuleType]:
    found = []
    for top in PACKAGES:
        package = importlib.import_module(top)
        found.append(package)
        for info in pkgutil.walk_packages(package.__path__, prefix=top + "."):
            if info.name.endswith("__main__"):
                continue
            found.append(importlib.import_module(info.name))
    return found


def _public_exception_classes() -> set[type[BaseException]]:
    classes: set[type[BaseException]] = set()
    for module in _library_modules():
        for name, value in vars(module).items():
            if (
                inspect.isclass(value)
                and issubclass(value, BaseException)
                and value.__module__ == module.__name__
                and not name.startswith("_")
            ):
                classes.add(value)
    return classes


def _ours(cls: type) -> bool:
    return cls.__module__.split(".")[0] in PACKAGES


def test_public_exception_classes_have_at_most_two_roots() -> None:
    classes = _public_exception_classes()
    assert len(classes) > 20  # the walk really found the library's errors
    roots = {cls for cls in classes if not any(_ours(base) for base in cls.__mro__[1:])}
    assert roots == {SubagentRuntimeError, Cancelled}


def test_the_roots_are_one_error_and_one_cancellation_that_except_exception_misses() -> None:
    assert issubclass(SubagentRuntimeError, Exception)
    assert not issubclass(Cancelled, Exception)
    for cls in (AbortError, ChildKilled):
        assert issubclass(cls, Cancelled)
    assert subagent.SubagentRuntimeError is SubagentRuntimeError
    assert subagent.Cancelled is Cancelled
    assert subagent.AbortError is AbortError
    assert issubclass(subagent.SubagentError, SubagentRuntimeError)


def test_store_and_argument_errors_keep_their_builtin_base() -> None:
    assert issubclass(SessionNotFoundError, KeyError)
    assert issubclass(SessionExistsError, FileExistsError)
    assert issubclass(UnknownTaskError, KeyError)
    assert issubclass(DescriptorError, ValueError)


def test_error_codes_are_a_closed_literal() -> None:
    assert set(get_args(ErrorCode)) == set(ERROR_CODES)
    with pytest.raises(ValueError, match="unknown SubagentError code"):
        subagent.SubagentError("NO_SUCH_CODE")  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ERRORS_MODULES)
def test_each_errors_module_documents_its_classes(name: str) -> None:
    module = importlib.import_module(name)
    doc = module.__doc__ or ""
    defined = [
        n
        for n, v in vars(module).items()
        if inspect.isclass(v) and issubclass(v, BaseException) and v.__module__ == name
    ]
    assert defined
    assert [n for n in defined if n not in doc] == []


def test_a_tool_that_catches_exception_cannot_swallow_its_cancellation() -> None:
    """The failure mode a `BaseException` cancellation prevents: a tool's `except Exception`
    does not catch the abort, so the call ends cancelled instead of carrying on."""
    owner = AbortController()
    swallowed: list[BaseException] = []

    def careless(_args: Mapping[str, Any], ctx: ToolContext) -> str:
        owner.abort("the user said stop")
        try:
            ctx.signal.raise_if_aborted()
        except Exception as exc:  # what a careless tool writes
            swallowed.append(exc)
        return "carried on"

    registry = ToolRegistry()
    registry.register(Tool("careless", "swallows errors", {"type": "object"}, careless))
    context = ToolContext(agent=None, session_id="s1", call_id="c1", signal=owner.signal)
    with pytest.raises(Cancelled) as raised:
        ToolScope(registry).execute(ToolCall(id="c1", name="careless", arguments={}), context)
    assert isinstance(raised.value, AbortError)
    assert raised.value.reason == "the user said stop"
    assert swallowed == []
