"""`subagent demo`: a coordinator on the scripted model fans out to N children, offline.

Everything a reader should see happens through the model-facing tools: the coordinator's first
step delegates to every child at once (foreground calls over `spawn` and `fork`, plus one
continuable background child), a later step interrupts the continuable child and a follow-up
`send_message` resumes it from its stored session. The operator (this module, standing in for
a person at the keyboard) steers one child mid-run and cancels another; one child's model
adapter raises, and the crash is contained as that child's `error` result.

Determinism: every choice comes from `random.Random(seed)` and every wait is on an event, so a
fixed seed gives the same final tree and summary (child ids and times differ; the views show
labels and leave times out of the final capture).
"""

from __future__ import annotations

import random
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gevent.event import Event

from agent import tracing
from agent.model import ModelRequest
from agent.models import scripted as S
from agent.store import SessionStore
from agent.tools import Tool, ToolContext
from providers.inprocess import ForkProvider, SpawnProvider
from subagent.cli.quiet import Quiescence
from subagent.cli_tree import TreeModel
from subagent.runtime import Runtime
from subagent.service import SteerableRunHandle
from subagent.tools import SubagentToolConfig, install_subagent_tools
from subagent.types import MessageSource
from supervision.group import TaskGroup

if TYPE_CHECKING:
    from agent.loop import TurnOutcome
    from subagent.service import RunHandle

__all__ = ["ChildPlan", "Demo", "plan_children"]

TOPICS = (
    "cache eviction",
    "retry budgets",
    "log compaction",
    "shard placement",
    "token limits",
    "queue backpressure",
    "schema drift",
    "lease renewal",
)
WORK_TOOLS = ("lookup", "read_notes", "tally")
STEER_TEXT = "Operator: please also rate the risk from 1 to 5."
_CHILD_ID = re.compile(r"continuable subagent (\S+) ")


@dataclass
class ChildPlan:
    """What one child (or grandchild) will do, decided up front from the seed."""

    label: str
    role: str  # work | steer | crash | cancel | continuable | lead | grandchild
    provider: str
    topic: str
    tools: list[str] = field(default_factory=list)
    grandchild: ChildPlan | None = None

    @property
    def prompt(self) -> str:
        return f"{self.label}: investigate {self.topic} and report one finding."

    @property
    def tool_name(self) -> str:
        return "subagent" if self.provider == "spawn" else "subagent_fork"


def plan_children(count: int, seed: int) -> list[ChildPlan]:
    """Roles: one each of steer, crash, continuable, cancel and lead (as many as fit)."""
    if count < 1:
        raise ValueError("--children must be at least 1")
    rng = random.Random(seed)
    specials = ["steer", "crash", "continuable", "cancel", "lead"][:count]
    roles = specials + ["work"] * (count - len(specials))
    rng.shuffle(roles)
    plans = []
    for i, role in enumerate(roles, start=1):
        provider = "spawn" if role == "continuable" else rng.choice(("spawn", "fork"))
        tools = [rng.choice(WORK_TOOLS) for _ in range(rng.randint(1, 3))]
        plan = ChildPlan(f"worker-{i:02d}", role, provider, rng.choice(TOPICS), tools)
        if role == "lead":
            plan.grandchild = ChildPlan(
                f"worker-{i:02d}.1", "grandchild", "spawn", rng.choice(TOPICS), [tools[0]]
            )
        plans.append(plan)
    return plans


def _user_texts(request: ModelRequest) -> list[str]:
    out = []
    for message in request.messages:
        if message.get("role") == "user":
            out.append("".join(b.get("text", "") for b in message.get("content", ())))
    return out


class Demo:
    """One demo run: build with `Demo(...)`, drive with `run()`, then read `tree`."""

    def __init__(
        self,
        store_root: str,
        *,
        children: int = 8,
        seed: int = 0,
        hold: bool = False,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self.hold = hold
        self.plans = plan_children(children, seed)
        self.by_prompt: dict[str, ChildPlan] = {}
        for plan in self.plans:
            self.by_prompt[plan.prompt] = plan
            if plan.grandchild is not None:
                self.by_prompt[plan.grandchild.prompt] = plan.grandchild
        self.by_session: dict[str, ChildPlan] = {}
        self.gates: dict[str, Event] = {}
        self.continuable_waiting = Event()
        self.continuable_id: str | None = None
        self.final_text = ""
        self.on_change = on_change
        # The operator's greenlets (one per steered or cancelled child); `close` ends them.
        self.operators = TaskGroup("demo-operators")
        self.model = S.ScriptedModel(self._respond, record=False)
        self.runtime = Runtime(store=SessionStore(store_root), scripted=self.model)
        service = self.runtime.subagents
        service.register(SpawnProvider())
        service.register(ForkProvider())
        for tool in self._work_tools():
            self.runtime.ctx.tools.register(tool)
        install_subagent_tools(
            self.runtime,
            tools=[
                SubagentToolConfig("spawn", name="subagent", background="continuable"),
                SubagentToolConfig("fork", name="subagent_fork"),
            ],
        )
        self.root = self.runtime.agent()
        self.tree = TreeModel(self.runtime.ctx, self.root.id, "coordinator")
        self._detach = self.tree.attach(service, self.root)
        service.subscribe_progress(self._operator)

    # -- the run -----------------------------------------------------------------------------

    @property
    def grandchildren(self) -> int:
        """How many grandchildren the plan has (the tree shows children and grandchildren)."""
        return sum(1 for plan in self.plans if plan.grandchild is not None)

    def run(self) -> TurnOutcome | None:
        """Drive the coordinator until it and every child it started are settled; returns its
        last turn outcome (ended early when the coordinator's own log failed)."""
        with tracing.root_span("subagent demo", {"subagent.children": len(self.plans)}):
            coordinator = tracing.ambient("coordinator")  # the trace's root: every turn under it
            self.root.send(f"Coordinate {len(self.plans)} workers.", trace=coordinator).get()
            # Wakes on events only; the barrier (a registry round trip) delivers every lifecycle
            # event told so far before the tree is read.
            service = self.runtime.subagents
            return Quiescence(
                self.root, self.runtime.tasks, barrier=service.providers, runs=service.runs
            ).wait()

    def cancel_all(self, reason: str) -> list[str]:
        """Ctrl-C: cancel the coordinator's turn (which cancels its children) and every task."""
        stopped = [self.tree.label(n) for n in self.tree.running()]
        self.root.cancel(reason)
        for task in self.runtime.tasks.list():
            if not task.settled:
                self.runtime.tasks.kill(task.id, reason)
        return stopped

    def close(self) -> None:
        self._detach()
        self.runtime.close()
        self.operators.close()

    # -- tools the children use ---------------------------------------------------------------

    def _work_tools(self) -> list[Tool]:
        def work(name: str) -> Tool:
            def fn(arguments: Mapping[str, Any], ctx: ToolContext) -> str:
                return f"{name}({arguments.get('topic', '')}): nothing alarming"

            return Tool(
                name=name,
                description=f"Demo tool: {name} a topic.",
                parameters={"type": "object", "properties": {"topic": {"type": "string"}}},
                fn=fn,
                concurrency_safe=True,
            )

        def await_guidance(arguments: Mapping[str, Any], ctx: ToolContext) -> str:
            gate = self.gates.setdefault(ctx.session_id, Event())
            remove = ctx.signal.add_listener(lambda reason: gate.set())
            try:
                gate.wait()
            finally:
                remove()
            ctx.signal.raise_if_aborted()
            return "guidance received"

        def long_task(arguments: Mapping[str, Any], ctx: ToolContext) -> str:
            self.continuable_waiting.set()
            ctx.signal.wait()
            ctx.signal.raise_if_aborted()
            return "unreachable"

        empty = {"type": "object", "properties": {}}
        return [
            *(work(n) for n in WORK_TOOLS),
            Tool("await_guidance", "Wait for the operator.", empty, await_guidance),
            Tool("long_task", "A task that runs until stopped.", empty, long_task),
        ]

    # -- the operator: steers one child, cancels another ---------------------------------------

    def _operator(self, event: Mapping[str, Any]) -> None:
        if event.get("kind") != "tool/call" or event.get("name") != "await_guidance":
            return
        agent_id = str(event.get("agent_id"))
        plan = self.by_session.get(agent_id)
        if plan is not None:
            self.operators.spawn(self._operate, agent_id, plan)

    def _handle(self, agent_id: str) -> RunHandle | None:
        for handle in self.runtime.subagents.runs():
            if handle.id == agent_id:
                return handle
        return None

    def _operate(self, agent_id: str, plan: ChildPlan) -> None:
        handle = self._handle(agent_id)
        if handle is None:
            return
        if plan.role == "cancel" and self.hold:
            # Test hook for Ctrl-C: this child waits until the operator interrupts everything.
            sys.stderr.write("demo: holding; press Ctrl-C\n")
            sys.stderr.flush()
            return
        if plan.role == "cancel":
            self.tree.note(agent_id, "cancelled by operator")
            handle.cancel("cancelled by the operator")
            return
        # Open the gate only once the steer waits in the child's queue: then the very next
        # step boundary admits it, whatever the scheduling. A settled run refuses the steer at
        # once, which opens the gate too.
        agent = handle.local_agent
        if agent is None or not isinstance(handle, SteerableRunHandle):
            raise TypeError(f"the demo steers only its own in-process children, not {handle!r}")
        queued = Event()
        remove = agent.add_steer_listener(lambda _message_id: queued.set())
        try:
            admitted = handle.steer(STEER_TEXT, MessageSource.user())
            admitted.add_done_callback(lambda _f: queued.set())
            queued.wait()
        finally:
            remove()
        self.gates.setdefault(agent_id, Event()).set()
        try:
            admitted.get()
            self.tree.note(agent_id, "steered")
        except Exception:
            self.tree.note(agent_id, "steer refused")

    # -- the scripted model --------------------------------------------------------------------

    def _respond(self, request: ModelRequest) -> S.Step | str:
        if self.on_change is not None:
            self.on_change()
        if request.session_id == self.root.id:
            return self._coordinator(request)
        plan = self.by_session.get(request.session_id)
        if plan is None:
            texts = _user_texts(request)
            plan = next((self.by_prompt[t] for t in texts if t in self.by_prompt), None)
            if plan is None:
                return S.text("I have no task.")
            self.by_session[request.session_id] = plan
        return self._child(plan, request)

    def _coordinator(self, request: ModelRequest) -> S.Step | str:
        last = request.messages[-1]
        if request.turn > 1:
            return S.text("Noted.")
        if request.step == 1:
            calls = []
            for plan in self.plans:
                args: dict[str, Any] = {"description": plan.label, "prompt": plan.prompt}
                if plan.role == "continuable":
                    args["run_in_background"] = True
                calls.append((plan.tool_name, args))
            return S.tool_calls(calls, text=f"Fanning out to {len(calls)} workers.")
        if last.get("role") == "tool" and self.continuable_id is None:
            for message in request.messages:
                if message.get("role") == "tool":
                    text = "".join(b.get("text", "") for b in message.get("content", ()))
                    found = _CHILD_ID.search(text)
                    if found:
                        self.continuable_id = found.group(1)
        cid = self.continuable_id
        if cid is not None and last.get("name") in ("subagent", "subagent_fork"):
            self.continuable_waiting.wait()
            self.tree.note(cid, "interrupted")
            return S.tool_call("interrupt_agent", {"agent_id": cid})
        if cid is not None and last.get("name") == "interrupt_agent":
            return S.tool_call(
                "send_message", {"subagent_id": cid, "message": "Wrap up with what you have."}
            )
        delegations = [
            m
            for m in request.messages
            if m.get("role") == "tool" and m.get("name") in ("subagent", "subagent_fork")
        ]
        failed = sum(1 for m in delegations if m.get("is_error"))
        self.final_text = (
            f"{len(delegations) - failed} of {len(self.plans)} workers reported; "
            f"{failed} failed or were stopped."
        )
        return S.text(self.final_text)

    def _child(self, plan: ChildPlan, request: ModelRequest) -> S.Step | str:
        step = request.step
        answer = f"{plan.label}: {plan.topic} looks healthy."
        if plan.role == "continuable":
            if request.turn == 1:
                return S.tool_call("long_task", {})
            return S.text(f"{plan.label}: resumed and wrapped up {plan.topic}.")
        if plan.role in ("steer", "cancel"):
            if step == 1:
                return S.tool_call("await_guidance", {})
            texts = _user_texts(request)
            steered = any(t == STEER_TEXT for t in texts)
            return S.text(f"{answer} Risk: 2/5." if steered else answer)
        if plan.role == "lead" and plan.grandchild is not None:
            if step == 1:
                g = plan.grandchild
                return S.tool_call("subagent", {"description": g.label, "prompt": g.prompt})
            return S.text(f"{answer} (with help from {plan.grandchild.label})")
        if step <= len(plan.tools):
            return S.tool_call(plan.tools[step - 1], {"topic": plan.topic})
        if plan.role == "crash":
            self.tree.note(request.session_id, "crashed, contained")
            raise RuntimeError(f"{plan.label}: simulated adapter bug")
        return S.text(answer)
