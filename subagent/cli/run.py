"""`subagent run`: a real root agent with the subagent tools, or a relay to an ACP agent."""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Mapping
from typing import Any

from subagent.cli.common import (
    EXIT_INTERRUPTED,
    CliError,
    flat_text,
    make_console,
    model_registry,
    model_route,
    store_root,
)
from subagent.cli.live import drive, report_stopped

__all__ = ["CLI_GC_FREEZE_EVERY", "cmd_run", "register"]

# See docs/performance.md (fanout): freezing the live heap every N starts.
CLI_GC_FREEZE_EVERY = 1_000


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
        raise CliError(
            "run needs --model NAME (with --base-url URL or $OPENAI_BASE_URL), "
            "--model anthropic:NAME, or --acp"
        )
    console = make_console()
    root_dir = store_root(args)
    root_dir.mkdir(parents=True, exist_ok=True)
    relay = {"prompt": args.prompt}

    def relay_model(request: Any) -> Any:
        last = request.messages[-1]
        if last.get("role") == "tool":
            return S.text(flat_text(last.get("content", ()), 100_000))
        return S.tool_call("subagent", {"description": "acp task", "prompt": relay["prompt"]})

    rt = Runtime(
        store=SessionStore(root_dir),
        models=model_registry(args),
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
            prefix, name = model_route(args.model)
            options = AgentOptions(model=f"{prefix}:{name}", token_budget=args.max_total_tokens)
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

        outcome, stopped = drive(console, tree, work, not args.no_live, interrupt)
        if tree.descendants():
            console.print(tree.render())
        reply = flat_text(outcome.output, 100_000) if outcome is not None else ""
        spent = root.usage.subtree
        if spent or args.max_total_tokens is not None:
            # Before the answer, so the answer stays the last thing printed.
            console.print(usage_line(spent, args.max_total_tokens), markup=False)
        console.print(reply or "(no output)")
        report_stopped(console, stopped)
        if stopped is not None:
            return EXIT_INTERRUPTED
        if outcome is not None and outcome.reason != "completed":
            why = outcome.message or outcome.cause
            raise CliError(f"the root turn ended {outcome.reason}" + (f": {why}" if why else ""))
        return 0
    finally:
        rt.close()


def usage_line(usage: Mapping[str, int], budget: int | None = None) -> str:
    """The final summary's token line, for the whole tree."""
    from agent.usage import total_tokens

    total = total_tokens(usage)
    parts = [
        f"{usage.get('input_tokens', 0):,} input",
        f"{usage.get('output_tokens', 0):,} output",
    ]
    cache_read = usage.get("cache_read_input_tokens", 0)
    cache_write = usage.get("cache_creation_input_tokens", 0)
    if cache_read or cache_write:
        parts.append(f"{cache_read:,} cache read")
        parts.append(f"{cache_write:,} cache write")
    line = f"tokens (whole tree): {total:,} = " + ", ".join(parts)
    if budget is not None:
        line += f"  (budget {budget:,})"
    return line


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def register(sub: Any) -> None:
    from agent.models.http import DEFAULT_MAX_RETRIES, DEFAULT_READ_TIMEOUT

    run = sub.add_parser("run", help="a real root agent with the subagent tools")
    run.add_argument("prompt")
    run.add_argument(
        "--base-url", help="an OpenAI-compatible endpoint (vLLM, llama.cpp, Ollama, OpenAI)"
    )
    run.add_argument(
        "--model",
        help="the model name at that endpoint, or anthropic:NAME for the Anthropic Messages API",
    )
    run.add_argument(
        "--acp", metavar="COMMAND", help="run the task on an ACP agent started by COMMAND"
    )
    run.add_argument("--max-depth", type=int, default=3, metavar="D")
    run.add_argument(
        "--max-total-tokens",
        type=_positive_int,
        metavar="N",
        help="token budget of the whole tree (input, output and cache tokens)",
    )
    run.add_argument(
        "--timeout",
        type=_positive_float,
        metavar="SECONDS",
        help=f"give up a model request attempt after this long without data "
        f"(default {DEFAULT_READ_TIMEOUT:g})",
    )
    run.add_argument(
        "--max-retries",
        type=_non_negative_int,
        metavar="N",
        help=f"retries of a failed model request (default {DEFAULT_MAX_RETRIES})",
    )
    run.add_argument("--no-live", action="store_true")
    run.set_defaults(fn=cmd_run)
