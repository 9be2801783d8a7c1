"""`subagent demo`: the offline coordinator with N children and a live tree."""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from subagent.cli.common import EXIT_INTERRUPTED, home_dir, make_console
from subagent.cli.live import drive, report_stopped

__all__ = ["cmd_demo", "register"]


def cmd_demo(args: argparse.Namespace) -> int:
    from agent.store import SessionStore
    from subagent.demo import Demo

    console = make_console()
    home = home_dir(args)
    if home:
        root = Path(home) / "sessions"
        where = "--home" if args.home else "$SUBAGENT_HOME"
        note = f"{root} (from {where})"
    else:
        root = Path(tempfile.mkdtemp(prefix="subagent-demo-")) / "sessions"
        note = f"{root} (temporary directory; pass --home DIR or set $SUBAGENT_HOME to choose)"
    SessionStore(root).ensure_root()  # 0700 whatever the umask
    started = time.monotonic()
    demo = Demo(str(root), children=args.children, seed=args.seed, hold=args.hold)
    console.print(f"subagent demo: {args.children} children, seed {args.seed}")
    console.print(f"store: {note}")
    try:
        _, stopped = drive(
            console,
            demo.tree,
            demo.run,
            not args.no_live,
            lambda: demo.cancel_all("interrupted (Ctrl-C)"),
        )
        console.print(demo.tree.render())
        console.print(demo.tree.summary())
        counts = ", ".join(f"{n} {s}" for s, n in demo.tree.counts().items())
        console.print(f"coordinator: {demo.final_text or '(cancelled before its summary)'}")
        console.print(f"children: {counts}")
        report_stopped(console, stopped)
    finally:
        demo.close()
    console.print(f"store: {root}")
    console.print(f"finished in {time.monotonic() - started:.2f} s")
    return EXIT_INTERRUPTED if stopped is not None else 0


def register(sub: Any) -> None:
    demo = sub.add_parser("demo", help="an offline coordinator with N children and a live tree")
    demo.add_argument("--children", type=int, default=8, metavar="N")
    demo.add_argument("--seed", type=int, default=0, metavar="S")
    demo.add_argument("--no-live", action="store_true", help="print only the final tree")
    demo.add_argument("--hold", action="store_true", help=argparse.SUPPRESS)
    demo.set_defaults(fn=cmd_demo)
