"""The gateway's view of its server replicas: health, load, and calls with one retry.

Health comes from polling the standard `grpc.health.v1` service every `health_interval` seconds,
so `/ready` follows the servers and a restarted server is used again without restarting the
gateway. Each chunk goes to the healthy replica with the fewest outstanding tokens; a failed call
is retried once on another one. A replica whose last FAILING_AFTER calls failed INTERNAL (an
engine that fails every batch fails fast, so it had the fewest outstanding tokens and drew the
traffic) is passed over for AVOID_SECONDS while another healthy one is there. Every call carries a deadline, so a dead or stuck replica gives
an error quickly instead of a hang.

A `--replica` is a server's `HOST:PORT`, or a source of them read again every
`resolve_interval` seconds: `dns:NAME:PORT` (every address the name resolves to: a Kubernetes
headless Service, one per ready pod) or `file:PATH` (one `HOST:PORT` per line, `#` comments).
Servers that appear are added; servers that disappear are dropped once their calls are done.

Each replica has an `id`, stable for its life in the pool: clients (`/ready`, error bodies, the
request log) see it, never an address. The `--replica HOST:PORT` flags are 0, 1, ... in their
order (the same in every gateway worker); servers a source finds are numbered on from there as
this worker finds them, and an id is never reused. The operator's metrics name replicas by
address.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import itertools
import logging
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from embedserve.contract import embed_stub
from embedserve.contract.local import LocalEmbedClient, local_socket_for
from embedserve.contract.secret import call_metadata
from embedserve.gateway.errors import ApiError

log = logging.getLogger("embedserve.gateway")
# the replicas (by id) the current request's calls went to, for its log line (set by the app)
REPLICAS_CALLED: contextvars.ContextVar[set[int] | None] = contextvars.ContextVar(
    "embedserve_replicas_called", default=None
)
# set for a request the native front waited on past `--request-timeout` (`native_front`): its
# calls have no time left, so it is answered as a call past its deadline, not run again
DEADLINE_PASSED: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "embedserve_deadline_passed", default=False
)

CHANNEL_OPTIONS = [
    # NOTE: the default reconnect backoff grows to two minutes; a restarted server must be
    # found again within about a second.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.max_receive_message_length", 256 << 20),
    ("grpc.max_send_message_length", 64 << 20),
]

# Codes after which another replica may well succeed.
RETRYABLE = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.CANCELLED,
}
# Codes of a server that failed the work itself (an engine failure), not the network.
ENGINE_FAILURES = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}
# After this many calls in a row answered with one of them, a replica is passed over for
# AVOID_SECONDS while another healthy one is there (it is tried again after; a success resets).
# NOTE: one bad request failing on every replica cannot take the pool down: with no other
# replica left, an avoided one is still chosen.
FAILING_AFTER = 3
AVOID_SECONDS = 10.0


# Servers in the gateway's own process (`serve --native`): a replica address -> its (embed,
# check) calls and its engine's outstanding tokens, registered by the process that holds both
# (`cli/native.py`) before its Python front starts. Such an address is a HOST:PORT no server
# listens on (`in-process:N`, N the model's place).
IN_PROCESS: dict[str, tuple[Any, Any, Callable[[], int]]] = {}
# Server processes the native front calls too (`cli/native_replicas.py`): a replica address ->
# the tokens of its calls there not yet answered, counted in this pool's view of the replica.
NATIVE_SENT: dict[str, Callable[[], int]] = {}


class Replica:
    def __init__(self, address: str, secret: str | None = None, id: int = 0) -> None:
        self.address = address
        self.id = id  # what clients see (see the module docstring)
        self.secret = secret  # the link secret sent with each gRPC call (`contract.secret`)
        self.healthy = False
        self.sent_tokens = 0  # of this pool's calls not yet answered
        # in process: the engine's own count, every front's calls in it (`IN_PROCESS`)
        self.engine_tokens: Callable[[], int] | None = None
        self.native_sent = NATIVE_SENT.get(address)  # the native front's calls (`NATIVE_SENT`)
        self.engine_failures = 0  # calls in a row answered INTERNAL / UNKNOWN
        self.avoid_until = 0.0  # time.monotonic() before which it is passed over
        self.channel: Any = None
        self.embed: Any = None
        self.check: Any = None

    @property
    def outstanding_tokens(self) -> int:
        """Tokens sent to it and not yet answered: in process, every front's (the native
        front's own requests beside this pool's calls); else this pool's and the native
        front's."""
        if self.engine_tokens is not None:
            return self.engine_tokens()
        return self.sent_tokens + (self.native_sent() if self.native_sent is not None else 0)

    def open(self) -> None:
        if self.address in IN_PROCESS:
            self.embed, self.check, self.engine_tokens = IN_PROCESS[self.address]
            return
        self.channel = grpc.aio.insecure_channel(self.address, options=CHANNEL_OPTIONS)
        # a server on this host is called over its unix socket (`contract.local`); gRPC for
        # the others, and for health everywhere
        local = local_socket_for(self.address)
        if local:
            self.embed = LocalEmbedClient(local)
        else:
            self.embed = functools.partial(
                embed_stub(self.channel), metadata=call_metadata(self.secret)
            )
        self.check = health_pb2_grpc.HealthStub(self.channel).Check

    async def close(self) -> None:
        if isinstance(self.embed, LocalEmbedClient):
            await self.embed.close()
        if self.channel is not None:
            await self.channel.close()


def to_api_error(error: grpc.aio.AioRpcError, replica: Replica) -> ApiError:
    """The client's error for a failed server call. NOTE: replicas are named by their id: a
    client never sees an internal address (the log keeps it), nor the transport's details,
    which carry addresses too."""
    index = replica.id
    code, details = error.code(), error.details() or ""
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return ApiError(400, details, param="input", code="invalid_value")
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return ApiError(429, f"server overloaded: {details}", code="overloaded")
    log.warning("replica %d (%s): %s %s", index, replica.address, code.name, details)
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return ApiError(503, f"server replica {index} unavailable: {code.name}", code="unavailable")
    return ApiError(
        500, f"server replica {index} failed: {code.name} {details}", code="server_error"
    )


def is_source(spec: str) -> bool:
    """A `--replica` that names servers to look up (`dns:` or `file:`), not one server."""
    return spec.startswith(("dns:", "file:"))


def check_replica(spec: str) -> None:
    """`HOST:PORT`, `dns:NAME:PORT` or `file:PATH`, else a ValueError saying so."""
    if spec.startswith("file:"):
        if not spec[5:]:
            raise ValueError(f"--replica file:PATH needs a path, got {spec!r}")
        return
    host, _, port = spec.removeprefix("dns:").rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--replica must be HOST:PORT, dns:NAME:PORT or file:PATH, got {spec!r}")


async def _addresses(spec: str) -> list[str] | None:
    """The servers a `--replica` stands for now (see the module docstring); None when the
    lookup failed (a DNS timeout, an unreadable file): then the replicas it had stay."""
    if spec.startswith("file:"):
        path = spec[5:]
        try:
            with open(path, encoding="utf-8") as f:
                lines = [line.split("#", 1)[0].strip() for line in f]
        except OSError as e:
            log.warning("replica file %s: %s (keeping the replicas it had)", path, e)
            return None
        found = [line for line in lines if line]
        for line in found:
            check_replica(line)
        return found
    if spec.startswith("dns:"):
        name, _, port = spec[4:].rpartition(":")
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(name, int(port), type=2)
        except socket.gaierror as e:
            if e.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)):
                return []  # no such name now (no pod ready yet): none, for now
            log.warning("replica name %s: %s (keeping the replicas it had)", name, e)
            return None  # a lookup that failed: not an answer
        except OSError as e:
            log.warning("replica name %s: %s (keeping the replicas it had)", name, e)
            return None
        hosts = sorted({str(info[4][0]) for info in infos})
        return [f"[{h}]:{port}" if ":" in h else f"{h}:{port}" for h in hosts]
    return [spec]


class ReplicaPool:
    def __init__(
        self,
        addresses: Sequence[str],
        *,
        secret: str | None = None,
        timeout: float = 30.0,
        health_interval: float = 0.5,
        resolve_interval: float = 5.0,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        """`on_change()`: a replica turned healthy or was added: the model behind the pool may
        have changed (a restart, a new version), so what was kept of its answers goes."""
        if not addresses:
            raise ValueError("a gateway needs at least one --replica HOST:PORT")
        self.sources = tuple(addresses)
        self.secret = secret
        fixed = [a for a in addresses if not is_source(a)]
        self.replicas = [Replica(a, secret, i) for i, a in enumerate(fixed)]
        self._ids = itertools.count(len(fixed))  # for the servers sources find
        self.timeout = timeout
        self.health_interval = health_interval
        self.resolve_interval = resolve_interval
        self.on_change = on_change
        self._poller: asyncio.Task[None] | None = None
        self._resolver: asyncio.Task[None] | None = None
        self._closing: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Open channels (inside the running loop) and poll health from now on."""
        for r in self.replicas:
            r.open()
        if any(is_source(s) for s in self.sources):
            await self.resolve_once()
            self._resolver = asyncio.create_task(self._resolve_forever(), name="replica-dns")
        await self.poll_once()
        self._poller = asyncio.create_task(self._poll_forever(), name="replica-health")

    async def resolve_once(self) -> None:
        """Look the sources up again: open the servers that appeared, drop the ones that went
        (closed once their outstanding calls are done)."""
        wanted: list[str] = []
        failed = False
        for spec in self.sources:
            found = await _addresses(spec)
            failed = failed or found is None
            wanted += found or []
        wanted = list(dict.fromkeys(wanted))
        have = {r.address: r for r in self.replicas}
        for address in wanted:
            if address not in have:
                replica = Replica(address, self.secret, next(self._ids))
                replica.open()
                self.replicas.append(replica)
                log.warning("replica %d (%s) added", replica.id, address)
                self.on_change()
        if failed:  # a lookup without an answer removes nothing
            return
        for replica in [r for r in self.replicas if r.address not in wanted]:
            self.replicas.remove(replica)
            log.warning("replica %d (%s) removed", replica.id, replica.address)
            task = asyncio.create_task(self._close_when_idle(replica))
            self._closing.add(task)  # NOTE: a reference, or the loop may drop the task
            task.add_done_callback(self._closing.discard)

    async def _close_when_idle(self, replica: Replica) -> None:
        # NOTE: a health check of it may still be in flight: closing the channel under it
        # would cancel it; wait out its deadline first
        await asyncio.sleep(self._check_timeout)
        while replica.outstanding_tokens > 0:
            await asyncio.sleep(self.health_interval)
        await replica.close()

    @property
    def _check_timeout(self) -> float:
        return max(1.0, 2 * self.health_interval)

    async def _resolve_forever(self) -> None:
        while True:
            await asyncio.sleep(self.resolve_interval)
            try:
                await self.resolve_once()
            except Exception as e:  # a bad line in a file: keep the replicas there are
                log.warning("replica lookup failed: %s", e)

    async def close(self) -> None:
        for task in (self._poller, self._resolver, *self._closing):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        for r in self.replicas:
            await r.close()

    @property
    def num_healthy(self) -> int:
        return sum(r.healthy for r in self.replicas)

    async def poll_once(self) -> None:
        await asyncio.gather(*(self._check(r) for r in self.replicas))

    async def _check(self, replica: Replica) -> None:
        timeout = self._check_timeout
        try:
            reply = await replica.check(health_pb2.HealthCheckRequest(service=""), timeout=timeout)
            healthy = reply.status == health_pb2.HealthCheckResponse.SERVING
        except Exception:  # any failed check means not healthy, and polling goes on
            healthy = False
        if healthy != replica.healthy:
            log.warning("replica %s is %s", replica.address, "healthy" if healthy else "DOWN")
        was, replica.healthy = replica.healthy, healthy
        if healthy and not was:
            self.on_change()

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(self.health_interval)
            try:
                await self.poll_once()
            except Exception as e:  # NOTE: never let the poller die: health would freeze
                log.warning("replica health polling: %s", e)

    def choose(self, exclude: Replica | None = None) -> Replica | None:
        """The healthy replica with the fewest outstanding tokens (not `exclude`), one whose
        calls keep failing INTERNAL (`avoid_until`) only when there is no other."""
        now = time.monotonic()
        best, best_key = None, (True, 0)
        for r in self.replicas:
            key = (r.avoid_until > now, r.outstanding_tokens)
            if r.healthy and r is not exclude and (best is None or key < best_key):
                best, best_key = r, key
        return best

    async def embed(self, request: Any, num_tokens: int) -> Any:
        """Send one chunk; on a retryable failure, once more to another replica."""
        replica = self.choose()
        if replica is None:
            raise ApiError(503, "no healthy server replica", code="no_healthy_replica")
        try:
            return await self._call(replica, request, num_tokens)
        except grpc.aio.AioRpcError as e:
            other = self.choose(exclude=replica) if e.code() in RETRYABLE else None
            if other is None:
                raise to_api_error(e, replica) from None
            log.warning("retrying on %s after %s from %s", other.address, e.code(), replica.address)
            try:
                return await self._call(other, request, num_tokens)
            except grpc.aio.AioRpcError as e2:
                raise to_api_error(e2, other) from None

    async def _call(self, replica: Replica, request: Any, num_tokens: int) -> Any:
        called = REPLICAS_CALLED.get()
        if called is not None:
            called.add(replica.id)
        replica.sent_tokens += num_tokens
        timeout = 0.0 if DEADLINE_PASSED.get() else self.timeout
        try:
            answer = await replica.embed(request, timeout=timeout)
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.UNAVAILABLE:
                replica.healthy = False  # until the next health check says otherwise
            elif e.code() in ENGINE_FAILURES:
                replica.engine_failures += 1
                if replica.engine_failures >= FAILING_AFTER:
                    if replica.avoid_until <= time.monotonic():
                        log.warning(
                            "replica %d (%s): %d calls in a row failed; avoided for %g s",
                            replica.id,
                            replica.address,
                            replica.engine_failures,
                            AVOID_SECONDS,
                        )
                    replica.avoid_until = time.monotonic() + AVOID_SECONDS
            raise
        finally:
            replica.sent_tokens -= num_tokens
        replica.engine_failures = 0
        replica.avoid_until = 0.0
        return answer
