"""What a model call costs the client: CPU per `OpenAIModel.complete` of ~20 events streamed,
and of the same answer as one JSON body.

`python -m benchmarks model_stream [--n N] [--quick] [--json]`. A local server in its own
process (gevent, raw sockets: its CPU is not ours) answers every request with a Chat
Completions stream of 20 text deltas, one chunk each, then `[DONE]`, on a kept-alive
connection; a request under `/json/` gets the same text as one `application/json` answer with a
`Content-Length`. Each round runs N calls of each kind in a fresh interpreter and reports its
process CPU per call (after a warm-up). With `MODEL_STREAM_AGAINST=/path/to/another/tree` the
rounds alternate between this tree and that one (e.g. an export of `main` before a change), in
the same run, and the ratios of the medians are reported.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

DEFAULT_N = 2_000
QUICK_N = 100
ROUNDS = 5
QUICK_ROUNDS = 1
EVENTS = 20

_SERVER = r"""
import json, sys
from gevent.server import StreamServer

def chunk(data):
    return b"%x\r\n%s\r\n" % (len(data), data)

events = [{"id": "c", "object": "chat.completion.chunk",
           "choices": [{"index": 0, "delta": {"content": "token %d " % i}, "finish_reason": None}]}
          for i in range(int(sys.argv[1]))]
events.append({"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
body = b"".join(chunk(b"data: " + json.dumps(e).encode() + b"\n\n") for e in events)
body += chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"
head = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n")
text = "".join("token %d " % i for i in range(int(sys.argv[1])))
whole = json.dumps({"id": "c", "object": "chat.completion", "choices": [
    {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 20, "total_tokens": 25}}).encode()
json_reply = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(whole)) + whole

def handle(sock, _addr):
    buf = b""
    try:
        while True:
            while b"\r\n\r\n" not in buf:
                data = sock.recv(65536)
                if not data:
                    return
                buf += data
            headers, buf = buf.split(b"\r\n\r\n", 1)
            length = 0
            for line in headers.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            while len(buf) < length:
                buf += sock.recv(65536)
            buf = buf[length:]
            sock.sendall(json_reply if headers.startswith(b"POST /json/") else head + body)
    except OSError:
        pass
    finally:
        sock.close()

server = StreamServer(("127.0.0.1", 0), handle)
server.start()
print(server.server_port, flush=True)
server.serve_forever()
"""

_CLIENT = r"""
import json, sys, time
from agent.model import ModelRequest
from agent.models.openai import OpenAIModel
from supervision.signal import AbortSignal

url, n = sys.argv[1], int(sys.argv[2])
model = OpenAIModel(base_url=url + "/v1", api_key="k", max_retries=0)
whole = OpenAIModel(base_url=url + "/json/v1", api_key="k", max_retries=0)
request = ModelRequest(session_id="s", model="m", system="",
                       messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                       tools=(), signal=AbortSignal.never())
deltas = []
for _ in range(max(20, n // 20)):  # warm-up: connection, caches
    model.complete(request, deltas.append)
    whole.complete(request, deltas.append)
deltas.clear()
began = time.process_time()
for _ in range(n):
    answer = model.complete(request, deltas.append)
cpu = time.process_time() - began
assert len(deltas) == n * int(sys.argv[3]), len(deltas)
assert answer.finish == "stop"
deltas.clear()
began = time.process_time()
for _ in range(n):
    answer = whole.complete(request, deltas.append)
json_cpu = time.process_time() - began
assert len(deltas) == n and answer.finish == "stop", (len(deltas), answer.finish)
model.close()
whole.close()
print(json.dumps({"cpu_us_per_call": cpu / n * 1e6, "json_cpu_us_per_call": json_cpu / n * 1e6}))
"""


def _round(tree: Path, url: str, n: int) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run(
        [sys.executable, "-c", _CLIENT, url, str(n), str(EVENTS)],
        env=env,
        cwd=tree,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    figures: dict[str, float] = json.loads(out.splitlines()[-1])
    return figures


def run(n: int | None, args: argparse.Namespace) -> dict[str, Any]:
    quick = getattr(args, "quick", False)
    n = n or (QUICK_N if quick else DEFAULT_N)
    rounds = QUICK_ROUNDS if quick else ROUNDS
    ours = Path(__file__).resolve().parent.parent
    against = os.environ.get("MODEL_STREAM_AGAINST")
    server = subprocess.Popen(
        [sys.executable, "-c", _SERVER, str(EVENTS)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        url = f"http://127.0.0.1:{int(server.stdout.readline())}"
        mine: list[dict[str, float]] = []
        theirs: list[dict[str, float]] = []
        for _ in range(rounds):
            mine.append(_round(ours, url, n))
            if against:
                theirs.append(_round(Path(against), url, n))
    finally:
        server.kill()
        server.wait()
    figures: dict[str, Any] = {"calls_per_round": n, "events_per_call": EVENTS, "rounds": rounds}
    for kind, prefix in (("cpu_us_per_call", ""), ("json_cpu_us_per_call", "json_")):
        ours_kind = [r[kind] for r in mine]
        figures[kind] = round(statistics.median(ours_kind), 1)
        figures[f"{kind}_rounds"] = [round(x, 1) for x in ours_kind]
        if against:
            theirs_kind = [r[kind] for r in theirs]
            other = statistics.median(theirs_kind)
            figures[f"against_{kind}"] = round(other, 1)
            figures[f"against_{kind}_rounds"] = [round(x, 1) for x in theirs_kind]
            ratio = statistics.median(ours_kind) / other
            figures[f"{prefix}ratio_ours_over_against"] = round(ratio, 3)
    if against:
        figures["against"] = against
    return figures
