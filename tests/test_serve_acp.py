"""`subagent acp`, driven by the ACP SDK client in its own process, and run as the child of
another runtime's `acp` provider (a runtime as a child of a runtime, the depth cap across both).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gevent import subprocess as gsub
from test_serve_mcp import BAD_LINES, answers_to_bad_lines, start_server

from agent.model import ModelRequest
from agent.models import scripted as S
from agent.options import AgentOptions
from agent.store import SessionStore
from providers.acp import DEPTH_META, AcpConfig, AcpProvider, session_params
from providers.acp_rpc import MAX_ERROR_MESSAGE
from subagent.runtime import Runtime
from subagent.serve.acp_agent import IGNORED_MCP_META
from subagent.tools import PROVIDER_MANAGED, SubagentToolConfig, install_subagent_tools

REPO = Path(__file__).resolve().parent.parent
CLIENT = REPO / "tests" / "serve_clients" / "acp_client.py"


def drive(
    scenario: str, home: Path, *server_args: str, env: dict[str, str] | None = None
) -> dict[str, Any]:
    environ = {k: v for k, v in os.environ.items() if k != "SUBAGENT_HOME"}
    environ.update(env or {})
    proc = gsub.run(
        [sys.executable, str(CLIENT), scenario, str(home), *server_args],
        cwd=REPO,
        env=environ,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def child_calls(turn: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {k: v for k, v in turn["calls"].items() if k.startswith("child:")}


def own_calls(turn: dict[str, Any]) -> list[dict[str, Any]]:
    return [v for k, v in turn["calls"].items() if not k.startswith("child:")]


@pytest.fixture(scope="module")
def basic(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return drive("basic", tmp_path_factory.mktemp("acp-home"), "--max-depth", "3")


def test_initialize_advertises_load_session(basic: dict[str, Any]) -> None:
    assert basic["protocol"] == 1
    assert basic["load_session"] is True


def test_a_prompt_streams_text_the_tool_call_and_the_childs_life(basic: dict[str, Any]) -> None:
    turn = basic["delegate"]
    assert turn["stop"] == "end_turn"
    assert turn["message"].endswith(
        "subagent returned: (offline scripted model) received: hello child"
    )
    (call,) = own_calls(turn)
    assert call["title"] == "subagent: hello child" and call["status"] == "completed"
    assert call["rawInput"] == {"description": "hello child", "prompt": "hello child"}
    ((_child_id, child),) = child_calls(turn).items()
    assert child["first"] == "tool_call"  # opened before any update, though progress may lead
    assert child["status"] == "completed"
    assert child["meta"] == {"subagent-runtime/parent": basic["session"]}
    assert child["lines"][0].endswith(": turn 1 started")  # progress while it ran
    assert any(line.endswith(": step 1") for line in child["lines"])
    assert child["lines"][-1].endswith("received: hello child")  # its answer at the end


def test_background_child_and_task_output_in_one_turn(basic: dict[str, Any]) -> None:
    turn = basic["background"]
    assert turn["stop"] == "end_turn"
    started, output = own_calls(turn)
    assert started["rawInput"]["run_in_background"] is True
    assert "Started continuable subagent" in started["lines"][0]
    assert output["title"] == "task_output" and output["rawInput"]["task_id"] == "task-1"
    assert output["lines"][0].startswith("Task task-1 (background work): completed")


def test_a_crashing_child_fails_its_call_with_the_code(basic: dict[str, Any]) -> None:
    turn = basic["crash"]
    assert turn["stop"] == "end_turn"  # the coordinator survives and reports
    (call,) = own_calls(turn)
    assert call["status"] == "failed"
    assert call["meta"] == {"subagent-runtime/code": "SUBAGENT_ERROR"}
    assert "Diagnostic: boom" in call["lines"][0]
    ((_, child),) = child_calls(turn).items()
    assert child["status"] == "failed" and child["lines"][-1].endswith("ended error")


def test_bad_tool_arguments_fail_the_call_with_the_code(basic: dict[str, Any]) -> None:
    (call,) = own_calls(basic["bad_args"])
    assert call["status"] == "failed"
    assert call["meta"] == {"subagent-runtime/code": "INVALID_ARGS"}
    assert not child_calls(basic["bad_args"])  # nothing was started


def test_bad_protocol_arguments_are_json_rpc_errors(basic: dict[str, Any]) -> None:
    assert basic["unknown_session"]["code"] == -32602
    assert basic["bad_depth"]["code"] == -32602
    assert DEPTH_META in basic["bad_depth"]["message"]


def test_a_coordinator_turn_that_ends_error_is_a_json_rpc_error(basic: dict[str, Any]) -> None:
    error = basic["coordinator_error"]
    assert error["code"] == -32603
    assert "ended error: the coordinator's model broke" in error["message"]


def test_a_session_started_at_the_cap_by_meta_cannot_delegate(basic: dict[str, Any]) -> None:
    turn = basic["at_cap"]
    assert turn["message"].endswith("cannot delegate: no subagent tool at this depth")
    assert not child_calls(turn)


def test_session_cancel_cascades_to_the_child(tmp_path: Path) -> None:
    seen = drive("cancel", tmp_path)
    assert seen["stop"] == "cancelled"
    child = seen["calls"][seen["child"]]
    assert child["status"] == "failed" and child["lines"][-1].endswith("ended aborted")
    events = SessionStore(tmp_path / "sessions").inspect(seen["child"][len("child:") :]).events
    (end,) = [e["data"] for e in events if e["type"] == "turn/end"]
    assert end["reason"] == "aborted"


def test_session_load_continues_the_coordinator_and_its_children(tmp_path: Path) -> None:
    first = drive("load_first", tmp_path)
    again = drive(
        "load_again",
        tmp_path,
        env={"ACP_LOAD_SESSION": first["session"], "ACP_LOAD_CHILD": first["child"]},
    )
    assert again["replayed_user"][0] == "/background remember the number 7"
    assert "subagent" in again["replayed_calls"]
    assert again["stop"] == "end_turn"
    sent, output = own_calls(again)
    assert "was stopped; it resumed with your message" in sent["lines"][0]
    assert "received: what was the number?" in output["lines"][0]
    child = again["calls"][f"child:{first['child']}"]
    assert child["first"] == "tool_call"  # a new process opens the resumed child's call
    assert child["lines"][0].endswith("turn 2 started")  # the stored child's second turn


def test_a_cancel_right_behind_its_prompt_answers_cancelled(tmp_path: Path) -> None:
    """Prompt and cancel in one write: the cancel may find the turn queued but unstarted (the
    message is discarded) or running; either way the prompt is answered `cancelled`."""
    proc = start_server("acp", tmp_path)
    assert proc.stdin is not None and proc.stdout is not None

    def send(*messages: dict[str, Any]) -> None:
        assert proc.stdin is not None
        proc.stdin.write("".join(json.dumps({"jsonrpc": "2.0", **m}) + "\n" for m in messages))
        proc.stdin.flush()

    def reply(rid: int) -> dict[str, Any]:
        assert proc.stdout is not None
        while True:
            message: dict[str, Any] = json.loads(proc.stdout.readline())
            if message.get("id") == rid:
                return message

    send({"id": 1, "method": "initialize", "params": {"protocolVersion": 1}})
    reply(1)
    send({"id": 2, "method": "session/new", "params": {"cwd": str(REPO), "mcpServers": []}})
    sid = reply(2)["result"]["sessionId"]
    prompt = [{"type": "text", "text": "/hang"}]
    send(
        {"id": 3, "method": "session/prompt", "params": {"sessionId": sid, "prompt": prompt}},
        {"method": "session/cancel", "params": {"sessionId": sid}},
    )
    assert reply(3)["result"] == {"stopReason": "cancelled"}
    send(
        {
            "id": 4,
            "method": "session/prompt",
            "params": {"sessionId": sid, "prompt": [{"type": "text", "text": "still here?"}]},
        }
    )
    assert reply(4)["result"] == {"stopReason": "end_turn"}  # the session goes on
    proc.stdin.close()
    proc.communicate(timeout=60)
    assert proc.returncode == 0


# -- a runtime as the child of a runtime -------------------------------------------------------


def test_session_params_carry_the_parents_depth_plus_one() -> None:
    class Parent:
        depth = 2

    assert session_params("/tmp", Parent()) == {
        "cwd": "/tmp",
        "mcpServers": [],
        "_meta": {DEPTH_META: 3},
    }
    assert session_params("/tmp", object()) == {"cwd": "/tmp", "mcpServers": []}


def _relay(request: ModelRequest) -> S.Step:
    last = request.messages[-1]
    if last.get("role") == "tool":
        return S.text("".join(b.get("text", "") for b in last.get("content", ())))
    prompt = "".join(b.get("text", "") for b in last.get("content", ()))
    return S.tool_call("subagent", {"description": "inner runtime", "prompt": prompt})


@pytest.fixture
def outer(tmp_path: Path) -> Iterator[tuple[Runtime, Path]]:
    inner_home = tmp_path / "inner"
    rt = Runtime(store=SessionStore(tmp_path / "outer"), scripted=S.ScriptedModel(_relay))
    config = AcpConfig(
        command=sys.executable,
        args=["-m", "subagent.cli", "--home", str(inner_home), "acp", "--max-depth", "3"],
        cwd=str(REPO),
        name="inner",
    )
    rt.subagents.register(AcpProvider(config))
    install_subagent_tools(
        rt, tools=[SubagentToolConfig("inner", name="subagent", max_depth=PROVIDER_MANAGED)]
    )
    try:
        yield rt, inner_home
    finally:
        rt.close()


def test_a_runtime_runs_subagent_acp_as_its_child_and_the_cap_holds_across(
    outer: tuple[Runtime, Path],
) -> None:
    rt, inner_home = outer
    root = rt.agent(options=AgentOptions(model="scripted:relay"))
    root.send("/delegate /delegate /delegate /delegate deep").get()
    outcome = root.when_idle().get()
    assert outcome.reason == "completed"
    answer = "".join(b.get("text", "") for b in outcome.output)
    # The inner coordinator starts at depth 1 (the outer root's child), so with a cap of 3 only
    # two more levels fit: the agent at depth 3 cannot delegate, although the prompt asks for
    # four levels (starting at 0, the inner runtime would have let depth 3 delegate once more).
    assert answer.endswith("cannot delegate: no subagent tool at this depth"), answer
    headers = SessionStore(inner_home / "sessions").list()
    assert sorted(h.delegation_depth for h in headers) == [1, 2, 3]


# -- raw requests -------------------------------------------------------------------------------


class RawClient:
    """`subagent acp` as a subprocess, spoken to in raw JSON-RPC lines (bytes: a `\\udce9`
    escape is ASCII on the wire, so anything a client could send can be sent)."""

    def __init__(self, home: Path, *flags: str) -> None:
        self.proc = start_server("acp", home, *flags, text=False)
        self.ask(0, "initialize", {"protocolVersion": 1})

    def ask(self, rid: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
        stdin, stdout = self.proc.stdin, self.proc.stdout
        assert stdin is not None and stdout is not None
        message = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}
        stdin.write(json.dumps(message).encode() + b"\n")
        stdin.flush()
        while True:
            answer: dict[str, Any] = json.loads(stdout.readline())
            if answer.get("id") == rid:
                return answer

    def close(self) -> str:
        """Hang up; the server's stderr, after it exited 0 without a traceback."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        _, raw = self.proc.communicate(timeout=60)
        stderr = raw.decode("utf-8", "replace")
        assert self.proc.returncode == 0, stderr[-2000:]
        assert "Traceback" not in stderr, stderr[-2000:]
        return stderr


def test_session_new_and_load_refuse_a_non_utf8_cwd_by_name(tmp_path: Path) -> None:
    """A client can name such a directory only with a lone-surrogate JSON escape: refused as
    invalid params naming the problem, and the connection goes on (docs/decisions.md)."""
    bad = os.fsdecode(os.path.join(os.fsencode(tmp_path), b"caf\xe9"))
    os.mkdir(bad)
    client = RawClient(tmp_path / "home")
    for rid, method, extra in ((2, "session/new", {}), (3, "session/load", {"sessionId": "s1"})):
        error = client.ask(rid, method, {"cwd": bad, "mcpServers": [], **extra})["error"]
        assert error["code"] == -32602, error
        assert "is not valid UTF-8" in error["message"]
    good = client.ask(4, "session/new", {"cwd": str(tmp_path), "mcpServers": []})
    assert "sessionId" in good["result"]
    client.close()


def test_the_clients_mcp_servers_are_named_as_not_connected(tmp_path: Path) -> None:
    """Not connected (docs/serve.md), and not silently: the answer's `_meta` says so (and the
    log, which `--debug` sends to stderr)."""
    servers = [
        {"name": "filesystem", "command": "/bin/true", "args": [], "env": []},
        {"type": "http", "name": "api", "url": "http://127.0.0.1:9/mcp", "headers": []},
    ]
    client = RawClient(tmp_path / "home", "--debug")
    new = client.ask(1, "session/new", {"cwd": str(tmp_path), "mcpServers": servers})["result"]
    assert new["_meta"] == {IGNORED_MCP_META: ["filesystem", "api"]}
    params = {"sessionId": new["sessionId"], "cwd": str(tmp_path), "mcpServers": servers[:1]}
    loaded = client.ask(2, "session/load", params)["result"]
    assert loaded["_meta"] == {IGNORED_MCP_META: ["filesystem"]}
    plain = client.ask(3, "session/new", {"cwd": str(tmp_path), "mcpServers": []})["result"]
    assert "_meta" not in plain
    bad = client.ask(4, "session/new", {"cwd": str(tmp_path), "mcpServers": "filesystem"})
    assert bad["error"]["code"] == -32602
    stderr = client.close()
    assert "not connecting the client's MCP server(s) filesystem, api" in stderr


def test_warnings_reach_stderr_without_debug_escaped_and_off_the_protocol(tmp_path: Path) -> None:
    """A server logs its warnings to stderr by default (WARNING and up: no INFO), as data (a
    client-given name keeps its escape visible), while stdout carries only protocol lines
    (`RawClient.ask` parses every line it reads as JSON)."""
    servers = [{"name": "evil\x1b[2Jname", "command": "/bin/true", "args": [], "env": []}]
    client = RawClient(tmp_path / "home")
    new = client.ask(1, "session/new", {"cwd": str(tmp_path), "mcpServers": servers})["result"]
    assert new["_meta"] == {IGNORED_MCP_META: ["evil\x1b[2Jname"]}  # the protocol keeps it
    stderr = client.close()
    assert "\x1b" not in stderr
    lines = [line for line in stderr.splitlines() if "not connecting" in line]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("WARNING:subagent.serve.acp_agent:")
    assert "MCP server(s) evil\\x1b[2Jname:" in lines[0]
    assert "INFO:" not in stderr and "DEBUG:" not in stderr


def test_debug_adds_info_and_debug_lines_to_a_servers_stderr(tmp_path: Path) -> None:
    client = RawClient(tmp_path / "home", "--debug")
    client.ask(1, "session/new", {"cwd": str(tmp_path), "mcpServers": []})
    stderr = client.close()
    assert "INFO:subagent.serve.acp_agent:acp server: session " in stderr
    assert "DEBUG:" in stderr


def test_a_bad_line_is_answered_and_the_acp_server_goes_on(tmp_path: Path) -> None:
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": 1, "clientCapabilities": {}},
    }
    answers = answers_to_bad_lines("acp", tmp_path, initialize)
    errors = [(a["error"]["code"], a["id"]) for a in answers[:-1]]
    assert errors == [(code, ident) for _, code, ident in BAD_LINES]
    assert answers[-1]["result"]["protocolVersion"] == 1


def test_an_error_quotes_at_most_the_start_of_a_huge_value(tmp_path: Path) -> None:
    """A refused session id, cwd or method name of a megabyte is quoted by its start only: the
    answer stays small, says how much was cut, and the connection goes on."""
    client = RawClient(tmp_path / "home")
    huge = "x" * 1_000_000
    cwd = str(tmp_path)
    asks = (
        (2, "session/load", {"cwd": cwd, "mcpServers": [], "sessionId": huge}),
        (3, "session/prompt", {"sessionId": huge, "prompt": []}),
        (4, huge, {}),
    )
    for rid, method, params in asks:
        error = client.ask(rid, method, params)["error"]
        assert len(error["message"]) < MAX_ERROR_MESSAGE + 100, (method[:20], error["code"])
        assert error["message"].endswith("characters cut)"), error["message"][-80:]
    good = client.ask(5, "session/new", {"cwd": cwd, "mcpServers": []})
    assert "sessionId" in good["result"]
    client.close()


def test_initialize_answers_its_own_version_and_refuses_what_is_not_a_version(
    tmp_path: Path,
) -> None:
    """ACP's negotiation: a client names the latest version it speaks; an agent that does not
    speak it answers with the latest it does (ours: 1), and the client decides. A value that is
    no version at all is invalid params, not a version 1 session."""
    client = RawClient(tmp_path / "home")
    assert client.ask(1, "initialize", {"protocolVersion": 2})["result"]["protocolVersion"] == 1
    refused = [{}, {"protocolVersion": "1"}, {"protocolVersion": True}, {"protocolVersion": -1}]
    for rid, params in enumerate(refused, 2):
        assert client.ask(rid, "initialize", params)["error"]["code"] == -32602, params
    assert client.ask(9, "initialize", {"protocolVersion": 1})["result"]["protocolVersion"] == 1
    client.close()
