"""The embedded offline model of `subagent mcp` and `subagent acp`: no network, no keys.

It answers every prompt by echoing it, so a client sees the whole protocol work out of the box,
and it obeys a few directives (lines of the turn's prompt that start with `/`), one per model
step, so a person (or a test) can drive delegation without a real model:

- `/delegate TEXT`: call the `subagent` tool with prompt TEXT (directives nest:
  `/delegate /delegate hi` makes a grandchild).
- `/background TEXT`: the same with `run_in_background: true`.
- `/call TOOL {json}`: call any tool with those arguments; `{task}` and `{child}` stand for the
  last task id and subagent id a tool result of this turn named.
- `/hang`: wait until the turn is cancelled.
- `/fail [MESSAGE]`: the model call fails, so the turn ends `error` (a crashing child).

When the directives are used up, the answer reports what the last tool call returned. Model
text is data here as everywhere: nothing is interpreted beyond these line prefixes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from agent.model import ModelRequest
from agent.models import scripted as S

__all__ = ["CLIENT_PROXY_MODEL", "OFFLINE_MODEL", "respond"]

# Routes on the runtime's `scripted` adapter.
OFFLINE_MODEL = "scripted:offline"
# The MCP connection's root agent stands in for the client: it only acknowledges the settlement
# notices its continuable children send it.
CLIENT_PROXY_MODEL = "scripted:mcp-client"

PREFIX = "(offline scripted model)"
_TASK = re.compile(r"\btask (?:id )?([A-Za-z0-9][\w.-]*[A-Za-z0-9])")
_CHILD = re.compile(r"\bsubagent ([A-Za-z0-9][\w.-]*[A-Za-z0-9])")


def _text(content: str | Iterable[object] | None) -> str:
    if isinstance(content, str):
        return content
    return "".join(str(b.get("text", "")) for b in content or () if isinstance(b, Mapping))


def _this_turn(messages: Sequence[Mapping[str, Any]]) -> tuple[str, list[Mapping[str, Any]]]:
    """The last user message's text and what followed it."""
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].get("role") == "user":
            return _text(messages[i].get("content")), list(messages[i + 1 :])
    return "", list(messages)


def _directives(prompt: str) -> list[str]:
    return [line.strip() for line in prompt.splitlines() if line.strip().startswith("/")]


def _label(text: str) -> str:
    words = re.sub(r"^/\w+\s*", "", text).split()
    label = " ".join(words[:5]) or "offline task"
    return label[:200]


def _substitute(value: str, after: list[Mapping[str, Any]]) -> str:
    results = [_text(m.get("content")) for m in after if m.get("role") == "tool"]
    for pattern, key in ((_TASK, "{task}"), (_CHILD, "{child}")):
        if key in value:
            found = [m.group(1) for r in results for m in pattern.finditer(r)]
            if found:
                value = value.replace(key, found[-1])
    return value


def _report(after: list[Mapping[str, Any]]) -> str:
    for message in reversed(after):
        if message.get("role") == "tool":
            text = _text(message.get("content"))
            verdict = "failed" if message.get("is_error") else "returned"
            return f"{PREFIX} {message.get('name')} {verdict}: {text}"
    return f"{PREFIX} done"


def _step(directive: str, request: ModelRequest, after: list[Mapping[str, Any]]) -> S.Step:
    word, _, rest = directive.partition(" ")
    rest = rest.strip()
    tools = {t.name for t in request.tools}
    if word in ("/delegate", "/background"):
        if "subagent" not in tools:
            return S.text(f"{PREFIX} cannot delegate: no subagent tool at this depth")
        arguments: dict[str, Any] = {"description": _label(rest), "prompt": rest or "hello"}
        if word == "/background":
            arguments["run_in_background"] = True
        return S.tool_call("subagent", arguments)
    if word == "/call":
        name, _, raw = rest.partition(" ")
        try:
            parsed = json.loads(_substitute(raw, after)) if raw.strip() else {}
        except ValueError as exc:
            return S.text(f"{PREFIX} bad /call arguments: {exc}")
        return S.tool_call(name, parsed if isinstance(parsed, dict) else {"value": parsed})
    if word == "/hang":
        return S.hang()
    if word == "/fail":
        return S.error(rest or "the offline model was told to fail")
    return S.text(f"{PREFIX} unknown directive {word!r}")


def respond(request: ModelRequest) -> S.Step:
    """The responder behind `OFFLINE_MODEL` and `CLIENT_PROXY_MODEL`."""
    prompt, after = _this_turn(request.messages)
    if request.model == CLIENT_PROXY_MODEL.partition(":")[2]:
        return S.text("noted")
    directives = _directives(prompt)
    done = sum(1 for m in after if m.get("role") == "assistant")
    if done < len(directives):
        return _step(directives[done], request, after)
    if directives:
        return S.text(_report(after))
    return S.text(f"{PREFIX} received: {prompt}")
