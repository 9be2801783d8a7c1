"""A signal watched on the hub for a while gets its Python handling back afterwards.

gevent's watcher, cancelled, leaves the signal at the system default (libev resets it): after
a CLI command had watched Ctrl-C once, the next Ctrl-C killed the process outright, with no
`KeyboardInterrupt`, no reaping of external agents and no last word (docs/decisions.md). Run in
a child interpreter, since the old behaviour kills the process that receives the signal."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

SCRIPT = textwrap.dedent(
    """
    import os, signal
    import gevent
    from gevent.event import Event
    from supervision.signal_watch import SignalWatch

    seen = []
    signal.signal(signal.SIGUSR1, lambda *_: seen.append("python"))
    on_hub = Event()
    watch = SignalWatch(signal.SIGUSR1, lambda: (seen.append("hub"), on_hub.set()))
    os.kill(os.getpid(), signal.SIGUSR1)
    assert on_hub.wait(10)
    watch.cancel()
    watch.cancel()  # idempotent
    os.kill(os.getpid(), signal.SIGUSR1)  # the Python handler runs at the next bytecode
    gevent.sleep(0)
    SignalWatch(signal.SIGINT, seen.append, "never").cancel()
    try:
        os.kill(os.getpid(), signal.SIGINT)
        gevent.sleep(0)
    except KeyboardInterrupt:
        seen.append("interrupt")
    print(seen)
    """
)


def test_a_cancelled_watch_gives_the_signal_back_the_handling_it_had() -> None:
    # The script takes SIGINT's default handling (a KeyboardInterrupt) as Python sets it up.
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "['hub', 'python', 'interrupt']"
