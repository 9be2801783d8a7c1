"""The root of every failure the runtime raises, and the one cancellation every layer shares.

Both live here, in the bottom layer, so every layer above can derive from them; the face
re-exports them from `subagent`. Each layer keeps its own part of the tree in one module
(`agent/errors.py`, `actors/gevent_actor.py`, `providers/errors.py`, `subagent/errors.py`)
and documents it there. The whole tree::

    Exception
    └── SubagentRuntimeError              catch this to catch any failure of the runtime
        ├── SupervisorError               (supervision) a supervisor refused or gave up
        │   ├── SupervisorClosedError
        │   └── RestartIntensityExceeded
        ├── agent.errors: ModelError, ToolError, PromptError, TurnBlocked, ToolCrash,
        │   Retryable, SessionLogError (+ InvariantError, CorruptSessionError,
        │   SessionBusyError, SessionNotFoundError [KeyError], SessionExistsError
        │   [FileExistsError])
        ├── providers.errors: RpcError, ConnectionClosed, RequestTimedOut, MethodNotFound,
        │   RpcFault, AgentProcessExited [RuntimeError]
        └── subagent.errors: SubagentError (stable `code`) (+ SubagentDepthError,
            UnsupportedSchemaError), DescriptorError [ValueError], UnknownTaskError
            [KeyError], CliError (+ UsageError)
    BaseException
    └── Cancelled                         one cancellation, whoever caused it
        ├── AbortError                    an `AbortSignal` aborted (carries its `reason`)
        │   └── RequestAborted            (providers) an ACP handshake request was aborted
        ├── ChildKilled [GreenletExit]    a supervised greenlet was killed
        └── ActorKilled                   (actors) an actor was killed

A second builtin base in brackets is kept for compatibility: a store's missing session is
still a `KeyError`, a bad descriptor still a `ValueError`.

`Cancelled` derives from `BaseException`, as trio's `Cancelled` and gevent's `GreenletExit`
do, so a tool's or adapter's `except Exception:` cannot swallow a cancellation and carry on
as though nothing happened (docs/decisions.md, "One exception tree").
"""

from __future__ import annotations

from gevent import GreenletExit

__all__ = [
    "AbortError",
    "Cancelled",
    "ChildKilled",
    "RestartIntensityExceeded",
    "SubagentRuntimeError",
    "SupervisorClosedError",
    "SupervisorError",
]


class SubagentRuntimeError(Exception):
    """The root of every failure the runtime raises (cancellation excepted: see `Cancelled`)."""


class Cancelled(BaseException):
    """The one cancellation every layer shares; `reason` says why, when someone said."""

    def __init__(self, message: str = "cancelled", reason: object = None) -> None:
        super().__init__(message)
        self.reason = reason


class AbortError(Cancelled):
    """The default abort reason, and what `raise_if_aborted()` raises for a non-exception reason."""

    def __init__(self, message: str = "aborted", reason: object = None) -> None:
        super().__init__(message, reason)


class ChildKilled(Cancelled, GreenletExit):  # type: ignore[misc]  # gevent is untyped
    """Raised inside a child's greenlet by `GreenletChild.kill()`; the exit is *cancelled*.

    Also a `GreenletExit`, so gevent treats it as an ordinary way for a greenlet to end."""

    def __init__(self, message: str = "", reason: object = None) -> None:
        super().__init__(message, reason)


class SupervisorError(SubagentRuntimeError):
    """Base of the supervisor's own errors."""


class SupervisorClosedError(SupervisorError):
    """The supervisor is disposing or disposed: it accepts no new children or resources."""


class RestartIntensityExceeded(SupervisorError):
    """Children failed more often than the supervisor may restart them; it gave up."""
