"""How long the gateway takes to reject a wrong API key, by how much of a real key it matches.

The check (`GatewayApp._authenticate`) compares with `hmac.compare_digest` against every key,
so a key that matches all but its last character must not be rejected measurably slower than
one that matches nothing (the timing side channel an attacker would use to guess a key byte by
byte). Rounds interleave the candidates; the figure is the median over rounds of each round's
median. In process, no network (which would only add noise on top).

    PYTHONPATH=src python3 benchmarks/studies/auth_timing.py [--rounds 30] [--per-round 2000]

Writes auth-timing-<machine>-YYYYMMDD.json (hardware, commit, date) into --out.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
from harness import report
from harness.timing import median

from embedserve.gateway.app import GatewayApp
from embedserve.gateway.auth import KeyRing
from embedserve.gateway.requests import Limits

KEY = "sk-live-" + "0123456789abcdef" * 3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--per-round", type=int, default=2000)
    ap.add_argument("--out", type=Path, default=None, help="default: results/studies/")
    args = ap.parse_args()
    app = GatewayApp(lambda: None, Limits(4, 8, ("m",)), max_body_bytes=1, api_keys=KeyRing([KEY], None))  # type: ignore[arg-type,return-value]  # fmt: skip
    candidates = {
        "matches nothing": "X" * len(KEY),
        "matches the first half": KEY[: len(KEY) // 2] + "X" * (len(KEY) - len(KEY) // 2),
        "matches all but the last character": KEY[:-1] + "X",
        "the right key (accepted)": KEY,
    }
    scopes = {
        k: {"headers": [(b"authorization", f"Bearer {v}".encode())]} for k, v in candidates.items()
    }
    results: dict[str, list[float]] = {k: [] for k in candidates}
    for r in range(args.rounds):
        order = list(scopes.items())
        for name, scope in order if r % 2 == 0 else order[::-1]:
            times = []
            for _ in range(args.per_round):
                t0 = time.perf_counter()
                with contextlib.suppress(Exception):
                    app._authenticate(dict(scope["headers"]))
                times.append(time.perf_counter() - t0)
            results[name].append(median(times))
    us = {name: round(median(m) * 1e6, 3) for name, m in results.items()}
    for name, value in us.items():
        print(f"{name:38s} {value:7.3f} us")
    doc = {"hardware": report.cpu_hardware(), "commit": report.commit(),
           "date": time.strftime("%Y-%m-%d"), "rounds": args.rounds,
           "per_round": args.per_round, "median_us_per_check": us}  # fmt: skip
    report.write_json(f"auth-timing-cpu{os.cpu_count()}", doc, args.out)


if __name__ == "__main__":
    main()
