"""The HTTP front against what a hostile page or a careless client sends, on a real `embedserve
serve`: a POST must say it is JSON (what a cross-site page can send without a preflight is
refused, what real clients send is served), and a client that hangs up halfway through its body
is a logged 499, not an exception."""

from __future__ import annotations

import http.client
import json
import shutil
import socket
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from urllib.parse import urlparse

import pytest

from tests.e2e.conftest import Proc
from tests.e2e.test_replica_failure import call

pytestmark = pytest.mark.slow

BODY = b'{"input": "hello"}'


def raw_post(url: str, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict]:  # type: ignore[type-arg]
    parts = urlparse(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        conn.request("POST", path, body, headers)
        reply = conn.getresponse()
        return reply.status, json.loads(reply.read())
    finally:
        conn.close()


@pytest.mark.parametrize(
    "headers",
    [
        {},  # what `fetch(url, {method: "POST", body: new Blob([json])})` sends: no type
        {"Content-Type": "text/plain;charset=UTF-8"},  # fetch of a string body
        {"Content-Type": "application/x-www-form-urlencoded"},  # a form; also curl -d
        {"Content-Type": "multipart/form-data; boundary=x"},
    ],
    ids=["none", "text-plain", "form", "multipart"],
)
def test_a_body_a_cross_site_page_could_send_gets_415(each_served: str, headers: dict) -> None:  # type: ignore[type-arg]
    status, reply = raw_post(each_served, "/v1/embeddings", BODY, headers)
    assert status == 415, reply
    error = reply["error"]
    assert error["code"] == "unsupported_media_type" and error["param"] == "Content-Type"
    assert "Content-Type: application/json" in error["message"]


def test_the_clients_people_use_send_json_and_are_served(each_served: str) -> None:
    import httpx
    import requests

    embed, tei_rerank = {"input": "hello"}, {"query": "a query", "texts": ["a doc", "another"]}
    assert httpx.post(f"{each_served}/v1/embeddings", json=embed, timeout=30).status_code == 200
    assert requests.post(f"{each_served}/v1/embeddings", json=embed, timeout=30).status_code == 200
    assert requests.post(f"{each_served}/rerank", json=tei_rerank, timeout=30).status_code == 200
    # urllib's default for a body is a form: a 415 that names the header to send
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{each_served}/v1/embeddings", data=BODY, timeout=30)
    assert refused.value.code == 415
    request = urllib.request.Request(
        f"{each_served}/v1/embeddings", BODY, {"Content-Type": "application/json; charset=utf-8"}
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        assert reply.status == 200


@pytest.mark.skipif(shutil.which("curl") is None, reason="no curl")
def test_curl_needs_the_json_header_the_docs_send(each_served: str) -> None:
    def curl(*args: str) -> dict:  # type: ignore[type-arg]
        out = subprocess.run(["curl", "-s", f"{each_served}/v1/embeddings", *args, "-d", BODY.decode()],
                             capture_output=True, check=True, timeout=60)  # fmt: skip
        return json.loads(out.stdout)  # type: ignore[no-any-return]

    assert curl()["error"]["code"] == "unsupported_media_type"  # -d alone: a form
    assert curl("-H", "Content-Type: application/json")["data"][0]["index"] == 0


@pytest.fixture(scope="module")
def logged() -> Iterator[Proc]:
    proc = Proc("serve", "--port", "0", "--device", "cpu", "--workers", "1", "--log-requests")
    try:
        proc.wait_for(r"embedserve: serving minilm at (\S+)")
        yield proc
    finally:
        proc.stop()


def test_a_client_that_hangs_up_during_its_upload_is_a_499_not_an_exception(
    logged: Proc,
) -> None:
    url = logged.wait_for(r"embedserve: serving minilm at (\S+)").group(1)
    port = urlparse(url).port
    assert port is not None
    seen = len(logged.lines)
    head = (b"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n")  # fmt: skip
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(head + b'{"input": "half a bo')
    line = logged.wait_for(r'(\{"request_id".*"status":499.*\})', timeout=10, start=seen)
    assert json.loads(line.group(1))["route"] == "/v1/embeddings"
    assert call(url, "POST", "/v1/embeddings", {"input": "still served"})[0] == 200
    logged.wait_for(r'"status":200', timeout=10, start=seen)
    output = "".join(logged.lines[seen:])
    assert "Exception in ASGI application" not in output and "Traceback" not in output, output
