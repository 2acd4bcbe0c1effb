"""Request tracing end to end: a real `embedserve serve --otlp-endpoint` exporting to an OTLP/HTTP
receiver started here (`POST /v1/traces`, protobuf, decoded with OpenTelemetry's own messages
compiled from `tests/data/otlp`); one request gives one trace with the gateway's, the server's
and the engine's spans, parented in that order and carrying the request id. Without the flag,
nothing is exported and the tracing module stays off."""

from __future__ import annotations

import http.server
import importlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Proc
from tests.e2e.test_rerank_serving import post

pytestmark = pytest.mark.slow

OTLP_PROTOS = Path(__file__).parent.parent / "data" / "otlp"


@pytest.fixture(scope="module")
def trace_service_pb2(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """opentelemetry-proto's trace_service_pb2, generated from the vendored .proto files."""
    out = tmp_path_factory.mktemp("otlp_pb2")
    protos = [str(p.relative_to(OTLP_PROTOS)) for p in OTLP_PROTOS.rglob("*.proto")]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{OTLP_PROTOS}",
            f"--python_out={out}",
            *protos,
        ],
        check=True,
    )
    sys.path.insert(0, str(out))
    try:
        return importlib.import_module("opentelemetry.proto.collector.trace.v1.trace_service_pb2")
    finally:
        sys.path.remove(str(out))


class Receiver(http.server.ThreadingHTTPServer):
    """An OTLP/HTTP trace receiver: keeps every export's body."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.content_types: list[str] = []
        super().__init__(("127.0.0.1", 0), ReceiverHandler)


class ReceiverHandler(http.server.BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.path != "/v1/traces":
            self.send_response(404)
        else:
            self.server.bodies.append(body)
            self.server.content_types.append(self.headers["Content-Type"])
            self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:  # quiet
        pass


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()


@pytest.fixture(scope="module", params=["python", "native"])
def traced_url(receiver: Receiver, request: pytest.FixtureRequest) -> Iterator[str]:
    """`serve --otlp-endpoint` on the Python path, then natively (Ivy's spans, recorded in Rust
    and exported with the Python front's: the same three, the same shape)."""
    endpoint = f"http://127.0.0.1:{receiver.server_address[1]}"
    front = "--native" if request.param == "native" else "--no-native"
    proc = Proc("serve", front, "--port", "0", "--device", "cpu", "--otlp-endpoint", endpoint)
    try:
        yield proc.wait_for(r"embedserve: serving minilm at (\S+)").group(1)
    finally:
        proc.stop()


def spans_of(receiver: Receiver, pb2: Any) -> list[tuple[str, Any]]:
    """Every span received so far, with its service's name."""
    out = []
    for body in list(receiver.bodies):
        message = pb2.ExportTraceServiceRequest.FromString(body)
        for rs in message.resource_spans:
            service = {a.key: a.value.string_value for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                out.extend((service["service.name"], span) for span in ss.spans)
    return out


# natively, a plain body is answered by Ivy (its spans recorded in Rust), one with options by
# the Python front (its spans, and the in-process server's: `server/tulip_calls.py`)
@pytest.mark.parametrize("options", [{}, {"dimensions": 128}], ids=["plain", "options"])
def test_one_request_is_one_trace_of_three_spans(
    traced_url: str, receiver: Receiver, trace_service_pb2: Any, options: dict[str, Any]
) -> None:
    # one per server and body
    request_id = f"trace-test-{traced_url.rsplit(':', 1)[1]}-{len(options)}"
    import json
    import urllib.request

    request = urllib.request.Request(
        traced_url + "/v1/embeddings",
        data=json.dumps({"input": ["a traced request"], **options}).encode(),
        headers={"Content-Type": "application/json", "X-Request-Id": request_id},
    )
    with urllib.request.urlopen(request, timeout=60) as reply:
        assert reply.status == 200
    deadline = time.monotonic() + 20
    mine: list[tuple[str, Any]] = []
    while time.monotonic() < deadline:
        spans = spans_of(receiver, trace_service_pb2)
        gateway = [s for _, s in spans if s.name == "gateway request" and any(
            a.key == "embedserve.request_id" and a.value.string_value == request_id
            for a in s.attributes)]  # fmt: skip
        if gateway:
            trace = gateway[0].trace_id
            mine = [(svc, s) for svc, s in spans if s.trace_id == trace]
            if len(mine) >= 3:
                break
        time.sleep(0.2)
    by_name = {s.name: (svc, s) for svc, s in mine}
    assert sorted(by_name) == ["engine step", "gateway request", "server request"], mine
    assert len(mine) == 3
    (gw_svc, gw), (sv_svc, sv), (en_svc, en) = (
        by_name[n] for n in ("gateway request", "server request", "engine step")
    )
    assert (gw_svc, sv_svc, en_svc) == (
        "embedserve-gateway",
        "embedserve-server",
        "embedserve-server",
    )
    assert gw.parent_span_id == b"" and sv.parent_span_id == gw.span_id
    assert en.parent_span_id == sv.span_id
    assert len(gw.trace_id) == 16 and len(gw.span_id) == 8
    for span in (gw, sv, en):
        attrs = {a.key: a.value for a in span.attributes}
        assert attrs["embedserve.request_id"].string_value == request_id
        assert 0 < span.start_time_unix_nano <= span.end_time_unix_nano
    gw_attrs = {a.key: a.value for a in gw.attributes}
    assert gw_attrs["http.route"].string_value == "/v1/embeddings"
    assert gw_attrs["http.response.status_code"].int_value == 200
    # the server's work lies inside the gateway's span
    assert gw.start_time_unix_nano <= sv.start_time_unix_nano <= sv.end_time_unix_nano
    assert sv.end_time_unix_nano <= gw.end_time_unix_nano + 5_000_000  # clocks of two processes
    assert set(receiver.content_types) == {"application/x-protobuf"}


def test_a_callers_traceparent_is_the_parent(
    traced_url: str, receiver: Receiver, trace_service_pb2: Any
) -> None:
    trace_id, parent = os.urandom(16).hex(), "00f067aa0ba902b7"  # one per server
    import json
    import urllib.request

    request = urllib.request.Request(
        traced_url + "/v1/embeddings",
        data=json.dumps({"input": "with a parent"}).encode(),
        headers={"Content-Type": "application/json", "traceparent": f"00-{trace_id}-{parent}-01"},
    )
    with urllib.request.urlopen(request, timeout=60) as reply:
        assert reply.status == 200
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        mine = [s for _, s in spans_of(receiver, trace_service_pb2)
                if s.trace_id == bytes.fromhex(trace_id)]  # fmt: skip
        if len(mine) >= 3:
            break
        time.sleep(0.2)
    gateway = [s for s in mine if s.name == "gateway request"]
    assert len(gateway) == 1 and gateway[0].parent_span_id == bytes.fromhex(parent)
    assert len(mine) == 3


def test_off_by_default(served: str) -> None:
    status, _ = post(served, "/v1/embeddings", {"input": "untraced"})
    assert status == 200
    from embedserve.contract import tracing

    assert tracing.TRACER is None  # nothing configures it without the flag
