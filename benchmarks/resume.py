"""Resume: cold resume of a big continuable child, and 1,000 children resumed after a restart.

`python -m benchmarks resume [--n EVENTS] [--quick] [--json]`. Everything runs on a directory
`SessionStore` in a temp dir (durability "turn": fsyncs at creation and turn ends).

- big: a parent and one continuable child (`start_continuable`) whose first activation is one
  long turn of tool steps, so the child's log holds ~EVENTS events (default 10,000). Then, in a
  FRESH `Runtime` over the same store, the parent is rebuilt with `rt.resume_agent(parent_id)`
  and we time `send_message(parent, child_id, ...)` until the resumed child's first model
  request (the responder stamps `time.perf_counter()` when it sees the child's request).
  Repeated in a new Runtime each time; the OS page cache is warm (cold = new runtime, not cold
  disk). Side by side: LangGraph resuming a thread from its SQLite checkpointer to the first
  node call, with as many messages as the child's history and with 10,000 messages.
- many: 1,000 continuable children started and settled; in a fresh Runtime each gets one
  message through `send_message` (a cold resume each); after settlement every child's log is
  validated (`agent.log.validate_log`) and must contain its message as a user message.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.log import validate_log
from agent.model import ModelRequest
from agent.models import scripted as S
from agent.options import AgentOptions
from agent.store import SessionStore
from agent.tools import Tool, ToolContext
from benchmarks import _peers
from benchmarks._measure import ratio as _ratio
from providers.inprocess import SpawnProvider
from subagent.runtime import Runtime
from subagent.types import MessageSource, SubagentStartRequest, text_block
from supervision.signal import AbortController

DEFAULT_EVENTS = 10_000
QUICK_EVENTS = 1_000
MANY = 1_000
QUICK_MANY = 100
REPEATS = 5
QUICK_REPEATS = 2
EVENTS_PER_STEP = 2  # assistant/message, tool/result (log format 3)

TARGETS = {
    "big_resume_to_first_request_ms": ("<=", 50.0),
    "many_lost_messages": ("<=", 0.0),
    "many_invalid_logs": ("<=", 0.0),
}


class _Model:
    """One responder for parent and children: children run `steps` tool steps in their first
    activation, then answer text; the parent answers every notice at once."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.parents: set[str] = set()
        self.first_request: dict[str, float] = {}
        self.watch: str | None = None
        self._tool = S.tool_call("noop", {})
        self._text = S.text("done")

    def __call__(self, request: ModelRequest) -> S.Step:
        sid = request.session_id
        if sid == self.watch and sid not in self.first_request:
            self.first_request[sid] = time.perf_counter()
        if sid in self.parents:
            return self._text
        if request.turn == 1 and request.step < self.steps:
            return self._tool
        return self._text


def _noop_tool() -> Tool:
    def fn(arguments: Any, ctx: ToolContext) -> str:
        return "ok"

    return Tool(name="noop", description="does nothing", parameters={"type": "object"}, fn=fn)


def _runtime(root: Path, model: _Model) -> Runtime:
    rt = Runtime(store=SessionStore(root), scripted=S.ScriptedModel(model, record=False))
    rt.subagents.register(SpawnProvider())
    rt.ctx.tools.register(_noop_tool())
    return rt


def _request(parent: Any, prompt: str, **kwargs: Any) -> SubagentStartRequest:
    return SubagentStartRequest(
        prompt=[text_block(prompt)], parent=parent, signal=AbortController().signal, **kwargs
    )


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t0 = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - t0


# -- big ------------------------------------------------------------------------------------


def _big(root: Path, events: int, repeats: int) -> dict[str, Any]:
    steps = max(1, events // EVENTS_PER_STEP)
    model = _Model(steps)
    rt = _runtime(root, model)
    parent = rt.agent()
    model.parents.add(parent.id)
    options = AgentOptions(model="scripted:default", max_steps=steps + 10)
    t0 = time.perf_counter()
    started = rt.subagents.start_continuable(
        "spawn", _request(parent, "build a long history", agent_options=options), label="big"
    )
    task = rt.tasks.wait(started.task_id)
    parent.when_idle().get()
    build_s = time.perf_counter() - t0
    child_id, parent_id = started.child_id, parent.id
    rt.close()
    stored = rt.store.load(child_id)
    count = len(stored.events)
    history = sum(
        1
        for e in stored.events
        if e["type"] in ("user/message", "assistant/message", "tool/result")
    )
    size = (root / f"{child_id}.session").stat().st_size

    samples: list[float] = []
    send_returns: list[float] = []
    for i in range(repeats):
        model.first_request.clear()
        model.watch = child_id
        rt = _runtime(root, model)
        parent = rt.resume_agent(parent_id)
        t0 = time.perf_counter()
        sent = rt.subagents.send_message(
            parent, child_id, [text_block(f"resume {i}")], MessageSource.coordinator(parent_id)
        )
        send_returns.append(time.perf_counter() - t0)
        rt.tasks.wait(sent.task_id or "")
        samples.append(model.first_request[child_id] - t0)
        parent.when_idle().get()
        rt.close()
        if sent.kind != "started":
            raise AssertionError(f"expected a cold resume, got {sent.kind}")
    final = rt.store.load(child_id)
    validate_log(final.events, final.header)
    ms = sorted(s * 1e3 for s in samples)
    return {
        "child_events": count,
        "child_history_messages": history,
        "log_bytes": size,
        "build_s": round(build_s, 3),
        "first_activation": task.status,
        "resume_to_first_request_ms_median": round(statistics.median(ms), 2),
        "resume_to_first_request_ms_min": round(ms[0], 2),
        "resume_to_first_request_ms_max": round(ms[-1], 2),
        "send_message_returns_ms_median": round(statistics.median(send_returns) * 1e3, 2),
        "repeats": repeats,
        "log_valid_after": True,
    }


# -- many ------------------------------------------------------------------------------------


def _many(root: Path, n: int) -> dict[str, Any]:
    model = _Model(1)
    rt = _runtime(root, model)
    parent = rt.agent()
    model.parents.add(parent.id)
    t0 = time.perf_counter()
    starts = [
        rt.subagents.start_continuable("spawn", _request(parent, f"task {i}"), label=f"c{i}")
        for i in range(n)
    ]
    first = [rt.tasks.wait(s.task_id) for s in starts]
    parent.when_idle().get()
    start_s = time.perf_counter() - t0
    parent_id = parent.id
    children = [s.child_id for s in starts]
    rt.close()

    rt = _runtime(root, model)
    parent = rt.resume_agent(parent_id)
    t0 = time.perf_counter()
    sent = [
        rt.subagents.send_message(
            parent, cid, [text_block(f"message for {cid}")], MessageSource.coordinator(parent_id)
        )
        for cid in children
    ]
    send_s = time.perf_counter() - t0
    second = [rt.tasks.wait(s.task_id or "") for s in sent]
    parent.when_idle().get()
    resume_s = time.perf_counter() - t0
    rt.close()

    lost = invalid = 0
    for cid in children:
        try:
            loaded = rt.store.load(cid)
            validate_log(loaded.events, loaded.header)
        except Exception:
            invalid += 1
            continue
        wanted = f"message for {cid}"
        if not any(
            e["type"] == "user/message"
            and any(b.get("text") == wanted for b in e["data"]["message"]["content"])
            for e in loaded.events
        ):
            lost += 1
    parent_log = rt.store.load(parent_id)
    validate_log(parent_log.events, parent_log.header)
    notices = sum(
        1
        for e in parent_log.events
        if e["type"] == "user/message"
        and e["data"]["message"]["source"].get("kind") == "subagent-settled"
    )
    return {
        "children": n,
        "first_activations_completed": sum(1 for t in first if t.status == "completed"),
        "start_and_settle_all_s": round(start_s, 3),
        "sent_started": sum(1 for s in sent if s.kind == "started"),
        "send_all_s": round(send_s, 3),
        "resume_all_to_settled_s": round(resume_s, 3),
        "resumes_per_s": round(n / resume_s),
        "second_activations_completed": sum(1 for t in second if t.status == "completed"),
        "lost_messages": lost,
        "invalid_logs": invalid,
        "settlement_notices_in_parent_log": notices,
    }


# -- report ---------------------------------------------------------------------------------


def _check(value: float | None, rule: tuple[str, float]) -> bool | None:
    if value is None:
        return None
    op, bound = rule
    return value <= bound if op == "<=" else value >= bound


def run(n: int | None, args: argparse.Namespace) -> dict[str, Any]:
    quick = bool(getattr(args, "quick", False))
    events = n or (QUICK_EVENTS if quick else DEFAULT_EVENTS)
    many = QUICK_MANY if quick else MANY
    repeats = QUICK_REPEATS if quick else REPEATS
    tmp = Path(tempfile.mkdtemp(prefix="bench-resume-"))
    try:
        big = _big(tmp / "big", events, repeats)
        many_figures = _many(tmp / "many", many)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    lg_equal = _peers.langgraph_resume(big["child_history_messages"], repeats)
    lg_10k = _peers.langgraph_resume(10_000, repeats)
    ours_ms = big["resume_to_first_request_ms_median"]
    ratios: dict[str, float | None] = {
        "big_resume_to_first_request_ms": ours_ms,
        "ours_over_langgraph_equal_history": _ratio(
            ours_ms, lg_equal.get("resume_to_first_node_ms_median")
        ),
        "ours_over_langgraph_10k_messages": _ratio(
            ours_ms, lg_10k.get("resume_to_first_node_ms_median")
        ),
        "many_lost_messages": many_figures["lost_messages"],
        "many_invalid_logs": many_figures["invalid_logs"],
    }
    return {
        "n": events,
        "ours": {"big": big, "many": many_figures},
        "langgraph": {"equal_history": lg_equal, "messages_10k": lg_10k},
        "ratios": ratios,
        "targets": {k: f"{op} {bound}" for k, (op, bound) in TARGETS.items()},
        "meets_target": {k: _check(ratios[k], rule) for k, rule in TARGETS.items()},
        "notes": [
            "directory SessionStore in a temp dir, durability 'turn'; warm OS page cache",
            "LangGraph: MessagesState in SqliteSaver, fresh connection and compiled graph per "
            "repeat, timed from invoke() to the first node call",
        ],
    }
