"""Issue 12 item 21: a contained child crash is a result, not a traceback on the host's stderr.

A library host that configured no logging used to get a full traceback on stderr (Python's
last-resort handler) for every crash the runtime contains. Contained crashes are logged at
DEBUG, and the library never configures logging itself, so stderr stays empty unless the host
asks for debug output. Real subprocesses, so no test framework configures logging for them.
"""

from __future__ import annotations

import sys
from pathlib import Path

from gevent import subprocess

TESTS = Path(__file__).resolve().parent

# A parent starts a child whose model adapter crashes; the run settles `error`, it prints the
# stop reason and the diagnostic on stdout. `debug` as argv[1] configures DEBUG logging first.
SCRIPT = """
import logging, sys
sys.path.insert(0, {tests!r})
if sys.argv[1:] == ["debug"]:
    logging.basicConfig(level=logging.DEBUG)
from seam_kit import Kit
from agent.models import scripted as S

k = Kit()
parent = k.parent()

def respond(request):
    if request.session_id != parent.id:
        raise ZeroDivisionError("the child's adapter has a bug")
    return S.text("parent")

k.respond = respond
run = k.start(parent)
result = run.result.get(timeout=10)
run.dispose()
k.close()
print(result.stop_reason, result.diagnostic)
"""


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", SCRIPT.format(tests=str(TESTS)), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_contained_child_crash_prints_nothing_on_an_unconfigured_hosts_stderr() -> None:
    proc = _run()
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "error ZeroDivisionError: the child's adapter has a bug"
    assert proc.stderr == ""


def test_the_contained_crash_is_still_visible_at_debug() -> None:
    proc = _run("debug")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("error ")
    assert "DEBUG:agent.loop:agent " in proc.stderr and "turn 1 crashed" in proc.stderr
    assert "ZeroDivisionError: the child's adapter has a bug" in proc.stderr  # the traceback


def test_the_library_configures_no_logging_of_its_own() -> None:
    """Importing and running the runtime adds no handler that prints anywhere (the host
    decides; Pykka's own NullHandler is allowed, it prints nothing)."""
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import logging, subagent, subagent.runtime, providers.inprocess, actors.agents\n"
            "from subagent.runtime import Runtime\n"
            "from agent.store import MemoryStore\n"
            "Runtime(store=MemoryStore()).close()\n"
            "loggers = [logging.getLogger()] + [\n"
            "    l for l in logging.Logger.manager.loggerDict.values()\n"
            "    if isinstance(l, logging.Logger)]\n"
            "handlers = [h for l in loggers for h in l.handlers]\n"
            "print(sum(not isinstance(h, logging.NullHandler) for h in handlers),\n"
            "      logging.getLogger().level)\n",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["0", str(30)]  # no handlers; the root's default WARNING
