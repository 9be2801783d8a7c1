"""Configuration of the ACP provider, validated when it is built so a bad deployment fails early.

Every check raises `ValueError` naming the offending field, because a misconfigured external
agent otherwise shows up much later as an opaque start failure inside a child run.
"""

from __future__ import annotations

import math
import os
import shutil
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypedDict

from agent.events import check_utf8_path

__all__ = [
    "DEFAULT_ENV_ALLOWLIST",
    "PERMISSION_POLICIES",
    "AcpConfig",
    "AcpOverrides",
    "ProgressCallback",
    "check_cwd",
    "is_default_allowed",
    "scrubbed_environment",
]

ProgressCallback = Callable[[dict[str, Any]], None]

PERMISSION_POLICIES = frozenset({"reject", "allow"})

# What a third-party agent gets from the host environment by default: what a program needs to
# run (search path, home, user, shell), locale, terminal, temp dirs, XDG dirs, proxy settings and
# CA bundles. Everything else (every token, password, webhook, DSN...) stays home unless the
# `AcpConfig` names it in `pass_env` or sets it in `env`: a denylist can never list every shape
# a secret takes, an allowlist fails safe.
DEFAULT_ENV_ALLOWLIST: frozenset[str] = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TERM",
        "COLORTERM",
        "NO_COLOR",
        "TMPDIR",
        "TMP",
        "TEMP",
        "XDG_CONFIG_HOME",
        "XDG_DATA_HOME",
        "XDG_CACHE_HOME",
        "XDG_STATE_HOME",
        "XDG_RUNTIME_DIR",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "NO_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "no_proxy",
        "all_proxy",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "REQUESTS_CA_BUNDLE",
        "NODE_EXTRA_CA_CERTS",
        "SYSTEMROOT",
        "COMSPEC",
        "PATHEXT",
    }
)
# Locale variables come as a family.
_ALLOWED_PREFIXES = ("LC_",)


def is_default_allowed(name: str) -> bool:
    """Whether the host variable `name` reaches an agent without being named in `pass_env`."""
    return name in DEFAULT_ENV_ALLOWLIST or name.startswith(_ALLOWED_PREFIXES)


def scrubbed_environment(
    parent: Mapping[str, str], keep: Sequence[str] = (), overrides: Mapping[str, str] = {}
) -> dict[str, str]:
    """The allowlisted part of the parent's environment, the variables in `keep`, then overrides.

    A child agent is third-party code: it should see only the credentials the deployment hands it
    on purpose, never every token the host process happens to hold.
    """
    allowed = set(keep)
    env = {k: v for k, v in parent.items() if k in allowed or is_default_allowed(k)}
    env.update(overrides)
    return env


def check_cwd(value: object, what: str) -> str:
    """An absolute directory this process can enter, else `ValueError` naming `what`."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty string, got {value!r}")
    if "\0" in value:
        raise ValueError(f"{what} must not contain NUL")
    if not os.path.isabs(value):
        raise ValueError(f"{what} must be an absolute path, got {value!r}")
    check_utf8_path(value, what)  # `session/new` carries it in UTF-8 JSON
    if not os.path.isdir(value):
        raise ValueError(f"{what} {value!r} is not a directory")
    if not os.access(value, os.X_OK):
        raise ValueError(f"{what} {value!r} cannot be entered (no search permission)")
    return value


def _check_grace(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what} must be a number of seconds, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{what} must be positive and finite, got {value!r}")
    return float(value)


MAX_NAME_LENGTH = 64


def _check_agent_name(name: object) -> None:
    """An agent's registry name appears in tool names, listings, logs and `--acp NAME=...`:
    a space or a `:` would be misread there, a control character would redraw a terminal."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    if not name:
        raise ValueError("name must not be empty")
    if len(name) > MAX_NAME_LENGTH:
        raise ValueError(f"name must be at most {MAX_NAME_LENGTH} characters, got {len(name)}")
    if not name.isprintable():
        raise ValueError(f"name {name!r} holds a control or other non-printable character")
    if " " in name or ":" in name:
        raise ValueError(f"name {name!r} must have no spaces and no ':'")


def _check_env_name(name: object, what: str) -> str:
    if not isinstance(name, str) or not name or "=" in name or "\0" in name:
        raise ValueError(f"{what} has an invalid variable name {name!r}")
    return name


class AcpOverrides(TypedDict, total=False):
    """The `AcpConfig` fields a caller may set when the command comes from a stored record
    (`provider_for_stored_child`): everything but the name, command, arguments and pass-env."""

    cwd: str | None
    env: Mapping[str, str]
    permission: str
    handshake_timeout: float
    exit_drain: float
    eof_grace: float
    terminate_grace: float
    max_line_bytes: int
    on_progress: ProgressCallback | None
    session_index: MutableMapping[str, str]


@dataclass(frozen=True, slots=True)
class AcpConfig:
    """How to launch and talk to one external ACP agent.

    `command` is an absolute executable or a name found on the (merged) PATH. `cwd` overrides the
    parent's session cwd. The agent's environment is the allowlisted part of the host's
    (`DEFAULT_ENV_ALLOWLIST`), plus the host variables `pass_env` names, with `env` on top.
    `permission` answers the agent's `session/request_permission`: `reject` (default: the
    agent's reject option) or `allow`. `handshake_timeout` bounds each of `initialize`,
    `session/new` and `session/load`; `exit_drain` is how long the output of an agent whose
    process exited is still read before the run settles. `eof_grace` and `terminate_grace`
    bound the teardown steps (close stdin, then SIGTERM, then SIGKILL).
    `on_progress` receives tool-call, thought and plan updates tagged with the run id.
    `session_index` maps continuable child ids to the agent's ACP session ids; pass a persistent
    mapping for cold resume across processes.
    """

    command: str
    args: Sequence[str] = ()
    cwd: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    pass_env: Sequence[str] = ()
    permission: str = "reject"
    handshake_timeout: float = 30.0
    exit_drain: float = 0.5
    eof_grace: float = 2.0
    terminate_grace: float = 3.0
    max_line_bytes: int = 8 * 1024 * 1024
    name: str = "acp"
    on_progress: ProgressCallback | None = None
    session_index: MutableMapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        setattr_ = object.__setattr__
        _check_agent_name(self.name)
        if isinstance(self.args, (str, bytes)) or not isinstance(self.args, Sequence):
            raise ValueError(f"args must be a sequence of strings, got {self.args!r}")
        for arg in self.args:
            if not isinstance(arg, str) or "\0" in arg:
                raise ValueError(f"args must hold strings without NUL, got {arg!r}")
        setattr_(self, "args", tuple(self.args))
        if not isinstance(self.env, Mapping):
            raise ValueError(f"env must be a mapping of strings, got {self.env!r}")
        env: dict[str, str] = {}
        for key, value in self.env.items():
            _check_env_name(key, "env")
            if not isinstance(value, str) or "\0" in value:
                raise ValueError(f"env[{key!r}] must be a string without NUL, got {value!r}")
            env[key] = value
        setattr_(self, "env", MappingProxyType(env))
        if isinstance(self.pass_env, (str, bytes)) or not isinstance(self.pass_env, Sequence):
            raise ValueError(f"pass_env must be a sequence of names, got {self.pass_env!r}")
        setattr_(self, "pass_env", tuple(_check_env_name(n, "pass_env") for n in self.pass_env))
        if self.cwd is not None:
            check_cwd(self.cwd, "cwd")
        if self.permission not in PERMISSION_POLICIES:
            raise ValueError(f"permission must be 'reject' or 'allow', got {self.permission!r}")
        setattr_(
            self, "handshake_timeout", _check_grace(self.handshake_timeout, "handshake_timeout")
        )
        setattr_(self, "exit_drain", _check_grace(self.exit_drain, "exit_drain"))
        setattr_(self, "eof_grace", _check_grace(self.eof_grace, "eof_grace"))
        setattr_(self, "terminate_grace", _check_grace(self.terminate_grace, "terminate_grace"))
        if (
            isinstance(self.max_line_bytes, bool)
            or not isinstance(self.max_line_bytes, int)
            or self.max_line_bytes <= 0
        ):
            raise ValueError(f"max_line_bytes must be a positive int, got {self.max_line_bytes!r}")
        if self.on_progress is not None and not callable(self.on_progress):
            raise ValueError("on_progress must be callable or None")
        if self.session_index is None:
            setattr_(self, "session_index", {})
        elif not all(hasattr(self.session_index, m) for m in ("__getitem__", "__setitem__", "get")):
            raise ValueError("session_index must be a mutable mapping")
        setattr_(self, "command", self._resolve_command())

    def _resolve_command(self) -> str:
        command = self.command
        if not isinstance(command, str) or not command or "\0" in command:
            raise ValueError(f"command must be a non-empty string, got {command!r}")
        if os.sep in command:
            if not os.path.isabs(command):
                raise ValueError(f"command must be absolute or a bare name, got {command!r}")
            if not (os.path.isfile(command) and os.access(command, os.X_OK)):
                raise ValueError(f"command {command!r} is not an executable file")
            return command
        path = self.environment().get("PATH", os.defpath)
        found = shutil.which(command, path=path)
        if found is None:
            raise ValueError(f"command {command!r} is not found on PATH")
        return found

    def environment(self, parent: Mapping[str, str] | None = None) -> dict[str, str]:
        """The child's environment: the allowlisted and `pass_env` host variables, `env` on top."""
        return scrubbed_environment(
            os.environ if parent is None else parent, self.pass_env, self.env
        )
