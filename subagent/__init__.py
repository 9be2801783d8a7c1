"""subagent-runtime: let an LLM agent delegate work to child agents and keep control of them.

The public face. Names are loaded lazily so the seam vocabulary (`subagent.types`,
`subagent.errors`, `subagent.schema`) stays importable from every layer without cycles.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Runtime": "subagent.runtime",
    "SubagentService": "subagent.service",
    "RunHandle": "subagent.service",
    "SteerableRunHandle": "subagent.service",
    "SubagentError": "subagent.errors",
    "SubagentDepthError": "subagent.errors",
    "SubagentCapabilities": "subagent.types",
    "SubagentStartRequest": "subagent.types",
    "SubagentResumeRequest": "subagent.types",
    "SubagentResult": "subagent.types",
    "SubagentContinuation": "subagent.types",
    "SubagentProvider": "subagent.types",
    "SubagentRun": "subagent.types",
    "Steerable": "subagent.types",
    "Resumable": "subagent.types",
    "MessageSource": "subagent.types",
    "ToolRestriction": "subagent.types",
    "text_block": "subagent.types",
    "AgentOptions": "agent.options",
    "AbortController": "supervision.signal",
    "AbortSignal": "supervision.signal",
    "SpawnProvider": "providers.inprocess",
    "ForkProvider": "providers.inprocess",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'subagent' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
