"""The client snippets of docs/clients.md that are marked tested run as written, against a real
`embedserve serve` (only the base URL is filled in), and the vectors the LangChain, LlamaIndex
and litellm snippets get equal the `openai` client's for the same text."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "clients.md"
TEXTS = ["a document", "another"]


def marked_blocks() -> dict[str, str]:
    text = DOC.read_text(encoding="utf-8")
    return dict(re.findall(r"<!-- tested: (\w+) -->\n```python\n(.*?)```", text, flags=re.S))


def run_block(name: str, url: str) -> dict[str, Any]:
    """Exec the block marked `<!-- tested: NAME -->` with BASE_URL set; return its namespace."""
    blocks = marked_blocks()
    assert name in blocks, f"docs/clients.md lost its tested {name} block"
    namespace: dict[str, Any] = {"BASE_URL": f"{url}/v1"}
    exec(compile(blocks[name], str(DOC), "exec"), namespace)
    return namespace


def assert_same_as_openai(url: str, got: Any, texts: list[str], **options: Any) -> None:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="not-needed", max_retries=0)
    reply = client.embeddings.create(model="minilm", input=texts, **options)
    want = np.array([d.embedding for d in reply.data], dtype=np.float64)
    got = np.asarray(got, dtype=np.float64)
    assert got.shape == want.shape
    cosine = (got * want).sum(-1) / (np.linalg.norm(got, axis=-1) * np.linalg.norm(want, axis=-1))
    assert cosine.min() > 0.9999


def test_the_openai_snippet_runs_as_written(each_served: str) -> None:
    run_block("openai", each_served)


def test_the_langchain_snippet_runs_as_written(each_served: str) -> None:
    pytest.importorskip(
        "langchain_openai", reason="langchain-openai is not installed (pip install -e '.[test]')"
    )
    namespace = run_block("langchain", each_served)
    assert_same_as_openai(each_served, namespace["vectors"], TEXTS)


def test_the_llamaindex_snippet_runs_as_written(each_served: str) -> None:
    pytest.importorskip(
        "llama_index.embeddings.openai",
        reason="llama-index-embeddings-openai is not installed (pip install -e '.[test]')",
    )
    namespace = run_block("llamaindex", each_served)
    assert_same_as_openai(each_served, [namespace["vector"]], TEXTS[:1])
    assert_same_as_openai(each_served, namespace["vectors"], TEXTS)


@pytest.mark.filterwarnings("ignore:.*ReadOnly. qualifier:UserWarning")  # litellm's own types
def test_the_litellm_snippet_runs_as_written(
    each_served: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # read when litellm is imported: its bundled price map, not a fetch from GitHub (no network)
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    pytest.importorskip("litellm", reason="litellm is not installed (pip install -e '.[test]')")
    namespace = run_block("litellm", each_served)
    got = [d["embedding"] for d in namespace["reply"].data]
    assert_same_as_openai(each_served, got, TEXTS, dimensions=128)
