"""Invariant replay of a session log, and the live appendable `SessionLog`.

The replay is incremental (`LogReplay.feed`) so the same rules run at load, on seeds, and at
every append: a bad event fails where it is made, not on the next cold resume.

Rules (docs/durability.md repeats them for readers of the file format):
- seq is contiguous from 0; the envelope is {type: str, seq: int, time: number, data: dict};
- turns are numbered 1, 2, 3, ... with no gap and no nesting; turn/end names the open turn,
  has a known reason and comes only with no open step;
- step/start only inside a turn, steps 1..k contiguous within the turn; in format 1 (header
  version 1) each is closed by a matching step/end before the next step/start or the
  turn/end; format 2 writes no step/end, and a step ends at the next step/start or turn/end;
  format 3 writes no step/start either: a step is opened by its assistant/message (or by a
  step/start, which older writers and seeds still carry) and is over once all its calls are
  answered;
- user/message only inside a turn at a boundary: after turn/start (the prompt), after
  step/start (a steer), or in format 3 after the result that answers a step's last call (a
  steer before the next step's reply); never between a reply and its last result;
- assistant/message and tool/call only inside a step (format 3: inside a turn, where a reply
  with no open step, or after a complete step, opens the next one); call ids are unique
  within a turn;
- a call is opened by the `tool_calls` of its assistant/message (format 2) or by its tool/call
  event (format 1, and seeds copied from such logs; a tool/call naming a call its message
  already opened, with the same name, is that call's format-1 record, not a second call);
- tool/result only inside a turn, pairing an earlier open call of that turn, once per call;
- subagent/descriptor only inside a turn; session/end-seed only outside a turn, with
  `length` equal to its own seq (the number of seeded events before it);
- request/header and inbox/* may appear anywhere; a request/header is `{ref}` (a sha256 hex
  digest naming content its store holds) or, as older logs have it, `{system, tools}`; inbox
  ids are accepted once, then claimed or discarded at most once;
- unknown types are accepted only when `data.ignorable is True`.
A log may end with a turn still open (a live session, or a torn tail before repair).
"""

from __future__ import annotations

import io
import logging
import re
import time
from array import array
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from itertools import accumulate, compress
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol, overload

import gevent
import gevent.lock
import msgpack

from agent import events as ev
from agent.errors import InvariantError
from agent.events import Event, SessionHeader
from agent.frames import MAX_FRAME, _crc32, _frame, _pack_prefix, _packb
from agent.jsoncheck import MAX_DEPTH, check_json, repair_surrogates
from agent.jsoncheck import is_lossless as _is_lossless

_unpackb = msgpack.unpackb
# A shared request header's address: the sha256 of its encoded content (agent.store).
_is_header_ref = re.compile(r"[0-9a-f]{64}").fullmatch
_now = time.time
_type_of = type  # `SessionLog.append` takes a parameter named `type`
# An appended event's payload: `bytes`, or a big event's `bytearray` (`_SlicedEncoder`), which
# nothing writes once it is made.
_Payload = bytes | bytearray
# Exact types only: a tuple, set, subclass (enum) or other object is refused by the encoder
# itself, so a value that skipped the walk still cannot smuggle one in.
_pack_strict = msgpack.Packer(use_bin_type=True, autoreset=True, strict_types=True).pack

__all__ = [
    "Durability",
    "EventView",
    "ForkSeed",
    "InvariantError",
    "LogReplay",
    "Payloads",
    "SessionLog",
    "SharedHeaders",
    "ToolLike",
    "completed_turn_prefix",
    "event_positions",
    "events_of_types",
    "is_plain_reply",
    "request_header_data",
    "validate_log",
]

logger = logging.getLogger("agent")

Durability = Literal["turn", "step", "none"]
DURABILITY_SETTINGS: frozenset[str] = frozenset({"turn", "step", "none"})


# Required data fields per type: (field, exact type, what it must be). Exact types, so a bool
# is not an int; `type(x) is t` keeps this check cheap on every append.
_Field = tuple[str, type, str]
_INT = (int, "an int")
_STR = (str, "a str")
_LIST = (list, "a list")
_DICT = (dict, "a dict")
_BOOL = (bool, "a bool")


def _fields(**checks: tuple[type, str]) -> tuple[_Field, ...]:
    return tuple((name, typ, what) for name, (typ, what) in checks.items())


_REQUIRED: dict[str, tuple[_Field, ...]] = {
    ev.TURN_START: _fields(turn=_INT),
    ev.TURN_END: _fields(turn=_INT, reason=_STR),
    ev.STEP_START: _fields(turn=_INT, step=_INT),
    ev.STEP_END: _fields(turn=_INT, step=_INT),
    ev.USER_MESSAGE: _fields(message=_DICT),
    ev.ASSISTANT_MESSAGE: _fields(message=_DICT, finish=_STR),
    ev.TOOL_CALL: _fields(call_id=_STR, name=_STR, arguments=_DICT),
    ev.TOOL_RESULT: _fields(call_id=_STR, name=_STR, content=_LIST, is_error=_BOOL),
    # Either `{ref}` (a shared header, stored once per distinct content) or, in logs written
    # before shared headers, `{system, tools}` inline: the per-type rule checks which.
    ev.REQUEST_HEADER: (),
    ev.SESSION_END_SEED: _fields(length=_INT),
    ev.SUBAGENT_DESCRIPTOR: _fields(descriptor=_DICT),
    ev.INBOX_ACCEPTED: _fields(message_id=_STR, kind=_STR, content=_LIST, source=_DICT),
    ev.INBOX_CLAIMED: _fields(message_id=_STR),
    ev.INBOX_DISCARDED: _fields(message_id=_STR, reason=_STR),
}
# Events whose required fields are all exact ints or strs, by field count. With no other key
# (same count), the replay's type checks plus the strict encoder (which refuses out-of-range
# ints and lone surrogates) are the whole lossless-JSON check, so append skips the walk.
_FLAT: dict[str, int] = {
    name: len(fields)
    for name, fields in _REQUIRED.items()
    if fields and all(typ in (int, str) for _key, typ, _what in fields)
}
# `{ref}`: one str the rule checks as a hash; a lone `system` or `tools` is refused by the rule.
_FLAT[ev.REQUEST_HEADER] = 1


# The shape checks below answer with a size: -1 for "not of the plain shape, walk it", else an
# estimate of the value's encoded size (a character a byte, `_ITEM` an item), which `append`
# compares with `BIG_EVENT`. One pass does both, so a step's events pay no second walk to learn
# they are small (the size walk alone was ~15 % of a child's instructions, q18's review).
_ITEM: Final = 16


def _text_size(content: object) -> int:
    """The size of `content` when it is a list of plain text blocks
    (`{"type": "text", "text": str}`), else -1."""
    if type(content) is not list:
        return -1
    size = 0
    for block in content:
        if type(block) is not dict or len(block) != 2 or block.get("type") != "text":
            return -1
        text = block.get("text")
        if type(text) is not str:
            return -1
        size += len(text) + _ITEM
    return size


def _plain_tool_result(data: dict[str, Any]) -> int:
    # The replay checks call_id, name, is_error (and code) as exact types; with no other key,
    # plain text content leaves nothing for the walk to find.
    count = len(data)
    if count != 4 and (count != 5 or "code" not in data):
        return -1
    size = _text_size(data.get("content"))
    if size < 0:
        return -1
    for key in ("call_id", "name", "code"):
        value = data.get(key)
        if type(value) is str:
            size += len(value)
    return size + 4 * _ITEM


_INT_MIN = -(2**63)
_INT_MAX = 2**64 - 1


def _flat_size(arguments: dict[Any, Any]) -> int:
    """A tool call's arguments, when flat (the common case), checked without the walk's
    recursion: str keys and scalar values as `check_json` takes them; their size, or -1 for
    "walk it"."""
    size = 0
    for key, value in arguments.items():
        if type(key) is not str:
            return -1
        t = type(value)
        if t is str:
            size += len(key) + len(value) + _ITEM
            continue
        if t is bool or value is None:
            pass
        elif t is int:
            if not _INT_MIN <= value <= _INT_MAX:
                return -1
        elif t is float:
            if value - value != 0.0:  # NaN, +-inf
                return -1
        else:
            return -1  # a container (or anything else): the walk decides
        size += len(key) + _ITEM
    return size


def plain_reply_size(message: object) -> int:
    """The size of an assistant `message` of the loop's shape when it is certainly lossless
    JSON (exact `{id, role, content, tool_calls}` with plain text blocks and calls `{id, name,
    arguments}`), for `SessionLog.append(size=...)`; -1 only means "walk it" (nested arguments
    are walked here; anything else is not)."""
    if type(message) is not dict or len(message) != 4:
        return -1
    message_id = message.get("id")
    if type(message_id) is not str or type(message.get("role")) is not str:
        return -1
    content = message.get("content")
    # A reply with calls often says nothing: an empty list needs no call.
    if type(content) is not list:
        return -1
    size = _text_size(content) if content else 0
    calls = message.get("tool_calls")
    if size < 0 or type(calls) is not list:
        return -1
    size += len(message_id) + 4 * _ITEM
    for call in calls:
        if type(call) is not dict or len(call) != 3:
            return -1
        call_id = call.get("id")
        name = call.get("name")
        arguments = call.get("arguments")
        if type(call_id) is not str or type(name) is not str or type(arguments) is not dict:
            return -1
        flat = _flat_size(arguments)
        if flat < 0:
            # data > message > tool_calls > call > arguments: depth 4 in the event's data.
            if not _is_lossless(arguments, 4):
                return -1
            flat = BIG_EVENT - _budget_left(arguments, BIG_EVENT)
        size += len(call_id) + len(name) + flat + 3 * _ITEM
    return size


def is_plain_reply(message: object) -> bool:
    """Whether an assistant `message` of the loop's shape is certainly lossless JSON
    (`plain_reply_size`); False only means "walk it"."""
    return plain_reply_size(message) >= 0


def _plain_assistant_message(data: dict[str, Any]) -> int:
    size = plain_reply_size(data.get("message"))
    if size < 0:
        return -1
    for key, value in data.items():
        if key != "message" and (type(key) is not str or not _is_lossless(value, 1)):
            return -1
    return size + len(data) * 4 * _ITEM  # usage and cost: a few small numbers


def _str_dict_size(value: object) -> int:
    """The size of `value` when it is a dict of str keys to str values (a message's `source`),
    else -1."""
    if type(value) is not dict:
        return -1
    size = 0
    for key, item in value.items():
        if type(key) is not str or type(item) is not str:
            return -1
        size += len(key) + len(item) + _ITEM
    return size


def _plain_inbox_accepted(data: dict[str, Any]) -> int:
    # A child's first prompt and every steer: text blocks from a source the runtime made.
    message_id = data.get("message_id")
    kind = data.get("kind")
    if len(data) != 4 or type(message_id) is not str or type(kind) is not str:
        return -1
    content = _text_size(data.get("content"))
    source = _str_dict_size(data.get("source"))
    if content < 0 or source < 0:
        return -1
    return content + source + len(message_id) + len(kind) + 4 * _ITEM


def _plain_user_message(data: dict[str, Any]) -> int:
    message = data.get("message")
    if len(data) != 1 or type(message) is not dict or len(message) != 4:
        return -1
    message_id = message.get("id")
    if type(message_id) is not str or type(message.get("role")) is not str:
        return -1
    content = _text_size(message.get("content"))
    source = _str_dict_size(message.get("source"))
    if content < 0 or source < 0:
        return -1
    return content + source + len(message_id) + 5 * _ITEM


# Shape checks for the events a step writes from parts the walk would only re-traverse: a size
# (>= 0) means the full lossless-JSON walk cannot fail, and estimates the event's size; -1 only
# means "walk it".
_PLAIN: dict[str, Callable[[dict[str, Any]], int]] = {
    ev.TOOL_RESULT: _plain_tool_result,
    ev.ASSISTANT_MESSAGE: _plain_assistant_message,
    ev.INBOX_ACCEPTED: _plain_inbox_accepted,
    ev.USER_MESSAGE: _plain_user_message,
}
_OPTIONAL: dict[str, tuple[_Field, ...]] = {
    ev.TURN_END: _fields(message=_STR),
    ev.ASSISTANT_MESSAGE: _fields(usage=_DICT),
    ev.TOOL_RESULT: _fields(code=_STR),
}


_BLOCKS_RULE = "each content block must be a dict with a str 'type' (a text block's 'text' a str)"


def _blocks_ok(content: list[Any]) -> bool:
    """Whether every content block is as the runtime makes them (`check_content`, a tool's
    normalized result, a model adapter's reply): a dict with a str `type`, and a text block's
    `text` a str. A stored log holding other blocks was not written by the runtime: a resume
    would hand them to a model adapter, so the replay refuses them where they are."""
    for block in content:
        if type(block) is not dict:
            return False
        kind = block.get("type")
        if type(kind) is not str or (kind == "text" and type(block.get("text")) is not str):
            return False
    return True


# What the last turn/end left of a replay: (the seq after it, turn, step, replied, the turn's
# calls, how many stayed open).
_Closed = tuple[int, int, int, bool, dict[str, "str | None"], int]


class LogReplay:
    """Incremental invariant checker; `feed` raises InvariantError on the first bad event."""

    __slots__ = (
        "_announce",
        "_boundary",
        "_calls",
        "_closed",
        "_implicit",
        "_inbox",
        "_open",
        "_refs",
        "_replied",
        "seed_length",
        "seq",
        "step",
        "step_open",
        "turn",
        "turn_open",
    )

    def __init__(self, header: SessionHeader | None = None) -> None:
        self.seq = 0  # the seq the next event must carry
        self.turn = 0  # the last turn started
        self.turn_open = False
        self.step = 0  # the last step started in the current turn
        self.step_open = False
        self.seed_length = header.seed_length if header is not None else 0
        # Format 2 (header version 2): an assistant/message's tool_calls open its calls, and
        # no tool/call event is written. Format 1 logs keep their rules exactly.
        self._announce = header is None or header.version >= 2
        # Format 3 (header version 3): no step/start is written either; a step is opened by
        # its reply and is over once its calls are answered (docs/decisions.md, "format 3").
        self._implicit = header is None or header.version >= 3
        self._replied = False  # the open step has its assistant/message
        self._boundary = False  # a user/message is admissible here
        # The calls of the current turn: id -> name while open, None once answered (one dict
        # per child instead of a dict and a set), and how many are open.
        self._calls: dict[str, str | None] = {}
        self._open = 0
        # Inbox ids accepted -> settled (claimed or discarded); made on first use.
        self._inbox: dict[str, bool] | None = None
        # The state the last turn/end left (`_Closed`): a fork's seed ends there, and its
        # replay is this state again, without the prefix decoded (`SessionLog.fork_seed`).
        self._closed: _Closed | None = None
        # Shared request headers named so far: ref -> the seq that first named it.
        self._refs: dict[str, int] | None = None

    @property
    def format(self) -> int:
        """The event format the log is written in: 3 writes a step as its assistant/message
        and results; 2 also writes step/start; 1 also tool/call and step/end
        (docs/decisions.md)."""
        if self._implicit:
            return 3
        return 2 if self._announce else 1

    @property
    def open_calls(self) -> dict[str, str]:
        """Tool calls of the open turn that have no result yet (id -> name), in call order."""
        if not self._open:
            return {}
        return {k: v for k, v in self._calls.items() if v is not None}

    @property
    def last_closed(self) -> _Closed | None:
        """What the last turn/end left (None before one): the end of a completed prefix."""
        return self._closed

    def inbox_state(self) -> dict[str, bool]:
        """A copy of the inbox ids accepted so far -> whether each is settled."""
        return dict(self._inbox) if self._inbox else {}

    def refs_named(self) -> dict[str, int]:
        """The shared request headers named so far -> the seq that first named each."""
        return dict(self._refs) if self._refs else {}

    @classmethod
    def after_closed(
        cls,
        header: SessionHeader,
        closed: _Closed,
        inbox: Mapping[str, bool],
        refs: Mapping[str, int],
    ) -> LogReplay:
        """The replay of a prefix that ends with a turn/end, under `header`, from what that
        turn/end left (`last_closed`) and the inbox and shared headers of the prefix: the state
        feeding the prefix again would give, every field of it (`tests/test_fork_seed.py`).

        Sound only where the prefix was replayed under the same format (the header's version)
        and its replay did not depend on the seed length: a longer seed only relaxes a reused
        call id (seeds copied from format 1) and admits an ancestor's seed marker, both already
        admitted for the events that were accepted."""
        replay = cls(header)
        seq, turn, step, replied, calls, open_calls = closed
        replay.seq = seq
        replay.turn = turn
        replay.step = step
        replay._replied = replied
        replay._calls = calls = dict(calls)
        replay._open = open_calls
        replay._inbox = dict(inbox) if inbox else None
        replay._refs = dict(refs) if refs else None
        replay._closed = (seq, turn, step, replied, calls, open_calls)
        return replay

    def feed(self, event: Event) -> None:
        seq = self.seq
        if type(event) is not dict:
            raise InvariantError(seq, f"event is a {type(event).__name__}, not a dict")
        if event.get("seq") != seq or type(event.get("seq")) is not int:
            raise InvariantError(seq, f"seq {event.get('seq')!r} where {seq} was expected")
        if type(event.get("time")) not in (float, int):
            raise InvariantError(seq, "time must be a number")
        self.feed_next(event.get("type"), event.get("data"))

    def feed_next(self, etype: object, data: object) -> None:
        """`feed` for an envelope the caller built itself: seq is `self.seq`, time a float.

        `SessionLog.append` makes the envelope, so re-checking its seq and time there is waste;
        everything about the type and the data is checked here, the same as at load.
        """
        seq = self.seq
        if type(etype) is not str:
            raise InvariantError(seq, "type must be a str")
        if type(data) is not dict:
            raise InvariantError(seq, "data must be a dict")
        rules = _RULES.get(etype)
        if rules is None:
            if data.get("ignorable") is not True:
                raise InvariantError(seq, f"unknown event type {etype!r} (not marked ignorable)")
            self.seq = seq + 1
            return
        fields_ok, handler = rules
        if fields_ok is not None and not fields_ok(data):
            _refuse_fields(seq, etype, data)
        handler(self, seq, data)
        self.seq = seq + 1
        if seq + 1 == self.seed_length and self.turn_open:
            raise InvariantError(seq, "the seed ends inside an open turn")

    # -- per type -------------------------------------------------------------------------

    def _turn_start(self, seq: int, data: dict[str, Any]) -> None:
        if self.turn_open:
            raise InvariantError(seq, f"turn/start while turn {self.turn} is open")
        if data["turn"] != self.turn + 1:
            raise InvariantError(seq, f"turn {data['turn']} follows turn {self.turn}")
        self.turn += 1
        self.turn_open = True
        self.step = 0
        self._replied = False
        self._boundary = True
        self._calls = {}
        self._open = 0

    def _turn_end(self, seq: int, data: dict[str, Any]) -> None:
        if not self.turn_open:
            raise InvariantError(seq, "turn/end with no open turn")
        if data["turn"] != self.turn:
            raise InvariantError(seq, f"turn/end names turn {data['turn']}, open is {self.turn}")
        if self.step_open and not self._announce:
            raise InvariantError(seq, f"turn/end while step {self.step} is open")
        if data["reason"] not in ev.TURN_END_REASONS:
            raise InvariantError(seq, f"unknown turn/end reason {data['reason']!r}")
        self.turn_open = False
        self.step_open = False  # ends the last step (format 2 writes no step/end)
        self._boundary = False
        # Nothing of the turn changes once it is closed (a turn/start makes a new `_calls`).
        self._closed = (seq + 1, self.turn, self.step, self._replied, self._calls, self._open)

    def _step_start(self, seq: int, data: dict[str, Any]) -> None:
        if not self.turn_open:
            raise InvariantError(seq, "step/start outside a turn")
        if self.step_open and not self._announce:
            raise InvariantError(seq, f"step/start while step {self.step} is open")
        # (Format 2 writes no step/end: an open step ends here.)
        if data["turn"] != self.turn or data["step"] != self.step + 1:
            raise InvariantError(
                seq,
                f"step/start {data['turn']}.{data['step']} where "
                f"{self.turn}.{self.step + 1} was expected",
            )
        self.step += 1
        self.step_open = True
        self._replied = False
        self._boundary = True

    def _step_end(self, seq: int, data: dict[str, Any]) -> None:
        if not self.step_open:
            raise InvariantError(seq, "step/end with no open step")
        if data["turn"] != self.turn or data["step"] != self.step:
            raise InvariantError(
                seq, f"step/end {data['turn']}.{data['step']} closes {self.turn}.{self.step}"
            )
        self.step_open = False
        self._boundary = False

    def _user_message(self, seq: int, data: dict[str, Any]) -> None:
        if not self.turn_open:
            raise InvariantError(seq, "user/message outside a turn")
        if not self._boundary:
            raise InvariantError(
                seq,
                "user/message only right after turn/start or step/start"
                + (", or once a step's calls are answered" if self._implicit else ""),
            )
        message = data["message"]
        if message.get("role") != "user" or type(message.get("content")) is not list:
            raise InvariantError(seq, "user/message needs role 'user' and a content list")
        if not _blocks_ok(message["content"]):
            raise InvariantError(seq, f"user/message: {_BLOCKS_RULE}")

    def _assistant_message(self, seq: int, data: dict[str, Any]) -> None:
        if self._implicit and (not self.step_open or (self._replied and not self._open)):
            # Format 3: the reply opens its step (no step/start is written).
            if not self.turn_open:
                raise InvariantError(seq, "assistant/message outside a turn")
            self.step += 1
            self.step_open = True
        elif not self.step_open:
            raise InvariantError(seq, "assistant/message outside a step")
        self._replied = True
        message = data["message"]
        if message.get("role") != "assistant" or type(message.get("content")) is not list:
            raise InvariantError(seq, "assistant/message needs role 'assistant' and a content list")
        if not _blocks_ok(message["content"]):
            raise InvariantError(seq, f"assistant/message: {_BLOCKS_RULE}")
        self._boundary = False
        calls = message.get("tool_calls")
        if calls is None:
            return
        if type(calls) is not list:
            raise InvariantError(seq, "assistant/message tool_calls must be a list")
        if not calls or not self._announce:
            return
        # Format 2 and 3: the reply's calls are opened here.
        turn_calls = self._calls
        for call in calls:
            if type(call) is not dict:
                raise InvariantError(seq, "assistant/message tool_calls entries must be dicts")
            call_id = call.get("id")
            name = call.get("name")
            if type(call_id) is not str or type(name) is not str:
                raise InvariantError(seq, "assistant/message: a tool call needs a str id and name")
            if call_id in turn_calls:  # open, or answered earlier in the turn
                if seq < self.seed_length:
                    # A seed copied from a format-1 log, where only the tool/call events
                    # opened calls and a repeated id in a reply was refused there: skip it.
                    continue
                raise InvariantError(
                    seq, f"tool call id {call_id!r} repeats within turn {self.turn}"
                )
            turn_calls[call_id] = name
            self._open += 1

    def _tool_call(self, seq: int, data: dict[str, Any]) -> None:
        if not self.step_open:
            raise InvariantError(seq, "tool/call outside a step")
        call_id = data["call_id"]
        if self._announce and self._calls.get(call_id) == data["name"]:
            # The format-1 record of a call its assistant/message opened (a seed, an old log).
            self._boundary = False
            return
        if call_id in self._calls:
            raise InvariantError(seq, f"tool/call id {call_id!r} repeats within turn {self.turn}")
        self._calls[call_id] = data["name"]
        self._open += 1
        self._boundary = False

    def _tool_result(self, seq: int, data: dict[str, Any]) -> None:
        if not self.turn_open:
            raise InvariantError(seq, "tool/result outside a turn")
        call_id = data["call_id"]
        calls = self._calls
        if call_id not in calls:
            raise InvariantError(seq, f"tool/result for unknown call {call_id!r} in this turn")
        if calls[call_id] is None:
            raise InvariantError(seq, f"second tool/result for call {call_id!r}")
        if not _blocks_ok(data["content"]):
            raise InvariantError(seq, f"tool/result: {_BLOCKS_RULE}")
        calls[call_id] = None
        self._open -= 1
        # Format 3: the step's last answer is its end, and a steer may be logged after it.
        self._boundary = self._implicit and not self._open and self._replied

    def _request_header(self, seq: int, data: dict[str, Any]) -> None:
        if "ref" in data:
            ref = data["ref"]
            if type(ref) is not str or not _is_header_ref(ref):
                raise InvariantError(seq, "request/header: ref must be a sha256 hex digest")
            if "system" in data or "tools" in data:
                raise InvariantError(seq, "request/header: a ref or system and tools, not both")
            refs = self._refs
            if refs is None:
                refs = self._refs = {}
            refs.setdefault(ref, seq)
            return
        if type(data.get("system")) is not str:
            raise InvariantError(seq, "request/header: system must be a str")
        if type(data.get("tools")) is not list:
            raise InvariantError(seq, "request/header: tools must be a list")

    def _session_end_seed(self, seq: int, data: dict[str, Any]) -> None:
        if self.turn_open:
            raise InvariantError(seq, "session/end-seed inside a turn")
        if data["length"] != seq:
            raise InvariantError(seq, f"session/end-seed length {data['length']} at seq {seq}")
        # A marker inside the seed is an ancestor's (a fork of a fork): it names its own seed.
        if self.seed_length and seq >= self.seed_length and data["length"] != self.seed_length:
            raise InvariantError(
                seq, f"session/end-seed length {data['length']}, header says {self.seed_length}"
            )

    def _subagent_descriptor(self, seq: int, data: dict[str, Any]) -> None:
        if not self.turn_open:
            raise InvariantError(seq, "subagent/descriptor outside a turn")

    def _inbox_accepted(self, seq: int, data: dict[str, Any]) -> None:
        if data["kind"] not in ("send", "steer"):
            raise InvariantError(seq, f"inbox/accepted kind {data['kind']!r}")
        inbox = self._inbox
        if inbox is None:
            inbox = self._inbox = {}
        if data["message_id"] in inbox:
            raise InvariantError(seq, f"inbox message {data['message_id']!r} accepted twice")
        inbox[data["message_id"]] = False

    def _inbox_settle(self, seq: int, data: dict[str, Any], what: str) -> None:
        message_id = data["message_id"]
        inbox = self._inbox
        if inbox is None or message_id not in inbox:
            raise InvariantError(seq, f"inbox/{what} of a message never accepted: {message_id!r}")
        if inbox[message_id]:
            raise InvariantError(seq, f"inbox message {message_id!r} settled twice")
        inbox[message_id] = True

    def _inbox_claimed(self, seq: int, data: dict[str, Any]) -> None:
        self._inbox_settle(seq, data, "claimed")

    def _inbox_discarded(self, seq: int, data: dict[str, Any]) -> None:
        self._inbox_settle(seq, data, "discarded")


_HANDLERS: dict[str, Callable[[LogReplay, int, dict[str, Any]], None]] = {
    name: getattr(LogReplay, "_" + name.replace("/", "_").replace("-", "_"))
    for name in ev.EVENT_TYPES
}


def _fields_check(
    required: tuple[_Field, ...], optional: tuple[_Field, ...]
) -> Callable[[dict[str, Any]], bool] | None:
    """A type's field rules as one straight-line test (the replay runs it on every append, so
    no loop over the rules): True when each required field has its exact type and each
    optional one present has. None for a type with no field rules. Written as source, the way
    `dataclasses` writes an `__init__`; `_refuse_fields` names the first field that fails."""
    if not required and not optional:
        return None
    namespace: dict[str, Any] = {}
    terms = []
    for i, (key, typ, _what) in enumerate(required):
        namespace[f"_r{i}"] = typ
        terms.append(f"type(data.get({key!r})) is _r{i}")
    for i, (key, typ, _what) in enumerate(optional):
        namespace[f"_o{i}"] = typ
        terms.append(f"({key!r} not in data or type(data[{key!r}]) is _o{i})")
    exec("def check(data):\n    return " + " and ".join(terms) + "\n", namespace)
    check: Callable[[dict[str, Any]], bool] = namespace["check"]
    return check


def _refuse_fields(seq: int, etype: str, data: dict[str, Any]) -> None:
    """Raise for the first field of `data` that breaks its type's rules (required, then
    optional, in their order)."""
    for key, typ, what in _REQUIRED[etype]:
        if type(data.get(key)) is not typ:
            raise InvariantError(seq, f"{etype}: {key} must be {what}")
    for key, typ, what in _OPTIONAL.get(etype, ()):
        if key in data and type(data[key]) is not typ:
            raise InvariantError(seq, f"{etype}: {key} must be {what}")
    raise InvariantError(seq, f"{etype}: a field breaks its rule")  # pragma: no cover


# One lookup per event: (the field rules' test, the per-type state rule).
_RULES: dict[
    str,
    tuple[
        Callable[[dict[str, Any]], bool] | None,
        Callable[[LogReplay, int, dict[str, Any]], None],
    ],
] = {
    name: (_fields_check(_REQUIRED[name], _OPTIONAL.get(name, ())), _HANDLERS[name])
    for name in _REQUIRED
}


def validate_log(events: Iterable[Event], header: SessionHeader | None = None) -> LogReplay:
    """Replay every invariant over `events`; returns the final state (open turn, calls)."""
    replay = LogReplay(header)
    feed = replay.feed
    for event in events:
        feed(event)
    return replay


def completed_turn_prefix(events: Sequence[Event]) -> list[Event]:
    """Events 0..the last turn/end inclusive: the balanced prefix a fork seeds from."""
    for index in range(len(events) - 1, -1, -1):
        if events[index]["type"] == ev.TURN_END:
            return list(events[: index + 1])
    return []


def closing_events(replay: LogReplay) -> list[tuple[str, dict[str, Any]]]:
    """The synthetic events that close an open tail turn as `interrupted` (used by repair)."""
    if not replay.turn_open:
        return []
    out: list[tuple[str, dict[str, Any]]] = []
    for call_id, name in replay.open_calls.items():
        out.append(
            (
                ev.TOOL_RESULT,
                {
                    "call_id": call_id,
                    "name": name,
                    "content": [
                        {
                            "type": "text",
                            "text": "interrupted: the session ended before this tool call returned",
                        }
                    ],
                    "is_error": True,
                    "code": "INTERRUPTED",
                },
            )
        )
    if replay.step_open and replay.format == 1:
        out.append((ev.STEP_END, {"turn": replay.turn, "step": replay.step}))
    out.append(
        (
            ev.TURN_END,
            {
                "turn": replay.turn,
                "reason": "interrupted",
                "message": "the session log ended inside this turn; closed on load",
            },
        )
    )
    return out


class ToolLike(Protocol):
    """What a request header records of a tool (`agent.model.ToolSpec`)."""

    @property
    def name(self) -> str: ...

    @property
    def description(self) -> str: ...

    @property
    def parameters(self) -> object: ...


class SharedHeaders(Protocol):
    """Where a log's request headers are kept once per distinct content (its store): returns
    the content's address, durable before it returns."""

    def request_header_ref(self, system: str, tools: Sequence[ToolLike]) -> str: ...


def request_header_data(system: str, tools: Sequence[ToolLike]) -> dict[str, Any]:
    """The content of a request header: the system prompt and the tools as the model sees them."""
    return {
        "system": system,
        "tools": [
            {"name": t.name, "description": t.description, "parameters": t.parameters}
            for t in tools
        ],
    }


class LogSink(Protocol):
    """Where a SessionLog's frames go (a file, or a MemoryStore buffer)."""

    def write(self, data: bytes | bytearray) -> None: ...

    def sync(self) -> None: ...

    def close(self) -> None: ...


# One code per known event type (0 for any other), so a view finds the events of a type among
# those it was built with without decoding them. In memory only: never written.
_KIND_NAMES: tuple[str, ...] = ("", *sorted(ev.EVENT_TYPES))
_KIND_OF: dict[str, int] = {name: code for code, name in enumerate(_KIND_NAMES) if name}
_OTHER = 0
_NO_BYTES = memoryview(b"")
_NO_ENDS = array("I")
_NO_KINDS = b""


# The first bytes of a payload `SessionLog.append` encoded, per known type: a fixmap of four
# whose first key is "type", then the type's name (every name is under 32 bytes: a fixstr).
_HEADS: dict[bytes, int] = {
    b"\x84\xa4type" + msgpack.packb(name): code for name, code in _KIND_OF.items()
}
_ENVELOPE_HEAD = b"\x84\xa4type"


def _leading_type(payload: bytes | bytearray | memoryview) -> str | None:
    """The type of an event payload that starts as the log encodes one (a map of four whose
    first key is "type" and whose value is a str), read from those bytes alone; None when it
    starts otherwise (then decode it)."""
    if payload[:6] != _ENVELOPE_HEAD or len(payload) < 7:
        return None
    marker = payload[6]
    if 0xA0 <= marker <= 0xBF:  # fixstr
        start, size = 7, marker & 0x1F
    elif marker == 0xD9 and len(payload) >= 8:  # str 8
        start, size = 8, payload[7]
    elif marker == 0xDA and len(payload) >= 9:  # str 16
        start, size = 9, int.from_bytes(payload[7:9], "big")
    else:
        return None
    if len(payload) < start + size:
        return None
    try:
        return bytes(payload[start : start + size]).decode("utf-8")
    except UnicodeDecodeError:
        return None


_INBOX_CODES = frozenset(
    _KIND_OF[name] for name in (ev.INBOX_ACCEPTED, ev.INBOX_CLAIMED, ev.INBOX_DISCARDED)
)


def kind_code(kind: str) -> int:
    """The in-memory type code of an event type (0 for a type outside the vocabulary)."""
    return _KIND_OF.get(kind, _OTHER)


class Payloads:
    """The events a view starts with (a loaded log, a fork's seed), gathered as the msgpack
    payloads they were read or encoded as: end to end in one buffer, with where each ends and
    its type's code. Nothing per event is a Python object: the collector never sees them, and
    the memory is the payloads' bytes plus 5 bytes an event (a frame's prefix is 8).

    `add` each payload in order, then hand this to one `EventView`, which takes it over.
    `capacity`, when known, is about the payloads' total size (a file's size will do): the
    buffer is allocated once instead of grown.
    """

    __slots__ = ("_buffer", "_ends", "_kinds", "_tell", "_write")

    def __init__(self, capacity: int = 0) -> None:
        # Written over zeros allocated at once (calloc: pages untouched until written), so the
        # buffer does not grow by copies; `take` trims it to what was written.
        self._buffer: io.BytesIO | None = io.BytesIO(bytes(max(capacity, 0)))
        self._write = self._buffer.write
        self._tell = self._buffer.tell
        self._ends = array("I")  # 4 bytes an event; 8 past 4 GiB of payloads
        self._kinds = bytearray()

    def __len__(self) -> int:
        return len(self._ends)

    def add(self, payload: bytes | bytearray | memoryview, kind: object) -> None:
        """Keep one event's payload (copied); `kind` is its type."""
        self._write(payload)
        end = self._tell()
        try:
            self._ends.append(end)
        except OverflowError:
            self._ends = array("Q", self._ends)
            self._ends.append(end)
        self._kinds.append(_KIND_OF.get(kind, _OTHER) if _type_of(kind) is str else _OTHER)

    def extend(
        self, payloads: bytes | memoryview, ends: array[int], kinds: bytes | bytearray
    ) -> None:
        """Keep a run of payloads at once: `payloads` end to end, `ends` where each ends in
        it, `kinds` their type codes (as a view holds them; a fork's seed copies its parent's)."""
        base = self._tell()
        self._write(payloads)
        mine = self._ends
        if base or ends.typecode != mine.typecode:
            try:
                ends = array(mine.typecode, [end + base for end in ends])
            except OverflowError:
                mine = self._ends = array("Q", mine)
                ends = array("Q", [end + base for end in ends])
        mine.extend(ends)  # the same typecode: one copy in C
        self._kinds += kinds

    def take(self) -> tuple[memoryview, array[int], bytes | bytearray]:
        """(payloads end to end, end offsets, type codes); the builder is spent."""
        buffer = self._buffer
        if buffer is None:
            raise ValueError("these payloads were already taken by a view")
        self._buffer = None
        buffer.truncate()  # what was written, not the capacity
        # The buffer's own bytes, trimmed to size, not a copy (BytesIO shares them when no
        # view of it is out), then released by the builder.
        data = buffer.getvalue()
        buffer.close()
        return memoryview(data), self._ends, self._kinds


def _in_range(index: int, size: int) -> int:
    """`index` of a sequence of `size` events, a negative one counted from the end."""
    if index < 0:
        index += size
    if not 0 <= index < size:
        raise IndexError("event index out of range")
    return index


def _decoded(blob: memoryview, ends: array[int], tail: Sequence[_Payload], index: int) -> Event:
    """A fresh copy of event `index` of payloads kept as one run (`blob`, cut at `ends`), then
    one by one (`tail`): an `EventView`'s, a `ForkSeed`'s."""
    if index < len(ends):
        event: Event = _unpackb(blob[ends[index - 1] if index else 0 : ends[index]])
    else:
        event = _unpackb(tail[index - len(ends)])
    return event


def _all_decoded(blob: memoryview, ends: array[int], tail: Sequence[_Payload]) -> Iterator[Event]:
    """A fresh copy of each event of such payloads, in order."""
    start = 0
    for end in ends:
        yield _unpackb(blob[start:end])
        start = end
    for payload in tail:
        yield _unpackb(payload)


# The payloads of a view's first events: those it was built with (end to end, where each ends,
# their type codes), then those appended since (one each, their type codes).
_Runs = tuple[memoryview, "array[int]", bytes | bytearray, list[_Payload], bytes | bytearray]


class _PayloadEvents(Sequence[Event]):
    """Events kept as msgpack payloads, one run (`_blob`, cut at `_ends`) then one by one
    (`_payloads`), read as fresh copies: what an `EventView` and a `ForkSeed` share."""

    __slots__ = ()
    _blob: memoryview
    _ends: array[int]
    _payloads: Sequence[bytes | bytearray]

    @overload
    def __getitem__(self, index: int) -> Event: ...

    @overload
    def __getitem__(self, index: slice) -> list[Event]: ...

    def __getitem__(self, index: int | slice) -> Event | list[Event]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        return _decoded(self._blob, self._ends, self._payloads, _in_range(index, len(self)))

    def __iter__(self) -> Iterator[Event]:
        return _all_decoded(self._blob, self._ends, self._payloads)


class EventView(_PayloadEvents):
    """A session's events, kept as their encoded payloads and decoded on access.

    A live child holds its whole log in memory. As dicts and lists that is several objects per
    event for the cyclic collector to rescan on every full collection, for the child's whole
    life, and about twice the file (six times for small events); as bytes it is none, and
    about the file's size. The events it is built with (`Payloads`: a resumed log as read, a
    fork's seed) sit in one buffer; those appended later are the payloads the log encoded for
    their frames. Each access decodes a fresh copy: the log never hands out its own state.
    """

    __slots__ = ("_blob", "_ends", "_kinds", "_loaded", "_payloads", "_tail_kinds")

    def __init__(self, loaded: Payloads | None = None) -> None:
        self._payloads: list[bytes | bytearray] = []
        # The type codes of the first `_payloads`, found when first asked for (`_coded`).
        self._tail_kinds = bytearray()
        self._kinds: bytes | bytearray
        if loaded is None:  # a new child's: shared empty parts, nothing made
            self._blob = _NO_BYTES
            self._ends = _NO_ENDS
            self._kinds = _NO_KINDS
            self._loaded = 0
        else:
            self._blob, self._ends, self._kinds = loaded.take()
            self._loaded = len(self._ends)

    def __len__(self) -> int:
        return self._loaded + len(self._payloads)

    def positions(self, types: Collection[str], start: int = 0) -> array[int]:
        """The indexes of the events of `types`, from `start` on, in order, found by their
        type codes: those the view was built with by the codes they were kept with, those
        appended since by the codes their payloads' first bytes give (`_coded`). Decodes
        nothing: a type outside the known vocabulary, when `types` names one, is read from the
        payload's first bytes too (decoded only where a payload does not start as the log
        encodes events, which another writer's file may)."""
        loaded = self._loaded
        size = loaded + len(self._payloads)
        found = array("q")
        if start < 0:
            start = 0
        if start >= size:
            return found
        codes = bytearray(256)
        unknown = False
        for name in types:
            code = _KIND_OF.get(name, _OTHER)
            codes[code] = 1
            unknown = unknown or code == _OTHER
        if start < loaded:
            self._pick(found, self._kinds, start, loaded, 0, codes, unknown, types)
        if size > loaded:
            tail = self._coded(size - loaded)
            self._pick(found, tail, max(start, loaded), size, loaded, codes, unknown, types)
        return found

    def _pick(
        self,
        found: array[int],
        kinds: bytes | bytearray,
        start: int,
        stop: int,
        base: int,
        codes: bytearray,
        unknown: bool,
        types: Collection[str],
    ) -> None:
        """Append to `found` the indexes `start..stop` whose code (`kinds[index - base]`) is
        picked by `codes`; an event of a type outside the vocabulary is told by its name."""
        picked = compress(range(start, stop), kinds[start - base : stop - base].translate(codes))
        if not unknown:
            found.extend(picked)
            return
        for index in picked:
            if kinds[index - base] != _OTHER or self._type_name(index) in types:
                found.append(index)

    def _type_name(self, index: int) -> object:
        """Event `index`'s type, read from its payload's first bytes where it starts as the log
        encodes an event (`{"type": ..., ...}`), else decoded."""
        loaded = self._loaded
        if index < loaded:
            ends = self._ends
            payload: _Payload | memoryview = self._blob[
                ends[index - 1] if index else 0 : ends[index]
            ]
        else:
            payload = self._payloads[index - loaded]
        name = _leading_type(payload)
        if name is None:
            kind: object = _unpackb(payload).get("type")
            return kind
        return name

    def select(self, types: Collection[str], start: int = 0) -> Iterator[Event]:
        """Fresh copies of the events of `types` from `start` on (`positions`): a scan for a
        few types decodes only those events."""
        blob = self._blob
        ends = self._ends
        loaded = self._loaded
        payloads = self._payloads
        for index in self.positions(types, start):
            if index < loaded:
                yield _unpackb(blob[ends[index - 1] if index else 0 : ends[index]])
            else:
                yield _unpackb(payloads[index - loaded])

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (EventView, list, tuple)):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<EventView of {len(self)} events>"

    @property
    def append_payload(self) -> Callable[[bytes | bytearray], None]:
        """The bound `append` of the frame list (the log's hot path calls it directly)."""
        return self._payloads.append

    def codes(self, start: int) -> bytes | bytearray:
        """The type codes (`kind_code`) of the events from index `start` on, decoding none
        of a known type (`_coded`)."""
        loaded = self._loaded
        tail = self._coded(len(self._payloads))
        if start >= loaded:
            return tail[start - loaded :]
        return self._kinds[start:loaded] + tail

    def _coded(self, count: int) -> bytearray:
        """The type codes of the first `count` appended events, each found once (then kept)
        from its payload's first bytes: `SessionLog.append` encodes `{"type": ..., "seq": ...}`
        in that order, so a known type's payload starts with its `_HEADS` entry, and one that
        starts as an envelope but with no entry is of a type outside the vocabulary. Nothing is
        kept per append (the step's hot path stays as it is; most logs are never asked), and
        nothing is decoded but a payload that does not start as an envelope (none the log
        appends)."""
        kinds = self._tail_kinds
        if len(kinds) < count:
            heads = _HEADS
            for payload in self._payloads[len(kinds) : count]:
                code = heads.get(bytes(payload[: 7 + (payload[6] & 0x1F)]))  # bytes: hashable
                if code is None:
                    kind = _leading_type(payload)
                    if kind is None:
                        kind = _unpackb(payload).get("type")
                    code = _KIND_OF.get(kind, _OTHER) if _type_of(kind) is str else _OTHER
                kinds.append(code)
        return kinds

    def runs(self, count: int) -> _Runs:
        """The first `count` events as payloads, decoding none: those the view was built with
        (their bytes end to end, where each ends, their type codes), then those appended since
        (one `bytes` each, their type codes). Copies of the parts, none of the bytes."""
        if not 0 <= count <= len(self):
            raise IndexError("event count out of range")
        loaded = min(count, self._loaded)
        appended = count - loaded
        ends = self._ends[:loaded]
        blob = self._blob[: ends[-1] if loaded else 0]
        return (
            blob,
            ends,
            self._kinds[:loaded],
            self._payloads[:appended],
            self._coded(appended)[:appended],
        )


class ForkSeed(_PayloadEvents):
    """A live log's completed-turn prefix kept as its payloads (`SessionLog.fork_seed`), with
    the replay state at its end: what a fork's child is created with, so the store copies the
    bytes into the child's `Payloads` and writes its frames from them, decoding, checking and
    encoding nothing again. The events were checked when the parent's log took them.

    As a sequence it reads as the events (each decoded on access), so a caller that does not
    know it gets what a list of them would give."""

    __slots__ = (
        "_blob",
        "_closed",
        "_ends",
        "_inbox",
        "_kinds",
        "_payloads",
        "_refs",
        "_tail_kinds",
        "version",
    )

    def __init__(
        self,
        version: int,
        runs: _Runs,
        closed: _Closed,
        inbox: Mapping[str, bool],
        refs: Mapping[str, int],
    ) -> None:
        self._blob, self._ends, self._kinds, self._payloads, self._tail_kinds = runs
        if len(self._ends) + len(self._payloads) != closed[0]:
            raise ValueError("a fork seed's payloads and its replay state disagree")
        self.version = version  # the format the prefix was replayed under
        self._closed = closed
        self._inbox = inbox
        self._refs = refs

    def __len__(self) -> int:
        return self._closed[0]

    def __repr__(self) -> str:
        return f"<ForkSeed of {len(self)} events>"

    @property
    def size(self) -> int:
        """The payloads' total bytes."""
        return len(self._blob) + sum(map(len, self._payloads))

    @property
    def refs(self) -> frozenset[str]:
        """The shared request headers the prefix names."""
        return frozenset(self._refs)

    def fits(self, header: SessionHeader) -> bool:
        """Whether a child with `header` may start from this seed's state as it is: the same
        event format as the parent's (another one is replayed from the events instead), and a
        `seed_length` that is this seed's or left to the store (0)."""
        return header.version == self.version and header.seed_length in (0, len(self))

    def replay_for(self, header: SessionHeader) -> LogReplay:
        """The child's replay, positioned after the seed (`LogReplay.after_closed`)."""
        if not self.fits(header) or header.seed_length != len(self):
            raise ValueError("this fork seed does not fit the header")
        return LogReplay.after_closed(header, self._closed, self._inbox, self._refs)

    def write(self, head: bytes) -> tuple[bytearray, Payloads]:
        """The child's file (`head`, then one frame per event from its payload as it is) and
        the payloads its view keeps: each event's bytes copied, none decoded or encoded. Reads
        only immutable bytes, so it may run in a pool thread."""
        blob, ends, tail = self._blob, self._ends, self._payloads
        size = self.size
        out = bytearray(head)
        prefix, crc = _pack_prefix, _crc32
        start = 0
        for end in ends:
            payload = blob[start:end]
            out += prefix(end - start, crc(payload))
            out += payload
            start = end
        for piece in tail:
            out += prefix(len(piece), crc(piece))
            out += piece
        payloads = Payloads(size)
        payloads.extend(blob, ends, self._kinds)
        if tail:
            payloads.extend(
                b"".join(tail), array("Q", accumulate(map(len, tail))), self._tail_kinds
            )
        return out, payloads


def event_positions(
    events: Sequence[Mapping[str, Any]], types: Collection[str], start: int = 0
) -> array[int]:
    """The indexes of the events of `types` from `start` on: an `EventView` finds them without
    decoding (`EventView.positions`), any other sequence is read."""
    if _type_of(events) is EventView:
        return events.positions(types, start)
    found = array("q")
    for index in range(max(start, 0), len(events)):
        kind = events[index].get("type")
        if _type_of(kind) is str and kind in types:
            found.append(index)
    return found


def events_of_types(
    events: Iterable[Mapping[str, Any]], types: Collection[str], start: int = 0
) -> Iterator[Mapping[str, Any]]:
    """The events of `types` from index `start` on, in order: an `EventView` decodes only those
    (`EventView.select`), any other iterable is filtered."""
    if _type_of(events) is EventView:
        # A new child's empty log is read this way at every start: no generator for it.
        return events.select(types, start) if len(events) > start else _NOTHING
    return _filtered(events, types, start)


_NOTHING: Iterator[Any] = iter(())  # exhausted, so shared


def _filtered(
    events: Iterable[Mapping[str, Any]], types: Collection[str], start: int
) -> Iterator[Mapping[str, Any]]:
    for index, event in enumerate(events):
        if index < start:
            continue
        kind = event.get("type")
        if _type_of(kind) is str and kind in types:
            yield event


# -- big events ----------------------------------------------------------------------------
# An event whose data may encode to more than this (by `_budget_left`'s estimate) is encoded
# in slices by `_SlicedEncoder`, other greenlets running between them: msgpack and CRC32 over a
# 63 MiB event take about a quarter of a second, all of it on the gevent hub otherwise.
BIG_EVENT: Final = 1 << 20
# The work done between two yields: bytes produced, characters encoded, or items packed (each
# counting `_ITEM_WEIGHT`), about a millisecond's worth.
_SLICE: Final = 1 << 18
# What one container item counts for: a list of a million small ints is few bytes, but a walk.
_ITEM_WEIGHT: Final = 16
# Pieces shorter than this are gathered into one run before they are kept.
_RUN: Final = 1 << 16


def _budget_left(value: dict[Any, Any] | list[Any], budget: int, depth: int = 0) -> int:
    """`budget` less an estimate of the container `value`'s encoded size, stopping once it is
    negative, so a big value costs a bounded walk. A character counts one byte (UTF-8 takes up
    to four: the slices bound the work, not this), an item `_ITEM_WEIGHT`, a key nothing more.
    Below `MAX_DEPTH` only: deeper is refused by the lossless check anyway. On every append that
    is not flat (about a microsecond for a step's reply): the one walk this path adds."""
    items = value.values() if type(value) is dict else value
    budget -= len(items) * _ITEM_WEIGHT
    for item in items:
        t = type(item)
        if t is str:
            budget -= len(item)
        elif (t is dict or t is list) and depth < MAX_DEPTH:
            budget = _budget_left(item, budget, depth + 1)
            if budget < 0:
                return budget
    return budget


def _container_head(count: int, fix: int, marker16: int, marker32: int) -> bytes:
    """A msgpack map or array header, in the shortest form (as msgpack's packer writes it)."""
    if count < 16:
        return bytes((fix | count,))
    if count < 0x10000:
        return bytes((marker16,)) + count.to_bytes(2, "big")
    return bytes((marker32,)) + count.to_bytes(4, "big")


class _Refused(Exception):
    """A value inside a big event the lossless check refuses; `path` is where, built on the way
    out so the error names it as `check_json` would."""

    def __init__(self, value: object, depth: int) -> None:
        super().__init__()
        self.value = value
        self.depth = depth
        self.path: list[str] = []


class _Oversized(Exception):
    """A big event grew past `MAX_FRAME` while it was encoded (nothing more is encoded)."""


class _SlicedEncoder:
    """Encodes one big event's data as msgpack a slice at a time, yielding to other greenlets
    between slices, and checks it as `check_json` would on the way. The bytes are those
    `msgpack.Packer(use_bin_type=True, strict_types=True)` writes for the same value, so a
    reader cannot tell which path encoded an event (the view reads its type from the first
    bytes). `finish` copies the pieces into the one payload the frame and the view share,
    computing the CRC as it goes, again in slices."""

    __slots__ = ("_pieces", "_run", "_work", "repair", "size")

    def __init__(self, head: bytes, repair: bool) -> None:
        self.repair = repair
        self._pieces: list[bytes | bytearray] = []
        self._run = bytearray(head)
        self.size = len(head)
        self._work = 0

    def _spent(self, work: int) -> None:
        self._work += work
        if self._work >= _SLICE:
            self._work = 0
            gevent.sleep(0)

    def _add(self, piece: bytes) -> None:
        size = len(piece)
        self.size += size
        if self.size > MAX_FRAME:
            raise _Oversized
        if size < _RUN:
            self._run += piece
            if len(self._run) >= _SLICE:
                self._pieces.append(self._run)
                self._run = bytearray()
        else:
            if self._run:
                self._pieces.append(self._run)
                self._run = bytearray()
            self._pieces.append(piece)
        self._spent(max(size, _ITEM_WEIGHT))

    def value(self, value: Any, depth: int) -> Any:
        """Encode `value`; returns it, or the repaired str that replaces it (lone surrogates)."""
        t = type(value)
        if t is str and len(value) > _SLICE:
            return self._text(value)
        if (t is dict or t is list) and depth < MAX_DEPTH and _budget_left(value, _SLICE) < 0:
            if t is dict:
                self._dict(value, depth)
            else:
                self._list(value, depth)
            return value
        if not _is_lossless(value, depth):
            raise _Refused(value, depth)
        try:
            piece = _pack_strict(value)
        except UnicodeEncodeError:
            if not self.repair:
                raise
            value = repair_surrogates(value)
            piece = _pack_strict(value)
        self._add(piece)
        return value

    def _dict(self, value: dict[Any, Any], depth: int) -> None:
        self._add(_container_head(len(value), 0x80, 0xDE, 0xDF))
        for key, item in value.items():
            try:
                if type(key) is not str:
                    raise _Refused(value, depth)
                self._add(_pack_strict(key))  # a lone surrogate in a key: repaired whole
                new = self.value(item, depth + 1)
            except _Refused as refused:
                if refused.value is not value:
                    refused.path.append(f".{key}")
                raise
            if new is not item:
                value[key] = new

    def _list(self, value: list[Any], depth: int) -> None:
        self._add(_container_head(len(value), 0x90, 0xDC, 0xDD))
        for index, item in enumerate(value):
            try:
                new = self.value(item, depth + 1)
            except _Refused as refused:
                refused.path.append(f"[{index}]")
                raise
            if new is not item:
                value[index] = new

    def _text(self, text: str) -> str:
        """A long str, encoded a slice of characters at a time; a slice with a lone surrogate is
        repaired alone (a surrogate pair is never cut), and the str rebuilt from the slices."""
        chunks: list[bytes] = []
        repaired: dict[int, str] = {}
        bounds: list[int] = []
        total = 0
        start, end = 0, len(text)
        while start < end:
            stop = min(start + _SLICE, end)
            if stop < end and "\ud800" <= text[stop - 1] <= "\udbff":
                stop += 1
            part = text[start:stop]
            try:
                chunk = part.encode("utf-8")
            except UnicodeEncodeError:
                if not self.repair:
                    raise
                repaired[len(bounds)] = part = repair_surrogates(part)
                chunk = part.encode("utf-8")
            chunks.append(chunk)
            bounds.append(stop)
            total += len(chunk)
            if self.size + total > MAX_FRAME:
                raise _Oversized
            self._spent(stop - start)
            start = stop
        self._add(b"\xdb" + total.to_bytes(4, "big"))  # str 32: over _SLICE bytes
        for chunk in chunks:
            self._add(chunk)
        if not repaired:
            return text
        starts = [0, *bounds[:-1]]
        return "".join(repaired.get(i, text[starts[i] : bounds[i]]) for i in range(len(bounds)))

    def finish(self) -> tuple[bytearray, int]:
        """(the payload, its CRC32): the pieces copied end to end into one buffer, a slice at
        a time. The buffer is never written again: the frame and the view share it."""
        if self._run:
            self._pieces.append(self._run)
            self._run = bytearray()
        payload = bytearray(self.size)
        crc = 0
        at = 0
        with memoryview(payload) as view:
            pieces, self._pieces = self._pieces, []
            for piece in pieces:
                size = len(piece)
                view[at : at + size] = piece
                crc = _crc32(piece, crc)
                at += size
                self._spent(size)
        return payload, crc


class SessionLog:
    """The live, appendable log of one session.

    Appends are buffered in memory (no syscall); `checkpoint` is the durability point. After
    a failed write or sync the log refuses further use: the file may end in a partial frame,
    and appending behind it would turn a repairable torn tail into mid-file corruption.
    """

    def __init__(
        self,
        header: SessionHeader,
        events: Sequence[Event] | EventView,
        sink: LogSink,
        durability: Durability = "turn",
        replay: LogReplay | None = None,
        shared: SharedHeaders | None = None,
    ) -> None:
        """`events` are those the sink already holds: a view the log takes over (a store's
        load, keeping the payloads it read), or events it encodes once (with no `replay`, it
        replays them first)."""
        if durability not in DURABILITY_SETTINGS:
            raise ValueError(f"durability must be one of {sorted(DURABILITY_SETTINGS)}")
        if replay is None:
            replay = validate_log(events, header)
        if _type_of(events) is not EventView:  # an exact type check: no ABC look-up
            events = EventView(encode_payloads(events)) if events else EventView()
        self.header = header
        self.events = events
        self.durability: Durability = durability
        self._sink = sink
        self._replay = replay
        self._shared = shared
        self._payloads_append = self.events.append_payload
        self._buffer = bytearray()
        # Frames ready to write before `_buffer`: a big event's payload is kept here as it is
        # (shared with the view), not copied into the buffer.
        self._queued: list[bytes | bytearray] | None = None
        # A big event being encoded in slices holds `_turn`; other appends wait for it, so
        # seqs are taken, and frames written, in the order the appends were made. Writes that
        # may yield (a big payload goes to a pool thread) hold `_writing`, one at a time. Both
        # made at the first big event: a child's log is a few objects, most never see one.
        self._slicing = False
        self._turn: gevent.lock.Semaphore | None = None
        self._writing: gevent.lock.Semaphore | None = None
        self._unsynced = False  # written to the OS since the last sync
        self._failed: BaseException | None = None
        self._closed = False

    @property
    def id(self) -> str:
        return self.header.id

    if TYPE_CHECKING:

        @property
        def next_seq(self) -> int: ...

    else:
        # The seq the next event gets (= `len(self.events)`), read through a C getter: the loop
        # and the actor name messages by it on every reply, steer and prompt.
        next_seq = property(attrgetter("_replay.seq"), doc="The seq the next event gets.")

    @property
    def turn_open(self) -> bool:
        return self._replay.turn_open

    @property
    def turn(self) -> int:
        """The number of the last turn started (0 before any): the replay's, so nothing is
        decoded to learn it (`agent.history.last_turn_number` reads it from the events)."""
        return self._replay.turn

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def format(self) -> int:
        """The event format this log is written in (`LogReplay.format`, from its header)."""
        return self._replay.format

    @property
    def open_calls(self) -> dict[str, str]:
        """Calls of the open turn with no tool/result yet (id -> name), in call order."""
        return self._replay.open_calls

    def append(
        self,
        type: str,
        data: dict[str, Any],
        *,
        prechecked: bool = False,
        repair: bool = True,
        size: int | None = None,
    ) -> Event:
        """Record one event. The log owns `data` afterwards: do not mutate it.

        Atomic: when it raises, nothing changed (no seq taken, no replay state, no frame). Text
        with lone surrogates is repaired to U+FFFD in place first (docs/decisions.md).

        The lossless-JSON walk is skipped where it cannot find anything: for the flat events
        whose every field the replay checks as an exact int or str (`_FLAT`), and when the
        caller says `prechecked` (every value inside `data` already went through an earlier
        append of this log, unchanged since, or the caller checked it as the walk would: e.g.
        an assistant/message whose usage is clean). The strict encoder and the replay still run.

        `repair=False`: text with a lone surrogate raises `UnicodeEncodeError` instead (nothing
        changed), for a caller that repairs its own objects first (the loop's model replies).

        An event of more than `BIG_EVENT` by estimate is encoded in slices (`_append_big`). The
        estimate comes from the plain-shape check that also spares the walk, or from `size`,
        a caller's own (the loop's `plain_reply_size` of a reply it prechecked), else from a
        walk of its own.
        """
        if self._closed or self._failed is not None:
            self._raise_unusable()
        if self._slicing and self._turn is not None:
            with self._turn:  # a big event is being encoded: this one comes after it
                pass
            if self._closed or self._failed is not None:
                self._raise_unusable()
        if _type_of(data) is not dict:
            # Refused by the replay below (data is a JSON object); named by the walk first.
            if not prechecked and not _is_lossless(data):
                check_json(data, where=f"{type}.data")
        elif _FLAT.get(type) != len(data):
            if size is None:
                plain = _PLAIN.get(type)
                size = -1 if plain is None else plain(data)
                if size >= 0:
                    prechecked = True  # the plain shape is lossless by construction
            if size > BIG_EVENT or (size < 0 and _budget_left(data, BIG_EVENT) < 0):
                return self._append_big(type, data, repair)
            if not prechecked and not _is_lossless(data):
                check_json(data, where=f"{type}.data")
        replay = self._replay
        event: Event = {"type": type, "seq": replay.seq, "time": _now(), "data": data}
        try:
            payload = _pack_strict(event)
        except UnicodeEncodeError:
            # Only a lone surrogate makes a checked value unencodable (rare, slow path).
            if not repair:
                raise
            repair_surrogates(data)
            payload = _pack_strict(event)
        except (TypeError, ValueError, OverflowError):
            # Only an unchecked (flat) event can get here: name the bad value, as the walk does.
            check_json(data, where=f"{type}.data")
            raise
        if len(payload) > MAX_FRAME:
            raise ValueError(f"{type} event of {len(payload)} bytes exceeds {MAX_FRAME}")
        try:
            replay.feed_next(type, data)
        except BaseException:
            # A refused event may have moved the replay part way: rebuild it (rare, loud path).
            self._replay = validate_log(list(self.events), self.header)
            raise
        buffer = self._buffer
        buffer += _pack_prefix(len(payload), _crc32(payload))
        buffer += payload
        self._payloads_append(payload)
        return event

    def _append_big(self, type: str, data: dict[str, Any], repair: bool) -> Event:
        """`append` for an event too big to encode at once: in slices, other greenlets running
        between them (`_SlicedEncoder`), with the same checks, refusals and atomicity. The seq
        is the one the log is at: appends made meanwhile wait for this one (`_turn`). Killed
        midway, it changed nothing (but lone surrogates it repaired in place, as `append`)."""
        if self._turn is None:
            self._turn = gevent.lock.Semaphore()
        with self._turn:
            self._slicing = True
            try:
                replay = self._replay
                seq = replay.seq
                event: Event = {"type": type, "seq": seq, "time": _now(), "data": data}
                head = _pack_strict(
                    {"type": type, "seq": seq, "time": event["time"], "data": None}
                )[:-1]  # the envelope up to its data (msgpack's nil, the last byte, cut)
                encoder = _SlicedEncoder(head, repair)
                try:
                    encoder.value(data, 0)
                except _Refused as refused:
                    where = f"{type}.data" + "".join(reversed(refused.path))
                    check_json(refused.value, where=where)
                    # `check_json` raises for whatever the quick check refused (a depth
                    # past the limit is judged from the top: explain it from there).
                    check_json(data, where=f"{type}.data")
                    raise TypeError(f"{where}: not lossless JSON") from None  # pragma: no cover
                except _Oversized:
                    raise ValueError(f"{type} event exceeds {MAX_FRAME} bytes") from None
                payload, crc = encoder.finish()
                if self._closed or self._failed is not None:
                    self._raise_unusable()
                if replay is not self._replay or replay.seq != seq:  # pragma: no cover
                    raise RuntimeError("the session log moved during a big append")
                try:
                    replay.feed_next(type, data)
                except BaseException:
                    self._replay = validate_log(list(self.events), self.header)
                    raise
                buffer = self._buffer
                buffer += _pack_prefix(len(payload), crc)
                if self._queued is None:
                    self._queued = []
                self._queued += (buffer, payload)
                self._buffer = bytearray()
                self._payloads_append(payload)
                return event
            finally:
                self._slicing = False

    def fork_seed(self) -> ForkSeed | None:
        """The completed-turn prefix (up to the last turn/end; the turn in flight left out) as
        payloads, with the replay state at its end, to seed a fork from (None: no turn ended
        yet). Decodes none of the prefix: only inbox events of the turn in flight, to undo
        them from the inbox state."""
        replay = self._replay
        closed = replay.last_closed
        if closed is None:
            return None
        count = closed[0]
        events = self.events
        inbox = replay.inbox_state()
        if inbox:
            codes = events.codes(count)
            inboxed = [i for i in range(len(codes)) if codes[i] in _INBOX_CODES]
            for index in reversed(inboxed):  # latest first: a claim is undone before its accept
                event = events[count + index]
                message_id = event["data"]["message_id"]
                if event["type"] == ev.INBOX_ACCEPTED:
                    del inbox[message_id]
                else:
                    inbox[message_id] = False
        refs = {ref: seq for ref, seq in replay.refs_named().items() if seq < count}
        return ForkSeed(self.header.version, events.runs(count), closed, inbox, refs)

    def append_request_header(self, system: str, tools: Sequence[ToolLike]) -> Event:
        """Record what the next model requests are shown. With a store behind the log, the
        content is kept there once (by its hash, durable first) and the event names it, so
        siblings sharing a prompt and tools do not each carry a copy; without one, inline."""
        shared = self._shared
        if shared is None:
            return self.append(ev.REQUEST_HEADER, request_header_data(system, tools))
        return self.append(ev.REQUEST_HEADER, {"ref": shared.request_header_ref(system, tools)})

    def checkpoint(self, point: Literal["step", "turn"]) -> None:
        """A durability point: see docs/durability.md for what each setting does here."""
        if point not in ("step", "turn"):
            raise ValueError(f"checkpoint point must be 'step' or 'turn', not {point!r}")
        if self._closed or self._failed is not None:
            self._raise_unusable()
        self._flush()
        durability = self.durability
        if durability == "step" or (durability == "turn" and point == "turn"):
            self._sync()

    def close(self) -> None:
        """Flush what is buffered (synced unless durability is "none") and release the file."""
        if self._closed:
            return
        try:
            if self._failed is None:
                self._flush()
                if self.durability != "none":
                    self._sync()
        finally:
            self._closed = True
            self._sink.close()

    def _flush(self) -> None:
        if not self._buffer and not self._queued:
            return
        if self._queued or (self._writing is not None and self._writing.locked()):
            self._flush_queued()  # a big frame is queued or being written: after it, in order
            return
        data = self._buffer
        self._buffer = bytearray()
        try:
            self._sink.write(data)
        except BaseException as exc:
            self._failed = exc
            raise
        self._unsynced = True

    def _flush_queued(self) -> None:
        """Write the queued frames, then the buffer, one write at a time: a big payload's write
        may yield (the sink writes it from a pool thread), and frames reach the file in order."""
        if self._writing is None:
            self._writing = gevent.lock.Semaphore()
        with self._writing:
            if self._failed is not None:
                self._raise_unusable()
            pieces = self._queued or []
            pieces.append(self._buffer)
            self._queued = None
            self._buffer = bytearray()
            try:
                for piece in pieces:
                    if piece:
                        self._sink.write(piece)
            except BaseException as exc:
                self._failed = exc
                raise
            self._unsynced = True

    def _sync(self) -> None:
        if not self._unsynced:
            return
        try:
            self._sink.sync()
        except BaseException as exc:
            self._failed = exc
            raise
        self._unsynced = False

    def _raise_unusable(self) -> None:
        if self._closed:
            raise ValueError(f"session log {self.id} is closed")
        # The cause in the message itself: whoever reports this names it (e.g. ENOSPC).
        raise OSError(
            f"session log {self.id} failed earlier ({self._failed}) and is unusable"
        ) from self._failed

    def __enter__(self) -> SessionLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<SessionLog {self.id} events={len(self.events)} durability={self.durability}>"


def encode_events(events: Iterable[Event]) -> bytes:
    """Frames for already-validated events (seeds, repairs)."""
    return b"".join(_frame(_packb(e)) for e in events)


def encode_payloads(events: Iterable[Event], frames: list[bytes] | None = None) -> Payloads:
    """Already-validated events, each encoded once, as a view's `Payloads`; with `frames`,
    each one's frame is appended to it too (a seed written and kept from one encoding).

    With a packer of its own: a long seed is encoded in a pool thread (`agent.store`), and a
    packer's buffer is not to be shared across threads."""
    pack = msgpack.Packer(use_bin_type=True, autoreset=True).pack
    payloads = Payloads()
    add = payloads.add
    for event in events:
        payload = pack(event)
        add(payload, event["type"])
        if frames is not None:
            frames.append(_frame(payload))
    return payloads
