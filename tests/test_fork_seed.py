"""A fork seeds its child from the parent's completed-turn prefix as payload bytes (q7).

`SessionLog.fork_seed` hands the prefix over as its payloads with the replay state its last
turn/end left; `SessionStore.create` copies and frames those bytes. These tests hold it to what
the old path (the prefix decoded, copied, checked, replayed and encoded again) gave: the same
file bytes, the same events read back, the same replay state, on parents with tool calls,
steers, inbox traffic, a shared request header and a torn-then-repaired tail.
"""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import pytest
from decode_count import count_decodes
from seam_kit import assert_log_valid, kit

import agent.log
from agent.errors import SharedHeaderMissingError
from agent.events import SessionHeader
from agent.log import (
    ForkSeed,
    InvariantError,
    LogReplay,
    Payloads,
    SessionLog,
    completed_turn_prefix,
    validate_log,
)
from agent.models import scripted as S
from agent.store import MemoryStore, SessionStore
from providers.inprocess import ForkProvider

AnyStore = MemoryStore | SessionStore
TEXT = [{"type": "text", "text": "hello ✓"}]


@pytest.fixture(params=["memory", "dir"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> AnyStore:
    if request.param == "memory":
        return MemoryStore()
    return SessionStore(tmp_path / "sessions", durability="none")


@dataclass(frozen=True)
class _Tool:
    name: str
    description: str
    parameters: object


TOOLS = (_Tool("read", "Read a file.", {"type": "object", "properties": {}}),)
_ids = itertools.count(1)


def header(sid: str, **kw: Any) -> SessionHeader:
    return SessionHeader(id=sid, created_at=1.0, cwd="/work", **kw)


def raw(store: AnyStore, sid: str) -> bytes:
    if isinstance(store, MemoryStore):
        return bytes(store.files[sid].data)
    return (store.root / f"{sid}.session").read_bytes()


def body(store: AnyStore, sid: str) -> bytes:
    """The file after its header frame: the event frames."""
    data = raw(store, sid)
    return data[8 + int.from_bytes(data[:4], "big") :]


def accept(log: SessionLog, kind: str = "send") -> str:
    message_id = f"m{next(_ids)}"
    log.append(
        "inbox/accepted",
        {"message_id": message_id, "kind": kind, "content": TEXT, "source": {"kind": "user"}},
    )
    return message_id


def turn(log: SessionLog, number: int, *, steps: int = 2, steer: bool = True) -> None:
    """A format-3 turn: a prompt, `steps` replies with a tool call each (a steer after the
    first result), a request header, a final reply."""
    message_id = accept(log)
    log.append("turn/start", {"turn": number})
    log.append("inbox/claimed", {"message_id": message_id})
    log.append("user/message", {"message": {"role": "user", "content": TEXT}})
    log.append_request_header("You are a parent.", TOOLS)
    for step in range(1, steps + 1):
        call_id = f"c{number}.{step}"
        log.append(
            "assistant/message",
            {
                "message": {
                    "role": "assistant",
                    "content": TEXT,
                    "tool_calls": [{"id": call_id, "name": "read", "arguments": {"p": step}}],
                },
                "finish": "tool_calls",
                "usage": {"input": 10, "output": 3},
            },
        )
        log.append(
            "tool/result", {"call_id": call_id, "name": "read", "content": TEXT, "is_error": False}
        )
        if steer and step == 1:
            steer_id = accept(log, "steer")
            log.append("inbox/claimed", {"message_id": steer_id})
            log.append("user/message", {"message": {"role": "user", "content": TEXT}})
    log.append(
        "assistant/message",
        {"message": {"role": "assistant", "content": TEXT}, "finish": "stop"},
    )
    log.append("turn/end", {"turn": number, "reason": "completed"})
    log.checkpoint("turn")


def in_flight(log: SessionLog, number: int) -> None:
    """The parent's turn in flight when it forks: inbox traffic of its own (a send queued, a
    prefix's pending send claimed), a reply whose call is still running."""
    accept(log)
    log.append("turn/start", {"turn": number})
    log.append("user/message", {"message": {"role": "user", "content": TEXT}})
    log.append(
        "assistant/message",
        {
            "message": {
                "role": "assistant",
                "content": TEXT,
                "tool_calls": [{"id": "fork", "name": "subagent_fork", "arguments": {}}],
            },
            "finish": "tool_calls",
        },
    )


def torn_parent(store: AnyStore) -> SessionLog:
    """A parent whose file was torn inside an open turn and repaired on `open`, then went on:
    a pending send in its prefix, a send of the turn in flight claimed a prefix's id."""
    log = store.create(header("parent"))
    turn(log, 1)
    turn(log, 2, steps=1, steer=False)
    log.append("turn/start", {"turn": 3})
    log.append("user/message", {"message": {"role": "user", "content": TEXT}})
    log.append(
        "assistant/message",
        {
            "message": {
                "role": "assistant",
                "content": TEXT,
                "tool_calls": [{"id": "t", "name": "read", "arguments": {}}],
            },
            "finish": "tool_calls",
        },
    )
    log.close()
    if isinstance(store, MemoryStore):
        del store.files["parent"].data[-5:]
    else:
        path = store.root / "parent.session"
        path.write_bytes(path.read_bytes()[:-5])
    log = store.open("parent")  # the torn reply dropped, turn 3 closed as interrupted
    assert log.events[-1]["data"]["reason"] == "interrupted"
    pending = accept(log)  # queued while idle: pending in the prefix
    turn(log, 4)
    in_flight(log, 5)
    log.append("inbox/claimed", {"message_id": pending})
    return log


def untimed(events: list[Any]) -> list[Any]:
    return [{**e, "time": 0} for e in events]


def replay_state(replay: LogReplay) -> dict[str, object]:
    return {name: getattr(replay, name) for name in LogReplay.__slots__}


def old_fork(store: AnyStore, parent: SessionLog, sid: str) -> SessionLog:
    """The path before q7: the prefix decoded into dicts, then copied, checked, replayed and
    encoded again by `create`."""
    seed = completed_turn_prefix(list(parent.events))
    return store.create(header(sid, seed_length=len(seed)), seed)


def new_fork(store: AnyStore, parent: SessionLog, sid: str) -> SessionLog:
    seed = parent.fork_seed()
    assert isinstance(seed, ForkSeed)
    return store.create(header(sid, seed_length=len(seed)), seed)


def go_on(log: SessionLog) -> None:
    """What a forked child does next: its seed marker and a turn of its own (the same
    message ids for every child it is called on)."""
    global _ids
    _ids = itertools.count(100_000 + 100 * len(log.events))
    log.append("session/end-seed", {"length": log.header.seed_length})
    turn(log, log.events[-2]["data"]["turn"] + 1 if len(log.events) > 1 else 1)


def test_a_fork_reads_back_as_the_old_path_with_the_same_bytes_and_replay(
    store: AnyStore,
) -> None:
    parent = torn_parent(store)
    old = old_fork(store, parent, "old")
    new = new_fork(store, parent, "new")
    assert new.header.seed_length == old.header.seed_length == len(old.events) > 40
    assert body(store, "new") == body(store, "old")
    assert new.events == old.events == completed_turn_prefix(list(parent.events))
    assert replay_state(new._replay) == replay_state(old._replay)
    assert replay_state(new._replay) == replay_state(validate_log(list(old.events), new.header))
    assert (new.turn_open, new.next_seq, new.open_calls) == (False, len(old.events), {})
    for log in (old, new):
        go_on(log)
        log.close()
    # The child's own events carry their own times; all else is the same.
    assert untimed(store.load("new").events) == untimed(store.load("old").events)
    # The read-back logs replay to the same state as the live ones held.
    assert replay_state(store.open("new")._replay) == replay_state(store.open("old")._replay)


def test_the_childs_inbox_is_the_prefixs_not_the_turn_in_flights(store: AnyStore) -> None:
    parent = torn_parent(store)
    child = new_fork(store, parent, "child")
    prefix = completed_turn_prefix(list(parent.events))
    accepted = [e["data"]["message_id"] for e in prefix if e["type"] == "inbox/accepted"]
    claimed = {e["data"]["message_id"] for e in prefix if e["type"] == "inbox/claimed"}
    # Accepted while idle, claimed only in the turn in flight.
    (pending,) = [message_id for message_id in accepted if message_id not in claimed]
    # A prefix's id is refused again, one accepted in flight is new to the child, and the
    # pending one may be settled once.
    child.append("turn/start", {"turn": 5})
    with pytest.raises(InvariantError, match="accepted twice"):
        child.append(
            "inbox/accepted",
            {"message_id": accepted[0], "kind": "send", "content": [], "source": {}},
        )
    in_flight_id = [e for e in parent.events if e["type"] == "inbox/accepted"][-1]
    assert in_flight_id["data"]["message_id"] not in accepted
    child.append("inbox/claimed", {"message_id": pending})
    with pytest.raises(InvariantError, match="settled twice"):
        child.append("inbox/claimed", {"message_id": pending})
    with pytest.raises(InvariantError, match="never accepted"):
        child.append("inbox/claimed", {"message_id": in_flight_id["data"]["message_id"]})


def test_a_fork_of_a_long_history_decodes_none_of_its_prefix(
    store: AnyStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Loaded events and live ones alike: no payload of the prefix is unpacked, and the file
    is the old path's byte for byte."""
    parent = store.create(header("parent"))
    for number in range(1, 41):
        turn(parent, number)
    parent.close()
    parent = store.open("parent")  # half the history loaded from the file ...
    for number in range(41, 81):
        turn(parent, number)  # ... half appended live
    in_flight(parent, 81)
    assert len(parent.events) > 1_000
    decodes = count_decodes(monkeypatch)
    seed = parent.fork_seed()
    assert seed is not None
    child = store.create(header("new", seed_length=len(seed)), seed)
    # Only the turn in flight's one inbox event was read (to undo it from the inbox state).
    assert decodes[0] == 1
    monkeypatch.undo()
    old_fork(store, parent, "old")
    assert body(store, "new") == body(store, "old")
    assert child.events == completed_turn_prefix(list(parent.events))


def test_a_parent_built_from_dicts_forks_the_same(store: AnyStore) -> None:
    """A log given its events as dicts (a seed list, a test's list) keeps them as payloads
    too: its fork is the same as the old path's."""
    source = store.create(header("source"))
    turn(source, 1)
    turn(source, 2)
    events = list(source.events)
    source.close()
    from_list = store.create(header("parent", seed_length=len(events)), events)
    from_list.append("session/end-seed", {"length": len(events)})
    turn(from_list, 3)
    for parent in (from_list, SessionLog(header("direct"), events, _Sink())):
        old = old_fork(store, parent, f"old-{parent.id}")
        new = new_fork(store, parent, f"new-{parent.id}")
        assert body(store, new.id) == body(store, old.id)
        assert replay_state(new._replay) == replay_state(old._replay)


class _Sink:
    def write(self, data: bytes | bytearray) -> None:
        pass

    def sync(self) -> None:
        pass

    def close(self) -> None:
        pass


def test_a_fork_of_a_fork_that_went_on_keeps_its_parents_seed_marker(store: AnyStore) -> None:
    """A child's own seed marker is inside its fork's seed: admitted there (it names the
    child's seed), by the old path and the new; the old code refused the grandchild."""
    parent = store.create(header("parent"))
    turn(parent, 1)
    child = new_fork(store, parent, "child")
    go_on(child)
    in_flight(child, 3)
    old = old_fork(store, child, "old")
    new = new_fork(store, child, "new")
    assert [e["type"] for e in new.events].count("session/end-seed") == 1
    assert body(store, "new") == body(store, "old")
    assert replay_state(new._replay) == replay_state(old._replay)
    go_on(new)
    new.close()
    assert store.load("new").header.seed_length == len(old.events)


def test_a_marker_in_a_seed_must_name_its_own_seq_and_one_after_it_the_header() -> None:
    def two_turns(log: SessionLog) -> None:
        turn(log, 1)
        turn(log, 2)

    events = _logged(two_turns)
    first = [e["type"] for e in events].index("turn/end") + 1
    marker = {"type": "session/end-seed", "seq": len(events), "time": 1.0, "data": {}}
    wrong = [*events, {**marker, "data": {"length": 3}}]
    with pytest.raises(InvariantError, match="length 3 at seq"):
        validate_log(wrong, header("x", seed_length=len(wrong) + 1))
    right = [*events, {**marker, "data": {"length": len(events)}}]
    validate_log(right, header("x", seed_length=len(right) + 4))  # an ancestor's marker
    validate_log(right, header("x", seed_length=len(events)))  # its own
    with pytest.raises(InvariantError, match="header says"):
        validate_log(right, header("x", seed_length=first))  # after the seed: the header's


def _logged(write: Callable[[SessionLog], None]) -> list[Any]:
    store = MemoryStore()
    with store.create(header("w")) as log:
        write(log)
        return list(log.events)


def test_an_older_format_parent_is_replayed_under_the_childs_format(store: AnyStore) -> None:
    """A resumed format-2 parent: its prefix is replayed under the child's header as before
    (the state cannot be reused across formats), with the same outcome as the old path."""
    parent = store.create(header("parent", version=2))
    parent.append("turn/start", {"turn": 1})
    parent.append("user/message", {"message": {"role": "user", "content": TEXT}})
    parent.append("step/start", {"turn": 1, "step": 1})
    parent.append(
        "assistant/message", {"message": {"role": "assistant", "content": TEXT}, "finish": "stop"}
    )
    parent.append("turn/end", {"turn": 1, "reason": "completed"})
    seed = parent.fork_seed()
    assert seed is not None and not seed.fits(header("new"))
    new = store.create(header("new"), seed)
    old = old_fork(store, parent, "old")
    assert body(store, "new") == body(store, "old")
    assert replay_state(new._replay) == replay_state(old._replay)


def test_a_missing_shared_header_refuses_the_fork_and_leaves_nothing(store: AnyStore) -> None:
    parent = store.create(header("parent"))
    turn(parent, 1)
    seed = parent.fork_seed()
    assert seed is not None and len(seed.refs) == 1
    (ref,) = seed.refs
    if isinstance(store, MemoryStore):
        del store.headers[ref]
    else:
        (store.root / "headers" / f"{ref}.header").unlink()
    with pytest.raises(SharedHeaderMissingError):
        store.create(header("child"), seed)
    assert not store.exists("child")


def test_no_completed_turn_no_seed_and_the_seed_reads_as_its_events() -> None:
    store = MemoryStore()
    parent = store.create(header("parent"))
    assert parent.fork_seed() is None
    in_flight(parent, 1)
    assert parent.fork_seed() is None
    parent.append("turn/end", {"turn": 1, "reason": "interrupted"})
    accept(parent)
    seed = parent.fork_seed()
    assert seed is not None
    events = completed_turn_prefix(list(parent.events))
    assert len(seed) == len(events) and list(seed) == events
    assert [seed[i] for i in range(-len(seed), len(seed))] == events + events
    assert seed[1:3] == events[1:3] and seed[1] is not seed[1]
    with pytest.raises(IndexError):
        seed[len(seed)]
    with pytest.raises(ValueError, match="does not fit"):
        seed.replay_for(header("x", seed_length=len(seed) + 1))
    # A seed length that disagrees goes the general way, which refuses it.
    with pytest.raises(ValueError, match="seed_length"):
        store.create(header("x", seed_length=2), seed)
    assert not store.exists("x")


def test_payloads_extend_runs_after_what_they_hold() -> None:
    first = msgpack.packb({"type": "turn/start", "seq": 0, "time": 1.0, "data": {"turn": 1}})
    run = [msgpack.packb({"type": "x/y", "seq": i, "time": 1.0, "data": {}}) for i in (1, 2)]
    payloads = Payloads()
    payloads.add(first, "turn/start")
    payloads.extend(b"".join(run), array("Q", [len(run[0]), len(run[0]) + len(run[1])]), b"\0\0")
    view = agent.log.EventView(payloads)
    assert [e["seq"] for e in view] == [0, 1, 2]
    assert list(view.positions(["turn/start"])) == [0]


def test_appended_events_are_typed_from_their_first_bytes_an_unknown_one_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fork finds the types of the parent's live events from their payloads' first bytes,
    decoding none: one of a type outside the vocabulary (ignorable, its name a str 8) is told
    by its name there, and kept as such."""
    store = MemoryStore()
    parent = store.create(header("parent"))
    turn(parent, 1)
    parent.append("x/custom-event-of-a-newer-writer-with-a-long-name", {"ignorable": True})
    turn(parent, 2)
    decodes = count_decodes(monkeypatch)
    seed = parent.fork_seed()
    assert seed is not None and decodes[0] == 0
    child = store.create(header("new", seed_length=len(seed)), seed)
    assert parent.fork_seed() is not None and decodes[0] == 0
    custom = "x/custom-event-of-a-newer-writer-with-a-long-name"
    assert list(child.events.positions([custom])) == list(parent.events.positions([custom]))
    assert decodes[0] == 0  # the seed's unknown event is told by its name's bytes too
    monkeypatch.undo()
    old = old_fork(store, parent, "old")
    assert body(store, "new") == body(store, "old")
    assert list(child.events.positions([custom, "turn/end"])) == list(
        old.events.positions([custom, "turn/end"])
    )
    assert [e["type"] for e in child.events.select([custom])] == [custom]


def test_the_fork_provider_seeds_a_live_childs_log_from_the_parents_payloads() -> None:
    with kit() as k:
        parent = k.parent()
        k.respond = lambda r: S.text("parent answer")
        parent.send("first question").get()
        parent.when_idle().get(timeout=5)
        seed = ForkProvider().seed_for(parent)
        assert isinstance(seed, ForkSeed) and list(seed) == list(parent.log.events)
        k.respond = lambda r: S.text(f"child sees {len(r.messages)} messages")
        run = k.start(parent, "child task", provider="fork")
        assert run.result.get(timeout=5).output[0]["text"] == "child sees 3 messages"
        run.dispose()
        events = assert_log_valid(k.store, run.id)
        assert events[: len(seed)] == list(seed)
        assert k.store.load(run.id).header.seed_length == len(seed)


def _decodes_before_a_forks_first_request(monkeypatch: pytest.MonkeyPatch, turns: int) -> int:
    """How many msgpack decodes a fork makes from its start until its model is first asked,
    for a parent of `turns` completed turns (q11)."""
    with kit() as k:
        parent = k.parent()
        k.respond = lambda r: S.text("parent answer")
        for i in range(turns):
            parent.send(f"question {i}").get()
            parent.when_idle().get(timeout=5)
        seen: list[int] = []
        decodes = count_decodes(monkeypatch)

        def first(request: Any) -> Any:
            seen.append(decodes[0])  # before the request's messages are read
            return S.text(f"child sees {len(request.messages)} messages")

        k.respond = first
        run = k.start(parent, "child task", provider="fork")
        assert run.result.get(timeout=5).output[0]["text"] == f"child sees {2 * turns + 1} messages"
        run.dispose()
        monkeypatch.undo()
        return seen[0]


def test_a_forks_agent_is_built_without_decoding_its_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The child's conversation (positions by type code), turn number (the replay's) and usage
    (the events after the seed) are read without decoding the seed: what its start decodes
    does not grow with the parent's history. Its requests' messages are decoded as they are
    read (fresh copies each time; docs/decisions.md, "q11")."""
    short = _decodes_before_a_forks_first_request(monkeypatch, 2)
    long = _decodes_before_a_forks_first_request(monkeypatch, 12)
    assert long == short
