"""ACP provider configuration: every bad field is a ValueError naming it, at construction."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from providers.acp import AcpConfig, AcpProvider
from providers.acp_config import is_default_allowed, scrubbed_environment


def build(**fields: Any) -> AcpConfig:
    options: dict[str, Any] = {"command": sys.executable}
    options.update(fields)
    return AcpConfig(**options)


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"command": ""}, "command"),
        ({"command": "definitely-not-an-installed-agent"}, "command"),
        ({"command": "relative/agent"}, "command"),
        ({"command": "/nonexistent/agent"}, "command"),
        ({"args": "--acp"}, "args"),
        ({"args": [1]}, "args"),
        ({"cwd": "relative"}, "cwd"),
        ({"cwd": "/nonexistent/dir"}, "cwd"),
        ({"cwd": ""}, "cwd"),
        ({"env": {"A": 1}}, "env"),
        ({"env": {"A=B": "x"}}, "env"),
        ({"env": ["A"]}, "env"),
        ({"pass_env": "TOKEN"}, "pass_env"),
        ({"permission": "ask"}, "permission"),
        ({"eof_grace": 0}, "eof_grace"),
        ({"eof_grace": -1.0}, "eof_grace"),
        ({"eof_grace": math.inf}, "eof_grace"),
        ({"eof_grace": math.nan}, "eof_grace"),
        ({"eof_grace": True}, "eof_grace"),
        ({"eof_grace": "1"}, "eof_grace"),
        ({"terminate_grace": 0.0}, "terminate_grace"),
        ({"handshake_timeout": 0}, "handshake_timeout"),
        ({"handshake_timeout": math.inf}, "handshake_timeout"),
        ({"exit_drain": -1}, "exit_drain"),
        ({"terminate_grace": math.inf}, "terminate_grace"),
        ({"max_line_bytes": 0}, "max_line_bytes"),
        ({"name": ""}, "name"),
        ({"on_progress": 3}, "on_progress"),
        ({"session_index": 3}, "session_index"),
    ],
)
def test_bad_configuration_names_the_field(fields: dict[str, Any], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        build(**fields)


def test_cwd_must_be_a_directory(tmp_path: Path) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("")
    with pytest.raises(ValueError, match="cwd"):
        build(cwd=str(a_file))


@pytest.mark.skipif(os.geteuid() == 0, reason="root may enter any directory")
def test_cwd_must_be_enterable(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o600)
    with pytest.raises(ValueError, match="cwd"):
        build(cwd=str(locked))


def test_a_good_configuration_is_normalised(tmp_path: Path) -> None:
    config = build(
        command=Path(sys.executable).name,
        args=["-m", "agent"],
        cwd=str(tmp_path),
        env={"X": "1"},
        eof_grace=1,
        permission="allow",
    )
    assert os.path.isabs(config.command)  # resolved on PATH at construction
    assert config.args == ("-m", "agent")
    assert config.eof_grace == 1.0
    assert isinstance(config.eof_grace, float)
    with pytest.raises(TypeError):
        config.env["Y"] = "2"  # type: ignore[index]
    assert AcpProvider(config).name == "acp"


def test_provider_takes_only_a_config() -> None:
    with pytest.raises(TypeError):
        AcpProvider({"command": sys.executable})  # type: ignore[arg-type]


# The secrets a denylist missed (issue 15), and the usual ones: none reaches an agent unless named.
SECRETS = [
    "OPENAI_API_KEY",
    "ANTHROPIC_API_KEY",
    "GITHUB_TOKEN",
    "AWS_SECRET_ACCESS_KEY",
    "SSH_AUTH_SOCK",
    "MYSQL_PWD",
    "GH_PAT",
    "CI_JOB_JWT",
    "BW_SESSION",
    "OP_SESSION_my_team",
    "GPG_PASSPHRASE",
    "PROXY_AUTHORIZATION",
    "API_BEARER",
    "GOOGLE_OAUTH",
    "SERVICE_CREDS",
    "SENTRY_DSN",
    "SLACK_WEBHOOK_URL",
    "DATABASE_URL",
]


@pytest.mark.parametrize("name", SECRETS)
def test_secrets_are_not_in_the_allowlist(name: str) -> None:
    assert not is_default_allowed(name)


@pytest.mark.parametrize(
    "name",
    ["PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TERM", "TMPDIR", "HTTPS_PROXY", "no_proxy"],
)
def test_what_a_program_needs_is_allowed(name: str) -> None:
    assert is_default_allowed(name)


def test_scrubbed_environment_is_an_allowlist_plus_named_plus_overrides() -> None:
    parent = {name: "secret" for name in SECRETS}
    parent.update({"PATH": "/bin", "HOME": "/h", "LC_ALL": "C", "RANDOM_SETTING": "x"})
    env = scrubbed_environment(
        parent, keep=["GITHUB_TOKEN", "MYSQL_PWD"], overrides={"HOME": "/x", "K": "v"}
    )
    assert env == {
        "PATH": "/bin",
        "LC_ALL": "C",
        "GITHUB_TOKEN": "secret",
        "MYSQL_PWD": "secret",
        "HOME": "/x",
        "K": "v",
    }
