"""The `subagent` command: a live demo, real runs, and a look into the session store.

The CLI never monkey-patches: everything it does is cooperative already (gevent-native HTTP,
`gevent.subprocess`, the store's thread pool). Errors are one line on stderr and a non-zero
exit; `--debug` adds the traceback and library logging. Ctrl-C cancels the whole tree and
reports what it stopped; a second Ctrl-C exits at once.
"""

from __future__ import annotations

import argparse
import logging
import sys
import traceback
from collections.abc import Callable, Sequence

from subagent.cli import demo, gc, listing, run, send
from subagent.cli.common import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_USAGE, CliError, Parser

__all__ = ["EXIT_ERROR", "EXIT_INTERRUPTED", "EXIT_USAGE", "CliError", "build_parser", "main"]

# One module per command group; each adds its subcommands to the parser.
COMMANDS = (demo, run, listing, send, gc)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="subagent", description="Delegate work to child agents and watch them.")
    parser.add_argument(
        "--home", help="store directory (default $SUBAGENT_HOME, else the user data dir)"
    )
    parser.add_argument(
        "--debug", action="store_true", help="tracebacks and library logging on stderr"
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for module in COMMANDS:
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.debug:
        logging.basicConfig(level=logging.DEBUG, stream=sys.stderr)
    else:
        # Library logging would tear the live view; a NullHandler also silences lastResort.
        logging.getLogger().addHandler(logging.NullHandler())
    fn: Callable[[argparse.Namespace], int] = args.fn
    try:
        return fn(args)
    except KeyboardInterrupt:
        sys.stderr.write("subagent: interrupted\n")
        return EXIT_INTERRUPTED
    except Exception as exc:
        if args.debug:
            traceback.print_exc()
        message = str(exc) if isinstance(exc, CliError) else f"{type(exc).__name__}: {exc}"
        if isinstance(exc, KeyError) and exc.args:
            message = f"{type(exc).__name__}: {exc.args[0]}"
        first = message.strip().splitlines()[0] if message.strip() else type(exc).__name__
        sys.stderr.write(f"subagent: error: {first}\n")
        return EXIT_ERROR
