"""Seeded chaos: hundreds of children over spawn, fork and continuable, with faults everywhere.

Each seed builds one `Runtime` on a directory store and drives children concurrently. A child's
plan (what its model does, step by step) and its fault (what the test does to it, and when) are
drawn from `random.Random(seed)`, so a failing seed replays exactly (`CHAOS_SEEDS=1234`).

Faults: model errors and hangs, tool exceptions, tools that ignore cancellation, provider start
failures (a wrapping provider, before and after the inner child exists), aborts before start,
during creation (from the publication hook), mid-step, mid-tool and during dispose, cancels,
concurrent disposes, steers racing completion, send_message racing settlement, interrupts,
lifecycle and progress listeners that raise, and session-log write failures that make a
continuable activation crash so its supervisor restarts it by cold resume.

After `Runtime.close()` the invariants of docs/reliability.md are checked; every violation is
collected (not just the first) and the test fails listing them with the seed.
"""

from __future__ import annotations

import os
import random
import traceback
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gevent
import gevent.pool
import pytest
from acp_peers.support import child_processes
from gevent.event import Event
from reliability_kit import describe_greenlets, live_greenlets, size

from actors import gevent_actor
from agent.log import validate_log
from agent.model import ModelRequest
from agent.models import scripted as S
from agent.store import SessionStore
from agent.tools import Tool, ToolContext, ToolError
from providers.inprocess import ForkProvider, SpawnProvider
from subagent.errors import SubagentError
from subagent.runtime import Runtime
from subagent.types import MessageSource, SubagentStartRequest, text_block
from supervision.signal import AbortController, AbortSignal

CHILDREN = size(240, 1000)
SEEDS = [int(s) for s in os.environ.get("CHAOS_SEEDS", "").split(",") if s] or list(
    range(size(3, 10))
)
PARENTS = 6
CONCURRENCY = 48

ACTIONS = [
    "text",
    "latency",
    "error",
    "hang",
    "tool_ok",
    "tool_raise",
    "tool_crash",
    "tool_block",
    "tool_ignore",
    "max_tokens",
    "refusal",
    "gate",
]
ONE_SHOT_FAULTS = [
    "none",
    "none",
    "abort_before_start",
    "provider_fail_before",
    "provider_fail_after",
    "abort_during_creation",
    "abort_mid_step",
    "abort_mid_tool",
    "cancel_mid_step",
    "dispose_mid_step",
    "abort_during_dispose",
    "steer_race",
    "steer_admitted",
    "leave_to_close",
]
CONTINUABLE_FAULTS = [
    "none",
    "send_race",
    "send_after",
    "interrupt",
    "log_fault",
    "abort_before_start",
    "leave_to_close",
]


@dataclass
class Plan:
    index: int
    kind: str  # spawn | fork | continuable
    actions: list[str]
    fault: str
    parent: int
    yields: int  # how many hub switches a racing fault waits before it fires
    gate: Event = field(default_factory=Event)  # the model or tool reached its gate
    opened: Event = field(default_factory=Event)


@dataclass
class Sent:
    """One message the test sent to a child, and what its sender was told."""

    child: str
    token: str
    how: str  # steer | send_message
    ok: bool
    detail: str = ""


@dataclass
class Stats:
    faults: Counter[str] = field(default_factory=Counter)
    actions: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)
    starts_refused: int = 0
    restarts: int = 0
    repaired_logs: int = 0
    logs_checked: int = 0
    messages_ok: int = 0
    messages_lost_reported: int = 0
    listener_raises: int = 0


def _plan_of(request: ModelRequest) -> int | None:
    for message in reversed(request.messages):
        if message.get("role") != "user":
            continue
        for block in message.get("content", ()):
            text = block.get("text", "") if isinstance(block, Mapping) else ""
            if text.startswith("plan="):
                return int(text[5:].split()[0])
    return None


class ChaosProvider:
    """Wraps an in-process provider to fail starts: before the child exists, or after (then it
    cleans the child up itself, as the seam demands of a provider whose start rejects)."""

    def __init__(self, inner: Any, name: str, fail: Callable[[SubagentStartRequest], str]) -> None:
        self.inner = inner
        self.name = name
        self.capabilities = inner.capabilities
        self.inherits_parent_context = inner.inherits_parent_context
        self._fail = fail

    def start(self, request: SubagentStartRequest) -> Any:
        how = self._fail(request)
        if how == "before":
            raise SubagentError("START_FAILED", "chaos: the provider failed before creation")
        run = self.inner.start(request)
        if how == "after":
            run.dispose()
            raise SubagentError("START_FAILED", "chaos: the provider failed after creation")
        return run

    def resume(self, request: Any) -> Any:
        return self.inner.resume(request)


class FailingSink:
    """A session-log sink whose writes fail after `budget` of them: the turn's log breaks."""

    def __init__(self, inner: Any, budget: int) -> None:
        self.inner = inner
        self.budget = budget

    def write(self, data: bytes | bytearray) -> None:
        self.budget -= 1
        if self.budget < 0:
            # A torn write: half the frame bytes reach the file, then the device fails.
            self.inner.write(bytes(data[: len(data) // 2]))
            raise OSError("chaos: injected write failure")
        self.inner.write(data)

    def sync(self) -> None:
        self.inner.sync()

    def close(self) -> None:
        self.inner.close()


class Chaos:
    def __init__(self, seed: int, root: Path) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.stats = Stats()
        self.violations: list[str] = []
        self.plans: dict[int, Plan] = {}
        self.sent: list[Sent] = []
        self.handles: list[Any] = []  # one-shot handles start() returned
        self.continuable: dict[str, Plan] = {}  # child id -> plan
        self.log_faulted: set[str] = set()
        self.events: list[Mapping[str, Any]] = []
        self.roots: set[str] = set()
        self.first_turn: dict[str, int] = {}
        self.creating: dict[Any, AbortController] = {}  # greenlet -> its start's controller
        self.fault_next_publish: dict[Any, int] = {}  # greenlet -> write budget
        self.model = S.ScriptedModel(self.respond, record=False)
        self.store = SessionStore(root, durability="none")
        self.runtime = Runtime(store=self.store, scripted=self.model, max_children=96)
        self.service = self.runtime.subagents
        self.service.register(SpawnProvider())
        self.service.register(ForkProvider())
        self.service.register(ChaosProvider(SpawnProvider("inner-spawn"), "chaos-spawn", self._how))
        self.service.register(ChaosProvider(ForkProvider("inner-fork"), "chaos-fork", self._how))
        self.service.subscribe(self.events.append)
        self._event_count = 0
        self.service.subscribe(self._raising_listener)
        self.service.subscribe_progress(self._raising_progress)
        self.runtime.ctx.lifecycle.on_published(self._on_published)
        self._register_tools()

    # -- the model --------------------------------------------------------------------------

    def respond(self, request: ModelRequest) -> S.Step:
        if request.session_id in self.roots:
            return S.text("parent ok")
        index = _plan_of(request)
        if index is None:
            return S.text("no plan")
        plan = self.plans[index]
        # A fork continues its parent's turn numbers: the plan drives the child's first turn.
        if request.turn > self.first_turn.setdefault(request.session_id, request.turn):
            return S.text(f"turn {request.turn} done")
        if request.step > len(plan.actions):
            return S.text("done")
        action = plan.actions[request.step - 1]
        if action == "text":
            return S.text(f"done {index}")
        if action == "latency":
            return S.text(f"done {index}", latency=self.rng.choice((0.0005, 0.001, 0.003)))
        if action == "error":
            return S.error(f"chaos model error {index}")
        if action == "hang":
            return S.hang()
        if action == "max_tokens":
            return S.max_tokens("partial")
        if action == "refusal":
            return S.refusal()
        if action == "gate":
            plan.gate.set()
            self._wait_open(plan, request.signal)
            return S.text(f"gated {index}")
        mode = action[len("tool_") :]
        return S.tool_call("chaos_tool", {"plan": index, "mode": mode})

    def _wait_open(self, plan: Plan, signal: AbortSignal) -> None:
        remove = signal.add_listener(lambda _r: plan.opened.set())
        try:
            plan.opened.wait()
        finally:
            remove()

    def _register_tools(self) -> None:
        def chaos_tool(arguments: Mapping[str, Any], ctx: ToolContext) -> str:
            plan = self.plans[int(arguments["plan"])]
            mode = arguments["mode"]
            if mode == "raise":
                raise ToolError("chaos tool error")
            if mode == "crash":
                raise RuntimeError("chaos tool crash")
            if mode == "block":
                plan.gate.set()
                self._wait_open(plan, ctx.signal)
            elif mode == "ignore":
                plan.gate.set()
                plan.opened.wait()  # ignores its signal: the loop must abandon it
            return "tool ok"

        self.runtime.ctx.tools.register(
            Tool(
                name="chaos_tool",
                description="chaos",
                parameters={"type": "object"},
                fn=chaos_tool,
            )
        )

    # -- hooks ------------------------------------------------------------------------------

    def _raising_listener(self, event: Mapping[str, Any]) -> None:
        self._event_count += 1
        if self._event_count % 3 == 0:
            self.stats.listener_raises += 1
            raise RuntimeError("chaos: a lifecycle listener raised")

    def _raising_progress(self, event: Mapping[str, Any]) -> None:
        if event.get("kind") == "tool/call":
            raise RuntimeError("chaos: a progress listener raised")

    def _how(self, request: SubagentStartRequest) -> str:
        text = request.prompt[0]["text"]
        plan = self.plans[int(text[5:].split()[0])]
        return {"provider_fail_before": "before", "provider_fail_after": "after"}.get(
            plan.fault, ""
        )

    def _on_published(self, agent: Any) -> None:
        me = gevent.getcurrent()
        controller = self.creating.pop(me, None)
        if controller is not None:
            controller.abort("chaos: aborted during creation")
        budget = self.fault_next_publish.pop(me, None)
        if budget is not None:
            log = agent.core.log
            log._sink = FailingSink(log._sink, budget)
            self.log_faulted.add(agent.id)

    # -- plans ------------------------------------------------------------------------------

    def make_plan(self, index: int) -> Plan:
        rng = self.rng
        kind = rng.choices(("spawn", "fork", "continuable"), (5, 3, 2))[0]
        faults = CONTINUABLE_FAULTS if kind == "continuable" else ONE_SHOT_FAULTS
        fault = rng.choice(faults)
        actions = [rng.choice(ACTIONS) for _ in range(rng.randint(1, 3))]
        if fault in ("abort_mid_step", "cancel_mid_step", "dispose_mid_step", "interrupt"):
            actions[0] = "gate"
        elif fault == "abort_mid_tool":
            actions[0] = rng.choice(("tool_block", "tool_ignore"))
        elif fault == "abort_during_dispose":
            actions[0] = rng.choice(("gate", "hang", "tool_block", "tool_ignore"))
        elif fault == "steer_admitted":
            actions = ["gate", "tool_ok", "text"]
        elif fault in ("steer_race", "send_race"):
            actions = [rng.choice(("text", "latency", "tool_ok", "error"))]
        elif fault == "log_fault":
            actions = ["tool_ok", "text"]
        elif fault in ("none", "send_after"):
            # Every such child must end on its own, so nothing in it waits for the test.
            actions = [a for a in actions if a not in ("hang", "gate", "tool_block", "tool_ignore")]
            actions = actions or ["text"]
        plan = Plan(index, kind, actions, fault, rng.randrange(PARENTS), rng.randint(0, 6))
        self.plans[index] = plan
        self.stats.faults[fault] += 1
        self.stats.actions.update(actions)
        return plan

    # -- drivers ----------------------------------------------------------------------------

    def drive(self, plan: Plan, parents: list[Any]) -> None:
        try:
            if plan.kind == "continuable":
                self._drive_continuable(plan, parents[plan.parent])
            else:
                self._drive_one_shot(plan, parents[plan.parent])
        except Exception as exc:  # a driver must never die silently: that is a finding
            self.violations.append(
                f"plan {plan.index} ({plan.kind}/{plan.fault}): driver raised {exc!r}"
            )
        finally:
            plan.opened.set()  # release anything still gated, so the run can end

    def _request(
        self, parent: Any, plan: Plan, signal: AbortSignal, extra: str = ""
    ) -> SubagentStartRequest:
        text = f"plan={plan.index} {extra}".strip()
        return SubagentStartRequest(prompt=[text_block(text)], parent=parent, signal=signal)

    def _expect_refused(self, plan: Plan, fn: Callable[[], Any], code: str) -> None:
        try:
            handle = fn()
        except SubagentError as exc:
            if exc.code != code:
                self.violations.append(f"plan {plan.index}: start failed {exc.code}, not {code}")
            self.stats.starts_refused += 1
            return
        self.violations.append(f"plan {plan.index}: {plan.fault} but the start succeeded")
        self.handles.append(handle)

    def _drive_one_shot(self, plan: Plan, parent: Any) -> None:
        fault = plan.fault
        controller = AbortController()
        provider = plan.kind
        if fault in ("provider_fail_before", "provider_fail_after"):
            provider = f"chaos-{plan.kind}"
        request = self._request(parent, plan, controller.signal)
        if fault == "abort_before_start":
            controller.abort("chaos: before start")
            self._expect_refused(plan, lambda: self.service.start(provider, request), "ABORTED")
            return
        if fault in ("provider_fail_before", "provider_fail_after"):
            self._expect_refused(
                plan, lambda: self.service.start(provider, request), "START_FAILED"
            )
            return
        if fault == "abort_during_creation":
            self.creating[gevent.getcurrent()] = controller
            try:
                self._expect_refused(plan, lambda: self.service.start(provider, request), "ABORTED")
            finally:
                self.creating.pop(gevent.getcurrent(), None)
            return
        handle = self.service.start(provider, request)
        self.handles.append(handle)
        if fault in ("abort_mid_step", "abort_mid_tool"):
            plan.gate.wait()
            controller.abort(f"chaos: {fault}")
        elif fault == "cancel_mid_step":
            plan.gate.wait()
            handle.cancel("chaos: cancel")
        elif fault == "dispose_mid_step":
            plan.gate.wait()
            other = gevent.spawn(handle.dispose)
            handle.dispose()
            other.get()
        elif fault == "abort_during_dispose":
            if plan.actions[0] != "hang":
                plan.gate.wait()
            disposer = gevent.spawn(handle.dispose)
            self._yield(plan.yields)
            controller.abort("chaos: during dispose")
            handle.cancel("chaos: cancel during dispose")
            disposer.get()
        elif fault == "steer_race":
            self._yield(plan.yields)
            self._steer(handle, plan)
        elif fault == "steer_admitted":
            plan.gate.wait()
            steering = gevent.spawn(self._steer, handle, plan)
            self._yield(1)
            plan.opened.set()
            steering.get()
        elif fault == "leave_to_close":
            return  # Runtime.close() must dispose it
        handle.result.get()
        handle.dispose()

    def _steer(self, handle: Any, plan: Plan) -> None:
        token = f"steer-{self.seed}-{plan.index}-{len(self.sent)}"
        try:
            handle.steer([text_block(token)], MessageSource.user()).get()
            self.sent.append(Sent(handle.id, token, "steer", True))
        except SubagentError as exc:
            self.sent.append(Sent(handle.id, token, "steer", False, exc.code))

    def _yield(self, n: int) -> None:
        for _ in range(n):
            gevent.sleep(0)

    def _drive_continuable(self, plan: Plan, parent: Any) -> None:
        fault = plan.fault
        controller = AbortController()
        request = self._request(parent, plan, controller.signal)
        if fault == "abort_before_start":
            controller.abort("chaos: before start")
            try:
                self.service.start_continuable("spawn", request, label=f"c{plan.index}")
            except SubagentError as exc:
                if exc.code != "ABORTED":
                    self.violations.append(f"plan {plan.index}: refused {exc.code}, not ABORTED")
                self.stats.starts_refused += 1
                return
            self.violations.append(f"plan {plan.index}: aborted continuable start succeeded")
            return
        if fault == "log_fault":
            self.fault_next_publish[gevent.getcurrent()] = self.rng.randint(1, 2)
        try:
            started = self.service.start_continuable("spawn", request, label=f"c{plan.index}")
        finally:
            self.fault_next_publish.pop(gevent.getcurrent(), None)
        child = started.child_id
        self.continuable[child] = plan
        if fault == "send_race":
            self._yield(plan.yields)
            self._send(parent, child, plan)
            self._send(parent, child, plan)
        elif fault == "send_after":
            self._wait_task(started.task_id)
            self._send(parent, child, plan)
        elif fault == "interrupt":
            plan.gate.wait()
            self.service.interrupt(child, by=parent)
            self._send(parent, child, plan)

    def _wait_task(self, task_id: str) -> None:
        self.runtime.tasks.wait(task_id)

    def _send(self, parent: Any, child: str, plan: Plan) -> None:
        token = f"send-{self.seed}-{plan.index}-{len(self.sent)}"
        try:
            sent = self.service.send_message(
                parent, child, [text_block(token)], MessageSource.coordinator(parent.id)
            )
            self.sent.append(Sent(child, token, "send_message", True, sent.kind))
        except SubagentError as exc:
            self.sent.append(Sent(child, token, "send_message", False, exc.code))

    # -- the run ----------------------------------------------------------------------------

    def run(self) -> None:
        parents = []
        for _ in range(PARENTS):
            parent = self.runtime.agent(options=None)
            self.roots.add(parent.id)
            parent.send("hello").get()  # one completed turn, so a fork has a prefix to seed
            parent.when_idle().get()
            parents.append(parent)
        plans = [self.make_plan(i) for i in range(CHILDREN)]
        pool = gevent.pool.Pool(CONCURRENCY)
        drivers = {plan.index: pool.spawn(self.drive, plan, parents) for plan in plans}
        try:
            pool.join()
        except gevent.exceptions.LoopExit:
            # Every driver waits on something nobody will set: a deadlock. Say where.
            stuck = [(i, g) for i, g in drivers.items() if not g.dead]
            for index, greenlet in stuck[:8]:
                plan = self.plans[index]
                stack = "".join(traceback.format_stack(greenlet.gr_frame)[-6:])
                self.violations.append(
                    f"DEADLOCK plan {index} {plan.kind}/{plan.fault} {plan.actions}:\n{stack}"
                )
            raise AssertionError("\n".join(self.violations)) from None
        self.runtime.close()


# -- invariants ------------------------------------------------------------------------------------


def check_invariants(chaos: Chaos, baseline_greenlets: set[int], actors_before: int) -> None:
    v = chaos.violations
    stats = chaos.stats
    # 1. every subagent/start has exactly one subagent/end, after it.
    starts: dict[str, int] = {}
    ends: dict[str, int] = {}
    for position, event in enumerate(chaos.events):
        if event["type"] == "subagent/start":
            if event["run_id"] in starts:
                v.append(f"run {event['run_id']}: two subagent/start events")
            starts[event["run_id"]] = position
        elif event["type"] == "subagent/end":
            if event["run_id"] in ends:
                v.append(f"run {event['run_id']}: two subagent/end events")
            ends[event["run_id"]] = position
            stats.outcomes[event["stop_reason"]] += 1
    for run_id, position in starts.items():
        if run_id not in ends:
            v.append(f"run {run_id}: subagent/start without subagent/end")
        elif ends[run_id] < position:
            v.append(f"run {run_id}: subagent/end before its subagent/start")
    for run_id in ends:
        if run_id not in starts:
            v.append(f"run {run_id}: subagent/end without subagent/start")
    # one-shot: a start event for exactly the handles start() returned
    one_shot_ids = {e["run_id"] for e in chaos.events if e["type"] == "subagent/start"} - {
        e["run_id"]
        for e in chaos.events
        if e["type"] == "subagent/start" and e["id"] in chaos.continuable
    }
    returned = {h.run_id for h in chaos.handles}
    if one_shot_ids != returned:
        v.append(
            f"one-shot starts: {len(one_shot_ids)} start events vs {len(returned)} handles "
            f"(extra {sorted(one_shot_ids - returned)[:5]}, "
            f"missing {sorted(returned - one_shot_ids)[:5]})"
        )
    # 2. every result resolved
    for handle in chaos.handles:
        if not handle.settled:
            v.append(f"run {handle.run_id}: result never resolved")
            continue
        try:
            handle.result.get(timeout=0)
        except Exception as exc:
            v.append(f"run {handle.run_id}: one-shot result rejected: {exc!r}")
    # 3. restarts: a log-faulted continuable child got at least one more activation
    continuable_runs = Counter(
        e["id"]
        for e in chaos.events
        if e["type"] == "subagent/start" and e["id"] in chaos.continuable
    )
    stats.restarts = sum(max(0, continuable_runs[c] - 1) for c in chaos.log_faulted)
    # 4. quiescence
    if gevent_actor.live_count() != actors_before:
        v.append(f"{gevent_actor.live_count() - actors_before} GeventActor(s) alive after close")
    if chaos.runtime.ctx.agents:
        v.append(f"{len(chaos.runtime.ctx.agents)} agent(s) still registered after close")
    running = [t for t in chaos.runtime.tasks.list() if not t.settled]
    if running:
        v.append(f"{len(running)} task(s) still running after close")
    leaked = live_greenlets() - baseline_greenlets
    if leaked:
        v.append(f"{len(leaked)} greenlet(s) alive after close: {describe_greenlets(leaked)[:5]}")
    if child_processes():
        v.append(f"subprocesses alive after close: {child_processes()}")
    # 5. every session log passes validate_log (a write-faulted one after its repair)
    logs: dict[str, list[Mapping[str, Any]]] = {}
    for header in chaos.store.list():
        sid = header.id
        gevent.sleep(0)  # a thousand loads in a row would block the hub
        try:
            seen = chaos.store.inspect(sid)
            if seen.needs_repair:
                if sid not in chaos.log_faulted:
                    v.append(f"session {sid}: open or torn tail after a clean close")
                stats.repaired_logs += 1
            loaded = chaos.store.load(sid)
            validate_log(loaded.events, loaded.header)
            logs[sid] = list(loaded.events)
            stats.logs_checked += 1
        except Exception as exc:
            v.append(f"session {sid}: log does not load/validate: {exc!r}")
    # 6. every accepted message is in a log, or was reported lost to its sender
    for sent in chaos.sent:
        gevent.sleep(0)
        events = logs.get(sent.child, [])
        accepted = [
            e["data"]["message_id"]
            for e in events
            if e["type"] == "inbox/accepted"
            and any(b.get("text") == sent.token for b in e["data"]["content"])
        ]
        claimed = {e["data"]["message_id"] for e in events if e["type"] == "inbox/claimed"} & set(
            accepted
        )
        seen_by_model = any(
            e["type"] == "user/message"
            and any(b.get("text") == sent.token for b in e["data"]["message"]["content"])
            for e in events
        )
        if sent.ok:
            stats.messages_ok += 1
            if not accepted:
                v.append(f"{sent.how} {sent.token} ({sent.detail}): reported ok, not in the log")
            if sent.detail in ("", "steered") and not (claimed and seen_by_model):
                v.append(f"{sent.how} {sent.token}: reported admitted, never reached the model")
        else:
            stats.messages_lost_reported += 1
            if claimed or seen_by_model:
                v.append(f"{sent.how} {sent.token}: reported lost ({sent.detail}) but delivered")


@pytest.mark.timeout(900)
@pytest.mark.parametrize("seed", SEEDS)
def test_chaos(seed: int, tmp_path: Path) -> None:
    actors_before = gevent_actor.live_count()
    baseline = live_greenlets()
    chaos = Chaos(seed, tmp_path / f"seed-{seed}")
    chaos.run()
    check_invariants(chaos, baseline, actors_before)
    s = chaos.stats
    print(
        f"\nchaos seed={seed} children={CHILDREN} faults={dict(s.faults)} "
        f"actions={dict(s.actions)} outcomes={dict(s.outcomes)} "
        f"refused={s.starts_refused} restarts={s.restarts} "
        f"repaired={s.repaired_logs} logs={s.logs_checked} messages_ok={s.messages_ok} "
        f"messages_lost_reported={s.messages_lost_reported} listener_raises={s.listener_raises} "
        f"violations={len(chaos.violations)}"
    )
    assert not chaos.violations, f"seed {seed}: " + "\n".join(chaos.violations[:40])


@pytest.mark.parametrize(
    ("mode", "max_children", "attempts"),
    [
        ("one-shot", None, 1),
        ("continuable", None, 8),
        ("one-shot", 8, 1),
    ],
    ids=["one-shot", "continuable", "cap-8"],
)
@pytest.mark.parametrize("seed", SEEDS[:2])
def test_close_racing_starts_and_messages(
    seed: int, mode: str, max_children: int | None, attempts: int, tmp_path: Path
) -> None:
    """`Runtime.close()` while starts wait for a slot, run their provider, or just published,
    and while messages are sent: every caller gets a handle or a `SubagentError`, never
    anything else, close() returns, and nothing is left behind."""
    for attempt in range(attempts):
        close_race(seed * 100 + attempt, mode, max_children, tmp_path / str(attempt))


def close_race(seed: int, mode: str, max_children: int | None, root: Path) -> None:
    rng = random.Random(seed)
    actors_before = gevent_actor.live_count()
    baseline = live_greenlets()
    events: list[Mapping[str, Any]] = []
    model = S.ScriptedModel(
        lambda r: rng.choice([S.text("ok"), S.hang(), S.text("ok", latency=0.001)]), record=False
    )
    runtime = Runtime(
        store=SessionStore(root, durability="none"), scripted=model, max_children=max_children
    )
    service = runtime.subagents
    service.register(SpawnProvider())
    service.register(ForkProvider())
    service.subscribe(events.append)
    parent = runtime.agent()
    outcomes: Counter[str] = Counter()
    handles: list[Any] = []

    def one(i: int) -> None:
        request = SubagentStartRequest(
            prompt=[text_block(f"c{i}")], parent=parent, signal=AbortController().signal
        )
        try:
            if mode == "continuable" and i % 3 == 2:
                started = service.start_continuable("spawn", request, label=f"c{i}")
                service.send_message(
                    parent, started.child_id, [text_block("more")], MessageSource.user()
                )
            else:
                handles.append(service.start("fork" if i % 3 else "spawn", request))
            outcomes["ok"] += 1
        except SubagentError as exc:
            outcomes[exc.code] += 1
        except Exception as exc:
            outcomes[f"{type(exc).__name__}: {exc}"] += 1

    greenlets = [gevent.spawn(one, i) for i in range(60)]
    for _ in range(rng.randint(0, 40)):
        gevent.sleep(0)
    closer = gevent.spawn(runtime.close)
    try:
        gevent.joinall([closer, *greenlets])
    except gevent.exceptions.LoopExit:
        stuck = [g for g in greenlets if not g.dead]
        for ref in gevent_actor.live_actors():
            gevent_actor.kill(ref)
        gevent.killall([closer, *stuck])
        pytest.fail(
            f"seed {seed}: close() {'returned' if closer.successful() else 'never returned'}, "
            f"{len(stuck)} of {len(greenlets)} callers never returned"
        )
    closer.get()
    unexpected = {k: v for k, v in outcomes.items() if k not in ("ok", *SUBAGENT_CODES)}
    assert unexpected == {}, f"close racing starts raised {unexpected} (all: {dict(outcomes)})"
    starts = [e["run_id"] for e in events if e["type"] == "subagent/start"]
    ends = [e["run_id"] for e in events if e["type"] == "subagent/end"]
    assert sorted(starts) == sorted(ends) and len(set(starts)) == len(starts)
    assert all(h.settled for h in handles)
    assert gevent_actor.live_count() == actors_before
    assert live_greenlets() - baseline == set(), describe_greenlets(live_greenlets() - baseline)
    print(f"\nclose racing starts, seed {seed}: {dict(outcomes)}")


SUBAGENT_CODES = ("RUNTIME_CLOSED", "START_FAILED", "ABORTED", "RUN_DISPOSED", "RUN_TERMINAL")
