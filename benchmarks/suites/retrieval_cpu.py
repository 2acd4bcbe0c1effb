"""Sparse and multi-vector retrieval on the CPU (issue 26): `Embedder.encode_outputs` against the
reference libraries, side by side in one run, on the same inputs (the peers fp32, ours at its CPU
default: bf16 where the CPU has it, under the fidelity guard):

- **SPLADE** (`splade-v3`'s config: BERT base with the masked-LM head): ours vs
  sentence-transformers `SparseEncoder.encode`;
- **bge-m3** (XLM-R large, dense + sparse + multi-vector from one forward): ours (all three in
  one call) vs FlagEmbedding `BGEM3FlagModel.encode(return_dense, return_sparse,
  return_colbert_vecs)`;
- **ColBERT** (`answerai-colbert-small-v1`, PyLate's layout): ours vs PyLate `ColBERT.encode`,
  run in a subprocess from PyLate's own environment (pylate 1.6 pins sentence-transformers 5.3 and
  transformers <= 5.3; under the project's sentence-transformers 6 it loads the folder's markers
  and lengths wrong: tests/engine/test_sparse_multivector.py `PYLATE_ENV`). Without that
  environment the peer is skipped and the reason recorded.

Folders: exact configs with random weights from `embedserve make-checkpoint` (no hub), made once
into `--models` (bge-m3 in fp32 is 2.3 GB). Timing does not depend on the weights' values, except
how many non-zero entries a sparse vector has, which both sides return alike.

Two figures per model: **tokens/s** over a corpus (`--passages` passages of 8-180 words, Python
standard-library docstrings, `harness/corpus.py`; the tokens are the sequences our engine runs,
which the parity tests show are the reference's), `--rounds` rounds alternating the two systems,
the median round; and **one short query's p50** (a query encoded alone, `--reps` calls after two
warm-up ones; ColBERT: as a query, with its marker and expansion). A fidelity figure per pair
(dense and multi-vector: least cosine; sparse: the share of inputs with the same non-zero ids).

Writes benchmarks/results/retrieval/retrieval-cpu<N>-YYYYMMDD.{json,md} (or into --out).

    nice .venv/bin/python benchmarks/suites/retrieval_cpu.py              # the full run
    PYTHONPATH=src python3 benchmarks/suites/retrieval_cpu.py --quick --out /tmp/r   # a try
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
from harness import corpus, report
from harness.timing import median, percentile, timed_ms, timed_s

ROOT = Path(__file__).resolve().parents[2]
# (name, the full run's make-checkpoint arch, --quick's)
MODELS = [
    ("splade", "splade-v3", "splade-minilm-l6"),
    ("bge-m3", "bge-m3", "bge-m3-tiny"),
    ("colbert", "answerai-colbert-small-v1", "answerai-colbert-small-v1"),
]
FIDELITY = ("cosine_min", "sparse_same_ids")  # the fields `fidelity` writes
QUERY = "how are sparse lexical weights stored in a vector database?"
PYLATE_ENV = Path(
    os.environ.get("EMBEDSERVE_PYLATE_ENV", ROOT / ".venv/pylate-ref")
)  # the tests' reference environment of PyLate


def folder(models: Path, arch: str) -> Path:
    """The `make-checkpoint` folder of `arch` under `models`, made when missing."""
    from embedserve.devtools.checkpoints import make_checkpoint

    path = models / arch
    if not (path / "config.json").exists():
        make_checkpoint(path, arch=arch, dtype="float32", seed=0, overwrite=path.exists())
    return path


def record(system: str, model: str, metric: str, value: float, n: int, dtype: str = "float32",
           **extra: Any) -> dict:  # type: ignore[type-arg]  # fmt: skip
    """One row; `dtype`: what ran (the peers fp32; ours the engine's, the CPU's default)."""
    return {"system": system, "model": model, "weights": "random", "dtype": dtype,
            "batch": n, "tokens": "8-180 words" if n > 1 else "query", "concurrency": 1,
            "metric": metric, "value": round(value, 2), "scope": "end_to_end", **extra}  # fmt: skip


def cosine_min(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    """The least cosine over matching rows of two lists of [n, dims] arrays (or of vectors)."""
    worst = 1.0
    for x, y in zip(a, b, strict=True):
        x, y = np.atleast_2d(np.asarray(x, np.float64)), np.atleast_2d(np.asarray(y, np.float64))
        cos = (x * y).sum(-1) / (np.linalg.norm(x, axis=-1) * np.linalg.norm(y, axis=-1))
        worst = min(worst, float(cos.min()))
    return worst


def alternate(runs: dict[str, Any], rounds: int) -> dict[str, list[float]]:
    """Seconds per call of each run, in rounds whose order alternates (load on a shared machine
    then hits both alike)."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for r in range(rounds):
        order = list(runs.items())
        for name, fn in order if r % 2 == 0 else order[::-1]:
            times[name] += timed_s(fn, 1)
        print(f"  round {r}: " + ", ".join(f"{k} {v[-1]:.2f}s" for k, v in times.items()),
              file=sys.stderr)  # fmt: skip
    return times


def splade_peer(path: Path, texts: list[str], args: argparse.Namespace) -> dict[str, Any]:
    from sentence_transformers import SparseEncoder

    peer = SparseEncoder(str(path), device="cpu")

    def run(batch: list[str]) -> Any:  # its own output: a torch sparse tensor
        return peer.encode(batch, batch_size=args.batch_size, convert_to_tensor=True)

    check = [np.flatnonzero(r).tolist() for r in run(texts).to_dense().numpy()]
    return {"name": "sentence-transformers SparseEncoder.encode", "corpus": lambda: run(texts),
            "query": lambda: run([QUERY]), "check": check}  # fmt: skip


def bge_m3_peer(path: Path, texts: list[str], args: argparse.Namespace) -> dict[str, Any]:
    from embedserve.devtools.references import flag_m3_embedder

    peer = flag_m3_embedder()(str(path), use_fp16=False, devices="cpu")
    kw = {"return_dense": True, "return_sparse": True, "return_colbert_vecs": True,
          "batch_size": args.batch_size}  # fmt: skip
    out = peer.encode(texts, **kw)
    return {"name": "FlagEmbedding BGEM3FlagModel.encode (dense+sparse+colbert)",
            "corpus": lambda: peer.encode(texts, **kw), "query": lambda: peer.encode([QUERY], **kw),
            "check": (list(out["dense_vecs"]), out["colbert_vecs"],
                      [sorted(map(int, w)) for w in out["lexical_weights"]])}  # fmt: skip


def fidelity(name: str, ours: Any, check: Any) -> dict[str, float]:
    def same_ids(ids: list[list[int]]) -> float:
        return float(np.mean([v["indices"] == i for v, i in zip(ours.sparse, ids, strict=True)]))

    if name == "splade":
        return {"sparse_same_ids": same_ids(check)}
    if name == "bge-m3":
        dense, colbert, ids = check
        return {"cosine_min": min(cosine_min(list(ours.dense), dense),
                                  cosine_min(ours.multivector, colbert)),
                "sparse_same_ids": same_ids(ids)}  # fmt: skip
    return {"cosine_min": cosine_min(ours.multivector, check)}


def pylate_in_subprocess(path: Path, texts: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """PyLate's corpus seconds per round, query milliseconds and document vectors, timed in its
    own environment (`--pylate-worker`); or {"skipped": reason}."""
    if not (PYLATE_ENV / "sentence_transformers").exists():
        return {"skipped": f"PyLate's reference environment is missing ({PYLATE_ENV}; see "
                "PYLATE_ENV in tests/engine/test_sparse_multivector.py): pylate 1.6 needs "
                "sentence-transformers 5.3 and transformers <= 5.3"}  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        job = Path(tmp) / "job.json"
        job.write_text(json.dumps({"folder": str(path), "texts": texts, "rounds": args.rounds,
                                   "reps": args.reps, "batch_size": args.batch_size}))  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(PYLATE_ENV)}
        cmd = [sys.executable, __file__, "--pylate-worker", str(job)]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            return {"skipped": f"PyLate failed: {done.stderr.strip().splitlines()[-1:]}"}
        out = json.loads(job.with_suffix(".out.json").read_text())
    out["check"] = [np.asarray(v, np.float32) for v in out.pop("vectors")]
    return out


def pylate_worker(job_path: Path) -> int:
    """Inside PyLate's environment: the timings `pylate_in_subprocess` reads."""
    from pylate import models

    job = json.loads(job_path.read_text())
    model = models.ColBERT(job["folder"], device="cpu")
    texts, b = job["texts"], job["batch_size"]
    vectors = model.encode(texts, is_query=False, batch_size=b)  # warm-up, and the check
    rounds = timed_s(lambda: model.encode(texts, is_query=False, batch_size=b), job["rounds"])
    query = timed_ms(lambda: model.encode([QUERY], is_query=True), job["reps"], "cpu")
    out = {"corpus_s": rounds, "query_ms": query,
           "vectors": [np.asarray(v, np.float32).tolist() for v in vectors]}  # fmt: skip
    job_path.with_suffix(".out.json").write_text(json.dumps(out))
    return 0


def bench_model(name: str, path: Path, texts: list[str], args: argparse.Namespace) -> list[dict]:  # type: ignore[type-arg]
    """Ours and the peer of one model: tokens/s over `texts`, one query's p50, fidelity."""
    from embedserve import Embedder

    ours = Embedder(path, device="cpu")
    # the peers cut a text over the model's limit (ColBERT's documents: 300 tokens) silently
    doc_kw: dict[str, Any] = {"truncate": "end"}
    doc_kw |= {"input_type": "document"} if name == "colbert" else {}
    q_kw = {"input_type": "query"} if name == "colbert" else {}
    ours_out = ours.encode_outputs(texts, **doc_kw)  # warm-up, and the fidelity check
    num_tokens = sum(ours_out.tokens or [])
    model = f"{path.name} ({', '.join(ours.spec.outputs)})"
    ours_name = "embedserve Embedder.encode_outputs"
    if name == "colbert":
        peer = pylate_in_subprocess(path, texts, args)
        peer_name = "PyLate ColBERT.encode"
        times = alternate({ours_name: lambda: ours.encode_outputs(texts, **doc_kw)}, args.rounds)
        if "skipped" not in peer:
            times[peer_name] = peer["corpus_s"]
    else:
        peer = (splade_peer if name == "splade" else bge_m3_peer)(path, texts, args)
        peer_name = peer["name"]
        runs = {ours_name: lambda: ours.encode_outputs(texts, **doc_kw), peer_name: peer["corpus"]}
        times = alternate(runs, args.rounds)
        peer["query_ms"] = timed_ms(peer["query"], args.reps, "cpu")
    ours_query = timed_ms(lambda: ours.encode_outputs([QUERY], **q_kw), args.reps, "cpu")
    checked = {} if "skipped" in peer else fidelity(name, ours_out, peer["check"])
    records = [
        record(ours_name, model, "tokens_per_s", num_tokens / median(times[ours_name]),
               len(texts), dtype=ours.engine.dtype_name, **checked),
        record(ours_name, model, "query_p50_ms", percentile(ours_query, 50), 1,
               dtype=ours.engine.dtype_name),
    ]  # fmt: skip
    if "skipped" in peer:
        records.append({"system": peer_name, "model": model, "skipped": peer["skipped"]})
        return records
    records += [
        record(peer_name, model, "tokens_per_s", num_tokens / median(times[peer_name]), len(texts)),
        record(peer_name, model, "query_p50_ms", percentile(peer["query_ms"], 50), 1),
    ]
    return records


def notes_for(records: list[dict], args: argparse.Namespace, num_texts: int) -> str:  # type: ignore[type-arg]
    import torch

    paragraphs = [
        f"{num_texts} passages (8-180 words), {args.rounds} alternating rounds (median); one "
        f"{len(QUERY.split())}-word query alone, p50 of {args.reps} calls. The peers fp32, torch threads "
        f"{torch.get_num_threads()}, peers' batch_size {args.batch_size}, ours at its CPU "
        "defaults. Random weights in the exact configs (`embedserve make-checkpoint`). "
        f"1-minute load average {os.getloadavg()[0]:.1f} at the end (the machine is shared)."
    ]
    if any(r["system"] == "PyLate ColBERT.encode" and "skipped" not in r for r in records):
        paragraphs.append("PyLate ran in its own process after ours (its environment), not "
                          "alternating with it.")  # fmt: skip
    paragraphs += [f"**{r['system']} skipped**: {r['skipped']}" for r in records if "skipped" in r]
    checks = [f"{r['model']}: " + ", ".join(f"{k} {r[k]:.7f}" for k in FIDELITY if k in r)
              for r in records if any(k in r for k in FIDELITY)]  # fmt: skip
    if checks:
        paragraphs.append("Fidelity against the peer on the corpus: " + "; ".join(checks) + ".")
    by = {(r["model"], r["system"], r["metric"]): r["value"] for r in records if "metric" in r}
    ratios = []
    for (model, system, metric), value in by.items():
        ours = by.get((model, "embedserve Embedder.encode_outputs", metric))
        if ours is not None and not system.startswith("embedserve"):
            ratio = ours / value if metric == "tokens_per_s" else value / ours
            ratios.append(f"- {model}, {metric}: ours {ratio:.2f}x {system}")
    return "\n\n".join(paragraphs) + ("\n\n**Ours against each:**\n" + "\n".join(ratios)
                                       if ratios else "")  # fmt: skip


def main() -> int:
    if sys.argv[1:2] == ["--pylate-worker"]:
        return pylate_worker(Path(sys.argv[2]))
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true",
                    help="the tiny test configs, 16 passages, 2 rounds, 5 reps: does it run")  # fmt: skip
    ap.add_argument("--models", type=Path, default=Path(tempfile.gettempdir()) / "embedserve-bench",
                    help="where the random-weight folders are made once")  # fmt: skip
    ap.add_argument("--only", default=None, help="a comma-separated subset: splade,bge-m3,colbert")
    ap.add_argument("--passages", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3, help="corpus rounds per system")
    ap.add_argument("--reps", type=int, default=30, help="timed single-query calls")
    ap.add_argument("--batch-size", type=int, default=32, help="the peers' batch size")
    ap.add_argument("--out", type=Path, default=None, help="default: results/retrieval/")
    args = ap.parse_args()
    if args.quick:
        args.passages, args.rounds, args.reps = 16, 2, 5
    chosen = set((args.only or "splade,bge-m3,colbert").split(","))
    texts = corpus.passages(args.passages, max_words=180)
    records: list[dict] = []  # type: ignore[type-arg]
    for name, arch, quick_arch in MODELS:
        if name in chosen:
            path = folder(args.models, quick_arch if args.quick else arch)
            print(f"{name}: {path}", file=sys.stderr)
            records += bench_model(name, path, texts, args)
    import torch

    notes = notes_for(records, args, len(texts)) + f"\n\nCommand: `{report.command_line()}`"
    path, table = report.write(
        "retrieval", report.cpu_hardware(), f"cpu{torch.get_num_threads()}", records,
        report.versions("torch", "transformers", "sentence-transformers", "FlagEmbedding",
                        "pylate", "tokenizers"), notes, args.out,
    )  # fmt: skip
    print(notes)
    print(table)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
