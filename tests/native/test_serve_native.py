"""`embedserve serve --native` (Ivy and Tulip in Rust, the CPU engine in the same process): the
vectors of `Embedder.encode` for the same texts, a text alone as in a batch, the natively answered
request and the one handed to the Python front agreeing, clear errors from the one place that owns
them, bounds before the work, concurrent clients each answered with their own rows, requests cut
into parts, the TEI timing headers and request ids, `/metrics` counting native answers, admission
(keys, hosts), and SIGTERM draining the requests in flight."""

from __future__ import annotations

import base64
import http.client
import json
import re
import signal
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from embedserve.embedder import Embedder
from embedserve.engine.fidelity import row_cosines
from tests.e2e.conftest import Proc
from tests.server.faults import fault_env

TEXTS = ["what is the capital of france", "Café déjà vu — naïve", "ok", "word " * 60]
READY = r"embedserve: serving minilm at http://127\.0\.0\.1:(\d+)"


@pytest.fixture(scope="module")
def embedder(minilm_path: Path) -> Embedder:
    return Embedder(minilm_path, device="cpu", dtype="float32")


def serve_native(*flags: str) -> tuple[Proc, int]:
    proc = Proc("serve", "--native", "--port", "0", "--device", "cpu", "--dtype", "float32", *flags)
    return proc, int(proc.wait_for(READY).group(1))


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    proc, port = serve_native("--max-body-bytes", "4096", "--max-inputs", "8")
    try:
        yield port
    finally:
        proc.stop()


def post(
    port: int, body: Any, path: str = "/v1/embeddings", headers: dict[str, str] | None = None
) -> tuple[int, Any, dict[str, str]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    conn.request("POST", path, raw, {"Content-Type": "application/json", **(headers or {})})
    reply = conn.getresponse()
    out = reply.status, json.loads(reply.read()), {k.lower(): v for k, v in reply.getheaders()}
    conn.close()
    return out


def vectors(answer: dict[str, Any]) -> np.ndarray:
    return np.array([d["embedding"] for d in answer["data"]], dtype=np.float32)


def test_the_vectors_are_the_embedders(port: int, embedder: Embedder) -> None:
    status, answer, _ = post(port, {"input": TEXTS, "model": "minilm"})
    assert status == 200 and [d["index"] for d in answer["data"]] == [0, 1, 2, 3]
    expected = embedder.encode(TEXTS)
    assert row_cosines(vectors(answer), expected).min() >= 0.99999
    assert answer["usage"]["prompt_tokens"] == sum(
        len(ids) for ids in embedder.inputs.tokenizer.encode(TEXTS)
    )
    alone = np.concatenate([vectors(post(port, {"input": t})[1]) for t in TEXTS])
    np.testing.assert_allclose(alone, vectors(answer), atol=1e-5)


def test_base64_answers_the_same_floats(port: int) -> None:
    _, floats, _ = post(port, {"input": ["a b c"]})
    _, b64, _ = post(port, {"input": ["a b c"], "encoding_format": "base64"})
    raw = np.frombuffer(base64.b64decode(b64["data"][0]["embedding"]), "<f4")
    np.testing.assert_allclose(raw, vectors(floats)[0], rtol=1e-6)


def test_the_python_front_answers_what_ivy_hands_over_the_same(port: int) -> None:
    """`dimensions` is not the plain shape: the Python front answers it, through the same
    queue and engine; its full-width answer equals Ivy's own, field for field."""
    status, native, _ = post(port, {"input": TEXTS, "model": "minilm"})
    status_py, python, _ = post(port, {"input": TEXTS, "model": "minilm", "dimensions": 384})
    assert status == status_py == 200
    assert python["model"] == native["model"] and python["usage"] == native["usage"]
    np.testing.assert_allclose(vectors(python), vectors(native), atol=1e-6)
    assert [d["index"] for d in python["data"]] == [d["index"] for d in native["data"]]


def test_teis_embed_answers_as_the_python_front(port: int) -> None:
    """TEI's plain `/embed` is answered here too: the rows of `/v1/embeddings`, and with
    `normalize: false` the raw rows the Python front gives (`dimensions` hands it over)."""
    status, rows, _ = post(port, {"inputs": TEXTS}, "/embed")
    assert status == 200 and len(rows) == len(TEXTS)
    _, openai, _ = post(port, {"input": TEXTS})
    np.testing.assert_allclose(np.array(rows), vectors(openai), atol=1e-6)
    raw_native = post(port, {"inputs": TEXTS, "normalize": False, "truncate": False}, "/embed")
    raw_python = post(port, {"inputs": TEXTS, "normalize": False, "dimensions": 384}, "/embed")
    assert raw_native[0] == raw_python[0] == 200
    np.testing.assert_allclose(np.array(raw_native[1]), np.array(raw_python[1]), atol=1e-5)
    assert np.abs(np.linalg.norm(np.array(raw_native[1]), axis=1) - 1).max() > 0.01
    (one,) = post(port, {"inputs": TEXTS[0]}, "/embed")[1]
    np.testing.assert_allclose(one, rows[0], atol=1e-6)


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"{not json", 400, "invalid_json"),
        ({"input": 3}, 400, "invalid_type"),
        ({"input": []}, 400, "invalid_value"),
        ({"input": ["a", ""]}, 400, "invalid_value"),
        ({"input": ["a"] * 9}, 400, "too_many_inputs"),
        ({"input": "x" * 5000}, 413, "body_too_large"),
        ({"input": "a", "model": "nope"}, 404, "model_not_found"),
    ],
)
def test_bad_requests_say_what_and_where(port: int, body: Any, status: int, code: str) -> None:
    got, answer, _ = post(port, body)
    assert got == status, answer
    assert answer["error"]["code"] == code and answer["error"]["message"], answer


def test_an_unknown_route_is_a_404(port: int) -> None:
    status, answer, _ = post(port, {"input": "a"}, "/v2/nothing")
    assert status == 404 and answer["error"]["message"]


def test_concurrent_clients_each_get_their_own_rows(port: int, embedder: Embedder) -> None:
    texts = [f"query number {i} about topic {i % 7}" for i in range(48)]
    expected = embedder.encode(texts)
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda t: post(port, {"input": t}), texts))
    assert all(status == 200 for status, _, _ in answers)
    got = np.concatenate([vectors(a) for _, a, _ in answers])
    assert row_cosines(got, expected).min() >= 0.99999


def test_timing_headers_and_request_ids(port: int) -> None:
    _, _, headers = post(port, {"input": "hello"})
    assert re.fullmatch(r"[0-9a-f]{32}", headers["x-request-id"])
    for name in ("x-total-time", "x-tokenization-time", "x-queue-time", "x-inference-time"):
        assert int(headers[name]) >= 0, name
    _, _, echoed = post(port, {"input": "hello"}, headers={"X-Request-Id": "trace-42"})
    assert echoed["x-request-id"] == "trace-42"


@pytest.mark.parametrize(("route", "body"), [("/v1/embeddings", "input"), ("/embed", "inputs")])
def test_metrics_count_the_native_answers(port: int, route: str, body: str) -> None:
    def embeddings_count() -> float:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        conn.close()
        found = re.search(
            rf'^embedserve_gateway_request_seconds_count\{{route="{route}"\}} (\S+)', text, re.M
        )
        return float(found.group(1)) if found else 0.0

    before = embeddings_count()
    for _ in range(3):
        assert post(port, {body: "counted"}, route)[0] == 200
    assert embeddings_count() - before >= 3


def scrape(port: int) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    return text


def test_the_engines_metrics_are_scraped_natively_too() -> None:
    """The engine's and its queue's metrics (`server.metrics`), which `serve` serves on a
    server's `--metrics-port`: on the one port's `/metrics`, and on `--metrics-port` when given."""
    proc, live = serve_native("--metrics-port", "0")
    try:
        assert post(live, {"input": "counted"})[0] == 200
        found = [re.search(r"engine's metrics on (http://\S+)", line) for line in proc.lines]
        [own] = [m.group(1) for m in found if m]
        with urllib.request.urlopen(own, timeout=30) as reply:
            texts = [scrape(live), reply.read().decode()]
        for text in texts:
            batches = re.search(r"^embedserve_server_batches_total (\S+)", text, re.M)
            assert batches and float(batches.group(1)) >= 1
            assert re.search(r"^embedserve_server_queued_tokens \S+", text, re.M)
            assert re.search(r'^embedserve_engine_info\{.*device="cpu".*\} 1', text, re.M)
    finally:
        proc.stop()


def test_a_large_request_is_cut_into_parts_and_answered_in_order(embedder: Embedder) -> None:
    """Parts of at most `--part-tokens` (a text over it alone in its part), queued at once and
    re-assembled in order: the same vectors as one batch."""
    proc, small = serve_native("--part-tokens", "32")
    try:
        texts = [*TEXTS, *(f"text {i} " * (1 + i % 5) for i in range(20))]
        status, answer, _ = post(small, {"input": texts})
        assert status == 200 and [d["index"] for d in answer["data"]] == list(range(len(texts)))
        assert row_cosines(vectors(answer), embedder.encode(texts)).min() >= 0.99999
    finally:
        proc.stop()


def test_the_queue_and_header_bounds_are_the_flags(embedder: Embedder) -> None:
    """`--max-batch-tokens`, `--max-queued-tokens` and `--max-headers` hold natively: the batch
    budget the ready line names, a request of ~14,000 tokens over a 5,000-token queue answered
    whole (its parts enter the queue as it drains), more header lines than asked a 431."""
    proc = Proc(
        "serve", "--native", "--port", "0", "--device", "cpu", "--dtype", "float32",
        "--max-queued-tokens", "5000", "--max-batch-tokens", "2048", "--max-headers", "12",
    )  # fmt: skip
    try:
        proc.wait_for(r"embedserve server: ready in this process .*batch tokens 2048\)")
        bounded = int(proc.wait_for(READY).group(1))
        texts = [f"passage {i} " + "about the weather and the sea " * 8 for i in range(220)]
        status, answer, _ = post(bounded, {"input": texts})
        assert status == 200 and answer["usage"]["prompt_tokens"] > 10_000
        assert [d["index"] for d in answer["data"]] == list(range(len(texts)))
        assert row_cosines(vectors(answer)[:3], embedder.encode(texts[:3])).min() >= 0.99999
        extra = {f"x-extra-{i}": "1" for i in range(12)}  # with Host, Content-*: over 12
        assert post(bounded, {"input": "a"}, headers=dict(list(extra.items())[:2]))[0] == 200
        headers = {"Content-Type": "application/json", **extra}
        conn = http.client.HTTPConnection("127.0.0.1", bounded, timeout=60)
        conn.request("POST", "/v1/embeddings", b'{"input": "a"}', headers)
        assert conn.getresponse().status == 431
        conn.close()
    finally:
        proc.stop()


def test_an_engine_failing_every_batch_ends_the_process_and_it_is_started_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server's engine guard holds natively: after `--max-failed-steps` failed batches in a
    row (the test-only fault hook, `tests/server/faults.py`: every step raises, as after a
    sticky CUDA error) the requests fail with 5xx and the native process exits FATAL_EXIT_CODE,
    instead of failing every batch for ever; `serve --native` then starts it again on the same
    port (`cli/native_restarts.py`), with an engine that serves."""
    switch = tmp_path / "fail-steps"
    switch.touch()
    for name, value in fault_env(switch).items():
        monkeypatch.setenv(name, value)
    proc, failing = serve_native("--max-failed-steps", "2", "--metrics-port", "0")
    try:
        assert not switch.exists()  # claimed: this process's engine fails every step
        statuses = []
        for _ in range(3):
            try:
                statuses.append(post(failing, {"input": "a"})[0])
            except (ConnectionError, http.client.HTTPException):
                break  # the process is going
        assert statuses and all(s >= 500 for s in statuses), statuses
        proc.wait_for(r"the engine could not serve; starting the native process again")
        assert any("the engine cannot serve, exiting" in line for line in proc.lines)
        deadline = time.monotonic() + 120
        while True:  # the new process, on the same port
            try:
                status, answer, _ = post(failing, {"input": "a"})
                break
            except (ConnectionError, http.client.HTTPException):
                assert time.monotonic() < deadline, "not started again in 120 s"
                time.sleep(0.5)
        assert status == 200 and len(answer["data"][0]["embedding"]) == 384
        assert proc.proc.poll() is None
        # `--metrics-port 0`'s port is kept too, as the HTTP one (a scraper's target)
        said = r"engine's metrics on (\S+)"
        first = proc.wait_for(said)
        again = proc.wait_for(said, timeout=10, start=proc.lines.index(first.string) + 1)
        assert again.group(1) == first.group(1) and not first.group(1).endswith(":0/metrics")
    finally:
        proc.stop()
    assert proc.proc.returncode == 0  # drained on SIGTERM, as before


def test_a_request_past_the_request_timeout_is_a_503_and_its_parts_are_dropped() -> None:
    """`--request-timeout` bounds Ivy's own requests: a part not answered within it ends the
    request with `serve`'s 503 for a call past its deadline (the Python front answers it without
    running it again), in TEI's shape on TEI's routes, and its parts not yet taken into a batch
    are dropped from Tulip's queue (a request of 5 parts or more runs 3 batches at most)."""
    proc = Proc(
        "serve", "--native", "--port", "0", "--device", "cpu", "--dtype", "float32",
        "--max-batch-tokens", "2048", "--request-timeout", "0.001",
    )  # fmt: skip
    try:
        late = int(proc.wait_for(READY).group(1))
        texts = [f"passage {i} " + "about the weather and the sea " * 8 for i in range(220)]
        status, answer, headers = post(late, {"input": texts})
        assert status == 503, answer
        assert answer["error"]["code"] == "unavailable"
        assert "DEADLINE_EXCEEDED" in answer["error"]["message"]
        assert headers["x-request-id"]
        status, answer, _ = post(late, {"inputs": "a"}, path="/embed")
        assert status == 503 and answer["error_type"] == "unhealthy"
        time.sleep(1.0)  # the batches taken before the deadline end
        batches = re.search(r"^embedserve_server_batches_total (\S+)", scrape(late), re.M)
        assert batches and float(batches.group(1)) <= 3 + 1, batches
        conn = http.client.HTTPConnection("127.0.0.1", late, timeout=30)
        conn.request("GET", "/health")
        assert conn.getresponse().status == 200  # still serving
        conn.close()
    finally:
        proc.stop()


def test_keys_and_hosts_are_checked_before_the_work(tmp_path: Path) -> None:
    proc, guarded = serve_native("--api-key", "sekret", "--allowed-host", "127.0.0.1")
    try:
        status, answer, _ = post(guarded, {"input": "a"})
        assert status == 401 and answer["error"]["message"]
        status, answer, _ = post(guarded, {"input": "a"}, headers={"Authorization": "Bearer no"})
        assert status == 401
        ok = {"Authorization": "Bearer sekret"}
        assert post(guarded, {"input": "a"}, headers=ok)[0] == 200
        status, answer, _ = post(guarded, {"input": "a"}, headers={**ok, "Host": "evil.example"})
        assert status in (400, 421) and answer["error"]["message"]
    finally:
        proc.stop()


def test_sigterm_drains_the_requests_in_flight() -> None:
    """A request in flight when SIGTERM comes is answered; the process then exits 0."""
    proc, live = serve_native()
    texts = [f"passage {i} " + "words in it " * 40 for i in range(300)]
    answers: list[int] = []
    asking = threading.Thread(target=lambda: answers.append(post(live, {"input": texts})[0]))
    asking.start()
    time.sleep(0.3)
    proc.proc.send_signal(signal.SIGTERM)
    asking.join(120)
    assert answers == [200]
    assert proc.proc.wait(60) == 0


def test_a_second_sigterm_stops_at_once() -> None:
    """A second SIGTERM more than a second after the first stops `serve --native` without
    waiting out the drain: the launcher passes it on (`cli/native_restarts.py`), and the native
    process's own rule ends it (here a request whose body never comes holds the drain open)."""
    proc, live = serve_native("--drain-seconds", "60", "--body-timeout", "60")
    stalled = socket.create_connection(("127.0.0.1", live))
    try:
        head = b"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        stalled.sendall(head + b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
        time.sleep(0.5)
        proc.proc.send_signal(signal.SIGTERM)
        proc.wait_for(r"stopping: draining the requests in flight")
        time.sleep(1.5)
        started = time.monotonic()
        proc.proc.send_signal(signal.SIGTERM)
        proc.proc.wait(30)
        assert time.monotonic() - started < 20  # not the 60 s drain
    finally:
        stalled.close()
        proc.stop()


def test_with_a_result_cache_every_request_goes_through_it() -> None:
    """`--cache-size`: the cache is the Python front's pipeline's, so the plain requests go
    there too (a repeated one is a hit) and get the same rows."""
    proc, port = serve_native("--cache-size", "1000000")
    try:
        first = vectors(post(port, {"input": ["cached once", "and again"]})[1])
        second = vectors(post(port, {"input": ["cached once", "and again"]})[1])
        np.testing.assert_array_equal(first, second)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        conn.close()
        hits = re.search(r"^embedserve_gateway_cache_hits_total (\S+)", text, re.M)
        assert hits is not None and float(hits.group(1)) == 2.0, text
    finally:
        proc.stop()


def test_with_the_request_log_every_request_has_its_line() -> None:
    """`--log-requests`: the log is the Python front's, so the plain requests go there too."""
    proc, port = serve_native("--log-requests")
    try:
        _, _, headers = post(port, {"input": "logged"}, headers={"X-Request-Id": "log-me-1"})
        assert headers["x-request-id"] == "log-me-1"
        line = proc.wait_for(r'(\{"request_id":"log-me-1".*\})').group(1)
        logged = json.loads(line)
        assert logged["route"] == "/v1/embeddings" and logged["status"] == 200
        assert logged["inputs"] == 1 and logged["prompt_tokens"] > 0
    finally:
        proc.stop()


def test_the_character_bound_holds_for_texts_of_few_tokens() -> None:
    """Texts of long words are a few `[UNK]` tokens each: within the token bound, over the
    request's characters (8 per token of `--max-tokens-per-request`), which the Python front
    refuses before it tokenizes; Ivy hands such a request over rather than answer it."""
    proc, port = serve_native("--max-tokens-per-request", "64")
    try:
        for path, key in (("/v1/embeddings", "input"), ("/embed", "inputs")):
            status, answer, _ = post(port, {key: ["x" * 200] * 3}, path)
            # OpenAI's error object, or TEI's {"error": message, "error_type"}
            error = answer["error"] if path == "/v1/embeddings" else answer
            assert status == 400 and "characters" in str(error), answer
            assert post(port, {key: ["x" * 200] * 2}, path)[0] == 200
    finally:
        proc.stop()
