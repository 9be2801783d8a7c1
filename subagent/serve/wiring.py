"""A runtime and its providers from command-line flags and/or a JSON config file.

`subagent run`, `subagent mcp` and `subagent acp` build their model registry and ACP providers
here, so `--model`, `--base-url` and `--acp` mean the same thing everywhere. The config file
(`--config FILE`, JSON) holds the same settings plus what does not fit a flag (ACP environment,
Ray); flags win over the file, and `--acp` flags add to the file's agents. See docs/serve.md.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.models import ModelRegistry
from agent.options import AgentOptions
from agent.store import SessionStore, default_root
from providers.acp_config import AcpConfig
from subagent.limits import DEFAULT_MAX_CHILDREN_PER_PARENT, MAX_CHILDREN_PER_PARENT
from subagent.serve.offline import OFFLINE_MODEL, respond
from subagent.tools import PROVIDER_MANAGED, SubagentToolConfig

if TYPE_CHECKING:
    from subagent.runtime import Runtime
    from subagent.service import SubagentService

__all__ = [
    "ServeConfig",
    "Served",
    "acp_config_from_flag",
    "build_served",
    "default_models",
    "load_config",
    "merge_flags",
]

_PROVIDER_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,40}$")
_RESERVED = frozenset({"spawn", "fork", "ray"})
_FILE_KEYS = frozenset(
    {"model", "base_url", "max_depth", "max_children_per_parent", "home", "acp", "ray"}
)


def default_models(base_url: str | None = None) -> ModelRegistry:
    """The `openai` route at `base_url` (else $OPENAI_BASE_URL or OpenAI): for library callers.
    The CLI passes its own registry (`subagent.cli.common.model_registry`), the same as `run`."""
    from agent.models.openai import OpenAIModel

    models = ModelRegistry()
    models.register("openai", OpenAIModel(base_url=base_url) if base_url else OpenAIModel())
    return models


def acp_config_from_flag(text: str, default_name: str = "acp") -> AcpConfig:
    """`NAME=COMMAND ARGS...` (or a bare `COMMAND ARGS...`, named `default_name`).

    A first word holding `=` is `NAME=...`: its name must be valid (`=gemini` or `my.agent=x`
    is refused, not read as a command of that name). A `=` after the first word is the
    command's (`gemini --flag=x`). Raises `ValueError` for an empty command, an empty or bad
    name, or a command that is not found.
    """
    name, command = default_name, text
    first = text.split(maxsplit=1)[0] if text.strip() else ""
    if "=" in first:
        head, _, command = text.lstrip().partition("=")
        if not head:
            raise ValueError(f"--acp {text!r} names no agent before '='")
        if not _PROVIDER_NAME.match(head):
            raise ValueError(
                f"--acp {text!r}: {head!r} is not a valid agent name "
                "(a letter, then letters, digits, '-' or '_', at most 41)"
            )
        name = head
    words = shlex.split(command)
    if not words:
        raise ValueError(f"--acp {text!r} names no command")
    return AcpConfig(command=words[0], args=words[1:], name=name)


def _acp_from_file(name: str, value: object) -> AcpConfig:
    if isinstance(value, str):
        return acp_config_from_flag(f"{name}={value}")
    if not isinstance(value, Mapping):
        raise ValueError(f"config: acp.{name} must be a command string or an object")
    allowed = {"command", "args", "cwd", "env", "pass_env", "permission"}
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise ValueError(f"config: acp.{name} has unknown keys {', '.join(unknown)}")
    if "command" not in value:
        raise ValueError(f"config: acp.{name} needs a command")
    return AcpConfig(name=name, **dict(value))


@dataclass(frozen=True)
class ServeConfig:
    """Everything a server is built from. `model=None` means the embedded offline model."""

    model: str | None = None
    base_url: str | None = None
    max_depth: int = 3
    # Children of one agent running at once; more wait for a slot (subagent.limits).
    max_children_per_parent: int = DEFAULT_MAX_CHILDREN_PER_PARENT
    store_dir: str | None = None
    acp: tuple[AcpConfig, ...] = ()
    ray: Mapping[str, Any] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.max_depth, bool) or not isinstance(self.max_depth, int):
            raise ValueError(f"max_depth must be an int, got {self.max_depth!r}")
        if self.max_depth < 0:
            raise ValueError("max_depth must be >= 0")
        cap = self.max_children_per_parent
        if isinstance(cap, bool) or not isinstance(cap, int):
            raise ValueError(f"max_children_per_parent must be an int, got {cap!r}")
        if not 1 <= cap <= MAX_CHILDREN_PER_PARENT:
            raise ValueError(f"max_children_per_parent must be within 1..{MAX_CHILDREN_PER_PARENT}")
        if self.base_url is not None and self.model is None:
            raise ValueError("--base-url needs --model (the model name at that endpoint)")
        names = [c.name for c in self.acp]
        for name in names:
            if name in _RESERVED or not _PROVIDER_NAME.match(name):
                raise ValueError(f"ACP agent name {name!r} is reserved or invalid")
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"two ACP agents are named {', '.join(dupes)}")
        if self.ray is not None and not isinstance(self.ray, Mapping):
            raise ValueError("config: ray must be an object")


def load_config(path: str | Path) -> ServeConfig:
    """Read a JSON config file (see docs/serve.md); `ValueError` names what is wrong."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"cannot read config {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"config {path} is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"config {path} must hold a JSON object")
    unknown = sorted(set(data) - _FILE_KEYS)
    if unknown:
        raise ValueError(f"config {path}: unknown keys {', '.join(unknown)}")
    acp = data.get("acp", {})
    if not isinstance(acp, Mapping):
        raise ValueError("config: acp must be an object of NAME: command or {command, ...}")
    for key in ("model", "base_url", "home"):
        if data.get(key) is not None and not isinstance(data[key], str):
            raise ValueError(f"config: {key} must be a string")
    return ServeConfig(
        model=data.get("model"),
        base_url=data.get("base_url"),
        max_depth=data.get("max_depth", 3),
        max_children_per_parent=data.get(
            "max_children_per_parent", DEFAULT_MAX_CHILDREN_PER_PARENT
        ),
        store_dir=str(Path(data["home"]) / "sessions") if data.get("home") else None,
        acp=tuple(_acp_from_file(str(n), v) for n, v in acp.items()),
        ray=data.get("ray"),
    )


def merge_flags(
    base: ServeConfig,
    *,
    model: str | None,
    base_url: str | None,
    max_depth: int | None,
    store_dir: str | None,
    acp: Sequence[str],
    max_children_per_parent: int | None = None,
) -> ServeConfig:
    """Flags over the file: scalars replace, `--acp` agents add."""
    return replace(
        base,
        model=model if model is not None else base.model,
        base_url=base_url if base_url is not None else base.base_url,
        max_depth=max_depth if max_depth is not None else base.max_depth,
        max_children_per_parent=(
            max_children_per_parent
            if max_children_per_parent is not None
            else base.max_children_per_parent
        ),
        store_dir=store_dir if store_dir is not None else base.store_dir,
        acp=base.acp + tuple(acp_config_from_flag(a) for a in acp),
    )


@dataclass
class Served:
    """A built runtime: its delegation tools, the model its agents use, and what to close."""

    runtime: Runtime
    tools: list[SubagentToolConfig]
    model: str
    closers: list[Callable[[], None]] = field(default_factory=list)

    def close(self) -> None:
        """Close the runtime (children first), then the providers that own outside resources."""
        try:
            self.runtime.close()
        finally:
            while self.closers:
                self.closers.pop()()


def _progress_relay(service: SubagentService) -> Callable[[dict[str, Any]], None]:
    """An ACP child's tool calls, thoughts and plans as progress events of that child."""

    def relay(event: dict[str, Any]) -> None:
        update = event.get("update")
        title = update.get("title") if isinstance(update, Mapping) else None
        service.relay_progress(
            {
                "agent_id": event.get("run_id"),
                "kind": f"remote/{event.get('kind')}",
                "title": title if isinstance(title, str) else None,
            }
        )

    return relay


def build_served(
    config: ServeConfig,
    *,
    fork: bool,
    child_options: bool,
    models: ModelRegistry | None = None,
    route: str | None = None,
) -> Served:
    """The runtime with spawn (continuable), optional fork, the ACP agents and Ray.

    `child_options=True` pins the children's model in the tool configs (the MCP root agent stands
    in for the client and runs no model of its own worth inheriting). `route` is the agents'
    model route (`prefix:name`; default `openai:<config.model>`, or the offline model), served
    by `models` (default `default_models(config.base_url)`).
    """
    from agent.models.scripted import ScriptedModel
    from providers.acp import AcpProvider
    from providers.inprocess import ForkProvider, SpawnProvider
    from subagent.runtime import Runtime

    root = Path(config.store_dir) if config.store_dir else default_root()
    root.mkdir(parents=True, exist_ok=True)
    if route is None:
        route = f"openai:{config.model}" if config.model else OFFLINE_MODEL
    model = route
    runtime = Runtime(
        store=SessionStore(root),
        models=models if models is not None else default_models(config.base_url),
        scripted=ScriptedModel(respond, record=False),
        max_children_per_parent=config.max_children_per_parent,
    )
    served = Served(runtime, [], model)
    try:
        options = AgentOptions(model=model) if child_options else None
        runtime.subagents.register(SpawnProvider())
        served.tools.append(
            SubagentToolConfig(
                "spawn",
                name="subagent",
                max_depth=config.max_depth,
                background="continuable",
                agent_options=options,
            )
        )
        if fork:
            runtime.subagents.register(ForkProvider())
            served.tools.append(
                SubagentToolConfig("fork", name="subagent_fork", max_depth=config.max_depth)
            )
        for acp in config.acp:
            relay = _progress_relay(runtime.subagents)
            runtime.subagents.register(AcpProvider(replace(acp, on_progress=relay)))
            served.tools.append(SubagentToolConfig(acp.name, max_depth=PROVIDER_MANAGED))
        if config.ray is not None:
            from providers.ray import RayProvider
            from subagent.ray_config import RayConfig

            settings = dict(config.ray)
            settings.setdefault("store_dir", str(root))
            provider = RayProvider(RayConfig(**settings))
            runtime.subagents.register(provider)
            served.closers.append(provider.close)
            served.tools.append(
                SubagentToolConfig(provider.name, max_depth=config.max_depth, agent_options=options)
            )
    except BaseException:
        served.close()
        raise
    return served
