"""Which HTTP server carries the gateway fastest: one `embedserve server` (the bundled MiniLM, CPU
defaults) behind several gateways at once, the same app (`gateway.main.build_app`) under uvicorn
+ httptools (what `embedserve gateway` runs) and under granian (Rust, hyper + tokio; ASGI), each
one worker; one short query at a time to each in turn on its own keep-alive connection (the
first 30 left out), and `Embedder.encode` in a fresh process per round (issue 38: the 2-core
CPU's target is in process + 1.0 ms).

    .venv/bin/python benchmarks/studies/http_server_ab.py [--rounds 5] [--requests 300]

granian must be installed (`pip install granian==2.8.7`); it is not a dependency.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import corpus, report
from harness.servers import BENCH, CLI, free_port, wait_http
from harness.timing import median
from http_ab import IN_PROCESS, WARM, clean_env, http_p50s

from embedserve.processes import Child

SRC = str(Path(__file__).resolve().parents[2] / "src")
# granian's variants: its default asyncio task wrapper, and its Rust one (`--task-impl rust`)
GRANIAN = {
    "granian asgi": ["--interface", "asgi"],
    "granian asgi, rust tasks": ["--interface", "asgi", "--task-impl", "rust"],
}


def granian(port: int, flags: list[str], gateway_argv: list[str]) -> Child:
    exe = shutil.which("granian", path=str(Path(sys.executable).parent))
    if exe is None:
        raise SystemExit("granian is not installed in this environment (pip install granian)")
    os.environ["ES_GATEWAY_ARGV"] = json.dumps(gateway_argv)  # the child's copy of the env
    argv = [exe, *flags, "--factory", "--workers", "1", "--runtime-mode", "st", "--loop",
            "uvloop", "--host", "127.0.0.1", "--port", str(port), "--working-dir", str(BENCH),
            "--log-level", "warning", "harness.granian_gateway:app"]  # fmt: skip
    return Child(argv, name="granian")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    os.environ.update(clean_env(SRC))
    server = Child([*CLI, "server", "--port", "0"], name="server")
    ready = server.wait_ready(300)
    gateway_argv = [
        "--replica",
        str(ready["address"]),
        "--workers",
        "1",
        "--calls-in-flight",
        "0",
        "--part-tokens",
        str(ready["max_batch_tokens"]),
    ]  # serve's, on the CPU
    uvicorn = Child([*CLI, "gateway", "--no-native", "--port", "0", *gateway_argv], name="gateway")
    url = str(uvicorn.wait_ready(120)["url"])
    children = {"uvicorn + httptools": (uvicorn, int(url.rsplit(":", 1)[1]))}
    for name, flags in GRANIAN.items():
        port = free_port()
        children[name] = (granian(port, flags, gateway_argv), port)
    for child, port in children.values():
        wait_http(child, port, 120)
    queries = corpus.queries(64)
    results: dict[str, list[float]] = {name: [] for name in children} | {"in process": []}
    code = IN_PROCESS.format(bench=str(BENCH), warm=WARM, n=args.requests)
    try:
        for r in range(args.rounds):
            p50s = http_p50s([port for _, port in children.values()], queries, args.requests)
            for name, p50 in zip(children, p50s, strict=True):
                results[name].append(round(p50, 3))
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                 check=True)  # fmt: skip
            results["in process"].append(round(float(out.stdout.split()[-1]), 3))
            print(r, {k: v[-1] for k, v in results.items()}, flush=True)
    finally:
        for child, _ in [*children.values(), (server, 0)]:
            child.proc.terminate()
    base = median(results["in process"])
    records = [
        {"system": f"embedserve gateway under {name}" if name != "in process" else
         "embedserve Embedder.encode", "model": "all-MiniLM-L6-v2", "weights": "real",
         "dtype": "CPU default", "batch": 1, "tokens": "3-12 words", "concurrency": 1,
         "metric": "one short query p50 (ms), median of rounds", "value": median(values),
         "over_in_process_ms": round(median(values) - base, 3),
         "scope": "HTTP end to end" if name != "in process" else "in process",
         "rounds": values}
        for name, values in results.items()
    ]  # fmt: skip
    notes = (
        f"{args.rounds} rounds, {args.requests} sequential requests per gateway per round "
        "(one keep-alive connection each, the gateways called in turn), every gateway one "
        "worker in front of the same `embedserve server`; granian "
        + report.versions("granian").get("granian", "?")
        + " in --runtime-mode st"
    )
    _, table = report.write("http-server-ab", report.cpu_hardware(), f"cpu{os.cpu_count()}",
                            records, report.versions("torch", "uvicorn", "granian"), notes,
                            args.out)  # fmt: skip
    print(table)


if __name__ == "__main__":
    main()
