"""Tampered and damaged session files beside good ones: cold resume refuses each with a stable
`SubagentError` code saying why, listings show it damaged and go on, and the good child beside
it is untouched (still listed, still resumable).

Each hostile file is a child of the same parent as a good one, made of the good one's own
events with one thing wrong: a frame that claims 4 GiB, msgpack nested 100,000 deep, events
with a valid CRC but the wrong shape, a header naming another session, a symlink, a FIFO.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
from seam_kit import Kit, kit

from actors.agents import create_agent
from agent.options import AgentOptions
from agent.store import SessionStore
from subagent.descriptor import SubagentDescriptor
from subagent.errors import SubagentError
from subagent.listings import Listings
from subagent.types import MessageSource

Events = list[dict[str, Any]]
BAD = "sbad"


@pytest.fixture
def k(tmp_path: Path) -> Iterator[Kit]:
    with kit(store=SessionStore(tmp_path)) as the_kit:
        yield the_kit


def frame(payload: bytes) -> bytes:
    return struct.pack(">II", len(payload), zlib.crc32(payload)) + payload


def packed(obj: object) -> bytes:
    return frame(msgpack.packb(obj, use_bin_type=True))


def good_child(k: Kit, parent: Any) -> str:
    agent = create_agent(
        k.runtime.ctx,
        options=AgentOptions(model="scripted:default"),
        parent_session=parent.id,
        origin="subagent",
        delegation_depth=1,
    )
    descriptor = SubagentDescriptor(provider="spawn", label="good", model="scripted:default")
    agent.before_first_request(
        lambda: agent.core.add_event("subagent/descriptor", {"descriptor": descriptor.to_json()})
    )
    agent.send("hello").get()
    agent.when_idle().get()
    agent.close()
    return str(agent.id)


def header_frame(k: Kit, session_id: str, parent_id: str) -> bytes:
    header = k.store.header(session_id).to_json()
    return packed({"magic": "subagent-session/1", "header": header})


def body(events: Events) -> bytes:
    return b"".join(packed(e) for e in events)


def renumbered(events: Events) -> Events:
    return [{**e, "seq": i} for i, e in enumerate(events)]


# Each case: (the good child's events, the header frame for BAD) -> BAD's file bytes.
Maker = Callable[[Events, Callable[[str], bytes]], bytes]


def _length_of_4_gib(events: Events, head: Callable[[str], bytes]) -> bytes:
    return head(BAD) + body(events[:2]) + struct.pack(">II", 0xFFFFFFFF, 0) + body(events[2:])


def _nested_100_000_deep(events: Events, head: Callable[[str], bytes]) -> bytes:
    deep = b"\x84\xa4type\xa8turn/end\xa3seq\x02\xa4data" + b"\x91" * 100_000 + b"\xc0"
    return head(BAD) + body(events[:2]) + frame(deep) + body(events[2:])


def _shaped(change: Callable[[Events], Events]) -> Maker:
    def make(events: Events, head: Callable[[str], bytes]) -> bytes:
        return head(BAD) + body(change([dict(e) for e in events]))

    return make


def _seq_a_str(events: Events) -> Events:
    events[1]["seq"] = "1"
    return events


def _data_a_list(events: Events) -> Events:
    events[1]["data"] = [1, 2]
    return events


def _unknown_kind(events: Events) -> Events:
    return renumbered([*events[:2], {**events[1], "type": "evil/kind", "data": {}}, *events[2:]])


def _end_before_start(events: Events) -> Events:
    end = next(e for e in events if e["type"] == "turn/end")
    return renumbered([end, *events])


def _message_without_content(events: Events) -> Events:
    for event in events:
        if event["type"] == "user/message":
            event["data"] = {"message": {"role": 5}}
    return events


def _reply_content_not_a_list(events: Events) -> Events:
    for event in events:
        if event["type"] == "assistant/message":
            event["data"] = {**event["data"], "message": {**event["data"]["message"]}}
            event["data"]["message"]["content"] = "text, not blocks"
    return events


def _another_sessions_header(events: Events, head: Callable[[str], bytes]) -> bytes:
    return head("") + body(events)  # the good child's own header, in BAD's file


def _content_blocks_not_dicts(events: Events) -> Events:
    for event in events:
        if event["type"] == "user/message":
            message = {**event["data"]["message"], "content": [5, None]}
            event["data"] = {**event["data"], "message": message}
    return events


def _text_not_a_str(events: Events) -> Events:
    for event in events:
        if event["type"] == "assistant/message":
            message = {**event["data"]["message"], "content": [{"type": "text", "text": 5}]}
            event["data"] = {**event["data"], "message": message}
    return events


def _a_result_of_bare_ints(events: Events) -> Events:
    out: Events = []
    for event in events:
        if event["type"] == "assistant/message":
            message = {
                **event["data"]["message"],
                "tool_calls": [{"id": "c1", "name": "noop", "arguments": [1]}],
            }
            out.append({**event, "data": {**event["data"], "message": message}})
            result = {"call_id": "c1", "name": "noop", "content": [42], "is_error": False}
            out.append({**event, "type": "tool/result", "data": result})
        else:
            out.append(event)
    return renumbered(out)


CASES: dict[str, Maker] = {
    "length-4-GiB": _length_of_4_gib,
    "nested-100000": _nested_100_000_deep,
    "seq-a-str": _shaped(_seq_a_str),
    "data-a-list": _shaped(_data_a_list),
    "unknown-kind": _shaped(_unknown_kind),
    "end-before-start": _shaped(_end_before_start),
    "message-without-content": _shaped(_message_without_content),
    "reply-content-not-a-list": _shaped(_reply_content_not_a_list),
    "header-of-another-session": _another_sessions_header,
    "content-blocks-not-dicts": _shaped(_content_blocks_not_dicts),
    "text-not-a-str": _shaped(_text_not_a_str),
    "a-result-of-bare-ints": _shaped(_a_result_of_bare_ints),
}


def coord(parent: Any) -> MessageSource:
    return MessageSource.coordinator(parent.id)


def plant(k: Kit, parent: Any, make: Maker) -> tuple[str, Path, bytes]:
    good = good_child(k, parent)
    assert isinstance(k.store, SessionStore)
    events: Events = [dict(e) for e in k.store.inspect(good).events]

    def head(session_id: str) -> bytes:
        header = k.store.header(good).to_json()
        if session_id:
            header["id"] = session_id
        return packed({"magic": "subagent-session/1", "header": header})

    path = k.store.root / f"{BAD}.session"
    data = make(events, head)
    path.write_bytes(data)
    return good, path, data


def assert_good_untouched(k: Kit, parent: Any, good: str) -> None:
    result = k.service.send_message(parent, good, "again", coord(parent))
    assert result.kind == "started"
    task = k.runtime.tasks.wait(result.task_id or "")
    assert task.status == "completed"


@pytest.mark.parametrize("case", list(CASES))
def test_cold_resume_refuses_a_damaged_log_and_the_listings_go_on(k: Kit, case: str) -> None:
    parent = k.parent()
    good, path, data = plant(k, parent, CASES[case])
    with pytest.raises(SubagentError) as info:
        k.service.send_message(parent, BAD, "continue", coord(parent))
    assert info.value.code == "NOT_RESUMABLE", info.value
    assert BAD in str(info.value)
    assert path.read_bytes() == data  # never repaired, never truncated
    assert BAD not in k.runtime.ctx.agents
    rows = {r["id"]: r for r in k.service.list_children(parent.id)}
    assert rows[good]["activity"] == "stored"
    if case != "header-of-another-session":
        assert rows[BAD]["activity"] == "corrupt", rows[BAD]
        assert rows[BAD]["error"]
    skimmed = {r["id"]: r for r in Listings(k.store, skim=True).list_children(parent.id)}
    assert skimmed[good]["activity"] == "stored"
    assert_good_untouched(k, parent, good)


@pytest.mark.parametrize("kind", ["symlink", "fifo"])
def test_a_session_file_that_is_not_a_regular_file(k: Kit, kind: str) -> None:
    parent = k.parent()
    good = good_child(k, parent)
    assert isinstance(k.store, SessionStore)
    path = k.store.root / f"{BAD}.session"
    if kind == "symlink":
        path.symlink_to(k.store.root / f"{good}.session")
    else:
        os.mkfifo(path)
    with pytest.raises(SubagentError) as info:
        k.service.send_message(parent, BAD, "continue", coord(parent))
    assert info.value.code == "NOT_RESUMABLE", info.value
    assert "not a regular file" in str(info.value)
    _headers, unreadable = k.store.census()
    assert [u.id for u in unreadable] == [BAD]
    assert "not a regular file" in unreadable[0].reason
    assert [r["id"] for r in k.service.list_children(parent.id)] == [good]
    assert_good_untouched(k, parent, good)


@pytest.mark.parametrize(
    "content",
    [[5], [None], [{"text": "no type"}], [{"type": 3}], [{"type": "text", "text": 5}]],
)
def test_an_append_of_content_blocks_the_runtime_never_makes_is_refused(content: Any) -> None:
    """The same rule at the call site: nothing changes, the next append goes on."""
    from agent.errors import InvariantError
    from agent.events import SessionHeader
    from agent.store import MemoryStore

    log = MemoryStore().create(SessionHeader(id="s1", created_at=1.0, cwd="/w"))
    log.append("turn/start", {"turn": 1})
    message = {"id": "u", "role": "user", "content": content, "source": {"kind": "user"}}
    with pytest.raises(InvariantError, match="content block"):
        log.append("user/message", {"message": message})
    assert log.next_seq == 1
    message["content"] = [{"type": "text", "text": "ok"}, {"type": "image", "data": "x"}]
    assert log.append("user/message", {"message": message})["seq"] == 1
