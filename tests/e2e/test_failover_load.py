"""Two servers standing for two hosts behind one gateway, under a load of bounded length, while
one is killed (SIGKILL) and restarted on its port: every request gets exactly one answer, each
either correct (vectors equal an `Embedder`'s for its own texts) or a documented error, none
lost; the restarted server takes load again.

The load's length is fixed once the restarted server has taken load: 300 requests more, and at
least `EMBEDSERVE_FAILOVER_REQUESTS` (default 1,500) in all. The counts are printed, and written
as JSON to `EMBEDSERVE_FAILOVER_REPORT` when set. NOTE: "answered twice" is counted at the
client (one reply per request); a call the gateway retried on the other server after the killed
one had run it is counted as a retry, from the gateway's log.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np
import pytest

from tests.data.texts import QUERIES
from tests.e2e.conftest import Proc, free_port

pytestmark = pytest.mark.slow

CLIENTS = 4
CAP = 100_000  # the load's length until the test fixes it
DOCUMENTED = {503: "service_unavailable", 429: "rate_limit_error"}  # docs/serving.md, "Errors"


def start_server(port: int, metrics_port: int) -> Proc:
    proc = Proc(
        "server",
        "--device",
        "cpu",
        "--dtype",
        "float32",
        "--port",
        str(port),
        "--metrics-port",
        str(metrics_port),
    )
    proc.wait_for(r"embedserve server: ready on", timeout=120)
    return proc


def batches(metrics_port: int) -> float:
    """The server's embedserve_server_batches_total: batches it has launched on its engine."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return float(re.search(r"^embedserve_server_batches_total (\S+)$", text, re.M).group(1))


def request_texts(i: int) -> list[str]:
    """Request i's own inputs (1 to 3), each naming the request, so answers cannot be swapped."""
    return [f"request {i} input {k}: {QUERIES[(i + k) % len(QUERIES)]}" for k in range(1 + i % 3)]


class Load:
    """CLIENTS threads, each with one keep-alive connection, sending requests 0..N-1 between
    them in a closed loop; every request's outcome recorded exactly once."""

    def __init__(self, url: str, total: int = CAP) -> None:
        self.url, self.total = urlparse(url), total
        self.next = 0
        self.lock = threading.Lock()
        self.outcomes: dict[int, tuple[str, Any]] = {}  # i -> (kind, detail)
        self.answers: list[int] = []  # every request id answered, in order (duplicates show)
        self.threads = [threading.Thread(target=self._client) for _ in range(CLIENTS)]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def join(self) -> None:
        for t in self.threads:
            t.join()

    def sent(self) -> int:
        with self.lock:
            return self.next

    def end_at(self, total: int) -> int:
        """Requests 0..total-1 in all (at least those already sent); returns the length."""
        with self.lock:
            self.total = max(total, self.next)
            return self.total

    def _take(self) -> int | None:
        with self.lock:
            if self.next >= self.total:
                return None
            self.next += 1
            return self.next - 1

    def _client(self) -> None:
        conn = http.client.HTTPConnection(self.url.hostname, self.url.port, timeout=30)
        while (i := self._take()) is not None:
            body = json.dumps({"input": request_texts(i), "user": f"r{i}"}).encode()
            try:
                conn.request("POST", "/v1/embeddings", body, {"content-type": "application/json"})
                reply = conn.getresponse()
                status, data = reply.status, json.loads(reply.read())
                outcome = ("ok", data) if status == 200 else ("error", (status, data))
            except Exception as e:  # no answer: lost
                conn.close()
                conn = http.client.HTTPConnection(self.url.hostname, self.url.port, timeout=30)
                outcome = ("lost", repr(e))
            with self.lock:
                self.answers.append(i)
                self.outcomes.setdefault(i, outcome)
        conn.close()


@pytest.mark.parametrize("front", ["python", "native"])
def test_a_server_killed_and_restarted_under_load_loses_nothing(minilm: Any, front: str) -> None:
    """Behind the Python gateway (`--no-native`), and behind the native front, `gateway`'s
    default (`cli/native_replicas.py`: Ivy's calls over the servers' sockets, its retry)."""
    minimum = int(os.environ.get("EMBEDSERVE_FAILOVER_REQUESTS", "1500"))
    ports = [free_port() for _ in range(4)]
    servers = [start_server(ports[0], ports[2]), start_server(ports[1], ports[3])]
    replicas = [arg for p in ports[:2] for arg in ("--replica", f"127.0.0.1:{p}")]
    python = ("--no-native",) if front == "python" else ()
    gateway = Proc("gateway", *replicas, *python, "--port", "0", "--request-timeout", "10")
    timeline: dict[str, float] = {}
    try:
        url = gateway.wait_for(r"embedserve gateway: listening on (\S+)").group(1)
        load = Load(url)
        start = time.monotonic()
        load.start()
        while load.sent() < minimum // 4:
            time.sleep(0.01)
        servers[0].kill()  # SIGKILL: no drain; its in-flight calls fail
        timeline["killed_at_request"] = load.sent()
        timeline["killed_s"] = time.monotonic() - start
        time.sleep(1.0)
        servers.append(start_server(ports[0], ports[2]))
        timeline["restarted_ready_s"] = time.monotonic() - start
        timeline["restarted_at_request"] = load.sent()
        batches_at_restart = batches(ports[2])  # its warm-up's
        deadline = time.monotonic() + 60
        while batches(ports[2]) == batches_at_restart and time.monotonic() < deadline:
            time.sleep(0.1)
        timeline["restarted_took_load_s"] = time.monotonic() - start
        total = load.end_at(max(minimum, load.sent() + 300))
        load.join()
        timeline["load_s"] = time.monotonic() - start
        restarted_batches = batches(ports[2]) - batches_at_restart
        # calls that failed on the killed server and went to the other (the gateway's log)
        retried = sum("retrying on" in line for line in gateway.lines)
    finally:
        gateway.stop()
        for s in servers:
            s.stop()

    kinds = Counter(kind for kind, _ in load.outcomes.values())
    errors = Counter(
        f"{status} {data.get('error', {}).get('type')}"
        for kind, (status, data) in ((k, d) for k, d in load.outcomes.values() if k == "error")
    )
    # the answers: each request's vectors against an Embedder's for its own texts
    ok = [i for i, (kind, _) in load.outcomes.items() if kind == "ok"]
    got = np.array(
        [d["embedding"] for i in ok for d in sorted(load.outcomes[i][1]["data"], key=lambda d: d["index"])],
        dtype=np.float32,
    )  # fmt: skip
    want = minilm.encode([t for i in ok for t in request_texts(i)])
    cosines = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    counts = {
        "requests": total,
        "answers": len(load.answers),
        "answered_twice": sum(1 for c in Counter(load.answers).values() if c > 1),
        "ok": kinds["ok"],
        "ok_wrong": int((cosines < 0.9999).sum()),
        "min_cosine": round(float(cosines.min()), 7),
        "documented_errors": dict(errors),
        "lost": kinds["lost"],
        "gateway_retries": retried,
        "restarted_server_batches": restarted_batches,
        **{k: round(v, 2) for k, v in timeline.items()},
    }
    print(json.dumps(counts))
    if os.environ.get("EMBEDSERVE_FAILOVER_REPORT"):
        Path(os.environ["EMBEDSERVE_FAILOVER_REPORT"]).write_text(json.dumps(counts, indent=1))
    assert counts["answers"] == total and counts["answered_twice"] == 0
    assert kinds["lost"] == 0, [d for k, d in load.outcomes.values() if k == "lost"][:3]
    assert counts["ok_wrong"] == 0
    for kind, detail in load.outcomes.values():
        if kind == "error":
            status, data = detail
            assert DOCUMENTED.get(status) == data["error"]["type"], detail
    assert restarted_batches > 0, "the restarted server took no load"
