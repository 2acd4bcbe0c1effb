"""Start-up to ready on the CPU: `embedserve serve` with the bundled model, first run and cached.

A float32 CPU measures its executors at start-up (`engine/cpu_paths.py`): the first start in a
fresh cache writes the ONNX graph and times every path; a later start reads the graph back and
only checks the path it remembered. Each start runs `embedserve serve --device cpu` in a
process of its own, timed from its launch to the line `embedserve: serving ... at URL` (the
gateway answering, the server's ready line before it), then stopped; `--starts` starts in all,
the first in a fresh `XDG_CACHE_HOME`, the others in the same one. The server's ready line (the
executor chosen, its timings) is kept with each start.

    .venv/bin/python benchmarks/studies/cpu_startup.py [--starts 3]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
from harness import report
from harness.machine import load1

READY = "embedserve: serving "


def start_once(cache: Path, timeout: float, extra: list[str]) -> dict[str, Any]:
    """One `serve` from launch to serving: seconds, the server's ready line, the load before."""
    env = {**os.environ, "XDG_CACHE_HOME": str(cache), "PYTHONWARNINGS": "ignore"}
    argv = [sys.executable, "-m", "embedserve.cli.main", "serve", "--device", "cpu", "--port", "0",
            *extra]  # fmt: skip
    load = load1()
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)  # fmt: skip
    ready_line, seconds = "", None
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            if "server: ready on" in line:
                ready_line = line.strip()
            if line.startswith(READY):
                seconds = time.perf_counter() - t0
                break
            if time.perf_counter() - t0 > timeout:
                break
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)
    if seconds is None:
        raise RuntimeError(f"serve did not become ready in {timeout} s (last: {ready_line!r})")
    return {"seconds": round(seconds, 2), "ready_line": ready_line, "load1_before": load}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--starts", type=int, default=3)
    p.add_argument("--timeout", type=float, default=180.0)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument(
        "--serve-args",
        default="",
        help="more `serve` flags, e.g. '--dtype float32 --cpu-path auto'",
    )
    p.add_argument("--tag", default="", help="the file name's variant, e.g. -f32auto")
    args = p.parse_args()
    cache = Path(tempfile.mkdtemp(prefix="cpu-startup-"))
    records = []
    for n in range(args.starts):
        got = start_once(cache, args.timeout, args.serve_args.split())
        kind = "first run (fresh cache)" if n == 0 else "cached"
        print(f"start {n}: {kind} {got['seconds']:.2f} s; {got['ready_line']}", flush=True)
        records.append({"system": "embedserve serve", "model": "all-MiniLM-L6-v2",
                        "weights": "real", "metric": "start-up to serving (s)", "tokens": kind,
                        "value": got["seconds"], "scope": "end_to_end", **got})  # fmt: skip
    isa = report.cpu_isa()
    hardware = f"{report.cpu_hardware()}; flags: {' '.join(isa) or 'unknown'}"
    notes = (f"`embedserve serve --device cpu --port 0 {args.serve_args}`, the bundled model, "
             "from the launch to the `embedserve: serving` line; the first start in a fresh "
             "XDG_CACHE_HOME (ONNX graph written, every CPU executor timed), the later ones in "
             "the same cache (graph read back, the remembered executor checked). The machine is "
             "shared: the 1-minute load before each start is in the JSON.")  # fmt: skip
    software = report.versions("torch", "embedserve", "onnxruntime")
    path, table = report.write("cpu-startup", hardware, "cpu2" + args.tag, records, software,
                               notes, args.out)  # fmt: skip
    print(table)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
