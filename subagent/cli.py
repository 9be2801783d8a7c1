"""The `subagent` command: a live demo, real runs, and a look into the session store.

The CLI never monkey-patches: everything it does is cooperative already (gevent-native HTTP,
`gevent.subprocess`, the store's thread pool). Errors are one line on stderr and a non-zero
exit; `--debug` adds the traceback and library logging. Ctrl-C cancels the whole tree and
reports what it stopped; a second Ctrl-C exits at once.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shlex
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

__all__ = ["CliError", "main"]

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class CliError(Exception):
    """A user-facing failure: printed as one line."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see --help)\n")
        sys.exit(EXIT_USAGE)


# -- helpers -------------------------------------------------------------------------------


def _console(stream: Any = None) -> Any:
    from rich.console import Console

    stream = stream or sys.stdout
    if stream.isatty():
        return Console(file=stream)
    # Scripts and tests: a fixed width and no styling, so captures are stable.
    return Console(file=stream, width=100, no_color=True, highlight=False, soft_wrap=True)


def _home(args: argparse.Namespace) -> str | None:
    return args.home or os.environ.get("SUBAGENT_HOME") or None


# See docs/performance.md (fanout): freezing the live heap every N starts.
CLI_GC_FREEZE_EVERY = 1_000


def _store_root(args: argparse.Namespace) -> Path:
    from agent.store import default_root

    home = _home(args)
    return Path(home) / "sessions" if home else default_root()


def _store(args: argparse.Namespace) -> Any:
    from agent.store import SessionStore

    root = _store_root(args)
    if not root.is_dir():
        raise CliError(f"no session store at {root}")
    return SessionStore(root)


def _print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _when(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))


def _text(content: Any, limit: int = 200) -> str:
    if isinstance(content, str):
        out = content
    else:
        out = " ".join(
            str(b.get("text", f"[{b.get('type')}]")) for b in content or () if isinstance(b, dict)
        )
    out = out.replace("\n", " ")
    return out if len(out) <= limit else out[: limit - 1] + "…"


def _last_user(request: Any) -> str:
    for message in reversed(request.messages):
        if message.get("role") == "user":
            return _text(message.get("content", ()), 2000)
    return ""


def _offline(request: Any) -> Any:
    from agent.models import scripted as S

    return S.text(f"(offline scripted model) received: {_last_user(request)}")


def _models(args: argparse.Namespace) -> Any:
    from agent.models import ModelRegistry
    from agent.models.openai import OpenAIModel

    models = ModelRegistry()
    base_url = getattr(args, "base_url", None)
    models.register("openai", OpenAIModel(base_url=base_url) if base_url else OpenAIModel())
    return models


# -- live driving --------------------------------------------------------------------------


class _Interrupts:
    """First Ctrl-C: run `on_first` (cancel the tree). Second: exit at once."""

    def __init__(self, on_first: Callable[[], list[str]]) -> None:
        self.on_first = on_first
        self.stopped: list[str] | None = None

    def __enter__(self) -> _Interrupts:
        import gevent

        def handler(*_args: Any) -> None:
            if self.stopped is not None:
                sys.stderr.write("subagent: interrupted again; exiting now\n")
                sys.stderr.flush()
                os._exit(EXIT_INTERRUPTED)
            self.stopped = []
            sys.stderr.write("subagent: interrupted; cancelling the tree (Ctrl-C again to exit)\n")
            sys.stderr.flush()

            def cancel() -> None:
                self.stopped = self.on_first()

            gevent.spawn(cancel)

        self._watcher = gevent.signal_handler(signal.SIGINT, handler)
        return self

    def __exit__(self, *exc: object) -> None:
        self._watcher.cancel()


def _drive(
    console: Any,
    tree: Any,
    work: Callable[[], Any],
    live: bool,
    on_interrupt: Callable[[], list[str]],
) -> tuple[Any, list[str] | None]:
    """Run `work` in a greenlet under the live tree; returns its value and what Ctrl-C stopped."""
    import gevent

    with _Interrupts(on_interrupt) as interrupts:
        job = gevent.spawn(work)
        if live and console.is_terminal:
            from rich.live import Live

            # No auto refresh: rich's refresh thread would read the tree off the hub.
            with Live(
                tree.render(times=True), console=console, auto_refresh=False, transient=True
            ) as view:
                while not job.ready():
                    view.update(tree.render(times=True), refresh=True)
                    job.join(timeout=0.1)
        else:
            # A timed join keeps a timer on the loop: with every greenlet waiting on the
            # operator (Ctrl-C), a plain join would end in LoopExit.
            while not job.ready():
                job.join(timeout=0.5)
        return job.get(), interrupts.stopped


def _report_stopped(console: Any, stopped: list[str] | None) -> None:
    if stopped is None:
        return
    if stopped:
        console.print(f"interrupted: stopped {len(stopped)} agent(s): {', '.join(stopped)}")
    else:
        console.print("interrupted: nothing was running")


# -- commands ------------------------------------------------------------------------------


def cmd_demo(args: argparse.Namespace) -> int:
    from agent.store import SessionStore
    from subagent.demo import Demo

    console = _console()
    home = _home(args)
    if home:
        root = Path(home) / "sessions"
        where = "--home" if args.home else "$SUBAGENT_HOME"
        note = f"{root} (from {where})"
    else:
        root = Path(tempfile.mkdtemp(prefix="subagent-demo-")) / "sessions"
        note = f"{root} (temporary directory; pass --home DIR or set $SUBAGENT_HOME to choose)"
    SessionStore(root).ensure_root()
    started = time.monotonic()
    demo = Demo(str(root), children=args.children, seed=args.seed, hold=args.hold)
    console.print(f"subagent demo: {args.children} children, seed {args.seed}")
    console.print(f"store: {note}")
    try:
        _, stopped = _drive(
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
        _report_stopped(console, stopped)
    finally:
        demo.close()
    console.print(f"store: {root}")
    console.print(f"finished in {time.monotonic() - started:.2f} s")
    return EXIT_INTERRUPTED if stopped is not None else 0


def cmd_run(args: argparse.Namespace) -> int:
    from agent.models import scripted as S
    from agent.options import AgentOptions
    from agent.store import SessionStore
    from providers.inprocess import ForkProvider, SpawnProvider
    from subagent.cli_tree import TreeModel
    from subagent.runtime import Runtime
    from subagent.tools import PROVIDER_MANAGED, SubagentToolConfig, install_subagent_tools

    if args.acp and (args.base_url or args.model):
        raise CliError("use either --acp or --base-url/--model, not both")
    if not args.acp and not args.model:
        raise CliError("run needs --model NAME (with --base-url URL or $OPENAI_BASE_URL) or --acp")
    console = _console()
    root_dir = SessionStore(_store_root(args)).ensure_root()
    relay = {"prompt": args.prompt}

    def relay_model(request: Any) -> Any:
        last = request.messages[-1]
        if last.get("role") == "tool":
            return S.text(_text(last.get("content", ()), 100_000))
        return S.tool_call("subagent", {"description": "acp task", "prompt": relay["prompt"]})

    rt = Runtime(
        store=SessionStore(root_dir),
        models=_models(args),
        scripted=S.ScriptedModel(relay_model),
        # The CLI owns its process, so it may take the process-wide collector knob the library
        # leaves opt-in: a wide fan-out then does not stall the hub in full collections.
        gc_freeze_every=CLI_GC_FREEZE_EVERY,
    )
    try:
        if args.acp:
            from providers.acp import AcpConfig, AcpProvider

            words = shlex.split(args.acp)
            if not words:
                raise CliError("--acp needs a command")
            rt.subagents.register(AcpProvider(AcpConfig(command=words[0], args=words[1:])))
            tools = [SubagentToolConfig("acp", name="subagent", max_depth=PROVIDER_MANAGED)]
            options = AgentOptions(model="scripted:relay")
        else:
            rt.subagents.register(SpawnProvider())
            rt.subagents.register(ForkProvider())
            tools = [
                SubagentToolConfig(
                    "spawn", name="subagent", max_depth=args.max_depth, background="continuable"
                ),
                SubagentToolConfig("fork", name="subagent_fork", max_depth=args.max_depth),
            ]
            options = AgentOptions(model=f"openai:{args.model}")
        install_subagent_tools(rt, tools=tools)
        root = rt.agent(options=options)
        tree = TreeModel(rt.ctx, root.id, "root")
        tree.attach(rt.subagents, root)
        console.print(f"session: {root.id}  store: {root_dir}")

        def work() -> Any:
            root.send(args.prompt).get()
            while True:
                outcome = root.when_idle().get()
                if root.status == "idle" and all(t.settled for t in rt.tasks.list()):
                    rt.subagents.providers()
                    return outcome

        def interrupt() -> list[str]:
            stopped = [tree.label(n) for n in tree.running()]
            if root.status == "running":
                stopped.insert(0, "root")
            root.cancel("interrupted (Ctrl-C)")
            for task in rt.tasks.list():
                if not task.settled:
                    rt.tasks.kill(task.id, "interrupted (Ctrl-C)")
            return stopped

        outcome, stopped = _drive(console, tree, work, not args.no_live, interrupt)
        if tree.descendants():
            console.print(tree.render())
        reply = _text(outcome.output, 100_000) if outcome is not None else ""
        console.print(reply or "(no output)")
        _report_stopped(console, stopped)
        if stopped is not None:
            return EXIT_INTERRUPTED
        if outcome is not None and outcome.reason != "completed":
            why = outcome.message or outcome.cause
            raise CliError(f"the root turn ended {outcome.reason}" + (f": {why}" if why else ""))
        return 0
    finally:
        rt.close()


def _runtime_over(store: Any) -> Any:
    from providers.inprocess import ForkProvider, SpawnProvider
    from subagent.runtime import Runtime

    rt = Runtime(store=store)
    rt.subagents.register(SpawnProvider())
    rt.subagents.register(ForkProvider())
    return rt


def _rows(store: Any, listing: Any) -> list[dict[str, Any]]:
    """One listing of the service over `store`, in a runtime opened and closed for it."""
    rt = _runtime_over(store)
    try:
        rows: list[dict[str, Any]] = listing(rt.subagents)
        return rows
    finally:
        rt.close()


def _require(store: Any, session_id: str) -> None:
    from agent.events import validate_session_id

    try:
        validate_session_id(session_id)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if not store.exists(session_id):
        raise CliError(f"no session {session_id!r} in {store.root}")


def cmd_ls(args: argparse.Namespace) -> int:
    from rich.table import Table

    store = _store(args)
    if args.parent:
        _require(store, args.parent)
        rows = _rows(store, lambda service: service.list_children(args.parent))
        if args.json:
            _print_json(rows)
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
                _when(r["created_at"]),
                "yes" if r.get("has_children") else "",
            )
    else:
        rows = _root_rows(store)
        if args.json:
            _print_json(rows)
            return 0
        table = Table(title=f"root sessions in {store.root}", title_justify="left")
        for col in ("id", "status", "created", "children", "cwd"):
            table.add_column(col)
        for r in rows:
            created = "-" if r["created_at"] is None else _when(r["created_at"])
            table.add_row(r["id"], r["status"], created, str(r["children"]), r["cwd"] or "-")
    _console().print(table)
    if args.parent:
        _note_unreadable(store)
    return 0


def _root_rows(store: Any) -> list[dict[str, Any]]:
    """Root sessions, plus what a listing by parent can never show: children whose parent is
    gone (`orphaned`) and entries whose header is unreadable (`corrupt at byte N: why`)."""
    headers, unreadable = store.census()
    ids = {h.id for h in headers} | {bad.id for bad in unreadable}
    kids: dict[str, int] = {}
    for h in headers:
        if h.parent_session:
            kids[h.parent_session] = kids.get(h.parent_session, 0) + 1
    rows: list[dict[str, Any]] = []
    for h in headers:
        if h.origin == "subagent" and h.parent_session in ids:
            continue
        if h.origin == "subagent":
            status = f"orphaned (parent {h.parent_session} is gone)"
        else:
            status = "running elsewhere" if store.is_held(h.id) else "stored"
        rows.append(
            {
                "id": h.id,
                "status": status,
                "created_at": h.created_at,
                "cwd": h.cwd,
                "children": kids.get(h.id, 0),
            }
        )
    for bad in unreadable:
        rows.append(
            {
                "id": bad.id,
                "status": _corrupt_status(bad),
                "created_at": None,
                "cwd": None,
                "children": 0,
            }
        )
    return rows


def _corrupt_status(bad: Any) -> str:
    where = "" if bad.offset is None else f" at byte {bad.offset}"
    return f"corrupt{where}: {bad.reason}"


def _note_unreadable(store: Any) -> None:
    """A listing by parent cannot place a session whose header is unreadable: say so."""
    _headers, unreadable = store.census()
    for bad in unreadable:
        sys.stderr.write(
            f"subagent: note: session {bad.id} cannot be placed in this listing: "
            f"{_corrupt_status(bad)}\n"
        )


def cmd_tree(args: argparse.Namespace) -> int:
    from rich.tree import Tree

    store = _store(args)
    _require(store, args.root)
    rows = _rows(store, lambda service: service.list_descendants(args.root))
    if args.json:
        _print_json(rows)
        _note_unreadable(store)
        return 0
    tree = Tree(args.root)
    branches: dict[str, Any] = {args.root: tree}
    for r in sorted(rows, key=lambda r: (r["depth"], r["created_at"])):
        parent = branches.get(r["parent_id"], tree)
        line = f"{r['id']}  {r.get('label') or '-'}  {r.get('mode')}  {r.get('activity')}"
        branches[r["id"]] = parent.add(line)
    _console().print(tree)
    _note_unreadable(store)
    return 0


def cmd_log(args: argparse.Namespace) -> int:
    from subagent.descriptor import authoritative_descriptor

    store = _store(args)
    _require(store, args.session)
    loaded = store.inspect(args.session)
    header = loaded.header
    if args.json:
        _print_json(
            {
                "header": header.to_json(),
                "events": loaded.events,
                "needs_repair": loaded.needs_repair,
            }
        )
        return 0
    console = _console()
    console.print(f"session {header.id}")
    console.print(
        f"  created {_when(header.created_at)}  cwd {header.cwd}  depth {header.delegation_depth}"
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
    for event in loaded.events[header.seed_length :]:
        kind, data = event["type"], event["data"]
        line = _log_line(kind, data)
        if line is not None:
            console.print(line, markup=False)
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
        return f"    user [{message['source'].get('kind')}]: {_text(message['content'])}"
    if kind == "assistant/message":
        text = _text(data["message"]["content"])
        return f"    assistant ({data.get('finish')}): {text}" if text else None
    if kind == "tool/call":
        return f"    tool call {data['name']} {json.dumps(data['arguments'], sort_keys=True)[:160]}"
    if kind == "tool/result":
        flag = f" ERROR {data.get('code') or ''}".rstrip() if data.get("is_error") else ""
        return f"    tool result {data['name']}{flag}: {_text(data['content'])}"
    if kind == "subagent/descriptor":
        return "    (descriptor recorded)"
    if kind == "inbox/accepted":
        return f"  inbox: accepted {data['kind']} {data['message_id']}"
    if kind == "inbox/discarded":
        return f"  inbox: discarded {data['message_id']} ({data.get('reason')})"
    if kind == "session/end-seed":
        return f"  (seeded with {data['length']} events from the parent)"
    return None


def cmd_send(args: argparse.Namespace) -> int:
    from agent.models import scripted as S
    from agent.options import AgentOptions
    from providers.inprocess import ForkProvider, SpawnProvider
    from subagent.errors import SubagentError
    from subagent.runtime import Runtime
    from subagent.tools import install_subagent_tools
    from subagent.types import MessageSource

    store = _store(args)
    _require(store, args.child)
    header = store.inspect(args.child).header
    if header.parent_session is None:
        raise CliError(f"{args.child} is a root session, not a subagent")
    if not store.exists(header.parent_session):
        raise SubagentError(
            "ORPHANED_CHILD",
            f"the parent {header.parent_session} of {args.child} is no longer stored (deleted by "
            f"gc?), so nobody can resume it; `subagent log {args.child}` still reads it",
        )
    rt = Runtime(store=store, models=_models(args), scripted=S.ScriptedModel(_offline))
    try:
        rt.subagents.register(SpawnProvider())
        rt.subagents.register(ForkProvider())
        install_subagent_tools(rt)
        options = AgentOptions(model=f"openai:{args.model}") if args.model else None
        parent = rt.resume_agent(header.parent_session, options=options)
        sent = rt.subagents.send_message(parent, args.child, args.message, MessageSource.user())
        task = rt.tasks.wait(sent.task_id) if sent.task_id else None
        while True:
            parent.when_idle().get()
            if parent.status == "idle":
                break
        result = {
            "child": args.child,
            "delivery": sent.kind,
            "task": sent.task_id,
            "status": task.status if task else None,
            "output": _text(task.output, 100_000) if task else "",
            "detail": task.detail if task else None,
        }
    finally:
        rt.close()
    if args.json:
        _print_json(result)
    else:
        console = _console()
        console.print(f"{args.child}: {sent.kind} (task {sent.task_id}): {result['status']}")
        if result["detail"]:
            console.print(str(result["detail"]), markup=False)
        console.print(result["output"] or "(no output)", markup=False)
    return 0 if result["status"] in (None, "completed") else EXIT_ERROR


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
    "open",
    "empty",
    "corrupt",
)


def _session_state(store: Any, session_id: str) -> tuple[str, float | None]:
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
        raise CliError("gc needs --older-than, --status or --all (add --dry-run to preview)")
    store = _store(args)
    now = time.time()
    rows: list[dict[str, Any]] = []
    ids = list(store._ids()) if hasattr(store, "_ids") else [h.id for h in store.list()]
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
            except (SessionLogError, OSError) as exc:  # e.g. a directory named x.session
                row["action"] = f"skipped ({getattr(exc, 'message', None) or exc})"
        rows.append(row)
    for name in store.clean_temporaries(dry_run=args.dry_run):
        action = "would remove" if args.dry_run else "removed"
        rows.append({"id": name, "status": "temporary", "age_seconds": None, "action": action})
    if args.json:
        _print_json(rows)
        return 0
    console = _console()
    for row in rows:
        console.print(f"{row['action']}: {row['id']} ({row['status']})")
    verb = "would delete" if args.dry_run else "deleted"
    done = sum(1 for r in rows if r["action"] in ("deleted", "would delete"))
    console.print(f"{verb} {done} session(s) in {store.root}")
    temporaries = sum(1 for r in rows if r["status"] == "temporary")
    if temporaries:
        verb = "would remove" if args.dry_run else "removed"
        console.print(f"{verb} {temporaries} temporary file(s) left by interrupted creates")
    return 0


# -- the parser ----------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="subagent", description="Delegate work to child agents and watch them.")
    parser.add_argument(
        "--home", help="store directory (default $SUBAGENT_HOME, else the user data dir)"
    )
    parser.add_argument(
        "--debug", action="store_true", help="tracebacks and library logging on stderr"
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    demo = sub.add_parser("demo", help="an offline coordinator with N children and a live tree")
    demo.add_argument("--children", type=int, default=8, metavar="N")
    demo.add_argument("--seed", type=int, default=0, metavar="S")
    demo.add_argument("--no-live", action="store_true", help="print only the final tree")
    demo.add_argument("--hold", action="store_true", help=argparse.SUPPRESS)
    demo.set_defaults(fn=cmd_demo)

    run = sub.add_parser("run", help="a real root agent with the subagent tools")
    run.add_argument("prompt")
    run.add_argument(
        "--base-url", help="an OpenAI-compatible endpoint (vLLM, llama.cpp, Ollama, OpenAI)"
    )
    run.add_argument("--model", help="the model name at that endpoint")
    run.add_argument(
        "--acp", metavar="COMMAND", help="run the task on an ACP agent started by COMMAND"
    )
    run.add_argument("--max-depth", type=int, default=3, metavar="D")
    run.add_argument("--no-live", action="store_true")
    run.set_defaults(fn=cmd_run)

    ls = sub.add_parser("ls", help="root sessions, or the children of PARENT")
    ls.add_argument("parent", nargs="?")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(fn=cmd_ls)

    tree = sub.add_parser("tree", help="every descendant of ROOT")
    tree.add_argument("root")
    tree.add_argument("--json", action="store_true")
    tree.set_defaults(fn=cmd_tree)

    log = sub.add_parser("log", help="a session's turns, steps, tools and descriptor")
    log.add_argument("session")
    log.add_argument("--json", action="store_true")
    log.set_defaults(fn=cmd_log)

    send = sub.add_parser("send", help="message a stored continuable child (cold resume)")
    send.add_argument("child")
    send.add_argument("message")
    send.add_argument("--base-url")
    send.add_argument("--model", help="the parent's model at --base-url (default: offline)")
    send.add_argument("--json", action="store_true")
    send.set_defaults(fn=cmd_send)

    gc = sub.add_parser("gc", help="delete stored sessions by age or status")
    gc.add_argument("--older-than", type=_duration, metavar="AGE", help="e.g. 90s, 30m, 12h, 7d")
    gc.add_argument("--status", action="append", choices=GC_STATUSES)
    gc.add_argument("--all", action="store_true")
    gc.add_argument("--dry-run", action="store_true")
    gc.add_argument("--json", action="store_true")
    gc.set_defaults(fn=cmd_gc)
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


if __name__ == "__main__":
    sys.exit(main())
