"""Run as a script, never imported: `python -I -S acp_exec.py PARENT_PID PROGRAM ARG...`.

Sets the Linux parent-death signal (SIGKILL) on itself, checks that the parent that spawned it
is still the one it expects (else exits 1: the parent died before the signal was armed), then
replaces itself with PROGRAM (an absolute path), which keeps the pid, the process group and the
armed signal. Doing this in an exec'd helper instead of a `preexec_fn` lets the parent spawn with
vfork, so a large parent is not copied on the gevent hub (see docs/decisions.md). Standard
library only, and nothing else: it runs isolated (`-I -S`) before the agent.
"""

from __future__ import annotations

import ctypes
import os
import sys

_PR_SET_PDEATHSIG = 1
_SIGKILL = 9
_USAGE = 2
_PARENT_GONE = 1
_EXEC_FAILED = 127


def main(argv: list[str]) -> int:
    if len(argv) < 3 or not argv[1].isdigit() or not os.path.isabs(argv[2]):
        sys.stderr.write("usage: acp_exec.py PARENT_PID /ABSOLUTE/PROGRAM [ARG...]\n")
        return _USAGE
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, _SIGKILL, 0, 0, 0)
    if os.getppid() != int(argv[1]):
        return _PARENT_GONE
    try:
        os.execv(argv[2], argv[2:])
    except OSError as exc:
        sys.stderr.write(f"acp_exec: cannot execute {argv[2]!r}: {exc.strerror}\n")
    return _EXEC_FAILED


if __name__ == "__main__":
    sys.exit(main(sys.argv))
