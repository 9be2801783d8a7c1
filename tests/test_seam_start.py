"""The service's registry and start validation, in the seed's order, before any child exists."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from seam_kit import Kit, kit

from agent.models import scripted as S
from providers.inprocess import SpawnProvider
from subagent.errors import SubagentDepthError, SubagentError
from subagent.schema import UnsupportedSchemaError
from subagent.types import SubagentCapabilities, SubagentStartRequest, ToolRestriction
from supervision.signal import AbortController


class NoCaps(SpawnProvider):
    capabilities = SubagentCapabilities()


class OnlySchema(SpawnProvider):
    capabilities = SubagentCapabilities(output_schema=True)


def nothing_created(k: Kit, parent: Any) -> None:
    assert [h.id for h in k.store.list()] == [parent.id]
    assert list(k.runtime.ctx.agents) == [parent.id]
    assert k.service.runs() == []
    k.flush_events()
    assert not k.events_of("subagent/start")


def test_register_duplicate_order_get_and_events() -> None:
    with kit() as k:
        names = [p.name for p in k.service.providers()]
        assert names == ["spawn", "fork"]
        with pytest.raises(SubagentError) as info:
            k.service.register(SpawnProvider())
        assert info.value.code == "DUPLICATE_PROVIDER"
        extra = SpawnProvider("extra")
        unregister = k.service.register(extra)
        assert k.service.get("extra") is extra
        assert [p.name for p in k.service.providers()] == ["spawn", "fork", "extra"]
        unregister()
        unregister()  # idempotent
        assert k.service.get("extra") is None
        k.flush_events()
        kinds = [(e["type"], e["provider"]) for e in k.events if "provider" in e]
        assert ("subagent/provider-added", "extra") in kinds
        assert kinds.count(("subagent/provider-removed", "extra")) == 1


def test_register_rejects_non_provider() -> None:
    with kit() as k, pytest.raises(TypeError):
        k.service.register(object())  # type: ignore[arg-type]


def test_unknown_provider_fails_first() -> None:
    with kit() as k:
        parent = k.parent()
        with pytest.raises(SubagentError) as info:
            # Also lacks capability and has a bad max_depth: NO_PROVIDER wins.
            k.start(parent, provider="nope", max_depth=-1)
        assert info.value.code == "NO_PROVIDER"
        nothing_created(k, parent)


@pytest.mark.parametrize(
    ("provider", "kwargs", "flag"),
    [
        ("none", {"output_schema": {"type": "object"}, "persona": "p"}, "output_schema"),
        ("none", {"max_depth": 3, "tool_filter": ToolRestriction(deny=("x",))}, "depth_limit"),
        ("none", {"tool_filter": ToolRestriction(deny=("x",)), "persona": "p"}, "tool_filter"),
        ("none", {"persona": "p"}, "persona"),
        ("schema", {"output_schema": {"type": "object"}, "max_depth": 2}, "depth_limit"),
    ],
)
def test_unsupported_capability_names_the_first_missing_flag(
    provider: str, kwargs: dict[str, Any], flag: str
) -> None:
    with kit() as k:
        k.service.register(NoCaps("none"))
        k.service.register(OnlySchema("schema"))
        parent = k.parent()
        with pytest.raises(SubagentError) as info:
            k.start(parent, provider=provider, **kwargs)
        assert info.value.code == "UNSUPPORTED_CAPABILITY"
        assert flag in str(info.value)
        nothing_created(k, parent)


@pytest.mark.parametrize("bad", [True, False, 1.0, "2"])
def test_max_depth_domain_is_a_type_error(bad: Any) -> None:
    with kit() as k:
        parent = k.parent()
        with pytest.raises(TypeError):
            k.start(parent, max_depth=bad, output_schema={"type": "string"})
        nothing_created(k, parent)


@pytest.mark.parametrize("bad", [-1, 2**53])
def test_max_depth_out_of_range_is_a_value_error(bad: int) -> None:
    """An int is the right type: outside 0..2**53-1 its value is wrong (docs/decisions.md,
    q21), still before the schema or anything else is looked at."""
    with kit() as k:
        parent = k.parent()
        with pytest.raises(ValueError, match="max_depth"):
            k.start(parent, max_depth=bad, output_schema={"type": "string"})
        nothing_created(k, parent)


def test_schema_checked_after_depth_domain_and_before_start() -> None:
    with kit() as k:
        parent = k.parent()
        with pytest.raises(UnsupportedSchemaError) as info:
            k.start(parent, output_schema={"type": "string", "pattern": "x"})
        assert info.value.code == "UNSUPPORTED_SCHEMA"
        assert len(info.value.violations) == 2  # non-object root and `pattern`
        nothing_created(k, parent)


def test_request_is_never_mutated() -> None:
    with kit() as k:
        parent = k.parent()
        schema = {"type": "object", "properties": {"a": {"type": "string"}}}
        prompt = [{"type": "text", "text": "go"}]
        k.respond = lambda r: S.tool_call("structured_output", {"a": "x"})
        request = SubagentStartRequest(
            prompt=prompt, parent=parent, signal=AbortController().signal, output_schema=schema
        )
        before = (copy.deepcopy(schema), copy.deepcopy(prompt))
        run = k.service.start("spawn", request)
        assert run.result.get(timeout=5).structured == {"a": "x"}
        run.dispose()
        assert (schema, prompt) == before


def test_max_depth_zero_forbids_children_of_a_root() -> None:
    with kit() as k:
        parent = k.parent()
        with pytest.raises(SubagentDepthError) as info:
            k.start(parent, max_depth=0)
        assert (info.value.attempted_depth, info.value.max_depth) == (1, 0)
        assert info.value.code == "DEPTH_EXCEEDED"
        nothing_created(k, parent)


def test_depth_is_inclusive_and_persisted_in_the_header() -> None:
    with kit() as k:
        root = k.parent()
        child_run = k.start(root, max_depth=1)
        child = child_run.local_agent
        assert child.depth == 1
        assert k.store.load(child.id).header.delegation_depth == 1
        child_run.result.get(timeout=5)
        with pytest.raises(SubagentDepthError) as info:
            k.start(child, max_depth=1)
        assert info.value.attempted_depth == 2
        grandchild = k.start(child, max_depth=2)
        assert grandchild.local_agent.depth == 2
        assert k.store.load(grandchild.id).header.delegation_depth == 2
        grandchild.dispose()
        child_run.dispose()


def test_depth_takes_the_greater_of_header_and_options() -> None:
    from agent.options import AgentOptions

    with kit() as k:
        root = k.runtime.agent(options=AgentOptions(subagent_depth=4))
        assert root.depth == 4
        with pytest.raises(SubagentDepthError) as info:
            k.start(root, max_depth=4)
        assert info.value.attempted_depth == 5


def test_already_aborted_signal_rejects_without_creating_anything() -> None:
    with kit() as k:
        parent = k.parent()
        controller = AbortController()
        controller.abort("no thanks")
        with pytest.raises(SubagentError) as info:
            k.start(parent, signal=controller.signal)
        assert info.value.code == "ABORTED"
        nothing_created(k, parent)


def test_unknown_tool_in_filter_fails_start_with_nothing_left() -> None:
    with kit() as k:
        parent = k.parent()
        with pytest.raises(SubagentError) as info:
            k.start(parent, tool_filter=ToolRestriction(allow=("no_such_tool",)))
        assert info.value.code == "INVALID_TOOL_FILTER"
        nothing_created(k, parent)
        with pytest.raises(SubagentError):
            k.start(parent, tool_filter=ToolRestriction())
        nothing_created(k, parent)


def test_persona_template_error_fails_start_with_nothing_left() -> None:
    with kit() as k:
        parent = k.parent()
        with pytest.raises(SubagentError) as info:
            k.start(parent, persona="You are {{unknown_name}}.")
        assert info.value.code == "START_FAILED"
        nothing_created(k, parent)


def test_provider_start_failure_emits_no_event_and_releases_the_slot() -> None:
    class Broken(SpawnProvider):
        def start(self, request: Any) -> Any:
            raise RuntimeError("boom")

    with kit(max_children=1) as k:
        k.service.register(Broken("broken"))
        parent = k.parent()
        with pytest.raises(RuntimeError):
            k.start(parent, provider="broken")
        nothing_created(k, parent)
        run = k.start(parent)  # the slot came back
        run.result.get(timeout=5)
        run.dispose()


def test_bad_arguments_are_type_errors() -> None:
    with kit() as k:
        parent = k.parent()
        with pytest.raises(TypeError):
            k.service.start("spawn", {"prompt": []})  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            k.service.start(3, k.request(parent))  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            k.service.start("spawn", k.request(object()))
