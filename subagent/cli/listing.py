"""`subagent ls`, `tree` and `log`: reading the session store."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

from subagent.cli.common import (
    flat_text,
    listing_rows,
    make_console,
    open_store,
    print_json,
    require_session,
    session_id_arg,
    store_root,
    when,
)

if TYPE_CHECKING:  # annotations only: each command imports what it uses when it runs
    from rich.tree import Tree

    from agent.frames import Skimmed
    from agent.store import SessionStore, UnreadableSession
    from subagent.cli.common import Subcommands
    from subagent.listings import ChildRow

__all__ = ["RootRow", "cmd_log", "cmd_ls", "cmd_tree", "register"]


class RootRow(TypedDict):
    """A root session as `subagent ls --json` prints it (docs/events.md): `status` is `stored`,
    `running elsewhere`, `orphaned (...)`, `detached (...)` or `corrupt ...`; an unreadable
    entry has no `created_at` or `cwd`. Its own spend and its stored subtree's, when its log is
    readable."""

    id: str
    status: str
    created_at: float | None
    cwd: str | None
    children: int
    usage: NotRequired[dict[str, int]]
    cost_usd: NotRequired[float]
    subtree_usage: NotRequired[dict[str, int]]
    subtree_cost_usd: NotRequired[float]


def cmd_ls(args: argparse.Namespace) -> int:
    from rich.table import Table

    root = store_root(args)
    # A store nobody wrote yet (no directory) holds no roots: `ls` lists nothing, rc 0.
    store = open_store(args) if args.parent or root.is_dir() else None
    if args.parent and store is not None:
        require_session(store, args.parent)
        rows = listing_rows(store, lambda listings: listings.list_children(args.parent))
        if args.json:
            print_json(rows)
            _note_unreadable(store)
            return 0
        table = Table(title=f"children of {args.parent}", title_justify="left")
        for col in ("id", "label", "mode", "status", "depth", "created", "children"):
            table.add_column(col)
        for r in rows:
            table.add_row(
                r["id"],
                str(r.get("label") or "-"),
                str(r.get("mode")),
                str(r.get("activity")),
                str(r.get("depth")),
                when(r["created_at"]),
                "yes" if r.get("has_children") else "",
            )
    else:
        roots = _root_rows(store, spend=args.json) if store is not None else []
        if args.json:
            print_json(roots)
            return 0
        table = Table(title=f"root sessions in {root}", title_justify="left")
        # The rows' usage is in `--json` (and `tree ROOT`): an 80-column table has no room.
        for col in ("id", "status", "created", "children", "cwd"):
            table.add_column(col)
        for e in roots:
            created = "-" if e["created_at"] is None else when(e["created_at"])
            table.add_row(e["id"], e["status"], created, str(e["children"]), e["cwd"] or "-")
    make_console().print(table)
    if args.parent and store is not None:
        _note_unreadable(store)
    return 0


def _root_rows(store: SessionStore, *, spend: bool = True) -> list[RootRow]:
    """Root sessions, plus what a listing by parent can never show: children whose parent is
    gone (`orphaned`), sessions whose parent links form a cycle (`detached`), and entries whose
    header is unreadable (`corrupt at byte N: why`).

    With `spend` (the `--json` rows), each row carries its usage, which skims every stored log
    for its replies; the table shows none, so it reads headers only."""
    headers, unreadable = store.census()
    ids = {h.id for h in headers} | {bad.id for bad in unreadable}
    kids: dict[str, int] = {}
    below: dict[str, list[str]] = {}
    for h in headers:
        if h.parent_session:
            kids[h.parent_session] = kids.get(h.parent_session, 0) + 1
            below.setdefault(h.parent_session, []).append(h.id)
    spent = _spends(store, [h.id for h in headers]) if spend else {}
    rows: list[RootRow] = []
    for h in headers:
        if h.origin == "subagent" and h.parent_session in ids:
            continue
        if h.origin == "subagent":
            status = f"orphaned (parent {h.parent_session} is gone)"
        else:
            status = "running elsewhere" if store.is_held(h.id) else "stored"
        row = RootRow(
            id=h.id, status=status, created_at=h.created_at, cwd=h.cwd, children=kids.get(h.id, 0)
        )
        if spend:
            _add_spend(row, h.id, spent, below)
        rows.append(row)
    # A session no root reaches through the parent links: its links form a cycle (a tampered
    # store, or one whose ids collide). Listed, so nothing stored is invisible.
    reached = {row["id"] for row in rows}
    pending = list(reached)
    while pending:
        for child in below.get(pending.pop(), ()):
            if child not in reached:
                reached.add(child)
                pending.append(child)
    for h in headers:
        if h.id in reached:
            continue
        status = f"detached (its parent links form a cycle, through {h.parent_session})"
        row = RootRow(
            id=h.id, status=status, created_at=h.created_at, cwd=h.cwd, children=kids.get(h.id, 0)
        )
        if spend:
            _add_spend(row, h.id, spent, below)
        rows.append(row)
    for bad in unreadable:
        rows.append(
            RootRow(id=bad.id, status=_corrupt_status(bad), created_at=None, cwd=None, children=0)
        )
    return rows


def _spends(store: SessionStore, session_ids: list[str]) -> dict[str, tuple[dict[str, int], int]]:
    """Stored sessions' own usage and cost (picodollars), each log skimmed for its replies
    alone (`SessionStore.skim_logs`): a log's tool results are never read. An unreadable log
    has no entry (its row says why elsewhere)."""
    if not session_ids:
        return {}
    read = store.skim_logs(dict.fromkeys(session_ids), _REPLIES, _spend_of)
    return {
        session_id: value
        for session_id, (_stamp, value) in read.items()
        if not isinstance(value, Exception)
    }


_REPLIES = frozenset({"assistant/message"})


def _spend_of(skimmed: Skimmed) -> tuple[dict[str, int], int]:
    """A skimmed session's own usage and cost: its replies after its fork seed."""
    from agent.usage import cost_of_events, usage_of_events

    seed_length = skimmed.header.seed_length
    replies = [event for event in skimmed.events if event["seq"] >= seed_length]
    return usage_of_events(replies), cost_of_events(replies)


def _add_spend(
    row: RootRow,
    session_id: str,
    spend: Mapping[str, tuple[dict[str, int], int]],
    below: Mapping[str, list[str]],
) -> None:
    """Give a root row `usage` / `cost_usd` (its own) and `subtree_usage` / `subtree_cost_usd`
    (it and every stored descendant), like the rows of `tree --json`."""
    from agent.usage import add_usage, pico_to_usd

    own = spend.get(session_id)
    if own is None:
        return
    usage, cost = own
    row["usage"] = dict(usage)
    if cost:
        row["cost_usd"] = pico_to_usd(cost)
    total: dict[str, int] = {}
    total_cost = 0
    seen = {session_id}
    pending = [session_id]
    while pending:  # a damaged store could hold a cycle: `seen` ends it
        current = pending.pop()
        usage, cost = spend.get(current, ({}, 0))
        add_usage(total, usage)
        total_cost += cost
        for child in below.get(current, ()):
            if child not in seen:
                seen.add(child)
                pending.append(child)
    row["subtree_usage"] = total
    if total_cost:
        row["subtree_cost_usd"] = pico_to_usd(total_cost)


def _spent_text(row: Mapping[str, Any], key: str = "subtree_usage") -> str:
    """`1,234 tok` (and `$0.012345` when priced) for a row's usage; `-` without one."""
    from agent.usage import total_tokens

    usage = row.get(key)
    if not isinstance(usage, Mapping):
        return "-"
    text = f"{total_tokens(usage):,} tok"
    cost = row.get("subtree_cost_usd" if key == "subtree_usage" else "cost_usd")
    if isinstance(cost, (int, float)):
        text += f" ${cost:,.6f}"
    return text


def _corrupt_status(bad: UnreadableSession) -> str:
    where = "" if bad.offset is None else f" at byte {bad.offset}"
    return f"corrupt{where}: {bad.reason}"


def _note_unreadable(store: SessionStore) -> None:
    """A listing by parent cannot place a session whose header is unreadable: say so."""
    _headers, unreadable = store.census()
    for bad in unreadable:
        sys.stderr.write(
            f"subagent: note: session {bad.id} cannot be placed in this listing: "
            f"{_corrupt_status(bad)}\n"
        )


def cmd_tree(args: argparse.Namespace) -> int:
    from rich.tree import Tree

    store = open_store(args)
    require_session(store, args.root)
    rows = listing_rows(store, lambda listings: listings.list_descendants(args.root))
    top = _tree_root_row(store, args.root, rows)
    if args.json:
        print_json([top, *rows])
        _note_unreadable(store)
        return 0
    tree = Tree(f"{args.root}  {top.get('activity')}  {_spent_text(top)}")
    branches: dict[str, Tree] = {args.root: tree}
    for r in sorted(rows, key=lambda r: (r["depth"], r["created_at"])):
        parent = branches.get(r["parent_id"] or "", tree)
        line = (
            f"{r['id']}  {r.get('label') or '-'}  {r.get('mode')}  {r.get('activity')}"
            f"  {_spent_text(r)}"
        )
        branches[r["id"]] = parent.add(line)
    make_console().print(tree)
    _note_unreadable(store)
    return 0


def _tree_root_row(store: SessionStore, root_id: str, rows: list[ChildRow]) -> ChildRow:
    """The row of the tree's root itself: its header, its own usage, and its subtree's (its
    own plus its children's subtree totals, which the descendant rows already carry)."""
    from agent.usage import PICO, add_usage, pico_to_usd
    from subagent.listings import ChildRow

    header = store.header(root_id)
    # A child row's shape, its `mode` saying what the root itself is (`root` or `subagent`).
    row = ChildRow(
        id=root_id,
        parent_id=header.parent_session,
        depth=header.delegation_depth,
        created_at=header.created_at,
        has_children=any(r.get("parent_id") == root_id for r in rows),
        mode="root" if header.origin is None else "subagent",
        label=None,
        activity="running elsewhere" if store.is_held(root_id) else "stored",
    )
    own = _spends(store, [root_id]).get(root_id)
    if own is None:
        return row
    usage, cost = own
    row["usage"] = dict(usage)
    if cost:
        row["cost_usd"] = pico_to_usd(cost)
    total = dict(usage)
    total_cost = cost
    for r in rows:
        if r.get("parent_id") == root_id:
            add_usage(total, r.get("subtree_usage") or {})
            total_cost += round(float(r.get("subtree_cost_usd") or 0) * PICO)
    row["subtree_usage"] = total
    if total_cost:
        row["subtree_cost_usd"] = pico_to_usd(total_cost)
    return row


def cmd_log(args: argparse.Namespace) -> int:
    from agent.history import with_tool_calls
    from subagent.descriptor import authoritative_descriptor

    store = open_store(args)
    require_session(store, args.session)
    loaded = store.inspect(args.session)
    header = loaded.header
    if args.json:
        print_json(
            {
                "header": header.to_json(),
                "events": list(loaded.events),
                "needs_repair": loaded.needs_repair,
            }
        )
        return 0
    console = make_console()
    console.print(f"session {header.id}")
    console.print(
        f"  created {when(header.created_at)}  cwd {header.cwd}  depth {header.delegation_depth}"
        + (f"  parent {header.parent_session}" if header.parent_session else "")
        + (f"  seed {header.seed_length} events" if header.seed_length else "")
    )
    try:
        found = authoritative_descriptor(loaded.events, header.seed_length)
    except Exception as exc:
        console.print(f"  descriptor: malformed ({exc})")
    else:
        if found is not None:
            data = found.to_json() if hasattr(found, "to_json") else {"unclassifiable": str(found)}
            console.print("  descriptor: " + json.dumps(data, sort_keys=True))
    if loaded.needs_repair:
        console.print("  (the tail is open or torn: a resume would repair it)")
    for kind, data in with_tool_calls(loaded.events[header.seed_length :]):
        line = _log_line(kind, data)
        if line is not None:
            console.print(line)
    return 0


def _log_line(kind: str, data: Mapping[str, Any]) -> str | None:
    if kind == "turn/start":
        return f"turn {data['turn']}"
    if kind == "turn/end":
        extra = data.get("message") or data.get("cause")
        return f"  end of turn {data['turn']}: {data['reason']}" + (f" ({extra})" if extra else "")
    if kind == "step/start":
        return f"  step {data['step']}"
    if kind == "user/message":
        message = data["message"]
        return f"    user [{message['source'].get('kind')}]: {flat_text(message['content'])}"
    if kind == "assistant/message":
        text = flat_text(data["message"]["content"])
        return f"    assistant ({data.get('finish')}): {text}" if text else None
    if kind == "tool/call":
        return f"    tool call {data['name']} {json.dumps(data['arguments'], sort_keys=True)[:160]}"
    if kind == "tool/result":
        flag = f" ERROR {data.get('code') or ''}".rstrip() if data.get("is_error") else ""
        return f"    tool result {data['name']}{flag}: {flat_text(data['content'])}"
    if kind == "subagent/descriptor":
        return "    (descriptor recorded)"
    if kind == "acp/session":  # a continuable ACP child's record (providers/acp_log.py)
        argv = " ".join([str(data.get("command")), *map(str, data.get("args") or [])])
        return f"    (ACP agent: {argv}; ACP session {data.get('acp_session_id')})"
    if kind == "inbox/accepted":
        return f"  inbox: accepted {data['kind']} {data['message_id']}"
    if kind == "inbox/discarded":
        return f"  inbox: discarded {data['message_id']} ({data.get('reason')})"
    if kind == "session/end-seed":
        return f"  (seeded with {data['length']} events from the parent)"
    return None


def register(sub: Subcommands) -> None:
    ls = sub.add_parser("ls", help="root sessions, or the children of PARENT")
    ls.add_argument("parent", nargs="?", type=session_id_arg, metavar="PARENT")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(fn=cmd_ls)

    tree = sub.add_parser("tree", help="every descendant of ROOT")
    tree.add_argument("root", type=session_id_arg, metavar="ROOT")
    tree.add_argument("--json", action="store_true")
    tree.set_defaults(fn=cmd_tree)

    log = sub.add_parser("log", help="a session's turns, steps, tools and descriptor")
    log.add_argument("session", type=session_id_arg, metavar="SESSION")
    log.add_argument("--json", action="store_true")
    log.set_defaults(fn=cmd_log)
