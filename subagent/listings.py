"""Listings of subagent children: rows built from the session store and the live agents.

Split from the continuation lifecycle (`subagent.continuation`) so a reader of a store needs no
runtime: `subagent ls` and `subagent tree` build a `Listings` over the store alone, while a
runtime's service builds one over its live agents too, plus the continuation manager's view of
its live activations (`ActivationView`: a remote child has no local agent to ask).

Rows are live-preferred: a live agent's own header and status override the stored ones. A run
that has neither (a one-shot ACP child: a remote process, no log in this store) is listed from
the service's view of its remote runs (`RemoteRunView`): `running` while the run table holds
it, then `ended` for as long as a settled task stays readable. A parent told a child's id sees
that child in every listing after, whichever provider runs it. A one-shot Ray child's log is in
the shared store under its host's session id: it is listed once, under its run id.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import NotRequired, Protocol, TypedDict

from agent.events import Event, SessionHeader, SessionLogError
from agent.frames import CorruptSessionError
from agent.log import SessionLog, events_of_types
from agent.usage import PICO, UsageAccount, add_usage, cost_of_events, pico_to_usd, usage_of_events
from subagent.descriptor import (
    DESCRIPTOR_EVENT,
    DescriptorError,
    SubagentDescriptor,
    Unclassifiable,
    authoritative_descriptor,
)

__all__ = [
    "Activation",
    "ActivationView",
    "ChildRow",
    "ListedAgent",
    "ListingStore",
    "Listings",
    "RemoteRun",
    "RemoteRunView",
    "add_subtree_usage",
]

log = logging.getLogger(__name__)
_DESCRIPTOR_ONLY = frozenset({DESCRIPTOR_EVENT})


@dataclass(frozen=True, slots=True)
class Activation:
    """What the continuation manager knows of a child it tracks: its label, and whether an
    activation of it is running now (known for a remote child only this way)."""

    label: str
    running: bool


# The continuation manager's answer for one child id, or None for a child it does not track.
ActivationView = Callable[[str], Activation | None]


@dataclass(frozen=True, slots=True)
class RemoteRun:
    """A run with no local agent (ACP, Ray), as the service knows it: live (its run table) or
    ended (kept as long as a settled task is). It is listed from this when the store holds no
    log under its id."""

    id: str
    parent_id: str
    created_at: float  # epoch seconds, like a header's
    # The id of its log in this store when that is not the run's id (a one-shot Ray child's
    # host session): that log is the same child, listed under the id its parent was told.
    session_id: str | None = None
    ended: bool = False


# The remote runs, every parent's: the service's run table, then the ended ones it keeps.
RemoteRunView = Callable[[], Sequence[RemoteRun]]


class _Loaded(Protocol):
    """A stored session as `inspect` reads it (`agent.store.LoadedSession`)."""

    @property
    def events(self) -> Sequence[Event]: ...

    @property
    def header(self) -> SessionHeader: ...


class ListingStore(Protocol):
    """The part of a session store a listing reads."""

    def list(self) -> Sequence[SessionHeader]: ...

    def inspect(self, session_id: str) -> _Loaded: ...

    def is_held(self, session_id: str) -> bool: ...


class ChildRow(TypedDict):
    """One child as `list_children` / `list_descendants` report it (docs/events.md, "Child
    rows"). `mode` is `one-shot`, `continuable` or `unknown` (an unreadable log, which then
    has an `error`); `activity` is `running`, `idle`, `stored`, `ended` (a remote one-shot
    child's run ended, nothing of it stored here), `running elsewhere`, or a diagnostic.
    Token and cost fields are there when the child's spend is known."""

    id: str
    parent_id: str | None
    depth: int
    created_at: float
    has_children: bool
    mode: str
    label: str | None
    activity: str
    usage: NotRequired[dict[str, int]]
    cost_usd: NotRequired[float]
    error: NotRequired[str]
    # `list_descendants` only: the child's own spend plus every listed descendant's.
    subtree_usage: NotRequired[dict[str, int]]
    subtree_cost_usd: NotRequired[float]


class ListedAgent(Protocol):
    """What a listing reads of a live agent (`actors.agent_handle.Agent`): its own header
    overrides the stored one, its status says whether it runs, its log and account its spend."""

    @property
    def header(self) -> SessionHeader: ...

    @property
    def status(self) -> str: ...

    @property
    def log(self) -> SessionLog: ...

    @property
    def usage(self) -> UsageAccount: ...


def _untracked(_child_id: str) -> Activation | None:
    return None


def _no_runs() -> Sequence[RemoteRun]:
    return ()


class Listings:
    """`list_children` / `list_descendants` over a store, live agents and live activations."""

    def __init__(
        self,
        store: ListingStore,
        agents: Mapping[str, ListedAgent] | None = None,
        activations: ActivationView = _untracked,
        remote_runs: RemoteRunView = _no_runs,
    ) -> None:
        self._store = store
        self._agents: Mapping[str, ListedAgent] = agents if agents is not None else {}
        self._activations = activations
        self._remote_runs = remote_runs

    def list_children(self, parent_session_id: str) -> list[ChildRow]:
        """The parent's direct children (live-preferred), ordered by creation time."""
        headers, remote = self._headers()
        parents = {h.parent_session for h in headers.values()}
        mine = [h for h in headers.values() if h.parent_session == parent_session_id]
        return self._rows(mine, parents, remote)

    def list_descendants(self, root_session_id: str) -> list[ChildRow]:
        """Every descendant of `root_session_id` (rows carry `parent_id` and `depth`)."""
        headers, remote = self._headers()
        by_parent: dict[str, list[SessionHeader]] = {}
        for header in headers.values():
            by_parent.setdefault(header.parent_session or "", []).append(header)
        found: list[SessionHeader] = []
        seen = {root_session_id}
        frontier = [root_session_id]
        while frontier:
            nxt: list[str] = []
            for parent_id in frontier:
                for header in by_parent.get(parent_id, []):
                    if header.id in seen:  # a damaged store could hold a cycle
                        continue
                    seen.add(header.id)
                    found.append(header)
                    nxt.append(header.id)
            frontier = nxt
        return add_subtree_usage(self._rows(found, set(by_parent), remote))

    def _headers(self) -> tuple[dict[str, SessionHeader], dict[str, bool]]:
        """Subagent session headers: stored ones, overridden by the live agents' own; then one
        made up for each remote run that has neither (the second value: their ids, and whether
        each has ended)."""
        headers = {h.id: h for h in self._store.list() if h.origin == "subagent"}
        for agent_id, agent in list(self._agents.items()):
            if agent.header.origin == "subagent":
                headers[agent_id] = agent.header
        remote: dict[str, bool] = {}
        aliases: dict[str, str] = {}
        for run in self._remote_runs():
            if run.session_id is not None and run.session_id != run.id:
                # Its log is kept under another id: the row is the run's (the id its parent
                # knows), and the log's own children hang under it.
                headers.pop(run.session_id, None)
                aliases[run.session_id] = run.id
            elif run.id in headers:
                continue  # its log (a continuable ACP or Ray child's) says more
            parent = self._agents.get(run.parent_id)
            above = parent.header if parent is not None else headers.get(run.parent_id)
            headers[run.id] = SessionHeader(
                id=run.id,
                created_at=run.created_at,
                cwd=above.cwd if above is not None else "",
                parent_session=run.parent_id,
                origin="subagent",
                delegation_depth=above.delegation_depth + 1 if above is not None else 1,
            )
            remote[run.id] = run.ended
        if aliases:
            for header_id, header in list(headers.items()):
                if header.parent_session in aliases:
                    parent_id = aliases[header.parent_session]
                    headers[header_id] = replace(header, parent_session=parent_id)
        return headers, remote

    def _rows(
        self,
        headers: Sequence[SessionHeader],
        parents: set[str | None],
        remote: Mapping[str, bool],
    ) -> list[ChildRow]:
        rows: list[ChildRow] = []
        for header in sorted(headers, key=lambda h: (h.created_at, h.id)):
            child_id = header.id
            ended = remote.get(child_id)
            if ended is not None:
                # Nothing of it is stored here under its id and its spend is counted when it
                # ends; one that ended stays listed, `ended`, as long as a settled task would.
                activation = self._activations(child_id)
                label = activation.label if activation is not None else None
                mode = "continuable" if label else "one-shot"
                rows.append(
                    _child_row(header, parents, mode, label, "ended" if ended else "running")
                )
                continue
            agent = self._agents.get(child_id)
            try:
                descriptor, usage, cost = self._descriptor_of(child_id, agent)
                cost_usd = pico_to_usd(cost) if cost else None
            except Exception as exc:  # one unreadable log never hides its siblings
                log.warning("listing: child %s is unreadable: %s", child_id, exc)
                row = _child_row(header, parents, "unknown", None, _diagnostic(exc))
                row["error"] = str(exc)
                rows.append(row)
                continue
            activation = self._activations(child_id)
            mode, label, error = "one-shot", None, None
            if isinstance(descriptor, SubagentDescriptor):
                mode, label = "continuable", descriptor.label
            elif isinstance(descriptor, Unclassifiable):
                mode = "continuable"
                error = descriptor.reason  # e.g. written by a newer runtime
            elif activation is not None and activation.label:
                mode, label = "continuable", activation.label  # before its first request
            if agent is None:
                # A remote child (ACP) has no local agent: its live activation says it runs.
                if activation is not None and activation.running:
                    activity = "running"
                elif self._held(child_id):
                    activity = "running elsewhere"  # another process holds its log
                else:
                    activity = "stored"
            else:
                activity = "running" if agent.status == "running" else "idle"
            row = _child_row(header, parents, mode, label, activity)
            row["usage"] = usage
            if cost_usd is not None:
                row["cost_usd"] = cost_usd
            if error is not None:
                row["error"] = error
            rows.append(row)
        return rows

    def _held(self, child_id: str) -> bool:
        """Held open for writing by another process (the store's lock says so)."""
        return bool(self._store.is_held(child_id))

    def _descriptor_of(
        self, child_id: str, agent: ListedAgent | None
    ) -> tuple[SubagentDescriptor | Unclassifiable | None, dict[str, int], int]:
        """The child's descriptor, its own token usage and cost in picodollars (live: its
        account; else its log)."""
        events: Iterable[Mapping[str, object]]
        if agent is not None:
            # Only the descriptor events after the seed are decoded from the live log.
            events = events_of_types(agent.log.events, _DESCRIPTOR_ONLY, agent.header.seed_length)
            seed_length = 0
            usage = dict(agent.usage.own)
            cost = agent.usage.cost_own
        else:
            loaded = self._store.inspect(child_id)
            events, seed_length = loaded.events, loaded.header.seed_length
            usage = usage_of_events(events, seed_length)
            cost = cost_of_events(events, seed_length)
        return authoritative_descriptor(events, seed_length), usage, cost


def _child_row(
    header: SessionHeader, parents: set[str | None], mode: str, label: str | None, activity: str
) -> ChildRow:
    return ChildRow(
        id=header.id,
        parent_id=header.parent_session,
        depth=header.delegation_depth,
        created_at=header.created_at,
        has_children=header.id in parents,
        mode=mode,
        label=label,
        activity=activity,
    )


def _diagnostic(exc: BaseException) -> str:
    corrupt = (CorruptSessionError, SessionLogError, DescriptorError)
    return "corrupt" if isinstance(exc, corrupt) else "unavailable"


def add_subtree_usage(rows: list[ChildRow]) -> list[ChildRow]:
    """Give each row of a whole-subtree listing `subtree_usage`: its own usage plus every
    listed descendant's (rows carry `id`, `parent_id`, `depth` and their own `usage`), and
    `subtree_cost_usd` likewise when any of them has a `cost_usd`."""
    totals: dict[str, dict[str, int]] = {}
    costs: dict[str, int] = {}
    for row in rows:
        totals[row["id"]] = dict(row.get("usage") or {})
        costs[row["id"]] = round(float(row.get("cost_usd") or 0) * PICO)
    for row in sorted(rows, key=lambda r: -int(r.get("depth") or 0)):
        parent_id = row.get("parent_id") or ""
        parent = totals.get(parent_id)
        if parent is not None:
            add_usage(parent, totals[row["id"]])
            costs[parent_id] += costs[row["id"]]
    for row in rows:
        row["subtree_usage"] = totals[row["id"]]
        if costs[row["id"]]:
            row["subtree_cost_usd"] = pico_to_usd(costs[row["id"]])
    return rows
