"""`subagent gc`: delete stored sessions by age or status."""

from __future__ import annotations

import argparse
import re
import time
from typing import TYPE_CHECKING, Any

from subagent.cli.common import (
    EXIT_ERROR,
    CliError,
    UsageError,
    make_console,
    open_store,
    print_json,
)

if TYPE_CHECKING:  # annotations only: each command imports what it uses when it runs
    from agent.store import SessionStore
    from subagent.cli.common import Subcommands

__all__ = ["GC_STATUSES", "cmd_gc", "register"]


_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _duration(text: str) -> float:
    match = _DURATION.match(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"bad duration {text!r} (use e.g. 90s, 30m, 12h, 7d)")
    return float(match.group(1)) * _UNITS[match.group(2)]


GC_STATUSES = (
    "completed",
    "aborted",
    "error",
    "max-tokens",
    "refusal",
    "blocked",
    "interrupted",
    "budget-exceeded",
    "open",
    "empty",
    "corrupt",
)


def _session_state(store: SessionStore, session_id: str) -> tuple[str, float | None]:
    """(status, last activity) of a stored session: its last turn's end, or why there is none."""
    try:
        loaded = store.inspect(session_id)
    except Exception:
        return "corrupt", None
    last = loaded.events[-1]["time"] if loaded.events else loaded.header.created_at
    if loaded.needs_repair:
        return "open", last
    for event in reversed(loaded.events):
        if event["type"] == "turn/end":
            return str(event["data"]["reason"]), last
    return "empty", last


def cmd_gc(args: argparse.Namespace) -> int:
    from agent.events import SessionLogError
    from agent.store import SessionBusyError

    if args.older_than is None and not args.status and not args.all:
        raise UsageError("gc needs --older-than, --status or --all (add --dry-run to preview)")
    store = open_store(args)
    now = time.time()
    rows: list[dict[str, Any]] = []
    ids = store.ids() if hasattr(store, "ids") else [h.id for h in store.list()]
    for session_id in sorted(ids):
        status, last = _session_state(store, session_id)
        age = None if last is None else now - last
        if args.status and status not in args.status:
            continue
        if (
            args.older_than is not None
            and (age is None or age < args.older_than)
            and status != "corrupt"
        ):
            continue
        row = {
            "id": session_id,
            "status": status,
            "age_seconds": None if age is None else round(age, 1),
        }
        if args.dry_run:
            row["action"] = "would delete"
        else:
            try:
                store.delete(session_id)
                row["action"] = "deleted"
            except SessionBusyError:
                row["action"] = "skipped (in use)"
            except SessionLogError as exc:  # by design, e.g. a directory named x.session
                row["action"] = f"skipped ({getattr(exc, 'message', None) or exc})"
            except OSError as exc:  # could not delete (read-only store, permissions): a failure
                row["action"] = f"failed ({exc})"
        rows.append(row)
    for name in store.clean_temporaries(dry_run=args.dry_run):
        action = "would remove" if args.dry_run else "removed"
        rows.append({"id": name, "status": "temporary", "age_seconds": None, "action": action})
    collect = getattr(store, "collect_headers", None)
    for name in collect(dry_run=args.dry_run) if collect is not None else ():
        action = "would remove" if args.dry_run else "removed"
        rows.append({"id": name, "status": "unused header", "age_seconds": None, "action": action})
    # A deletion the OS refused is a failure of the command (docs/cli.md): exit 1.
    failed = sum(1 for r in rows if r["action"].startswith("failed"))
    if args.json:
        print_json(rows)
        return EXIT_ERROR if failed else 0
    console = make_console()
    for row in rows:
        console.print(f"{row['action']}: {row['id']} ({row['status']})")
    verb = "would delete" if args.dry_run else "deleted"
    done = sum(1 for r in rows if r["action"] in ("deleted", "would delete"))
    console.print(f"{verb} {done} session(s) in {store.root}")
    temporaries = sum(1 for r in rows if r["status"] == "temporary")
    if temporaries:
        verb = "would remove" if args.dry_run else "removed"
        console.print(f"{verb} {temporaries} temporary file(s) left by interrupted creates")
    if failed:
        raise CliError(f"{failed} session(s) could not be deleted")
    return 0


def register(sub: Subcommands) -> None:
    gc = sub.add_parser("gc", help="delete stored sessions by age or status")
    gc.add_argument("--older-than", type=_duration, metavar="AGE", help="e.g. 90s, 30m, 12h, 7d")
    gc.add_argument("--status", action="append", choices=GC_STATUSES)
    gc.add_argument("--all", action="store_true")
    gc.add_argument("--dry-run", action="store_true")
    gc.add_argument("--json", action="store_true")
    gc.set_defaults(fn=cmd_gc)
