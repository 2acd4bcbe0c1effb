"""`embedserve serve --config models.toml`, real processes: the bundled embedder and a
random-weight cross-encoder, each with its own limits; each server states its memory."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from embedserve.devtools.checkpoints import make_checkpoint
from tests.data.texts import RERANK_DOCS, RERANK_QUERY
from tests.e2e.conftest import Proc
from tests.e2e.test_multi_model import get
from tests.e2e.test_rerank_serving import post

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Proc]]:
    folder = tmp_path_factory.mktemp("models-file")
    ranker = make_checkpoint(folder / "ce", arch="ms-marco-minilm-l6", dtype="float32", seed=5)
    config = folder / "models.toml"
    config.write_text(
        f'[[model]]\nname = "embedder"\nmodel = "minilm"\nmax_inputs = 8\n\n'
        f'[[model]]\nname = "ranker"\nmodel = "{ranker}"\nmax_inputs = 3\n'
        "max_batch_tokens = 512\n"
    )
    proc = Proc(
        "serve", "--config", str(config), "--port", "0", "--device", "cpu", "--dtype", "float32"
    )
    try:
        yield proc.wait_for(r"embedserve: serving embedder, ranker at (\S+)").group(1), proc
    finally:
        proc.stop()


def test_each_model_answers_under_its_own_limits(served: tuple[str, Proc]) -> None:
    url, proc = served
    status, reply = get(url, "/v1/models")
    limits = {m["id"]: m["limits"]["max_inputs"] for m in reply["data"]}
    assert status == 200 and limits == {"embedder": 8, "ranker": 3}
    status, reply = post(url, "/v1/rerank", {"query": RERANK_QUERY, "documents": RERANK_DOCS[:3]})
    assert status == 200 and reply["model"] == "ranker"
    status, reply = post(url, "/v1/rerank", {"query": RERANK_QUERY, "documents": RERANK_DOCS[:4]})
    assert status == 400 and reply["error"]["code"] == "too_many_inputs", reply
    status, reply = post(url, "/v1/embeddings", {"model": "embedder", "input": ["a"] * 8})
    assert status == 200 and len(reply["data"]) == 8
    # each server stated its memory at start-up (the ranker at its own batch budget)
    stated = [m.group(1) for line in proc.lines if (m := _MEMORY.search(line))]
    assert len(stated) == 2, proc.lines


_MEMORY = re.compile(r"embedserve server: memory on cpu: ([\d.]+ GiB: weights .*)")
