"""A child's delegation depth is computed once, by the registry where it validates the start,
and carried to the provider in the request (`SubagentStartRequest.depth`), which writes it into
the child's header: no provider or tracer computes it again."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from seam_kit import kit

import subagent.types
from actors import registry_actor
from providers.inprocess import SpawnProvider
from subagent.errors import SubagentDepthError
from subagent.types import SubagentStartRequest


class Recording(SpawnProvider):
    """Spawn, keeping every request as the provider received it."""

    def __init__(self) -> None:
        super().__init__("recording")
        self.requests: list[SubagentStartRequest] = []

    def start(self, request: SubagentStartRequest) -> Any:
        self.requests.append(request)
        return super().start(request)


def test_the_provider_receives_the_depth_the_registry_computed() -> None:
    with kit() as k:
        provider = Recording()
        k.service.register(provider)
        root = k.parent()
        asked = k.request(root)
        child = k.service.start("recording", asked)
        grandchild = k.service.start("recording", k.request(child.local_agent, max_depth=2))
        assert [r.depth for r in provider.requests] == [1, 2]
        assert asked.depth is None  # the caller's request is never changed
        assert child.local_agent.header.delegation_depth == 1
        assert grandchild.local_agent.header.delegation_depth == 2
        assert grandchild.local_agent.depth == 2
        with pytest.raises(SubagentDepthError) as info:
            k.service.start("recording", k.request(grandchild.local_agent, max_depth=2))
        assert (info.value.attempted_depth, info.value.max_depth) == (3, 2)
        assert len(provider.requests) == 2  # refused before the provider was asked
        for run in (grandchild, child):
            run.result.get()
            run.dispose()


def test_the_depth_is_computed_once_per_start(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Any] = []
    rule = subagent.types.child_depth

    def counted(parent: object) -> int:
        calls.append(parent)
        return rule(parent)

    # The registry's binding and the one `depth_of` falls back on for direct provider calls.
    monkeypatch.setattr(registry_actor, "child_depth", counted)
    monkeypatch.setattr(subagent.types, "child_depth", counted)
    with kit() as k:
        root = k.parent()
        runs = [k.start(root) for _ in range(3)]
        assert len(calls) == 3
        for run in runs:
            run.result.get()
            run.dispose()


def test_the_provider_writes_the_carried_depth_into_the_header() -> None:
    with kit() as k:
        root = k.parent()
        # Called directly with a depth (as a service would carry it): the provider uses it.
        run = SpawnProvider().start(replace(k.request(root), depth=7))
        try:
            assert run.local_agent.header.delegation_depth == 7
            assert run.local_agent.depth == 7
        finally:
            run.dispose()
        # Called directly without one (never through the service): the same rule, parent + 1.
        run = SpawnProvider().start(k.request(root))
        try:
            assert run.local_agent.header.delegation_depth == 1
        finally:
            run.dispose()
