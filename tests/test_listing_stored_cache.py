"""A listing keeps what a row needs of each stored child's log (descriptor, usage, cost) by the
file's stamp (inode, size, mtime, ctime), so a later listing reads only the logs that changed:
a parent with 5,000 stored children used to read and decode every one of their logs, on the
hub, for every `list_agents`. What changed (a resume's new turn, a log appended by another
process, a file replaced) is always read again; many logs are read off the hub."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gevent
import pytest
from seam_kit import Kit, kit, last_user_text, wait_until

from actors.agents import resume_agent
from agent import store as store_module
from agent.events import SessionHeader
from agent.model import ModelRequest
from agent.models import scripted as S
from agent.store import MemoryStore, SessionStore
from agent.usage import usage_of_events
from subagent.listings import Listings
from subagent.runtime import Runtime
from subagent.types import MessageSource
from supervision.offload import offload as real_offload

TURN = {"input_tokens": 10, "output_tokens": 2}


def _twice(usage: dict[str, int]) -> dict[str, int]:
    return {key: 2 * value for key, value in usage.items()}


@pytest.fixture
def steady(monkeypatch: pytest.MonkeyPatch) -> None:
    """Files written now count as still: a test's logs are all younger than the racy window
    (`_RACY_NS`), and would otherwise never be kept."""
    monkeypatch.setattr(store_module, "_RACY_NS", 0)


@pytest.fixture
def k(tmp_path: Path) -> Iterator[Kit]:
    with kit(store=SessionStore(tmp_path)) as the_kit:
        the_kit.respond = lambda request: S.text(f"done: {last_user_text(request)}", usage=TURN)
        yield the_kit


class _Reads:
    """The stored logs a store opens to read (in order), as a listing reads them."""

    def __init__(self, store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        self.ids: list[str] = []
        real = store._reader

        def counted(session_id: str) -> Any:
            self.ids.append(session_id)
            return real(session_id)

        monkeypatch.setattr(store, "_reader", counted)

    def taken(self) -> list[str]:
        ids, self.ids = sorted(self.ids), []
        return ids


def _released(k: Kit, child_id: str) -> None:
    wait_until(lambda: child_id not in k.runtime.ctx.agents)


def _stored_children(k: Kit, parent: Any, count: int) -> list[str]:
    ids = []
    for i in range(count):
        started = k.service.start_continuable(
            "spawn", k.request(parent, f"task {i}"), label=f"w{i}"
        )
        k.runtime.tasks.wait(started.task_id)
        _released(k, started.child_id)
        ids.append(started.child_id)
    return ids


def _resume(k: Kit, parent: Any, child_id: str, text: str) -> None:
    sent = k.service.send_message(parent, child_id, text, MessageSource.coordinator(parent.id))
    assert sent.kind == "started" and sent.task_id is not None
    k.runtime.tasks.wait(sent.task_id)
    _released(k, child_id)


def _brief(rows: list[Any]) -> list[tuple[str, str | None, str, dict[str, int]]]:
    return [(r["id"], r["label"], r["activity"], r.get("usage", {})) for r in rows]


@pytest.mark.usefixtures("steady")
def test_a_listing_reads_each_stored_log_once_and_a_resumed_child_s_again(
    k: Kit, monkeypatch: pytest.MonkeyPatch
) -> None:
    parent = k.parent()
    a, b, c = _stored_children(k, parent, 3)
    reads = _Reads(k.store, monkeypatch)
    first = k.service.list_children(parent.id)
    assert _brief(first) == [
        (a, "w0", "stored", TURN),
        (b, "w1", "stored", TURN),
        (c, "w2", "stored", TURN),
    ]
    assert reads.taken() == sorted([a, b, c])
    assert k.service.list_children(parent.id) == first
    assert reads.taken() == []  # nothing changed: nothing read

    _resume(k, parent, b, "more")
    reads.taken()  # the resume's own reads
    rows = k.service.list_children(parent.id)
    assert _brief(rows) == [
        (a, "w0", "stored", TURN),
        (b, "w1", "stored", _twice(TURN)),  # the new turn's usage, never the kept one
        (c, "w2", "stored", TURN),
    ]
    assert reads.taken() == [b]
    assert rows[1]["usage"] == usage_of_events(k.store.inspect(b).events)


def test_a_log_changed_within_the_racy_window_is_never_kept(
    k: Kit, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file's times have a coarse grain: a log written that recently is read at every
    listing until it has been still for `_RACY_NS`, so a same-size rewrite is never missed."""
    monkeypatch.setattr(store_module, "_RACY_NS", 3600 * 10**9)
    parent = k.parent()
    (child,) = _stored_children(k, parent, 1)
    reads = _Reads(k.store, monkeypatch)
    for _ in range(2):
        assert [r["id"] for r in k.service.list_children(parent.id)] == [child]
        assert reads.taken() == [child]


@pytest.mark.usefixtures("steady")
def test_a_log_another_process_holds_and_appends_is_read_again(
    k: Kit, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parent = k.parent()
    (child,) = _stored_children(k, parent, 1)
    assert _brief(k.service.list_children(parent.id)) == [(child, "w0", "stored", TURN)]

    def respond(request: ModelRequest) -> S.Step:
        return S.text("elsewhere", usage=TURN)

    # Another runtime on the same directory stands for another process.
    with Runtime(store=SessionStore(tmp_path), scripted=S.ScriptedModel(respond)) as other:
        agent = resume_agent(other.ctx, child)
        agent.send("more").get()
        agent.when_idle().get()
        reads = _Reads(k.store, monkeypatch)
        rows = k.service.list_children(parent.id)
        assert _brief(rows) == [(child, "w0", "running elsewhere", _twice(TURN))]
        assert reads.taken() == [child]
        agent.close()
    assert _brief(k.service.list_children(parent.id)) == [(child, "w0", "stored", _twice(TURN))]
    assert reads.taken() == []  # closing appended nothing


@pytest.mark.usefixtures("steady")
def test_a_log_replaced_by_another_file_is_read_again_and_its_error_is_kept(
    k: Kit, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file put in the log's place (another inode, same size: a restore, a copy) is read
    again; a log that cannot be read is reported from what was kept until it changes."""
    assert isinstance(k.store, SessionStore)
    parent = k.parent()
    good, other = _stored_children(k, parent, 2)
    path = k.store.root / f"{good}.session"
    original = path.read_bytes()
    assert [r["activity"] for r in k.service.list_children(parent.id)] == ["stored", "stored"]

    def put(data: bytes) -> None:
        tmp = path.with_name(".replacement.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)

    damaged = bytearray(original)
    damaged[len(damaged) // 2] ^= 0xFF
    put(bytes(damaged))
    reads = _Reads(k.store, monkeypatch)
    for expected_reads in ([good], []):
        rows = k.service.list_children(parent.id)
        assert [(r["id"], r["mode"], r["activity"]) for r in rows] == [
            (good, "unknown", "corrupt"),
            (other, "continuable", "stored"),
        ]
        assert "corrupt" in rows[0]["error"] or rows[0]["error"]
        assert reads.taken() == expected_reads
    put(original)
    assert _brief(k.service.list_children(parent.id)) == [
        (good, "w0", "stored", TURN),
        (other, "w1", "stored", TURN),
    ]
    assert reads.taken() == [good]


@pytest.mark.usefixtures("steady")
def test_many_logs_to_read_are_read_off_the_hub_few_in_place(
    k: Kit, monkeypatch: pytest.MonkeyPatch
) -> None:
    offloaded: list[int] = []
    real = real_offload

    asked: list[int] = []

    def counting(fn: Any, *args: Any) -> Any:
        if getattr(fn, "__name__", "") == "_digest_now":
            offloaded.append(len(args[0]))
        if getattr(fn, "__name__", "") == "_held_now":
            asked.append(len(args[0]))
        return real(fn, *args)

    monkeypatch.setattr(store_module, "offload", counting)
    parent = k.parent()
    many = store_module._LOGS_READ_ON_HUB + 1
    children = _stored_children(k, parent, many)
    assert len(k.service.list_children(parent.id)) == many
    assert offloaded == [many]
    _resume(k, parent, children[0], "more")
    assert k.service.list_children(parent.id)[0]["usage"] == _twice(TURN)
    assert offloaded == [many]  # one log to read: read in place
    # Few logs, but many bytes: off the hub too.
    monkeypatch.setattr(store_module, "_LOG_BYTES_ON_HUB", 1)
    _resume(k, parent, children[1], "more")
    assert k.service.list_children(parent.id)[1]["usage"] == _twice(TURN)
    assert offloaded == [many, 1]
    # Whether another process holds each stored child's log: asked together, off the hub
    # when many.
    assert asked == []
    monkeypatch.setattr(store_module, "_HELD_ASKED_ON_HUB", many - 1)
    assert len(k.service.list_children(parent.id)) == many
    assert asked == [many]


@pytest.mark.usefixtures("steady")
def test_what_is_kept_is_one_entry_per_stored_child_and_goes_with_it(k: Kit) -> None:
    parent = k.parent()
    children = _stored_children(k, parent, 3)
    listings = Listings(k.store)
    assert len(listings.list_children(parent.id)) == 3
    assert set(listings._digests) == set(children)  # what the listing keeps, by child
    k.store.delete(children[0])
    assert [r["id"] for r in listings.list_children(parent.id)] == children[1:]
    assert set(listings._digests) == set(children[1:])


def test_a_memory_store_s_logs_are_read_at_every_listing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The memory store has no file stamps to trust (its bytes may be changed in place), so
    nothing is kept: every listing reads every stored child's log, and is right."""
    with kit(store=MemoryStore()) as mk:
        mk.respond = lambda request: S.text("ok", usage=TURN)
        parent = mk.parent()
        run = mk.start(parent, "task")
        run.result.get()
        run.dispose()
        reads = _Reads(mk.store, monkeypatch)
        for _ in range(2):
            assert _brief(mk.service.list_children(parent.id)) == [(run.id, None, "stored", TURN)]
            assert reads.taken() == [run.id]


@pytest.mark.usefixtures("steady")
def test_a_long_listing_lets_other_greenlets_run_between_batches_of_rows(
    k: Kit, monkeypatch: pytest.MonkeyPatch
) -> None:
    from subagent import listings as listings_module

    parent = k.parent()
    children = _stored_children(k, parent, 3)
    listings = Listings(k.store)
    assert len(listings.list_children(parent.id)) == 3  # every log read and kept
    ran: list[bool] = []
    other = gevent.spawn(ran.append, True)
    assert [r["id"] for r in listings.list_children(parent.id)] == children
    assert ran == []  # three rows, nothing read: the listing never yielded
    monkeypatch.setattr(listings_module, "_ROWS_BETWEEN_YIELDS", 2)
    assert [r["id"] for r in listings.list_children(parent.id)] == children
    assert ran == [True]
    other.join()


def test_a_big_directory_is_scanned_off_the_hub(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scans: list[str] = []

    def counting(fn: Any, *args: Any) -> Any:
        if getattr(fn, "__name__", "") == "_listed":
            scans.append("off the hub")
        return real_offload(fn, *args)

    monkeypatch.setattr(store_module, "offload", counting)
    monkeypatch.setattr(store_module, "_SCANNED_ON_HUB", 2)
    store = SessionStore(tmp_path, durability="none")
    for i in range(3):
        store.create(SessionHeader(id=f"s{i}", created_at=float(i), cwd="/w")).close()
    assert [h.id for h in store.list()] == ["s0", "s1", "s2"]
    assert scans == []  # the first scan: nothing known of the directory's size yet
    assert [h.id for h in store.list()] == ["s0", "s1", "s2"]
    assert scans == ["off the hub"]
