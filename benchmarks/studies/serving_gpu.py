"""Suites 3 and 4 on a GPU, end to end: `embedserve serve --device cuda` over HTTP on loopback.

One script run on the GPU machine, all-MiniLM-L6-v2 (a float16 copy of the real weights, run in
bf16 by our engine), measures:

1. fidelity at warm-up: served vectors vs sentence-transformers on the same GPU (cosine);
2. end-to-end latency of one query (HTTP, JSON, tokenization, gRPC, engine) for a short query
   and a 128-token passage, next to our engine's own time for the same ids in this process and
   sentence-transformers `encode` of the same single text (the baseline users run today);
3. suite 4: 1, 2, 4, 8, 16 concurrent clients, one short query per request (requests/s, p50, p99);
4. suite 3: four client processes each sending 100 passages per request (base64 output), in
   tokens/s, next to sentence-transformers `encode` of the same 100 passages in process
   (batch size 64, the folder's dtype);
5. the clients' ceiling: the same 16 client processes against a no-op server (8 workers).

Clients are processes (benchmarks/loadgen.py): one Python process tops out near 4,700 requests/s.

Text: Python standard-library docstrings (benchmarks/corpus.py). Writes
`concurrency-<gpu>-YYYYMMDD.json` + `.md` into --out (default benchmarks/results).

    PYTHONPATH=src python3 benchmarks/serving_gpu.py --model DIR [--out DIR] [--seconds 4]
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
from harness import corpus, loadgen, report
from harness.servers import CLI, start

MODEL = "all-MiniLM-L6-v2"


def post(port: int, body: dict[str, Any], conn: http.client.HTTPConnection | None = None) -> Any:
    c = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    c.request(
        "POST",
        "/v1/embeddings",
        body=json.dumps(body),
        headers={"Content-Type": "application/json"},
    )
    reply = c.getresponse()
    data = reply.read()
    if reply.status != 200:
        raise RuntimeError(f"HTTP {reply.status}: {data[:300]!r}")
    return json.loads(data)


def percentiles(seconds: list[float]) -> dict[str, float]:
    ms = np.array(seconds) * 1000
    return {"p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99))}


def timed(fn: Any, count: int) -> list[float]:
    out = []
    for _ in range(count):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", type=Path, required=True, help="all-MiniLM-L6-v2 folder")
    ap.add_argument("--out", type=Path, default=report.RESULTS)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--levels", default="1,2,4,8,16")
    ap.add_argument("--device", default="cuda", help="cpu only to try the script out")
    ap.add_argument("--workers", type=int, default=None, help="gateway workers (default: serve's)")
    ap.add_argument("--tag", default="", help="suffix of the results' file name")
    args = ap.parse_args()

    import torch
    from sentence_transformers import SentenceTransformer

    from embedserve.core.tokenization import TextTokenizer
    from embedserve.engine.batch import PackedBatch
    from embedserve.engine.engine import Engine

    queries = corpus.queries(256)
    passages = corpus.passages(400, max_words=180)
    tok = TextTokenizer(args.model / "tokenizer.json", 256)
    long_ids = [i for i in tok.encode([" ".join(passages)], truncate="end")[0]][:128]
    passage_128 = tok._full.decode(long_ids[1:-1])  # ~128 tokens of real text
    batches = [passages[i : i + 100] for i in range(0, 400, 100)]

    t_start = time.perf_counter()
    server, ready = start(
        [
            *CLI,
            "serve",
            "--model",
            str(args.model),
            "--device",
            args.device,
            "--port",
            "0",
            "--served-model-name",
            "minilm",
            *(["--workers", str(args.workers)] if args.workers else []),
        ],
        r"serving \S+ at http://127\.0\.0\.1:(\d+)",
    )
    startup_s = time.perf_counter() - t_start
    port = int(ready.group(1))
    records: list[dict[str, Any]] = []
    extra: dict[str, Any] = {"serve_startup_s": round(startup_s, 2)}
    try:
        st = SentenceTransformer(str(args.model), device=args.device)
        st_dtype = str(next(st.parameters()).dtype).replace("torch.", "")
        probe = queries[:16] + passages[:16]
        served = np.array(
            [d["embedding"] for d in post(port, {"input": probe, "truncate": "end"})["data"]]
        )
        ref = st.encode(probe, normalize_embeddings=True)
        cosine_min = float((served * ref).sum(1).min())
        extra["cosine_min_vs_sentence_transformers"] = cosine_min
        if cosine_min < 0.999:
            raise SystemExit(
                f"served vectors diverge from sentence-transformers: cosine {cosine_min}"
            )

        base = {
            "model": MODEL,
            "weights": "real",
            "dtype": "bf16" if args.device == "cuda" else "fp32",
            "concurrency": 1,
        }
        engine = Engine.from_folder(args.model, device=args.device)
        for name, text in (("short query", queries[0]), ("128 tokens", passage_128)):
            ids = tok.encode([text])[0]
            body = {"input": text, "model": "minilm"}
            # a fresh connection: the idle time of the slow baseline below outlasts keep-alive
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            for _ in range(50):
                post(port, body, conn)
            e2e = percentiles(timed(lambda body=body, conn=conn: post(port, body, conn), 300))
            batch = PackedBatch.from_token_lists([ids])
            for _ in range(5):
                engine.step(batch).wait()
            eng = percentiles(timed(lambda batch=batch: engine.step(batch).wait(), 300))
            st.encode([text])
            st_lat = percentiles(timed(lambda text=text: st.encode([text]), 100))
            for metric in ("p50_ms", "p99_ms"):
                rec = {**base, "batch": 1, "tokens": len(ids), "metric": metric}
                records.append(
                    {
                        **rec,
                        "system": "embedserve",
                        "value": round(e2e[metric], 4),
                        "scope": "end_to_end",
                        "cosine_min": round(cosine_min, 6),
                    }
                )
                records.append(
                    {
                        **rec,
                        "system": "embedserve",
                        "value": round(eng[metric], 4),
                        "scope": "engine",
                        "cosine_min": round(cosine_min, 6),
                    }
                )
                records.append(
                    {
                        **rec,
                        "system": "sentence-transformers",
                        "dtype": st_dtype,
                        "value": round(st_lat[metric], 4),
                        "scope": "end_to_end",
                    }
                )
            print(f"{name} ({len(ids)} tok): e2e {e2e}, engine {eng}, st {st_lat}", flush=True)
        conn.close()

        query_bodies = [json.dumps({"input": q, "model": "minilm"}).encode() for q in queries]
        for clients in (int(x) for x in args.levels.split(",")):
            s = loadgen.run(port, loadgen.split(query_bodies, clients), args.seconds).summary()
            for metric in ("requests_per_s", "p50_ms", "p99_ms"):
                records.append(
                    {
                        **base,
                        "system": "embedserve",
                        "batch": 1,
                        "tokens": "3-12 words",
                        "concurrency": clients,
                        "metric": metric,
                        "value": round(s[metric], 3),
                        "scope": "end_to_end",
                    }
                )
            print(f"{clients} clients: {s}", flush=True)

        post(port, {"input": batches[0], "encoding_format": "base64", "truncate": "end"})
        batch_bodies = [
            json.dumps({"input": b, "encoding_format": "base64", "truncate": "end"}).encode()
            for b in batches
        ]
        bulk = loadgen.run(port, loadgen.split(batch_bodies, 4), args.seconds * 2)
        tps = bulk.tokens_per_s
        extra["throughput_errors"] = bulk.errors
        num_tokens = [sum(len(x) for x in tok.encode(b, truncate="end")) for b in batches]
        st.encode(batches[0], batch_size=64)
        st_times = [timed(lambda b=b: st.encode(b, batch_size=64), 1)[0] for b in batches * 2]
        st_tps = sum(num_tokens) * 2 / sum(st_times)
        tp = {**base, "batch": 100, "tokens": "8-180 words", "metric": "tokens_per_s"}
        records.append(
            {
                **tp,
                "system": "embedserve",
                "concurrency": 4,
                "value": round(tps, 1),
                "scope": "end_to_end",
            }
        )
        records.append(
            {
                **tp,
                "system": "sentence-transformers",
                "dtype": st_dtype,
                "value": round(st_tps, 1),
                "scope": "end_to_end",
            }
        )
        print(
            f"throughput: embedserve {tps:.0f} tok/s (4 clients), sentence-transformers {st_tps:.0f} tok/s",
            flush=True,
        )
        extra["decode_check_base64"] = (
            len(
                base64.b64decode(
                    post(port, {"input": "x", "encoding_format": "base64"})["data"][0]["embedding"]
                )
            )
            == 4 * 384
        )
    finally:
        server.stop(60)
    # the clients' ceiling: the same client processes against a no-op server of many workers
    with loadgen.noop_server(workers=8) as noop_port:
        ceiling = loadgen.run(noop_port, loadgen.split(query_bodies, 16), args.seconds).summary()
    extra["client_ceiling_16_clients_noop_8_workers_req_per_s"] = round(ceiling["requests_per_s"])
    print(f"client ceiling (16 client processes, no-op server): {ceiling}", flush=True)

    notes = (
        f"`embedserve serve --device cuda` (one server replica, gateway workers: "
        f"{args.workers or 'default'}) over HTTP on loopback; concurrency and throughput clients "
        "are processes of their own (benchmarks/loadgen.py), one keep-alive connection each, "
        "closed loop. "
        "end_to_end = HTTP request to parsed JSON reply; engine = `Engine.step(batch).wait()` "
        "wall time in this process for the same token ids (graph replay + host work); "
        f"sentence-transformers = `encode` in process on the same GPU ({st_dtype}). Text: Python "
        "standard-library docstrings. Extra: " + json.dumps(extra)
    )
    software = report.versions(
        "torch", "transformers", "sentence-transformers", "grpcio", "uvicorn"
    )
    _, table = report.write(
        "concurrency",
        torch.cuda.get_device_name() if args.device == "cuda" else report.cpu_hardware(),
        ("h200" if args.device == "cuda" else "cpu-trial") + args.tag,
        records,
        software,
        notes,
        args.out,
    )
    print(table)


if __name__ == "__main__":
    main()
