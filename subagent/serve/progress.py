"""Children's lifecycle and progress events as one-line texts for a protocol client.

Both servers show a client what the children do: MCP as `notifications/progress` messages, ACP
as tool-call updates. The text is built from event fields only (ids, kinds, tool names, stop
reasons), never by interpreting model output; `model/chunk` events are too fine-grained to
forward and are skipped.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from actors.agent_handle import Agent

if TYPE_CHECKING:
    from subagent.service import SubagentService

__all__ = ["ChildFeed", "describe"]

_SKIP = frozenset({"model/chunk", "assistant/message"})


def describe(event: Mapping[str, Any], labels: Mapping[str, str]) -> str | None:
    """One line for a lifecycle or progress event, or None for one not worth a message."""
    kind = event.get("type") or event.get("kind")
    who = str(event.get("id") or event.get("agent_id") or "?")
    label = labels.get(who)
    name = f"{who} ({label})" if label else who
    if kind == "subagent/start":
        return f"{name}: started on {event.get('provider')}"
    if kind == "subagent/end":
        extra = f": {event['failure']}" if event.get("failure") else ""
        return f"{name}: ended {event.get('stop_reason')}{extra}"
    if kind in _SKIP:
        return None
    if kind == "turn/start":
        return f"{name}: turn {event.get('turn')} started"
    if kind == "step/start":
        return f"{name}: step {event.get('step')}"
    if kind == "tool/call":
        return f"{name}: calls {event.get('name')}"
    if kind == "tool/result":
        return f"{name}: {event.get('name')} {'failed' if event.get('is_error') else 'returned'}"
    if isinstance(kind, str) and kind.startswith("remote/"):  # an ACP child's own update
        title = event.get("title")
        return f"{name}: {kind[len('remote/') :]}" + (f" {title}" if title else "")
    if kind == "turn/end":
        return f"{name}: turn {event.get('turn')} ended {event.get('reason')}"
    return None


class ChildFeed:
    """Every event of the agents below `root_id`, fanned out to the sinks added with `add`.

    Subscribed once, before any child starts: the service attaches its progress relay to a child
    only when someone listens at the child's publication. Lifecycle events name their parent;
    progress events are attributed by walking the live agents' parent links, so a grandchild's
    steps count too.
    """

    def __init__(
        self, service: SubagentService, agents: Mapping[str, object], root_id: str
    ) -> None:
        self._agents = agents
        self._root = root_id
        self._known: set[str] = set()
        self._sinks: list[Callable[[Mapping[str, Any]], None]] = []
        self._removers = [
            service.subscribe(self._on_lifecycle),
            service.subscribe_progress(self._on_progress),
        ]

    def add(self, sink: Callable[[Mapping[str, Any]], None]) -> Callable[[], None]:
        """Forward events to `sink` from now on; returns the remover."""
        self._sinks.append(sink)

        def remove() -> None:
            if sink in self._sinks:
                self._sinks.remove(sink)

        return remove

    def _deliver(self, event: Mapping[str, Any]) -> None:
        for sink in list(self._sinks):
            sink(event)

    def _below_root(self, agent_id: str) -> bool:
        seen = 0
        current: str | None = agent_id
        while current is not None and seen < 64:
            if current in self._known:
                return True
            agent = self._agents.get(current)
            if isinstance(agent, Agent):  # `ctx.agents` holds the face's agents only
                parent = agent.header.parent_session
            else:
                # A remote child (ACP, Ray) has a parent-scoped id, `<parent id>.<suffix>`: its
                # first updates may arrive before its `subagent/start` has been delivered.
                parent = current.rpartition(".")[0] or None
            if parent == self._root:
                return True
            current, seen = parent, seen + 1
        return False

    def _on_lifecycle(self, event: Mapping[str, Any]) -> None:
        parent = event.get("parent_id")
        # `_below_root`, not only the known set: a grandchild's start can be delivered before
        # its parent's (the child works while it is being published).
        if parent == self._root or (isinstance(parent, str) and self._below_root(parent)):
            self._known.add(str(event.get("id")))
            self._deliver(event)

    def _on_progress(self, event: Mapping[str, Any]) -> None:
        agent_id = event.get("agent_id")
        if isinstance(agent_id, str) and agent_id != self._root and self._below_root(agent_id):
            self._deliver(event)

    def close(self) -> None:
        self._sinks.clear()
        while self._removers:
            self._removers.pop()()
