"""Two models behind one gateway, real processes: `embedserve serve --model minilm --model
ms-marco=FOLDER` (the bundled embedder and a random-weight cross-encoder). The `openai` client
embeds, `/v1/rerank` ranks; answers equal the offline `Embedder` / `Scorer` (which equal each
model served alone); the request's `model` picks the model, and one model's dead server leaves
the other answering."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest

from embedserve.devtools.checkpoints import make_checkpoint
from embedserve.scorer import Scorer
from tests.data.texts import RERANK_DOCS, RERANK_QUERY
from tests.e2e.conftest import Proc
from tests.e2e.test_rerank_serving import post

pytestmark = pytest.mark.slow

QUERY = RERANK_QUERY
DOCS = RERANK_DOCS[:4]
TEXTS = ["vector search with embeddings", "a reranker scores query and document pairs"]


def get(url: str, path: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url + path, timeout=30) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ms-marco-multi")
    return make_checkpoint(out, arch="ms-marco-minilm-l6", dtype="float32", seed=5, overwrite=True)


# the Python path (a server process per model), then natively (an engine and Tulip per model
# in the one process, `cli/native.py`): the same answers, statuses and metrics
@pytest.fixture(scope="module", params=["--no-native", "--native"])
def both(cross_encoder: Path, request: pytest.FixtureRequest) -> Iterator[tuple[str, Proc]]:
    proc = Proc("serve", request.param, "--model", "minilm", "--model", f"ms-marco={cross_encoder}",
                "--port", "0", "--device", "cpu", "--dtype", "float32")  # fmt: skip
    try:
        yield proc.wait_for(r"embedserve: serving minilm, ms-marco at (\S+)").group(1), proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def url(both: tuple[str, Proc]) -> str:
    return both[0]


def test_the_openai_client_embeds_with_the_embedder(url: str, minilm: Any) -> None:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    response = client.embeddings.create(model="minilm", input=TEXTS)
    got = np.array([d.embedding for d in response.data])
    want = minilm.encode(TEXTS)
    assert response.model == "minilm" and got.shape == want.shape == (2, 384)
    np.testing.assert_allclose(got, want, atol=1e-5)
    # the only embedder: no `model` needed on an embedding route
    status, reply = post(url, "/v1/embeddings", {"input": TEXTS})
    assert status == 200 and reply["model"] == "minilm"


def test_rerank_goes_to_the_reranker(url: str, cross_encoder: Path, minilm: Any) -> None:
    want = Scorer(cross_encoder, device="cpu", dtype="float32").score(QUERY, DOCS)
    for body in ({"model": "ms-marco"}, {}):  # the only reranker: no `model` needed
        status, reply = post(url, "/v1/rerank", {**body, "query": QUERY, "documents": DOCS})
        assert status == 200, reply
        assert reply["model"] == "ms-marco"
        assert [r["index"] for r in reply["results"]] == list(np.argsort(-want, kind="stable"))
        for r in reply["results"]:
            assert r["relevance_score"] == pytest.approx(float(want[r["index"]]), abs=1e-5)
    # the embedder, named, ranks by cosine as when served alone
    status, reply = post(url, "/v1/rerank", {"model": "minilm", "query": QUERY, "documents": DOCS})
    assert status == 200 and reply["model"] == "minilm"
    q, d = minilm.encode([QUERY]), minilm.encode(DOCS)
    cosine = (d @ q.T)[:, 0]
    for r in reply["results"]:
        assert r["relevance_score"] == pytest.approx(float(cosine[r["index"]]), abs=1e-5)


def test_wrong_task_unknown_and_ambiguous_models(url: str) -> None:
    status, reply = post(url, "/v1/embeddings", {"model": "ms-marco", "input": TEXTS})
    assert status == 400 and reply["error"]["code"] == "wrong_model_task"
    assert "models that embed: minilm" in reply["error"]["message"]
    status, reply = post(url, "/v1/embeddings", {"model": "nope", "input": TEXTS})
    assert status == 404 and reply["error"]["code"] == "model_not_found"
    assert "available: minilm, ms-marco" in reply["error"]["message"]
    # /tokenize: both models tokenize, so `model` is required
    status, reply = post(url, "/tokenize", {"input": TEXTS})
    assert status == 400 and reply["error"]["param"] == "model"
    assert "minilm, ms-marco" in reply["error"]["message"]


def test_models_ready_and_metrics_cover_both(url: str) -> None:
    status, reply = get(url, "/v1/models")
    assert status == 200
    by_id = {m["id"]: m for m in reply["data"]}
    assert by_id["minilm"]["task"] == "embed" and by_id["minilm"]["dimensions"] == 384
    assert by_id["ms-marco"]["task"] == "score" and by_id["ms-marco"]["outputs"] == ["score"]
    assert by_id["minilm"]["limits"]["max_inputs"] == 2048
    status, reply = get(url, "/ready")
    assert status == 200 and set(reply["models"]) == {"minilm", "ms-marco"}
    with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
        text = r.read().decode()
    assert '{model="minilm",route="/v1/embeddings",status="200"}' in text
    assert 'model="ms-marco"' in text


def _servers_of(serve_pid: int, needle: str) -> list[int]:
    """The `embedserve server` processes under `serve` whose command line holds `needle`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(stat[1]) == serve_pid and b"server" in cmdline and needle.encode() in cmdline:
            found.append(int(entry))
    return found


def test_a_dead_reranker_server_leaves_the_embedder_answering(
    both: tuple[str, Proc], cross_encoder: Path
) -> None:
    url, proc = both
    if "--native" in proc.argv:
        pytest.skip("one process natively: an engine that fails restarts it (tests/native)")
    (pid,) = _servers_of(proc.proc.pid, str(cross_encoder))
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and get(url, "/ready")[0] == 200:
        time.sleep(0.05)
    status, reply = get(url, "/ready")
    assert status == 503 and reply["not_ready"] == ["ms-marco"], reply
    for _ in range(20):  # the embedder answers every request meanwhile
        status, reply = post(url, "/v1/embeddings", {"model": "minilm", "input": TEXTS})
        assert status == 200, reply
    deadline = time.monotonic() + 120  # serve restarts the server; the gateway takes it back
    while time.monotonic() < deadline and get(url, "/ready")[0] != 200:
        time.sleep(0.2)
    assert get(url, "/ready")[0] == 200
    status, _ = post(url, "/v1/rerank", {"query": QUERY, "documents": DOCS})
    assert status == 200
