"""Sparse and multi-vector retrieval on the CPU (issue 26): `Embedder.encode_outputs` against the
reference libraries, side by side in one run, on the same inputs (the peers fp32, ours at its CPU
default: bf16 where the CPU has it, under the fidelity guard):

- **SPLADE** (`splade-v3`'s config: BERT base with the masked-LM head): ours vs
  sentence-transformers `SparseEncoder.encode`;
- **bge-m3** (XLM-R large, dense + sparse + multi-vector from one forward): ours (all three in
  one call) vs FlagEmbedding `BGEM3FlagModel.encode(return_dense, return_sparse,
  return_colbert_vecs)`;
- **ColBERT** (`answerai-colbert-small-v1`, PyLate's layout): ours vs PyLate `ColBERT.encode`,
  run in a worker process from PyLate's own environment (pylate 1.6 pins sentence-transformers
  5.3 and transformers <= 5.3; under the project's sentence-transformers 6 it loads the folder's
  markers and lengths wrong), built by `python -m embedserve.devtools.pylate_env`. The worker
  stays up and runs each corpus round on a line from this process, so its rounds alternate with
  ours as the other peers' do. Without that environment the peer is skipped and the reason
  recorded.

Ours runs at each of `--dtypes` (default: the CPU default, bf16 where the CPU has it, and fp32,
the peers' dtype), each row with its fidelity against the peer.

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
OURS = "embedserve Embedder.encode_outputs"
PYLATE = "PyLate ColBERT.encode"


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


class PylatePeer:
    """PyLate in a worker process of its own environment (`--pylate-worker`): loads the folder,
    encodes the corpus once (warm-up, and the vectors checked), then runs one corpus round per
    "corpus" line it reads, so rounds alternate with ours; "query" times the query alone there."""

    def __init__(self, path: Path, texts: list[str], args: argparse.Namespace) -> None:
        from embedserve.devtools.pylate_env import env_folder

        self.skipped = ""
        env_dir = env_folder(ROOT)
        if not (env_dir / "pylate").exists():
            self.skipped = (f"PyLate's reference environment is missing ({env_dir}): build it "
                            "with `python -m embedserve.devtools.pylate_env`")  # fmt: skip
            return
        self.tmp = tempfile.TemporaryDirectory()
        job = Path(self.tmp.name) / "job.json"
        job.write_text(json.dumps({"folder": str(path), "texts": texts, "reps": args.reps,
                                   "batch_size": args.batch_size}))  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(env_dir)}
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--pylate-worker", str(job)], env=env, text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        )  # fmt: skip
        ready = json.loads(self._ask(None))
        self.versions = ready["versions"]
        self.check = [np.asarray(v, np.float32) for v in ready["vectors"]]

    def _ask(self, line: str | None) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        if line is not None:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        if not answer:
            raise RuntimeError(f"the PyLate worker exited ({self.proc.wait()})")
        return answer

    def corpus(self) -> None:
        self._ask("corpus")

    def query_ms(self) -> list[float]:
        return list(json.loads(self._ask("query")))

    def close(self) -> None:
        if not self.skipped:
            self._ask("quit")
            self.proc.wait()
            self.tmp.cleanup()


def pylate_worker(job_path: Path) -> int:
    """Inside PyLate's environment: answers `PylatePeer`'s lines on stdout, one line each."""
    from importlib import metadata

    from pylate import models

    # the answers go to a copy of stdout; anything the libraries print goes to stderr
    answer = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    job = json.loads(job_path.read_text())
    model = models.ColBERT(job["folder"], device="cpu")
    texts, b = job["texts"], job["batch_size"]
    vectors = model.encode(texts, is_query=False, batch_size=b)  # warm-up, and the check
    names = ("pylate", "sentence-transformers", "transformers", "tokenizers")
    ready = {"versions": {n: metadata.version(n) for n in names},
             "vectors": [np.asarray(v, np.float32).tolist() for v in vectors]}  # fmt: skip

    def corpus() -> str:
        model.encode(texts, is_query=False, batch_size=b)
        return "done"

    def query() -> list[float]:
        return timed_ms(lambda: model.encode([QUERY], is_query=True), job["reps"], "cpu")

    answers = {"corpus": corpus, "query": query, "quit": lambda: "bye"}
    print(json.dumps(ready), file=answer, flush=True)
    for line in sys.stdin:
        print(json.dumps(answers[line.strip()]()), file=answer, flush=True)
        if line.strip() == "quit":
            break
    return 0


def bench_model(name: str, path: Path, texts: list[str], args: argparse.Namespace) -> list[dict]:  # type: ignore[type-arg]
    """Ours (at each of `--dtypes`) and the peer of one model: tokens/s over `texts`, one
    query's p50, fidelity of each of ours against the peer."""
    from embedserve import Embedder

    # the peers cut a text over the model's limit (ColBERT's documents: 300 tokens) silently
    doc_kw: dict[str, Any] = {"truncate": "end"}
    doc_kw |= {"input_type": "document"} if name == "colbert" else {}
    q_kw = {"input_type": "query"} if name == "colbert" else {}
    ours = {}
    for dtype in args.dtypes.split(","):
        embedder = Embedder(path, device="cpu", dtype=None if dtype == "default" else dtype)
        label = f"{OURS} ({embedder.engine.dtype_name})"
        if label not in ours:  # "default" may be float32 itself
            ours[label] = (embedder, embedder.encode_outputs(texts, **doc_kw))  # warm-up, check
    embedder, first = next(iter(ours.values()))
    num_tokens = sum(first.tokens or [])
    model = f"{path.name} ({', '.join(embedder.spec.outputs)})"

    def corpus_run(e: Any) -> Any:
        return lambda: e.encode_outputs(texts, **doc_kw)

    runs = {label: corpus_run(e) for label, (e, _) in ours.items()}
    if name == "colbert":
        peer: Any = PylatePeer(path, texts, args)
        peer_name, check = PYLATE, getattr(peer, "check", None)
        if not peer.skipped:
            runs[peer_name] = peer.corpus
    else:
        peer = (splade_peer if name == "splade" else bge_m3_peer)(path, texts, args)
        peer_name, check = peer["name"], peer["check"]
        runs[peer_name] = peer["corpus"]
    times = alternate(runs, args.rounds)
    records = []
    for label, (e, out) in ours.items():
        query_ms = timed_ms(lambda e=e: e.encode_outputs([QUERY], **q_kw), args.reps, "cpu")
        checked = {} if check is None else fidelity(name, out, check)
        dtype = e.engine.dtype_name
        # a float32 CPU's executor (the start-up choice), as the ready line prints it
        path = {} if e.engine.cpu_choice is None else {"cpu_path": e.engine.cpu_choice.describe()}
        records += [
            record(OURS, model, "tokens_per_s", num_tokens / median(times[label]), len(texts),
                   dtype=dtype, **checked, **path),
            record(OURS, model, "query_p50_ms", percentile(query_ms, 50), 1, dtype=dtype, **path),
        ]  # fmt: skip
    if name == "colbert" and peer.skipped:
        records.append({"system": peer_name, "model": model, "skipped": peer.skipped})
        return records
    if name == "colbert":
        peer_query_ms = peer.query_ms()
        args.peer_versions = peer.versions
        peer.close()
    else:
        peer_query_ms = timed_ms(peer["query"], args.reps, "cpu")
    records += [
        record(peer_name, model, "tokens_per_s", num_tokens / median(times[peer_name]), len(texts)),
        record(peer_name, model, "query_p50_ms", percentile(peer_query_ms, 50), 1),
    ]
    return records


def notes_for(records: list[dict], args: argparse.Namespace, num_texts: int) -> str:  # type: ignore[type-arg]
    import torch

    paragraphs = [
        f"{num_texts} passages (8-180 words), {args.rounds} alternating rounds (median); one "
        f"{len(QUERY.split())}-word query alone, p50 of {args.reps} calls. The peers fp32, ours "
        f"at {args.dtypes} (default: the CPU's, bf16 where it has it), torch threads "
        f"{torch.get_num_threads()}, peers' batch_size {args.batch_size}. Random weights in the "
        "exact configs (`embedserve make-checkpoint`). 1-minute load average "
        f"{os.getloadavg()[0]:.1f} at the end (the machine is shared)."
    ]
    if getattr(args, "peer_versions", None):
        versions = ", ".join(f"{k} {v}" for k, v in args.peer_versions.items())
        paragraphs.append(
            f"PyLate ran in a worker process of its own environment ({versions}; torch the "
            "same), its corpus rounds alternating with ours; its query p50 timed inside it."
        )
    paragraphs += [f"**{r['system']} skipped**: {r['skipped']}" for r in records if "skipped" in r]
    checks = [f"{r['model']} ours {r['dtype']}: " + ", ".join(f"{k} {r[k]:.7f}" for k in FIDELITY if k in r)
              for r in records if any(k in r for k in FIDELITY)]  # fmt: skip
    if checks:
        paragraphs.append("Fidelity against the peer on the corpus: " + "; ".join(checks) + ".")
    rows = [r for r in records if "metric" in r]
    ratios = []
    for peer in (r for r in rows if r["system"] != OURS):
        for mine in rows:
            if (mine["system"], mine["model"], mine["metric"]) == (
                OURS,
                peer["model"],
                peer["metric"],
            ):
                v, p = mine["value"], peer["value"]
                ratio = v / p if peer["metric"] == "tokens_per_s" else p / v
                ratios.append(f"- {peer['model']}, {peer['metric']}: ours {mine['dtype']} "
                              f"{ratio:.2f}x {peer['system']}")  # fmt: skip
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
    ap.add_argument("--dtypes", default="default,float32",
                    help="ours at each (comma-separated): default (the CPU's), float32, bfloat16")  # fmt: skip
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
