"""Drives `subagent acp` with the ACP SDK client (`acp`, asyncio), in its own process.

`python acp_client.py SCENARIO HOME [SERVER ARGS...]`: spawns `python -m subagent.cli --home
HOME acp SERVER ARGS...` with `acp.spawn_agent_process`, runs one scenario and prints one JSON
object of observations on stdout. Waits are on updates the agent sends, never on sleeps.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from typing import Any

import acp
from acp import text_block
from acp.schema import ClientCapabilities

SCENARIO, HOME, *SERVER_ARGS = sys.argv[1:]


class Recorder:
    """The client side: records every session/update as a plain dict, wakes waiters."""

    def __init__(self) -> None:
        self.updates: list[dict[str, Any]] = []
        self.changed = asyncio.Event()

    def on_connect(self, conn: Any) -> None:
        pass

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        data = update.model_dump(by_alias=True, exclude_none=True, mode="json")
        data["sessionId"] = session_id
        self.updates.append(data)
        self.changed.set()

    async def request_permission(self, *args: Any, **kwargs: Any) -> Any:
        raise acp.RequestError.method_not_found("session/request_permission")

    async def wait_for(self, predicate: Any) -> dict[str, Any]:
        while True:
            for update in self.updates:
                if predicate(update):
                    return update
            self.changed.clear()
            await self.changed.wait()

    def take(self) -> list[dict[str, Any]]:
        out, self.updates = self.updates, []
        return out


def texts(update: dict[str, Any]) -> str:
    content = update.get("content")
    if isinstance(content, dict):
        return str(content.get("text", ""))
    out = []
    for item in content or ():
        inner = item.get("content", {}) if isinstance(item, dict) else {}
        out.append(str(inner.get("text", "")))
    return "\n".join(out)


def summary(updates: list[dict[str, Any]]) -> dict[str, Any]:
    """Agent text, the coordinator's tool calls and the children's calls, by id."""
    message = "".join(texts(u) for u in updates if u["sessionUpdate"] == "agent_message_chunk")
    calls: dict[str, dict[str, Any]] = {}
    for u in updates:
        if u["sessionUpdate"] not in ("tool_call", "tool_call_update"):
            continue
        call = calls.setdefault(
            u["toolCallId"], {"updates": 0, "lines": [], "first": u["sessionUpdate"]}
        )
        call["updates"] += 1
        for key in ("title", "status", "rawInput"):
            if key in u:
                call[key] = u[key]
        if "_meta" in u:
            call.setdefault("meta", {}).update(u["_meta"])
        if texts(u):
            call["lines"].append(texts(u))
    return {"message": message, "calls": calls}


async def connect(recorder: Recorder) -> Any:
    return acp.spawn_agent_process(
        recorder,
        sys.executable,
        "-m",
        "subagent.cli",
        "--home",
        HOME,
        "acp",
        *SERVER_ARGS,
        env=dict(os.environ),
    )


async def start(conn: Any) -> str:
    await conn.initialize(
        protocol_version=acp.PROTOCOL_VERSION, client_capabilities=ClientCapabilities()
    )
    session = await conn.new_session(cwd=os.getcwd())
    return str(session.session_id)


async def prompt(conn: Any, session_id: str, text: str) -> str:
    reply = await conn.prompt(session_id=session_id, prompt=[text_block(text)])
    return str(reply.stop_reason)


async def basic(conn: Any, recorder: Recorder) -> dict[str, Any]:
    init = await conn.initialize(
        protocol_version=acp.PROTOCOL_VERSION, client_capabilities=ClientCapabilities()
    )
    out: dict[str, Any] = {
        "protocol": init.protocol_version,
        "load_session": init.agent_capabilities.load_session,
    }
    sid = str((await conn.new_session(cwd=os.getcwd())).session_id)
    out["session"] = sid
    out["delegate"] = {
        "stop": await prompt(conn, sid, "/delegate hello child"),
        **summary(recorder.take()),
    }
    out["background"] = {
        "stop": await prompt(
            conn,
            sid,
            '/background background work\n/call task_output {"task_id": "{task}", "wait": true}',
        ),
        **summary(recorder.take()),
    }
    out["crash"] = {
        "stop": await prompt(conn, sid, "/delegate /fail boom"),
        **summary(recorder.take()),
    }
    out["bad_args"] = {
        "stop": await prompt(conn, sid, '/call subagent {"prompt": 1}'),
        **summary(recorder.take()),
    }
    try:
        await conn.new_session(cwd=os.getcwd(), **{"subagent-runtime/depth": -1})
        out["bad_depth"] = "answered"
    except acp.RequestError as exc:
        out["bad_depth"] = {"code": exc.code, "message": str(exc)}
    deep = await conn.new_session(cwd=os.getcwd(), **{"subagent-runtime/depth": 3})
    out["at_cap"] = {
        "stop": await prompt(conn, str(deep.session_id), "/delegate too deep"),
        **summary(recorder.take()),
    }
    try:
        await prompt(conn, sid, "/fail the coordinator's model broke")
        out["coordinator_error"] = "answered"
    except acp.RequestError as exc:
        out["coordinator_error"] = {"code": exc.code, "message": str(exc)}
    recorder.take()
    try:
        await prompt(conn, "no-such-session", "hi")
        out["unknown_session"] = "answered"
    except acp.RequestError as exc:
        out["unknown_session"] = {"code": exc.code, "message": str(exc)}
    return out


async def cancel(conn: Any, recorder: Recorder) -> dict[str, Any]:
    sid = await start(conn)
    turn = asyncio.create_task(prompt(conn, sid, "/delegate /hang"))
    step = await recorder.wait_for(
        lambda u: u.get("toolCallId", "").startswith("child:") and texts(u).endswith(": step 1")
    )
    await conn.cancel(session_id=sid)
    stop = await turn
    child = step["toolCallId"]
    await recorder.wait_for(
        lambda u: u.get("toolCallId") == child and u.get("status") in ("failed", "completed")
    )
    return {"stop": stop, "child": child, **summary(recorder.take())}


async def load_first(conn: Any, recorder: Recorder) -> dict[str, Any]:
    sid = await start(conn)
    stop = await prompt(conn, sid, "/background remember the number 7")
    message = summary(recorder.updates)["message"]
    child = re.search(r"continuable subagent (\S+) ", message)
    assert child, message
    # The child reports back when it settles: the coordinator takes a turn on the notice (its
    # updates come outside any prompt). Wait for that turn's answer before hanging up.
    await recorder.wait_for(
        lambda u: (
            u["sessionUpdate"] == "agent_message_chunk"
            and f"({child.group(1)}) completed" in texts(u)
        )
    )
    return {"session": sid, "child": child.group(1), "stop": stop}


async def load_again(conn: Any, recorder: Recorder) -> dict[str, Any]:
    sid, child = os.environ["ACP_LOAD_SESSION"], os.environ["ACP_LOAD_CHILD"]
    await conn.initialize(
        protocol_version=acp.PROTOCOL_VERSION, client_capabilities=ClientCapabilities()
    )
    await conn.load_session(cwd=os.getcwd(), session_id=sid)
    replay = recorder.take()
    stop = await prompt(
        conn,
        sid,
        f'/call send_message {{"subagent_id": "{child}", "message": "what was the number?"}}\n'
        '/call task_output {"task_id": "{task}", "wait": true}',
    )
    return {
        "replayed_user": [texts(u) for u in replay if u["sessionUpdate"] == "user_message_chunk"],
        "replayed_calls": [u.get("title") for u in replay if u["sessionUpdate"] == "tool_call"],
        "stop": stop,
        **summary(recorder.take()),
    }


SCENARIOS = {
    "basic": basic,
    "cancel": cancel,
    "load_first": load_first,
    "load_again": load_again,
}


async def main() -> None:
    recorder = Recorder()
    async with await connect(recorder) as (conn, _process):
        out = await asyncio.wait_for(SCENARIOS[SCENARIO](conn, recorder), 60)
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    asyncio.run(main())
