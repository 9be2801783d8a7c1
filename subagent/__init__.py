"""subagent-runtime: let an LLM agent delegate work to child agents and keep control of them.

The public face: everything a user of the library needs is importable from here, and the
README and docs import only from here. Internals live in the layers below (`supervision`,
`agent`, `actors`, `providers`) and may change without notice.

Names are loaded lazily, on first use: `import subagent` stays cheap, never imports Ray (the
Ray names need the `ray` extra only once a provider connects), and the seam vocabulary
(`subagent.types`, `subagent.errors`, `subagent.schema`, `subagent.descriptor`) stays
importable from every layer without cycles. `subagent.scripted` is the scripted stand-in model
with its step builders (`scripted.text(...)`, `scripted.tool_call(...)`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what a type checker sees; at run time `__getattr__` loads the same names
    from actors.agent_handle import Agent
    from actors.gevent_actor import GeventFuture
    from agent.errors import (
        ModelError,
        PromptError,
        SessionBusyError,
        SessionExistsError,
        SessionLogError,
        SessionNotFoundError,
        ToolError,
    )
    from agent.events import Event, SessionHeader
    from agent.http_client import tls_context
    from agent.model import (
        FinishReason,
        ModelAdapter,
        ModelRequest,
        ModelResponse,
        ProgressSink,
        ToolCall,
        ToolSpec,
    )
    from agent.models import ModelRegistry
    from agent.models.anthropic import AnthropicModel
    from agent.models.openai import OpenAIModel
    from agent.models.scripted import ScriptedModel
    from agent.options import AgentOptions
    from agent.prompt import PERSONA_SECTION, SystemPrompt
    from agent.store import MemoryStore, SessionStore
    from agent.tools import Tool, ToolContext, ToolFn, ToolRegistry, ToolResult
    from agent.usage import Price, PriceTable
    from providers.acp import AcpConfig, AcpProvider, ResumableAcpProvider, discover_acp_provider
    from providers.inprocess import ForkProvider, SpawnProvider
    from providers.ray import RayProvider
    from subagent.descriptor import SubagentDescriptor
    from subagent.errors import (
        ERROR_CODES,
        DescriptorError,
        ErrorCode,
        SubagentDepthError,
        SubagentError,
        UnknownTaskError,
        UnsupportedSchemaError,
    )
    from subagent.ray_config import RayConfig
    from subagent.runtime import Runtime
    from subagent.service import RunHandle, SteerableRunHandle, SubagentService
    from subagent.tasks import Task
    from subagent.tools import SubagentToolConfig, install_subagent_tools
    from subagent.types import (
        ABORTED,
        COMPLETED,
        ERROR,
        MAX_TOKENS,
        REFUSAL,
        ContentBlock,
        MessageSource,
        Resumable,
        Steerable,
        SubagentCapabilities,
        SubagentContinuation,
        SubagentProvider,
        SubagentResult,
        SubagentResumeRequest,
        SubagentRun,
        SubagentStartRequest,
        ToolRestriction,
        text_block,
    )
    from supervision.errors import AbortError, Cancelled, SubagentRuntimeError
    from supervision.signal import AbortController, AbortSignal

# Public name -> the module that defines it.
_EXPORTS = {
    # The runtime and its service.
    "Runtime": "subagent.runtime",
    "SubagentService": "subagent.service",
    "RunHandle": "subagent.service",
    "SteerableRunHandle": "subagent.service",
    "Agent": "actors.agent_handle",
    "AgentOptions": "agent.options",
    "Task": "subagent.tasks",
    "GeventFuture": "actors.gevent_actor",
    # Stores.
    "SessionStore": "agent.store",
    "MemoryStore": "agent.store",
    # Providers and their configurations.
    "SpawnProvider": "providers.inprocess",
    "ForkProvider": "providers.inprocess",
    "AcpConfig": "providers.acp",
    "AcpProvider": "providers.acp",
    "ResumableAcpProvider": "providers.acp",
    "discover_acp_provider": "providers.acp",
    "RayConfig": "subagent.ray_config",
    "RayProvider": "providers.ray",
    # Model adapters.
    "ModelAdapter": "agent.model",
    "ModelRequest": "agent.model",
    "ModelResponse": "agent.model",
    "ToolSpec": "agent.model",
    "ToolCall": "agent.model",
    "FinishReason": "agent.model",
    "ProgressSink": "agent.model",
    "ModelRegistry": "agent.models",
    "OpenAIModel": "agent.models.openai",
    "AnthropicModel": "agent.models.anthropic",
    "tls_context": "agent.http_client",  # a TLS context for the adapters (private CA, client cert)
    "ScriptedModel": "agent.models.scripted",
    # Prices (cost in usage, cost budgets).
    "Price": "agent.usage",
    "PriceTable": "agent.usage",
    # Tools, the system prompt.
    "Tool": "agent.tools",
    "ToolContext": "agent.tools",
    "ToolFn": "agent.tools",
    "ToolResult": "agent.tools",
    "ToolRegistry": "agent.tools",
    "SystemPrompt": "agent.prompt",
    "PERSONA_SECTION": "agent.prompt",
    "SubagentToolConfig": "subagent.tools",
    "install_subagent_tools": "subagent.tools",
    # Cancellation.
    "AbortController": "supervision.signal",
    "AbortSignal": "supervision.signal",
    # Errors: one tree under SubagentRuntimeError, one cancellation (supervision/errors.py).
    "SubagentRuntimeError": "supervision.errors",
    "Cancelled": "supervision.errors",
    "AbortError": "supervision.errors",
    "SubagentError": "subagent.errors",
    "SubagentDepthError": "subagent.errors",
    "ErrorCode": "subagent.errors",
    "ERROR_CODES": "subagent.errors",
    "UnsupportedSchemaError": "subagent.errors",
    "DescriptorError": "subagent.errors",
    "UnknownTaskError": "subagent.errors",
    "ModelError": "agent.errors",
    "ToolError": "agent.errors",
    "PromptError": "agent.errors",
    "SessionLogError": "agent.errors",
    "SessionNotFoundError": "agent.errors",
    "SessionExistsError": "agent.errors",
    "SessionBusyError": "agent.errors",
    # Session log shapes.
    "Event": "agent.events",
    "SessionHeader": "agent.events",
    # The seam vocabulary.
    "SubagentCapabilities": "subagent.types",
    "SubagentStartRequest": "subagent.types",
    "SubagentResumeRequest": "subagent.types",
    "SubagentResult": "subagent.types",
    "SubagentContinuation": "subagent.types",
    "SubagentDescriptor": "subagent.descriptor",
    "SubagentProvider": "subagent.types",
    "SubagentRun": "subagent.types",
    "Steerable": "subagent.types",
    "Resumable": "subagent.types",
    "MessageSource": "subagent.types",
    "ToolRestriction": "subagent.types",
    "ContentBlock": "subagent.types",
    "text_block": "subagent.types",
    "COMPLETED": "subagent.types",
    "ABORTED": "subagent.types",
    "ERROR": "subagent.types",
    "MAX_TOKENS": "subagent.types",
    "REFUSAL": "subagent.types",
}

# Curated; `_EXPORTS` says where each name lives (tests/test_public_surface.py pins both).
__all__ = [
    "ABORTED",
    "COMPLETED",
    "ERROR",
    "ERROR_CODES",
    "MAX_TOKENS",
    "PERSONA_SECTION",
    "REFUSAL",
    "AbortController",
    "AbortError",
    "AbortSignal",
    "AcpConfig",
    "AcpProvider",
    "Agent",
    "AgentOptions",
    "AnthropicModel",
    "Cancelled",
    "ContentBlock",
    "DescriptorError",
    "ErrorCode",
    "Event",
    "FinishReason",
    "ForkProvider",
    "GeventFuture",
    "MemoryStore",
    "MessageSource",
    "ModelAdapter",
    "ModelError",
    "ModelRegistry",
    "ModelRequest",
    "ModelResponse",
    "OpenAIModel",
    "Price",
    "PriceTable",
    "ProgressSink",
    "PromptError",
    "RayConfig",
    "RayProvider",
    "Resumable",
    "ResumableAcpProvider",
    "RunHandle",
    "Runtime",
    "ScriptedModel",
    "SessionBusyError",
    "SessionExistsError",
    "SessionHeader",
    "SessionLogError",
    "SessionNotFoundError",
    "SessionStore",
    "SpawnProvider",
    "Steerable",
    "SteerableRunHandle",
    "SubagentCapabilities",
    "SubagentContinuation",
    "SubagentDepthError",
    "SubagentDescriptor",
    "SubagentError",
    "SubagentProvider",
    "SubagentResult",
    "SubagentResumeRequest",
    "SubagentRun",
    "SubagentRuntimeError",
    "SubagentService",
    "SubagentStartRequest",
    "SubagentToolConfig",
    "SystemPrompt",
    "Task",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolError",
    "ToolFn",
    "ToolRegistry",
    "ToolRestriction",
    "ToolResult",
    "ToolSpec",
    "UnknownTaskError",
    "UnsupportedSchemaError",
    "discover_acp_provider",
    "install_subagent_tools",
    "text_block",
    "tls_context",
]


def __getattr__(name: str) -> object:
    """Import an exported name's module on first use (PEP 562), so `import subagent` is cheap."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'subagent' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
