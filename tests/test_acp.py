"""The ACP provider against real ACP peers: SDK-built agents, each in its own process."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from typing import Any

import gevent
import pytest
from acp_peers.support import (
    Notifier,
    Parent,
    fake_config,
    finish,
    group_alive,
    peer_config,
    pid_alive,
    text_prompt,
    wait_until,
)

import providers.acp as acp_module
from providers.acp import (
    AcpConfig,
    AcpProvider,
    AcpRun,
    ResumableAcpProvider,
    discover_acp_provider,
)
from subagent.errors import SubagentError
from subagent.types import (
    MessageSource,
    Resumable,
    SubagentCapabilities,
    SubagentContinuation,
    SubagentProvider,
    SubagentResumeRequest,
    SubagentRun,
    SubagentStartRequest,
)
from supervision.signal import AbortController, AbortSignal

RESULT_TIMEOUT = 30.0


def start(
    provider: AcpProvider, parent: Parent, text: str = "hello", signal: AbortSignal | None = None
) -> AcpRun:
    request = SubagentStartRequest(
        prompt=text_prompt(text), parent=parent, signal=signal or AbortSignal.never()
    )
    return provider.start(request)


# -- identity and capabilities ------------------------------------------------------------------


def test_remote_identity_and_no_start_time_capabilities(parent: Parent) -> None:
    provider = AcpProvider(peer_config("normal"))
    assert isinstance(provider, SubagentProvider)
    assert provider.name == "acp"
    assert provider.capabilities == SubagentCapabilities()
    assert provider.inherits_parent_context is False
    assert not isinstance(provider, Resumable)
    assert isinstance(ResumableAcpProvider(peer_config("normal")), Resumable)

    first, second = start(provider, parent), start(provider, parent)
    assert isinstance(first, SubagentRun)
    assert first.local_agent is None
    assert first.id != second.id
    assert first.id.startswith(parent.session_id)
    finish(first)
    finish(second)


# -- a normal turn ------------------------------------------------------------------------------


def test_normal_turn_collects_text_and_reports_progress(parent: Parent) -> None:
    events: list[dict[str, Any]] = []
    provider = AcpProvider(peer_config("normal", on_progress=events.append))
    run = start(provider, parent, "hello there")
    result = finish(run)
    assert result.stop_reason == "completed"
    assert result.diagnostic is None
    [block] = result.output
    assert block["type"] == "text"
    assert block["text"].startswith("echo: hello there [session sess-")
    # session/new got the parent's cwd
    assert block["text"].endswith(f":{parent.cwd}]")
    assert [e["kind"] for e in events] == ["agent_thought_chunk", "plan", "tool_call"]
    assert all(e["run_id"] == run.id for e in events)
    assert events[2]["update"]["toolCallId"] == "t1"


def test_configured_cwd_overrides_the_parent_cwd(parent: Parent, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = finish(start(AcpProvider(peer_config("normal", cwd=str(elsewhere))), parent))
    assert result.output[0]["text"].endswith(f":{elsewhere}]")


@pytest.mark.parametrize(
    ("acp_reason", "stop_reason"),
    [
        ("max_tokens", "max-tokens"),
        ("refusal", "refusal"),
        ("cancelled", "error"),  # nobody cancelled it: not an abort
        ("max_turn_requests", "error"),
        ("something_new", "error"),
    ],
)
def test_stop_reason_mapping(parent: Parent, acp_reason: str, stop_reason: str) -> None:
    result = finish(start(AcpProvider(peer_config("normal")), parent, f"stop:{acp_reason}"))
    assert result.stop_reason == stop_reason
    assert result.output == [{"type": "text", "text": "partial"}]
    if acp_reason == "cancelled":
        assert "nobody cancelled it" in (result.diagnostic or "")
    elif stop_reason == "error":
        assert acp_reason in (result.diagnostic or "")


def test_environment_is_an_allowlist_plus_what_the_config_names(
    parent: Parent, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACP_TEST_API_KEY", "sk-secret")
    monkeypatch.setenv("SENTRY_DSN", "https://key@sentry.example/1")
    monkeypatch.setenv("ACP_TEST_KEPT_TOKEN", "kept")
    monkeypatch.setenv("ACP_TEST_PLAIN", "plain")
    monkeypatch.setenv("LC_ACP_TEST", "locale")
    provider = AcpProvider(
        peer_config("normal", pass_env=["ACP_TEST_KEPT_TOKEN"], env={"ACP_TEST_SET": "set"})
    )

    def ask(name: str) -> str:
        text: str = finish(start(provider, parent, f"env:{name}")).output[0]["text"]
        return text

    assert ask("ACP_TEST_API_KEY") == "<unset>"
    assert ask("SENTRY_DSN") == "<unset>"
    assert ask("ACP_TEST_PLAIN") == "<unset>"  # not a secret by its name, but not allowlisted
    assert ask("ACP_TEST_KEPT_TOKEN") == "kept"
    assert ask("ACP_TEST_SET") == "set"
    assert ask("LC_ACP_TEST") == "locale"
    assert ask("PATH") == os.environ["PATH"]


# -- agent-to-client requests -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "answer"), [("allow", "selected:yes"), ("reject", "selected:no")]
)
def test_permission_requests_follow_the_policy(parent: Parent, policy: str, answer: str) -> None:
    events: list[dict[str, Any]] = []
    provider = AcpProvider(peer_config("permission", permission=policy, on_progress=events.append))
    result = finish(start(provider, parent))
    assert result.stop_reason == "completed"
    assert result.output[0]["text"] == f"permission: {answer}"
    [event] = events
    assert event["kind"] == "permission"
    assert event["update"]["toolCall"]["toolCallId"] == "t1"


def test_unknown_agent_requests_get_method_not_found(parent: Parent) -> None:
    result = finish(start(AcpProvider(peer_config("unknown")), parent))
    assert result.output[0]["text"] == "codes: [-32601, -32601]"


# -- cancellation and disposal ------------------------------------------------------------------


def test_abort_settles_aborted_at_once_even_if_the_agent_ignores_cancel(parent: Parent) -> None:
    controller = AbortController()
    run = start(AcpProvider(peer_config("ignore_cancel")), parent, signal=controller.signal)
    controller.abort("enough")
    result = run.result.get(timeout=RESULT_TIMEOUT)
    assert result.stop_reason == "aborted"
    assert group_alive(run.pid)  # settled without waiting for the child
    run.dispose()
    assert not group_alive(run.pid)


def test_abort_sends_session_cancel(parent: Parent, tmp_path: Path, notifier: Notifier) -> None:
    marker = tmp_path / "cancelled"
    env = {"ACP_PEER_MARKER": str(marker), **notifier.env}
    controller = AbortController()
    run = start(AcpProvider(peer_config("wait", env=env)), parent, signal=controller.signal)
    controller.abort()
    assert run.result.get(timeout=RESULT_TIMEOUT).stop_reason == "aborted"
    run.dispose()  # the peer handles session/cancel before it sees stdin close
    assert marker.read_text() == "cancelled"


def test_dispose_mid_turn_settles_aborted_and_is_idempotent(parent: Parent) -> None:
    run = start(AcpProvider(peer_config("ignore_cancel")), parent)
    waiters = [gevent.spawn(run.dispose) for _ in range(3)]
    run.dispose()
    assert not group_alive(run.pid)
    gevent.joinall(waiters, raise_error=True)
    assert all(w.successful() for w in waiters)
    assert run.result.get(timeout=0).stop_reason == "aborted"
    run.dispose()


def test_dispose_leaves_no_descendant_even_one_that_ignores_sigterm(
    parent: Parent, notifier: Notifier
) -> None:
    config = peer_config("stubborn", env=notifier.env, eof_grace=0.2, terminate_grace=0.2)
    run = start(AcpProvider(config), parent)
    leader = int(notifier.expect("pid"))
    grandchild = int(notifier.expect("grandchild"))
    assert leader == run.pid
    assert pid_alive(grandchild)
    assert os.getpgid(grandchild) == run.pid  # in the leader's group, not ours
    run.dispose()
    assert not pid_alive(leader)
    assert not pid_alive(grandchild)
    assert not group_alive(run.pid)
    assert run.result.get(timeout=0).stop_reason == "aborted"


# -- failures mid-turn --------------------------------------------------------------------------


def test_crash_mid_turn_ends_error_with_exit_code_and_stderr(parent: Parent) -> None:
    result = finish(start(AcpProvider(peer_config("crash")), parent))
    assert result.stop_reason == "error"
    assert result.output == [{"type": "text", "text": "about to crash"}]
    assert "exit code 3" in (result.diagnostic or "")
    assert "boom: the peer crashed on purpose" in (result.diagnostic or "")


def test_stderr_spam_cannot_deadlock_the_agent(parent: Parent) -> None:
    result = finish(start(AcpProvider(peer_config("stderr_spam")), parent))
    assert result.stop_reason == "completed"
    assert result.output[0]["text"] == "survived the spam"


def test_garbage_on_stdout_ends_the_run_error(parent: Parent) -> None:
    result = finish(start(AcpProvider(peer_config("garbage")), parent))
    assert result.stop_reason == "error"
    assert "malformed JSON" in (result.diagnostic or "")
    assert result.output == [{"type": "text", "text": "before garbage"}]


def test_oversize_line_ends_the_run_error(parent: Parent) -> None:
    result = finish(start(AcpProvider(peer_config("huge_line", max_line_bytes=4096)), parent))
    assert result.stop_reason == "error"
    assert "exceeds 4096 bytes" in (result.diagnostic or "")


# -- start failures -----------------------------------------------------------------------------


def test_an_aborted_signal_rejects_without_spawning(
    parent: Parent, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_spawn(*_args: Any, **_kwargs: Any) -> None:
        raise AssertionError("spawned despite an aborted signal")

    monkeypatch.setattr(acp_module, "ProcessGroup", no_spawn)
    controller = AbortController()
    controller.abort("too late")
    with pytest.raises(SubagentError) as info:
        start(AcpProvider(peer_config("normal")), parent, signal=controller.signal)
    assert info.value.code == "ABORTED"


def test_abort_while_the_agent_is_slow_at_session_new(parent: Parent, notifier: Notifier) -> None:
    controller = AbortController()
    provider = AcpProvider(peer_config("slow_new", env=notifier.env))
    starting = gevent.spawn(start, provider, parent, "hello", controller.signal)
    pid = int(notifier.expect("pid"))
    notifier.expect("new_session")
    controller.abort("changed my mind")
    starting.join()
    assert isinstance(starting.exception, SubagentError)
    assert starting.exception.code == "ABORTED"
    assert not group_alive(pid)  # reaped before start rejected


def test_session_new_without_an_id_fails_start_after_reaping(
    parent: Parent, notifier: Notifier
) -> None:
    provider = AcpProvider(peer_config("no_session_id", env=notifier.env))
    starting = gevent.spawn(start, provider, parent)
    pid = int(notifier.expect("pid"))
    starting.join()
    assert isinstance(starting.exception, SubagentError)
    assert starting.exception.code == "START_FAILED"
    assert "sessionId" in starting.exception.detail
    assert not group_alive(pid)


def test_agent_that_exits_at_once_fails_start(parent: Parent) -> None:
    config = AcpConfig(command=sys.executable, args=["-c", "import sys; sys.exit(7)"])
    with pytest.raises(SubagentError) as info:
        start(AcpProvider(config), parent)
    assert info.value.code == "START_FAILED"
    assert "exit code 7" in info.value.detail


def test_garbage_during_the_handshake_fails_start(parent: Parent) -> None:
    script = "import sys, time; print('not json', flush=True); time.sleep(60)"
    config = AcpConfig(command=sys.executable, args=["-c", script], terminate_grace=5.0)
    with pytest.raises(SubagentError) as info:
        start(AcpProvider(config), parent)
    assert info.value.code == "START_FAILED"
    assert "malformed JSON" in info.value.detail


def test_wrong_protocol_version_fails_start(parent: Parent) -> None:
    script = (
        "import json, sys\n"
        "msg = json.loads(sys.stdin.readline())\n"
        "reply = {'jsonrpc': '2.0', 'id': msg['id'], 'result': {'protocolVersion': 99}}\n"
        "print(json.dumps(reply), flush=True)\n"
        "sys.stdin.read()\n"
    )
    config = AcpConfig(command=sys.executable, args=["-c", script])
    with pytest.raises(SubagentError) as info:
        start(AcpProvider(config), parent)
    assert info.value.code == "START_FAILED"
    assert "protocol 99" in info.value.detail


def test_spawn_failure_is_a_start_failure(parent: Parent, tmp_path: Path) -> None:
    not_a_program = tmp_path / "not-a-program"
    not_a_program.write_bytes(b"\x00\x01\x02 not an executable format")
    not_a_program.chmod(not_a_program.stat().st_mode | stat.S_IXUSR)
    with pytest.raises(SubagentError) as info:
        start(AcpProvider(AcpConfig(command=str(not_a_program))), parent)
    assert info.value.code == "START_FAILED"


def test_bad_parent_cwd_fails_start(tmp_path: Path) -> None:
    provider = AcpProvider(peer_config("normal"))
    for cwd in ("relative/dir", str(tmp_path / "missing"), None):
        with pytest.raises(SubagentError) as info:
            start(provider, Parent(cwd=cwd))  # type: ignore[arg-type]
        assert info.value.code == "START_FAILED"
        assert "parent cwd" in info.value.detail


def test_non_text_prompt_blocks_are_refused(parent: Parent) -> None:
    request = SubagentStartRequest(
        prompt=[{"type": "image", "data": "", "mimeType": "image/png"}],
        parent=parent,
        signal=AbortSignal.never(),
    )
    with pytest.raises(SubagentError) as info:
        AcpProvider(peer_config("normal")).start(request)
    assert info.value.code == "START_FAILED"


def test_a_lone_surrogate_in_the_prompt_is_repaired_before_it_is_sent(parent: Parent) -> None:
    """As everywhere in the runtime (docs/decisions.md): U+FFFD, not a failed run."""
    result = finish(start(AcpProvider(peer_config("normal")), parent, "left \ud800 right"))
    assert result.stop_reason == "completed", result.diagnostic
    assert result.output[0]["text"].startswith("echo: left \ufffd right [session sess-")


# -- resume through session/load ----------------------------------------------------------------


def test_continuable_start_then_resume_through_session_load(parent: Parent) -> None:
    provider = ResumableAcpProvider(peer_config("normal"))
    request = SubagentStartRequest(
        prompt=text_prompt("first"),
        parent=parent,
        signal=AbortSignal.never(),
        continuation=SubagentContinuation(session_id="child-1", descriptor=None),
    )
    run = provider.start(request)
    assert run.id == "child-1"
    acp_session = run.acp_session_id
    assert provider.config.session_index["child-1"] == acp_session
    assert finish(run).stop_reason == "completed"

    resumed = provider.resume(
        SubagentResumeRequest(
            session_id="child-1",
            prompt=text_prompt("again"),
            source=MessageSource.user(),
            parent=parent,
            signal=AbortSignal.never(),
            descriptor=None,
        )
    )
    assert resumed.id == "child-1"
    result = finish(resumed)
    # The replayed history ("old answer") is not output of this turn.
    assert result.output == [{"type": "text", "text": f"echo: again [session {acp_session}]"}]


def test_resume_needs_a_known_child_and_an_agent_with_load_session(parent: Parent) -> None:
    def resume_request(session_id: str) -> SubagentResumeRequest:
        return SubagentResumeRequest(
            session_id=session_id,
            prompt=text_prompt("again"),
            source=MessageSource.user(),
            parent=parent,
            signal=AbortSignal.never(),
            descriptor=None,
        )

    with pytest.raises(SubagentError) as info:
        ResumableAcpProvider(peer_config("normal")).resume(resume_request("nobody"))
    assert info.value.code == "UNKNOWN_CHILD"

    no_load = ResumableAcpProvider(peer_config("permission", session_index={"c": "sess-x"}))
    with pytest.raises(SubagentError) as info:
        no_load.resume(resume_request("c"))
    assert info.value.code == "START_FAILED"
    assert "loadSession" in info.value.detail


def test_plain_provider_refuses_continuable_starts(parent: Parent) -> None:
    request = SubagentStartRequest(
        prompt=text_prompt("x"),
        parent=parent,
        signal=AbortSignal.never(),
        continuation=SubagentContinuation(session_id="child-1", descriptor=None),
    )
    with pytest.raises(SubagentError) as info:
        AcpProvider(peer_config("normal")).start(request)
    assert info.value.code == "UNSUPPORTED_CAPABILITY"


def test_discovery_offers_resume_only_when_the_agent_advertises_load_session() -> None:
    assert isinstance(discover_acp_provider(peer_config("normal")), Resumable)
    plain = discover_acp_provider(peer_config("permission"))
    assert isinstance(plain, AcpProvider)
    assert not isinstance(plain, Resumable)


# -- bounded handshakes (stdlib fake agent) -----------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "step"), [("silent", "initialize"), ("silent_new", "session/new")]
)
def test_a_silent_handshake_fails_start_naming_the_step(
    parent: Parent, notifier: Notifier, mode: str, step: str
) -> None:
    provider = AcpProvider(fake_config(mode, env=notifier.env, handshake_timeout=0.3))
    starting = gevent.spawn(start, provider, parent)
    pid = int(notifier.expect("pid"))
    starting.join()
    assert isinstance(starting.exception, SubagentError)
    assert starting.exception.code == "START_FAILED"
    assert f"{step} got no answer within 0.3 s" in starting.exception.detail
    assert not group_alive(pid)  # reaped before start rejected


def test_a_silent_session_load_fails_resume_naming_the_step(
    parent: Parent, notifier: Notifier
) -> None:
    config = fake_config(
        "silent_new", env=notifier.env, handshake_timeout=0.3, session_index={"c": "s1"}
    )
    resuming = gevent.spawn(
        ResumableAcpProvider(config).resume,
        SubagentResumeRequest(
            session_id="c",
            prompt=text_prompt("again"),
            source=MessageSource.user(),
            parent=parent,
            signal=AbortSignal.never(),
            descriptor=None,
        ),
    )
    pid = int(notifier.expect("pid"))
    resuming.join()
    assert isinstance(resuming.exception, SubagentError)
    assert resuming.exception.code == "START_FAILED"
    assert "session/load got no answer within 0.3 s" in resuming.exception.detail
    assert not group_alive(pid)


def test_discovery_is_bounded_by_the_timeout_and_the_signal(notifier: Notifier) -> None:
    with pytest.raises(SubagentError) as info:
        discover_acp_provider(fake_config("silent", handshake_timeout=0.3))
    assert info.value.code == "START_FAILED"
    assert "initialize got no answer" in info.value.detail

    controller = AbortController()
    discovering = gevent.spawn(
        discover_acp_provider, fake_config("silent", env=notifier.env), signal=controller.signal
    )
    pid = int(notifier.expect("pid"))
    controller.abort("no more waiting")
    discovering.join()
    assert isinstance(discovering.exception, SubagentError)
    assert discovering.exception.code == "ABORTED"
    assert not group_alive(pid)


# -- a dying launcher ---------------------------------------------------------------------------


def test_a_killed_launcher_ends_the_run_error_and_its_group_is_reaped(
    parent: Parent, notifier: Notifier
) -> None:
    run = start(AcpProvider(fake_config("launcher", env=notifier.env)), parent)
    launcher = int(notifier.expect("pid"))
    agent = int(notifier.expect_all("agent", "prompt")["agent"])  # the turn is in flight
    assert launcher == run.pid
    os.kill(launcher, 9)  # the real agent still holds stdout open
    result = run.result.get(timeout=RESULT_TIMEOUT)
    assert result.stop_reason == "error"
    assert "the agent process exited" in (result.diagnostic or "")
    assert "exit code -9" in (result.diagnostic or "")
    wait_until(lambda: not pid_alive(agent))  # reaped without anyone disposing the run
    assert not group_alive(run.pid)
    run.dispose()


# -- permissions --------------------------------------------------------------------------------


def test_a_refused_permission_is_the_agents_reject_option_and_not_an_abort(
    parent: Parent,
) -> None:
    events: list[dict[str, Any]] = []
    provider = AcpProvider(fake_config("refusing", on_progress=events.append))
    result = finish(start(provider, parent))
    assert result.output == [{"type": "text", "text": "permission: reject_once"}]
    assert result.stop_reason == "error"  # the agent ended `cancelled`, nobody aborted it
    assert "refused permission for: rm -rf build" in (result.diagnostic or "")
    assert events[0]["update"]["kind"] == "reject_once"


def test_allow_prefers_allow_once(parent: Parent) -> None:
    provider = AcpProvider(fake_config("refusing", permission="allow"))
    result = finish(start(provider, parent))
    assert result.output == [{"type": "text", "text": "permission: allow_once"}]
    assert result.stop_reason == "completed"


# -- diagnostics --------------------------------------------------------------------------------


def test_a_json_rpc_error_carries_its_data_and_stderr_is_clean(parent: Parent) -> None:
    result = finish(start(AcpProvider(fake_config("rpc_error")), parent))
    assert result.stop_reason == "error"
    diagnostic = result.diagnostic or ""
    assert "Internal error (code -32603)" in diagnostic
    assert "quota exhausted for model m-1" in diagnostic  # the agent's reason, from `data`
    assert "fatal: model quota exhausted" in diagnostic  # the stderr tail
    assert "\x1b" not in diagnostic and "\x07" not in diagnostic


# -- a bad line from the agent ends the run, says what was wrong, and reaps the agent -----------


@pytest.mark.parametrize(
    ("mode", "why"),
    [
        ("garbage", "malformed JSON: expecting value at column 1"),
        ("big_number", "a JSON number has more than 4,300 digits"),
        ("escape_garbage", "malformed JSON"),
    ],
)
def test_a_bad_line_mid_turn_ends_the_run_says_why_and_reaps_the_agent(
    parent: Parent, mode: str, why: str
) -> None:
    """The run ends `error` with a diagnostic naming the fault, the line shown escaped (no raw
    control character), and the agent is reaped as soon as the run ends, not only at dispose."""
    run = start(AcpProvider(peer_config(mode)), parent)
    result = run.result.get(timeout=RESULT_TIMEOUT)
    try:
        assert result.stop_reason == "error"
        diagnostic = result.diagnostic or ""
        assert diagnostic.startswith(f"protocol error: {why}"), diagnostic
        assert not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in diagnostic), diagnostic
        if mode == "escape_garbage":
            assert "\\x1b[2J" in diagnostic and "\\x9b" in diagnostic
        wait_until(lambda: not group_alive(run.pid), timeout=RESULT_TIMEOUT)
    finally:
        run.dispose()
    assert not group_alive(run.pid)


def test_an_agent_streaming_without_end_is_stopped_at_the_output_bound(parent: Parent) -> None:
    """An agent may not fill the host's memory with its answer: past `MAX_OUTPUT_BYTES` the
    run ends `error`, saying so, and the agent is reaped before anyone disposes the run."""
    run = start(AcpProvider(peer_config("flood_output")), parent)
    result = run.result.get(timeout=RESULT_TIMEOUT)
    try:
        assert result.stop_reason == "error"
        assert "the agent's answer exceeds 66,060,288 bytes (UTF-8)" in (result.diagnostic or "")
        assert len(result.output[0]["text"]) <= acp_module.MAX_OUTPUT_BYTES
        wait_until(lambda: not group_alive(run.pid), timeout=RESULT_TIMEOUT)
    finally:
        run.dispose()
