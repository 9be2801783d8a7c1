"""The run of an in-process child: see `actors.local_run` (the child's own actor is the run's
actor). Re-exported here for the providers that build on it (spawn, fork, the Ray host)."""

from __future__ import annotations

from actors.local_run import MAX_DIAGNOSTIC_BYTES, LocalRun, clip_diagnostic, stop_reason_of

__all__ = ["MAX_DIAGNOSTIC_BYTES", "LocalRun", "clip_diagnostic", "stop_reason_of"]
