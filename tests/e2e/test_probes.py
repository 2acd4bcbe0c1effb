"""The Kubernetes probes of deploy/kubernetes, sent the way the kubelet sends them, to a server
and a gateway started from the manifests' own command lines with API keys and `--allowed-host`
added: every probe passes. And `serve --allowed-host NAME` starts (its start-up probe sends the
bind address, which is not NAME)."""

from __future__ import annotations

import http.client
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Proc, free_port
from tests.test_deploy import containers

pytestmark = pytest.mark.slow

KEY = "sk-probe-test-0123456789"
NAME = "api.example.com"  # the public name the gateway answers; probes send the pod IP instead
PROBES = ("startupProbe", "readinessProbe", "livenessProbe")


def command_line(kind: str, replace: dict[str, str | None], extra: list[str]) -> list[str]:
    """The manifest container's args (without `embedserve`), `--flag=value` swapped for
    `replace[flag]` (None: dropped), then `extra`; every flag replaced must be there."""
    (container,) = containers(kind)
    args, found = [], set()
    for arg in container["args"][1:]:
        flag = arg.partition("=")[0]
        if flag in replace:
            found.add(flag)
            if replace[flag] is not None:
                args.append(f"{flag}={replace[flag]}")
        else:
            args.append(arg)
    assert found == set(replace), f"the {kind} manifest lost {set(replace) - found}"
    return args + extra


def probes(kind: str) -> list[tuple[str, dict[str, Any], int]]:
    """Each probe of the container: its name, its handler, and the container port it targets."""
    (container,) = containers(kind)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    out = []
    for name in PROBES:
        if name in container:
            handler = container[name].get("httpGet") or container[name].get("grpc")
            assert handler is not None, f"{kind} {name}: only httpGet and grpc probes are tested"
            port = handler["port"]
            out.append((name, container[name], ports.get(port, port)))
    return out


def kubelet_get(port: int, handler: dict[str, Any]) -> tuple[int, bytes]:
    """An httpGet probe as the kubelet sends it: to the pod IP (here 127.0.0.1), Host the IP and
    port, its own User-Agent, the probe's headers and nothing else (no key)."""
    assert handler.get("scheme", "HTTP") == "HTTP"
    headers = {"Host": f"127.0.0.1:{port}", "User-Agent": "kube-probe/1.30", "Accept": "*/*"}
    headers |= {h["name"]: h["value"] for h in handler.get("httpHeaders", [])}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", handler["path"], headers=headers)
        reply = conn.getresponse()
        return reply.status, reply.read()
    finally:
        conn.close()


def grpc_check(port: int, handler: dict[str, Any]) -> int:
    """A grpc probe (the kubelet's, or grpc_health_probe's): grpc.health.v1 Check of the probe's
    service ("" when none), without the link secret; the status it answers."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        request = health_pb2.HealthCheckRequest(service=handler.get("service", ""))
        return int(stub.Check(request, timeout=5).status)


def poll(want: int, check: Callable[..., int], *args: Any) -> list[int]:
    """What `check(*args)` answered, called every 0.5 s (a short probe period) until it was
    `want`, for at most 30 s."""
    seen = [check(*args)]
    deadline = time.monotonic() + 30
    while seen[-1] != want and time.monotonic() < deadline:
        time.sleep(0.5)
        seen.append(check(*args))
    return seen


def kubelet_status(port: int, handler: dict[str, Any]) -> int:
    return kubelet_get(port, handler)[0]


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, int]]:
    """A server and a gateway as the manifests start them (CPU, loopback, free ports, the
    bundled model), the gateway with `--api-key-file` and `--allowed-host`; their ports by the
    manifests' container ports."""
    folder: Path = tmp_path_factory.mktemp("deployed")
    (folder / "link-secret").write_text("a-long-random-link-secret-for-the-test\n")
    (folder / "keys").write_text(f"{KEY}\n")
    grpc_port, http_port = free_port(), free_port()
    secret = str(folder / "link-secret")
    server = Proc(*command_line("server", {
        "--model": None, "--device": "cpu", "--host": "127.0.0.1", "--port": str(grpc_port),
        "--link-secret-file": secret, "--metrics-port": "0",
    }, []))  # fmt: skip
    gateway = None
    try:
        server.wait_for(r"embedserve server: ready on")
        gateway = Proc(*command_line("gateway", {
            "--model": None, "--host": "127.0.0.1", "--port": str(http_port),
            "--replica": f"127.0.0.1:{grpc_port}", "--link-secret-file": secret,
        }, [f"--api-key-file={folder / 'keys'}", f"--allowed-host={NAME}"]))  # fmt: skip
        gateway.wait_for(r"embedserve gateway: listening on", timeout=150)
        (s,) = containers("server")
        (g,) = containers("gateway")
        by_name = {p["name"]: p["containerPort"] for p in s["ports"] + g["ports"]}
        yield {by_name["grpc"]: grpc_port, by_name["http"]: http_port}
    finally:
        if gateway is not None:
            gateway.stop()
        server.stop()


@pytest.mark.parametrize("kind", ["gateway", "server"])
def test_every_probe_of_the_manifests_passes_with_keys_and_allowed_hosts(
    deployed: dict[str, int], kind: str
) -> None:
    assert probes(kind), f"the {kind} manifest has no probes"
    for name, probe, container_port in probes(kind):
        port = deployed[container_port]
        if "httpGet" in probe:
            handler = probe["httpGet"]
            seen = poll(200, kubelet_status, port, handler)
            # readiness may be 503 until the gateway has checked its replica, never 401 or 421
            assert seen[-1] == 200 and set(seen) <= {200, 503}, (kind, name, seen)
            assert kubelet_get(port, handler)[0] == 200, (kind, name)
        else:
            serving = 1  # grpc.health.v1 HealthCheckResponse.SERVING
            seen = poll(serving, grpc_check, port, probe["grpc"])
            assert seen[-1] == serving, (kind, name, seen)


def test_readiness_without_a_key_tells_the_status_only(deployed: dict[str, int]) -> None:
    (container,) = containers("gateway")
    (http_port,) = [p["containerPort"] for p in container["ports"] if p["name"] == "http"]
    port = deployed[http_port]
    assert poll(200, kubelet_status, port, {"path": "/ready"})[-1] == 200
    assert kubelet_get(port, {"path": "/ready"}) == (200, b'{"status":"ready"}')
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:  # the replicas' details: for an allowed Host with a key, as every other route
        conn.request("GET", "/ready", headers={"Host": NAME, "Authorization": f"Bearer {KEY}"})
        reply = conn.getresponse()
        assert reply.status == 200 and b'"replicas"' in reply.read()
        conn.request("GET", "/v1/models", headers={"Host": f"127.0.0.1:{port}"})
        reply = conn.getresponse()
        assert reply.status == 421 and b"host_not_allowed" in reply.read()
        conn.request("GET", "/v1/models", headers={"Host": NAME})
        reply = conn.getresponse()
        assert reply.status == 401 and b"invalid_api_key" in reply.read()
    finally:
        conn.close()


def test_serve_with_an_allowed_host_starts_and_answers_that_name_only() -> None:
    proc = Proc("serve", "--port", "0", "--device", "cpu", "--workers", "1",
                "--allowed-host", NAME)  # fmt: skip
    try:
        url = proc.wait_for(r"embedserve: serving minilm at (\S+)", timeout=150).group(1)
        port = int(url.rsplit(":", 1)[1])
        assert kubelet_get(port, {"path": "/health"})[0] == 200
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            for host, want in ((NAME, 200), (f"{NAME}:{port}", 200), (f"127.0.0.1:{port}", 421)):
                json = {"Content-Type": "application/json", "Host": host}
                conn.request("POST", "/v1/embeddings", b'{"input": "hi"}', json)
                reply = conn.getresponse()
                assert reply.status == want, (host, reply.status, reply.read())
                reply.read()
        finally:
            conn.close()
    finally:
        proc.stop()
