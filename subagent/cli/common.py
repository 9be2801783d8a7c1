"""What every `subagent` command shares: errors, exit codes, the console, the store, JSON."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, NoReturn, Protocol

from subagent.cli.text import DataConsole, shown
from subagent.errors import CliError, UsageError

if TYPE_CHECKING:  # imported where used, to keep the command's start fast
    from agent.models import ModelRegistry
    from agent.store import SessionStore
    from subagent.listings import ChildRow, Listings

__all__ = [
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_TERMINATED",
    "EXIT_USAGE",
    "CliError",
    "Parser",
    "Subcommands",
    "UsageError",
    "answer_text",
    "flat_text",
    "home_dir",
    "listing_rows",
    "make_console",
    "model_registry",
    "non_negative_int",
    "open_store",
    "positive_int",
    "print_json",
    "read_prompt",
    "require_model_ready",
    "require_session",
    "session_id_arg",
    "store_root",
    "when",
]

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143  # 128 + SIGTERM


# The largest count any option takes: JSON's safe integer (what the runtime's own checks use).
# A bigger value is a typo or an attack: refused as a bad argument (exit 2), not met later as
# an `OverflowError` or a retry loop that never ends.
MAX_COUNT = 2**53 - 1


def positive_int(text: str) -> int:
    """An argparse type: an int >= 1 (a bad value exits 2, like any other bad argument)."""
    return _bounded_int(text, 1, MAX_COUNT)


def non_negative_int(text: str) -> int:
    """An argparse type: an int >= 0."""
    return _bounded_int(text, 0, MAX_COUNT)


def int_between(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an int in [low, high]."""

    def parse(text: str) -> int:
        return _bounded_int(text, low, high)

    return parse


def http_url(text: str) -> str:
    """An argparse type: an http(s) URL with a host (and a valid port, if any)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(text)
        valid = parts.scheme in ("http", "https") and bool(parts.hostname)
        parts.port  # noqa: B018  (raises for a bad port)
    except ValueError:
        valid = False
    if not valid:
        raise argparse.ArgumentTypeError(f"must be an http(s) URL, got {text!r}")
    return text


def session_id_arg(text: str) -> str:
    """An argparse type: a session id of the store's syntax. A malformed one (`../x`) can name
    no session, so it is a bad argument (exit 2), not a failed lookup (exit 1)."""
    from agent.events import validate_session_id

    try:
        return validate_session_id(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _bounded_int(text: str, low: int, high: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
    if value > high:
        raise argparse.ArgumentTypeError(f"must be at most {high:,}, got {value}")
    return value


def read_prompt(value: str | None, file: str | None, what: str = "prompt") -> str:
    """The text of a prompt given inline, as `-` (stdin), by `--prompt-file FILE`, or piped.

    Prompts can be longer than the argument-list limit (~128 KiB per argument), so they may come
    from stdin or a file; the bytes must be UTF-8. Trailing newlines (what `echo` and editors
    add) are dropped. Giving two sources, or none, or an empty prompt is a usage error.
    """
    if value is not None and file is not None:
        raise UsageError(f"give the {what} inline, as -, or with --{what}-file, not both")
    if value is not None and value != "-":
        text = value
    else:
        if value is None and file is None and (sys.stdin is None or sys.stdin.isatty()):
            raise UsageError(f"no {what}: give it inline, as - (stdin), or with --{what}-file")
        if file is None or file == "-":
            text = _decode(_bounded(_read_stdin(), what), f"the {what} on stdin")
        else:
            try:
                with Path(file).open("rb") as stream:
                    raw = stream.read(MAX_PROMPT_BYTES + 1)  # bounded: `/dev/zero` never ends
            except OSError as exc:
                raise CliError(f"cannot read the {what} file: {exc}") from None
            text = _decode(_bounded(raw, what), f"the {what} file {file}")
        text = text.rstrip("\r\n")
    if not text.strip():
        raise UsageError(f"the {what} is empty")
    return text


# A prompt is logged whole in one event, and a session log's frame holds 64 MiB: half of that
# leaves room for the event around it. Reads stop one byte past it, so endless input
# (`--prompt-file /dev/zero`, `yes |`) is refused instead of filling memory.
MAX_PROMPT_BYTES = 32 * 1024 * 1024


def _bounded(raw: bytes, what: str) -> bytes:
    if len(raw) > MAX_PROMPT_BYTES:
        raise UsageError(f"the {what} is larger than {MAX_PROMPT_BYTES // (1024 * 1024)} MiB")
    return raw


def _read_stdin() -> bytes:
    # Read before the runtime exists: nothing else runs on the hub yet, so a plain read is fine.
    stream = sys.stdin
    if stream is None:
        return b""
    try:
        return stream.buffer.read(MAX_PROMPT_BYTES + 1)
    except OSError as exc:
        raise CliError(f"cannot read stdin: {exc}") from None


def _decode(raw: bytes, where: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CliError(f"{where} is not UTF-8 text (byte {exc.start})") from None


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # The message may quote what was typed (`argument SESSION: invalid session id ...`):
        # it reaches the terminal escaped, like every other error line.
        sys.stderr.write(f"{self.prog}: error: {shown(message, one_line=True)} (see --help)\n")
        sys.exit(EXIT_USAGE)


class Subcommands(Protocol):
    """What each command module's `register` uses of `add_subparsers(parser_class=Parser)`'s
    result (argparse names that class only privately)."""

    def add_parser(self, name: str, *, help: str) -> Parser: ...


def make_console(stream: IO[str] | None = None) -> DataConsole:
    """The one console every command prints through: every str on it is data (cli/text.py)."""
    stream = stream or sys.stdout
    return DataConsole(stream, plain=not stream.isatty())


def home_dir(args: argparse.Namespace) -> str | None:
    """`--home` or `SUBAGENT_HOME`. One that names something other than a directory is a bad
    argument: read as an empty home, `ls` would say "no sessions" of a typo'd path."""
    home: str | None = args.home or os.environ.get("SUBAGENT_HOME") or None
    if home is not None:
        _a_directory_or_nothing(Path(home), "the home")
    return home


def store_root(args: argparse.Namespace) -> Path:
    from agent.store import default_root

    home = home_dir(args)
    if not home:
        return default_root()
    root = Path(home) / "sessions"
    _a_directory_or_nothing(root, "the session store")
    return root


def _a_directory_or_nothing(path: Path, what: str) -> None:
    """`path` is a directory, or could become one: a file at it or on the way is refused."""
    for folder in (path, *path.parents):
        if folder.exists():
            if not folder.is_dir():
                where = "" if folder == path else f" ({str(folder)!r} is a file)"
                raise UsageError(f"{what} {str(path)!r} is not a directory{where}")
            return


def open_store(args: argparse.Namespace) -> SessionStore:
    from agent.store import SessionStore

    root = store_root(args)
    if not root.is_dir():
        raise CliError(f"no session store at {root}")
    return SessionStore(root)


def print_json(data: object) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True) + "\n")


def when(epoch: float) -> str:
    """A stored time as local date and time. A stored file is data: a time the platform cannot
    show (`2**64`, `1e300`: a damaged or crafted header) reads as such, and the listing goes on."""
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))
    except (OverflowError, OSError, ValueError, TypeError):
        return f"(time out of range: {epoch!r})"


def flat_text(content: str | Iterable[object] | None, limit: int = 200) -> str:
    if isinstance(content, str):
        out = content
    else:
        out = " ".join(
            str(b.get("text", f"[{b.get('type')}]")) for b in content or () if isinstance(b, dict)
        )
    out = out.replace("\n", " ")
    return out if len(out) <= limit else out[: limit - 1] + "…"


def answer_text(content: str | Iterable[object] | None) -> str:
    """An answer's text blocks, whole: newlines kept, nothing cut (it is what was asked for)."""
    if isinstance(content, str):
        return content
    parts = []
    for block in content or ():
        if isinstance(block, dict):
            if block.get("type") == "text":
                parts.append(str(block.get("text", "")))
            else:
                parts.append(f"[{block.get('type')}]")
    return "\n".join(parts)


def model_registry(args: argparse.Namespace) -> ModelRegistry:
    """The HTTP model routes, with `--base-url`, `--timeout` and `--max-retries` applied.

    `--base-url` goes to the route `--model` names (`anthropic:` or else OpenAI-compatible).
    """
    from agent.models import ModelRegistry
    from agent.models.anthropic import AnthropicModel
    from agent.models.openai import OpenAIModel

    models = ModelRegistry()
    base_url = getattr(args, "base_url", None)
    prefix, _name = model_route(getattr(args, "model", None))
    transport: dict[str, Any] = {}
    timeout = getattr(args, "timeout", None)
    if timeout is not None:
        transport["timeout"] = timeout
    retries = getattr(args, "max_retries", None)
    if retries is not None:
        transport["max_retries"] = retries
    openai_url = base_url if prefix == "openai" else None
    anthropic_url = base_url if prefix == "anthropic" else None
    models.register("openai", OpenAIModel(base_url=openai_url, **transport))
    models.register("anthropic", AnthropicModel(base_url=anthropic_url, **transport))
    return models


MODEL_ROUTES = ("openai", "anthropic")

# What each route needs when `check_ready` says no call can succeed (no key for the public API).
_ROUTE_NEEDS = {
    "openai": "--base-url URL (or $OPENAI_BASE_URL), or $OPENAI_API_KEY for {url}",
    "anthropic": "$ANTHROPIC_API_KEY for {url} (or --base-url URL)",
}


def require_model_ready(models: ModelRegistry, model: str) -> None:
    """`--model`'s route can be called (a key, or a base URL that needs none): checked before
    anything is created, so a run that could never make a request stores no session."""
    from agent.errors import ModelError
    from agent.models.http import HTTPModel

    prefix, name = model_route(model)
    adapter, _ = models.resolve(f"{prefix}:{name}")
    if not isinstance(adapter, HTTPModel):
        return
    try:
        adapter.check_ready()
    except ModelError:
        needs = _ROUTE_NEEDS.get(prefix, "a reachable endpoint ({url})")
        raise UsageError(f"--model {model!r} needs {needs.format(url=adapter.base_url)}") from None


def model_route(model: str | None) -> tuple[str, str]:
    """`--model`: `anthropic:NAME`, `openai:NAME`, or a bare NAME at an OpenAI-compatible
    endpoint (a bare name may hold colons itself, like Ollama's `llama3:8b`)."""
    if not model:
        return "openai", ""
    prefix, sep, name = model.partition(":")
    if sep and prefix in MODEL_ROUTES:
        if not name:
            raise UsageError(f"--model {model!r} names no model after {prefix + ':'!r}")
        return prefix, name
    return "openai", model


def listing_rows(
    store: SessionStore, listing: Callable[[Listings], list[ChildRow]]
) -> list[ChildRow]:
    """One listing over `store` alone: reading the store needs no runtime (nothing is live in
    this process, so every child is stored, or running elsewhere when another process holds it).
    Made once, so each log is skimmed for what a row needs (`Listings(skim=True)`)."""
    from subagent.listings import Listings

    return listing(Listings(store, skim=True))


def require_session(store: SessionStore, session_id: str) -> None:
    from agent.events import validate_session_id

    try:
        validate_session_id(session_id)
    except ValueError as exc:  # the argument's type checks it first; this guards other callers
        raise UsageError(str(exc)) from None
    if not store.exists(session_id):
        raise CliError(f"no session {session_id!r} in {store.root}")
