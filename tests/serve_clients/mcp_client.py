"""Drives `subagent mcp` with the official MCP Python SDK client (asyncio), in its own process.

`python mcp_client.py SCENARIO HOME [SERVER ARGS...]`: starts `python -m subagent.cli --home
HOME mcp SERVER ARGS...` through `mcp.client.stdio.stdio_client`, runs one scenario, and prints
one JSON object of observations on stdout for the test to assert on. Every wait is on an event
the server sends (a response, a progress notification), never a sleep.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

SCENARIO, HOME, *SERVER_ARGS = sys.argv[1:]


def text_of(result: Any) -> str:
    return "\n".join(getattr(block, "text", "") for block in result.content)


def outcome(result: Any) -> dict[str, Any]:
    meta = result.meta or {}
    return {
        "text": text_of(result),
        "is_error": bool(result.is_error),
        "code": meta.get("subagent-runtime/code"),
    }


async def basic(session: ClientSession) -> dict[str, Any]:
    out: dict[str, Any] = {}
    tools = await session.list_tools()
    out["tools"] = {t.name: t.input_schema for t in tools.tools}
    progress: list[str] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(f"{value}|{message}")

    result = await session.call_tool(
        "subagent",
        {"description": "say hello", "prompt": "hello from the client"},
        progress_callback=on_progress,
    )
    out["foreground"] = outcome(result)
    out["progress"] = progress
    out["bad_args"] = outcome(await session.call_tool("subagent", {"prompt": 42}))
    out["crash"] = outcome(
        await session.call_tool("subagent", {"description": "crash", "prompt": "/fail boom"})
    )
    started = outcome(
        await session.call_tool(
            "subagent",
            {
                "description": "in background",
                "prompt": "background work",
                "run_in_background": True,
            },
        )
    )
    out["background"] = started
    task = re.search(r"\(task (\S+)\)", started["text"])
    child = re.search(r"continuable subagent (\S+) ", started["text"])
    assert task and child, started
    out["task_output"] = outcome(
        await session.call_tool("task_output", {"task_id": task.group(1), "wait": True})
    )
    out["unknown_task"] = outcome(await session.call_tool("task_output", {"task_id": "nope"}))
    out["listing"] = outcome(await session.call_tool("list_agents", {}))
    again = outcome(
        await session.call_tool(
            "send_message", {"subagent_id": child.group(1), "message": "follow up"}
        )
    )
    out["send_message"] = again
    resumed = re.search(r"as task (\S+) ", again["text"])
    assert resumed, again
    out["resumed_output"] = outcome(
        await session.call_tool("task_output", {"task_id": resumed.group(1), "wait": True})
    )
    out["child"] = child.group(1)
    try:
        await session.call_tool("no_such_tool", {})
        out["unknown_tool"] = "answered"
    except Exception as exc:  # the SDK raises on a JSON-RPC error
        out["unknown_tool"] = f"{type(exc).__name__}: {exc}"
    await session.send_ping()
    out["ping"] = True
    return out


async def cancel(session: ClientSession) -> dict[str, Any]:
    out: dict[str, Any] = {}
    running = anyio.Event()
    child: list[str] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        found = re.match(r"(\S+).*: step 1$", message or "")
        if found and not child:
            child.append(found.group(1))
            running.set()

    async with anyio.create_task_group() as group:

        async def call() -> None:
            await session.call_tool(
                "subagent",
                {"description": "hang until cancelled", "prompt": "/hang"},
                progress_callback=on_progress,
            )
            out["answered"] = True  # must not happen: the call was cancelled

        group.start_soon(call)
        await running.wait()
        group.cancel_scope.cancel()
    out["child"] = child[0]
    # The server sends no answer to a cancelled call; the child's state is what shows it.
    with anyio.fail_after(20):
        while True:
            listing = outcome(await session.call_tool("list_agents", {}))
            line = next(x for x in listing["text"].splitlines() if x.startswith(child[0]))
            if "status=running" not in line:
                break
    out["after"] = line
    return out


async def depth(session: ClientSession) -> dict[str, Any]:
    tools = await session.list_tools()
    forged = await session.call_tool("subagent", {"description": "x", "prompt": "y"})
    return {"tools": [t.name for t in tools.tools], "forged": outcome(forged)}


async def nested(session: ClientSession) -> dict[str, Any]:
    result = await session.call_tool(
        "subagent", {"description": "nest", "prompt": "/delegate /delegate /delegate deep"}
    )
    return {"nested": outcome(result)}


async def acp_child(session: ClientSession) -> dict[str, Any]:
    progress: list[str] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(message or "")

    tools = await session.list_tools()
    result = await session.call_tool(
        "subagent_peer",
        {"description": "ask the peer", "prompt": "hello peer"},
        progress_callback=on_progress,
    )
    return {
        "tools": [t.name for t in tools.tools],
        "result": outcome(result),
        "progress": progress,
    }


async def overlap(session: ClientSession) -> dict[str, Any]:
    """Two calls at once on one connection, each with its own progress token."""
    first: list[str] = []
    second: list[str] = []
    grandchild_done = anyio.Event()

    async def on_first(value: float, total: float | None, message: str | None) -> None:
        first.append(message or "")
        if (message or "").endswith("(grandchild work): ended completed"):
            grandchild_done.set()

    async def on_second(value: float, total: float | None, message: str | None) -> None:
        second.append(message or "")

    out: dict[str, Any] = {}
    async with anyio.create_task_group() as group:

        async def hanging() -> None:
            await session.call_tool(
                "subagent",
                {"description": "first", "prompt": "/delegate grandchild work\n/hang"},
                progress_callback=on_first,
            )

        group.start_soon(hanging)
        await grandchild_done.wait()  # the first call's subtree is busy (its child hangs)
        done = await session.call_tool(
            "subagent",
            {"description": "second", "prompt": "/delegate inner work"},
            progress_callback=on_second,
        )
        out["second_result"] = outcome(done)
        group.cancel_scope.cancel()
    out["first"] = first
    out["second"] = second
    return out


SCENARIOS = {
    "overlap": overlap,
    "basic": basic,
    "cancel": cancel,
    "depth": depth,
    "nested": nested,
    "acp_child": acp_child,
}


async def main() -> None:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "subagent.cli", "--home", HOME, "mcp", *SERVER_ARGS],
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        init = await session.initialize()
        out = {"protocol": init.protocol_version, "server": init.server_info.name}
        with anyio.fail_after(60):
            out.update(await SCENARIOS[SCENARIO](session))
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    anyio.run(main)
