"""`subagent mcp` and `subagent acp`: serve the runtime to another agent on stdin/stdout."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from subagent.cli.common import (
    UsageError,
    home_dir,
    http_url,
    int_between,
    model_registry,
    model_route,
    non_negative_int,
)
from subagent.limits import DEFAULT_MAX_CHILDREN_PER_PARENT, MAX_CHILDREN_PER_PARENT

if TYPE_CHECKING:  # annotations only: each command imports what it uses when it runs
    from subagent.cli.common import Subcommands

__all__ = ["cmd_serve", "register"]


def cmd_serve(args: argparse.Namespace) -> int:
    """Validate everything first (errors are one stderr line); then stdout is the protocol's."""
    from subagent.serve.run import serve
    from subagent.serve.wiring import ServeConfig, load_config, merge_flags

    try:
        base = load_config(args.config) if args.config else ServeConfig()
        home = home_dir(args)
        config = merge_flags(
            base,
            model=args.model,
            base_url=args.base_url,
            max_depth=args.max_depth,
            max_children_per_parent=args.max_children_per_parent,
            store_dir=str(Path(home) / "sessions") if home else None,
            acp=args.acp or (),
        )
    except ValueError as exc:  # a bad flag, config file or ACP command: exit 2, like argparse
        raise UsageError(str(exc)) from None
    # The same model routes as `run` (`--model anthropic:NAME`, `openai:NAME` or a bare NAME).
    route = None
    if config.model:
        prefix, name = model_route(config.model)
        route = f"{prefix}:{name}"
    models = model_registry(argparse.Namespace(base_url=config.base_url, model=config.model))
    return serve(args.command, config, models=models, route=route)


def _add(sub: Subcommands, name: str, help_text: str) -> None:
    serve = sub.add_parser(name, help=help_text)
    serve.add_argument("--config", metavar="FILE", help="a JSON config file (see docs/serve.md)")
    serve.add_argument("--model", help="the agents' model at --base-url (default: offline)")
    serve.add_argument("--base-url", type=http_url, help="an OpenAI-compatible endpoint")
    serve.add_argument(
        "--acp",
        action="append",
        metavar="NAME=COMMAND",
        help="an ACP agent as the delegation tool subagent_NAME (repeatable)",
    )
    serve.add_argument(
        "--max-depth", type=non_negative_int, metavar="D", help="the delegation depth cap (3)"
    )
    serve.add_argument(
        "--max-children-per-parent",
        type=int_between(1, MAX_CHILDREN_PER_PARENT),
        metavar="N",
        help=f"children of one agent running at once; more wait for a slot "
        f"(default {DEFAULT_MAX_CHILDREN_PER_PARENT})",
    )
    # The server stops gracefully on SIGTERM (children cancelled, logs closed), then exits 143.
    # Stdout is the protocol's, so warnings go to stderr even without --debug.
    serve.set_defaults(fn=cmd_serve, handles_sigterm=True, logs_warnings=True)


def register(sub: Subcommands) -> None:
    _add(sub, "mcp", "serve the subagent tools to an MCP client on stdio")
    _add(sub, "acp", "serve a coordinator agent to an ACP client (editor) on stdio")
