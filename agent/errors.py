"""The agent layer's failures: one module, so the layer's part of the tree is read in one place.

Every class here derives from `SubagentRuntimeError` (supervision/errors.py holds the root,
the one cancellation `Cancelled`, and the picture of the whole tree)::

    SubagentRuntimeError
    ├── ModelError            a model or transport failure: the turn ends `error`
    ├── Retryable             an HTTP attempt failed in a way another attempt may not
    ├── ResponseTooLarge      an HTTP body (or one line of it) ran past its bound
    ├── ProxyError            [ConnectionError] an HTTP proxy would not open a tunnel
    ├── ToolError             a tool reports a failure to the model, with its own `code`
    ├── ToolCrash             the tool layer broke its contract: the turn ends `error`
    ├── TurnBlocked           a `before_first_request` hook refused the turn: it ends `blocked`
    ├── PromptError           a template or section that cannot be rendered
    ├── TooManyContainers     [ValueError] a peer's long JSON holds too many arrays/objects
    └── SessionLogError       a session log that cannot be used as is
        ├── InvariantError        an event breaks the log's structure
        ├── CorruptSessionError   a damaged frame before the tail
        ├── SessionBusyError      the session is open for appending elsewhere
        └── SharedHeaderMissingError  a log names a shared request header its store lacks
    SessionNotFoundError      [SubagentRuntimeError, KeyError] no session has that id
    SessionExistsError        [SubagentRuntimeError, FileExistsError] the id is already stored

The store's two keep their builtin second base, so `except KeyError` written against a
dict-like store still works. Cancellation is never an error here: a model adapter or a tool
that sees its signal abort raises `AbortError` (a `Cancelled`, not an `Exception`).
"""

from __future__ import annotations

from supervision.errors import SubagentRuntimeError

__all__ = [
    "TOOL_FAILED",
    "CorruptSessionError",
    "InvariantError",
    "ModelError",
    "PromptError",
    "ProxyError",
    "ResponseTooLarge",
    "Retryable",
    "SessionBusyError",
    "SessionExistsError",
    "SessionLogError",
    "SessionNotFoundError",
    "SharedHeaderMissingError",
    "TooManyContainers",
    "ToolCrash",
    "ToolError",
    "TurnBlocked",
]

# The code of a tool failure that names no code of its own.
TOOL_FAILED = "TOOL_FAILED"


class ModelError(SubagentRuntimeError):
    """A model or transport failure: the turn ends `error` with this message as diagnostic."""


class Retryable(SubagentRuntimeError):
    """Raised inside an attempt: this attempt failed in a way another attempt may not."""

    def __init__(self, diagnostic: str, retry_after: float | None = None) -> None:
        super().__init__(diagnostic)
        self.diagnostic = diagnostic
        self.retry_after = retry_after


class ResponseTooLarge(SubagentRuntimeError):
    """An HTTP body (`what="body"`) or one line of it (`what="line"`) ran past `limit` bytes;
    `received` bytes of body had been read (agent/http_client.py)."""

    def __init__(self, what: str, limit: int, received: int) -> None:
        super().__init__(f"the {what} ran past {limit} bytes ({received} bytes of body read)")
        self.what = what
        self.limit = limit
        self.received = received


class ProxyError(SubagentRuntimeError, ConnectionError):
    """The proxy did not open the tunnel (agent/http_proxy.py): `status` is its answer's code
    (None: no answer that HTTP could read). A 4xx (407: credentials, 403: a policy) will not
    change on a retry. A `ConnectionError`, so code that handles a failed connect handles it."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ToolError(SubagentRuntimeError):
    """Raised by a tool to report a failure to the model with a code of its choosing."""

    def __init__(self, message: str, code: str = TOOL_FAILED) -> None:
        if not isinstance(code, str) or not code:
            raise ValueError("ToolError code must be a non-empty string")
        super().__init__(message)
        self.message = message
        self.code = code


class ToolCrash(SubagentRuntimeError):
    """The tool layer broke its contract (`execute` raised): the turn ends `error`."""


class TurnBlocked(SubagentRuntimeError):
    """Raised by a `before_first_request` hook to refuse the turn: it ends `blocked`."""


class PromptError(SubagentRuntimeError):
    """A template or section that cannot be rendered; never reaches the model half-rendered."""


class SessionLogError(SubagentRuntimeError):
    """Base of every "this session log cannot be used as is" failure."""


class SessionNotFoundError(SubagentRuntimeError, KeyError):
    """No session has that id."""

    def __str__(self) -> str:
        return f"no session {self.args[0]!r}" if self.args else "no such session"


class SessionExistsError(SubagentRuntimeError, FileExistsError):
    """`create` was given an id that is already stored."""


class SessionBusyError(SessionLogError):
    """The session is open for appending (in this process or another)."""


class SharedHeaderMissingError(SessionLogError):
    """A log names a shared request header (by its hash) that its store does not hold: the
    session file was copied without the store's `headers/` directory, or that file was removed.
    Never ignored: the log would no longer say what its model was shown."""

    def __init__(self, ref: str, where: str) -> None:
        self.ref = ref
        self.where = where
        super().__init__(
            f"{where}: names shared request header {ref}, which this store does not hold "
            "(copy a store's headers/ directory along with its sessions)"
        )


class InvariantError(SessionLogError):
    """An event breaks the log's structure; `seq` names it."""

    def __init__(self, seq: int, message: str) -> None:
        self.seq = seq
        self.message = message
        super().__init__(f"event seq {seq}: {message}")


class CorruptSessionError(SessionLogError):
    """A damaged frame before the tail: never repaired silently."""

    def __init__(self, name: str, offset: int, message: str) -> None:
        self.name = name
        self.offset = offset
        self.message = message
        super().__init__(f"{name}: corrupt session at byte {offset}: {message}")


class TooManyContainers(SubagentRuntimeError, ValueError):
    """A peer's long JSON text holds more arrays and objects than `json_text.MAX_CONTAINERS`:
    refused as nothing we take (each would be a tracked object the cyclic collector scans)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"a message holds more than {limit:,} JSON arrays and objects")
