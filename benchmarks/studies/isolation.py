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
the probe's slowdown with and without it is the share of the gateway's tokenizing of the flood.
Text: Python standard-library docstrings.

    PYTHONPATH=src python3 benchmarks/studies/isolation.py --device cuda [--out DIR]
    PYTHONPATH=src python3 benchmarks/studies/isolation.py --device cpu --seconds 3 \\
        --flood-clients 2 --passages 16     # a quick try
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
from harness import corpus, loadgen, report
from harness.servers import CLI, start
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


def bodies(model: str, large: bool, count: int, passages: int, ids: bool = False) -> list[bytes]:
    """`count` request bodies for `model`: embeddings of `passages` long passages each (as token
    ids: `ids`), or reranks of one query against 4 short documents (the flood's or the probe's)."""
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


def measure(args: argparse.Namespace, port: int) -> dict[str, Any]:
    probed = "minilm" if args.flood == "ms-marco" else "ms-marco"
    probe = [bodies(probed, False, 64, 0)]
    loadgen.run(port, probe, min(2.0, args.seconds), route(probed))  # warm both paths
    idle = loadgen.run(port, probe, args.seconds, route(probed))
    flood_bodies = loadgen.split(bodies(args.flood, True, 4 * args.flood_clients, args.passages,
                                        args.flood_ids), args.flood_clients)  # fmt: skip
    flood: list[loadgen.LoadResult] = []
    # the flood runs past both ends of the probe's window: the probe sees it all along
    flooder = threading.Thread(
        target=lambda: flood.append(
            loadgen.run(port, flood_bodies, args.seconds + 2 * args.ramp, route(args.flood))
        )
    )
    flooder.start()
    time.sleep(args.ramp)
    during = loadgen.run(port, probe, args.seconds, route(probed))
    flooder.join()
    return {"probed": probed, "idle": idle, "during": during, "flood": flood[0]}


def records(args: argparse.Namespace, m: dict[str, Any]) -> list[dict[str, Any]]:
    common = {"system": "embedserve", "weights": "real (minilm), random (ms-marco)",
              "dtype": args.dtype or "default", "scope": "end_to_end"}  # fmt: skip
    out = []
    for phase in ("idle", "during"):
        ms = [x * 1000 for x in m[phase].latencies]
        for q in (50, 99):
            out.append({**common, "model": m["probed"], "metric": f"p{q}_ms",
                        "value": percentile(ms, q),
                        "concurrency": 1 if phase == "idle" else f"1 + {args.flood_clients} flooding"})  # fmt: skip
    flood = m["flood"]
    out.append({**common, "model": args.flood, "metric": "flood_tokens_per_s",
                "value": flood.tokens_per_s, "concurrency": args.flood_clients,
                "batch": args.passages})  # fmt: skip
    return out


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
                 *(["--dtype", args.dtype] if args.dtype else []), *args.serve_flags]  # fmt: skip
        server, ready = start([*CLI, "serve", "--port", "0", *flags],
                              r"serving minilm, ms-marco at http://127\.0\.0\.1:(\d+)")  # fmt: skip
        port = int(ready.group(1))
        try:
            m = measure(args, port)
        finally:
            server.stop(30)
    idle_p99 = percentile([x * 1000 for x in m["idle"].latencies], 99)
    during_p99 = percentile([x * 1000 for x in m["during"].latencies], 99)
    ratio = during_p99 / idle_p99
    flood = m["flood"]
    notes = (
        f"`embedserve serve {' '.join(flags).replace(str(ranker), 'RANDOM-WEIGHTS')}`. "
        f"Probe: one client, short {route(m['probed'])} requests to {m['probed']}, "
        f"{len(m['idle'].latencies)} idle / {len(m['during'].latencies)} under the flood "
        f"({m['idle'].errors} / {m['during'].errors} non-200). Flood: {args.flood_clients} "
        f"client processes, {args.passages} passages of 150-180 words"
        f"{' sent as token ids' if args.flood_ids else ''} per {route(args.flood)} "
        f"request to {args.flood}: {flood.requests_per_s:.2f} requests/s, "
        f"{flood.tokens_per_s:.0f} tokens/s, {flood.errors} non-200. Probe p99 under the flood "
        f"/ idle: {ratio:.2f}x (target <= {TARGET}x: {'met' if ratio <= TARGET else 'NOT met'})."
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
