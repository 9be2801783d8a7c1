"""Tracing switched off costs a constant check per child, and a provider set later is used.

The check reads the API's global provider where OpenTelemetry keeps it (the seam in
`agent.tracing.tracer`); these tests pin that seam, the rule that a host's provider installed
after the runtime started gets spans from the next child on, and that the environment is not
consulted per child.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
from gevent import subprocess as gsub
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from tracing_support import installed, no_provider

from agent import tracing
from agent.models import scripted as S
from agent.store import MemoryStore
from providers.inprocess import SpawnProvider
from subagent.runtime import Runtime
from subagent.types import SubagentStartRequest, text_block
from supervision.signal import AbortController

REPO = Path(__file__).resolve().parent.parent
ENV_KEY = "OTEL_PYTHON_TRACER_PROVIDER"


class _CountingEnviron(dict[str, str]):
    """`os.environ` stand-in that counts the look-ups of OpenTelemetry's provider variable."""

    looked_up = 0

    def __contains__(self, key: object) -> bool:
        if key == ENV_KEY:
            type(self).looked_up += 1
        return super().__contains__(key)


def _start_one(rt: Runtime, parent: Any) -> None:
    request = SubagentStartRequest(
        prompt=[text_block("go")], parent=parent, signal=AbortController().signal
    )
    run = rt.subagents.start("spawn", request)
    assert run.result.get(timeout=10).stop_reason == "completed"
    run.dispose()


def test_the_seam_reads_the_provider_the_api_set() -> None:
    """The pin: `set_tracer_provider` stores the provider where `tracer()` reads it."""
    with no_provider():
        assert trace._TRACER_PROVIDER is None
        assert tracing.tracer() is None
        host = TracerProvider()
        with installed(host):
            assert trace._TRACER_PROVIDER is host
            assert tracing.tracer() is not None
        assert tracing.tracer() is None


def test_tracing_off_consults_no_environment_per_child(monkeypatch: pytest.MonkeyPatch) -> None:
    """Off, each child costs an attribute read: no `os.environ` test (the API's
    `get_tracer_provider()` made one at the activation, the prompt and the turn)."""
    with no_provider():
        tracing.tracer()  # the one look-up, done
        rt = Runtime(store=MemoryStore(), scripted=S.ScriptedModel(lambda r: S.text("ok")))
        try:
            rt.subagents.register(SpawnProvider())
            parent = rt.agent()
            monkeypatch.setattr(os, "environ", _CountingEnviron(os.environ))
            _CountingEnviron.looked_up = 0
            for _ in range(5):
                _start_one(rt, parent)
            assert _CountingEnviron.looked_up == 0
        finally:
            monkeypatch.undo()
            rt.close()


def test_a_provider_installed_after_the_runtime_started_traces_the_next_child() -> None:
    """The runtime never caches "off": the host's provider, set once the runtime runs, gets
    the spans of every child started after it."""
    with no_provider():
        rt = Runtime(store=MemoryStore(), scripted=S.ScriptedModel(lambda r: S.text("ok")))
        try:
            rt.subagents.register(SpawnProvider())
            parent = rt.agent()
            _start_one(rt, parent)  # tracing off: nothing to record it
            with installed() as exporter:
                _start_one(rt, parent)
                names = [span.name for span in exporter.get_finished_spans()]
            assert "invoke_agent" in names  # the child's activation
            assert any(name.startswith("chat") for name in names)  # and its model call
        finally:
            rt.close()


ENV_SCRIPT = """
from agent import tracing
found = tracing.tracer()
from opentelemetry import trace
print(type(trace.get_tracer_provider()).__name__, found is not None)
"""


def test_the_provider_variable_is_honoured_at_the_first_check() -> None:
    """`OTEL_PYTHON_TRACER_PROVIDER`, set when the process starts, is loaded by the first
    check (OpenTelemetry's own look-up), as the API would."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env[ENV_KEY] = "sdk_tracer_provider"
    proc = gsub.run(
        [sys.executable, "-c", ENV_SCRIPT],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["TracerProvider", "True"]


def test_the_context_seam_sets_what_the_api_reads() -> None:
    """The pin for a tool call's context (`agent.tracing._attach`/`_detach`): under the API's
    default runtime context they are its context variable's own `set` and `reset`, and what
    they set is what the API's `get_current` reads, restored after."""
    from opentelemetry import context
    from opentelemetry.context.contextvars_context import ContextVarsRuntimeContext

    runtime = context._RUNTIME_CONTEXT
    assert type(runtime) is ContextVarsRuntimeContext
    assert tracing._attach == runtime._current_context.set  # type: ignore[attr-defined]
    assert tracing._detach == runtime._current_context.reset  # type: ignore[attr-defined]
    before = context.get_current()
    ctx = context.set_value("k", "v")
    token = tracing._attach(ctx)
    assert context.get_current() is ctx and context.get_value("k") == "v"
    tracing._detach(token)
    assert context.get_current() is before
