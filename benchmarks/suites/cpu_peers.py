"""The CPU's strongest peers side by side in one run: one short query, one passage, a corpus.

Every system embeds the same texts with all-MiniLM-L6-v2's real weights (the bundled folder),
tokenization included, each in a process of its own (one after the other, never two at once):

- **embedserve** `Embedder.encode` at its CPU defaults (bf16 where the CPU has native bf16,
  under the fidelity guard), and `dtype="float32", cpu_path="auto"` (the float32 executor
  measured at start-up, what a CPU without bf16 runs by default);
- **sentence-transformers** with its torch backend (fp32: the reference of every cosine), and with
  its ONNX backend as its docs advise for CPUs (`backend="onnx"`: an ONNX export of the same
  folder through Optimum; its O3-optimized export beside it);
- **fastembed** (ONNX Runtime) on a local fp32 export of the same weights, registered with
  `TextEmbedding.add_custom_model` (no hub is reachable), plain and run through onnxruntime's
  transformer optimizer (its fused attention / LayerNorm / GELU graph).

The ONNX peers need transformers < 4.58 (optimum-onnx's pin), which our package does not run on,
so they run under another interpreter (`--peers-python`, a venv of
`fastembed==0.9.1 sentence-transformers==5.1.2 transformers==4.57.1 optimum-onnx[onnxruntime]`).

Measured per system: one short query (3-12 words) per call, p50/p99 of `--calls`; one
passage cut at 256 tokens per call, p50; `--corpus` passages in one call (the library's own
batching), texts/s. Fidelity: every query and passage vector against sentence-transformers torch
fp32's, the least cosine (the guard is 0.999).

Writes benchmarks/results/latency/latency-cpu2-peers-YYYYMMDD.{json,md} (or into --out).

    .venv/bin/python benchmarks/suites/cpu_peers.py --peers-python /path/to/peers/bin/python

`--model FOLDER` runs another family's sentence-transformers folder (e.g. `embedserve
make-checkpoint --arch multilingual-e5-base` or `qwen3-0.6b`, random weights of the published
config) through the torch systems only (the ONNX exports are made for MiniLM's shape); its
files are named `latency-cpu2-<avx2|avx512>-families-...`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
from harness import corpus, report  # neither imports embedserve: the peers' worker runs them
from harness.timing import percentile

GUARD = 0.999
# (system, interpreter: "ours" or "peers"); the first torch-ST row is every cosine's reference
SYSTEMS = [
    ("sentence-transformers torch fp32", "ours"),
    ("embedserve (CPU default)", "ours"),
    ("embedserve float32", "ours"),
    ("sentence-transformers onnx", "peers"),
    ("sentence-transformers onnx O3", "peers"),
    ("fastembed (fp32 export)", "peers"),
    ("fastembed (ORT-optimized export)", "peers"),
]
REFERENCE = SYSTEMS[0][0]


# ---------------------------------------------------------------- the workers (one per process)


def _encoder(system: str, folder: Path) -> tuple[Any, str]:
    """(encode a list of texts -> float32 rows, what ran): one call for a query and a corpus alike,
    each library batching as it does."""
    if system.startswith("embedserve"):
        from embedserve import Embedder

        # float32 asked: the measured float32 executor (cpu_path "auto"), as a CPU without
        # native bf16 runs by default
        f32 = "float32" in system
        e = Embedder(str(folder), device="cpu", dtype="float32" if f32 else None,
                     cpu_path="auto" if f32 else None)  # fmt: skip
        path = e.engine.cpu_choice.describe() if e.engine.cpu_choice else e.engine.cpu_path
        return e.encode, f"dtype {e.engine.dtype_name}, cpu path {path}"
    if system.startswith("sentence-transformers"):
        from sentence_transformers import SentenceTransformer

        if "onnx" in system:
            kwargs = {"file_name": "onnx/model_O3.onnx"} if "O3" in system else {}
            m = SentenceTransformer(str(folder), backend="onnx", model_kwargs=kwargs)
        else:
            m = SentenceTransformer(str(folder), device="cpu")

        def enc(texts: list[str]) -> np.ndarray:
            return m.encode(texts, normalize_embeddings=True, convert_to_numpy=True)

        return enc, "batch 32"
    from fastembed import TextEmbedding
    from fastembed.common.model_description import ModelSource, PoolingType

    file = "onnx/model_ortopt.onnx" if "optimized" in system else "onnx/model.onnx"
    name = f"local/minilm-{Path(file).stem}"
    TextEmbedding.add_custom_model(
        name, pooling=PoolingType.MEAN, normalization=True,
        sources=ModelSource(hf="local/none"), dim=384, model_file=file,
    )  # fmt: skip
    fe = TextEmbedding(name, specific_model_path=str(folder))

    def fenc(texts: list[str]) -> np.ndarray:
        return np.stack(list(fe.embed(texts)))

    return fenc, "batch 256"


def worker(
    system: str,
    folder: Path,
    texts_file: Path,
    out: Path,
    calls: int,
    bulk_too: bool,
    fidelity_texts: int | None = None,
) -> None:
    texts = json.loads(texts_file.read_text())
    queries, passages, corp = texts["queries"], texts["passages"], texts["corpus"]
    start = time.perf_counter()
    encode, detail = _encoder(system, folder)
    load_s = time.perf_counter() - start  # imports, weights, and ours' start-up choice
    for t in queries[:20] + passages[:5]:
        encode([t])
    q_ms, p_ms = [], []
    for i in range(calls):
        t0 = time.perf_counter()
        encode([queries[i % len(queries)]])
        q_ms.append((time.perf_counter() - t0) * 1e3)
    for i in range(calls):
        t0 = time.perf_counter()
        encode([passages[i % len(passages)]])
        p_ms.append((time.perf_counter() - t0) * 1e3)
    corpus_s = None
    if bulk_too:  # the first round only: the corpus, and the vectors of the fidelity check
        encode(corp[:64])
        t0 = time.perf_counter()
        encode(corp)
        corpus_s = time.perf_counter() - t0
        n = fidelity_texts  # None: all of them
        vectors = np.concatenate([encode(queries[:n]), encode(passages[:n])]).astype(np.float32)
        np.save(out.with_suffix(".npy"), vectors)
    out.write_text(json.dumps({"query_ms": q_ms, "passage_ms": p_ms, "corpus_s": corpus_s,
                               "detail": detail, "load_s": load_s}))  # fmt: skip


def turn_worker(system: str, folder: Path, texts_file: Path) -> None:
    """Stays loaded and answers lines "START COUNT" on stdin with the milliseconds of COUNT short
    queries from START (a JSON list on stdout), until stdin ends: the in-turn phase's worker."""
    queries = json.loads(texts_file.read_text())["queries"]
    encode, _ = _encoder(system, folder)
    for t in queries[:50]:
        encode([t])
    print("ready", flush=True)
    for line in sys.stdin:
        start, count = map(int, line.split())
        ms = []
        for i in range(start, start + count):
            t0 = time.perf_counter()
            encode([queries[i % len(queries)]])
            ms.append((time.perf_counter() - t0) * 1e3)
        print(json.dumps(ms), flush=True)


# ---------------------------------------------------------------- the run


def export_onnx(peers: str, folder: Path) -> None:
    """The folder's ONNX exports (Optimum's, as sentence-transformers makes it; its O3; the
    onnxruntime transformer optimizer's), written once into `folder/onnx/`."""
    script = f"""
import shutil, sys
from pathlib import Path
from sentence_transformers import SentenceTransformer, export_optimized_onnx_model
folder = Path({str(folder)!r})
m = SentenceTransformer(str(folder), backend="onnx")  # exports the model when onnx/ is missing
# saved aside and only onnx/ kept: save_pretrained also rewrites tokenizer_config.json with
# "max_length": 128 (tokenizer.json's truncation), which fastembed would then truncate at
m.save_pretrained(str(folder / "st-saved"))
shutil.copytree(folder / "st-saved" / "onnx", folder / "onnx")
shutil.rmtree(folder / "st-saved")
export_optimized_onnx_model(m, "O3", str(folder))
from onnxruntime.transformers import optimizer
opt = optimizer.optimize_model(str(folder / "onnx/model.onnx"), model_type="bert",
                               num_heads=12, hidden_size=384, opt_level=1)
opt.save_model_to_file(str(folder / "onnx/model_ortopt.onnx"))
"""
    subprocess.run([peers, "-c", script], check=True)


def prepare_texts(folder: Path, n_corpus: int) -> dict[str, list[str]]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.no_truncation()  # the file truncates at 128
    queries = corpus.queries(256)
    cut = []
    for text in corpus.passages(3000, min_words=150, max_words=400):
        ids = tok.encode(text, add_special_tokens=False).ids
        if len(ids) >= 254:  # 254 + [CLS] + [SEP]: the model's limit of 256
            cut.append(tok.decode(ids[:254]))
    mixed = []  # nobody truncates: every text fits the model's 256 tokens
    for text in corpus.passages(n_corpus, min_words=20, max_words=180, seed=3):
        ids = tok.encode(text, add_special_tokens=False).ids
        mixed.append(tok.decode(ids[:254]) if len(ids) > 254 else text)
    return {"queries": queries, "passages": cut[:150], "corpus": mixed}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--peers-python", default=None, help="the ONNX peers' interpreter (else skipped)"
    )
    p.add_argument("--calls", type=int, default=150)
    p.add_argument(
        "--fidelity-texts", type=int, default=None,
        help="the cosine check on the first N queries and N passages (default: all, 256 and "
        "150; a large model on 2 cores takes minutes a system for them)",
    )  # fmt: skip
    p.add_argument("--corpus", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=3, help="latency rounds, the order rotated")
    p.add_argument("--systems", default=None, help="comma-separated subset of the systems")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--model", type=Path, default=None, help="another folder, torch systems only")
    p.add_argument(
        "--turns", type=int, default=60,
        help="in-turn phase: blocks of --block short queries per system, the systems in turn",
    )  # fmt: skip
    p.add_argument("--block", type=int, default=10)
    p.add_argument(
        "--pause", type=float, default=0.05,
        help="seconds idle before each block: the last system's threads (ORT's spin) go quiet",
    )  # fmt: skip
    p.add_argument("--worker", nargs=5, default=None, help=argparse.SUPPRESS)
    p.add_argument("--turn-worker", nargs=3, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.turn_worker:
        system, folder, texts = args.turn_worker
        turn_worker(system, Path(folder), Path(texts))
        return
    if args.worker:
        system, folder, texts, out, bulk_too = args.worker
        worker(system, Path(folder), Path(texts), Path(out), args.calls, bulk_too == "1",
               args.fidelity_texts)  # fmt: skip
        return
    from embedserve.loading.bundled import resolve_model

    work = Path(tempfile.mkdtemp(prefix="cpu-peers-"))
    # ours' ONNX graph into a fresh cache: the first round's start-up writes it, later ones read it
    os.environ["XDG_CACHE_HOME"] = str(work / "cache")
    folder = work / (args.model.name if args.model else "all-MiniLM-L6-v2")
    shutil.copytree(args.model or resolve_model("minilm"), folder)
    chosen = [s for s in SYSTEMS if args.systems is None or s[0] in args.systems.split(",")]
    if args.model:  # the ONNX peers' exports are MiniLM's (its heads and width)
        chosen = [s for s in chosen if s[1] == "ours"]
    elif args.peers_python:
        export_onnx(args.peers_python, folder)
    texts = prepare_texts(folder, args.corpus)
    (work / "texts.json").write_text(json.dumps(texts))
    results: dict[str, dict[str, Any]] = {}
    # the machine (a VM) drifts by tens of percent over minutes: every system is measured in
    # each round, the order rotated, and the rows pool the rounds' calls
    for round_ in range(args.rounds):
        k = round_ % len(chosen)
        for system, which in chosen[k:] + chosen[:k]:
            run_worker(args, system, which, folder, work, results, round_)
    if args.turns:
        in_turn(args, chosen, folder, work, results)
    write(args, folder.name, texts, results)


def in_turn(args: argparse.Namespace, chosen: list[tuple[str, str]], folder: Path, work: Path,
            results: dict[str, dict[str, Any]]) -> None:  # fmt: skip
    """Short queries with every system loaded at once, each in its own process, given a block of
    `--block` calls in turn (the order rotated per turn), so each system's calls sample the same
    seconds of this drifting machine; the others wait on a pipe meanwhile (never two at once)."""
    from harness.machine import load1

    results["in_turn_load1"] = load1()  # type: ignore[assignment]
    procs = {}
    for system, which in chosen:
        python = sys.executable if which == "ours" else args.peers_python
        if python is None:
            continue
        argv = [python, __file__, "--turn-worker", system, str(folder), str(work / "texts.json")]
        procs[system] = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
        )  # fmt: skip
        line = procs[system].stdout.readline()  # loaded and warm before the next one starts
        if line.strip() != "ready":
            raise RuntimeError(f"{system}'s in-turn worker did not start: {line!r}")
    order = list(procs)
    for turn in range(args.turns):
        k = turn % len(order)
        for system in order[k:] + order[:k]:
            p = procs[system]
            time.sleep(args.pause)
            p.stdin.write(f"{turn * args.block} {args.block}\n")
            p.stdin.flush()
            results[system].setdefault("turn_query_ms", []).extend(json.loads(p.stdout.readline()))
    for p in procs.values():
        p.stdin.close()
        p.wait()
    for system in order:
        print(f"in turn {system}: query p50 "
              f"{np.median(results[system]['turn_query_ms']):.2f} ms", flush=True)  # fmt: skip


def run_worker(args: argparse.Namespace, system: str, which: str, folder: Path, work: Path,
               results: dict[str, dict[str, Any]], round_: int) -> None:  # fmt: skip
    from harness.machine import load1

    python = sys.executable if which == "ours" else args.peers_python
    if python is None:
        results[system] = {"skipped": "no --peers-python"}
        return
    out = work / f"r{abs(hash(system))}-{round_}.json"
    load = load1()
    argv = [python, __file__, "--worker", system, str(folder), str(work / "texts.json"),
            str(out), "1" if round_ == 0 else "0", "--calls", str(args.calls)]  # fmt: skip
    if args.fidelity_texts is not None:
        argv += ["--fidelity-texts", str(args.fidelity_texts)]
    subprocess.run(argv, check=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    got = json.loads(out.read_text())
    r = results.setdefault(system, {"query_ms": [], "passage_ms": [], "round_p50_ms": [],
                                    "load1_before": [], "load_s": [],
                                    "detail": got["detail"]})  # fmt: skip
    r["load_s"].append(round(got["load_s"], 2))
    r["query_ms"] += got["query_ms"]
    r["passage_ms"] += got["passage_ms"]
    r["round_p50_ms"].append(round(float(np.median(got["query_ms"])), 3))
    r["load1_before"].append(load)
    if got["corpus_s"] is not None:
        r["corpus_s"] = got["corpus_s"]
        r["vectors"] = np.load(out.with_suffix(".npy"))
    print(f"round {round_} {system}: query p50 {r['round_p50_ms'][-1]:.2f} ms", flush=True)


def write(
    args: argparse.Namespace, model: str, texts: dict[str, list[str]], results: dict[str, Any]
) -> None:
    """One record per system and metric (the project's benchmark brief's shape), each with the system's least
    cosine against sentence-transformers torch fp32."""
    turn_load = results.pop("in_turn_load1", None)
    ref = results.get(REFERENCE, {}).get("vectors")
    records: list[dict[str, Any]] = []
    for system, r in results.items():
        if "skipped" in r:
            records.append({"system": system, "metric": "skipped", "value": r["skipped"]})
            continue
        cos = None
        if ref is not None:
            v = r["vectors"]
            cos = float(np.min(np.sum(v * ref, axis=1) / (
                np.linalg.norm(v, axis=1) * np.linalg.norm(ref, axis=1))))  # fmt: skip
        base = {"system": system, "model": model, "weights": "random" if args.model else "real",
                "dtype": r["detail"], "concurrency": 1, "scope": "in process, tokenize included",
                "cosine_min": cos, "load1_before": r["load1_before"],
                "load_s": r["load_s"]}  # fmt: skip
        metrics = [
            ("one short query p50 (ms)", "3-12 words", percentile(r["query_ms"], 50)),
            ("one short query p99 (ms)", "3-12 words", percentile(r["query_ms"], 99)),
            (
                "one short query p50, systems in turn (ms)",
                "3-12 words",
                percentile(r["turn_query_ms"], 50) if r.get("turn_query_ms") else None,
            ),
            ("one passage p50 (ms)", "256", percentile(r["passage_ms"], 50)),
            ("corpus (texts/s)", "20-180 words", len(texts["corpus"]) / r["corpus_s"]),
        ]
        for metric, tokens, value in metrics:
            if value is None:
                continue
            records.append({**base, "metric": metric, "tokens": tokens, "value": round(value, 3)})
            if metric == metrics[0][0]:  # the query p50 of each round beside the pooled one
                records[-1]["round_p50_ms"] = r["round_p50_ms"]
        if cos is not None and cos < GUARD:
            print(f"{system}: least cosine {cos:.6f} is under the guard's {GUARD}", flush=True)
    notes = (f"{args.rounds} rounds (the order rotated) x {args.calls} calls per latency row (queries of 3-12 words; passages of exactly 256 "
             f"tokens); {len(texts['corpus'])} passages of 20-180 words in one call per library "
             "(its own batching), in the first round; each system in its own process, one after the "
             "other; each round's query p50 and the machine's 1-minute load before each run are "
             "in the JSON. Then, with every system loaded at once (each in its own process), "
             f"{args.turns} turns of {args.block} short queries per system, the systems in turn "
             "(the order rotated per turn): the in-turn row, whose calls sample the same seconds "
             "of this machine for every system.")  # fmt: skip
    notes += (" load_s: seconds from the worker's start to a loaded model, per round (ours: the "
              "start-up choice of the CPU executor included; the first round writes the ONNX "
              "graph into a fresh cache, later rounds read it back).")  # fmt: skip
    if args.fidelity_texts is not None:
        notes += (f" The least cosine is over the first {args.fidelity_texts} queries and "
                  "passages (--fidelity-texts).")  # fmt: skip
    if turn_load is not None:
        notes += f" Load average (1 min) before the in-turn phase: {turn_load}."
    software = report.versions("torch", "embedserve", "sentence-transformers", "onnxruntime")
    isa = report.cpu_isa()
    # the CPU kind in the name: runs on an AVX2-only CPU and an AVX-512 one stay apart
    kind = "avx512" if "avx512f" in isa else "avx2" if "avx2" in isa else "cpu"
    slug = f"cpu2-{kind}-families" if args.model else f"cpu2-{kind}-peers"
    hardware = f"{report.cpu_hardware()}; flags: {' '.join(isa) or 'unknown'}"
    path, table = report.write("latency", hardware, slug, records, software, notes, args.out)
    print(table)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
