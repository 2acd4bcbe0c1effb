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

Clients are processes (benchmarks/harness/loadgen.py): one Python process tops out near 4,700 requests/s.

Text: Python standard-library docstrings (benchmarks/harness/corpus.py). Writes
`concurrency-<gpu>-YYYYMMDD.json` + `.md` into --out (default benchmarks/results/concurrency/).

    PYTHONPATH=src python3 benchmarks/studies/serving_gpu.py --model DIR [--out DIR] [--seconds 4]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
from harness import corpus, loadgen, report
from harness.http_calls import connect, post_json, post_on
from harness.servers import CLI, SERVING, start
from harness.timing import latency_ms, timed_s

MODEL = "all-MiniLM-L6-v2"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", type=Path, required=True, help="all-MiniLM-L6-v2 folder")
    ap.add_argument("--out", type=Path, default=None, help="default: results/concurrency/")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--levels", default="1,2,4,8,16")
    ap.add_argument("--device", default="cuda", help="cpu only to try the script out")
    ap.add_argument("--workers", type=int, default=None, help="gateway workers (default: serve's)")
    ap.add_argument("--tag", default="", help="suffix of the results' file name")
    ap.add_argument(
        "--parts",
        default="latency,levels,bulk,ceiling",
        help="which of latency, levels, bulk, ceiling to run (fidelity always)",
    )
    ap.add_argument(
        "--serve-args", default="", help="more `serve` flags, e.g. '--warmup-queries 0'"
    )
    args = ap.parse_args()
    from sentence_transformers import SentenceTransformer

    from embedserve.core.tokenization import TextTokenizer

    queries = corpus.queries(256)
    passages = corpus.passages(400, max_words=180)
    tok = TextTokenizer(args.model / "tokenizer.json", 256)
    t_start = time.perf_counter()
    server, ready = start(
        [*CLI, "serve", "--model", str(args.model), "--device", args.device, "--port", "0",
         "--served-model-name", "minilm",
         *(["--workers", str(args.workers)] if args.workers else []), *args.serve_args.split()],
        SERVING,
    )  # fmt: skip
    port = int(ready.group(1))
    records: list[dict[str, Any]] = []
    extra: dict[str, Any] = {
        "serve_startup_s": round(time.perf_counter() - t_start, 2),
        # each gateway worker's tokenizer pool (`memory.tokenizer_threads` unless set)
        "rayon_num_threads": os.environ.get("RAYON_NUM_THREADS", "cores // workers"),
    }
    query_bodies = [json.dumps({"input": q, "model": "minilm"}).encode() for q in queries]
    try:
        st = SentenceTransformer(str(args.model), device=args.device)
        st_dtype = str(next(st.parameters()).dtype).replace("torch.", "")
        cosine_min = fidelity(port, st, queries[:16] + passages[:16], extra)
        base = {"model": MODEL, "weights": "real", "concurrency": 1,
                "dtype": "bf16" if args.device == "cuda" else "cpu default"}  # fmt: skip
        parts = set(args.parts.split(","))
        if "latency" in parts:
            single_latency(args, port, tok, st, st_dtype, queries, passages, cosine_min, base,
                           records)  # fmt: skip
        if "levels" in parts:
            levels(args, port, query_bodies, base, records)
        if "bulk" in parts:
            bulk(args, port, tok, st, st_dtype, passages, base, records, extra)
    finally:
        server.stop(60)
    if "ceiling" not in parts:
        write(args, st_dtype, records, extra)
        return
    # the clients' ceiling: the same client processes against a no-op server of many workers
    try:
        with loadgen.noop_server(workers=8) as noop_port:
            ceiling = loadgen.run(noop_port, loadgen.split(query_bodies, 16), args.seconds)
    except (OSError, TimeoutError) as e:  # on 2026-12-04 the H200 host's no-op server timed out
        extra["client_ceiling_error"] = repr(e)
    else:
        summary = ceiling.summary()
        extra["client_ceiling_16_clients_noop_8_workers_req_per_s"] = round(
            summary["requests_per_s"]
        )
        print(f"client ceiling (16 client processes, no-op server): {summary}", flush=True)
    write(args, st_dtype, records, extra)


def fidelity(port: int, st: Any, probe: list[str], extra: dict[str, Any]) -> float:
    """1. served vectors against sentence-transformers on the same device; exits below 0.999."""
    reply = post_json(port, {"input": probe, "truncate": "end"})
    served = np.array([d["embedding"] for d in reply["data"]])
    ref = st.encode(probe, normalize_embeddings=True)
    cosine_min = float((served * ref).sum(1).min())
    extra["cosine_min_vs_sentence_transformers"] = cosine_min
    if cosine_min < 0.999:
        raise SystemExit(f"served vectors diverge from sentence-transformers: cosine {cosine_min}")
    return cosine_min


def single_latency(args: argparse.Namespace, port: int, tok: Any, st: Any, st_dtype: str,
                   queries: list[str], passages: list[str], cosine_min: float,
                   base: dict[str, Any], records: list[dict[str, Any]]) -> None:  # fmt: skip
    """2. one query end to end, our engine on the same ids, sentence-transformers on the text."""
    from embedserve.engine.batch import PackedBatch
    from embedserve.engine.engine import Engine

    long_ids = [i for i in tok.encode([" ".join(passages)], truncate="end")[0]][:128]
    passage_128 = tok._full.decode(long_ids[1:-1])  # ~128 tokens of real text
    engine = Engine.from_folder(args.model, device=args.device)
    for name, text in (("short query", queries[0]), ("128 tokens", passage_128)):
        ids = tok.encode([text])[0]
        body = {"input": text, "model": "minilm"}  # encoded per call, as a client does
        # a fresh connection: the idle time of the slow baseline below outlasts keep-alive
        conn = connect(port, timeout=60)
        for _ in range(50):
            post_on(conn, json.dumps(body))
        e2e = latency_ms(timed_s(lambda body=body, conn=conn: post_on(conn, json.dumps(body)), 300))
        batch = PackedBatch.from_token_lists([ids])
        for _ in range(5):
            engine.step(batch).wait()
        eng = latency_ms(timed_s(lambda batch=batch: engine.step(batch).wait(), 300))
        st.encode([text])
        st_lat = latency_ms(timed_s(lambda text=text: st.encode([text]), 100))
        for metric in ("p50_ms", "p99_ms"):
            rec = {**base, "batch": 1, "tokens": len(ids), "metric": metric}
            ours = {**rec, "system": "embedserve", "cosine_min": round(cosine_min, 6)}
            records += [
                {**ours, "value": round(e2e[metric], 4), "scope": "end_to_end"},
                {**ours, "value": round(eng[metric], 4), "scope": "engine"},
                {**rec, "system": "sentence-transformers", "dtype": st_dtype,
                 "value": round(st_lat[metric], 4), "scope": "end_to_end"},
            ]  # fmt: skip
        print(f"{name} ({len(ids)} tok): e2e {e2e}, engine {eng}, st {st_lat}", flush=True)
        conn.close()


def levels(args: argparse.Namespace, port: int, query_bodies: list[bytes],
           base: dict[str, Any], records: list[dict[str, Any]]) -> None:  # fmt: skip
    """3. suite 4: concurrent clients, one short query per request."""
    for clients in (int(x) for x in args.levels.split(",")):
        s = loadgen.run(port, loadgen.split(query_bodies, clients), args.seconds).summary()
        for metric in ("requests_per_s", "p50_ms", "p99_ms"):
            records.append(
                {**base, "system": "embedserve", "batch": 1, "tokens": "3-12 words",
                 "concurrency": clients, "metric": metric, "value": round(s[metric], 3),
                 "scope": "end_to_end"}
            )  # fmt: skip
        print(f"{clients} clients: {s}", flush=True)


def bulk(args: argparse.Namespace, port: int, tok: Any, st: Any, st_dtype: str,
         passages: list[str], base: dict[str, Any], records: list[dict[str, Any]],
         extra: dict[str, Any]) -> None:  # fmt: skip
    """4. suite 3: four clients of 100 passages per request (base64), against sentence-
    transformers `encode` of the same passages in process."""
    batches = [passages[i : i + 100] for i in range(0, 400, 100)]
    post_json(port, {"input": batches[0], "encoding_format": "base64", "truncate": "end"})
    batch_bodies = [
        json.dumps({"input": b, "encoding_format": "base64", "truncate": "end"}).encode()
        for b in batches
    ]
    result = loadgen.run(port, loadgen.split(batch_bodies, 4), args.seconds * 2)
    tps = result.tokens_per_s
    extra["throughput_errors"] = result.errors
    num_tokens = [sum(len(x) for x in tok.encode(b, truncate="end")) for b in batches]
    st.encode(batches[0], batch_size=64)
    st_times = [timed_s(lambda b=b: st.encode(b, batch_size=64), 1)[0] for b in batches * 2]
    st_tps = sum(num_tokens) * 2 / sum(st_times)
    eng_tps = engine_tokens_per_s(args, tok, batches)
    extra["http_share_of_engine_100_passages"] = round(tps / eng_tps, 3)
    tp = {**base, "batch": 100, "tokens": "8-180 words", "metric": "tokens_per_s"}
    records += [
        {**tp, "system": "embedserve", "concurrency": 1, "value": round(eng_tps, 1),
         "scope": "engine"},
        {**tp, "system": "embedserve", "concurrency": 4, "value": round(tps, 1),
         "scope": "end_to_end"},
        {**tp, "system": "sentence-transformers", "dtype": st_dtype, "value": round(st_tps, 1),
         "scope": "end_to_end"},
    ]  # fmt: skip
    print(
        f"throughput: embedserve {tps:.0f} tok/s (4 clients), sentence-transformers {st_tps:.0f} tok/s",
        flush=True,
    )
    reply = post_json(port, {"input": "x", "encoding_format": "base64"})
    extra["decode_check_base64"] = len(base64.b64decode(reply["data"][0]["embedding"])) == 4 * 384


def engine_tokens_per_s(args: argparse.Namespace, tok: Any, batches: list[list[str]]) -> float:
    """The engine alone on the same 100-passage batches, in this process: `Engine.step` of each
    request's passages as one packed batch, what the server's path is held to (issue 38)."""
    from embedserve.engine.batch import PackedBatch
    from embedserve.engine.engine import Engine

    engine = Engine.from_folder(args.model, device=args.device)
    packed = [PackedBatch.from_token_lists(tok.encode(b, truncate="end")) for b in batches]
    for batch in packed * 3:  # eager, capture, replay of each bucket
        engine.step(batch).wait()
    tokens = sum(int(b.num_tokens) for b in packed)
    seconds = min(timed_s(lambda: [engine.step(b).wait() for b in packed], 5))
    print(f"engine alone on the same batches: {tokens / seconds:.0f} tok/s", flush=True)
    return tokens / seconds


def write(args: argparse.Namespace, st_dtype: str, records: list[dict[str, Any]],
          extra: dict[str, Any]) -> None:  # fmt: skip
    import torch

    notes = (
        f"`embedserve serve --device cuda` (one server replica, gateway workers: "
        f"{args.workers or 'default'}{'; ' + args.serve_args if args.serve_args else ''}) over HTTP on loopback; concurrency and throughput clients "
        "are processes of their own (benchmarks/harness/loadgen.py), one keep-alive connection each, "
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
        (report.card_slug() if args.device == "cuda" else "cpu-trial") + args.tag,
        records,
        software,
        notes,
        args.out,
    )
    print(table)


if __name__ == "__main__":
    main()
