"""The providers layer's failures: one module, so the layer's part of the tree is read in one place.

Every class derives from `SubagentRuntimeError` or, for cancellation, from `Cancelled`
(supervision/errors.py holds both roots and the picture of the whole tree)::

    SubagentRuntimeError
    ├── RpcError              the ACP peer answered our request with a JSON-RPC error object
    ├── ConnectionClosed      the connection ended before an answer came
    ├── RequestTimedOut       a request got no answer within its timeout
    ├── MethodNotFound        raised by a request handler: answered -32601
    ├── RpcFault              raised by a request handler: answered with its code and message
    └── AgentProcessExited    [RuntimeError] a continuable activation lost its agent process
    Cancelled
    └── AbortError
        └── RequestAborted    the signal passed to `request` aborted while it was pending

What reaches a caller of the seam is never one of these: providers turn them into a
`SubagentError` with a stable code, or into a run's `error` outcome with a diagnostic.
"""

from __future__ import annotations

from providers.acp_text import MAX_DATA_CHARS, describe_data, quoted, short_text
from supervision.errors import AbortError, SubagentRuntimeError

__all__ = [
    "AgentProcessExited",
    "ConnectionClosed",
    "MethodNotFound",
    "RequestAborted",
    "RequestTimedOut",
    "RpcError",
    "RpcFault",
]


class RpcError(SubagentRuntimeError):
    """The peer answered our request with a JSON-RPC error object."""

    def __init__(self, method: str, code: object, message: object, data: object = None) -> None:
        # The message and code are the agent's: cleaned and bounded like its `data` (an agent
        # may answer with a megabyte-long message, or a code that is a string of escapes).
        shown = short_text(message if isinstance(message, str) else quoted(message), MAX_DATA_CHARS)
        text = f"{method} failed: {shown} (code {quoted(code)})"
        if data is not None:
            # The agent's own reason usually lives here (the message is often just
            # "Internal error"), so it is part of every diagnostic.
            text += f": {describe_data(data)}"
        super().__init__(text)
        self.method = method
        self.code = code
        self.message = message
        self.data = data


class ConnectionClosed(SubagentRuntimeError):
    """The connection ended (EOF, protocol violation, or closed by us) before an answer came."""

    def __init__(self, reason: str, *, protocol_error: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.protocol_error = protocol_error


class RequestTimedOut(SubagentRuntimeError):
    """`request` got no answer within its `timeout`."""

    def __init__(self, method: str, timeout: float) -> None:
        super().__init__(f"{method} got no answer within {timeout:g} s")
        self.method = method
        self.timeout = timeout


class RequestAborted(AbortError):
    """The signal passed to `request` aborted while the request was pending.

    An `AbortError` (so a `Cancelled`) kept under its own name: the handshake turns exactly
    this one into `SubagentError("ABORTED")`."""

    def __init__(self, reason: object) -> None:
        super().__init__(f"aborted: {reason!r}", reason)


class MethodNotFound(SubagentRuntimeError):
    """Raised by a request handler for a method it does not serve (answered -32601)."""


class RpcFault(SubagentRuntimeError):
    """Raised by a request handler to answer with this JSON-RPC error (e.g. -32602)."""

    def __init__(self, code: int, message: str, data: object = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data


class AgentProcessExited(SubagentRuntimeError, RuntimeError):
    """A continuable activation lost its agent process mid-turn: an infrastructure fault, which
    the continuation service answers with a transient restart (cold resume)."""
