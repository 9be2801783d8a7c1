"""The `ray` provider: children hosted on a Ray cluster, many per long-lived `ChildHost` actor.

A pool of `ChildHost` actors (see `providers.ray_host`) each runs its own `Runtime` with many
in-process children; one Ray actor per child would cost a worker process and seconds each.
Placement picks the least-loaded healthy host (fewest live runs this provider placed there).

Remote identity per the seed: `run.id` is a fresh parent-scoped id (or exactly the continuation
session id of a continuable child), `local_agent` is None. Every start-time capability is
supported (the host runs our own agent core), runs are `Steerable`, the provider is `Resumable`.

Never blocking the hub. Ray object refs are awaited by one greenlet per provider that polls
`ray.wait(..., timeout=0)` with a short adaptive `gevent.sleep` between polls, so any number of
children are awaited at once. `ray.init` (which spawns the local cluster's processes and ties
them to the calling thread's life) runs on a dedicated driver thread (`LocalRay`); actor
creation and `ray.kill` run in the hub's thread pool.

Traffic. Commands (start, steer, cancel, dispose, resume, recover) are batched per host per hub
tick and numbered; the host re-orders batches and answers through one ordered event stream per
host (published, progress, settled, steer replies, disposed), long-polled by one greenlet per
host. So a child's progress always reaches the parent's listeners before its result settles.

Host death. A dead host is restarted by Ray (`max_restarts`); the provider notices (a failed
poll, or a new incarnation token), resolves the host's one-shot children `error` with a
diagnostic, and re-establishes its continuable children from their logs in the shared store on
the least-loaded healthy host (transparently: the run's `result` keeps pending).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import threading
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import gevent
from gevent.event import AsyncResult
from gevent.event import Event as GEvent
from gevent.lock import Semaphore

from actors.gevent_actor import GeventFuture
from agent import tracing
from providers.local_run import clip_diagnostic
from providers.ray_host import ChildHost
from providers.ray_runtime import HostConfig, HostSetup, RuntimeFactory, result_from_json
from providers.remote_run import RemoteRun
from subagent.errors import SubagentError
from subagent.types import (
    ABORTED,
    ERROR,
    AgentView,
    MessageSource,
    SubagentCapabilities,
    SubagentResult,
    SubagentResumeRequest,
    SubagentStartRequest,
    depth_of,
)
from supervision.group import TaskGroup
from supervision.offload import offload
from supervision.signal import AbortSignal

if TYPE_CHECKING:
    from ray import ObjectRef
    from ray.actor import ActorHandle

__all__ = ["LocalRay", "RayConfig", "RayProvider", "RayRun"]

log = logging.getLogger(__name__)

T = TypeVar("T")

ProgressCallback = Callable[[Mapping[str, Any]], None]

_POLL_MIN = 0.0005
_POLL_MAX = 0.01
_MAX_BATCH = 256


def _ray() -> types.ModuleType:
    try:
        import ray
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise SubagentError(
            "START_FAILED",
            "the ray provider needs the `ray` extra: pip install 'subagent-runtime[ray]'",
        ) from exc
    return ray


class LocalRay:
    """`ray.init` / `ray.shutdown` on a dedicated, long-lived driver thread.

    `ray.init` blocks for seconds and the processes it starts die with the *thread* that started
    them (Linux parent-death signal), so it can neither run on the hub nor in a pool thread that
    may retire. Both calls are cooperative for the calling greenlet.
    """

    def __init__(self, **init_options: object) -> None:
        self.init_options = init_options
        self._started = threading.Event()
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._main, name="ray-driver", daemon=True)
            self._thread.start()
        offload(self._started.wait)
        if self._error is not None:
            raise self._error

    def _main(self) -> None:
        ray = _ray()
        try:
            ray.init(**self.init_options)
        except BaseException as exc:
            self._error = exc
            self._started.set()
            self._stopped.set()
            return
        self._started.set()
        self._stop.wait()
        try:
            ray.shutdown()
        finally:
            self._stopped.set()

    def shutdown(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        offload(self._stopped.wait)


@dataclass(frozen=True)
class RayConfig:
    """How the provider reaches Ray and builds its host pool.

    `address`: None uses an already initialised Ray, else starts a local one (`init_options`,
    e.g. `{"num_cpus": 2}`); `"auto"` joins the cluster this machine belongs to; `"ray://host:
    10001"` connects through Ray Client. `store_dir` must be one directory every host reaches
    (a shared mount on a real cluster); give the parent's runtime the same directory when it
    uses continuable children. `runtime_factory` builds each host's runtime; the provider sits
    below the runtime in the layers, so the face supplies it: build the config as
    `subagent.RayConfig`, whose default is `subagent.Runtime`.
    """

    store_dir: str
    address: str | None = None
    pool_size: int = 2
    name: str = "ray"
    host_setup: HostSetup | None = None
    durability: str = "turn"
    max_restarts: int = 3
    host_num_cpus: float = 1.0
    host_max_concurrency: int = 4
    host_options: Mapping[str, Any] = field(default_factory=dict)
    init_options: Mapping[str, Any] = field(default_factory=dict)
    relay_progress: bool = True
    on_progress: ProgressCallback | None = None
    poll_timeout: float = 0.5
    runtime_factory: RuntimeFactory | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.store_dir, (str, os.PathLike)) or not str(self.store_dir):
            raise ValueError("store_dir must be a directory path")
        if not isinstance(self.pool_size, int) or self.pool_size < 1:
            raise ValueError("pool_size must be a positive int")
        if not isinstance(self.name, str) or not self.name:
            raise ValueError("name must be a non-empty string")
        if self.max_restarts < 0:
            raise ValueError("max_restarts must be >= 0 (-1 is not supported: say how many)")
        if self.host_max_concurrency < 2:
            raise ValueError("host_max_concurrency must be >= 2 (polls and commands overlap)")
        if self.on_progress is not None and not callable(self.on_progress):
            raise TypeError("on_progress must be callable")
        if self.runtime_factory is not None and not callable(self.runtime_factory):
            raise TypeError("runtime_factory must be callable")


class _RefWaiter:
    """Awaits Ray object refs for greenlets: one polling greenlet, `ray.wait(timeout=0)`."""

    def __init__(self) -> None:
        self._pending: dict[Any, AsyncResult] = {}
        self._loop: gevent.Greenlet | None = None
        self._tasks = TaskGroup("ray-ref-waiter")

    def wait(self, ref: ObjectRef[T]) -> T:
        result: AsyncResult = AsyncResult()
        self._pending[ref] = result
        if self._loop is None or self._loop.dead:
            self._loop = self._tasks.spawn(self._run)
        value: T = result.get()
        return value

    def close(self) -> None:
        """End the polling greenlet; a wait still pending fails with RUNTIME_CLOSED."""
        self._tasks.close()

    def _run(self) -> None:
        try:
            self._poll()
        except gevent.GreenletExit:
            pending, self._pending = self._pending, {}
            for waiter in pending.values():
                waiter.set_exception(SubagentError("RUNTIME_CLOSED", "the ray provider closed"))
            raise

    def _poll(self) -> None:
        ray = _ray()
        pause = _POLL_MIN
        while self._pending:
            refs = list(self._pending)
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=True)
            for ref in ready:
                waiter = self._pending.pop(ref)
                try:
                    waiter.set(ray.get(ref, timeout=0))
                except Exception as exc:
                    waiter.set_exception(exc)
            if ready:
                pause = _POLL_MIN
                gevent.sleep(0)
            else:
                gevent.sleep(pause)
                pause = min(pause * 2, _POLL_MAX)


class _Host:
    """The provider's view of one `ChildHost` actor."""

    def __init__(self, index: int, handle: ActorHandle[Any]) -> None:
        self.index = index
        self.handle = handle
        self.incarnation = ""
        self.cursor = 0
        self.seq = 0
        self.runs: dict[str, RayRun] = {}
        self.outbox: list[tuple[Any, ...]] = []
        self.flushing = False
        self.healthy = False
        self.dead = False
        self.generation = 0
        self.restarts = 0


class RayRun(RemoteRun):
    """One activation of a child on a Ray host. `result` never fails for child-level failures."""

    def __init__(
        self,
        provider: RayProvider,
        key: str,
        spec: dict[str, Any],
        signal: AbortSignal,
        *,
        continuable: bool,
        recovery: dict[str, Any] | None,
        on_progress: ProgressCallback | None,
    ) -> None:
        super().__init__(key)
        self._provider = provider
        self._spec = spec
        self._recovery = recovery
        self.continuable = continuable
        self._on_progress = on_progress
        self._published = GEvent()
        self._failure: SubagentError | None = None
        self._disposing = False
        self._disposed = GEvent()
        self._steers: dict[int, GeventFuture[None]] = {}
        self._tokens = 0
        self.host: _Host | None = None
        self.session_id: str | None = None
        self.message_id: str | None = None
        self.recoveries = 0
        self._remove_listener = signal.add_listener(self._on_abort)

    def __repr__(self) -> str:
        where = None if self.host is None else self.host.index
        return f"<RayRun {self._id} host={where} settled={self._settled}>"

    @property
    def steers_in_flight(self) -> int:
        """Steers sent to the host and not answered yet. Each entry leaves on its outcome: the
        host's answer (admitted, refused, the turn ended), a cancel (the host refuses what its
        ended turn did not admit), the host's death, the run's disposal or detachment. A caller
        that stopped waiting (`get(timeout=...)`) leaves its steer in flight: the host may still
        admit it. So the parent holds no more than the host has not answered, which the host
        bounds (`max_pending_steers`: one past it is answered `INBOX_FULL`)."""
        return len(self._steers)

    # -- caller operations ---------------------------------------------------------------------

    def steer(
        self, content: Sequence[Mapping[str, Any]], source: MessageSource
    ) -> GeventFuture[None]:
        future: GeventFuture[None] = GeventFuture()
        if self._disposing:
            return _failed(future, SubagentError("RUN_DISPOSED"))
        if self._settled:
            return _failed(future, SubagentError("RUN_TERMINAL", "the run has settled"))
        host = self.host
        if host is None or not host.healthy:
            return _failed(future, SubagentError("RUN_TERMINAL", "the run's host is unavailable"))
        self._tokens += 1
        token = self._tokens
        self._steers[token] = future
        content_json = [dict(b) for b in content]
        self._provider.send(host, ("steer", self._id, token, content_json, source.to_json()))
        return future

    def cancel(self, cause: object = None) -> None:
        """Abort the running turn; the result settles `aborted` unless it already completed."""
        if self._settled or self._disposing:
            return
        host = self.host
        why = "cancelled" if cause is None else str(cause)
        if host is not None and host.healthy:
            self._provider.send(host, ("cancel", self._id, why))
        else:
            self._settle(SubagentResult(output=[], stop_reason=ABORTED, diagnostic=why))

    def dispose(self) -> None:
        """Dispose the child on its host and return once the host reports quiescence."""
        if not self._disposing:
            self._disposing = True
            self._remove_listener()
            host = self.host
            if host is not None and host.healthy:
                self._provider.send(host, ("dispose", self._id))
            else:
                self._finish_dispose()
        self._disposed.wait()

    # -- events from the host (hub) ------------------------------------------------------------

    def on_event(self, event: Mapping[str, Any]) -> None:
        kind = event["k"]
        if kind == "progress":
            self._progress(event["event"])
        elif kind == "published":
            self.session_id = event["session_id"]
            self.message_id = event["message_id"]
            self._published.set()
        elif kind == "settled":
            self._settle(result_from_json(event["result"]))
        elif kind == "fault":
            self._fault(RuntimeError(f"the child's host reported a fault: {event['message']}"))
        elif kind == "steer":
            future = self._steers.pop(event["token"], None)
            if future is not None:
                if event["code"] is None:
                    future.set(None)
                else:
                    _failed(future, SubagentError(event["code"], event["message"]))
        elif kind == "failed":
            error = SubagentError(event["code"], event["message"])
            if self._disposing:
                # The host forgot the run: no `disposed` event will follow.
                self._finish_dispose()
                return
            if not self._published.is_set():
                self._failure = error
                self._published.set()
            else:
                self._settle(_error_result(f"re-establishing the child failed: {error}"))
            self._detach()
        elif kind == "disposed":
            self._finish_dispose()

    def _progress(self, event: Mapping[str, Any]) -> None:
        tagged = {**event, "run_id": self._id, "provider": self._provider.name}
        if self.host is not None:
            tagged["host"] = self.host.index
        if self._on_progress is not None:
            try:
                self._on_progress(tagged)
            except Exception:
                log.exception("ray run %s: progress listener raised", self._id)
        callback = self._provider.config.on_progress
        if callback is not None:
            try:
                callback(tagged)
            except Exception:
                log.exception("ray run %s: on_progress raised", self._id)

    def host_lost(self, why: str) -> None:
        """The host died: recover a continuable activation, else resolve `error`."""
        self.host = None
        self._fail_steers(SubagentError("RUN_TERMINAL", f"the child's host died: {why}"))
        if self._disposing:
            self._settle(SubagentResult(output=[], stop_reason=ABORTED, diagnostic="disposed"))
            self._finish_dispose()
            return
        if self._settled:
            return
        if self.continuable and self._recovery is not None:
            self._provider.recover_later(self, why)
            return
        diagnostic = f"the Ray host running this child died: {why}"
        if not self._published.is_set():
            self._failure = SubagentError("START_FAILED", diagnostic)
            self._published.set()
            return
        self._settle(_error_result(diagnostic))

    def give_up(self, result: SubagentResult) -> None:
        """Nothing can run this child any more: settle it with `result`, release its start."""
        self._settle(result)
        self._published.set()

    def abandon_start(self) -> None:
        """The start failed before the child was placed: stop listening for its abort."""
        self._remove_listener()

    def wait_published(self, signal: AbortSignal) -> None:
        """Wait until the host published the child (or `signal` aborts); raise a start failure."""
        remove = signal.add_listener(lambda _reason: self._published.set())
        try:
            self._published.wait()
        finally:
            remove()
        if self._failure is not None:
            self._remove_listener()
            self._detach()
            raise self._failure

    def recovery_spec(self) -> dict[str, Any]:
        assert self._recovery is not None
        return {**self._recovery, "message_id": self.message_id}

    # -- settlement ----------------------------------------------------------------------------

    def _on_abort(self, reason: object) -> None:
        self.cancel(reason)

    def _settle(self, result: SubagentResult) -> None:
        self._resolve(result)

    def _detach(self) -> None:
        host = self.host
        if host is not None and host.runs.get(self._id) is self:
            del host.runs[self._id]
        self.host = None
        # No event of this run is routed to it any more: a steer reply the host posts after
        # its `disposed` (its steer greenlet woke late) would never settle these.
        if self._steers:
            why = "the run left its host before answering"
            self._fail_steers(
                SubagentError("RUN_DISPOSED", why)
                if self._disposing
                else SubagentError("RUN_TERMINAL", why)
            )

    def _fail_steers(self, error: SubagentError) -> None:
        steers, self._steers = self._steers, {}
        for future in steers.values():
            _failed(future, error)

    def _finish_dispose(self) -> None:
        self._settle(SubagentResult(output=[], stop_reason=ABORTED, diagnostic="disposed"))
        self._detach()
        self._disposed.set()


class RayProvider:
    """Runs children on a pool of `ChildHost` Ray actors. Call `close()` when done."""

    # The child runs in another process: its activation span is a CLIENT (docs/tracing.md).
    remote_process = True

    def __init__(self, config: RayConfig) -> None:
        if not isinstance(config, RayConfig):
            raise TypeError(f"config must be a RayConfig, got {type(config).__name__}")
        if config.runtime_factory is None:
            raise TypeError(
                "RayConfig.runtime_factory is None: build the config as subagent.RayConfig "
                "(each host composes subagent.Runtime) or pass the factory of your runtime"
            )
        self.config = config
        self._runtime_factory: RuntimeFactory = config.runtime_factory
        self._hosts: list[_Host] = []
        self._waiter = _RefWaiter()
        self._connect_lock = Semaphore()
        self._connected = False
        self._closed = False
        self._local_ray: LocalRay | None = None
        self._pool_changed = GEvent()
        # Poll loops, revivers, flushers and recoveries: all end when the provider closes.
        self._tasks = TaskGroup("ray-provider")

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def capabilities(self) -> SubagentCapabilities:
        # Not `token_budget`: the parent cannot see a Ray child's usage, so it cannot hold it.
        return dataclasses.replace(SubagentCapabilities.all(), token_budget=False)

    @property
    def inherits_parent_context(self) -> bool:
        return False

    # -- pool ------------------------------------------------------------------------------------

    def connect(self) -> None:
        """Initialise Ray if needed and start the host pool (cooperative; idempotent)."""
        with self._connect_lock:
            if self._closed:
                raise SubagentError("RUNTIME_CLOSED", "the ray provider is closed")
            if self._connected:
                return
            # Importing Ray takes a good fraction of a second: not on the hub.
            ray = offload(_ray)
            if not ray.is_initialized():
                options = dict(self.config.init_options)
                if self.config.address is not None:
                    options["address"] = self.config.address
                local = LocalRay(**options)
                local.start()
                self._local_ray = local
            host_config = HostConfig(
                store_dir=str(self.config.store_dir),
                runtime_factory=self._runtime_factory,
                durability=self.config.durability,
                setup=self.config.host_setup,
                relay_progress=self.config.relay_progress,
            )
            handles = offload(self._create_hosts, host_config)
            self._hosts = [_Host(i, h) for i, h in enumerate(handles)]
            for host in self._hosts:
                reply: dict[str, Any] = self._waiter.wait(host.handle.ready.remote())
                self._become_healthy(host, reply)
            self._connected = True

    def _create_hosts(self, host_config: HostConfig) -> list[Any]:
        ray = _ray()
        actor_class = ray.remote(ChildHost)
        options: dict[str, Any] = {
            "max_restarts": self.config.max_restarts,
            "max_task_retries": 0,
            "num_cpus": self.config.host_num_cpus,
            "max_concurrency": self.config.host_max_concurrency,
        }
        options.update(self.config.host_options)
        return [
            actor_class.options(**options).remote(host_config) for _ in range(self.config.pool_size)
        ]

    def _become_healthy(self, host: _Host, reply: Mapping[str, Any]) -> None:
        host.incarnation = reply["incarnation"]
        host.cursor = 0
        host.seq = 0
        host.healthy = True
        self._tasks.spawn(self._poll_loop, host)
        self._pool_changed.set()
        self._pool_changed = GEvent()

    def hosts(self) -> list[dict[str, Any]]:
        """Per host: index, actor handle, health, live runs, restarts seen."""
        return [
            {
                "index": h.index,
                "handle": h.handle,
                "healthy": h.healthy,
                "dead": h.dead,
                "live": len(h.runs),
                "restarts": h.restarts,
                "incarnation": h.incarnation,
            }
            for h in self._hosts
        ]

    def run_setup(self, setup: HostSetup) -> None:
        """Run `setup(runtime)` on every healthy host now (a restarted host runs the config's)."""
        for host in self._hosts:
            if host.healthy:
                self._waiter.wait(host.handle.run_setup.remote(setup))

    def kill_host(self, index: int) -> None:
        """Kill one host process as a crash would (Ray restarts it): for tests and drills."""
        ray = _ray()
        handle = self._hosts[index].handle
        offload(lambda: ray.kill(handle, no_restart=False))

    def _place(self) -> _Host:
        """The least-loaded healthy host; waits while every host is restarting."""
        while True:
            if self._closed:
                raise SubagentError("RUNTIME_CLOSED", "the ray provider is closed")
            healthy = [h for h in self._hosts if h.healthy]
            if healthy:
                return min(healthy, key=lambda h: (len(h.runs), h.index))
            if all(h.dead for h in self._hosts):
                raise SubagentError("START_FAILED", "every Ray host of the pool is dead")
            self._pool_changed.wait()

    # -- commands and events -------------------------------------------------------------------

    def send(self, host: _Host, command: tuple[Any, ...]) -> None:
        """Queue one command for `host`; a flushing greenlet submits the batch."""
        host.outbox.append(command)
        if not host.flushing:
            host.flushing = True
            self._tasks.spawn(self._flush, host)

    def _flush(self, host: _Host) -> None:
        try:
            while host.outbox and host.healthy:
                batch, host.outbox = host.outbox[:_MAX_BATCH], host.outbox[_MAX_BATCH:]
                host.handle.submit.remote(host.incarnation, host.seq, batch)
                host.seq += 1
                if host.outbox:
                    gevent.sleep(0)
        except Exception as exc:
            log.exception("submitting to ray host %d failed", host.index)
            self._host_failed(host, f"submit failed: {exc}")
        finally:
            host.flushing = False

    def _poll_loop(self, host: _Host) -> None:
        generation = host.generation
        while not self._closed and host.healthy and host.generation == generation:
            ref: ObjectRef[dict[str, Any]] = host.handle.poll.remote(
                host.incarnation, host.cursor, self.config.poll_timeout
            )
            try:
                reply = self._waiter.wait(ref)
            except Exception as exc:
                if not self._closed:
                    self._host_failed(host, f"{type(exc).__name__}: {exc}")
                return
            if host.generation != generation:
                return
            if reply["incarnation"] != host.incarnation:
                self._host_failed(host, "the host was restarted")
                return
            host.cursor = reply["cursor"]
            for event in reply["events"]:
                run = host.runs.get(event["run"])
                if run is None:
                    continue
                try:
                    run.on_event(event)
                except Exception:
                    log.exception("ray host %d: handling %s failed", host.index, event.get("k"))

    def _host_failed(self, host: _Host, why: str) -> None:
        if not host.healthy:
            return
        log.warning("ray host %d failed: %s", host.index, clip_diagnostic(why))
        host.healthy = False
        host.generation += 1
        host.restarts += 1
        host.outbox.clear()
        runs, host.runs = list(host.runs.values()), {}
        for run in runs:
            run.host_lost(clip_diagnostic(why))
        self._tasks.spawn(self._revive, host)

    def _revive(self, host: _Host) -> None:
        """Wait for Ray to restart the host actor; give up when Ray says it is dead for good."""
        ray = _ray()
        for _ in range(600):
            if self._closed:
                return
            try:
                reply: dict[str, Any] = self._waiter.wait(host.handle.ready.remote())
            except ray.exceptions.ActorUnavailableError:
                gevent.sleep(0.1)
                continue
            except ray.exceptions.RayActorError as exc:
                log.error("ray host %d is dead for good: %s", host.index, exc)
                host.dead = True
                self._pool_changed.set()
                self._pool_changed = GEvent()
                return
            self._become_healthy(host, reply)
            return
        host.dead = True

    def recover_later(self, run: RayRun, why: str) -> None:
        """Place a continuable run whose host died on another host, off the caller's greenlet.

        Once the provider is closed the recovery fails at once (nothing to place it on), so it
        runs inline: a greenlet spawned now would be killed by `close` before it settled the run.
        """
        if self._closed:
            self._recover(run, why)
        else:
            self._tasks.spawn(self._recover, run, why)

    def _recover(self, run: RayRun, why: str) -> None:
        try:
            host = self._place()
        except SubagentError as exc:
            run.give_up(_error_result(f"the child's host died ({why}) and {exc.detail}"))
            return
        run.recoveries += 1
        run.host = host
        host.runs[run.id] = run
        self.send(host, ("recover", run.id, run.recovery_spec()))

    # -- the seam --------------------------------------------------------------------------------

    def start(self, request: SubagentStartRequest) -> RayRun:
        """Place the child on the least-loaded host; return once the host published it."""
        _raise_if_aborted(request.signal)
        self.connect()
        parent = request.parent
        parent_spec = _parent_spec(parent)
        continuation = request.continuation
        cont_json = None
        if continuation is not None:
            cont_json = {
                "session_id": continuation.session_id,
                "descriptor": _descriptor_json(continuation.descriptor),
            }
            key = continuation.session_id
        else:
            key = f"{parent.id}.ray-{secrets.token_hex(8)}"
        spec: dict[str, Any] = {
            "prompt": [dict(b) for b in request.prompt],
            "parent": parent_spec,
            "agent_options": request.agent_options,
            "output_schema": None if request.output_schema is None else dict(request.output_schema),
            "max_depth": request.max_depth,
            "depth": depth_of(request),  # the child's, computed once by the service
            "tool_filter": request.tool_filter,
            "persona": request.persona,
            "continuation": cont_json,
            "trace": tracing.carrier(request.trace),  # W3C traceparent: the host joins the trace
            "trace_name": getattr(request.trace, "name", None),
        }
        recovery = None
        if cont_json is not None:
            recovery = {
                "session_id": key,
                "descriptor": cont_json["descriptor"],
                "parent": parent_spec,
                "output_schema": spec["output_schema"],
                "start": spec,
            }
        run = self._new_run(key, spec, request.signal, recovery, parent)
        return self._establish(run, "start", spec, request.signal)

    def resume(self, request: SubagentResumeRequest) -> RayRun:
        """Cold-resume a stored continuable child on the least-loaded host, for one turn."""
        _raise_if_aborted(request.signal)
        self.connect()
        parent_spec = _parent_spec(request.parent)
        descriptor_json = _descriptor_json(request.descriptor)
        spec: dict[str, Any] = {
            "session_id": request.session_id,
            "prompt": [dict(b) for b in request.prompt],
            "source": request.source.to_json(),
            "parent": parent_spec,
            "descriptor": descriptor_json,
            "trace": tracing.carrier(request.trace),
            "trace_name": getattr(request.trace, "name", None),
        }
        recovery = {
            "session_id": request.session_id,
            "descriptor": descriptor_json,
            "parent": parent_spec,
            "output_schema": None,
        }
        run = self._new_run(request.session_id, spec, request.signal, recovery, request.parent)
        return self._establish(run, "resume", spec, request.signal)

    def _new_run(
        self,
        key: str,
        spec: dict[str, Any],
        signal: AbortSignal,
        recovery: dict[str, Any] | None,
        parent: object,
    ) -> RayRun:
        relay = None
        if self.config.relay_progress:
            service = getattr(getattr(parent, "ctx", None), "subagents", None)
            relay = getattr(service, "relay_progress", None)
        return RayRun(
            self,
            key,
            spec,
            signal,
            continuable=recovery is not None,
            recovery=recovery,
            on_progress=relay,
        )

    def _establish(self, run: RayRun, op: str, spec: dict[str, Any], signal: AbortSignal) -> RayRun:
        try:
            host = self._place()
        except BaseException:
            run.abandon_start()
            raise
        run.host = host
        host.runs[run.id] = run
        self.send(host, (op, run.id, spec))
        run.wait_published(signal)
        if signal.aborted:
            run.dispose()
            raise SubagentError("ABORTED", f"the start was aborted: {signal.reason}")
        return run

    def close(self) -> None:
        """Close every host (its children first), kill the actors, stop an owned local Ray."""
        if self._closed:
            return
        self._closed = True
        self._pool_changed.set()
        ray = _ray() if self._hosts else None
        for host in self._hosts:
            if host.healthy:
                try:
                    self._waiter.wait(host.handle.close.remote())
                except Exception:
                    log.exception("closing ray host %d failed", host.index)
            host.healthy = False
            runs, host.runs = list(host.runs.values()), {}
            for run in runs:
                run.host_lost("the provider was closed")
        if ray is not None:
            handles = [h.handle for h in self._hosts]
            offload(lambda: [ray.kill(h, no_restart=True) for h in handles])
        self._tasks.close()
        self._waiter.close()
        if self._local_ray is not None:
            self._local_ray.shutdown()
            self._local_ray = None


def _parent_spec(parent: AgentView) -> dict[str, Any]:
    parent_id = getattr(parent, "id", None)
    if not isinstance(parent_id, str):
        raise TypeError("request.parent must be an agent (with a string id)")
    return {
        "id": parent_id,
        "cwd": str(getattr(parent, "cwd", "") or os.getcwd()),
        "depth": int(getattr(parent, "depth", 0)),
        "model": parent.options.model,
    }


def _descriptor_json(descriptor: object) -> dict[str, Any]:
    data = descriptor.to_json() if hasattr(descriptor, "to_json") else descriptor
    if not isinstance(data, Mapping):
        raise TypeError("a continuation descriptor must be a SubagentDescriptor or its JSON")
    return dict(data)


def _error_result(diagnostic: str) -> SubagentResult:
    return SubagentResult(output=[], stop_reason=ERROR, diagnostic=clip_diagnostic(diagnostic))


def _failed(future: GeventFuture[None], exc: BaseException) -> GeventFuture[None]:
    future.set_exception((type(exc), exc, None))
    return future


def _raise_if_aborted(signal: AbortSignal) -> None:
    if signal.aborted:
        raise SubagentError("ABORTED", f"the start was aborted: {signal.reason}")
