"""An outside client beside ours (issue 38): NVIDIA's AIPerf and our load generator against the
same `embedserve serve`, in turn, on the same inputs.

One server (`--device cuda` on the GPU machine, the CPU elsewhere), then for each load (short
queries at 1 and 16 clients, 100 passages per request at 4 clients) AIPerf's `profile
--endpoint-type embeddings` (`harness/aiperf_run.py`, its carried wheels installed first) and
our closed-loop client processes (`harness/loadgen.py`) for the same seconds. AIPerf counts a
text's tokens without the special tokens (2 fewer per text for BERT) and its requests/s only
over successful requests, so compare requests/s and latency; tokens/s are each tool's own.

    PYTHONPATH=src python3 benchmarks/studies/aiperf_serving.py --model DIR [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
from harness import aiperf_run, corpus, loadgen, report
from harness.servers import CLI, SERVING, start

NAME = "minilm"
LOADS = [("queries", 1), ("queries", 16), ("bulk", 4)]
# what our bodies carry beyond the texts, for AIPerf to send too
EXTRA = {"queries": [], "bulk": ["--extra-inputs", "truncate:end", "encoding_format:base64"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", type=Path, required=True, help="a model folder")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--model-name", default="all-MiniLM-L6-v2", help="the name in the results")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--machine", default="h200", help="the file name's machine")
    ap.add_argument("--out", type=Path, default=None, help="default: results/concurrency/")
    args = ap.parse_args()
    queries = corpus.queries(256)
    passages = corpus.passages(800, max_words=180)
    batches = [passages[i : i + 100] for i in range(0, 800, 100)]
    bodies = {
        "queries": [json.dumps({"input": q, "model": NAME}).encode() for q in queries],
        "bulk": [json.dumps({"input": b, "model": NAME, "encoding_format": "base64",
                             "truncate": "end"}).encode() for b in batches],
    }  # fmt: skip
    aiperf_run.install_carried()
    server, ready = start(
        [*CLI, "serve", "--model", str(args.model), "--device", args.device, "--port", "0",
         "--served-model-name", NAME], SERVING)  # fmt: skip
    port = int(ready.group(1))
    url = f"http://127.0.0.1:{port}"
    records: list[dict[str, Any]] = []
    out = args.out or report.folder("concurrency")
    version, got_command = "?", "?"
    try:
        for load, clients in LOADS:
            texts: Any = queries if load == "queries" else batches
            got = aiperf_run.run_aiperf(
                url, NAME, texts, out_dir=out / "aiperf-artifacts" / f"{load}-{clients}",
                concurrency=clients, duration_s=args.seconds, tokenizer=str(args.model),
                name=f"{load}-{clients}", extra_args=EXTRA[load],
            )  # fmt: skip
            version = got.get("aiperf_version", version)
            got_command = got.get("command", got_command)
            ours = loadgen.run(port, loadgen.split(bodies[load], clients), args.seconds).summary()
            print(f"{load} x{clients}: aiperf {got['requests_per_s']:.1f} req/s p50 "
                  f"{got['p50_ms']:.2f} p99 {got['p99_ms']:.2f} ms errors {got['errors']}; ours "
                  f"{ours['requests_per_s']:.1f} req/s p50 {ours['p50_ms']:.2f} p99 "
                  f"{ours['p99_ms']:.2f} ms errors {ours['errors']}", flush=True)  # fmt: skip
            for client, figures in (("aiperf", got), ("embedserve loadgen", ours)):
                for metric in ("requests_per_s", "p50_ms", "p99_ms", "tokens_per_s", "errors"):
                    if figures.get(metric) is None:
                        continue
                    records.append({
                        "system": f"embedserve serve ({client} clients)", "model": args.model_name,
                        "weights": "real", "dtype": "bf16" if args.device == "cuda" else "cpu default",
                        "batch": 1 if load == "queries" else 100,
                        "tokens": "3-12 words" if load == "queries" else "8-180 words",
                        "concurrency": clients, "metric": metric,
                        "value": round(float(figures[metric]), 3), "scope": "end_to_end",
                    })  # fmt: skip
    finally:
        server.stop(60)
    hardware = report.cpu_hardware()
    if args.device == "cuda":
        import torch

        hardware = f"{torch.cuda.get_device_name()}, host {hardware}"
    notes = (
        f"AIPerf {version} (`{got_command}`) and our load generator against one `embedserve "
        f"serve --device {args.device}`, in turn, {args.seconds:g} s each. CPU flags: "
        f"{report.cpu_flags()}. AIPerf counts tokens without the special tokens and requests/s "
        "over successful requests only."
    )
    _, table = report.write(
        "concurrency", hardware, f"{args.machine}-aiperf", records,
        {**report.versions("torch", "tokenizers"), "aiperf": version}, notes, args.out,
    )  # fmt: skip
    print(table)


if __name__ == "__main__":
    main()
