"""A fixed, varied set of test texts: queries, passages past 256 tokens, scripts, emoji, edge cases."""

from __future__ import annotations

QUERIES = [
    "what is the capital of france",
    "how do vaccines work",
    "best way to learn python",
    "symptoms of vitamin d deficiency",
    "python list comprehension vs map",
    "who wrote the brothers karamazov",
    "cheap flights from berlin to lisbon in may",
    "difference between tcp and udp",
    "how tall is mount everest in feet",
    "define photosynthesis",
    "a",
    "?",
    "42",
    "C++ templates SFINAE example",
    "e = mc^2 explained simply",
    "UPPER CASE QUERY ABOUT NUCLEAR FUSION",
    "hyphenated-words and under_scores and CamelCase",
    "url: https://example.com/path?q=1&lang=en#frag",
    "email me at someone@example.org",
    "   leading and trailing spaces   ",
]

MULTILINGUAL = [
    "Der schnelle braune Fuchs springt über den faulen Hund.",
    "Le cœur a ses raisons que la raison ne connaît point.",
    "¿Dónde está la biblioteca más cercana?",
    "Быстрая коричневая лиса прыгает через ленивую собаку.",
    "東京は日本の首都です。",
    "我喜欢在周末读书和散步。",
    "서울은 대한민국의 수도입니다.",
    "مرحبا بالعالم، كيف حالك اليوم؟",
    "שלום עולם, מה שלומך?",
    "नमस्ते दुनिया, आप कैसे हैं?",
    "Γειά σου Κόσμε, τι κάνεις;",
    "สวัสดีชาวโลก",
    "Xin chào thế giới",
    "Zażółć gęślą jaźń",
    "naïve café résumé coöperate",
]

EMOJI = [
    "I love pizza 🍕🍕🍕",
    "🚀 launch day! 🎉",
    "👩‍👩‍👧‍👦 family emoji with joiners",
    "flags 🇫🇷🇯🇵🇧🇷",
    "😀",
    "mixed 日本語 and English and emoji 🤖",
    "math symbols ∑ ∫ √ ∞ ≠ ≤",
    "zero\u200bwidth\u200bspaces",
    "tabs\tand\nnewlines\r\nmixed",
    "control \x07 bell and \x1b escape",
]

WHITESPACE = [" ", "   ", "\n", "\t\t", " \n \t "]

_SENTENCES = [
    "Retrieval systems embed every document in a corpus into a vector space.",
    "At query time the query is embedded with the same model and compared by cosine similarity.",
    "Approximate nearest neighbour indexes such as HNSW make the search sub-linear.",
    "A reranker then scores the top candidates with a cross-encoder for better precision.",
    "Throughput matters when indexing billions of documents, latency when serving queries.",
    "Transformers process tokens in parallel, attending to every other token in the sequence.",
    "Mean pooling averages the final hidden states over the tokens of each sequence.",
    "Normalization to unit length turns the dot product into cosine similarity.",
    "Quantizing embeddings to int8 or binary shrinks the index by four to thirty-two times.",
    "Matryoshka representation learning lets users truncate vectors to fewer dimensions.",
]


def passages() -> list[str]:
    """Passages from one sentence to far past 256 tokens, deterministic."""
    out = []
    for n in (1, 2, 3, 5, 8, 12, 20, 30, 45):
        for offset in (0, 3, 7, 9):
            sents = [_SENTENCES[(offset + i) % len(_SENTENCES)] for i in range(n)]
            out.append(" ".join(sents))
    return out


def all_texts() -> list[str]:
    """About 120 varied texts; some are longer than all-MiniLM-L6-v2's 256-token limit. Not the
    WHITESPACE ones: no token of their own, refused as "" is (tests/core/test_empty_texts.py)."""
    mixed = [q + " " + m for q, m in zip(QUERIES[:10], MULTILINGUAL[:10], strict=True)] + [
        e + " " + p for e, p in zip(EMOJI, passages()[10:20], strict=True)
    ]
    return QUERIES + MULTILINGUAL + EMOJI + passages() + mixed


# A query and documents to rank (scoring tests): relevant, unrelated, a near one, a tiny one,
# a longer one.
RERANK_QUERY = "how do vector databases rank documents?"
RERANK_DOCS = [
    "A vector database stores embeddings and ranks documents by similarity to a query vector.",
    "The weather in Lisbon is mild in winter.",
    "Rerankers score each query and document pair with a cross-encoder after vector search.",
    "ok",
    "Late chunking embeds a whole document once and pools each chunk's tokens. " * 3,
]
