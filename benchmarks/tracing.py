"""Tracing's cost on the fan-out job: `python -m benchmarks tracing [--n N] [--quick] [--json]`.

The fan-out job shape (N spawned children x 10 steps: 9 tool calls of a trivial tool, then
text; 10 ms scripted latency per model call; in-memory store), once per mode, each run in a
fresh process so no mode inherits another's imports, tracer provider or heap:

- `none`: the OpenTelemetry packages made unimportable (as without the `otel` extra);
- `off`: the packages importable, no tracer provider set (the API's proxy default);
- `on`: an SDK tracer provider with the SDK's `BatchSpanProcessor` over an exporter that reads
  and drops each span (so the figure is the runtime's and the SDK's cost, not a backend's or the
  network's): what a host that sets up its own provider gets;
- `sampled`: as `on` with parent-based 10 % sampling.

Modes are interleaved round by round (none, off, on, none, off, on, ...) so a machine whose
load changes during the run shifts every mode alike; the figures are each mode's median and the
ratios of medians. Targets: off within 3 % of none, on within 30 %.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import time
from typing import Any

DEFAULT_N = 2_000
QUICK_N = 200
ROUNDS = 5
QUICK_ROUNDS = 2
STEPS = 10
LATENCY = 0.01
MODES = ("none", "off", "on", "sampled")

TARGETS = {"off_over_none": 1.03, "on_over_none": 1.30}


def run(n: int | None, args: argparse.Namespace) -> dict[str, Any]:
    quick = bool(getattr(args, "quick", False))
    n = n or (QUICK_N if quick else DEFAULT_N)
    rounds = QUICK_ROUNDS if quick else ROUNDS
    samples: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    for _ in range(rounds):
        for mode in MODES:
            samples[mode].append(_child(mode, n))
    figures: dict[str, Any] = {"n": n, "rounds": rounds, "steps": STEPS}
    for mode in MODES:
        figures[f"wall_s_{mode}"] = round(statistics.median(s["wall_s"] for s in samples[mode]), 4)
        figures[f"cpu_s_{mode}"] = round(statistics.median(s["cpu_s"] for s in samples[mode]), 4)
    for mode in MODES:
        figures[f"full_gc_s_{mode}"] = round(
            statistics.median(s["full_gc_s"] for s in samples[mode]), 4
        )
        figures[f"full_gcs_{mode}"] = statistics.median(s["full_gcs"] for s in samples[mode])
    figures["spans_per_run_on"] = samples["on"][0]["spans"]
    figures["spans_per_run_sampled"] = samples["sampled"][0]["spans"]
    for mode in ("off", "on", "sampled"):
        for what in ("wall", "cpu"):
            figures[f"{what}_{mode}_over_none"] = round(
                figures[f"{what}_s_{mode}"] / figures[f"{what}_s_none"], 3
            )
    figures["targets"] = {
        f"wall_{key}": figures[f"wall_{key}"] <= limit for key, limit in TARGETS.items()
    }
    return figures


def _child(mode: str, n: int) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.tracing", mode, str(n)],
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _job(mode: str, n: int) -> dict[str, Any]:
    """One measured fan-out in this (fresh) process, under `mode`."""
    if mode == "none":
        sys.modules["opentelemetry"] = None  # type: ignore[assignment]  # import now fails
    counted = [0]
    provider: Any = None
    if mode in ("on", "sampled"):
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            SpanExporter,
            SpanExportResult,
        )

        class Dropping(SpanExporter):
            """Reads each span's name and attributes, as an encoding exporter would, then
            drops it: the figure is the runtime's and the SDK's cost, not a backend's."""

            def export(self, spans: Any) -> SpanExportResult:
                for span in spans:
                    counted[0] += 1 if span.name and span.attributes is not None else 0
                return SpanExportResult.SUCCESS

        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

        # `sampled`: what OTEL_TRACES_SAMPLER=parentbased_traceidratio with arg 0.1 sets up.
        sampler = ParentBased(TraceIdRatioBased(0.1)) if mode == "sampled" else None
        provider = TracerProvider(sampler=sampler)
        provider.add_span_processor(BatchSpanProcessor(Dropping()))
        trace.set_tracer_provider(provider)

    import os

    import gevent

    from agent import tracing
    from agent.models import scripted as S
    from agent.store import MemoryStore
    from agent.tools import Tool
    from providers.inprocess import SpawnProvider
    from subagent.runtime import Runtime
    from subagent.types import SubagentStartRequest, text_block
    from supervision.signal import AbortController

    assert (tracing.tracer() is not None) == (mode in ("on", "sampled")), mode
    tool_step = S.tool_call("noop", {}, latency=LATENCY)
    final_step = S.text("done", latency=LATENCY)
    model = S.ScriptedModel(lambda r: tool_step if r.step < STEPS else final_step, record=False)
    rt = Runtime(store=MemoryStore(), scripted=model)  # the runtime's own GC policy, as users get
    rt.subagents.register(SpawnProvider())
    rt.ctx.tools.register(Tool("noop", "does nothing", {"type": "object"}, lambda a, c: "ok"))
    parent = rt.agent()
    gevent.sleep(0)
    collections = [0, 0.0, 0.0]  # full collections, their CPU time, the current one's start

    def watch(phase: str, info: dict[str, Any]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            collections[2] = time.process_time()
        else:
            collections[0] += 1
            collections[1] += time.process_time() - collections[2]

    gc.callbacks.append(watch)
    t0 = time.perf_counter()
    c0 = sum(os.times()[:2])
    runs = [
        rt.subagents.start(
            "spawn",
            SubagentStartRequest(
                prompt=[text_block("task")], parent=parent, signal=AbortController().signal
            ),
        )
        for _ in range(n)
    ]
    results = [r.result.get() for r in runs]
    wall = time.perf_counter() - t0
    cpu = sum(os.times()[:2]) - c0
    gc.callbacks.remove(watch)
    for r in runs:
        r.dispose()
    rt.close()
    assert all(r.stop_reason == "completed" for r in results)
    if provider is not None:
        provider.shutdown()  # exports what the batch still holds
    return {
        "mode": mode,
        "wall_s": wall,
        "cpu_s": cpu,
        "spans": counted[0],
        "full_gcs": collections[0],
        "full_gc_s": collections[1],
    }


if __name__ == "__main__":
    print(json.dumps(_job(sys.argv[1], int(sys.argv[2]))))
