"""The public face: `subagent` exports exactly the pinned names, each resolves, `import subagent`
never needs Ray, and the README and docs import only from `subagent`."""

from __future__ import annotations

import ast
import importlib
import re
import sys
from pathlib import Path

import pytest
from gevent import subprocess

import subagent
from providers.ray import RayConfig as ProviderRayConfig
from providers.ray import RayProvider

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
OURS = {"supervision", "agent", "actors", "providers", "subagent"}
# Real submodules of the face that docs may import from `subagent`.
FACE_MODULES = {"scripted"}

EXPORTED = [
    "ABORTED",
    "AbortController",
    "AbortError",
    "AbortSignal",
    "AcpConfig",
    "AcpProvider",
    "Agent",
    "AgentOptions",
    "AnthropicModel",
    "COMPLETED",
    "Cancelled",
    "ContentBlock",
    "DescriptorError",
    "ERROR",
    "ERROR_CODES",
    "ErrorCode",
    "Event",
    "FinishReason",
    "ForkProvider",
    "GeventFuture",
    "MAX_TOKENS",
    "MemoryStore",
    "MessageSource",
    "ModelAdapter",
    "ModelError",
    "ModelRegistry",
    "ModelRequest",
    "ModelResponse",
    "OpenAIModel",
    "PERSONA_SECTION",
    "Price",
    "PriceTable",
    "ProgressSink",
    "PromptError",
    "REFUSAL",
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


def test_the_exported_names_are_pinned() -> None:
    assert sorted(EXPORTED) == EXPORTED
    assert sorted(subagent.__all__) == sorted(EXPORTED)
    assert sorted(subagent._EXPORTS) == sorted(subagent.__all__)


@pytest.mark.parametrize("name", EXPORTED)
def test_every_exported_name_resolves(name: str) -> None:
    assert getattr(subagent, name) is not None
    assert name in dir(subagent)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = subagent.no_such_name  # type: ignore[attr-defined]


def test_import_subagent_does_not_import_ray() -> None:
    code = (
        "import sys, subagent\n"
        "for name in subagent.__all__: getattr(subagent, name)\n"
        "from subagent import scripted\n"
        "assert 'ray' not in sys.modules, 'ray was imported'\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr


def test_the_face_hands_ray_hosts_the_runtime() -> None:
    assert subagent.RayConfig(store_dir="/tmp/x").runtime_factory is subagent.Runtime
    assert issubclass(subagent.RayConfig, ProviderRayConfig)
    # The provider layer cannot name the runtime: without a factory it refuses loudly.
    with pytest.raises(TypeError, match="runtime_factory"):
        RayProvider(ProviderRayConfig(store_dir="/tmp/x"))
    with pytest.raises(TypeError, match="runtime_factory must be callable"):
        subagent.RayConfig(store_dir="/tmp/x", runtime_factory="subagent.runtime:Runtime")  # type: ignore[arg-type]


def _python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


def _imports(code: str) -> list[tuple[str, str | None]]:
    """(module, name) for every import in `code`; name is None for `import module`."""
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            found.extend((alias.name, None) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.extend((node.module or "", alias.name) for alias in node.names)
    return found


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: p.name)
def test_documents_import_only_from_subagent(path: Path) -> None:
    for code in _python_blocks(path):
        for module, name in _imports(code):
            if module.split(".")[0] not in OURS:
                continue
            assert module == "subagent", f"{path.name} imports {module}"
            assert name is None or name in subagent.__all__ or name in FACE_MODULES, (
                f"{path.name}: `from subagent import {name}` does not resolve"
            )
            if name in FACE_MODULES:
                importlib.import_module(f"subagent.{name}")
            elif name is not None:
                assert getattr(subagent, name) is not None
        # `subagent.X` and `scripted.X` (under whatever alias) resolve too.
        modules = _face_aliases(code)
        for node in ast.walk(ast.parse(code)):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                module = modules.get(node.value.id)
                if module is not None:
                    assert hasattr(module, node.attr), f"{path.name}: {node.value.id}.{node.attr}"


def _face_aliases(code: str) -> dict[str, object]:
    """Local names bound to `subagent` or one of its real submodules in `code`."""
    aliases: dict[str, object] = {}
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "subagent":
                    aliases[alias.asname or "subagent"] = subagent
        elif isinstance(node, ast.ImportFrom) and node.module == "subagent":
            for alias in node.names:
                if alias.name in FACE_MODULES:
                    aliases[alias.asname or alias.name] = importlib.import_module(
                        f"subagent.{alias.name}"
                    )
    return aliases


def test_some_documents_have_code() -> None:
    assert sum(len(_python_blocks(p)) for p in DOCUMENTS) >= 2
