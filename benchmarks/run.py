"""The one runner of the benchmarks: the suites of a machine, their summary and figures, and
the named steps of a GPU session (what `gpu_run.sh` runs after installing the carried wheels).

    .venv/bin/python benchmarks/run.py suites --machine cpu2        # on a 2-core CPU
    bash benchmarks/gpu_run.sh suites                               # on the H200 (docs/gpu.md)
    .venv/bin/python benchmarks/run.py summary FILE.json ... [--plots]
    .venv/bin/python benchmarks/run.py plots FILE.json [--out docs/x.png]
    python3 benchmarks/run.py step tests latency breakdown ...      # GPU steps, output under $OUT

Each suite runs as its own process and writes its own results file (`benchmarks/README.md`):

- latency: `suites/latency.py` (one text per call; sentence-transformers and transformers beside
  ours; transformers is the fidelity guard: the run fails below cosine 0.999);
- scoring: `suites/scoring.py` (one query against 5 / 25 / 50 documents; transformers and
  sentence-transformers `CrossEncoder`), on a GPU only;
- throughput and concurrency: `suites/concurrency.py` (ours, Infinity where it runs, and a
  FastAPI + sentence-transformers server over HTTP; sentence-transformers `encode` tuned, in
  process). The offline throughput suite (`suites/throughput.py`) runs on its own.

Then the summary: for every workload, how many times faster ours is than each baseline (their
time over ours, or our rate over theirs), from those files; several files of one suite and
machine (repeated runs) give each ratio's range. It goes to
`results/summary/summary-<machine>-<date>.{json,md}` and the figures (`harness/plots.py`) to `docs/`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/: the harness
from harness import plots, report
from harness.steps import STEPS, run_steps

HERE = Path(__file__).resolve().parent
BASELINES = ("transformers", "sentence-transformers", "naive FastAPI + ST", "Infinity")


def run_suites(machine: str, out: Path | None, minilm: Path | None, infinity: list[str]) -> list[Path]:  # fmt: skip
    """Every suite of the machine, one process each; the results files they wrote."""
    gpu = machine != "cpu2"
    py = sys.executable
    model = ["--minilm", str(minilm)] if minilm else []
    to = ["--out", str(out)] if out else []
    steps: list[tuple[str, list[str]]] = [
        ("latency", [py, str(HERE / "suites" / "latency.py"), "--device", "cuda" if gpu else "cpu",
                     *to, *model]),
    ]  # fmt: skip
    if gpu:
        tok = ["--bert-tokenizer", str(minilm)] if minilm else []
        steps.append(("scoring", [py, str(HERE / "suites" / "scoring.py"), *to, *tok]))
    peers = [py, str(HERE / "suites" / "concurrency.py"), *to, *infinity]
    peers += ["--model", str(minilm)] if minilm else []
    if gpu:
        peers += ["--device", "cuda", "--worktree", "--idle-load", "1000", "--seconds", "3",
                  "--passage-seconds", "5"]  # fmt: skip
    else:  # the latency suite just ran: wait for an idle machine, but not for long
        peers += ["--wait-budget", "120"]
    steps.append(("throughput + concurrency", peers))
    root = out or report.RESULTS
    before = set(root.rglob("*.json"))
    failed = []
    for name, argv in steps:
        t0 = time.monotonic()
        print(f"=== suite {name}: {' '.join(argv)}", flush=True)
        done = subprocess.run(argv, env=os.environ)
        print(
            f"=== suite {name}: exit {done.returncode} in {time.monotonic() - t0:.0f} s", flush=True
        )
        if done.returncode:
            failed.append(name)
    written = sorted(set(root.rglob("*.json")) - before)
    if failed:
        print(f"suites that failed: {', '.join(failed)}", flush=True)
    return written


# ---------------------------------------------------------------- the summary


def _by(records: list[dict[str, Any]], **match: Any) -> list[dict[str, Any]]:
    return [r for r in records if all(r.get(k) == v for k, v in match.items())]


def _value(records: list[dict[str, Any]], **match: Any) -> float | None:
    found = _by(records, **match)
    return float(found[0]["value"]) if found else None


def ratios(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """(workload, baseline, ratio) rows of one results file: how many times faster ours is."""
    rows: list[dict[str, Any]] = []
    recs = doc["records"]

    def add(workload: str, baseline: str, ours: float | None, theirs: float | None, time_: bool) -> None:  # fmt: skip
        if ours and theirs:
            rows.append({"workload": workload, "baseline": baseline,
                         "ratio": theirs / ours if time_ else ours / theirs})  # fmt: skip

    suite = doc["suite"]
    if suite == "latency":
        for r in _by(recs, system="embedserve", metric="p50_ms"):
            w = f"1 × {r['tokens']} tokens, {r['model'].split(' ')[0]}"
            for system, base in (("hf-transformers", BASELINES[0]), ("sentence-transformers", BASELINES[1])):  # fmt: skip
                theirs = _value(
                    recs, system=system, metric="p50_ms", model=r["model"], tokens=r["tokens"]
                )
                add(w, base, r["value"], theirs, True)
    elif suite == "scoring":
        for r in _by(recs, system="embedserve HTTP /v1/rerank", metric="p50_ms"):
            w = f"1 query × {r['batch']} docs, {r['model'].split(' ')[0]}"
            for system, base in (("transformers eager", BASELINES[0]),
                                 ("sentence-transformers CrossEncoder.predict", BASELINES[1])):  # fmt: skip
                theirs = _value(
                    recs, system=system, metric="p50_ms", model=r["model"], batch=r["batch"]
                )
                add(w, base, r["value"], theirs, True)
    elif suite == "concurrency":
        servers = (
            ("sentence-transformers + FastAPI", BASELINES[2]),
            ("infinity-emb (torch)", BASELINES[3]),
        )
        for r in _by(recs, system="embedserve", scope="end_to_end"):
            passages = isinstance(r["batch"], int) and r["batch"] > 1
            if r["metric"] == ("tokens_per_s" if passages else "requests_per_s"):
                w = (f"{r['batch']} passages per request, {r['concurrency']} clients (tokens/s)"
                     if passages else f"1 query per request, {r['concurrency']} clients (req/s)")  # fmt: skip
                for system, base in servers:
                    theirs = _value(recs, system=system, metric=r["metric"], batch=r["batch"],
                                    concurrency=r["concurrency"], scope="end_to_end")  # fmt: skip
                    add(w, base, r["value"], theirs, False)
                if passages:
                    st = _value(
                        recs, system="sentence-transformers encode (tuned)", metric="tokens_per_s"
                    )
                    add(w, BASELINES[1] + " (encode, tuned)", r["value"], st, False)
    return rows


def summarize(files: list[Path]) -> tuple[dict[str, Any], str]:
    """Every file's ratios; files of one suite and hardware are runs of it: each ratio's runs."""
    table: dict[tuple[str, str, str], dict[str, list[float]]] = defaultdict(
        lambda: defaultdict(list)
    )
    sources: dict[tuple[str, str], list[str]] = defaultdict(list)
    commits = set()
    for path in files:
        doc = json.loads(path.read_text())
        key = (doc["hardware"], doc["suite"])
        sources[key].append(path.stem)
        commits.add(doc["commit"])
        for row in ratios(doc):
            table[(*key, row["workload"])][row["baseline"]].append(row["ratio"])
    out_rows = []
    lines = [
        "| hardware | suite | workload | " + " | ".join(f"vs {b}" for b in BASELINES) + " |",
        "|---" * (3 + len(BASELINES)) + "|",
    ]
    for (hardware, suite, workload), by_base in table.items():
        cells = []
        for b in BASELINES:
            values = [v for k, vs in by_base.items() if k.split(" (")[0] == b for v in vs]
            label = next((k for k in by_base if k.split(" (")[0] == b), b)
            if not values:
                cells.append("–")
                continue
            text = (
                f"{min(values):.2f}×"
                if len(values) == 1
                else f"{min(values):.2f}–{max(values):.2f}×"
            )
            cells.append(text + (" (encode)" if label != b else ""))
            out_rows.append({"hardware": hardware, "suite": suite, "workload": workload,
                             "baseline": label, "ratios": [round(v, 3) for v in values]})  # fmt: skip
        lines.append(f"| {hardware} | {suite} | {workload} | " + " | ".join(cells) + " |")
    doc = {"rows": out_rows, "files": {f"{h} {s}": v for (h, s), v in sources.items()},
           "commits": sorted(commits)}  # fmt: skip
    return doc, "\n".join(lines)


def write_summary(files: list[Path], slug: str, out: Path | None) -> None:
    doc, table = summarize(files)
    out = out or report.folder("summary")
    out.mkdir(parents=True, exist_ok=True)
    stem = report.next_stem(out, f"summary-{slug}-{report.today()}")
    stem.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
    stem.with_suffix(".md").write_text(
        "# Ours against each baseline: how many times faster (their time / ours, or our rate / "
        "theirs)\n\nFrom: " + ", ".join(f"`{f.name}`" for f in files) + "\n\n" + table + "\n"
    )
    print(table)
    print(f"wrote {stem}.json and .md")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="command", required=True)
    suites = sub.add_parser("suites", help="every suite of a machine, then their summary")
    suites.add_argument("--machine", default="cpu2", help="cpu2, or the GPU's name (h200)")
    suites.add_argument("--out", type=Path, default=None,
                        help="one folder for every file (default: results/<suite>/)")  # fmt: skip
    suites.add_argument("--minilm", type=Path, default=None, help="all-MiniLM-L6-v2 folder")
    suites.add_argument("--infinity-python", default=None, help="passed to suites/concurrency.py")
    suites.add_argument("--infinity-path", default=None, help="passed to suites/concurrency.py")
    summary = sub.add_parser("summary", help="the ratios of results files")
    summary.add_argument("files", type=Path, nargs="+", help="results files")
    summary.add_argument("--out", type=Path, default=None, help="default: results/summary/")
    summary.add_argument("--plots", action="store_true", help="the figures too")
    figures = sub.add_parser("plots", help="one figure per results file, under docs/")
    figures.add_argument("files", type=Path, nargs="+", help="results JSON files")
    figures.add_argument("--out", type=Path, default=None, help="the PNG (one input file only)")
    step = sub.add_parser("step", help="named steps of a GPU session, output under $OUT")
    step.add_argument("names", nargs="+", choices=sorted(STEPS), metavar="NAME",
                      help=", ".join(sorted(STEPS)))  # fmt: skip
    return ap.parse_args()


def main() -> None:
    args = parse_args()
    t0 = time.monotonic()
    if args.command == "step":
        sys.exit(run_steps(args.names))
    if args.command == "plots":
        plots.draw(args.files, args.out)
        return
    if args.command == "suites":
        infinity = []
        if args.infinity_python is not None:
            infinity += ["--infinity-python", args.infinity_python]
        if args.infinity_path:
            infinity += ["--infinity-path", args.infinity_path]
        files = run_suites(args.machine, args.out, args.minilm, infinity)
        write_summary(files, args.machine, args.out)
    else:
        write_summary(args.files, "suites", args.out)
        if args.plots:
            plots.draw(args.files)
    print(f"done in {time.monotonic() - t0:.0f} s")


if __name__ == "__main__":
    main()
