"""The load generator's ceiling: its clients against a no-op server of several processes.

A result is trustworthy when the same clients reach well above (at least 1.5x) the rate a
benchmark asks them to show (harness/loadgen.py says why the clients are processes).

    PYTHONPATH=src python3 benchmarks/studies/loadgen_ceiling.py --clients 16 --workers 8 --seconds 4
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
from harness import loadgen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=4.0)
    args = ap.parse_args()
    body = json.dumps({"input": "a short query", "model": "noop"}).encode()
    with loadgen.noop_server(args.workers) as port:
        result = loadgen.run(port, loadgen.split([body], args.clients), args.seconds)
    print(json.dumps({"clients": args.clients, "workers": args.workers, **result.summary()}))


if __name__ == "__main__":
    main()
