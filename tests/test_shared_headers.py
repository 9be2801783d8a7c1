"""Shared request headers: a child's log names its system prompt and tool specs by address
(`request/header {ref}`), the store keeps each distinct content once; old logs that carry the
header inline still replay and resume; a store without the shared header fails loud, typed."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from seam_kit import Kit, assert_log_valid, kit, last_user_text, wait_until

from agent.errors import CorruptSessionError, InvariantError, SharedHeaderMissingError
from agent.events import SessionHeader
from agent.frames import encode_event, encode_header
from agent.log import validate_log
from agent.models import scripted as S
from agent.store import HEADERS_DIR, MemoryStore, SessionStore
from agent.tools import Tool, ToolContext
from subagent.errors import SubagentError
from subagent.types import MessageSource, text_block

Events = list[Mapping[str, Any]]


def noop(arguments: Mapping[str, Any], ctx: ToolContext) -> str:
    return "ok"


def headers_of(events: Events) -> list[dict[str, Any]]:
    return [dict(e["data"]) for e in events if e["type"] == "request/header"]


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Kit]:
    with kit(store=SessionStore(tmp_path / "sessions")) as the_kit:
        the_kit.runtime.ctx.prompt.set_section("base", "You help.")
        yield the_kit


def test_siblings_name_one_stored_header_which_is_what_their_model_saw() -> None:
    with kit() as k:
        k.runtime.ctx.prompt.set_section("base", "You help.")
        k.runtime.ctx.tools.register(
            Tool(name="noop", description="does nothing", parameters={"type": "object"}, fn=noop)
        )
        parent = k.parent()
        runs = [k.start(parent, f"task {i}") for i in range(5)]
        for run in runs:
            assert run.result.get().stop_reason == "completed"
        refs = set()
        for run in runs:
            (header,) = headers_of(k.store.load(run.id).events)
            assert set(header) == {"ref"}  # no per-child copy of the prompt or the tools
            refs.add(header["ref"])
            run.dispose()
        (ref,) = refs
        assert list(k.store.headers) == [ref]  # stored once for the five children
        content = k.store.request_header(ref)
        seen = k.model.requests_for(runs[0].id)[0]
        assert content["system"] == seen.system == "You help."
        assert [t.name for t in seen.tools] == ["noop"]
        assert [t["name"] for t in content["tools"]] == [t.name for t in seen.tools]
        assert content["tools"] == [
            {"name": t.name, "description": t.description, "parameters": t.parameters}
            for t in seen.tools
        ]


def test_a_different_prompt_is_a_different_header() -> None:
    with kit() as k:
        parent = k.parent()
        plain = k.start(parent)
        persona = k.start(parent, persona="You are terse.")
        refs = []
        for run in (plain, persona):
            run.result.get()
            (header,) = headers_of(k.store.load(run.id).events)
            refs.append(header["ref"])
            run.dispose()
        assert refs[0] != refs[1]
        assert "You are terse." in k.store.request_header(refs[1])["system"]
        assert "You are terse." not in k.store.request_header(refs[0])["system"]


def test_a_header_stored_on_disk_is_read_by_another_store_object(disk: Kit) -> None:
    parent = disk.parent()
    run = disk.start(parent)
    run.result.get()
    run.dispose()
    (header,) = headers_of(disk.store.load(run.id).events)
    root = disk.store.root
    assert (root / HEADERS_DIR / f"{header['ref']}.header").is_file()
    other = SessionStore(root)  # what a new process sees
    assert other.request_header(header["ref"]) == disk.store.request_header(header["ref"])
    assert other.resolve_request_header(header)["system"] == "You help."


def test_a_store_without_the_shared_header_fails_typed(disk: Kit) -> None:
    parent = disk.parent()
    started = disk.service.start_continuable("spawn", disk.request(parent, "one"), label="c")
    assert disk.runtime.tasks.wait(started.task_id).status == "completed"
    wait_until(lambda: started.child_id not in disk.runtime.ctx.agents)
    (header,) = headers_of(disk.store.inspect(started.child_id).events)
    (disk.store.root / HEADERS_DIR / f"{header['ref']}.header").unlink()
    with pytest.raises(SharedHeaderMissingError) as info:
        disk.store.load(started.child_id)
    assert info.value.ref == header["ref"]
    with pytest.raises(SharedHeaderMissingError):
        disk.store.open(started.child_id)
    with pytest.raises(SharedHeaderMissingError):
        disk.store.request_header(header["ref"])
    # Cold resume refuses the child rather than continuing a log that lost its model input.
    with pytest.raises(SubagentError) as refused:
        disk.service.send_message(
            parent, started.child_id, "again", MessageSource.coordinator(parent.id)
        )
    assert refused.value.code == "NOT_RESUMABLE"
    assert isinstance(refused.value.__cause__, SharedHeaderMissingError)
    assert not disk.store.is_held(started.child_id)  # nothing left open by the failed resume


def test_a_damaged_shared_header_is_corruption_not_content(disk: Kit) -> None:
    parent = disk.parent()
    run = disk.start(parent)
    run.result.get()
    run.dispose()
    (header,) = headers_of(disk.store.load(run.id).events)
    path = disk.store.root / HEADERS_DIR / f"{header['ref']}.header"
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptSessionError):
        disk.store.request_header(header["ref"])


def test_a_seed_naming_a_header_the_store_lacks_is_refused() -> None:
    source = MemoryStore()
    log = source.create(SessionHeader(id="src", created_at=1.0, cwd="/"))
    log.append_request_header("system text", [])
    log.close()
    seed = source.load("src").events
    target = MemoryStore()
    with pytest.raises(SharedHeaderMissingError):
        target.create(SessionHeader(id="child", created_at=1.0, cwd="/"), seed)
    assert not target.exists("child")
    source.create(SessionHeader(id="child", created_at=1.0, cwd="/"), seed).close()


def test_the_replay_checks_both_shapes() -> None:
    def events(data: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"type": "request/header", "seq": 0, "time": 1.0, "data": data}]

    validate_log(events({"ref": "a" * 64}))
    validate_log(events({"system": "s", "tools": []}))
    for bad, why in (
        ({"ref": "not-a-digest"}, "ref must be a sha256"),
        ({"ref": "A" * 64}, "ref must be a sha256"),
        ({"ref": "a" * 64, "system": "s"}, "not both"),
        ({"system": "s"}, "tools must be a list"),
        ({"tools": []}, "system must be a str"),
    ):
        with pytest.raises(InvariantError, match=why):
            validate_log(events(bad))
    log = MemoryStore().create(SessionHeader(id="s", created_at=1.0, cwd="/"))
    with pytest.raises(InvariantError, match="ref must be"):
        log.append("request/header", {"ref": "../../etc/passwd"})
    assert len(log.events) == 0


def rewrite_in_the_old_shape(store: SessionStore, session_id: str) -> None:
    """The session's file as an older writer made it: every request header inline."""
    loaded = store.load(session_id)
    events = []
    for event in loaded.events:
        if event["type"] == "request/header":
            event = {**event, "data": store.resolve_request_header(event["data"])}
        events.append(event)
    path = store.root / f"{session_id}.session"
    path.write_bytes(encode_header(loaded.header) + b"".join(encode_event(e) for e in events))


def test_an_old_log_with_inline_headers_replays_and_resumes(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    with kit(store=SessionStore(root)) as k:
        parent = k.parent()
        started = k.service.start_continuable("spawn", k.request(parent, "one"), label="old")
        assert k.runtime.tasks.wait(started.task_id).status == "completed"
        wait_until(lambda: started.child_id not in k.runtime.ctx.agents)
        parent_id, child_id = parent.id, started.child_id
    store = SessionStore(root)
    for session_id in store.ids():  # the parent's log too: it ran a turn on the settlement
        rewrite_in_the_old_shape(store, session_id)
    for path in (root / HEADERS_DIR).iterdir():
        path.unlink()  # an old store has no shared headers at all
    (old,) = headers_of(store.load(child_id).events)
    assert set(old) == {"system", "tools"}

    with kit(store=SessionStore(root)) as k:
        k.respond = lambda request: S.text(f"again: {last_user_text(request)}")
        parent = k.runtime.resume_agent(parent_id)
        sent = k.service.send_message(
            parent, child_id, "still there?", MessageSource.coordinator(parent_id)
        )
        assert sent.kind == "started"
        task = k.runtime.tasks.wait(sent.task_id or "")
        assert task.status == "completed"
        assert task.output == [text_block("again: still there?")]
        wait_until(lambda: child_id not in k.runtime.ctx.agents)
        events = assert_log_valid(k.store, child_id)
        first, second = headers_of(events)
        assert set(first) == {"system", "tools"}  # the old event is kept as written
        assert set(second) == {"ref"}  # what this version appends
        assert k.store.resolve_request_header(second) == k.store.resolve_request_header(first)
