"""The in-process providers: `spawn` (a fresh child) and `fork` (a child seeded with the parent's
completed turns). Both create an ordinary agent through the parent's context, with a new flat
tool scope, and support every start-time capability.

Creation is a transaction: the tool filter and persona are checked before anything exists, and
if the signal aborts or anything fails after the child session was created, the child is closed
and its session deleted before `start()` raises.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

from actors.agent_handle import Agent
from actors.agents import create_agent, resume_agent
from actors.local_run import LocalRun
from agent import tracing
from agent.log import SessionLog
from agent.options import AgentOptions
from agent.parent import ParentAgent, parent_agent
from agent.prompt import PERSONA_SECTION, PromptError, SystemPrompt
from agent.tools import Tool, ToolContext, ToolScope
from agent.usage import PICO, child_budget, child_cost_budget, usd_to_pico
from subagent.errors import SubagentError
from subagent.schema import check_output_schema
from subagent.types import (
    MessageSource,
    OptionsView,
    SubagentCapabilities,
    SubagentResumeRequest,
    SubagentStartRequest,
    ToolRestriction,
    depth_of,
)
from supervision.signal import AbortSignal

__all__ = ["ForkProvider", "InProcessProvider", "SpawnProvider", "structured_output_tool"]

STRUCTURED_OUTPUT_TOOL = "structured_output"
STRUCTURED_OUTPUT_SECTION = "subagent:structured-output"
STRUCTURED_OUTPUT_PROMPT = (
    "When you have your final answer, call the `structured_output` tool with it as the "
    "arguments. That call ends your turn; do not call any tool after it."
)


class _CaptureTool(Tool):
    """The capture tool. `structured_output_tool` held its parameters to the supported subset
    (`subagent.schema`), which implies a valid Draft 2020-12 schema, so the generic meta-schema
    check (~0.2 ms per property, on the hub, at every child start) is not repeated."""

    def _check_parameters(self) -> None:
        pass


def structured_output_tool(schema: Mapping[str, Any]) -> Tool:
    """A scoped capture tool whose parameters are the requested schema (`UNSUPPORTED_SCHEMA`
    unless it is in the supported subset; a large schema's verdict is usually remembered from
    its admission)."""
    check_output_schema(schema)

    def capture(arguments: Mapping[str, Any], ctx: ToolContext) -> str:
        ctx.caller.core.capture(dict(arguments))
        return "captured; your turn is complete"

    return _CaptureTool(
        name=STRUCTURED_OUTPUT_TOOL,
        description="Submit your final answer in the required structure. This ends your turn.",
        parameters=dict(schema),
        fn=capture,
    )


class InProcessProvider:
    """Shared machinery of spawn and fork; subclasses choose the seed."""

    capabilities = SubagentCapabilities.all()
    inherits_parent_context = False
    # Its start runs in the caller's greenlet and returns without waiting on anything remote
    # (a durable store's fsync at most): the registry may run it inside the one crossing that
    # admits and publishes the run (actors/registry_actor.py, `Start`).
    starts_in_place = True

    def __init__(self, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError("provider name must be a non-empty string")
        self._name = name
        self._source: MessageSource | None = None

    @property
    def name(self) -> str:
        return self._name

    def seed_for(self, parent: ParentAgent) -> Sequence[Mapping[str, Any]]:
        return []

    def start(self, request: SubagentStartRequest, *, session_id: str | None = None) -> LocalRun:
        """Create the child and begin its turn. `session_id` names the child's session where
        its starter minted the id (a Ray host: a one-shot child's log is under the run id its
        parent was told); a continuable child's is its continuation's, else a fresh one."""
        signal = request.signal
        if signal.aborted:
            _raise_if_aborted(signal)
        parent = parent_agent(request.parent)
        continuation = request.continuation
        if continuation is not None:
            if session_id not in (None, continuation.session_id):
                raise ValueError("session_id differs from the continuation's session id")
            session_id = continuation.session_id
        token_budget = request.token_budget
        agent = self._create_child(
            parent,
            options=_agent_options(request.agent_options),
            tool_filter=request.tool_filter,
            persona=request.persona,
            output_schema=request.output_schema,
            session_id=session_id,
            seed=self.seed_for(parent),
            depth=depth_of(request),
            token_budget=None
            if token_budget is None
            else child_budget(getattr(parent, "usage", None), token_budget),
            cost_budget=request.cost_budget,
        )
        try:
            if signal.aborted:
                _raise_if_aborted(signal)
            if continuation is not None:
                descriptor = continuation.descriptor
                data = descriptor.to_json() if hasattr(descriptor, "to_json") else descriptor
                # The first activation's traceparent rides along: a resumed one links to it.
                event = {"descriptor": data, **tracing.carrier(request.trace)}
                agent.before_first_request(
                    lambda: agent.core.add_event("subagent/descriptor", event)
                )
            run = LocalRun(
                agent, request.signal, wants_structured=request.output_schema is not None
            )
            # The prompt's source: one frozen `MessageSource` shared by the siblings a parent
            # starts in a row (it was made, and checked, once per child).
            source, parent_id = self._source, parent.id
            if source is None or source.sender_session_id != parent_id:
                source = self._source = MessageSource.coordinator(parent_id)
            run.begin(request.prompt, source, request.trace)
        except BaseException:
            _discard(agent)
            raise
        return run

    def resume(self, request: SubagentResumeRequest) -> LocalRun:
        """Rebuild a stored continuable child under the live parent and drive one turn."""
        _raise_if_aborted(request.signal)
        parent = parent_agent(request.parent)
        descriptor = request.descriptor
        ctx = parent.ctx
        options = _options_for(parent, None, descriptor.model).with_(
            token_budget=child_budget(
                getattr(parent, "usage", None), getattr(descriptor, "token_budget", None)
            ),
            cost_budget=_child_cost(parent, getattr(descriptor, "cost_budget", None)),
        )
        _check_priced(parent, options)
        tools, prompt = self._scopes(parent, descriptor.tool_filter, descriptor.persona, None)
        agent = resume_agent(ctx, request.session_id, options=options, tools=tools, prompt=prompt)
        try:
            _raise_if_aborted(request.signal)
            run = LocalRun(agent, request.signal)
            run.begin(request.prompt, request.source, request.trace)
        except BaseException:
            agent.close("resume failed")
            raise
        return run

    # -- creation ----------------------------------------------------------------------------

    def _scopes(
        self,
        parent: ParentAgent,
        tool_filter: ToolRestriction | None,
        persona: str | None,
        output_schema: Mapping[str, Any] | None,
    ) -> tuple[ToolScope, SystemPrompt]:
        ctx = parent.ctx
        tools = ToolScope(ctx.tools)
        if tool_filter is not None:
            tools.apply(tool_filter)
        prompt = SystemPrompt(parent=ctx.prompt)
        if persona is not None:
            if not isinstance(persona, str):
                raise TypeError("persona must be a string")
            try:
                prompt.set_section(PERSONA_SECTION, persona, order=0)
            except PromptError as exc:
                # A malformed group fails where the section is set, an unknown name where it
                # renders (below): either typo in a persona is the same START_FAILED.
                raise SubagentError("START_FAILED", f"persona template: {exc}") from exc
        if output_schema is not None:
            tools.add(structured_output_tool(output_schema), exempt=True)
            prompt.set_section(STRUCTURED_OUTPUT_SECTION, STRUCTURED_OUTPUT_PROMPT, order=1000)
        try:
            prompt.render(ctx.variables)
        except PromptError as exc:
            raise SubagentError("START_FAILED", f"persona template: {exc}") from exc
        return tools, prompt

    def _create_child(
        self,
        parent: ParentAgent,
        *,
        options: AgentOptions | None,
        tool_filter: ToolRestriction | None,
        persona: str | None,
        output_schema: Mapping[str, Any] | None,
        session_id: str | None,
        seed: Sequence[Mapping[str, Any]],
        depth: int,
        token_budget: int | None = None,
        cost_budget: float | None = None,
    ) -> Agent:
        options = _with_budget(
            _options_for(parent, options, None),
            token_budget,
            None if cost_budget is None else _child_cost(parent, cost_budget),
        )
        _check_priced(parent, options)
        tools, prompt = self._scopes(parent, tool_filter, persona, output_schema)
        return create_agent(
            parent.ctx,
            # The depth (computed by the registry, carried by the request) is the child's
            # header's, which Agent.depth reads: the options are copied only to carry a budget.
            options=options,
            cwd=parent.cwd,
            session_id=session_id,
            parent_session=parent.id,
            origin="subagent",
            delegation_depth=depth,
            seed=seed,
            tools=tools,
            prompt=prompt,
        )


class SpawnProvider(InProcessProvider):
    """A fresh child: it does not see the parent's conversation."""

    def __init__(self, name: str = "spawn") -> None:
        super().__init__(name)


class ForkProvider(InProcessProvider):
    """A child seeded with the parent's completed-turn prefix (the in-flight turn excluded)."""

    inherits_parent_context = True

    def __init__(self, name: str = "fork") -> None:
        super().__init__(name)

    def seed_for(self, parent: ParentAgent) -> Sequence[Mapping[str, Any]]:
        """The parent's completed turns as their payloads (`SessionLog.fork_seed`): the store
        copies and frames those bytes for the child, decoding none of them."""
        log = getattr(parent, "log", None)
        if not isinstance(log, SessionLog):
            raise TypeError("a fork needs a live parent agent (with its session log)")
        seed = log.fork_seed()
        return [] if seed is None else seed


# The default options of a child of a parent on route `model` (frozen, so siblings share one):
# a start without options of its own builds none. Bounded: one entry per route seen.
_DEFAULTS: dict[str, AgentOptions] = {}
_DEFAULTS_MAX = 64


def _default_options(model: str) -> AgentOptions:
    found = _DEFAULTS.get(model)
    if found is None:
        if len(_DEFAULTS) >= _DEFAULTS_MAX:
            _DEFAULTS.clear()
        found = _DEFAULTS[model] = AgentOptions(model=model)
    return found


def _options_for(
    parent: ParentAgent, options: AgentOptions | None, model: str | None
) -> AgentOptions:
    base = options if options is not None else _default_options(parent.options.model)
    if model is not None:
        base = base.with_(model=model)
    return base


def _with_budget(
    options: AgentOptions, token_budget: int | None, cost_budget: Decimal | None = None
) -> AgentOptions:
    if options.token_budget == token_budget and options.cost_budget == cost_budget:
        return options
    return options.with_(token_budget=token_budget, cost_budget=cost_budget)


def _agent_options(options: OptionsView | None) -> AgentOptions | None:
    """The request's options: an in-process child is built from real `AgentOptions`."""
    if options is not None and not isinstance(options, AgentOptions):
        raise TypeError("agent_options must be an AgentOptions or None")
    return options


def _raise_if_aborted(signal: AbortSignal) -> None:
    if signal.aborted:
        raise SubagentError("ABORTED", f"the start was aborted: {signal.reason}")


def _discard(agent: Agent) -> None:
    """Undo a creation: close the child and delete its session."""
    agent.close("start failed")
    store = agent.ctx.store
    if store.exists(agent.id):
        store.delete(agent.id)


def _child_cost(parent: ParentAgent, requested: float | None) -> Decimal | None:
    """The child's cost budget in USD: as asked, clamped to what the parent's chain has left."""
    if requested is None:
        return None
    pico = child_cost_budget(getattr(parent, "usage", None), usd_to_pico(requested, "cost_budget"))
    return None if pico is None else Decimal(pico) / PICO


def _check_priced(parent: ParentAgent, options: AgentOptions) -> None:
    """A cost budget on the child or above it needs the child's model route priced: an unpriced
    model would spend without being counted, so the child is refused before it exists."""
    account = getattr(parent, "usage", None)
    held = options.cost_budget is not None or (
        account is not None and account.cost_remaining() is not None
    )
    if held and parent.ctx.prices.get(options.model) is None:
        raise SubagentError(
            "NO_PRICE",
            f"model route {options.model!r} has no price in the runtime's price table, and a "
            "cost budget holds this child",
        )
