"""What every `subagent` command shares: errors, exit codes, the console, the store, JSON."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

__all__ = [
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_USAGE",
    "CliError",
    "Parser",
    "flat_text",
    "home_dir",
    "listing_rows",
    "make_console",
    "model_registry",
    "open_store",
    "print_json",
    "require_session",
    "runtime_over",
    "store_root",
    "when",
]

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class CliError(Exception):
    """A user-facing failure: printed as one line."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see --help)\n")
        sys.exit(EXIT_USAGE)


def make_console(stream: Any = None) -> Any:
    from rich.console import Console

    stream = stream or sys.stdout
    if stream.isatty():
        return Console(file=stream)
    # Scripts and tests: a fixed width and no styling, so captures are stable.
    return Console(file=stream, width=100, no_color=True, highlight=False, soft_wrap=True)


def home_dir(args: argparse.Namespace) -> str | None:
    return args.home or os.environ.get("SUBAGENT_HOME") or None


# See docs/performance.md (fanout): freezing the live heap every N starts.
CLI_GC_FREEZE_EVERY = 1_000


def store_root(args: argparse.Namespace) -> Path:
    from agent.store import default_root

    home = home_dir(args)
    return Path(home) / "sessions" if home else default_root()


def open_store(args: argparse.Namespace) -> Any:
    from agent.store import SessionStore

    root = store_root(args)
    if not root.is_dir():
        raise CliError(f"no session store at {root}")
    return SessionStore(root)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True) + "\n")


def when(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))


def flat_text(content: Any, limit: int = 200) -> str:
    if isinstance(content, str):
        out = content
    else:
        out = " ".join(
            str(b.get("text", f"[{b.get('type')}]")) for b in content or () if isinstance(b, dict)
        )
    out = out.replace("\n", " ")
    return out if len(out) <= limit else out[: limit - 1] + "…"


def model_registry(args: argparse.Namespace) -> Any:
    from agent.models import ModelRegistry
    from agent.models.openai import OpenAIModel

    models = ModelRegistry()
    base_url = getattr(args, "base_url", None)
    models.register("openai", OpenAIModel(base_url=base_url) if base_url else OpenAIModel())
    return models


def runtime_over(store: Any) -> Any:
    from providers.inprocess import ForkProvider, SpawnProvider
    from subagent.runtime import Runtime

    rt = Runtime(store=store)
    rt.subagents.register(SpawnProvider())
    rt.subagents.register(ForkProvider())
    return rt


def listing_rows(store: Any, listing: Any) -> list[dict[str, Any]]:
    """One listing of the service over `store`, in a runtime opened and closed for it."""
    rt = runtime_over(store)
    try:
        rows: list[dict[str, Any]] = listing(rt.subagents)
        return rows
    finally:
        rt.close()


def require_session(store: Any, session_id: str) -> None:
    from agent.events import validate_session_id

    try:
        validate_session_id(session_id)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if not store.exists(session_id):
        raise CliError(f"no session {session_id!r} in {store.root}")
