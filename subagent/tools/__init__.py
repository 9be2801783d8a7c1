"""Model-facing tools over the subagent seam.

- `subagent` (one per provider, `subagent.tools.delegate`): delegate a task, foreground or
  background (one-shot task or continuable child).
- `send_message`, `interrupt_agent`, `list_agents` (`subagent.tools.control`).
- `task_output`, `task_kill` (`subagent.tools.task_tools`).

`install_subagent_tools(runtime_or_agent)` puts them in front of agents with the depth rule.
"""

from __future__ import annotations

from subagent.tools.control import (
    format_agent_rows,
    interrupt_agent_tool,
    list_agents_tool,
    send_message_tool,
)
from subagent.tools.delegate import (
    DEFAULT_MAX_DEPTH,
    PROVIDER_MANAGED,
    SubagentToolConfig,
    child_labels,
    describe_subagent_tool,
    failure_text,
    headline,
    output_text,
    subagent_tool,
)
from subagent.tools.install import install_subagent_tools, resolve_configs
from subagent.tools.task_tools import format_task, task_kill_tool, task_output_tool

__all__ = [
    "DEFAULT_MAX_DEPTH",
    "PROVIDER_MANAGED",
    "SubagentToolConfig",
    "child_labels",
    "describe_subagent_tool",
    "failure_text",
    "format_agent_rows",
    "format_task",
    "headline",
    "install_subagent_tools",
    "interrupt_agent_tool",
    "list_agents_tool",
    "output_text",
    "resolve_configs",
    "send_message_tool",
    "subagent_tool",
    "task_kill_tool",
    "task_output_tool",
]
