"""Writing benchmark results in the one format of every suite: JSON plus a Markdown table."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


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
    return f"{model}, {os.cpu_count()} cores"


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
    out_dir: Path = RESULTS,
) -> tuple[Path, str]:
    """Write `<suite>-<hardware_slug>-<yyyymmdd>.json` and `.md` (with `-2`, `-3`, ... when that
    day's file exists); return the JSON path and table."""
    today = dt.date.today()
    doc = {
        "suite": suite,
        "hardware": hardware,
        "commit": commit(),
        "date": today.isoformat(),
        "software": software,
        "records": records,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / f"{suite}-{hardware_slug}-{today:%Y%m%d}"
    # NOTE: never over another run's results of the same day: -2, -3, ... after the date
    for n in range(2, 1000):
        if not stem.with_suffix(".json").exists():
            break
        stem = out_dir / f"{suite}-{hardware_slug}-{today:%Y%m%d}-{n}"
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
