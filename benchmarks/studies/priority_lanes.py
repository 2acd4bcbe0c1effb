"""Priority lanes (issue 56): a one-word query's latency while a bulk job runs, lanes on and off.

`embedserve serve --device cpu` (the bundled MiniLM) twice in one run, `--lanes on` then
`--lanes off`. In each: one-word queries one after another for `--idle-seconds` on the idle
server (the reference); then each bulk job in turn for `--seconds`, while one more client sends
one-word queries one after another:

- `passages`: 2 clients, each sending requests of 64 passages of 233 tokens back to back (the
  fairness study's large request, in a stream; its parts fill a server batch each);
- `records`: 8 clients, each sending requests of 20 short records of 24 tokens back to back (an
  indexing client's batches: 480 tokens a request, bulk by its 20 inputs; each a small request
  to the server's scheduler, under half its batch, so one FCFS queue puts a query behind all of
  them, where the passages' large parts are passed once by the small-request rule).

Reported per mode and job: the queries' p50/p99 during the job and on the idle server, and the
job's tokens/s (tokens of the bulk requests answered, over the time until the last came back).
Text: Python standard-library docstrings (`fairness.long_passages`).

    PYTHONPATH=src python3 benchmarks/studies/priority_lanes.py [--out DIR] [--seconds 30]
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
from harness import corpus, report
from studies.fairness import call, long_passages, ms, probe, probed, started_serve

COMMON = {"system": "embedserve", "model": "all-MiniLM-L6-v2", "weights": "real"}


def bulk_client(
    url: str, texts: list[str], stop: threading.Event, out: list[tuple[int, int]]
) -> None:
    """Requests of `texts` back to back until `stop`: (status, tokens) of each."""
    while not stop.is_set():
        status, body = call(url, {"input": texts})
        out.append((status, body["usage"]["prompt_tokens"] if status == 200 else 0))


# name: (clients, inputs per request, tokens per input)
JOBS = {"passages": (2, 64, 233), "records": (8, 20, 24)}


def run_job(url: str, texts: list[list[str]], words: list[str], seconds: float) -> dict[str, Any]:
    """One bulk job (a client per list of texts) for `seconds`, queries sent meanwhile."""
    during: list[tuple[int, float]] = []
    done: list[tuple[int, int]] = []
    stop = threading.Event()
    clients = [threading.Thread(target=bulk_client, args=(url, t, stop, done)) for t in texts]
    t0 = time.perf_counter()
    for c in clients:
        c.start()
    time.sleep(1.0)  # the bulk job fills the queue first
    prober = threading.Thread(target=probe, args=(url, words, stop, during))
    prober.start()
    time.sleep(seconds)
    stop.set()
    prober.join()
    for c in clients:
        c.join()
    return {
        "during": [t for s, t in during if s == 200],
        "probe_statuses": sorted({s for s, _ in during}),
        "bulk_statuses": sorted({s for s, _ in done}),
        "bulk_requests": len(done),
        "bulk_tokens": sum(n for _, n in done),
        "seconds": time.perf_counter() - t0,
    }


def run_mode(
    lanes: str, args: argparse.Namespace, words: list[str], jobs: dict[str, list[list[str]]]
) -> dict[str, Any]:
    """One `serve --lanes <lanes>`: the idle reference, then each bulk job with the probe."""
    server, url, dtype, budget = started_serve("--lanes", lanes)
    try:
        idle = probed(url, words, args.idle_seconds)
        results = {name: run_job(url, texts, words, args.seconds) for name, texts in jobs.items()}
    finally:
        server.stop(30)
    return {
        "lanes": lanes,
        "dtype": dtype,
        "budget": budget,
        "idle": [t for s, t in idle if s == 200],
        "jobs": results,
    }


def records(mode: dict[str, Any]) -> list[dict[str, Any]]:
    common = {**COMMON, "dtype": mode["dtype"], "scope": "end_to_end", "lanes": mode["lanes"]}
    probe = {**common, "batch": 1, "tokens": "1 word"}
    idle = mode["idle"]
    rows = [
        {**probe, "concurrency": 1, "metric": "p50_ms", "value": ms(idle, 50),
         "during": "idle server (reference)"},
        {**probe, "concurrency": 1, "metric": "p99_ms", "value": ms(idle, 99),
         "during": "idle server (reference)"},
    ]  # fmt: skip
    for name, job in mode["jobs"].items():
        clients, inputs, tokens = JOBS[name]
        during = job["during"]
        rows += [
            {**common, "batch": inputs, "tokens": tokens, "concurrency": clients, "job": name,
             "metric": "bulk_tokens_per_s", "value": job["bulk_tokens"] / job["seconds"],
             "bulk_requests": job["bulk_requests"], "statuses": job["bulk_statuses"],
             "seconds": job["seconds"]},
            {**probe, "concurrency": clients + 1, "metric": "p50_ms", "value": ms(during, 50),
             "during": f"bulk job {name}", "count": len(during)},
            {**probe, "concurrency": clients + 1, "metric": "p99_ms", "value": ms(during, 99),
             "during": f"bulk job {name}", "max_ms": ms(during, 100),
             "statuses": job["probe_statuses"]},
        ]  # fmt: skip
    return rows


def summary(mode: dict[str, Any]) -> list[str]:
    lines = []
    for name, job in mode["jobs"].items():
        during = job["during"]
        lines.append(
            f"lanes {mode['lanes']}, job {name}: one-word query p50 {ms(during, 50):.1f} ms, p99 "
            f"{ms(during, 99):.1f} ms ({len(during)} queries); bulk "
            f"{job['bulk_tokens'] / job['seconds']:,.0f} tokens/s ({job['bulk_requests']} "
            f"requests, statuses {job['bulk_statuses']})"
        )
    idle = mode["idle"]
    return [
        *lines,
        f"lanes {mode['lanes']}, idle: p50 {ms(idle, 50):.1f} ms, p99 {ms(idle, 99):.1f} ms",
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="default: results/studies/")
    parser.add_argument("--seconds", type=float, default=30.0, help="each bulk job, per mode")
    parser.add_argument("--idle-seconds", type=float, default=5.0)
    parser.add_argument("--tag", default="", help="suffix of the results' hardware slug")
    args = parser.parse_args()
    words = [w.strip(".,:;()").lower() for w in " ".join(corpus.queries(200)).split()][:200]
    jobs = {}
    for name, (clients, inputs, tokens) in JOBS.items():
        texts = long_passages(clients * inputs, tokens)
        jobs[name] = [texts[i::clients] for i in range(clients)]
    load = os.getloadavg()[0]  # other work on the machine, said in the notes
    modes = [run_mode(lanes, args, words, jobs) for lanes in ("on", "off")]
    rows = [r for mode in modes for r in records(mode)]
    lines = [line for mode in modes for line in summary(mode)]
    notes = (
        f"`embedserve serve --device cpu --lanes on|off` (bundled MiniLM, {modes[0]['dtype']}, "
        f"{modes[0]['budget']}), one after the other. Each bulk job for {args.seconds:.0f} s: "
        "`passages`, 2 clients sending requests of 64 passages of 233 tokens back to back; "
        "`records`, 8 clients sending requests of 20 records of 24 tokens back to back (bulk by "
        "their 20 inputs); one more client sends one-word queries one after another meanwhile.\n\n"
        + "\n".join(f"- {line}." for line in lines)
        + f"\n\nLoad average (1 min) before the run: {load:.2f}, after: {os.getloadavg()[0]:.2f}."
        + f" Command: `{report.command_line()}`."
    )
    _, table = report.write(
        "priority-lanes", report.cpu_hardware(), f"cpu{os.cpu_count()}" + args.tag, rows,
        report.versions("torch"), notes, args.out,
    )  # fmt: skip
    print(notes)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
