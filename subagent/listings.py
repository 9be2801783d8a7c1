"""Listings of subagent children: rows built from the session store and the live agents.

Split from the continuation lifecycle (`subagent.continuation`) so a reader of a store needs no
runtime: `subagent ls` and `subagent tree` build a `Listings` over the store alone, while a
runtime's service builds one over its live agents too, plus the continuation manager's view of
its live activations (`ActivationView`: a remote child has no local agent to ask).

Rows are live-preferred: a live agent's own header and status override the stored ones. A run
that has neither (a one-shot ACP child: a remote process, no log in this store) is listed from
the service's view of its remote runs (`RemoteRunView`, asked one parent at a time): `running`
while it runs, then `ended` for as long as a settled task stays readable. A parent told a
child's id sees that child in every listing after, whichever provider runs it. A Ray child's
log is in the shared store under its run id (the id its parent was told): the log gives its row,
the run its activity (`running`, then `ended` while remembered, `stored` after).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NotRequired, Protocol, TypedDict, TypeVar

import gevent

from agent.events import ASSISTANT_MESSAGE, Event, SessionHeader, SessionLogError
from agent.frames import CorruptSessionError
from agent.log import SessionLog, events_of_types
from agent.usage import (
    PICO,
    USAGE_KEYS,
    UsageAccount,
    add_usage,
    cost_of_events,
    pico_to_usd,
    usage_of_events,
)
from subagent.descriptor import (
    DESCRIPTOR_EVENT,
    DescriptorError,
    SubagentDescriptor,
    Unclassifiable,
    authoritative_descriptor,
)

__all__ = [
    "SKIMMED_TYPES",
    "Activation",
    "ActivationView",
    "ChildRow",
    "ListedAgent",
    "ListingStore",
    "Listings",
    "RemoteRun",
    "RemoteRunView",
    "add_subtree_usage",
    "skim_digest",
]

log = logging.getLogger(__name__)
# A listing builds this many rows (~10 us each) between yields to the hub.
_ROWS_BETWEEN_YIELDS = 256
_DESCRIPTOR_ONLY = frozenset({DESCRIPTOR_EVENT})
# What a row reads of a stored log when it skims it (`Listings(skim=True)`).
SKIMMED_TYPES = frozenset({DESCRIPTOR_EVENT, ASSISTANT_MESSAGE})


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
    """A run with no local agent (ACP, Ray), as the service knows it: live (started, not yet
    settled) or ended (kept as long as a settled task is). It is listed from this when the
    store holds no log under its id; when it does (a Ray child's, in the shared store), the log
    gives the row and this its activity while the child is one-shot."""

    id: str
    parent_id: str
    created_at: float  # epoch seconds, like a header's
    ended: bool = False


class RemoteRunView(Protocol):
    """The service's remote runs, one parent's at a time (`subagent.remote_runs`): a listing
    asks for the parents it lists, never for every run the service knows."""

    def children_of(self, parent_id: str) -> Sequence[RemoteRun]: ...

    def has_runs(self, parent_id: str) -> bool: ...


class _NoRuns:
    """No remote runs (a listing over a store alone)."""

    def children_of(self, parent_id: str) -> Sequence[RemoteRun]:
        return ()

    def has_runs(self, parent_id: str) -> bool:
        return False


class _Loaded(Protocol):
    """A stored session as `inspect` reads it (`agent.store.LoadedSession`)."""

    @property
    def events(self) -> Sequence[Event]: ...

    @property
    def header(self) -> SessionHeader: ...


# What a row needs of a stored child's log, read once per version of the file: its descriptor
# (or None, or why it cannot be read), its own usage (each count of `USAGE_KEYS` in order, None
# where not reported: smaller than a dict, and each row gets a dict of its own) and its own
# cost in picodollars.
_Digest = tuple[SubagentDescriptor | Unclassifiable | None, tuple[int | None, ...], int]
_T = TypeVar("_T")


class _Skimmed(Protocol):
    """A stored session as `skim_logs` reads it (`agent.frames.Skimmed`): its header, and the
    events of the types asked for, in order, each with its seq."""

    @property
    def header(self) -> SessionHeader: ...

    @property
    def events(self) -> Sequence[Event]: ...


class ListingStore(Protocol):
    """The part of a session store a listing reads (`agent.store.SessionStore`)."""

    def list(self) -> Sequence[SessionHeader]: ...

    def digest_logs(
        self, known: Mapping[str, object], digest: Callable[[_Loaded], _T], /
    ) -> Mapping[str, tuple[object | None, _T | Exception]]: ...

    def skim_logs(
        self,
        known: Mapping[str, object],
        types: frozenset[str],
        digest: Callable[[_Skimmed], _T],
        /,
    ) -> Mapping[str, tuple[object | None, _T | Exception]]: ...

    def held_among(self, session_ids: Iterable[str], /) -> set[str]: ...


def _digest(loaded: _Loaded) -> _Digest:
    """A stored child's `_Digest` (pure: it may run in the hub's thread pool)."""
    events, seed_length = loaded.events, loaded.header.seed_length
    descriptor = authoritative_descriptor(events, seed_length)
    usage = _packed(usage_of_events(events, seed_length))
    return descriptor, usage, cost_of_events(events, seed_length)


def skim_digest(skimmed: _Skimmed) -> _Digest:
    """`_digest` of a skimmed log (its descriptors and replies alone; pure, as `_digest`)."""
    seed_length = skimmed.header.seed_length
    events = [event for event in skimmed.events if event["seq"] >= seed_length]
    descriptor = authoritative_descriptor(events, 0)
    return descriptor, _packed(usage_of_events(events)), cost_of_events(events)


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


class Listings:
    """`list_children` / `list_descendants` over a store, live agents and live activations."""

    def __init__(
        self,
        store: ListingStore,
        agents: Mapping[str, ListedAgent] | None = None,
        activations: ActivationView = _untracked,
        remote_runs: RemoteRunView | None = None,
        *,
        skim: bool = False,
    ) -> None:
        """`skim`: read of each stored log only what a row needs (`ListingStore.skim_logs`),
        for a listing made once (the CLI's); a damaged byte the skim does not read is then not
        seen. Otherwise each log is read whole, once per change of its file."""
        self._store = store
        self._skim = skim
        self._agents: Mapping[str, ListedAgent] = agents if agents is not None else {}
        self._activations = activations
        self._remote: RemoteRunView = remote_runs if remote_runs is not None else _NoRuns()
        # Stored children's digests by id, with the stamp of the file they were read from:
        # a listing reads again only the logs that changed (`ListingStore.digest_logs`). At
        # most one entry per subagent session of the store (pruned to the listed headers).
        self._digests: dict[str, tuple[object, _Digest | Exception]] = {}

    def list_children(self, parent_session_id: str) -> list[ChildRow]:
        """The parent's direct children (live-preferred), ordered by creation time."""
        headers = self._headers()
        by_parent = _by_parent(headers.values())
        remote: dict[str, bool] = {}
        mine = self._children(parent_session_id, headers, by_parent, remote)
        return self._rows(mine, by_parent, remote, headers)

    def list_descendants(self, root_session_id: str) -> list[ChildRow]:
        """Every descendant of `root_session_id` (rows carry `parent_id` and `depth`)."""
        headers = self._headers()
        by_parent = _by_parent(headers.values())
        remote: dict[str, bool] = {}
        found: list[SessionHeader] = []
        seen = {root_session_id}
        frontier = [root_session_id]
        while frontier:
            nxt: list[str] = []
            for parent_id in frontier:
                for header in self._children(parent_id, headers, by_parent, remote):
                    if header.id in seen:  # a damaged store could hold a cycle
                        continue
                    seen.add(header.id)
                    found.append(header)
                    nxt.append(header.id)
            frontier = nxt
        return add_subtree_usage(self._rows(found, by_parent, remote, headers))

    def _headers(self) -> dict[str, SessionHeader]:
        """Subagent session headers: stored ones, overridden by the live agents' own."""
        headers = {h.id: h for h in self._store.list() if h.origin == "subagent"}
        for agent_id, agent in list(self._agents.items()):
            if agent.header.origin == "subagent":
                headers[agent_id] = agent.header
        return headers

    def _children(
        self,
        parent_id: str,
        headers: Mapping[str, SessionHeader],
        by_parent: Mapping[str | None, list[SessionHeader]],
        remote: dict[str, bool],
    ) -> list[SessionHeader]:
        """`parent_id`'s children: those with a header, then a header made up for each of its
        remote runs that has none (recorded in `remote`, with whether it ended). A remote run
        whose log is here is recorded too: while it is one-shot, the run says whether it runs."""
        children = list(by_parent.get(parent_id, ()))
        runs = self._remote.children_of(parent_id)
        if not runs:
            return children
        parent = self._agents.get(parent_id)
        above = parent.header if parent is not None else headers.get(parent_id)
        for run in runs:
            remote[run.id] = run.ended
            if run.id in headers:
                continue  # its log (a Ray child's, a continuable ACP child's) says more
            children.append(
                SessionHeader(
                    id=run.id,
                    created_at=run.created_at,
                    cwd=above.cwd if above is not None else "",
                    parent_session=parent_id,
                    origin="subagent",
                    delegation_depth=above.delegation_depth + 1 if above is not None else 1,
                )
            )
        return children

    def _rows(
        self,
        found: Sequence[SessionHeader],
        by_parent: Mapping[str | None, object],
        remote: Mapping[str, bool],
        headers: Mapping[str, SessionHeader],
    ) -> list[ChildRow]:
        rows: list[ChildRow] = []
        runs = self._remote
        ordered = sorted(found, key=lambda h: (h.created_at, h.id))
        # Which children are live is taken once, before the stored logs are read (perhaps in
        # the thread pool, while agents come and go): each row is one or the other.
        live = {h.id: agent for h in ordered if (agent := self._agents.get(h.id)) is not None}
        stored_ids = [
            h.id for h in ordered if h.id not in live and (h.id in headers or h.id not in remote)
        ]
        stored = self._stored_digests(stored_ids, headers)
        # Held by another process: asked after the logs are read, as the old per-row ask was.
        held = self._store.held_among(stored_ids) if stored_ids else set()
        for index, header in enumerate(ordered):
            if index % _ROWS_BETWEEN_YIELDS == _ROWS_BETWEEN_YIELDS - 1:
                gevent.sleep(0)  # thousands of rows: other greenlets run between batches
            child_id = header.id
            parent = child_id in by_parent or runs.has_runs(child_id)
            ended = remote.get(child_id)
            if ended is not None and child_id not in headers:
                # Nothing of it is stored here and its spend is counted when it ends; one that
                # ended stays listed, `ended`, as long as a settled task would.
                activation = self._activations(child_id)
                label = activation.label if activation is not None else None
                mode = "continuable" if label else "one-shot"
                rows.append(
                    _child_row(header, parent, mode, label, "ended" if ended else "running")
                )
                continue
            agent = live.get(child_id)
            read: _Digest | Exception
            try:
                read = stored[child_id] if agent is None else _live_digest(agent)
            except Exception as exc:
                read = exc
            if isinstance(read, Exception):  # one unreadable log never hides its siblings
                log.warning("listing: child %s is unreadable: %s", child_id, read)
                row = _child_row(header, parent, "unknown", None, _diagnostic(read))
                row["error"] = str(read)
                rows.append(row)
                continue
            descriptor, usage_items, cost = read
            cost_usd = pico_to_usd(cost) if cost else None
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
                # A remote child (ACP, Ray) has no local agent: its live run, or its live
                # activation, says it runs; a one-shot one's ended run, that it is over.
                if ended is False or (activation is not None and activation.running):
                    activity = "running"
                elif ended and mode == "one-shot":
                    activity = "ended"
                elif child_id in held:
                    activity = "running elsewhere"  # another process holds its log
                else:
                    activity = "stored"
            else:
                activity = "running" if agent.status == "running" else "idle"
            row = _child_row(header, parent, mode, label, activity)
            row["usage"] = {
                k: n for k, n in zip(USAGE_KEYS, usage_items, strict=True) if n is not None
            }
            if cost_usd is not None:
                row["cost_usd"] = cost_usd
            if error is not None:
                row["error"] = error
            rows.append(row)
        return rows

    def _stored_digests(
        self, child_ids: Sequence[str], headers: Mapping[str, SessionHeader]
    ) -> dict[str, _Digest | Exception]:
        """The digests of these stored children's logs: kept ones whose file is unchanged,
        the rest read now (off the hub when many: `digest_logs`)."""
        kept = self._digests
        if len(kept) > len(headers):  # sessions gone from the store: their digests go too
            self._digests = kept = {i: v for i, v in kept.items() if i in headers}
        if not child_ids:
            return {}
        # What is kept now, for these: another listing may change the kept set meanwhile.
        before = {i: entry for i in child_ids if (entry := kept.get(i)) is not None}
        known = {i: (before[i][0] if i in before else None) for i in child_ids}
        if self._skim:
            fresh = self._store.skim_logs(known, SKIMMED_TYPES, skim_digest)
        else:
            fresh = self._store.digest_logs(known, _digest)
        out: dict[str, _Digest | Exception] = {}
        for child_id in child_ids:
            got = fresh.get(child_id)
            if got is None:  # unchanged since it was kept
                out[child_id] = before[child_id][1]
                continue
            stamp, value = got
            if stamp is None:  # not to be kept (changed too recently, or a passing failure)
                self._digests.pop(child_id, None)
            else:
                self._digests[child_id] = (stamp, value)
            out[child_id] = value
        return out


def _packed(usage: Mapping[str, int]) -> tuple[int | None, ...]:
    return tuple(usage.get(key) for key in USAGE_KEYS)


def _live_digest(agent: ListedAgent) -> _Digest:
    """A live child's descriptor (only the descriptor events after its seed are decoded from
    its log), and its own usage and cost from its account."""
    events = events_of_types(agent.log.events, _DESCRIPTOR_ONLY, agent.header.seed_length)
    usage = _packed(agent.usage.own)
    return authoritative_descriptor(events, 0), usage, agent.usage.cost_own


def _child_row(
    header: SessionHeader, has_children: bool, mode: str, label: str | None, activity: str
) -> ChildRow:
    return ChildRow(
        id=header.id,
        parent_id=header.parent_session,
        depth=header.delegation_depth,
        created_at=header.created_at,
        has_children=has_children,
        mode=mode,
        label=label,
        activity=activity,
    )


def _by_parent(headers: Iterable[SessionHeader]) -> dict[str | None, list[SessionHeader]]:
    by_parent: dict[str | None, list[SessionHeader]] = {}
    for header in headers:
        by_parent.setdefault(header.parent_session, []).append(header)
    return by_parent


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
