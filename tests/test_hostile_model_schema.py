"""Schemas that point elsewhere: nothing is fetched at run time.

A tool's parameters (a tool author's schema, or one an MCP/ACP peer described) with a `$ref` to
`http://...` made jsonschema fetch it, with a blocking `urllib` call on the hub, each time a
model called the tool. Structured-output schemas (the caller's) never had `$ref` (the subset
refuses it before a run exists); these tests hold both with a listener on 127.0.0.1 that counts
who connects.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import gevent
import pytest
from gevent.server import StreamServer
from gevent.socket import socket as Socket
from seam_kit import kit
from test_model_tools import results, text_of

from agent.models import scripted as S
from agent.store import MemoryStore
from agent.tools import Tool, ToolContext
from subagent.errors import SubagentError
from subagent.runtime import Runtime
from subagent.schema import validate_output


class Listener:
    """A server that answers any request with a schema, and counts the connections."""

    def __init__(self) -> None:
        self.connections = 0
        self._server = StreamServer(("127.0.0.1", 0), self._handle)
        self._server.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_port}/schema.json"

    def _handle(self, sock: Socket, _addr: Any) -> None:
        self.connections += 1
        body = b'{"type": "string"}'
        sock.recv(65536)
        sock.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )

    def close(self) -> None:
        self._server.stop(timeout=1)


@pytest.fixture
def listener() -> Iterator[Listener]:
    server = Listener()
    try:
        yield server
    finally:
        server.close()


def test_a_tools_remote_ref_is_never_fetched(listener: Listener) -> None:
    seen: list[Mapping[str, Any]] = []

    def fn(arguments: Mapping[str, Any], _ctx: ToolContext) -> str:
        seen.append(arguments)
        return "ran"

    parameters = {"type": "object", "properties": {"a": {"$ref": listener.url}}}
    with Runtime(store=MemoryStore()) as rt:
        rt.ctx.tools.register(Tool("remote", "Refers elsewhere.", parameters, fn))
        rt.scripted.script("root", [S.tool_call("remote", {"a": 1}), S.text("ok")])
        root = rt.agent(session_id="root")
        root.send("go").get()
        assert root.when_idle().get().reason == "completed"
        (result,) = results(root)
    gevent.sleep(0)  # a connection the validator opened would have been accepted by now
    assert listener.connections == 0
    assert seen == []
    assert result["code"] == "TOOL_FAILED"
    assert listener.url in text_of(result) and "never fetched" in text_of(result)


@pytest.mark.parametrize(
    "where",
    [
        lambda url: {"type": "object", "properties": {"a": {"$ref": url}}},
        lambda url: {"type": "object", "$schema": url},
        lambda url: {"type": "object", "properties": {"a": {"oneOf": [{"$ref": url}]}}},
    ],
)
def test_a_structured_output_schema_with_a_remote_ref_is_refused_before_a_run(
    listener: Listener, where: Any
) -> None:
    schema = where(listener.url)
    with kit() as k:
        parent = k.parent()
        with pytest.raises(SubagentError) as info:
            k.start(parent, output_schema=schema)
        assert info.value.code == "UNSUPPORTED_SCHEMA"
        assert k.service.list_children(parent.id) == []
        assert [a for a in k.runtime.ctx.agents if a != parent.id] == []
        with pytest.raises(SubagentError) as info:
            validate_output(schema, {"a": "x"})
        assert info.value.code == "UNSUPPORTED_SCHEMA"
    gevent.sleep(0)
    assert listener.connections == 0
