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
    from actors.registry_actor import LifecycleEvent
    from subagent.service import SubagentService

__all__ = ["CallFeed", "ChildFeed", "describe"]

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


class CallFeed:
    """The events of the children one call claimed (and their descendants), for that call only.

    Made by `ChildFeed.add_call`; the call names each child it starts with `claim` and ends with
    `close`.
    """

    def __init__(self, feed: ChildFeed, sink: Callable[[Mapping[str, Any]], None]) -> None:
        self._feed = feed
        self.sink = sink
        self._closed = False

    def claim(self, child_id: str) -> None:
        """`child_id` (a child of the feed's root) is this call's: its events come here, until
        the call ends (to every open call that claimed it)."""
        self._feed.claim(self, child_id)

    def close(self) -> None:
        """Stop: the call is over; its children's later events reach no call. Idempotent."""
        if not self._closed:
            self._closed = True
            self._feed.release(self)


class ChildFeed:
    """Every event of the agents below `root_id`, fanned out to the sinks added with `add`, and
    per call to the `CallFeed`s made with `add_call` (each sees only the children it claimed).

    Subscribed once, before any child starts: the service attaches its progress relay to a child
    only when someone listens at the child's publication. Lifecycle events name their parent;
    progress events are attributed by walking the live agents' parent links, so a grandchild's
    steps count too.

    A child's first events can arrive before the call that started it has claimed it (the child
    works while it is being published): they wait, a bounded number, for the claim.
    """

    MAX_WAITING_CHILDREN = 64
    MAX_WAITING_EVENTS = 256  # per child

    def __init__(
        self, service: SubagentService, agents: Mapping[str, object], root_id: str
    ) -> None:
        self._agents = agents
        self._root = root_id
        self._parents: dict[str, str] = {}  # agents below the root whose start was delivered
        self._sinks: list[Callable[[Mapping[str, Any]], None]] = []
        # A child of the root -> the open calls that claimed it (started, woke or wait on it).
        self._owners: dict[str, list[CallFeed]] = {}
        self._claimed: set[str] = set()  # children of the root some call claimed at least once
        self._waiting: dict[str, list[Mapping[str, Any]]] = {}  # unclaimed children's events
        self._open_calls = 0  # events wait for a claim only while some call could make it
        self._removers = [
            service.subscribe(self._on_lifecycle),
            service.subscribe_progress(self._on_progress),
        ]

    def add(self, sink: Callable[[Mapping[str, Any]], None]) -> Callable[[], None]:
        """Forward every child's events to `sink` from now on; returns the remover."""
        self._sinks.append(sink)

        def remove() -> None:
            if sink in self._sinks:
                self._sinks.remove(sink)

        return remove

    def add_call(self, sink: Callable[[Mapping[str, Any]], None]) -> CallFeed:
        """A feed of only the children the call claims (see `CallFeed`)."""
        self._open_calls += 1
        return CallFeed(self, sink)

    def claim(self, call: CallFeed, child_id: str) -> None:
        """Route `child_id`'s events (and its descendants') to `call` too, the waiting ones
        first."""
        owners = self._owners.setdefault(child_id, [])
        if call not in owners:
            owners.append(call)
        self._claimed.add(child_id)
        for event in self._waiting.pop(child_id, ()):
            call.sink(event)

    def release(self, call: CallFeed) -> None:
        """The children `call` claimed belong to no call any more."""
        for child_id, owners in list(self._owners.items()):
            if call in owners:
                owners.remove(call)
                if not owners:
                    del self._owners[child_id]
        self._open_calls -= 1
        if not self._open_calls:
            self._waiting.clear()  # no call open: none of them will be claimed

    def _deliver(self, top: str, event: Mapping[str, Any]) -> None:
        for sink in list(self._sinks):
            sink(event)
        owners = self._owners.get(top)
        if owners:
            for owner in list(owners):
                owner.sink(event)
        elif self._open_calls and top not in self._claimed:
            waiting = self._waiting.get(top)
            if waiting is None:
                if len(self._waiting) >= self.MAX_WAITING_CHILDREN:
                    del self._waiting[next(iter(self._waiting))]  # the oldest waits no more
                waiting = self._waiting[top] = []
            if len(waiting) < self.MAX_WAITING_EVENTS:
                waiting.append(event)

    def _top(self, agent_id: str) -> str | None:
        """The child of the root that `agent_id` descends from (itself, for a child), or None
        when it is not below the root."""
        seen = 0
        current = agent_id
        while seen < 64:
            parent = self._parents.get(current)
            if parent is None:
                agent = self._agents.get(current)
                if isinstance(agent, Agent):  # `ctx.agents` holds the face's agents only
                    parent = agent.header.parent_session
                else:
                    # A remote child (ACP, Ray) has a parent-scoped id, `<parent id>.<suffix>`:
                    # its first updates may arrive before its `subagent/start` is delivered.
                    parent = current.rpartition(".")[0] or None
            if parent is None:
                return None
            if parent == self._root:
                return current
            current, seen = parent, seen + 1
        return None

    def _on_lifecycle(self, event: LifecycleEvent) -> None:
        if "parent_id" not in event:  # a provider added or removed: about no child
            return
        parent, child = event["parent_id"], event["id"]
        # `_top`, not only the known links: a grandchild's start can be delivered before its
        # parent's (the child works while it is being published).
        top = child if parent == self._root else self._top(parent)
        if top is not None:
            self._parents[child] = parent
            self._deliver(top, event)

    def _on_progress(self, event: Mapping[str, Any]) -> None:
        agent_id = event.get("agent_id")
        if isinstance(agent_id, str) and agent_id != self._root:
            top = self._top(agent_id)
            if top is not None:
                self._deliver(top, event)

    def close(self) -> None:
        self._sinks.clear()
        self._owners.clear()
        self._waiting.clear()
        while self._removers:
            self._removers.pop()()
