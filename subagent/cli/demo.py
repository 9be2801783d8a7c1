"""`subagent demo`: the offline coordinator with N children and a live tree."""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from subagent.cli.common import (
    EXIT_INTERRUPTED,
    CliError,
    home_dir,
    int_between,
    make_console,
    store_root,
)
from subagent.cli.live import drive, report_stopped

if TYPE_CHECKING:  # annotations only: each command imports what it uses when it runs
    from agent.loop import TurnOutcome
    from subagent.cli.common import Subcommands

__all__ = ["cmd_demo", "register"]


def cmd_demo(args: argparse.Namespace) -> int:
    from agent.store import SessionStore
    from subagent.demo import Demo

    console = make_console()
    home = home_dir(args)
    temporary: Path | None = None
    if home:
        root = store_root(args)
        where = "--home" if args.home else "$SUBAGENT_HOME"
        note = f"{root} (from {where})"
    else:
        # A store of its own, removed at exit unless --keep: runs do not pile up in $TMPDIR.
        temporary = Path(tempfile.mkdtemp(prefix="subagent-demo-"))
        root = temporary / "sessions"
        fate = "kept (--keep)" if args.keep else "deleted at exit unless --keep"
        note = f"{root} (temporary directory, {fate}; --home DIR or $SUBAGENT_HOME choose one)"
    try:
        SessionStore(root).ensure_root()  # 0700 whatever the umask
        started = time.monotonic()
        demo = Demo(str(root), children=args.children, seed=args.seed, hold=args.hold)
        try:
            grand = demo.grandchildren
            family = f"{args.children} children" + (
                f", {grand} grandchild{'ren' if grand != 1 else ''}" if grand else ""
            )
            console.print(
                f"subagent demo: {args.children + grand} agents ({family}), seed {args.seed}"
            )
            console.print(f"store: {note}")
            outcome, stopped = drive(
                console,
                demo.tree,
                demo.run,
                not args.no_live,
                lambda: demo.cancel_all("interrupted (Ctrl-C)"),
            )
            if stopped is None:  # Ctrl-C ends the wait early: what it stopped is reported
                demo.tree.finish(outcome)
            console.print(demo.tree.render())
            console.print(demo.tree.summary())
            counts = ", ".join(f"{n} {s}" for s, n in demo.tree.counts().items())
            failure = write_failure(outcome, demo.tree.faults)
            console.print(f"coordinator: {demo.final_text or no_summary(outcome, stopped)}")
            console.print(f"agents: {counts}")
            report_stopped(console, stopped)
        finally:
            demo.close()
    finally:
        if temporary is not None and not args.keep:
            shutil.rmtree(temporary, ignore_errors=True)
    kept = temporary is None or args.keep
    console.print(f"store: {root}" if kept else "store: deleted (pass --keep to keep it)")
    console.print(f"finished in {time.monotonic() - started:.2f} s")
    if stopped is not None:
        return EXIT_INTERRUPTED
    if failure is not None:
        raise CliError(failure)
    return 0


def no_summary(outcome: TurnOutcome | None, stopped: object) -> str:
    """Why the coordinator printed no summary, in its own words: an interrupt, a log that could
    not be written (not a cancel, although its turn was stopped), or how its turn ended."""
    if stopped is not None:
        return "(cancelled before its summary)"
    fault = getattr(outcome, "fault", None)
    if fault is not None:
        return f"(no summary: its log could not be written: {fault})"
    reason = getattr(outcome, "reason", None)
    return f"(no summary: its turn ended {reason})" if reason else "(no summary)"


def write_failure(outcome: TurnOutcome | None, faults: list[str]) -> str | None:
    """What failed to be written, naming the cause (e.g. `[Errno 28] No space left on device`),
    or None: a demo whose logs could not all be written did not run as shown."""
    fault = getattr(outcome, "fault", None)
    if fault is not None:
        return f"the coordinator's log could not be written: {fault}"
    if faults:
        more = f" (and {len(faults) - 1} more)" if len(faults) > 1 else ""
        return f"a log could not be written: {faults[0]}{more}"
    return None


# The demo runs its whole tree in this process, one scripted step each: 10,000 children take a
# few seconds and some hundreds of MB; more is a typo, refused as a bad argument (exit 2).
MAX_DEMO_CHILDREN = 10_000


def register(sub: Subcommands) -> None:
    demo = sub.add_parser("demo", help="an offline coordinator with N children and a live tree")
    demo.add_argument(
        "--children",
        type=int_between(1, MAX_DEMO_CHILDREN),
        default=8,
        metavar="N",
        help=f"children (default 8, at most {MAX_DEMO_CHILDREN:,})",
    )
    demo.add_argument("--seed", type=int, default=0, metavar="S", help="the scenario's seed")
    demo.add_argument("--no-live", action="store_true", help="print only the final tree")
    demo.add_argument(
        "--keep",
        action="store_true",
        help="keep the temporary store (without --home the demo deletes it at exit)",
    )
    demo.add_argument(
        "--hold",
        action="store_true",
        help="the child the operator would cancel waits until Ctrl-C: try an interrupt",
    )
    demo.set_defaults(fn=cmd_demo)
