"""Suite 2, low-latency scoring, on a GPU: one query against 5 / 25 / 50 documents of ~512-token
pairs, for the ms-marco MiniLM cross-encoder shape and the Qwen3-Reranker-0.6B shape (random
weights from `embedserve make-checkpoint`, run in bf16), in one script run:

- engine: the packed pairs to scores on the host in batches of the largest captured bucket (8,192
  tokens), as `Scorer` runs them (graph replays; median of 30);
- embedding forward: the same pairs through the same weights as an embedding model (no score
  head): the per-token cost of scoring against embedding;
- HTTP: `embedserve serve` on the folder, `POST /v1/rerank`, keep-alive client, p50 of 30; and
  the same against `embedserve serve --native` (`--fronts python` for the first alone);
- transformers eager on the same weights in bf16 (`AutoModelForSequenceClassification`;
  `Qwen3ForCausalLM` with only the last position's logits), tokenization included;
- sentence-transformers `CrossEncoder.predict` in bf16 (the cross-encoder), batch = all pairs;
- the score guard at warm-up: our bf16 scores against transformers fp32 on the same pairs;
- the compute floor: the forward's FLOPs over the measured bf16 matrix rate (743 TFLOP/s).

    PYTHONPATH=src python3 benchmarks/suites/scoring.py --device cuda --out DIR [--counts 5,25,50]

`--device cpu` runs the same on the CPU, in bf16 (slow: to try the suite out, not a figure).
"""

from __future__ import annotations

import argparse
import dataclasses
import http.client
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
from harness import corpus, report, timing
from harness.servers import CLI, start

MATRIX_FLOPS = 743e12  # measured bf16 matrix rate of the H200 (the project brief's)
QUERY = "how do vector databases rank the documents they return for a search query?"
PAIR_TOKENS = 512
DEVICE = "cuda"  # --device cpu only to try the script out
FRONTS = "python,native"  # `--fronts`: the servers whose /v1/rerank is timed
HTTP_SYSTEMS = {"python": "embedserve HTTP /v1/rerank", "native": "embedserve serve --native HTTP /v1/rerank"}  # fmt: skip
ARCHS = {"ms-marco-minilm-l6": "ms-marco-MiniLM-L-6-v2 shape", "qwen3-reranker-0.6b": "Qwen3-Reranker-0.6B shape"}  # fmt: skip


def median_ms(fn: Any, reps: int = 30, warm: int = 3) -> float:
    return timing.median(timing.timed_ms(fn, reps, DEVICE, warm))


def documents(scorer: Any, count: int) -> list[str]:
    """`count` documents whose pairs with QUERY are about PAIR_TOKENS tokens (real text)."""
    tok = scorer.pairs.tokenizer
    overhead = len(scorer.pairs.prepare(QUERY, ["x"]).seqs[0]) - 1
    stream = [i for t in corpus.passages(400) for i in tok.encode_plain(t)]
    room = PAIR_TOKENS - overhead - 4
    return [tok._full.decode(stream[k * room : (k + 1) * room]) for k in range(count)]


def flops(spec: Any, seqlens: list[int]) -> float:
    """Matrix FLOPs of one forward: 2 x non-embedding weights x tokens, plus attention."""
    if spec.bert is not None:
        c = spec.bert
        h, layers = c.hidden_size, c.num_layers
        per_token = layers * (4 * h * h + 2 * h * c.intermediate_size)
        q_width = h
    else:
        c = spec.qwen3
        h, layers, d = c.hidden_size, c.num_layers, c.head_dim
        qkv = h * (c.num_heads + 2 * c.num_kv_heads) * d
        per_token = layers * (qkv + c.num_heads * d * h + 3 * h * c.intermediate_size)
        q_width = c.num_heads * d
    attention = sum(4 * n * n * q_width * layers for n in seqlens)
    return 2.0 * per_token * sum(seqlens) + attention


_HF: dict[tuple[str, str], Any] = {}  # transformers models loaded once per (folder, dtype)


def hf_scores(
    folder: Path, spec: Any, scorer: Any, docs: list[str], dtype: Any, query: str = QUERY
) -> Any:
    """transformers eager on the same pairs: a callable computing the scores, on the GPU."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, Qwen3ForCausalLM

    from embedserve.core.pairs import RERANK_BODY, RERANK_INSTRUCTION, RERANK_SUFFIX, RERANK_SYSTEM

    tok = AutoTokenizer.from_pretrained(folder)
    key = (str(folder), str(dtype))
    if spec.bert is not None:
        model = (
            _HF.get(key)
            or AutoModelForSequenceClassification.from_pretrained(folder, torch_dtype=dtype)
            .to(DEVICE)
            .eval()
        )
        _HF[key] = model

        @torch.inference_mode()
        def run() -> np.ndarray:
            enc = tok([query] * len(docs), docs, padding=True, truncation="only_second",
                      max_length=spec.max_seq_length, return_tensors="pt").to(DEVICE)  # fmt: skip
            return model(**enc).logits[:, 0].float().cpu().numpy()

        return run
    model = (
        _HF.get(key)
        or Qwen3ForCausalLM.from_pretrained(folder, torch_dtype=dtype).to(DEVICE).eval()
    )
    _HF[key] = model
    tok.padding_side = "left"
    yes, no = tok.convert_tokens_to_ids("yes"), tok.convert_tokens_to_ids("no")
    head = RERANK_BODY.format(instruction=RERANK_INSTRUCTION, query=query)
    texts = [RERANK_SYSTEM + head + d + RERANK_SUFFIX for d in docs]

    @torch.inference_mode()
    def run_llm() -> np.ndarray:
        enc = tok(texts, padding=True, add_special_tokens=False, return_tensors="pt").to(DEVICE)
        logits = model(**enc, logits_to_keep=1).logits[:, -1]
        return (logits[:, yes] - logits[:, no]).float().cpu().numpy()

    return run_llm


def http_ms(port: int, docs: list[str], reps: int = 30) -> float:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    body = json.dumps({"query": QUERY, "documents": docs})

    def once() -> None:
        conn.request("POST", "/v1/rerank", body=body, headers={"Content-Type": "application/json"})
        reply = conn.getresponse()
        data = reply.read()
        if reply.status != 200:
            raise RuntimeError(f"HTTP {reply.status}: {data[:300]!r}")

    for _ in range(5):
        once()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        once()
        times.append((time.perf_counter() - t0) * 1e3)
    conn.close()
    return timing.median(times)


def top10_agreement(folder: Path, queries: int = 50, docs_per_query: int = 20) -> dict[str, Any]:
    """Our bf16 scores against transformers fp32 on `queries` x `docs_per_query` pairs: how many
    queries keep the same top-10 order, and the largest score difference (as served)."""
    import torch

    from embedserve import Scorer

    scorer = Scorer(folder, device=DEVICE)
    spec = scorer.spec
    texts = corpus.passages(queries * docs_per_query, max_words=60, seed=7)
    same, worst, gaps = 0, 0.0, []
    for q, query in enumerate(corpus.queries(queries, seed=3)):
        docs = texts[q * docs_per_query : (q + 1) * docs_per_query]
        ours = scorer.score(query, docs)
        ref = scorer.pairs.activate(hf_scores(folder, spec, scorer, docs, torch.float32, query)())  # type: ignore[union-attr]
        worst = max(worst, float(np.abs(ours - ref).max()))
        top_ours = list(np.argsort(-ours, kind="stable")[:10])
        top_ref = list(np.argsort(-ref, kind="stable")[:10])
        same += top_ours == top_ref
        ranked = np.sort(ref)[::-1][:11]
        gaps.append(float(np.min(ranked[:-1] - ranked[1:])))  # the closest neighbours in the top 10
    return {"queries": queries, "documents_per_query": docs_per_query,
            "same_top10_order": same, "score_max_abs_diff": round(worst, 5),
            "median_smallest_gap_in_reference_top10": round(timing.median(gaps), 6)}  # fmt: skip


def bench(arch: str, folder: Path, counts: list[int], fronts: list[str]) -> list[dict[str, Any]]:
    import torch

    from embedserve import Scorer
    from embedserve.embedder import run_batches
    from embedserve.engine.engine import Engine

    scorer = Scorer(folder, device=DEVICE)
    spec = scorer.spec
    embedder = Engine(dataclasses.replace(spec, task="embed", score=None), device=DEVICE)
    all_docs = documents(scorer, max(counts))
    budget = scorer.engine.batch_tokens
    hf_fp32 = hf_scores(folder, spec, scorer, all_docs, torch.float32)
    reference = hf_fp32()
    ours = scorer.score(QUERY, all_docs, raw=True)
    guard = float(np.abs(ours - reference).max())  # raw logits
    act = scorer.pairs.activate  # type: ignore[union-attr]
    guard_score = float(np.abs(act(ours) - act(reference)).max())  # as served
    del hf_fp32
    _HF.clear()
    torch.cuda.empty_cache()
    servers, ports = [], {}
    for front in fronts:
        native = ["--native"] if front == "native" else []
        server, ready = start([*CLI, "serve", *native, "--model", str(folder), "--device", DEVICE,
                               "--port", "0"], r"serving \S+ at http://127\.0\.0\.1:(\d+)")  # fmt: skip
        servers.append(server)
        ports[front] = int(ready.group(1))
    records: list[dict[str, Any]] = []
    try:
        for n in counts:
            docs = all_docs[:n]
            prepared = scorer.pairs.prepare(QUERY, docs)  # type: ignore[union-attr]
            seqlens = [len(s) for s in prepared.seqs]
            # as `Scorer` runs them: batches of the largest captured bucket, replayed graphs
            seqs, second = prepared.seqs, prepared.second_segment
            engine = median_ms(
                lambda s=seqs, c=second: run_batches(scorer.engine, s, budget, second_segment=c)
            )
            embed = median_ms(
                lambda s=seqs, c=second: run_batches(embedder, s, budget, second_segment=c)
            )
            over_http = {front: http_ms(port, docs) for front, port in ports.items()}
            hf = hf_scores(folder, spec, scorer, docs, torch.bfloat16)
            hf_ms = median_ms(hf, reps=10)
            del hf
            _HF.clear()
            st_ms = None
            if spec.bert is not None:
                from sentence_transformers import CrossEncoder

                ce = CrossEncoder(
                    str(folder), device=DEVICE, model_kwargs={"torch_dtype": torch.bfloat16}
                )
                pairs = [(QUERY, d) for d in docs]
                st_ms = median_ms(lambda ce=ce, p=pairs, n=n: ce.predict(p, batch_size=n), reps=10)
                del ce
            floor = flops(spec, seqlens) / MATRIX_FLOPS * 1e3
            common = {"model": ARCHS[arch], "weights": "random", "batch": n,
                      "tokens": round(statistics.mean(seqlens)), "concurrency": 1, "metric": "p50_ms"}  # fmt: skip
            row = {
                "embedserve engine": (engine, "engine", "bf16"),
                "embedserve embedding forward (same pairs, no score head)": (
                    embed,
                    "engine",
                    "bf16",
                ),
                **{
                    HTTP_SYSTEMS[front]: (ms, "end_to_end", "bf16")
                    for front, ms in over_http.items()
                },
                "transformers eager": (hf_ms, "end_to_end", "bf16"),
                "compute floor (FLOPs / 743 TFLOP/s)": (floor, "floor", "bf16"),
            }
            if st_ms is not None:
                row["sentence-transformers CrossEncoder.predict"] = (st_ms, "end_to_end", "bf16")
            for system, (value, scope, dtype) in row.items():
                records.append({**common, "system": system, "value": round(value, 4),
                                "scope": scope, "dtype": dtype})  # fmt: skip
            records[-len(row)]["logit_max_abs_diff_vs_transformers_fp32"] = round(guard, 5)
            records[-len(row)]["score_max_abs_diff_vs_transformers_fp32"] = round(guard_score, 5)
            print(f"{arch} x{n} ({sum(seqlens)} tok): engine {engine:.3f} ms, embed {embed:.3f}, "
                  f"http {over_http}, hf {hf_ms:.3f}, st {st_ms}, floor {floor:.3f}; "
                  f"guard logits {guard:.4f} scores {guard_score:.4f}", flush=True)  # fmt: skip
    finally:
        for server in servers:
            server.stop(60)
    return records


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, default=None, help="default: results/scoring/")
    ap.add_argument("--counts", default="5,25,50")
    ap.add_argument("--archs", default=",".join(ARCHS))
    ap.add_argument("--bert-tokenizer", type=Path, default=None,
                    help="a BERT uncased tokenizer folder (default: the bundled MiniLM's)")  # fmt: skip
    ap.add_argument("--device", default="cuda", choices=["cpu", "cuda"],
                    help="cpu only to try the script out")  # fmt: skip
    ap.add_argument("--order-only", action="store_true",
                    help="only the top-10 agreement with transformers (50 queries x 20 documents)")  # fmt: skip
    ap.add_argument("--fronts", default=FRONTS, help="the servers of the HTTP rows")
    args = ap.parse_args()
    global DEVICE
    DEVICE = args.device

    import torch

    from embedserve.devtools.checkpoints import make_checkpoint

    counts = [int(c) for c in args.counts.split(",")]
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        for arch in args.archs.split(","):
            folder = make_checkpoint(Path(tmp) / arch, arch=arch, dtype="float32", seed=0,
                                     tokenizer_from=args.bert_tokenizer)  # fmt: skip
            if args.order_only:
                agreement = top10_agreement(folder)
                print(arch, agreement, flush=True)
                records.append({"system": "embedserve bf16 vs transformers fp32", "model": ARCHS[arch],
                                "weights": "random", "dtype": "bf16", "batch": 20, "tokens": "passages",
                                "concurrency": 1, "metric": "same_top10_order_of_50",
                                "value": agreement["same_top10_order"], "scope": "scores", **agreement})  # fmt: skip
                continue
            records += bench(arch, folder, counts, args.fronts.split(","))
    notes = (
        "One query against N documents, pairs of about 512 tokens (real text: Python "
        "standard-library docstrings), random weights in the published shapes "
        "(make-checkpoint), bf16. engine = the pairs in batches of at most 8,192 tokens (graph "
        "replays, as `Scorer` runs them), wall time to scores on the host; embedding forward = the same batch through the same weights with no "
        "score head; HTTP = `embedserve serve` (and `serve --native`), POST /v1/rerank, keep-alive, p50 of 30; "
        "transformers eager and sentence-transformers in process on the same GPU, tokenization "
        "included. The first record of each block carries the score guard: the largest "
        "difference of our bf16 logits, and of the served scores (after the activation), from "
        "transformers fp32 on the 50 pairs."
    )
    on_gpu = DEVICE == "cuda"
    _, table = report.write(
        "scoring-order" if args.order_only else "scoring", torch.cuda.get_device_name() if on_gpu else report.cpu_hardware(),
        report.card_slug() if on_gpu else "cpu-trial", records,
        report.versions("torch", "transformers", "sentence-transformers"), notes, args.out,
    )  # fmt: skip
    print(table)


if __name__ == "__main__":
    main()
