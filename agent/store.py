"""Session stores: a directory of `<id>.session` files, and an in-memory twin for tests.

Both keep the exact same bytes (the frame format of `agent.frames`), so load, repair and
corruption handling are one code path and the memory store is a faithful stand-in. A live
`SessionLog` holds its session exclusively (an `flock` on the file, a flag in memory): a second
`open`, a repairing `load` or a `delete` of it raises `SessionBusyError` instead of racing.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import fcntl
import functools
import gc
import hashlib
import logging
import math
import os
import re
import secrets
import stat
import struct
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final, Protocol, TypeVar, cast

import gevent
import gevent.lock
import msgpack
import platformdirs

from agent.errors import (
    SessionBusyError,
    SessionExistsError,
    SessionNotFoundError,
    SharedHeaderMissingError,
)
from agent.events import (
    REQUEST_HEADER,
    Event,
    SessionHeader,
    SessionLogError,
    validate_session_id,
)
from agent.frames import (
    FRAME_HEADER_SIZE,
    MAX_FRAME,
    CorruptSessionError,
    Decoded,
    EventSink,
    ReadAt,
    Skimmed,
    _crc32,
    _frame,
    _packb,
    decode_header,
    encode_header,
    iter_frames,
    read_frames,
    skim_frames,
)
from agent.jsoncheck import check_json, repair_surrogates
from agent.log import (
    DURABILITY_SETTINGS,
    Durability,
    EventView,
    ForkSeed,
    InvariantError,
    LogReplay,
    Payloads,
    SessionLog,
    ToolLike,
    closing_events,
    encode_payloads,
    request_header_data,
    validate_log,
)
from supervision.offload import offload

__all__ = [
    "Digested",
    "LoadedSession",
    "MemoryStore",
    "SessionBusyError",
    "SessionExistsError",
    "SessionNotFoundError",
    "SessionStore",
    "SharedHeaderMissingError",
    "Stamp",
    "UnreadableSession",
    "default_root",
]

logger = logging.getLogger("agent")


SUFFIX: Final = ".session"
_TMP_SUFFIX: Final = ".tmp"
# Files at least this big are read and decoded in the hub's thread pool, not on the hub: a
# 256 KiB log decodes in a few milliseconds, and a torn tail's search stays off the hub too.
# Either way a file is read a chunk at a time as it is decoded (`frames.read_frames`), never
# held whole: a load's transient memory is one chunk, not the file's size.
_THREADPOOL_READ: Final = 1 << 18
# A listing that must read more session headers than this (~20 us each) reads them off the hub.
_HEADERS_READ_ON_HUB: Final = 64
# `digest_logs` reads the logs it must read off the hub when they are more than this many, or
# this many bytes together: a log of a few turns is ~0.1 ms to read and decode, so what stays on
# the hub is a couple of milliseconds at most.
_LOGS_READ_ON_HUB: Final = 16
_LOG_BYTES_ON_HUB: Final = 1 << 16
# `census` scans the directory off the hub when the last scan found more files than this.
_SCANNED_ON_HUB: Final = 1024
# `held_among` asks off the hub past this many sessions (an open, a lock query, a close each).
_HELD_ASKED_ON_HUB: Final = 64
# A digest of a log changed this recently (ns, by its file's times) is not kept: file times
# have a coarse grain (a kernel tick; a second or two on some filesystems), so a rewrite of the
# same size within the grain would look unchanged (git's "racy clean" problem). Read again
# instead, until the file has been still for this long.
_RACY_NS: Final = 2_000_000_000
# How long the stamps a `census` saw stand for the files (s): a listing calls `census` for its
# headers, then `digest_logs` for its rows, so the stamps of that census are as fresh as its
# headers; a `digest_logs` later than this stats the files itself.
_STAMPS_FRESH: Final = 1.0
# Seeds of this many events or more are checked and encoded in the hub's thread pool too.
_THREADPOOL_SEED: Final = 2_000
# Shared request headers: `<root>/headers/<sha256 hex>.header`, one frame each.
HEADERS_DIR: Final = "headers"
_HEADER_SUFFIX: Final = ".header"
_HEADER_REF = re.compile(r"[0-9a-f]{64}")
# How many distinct (system prompt, tools) pairs a store remembers the address of.
_HEADER_CACHE: Final = 256
_pack_strict = msgpack.Packer(use_bin_type=True, autoreset=True, strict_types=True).pack


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Hold the cyclic collector off while a log is decoded.

    Decoding allocates tens of thousands of containers at once; each burst would otherwise
    trigger collections that rescan every live object (every live child's state), which costs
    more than the decode. Nothing decoded is garbage yet, so postponing loses nothing. If
    another pause overlaps, the collector is back on once the outermost pause that found it on
    ends; it is never left off.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


_T = TypeVar("_T")


def _listed(items: Callable[[], Iterable[_T]]) -> builtins.list[_T]:
    return builtins.list(items())


# What tells a stored file's version: (inode, size, mtime ns, ctime ns). An append grows the
# size (and moves both times); a session made again under its id is another inode, or the
# same one reused with other times; a repair (truncate, then append) moves the times.
Stamp = tuple[int, int, int, int]
# `digest_logs`' answer for one log: the stamp of the file as read (None: not to be kept, the
# file changed too recently to tell or could not be read), and the digest or what failed.
Digested = tuple[Stamp | None, _T | Exception]


def _stamp_of(info: os.stat_result) -> Stamp:
    return (info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def _bare(exc: Exception) -> Exception:
    """`exc` without its traceback (nor its chain's): kept in a cache, it must not hold the
    frames of the read that raised it, nor their buffers."""
    seen: BaseException | None = exc
    while seen is not None:
        seen.__traceback__ = None
        seen = seen.__cause__ or seen.__context__
    return exc


def _call(fn: Callable[..., _T], *args: object) -> _T:
    """`fn(*args)` in place: `offload`'s shape, for what is cheap enough to run on the hub."""
    return fn(*args)


@dataclass(frozen=True, slots=True)
class LoadedSession:
    """A stored session as read. `events` is a read-only sequence of the log's events kept as
    their payloads (`agent.log.EventView`): indexing, iteration, `len`, and `positions` /
    `select` by type decode only what they return, each read a fresh copy. Copy what you keep
    or change (`list(loaded.events)`)."""

    header: SessionHeader
    events: EventView
    repaired: bool
    # Bytes of an incomplete tail frame: dropped by `load`, only reported by `inspect`.
    torn_bytes: int = 0
    # `inspect` only: the tail is torn or ends in an open turn, so `load` would write a repair.
    needs_repair: bool = False


@dataclass(frozen=True, slots=True)
class UnreadableSession:
    """A stored entry whose header cannot be read: listed as corrupt, never dropped."""

    id: str
    offset: int | None  # byte offset of the damage, when known
    reason: str


# Errors of a store that may be read but not written (read-only mount, no write permission).
_READ_ONLY_ERRNOS: Final = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})
# A `.tmp` left by an interrupted create is removed only once this old (seconds): a younger one
# may be a create in progress in another process, between its `open` and its `flock`.
TMP_GRACE: Final = 60.0


def default_root() -> Path:
    """`$SUBAGENT_HOME/sessions`, else the platform user data dir's `sessions`."""
    home = os.environ.get("SUBAGENT_HOME") or platformdirs.user_data_dir("subagent")
    return Path(home) / "sessions"


class _Store:
    """The shared logic; subclasses provide byte storage and exclusive handles."""

    persistent: bool = False

    def __init__(self, durability: Durability = "turn") -> None:
        if durability not in DURABILITY_SETTINGS:
            raise ValueError(f"durability must be one of {sorted(DURABILITY_SETTINGS)}")
        self.durability: Durability = durability
        # Headers `census` read, by id, with their file's stamp (`_stamped_ids`): a header is
        # written once, at create, so a listing reads only the files that are new since.
        self._known_headers: dict[str, tuple[object, SessionHeader]] = {}
        # Each file's stamp as the last `census` saw it, and when (monotonic s): `digest_logs`
        # compares with these while they are fresh (`_STAMPS_FRESH`), else stats the files.
        self._stamps: dict[str, object] = {}
        self._stamped_at = -math.inf
        # system prompt -> [(tools, address)]: the addresses of headers stored or seen here.
        self._header_refs: dict[str, builtins.list[tuple[tuple[Any, ...], str]]] = {}
        self._header_count = 0

    # -- backend primitives -----------------------------------------------------------------

    def _name(self, session_id: str) -> str:
        raise NotImplementedError

    def _create_bytes(self, session_id: str, data: bytes | bytearray) -> _Handle:
        raise NotImplementedError

    def _acquire(self, session_id: str) -> _Handle | None:
        """An exclusive handle, or None when the session is busy; SessionNotFoundError."""
        raise NotImplementedError

    def _reader(self, session_id: str) -> _Reader:
        """A read-only view of the stored bytes, taking nothing (close it when done)."""
        raise NotImplementedError

    def ids(self) -> list[str]:
        """Every stored session id, reading no log (what `gc` walks, unreadable ones too)."""
        return list(self._ids())

    def _ids(self) -> Iterable[str]:
        raise NotImplementedError

    def _read_header_bytes(self, session_id: str) -> bytes:
        raise NotImplementedError

    def _remove(self, session_id: str) -> None:
        raise NotImplementedError

    def exists(self, session_id: str) -> bool:
        raise NotImplementedError

    def _has_shared(self, ref: str) -> bool:
        raise NotImplementedError

    def _put_shared(self, ref: str, frame: bytes) -> None:
        """Store one shared header's frame, durably (per the store's setting), never clobbering."""
        raise NotImplementedError

    def _read_shared(self, ref: str) -> bytes:
        """The frame; `SharedHeaderMissingError` when the store does not hold it."""
        raise NotImplementedError

    # -- shared request headers ---------------------------------------------------------------

    def request_header_ref(self, system: str, tools: Sequence[ToolLike]) -> str:
        """The address of this request header, its content stored here first if it is new.

        Siblings share their system prompt and tool objects, so after the first child this is
        a dict look-up and an identity comparison of the tools; the content is walked, encoded
        and hashed once per distinct content and process."""
        # A tuple both sides: a list never equals a tuple, so comparing the stored copy with the
        # caller's sequence as given would miss every time.
        specs = tools if type(tools) is tuple else tuple(tools)
        known = self._header_refs.get(system)
        if known is not None:
            for seen, ref in known:
                if seen == specs:
                    # On disk, `subagent gc` may have removed it since: one stat to be sure.
                    if not self.persistent or self._has_shared(ref):
                        return ref
                    break
        data = request_header_data(system, tools)
        check_json(data, where="request/header")
        try:
            payload = _pack_strict(data)
        except UnicodeEncodeError:  # lone surrogates: repaired as a log append repairs them
            repair_surrogates(data)
            payload = _pack_strict(data)
        ref = hashlib.sha256(payload).hexdigest()
        if not self._has_shared(ref):
            self._put_shared(ref, _frame(payload))
        if self._header_count >= _HEADER_CACHE:
            self._header_refs.clear()
            self._header_count = 0
        self._header_refs.setdefault(system, []).append((specs, ref))
        self._header_count += 1
        return ref

    def request_header(self, ref: str) -> dict[str, Any]:
        """The content a shared header's address names: `{"system", "tools"}`.

        `SharedHeaderMissingError` when this store does not hold it, `CorruptSessionError` when
        what it holds is damaged or is not that content."""
        if type(ref) is not str or not _HEADER_REF.fullmatch(ref):
            raise ValueError(f"not a shared request header address: {ref!r}")
        frame = self._read_shared(ref)
        name = f"{self._shared_name(ref)}"
        if len(frame) < FRAME_HEADER_SIZE:
            raise CorruptSessionError(name, 0, "truncated shared header")
        length = int.from_bytes(frame[:4], "big")
        payload = frame[FRAME_HEADER_SIZE:]
        if length != len(payload) or _crc32(payload) != int.from_bytes(frame[4:8], "big"):
            raise CorruptSessionError(name, 0, "shared header frame fails its length or CRC")
        if hashlib.sha256(payload).hexdigest() != ref:
            raise CorruptSessionError(name, 0, "shared header content does not match its address")
        data = msgpack.unpackb(payload)
        if type(data) is not dict or type(data.get("system")) is not str:
            raise CorruptSessionError(name, 0, "shared header is not {system, tools}")
        if type(data.get("tools")) is not builtins.list:
            raise CorruptSessionError(name, 0, "shared header is not {system, tools}")
        return data

    def resolve_request_header(self, data: Mapping[str, Any]) -> dict[str, Any]:
        """A `request/header` event's content, whichever shape it was logged in."""
        ref = data.get("ref")
        if ref is not None:
            return self.request_header(ref)
        return {"system": data["system"], "tools": data["tools"]}

    def _shared_name(self, ref: str) -> str:
        return f"{HEADERS_DIR}/{ref}{_HEADER_SUFFIX}"

    def _check_shared(self, session_id: str, events: Iterable[Event]) -> None:
        """Every shared header the events name is held here: a log whose model input can no
        longer be read fails loud when it is loaded, not when someone reads that event."""
        refs = {
            e["data"]["ref"] for e in events if e["type"] == REQUEST_HEADER and "ref" in e["data"]
        }
        self._check_refs(session_id, refs)

    def _check_refs(self, session_id: str, refs: Iterable[str]) -> None:
        for ref in sorted(refs):
            if not self._has_shared(ref):
                raise SharedHeaderMissingError(ref, self._name(session_id))

    # -- public API ---------------------------------------------------------------------------

    def create(self, header: SessionHeader, seed_events: Iterable[Event] = ()) -> SessionLog:
        """Store a new session (atomically) and return its log, positioned after the seed."""
        if not seed_events and header.seed_length == 0 and type(seed_events) in (tuple, list):
            # A fresh child (no seed): nothing to copy, check or replay, only the header.
            handle = self._create_bytes(header.id, encode_header(header))
            return SessionLog(header, [], handle, self.durability, LogReplay(header), shared=self)
        if type(seed_events) is ForkSeed and seed_events.fits(header):
            return self._create_forked(header, seed_events)
        with gc_paused():  # a long seed's copies are a burst of containers, none garbage
            seed = [dict(e) for e in seed_events]
        if header.seed_length not in (0, len(seed)):
            raise ValueError(
                f"header.seed_length is {header.seed_length} but {len(seed)} seed events given"
            )
        if header.seed_length != len(seed):
            header = replace(header, seed_length=len(seed))
        # A long seed (a fork of a long session) is tens of ms of CPU to check, replay and
        # encode: in the hub's thread pool, as a big log's decode is.
        frames = [encode_header(header)]
        if len(seed) >= _THREADPOOL_SEED:
            replay, payloads = offload(_prepare_seed, header, seed, frames)
        else:
            replay, payloads = _prepare_seed(header, seed, frames)
        if seed:
            self._check_shared(header.id, seed)  # type: ignore[arg-type]
        del seed
        handle = self._create_bytes(header.id, b"".join(frames))
        return SessionLog(header, EventView(payloads), handle, self.durability, replay, shared=self)

    def _create_forked(self, header: SessionHeader, seed: ForkSeed) -> SessionLog:
        """`create` from a live parent's prefix as payloads: the bytes copied and framed as
        they are, the replay state taken from the parent's at that point. Nothing is decoded,
        checked or encoded again: the parent's log checked every event when it took it, in the
        same event format (`ForkSeed.fits`); the shared headers it names are still checked."""
        if header.seed_length != len(seed):
            header = replace(header, seed_length=len(seed))
        replay = seed.replay_for(header)
        self._check_refs(header.id, seed.refs)
        head = encode_header(header)
        if seed.size >= _THREADPOOL_READ:  # CRCs of a big prefix: off the hub, as its read is
            data, payloads = offload(seed.write, head)
        else:
            data, payloads = seed.write(head)
        handle = self._create_bytes(header.id, data)
        return SessionLog(header, EventView(payloads), handle, self.durability, replay, shared=self)

    def open(self, session_id: str) -> SessionLog:
        """Load (repairing a torn or open tail durably) and hold the session for appending."""
        validate_session_id(session_id)
        handle = self._acquire(session_id)
        if handle is None:
            raise SessionBusyError(f"session {session_id} is already open")
        try:
            loaded, replay, refs = self._load_locked(session_id, handle)
            self._check_refs(session_id, refs)
        except BaseException:
            handle.close()
            raise
        # The events stay the payloads read from the file (decoded once, to replay them).
        return SessionLog(
            loaded.header, loaded.events, handle, self.durability, replay, shared=self
        )

    def load(self, session_id: str) -> LoadedSession:
        """The session's header and events, with a torn or open tail repaired durably.

        On a store it may not write (a read-only mount), a session that needs no repair loads
        as is; one that does raises `SessionLogError` saying so.
        """
        validate_session_id(session_id)
        try:
            handle = self._acquire(session_id)
        except OSError as exc:
            if exc.errno not in _READ_ONLY_ERRNOS:
                raise
            loaded, refs = self._inspect(session_id)
            if loaded.needs_repair:
                raise SessionLogError(
                    f"session {session_id} needs a repair, but its store is not writable: {exc}"
                ) from exc
        else:
            if handle is None:
                loaded, refs = self._inspect(session_id)
                if loaded.needs_repair:
                    raise SessionBusyError(f"session {session_id} is open and mid-turn")
            else:
                try:
                    loaded, _replay, refs = self._load_locked(session_id, handle)
                finally:
                    handle.close()
        self._check_refs(session_id, refs)
        return loaded

    def inspect(self, session_id: str) -> LoadedSession:
        """What is stored, as is: never writes, never takes the session."""
        return self._inspect(session_id)[0]

    def _inspect(self, session_id: str) -> tuple[LoadedSession, set[str]]:
        """`inspect`, and the shared request headers the log names."""
        validate_session_id(session_id)
        reader = self._reader(session_id)
        try:
            kept = _Keeper(reader.size())
            decoded, replay = self._decode(session_id, reader, kept)
        finally:
            reader.close()
        return _as_inspected(decoded, replay, kept), kept.refs

    def digest_logs(
        self, known: Mapping[str, object], digest: Callable[[LoadedSession], _T]
    ) -> dict[str, Digested[_T]]:
        """`digest` of each stored log named in `known` whose file is not the one its known
        stamp (the mapped value; None: none known) describes, as `inspect` reads it: what
        a caller that keeps a digest per log (a listing: descriptor, usage, cost) needs to read
        again, and only that. Logs not in the answer are unchanged.

        The stamps compared are those of the last `census` (a listing calls it first), else
        taken now. Many logs, or many bytes, are read in the hub's thread pool: `digest` then
        runs there too, so it must be pure. A failure to read or digest is the answer's value
        (`SessionNotFoundError` for one deleted meanwhile), never raised. The memory store has
        no stamps: every log is read each time.
        """

        def read(session_id: str, reader: _Reader, size: int) -> _T:
            kept = _Keeper(size)
            decoded, replay = self._decode_now(session_id, reader, size, kept)
            return digest(_as_inspected(decoded, replay, kept))

        return self._digest_many(known, read)

    def skim_logs(
        self,
        known: Mapping[str, object],
        types: Collection[str],
        digest: Callable[[Skimmed], _T],
    ) -> dict[str, Digested[_T]]:
        """`digest_logs` for a reader that needs a few types of event of each log (a listing in
        a process of its own: descriptors and replies): each log is skimmed
        (`frames.skim_frames`), reading whole only the frames of those `types` and, of the
        others, their prefix and type; so a log's big tool results are never read. A skim
        vouches for less than `inspect` (the chain of frames, and the frames it decodes), so a
        session whose skipped bytes are damaged is only found so by a full read (`load`)."""
        wanted = frozenset(types)

        def read(session_id: str, reader: _Reader, size: int) -> _T:
            name = self._name(session_id)
            skimmed = skim_frames(reader.read_at, size, name, wanted)
            if skimmed.header.id != session_id:
                raise CorruptSessionError(name, 0, f"header names session {skimmed.header.id!r}")
            return digest(skimmed)

        return self._digest_many(known, read)

    def _digest_many(
        self,
        known: Mapping[str, object],
        read: Callable[[str, _Reader, int], _T],
    ) -> dict[str, Digested[_T]]:
        """`read` of each log in `known` whose file changed (`digest_logs`' rules)."""
        todo: builtins.list[str] = []
        size = 0
        for session_id, seen in known.items():
            stamp, length = self._probe(session_id)
            if stamp is not None and stamp == seen:
                continue
            todo.append(session_id)
            size += length
        if not todo:
            return {}
        # A skim reads a small part of a big log, but that part may be a big reply: the size
        # decides for it too.
        if len(todo) > _LOGS_READ_ON_HUB or size >= _LOG_BYTES_ON_HUB:
            found = offload(self._digest_now, todo, read, True)
        else:
            found = self._digest_now(todo, read, False)
        for session_id, (stamp, value) in found.items():
            seen = self._stamps.get(session_id)
            if stamp is not None and seen == stamp:  # the census's object: one a file, kept
                found[session_id] = (seen, value)
        return found

    def _probe(self, session_id: str) -> tuple[Stamp | None, int]:
        """The file's stamp (None: none to trust) and size, for `digest_logs`."""
        raise NotImplementedError

    def _digest_now(
        self,
        session_ids: Iterable[str],
        read: Callable[[str, _Reader, int], _T],
        in_thread: bool,
    ) -> dict[str, Digested[_T]]:
        """Read and digest each log, here and now (on the hub or in a pool thread).

        In a pool thread, the GIL is offered back after each log: Python hands it to a waiting
        thread only every switch interval (5 ms) otherwise, and the hub needs it several
        times a tick, so a long batch would stretch every other greenlet's wake-up."""
        out: dict[str, Digested[_T]] = {}
        for session_id in session_ids:
            out[session_id] = self._digest_one(session_id, read)
            if in_thread:
                time.sleep(0)
        return out

    def _digest_one(self, session_id: str, read: Callable[[str, _Reader, int], _T]) -> Digested[_T]:
        stamp: Stamp | None = None
        value: _T | Exception
        try:
            validate_session_id(session_id)
            reader = self._reader(session_id)
            try:
                # The stamp of the bytes read: the read stops at the size it names, so an
                # append meanwhile is read next time, never mistaken for what was read now.
                stamp = reader.stamp()
                size = stamp[1] if stamp is not None else reader.size()
                value = read(session_id, reader, size)
            finally:
                reader.close()
        except OSError as exc:  # perhaps passing (EIO, EMFILE): read again next time
            return None, _bare(exc)
        except Exception as exc:  # what the bytes say (corrupt, a bad descriptor): kept
            value = _bare(exc)
        if stamp is not None and time.time_ns() - max(stamp[2], stamp[3]) < _RACY_NS:
            stamp = None
        return stamp, value

    def scan(self, session_id: str, start: int = 0) -> Iterator[Event]:
        """Stored events from index `start`, read and decoded lazily as consumed (see
        `frames.iter_frames`): for lookups that stop early; never writes, never validates.

        The file is opened and its size taken now (a missing or irregular one raises here);
        it is closed when the iteration ends or the iterator is dropped."""
        validate_session_id(session_id)
        events = self._scan(self._reader(session_id), self._name(session_id), start)
        next(events)  # runs up to the first read: the reader is the generator's to close now
        return cast(Iterator[Event], events)  # the priming `None` is consumed

    @staticmethod
    def _scan(reader: _Reader, name: str, start: int) -> Iterator[Event | None]:
        try:
            size = reader.size()
            yield None
            read_at: ReadAt = reader.read_at
            if size >= _THREADPOOL_READ:
                # Consumed on the hub: each chunk is read in the thread pool, as a load's is.
                read_at = functools.partial(offload, reader.read_at)
            yield from iter_frames(read_at, size, name, start)
        finally:
            reader.close()

    def header(self, session_id: str) -> SessionHeader:
        """One stored session's header, read alone: it is readable even when the body is not."""
        validate_session_id(session_id)
        return decode_header(self._read_header_bytes(session_id), self._name(session_id))

    def list(self) -> list[SessionHeader]:
        """Every stored session's header, oldest first; unreadable files are logged, skipped
        (`census` reports them)."""
        headers, unreadable = self.census()
        for bad in unreadable:
            logger.warning("skipping unreadable session %s: %s", bad.id, bad.reason)
        return headers

    def census(self) -> tuple[builtins.list[SessionHeader], builtins.list[UnreadableSession]]:
        """Every stored session's header (oldest first), and every `<id>.session` entry whose
        header cannot be read (a damaged header, a symlink, a directory), with the offset."""
        headers: builtins.list[SessionHeader] = []
        known = self._known_headers
        kept: dict[str, tuple[object, SessionHeader]] = {}
        unknown: builtins.list[tuple[str, object]] = []
        # A big directory's scan (a `stat` and an id check a file, ~5 us) in the thread pool.
        scan = offload if len(self._stamps) > _SCANNED_ON_HUB else _call
        stamped = scan(_listed, self._stamped_ids)
        stamps: dict[str, object] = {}
        for session_id, stamp in stamped:
            hit = known.get(session_id)
            if hit is not None and hit[0] == stamp:
                kept[session_id] = hit
                headers.append(hit[1])
                stamps[session_id] = hit[0]  # one stamp object a file, wherever it is kept
            else:
                unknown.append((session_id, stamp))
                stamps[session_id] = stamp
        self._stamps = stamps
        self._stamped_at = time.monotonic()
        # Many files to open and read (a first listing of a big store): off the hub.
        read = offload if len(unknown) > _HEADERS_READ_ON_HUB else _call
        found, unreadable = read(self._read_headers, unknown)
        for session_id, stamp, header in found:
            headers.append(header)
            if stamp is not None:
                kept[session_id] = (stamp, header)
        self._known_headers = kept  # what is gone from the store is gone from here too
        headers.sort(key=lambda h: (h.created_at, h.id))
        return headers, unreadable

    def _read_headers(
        self, stamped: Iterable[tuple[str, object]]
    ) -> tuple[builtins.list[tuple[str, object, SessionHeader]], builtins.list[UnreadableSession]]:
        found: builtins.list[tuple[str, object, SessionHeader]] = []
        unreadable: builtins.list[UnreadableSession] = []
        for session_id, stamp in stamped:
            try:
                data = self._read_header_bytes(session_id)
                header = decode_header(data, self._name(session_id))
            except CorruptSessionError as exc:
                unreadable.append(UnreadableSession(session_id, exc.offset, exc.message))
            except SessionNotFoundError:
                continue  # deleted since the directory was listed
            except (SessionLogError, OSError) as exc:
                unreadable.append(UnreadableSession(session_id, None, str(exc)))
            else:
                found.append((session_id, stamp, header))
        return found, unreadable

    def _stamped_ids(self) -> Iterable[tuple[str, object]]:
        """Every stored id, with what tells whether its file is the one whose header `census`
        read last time (None: read it again)."""
        return ((session_id, None) for session_id in self._ids())

    def is_held(self, session_id: str) -> bool:
        """Whether a live SessionLog holds the session, in this process or another (a reader's
        query: it takes nothing). False for a missing or unreadable session."""
        raise NotImplementedError

    def held_among(self, session_ids: Iterable[str]) -> set[str]:
        """The sessions of `session_ids` that are held (`is_held`), asked together: a listing
        asks for every stored child it lists, so a long batch is asked off the hub."""
        return {session_id for session_id in session_ids if self.is_held(session_id)}

    def clean_temporaries(self, *, dry_run: bool = False) -> builtins.list[str]:
        """Remove what interrupted creates left behind; returns the names (see SessionStore)."""
        return []

    def delete(self, session_id: str) -> None:
        validate_session_id(session_id)
        handle = self._acquire(session_id)
        if handle is None:
            raise SessionBusyError(f"session {session_id} is open")
        try:
            self._remove(session_id)
        finally:
            handle.close()

    # -- shared internals ---------------------------------------------------------------------

    def _decode(self, session_id: str, reader: _Reader, kept: _Keeper) -> tuple[Decoded, LogReplay]:
        """Read, decode and replay a stored log into a keeper: each event replayed as it is
        decoded and kept as its payload (no list of events; `Decoded.events` is empty)."""
        size = reader.size()
        if size >= _THREADPOOL_READ:
            # Reading and decoding a big log is tens of ms of I/O and CPU: off the hub, so
            # greenlets keep running.
            return offload(self._decode_now, session_id, reader, size, kept)
        return self._decode_now(session_id, reader, size, kept)

    def _decode_now(
        self, session_id: str, reader: _Reader, size: int, kept: _Keeper
    ) -> tuple[Decoded, LogReplay]:
        name = self._name(session_id)
        with gc_paused():
            decoded = read_frames(reader.read_at, size, name, sink=kept.start)
        header = decoded.header
        # Corruption anywhere in the file outranks a wrong id, which outranks a broken rule.
        if header.id != session_id:
            raise CorruptSessionError(name, 0, f"header names session {header.id!r}")
        try:
            replay = kept.replay()
        except InvariantError as exc:
            raise InvariantError(exc.seq, f"{name}: {exc.message}") from None
        return decoded, replay

    def _load_locked(
        self, session_id: str, handle: _Handle
    ) -> tuple[LoadedSession, LogReplay, set[str]]:
        """`_decode`, then the repair of a torn or open tail (its events kept too); also the
        shared request headers the log names."""
        kept = _Keeper(handle.size())
        decoded, replay = self._decode(session_id, handle, kept)
        header, _none, good, torn, size = decoded
        torn_bytes = size - good
        closing = closing_events(replay)
        if not torn and not closing:
            return (
                LoadedSession(header, EventView(kept.payloads), repaired=False),
                replay,
                kept.refs,
            )
        now = time.time()
        frames: builtins.list[bytes] = []
        for etype, edata in closing:
            event: Event = {"type": etype, "seq": replay.seq, "time": now, "data": edata}
            replay.feed(event)
            payload = _packb(event)
            frames.append(_frame(payload))
            kept.payloads.add(payload, etype)
        tail = b"".join(frames)
        handle.repair(good, tail, sync=self.durability != "none")
        logger.info(
            "repaired session %s: dropped %d torn bytes, closed %d events",
            session_id,
            torn_bytes,
            len(frames),
        )
        loaded = LoadedSession(
            header, EventView(kept.payloads), repaired=True, torn_bytes=torn_bytes
        )
        return loaded, replay, kept.refs


def _prepare_seed(
    header: SessionHeader, seed: builtins.list[dict[str, Any]], frames: builtins.list[bytes]
) -> tuple[LogReplay, Payloads]:
    """A seed checked (lossless JSON, then the replay under the new header) and encoded once:
    its frames appended to `frames`; returns its replay and the payloads the log keeps."""
    for index, event in enumerate(seed):
        check_json(event.get("data"), where=f"seed[{index}].data")
    try:
        replay = validate_log(seed, header)  # type: ignore[arg-type]
    except InvariantError as exc:
        raise ValueError(f"invalid seed: {exc}") from exc
    if replay.turn_open:
        raise ValueError("invalid seed: it ends inside an open turn")
    # Each event encoded once: its frame is written, its payload kept by the log.
    return replay, encode_payloads(seed, frames)  # type: ignore[arg-type]


def _as_inspected(decoded: Decoded, replay: LogReplay, kept: _Keeper) -> LoadedSession:
    """What `inspect` answers for a log read into `kept`: as stored, nothing repaired."""
    return LoadedSession(
        decoded.header,
        EventView(kept.payloads),
        repaired=False,
        torn_bytes=decoded.size - decoded.good_length,
        needs_repair=decoded.torn or replay.turn_open,
    )


class _Keeper:
    """How `open` reads a log: each event, as it is decoded, is replayed and its payload kept
    (as read: the same msgpack the live log appends), and the dict is dropped; the shared
    request headers named are noted. One decode per event, and no decoded log held.

    The first broken rule is kept, not raised, and the frames are still read to the end: a
    corrupt frame anywhere outranks it, as when the whole file was decoded before the replay.
    """

    __slots__ = ("_error", "_replay", "payloads", "refs")

    def __init__(self, capacity: int) -> None:
        self.payloads = Payloads(capacity)
        self.refs: set[str] = set()
        self._replay: LogReplay | None = None
        self._error: InvariantError | None = None

    def start(self, header: SessionHeader) -> EventSink:
        replay = self._replay = LogReplay(header)
        feed = replay.feed
        add = self.payloads.add
        note_ref = self.refs.add

        def keep(event: Event, payload: memoryview) -> None:
            if self._error is not None:
                return
            try:
                feed(event)
            except InvariantError as exc:
                self._error = exc
                return
            kind = event["type"]
            add(payload, kind)
            if kind == REQUEST_HEADER:
                ref = event["data"].get("ref")
                if ref is not None:
                    note_ref(ref)

        return keep

    def replay(self) -> LogReplay:
        """The replay of every event read; the first rule an event broke raises here."""
        if self._error is not None:
            raise self._error
        if self._replay is None:  # pragma: no cover - read_frames reads the header first
            raise RuntimeError("no header was read")
        return self._replay


class _Reader(Protocol):
    """A session's stored bytes, read a piece at a time (`read_at` may block: for a big file it
    is called in the hub's thread pool)."""

    def size(self) -> int: ...

    def read_at(self, offset: int, size: int, /) -> bytes | bytearray: ...

    def stamp(self) -> Stamp | None:
        """The file's stamp now (None where there is none: the memory store)."""
        ...

    def close(self) -> None: ...


class _Handle:
    """An exclusive hold on one session's bytes; also the SessionLog's sink (and a `_Reader`)."""

    def size(self) -> int:
        raise NotImplementedError

    def read_at(self, offset: int, size: int, /) -> bytes | bytearray:
        raise NotImplementedError

    def repair(self, good_length: int, tail: bytes, sync: bool) -> None:
        raise NotImplementedError

    def stamp(self) -> Stamp | None:
        return None

    def write(self, data: bytes | bytearray) -> None:
        raise NotImplementedError

    def sync(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


# -- directory store -----------------------------------------------------------------------


class _FileHandle(_Handle):
    def __init__(self, fd: int, path: Path, before_sync: Callable[[], None] | None = None) -> None:
        self.fd = fd
        self.path = path
        # Serialises sync/close so a close never lands while a pool thread fsyncs the fd.
        self._lock = gevent.lock.Semaphore()
        # Makes what this log may name (shared request headers) durable before the log is.
        self._before_sync = before_sync

    def size(self) -> int:
        return os.fstat(self.fd).st_size

    def stamp(self) -> Stamp | None:
        return _stamp_of(os.fstat(self.fd))

    def read_at(self, offset: int, size: int, /) -> bytes | bytearray:
        return _pread_at(self.fd, offset, size)

    def repair(self, good_length: int, tail: bytes, sync: bool) -> None:
        with self._lock:
            offload(_truncate_append, self.fd, good_length, tail, sync)

    def write(self, data: bytes | bytearray) -> None:
        if len(data) >= _WRITE_ON_HUB:
            # A big event's frame: the copy into the page cache takes tens of ms.
            with self._lock:
                offload(_write_all, self.fd, data)
            return
        view = memoryview(data)
        while view:
            written = os.write(self.fd, view)
            view = view[written:]

    def sync(self) -> None:
        if self._before_sync is not None:
            self._before_sync()
        with self._lock:
            offload(os.fsync, self.fd)

    def close(self) -> None:
        with self._lock:
            if self.fd >= 0:
                fd, self.fd = self.fd, -1
                os.close(fd)  # also releases the flock


# A log's write of this many bytes or more is made from the hub's thread pool (`_FileHandle`).
_WRITE_ON_HUB = 1 << 20


def _write_all(fd: int, data: bytes | bytearray) -> None:
    with memoryview(data) as view:
        while view:
            view = view[os.write(fd, view) :]


def _pread_at(fd: int, offset: int, size: int) -> bytes | bytearray:
    """`size` bytes from `offset`, fewer only where the file ends: one buffer, never chunks
    joined into a second copy (a short read, rare on a regular file, is finished in place)."""
    data = os.pread(fd, size, offset)
    if len(data) == size or not data:
        return data
    buffer = bytearray(data)
    del data
    while len(buffer) < size:
        more = os.pread(fd, size - len(buffer), offset + len(buffer))
        if not more:
            break
        buffer += more
    return buffer


def _truncate_append(fd: int, good_length: int, tail: bytes, sync: bool) -> None:
    os.ftruncate(fd, good_length)
    view = memoryview(tail)
    while view:
        view = view[os.write(fd, view) :]  # O_APPEND: lands at the new end
    if sync:
        os.fsync(fd)


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise
    _mark_live(fd)
    return True


# `struct flock` for the open-file-description lock calls (Linux: short, short, off_t, off_t,
# pid_t, padded to 32 bytes).
_FLOCK = struct.Struct("hhqqi4x")
_OFD_SETLK: Final = getattr(fcntl, "F_OFD_SETLK", None)
_OFD_GETLK: Final = getattr(fcntl, "F_OFD_GETLK", None)


def _mark_live(fd: int) -> None:
    """Beside the exclusive `flock`, a write lock on byte 0 that other processes can *query*
    without taking anything (F_OFD_GETLK): how `is_held` tells a session live elsewhere
    without a probe that could make a concurrent `open` fail busy. Released with the fd."""
    if _OFD_SETLK is None:
        return
    with contextlib.suppress(OSError):
        fcntl.fcntl(fd, _OFD_SETLK, _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, 0, 1, 0))


def _held(fd: int) -> bool:
    """Whether a live SessionLog (any process) holds the file open on `fd`'s inode."""
    if _OFD_GETLK is not None:
        try:
            answer = fcntl.fcntl(fd, _OFD_GETLK, _FLOCK.pack(fcntl.F_RDLCK, os.SEEK_SET, 0, 1, 0))
        except OSError:
            pass
        else:
            return bool(_FLOCK.unpack(answer)[0] != fcntl.F_UNLCK)
    # No query API: a shared flock probe (it may make a racing `open` see busy, briefly).
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    fcntl.flock(fd, fcntl.LOCK_UN)
    return False


def _not_regular(path: Path) -> str:
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return "not a regular file"
    if stat.S_ISLNK(mode):
        return "not a regular file (a symbolic link; the store never follows links)"
    if stat.S_ISDIR(mode):
        return "not a regular file (a directory)"
    return "not a regular file"


def _fsync_paths(files: list[Path], dirs: list[Path]) -> None:
    for path in files:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    for path in dirs:
        _fsync_dir(path)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class SessionStore(_Store):
    """A directory with one `<id>.session` file per session."""

    persistent = True

    def __init__(
        self, root: str | os.PathLike[str] | None = None, durability: Durability = "turn"
    ) -> None:
        super().__init__(durability)
        self.root = Path(root) if root is not None else default_root()
        self._root_ready = False
        # Shared headers written but not yet fsynced (files, then directories): made durable
        # before any log of this store syncs, so a durable event never names a lost header.
        self._unsynced_headers: builtins.list[Path] = []
        self._unsynced_dirs: builtins.list[Path] = []
        self._headers_lock = gevent.lock.Semaphore()

    def __repr__(self) -> str:
        return f"SessionStore({str(self.root)!r}, durability={self.durability!r})"

    def _path(self, session_id: str) -> Path:
        return self.root / f"{session_id}{SUFFIX}"

    def _name(self, session_id: str) -> str:
        return str(self._path(session_id))

    def exists(self, session_id: str) -> bool:
        """Whether the id is taken: also by an entry that is not a readable session (a
        symlink, a directory), which every read then reports as corrupt."""
        validate_session_id(session_id)
        return os.path.lexists(self._path(session_id))

    def ensure_root(self) -> Path:
        """Create the sessions directory if missing: mode 0700 whatever the umask (its files
        are 0600; a listing of session ids is nobody else's business either)."""
        root = self.root
        if self._root_ready or root.is_dir():
            self._root_ready = True
            return root
        root.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(root, 0o700)
        except FileExistsError:
            pass
        else:
            os.chmod(root, 0o700)  # the umask may have taken bits of our own
        self._root_ready = True
        return root

    def _create_bytes(self, session_id: str, data: bytes | bytearray) -> _Handle:
        self.ensure_root()
        final = self._path(session_id)
        if os.path.lexists(final):
            raise SessionExistsError(f"session {session_id} already exists")
        tmp = self.root / f".{session_id}.{secrets.token_hex(4)}{_TMP_SUFFIX}"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC, 0o600)
        handle = _FileHandle(fd, final, self._sync_shared)
        try:
            os.fchmod(fd, 0o600)  # 0600 whatever the umask took
            _try_lock(fd)
            handle.write(data)
            if self.durability != "none":
                self._sync_shared()  # a seed may name shared headers
                offload(os.fsync, fd)
            try:
                os.link(tmp, final)  # atomic and never clobbers: a reader sees all or nothing
            except FileExistsError:
                raise SessionExistsError(f"session {session_id} already exists") from None
            if self.durability != "none":
                offload(_fsync_dir, self.root)
        except BaseException:
            handle.close()
            raise
        finally:
            tmp.unlink(missing_ok=True)
        return handle

    def _open_fd(self, session_id: str, flags: int) -> int:
        """Open the session file itself: never through a symlink, never a FIFO, device or
        directory that happens to carry a session's name (reported as corrupt)."""
        path = self._path(session_id)
        try:
            fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            raise SessionNotFoundError(session_id) from None
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
                raise CorruptSessionError(str(path), 0, _not_regular(path)) from None
            raise
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise CorruptSessionError(str(path), 0, _not_regular(path))
            if flags != os.O_RDONLY:
                fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _acquire(self, session_id: str) -> _Handle | None:
        fd = self._open_fd(session_id, os.O_RDWR | os.O_APPEND)
        if not _try_lock(fd):
            os.close(fd)
            return None
        return _FileHandle(fd, self._path(session_id), self._sync_shared)

    def _reader(self, session_id: str) -> _Reader:
        fd = self._open_fd(session_id, os.O_RDONLY)  # reading needs read access only
        return _FileHandle(fd, self._path(session_id))

    def _read_header_bytes(self, session_id: str) -> bytes:
        fd = self._open_fd(session_id, os.O_RDONLY)
        try:
            prefix = os.pread(fd, 8, 0)
            if len(prefix) < 8:
                return prefix
            length = int.from_bytes(prefix[:4], "big")
            return prefix + os.pread(fd, min(length, 1 << 20), 8)
        finally:
            os.close(fd)

    def held_among(self, session_ids: Iterable[str]) -> set[str]:
        ids = builtins.list(session_ids)
        if len(ids) > _HELD_ASKED_ON_HUB:
            return offload(self._held_now, ids)
        return self._held_now(ids, False)

    def _held_now(self, session_ids: Iterable[str], in_thread: bool = True) -> set[str]:
        held = set()
        for index, session_id in enumerate(session_ids):
            if self.is_held(session_id):
                held.add(session_id)
            if in_thread and index % 16 == 15:
                time.sleep(0)  # the GIL offered back to the hub (see `_digest_now`)
        return held

    def is_held(self, session_id: str) -> bool:
        validate_session_id(session_id)
        try:
            fd = self._open_fd(session_id, os.O_RDONLY)
        except (SessionNotFoundError, SessionLogError, OSError):
            return False
        try:
            return _held(fd)
        finally:
            os.close(fd)

    def clean_temporaries(self, *, dry_run: bool = False) -> builtins.list[str]:
        """Remove the `.tmp` files interrupted creates left (returns their names).

        A `.tmp` with a second link is a finished create's (the session has the other name):
        removing that name frees nothing yet harms nothing. A lone one is removed only when it
        is older than TMP_GRACE and no process holds it (a create in progress holds its lock).
        Links are never followed; only regular files are touched.
        """
        removed: builtins.list[str] = []
        now = time.time()
        for directory, prefix in ((self.root, ""), (self.root / HEADERS_DIR, f"{HEADERS_DIR}/")):
            try:
                names = os.listdir(directory)
            except (FileNotFoundError, NotADirectoryError):
                continue
            removed.extend(
                prefix + name for name in self._clean_in(directory, sorted(names), now, dry_run)
            )
        return removed

    def _clean_in(
        self, directory: Path, names: builtins.list[str], now: float, dry_run: bool
    ) -> builtins.list[str]:
        removed: builtins.list[str] = []
        for name in names:
            if not (name.startswith(".") and name.endswith(_TMP_SUFFIX)):
                continue
            path = directory / name
            try:
                info = os.lstat(path)
                if not stat.S_ISREG(info.st_mode):
                    continue
                if info.st_nlink < 2 and not self._stale_tmp(path, now - info.st_mtime):
                    continue
                if not dry_run:
                    path.unlink()
            except OSError:  # gone meanwhile, or the store is read-only: nothing to do
                continue
            removed.append(name)
        return removed

    @staticmethod
    def _stale_tmp(path: Path, age: float) -> bool:
        if age < TMP_GRACE:
            return False
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            return not _held(fd)
        finally:
            os.close(fd)

    def _stamped_ids(self) -> Iterable[tuple[str, object]]:
        """Each file's stamp (`Stamp`): a new file (a create, or a session deleted and made
        again under its id) has another inode or times; an append changes the size and times
        too, which costs only a re-read of a live log's header."""
        try:
            entries = list(os.scandir(self.root))
        except FileNotFoundError:
            return []
        out: builtins.list[tuple[str, object]] = []
        for entry in entries:
            name = entry.name
            if not name.endswith(SUFFIX) or name.startswith("."):
                continue
            try:
                session_id = validate_session_id(name[: -len(SUFFIX)])
            except ValueError:
                continue
            try:
                found = entry.stat(follow_symlinks=False)
            except OSError:  # gone since the directory was read: the read says so
                out.append((session_id, None))
                continue
            out.append((session_id, _stamp_of(found)))
        return out

    def _probe(self, session_id: str) -> tuple[Stamp | None, int]:
        stamp = None
        if time.monotonic() - self._stamped_at < _STAMPS_FRESH:
            stamp = self._stamps.get(session_id)
        if stamp is None:
            try:
                found = os.lstat(self._path(session_id))
            except OSError:
                return None, 0
            if not stat.S_ISREG(found.st_mode):
                return None, 0
            stamp = _stamp_of(found)
        seen = cast(Stamp, stamp)
        return seen, seen[1]

    def _ids(self) -> Iterable[str]:
        try:
            names = os.listdir(self.root)
        except FileNotFoundError:
            return []
        out = []
        for name in names:
            if name.endswith(SUFFIX) and not name.startswith("."):
                session_id = name[: -len(SUFFIX)]
                try:
                    out.append(validate_session_id(session_id))
                except ValueError:
                    continue
        return out

    def _remove(self, session_id: str) -> None:
        self._path(session_id).unlink()
        if self.durability != "none":
            offload(_fsync_dir, self.root)

    # -- shared request headers: <root>/headers/<ref>.header ----------------------------------

    def _shared_path(self, ref: str) -> Path:
        return self.root / HEADERS_DIR / f"{ref}{_HEADER_SUFFIX}"

    def _shared_name(self, ref: str) -> str:
        return str(self._shared_path(ref))

    def _has_shared(self, ref: str) -> bool:
        try:
            return stat.S_ISREG(os.lstat(self._shared_path(ref)).st_mode)
        except OSError:
            return False

    def _put_shared(self, ref: str, frame: bytes) -> None:
        """Written (to the page cache) now, complete under its name or not at all; fsynced by
        the next sync of any log of this store, before that log (`_sync_shared`): a process
        kill loses nothing written, and a power loss cannot leave a durable event naming it."""
        self.ensure_root()
        directory = self.root / HEADERS_DIR
        sync = self.durability != "none"
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            pass
        else:
            os.chmod(directory, 0o700)
            if sync:
                self._unsynced_dirs.append(self.root)
        final = self._shared_path(ref)
        tmp = directory / f".{ref}.{secrets.token_hex(4)}{_TMP_SUFFIX}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            try:
                os.fchmod(fd, 0o600)
                view = memoryview(frame)
                while view:
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)
            # Same address, same content: a concurrent writer's file is as good as ours.
            with contextlib.suppress(FileExistsError):
                os.link(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)
        if sync:
            self._unsynced_headers.append(final)
            self._unsynced_dirs.append(directory)

    def collect_headers(self, *, dry_run: bool = False) -> builtins.list[str]:
        """Remove the shared request headers no stored session names (returns their names).

        Only while no session of the store is live anywhere (a live log may be about to name
        one), and only headers older than TMP_GRACE. Reads every session's events."""
        directory = self.root / HEADERS_DIR
        try:
            names = sorted(os.listdir(directory))
        except (FileNotFoundError, NotADirectoryError):
            return []
        ids = builtins.list(self._ids())
        if any(self.is_held(session_id) for session_id in ids):
            return []
        named: set[str] = set()
        for session_id in ids:
            try:
                for event in self.scan(session_id):
                    if event.get("type") == REQUEST_HEADER:
                        ref = event.get("data", {}).get("ref")
                        if isinstance(ref, str):
                            named.add(ref)
            except (SessionLogError, OSError):
                return []  # an unreadable log may name any of them: keep them all
        removed: builtins.list[str] = []
        now = time.time()
        for name in names:
            if not name.endswith(_HEADER_SUFFIX) or name[: -len(_HEADER_SUFFIX)] in named:
                continue
            path = directory / name
            try:
                info = os.lstat(path)
                if not stat.S_ISREG(info.st_mode) or now - info.st_mtime < TMP_GRACE:
                    continue
                if not dry_run:
                    path.unlink()
            except OSError:
                continue
            removed.append(f"{HEADERS_DIR}/{name}")
        return removed

    def _sync_shared(self) -> None:
        """fsync the shared headers written since the last call (files, then directories).
        Serialised: a second log syncing meanwhile waits until the first one's fsync is done."""
        if not self._unsynced_headers and not self._unsynced_dirs:
            return
        with self._headers_lock:
            files, self._unsynced_headers = self._unsynced_headers, []
            dirs, self._unsynced_dirs = self._unsynced_dirs, []
            if files or dirs:
                offload(_fsync_paths, files, list(dict.fromkeys(dirs)))

    def _read_shared(self, ref: str) -> bytes:
        path = self._shared_path(ref)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            raise SharedHeaderMissingError(ref, str(self.root)) from None
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
                raise CorruptSessionError(str(path), 0, _not_regular(path)) from None
            raise
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise CorruptSessionError(str(path), 0, _not_regular(path))
            return bytes(_pread_at(fd, 0, min(info.st_size, MAX_FRAME + FRAME_HEADER_SIZE)))
        finally:
            os.close(fd)


# -- memory store --------------------------------------------------------------------------


class _MemoryFile:
    __slots__ = ("data", "held", "syncs")

    def __init__(self, data: bytes | bytearray) -> None:
        self.data = bytearray(data)
        self.held = False
        self.syncs = 0  # sync points reached, so tests can check durability behaviour


class _MemoryHandle(_Handle):
    def __init__(self, file: _MemoryFile) -> None:
        self.file = file
        file.held = True
        self._open = True
        # `write`, as the file's own bound `extend` (a log writes once a step: no Python frame).
        # `repair` changes `file.data` in place, so the binding stays the file's.
        self.write = file.data.extend  # type: ignore[method-assign,assignment]

    def size(self) -> int:
        return len(self.file.data)

    def read_at(self, offset: int, size: int, /) -> bytes | bytearray:
        return self.file.data[offset : offset + size]  # a copy of this piece alone

    def repair(self, good_length: int, tail: bytes, sync: bool) -> None:
        del self.file.data[good_length:]
        self.file.data += tail
        if sync:
            self.file.syncs += 1

    def write(self, data: bytes | bytearray) -> None:  # replaced per handle (`__init__`)
        self.file.data += data

    def sync(self) -> None:
        self.file.syncs += 1

    def close(self) -> None:
        if self._open:
            self._open = False
            self.file.held = False


class _MemoryReader:
    """An unlocked reader of a memory file: pieces are copied out, so a live log appending to
    the same bytearray meanwhile is never refused for an outstanding view of it."""

    __slots__ = ("file",)

    def __init__(self, file: _MemoryFile) -> None:
        self.file = file

    def size(self) -> int:
        return len(self.file.data)

    def read_at(self, offset: int, size: int, /) -> bytes | bytearray:
        return self.file.data[offset : offset + size]

    def stamp(self) -> Stamp | None:
        return None

    def close(self) -> None:
        pass


class MemoryStore(_Store):
    """The same store, holding each session's file bytes in memory (tests, throwaway runs)."""

    persistent = False

    def __init__(self, durability: Durability = "turn") -> None:
        super().__init__(durability)
        self.files: dict[str, _MemoryFile] = {}
        self.headers: dict[str, bytes] = {}  # shared request headers by address

    def __repr__(self) -> str:
        return f"MemoryStore({len(self.files)} sessions)"

    def _name(self, session_id: str) -> str:
        return f"memory:{session_id}"

    def exists(self, session_id: str) -> bool:
        validate_session_id(session_id)
        return session_id in self.files

    def _file(self, session_id: str) -> _MemoryFile:
        try:
            return self.files[session_id]
        except KeyError:
            raise SessionNotFoundError(session_id) from None

    def _create_bytes(self, session_id: str, data: bytes | bytearray) -> _Handle:
        if session_id in self.files:
            raise SessionExistsError(f"session {session_id} already exists")
        file = self.files[session_id] = _MemoryFile(data)
        return _MemoryHandle(file)

    def is_held(self, session_id: str) -> bool:
        validate_session_id(session_id)
        file = self.files.get(session_id)
        return file is not None and file.held

    def _acquire(self, session_id: str) -> _Handle | None:
        file = self._file(session_id)
        return None if file.held else _MemoryHandle(file)

    def _reader(self, session_id: str) -> _Reader:
        return _MemoryReader(self._file(session_id))

    def _read_header_bytes(self, session_id: str) -> bytes:
        data = self._file(session_id).data
        if len(data) < FRAME_HEADER_SIZE:
            return bytes(data)
        return bytes(data[: FRAME_HEADER_SIZE + int.from_bytes(data[:4], "big")])

    def _ids(self) -> Iterable[str]:
        return list(self.files)

    def _probe(self, session_id: str) -> tuple[Stamp | None, int]:
        file = self.files.get(session_id)
        return None, len(file.data) if file is not None else 0

    def _remove(self, session_id: str) -> None:
        del self.files[session_id]

    def _has_shared(self, ref: str) -> bool:
        return ref in self.headers

    def _put_shared(self, ref: str, frame: bytes) -> None:
        self.headers.setdefault(ref, frame)

    def _read_shared(self, ref: str) -> bytes:
        try:
            return self.headers[ref]
        except KeyError:
            raise SharedHeaderMissingError(ref, repr(self)) from None
