"""`subagent run`: a real root agent with the subagent tools, or a relay to an ACP agent."""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from subagent.cli.common import (
    EXIT_INTERRUPTED,
    CliError,
    UsageError,
    answer_text,
    http_url,
    int_between,
    make_console,
    model_registry,
    model_route,
    non_negative_int,
    positive_int,
    read_prompt,
    require_model_ready,
    store_root,
)
from subagent.cli.live import drive, report_stopped
from subagent.cli.quiet import Quiescence
from subagent.limits import DEFAULT_MAX_CHILDREN_PER_PARENT, MAX_CHILDREN_PER_PARENT

if TYPE_CHECKING:  # annotations only: each command imports what it uses when it runs
    from agent.loop import TurnOutcome
    from agent.model import ModelRequest
    from agent.models import scripted as S
    from agent.usage import PriceTable
    from subagent.cli.common import Subcommands

__all__ = ["CLI_GC_FREEZE_EVERY", "cmd_run", "register"]

# See docs/performance.md (fanout): freezing the live heap every N starts.
CLI_GC_FREEZE_EVERY = 1_000


def cmd_run(args: argparse.Namespace) -> int:
    from agent import tracing
    from agent.models import scripted as S
    from agent.options import AgentOptions
    from agent.store import SessionStore
    from providers.inprocess import ForkProvider, SpawnProvider
    from subagent.cli_tree import TreeModel
    from subagent.runtime import Runtime
    from subagent.tools import PROVIDER_MANAGED, SubagentToolConfig, install_subagent_tools

    if args.acp is not None and (args.base_url or args.model):
        raise UsageError("use either --acp or --base-url/--model, not both")
    if args.acp_env and args.acp is None:
        raise UsageError("--acp-env needs --acp")
    if args.acp is None and not args.model:
        raise UsageError(
            "run needs --model NAME (with --base-url URL or $OPENAI_BASE_URL), "
            "--model anthropic:NAME, or --acp"
        )
    if args.acp is not None and (args.max_cost is not None or args.max_total_tokens is not None):
        raise UsageError(
            "budgets cannot hold an ACP agent (its usage is not visible): "
            "--max-total-tokens and --max-cost need --model"
        )
    prices = _load_prices(args.prices)
    if args.max_cost is not None:
        route = ":".join(model_route(args.model))
        if prices.get(route) is None:
            raise CliError(
                f"--max-cost needs a price for {route!r}: give --prices FILE with that route "
                "(or its prefix:*)"
            )
    words = shlex.split(args.acp) if args.acp is not None else []
    if args.acp is not None and not words:
        raise UsageError("--acp needs a command")
    prompt = read_prompt(args.prompt, args.prompt_file)
    models = model_registry(args)
    if args.model:  # before the store's directory exists: a refused run leaves nothing
        require_model_ready(models, args.model)
    console = make_console()
    root_dir = SessionStore(store_root(args)).ensure_root()  # 0700 whatever the umask
    # The ACP relay's one delegation: its error, if the child could not answer.
    relay_failure: list[str] = []

    def relay_model(request: ModelRequest) -> S.Step:
        last = request.messages[-1]
        if last.get("role") == "tool":
            text = answer_text(last.get("content", ()))
            if last.get("is_error"):
                relay_failure.append(_failure_line(text))
            return S.text(text)
        return S.tool_call("subagent", {"description": "acp task", "prompt": prompt})

    rt = Runtime(
        store=SessionStore(root_dir),
        models=models,
        scripted=S.ScriptedModel(relay_model),
        # The CLI owns its process, so it may take the process-wide collector knob the library
        # leaves opt-in: a wide fan-out then does not stall the hub in full collections.
        gc_freeze_every=CLI_GC_FREEZE_EVERY,
        prices=prices,
        max_children_per_parent=args.max_children_per_parent,
    )
    try:
        if words:
            from providers.acp import AcpConfig, AcpProvider

            config = AcpConfig(command=words[0], args=words[1:], pass_env=args.acp_env or ())
            rt.subagents.register(AcpProvider(config))
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
            options = AgentOptions(
                model=f"{prefix}:{name}",
                token_budget=args.max_total_tokens,
                cost_budget=args.max_cost,
            )
        install_subagent_tools(rt, tools=tools)
        root = rt.agent(options=options)
        tree = TreeModel(rt.ctx, root.id, "root")
        tree.attach(rt.subagents, root)
        console.print(f"session: {root.id}  store: {root_dir}")

        def work() -> TurnOutcome | None:
            with tracing.root_span("subagent run"):  # the trace's root (docs/tracing.md)
                root.send(prompt, trace=tracing.ambient("root")).get()
                return Quiescence(
                    root, rt.tasks, barrier=rt.subagents.providers, runs=rt.subagents.runs
                ).wait()

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
        if stopped is None:  # Ctrl-C ends the wait early: what it stopped is reported
            tree.finish(outcome)
        if tree.descendants():
            console.print(tree.render())
        if relay_failure and stopped is None:
            # The relay only carries the ACP agent's answer: without one the command failed.
            raise CliError(relay_failure[0])
        reply = answer_text(outcome.output) if outcome is not None else ""
        spent = root.usage.subtree
        if spent or args.max_total_tokens is not None:
            # Before the answer, so the answer stays the last thing printed.
            console.print(usage_line(spent, args.max_total_tokens))
        if len(prices) and (spent or args.max_cost is not None):
            console.print(cost_line(root.usage.cost_spent, args.max_cost))
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


def _failure_line(text: str) -> str:
    """The relay's failure as the command's one error line: the headline and the diagnostic,
    which says what went wrong (it used to be cut at the headline, `Subagent failed with an
    error.`), without the partial output. A diagnostic's own lines (a stderr tail) are joined."""
    head = text.split("\nPartial output:", 1)[0]
    return " ".join(line.strip() for line in head.splitlines() if line.strip())


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


def cost_line(pico: int, budget: float | None = None) -> str:
    """The final summary's cost line, for the whole tree (priced responses only)."""
    from agent.usage import pico_to_usd

    line = f"cost (whole tree): ${pico_to_usd(pico):,.6f}"
    if budget is not None:
        line += f"  (budget ${budget:,.6f})"
    return line


def _load_prices(path: str | None) -> PriceTable:
    """The `--prices` table (empty without one); a bad file is a clean error."""
    from agent.usage import PriceTable

    if path is None:
        return PriceTable()
    try:
        return PriceTable.load(path)
    except OSError as exc:
        raise CliError(f"--prices: cannot read {path}: {exc.strerror or exc}") from None
    except (ValueError, TypeError) as exc:
        raise CliError(f"--prices: {exc}") from None


# More retries than this is a typo: with backoff between attempts, a run would never end.
MAX_RETRIES = 100


def _positive(unit: str) -> Callable[[str], float]:
    """An argparse type: a finite number above 0, its error naming `unit`."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not 0 < value < float("inf"):
            raise argparse.ArgumentTypeError(f"must be a positive number of {unit}, got {text!r}")
        return value

    return parse


def register(sub: Subcommands) -> None:
    from agent.models.http import DEFAULT_MAX_RETRIES, DEFAULT_READ_TIMEOUT

    run = sub.add_parser("run", help="a real root agent with the subagent tools")
    run.add_argument(
        "prompt",
        nargs="?",
        help="the task; - reads it from stdin, as does a pipe when PROMPT is left out",
    )
    run.add_argument(
        "--prompt-file", metavar="FILE", help="read the task from FILE (UTF-8; - for stdin)"
    )
    run.add_argument(
        "--base-url",
        type=http_url,
        help="an OpenAI-compatible endpoint (vLLM, llama.cpp, Ollama, OpenAI)",
    )
    run.add_argument(
        "--model",
        help="the model name at that endpoint, or anthropic:NAME for the Anthropic Messages API",
    )
    run.add_argument(
        "--acp", metavar="COMMAND", help="run the task on an ACP agent started by COMMAND"
    )
    run.add_argument(
        "--acp-env",
        action="append",
        metavar="NAME",
        help="pass this environment variable to the ACP agent (repeatable; e.g. its API key)",
    )
    run.add_argument(
        "--max-depth",
        type=non_negative_int,
        default=3,
        metavar="D",
        help="how deep delegation may go (default 3)",
    )
    run.add_argument(
        "--max-total-tokens",
        type=positive_int,
        metavar="N",
        help="token budget of the whole tree (input, output and cache tokens)",
    )
    run.add_argument(
        "--max-cost",
        type=_positive("USD"),
        metavar="USD",
        help="cost budget of the whole tree in USD (needs --prices with the model's route)",
    )
    run.add_argument(
        "--prices",
        metavar="FILE",
        help="price table: JSON or TOML (.toml) mapping model routes to USD per million "
        "input / output / cache_read / cache_write tokens",
    )
    run.add_argument(
        "--timeout",
        type=_positive("seconds"),
        metavar="SECONDS",
        help=f"give up a model request attempt after this long without data "
        f"(default {DEFAULT_READ_TIMEOUT:g})",
    )
    run.add_argument(
        "--max-retries",
        type=int_between(0, MAX_RETRIES),
        metavar="N",
        help=f"retries of a failed model request (default {DEFAULT_MAX_RETRIES})",
    )
    run.add_argument(
        "--max-children-per-parent",
        type=int_between(1, MAX_CHILDREN_PER_PARENT),
        default=DEFAULT_MAX_CHILDREN_PER_PARENT,
        metavar="N",
        help=f"children of one agent running at once; more wait for a slot "
        f"(default {DEFAULT_MAX_CHILDREN_PER_PARENT})",
    )
    run.add_argument("--no-live", action="store_true", help="print only the final tree")
    run.set_defaults(fn=cmd_run)
