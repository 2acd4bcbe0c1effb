"""Real English text for benchmarks, offline: the docstrings of the Python standard library.

Deterministic: the same Python version gives the same passages. Passages are runs of whole
sentences cut to a spread of lengths (a few words to a few hundred), like a retrieval corpus.
"""

from __future__ import annotations

import importlib
import random
import re

MODULES = [
    "argparse",
    "asyncio",
    "collections",
    "concurrent.futures",
    "contextlib",
    "csv",
    "dataclasses",
    "datetime",
    "decimal",
    "email",
    "enum",
    "functools",
    "heapq",
    "http.client",
    "inspect",
    "itertools",
    "json",
    "logging",
    "multiprocessing",
    "os",
    "pathlib",
    "pickle",
    "queue",
    "random",
    "re",
    "shutil",
    "socket",
    "sqlite3",
    "statistics",
    "string",
    "subprocess",
    "tarfile",
    "threading",
    "typing",
    "unittest",
    "urllib.request",
    "uuid",
    "zipfile",
]


def sentences() -> list[str]:
    out: list[str] = []
    for name in MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        docs = [module.__doc__ or ""]
        for attr in sorted(vars(module)):
            obj = getattr(module, attr, None)
            doc = getattr(obj, "__doc__", None)
            if isinstance(doc, str) and not attr.startswith("_"):
                docs.append(doc)
        for doc in docs:
            text = re.sub(r"\s+", " ", doc).strip()
            out.extend(s for s in re.split(r"(?<=[.!?])\s+", text) if len(s.split()) >= 4)
    return list(dict.fromkeys(out))  # unique, in order


def passages(count: int, *, min_words: int = 8, max_words: int = 180, seed: int = 0) -> list[str]:
    """`count` passages whose lengths spread from `min_words` to `max_words` words."""
    rng = random.Random(seed)
    pool = sentences()
    out = []
    for _ in range(count):
        target = int(min_words * (max_words / min_words) ** rng.random())  # log-uniform
        words: list[str] = []
        i = rng.randrange(len(pool))
        while len(words) < target:
            words.extend(pool[i % len(pool)].split())
            i += 1
        out.append(" ".join(words[:target]))
    return out


def queries(count: int, seed: int = 1) -> list[str]:
    """Short query-like strings: the first 3 to 12 words of random sentences."""
    rng = random.Random(seed)
    pool = sentences()
    return [" ".join(rng.choice(pool).split()[: rng.randint(3, 12)]) for _ in range(count)]
