"""`subagent send`: message a stored continuable child (cold resume)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from subagent.cli.common import (
    EXIT_ERROR,
    CliError,
    UsageError,
    answer_text,
    flat_text,
    http_url,
    make_console,
    model_registry,
    model_route,
    open_store,
    print_json,
    read_prompt,
    require_model_ready,
    require_session,
    session_id_arg,
)

if TYPE_CHECKING:  # annotations only: each command imports what it uses when it runs
    from agent.model import ModelRequest
    from agent.models import scripted as S
    from subagent.cli.common import Subcommands

__all__ = ["cmd_send", "register"]


def _last_user(request: ModelRequest) -> str:
    for message in reversed(request.messages):
        if message.get("role") == "user":
            return flat_text(message.get("content", ()), 2000)
    return ""


def _offline(request: ModelRequest) -> S.Step:
    from agent.models import scripted as S

    return S.text(f"(offline scripted model) received: {_last_user(request)}")


def cmd_send(args: argparse.Namespace) -> int:
    from agent.models import scripted as S
    from agent.options import AgentOptions
    from providers.acp import provider_for_stored_child
    from providers.inprocess import ForkProvider, SpawnProvider
    from subagent.errors import SubagentError
    from subagent.runtime import Runtime
    from subagent.tools import install_subagent_tools
    from subagent.types import MessageSource

    message = read_prompt(args.message, args.message_file, "message")
    models = model_registry(args)
    if args.model:  # the parent's model: one that can never be called is a bad argument
        require_model_ready(models, args.model)
    store = open_store(args)
    require_session(store, args.child)
    header = store.header(args.child)
    if header.parent_session is None:
        raise CliError(f"{args.child} is a root session, not a subagent")
    if not store.exists(header.parent_session):
        raise SubagentError(
            "ORPHANED_CHILD",
            f"the parent {header.parent_session} of {args.child} is no longer stored (deleted by "
            f"gc?), so nobody can resume it; `subagent log {args.child}` still reads it",
        )
    rt = Runtime(store=store, models=models, scripted=S.ScriptedModel(_offline))
    try:
        rt.subagents.register(SpawnProvider())
        rt.subagents.register(ForkProvider())
        install_subagent_tools(rt)
        # An ACP child is reached again through the agent its log records (command, arguments,
        # names of passed variables), plus the variables named here. Registered after the tools:
        # it serves this resume, not new delegations.
        acp = provider_for_stored_child(store, args.child, pass_env=args.acp_env or ())
        if acp is not None:
            rt.subagents.register(acp)
        elif args.acp_env:
            raise UsageError(f"{args.child} is not an ACP child (--acp-env is for ACP children)")
        options = AgentOptions(model=":".join(model_route(args.model))) if args.model else None
        parent = rt.resume_agent(header.parent_session, options=options)
        sent = rt.subagents.send_message(parent, args.child, message, MessageSource.user())
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
            "output": answer_text(task.output) if task else "",
            "detail": task.detail if task else None,
        }
    finally:
        rt.close()
    if args.json:
        print_json(result)
    else:
        console = make_console()
        console.print(f"{args.child}: {sent.kind} (task {sent.task_id}): {result['status']}")
        if result["detail"]:
            console.print(str(result["detail"]))
        console.print(result["output"] or "(no output)")
    return 0 if result["status"] in (None, "completed") else EXIT_ERROR


def register(sub: Subcommands) -> None:
    send = sub.add_parser("send", help="message a stored continuable child (cold resume)")
    send.add_argument("child", type=session_id_arg, metavar="CHILD")
    send.add_argument(
        "message", nargs="?", help="- reads it from stdin, as does a pipe when left out"
    )
    send.add_argument(
        "--message-file", metavar="FILE", help="read the message from FILE (UTF-8; - for stdin)"
    )
    send.add_argument("--base-url", type=http_url)
    send.add_argument("--model", help="the parent's model at --base-url (default: offline)")
    send.add_argument(
        "--acp-env",
        action="append",
        metavar="NAME",
        help="also pass this variable to an ACP child's agent (repeatable)",
    )
    send.add_argument("--json", action="store_true")
    send.set_defaults(fn=cmd_send)
