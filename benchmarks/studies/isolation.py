"""Isolation of two models behind one gateway: one model flooded, the other's short requests.

One `embedserve serve` with the bundled all-MiniLM-L6-v2 (`minilm`) and a random-weight
ms-marco-MiniLM-L6 cross-encoder (`ms-marco`, `embedserve make-checkpoint`; its weights do not
change its cost). First the probe alone: one client sending short reranks (one query, 4 short
documents) to `ms-marco` back to back for `--seconds` (the idle reference). Then the same
probe while `--flood-clients` client processes send large embedding requests (`--passages`
passages of 150-180 words each) to `minilm`, back to back. Reported: the probe's p50 / p99
idle and under the flood, their ratio (the target: p99 under flood within 1.5x of idle), the
flood's requests/s, tokens/s and non-200 answers. `--flood ms-marco` swaps the roles (large
reranks flooding, short embeddings probed). `--flood-ids` sends the flood's passages as token
ids (cut to the model's 256 as `truncate: end` would), so the gateway does not tokenize them:
the probe's slowdown with and without it is the share of the gateway's tokenizing of the flood;
`--flood-base64` asks the flood's vectors as base64. `--rounds` alternates (probe alone, probe
under the flood) that many times. Per window the notes give the machine's busy and stolen
cores (hypervisor steal, /proc/stat) and the gateway's stall watch (loop ticks >= 10 / 50 ms
late, GC pauses); with `--metrics-port` the
records add the probed server's stage times (mean, and share >= 10 ms). Under
PYTHONASYNCIODEBUG=1 the callbacks that held a gateway loop over 10 ms are listed at the end.
Text: Python standard-library docstrings.

    PYTHONPATH=src python3 benchmarks/studies/isolation.py --device cuda [--out DIR]
    PYTHONPATH=src python3 benchmarks/studies/isolation.py --device cpu --seconds 3 \\
        --flood-clients 2 --passages 16     # a quick try
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
from harness import corpus, loadgen, report
from harness.machine import CpuMeter
from harness.servers import CLI, metric_samples, start
from harness.timing import percentile

TARGET = 1.5  # the issue's: the probe's p99 under the flood within 1.5x of its idle p99


MINILM_MAX_TOKENS = 256


def token_ids(texts: list[str]) -> list[list[int]]:
    """`texts` as all-MiniLM-L6-v2's token ids, [CLS] ... [SEP], cut at its 256 as the server's
    `truncate: end` cuts them (the bundled tokenizer.json pads and cuts at 128: both off)."""
    from tokenizers import Tokenizer

    from embedserve.loading.bundled import resolve_model

    tokenizer = Tokenizer.from_file(str(resolve_model("minilm") / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    cut = MINILM_MAX_TOKENS - 1
    return [e.ids[:cut] + e.ids[-1:] if len(e.ids) > cut + 1 else e.ids
            for e in tokenizer.encode_batch(texts)]  # fmt: skip


def bodies(model: str, large: bool, count: int, passages: int, ids: bool = False,
           base64: bool = False) -> list[bytes]:  # fmt: skip
    """`count` request bodies for `model`: embeddings of `passages` long passages each (as token
    ids: `ids`; vectors asked as base64: `base64`), or reranks of one query against 4 short
    documents (the flood's or the probe's)."""
    out = []
    for k in range(count):
        if model == "minilm":
            texts: list[Any] = (
                corpus.passages(passages, min_words=150, max_words=180, seed=k)
                if large
                else corpus.queries(1, seed=k)
            )
            if large and ids:
                texts = token_ids(texts)
            body = {"model": model, "input": texts, "truncate": "end"}  # passages past 256 tokens
            if base64:
                body["encoding_format"] = "base64"
            out.append(json.dumps(body).encode())
        else:
            docs = (
                corpus.passages(passages, min_words=150, max_words=180, seed=k)
                if large
                else corpus.passages(4, min_words=8, max_words=20, seed=k)
            )
            query = corpus.queries(1, seed=k)[0]
            body = {"model": model, "query": query, "documents": docs, "truncate": "end"}
            out.append(json.dumps(body).encode())
    return out


def route(model: str) -> str:
    return "/v1/embeddings" if model == "minilm" else "/v1/rerank"


@dataclass
class Window:
    """One probe window: the probe's answers, the machine's busy cores (everything, this run
    included) and the probed server's stage times (`embedserve_server_stage_seconds`;
    the probed server runs the probe's requests only, so one batch is one request)."""

    probe: loadgen.LoadResult
    busy_cores: float
    steal_cores: float  # cores' worth of time the hypervisor gave other guests (/proc/stat)
    stages: dict[str, float]  # per stage: its mean ms, and its share of >= 10 ms
    stalls: dict[str, float]  # the gateway's workers (`gateway.stalls`): see `stall_counts`


STALLS = {"embedserve_gateway_loop_lag_seconds", "embedserve_gateway_gc_pause_seconds"}


def stall_counts(samples: dict[Any, float]) -> dict[str, float]:
    """From the gateway's stall histograms (every worker added up): loop-lag ticks in all, late
    by >= 10 ms and >= 50 ms; garbage collections in all, >= 10 ms, and their seconds."""

    def count(name: str, le: str | None = None) -> float:
        total = sum(v for (n, labels), v in samples.items() if n == f"{name}_count")
        if le is None:
            return total
        below = sum(v for (n, labels), v in samples.items()
                    if n == f"{name}_bucket" and ("le", le) in labels)  # fmt: skip
        return total - below

    lag, pause = "embedserve_gateway_loop_lag_seconds", "embedserve_gateway_gc_pause_seconds"
    return {
        "lag_ticks": count(lag),
        "lag_10ms": count(lag, "0.01"),
        "lag_50ms": count(lag, "0.05"),
        "gc_passes": count(pause),
        "gc_10ms": count(pause, "0.01"),
        "gc_seconds": sum(v for (n, _), v in samples.items() if n == f"{pause}_sum"),
    }


STAGES = {"embedserve_server_stage_seconds"}


def stage_counts(samples: dict[Any, float]) -> dict[str, tuple[float, float, float]]:
    """The probed server's stage histograms: per stage (seconds, observations, observations of
    10 ms or more)."""
    out = {}
    for (name, labels), value in samples.items():
        if name != "embedserve_server_stage_seconds_count":
            continue
        stage = dict(labels)["stage"]
        total = samples[("embedserve_server_stage_seconds_sum", labels)]
        below = samples[("embedserve_server_stage_seconds_bucket",
                         tuple(sorted({**dict(labels), "le": "0.01"}.items())))]  # fmt: skip
        out[stage] = (total, value, value - below)
    return out


def probe_window(port: int, probe: list[list[bytes]], path: str, seconds: float,
                 stages_port: int | None) -> Window:  # fmt: skip
    server = f"http://127.0.0.1:{stages_port}/metrics"
    gateway = f"http://127.0.0.1:{port}/metrics"
    before = stage_counts(metric_samples(server, STAGES)) if stages_port else {}
    stalls_before = stall_counts(metric_samples(gateway, STALLS))
    meter = CpuMeter()
    result = loadgen.run(port, probe, seconds, path)
    busy, steal = meter.busy_cores(), meter.cores()[1]
    after = stage_counts(metric_samples(server, STAGES)) if stages_port else {}
    stalls_after = stall_counts(metric_samples(gateway, STALLS))
    stalls = {k: stalls_after[k] - stalls_before[k] for k in stalls_after}
    stages = {}
    for stage, (total, count, slow) in after.items():
        t0, c0, s0 = before.get(stage, (0.0, 0.0, 0.0))
        if count > c0:
            stages[f"{stage}_mean_ms"] = (total - t0) / (count - c0) * 1e3
            stages[f"{stage}_10ms_share"] = (slow - s0) / (count - c0)
    return Window(result, busy, steal, stages, stalls)


def measure(args: argparse.Namespace, port: int) -> dict[str, Any]:
    """`--rounds` of (probe alone, probe under the flood), alternated, so a slow spell of the
    machine shows in one round rather than in one phase."""
    probed = "minilm" if args.flood == "ms-marco" else "ms-marco"
    path = route(probed)
    # the probed server's metrics: serve gives the i-th model's server --metrics-port + i
    stages_port = args.metrics_port + (probed == "ms-marco") if args.metrics_port else None
    probe = [bodies(probed, False, 64, 0)]
    loadgen.run(port, probe, min(2.0, args.seconds), path)  # warm both paths
    flood_bodies = loadgen.split(
        bodies(args.flood, True, 4 * args.flood_clients, args.passages, args.flood_ids,
               args.flood_base64),
        args.flood_clients,
    )  # fmt: skip
    rounds: list[dict[str, Any]] = []
    for _ in range(args.rounds):
        idle = probe_window(port, probe, path, args.seconds, stages_port)
        flood: list[loadgen.LoadResult] = []
        # the flood runs past both ends of the probe's window: the probe sees it all along
        flooder = threading.Thread(
            target=lambda out: out.append(
                loadgen.run(port, flood_bodies, args.seconds + 2 * args.ramp, route(args.flood))
            ),
            args=(flood,),
        )
        flooder.start()
        time.sleep(args.ramp)
        during = probe_window(port, probe, path, args.seconds, stages_port)
        flooder.join()
        rounds.append({"idle": idle, "during": during, "flood": flood[0]})
    return {"probed": probed, "rounds": rounds}


def latencies_ms(m: dict[str, Any], phase: str) -> list[float]:
    return [x * 1000 for r in m["rounds"] for x in r[phase].probe.latencies]


def records(args: argparse.Namespace, m: dict[str, Any]) -> list[dict[str, Any]]:
    common = {"system": "embedserve", "weights": "real (minilm), random (ms-marco)",
              "dtype": args.dtype or "default", "scope": "end_to_end"}  # fmt: skip
    out = []
    for phase in ("idle", "during"):
        ms = latencies_ms(m, phase)
        concurrency = 1 if phase == "idle" else f"1 + {args.flood_clients} flooding"
        for q in (50, 99):
            out.append({**common, "model": m["probed"], "metric": f"p{q}_ms",
                        "value": percentile(ms, q), "concurrency": concurrency})  # fmt: skip
        windows = [r[phase] for r in m["rounds"]]
        for stage in windows[0].stages:
            out.append({**common, "model": m["probed"], "concurrency": concurrency,
                        "metric": f"server_{stage}", "scope": "server",
                        "value": sum(w.stages.get(stage, 0.0) for w in windows)
                        / len(windows)})  # fmt: skip
    floods = [r["flood"] for r in m["rounds"]]
    out.append({**common, "model": args.flood, "metric": "flood_tokens_per_s",
                "value": sum(f.tokens_per_s for f in floods) / len(floods),
                "concurrency": args.flood_clients, "batch": args.passages})  # fmt: skip
    return out


def round_notes(m: dict[str, Any]) -> str:
    """Per round: the probe's p99 idle -> under the flood (ms) and the machine's busy cores."""
    parts = []
    for r in m["rounds"]:
        idle, during = r["idle"], r["during"]
        p_idle = percentile([x * 1000 for x in idle.probe.latencies], 99)
        p_during = percentile([x * 1000 for x in during.probe.latencies], 99)
        s = during.stalls
        parts.append(f"{p_idle:.2f} -> {p_during:.2f} ms ({idle.busy_cores:.1f} -> "
                     f"{during.busy_cores:.1f} busy cores, {idle.steal_cores:.2f} -> "
                     f"{during.steal_cores:.2f} stolen; under the flood the gateway's loops "
                     f"ran {s['lag_10ms']:.0f} of {s['lag_ticks']:.0f} ticks >= 10 ms late, "
                     f"{s['lag_50ms']:.0f} >= 50 ms; {s['gc_passes']:.0f} collections, "
                     f"{s['gc_10ms']:.0f} >= 10 ms, {s['gc_seconds'] * 1e3:.0f} ms in all)")  # fmt: skip
    return "; ".join(parts)


def show_slow_callbacks(lines: list[str], top: int = 12) -> None:
    """With PYTHONASYNCIODEBUG=1 in serve's environment every gateway worker logs each callback
    that held its loop over `stalls.LAG_INTERVAL`: how many, and the longest."""
    slow = []
    for line in lines:
        if m := re.search(r"Executing (.*) took (\d+\.\d+) seconds", line):
            slow.append((float(m.group(2)), re.sub(r" at 0x[0-9a-f]+|\d+", "#", m.group(1))))
    print(f"asyncio slow callbacks: {len(slow)}")
    for seconds, what in sorted(slow, reverse=True)[:top]:
        print(f"  {seconds * 1e3:7.1f} ms  {what[:230]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", help="serve's --device (cpu, cuda)")
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--flood", choices=("minilm", "ms-marco"), default="minilm",
                    help="the model flooded; the other is probed")  # fmt: skip
    ap.add_argument("--flood-clients", type=int, default=8, help="flooding client processes")
    ap.add_argument("--passages", type=int, default=256, help="passages per flood request")
    ap.add_argument("--seconds", type=float, default=30.0, help="each probe window")
    ap.add_argument("--ramp", type=float, default=3.0, help="flood seconds before/after the probe")
    ap.add_argument("--flood-ids", action="store_true",
                    help="the flood's passages as token ids (minilm flood only): no tokenizing "
                    "in the gateway")  # fmt: skip
    ap.add_argument(
        "--flood-base64",
        action="store_true",
        help="the flood asks its vectors as base64 (the openai client's default)",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="rounds of (probe alone, probe under the flood), alternated",
    )
    ap.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve's --metrics-port: read the probed server's stage times",
    )
    ap.add_argument("--out", type=Path, default=None, help="default: results/concurrency/")
    ap.add_argument("serve_flags", nargs="*", help="more `serve` flags (after --)")
    args = ap.parse_args()
    if args.flood_ids and args.flood != "minilm":
        ap.error("--flood-ids: the minilm flood only (a rerank's documents are text)")
    from embedserve.devtools.checkpoints import make_checkpoint

    with tempfile.TemporaryDirectory(prefix="isolation-") as tmp:
        ranker = make_checkpoint(Path(tmp) / "ce", arch="ms-marco-minilm-l6", dtype="float32",
                                 seed=5)  # fmt: skip
        flags = ["--model", "minilm", "--model", f"ms-marco={ranker}", "--device", args.device,
                 *(["--dtype", args.dtype] if args.dtype else []),
                 *(["--metrics-port", str(args.metrics_port)] if args.metrics_port else []),
                 *args.serve_flags]  # fmt: skip
        server, ready = start([*CLI, "serve", "--port", "0", *flags],
                              r"serving minilm, ms-marco at http://127\.0\.0\.1:(\d+)")  # fmt: skip
        port = int(ready.group(1))
        try:
            m = measure(args, port)
        finally:
            server.stop(30)
        if os.environ.get("PYTHONASYNCIODEBUG"):  # a diagnosis: asyncio's slow-callback lines
            show_slow_callbacks(server.lines)
    idle_p99 = percentile(latencies_ms(m, "idle"), 99)
    during_p99 = percentile(latencies_ms(m, "during"), 99)
    ratio = during_p99 / idle_p99
    floods = [r["flood"] for r in m["rounds"]]
    errors = {
        phase: sum(r[phase].probe.errors for r in m["rounds"]) for phase in ("idle", "during")
    }
    notes = (
        f"`embedserve serve {' '.join(flags).replace(str(ranker), 'RANDOM-WEIGHTS')}`. "
        f"Probe: one client, short {route(m['probed'])} requests to {m['probed']}, "
        f"{len(latencies_ms(m, 'idle'))} idle / {len(latencies_ms(m, 'during'))} under the "
        f"flood ({errors['idle']} / {errors['during']} non-200), {args.rounds} round(s) of "
        f"{args.seconds:g} s per phase, alternated. Flood: {args.flood_clients} "
        f"client processes, {args.passages} passages of 150-180 words"
        f"{' sent as token ids' if args.flood_ids else ''}"
        f"{', vectors asked as base64' if args.flood_base64 else ''} per {route(args.flood)} "
        f"request to {args.flood}: {sum(f.requests_per_s for f in floods) / len(floods):.2f} "
        f"requests/s, {sum(f.tokens_per_s for f in floods) / len(floods):.0f} tokens/s, "
        f"{sum(f.errors for f in floods)} non-200. Per round, probe p99 idle -> flood: "
        f"{round_notes(m)}. Probe p99 under the flood / idle (all rounds): {ratio:.2f}x "
        f"(target <= {TARGET}x: {'met' if ratio <= TARGET else 'NOT met'})."
    )
    hardware = report.cpu_hardware()
    if args.device.startswith("cuda"):
        import torch

        hardware = f"{torch.cuda.get_device_name()}, {hardware}"
    machine = "h200" if "H200" in hardware else f"cpu{os.cpu_count()}"
    _, table = report.write("concurrency", hardware, f"{machine}-isolation", records(args, m),
                            report.versions("torch"), notes, args.out)  # fmt: skip
    print(notes)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
