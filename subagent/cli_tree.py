"""The live tree the CLI draws: a model fed by lifecycle and progress events, and its views.

The model only records what events say; rendering reads it. Both run on the gevent hub, so
the model needs no locks (rich's own refresh thread is never used: the CLI refreshes from a
greenlet). Children are ordered by label, then id, so a finished tree renders the same way
every time; elapsed times appear only when asked for (the live view), never in a final capture.
Every string a model chose (labels, tool names, notes) is shown as data (`cli/text.py`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from agent.usage import add_usage, total_tokens
from subagent.cli.text import data, shown
from subagent.tools.delegate import child_labels

if TYPE_CHECKING:  # annotations only: each command imports what it uses when it runs
    from actors.agent_handle import Agent
    from agent.context import AgentContext
    from agent.loop import TurnOutcome
    from subagent.service import SubagentService

__all__ = ["Node", "TreeModel"]

_STYLES = {
    "running": "bold cyan",
    "idle": "cyan",
    "starting": "dim",
    "completed": "green",
    "aborted": "yellow",
    "error": "bold red",
    "max-tokens": "magenta",
    "refusal": "magenta",
    "budget-exceeded": "magenta",
    "unknown": "red",
}


@dataclass
class Node:
    id: str
    parent_id: str | None
    provider: str
    started: float
    label: str | None = None
    status: str = "starting"
    turn: int = 0
    step: int = 0
    steps: int = 0
    tools: int = 0
    last_tool: str | None = None
    activations: int = 0
    ended: float | None = None
    notes: list[str] = field(default_factory=list)
    # This agent's own token usage, summed from its model responses' progress events.
    usage: dict[str, int] = field(default_factory=dict)

    @property
    def live(self) -> bool:
        return self.status in ("starting", "running", "idle")


class TreeModel:
    """Every agent under one root, as the events describe it."""

    def __init__(
        self,
        ctx: AgentContext,
        root_id: str,
        root_label: str = "root",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ctx = ctx
        self._clock = clock
        self.root_id = root_id
        self.nodes: dict[str, Node] = {
            root_id: Node(root_id, None, "-", clock(), label=root_label, status="idle")
        }
        self.changes = 0
        # Infrastructure faults (a log write failed), as `label: cause`, in the order seen.
        self.faults: list[str] = []

    def attach(self, service: SubagentService, root: Agent) -> Callable[[], None]:
        """Subscribe to the service and the root agent; returns the detach function."""
        removers = [
            service.subscribe(self.on_lifecycle),
            service.subscribe_progress(self.on_progress),
            root.add_progress_listener(self.on_progress),
        ]

        def detach() -> None:
            for remove in removers:
                with contextlib.suppress(Exception):
                    remove()

        return detach

    # -- events ------------------------------------------------------------------------------

    def on_lifecycle(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        child_id = str(event.get("id"))
        if kind == "subagent/start":
            node = self.nodes.get(child_id)
            if node is None:
                node = self.nodes[child_id] = Node(
                    child_id, event.get("parent_id"), str(event.get("provider")), self._clock()
                )
            elif node.activations >= 1:
                node.notes.append("resumed")
                node.started = self._clock()
            node.provider = str(event.get("provider"))
            node.activations += 1
            node.status = "running"
            node.ended = None
        elif kind == "subagent/end":
            node = self.nodes.get(child_id)
            if node is None:
                return
            stop = str(event.get("stop_reason"))
            node.status = stop
            node.ended = self._clock()
            if "failure" in event:
                node.notes.append("infrastructure fault")
                self.faults.append(f"{self.label(node)}: {event['failure']}")
        self.changes += 1

    def on_progress(self, event: Mapping[str, Any]) -> None:
        agent_id = str(event.get("agent_id"))
        node = self.nodes.get(agent_id)
        if node is None:
            node = self._adopt(agent_id)
            if node is None:
                return
        kind = event.get("kind")
        if kind == "turn/start":
            node.turn = int(event.get("turn", 0))
            node.step = 0
            node.status = "running"
        elif kind == "step/start":
            node.step = int(event.get("step", 0))
            node.steps += 1
        elif kind == "tool/call":
            node.tools += 1
            node.last_tool = str(event.get("name"))
        elif kind == "assistant/message":
            usage = event.get("usage")
            if isinstance(usage, Mapping):
                add_usage(node.usage, usage)
        elif kind == "turn/end" and node.id == self.root_id:
            node.status = "idle"
        self.changes += 1

    def _adopt(self, agent_id: str) -> Node | None:
        """A child's first progress can precede its `subagent/start`: take it from ctx.agents."""
        agent = self._ctx.agents.get(agent_id)
        header = getattr(agent, "header", None)
        parent = getattr(header, "parent_session", None)
        if parent is None or parent not in self.nodes:
            return None
        node = self.nodes[agent_id] = Node(agent_id, parent, "?", self._clock(), status="running")
        return node

    def note(self, agent_id: str, text: str) -> None:
        node = self.nodes.get(agent_id)
        if node is not None and text not in node.notes:
            node.notes.append(text)
            self.changes += 1

    def finish(self, outcome: TurnOutcome | None) -> None:
        """Once the run is over (the wait returned, every child's end delivered): the root
        shows how its last turn ended, and a child whose end never arrived shows `unknown`,
        never a stale `running`."""
        root = self.nodes[self.root_id]
        if outcome is not None and outcome.fault is not None:
            root.status = "error"
            root.notes.append("log write failed")
        elif root.live:
            root.status = "idle"
        for node in self.descendants():
            if node.live:
                node.status = "unknown"
                node.notes.append("end not seen")
        self.changes += 1

    # -- reading -----------------------------------------------------------------------------

    def label(self, node: Node) -> str:
        if node.label:
            return node.label
        found = child_labels(self._ctx).get(node.id)
        return found or node.id

    def children(self, parent_id: str) -> list[Node]:
        kids = [n for n in self.nodes.values() if n.parent_id == parent_id]
        return sorted(kids, key=lambda n: (self.label(n), n.id))

    def descendants(self) -> list[Node]:
        """Depth-first, in the tree's order."""
        out: list[Node] = []

        def walk(parent_id: str) -> None:
            for kid in self.children(parent_id):
                out.append(kid)
                walk(kid.id)

        walk(self.root_id)
        return out

    def running(self) -> list[Node]:
        return [n for n in self.descendants() if n.live]

    def subtree_tokens(self, node: Node) -> int:
        """Tokens the node and every node below it spent (as far as the events told)."""
        total = total_tokens(node.usage)
        for kid in self.children(node.id):
            total += self.subtree_tokens(kid)
        return total

    def elapsed(self, node: Node) -> float:
        return (node.ended if node.ended is not None else self._clock()) - node.started

    # -- views -------------------------------------------------------------------------------

    def _line(self, node: Node, times: bool) -> Text:
        # Labels, provider names, tool names and notes can come from a model: data only.
        text = Text()
        text.append(shown(self.label(node), one_line=True), style="bold")
        if node.id != self.root_id:
            text.append(f" [{shown(node.provider, one_line=True)}]", style="dim")
        text.append(" ")
        text.append(shown(node.status, one_line=True), style=_STYLES.get(node.status, "red"))
        text.append(f"  turn {node.turn} step {node.step}")
        if node.last_tool:
            text.append(f"  tool {shown(node.last_tool, one_line=True)}", style="dim")
        tokens = self.subtree_tokens(node)
        if tokens:
            text.append(f"  {tokens:,} tok", style="dim")
        if node.notes:
            notes = ", ".join(shown(n, one_line=True) for n in node.notes)
            text.append(f"  ({notes})", style="italic")
        if times:
            text.append(f"  {self.elapsed(node):.1f}s", style="dim")
        return text

    def render(self, *, times: bool = False) -> Tree:
        root = self.nodes[self.root_id]
        tree = Tree(self._line(root, times), guide_style="dim")

        def add(branch: Tree, parent_id: str) -> None:
            for kid in self.children(parent_id):
                add(branch.add(self._line(kid, times)), kid.id)

        add(tree, self.root_id)
        return tree

    def summary(self) -> Table:
        table = Table(title="Summary", title_justify="left")
        for column in ("agent", "provider", "outcome", "turns", "steps", "tools", "notes"):
            justify = "right" if column in ("turns", "steps", "tools") else "left"
            table.add_column(column, justify=justify)  # type: ignore[arg-type]
        for node in self.descendants():
            table.add_row(
                data(self.label(node), one_line=True),
                data(node.provider, one_line=True),
                data(node.status, _STYLES.get(node.status, "red"), one_line=True),
                str(node.turn),
                str(node.steps),
                str(node.tools),
                data(", ".join(node.notes), one_line=True),
            )
        return table

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for node in self.descendants():
            out[node.status] = out.get(node.status, 0) + 1
        return dict(sorted(out.items()))
