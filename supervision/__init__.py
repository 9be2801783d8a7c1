"""Cancellation and supervision: the bottom layer. It knows gevent and nothing else of ours."""

from supervision.child import Child, Exit, ExitKind
from supervision.greenlet_child import ChildKilled, GreenletChild, spawn_child
from supervision.group import TaskGroup
from supervision.signal import AbortController, AbortError, AbortSignal
from supervision.supervisor import (
    ChildSpec,
    RestartIntensityExceeded,
    RestartType,
    Strategy,
    Supervisor,
    SupervisorClosedError,
    SupervisorError,
)

__all__ = [
    "AbortController",
    "AbortError",
    "AbortSignal",
    "Child",
    "ChildKilled",
    "ChildSpec",
    "Exit",
    "ExitKind",
    "GreenletChild",
    "RestartIntensityExceeded",
    "RestartType",
    "Strategy",
    "Supervisor",
    "SupervisorClosedError",
    "SupervisorError",
    "TaskGroup",
    "spawn_child",
]
