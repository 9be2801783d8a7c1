"""`subagent mcp`, driven by the official MCP Python SDK client in its own process.

The SDK client is asyncio-based, so it runs in `tests/serve_clients/mcp_client.py` (started with
this interpreter); it starts the server as a real subprocess over stdio and prints what it saw.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import gevent
import pytest
from gevent import subprocess as gsub

from agent.store import SessionStore
from subagent.serve.wiring import ServeConfig, acp_config_from_flag, load_config, merge_flags

REPO = Path(__file__).resolve().parent.parent
CLIENT = REPO / "tests" / "serve_clients" / "mcp_client.py"


def start_server(command: str, home: Path, *flags: str, text: bool = True) -> Any:
    """`subagent [FLAGS] --home HOME COMMAND` (`mcp` or `acp`) as a subprocess on pipes."""
    return gsub.Popen(
        [sys.executable, "-m", "subagent.cli", *flags, "--home", str(home), command],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=text,
    )


def terminated(proc: Any, timeout: float = 60) -> tuple[Any, Any]:
    """SIGTERM the server and wait for it to exit; its stdout and stderr. Its stdin stays open
    until then: closed at once (as `communicate` does), the end of input raced the signal, and
    a server that read the end first exited 0 as for a client that hung up."""
    proc.send_signal(signal.SIGTERM)
    out = gevent.spawn(proc.stdout.read)
    err = gevent.spawn(proc.stderr.read)
    try:
        proc.wait(timeout=timeout)
    except gsub.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail(f"the server, sent SIGTERM, had not exited {timeout:g} s later")
    finally:
        proc.stdin.close()
    return out.get(timeout=10), err.get(timeout=10)


def drive(scenario: str, home: Path, *server_args: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "SUBAGENT_HOME"}
    proc = gsub.run(
        [sys.executable, str(CLIENT), scenario, str(home), *server_args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


@pytest.fixture(scope="module")
def basic(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return drive("basic", tmp_path_factory.mktemp("mcp-home"))


def test_handshake_and_the_six_tools_with_their_schemas(basic: dict[str, Any]) -> None:
    assert basic["protocol"] == "2025-06-18"  # the SDK asked for a newer one; we answer ours
    assert basic["server"] == "subagent-runtime"
    assert set(basic["tools"]) == {
        "subagent",
        "send_message",
        "interrupt_agent",
        "list_agents",
        "task_output",
        "task_kill",
    }
    schema = basic["tools"]["subagent"]
    assert schema["required"] == ["description", "prompt"]
    assert schema["properties"]["run_in_background"]["type"] == "boolean"
    assert basic["tools"]["task_output"]["required"] == ["task_id"]
    assert basic["ping"] is True


def test_foreground_delegation_answers_with_the_childs_output(basic: dict[str, Any]) -> None:
    assert basic["foreground"] == {
        "text": "(offline scripted model) received: hello from the client",
        "is_error": False,
        "code": None,
    }


def test_progress_notifications_follow_the_child_while_the_call_runs(
    basic: dict[str, Any],
) -> None:
    lines = [p.split("|", 1) for p in basic["progress"]]
    values = [float(v) for v, _ in lines]
    assert values == sorted(values) and len(set(values)) == len(values)  # strictly increasing
    messages = [m for _, m in lines]
    assert any(m.endswith("started on spawn") for m in messages)
    assert any(m.endswith(": step 1") for m in messages)
    assert messages[-1].endswith("(say hello): ended completed")


def test_overlapping_calls_each_see_only_their_own_subtree_in_progress(tmp_path: Path) -> None:
    seen = drive("overlap", tmp_path)
    assert seen["second_result"]["is_error"] is False
    first, second = seen["first"], seen["second"]
    # Nothing of the other call's subtree, though both ran on the connection's one root agent.
    assert not [m for m in first if "(second)" in m or "(inner work)" in m], first
    assert not [m for m in second if "(first)" in m or "(grandchild work)" in m], second
    # And all of its own: the child, then the grandchild it delegated to.
    assert any(m.endswith("(first): step 1") for m in first)
    assert any(m.endswith("(grandchild work): ended completed") for m in first)
    assert any(m.endswith("(second): step 1") for m in second)
    assert any(m.endswith("(inner work): ended completed") for m in second)
    assert second[-1].endswith("(second): ended completed")


def test_bad_arguments_are_an_error_result_with_the_code(basic: dict[str, Any]) -> None:
    bad = basic["bad_args"]
    assert bad["is_error"] is True and bad["code"] == "INVALID_ARGS"
    assert bad["text"].startswith("[INVALID_ARGS] ")
    assert "'description' is a required property" in bad["text"]


def test_a_crashing_child_is_an_error_result_not_a_transport_error(
    basic: dict[str, Any],
) -> None:
    crash = basic["crash"]
    assert crash["is_error"] is True and crash["code"] == "SUBAGENT_ERROR"
    assert "Diagnostic: boom" in crash["text"]


def test_background_task_then_task_output_then_a_follow_up(basic: dict[str, Any]) -> None:
    assert basic["background"]["is_error"] is False
    assert "Task task-1 (in background): completed" in basic["task_output"]["text"]
    assert "received: background work" in basic["task_output"]["text"]
    unknown = basic["unknown_task"]
    assert unknown["is_error"] is True and unknown["code"] == "UNKNOWN_TASK"
    assert f"{basic['child']}  status=stored  mode=continuable" in basic["listing"]["text"]
    assert "resumed with your message" in basic["send_message"]["text"]
    assert "received: follow up" in basic["resumed_output"]["text"]


def test_an_unknown_tool_name_is_a_protocol_error(basic: dict[str, Any]) -> None:
    assert basic["unknown_tool"].startswith("MCPError")
    assert "unknown tool: no_such_tool" in basic["unknown_tool"]


def test_cancelling_a_call_cancels_its_child(tmp_path: Path) -> None:
    seen = drive("cancel", tmp_path)
    assert "answered" not in seen  # a cancelled call gets no answer
    assert "status=running" not in seen["after"]
    events = SessionStore(tmp_path / "sessions").inspect(seen["child"]).events
    (end,) = [e["data"] for e in events if e["type"] == "turn/end"]
    assert end["reason"] == "aborted"
    assert "cancelled by the MCP client" in end["cause"]


def test_at_the_depth_cap_subagent_is_hidden_and_refused(tmp_path: Path) -> None:
    seen = drive("depth", tmp_path, "--max-depth", "0")
    assert "subagent" not in seen["tools"]
    assert seen["forged"]["is_error"] is True and seen["forged"]["code"] == "UNKNOWN_TOOL"


def test_the_depth_cap_counts_from_the_connection_root(tmp_path: Path) -> None:
    seen = drive("nested", tmp_path, "--max-depth", "2")
    assert seen["nested"]["text"].endswith("cannot delegate: no subagent tool at this depth")
    depths = sorted(h.delegation_depth for h in SessionStore(tmp_path / "sessions").list())
    assert depths == [0, 1, 2]


def test_an_acp_agent_from_the_flag_is_a_tool_with_progress(tmp_path: Path) -> None:
    peer = REPO / "tests" / "acp_peers" / "sdk_agent.py"
    seen = drive("acp_child", tmp_path, "--acp", f"peer={sys.executable} {peer} normal")
    assert "subagent_peer" in seen["tools"]
    assert seen["result"]["is_error"] is False
    assert seen["result"]["text"].startswith("echo: hello peer")
    progress = seen["progress"]
    assert any(m.endswith(": started on peer") for m in progress)
    assert any(m.endswith("(ask the peer): tool_call look around") for m in progress)
    assert progress[-1].endswith("(ask the peer): ended completed")


def test_stdout_carries_only_protocol(tmp_path: Path) -> None:
    """A raw client: every line the server writes is a JSON-RPC message, logging goes to stderr."""
    messages = [
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2024-11-05",
                "capabilities": {},
                "clientInfo": {"name": "raw", "version": "0"},
            },
        },
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {"name": "subagent", "arguments": {"description": "d", "prompt": "hi"}},
        },
    ]
    proc = start_server("mcp", tmp_path, "--debug")
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("".join(json.dumps(m) + "\n" for m in messages))
    proc.stdin.flush()
    replies = [json.loads(proc.stdout.readline()) for _ in range(2)]
    proc.stdin.close()  # EOF: the client is done, the server exits
    rest, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr[-2000:]
    assert rest == ""
    assert [r.get("id") for r in replies] == [1, 2]
    assert replies[0]["result"]["protocolVersion"] == "2024-11-05"  # an older version, accepted
    assert replies[1]["result"]["isError"] is False
    assert "DEBUG" in stderr  # --debug logging went to stderr, not into the protocol


def test_sigterm_cancels_running_children_and_exits_after_a_graceful_stop(tmp_path: Path) -> None:
    messages = [
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {}},
        },
        {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {
                "name": "subagent",
                "arguments": {"description": "wait", "prompt": "/hang"},
                "_meta": {"progressToken": 7},
            },
        },
    ]
    proc = start_server("mcp", tmp_path)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("".join(json.dumps(m) + "\n" for m in messages))
    proc.stdin.flush()
    child = None
    while child is None:  # wait for the child's first step, reported as progress
        message = json.loads(proc.stdout.readline())
        text = message.get("params", {}).get("message", "")
        if text.endswith(": step 1"):
            child = text.split(":")[0].split()[0]
    rest, stderr = terminated(proc)
    assert proc.returncode == 143, stderr[-2000:]  # after a graceful stop
    assert '"id":2' not in rest  # the call was cancelled, not answered
    events = SessionStore(tmp_path / "sessions").inspect(child).events
    (end,) = [e["data"] for e in events if e["type"] == "turn/end"]
    assert end["reason"] == "aborted"
    assert "shutting down" in end["cause"]


BAD_LINES = [
    # (the line, the JSON-RPC error code, the id the answer carries)
    ("this is not json", -32700, None),
    ("[]", -32600, None),  # a batch: MCP has none since 2025-06-18
    ("42", -32600, None),
    ('{"jsonrpc": "2.0", "id": 7}', -32600, 7),  # neither a request nor a response
    ('{"jsonrpc": "2.0", "id": [1], "params": {}}', -32600, None),  # an id that is no id
    # Requests whose id cannot be echoed: answered as invalid with `id: null`, never with the
    # object back, nor `Infinity` (what `1e400` parses to), which is not JSON.
    ('{"jsonrpc": "2.0", "id": {"a": 1}, "method": "tools/list"}', -32600, None),
    ('{"jsonrpc": "2.0", "id": 1e400, "method": "tools/list"}', -32600, None),
    ('{"jsonrpc": "2.0", "id": true, "method": "tools/list"}', -32600, None),
    ('{"jsonrpc": "2.0", "id": null, "method": "tools/list"}', -32600, None),
]


def answers_to_bad_lines(
    command: str, home: Path, first: dict[str, Any], extra: str = ""
) -> list[Any]:
    """Send each bad line, then `first`; return every answer up to the one for `first`."""
    proc = start_server(command, home)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(extra + "".join(line + "\n" for line, _, _ in BAD_LINES))
    proc.stdin.write(json.dumps(first) + "\n")
    proc.stdin.flush()
    answers: list[Any] = []
    while not answers or answers[-1].get("id") != first["id"]:
        answers.append(json.loads(proc.stdout.readline()))
    proc.stdin.close()
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr[-2000:]
    return answers


def test_a_bad_line_is_answered_and_the_server_goes_on(tmp_path: Path) -> None:
    """JSON-RPC 2.0: a parse error is -32700 and an invalid request -32600, `id: null` when the
    line has no usable id; the connection survives them (a client's stray line must not make the
    server vanish), and a later request is served."""
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"},
        },
    }
    answers = answers_to_bad_lines("mcp", tmp_path, initialize)
    errors = [(a["error"]["code"], a["id"]) for a in answers[:-1]]
    assert errors == [(code, ident) for _, code, ident in BAD_LINES]
    assert answers[-1]["result"]["serverInfo"]["name"] == "subagent-runtime"


def test_a_cancel_naming_an_object_id_is_a_warning_not_a_traceback(tmp_path: Path) -> None:
    """`notifications/cancelled` with an unhashable `requestId` used to raise in the handler
    (logged with a traceback); it names no call, so it is a one-line warning and nothing else."""
    proc = start_server("mcp", tmp_path)
    assert proc.stdin is not None and proc.stdout is not None
    cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled"}
    lines = [
        {**cancel, "params": {"requestId": {"x": "\x1b[31m"}}},
        {**cancel, "params": {"requestId": [1]}},
        {
            "jsonrpc": "2.0",
            "id": "after",
            "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {}},
        },
    ]
    proc.stdin.write("".join(json.dumps(line) + "\n" for line in lines))
    proc.stdin.flush()
    answer = json.loads(proc.stdout.readline())
    assert answer["id"] == "after" and "result" in answer
    proc.stdin.close()
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert "Traceback" not in stderr, stderr
    assert stderr.count("a cancel names no usable request id") == 2, stderr
    assert "\x1b" not in stderr


def test_an_id_that_cannot_be_a_session_names_no_child(tmp_path: Path) -> None:
    """A model (or client) that sends a malformed child id gets `UNKNOWN_CHILD`, as for any id
    no child has; it used to reach the service as a bad argument and come back `TOOL_FAILED`
    (the code for a tool that crashed)."""
    proc = start_server("mcp", tmp_path)
    assert proc.stdin is not None and proc.stdout is not None
    initialize = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {}},
    }
    calls = [
        ("send_message", {"subagent_id": "../../etc/passwd", "message": "hi"}),
        ("send_message", {"subagent_id": "\x1b[31m", "message": "hi"}),
        ("interrupt_agent", {"agent_id": "a/b"}),
    ]
    lines = [initialize, {"jsonrpc": "2.0", "method": "notifications/initialized"}]
    lines += [
        {"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {"name": n, "arguments": a}}
        for i, (n, a) in enumerate(calls, start=1)
    ]
    proc.stdin.write("".join(json.dumps(line) + "\n" for line in lines))
    proc.stdin.flush()
    answers = {}
    while len(answers) < len(calls) + 1:
        answer = json.loads(proc.stdout.readline())
        answers[answer["id"]] = answer
    proc.stdin.close()
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr[-2000:]
    for i in range(1, len(calls) + 1):
        result = answers[i]["result"]
        assert result["isError"] is True
        assert result["_meta"]["subagent-runtime/code"] == "UNKNOWN_CHILD", result
        assert "\x1b" not in result["content"][0]["text"]


def test_an_over_long_line_is_skipped_to_its_end_and_answered(tmp_path: Path) -> None:
    initialize = {
        "jsonrpc": "2.0",
        "id": "after",
        "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {}},
    }
    too_long = '{"jsonrpc": "2.0", "id": 9, "method": "x", "params": "' + "a" * (16 << 20) + '"}\n'
    answers = answers_to_bad_lines("mcp", tmp_path, initialize, extra=too_long)
    first = answers[0]
    assert first["id"] is None and first["error"]["code"] == -32600
    assert "exceeds" in first["error"]["message"]
    assert answers[-1]["id"] == "after" and "result" in answers[-1]


# -- configuration --------------------------------------------------------------------------


def test_config_file_and_flags_merge(tmp_path: Path) -> None:
    path = tmp_path / "serve.json"
    path.write_text(
        json.dumps(
            {
                "model": "qwen",
                "base_url": "http://127.0.0.1:1/v1",
                "max_depth": 2,
                "max_children_per_parent": 3,
                "acp": {"peer": {"command": sys.executable, "args": ["peer.py"]}},
            }
        )
    )
    merged = merge_flags(
        load_config(path),
        model=None,
        base_url=None,
        max_depth=4,
        store_dir=None,
        acp=[f"other={sys.executable} x.py"],
    )
    assert (merged.model, merged.max_depth) == ("qwen", 4)
    assert merged.max_children_per_parent == 3  # no flag: the file's
    flagged = merge_flags(
        load_config(path),
        model=None,
        base_url=None,
        max_depth=None,
        store_dir=None,
        acp=[],
        max_children_per_parent=7,
    )
    assert (flagged.max_depth, flagged.max_children_per_parent) == (2, 7)
    assert ServeConfig().max_children_per_parent == 16  # the commands' default
    assert [c.name for c in merged.acp] == ["peer", "other"]
    assert merged.acp[1].args == ("x.py",)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"modle": "x"}, "unknown keys modle"),
        ({"acp": {"spawn": "true"}}, "reserved"),
        ({"max_depth": -1}, "max_depth must be >= 0"),
        ({"base_url": "http://x"}, "--base-url needs --model"),
        ({"max_children_per_parent": 0}, "max_children_per_parent must be within 1..10000"),
        ({"max_children_per_parent": 10_001}, "must be within 1..10000"),
        ({"max_children_per_parent": True}, "max_children_per_parent must be an int"),
        ({"max_children_per_parent": "4"}, "max_children_per_parent must be an int"),
    ],
)
def test_a_bad_config_is_refused_by_name(tmp_path: Path, data: Any, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=message):
        load_config(path)


def test_acp_flag_names(tmp_path: Path) -> None:
    assert acp_config_from_flag(f"claude={sys.executable} -V").name == "claude"
    assert acp_config_from_flag(f"{sys.executable} -V").name == "acp"
    with pytest.raises(ValueError, match="names no command"):
        acp_config_from_flag("claude=")
    with pytest.raises(ValueError, match="two ACP agents"):
        ServeConfig(acp=(acp_config_from_flag("a=true"), acp_config_from_flag("a=true")))


@pytest.mark.parametrize("value", ["0", "10001", "many"])
def test_a_bad_children_cap_is_a_usage_error(tmp_path: Path, value: str) -> None:
    flags = ["--home", str(tmp_path), "mcp", "--max-children-per-parent", value]
    proc: subprocess.CompletedProcess[str] = gsub.run(
        [sys.executable, "-m", "subagent.cli", *flags],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()[-1:]
    assert "--max-children-per-parent" in line


def test_a_bad_flag_is_one_error_line_before_stdio_is_taken(tmp_path: Path) -> None:
    proc: subprocess.CompletedProcess[str] = gsub.run(
        [
            sys.executable,
            "-m",
            "subagent.cli",
            "--home",
            str(tmp_path),
            "mcp",
            "--acp",
            "x=/nonexistent/agent",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        "subagent mcp: error: command '/nonexistent/agent' is not an executable file (see --help)"
    ]


def test_a_lone_surrogate_from_the_client_reaches_it_back_repaired(tmp_path: Path) -> None:
    """A JSON `\\ud800` escape in a description becomes the child's label, which progress
    messages carry: they go out with U+FFFD (docs/decisions.md), not lost to an encode error."""
    messages = [
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {}},
        },
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {
                "name": "subagent",
                "arguments": {"description": "half \ud800 label", "prompt": "hi \udcff"},
                "_meta": {"progressToken": "tok"},
            },
        },
    ]
    proc = start_server("mcp", tmp_path, text=False)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(b"".join(json.dumps(m).encode() + b"\n" for m in messages))  # ASCII escapes
    proc.stdin.flush()
    seen: list[dict[str, Any]] = []
    while not seen or seen[-1].get("id") != 2:
        seen.append(json.loads(proc.stdout.readline()))
    proc.stdin.close()
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr[-2000:]
    assert b"UnicodeEncodeError" not in stderr, stderr[-2000:]
    progress = [m["params"]["message"] for m in seen if m.get("method") == "notifications/progress"]
    assert any(p.endswith("(half \ufffd label): ended completed") for p in progress), progress
    assert seen[-1]["result"]["content"][0]["text"].endswith("received: hi \ufffd")
