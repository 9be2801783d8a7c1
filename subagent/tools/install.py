"""Putting the subagent tools in front of agents: runtime-wide, or for one agent's subtree.

Two placements, one depth rule (an agent whose child would pass a tool's `max_depth` must not
see that tool):

- runtime-wide (`install_subagent_tools(runtime)`): the tools go into the global registry, so a
  child's `tool_filter` may name them; each agent at a tool's cap gets a `deny` restriction on
  it when it is published (created or resumed), which hides it from `specs()` and refuses a
  forged call (visibility is authority in `ToolScope`).
- one agent (`install_subagent_tools(agent)`): the tools go into that agent's own scope and,
  with `inherit=True`, into every descendant's scope as it is published, each only below the
  cap. A child filter cannot name them (they are added after the filter), so an allow-list child
  simply does not get them.

The delegation tool also refuses at run time, whatever the placement.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from actors.agent_handle import Agent
from agent.context import AgentContext
from agent.prompt import PromptError, check_template
from agent.tools import Tool, ToolScope
from providers.inprocess import InProcessProvider
from subagent.errors import SubagentError
from subagent.live import task_service
from subagent.service import SubagentService
from subagent.tools.control import interrupt_agent_tool, list_agents_tool, send_message_tool
from subagent.tools.delegate import SubagentToolConfig, subagent_tool
from subagent.tools.task_tools import task_kill_tool, task_output_tool

if TYPE_CHECKING:
    from subagent.runtime import Runtime

__all__ = ["install_subagent_tools", "resolve_configs"]

ToolSpecArg = SubagentToolConfig | str


def resolve_configs(
    service: SubagentService, tools: Sequence[ToolSpecArg] | None
) -> list[tuple[SubagentToolConfig, str]]:
    """Configs with their final tool names. A lone unnamed tool is called `subagent`."""
    if tools is None:
        tools = [p.name for p in service.providers()]
    configs = [SubagentToolConfig(provider=t) if isinstance(t, str) else t for t in tools]
    for c in configs:
        if not isinstance(c, SubagentToolConfig):
            raise TypeError(f"expected a SubagentToolConfig or provider name, got {c!r}")
    lone = len(configs) == 1
    out = [(c, "subagent" if (lone and c.name is None) else c.tool_name()) for c in configs]
    names = [n for _, n in out]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"two delegation tools would be named {', '.join(dupes)}")
    return out


def install_subagent_tools(
    target: Runtime | AgentContext | Agent,
    service: SubagentService | None = None,
    *,
    tools: Sequence[ToolSpecArg] | None = None,
    control: bool = True,
    task_tools: bool = True,
    inherit: bool = True,
) -> Callable[[], None]:
    """Install the delegation tools (one per config) and the control/task tools.

    `target` is a `Runtime`, an `AgentContext` (runtime-wide) or an `Agent` (its subtree).
    Returns an idempotent uninstall function (agents already published keep their scopes).
    """
    root: Agent | None = None
    if isinstance(target, AgentContext):
        ctx = target
    elif isinstance(target, Agent):
        ctx, root = target.ctx, target
    else:
        found = getattr(target, "ctx", None)  # a Runtime
        if not isinstance(found, AgentContext):
            kind = type(target).__name__
            raise TypeError(f"target must be a Runtime, an AgentContext or an Agent, got {kind}")
        ctx = found
    if service is None and isinstance(ctx.subagents, SubagentService):
        service = ctx.subagents
    if service is None:
        raise ValueError("no SubagentService: pass service= or use a Runtime")
    configs = resolve_configs(service, tools)
    delegation: list[tuple[SubagentToolConfig, Tool]] = [
        (c, subagent_tool(service, c, name=n)) for c, n in configs
    ]
    extra: list[Tool] = []
    if control:
        extra += [
            send_message_tool(service),
            interrupt_agent_tool(service),
            list_agents_tool(service),
        ]
    if task_tools:
        tasks = task_service(ctx)
        if tasks is None:
            raise ValueError("task tools need ctx.tasks (use a Runtime)")
        extra += [task_output_tool(tasks), task_kill_tool(tasks)]
    _check_at_install(ctx, service, delegation, extra if root is None else [])
    undo: list[Callable[[], None]] = []
    if root is not None:
        hook = _subtree_installer(root, delegation, extra, inherit)
    else:
        for _, tool in delegation:
            undo.append(ctx.tools.register(tool))
        for tool in extra:
            undo.append(ctx.tools.register(tool))
        hook = _cap_hider(delegation)
        for agent in list(ctx.agents.values()):
            if isinstance(agent, Agent):  # it always is: the face's class, as published
                hook(agent)
    unhook = ctx.lifecycle.on_published(hook)

    def uninstall() -> None:
        unhook()
        while undo:
            undo.pop()()

    return uninstall


def _check_at_install(
    ctx: AgentContext,
    service: SubagentService,
    delegation: list[tuple[SubagentToolConfig, Tool]],
    installed: list[Tool],
) -> None:
    """What every call would otherwise fail on, checked once where it is known: an in-process
    child's persona renders with this runtime's variables and its filter reads this runtime's
    tools (with the tools a runtime-wide install adds, `installed`). Another provider's child
    (Ray, ACP) has its own, so its persona and filter are checked when it starts."""
    for config, tool in delegation:
        if not isinstance(service.get(config.provider), InProcessProvider):
            continue
        if config.persona is not None:
            try:
                check_template(config.persona, ctx.variables)
            except PromptError as exc:
                raise ValueError(
                    f"tool {tool.name!r}: persona template: {exc} "
                    "(register the variable before installing; its value may come later)"
                ) from None
        if config.tool_filter is not None:
            scope = ToolScope(ctx.tools)  # what a child's scope starts from (providers/inprocess)
            for other in (*(t for _, t in delegation), *installed):
                scope.add(other)
            try:
                scope.apply(config.tool_filter)
            except SubagentError as exc:
                raise SubagentError(
                    exc.code,
                    f"tool {tool.name!r}: {exc.detail} "
                    "(register the tools a filter names before installing)",
                ) from None


def _cap_hider(delegation: list[tuple[SubagentToolConfig, Tool]]) -> Callable[[Agent], None]:
    def hide(agent: Agent) -> None:
        hidden = [t.name for c, t in delegation if c.hidden_for(agent.depth)]
        if hidden:
            agent.tools.restrict(deny=hidden)

    return hide


def _subtree_installer(
    root: Agent,
    delegation: list[tuple[SubagentToolConfig, Tool]],
    extra: list[Tool],
    inherit: bool,
) -> Callable[[Agent], None]:
    members = {root.id}

    def install(agent: Agent) -> None:
        for config, tool in delegation:
            if not config.hidden_for(agent.depth):
                agent.tools.add(tool)
        for tool in extra:
            agent.tools.add(tool)

    install(root)

    def on_published(agent: Agent) -> None:
        if not inherit or agent is root:
            return
        if agent.header.parent_session in members:
            members.add(agent.id)
            install(agent)

    return on_published
