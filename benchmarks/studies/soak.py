"""A soak: `embedserve serve` on the CPU under steady mixed load (short queries from 4 client
processes, plus a 100-passage request every few seconds) for `--seconds`; the resident memory of
all its processes sampled along the way. Growth is measured from the sample after warm-up.

`--mix`: instead, one `serve` of three models (MiniLM, a cross-encoder reranker and a SPLADE
model, both random-weight checkpoints of the exact configs made here) under three clients, one
embedding, one reranking and one asking sparse outputs, for `--seconds`; the resident memory of
every process sampled on its own (issue 40's soak; TEI's users saw a reranker grow 6 -> 42 GB).
It stops at `--requests` requests in all (the three clients share the count) or after
`--seconds`, whichever comes first, and states each process's growth from the first sample
after `--warmup` seconds to the last, and its slope (least squares, MB per hour).

    PYTHONPATH=src python3 benchmarks/studies/soak.py [--seconds 60] [--mix [--requests N]]
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
from harness import corpus, loadgen, report
from harness.machine import rss_mb
from harness.servers import CLI, start

from embedserve.processes import descendants


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--out", type=Path, default=None, help="default: results/studies/")
    ap.add_argument("--mix", action="store_true", help="embed, rerank and sparse, 3 models")
    ap.add_argument("--requests", type=int, default=None, help="--mix: stop after this many")
    ap.add_argument("--warmup", type=float, default=60.0, help="--mix: s before growth counts")
    args = ap.parse_args()
    if args.mix:
        return mixed(args)
    server, ready = start([*CLI, "serve", "--device", "cpu", "--port", "0"],
                          r"serving \S+ at (http://127\.0\.0\.1:(\d+))")  # fmt: skip
    port = int(ready.group(2))
    bodies = [json.dumps({"input": q}).encode() for q in corpus.queries(64)]
    bulk = json.dumps({"input": corpus.passages(100), "truncate": "end"})
    samples: list[tuple[float, float]] = []
    stop = threading.Event()

    def big_requests() -> None:
        while not stop.wait(3.0):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
            conn.request("POST", "/v1/embeddings", bulk, {"Content-Type": "application/json"})
            conn.getresponse().read()
            conn.close()

    try:
        pids = descendants(server.proc.pid) | {server.proc.pid}
        loadgen.run(port, loadgen.split(bodies, 4), 5.0)  # warm-up
        t0 = time.monotonic()
        bulk_thread = threading.Thread(target=big_requests)
        bulk_thread.start()
        result = {}

        def sample() -> None:
            while not stop.wait(5.0):
                samples.append((round(time.monotonic() - t0, 1), round(rss_mb(pids), 1)))

        sampler = threading.Thread(target=sample)
        sampler.start()
        result = loadgen.run(port, loadgen.split(bodies, 4), args.seconds).summary()
        stop.set()
        bulk_thread.join(120)
        sampler.join(10)
    finally:
        server.stop(30)
    first, last = samples[0][1], samples[-1][1]
    doc = {
        "hardware": report.cpu_hardware(),
        "commit": report.commit(),
        "date": time.strftime("%Y-%m-%d"),
        "seconds": args.seconds,
        "requests": int(result["requests"]),
        "errors": int(result["errors"]),
        "p99_ms": round(result["p99_ms"], 1),
        "rss_mb_samples (s, MB)": samples,
        "growth_from_first_sample_percent": round((last - first) / first * 100, 2),
    }
    report.write_json("soak-cpu", doc, args.out)
    print(json.dumps(doc, indent=1))


def _named(pid: int) -> str:
    """`pid` with what it runs (the model of a server), for the samples."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return str(pid)
    words = [a.decode(errors="replace") for a in argv]
    model = next(
        (w for w, prev in zip(words[1:], words[:-1], strict=True) if prev == "--model"), ""
    )
    role = next((w for w in ("server", "gateway", "serve") if w in words), words[0][-20:])
    return f"{pid} {role} {Path(model).name}".strip()


def _client(
    port: int,
    path: str,
    bodies: list[bytes],
    start_at: float,
    end: float,
    sent: Any,
    most: int,
    pipe: Any,
) -> None:
    """One client on one keep-alive connection, from `start_at` until `end` or until the
    clients' shared count `sent` reaches `most`; sends (requests, errors) on `pipe`."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    headers = {"Content-Type": "application/json"}
    num = errors = 0
    time.sleep(max(0.0, start_at - time.time()))
    while time.time() < end:
        with sent.get_lock():
            if sent.value >= most:
                break
            sent.value += 1
        try:
            conn.request("POST", path, body=bodies[num % len(bodies)], headers=headers)
            reply = conn.getresponse()
            reply.read()
            errors += reply.status != 200
        except (OSError, http.client.HTTPException):
            errors += 1
            conn.close()
        num += 1
    conn.close()
    pipe.send((num, errors))


def growth(samples: list[dict[str, Any]], warmup: float) -> dict[str, dict[str, float]]:
    """Per process: MB from the first sample after `warmup` s to the last, and the slope of a
    least-squares line through those samples (MB per hour)."""
    after = [x for x in samples if x["s"] >= warmup]
    out: dict[str, dict[str, float]] = {}
    for name in after[0]["rss_mb"] if len(after) >= 2 else ():
        points = [(x["s"], x["rss_mb"][name]) for x in after if name in x["rss_mb"]]
        ts, mbs = [t for t, _ in points], [mb for _, mb in points]
        mean_t, mean_mb = sum(ts) / len(ts), sum(mbs) / len(mbs)
        var = sum((t - mean_t) ** 2 for t in ts) or 1.0
        slope = sum((t - mean_t) * (mb - mean_mb) for t, mb in points) / var
        out[name] = {"MB": round(mbs[-1] - mbs[0], 1), "MB per hour": round(slope * 3600, 1)}
    return out


def mixed(args: argparse.Namespace) -> None:
    """Embed, rerank and sparse requests on three models of one `serve` (see the docstring)."""
    import multiprocessing as mp
    import tempfile

    from embedserve.devtools.checkpoints import make_checkpoint

    folder = Path(tempfile.mkdtemp(prefix="soak-models-"))
    for arch in ("ms-marco-minilm-l6", "splade-minilm-l6"):
        make_checkpoint(folder / arch, arch=arch, seed=0, dtype="float32")
    server, ready = start([*CLI, "serve", "--device", "cpu", "--port", "0", "--model", "minilm",
                           "--model", f"rerank={folder / 'ms-marco-minilm-l6'}",
                           "--model", f"splade={folder / 'splade-minilm-l6'}"],
                          r"serving .+ at (http://127\.0\.0\.1:(\d+))", timeout=600)  # fmt: skip
    port = int(ready.group(2))
    queries, passages = corpus.queries(64), corpus.passages(64, max_words=60)
    work = [
        ("/v1/embeddings", [json.dumps({"model": "minilm", "input": q}).encode() for q in queries]),
        ("/v1/rerank", [json.dumps({"model": "rerank", "query": q, "documents": passages[i % 48 :][:16]}).encode()
                        for i, q in enumerate(queries)]),
        ("/v1/embeddings", [json.dumps({"model": "splade", "input": [p], "outputs": ["sparse"]}).encode()
                            for p in passages]),
    ]  # fmt: skip
    samples: list[dict[str, Any]] = []
    stop = threading.Event()
    try:
        t0 = time.monotonic()

        def sample() -> None:
            while not stop.wait(10.0):
                # read again each time: a restarted worker is a new process
                pids = descendants(server.proc.pid) | {server.proc.pid}
                now = {_named(pid): round(rss_mb({pid}), 1) for pid in sorted(pids)}
                samples.append({"s": round(time.monotonic() - t0, 1), "rss_mb": now})

        sampler = threading.Thread(target=sample)
        sampler.start()
        ctx = mp.get_context("spawn")
        start_at = time.time() + 2.0
        pipes = []
        # the requests sent so far by all three clients, and the most to send
        sent, most = ctx.Value("q", 0), args.requests or 2**62
        for path, bodies in work:
            receive, send = ctx.Pipe(duplex=False)
            end = start_at + args.seconds
            ctx.Process(
                target=_client, args=(port, path, bodies, start_at, end, sent, most, send)
            ).start()
            pipes.append(receive)
        per_path = [receive.recv() for receive in pipes]  # (requests, errors) each
        elapsed = round(time.monotonic() - t0, 1)
        stop.set()
        sampler.join(20)
    finally:
        server.stop(30)
    names = ["embed", "rerank", "sparse"]
    counts = {
        n: {"requests": num, "errors": err} for n, (num, err) in zip(names, per_path, strict=True)
    }
    doc = {
        "hardware": report.cpu_hardware(),
        "commit": report.commit(),
        "date": time.strftime("%Y-%m-%d"),
        "note": "a shared 2-core machine (other agents' jobs ran too): latencies are not ours alone",
        "seconds": args.seconds,
        "elapsed seconds": elapsed,
        "requests": sum(c["requests"] for c in counts.values()),
        "by kind": counts,
        "rss growth after warm-up by process": growth(samples, args.warmup),
        "rss_mb_samples by process (every 10 s)": samples,
    }
    path = report.write_json("soak-mix-cpu", doc, args.out)
    print(json.dumps({k: v for k, v in doc.items() if "samples" not in k}, indent=1))
    print(path)


if __name__ == "__main__":
    main()
