"""The model-facing `subagent` tool: one per provider, built from a `SubagentToolConfig`.

The tool turns the model's `{description, prompt, run_in_background?}` into a
`SubagentStartRequest` and maps the outcome back to a tool result. Three ways to run:

- foreground: the call waits for the child; the child's signal is the tool call's signal, so
  cancelling the parent's turn cancels the child. A non-`completed` result is an error result
  (headline, diagnostic, partial output). The run is disposed exactly once, whatever happens.
- background one-shot: the run becomes an adopted task in `ctx.tasks`, settled by
  `subagent.settlement` (the path continuable activations take too); `task_output` reads it.
- background continuable: `start_continuable`; the model gets the child id for `send_message`.

The depth cap is enforced twice on purpose: the tool is hidden from agents at the cap (see
`subagent.tools.install`) and refused when called anyway (a forged call, a lifted filter).
"""

from __future__ import annotations

import logging
import re
import weakref
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal

from actors.registry_actor import MAX_SAFE_INTEGER
from agent import tracing
from agent.context import AgentContext
from agent.options import AgentOptions
from agent.prompt import PromptError, template_names
from agent.tools import Tool, ToolContext, ToolError
from agent.usage import usd_to_pico
from subagent import settlement
from subagent.errors import SubagentError
from subagent.live import calling_agent, task_service
from subagent.settlement import headline, output_text
from subagent.types import (
    ABORTED,
    BUDGET_EXCEEDED,
    COMPLETED,
    ERROR,
    MAX_TOKENS,
    REFUSAL,
    SubagentResult,
    SubagentStartRequest,
    ToolRestriction,
    text_block,
)
from supervision.signal import AbortController, AbortSignal

if TYPE_CHECKING:
    from actors.agent_handle import Agent
    from subagent.service import RunHandle, SubagentService
    from subagent.tasks import Task, TaskService

__all__ = [
    "DEFAULT_MAX_DEPTH",
    "KEPT_LABELS",
    "MAX_MESSAGE_CHARS",
    "PROVIDER_MANAGED",
    "ChildLabels",
    "SubagentToolConfig",
    "child_labels",
    "describe_subagent_tool",
    "failure_text",
    "headline",
    "output_text",
    "subagent_tool",
]

DEFAULT_MAX_DEPTH: Final = 3
PROVIDER_MANAGED: Final = "provider-managed"

BackgroundMode = Literal["one-shot", "continuable"]

log = logging.getLogger(__name__)

_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")

# Labels kept per runtime context: the newest children's. A server started once and asked for
# children without end would otherwise hold one label per child it ever started.
KEPT_LABELS: Final = 10_000


class ChildLabels(MutableMapping[str, str]):
    """Child id -> the description its delegating call gave, the newest `bound` kept (oldest
    set first out). Display only: the CLI's live tree, listings and progress lines show it;
    nothing decides anything from it, so a forgotten one only shows as no label."""

    __slots__ = ("_bound", "_labels")

    def __init__(self, bound: int = KEPT_LABELS) -> None:
        if bound < 1:
            raise ValueError("bound must be positive")
        self._bound = bound
        self._labels: dict[str, str] = {}

    def __setitem__(self, child_id: str, label: str) -> None:
        labels = self._labels
        labels.pop(child_id, None)  # set again: the newest now
        labels[child_id] = label
        if len(labels) > self._bound:
            del labels[next(iter(labels))]

    def __getitem__(self, child_id: str) -> str:
        return self._labels[child_id]

    def __delitem__(self, child_id: str) -> None:
        del self._labels[child_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._labels)

    def __len__(self) -> int:
        return len(self._labels)


_LABELS: weakref.WeakKeyDictionary[AgentContext, ChildLabels] = weakref.WeakKeyDictionary()


def child_labels(ctx: AgentContext) -> ChildLabels:
    """The labels the subagent tools recorded for children of this runtime context."""
    labels = _LABELS.get(ctx)
    if labels is None:
        labels = _LABELS[ctx] = ChildLabels()
    return labels


@dataclass(frozen=True, slots=True)
class SubagentToolConfig:
    """How one delegation tool behaves. `name=None` picks a name at install time."""

    provider: str
    name: str | None = None
    max_depth: int | Literal["provider-managed"] = DEFAULT_MAX_DEPTH
    tool_filter: ToolRestriction | None = None
    persona: str | None = None
    agent_options: AgentOptions | None = None
    background: BackgroundMode = "one-shot"
    # Background one-shot: tell the parent when the child settles (a `subagent-settled` message).
    notify_parent: bool = True
    # Each child's token budget (its subtree's), clamped to what the parent has left.
    token_budget: int | None = None
    # Each child's cost budget in USD (needs a price table), clamped the same way.
    cost_budget: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.provider, str) or not self.provider:
            raise ValueError("provider must be a non-empty string")
        if self.name is not None and not isinstance(self.name, str):
            raise TypeError("name must be a string or None")
        md = self.max_depth
        if md != PROVIDER_MANAGED and (
            not isinstance(md, int) or isinstance(md, bool) or not 0 <= md <= MAX_SAFE_INTEGER
        ):
            # The bound is the one every start checks: past it, each call would fail instead.
            raise ValueError(
                f"max_depth must be an int in [0, 2**53-1] or {PROVIDER_MANAGED!r}, got {md!r}"
            )
        if self.background not in ("one-shot", "continuable"):
            raise ValueError("background must be 'one-shot' or 'continuable'")
        if self.tool_filter is not None and not isinstance(self.tool_filter, ToolRestriction):
            raise TypeError("tool_filter must be a ToolRestriction or None")
        if self.persona is not None:
            if not isinstance(self.persona, str):
                raise TypeError("persona must be a string or None")
            try:
                # A malformed group is wrong in any runtime: refused here, not at every call.
                template_names(self.persona)
            except PromptError as exc:
                raise ValueError(f"persona template: {exc}") from None
        if self.agent_options is not None and not isinstance(self.agent_options, AgentOptions):
            raise TypeError("agent_options must be an AgentOptions or None")
        tb = self.token_budget
        if tb is not None and (not isinstance(tb, int) or isinstance(tb, bool) or tb < 1):
            raise ValueError(f"token_budget must be a positive int or None, got {tb!r}")
        if self.cost_budget is not None and usd_to_pico(self.cost_budget, "cost_budget") <= 0:
            raise ValueError(
                f"cost_budget must be a positive number or None, got {self.cost_budget!r}"
            )

    @property
    def depth_cap(self) -> int | None:
        """The absolute child depth cap, or None when the provider manages depth."""
        return None if self.max_depth == PROVIDER_MANAGED else int(self.max_depth)

    def tool_name(self) -> str:
        if self.name is not None:
            return self.name
        return "subagent_" + _NAME_UNSAFE.sub("_", self.provider)

    def hidden_for(self, depth: int) -> bool:
        """Whether an agent at `depth` must not see this tool: its child would pass the cap."""
        cap = self.depth_cap
        return cap is not None and depth + 1 > cap


# The longest prompt (and `send_message` message) a model may write: twice what the largest
# output limits of today's models let one reply hold (~128k tokens, ~0.5 MB of text). A model's
# prompt is copied into the child's log, its history and every one of its requests; 50 MB of it
# held the hub for most of a second in each of them. Past it the call is `INVALID_ARGS`.
MAX_MESSAGE_CHARS: Final = 1 << 20

PARAMETERS: Final[Mapping[str, Any]] = {
    "type": "object",
    "properties": {
        "description": {
            "type": "string",
            "minLength": 1,
            "maxLength": 200,
            "description": "A short (3-8 word) label for the task, shown in listings.",
        },
        "prompt": {
            "type": "string",
            "minLength": 1,
            "maxLength": MAX_MESSAGE_CHARS,
            "description": "The task for the subagent: what to do and what to report back.",
        },
        "run_in_background": {
            "type": "boolean",
            "description": "Return at once instead of waiting for the subagent's answer.",
        },
    },
    "required": ["description", "prompt"],
    "additionalProperties": False,
}


def describe_subagent_tool(config: SubagentToolConfig, inherits_parent_context: bool) -> str:
    """The model-facing description; the context sentence follows the provider's truth."""
    if inherits_parent_context:
        context = (
            "The subagent starts with a copy of this conversation up to your last completed "
            "turn, so the prompt may refer to what was said before; it does not see the "
            "current turn, so restate anything from it that the task needs."
        )
    else:
        context = (
            "The subagent does NOT see this conversation: it starts fresh, so the prompt must "
            "stand alone and carry every fact, file path and constraint the task needs."
        )
    if config.background == "continuable":
        background = (
            "With run_in_background=true the call returns at once with the subagent's id; the "
            "subagent keeps its session, reports back to you when each activation settles, "
            "and you can message it later with send_message."
        )
    else:
        background = (
            "With run_in_background=true the call returns at once with a task id; read the "
            "result later with task_output, or stop it with task_kill."
        )
    return (
        f"Delegate a self-contained task to a subagent (provider {config.provider!r}). "
        f"{context} By default you wait and receive the subagent's final answer. {background} "
        "Independent tasks may be delegated in parallel with several calls in one step."
    )


_CODES: Final = {
    ABORTED: "SUBAGENT_ABORTED",
    ERROR: "SUBAGENT_ERROR",
    MAX_TOKENS: "SUBAGENT_MAX_TOKENS",
    REFUSAL: "SUBAGENT_REFUSAL",
    BUDGET_EXCEEDED: "SUBAGENT_BUDGET_EXCEEDED",
}


def failure_text(result: SubagentResult, child_id: str | None = None) -> str:
    """Headline, then the diagnostic, then whatever partial output there is."""
    lines = [headline(result.stop_reason)]
    if child_id:
        lines.append(f"Subagent id: {child_id}")
    if result.diagnostic:
        lines.append(f"Diagnostic: {result.diagnostic}")
    partial = output_text(result)
    lines.append(f"Partial output:\n{partial}" if partial else "Partial output: (none)")
    return "\n".join(lines)


def _abandon(handle: RunHandle, controller: AbortController | None, cause: BaseException) -> None:
    """Stop a started run that nothing took ownership of: cancel, then dispose (which returns
    once its end is emitted). A failure of the dispose itself is logged, never raised over
    `cause`, which is what the caller must see."""
    why = f"the start could not complete: {type(cause).__name__}: {cause}"
    try:
        if controller is not None:
            controller.abort(why)
        handle.cancel(why)
        handle.dispose()
    except Exception:
        log.exception("disposing abandoned run %s failed", handle.id)


def _tool_error(exc: SubagentError) -> ToolError:
    return ToolError(f"Could not start the subagent: {exc.detail} ({exc.code})", code=exc.code)


def _tell_caller(ctx: ToolContext, child_id: str) -> None:
    """Name the child this call started to whoever runs the call (see `ToolContext.on_child`)."""
    if ctx.on_child is not None:
        ctx.on_child(child_id)


class _Delegate:
    """The tool function, bound to its service and config."""

    def __init__(self, service: SubagentService, config: SubagentToolConfig, name: str) -> None:
        self.service = service
        self.config = config
        self.name = name

    def __call__(self, arguments: Mapping[str, Any], ctx: ToolContext) -> str:
        agent = calling_agent(ctx)
        depth = agent.depth
        if self.config.hidden_for(depth):
            raise ToolError(
                f"{self.name} is not available at delegation depth {depth} "
                f"(max_depth {self.config.max_depth})",
                code="DEPTH_EXCEEDED",
            )
        # A label is one line wherever it is shown (listings, progress, notices): a newline in
        # it would let a model forge rows of `list_agents` for whoever reads them.
        description = " ".join(str(arguments["description"]).split())
        if not description:
            raise ToolError(
                f"invalid arguments for {self.name}: description is blank", code="INVALID_ARGS"
            )
        prompt = [text_block(str(arguments["prompt"]))]
        background = bool(arguments.get("run_in_background", False))
        if background and self.config.background == "continuable":
            return self._continuable(agent, description, prompt, ctx)
        if background:
            return self._one_shot(agent, description, prompt, ctx)
        return self._foreground(agent, description, prompt, ctx)

    def _request(
        self,
        agent: Agent,
        prompt: list[dict[str, Any]],
        signal: AbortSignal,
        trace: tracing.TraceParent | None = None,
    ) -> SubagentStartRequest:
        c = self.config
        return SubagentStartRequest(
            prompt=prompt,
            parent=agent,
            signal=signal,
            agent_options=c.agent_options,
            max_depth=c.depth_cap,
            tool_filter=c.tool_filter,
            persona=c.persona,
            token_budget=c.token_budget,
            cost_budget=c.cost_budget,
            trace=trace,
        )

    def _start(self, agent: Agent, request: SubagentStartRequest, description: str) -> RunHandle:
        try:
            handle = self.service.start(self.config.provider, request)
        except SubagentError as exc:
            raise _tool_error(exc) from exc
        child_labels(agent.ctx)[handle.id] = description
        return handle

    def _foreground(
        self, agent: Agent, description: str, prompt: list[dict[str, Any]], ctx: ToolContext
    ) -> str:
        trace = tracing.named(ctx.trace, description)
        handle = self._start(agent, self._request(agent, prompt, ctx.signal, trace), description)
        try:
            _tell_caller(ctx, handle.id)
            result = handle.result.get()
        finally:
            handle.dispose()
        if result.stop_reason != COMPLETED:
            raise ToolError(
                failure_text(result), code=_CODES.get(result.stop_reason, "SUBAGENT_FAILED")
            )
        return output_text(result)

    def _one_shot(
        self, agent: Agent, description: str, prompt: list[dict[str, Any]], ctx: ToolContext
    ) -> str:
        tasks = task_service(agent.ctx)
        if tasks is None:
            raise ToolError("background subagents need ctx.tasks", code="CONTINUATION_UNAVAILABLE")
        # The child outlives this call, so it gets its own signal; the task's kill aborts it.
        controller = AbortController()
        trace = tracing.named(ctx.trace, description)
        request = self._request(agent, prompt, controller.signal, trace)
        handle = self._start(agent, request, description)
        task: Task | None = None
        try:
            _tell_caller(ctx, handle.id)
            task = tasks.adopt(
                description,
                agent.id,
                kill=lambda reason: controller.abort(reason),
                subject=handle.id,
            )
            tasks.watch(self._watch, agent, tasks, handle, task.id, description)
        except BaseException as exc:
            # Nothing owns the started child yet: it must not be left running or undisposed.
            _abandon(handle, controller, exc)
            if task is not None:
                tasks.settle(task.id, "failed", detail=f"{type(exc).__name__}: {exc}")
            if isinstance(exc, SubagentError):
                raise _tool_error(exc) from exc
            raise
        return (
            f"Started subagent {handle.id} in the background as task {task.id}. "
            f"Read its result with task_output(task_id={task.id!r}); "
            f"stop it with task_kill(task_id={task.id!r})."
        )

    def _watch(
        self, agent: Agent, tasks: TaskService, handle: RunHandle, task_id: str, description: str
    ) -> None:
        """Settle the task when the child ends (the path continuation shares), then tell the
        parent where to read the result."""
        try:
            outcome = settlement.outcome_of(handle.result)
        finally:
            handle.dispose()
        settlement.settle_task(tasks, task_id, outcome)
        if self.config.notify_parent and agent.ctx.agents.get(agent.id) is agent:
            summary = settlement.summary(description, handle.id, outcome)
            note = f"{summary} Read the result with task_output(task_id={task_id!r})."
            settlement.tell_parent(agent, [text_block(note)], summary)

    def _continuable(
        self, agent: Agent, description: str, prompt: list[dict[str, Any]], ctx: ToolContext
    ) -> str:
        request = self._request(agent, prompt, ctx.signal, tracing.named(ctx.trace, description))
        try:
            started = self.service.start_continuable(
                self.config.provider, request, label=description
            )
        except SubagentError as exc:
            raise _tool_error(exc) from exc
        child_labels(agent.ctx)[started.child_id] = description
        _tell_caller(ctx, started.child_id)
        return (
            f"Started continuable subagent {started.child_id} (task {started.task_id}). It "
            "reports back when its activation settles; send follow-ups with "
            f"send_message(subagent_id={started.child_id!r}, message=...)."
        )


def subagent_tool(
    service: SubagentService, config: SubagentToolConfig, *, name: str | None = None
) -> Tool:
    """Build the delegation tool for `config.provider` (which must be registered)."""
    provider = service.get(config.provider)
    if provider is None:
        raise SubagentError("NO_PROVIDER", f"no provider named {config.provider!r}")
    caps = provider.capabilities
    needs = [
        ("max_depth", config.depth_cap is not None, caps.depth_limit),
        ("tool_filter", config.tool_filter is not None, caps.tool_filter),
        ("persona", config.persona is not None, caps.persona),
        ("token_budget", config.token_budget is not None, caps.token_budget),
        ("cost_budget", config.cost_budget is not None, caps.token_budget),
    ]
    missing = [what for what, wanted, has in needs if wanted and not has]
    if missing:
        hint = " (use max_depth='provider-managed')" if "max_depth" in missing else ""
        raise SubagentError(
            "UNSUPPORTED_CAPABILITY",
            f"provider {config.provider!r} does not support {', '.join(missing)}{hint}",
        )
    tool_name = name or config.tool_name()
    fn: Callable[[Mapping[str, Any], ToolContext], str] = _Delegate(service, config, tool_name)
    return Tool(
        name=tool_name,
        description=describe_subagent_tool(config, bool(provider.inherits_parent_context)),
        parameters=PARAMETERS,
        fn=fn,
        # Several delegations in one step run side by side: that is the point of fanning out.
        concurrency_safe=True,
    )
