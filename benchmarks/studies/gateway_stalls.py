"""One gateway worker's event loop under large requests: what a short request sharing the worker
waits, with the servers taken out of the picture.

The gateway app runs in this process (`harness.gateway`'s way) with a replica pool that answers
every part at once with zero rows of the right shape. One coroutine sends large embedding
requests back to back (`--passages` passages of 150-180 words, as text or as token ids, floats
or base64), another a short query every `--every-ms`; each short query's time is what the
worker's loop made it wait. Reported: the short queries' p50 / p99 / max alone and beside the
large ones, the large requests' rate, and the loop's lag ticks (`gateway.stalls`) >= 5 / 20 ms.

On the H200 host, two models behind one gateway of 8 workers, a short request's p99 went from
3 to 30-40 ms under such a flood while its own server's stages grew ~1 ms (the isolation
study): the wait is in the gateway's workers.

    PYTHONPATH=src python3 benchmarks/studies/gateway_stalls.py [--seconds 10] [--ids] [--base64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
from harness import corpus, report
from harness.timing import percentile

HEADERS = [(b"host", b"127.0.0.1"), (b"content-type", b"application/json")]


class ZeroPool:
    """Answers each part at once: zero float32 rows, one per sequence (the head's width)."""

    replicas: tuple[Any, ...] = ()

    async def embed(self, request: Any, num_tokens: int) -> Any:
        from embedserve.contract import EmbedResponse

        rows = np.zeros((len(request.seqlens), request.dimensions or 384), dtype="<f4")
        return EmbedResponse(embeddings=rows.tobytes(), shape=list(rows.shape), dtype="float32")


async def call(app: Any, body: bytes) -> int:
    """One ASGI request to /v1/embeddings; its status."""
    scope = {"type": "http", "method": "POST", "path": "/v1/embeddings", "headers": HEADERS}
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop()
        await asyncio.Event().wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return int(sent[0]["status"])


def flood_body(args: argparse.Namespace, seed: int) -> bytes:
    texts: list[Any] = corpus.passages(args.passages, min_words=150, max_words=180, seed=seed)
    if args.ids:
        from isolation import token_ids  # the same cut as the isolation study's flood

        texts = token_ids(texts)
    body: dict[str, Any] = {"input": texts, "truncate": "end"}
    if args.base64:
        body["encoding_format"] = "base64"
    return json.dumps(body).encode()


async def phase(app: Any, args: argparse.Namespace, flood: list[bytes] | None) -> dict[str, Any]:
    """Short queries every `--every-ms` for `--seconds`, beside back-to-back large requests
    when `flood` is given: the short ones' latencies (ms), the large ones' count, lag ticks."""
    queries = [json.dumps({"input": q}).encode() for q in corpus.queries(64)]
    stop = time.monotonic() + args.seconds
    done = {"large": 0}
    lat: list[float] = []

    async def flooder() -> None:
        k = 0
        while time.monotonic() < stop:
            assert await call(app, flood[k % len(flood)]) == 200  # type: ignore[index]
            done["large"] += 1
            k += 1

    async def prober() -> None:
        k = 0
        while time.monotonic() < stop:
            t = time.perf_counter()
            assert await call(app, queries[k % len(queries)]) == 200
            lat.append((time.perf_counter() - t) * 1e3)
            k += 1
            await asyncio.sleep(args.every_ms / 1e3)

    lag = app.metrics.loop_lag
    before = _lag_counts(lag)
    await asyncio.gather(prober(), *([flooder()] if flood else []))
    after = _lag_counts(lag)
    return {
        "latencies_ms": lat,
        "large_per_s": done["large"] / args.seconds,
        "lag": {k: after[k] - before[k] for k in after},
    }


def _lag_counts(histogram: Any) -> dict[str, float]:
    """Ticks in all, and late by >= 5 ms / >= 20 ms, from the histogram's samples."""
    samples = {
        (s.name, s.labels.get("le")): s.value for m in histogram.collect() for s in m.samples
    }
    total = samples[("embedserve_gateway_loop_lag_seconds_count", None)]
    return {
        "ticks": total,
        "5ms": total - samples[("embedserve_gateway_loop_lag_seconds_bucket", "0.005")],
        "20ms": total - samples[("embedserve_gateway_loop_lag_seconds_bucket", "0.02")],
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from embedserve.gateway.main import GatewayConfig, build_app

    app = build_app(GatewayConfig(replicas=("127.0.0.1:1",), models=("minilm",)))
    served = app.served.models[0]
    served.pipeline = served.make_pipeline()
    served.pipeline.replicas = ZeroPool()
    for service in app.services:
        await service.start()
    flood = [flood_body(args, seed) for seed in range(4)]
    assert await call(app, flood[0]) == 200  # warm: the tokenizer's pool, the paths
    out = {"alone": await phase(app, args, None), "flood": await phase(app, args, flood)}
    for service in app.services:
        await service.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--passages", type=int, default=256)
    ap.add_argument("--every-ms", type=float, default=2.0)
    ap.add_argument("--ids", action="store_true", help="the large requests as token ids")
    ap.add_argument("--base64", action="store_true", help="the large requests' vectors as base64")
    ap.add_argument("--label", default="", help="what this run's tree is (the notes)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # isolation's token_ids
    m = asyncio.run(run(args))
    records, lines = [], []
    for name, ph in m.items():
        lat = ph["latencies_ms"]
        row = {"p50": percentile(lat, 50), "p99": percentile(lat, 99), "max": max(lat)}
        for metric, value in row.items():
            records.append({"system": f"embedserve gateway worker {args.label}".strip(),
                            "model": "all-MiniLM-L6-v2", "weights": "real (tokenizer)",
                            "concurrency": "1" if name == "alone" else "1 + 1 large",
                            "batch": args.passages, "metric": f"short query {metric} (ms)",
                            "value": value, "scope": "one gateway worker, servers answer at once"})  # fmt: skip
        lag = ph["lag"]
        lines.append(
            f"- {name}: short query p50 {row['p50']:.2f} / p99 {row['p99']:.2f} / max "
            f"{row['max']:.1f} ms over {len(lat)}; large requests {ph['large_per_s']:.1f}/s; "
            f"loop ticks {lag['ticks']:.0f}, >= 5 ms late {lag['5ms']:.0f}, >= 20 ms {lag['20ms']:.0f}"
        )
    notes = (
        f"{args.label + ': ' if args.label else ''}{args.passages} passages per large request"
        f"{' as token ids' if args.ids else ''}{', base64 vectors' if args.base64 else ''}; "
        f"a short query every {args.every_ms:g} ms for {args.seconds:g} s per phase.\n\n"
        + "\n".join(lines)
    )
    report.write(
        "gateway-stalls", report.cpu_hardware(), f"cpu{os.cpu_count()}", records,
        report.versions("tokenizers"), notes, args.out,
    )  # fmt: skip
    print(notes)


if __name__ == "__main__":
    main()
