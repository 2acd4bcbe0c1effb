"""A record that kills the worker embedding it costs a bounded number of restarts and ends up in
the errors file with the reason; the other records of its batch are embedded. The death is
simulated in-process: an exception Python does not catch as an error (BaseException), which like
a kill leaves the actor's marks on disk; Ray retries the batch on a restarted actor, here the same
object called again (an actor keeps nothing of the job in memory but its model)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from embedserve.indexing import actor
from embedserve.indexing.actor import EmbedBatch, IndexOptions
from embedserve.indexing.ledger import RECORD_DEATHS, Ledger
from tests.indexing.test_indexing import TEXTS

POISON = "this text kills the process that embeds it"


class Died(BaseException):
    """The actor's process went away (what SIGKILL or an out-of-memory kill does)."""


def test_a_record_that_keeps_killing_its_worker_is_reported_not_retried_for_ever(
    tmp_path: Path,
    minilm,  # type: ignore[no-untyped-def]
) -> None:
    embed = EmbedBatch(IndexOptions(model=str(minilm.spec.path), device="cpu", dtype="float32"))
    embed.ledger = Ledger("job", tmp_path)
    real = embed._encode

    def encode(texts: list[str]):  # type: ignore[no-untyped-def]
        if POISON in texts:
            raise Died
        return real(texts)

    embed._encode = encode  # type: ignore[method-assign]
    texts = [TEXTS[0], POISON, TEXTS[1], TEXTS[2]]
    batch = {
        "id": np.array(["a", "b", "c", "d"], dtype=object),
        "text": np.array(texts, dtype=object),
    }
    deaths = 0
    for _ in range(1 + actor.MAX_TASK_RETRIES):  # the first try and Ray's retries
        try:
            out = embed(batch)
            break
        except Died:
            deaths += 1
    else:
        pytest.fail("the batch was still killing its worker after every retry")
    # the batch once, then the record RECORD_DEATHS times, within Ray's bounds
    assert deaths == 1 + RECORD_DEATHS
    assert deaths <= min(actor.MAX_TASK_RETRIES, actor.MAX_RESTARTS)
    assert list(out["error"][[0, 2, 3]]) == ["", "", ""]
    assert "the worker embedding it died 2 times" in out["error"][1]
    want = minilm.encode([TEXTS[0], TEXTS[1], TEXTS[2]])
    assert (out["vector"][[0, 2, 3]] * want).sum(1).min() >= 0.99999
    assert not out["vector"][1].any()
    assert list(tmp_path.iterdir()) == []  # no mark left once the batch is done
    # an error in Python is no death: the batch is not suspected the next time
    embed._encode = real  # type: ignore[method-assign]
    batch["text"][1] = TEXTS[3]
    assert list(embed(batch)["error"]) == ["", "", "", ""]
