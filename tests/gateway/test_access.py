"""What the gateway lets in: API keys (every route but the probes, /metrics unless asked), the
Host names it answers (the probes: any), the methods a route takes (405 with Allow), bodies
that say they are JSON only (415), and no internal addresses."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from embedserve.core.inputs import InputPreparer
from embedserve.gateway.app import GatewayApp
from embedserve.gateway.auth import KeyRing
from tests.gateway.test_app import LIMITS, SlowPipeline

KEY = "sk-test-0123456789abcdef"


def request(
    app: GatewayApp, method: str, path: str, headers: list[tuple[bytes, bytes]], body: bytes = b""
) -> tuple[int, dict[bytes, bytes], Any]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path, "headers": headers}
    asyncio.run(app(scope, receive, send))
    reply = sent[1]["body"]
    payload = json.loads(reply) if reply[:1] in (b"{", b"[") else reply
    return sent[0]["status"], dict(sent[0]["headers"]), payload


def make_app(inputs: InputPreparer, keys: KeyRing | None = None, **kw: Any) -> GatewayApp:
    pipeline = SlowPipeline(inputs)
    pipeline.release.set()
    replica = SimpleNamespace(id=0, address="127.0.0.1:50051", healthy=True, outstanding_tokens=0)
    pipeline.replicas = SimpleNamespace(replicas=[replica], num_healthy=1)  # type: ignore[attr-defined]
    app = GatewayApp(lambda: pipeline, LIMITS, max_body_bytes=10_000, api_keys=keys or (lambda: frozenset()), **kw)  # type: ignore[arg-type,return-value]  # fmt: skip
    app.pipeline = pipeline  # type: ignore[assignment]
    return app


JSON = [(b"content-type", b"application/json")]
BODY = b'{"input": "hi"}'


def bearer(key: str) -> list[tuple[bytes, bytes]]:
    return [(b"authorization", f"Bearer {key}".encode())]


def test_keys_are_required_on_every_route_but_the_probes(
    inputs: InputPreparer,
) -> None:
    app = make_app(inputs, KeyRing([KEY], None))
    open_paths = ("/health", "/ready")  # /metrics needs the key by default (issue 40)
    for method, path in [(m, p) for m, p in app.routes if p not in open_paths]:
        for headers in ([], bearer("wrong"), [(b"authorization", f"Basic {KEY}".encode())]):
            status, head, body = request(app, method, path, headers + JSON, BODY)
            assert status == 401, (method, path, headers)
            assert body["error"]["type"] == "authentication_error"
            assert head[b"www-authenticate"] == b"Bearer"
    status, _, body = request(app, "POST", "/v1/embeddings", bearer(KEY) + JSON, BODY)
    assert status == 200, body
    assert request(app, "GET", "/health", [])[0] == 200
    assert request(app, "GET", "/metrics", bearer(KEY))[0] == 200
    # /ready: its status to anyone (the kubelet sends no key), the replicas' details with a key
    for headers in ([], bearer("wrong")):
        assert request(app, "GET", "/ready", headers)[::2] == (200, {"status": "ready"}), headers
    status, _, body = request(app, "GET", "/ready", bearer(KEY))
    assert status == 200 and body["replicas"] == [
        {"replica": 0, "healthy": True, "outstanding_tokens": 0}
    ]
    opened = make_app(inputs, KeyRing([KEY], None), metrics_open=True)  # `--metrics-open`
    assert request(opened, "GET", "/metrics", [])[0] == 200
    assert request(opened, "POST", "/v1/embeddings", JSON, BODY)[0] == 401


def test_a_key_file_is_read_again_on_reload(inputs: InputPreparer, tmp_path: Path) -> None:
    keys_file = tmp_path / "keys"
    keys_file.write_text("# rotated monthly\nfirst-key\n\nsecond-key\n")
    ring = KeyRing([], str(keys_file))
    app = make_app(inputs, ring)
    assert request(app, "POST", "/v1/embeddings", bearer("second-key") + JSON, BODY)[0] == 200
    keys_file.write_text("third-key\n")
    ring.reload()
    assert request(app, "POST", "/v1/embeddings", bearer("second-key") + JSON, BODY)[0] == 401
    assert request(app, "POST", "/v1/embeddings", bearer("third-key") + JSON, BODY)[0] == 200
    keys_file.write_text("")  # an empty file would lock everyone out: the keys in force stay
    ring.reload()
    assert request(app, "POST", "/v1/embeddings", bearer("third-key") + JSON, BODY)[0] == 200
    with pytest.raises(ValueError, match="no keys"):
        KeyRing([], str(keys_file))


def test_405_lists_the_allowed_methods_and_415_refuses_non_json(inputs: InputPreparer) -> None:
    app = make_app(inputs)
    status, head, body = request(app, "GET", "/v1/embeddings", [])
    assert (
        status == 405
        and head[b"allow"] == b"POST"
        and body["error"]["code"] == "method_not_allowed"
    )
    for media in (b"text/plain", b"application/x-www-form-urlencoded", b"multipart/form-data"):
        status, _, body = request(app, "POST", "/v1/embeddings", [(b"content-type", media)], BODY)
        assert status == 415 and body["error"]["code"] == "unsupported_media_type", media
    for media in (b"application/json; charset=utf-8", b"Application/JSON"):
        assert request(app, "POST", "/v1/embeddings", [(b"content-type", media)], BODY)[0] == 200
    # none at all: what a cross-site `fetch` of a Blob sends, so it is no JSON either
    status, _, body = request(app, "POST", "/v1/embeddings", [], BODY)
    assert status == 415 and body["error"]["code"] == "unsupported_media_type"
    assert body["error"]["param"] == "Content-Type" and "Content-Type" in body["error"]["message"]
    for media in (b"application/json", b"application/json;charset=UTF-8", b"application/x+json"):
        assert request(app, "POST", "/v1/embeddings", [(b"content-type", media)], BODY)[0] == 200


def test_only_the_allowed_hosts_are_answered(inputs: InputPreparer) -> None:
    from embedserve.gateway.main import LOOPBACK_HOSTS

    app = make_app(inputs, allowed_hosts=frozenset(LOOPBACK_HOSTS))
    for host in (b"127.0.0.1:8000", b"localhost", b"LOCALHOST:1", b"[::1]:8000", b"::1"):
        status, _, _ = request(app, "POST", "/v1/embeddings", [(b"host", host), *JSON], BODY)
        assert status == 200, host
    for host in (b"evil.example", b"evil.example:8000", b"127.0.0.1.evil.example"):
        status, _, body = request(app, "POST", "/v1/embeddings", [(b"host", host), *JSON], BODY)
        assert status == 421 and body["error"]["code"] == "host_not_allowed", host
    assert request(app, "GET", "/v1/models", [])[0] == 421  # no Host at all
    assert request(make_app(inputs), "GET", "/health", [(b"host", b"anything")])[0] == 200


def test_the_probes_answer_every_host_without_a_key(inputs: InputPreparer) -> None:
    """A kubelet probes the pod's IP with no key: `--allowed-host` and `--api-key` must not
    turn it away (the gateway's own start-up probe sends the bind address too)."""
    app = make_app(inputs, KeyRing([KEY], None), allowed_hosts=frozenset({"api.example.com"}))
    kubelet = [(b"host", b"10.1.2.3:8000"), (b"user-agent", b"kube-probe/1.30")]
    for headers in (kubelet, [], [(b"host", b"evil.example")]):
        assert request(app, "GET", "/health", headers)[::2] == (200, {"status": "ok"}), headers
        assert request(app, "GET", "/ready", headers)[::2] == (200, {"status": "ready"}), headers
    # the replicas' details need what every other route needs: an allowed Host and a key
    status, _, body = request(app, "GET", "/ready", [*kubelet, *bearer(KEY)])
    assert status == 200 and "replicas" not in body
    trusted = [(b"host", b"api.example.com"), *bearer(KEY)]
    assert "replicas" in request(app, "GET", "/ready", trusted)[2]
    assert request(app, "GET", "/v1/models", kubelet)[0] == 421
    assert request(app, "GET", "/v1/models", [(b"host", b"api.example.com")])[0] == 401
    assert request(app, "POST", "/health", kubelet)[0] == 405
    app.draining = True  # liveness stays 200 while draining; readiness fails at once
    assert request(app, "GET", "/health", kubelet)[0] == 200
    assert request(app, "GET", "/ready", kubelet)[0] == 503


def test_request_ids_and_one_log_line_per_request_without_text(
    inputs: InputPreparer, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    app = make_app(inputs, log_requests=True)
    with caplog.at_level(logging.INFO, logger="embedserve.gateway.requests"):
        _, head, _ = request(
            app, "POST", "/v1/embeddings", [(b"x-request-id", b"abc-123"), *JSON], BODY
        )
        _, fresh, _ = request(app, "POST", "/v1/embeddings", JSON, b'{"input": "secret text"}')
        _, odd, _ = request(app, "GET", "/health", [(b"x-request-id", b"bad id\n")])
    assert head[b"x-request-id"] == b"abc-123"
    assert len(fresh[b"x-request-id"]) == 32 and odd[b"x-request-id"] != b"bad id\n"
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name.endswith(".requests")]
    assert [line["request_id"] for line in lines[:2]] == [
        "abc-123",
        fresh[b"x-request-id"].decode(),
    ]
    assert lines[0]["route"] == "/v1/embeddings" and lines[0]["status"] == 200
    assert lines[0]["prompt_tokens"] == 3 and lines[0]["inputs"] == 1 and lines[0]["ms"] >= 0
    assert lines[0]["replicas"] == []  # the fake pipeline calls none
    assert "secret" not in caplog.text


def test_a_key_sent_twice_is_a_400_not_the_last_one_silently(inputs: InputPreparer) -> None:
    from embedserve.gateway.jsonio import duplicate_key, loads

    app = make_app(inputs)
    body = b'{"input": "first", "input": "second"}'
    status, _, reply = request(app, "POST", "/v1/embeddings", JSON, body)
    assert status == 400 and reply["error"]["code"] == "duplicate_key"
    assert reply["error"]["param"] == "input"
    # the quoted key inside a text, or twice in nested objects, is not a top-level duplicate
    for ok in (
        b'{"input": "say \\"input\\" twice: \\"input\\""}',
        b'{"input": [{"a": 1}, {"a": 2}]}',
    ):
        assert duplicate_key(ok, loads(ok)) is None, ok
    assert duplicate_key(b'{"a": {"b": 1, "b": 2}}', {"a": {"b": 2}}) is None


def test_two_host_headers_are_a_400_and_a_compressed_body_a_415(inputs: InputPreparer) -> None:
    """The last Host won (and could pass --allowed-host for the first); a gzip body was read as
    JSON (a confusing UTF-8 400)."""
    from embedserve.gateway.main import LOOPBACK_HOSTS

    app = make_app(inputs, allowed_hosts=frozenset(LOOPBACK_HOSTS))
    for hosts in (
        [(b"host", b"evil.example"), (b"host", b"localhost")],
        [(b"host", b"localhost"), (b"host", b"evil.example")],
    ):
        status, _, body = request(app, "POST", "/v1/embeddings", hosts + JSON, BODY)
        assert status == 400 and body["error"]["code"] == "duplicate_host", hosts
    gzip = [(b"host", b"localhost"), (b"content-encoding", b"gzip"), *JSON]
    status, _, body = request(app, "POST", "/v1/embeddings", gzip, b"\x1f\x8b\x08\x00")
    assert status == 415 and "Content-Encoding 'gzip'" in body["error"]["message"]
    plain = [(b"host", b"localhost"), (b"content-encoding", b"identity"), *JSON]
    assert request(app, "POST", "/v1/embeddings", plain, BODY)[0] == 200
