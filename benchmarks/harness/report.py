"""Writing benchmark results in the one format of every suite: JSON plus a Markdown table.

Where a file goes (benchmarks/README.md, "Results"): `results/<folder>/<suite>-<machine>[-<variant>]-
<yyyymmdd>[-<n>].{json,md}`, the folder being the suite (latency, scoring, throughput, concurrency,
retrieval, summary) or `studies` for a study's own shape; logs and profiles in `results/logs` and
`results/profiles`. `--out DIR` in every script writes into DIR instead (the GPU machine's $OUT).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent.parent / "results"
SUITES = ("latency", "scoring", "throughput", "concurrency", "retrieval", "summary")
LOGS, PROFILES = RESULTS / "logs", RESULTS / "profiles"


def folder(suite: str) -> Path:
    """The results folder of a suite's files; `studies` for anything else."""
    return RESULTS / (suite if suite in SUITES else "studies")


def next_stem(out_dir: Path, name: str) -> Path:
    """`out_dir/name`, or `name-2`, `name-3`, ... when that file exists: never over another run's
    results of the same day."""
    stem = out_dir / name
    for n in range(2, 1000):
        if not stem.with_suffix(".json").exists():
            break
        stem = out_dir / f"{name}-{n}"
    return stem


def today() -> str:
    return f"{dt.date.today():%Y%m%d}"


def write_json(name: str, doc: Any, out_dir: Path | None = None) -> Path:
    """A study's own JSON document as `<out_dir or results/studies>/<name>-<yyyymmdd>.json`."""
    out_dir = out_dir or folder("studies")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = next_stem(out_dir, f"{name}-{today()}").with_suffix(".json")
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


def command_line() -> str:
    """This run's command, the script named by its path under benchmarks/ (for the notes)."""
    script = Path(sys.argv[0]).resolve()
    try:
        shown = str(script.relative_to(RESULTS.parent.parent))
    except ValueError:
        shown = script.name
    return " ".join([shown, *sys.argv[1:]])


def commit() -> str:
    """The measured code's commit: `EMBEDSERVE_COMMIT` when set (NOTE: on the GPU machine the
    working tree arrives with the session's starting HEAD: pass the real one in the command),
    else `git rev-parse` here."""
    if os.environ.get("EMBEDSERVE_COMMIT"):
        return os.environ["EMBEDSERVE_COMMIT"]
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "src"], capture_output=True, text=True
        )
        return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def cpu_hardware() -> str:
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores{cpu_flags()}"


def card_slug() -> str:
    """This machine's GPU in a result file's name ("h100", "h200"): a run names the card it ran
    on, not the one it was planned for (one rule, `peers/vllm_suites.gpu_slug`)."""
    import torch
    from peers.vllm_suites import gpu_slug

    return gpu_slug(torch.cuda.get_device_name())


# The flags that decide which CPU path is fast (float32 AVX2, AVX-512, bf16, AMX, int8 VNNI).
SPEED_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_bf16")


def cpu_flags() -> str:
    """`, flags a b c` of SPEED_FLAGS this CPU has (empty where /proc/cpuinfo is unreadable)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    line = next((x for x in text.splitlines() if x.startswith(("flags", "Features"))), "")
    have = set(line.split(":", 1)[-1].split())
    return ", flags " + " ".join(f for f in SPEED_FLAGS if f in have) if have else ""


# the vector and matrix extensions a CPU executor's speed depends on, as /proc/cpuinfo names them
ISA_FLAGS = ("avx", "avx2", "fma", "avx_vnni", "avx512f", "avx512_vnni", "avx512_bf16",
             "amx_tile", "amx_bf16", "amx_int8", "asimd", "sve")  # fmt: skip


def cpu_isa() -> list[str]:
    """Which of `ISA_FLAGS` this CPU reports (the first processor's flags line)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                have = set(line.split(":", 1)[1].split())
                return [f for f in ISA_FLAGS if f in have]
    except OSError:
        pass
    return []


def versions(*packages: str) -> dict[str, str]:
    out = {}
    for p in packages:
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[p] = metadata.version(p)
    return out


def write(
    suite: str,
    hardware: str,
    hardware_slug: str,
    records: list[dict[str, Any]],
    software: dict[str, str],
    notes: str,
    out_dir: Path | None = None,
) -> tuple[Path, str]:
    """Write `<suite>-<hardware_slug>-<yyyymmdd>.json` and `.md` (with `-2`, `-3`, ... when that
    day's file exists) into `out_dir`, by default the suite's folder; return the JSON path and
    table."""
    out_dir = out_dir or folder(suite)
    doc = {
        "suite": suite,
        "hardware": hardware,
        "commit": commit(),
        "date": dt.date.today().isoformat(),
        "software": software,
        "records": records,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = next_stem(out_dir, f"{suite}-{hardware_slug}-{today()}")
    stem.with_suffix(".json").write_text(json.dumps(doc, indent=2) + "\n")
    keys = [
        "system",
        "model",
        "weights",
        "dtype",
        "batch",
        "tokens",
        "concurrency",
        "metric",
        "value",
        "scope",
        "cosine_min",
    ]
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for r in records:
        cells = []
        for k in keys:
            v = r.get(k, "")
            cells.append(f"{v:.6g}" if isinstance(v, float) else str(v))
        lines.append("| " + " | ".join(cells) + " |")
    table = "\n".join(lines)
    header = (
        f"# {suite} benchmark\n\n- hardware: {hardware}\n- commit: {doc['commit']}\n"
        f"- date: {doc['date']}\n- software: "
        + ", ".join(f"{k} {v}" for k, v in software.items())
        + "\n\n"
    )
    stem.with_suffix(".md").write_text(header + notes.strip() + "\n\n" + table + "\n")
    return stem.with_suffix(".json"), table
