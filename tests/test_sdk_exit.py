"""A `subagent` command on the OpenTelemetry SDK's pipeline exits within one deadline against a
collector that is down or never answers, and says how many spans that cost (docs/tracing.md).

Real CLI processes, real sockets on 127.0.0.1. The SDK's exporter would retry each batch until
its timeout and the CLI's flush used to wait for every queued batch in turn; here each span is
its own batch (`OTEL_BSP_MAX_EXPORT_BATCH_SIZE=1`, read by the SDK), so the old exit took
minutes. The bounds asserted are bounds on a hang (three times the deadline), not speed."""

from __future__ import annotations

import http.server
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from gevent import subprocess as gsub

from supervision.offload import offload

pytest.importorskip("opentelemetry.exporter.otlp.proto.http", reason="the otel extra")

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from otlp_collector import collector

REPO = Path(__file__).resolve().parent.parent

# The exporter's timeout the tests set (ms): the exit deadline is the smaller of it and 5 s.
TIMEOUT_MS = 2000
DEADLINE_S = TIMEOUT_MS / 1000
BOUND_S = 3 * DEADLINE_S  # the hang bound: generous against a loaded machine


PIPELINES = ("sdk", "lean")


def _env(endpoint: str, pipeline: str = "sdk", **more: str) -> dict[str, str]:
    """The environment of a CLI on the SDK (or lean) path, posting to `endpoint`, one span a
    batch."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "SUBAGENT_"))}
    if pipeline == "sdk":
        env["SUBAGENT_OTEL_SDK"] = "true"
    return {
        **env,
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_EXPORTER_OTLP_TIMEOUT": str(TIMEOUT_MS),
        "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "1",
        **more,
    }


def _cli(home: Path, env: Mapping[str, str], *args: str) -> Any:
    return gsub.Popen(
        [sys.executable, "-m", "subagent.cli", "--home", str(home), *args],
        cwd=REPO,
        env=dict(env),
        stdin=gsub.PIPE,
        stdout=gsub.PIPE,
        stderr=gsub.PIPE,
        text=True,
    )


def _demo_exit(home: Path, env: Mapping[str, str]) -> tuple[float, str]:
    """Run `subagent demo --no-live`; how long it took to exit once its work was done (its
    last line printed), and its stderr."""
    proc = _cli(home, env, "demo", "--no-live")
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("finished in"):
            break
    else:
        pytest.fail(f"the demo did not finish: {proc.communicate(timeout=60)[1][-2000:]}")
    elapsed, stderr = _exit_after(proc, time.monotonic(), "the demo, its work done")
    assert proc.returncode == 0, stderr[-2000:]
    return elapsed, stderr


def _exit_after(proc: Any, since: float, what: str) -> tuple[float, str]:
    """How long after `since` `proc` exited, and its stderr; a minute at most (else killed,
    and the test fails)."""
    try:
        _, stderr = proc.communicate(timeout=60)
    except gsub.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(f"{what}, had not exited a minute later")
    return time.monotonic() - since, stderr


def _lost(stderr: str) -> tuple[int, str]:
    """The exit line's count and cause (`subagent: tracing: N spans were not exported: ...`)."""
    (said,) = [line for line in stderr.splitlines() if "spans were not exported" in line]
    assert said.startswith("subagent: tracing: "), said
    count = int(said.split()[2])
    return count, said.partition("were not exported: ")[2]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port  # closed once the block ends: nothing listens there


class _Silent:
    """A collector that accepts connections and never answers (a hung process, a black hole
    behind a load balancer)."""

    def __init__(self) -> None:
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.endpoint = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._held: list[socket.socket] = []
        self._closing = False
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            conn, _ = self._listener.accept()
            self._held.append(conn)
            if self._closing:
                return

    def close(self) -> None:
        self._closing = True
        # A blocked accept() does not end when its socket is closed: one last connection ends it.
        socket.create_connection(self._listener.getsockname(), timeout=10).close()
        offload(self._thread.join, 10)
        self._listener.close()
        for conn in self._held:
            conn.close()


@pytest.fixture
def silent() -> Iterator[_Silent]:
    found = _Silent()
    yield found
    found.close()


class _AnswersThenHolds:
    """A collector that takes the first `answered` requests and holds every later one unanswered
    until closed: a collector that stalls mid-run."""

    def __init__(self, answered: int) -> None:
        self.spans = 0
        self.requests = 0
        self._release = threading.Event()
        reply = ExportTraceServiceResponse().SerializeToString()
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with lock:
                    owner.requests += 1
                    held = owner.requests > answered
                    if not held:
                        request = ExportTraceServiceRequest.FromString(body)
                        owner.spans += sum(
                            len(s.spans) for r in request.resource_spans for s in r.scope_spans
                        )
                if held:
                    owner._release.wait(60)
                    return  # no answer: the connection closes
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:
                return

        lock = threading.Lock()
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._release.set()
        offload(self._server.shutdown)
        self._server.server_close()
        offload(self._thread.join, 10)


@pytest.fixture(scope="module")
def demo_spans(tmp_path_factory: pytest.TempPathFactory) -> int:
    """How many spans the demo makes (on the SDK path; the lean one makes the same), counted
    by a collector that takes them."""
    with collector() as local:
        env = _env(local.endpoint.removesuffix("/v1/traces"), OTEL_BSP_MAX_EXPORT_BATCH_SIZE="512")
        proc = _cli(tmp_path_factory.mktemp("home"), env, "demo", "--no-live")
        _, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, stderr[-2000:]
        assert "spans were not exported" not in stderr
        count = len(local.spans())
    assert count > 0
    return count


# Why the first span was lost, by pipeline: the SDK's tally names the deadline; the lean
# exporter names the first failed post, or the deadline when no post failed before it.
_DEADLINE = f"the exit deadline ({DEADLINE_S:g} s) passed"


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_against_a_refusing_endpoint_the_demo_exits_within_the_deadline(
    tmp_path: Path, demo_spans: int, pipeline: str
) -> None:
    elapsed, stderr = _demo_exit(tmp_path, _env(f"http://127.0.0.1:{_closed_port()}", pipeline))
    assert elapsed < BOUND_S, (elapsed, stderr[-2000:])
    count, why = _lost(stderr)
    assert count == demo_spans  # every span: none could be exported
    if pipeline == "sdk":
        assert _DEADLINE in why
    else:
        assert why.startswith("the export to the collector failed (ConnectionRefusedError")


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_against_a_silent_collector_the_demo_exits_within_the_deadline(
    tmp_path: Path, silent: _Silent, demo_spans: int, pipeline: str
) -> None:
    elapsed, stderr = _demo_exit(tmp_path, _env(silent.endpoint, pipeline))
    assert elapsed < BOUND_S, (elapsed, stderr[-2000:])
    count, why = _lost(stderr)
    assert count == demo_spans
    if pipeline == "sdk":
        # The export the SDK's thread began during the run may have timed out first.
        assert why.endswith(f"{_DEADLINE} before the rest were exported")
    else:  # a post begun during the run may have timed out first
        assert _DEADLINE in why or "timed out after" in why


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_spans_still_queued_when_the_deadline_cuts_the_flush_are_counted(
    tmp_path: Path, demo_spans: int, pipeline: str
) -> None:
    """The collector takes 10 batches, then stalls: the rest (queued, or held in an export)
    are lost, and the count says exactly how many: every span the collector did not take."""
    stalling = _AnswersThenHolds(answered=10)
    try:
        elapsed, stderr = _demo_exit(tmp_path, _env(stalling.endpoint, pipeline))
    finally:
        stalling.close()
    assert elapsed < BOUND_S, (elapsed, stderr[-2000:])
    assert stalling.spans == 10
    count, why = _lost(stderr)
    assert count == demo_spans - 10
    assert _DEADLINE in why or "timed out after" in why


def test_the_deadline_is_the_exporters_timeout_at_most_five_seconds() -> None:
    from subagent import telemetry

    assert telemetry.exit_timeout_s({}) == 5.0  # the exporter's default, 10 s, capped
    assert telemetry.exit_timeout_s({"OTEL_EXPORTER_OTLP_TIMEOUT": "800"}) == 0.8
    assert telemetry.exit_timeout_s({"OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "60000"}) == 5.0


# -- the servers: SIGTERM, then the same bounded exit ----------------------------------------------


def _ask(proc: Any, rid: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}))
    proc.stdin.write("\n")
    proc.stdin.flush()
    while True:
        line = proc.stdout.readline()
        assert line, proc.communicate(timeout=60)[1][-2000:]
        answer: dict[str, Any] = json.loads(line)
        if answer.get("id") == rid:
            return answer


def _terminated(proc: Any) -> tuple[float, str]:
    """SIGTERM; how long the server took to exit, and its stderr."""
    proc.send_signal(signal.SIGTERM)
    elapsed, stderr = _exit_after(proc, time.monotonic(), "the server, sent SIGTERM")
    assert proc.returncode == 143, stderr[-2000:]
    return elapsed, stderr


def test_subagent_mcp_exits_within_the_deadline_after_sigterm(
    tmp_path: Path, silent: _Silent
) -> None:
    proc = _cli(tmp_path, _env(silent.endpoint), "mcp")
    params = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {}}
    assert "result" in _ask(proc, 1, "initialize", params)
    for rid in range(2, 6):  # a few children: their spans wait on the silent collector
        call = {"name": "subagent", "arguments": {"description": f"w{rid}", "prompt": "hello"}}
        assert "result" in _ask(proc, rid, "tools/call", call)
    elapsed, stderr = _terminated(proc)
    assert elapsed < BOUND_S, (elapsed, stderr[-2000:])
    count, why = _lost(stderr)
    assert count > 0 and f"the exit deadline ({DEADLINE_S:g} s) passed" in why


def test_subagent_acp_exits_within_the_deadline_after_sigterm(
    tmp_path: Path, silent: _Silent
) -> None:
    proc = _cli(tmp_path, _env(silent.endpoint), "acp")
    assert "result" in _ask(proc, 1, "initialize", {"protocolVersion": 1})
    new = _ask(proc, 2, "session/new", {"cwd": str(REPO), "mcpServers": []})
    sid = new["result"]["sessionId"]
    for rid in range(3, 7):  # a few turns: their spans wait on the silent collector
        prompt = {"sessionId": sid, "prompt": [{"type": "text", "text": f"hello {rid}"}]}
        assert _ask(proc, rid, "session/prompt", prompt)["result"] == {"stopReason": "end_turn"}
    elapsed, stderr = _terminated(proc)
    assert elapsed < BOUND_S, (elapsed, stderr[-2000:])
    count, why = _lost(stderr)
    assert count > 0 and f"the exit deadline ({DEADLINE_S:g} s) passed" in why


def _script(script: str, endpoint: str) -> list[str]:
    """Run `script` in a fresh interpreter (no `OTEL_`/`SUBAGENT_` settings) with `endpoint`;
    the words it printed."""
    proc = gsub.run(
        [sys.executable, "-c", script, endpoint],
        cwd=REPO,
        env={k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "SUBAGENT_"))},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.split()


HOST_SCRIPT = """
import sys
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from subagent import telemetry

exporter = InMemorySpanExporter()
host = TracerProvider()
host.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(host)
env = {"SUBAGENT_OTEL_SDK": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": sys.argv[1]}
assert telemetry.configure_from_env(env) is False  # the host's provider stays
telemetry.flush_at_exit()
host.get_tracer("t").start_span("after the exit flush").end()
print(len(exporter.get_finished_spans()), telemetry.lost_spans()[0])
"""


def test_the_exit_never_closes_the_hosts_own_provider() -> None:
    # Still exporting; nothing of ours to count.
    assert _script(HOST_SCRIPT, f"http://127.0.0.1:{_closed_port()}") == ["1", "0"]


# -- a flush that is not an exit ---------------------------------------------------------------

FLUSH_SCRIPT = """
import sys, time
import gevent
from opentelemetry import trace
from subagent import telemetry

env = {"SUBAGENT_OTEL_SDK": "true", "OTEL_TRACES_EXPORTER": "otlp",
       "OTEL_EXPORTER_OTLP_ENDPOINT": sys.argv[1], "OTEL_EXPORTER_OTLP_TIMEOUT": "10000"}
assert telemetry.configure_from_env(env) is True
for i in range(5):
    trace.get_tracer("t").start_span(f"span {i}").end()
ticks = [0]
def tick():
    while True:
        ticks[0] += 1
        gevent.sleep(0.01)
ticker = gevent.spawn(tick)
start = time.monotonic()
flushed = telemetry.flush(1.0)
print(flushed, ticks[0], round(time.monotonic() - start, 2))
ticker.kill()
"""


def test_a_flush_on_the_sdk_path_keeps_its_timeout_and_the_hub_free(silent: _Silent) -> None:
    """`telemetry.flush(timeout_s)` against a collector that never answers: the SDK's flush
    ignores its timeout and exports in the calling thread, so it used to hold the hub (and the
    caller) for the exporter's 10 s; it now waits at most its timeout, on the hub, and says it
    did not finish."""
    flushed, ticks, elapsed = _script(FLUSH_SCRIPT, silent.endpoint)
    assert flushed == "False"
    assert int(ticks) > 0  # other greenlets ran while it waited
    assert float(elapsed) < 3 * 1.0  # a bound on a hang (the exporter's own timeout is 10 s)


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_ctrl_c_during_the_exit_wait_ends_it_and_still_says_what_was_lost(
    tmp_path: Path, silent: _Silent, demo_spans: int, pipeline: str
) -> None:
    """A user who will not wait out the deadline presses Ctrl-C: the wait ends, every span not
    exported is counted lost and said so, and the command exits 130, no traceback of it."""
    env = _env(silent.endpoint, pipeline, OTEL_EXPORTER_OTLP_TIMEOUT="60000")  # deadline 5 s
    proc = _cli(tmp_path, env, "--debug", "demo", "--no-live")
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:  # --debug: the exit says when it starts waiting for the spans
        seen.append(line)
        if "tracing: flushing spans at exit" in line:
            break
    else:
        pytest.fail(f"the exit never waited for spans: {''.join(seen)[-2000:]}")
    proc.send_signal(signal.SIGINT)
    _, rest = _exit_after(proc, time.monotonic(), "the demo, interrupted in its exit wait")
    stderr = "".join(seen) + rest
    assert proc.returncode == 130, stderr[-2000:]
    assert "KeyboardInterrupt" not in stderr, stderr[-2000:]  # (--debug shows the demo's crash)
    assert _lost(stderr) == (demo_spans, "the exit was interrupted before they were exported")
    assert stderr.rstrip().endswith("subagent: interrupted"), stderr[-2000:]
