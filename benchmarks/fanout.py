"""Fan-out: many scripted children through the full seam, against autogen-core and the Agents SDK.

`python -m benchmarks fanout [--n N] [--quick] [--json]`. Every child is started with
`rt.subagents.start("spawn", ...)` on the in-memory store (validation, registry actor, run
actor, child agent and its actor, session header, lifecycle events), its result collected and
its run disposed. Phases, each on a fresh `Runtime` (RSS first, so its delta does not reuse
memory freed by the others):

- rss: N children parked in a `hang` model step; RSS delta / N.
- fanout: N children x 10 steps (9 tool calls of a trivial tool, then text), 10 ms scripted
  latency per model call; wall time to every result, process CPU / (N * 10).
- starts: N one-step, no-latency children; start() calls per second.
- tree: a root with ~10,000 descendants in 3 levels, all hanging; `root.cancel()` until every
  result resolved and every `subagent/end` was emitted; then `root.close()` to quiescence.
- steer: 10,000 children mid-turn. Latency from `run.steer()` to the child AgentActor queueing
  the message (the `time` of its `inbox/accepted` event, a `time.time()` stamp: read from the
  log, no instrumentation), and to admission (the steer future). Two loads: "quiet" (every
  child parked inside a tool call behind a gate) and "busy" (every child stepping with 1 s model
  latency while the steers go out). The child logs are then read to check each message was
  admitted at the very next step boundary after it was accepted.

Peers (benchmarks/_peers.py), same N, same process: autogen-core and the OpenAI Agents SDK.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gevent
from gevent.event import Event as GEvent

from actors import gevent_actor
from actors.agent_handle import Agent
from agent.model import ModelRequest
from agent.models import scripted as S
from agent.options import AgentOptions
from agent.store import MemoryStore
from agent.tools import Tool, ToolContext
from benchmarks import _isolated, _peers
from benchmarks._measure import pct as _pct
from benchmarks._measure import ratio as _ratio
from benchmarks._measure import rss_bytes as _rss_bytes
from providers.inprocess import SpawnProvider
from subagent.runtime import Runtime
from subagent.service import RunHandle, SteerableRunHandle
from subagent.types import SubagentStartRequest, text_block
from supervision.signal import AbortController

DEFAULT_N = 2_000
QUICK_N = 200
SMALL_N = 1_000
# The figure is at 100,000 idle children (~2 GB of RSS, ~25 s of the run).
BIG_N = 100_000
QUICK_BIG_N = 2_000
GC_N = 10_000
STEPS = 10
LATENCY = 0.01
TREE_N = 10_000
QUICK_TREE_N = 1_000
STEER_N = 10_000
QUICK_STEER_N = 500
BUSY_STEP_LATENCY = 1.0
# The Agents SDK spends ~7 ms of CPU per step at N = 2,000 (and more per step as N grows): at
# N = 10,000 it would run for many minutes. Above this it runs at the cap, and its wall time at
# N is extrapolated linearly (a lower bound: its CPU per step grows with N).
SDK_CAP = 2_000

# -- helpers --------------------------------------------------------------------------------


class _GcClock:
    """Total CPU time spent in cyclic GC passes while installed."""

    def __init__(self) -> None:
        self.total = 0.0
        self.passes = 0
        self.by_generation = [0.0, 0.0, 0.0]
        self._t = 0.0

    def __call__(self, phase: str, info: Mapping[str, Any]) -> None:
        if phase == "start":
            self._t = time.process_time()
        else:
            spent = time.process_time() - self._t
            self.total += spent
            self.by_generation[info["generation"]] += spent
            self.passes += 1

    def __enter__(self) -> _GcClock:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)


def _noop_tool() -> Tool:
    def fn(arguments: Mapping[str, Any], ctx: ToolContext) -> str:
        return "ok"

    return Tool(name="noop", description="does nothing", parameters={"type": "object"}, fn=fn)


# What each scripted reply reports when usage accounting is on (benchmarks/usage.py).
USAGE = {"input_tokens": 1200, "output_tokens": 80}


def _runtime(
    responder: Callable[[ModelRequest], S.Step | str],
    gc_policy: bool = True,
    usage: bool = False,
) -> Runtime:
    # record=False: the scripted model keeps no request history (it would hold every message).
    rt = Runtime(
        store=MemoryStore(),
        scripted=S.ScriptedModel(responder, record=False, usage=USAGE if usage else None),
        gc_policy=gc_policy,
    )
    rt.subagents.register(SpawnProvider())
    rt.ctx.tools.register(_noop_tool())
    return rt


def _request(parent: Any, prompt: str = "task", **kwargs: Any) -> SubagentStartRequest:
    return SubagentStartRequest(
        prompt=[text_block(prompt)], parent=parent, signal=AbortController().signal, **kwargs
    )


def _settle(predicate: Callable[[], bool], limit_s: float = 60.0) -> None:
    deadline = time.monotonic() + limit_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("benchmark: condition never held")
        gevent.sleep(0.001)


# -- phases ---------------------------------------------------------------------------------


def _rss(n: int) -> dict[str, Any]:
    parked = [0]

    def responder(request: ModelRequest) -> S.Step:
        parked[0] += 1
        return S.hang()

    rt = _runtime(responder)
    parent = rt.agent()
    gc.collect()
    rss0 = _rss_bytes()
    t0 = time.perf_counter()
    runs = [rt.subagents.start("spawn", _request(parent)) for _ in range(n)]
    start_s = time.perf_counter() - t0
    _settle(lambda: parked[0] == n)
    gc.collect()
    gevent_actor.freeze_gc()
    rss_per = (_rss_bytes() - rss0) / n
    live = gevent_actor.live_count()
    t0 = time.perf_counter()
    for run in runs:
        run.dispose()
    dispose_s = time.perf_counter() - t0
    rt.close()
    gc.unfreeze()
    return {
        "n": n,
        "rss_per_idle_child_kib": round(rss_per / 1024, 2),
        "starts_per_s_parked_children": round(n / start_s),
        "live_actors_while_parked": live,
        "dispose_all_s": round(dispose_s, 4),
        "dispose_us_each": round(dispose_s / n * 1e6, 2),
    }


_TOOL_STEP = S.tool_call("noop", {}, latency=LATENCY)
_FINAL_STEP = S.text("done", latency=LATENCY)


def _fanout_responder(request: ModelRequest) -> S.Step:
    return _TOOL_STEP if request.step < STEPS else _FINAL_STEP


def _fanout(n: int, gc_mode: str = "default", usage: bool = False) -> dict[str, Any]:
    """`gc_mode`: "default" (the runtime's own GC policy), "off" (gc.disable() for the run, one
    full collection after it, counted), "frozen" (freeze_gc() right after the start burst), or
    "cpython" (the runtime's policy off: CPython's thresholds, no freezing). `usage`: every
    model reply reports token usage (logged, charged up the account chain) or none."""
    rt = _runtime(_fanout_responder, gc_mode != "cpython", usage)
    parent = rt.agent()
    ends = [0]
    rt.subagents.subscribe(lambda e: _count_end(e, ends))
    gc.collect()
    if gc_mode == "off":
        gc.disable()
    with _GcClock() as gc_clock:
        t0 = time.perf_counter()
        c0 = _peers.cpu_s()
        runs = [rt.subagents.start("spawn", _request(parent)) for _ in range(n)]
        started_s = time.perf_counter() - t0
        if gc_mode == "frozen":
            gevent_actor.freeze_gc()
        results = [run.result.get() for run in runs]
        wall = time.perf_counter() - t0
        if gc_mode != "off":
            gc.collect()  # the collection the run deferred is part of its cost
        cpu = _peers.cpu_s() - c0
        gc_cpu = gc_clock.total
        t1 = time.perf_counter()
        for run in runs:
            run.dispose()
        if gc_mode == "off":
            gc.enable()
            gc.collect()
        dispose_s = time.perf_counter() - t1
        c_all = _peers.cpu_s() - c0
    gc.unfreeze()
    completed = sum(1 for r in results if r.stop_reason == "completed")
    sample = rt.store.load(runs[0].id).events
    steps = sum(1 for e in sample if e["type"] == "assistant/message")  # one reply a step
    rt.subagents.providers()  # flush the registry's end events
    rt.close()
    return {
        "n": n,
        "gc_mode": gc_mode,
        "usage": usage,
        "wall_s": round(wall, 4),
        "start_calls_s": round(started_s, 4),
        "dispose_all_s": round(dispose_s, 4),
        "cpu_s": round(cpu, 4),
        "cpu_per_child_step_us": round(cpu / (n * STEPS) * 1e6, 2),
        "gc_cpu_share": round(gc_cpu / cpu, 4) if cpu else None,
        "cpu_per_child_step_us_incl_dispose": round(c_all / (n * STEPS) * 1e6, 2),
        "gc_s": round(gc_clock.total, 4),
        "gc_s_by_generation": [round(g, 4) for g in gc_clock.by_generation],
        "gc_passes": gc_clock.passes,
        "completed": completed,
        "end_events": ends[0],
        "steps_in_a_child_log": steps,
        "events_in_a_child_log": len(sample),
    }


def _count_end(event: Mapping[str, Any], ends: list[int]) -> None:
    if event["type"] == "subagent/end":
        ends[0] += 1


def _starts(n: int) -> dict[str, Any]:
    rt = _runtime(lambda request: S.text("ok"))
    parent = rt.agent()
    gc.collect()
    with _GcClock() as gc_clock:
        t0 = time.perf_counter()
        runs = [rt.subagents.start("spawn", _request(parent)) for _ in range(n)]
        start_s = time.perf_counter() - t0
        results = [run.result.get() for run in runs]
        done_s = time.perf_counter() - t0
    for run in runs:
        run.dispose()
    rt.close()
    return {
        "n": n,
        "starts_per_s": round(n / start_s),
        "start_us_each": round(start_s / n * 1e6, 2),
        "all_results_s": round(done_s, 4),
        "completed": sum(1 for r in results if r.stop_reason == "completed"),
        "gc_s": round(gc_clock.total, 4),
    }


def _tree_shape(total: int) -> tuple[int, int, int]:
    """(level-1 fan, level-2 fan per level-1, level-3 fan per level-2) giving ~total nodes."""
    a = b = max(2, round(total ** (1 / 4)))  # e.g. 10 x 10 x 99 for 10,000
    c = max(1, round((total - a - a * b) / (a * b)))
    return a, b, c


def _tree(total: int) -> dict[str, Any]:
    rt = _runtime(lambda request: S.hang())
    root = rt.agent()
    ends = [0]
    rt.subagents.subscribe(lambda e: _count_end(e, ends))
    baseline = gevent_actor.live_count()
    a, b, c = _tree_shape(total)
    runs: list[Any] = []
    t0 = time.perf_counter()
    for _ in range(a):
        l1 = rt.subagents.start("spawn", _request(root))
        runs.append(l1)
        for _ in range(b):
            l2 = rt.subagents.start("spawn", _request(l1.local_agent))
            runs.append(l2)
            for _ in range(c):
                runs.append(rt.subagents.start("spawn", _request(l2.local_agent)))
    n = len(runs)
    _settle(lambda: all(r.local_agent.turn_running for r in runs))
    build_s = time.perf_counter() - t0
    gc.collect()
    gevent_actor.freeze_gc()
    live_before = gevent_actor.live_count()
    t0 = time.perf_counter()
    root.cancel("benchmark: cancel the tree")
    for run in runs:
        run.result.get()
    _settle(lambda: ends[0] >= n, limit_s=30)
    rt.subagents.providers()
    cancel_s = time.perf_counter() - t0
    running_after = sum(1 for r in runs if r.local_agent.status == "running")
    aborted = sum(1 for r in runs if r.result.get().stop_reason == "aborted")
    t0 = time.perf_counter()
    root.close("benchmark over")
    dispose_s = time.perf_counter() - t0
    live_after = gevent_actor.live_count()
    rt.close()
    gc.unfreeze()
    return {
        "descendants": n,
        "shape": f"{a} x {b} x {c}",
        "build_s": round(build_s, 3),
        "tree_cancel_s": round(cancel_s, 4),
        "aborted": aborted,
        "end_events": ends[0],
        "turns_running_after_cancel": running_after,
        "live_actors_before_cancel": live_before,
        "root_close_dispose_s": round(dispose_s, 4),
        "live_actors_after_dispose": live_after,
        "live_actors_baseline_with_root": baseline,
        "quiescent": live_after <= baseline - 1,
    }


def _steer(n: int, busy: bool) -> dict[str, Any]:
    gate = GEvent()

    def wait_gate(arguments: Mapping[str, Any], ctx: ToolContext) -> str:
        gate.wait()
        return "gate open"

    parked = [0]
    busy_step = S.tool_call("noop", {}, latency=BUSY_STEP_LATENCY)
    quiet_step = S.tool_call("wait_gate", {})
    final = S.text("steered: done")

    def responder(request: ModelRequest) -> S.Step:
        last = request.messages[-1]
        if request.step > 1 and last["role"] == "user":
            return final  # the steer was admitted at this boundary
        if request.step == 1:
            parked[0] += 1
        return busy_step if busy else quiet_step

    rt = _runtime(responder)
    rt.ctx.tools.register(
        Tool(name="wait_gate", description="waits", parameters={"type": "object"}, fn=wait_gate)
    )
    parent = rt.agent()
    options = AgentOptions(model="scripted:default", max_steps=10_000)
    runs = [rt.subagents.start("spawn", _request(parent, agent_options=options)) for _ in range(n)]
    _settle(lambda: parked[0] == n)
    gc.collect()
    gevent_actor.freeze_gc()
    acks: list[float] = []
    futures = []
    marks: list[int] = []
    steps_before = sum(len(_agent(r).log.events) for r in runs) if busy else 0
    t_window = time.perf_counter()
    for run in runs:
        events = _agent(run).log.events
        mark = len(events)
        t_call = time.time()
        assert isinstance(run, SteerableRunHandle)
        futures.append((t_call, run.steer("please wrap up")))
        while True:
            found = _accepted_steer(events, mark)
            if found is not None:
                acks.append(found["time"] - t_call)
                marks.append(found["seq"])
                break
            gevent.sleep(0)
    window_s = time.perf_counter() - t_window
    events_during = (sum(len(_agent(r).log.events) for r in runs) - steps_before) if busy else 0
    gate.set()
    admissions: list[float] = []
    failures = 0
    for t_call, future in futures:
        try:
            future.get()
            admissions.append(time.time() - t_call)
        except Exception:
            failures += 1
    results = [run.result.get() for run in runs]
    next_boundary, later, missing = _check_admission(runs, marks)
    for run in runs:
        run.dispose()
    rt.close()
    gc.unfreeze()
    acks_us = [a * 1e6 for a in acks]
    return {
        "n": n,
        "load": f"every child stepping, {BUSY_STEP_LATENCY} s model latency"
        if busy
        else "every child parked inside a tool call (gate)",
        "ack_p50_us": round(statistics.median(acks_us), 2),
        "ack_p99_us": round(_pct(acks_us, 0.99), 2),
        "ack_max_us": round(max(acks_us), 2),
        "steer_window_s": round(window_s, 3),
        "log_events_appended_by_others_during_window": events_during,
        "admission_p50_ms_after_gate_or_step": round(statistics.median(admissions) * 1e3, 2)
        if admissions
        else None,
        "steer_failures": failures,
        "admitted_at_next_boundary": next_boundary,
        "admitted_later": later,
        "never_admitted": missing,
        "completed": sum(1 for r in results if r.stop_reason == "completed"),
        "note": "ack = inbox/accepted event time (child AgentActor queued it) - time.time() "
        "just before run.steer()",
    }


def _accepted_steer(events: Sequence[Mapping[str, Any]], start: int) -> Mapping[str, Any] | None:
    for i in range(start, len(events)):
        e = events[i]
        if e["type"] == "inbox/accepted" and e["data"]["kind"] == "steer":
            return e
    return None


def _agent(run: RunHandle) -> Agent:
    """A spawned child's own agent (a local run always has one)."""
    agent = run.local_agent
    assert agent is not None, f"{run!r} is not a local run"
    return agent


def _check_admission(runs: list[Any], marks: list[int]) -> tuple[int, int, int]:
    """Per child: the steer accepted at seq `mark` must be logged as a user/message at the first
    step boundary following it (no step boundary may pass it by). A boundary is a step/start in
    log formats 1 and 2; in format 3 (no step/start) the steer must come before the reply of
    the step after the one running when it was accepted, i.e. at most one reply in between."""
    ok = later = missing = 0
    for run, mark in zip(runs, marks, strict=True):
        log = run.local_agent.log
        events = log.events
        boundary = "step/start" if log.format <= 2 else "assistant/message"
        fewest = 1 if boundary == "step/start" else 0
        message_id = events[mark]["data"]["message_id"]
        boundaries = 0
        admitted = False
        for e in events[mark + 1 :]:
            if e["type"] == boundary:
                boundaries += 1
            elif e["type"] == "user/message" and e["data"]["message"]["id"] == message_id:
                admitted = True
                break
        if not admitted:
            missing += 1
        elif fewest <= boundaries <= 1:
            ok += 1
        else:
            later += 1
    return ok, later, missing


# -- report -------------------------------------------------------------------------------


def _phase(target: str, *args: Any) -> dict[str, Any]:
    return _isolated.run(f"benchmarks.{target}", *args)


def run(n: int | None, args: argparse.Namespace) -> dict[str, Any]:
    """Every phase, ours and the peers' and floors', in its own fresh interpreter."""
    quick = bool(getattr(args, "quick", False))
    n = n or (QUICK_N if quick else DEFAULT_N)
    tree_n = QUICK_TREE_N if quick else TREE_N
    steer_n = QUICK_STEER_N if quick else STEER_N
    gc_n = n if quick else GC_N
    big_n = max(n, QUICK_BIG_N if quick else BIG_N)

    ours: dict[str, Any] = {
        "idle_small": _phase("fanout:_rss", SMALL_N),
        "idle": _phase("fanout:_rss", big_n),
        "starts": _phase("fanout:_rss", n),
        "fanout": _phase("fanout:_fanout", n),
        "fanout_cpython_gc": _phase("fanout:_fanout", n, "cpython"),
        "fanout_gc_n": _phase("fanout:_fanout", gc_n) if gc_n != n else None,
        "tree": _phase("fanout:_tree", tree_n),
        "steer": _phase("fanout:_steer", steer_n, False),
    }
    peers = {
        "autogen_creation": _phase("_peers:autogen_creation", n),
        "autogen_one_message": _phase("_peers:autogen_fanout_one_message", n, STEPS, LATENCY),
        "autogen_rounds": _phase("_peers:autogen_fanout", n, STEPS, LATENCY),
        "autogen_idle": _phase("_peers:autogen_idle_kib", n),
        "pykka_threads": _phase("_peers:pykka_threads_fanout", n, STEPS, LATENCY),
    }
    floors = {
        "starts": _phase("_floors:starts_floor", n),
        "fanout": _phase("_floors:fanout_floor", n, STEPS, LATENCY),
        "steer": _phase("_floors:steer_floor", steer_n),
        "cancel": _phase("_floors:cancel_floor", ours["tree"].get("descendants", tree_n)),
    }
    gc_run = ours["fanout_gc_n"] or ours["fanout"]
    small, big = ours["idle_small"], ours["idle"]
    rows = [
        _row(
            "starts through the full seam (spawn, parked child), /s",
            ours["starts"].get("starts_per_s_parked_children"),
            peers["autogen_creation"].get("creation_per_s"),
            ">= 2.0 x autogen-core agent creation (>= 10k/s)",
            lambda r, v: r is not None and r >= 2.0 and v >= 10_000,
            floor=floors["starts"].get("starts_per_s"),
        ),
        _row(
            f"fan-out {n} children x {STEPS} steps x {LATENCY * 1e3:g} ms, wall s",
            ours["fanout"].get("wall_s"),
            peers["autogen_one_message"].get("wall_s"),
            "<= 1.0 x autogen one-message shape (stretch 0.5)",
            lambda r, v: r is not None and r <= 1.0,
            floor=floors["fanout"].get("wall_s"),
            extra={
                "autogen_rounds_wall_s": peers["autogen_rounds"].get("wall_s"),
                "pykka_threads_wall_s": peers["pykka_threads"].get("wall_s"),
            },
        ),
        _row(
            "CPU per child step (GC and its deferred collection included), us",
            ours["fanout"].get("cpu_per_child_step_us"),
            peers["autogen_one_message"].get("cpu_per_step_us"),
            "<= 35 us",
            lambda r, v: v <= 35.0,
            floor=floors["fanout"].get("cpu_per_step_us"),
            extra={
                "autogen_rounds_cpu_per_step_us": peers["autogen_rounds"].get("cpu_per_step_us")
            },
        ),
        _row(
            f"CPU share of cyclic GC in the fan-out at {gc_run.get('n')}",
            gc_run.get("gc_cpu_share"),
            ours["fanout_cpython_gc"].get("gc_cpu_share"),
            "<= 0.10 (peer column: the same run with CPython's default GC)",
            lambda r, v: v <= 0.10,
        ),
        _row(
            f"steer acknowledgement p50 on {steer_n} live children, us",
            ours["steer"].get("ack_p50_us"),
            floors["steer"].get("ack_p50_us"),
            "<= 2.5 x asyncio floor",
            lambda r, v: r is not None and r <= 2.5,
        ),
        _row(
            f"steer acknowledgement p99 on {steer_n} live children, us",
            ours["steer"].get("ack_p99_us"),
            floors["steer"].get("ack_p99_us"),
            "<= 6 x asyncio floor",
            lambda r, v: r is not None and r <= 6.0,
        ),
        _row(
            f"cancel {ours['tree'].get('descendants')} descendants through the seam, s",
            ours["tree"].get("tree_cancel_s"),
            floors["cancel"].get("cancel_s"),
            "<= 0.5 s",
            lambda r, v: v <= 0.5,
        ),
        _row(
            f"idle children at {big.get('n')}: RSS per child, KiB",
            big.get("rss_per_idle_child_kib"),
            peers["autogen_idle"].get("rss_per_idle_agent_kib"),
            "<= 32 KiB",
            lambda r, v: v <= 32.0,
        ),
        _row(
            f"start rate at {big.get('n')} over the rate at {small.get('n')}",
            _ratio(
                big.get("starts_per_s_parked_children"), small.get("starts_per_s_parked_children")
            ),
            None,
            ">= 0.7",
            lambda r, v: v >= 0.7,
        ),
        _row(
            f"dispose time per child at {big.get('n')} over at {small.get('n')} (linear = 1)",
            _ratio(big.get("dispose_us_each"), small.get("dispose_us_each")),
            None,
            "<= 1.5 (linear)",
            lambda r, v: v <= 1.5,
        ),
    ]
    return {
        "n": n,
        "steps_per_child": STEPS,
        "model_latency_s": LATENCY,
        "targets": rows,
        "ours": ours,
        "peers": peers,
        "floors": floors,
        "notes": [
            "every phase runs in its own fresh interpreter (benchmarks/_isolated.py)",
            "ours: ScriptedModel(record=False), in-memory store, the runtime's default GC policy",
            "CPU figures include the cyclic GC and one final gc.collect() of deferred garbage",
            "ratio = ours / peer in the same run; the floor is asyncio with no framework",
        ],
    }


def _row(
    figure: str,
    ours: float | None,
    peer: float | None,
    target: str,
    met: Callable[[float | None, float], bool],
    *,
    floor: float | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    ratio = _ratio(ours, peer)
    row: dict[str, Any] = {
        "figure": figure,
        "ours": ours,
        "peer": peer,
        "ratio": ratio,
        "floor": floor,
        "ours_over_floor": _ratio(ours, floor),
        "target": target,
        "met": None if ours is None else met(ratio, ours),
    }
    if extra:
        row.update(extra)
    return row
