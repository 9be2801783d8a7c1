"""The `subagent` command: a live demo, real runs, and a look into the session store.

The CLI never monkey-patches: everything it does is cooperative already (gevent-native HTTP,
`gevent.subprocess`, the store's thread pool). Errors are one line on stderr and a non-zero
exit; `--debug` adds the traceback and library logging (the servers, `subagent mcp` and
`subagent acp`, log warnings to stderr without it). Ctrl-C cancels the whole tree and
reports what it stopped; a second Ctrl-C, or SIGTERM, kills the ACP agents' process groups and
exits at once.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import traceback
from collections.abc import Callable, Sequence

from subagent import telemetry
from subagent.cli import demo, gc, listing, run, send, serve
from subagent.cli.common import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    CliError,
    Parser,
    UsageError,
)
from subagent.cli.live import on_sigterm, reap_external_children
from subagent.cli.text import shown

__all__ = ["EXIT_ERROR", "EXIT_INTERRUPTED", "EXIT_USAGE", "CliError", "build_parser", "main"]

# One module per command group; each adds its subcommands to the parser.
COMMANDS = (demo, run, listing, send, gc, serve)


def _global_options(parser: argparse.ArgumentParser, *, default: object) -> None:
    parser.add_argument(
        "--home",
        default=default,
        help="store directory (default $SUBAGENT_HOME, else the user data dir)",
    )
    parser.add_argument(
        "--debug",
        action="store_true",
        default=default,
        help="tracebacks and library logging on stderr",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="subagent", description="Delegate work to child agents and watch them.")
    _global_options(parser, default=None)
    parser.set_defaults(debug=False)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for module in COMMANDS:
        module.register(sub)
    # The global options are accepted after the subcommand too (`subagent ls --home DIR`):
    # there they default to SUPPRESS, so an absent one leaves the value given before it.
    for command in sub.choices.values():
        _global_options(command, default=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.debug:
        _log_to_stderr(logging.DEBUG)
    elif getattr(args, "logs_warnings", False):
        # A server's stdout is the protocol and it has no view to tear: its warnings (a client
        # option it ignores, a child that failed to dispose, dropped spans) go to stderr.
        _log_to_stderr(logging.WARNING)
    else:
        # Library logging would tear the live view; a NullHandler also silences lastResort.
        logging.getLogger().addHandler(logging.NullHandler())
    fn: Callable[[argparse.Namespace], int] = args.fn
    from supervision.signal_watch import SignalWatch

    # SIGTERM: reap external agents first, then exit (they would outlive us in their sessions).
    # A command that stops gracefully on SIGTERM itself (the servers) says so.
    terminate = None
    if not getattr(args, "handles_sigterm", False):
        terminate = SignalWatch(signal.SIGTERM, on_sigterm)
    status = EXIT_ERROR
    try:
        telemetry.configure_from_env()  # OTEL_TRACES_EXPORTER etc. (docs/tracing.md)
        status = fn(args)
    except KeyboardInterrupt:
        reap_external_children()
        sys.stderr.write("subagent: interrupted\n")
        status = EXIT_INTERRUPTED
    except UsageError as exc:
        sys.stderr.write(f"subagent {args.command}: error: {_one_line(str(exc))} (see --help)\n")
        status = EXIT_USAGE
    except Exception as exc:
        if args.debug:
            # The traceback can quote model text too: it reaches the terminal escaped.
            sys.stderr.write(shown(traceback.format_exc()))
        message = str(exc) if isinstance(exc, CliError) else f"{type(exc).__name__}: {exc}"
        if isinstance(exc, KeyError) and exc.args:
            message = f"{type(exc).__name__}: {exc.args[0]}"
        sys.stderr.write(f"subagent: error: {_one_line(message) or type(exc).__name__}\n")
        status = EXIT_ERROR
    finally:
        if terminate is not None:
            terminate.cancel()
        if not _flush_spans() and status != EXIT_INTERRUPTED:
            sys.stderr.write("subagent: interrupted\n")
            status = EXIT_INTERRUPTED
    return status


def _flush_spans() -> bool:
    """Flush the spans within the exit deadline (docs/tracing.md) and say what was lost; False
    when Ctrl-C cut the wait (what was left is counted lost, and said all the same)."""
    import gevent

    from supervision.signal_watch import SignalWatch

    # Ctrl-C is raised here, in the waiting greenlet: left to Python's handler it could land in
    # the hub, which prints it as an error before passing it on.
    watch = SignalWatch(signal.SIGINT, gevent.kill, gevent.getcurrent(), KeyboardInterrupt)
    try:
        telemetry.flush_at_exit()
    except KeyboardInterrupt:
        return False
    finally:
        watch.cancel()
        _say_lost_spans()
    return True


def _say_lost_spans() -> None:
    """One line on stderr when spans were lost: the exporter's own warning is library logging,
    which commands that draw a live view do not show (a wrong endpoint would go unnoticed)."""
    lost, why = telemetry.lost_spans()
    if lost:
        reason = f": {_one_line(why)}" if why else ""
        sys.stderr.write(f"subagent: tracing: {lost} spans were not exported{reason}\n")


class _DataFormatter(logging.Formatter):
    """Log lines as data: a message may quote a model, an agent or a client (names, stderr
    tails), so control characters reach the terminal escaped."""

    def format(self, record: logging.LogRecord) -> str:
        return shown(super().format(record))


def _log_to_stderr(level: int) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_DataFormatter(logging.BASIC_FORMAT))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(level)


def _one_line(message: str) -> str:
    """The first line of an error message, safe for the terminal (it may quote model text)."""
    lines = message.strip().splitlines()
    return shown(lines[0], one_line=True) if lines else ""
