"""Where the host's cores go under `embedserve serve` (issue 38): CPU per thread of the server
and the gateway workers, and where the server's threads spend it.

`serve` (the real engine on `--device`) under closed-loop client processes (`harness/loadgen.py`):
one client, 16 clients of short queries, 4 clients of 100 passages. For each load: the cores each
thread used over the window, summed by thread name (the server names its own:
`processes.name_os_thread`; "loop" is a process's main thread, its event loop), for the server
process and for the gateway workers together. With `--py-spy` (a py-spy binary), the server is
also sampled during the 16-client load, native frames included: the raw stacks are written
beside the results, and the hottest leaf frames per thread go into the table's notes.

    PYTHONPATH=src python3 benchmarks/studies/server_threads.py --model DIR [--device cuda]
        [--py-spy PATH] [--serve-args '...'] [--out DIR]
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import loadgen, report
from harness.machine import thread_cores, thread_seconds
from harness.servers import CLI, SERVING, start
from null_path import bodies as null_path_bodies

from embedserve.processes import descendants


def _argv(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return b""


def roles(serve_pid: int) -> dict[str, list[int]]:
    """The server process and the gateway's worker processes under `serve`: a server is
    `embedserve.cli.main server`; a worker, a process below the gateway's supervisor that is
    not its resource tracker."""
    below = descendants(serve_pid)
    servers = [p for p in below if b"embedserve.cli.main server" in _argv(p)]
    gateways = [p for p in below if b"embedserve.cli.main gateway" in _argv(p)]
    workers = [p for g in gateways for p in descendants(g) if b"resource_tracker" not in _argv(p)]
    return {"server": servers, "gateway": workers}


def snapshot(pids: dict[str, list[int]]) -> dict[str, dict[int, tuple[str, float]]]:
    """Each side's threads (`thread_seconds`), by side ("server", "gateway")."""
    out: dict[str, dict[int, tuple[str, float]]] = {}
    for side, group in pids.items():
        out[side] = {}
        for pid in group:
            out[side].update(thread_seconds(pid))
    return out


def leaf_summary(raw: Path, top: int = 12) -> dict[str, list[tuple[str, float]]]:
    """Per thread, its hottest leaf frames (share of that thread's samples), from py-spy's raw
    format (`thread (0x..);frame;...;leaf COUNT`)."""
    leaves: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if len(frames) < 2 or not count.isdigit():
            continue
        leaves[frames[0]][frames[-1]] += int(count)
    out = {}
    for thread, counter in leaves.items():
        total = sum(counter.values())
        out[f"{thread} ({total} samples)"] = [
            (frame, round(n / total, 3)) for frame, n in counter.most_common(top)
        ]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--py-spy", default=None, help="a py-spy binary: sample the server too")
    ap.add_argument("--serve-args", default="", help="more `serve` flags")
    ap.add_argument("--tag", default="")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)  # py-spy writes there before the results
    queries, bulk = null_path_bodies()  # the null path's: short queries, 100 passages (base64)
    serve, ready = start(
        [*CLI, "serve", "--model", args.model, "--device", args.device, "--port", "0",
         "--served-model-name", "minilm", *args.serve_args.split()],
        SERVING,
    )  # fmt: skip
    port = int(ready.group(1))
    records: list[dict[str, Any]] = []
    notes: dict[str, Any] = {}
    try:
        pids = roles(serve.proc.pid)
        loadgen.run(port, loadgen.split(queries, 4), 1.0)  # warm-up
        loads = [("queries", 1, queries), ("queries", 16, queries), ("bulk", 4, bulk)]
        if args.py_spy:  # sampled apart: py-spy stops the process at each sample
            loads.append(("profiled", 16, queries))
        for load, clients, bodies in loads:
            spy = None
            if load == "profiled":
                raw = (args.out or Path(".")) / f"server-py-spy-{args.device}{args.tag}.txt"
                spy = subprocess.Popen(
                    [args.py_spy, "record", "--pid", str(pids["server"][0]), "--native",
                     "--threads", "--rate", "250", "--duration", str(int(args.seconds) + 1),
                     "--format", "raw", "--output", str(raw)],
                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                )  # fmt: skip
                time.sleep(0.5)
            before = snapshot(pids)
            start_t = time.perf_counter()
            out = loadgen.run(port, loadgen.split(bodies, clients), args.seconds).summary()
            window = time.perf_counter() - start_t
            after = snapshot(pids)
            used = {
                (side, name): cores  # the wall window: client start-up included
                for side in after
                for name, cores in thread_cores(before[side], after[side], window).items()
            }
            if spy is not None:
                _, err = spy.communicate(timeout=120)
                notes["py_spy_16_clients"] = (
                    leaf_summary(raw) if raw.exists() else f"py-spy failed: {err[-400:]}"
                )
            line = f"{load} x{clients}: {out['requests_per_s']:.0f} req/s, {out['errors']} errors"
            system = "embedserve serve" + (" (sampled by py-spy)" if load == "profiled" else "")
            base = {"system": system, "model": "all-MiniLM-L6-v2",
                    "batch": 100 if load == "bulk" else 1, "concurrency": clients,
                    "tokens": "8-180 words" if load == "bulk" else "3-12 words",
                    "scope": "end_to_end"}  # fmt: skip
            for metric in ("requests_per_s", "errors"):
                records.append({**base, "metric": metric, "value": out[metric]})
            for (side, name), cores in sorted(used.items(), key=lambda kv: -kv[1]):
                if cores >= 0.01:
                    records.append(
                        {**base, "metric": f"{side}_cores_{name}", "value": round(cores, 3)}
                    )
                    line += f", {side}:{name} {cores:.2f}"
            print(line, flush=True)
    finally:
        serve.stop(60)
    text = (
        f"`embedserve serve --device {args.device} {args.serve_args}` under client processes on "
        f"the same machine; *_cores_NAME: CPU seconds of that side's threads of that name over "
        f"the load's wall window (its clients' start included), so a fraction of a core. "
        f"Gateway: its workers together. Notes: {json.dumps(notes)}"
    )
    hw = report.cpu_hardware() + ("; NVIDIA GPU" if args.device == "cuda" else "")
    slug = ("h200" if args.device == "cuda" else "cpu") + args.tag
    _, table = report.write(
        "server-threads", hw, slug, records, report.versions("uvicorn", "grpcio"), text, args.out
    )
    print(table[-3000:])


if __name__ == "__main__":
    main()
