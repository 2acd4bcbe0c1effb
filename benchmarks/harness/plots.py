"""Figures from committed results files (benchmarks/results/<suite>/*.json), one PNG per file,
under docs/.

Each figure carries a caption with the file's hardware, commit and date. Suites drawn so far:

- `concurrency`: requests/s and p99 latency against concurrent clients, one line per system,
  for the one-input-per-request records; requests of several inputs (e.g. 32 passages from 4
  clients), when the file has them, as bars of tokens/s beside (with the in-process
  sentence-transformers `encode` baseline when the file has it);
- `latency` (the suite's files, `suites/latency.py`): p50 latency against tokens per text, one
  line per system, one panel per model.

    .venv/bin/python benchmarks/run.py plots \\
        benchmarks/results/concurrency/concurrency-cpu2-peers-YYYYMMDD.json [--out docs/peers-cpu.png]

Without `--out`, a file's figure is docs/<its name>.png. Needs matplotlib.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]  # the repository
COLORS = ["#d62728", "#1f77b4", "#7f7f7f", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]
MARKERS = ["o", "s", "^", "D", "v", "P", "X"]


def committed(path: Path) -> bool:
    done = subprocess.run(
        ["git", "ls-files", "--error-unmatch", str(path)], cwd=ROOT, capture_output=True
    )
    return done.returncode == 0


def caption(doc: dict[str, Any], path: Path) -> str:
    return (
        f"{doc.get('hardware', '?')}  ·  commit {doc.get('commit', '?')}  ·  "
        f"{doc.get('date', '?')}  ·  {shown(path)}"
    )


def shown(path: Path) -> str:
    """The results file as the repository names it (its bare name when it lies elsewhere)."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return f"benchmarks/results/{path.name}"


def systems_in_order(records: list[dict[str, Any]]) -> list[str]:
    """Systems with a requests/s record, in the file's order (ours first where it is first)."""
    return list(dict.fromkeys(r["system"] for r in records if r["metric"] == "requests_per_s"))


def label_values(ax: Any, x: float, items: list[tuple[float, str]], style: dict[str, Any]) -> None:
    """Value labels right of the points at `x`, pushed apart vertically so none overlap."""
    gap = 12.0  # points between label centres
    to_points = 72.0 / ax.figure.dpi
    placed: list[float] = []
    for y, s in sorted(items):
        at = ax.transData.transform((x, y))[1] * to_points
        want = max([at, *[p + gap for p in placed]])
        placed.append(want)
        ax.annotate(
            f"{y:,.0f}" if y >= 10 else f"{y:.1f}",
            (x, y),
            textcoords="offset points",
            xytext=(7, want - at),
            ha="left",
            va="center",
            fontsize=8,
            color=style[s]["color"],
            bbox={
                "boxstyle": "round,pad=0.15",
                "facecolor": "white",
                "edgecolor": "none",
                "alpha": 0.85,
            },
            zorder=5,
        )


Single = dict[tuple[str, str], dict[int, float]]  # (system, metric) -> {concurrency: value}
Bulk = dict[tuple[int, int], dict[str, dict[str, float]]]  # (batch, clients) -> system -> metric


def split_records(records: list[dict[str, Any]], systems: list[str]) -> tuple[Single, Bulk, dict[tuple[int, int], str]]:  # fmt: skip
    """End-to-end records of one input per request (lines) and of several (bars), with each
    bar panel's label."""
    single: Single = defaultdict(dict)
    bulk: Bulk = defaultdict(lambda: defaultdict(dict))
    bulk_label: dict[tuple[int, int], str] = {}
    for r in records:
        if r["system"] not in systems or r.get("scope") != "end_to_end":
            continue
        batch = r.get("batch", 1)
        if isinstance(batch, int) and batch > 1:
            key = (batch, int(r["concurrency"]))
            bulk[key][r["system"]][r["metric"]] = float(r["value"])
            bulk_label[key] = r.get("workload", f"{batch} inputs per request")
        else:
            single[(r["system"], r["metric"])][int(r["concurrency"])] = float(r["value"])
    return single, bulk, bulk_label


def concurrency_figure(doc: dict[str, Any], path: Path, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = doc["records"]
    systems = systems_in_order(records)
    if not systems:
        raise SystemExit(f"{path}: no requests_per_s records to draw")
    style = {
        s: {"color": COLORS[i % len(COLORS)], "marker": MARKERS[i % len(MARKERS)]}
        for i, s in enumerate(systems)
    }
    single, bulk, bulk_label = split_records(records, systems)
    offline = [r for r in records if r.get("scope") == "offline" and r["metric"] == "tokens_per_s"]
    model = records[0].get("model", "")
    panels = 2 + len(bulk)
    fig, axes = plt.subplots(
        1,
        panels,
        figsize=(5.2 * panels, 5.0),
        gridspec_kw={"width_ratios": [1.25, 1.25] + [1] * len(bulk)},
    )
    for ax, metric, label in (
        (axes[0], "requests_per_s", "requests/s (higher is better)"),
        (axes[1], "p99_ms", "p99 latency, ms (lower is better)"),
    ):
        line_panel(fig, ax, metric, label, single, systems, style)
    axes[0].legend(loc="upper left", fontsize=9)

    for r in offline:  # an in-process baseline beside every several-inputs panel
        style.setdefault(r["system"], {"color": "#bcbd22", "marker": "*"})
        for key in bulk:
            bulk[key][r["system"]]["tokens_per_s"] = float(r["value"])
    for ax, ((batch, clients), by_system) in zip(axes[2:], sorted(bulk.items()), strict=True):
        names = [s for s in [*systems, *(r["system"] for r in offline)] if s in by_system]
        bar_panel(ax, names, by_system, style)
        ax.set_title(f"{bulk_label[(batch, clients)]}, {clients} clients", fontsize=10)

    fig.suptitle(f"{model} over HTTP (POST /v1/embeddings), {doc.get('suite', '')} suite")
    fig.text(0.5, 0.01, caption(doc, path), ha="center", fontsize=9, color="#333333")
    fig.tight_layout(rect=(0, 0.04, 1, 0.95))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)


def line_panel(fig: Any, ax: Any, metric: str, label: str, single: Single, systems: list[str],
               style: dict[str, Any]) -> None:  # fmt: skip
    """One metric against concurrent clients, a line per system, values labelled."""
    from matplotlib.ticker import (
        FixedLocator,
        FuncFormatter,
        LogLocator,
        NullFormatter,
        NullLocator,
        ScalarFormatter,
    )

    levels = sorted({c for (s, m), v in single.items() for c in v})
    labels: dict[int, list[tuple[float, str]]] = defaultdict(list)
    for s in systems:
        points = sorted(single.get((s, metric), {}).items())
        if not points:
            continue
        xs, ys = zip(*points, strict=True)
        ax.plot(xs, ys, label=s, linewidth=2, markersize=7, **style[s])
        for x, y in points:
            labels[x].append((y, s))
    ax.set_xscale("log", base=2)
    ax.set_xlim(min(levels) / 1.35, max(levels) * 1.6)  # room for the value labels
    ax.xaxis.set_major_locator(FixedLocator(levels))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(ScalarFormatter())
    if metric == "p99_ms":
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
        low, high = ax.get_ylim()
        ax.set_ylim(low / 1.3, high * 1.5)
    else:
        ax.set_ylim(bottom=0, top=ax.get_ylim()[1] * 1.1)
    fig.canvas.draw()  # the scales and limits are final: place the value labels
    for x, items in labels.items():
        label_values(ax, x, items, style)
    ax.set_xlabel("concurrent clients (one short query per request)")
    ax.set_ylabel(label)
    ax.grid(True, which="both", alpha=0.3)


def bar_panel(ax: Any, names: list[str], by_system: dict[str, dict[str, float]],
              style: dict[str, Any]) -> None:  # fmt: skip
    """Several inputs per request: a bar per system in tokens/s (or requests/s), annotated."""
    from matplotlib.ticker import FuncFormatter

    tokens = all("tokens_per_s" in by_system[s] for s in names)
    metric = "tokens_per_s" if tokens else "requests_per_s"
    values = [by_system[s][metric] for s in names]
    bars = ax.bar(range(len(names)), values, color=[style[s]["color"] for s in names], width=0.6)
    for bar, s in zip(bars, names, strict=True):
        m = by_system[s]
        text = f"{m['tokens_per_s']:,.0f} tok/s" if tokens else ""
        if "requests_per_s" in m:
            text += f"\n{m['requests_per_s']:.2f} req/s"
        if "p99_ms" in m:
            text += f"\np99 {m['p99_ms'] / 1000:.2f} s"
        if "requests_per_s" not in m:
            text += "\n(in process)"
        ax.annotate(
            text,
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            textcoords="offset points",
            xytext=(0, 4),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    wrapped = [
        s.replace(" + ", "\n+ ").replace(" encode", "\nencode").replace(" (", "\n(") for s in names
    ]
    ax.set_xticks(range(len(names)), wrapped, fontsize=8)
    if tokens:
        big = max(values) >= 1e6
        ax.yaxis.set_major_formatter(
            FuncFormatter(lambda v, _, big=big: f"{v / 1e6:g}M" if big else f"{v / 1e3:g}k")
        )
    ax.set_ylim(0, max(values) * 1.45)
    ax.set_ylabel(f"{'tokens' if tokens else 'requests'}/s (higher is better)")
    ax.grid(True, axis="y", alpha=0.3)


def latency_figure(doc: dict[str, Any], path: Path, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter

    records = [r for r in doc["records"] if r["metric"] == "p50_ms" and r.get("scope") == "offline"]
    if not records:
        raise SystemExit(f"{path}: no offline p50_ms records (suites/latency.py's) to draw")
    models = list(dict.fromkeys(r["model"] for r in records))
    systems = list(dict.fromkeys(r["system"] for r in records))
    style = {
        s: {"color": COLORS[i % len(COLORS)], "marker": MARKERS[i % len(MARKERS)]}
        for i, s in enumerate(systems)
    }
    fig, axes = plt.subplots(1, len(models), figsize=(6.2 * len(models), 5.0), squeeze=False)
    for ax, model in zip(axes[0], models, strict=True):
        mine = [r for r in records if r["model"] == model]
        lengths = sorted({int(r["tokens"]) for r in mine})
        for s in systems:
            points = sorted((int(r["tokens"]), float(r["value"])) for r in mine if r["system"] == s)
            if not points:
                continue
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, label=s, linewidth=2, markersize=6, **style[s])
            last_x, last_y = points[-1]
            ax.annotate(f"{last_y:.2f} ms", (last_x, last_y), textcoords="offset points",
                        xytext=(6, 0), va="center", fontsize=8, color=style[s]["color"])  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        # labels at the bucket-exact lengths only (the real ones sit just left of them)
        exact = [n for n in lengths if n & (n - 1) == 0] or lengths
        ax.xaxis.set_major_locator(FixedLocator(exact))
        ax.xaxis.set_minor_locator(FixedLocator([n for n in lengths if n not in exact]))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_xlim(min(lengths) / 1.2, max(lengths) * 2.2)  # room for the value labels
        ax.set_xlabel("tokens in the one text (ticks: bucket-exact; points left of them: real)")
        ax.set_ylabel("p50 latency per call, ms (lower is better)")
        ax.set_title(f"{model} ({mine[0].get('weights', '')} weights, {mine[0].get('dtype', '')})",
                     fontsize=10)  # fmt: skip
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(loc="center right", fontsize=9)
    fig.suptitle("One text per call, in process, tokenization included (latency suite)")
    fig.text(0.5, 0.01, caption(doc, path), ha="center", fontsize=9, color="#333333")
    fig.tight_layout(rect=(0, 0.04, 1, 0.95))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)


DRAW = {"concurrency": concurrency_figure, "latency": latency_figure}


def draw(files: list[Path], out: Path | None = None) -> None:
    """One figure per results file, into docs/<its name>.png or `out` (one file only)."""
    if out is not None and len(files) > 1:
        raise SystemExit("--out takes one input file")
    for path in files:
        doc = json.loads(path.read_text())
        suite = doc.get("suite")
        if suite not in DRAW:
            sys.exit(f"{path}: suite {suite!r} has no figure yet (known: {', '.join(DRAW)})")
        if not committed(path):
            print(f"note: {path} is not committed yet", file=sys.stderr)
        target = out or ROOT / "docs" / f"{path.stem}.png"
        DRAW[suite](doc, path, target)
        print(f"wrote {target}")
