"""NVIDIA AIPerf as a second load generator: `aiperf profile --endpoint-type embeddings` run as a
subprocess against an OpenAI-compatible `/v1/embeddings` server, its JSON export read back.

Standard library only: aiperf (PyPI `aiperf`, 0.13.0) and its own dependencies live in another
folder, `.carry/aiperf` installed to /tmp/aiperf on the GPU machine (benchmarks/peers/AIPERF.md,
benchmarks/peers/aiperf_wheels.sh), and are put on the subprocess's PYTHONPATH only.

The inputs go in as aiperf's `single_turn` custom dataset, one request a line: `{"text": q}` for
one text a request, `{"texts": [...]}` for a batch (the embeddings endpoint sends every text of
the line as one request's `input` list: 100 passages a request work), sent in file order and
again from the top when the file runs out. Streaming stays off (aiperf's default; embeddings do
not stream), as do its UI, server-metrics scraping and GPU telemetry.

Token counts (aiperf's input sequence length, input tokens/s) come from the tokenizer aiperf is
given, without special tokens: with MiniLM's folder, 2 a text fewer than the server's
`prompt_tokens` ([CLS], [SEP]; 6.6 against 8.6 for a short query). A local model folder is read
offline; `builtin` (tiktoken o200k_base) downloads its vocabulary on first use, so it fails with
no network.
With a local folder, HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE are removed from aiperf's environment:
aiperf 0.13.0 in offline mode looks every tokenizer name up in the Hub cache, a folder path too,
and fails (HFValidationError).

    from benchmarks.harness.aiperf_run import install_carried, run_aiperf
    install_carried()  # .carry/aiperf -> /tmp/aiperf, AIPERF_PATH set
    r = run_aiperf("http://127.0.0.1:8000", "minilm", queries, concurrency=16, duration_s=20,
                   out_dir=Path(out) / "aiperf", tokenizer=".carry/minilm-fp16")
    python3 benchmarks/harness/aiperf_run.py --url http://127.0.0.1:8123 --model minilm \\
        --tokenizer MODEL_DIR --concurrency 2 --duration 5 --out /tmp/aiperf-smoke
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

CARRIED = Path(".carry/aiperf")  # benchmarks/peers/aiperf_wheels.sh
TARGET = Path("/tmp/aiperf")
EXPORT = "profile_export_aiperf.json"


def install_carried(wheels: Path = CARRIED, target: Path = TARGET) -> Path | None:
    """Installs the carried wheels into `target` (once) and sets AIPERF_PATH to it. An earlier
    call's install on the same warm machine is used when this call carries no wheels; None when
    there is neither. The image's packages (numpy, transformers, rich, ...) are used as they are."""
    found = sorted(Path(wheels).glob("*.whl"))
    installed = (target / "aiperf" / "__init__.py").exists()
    if not found and not installed:
        return None
    if not installed:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                        "--no-compile", "--no-cache-dir", "--upgrade", "--target", str(target),
                        *map(str, found)], check=True)  # fmt: skip
    os.environ["AIPERF_PATH"] = str(target)
    return target


def aiperf_command(env: dict[str, str]) -> list[str]:
    """How aiperf is started: AIPERF_CMD (a command line, e.g. `aiperf` or `/venv/bin/python -m
    aiperf`), else this Python with AIPERF_PATH (a pip --target folder) first on PYTHONPATH, else
    `aiperf` on PATH, else this Python if it can import aiperf. Updates env's PYTHONPATH."""
    if env.get("AIPERF_CMD"):
        return shlex.split(env["AIPERF_CMD"])
    if env.get("AIPERF_PATH"):
        rest = env.get("PYTHONPATH")
        env["PYTHONPATH"] = env["AIPERF_PATH"] + (os.pathsep + rest if rest else "")
        return [sys.executable, "-m", "aiperf"]
    script = shutil.which("aiperf", path=env.get("PATH"))
    if script:
        return [script]
    if importlib.util.find_spec("aiperf") is not None:
        return [sys.executable, "-m", "aiperf"]
    raise FileNotFoundError(
        "aiperf not found: set AIPERF_CMD or AIPERF_PATH, or put `aiperf` on "
        "PATH (benchmarks/peers/AIPERF.md)"
    )


def write_inputs(
    path: Path, texts: Sequence[str] | Sequence[Sequence[str]], batch_size: int = 1
) -> list[int]:
    """aiperf's single_turn JSONL: one line per request. `texts` is either a list of strings (cut
    into requests of `batch_size`) or a list of batches (one request each). Returns the batch
    sizes, in file order."""
    if not texts:
        raise ValueError("no texts")
    if isinstance(texts[0], str):
        flat = list(texts)
        batches = [flat[i : i + batch_size] for i in range(0, len(flat), batch_size)]
    else:
        batches = [list(b) for b in texts]
    sizes = []
    with open(path, "w", encoding="utf-8") as f:
        for batch in batches:
            if not batch:
                raise ValueError("an empty batch")
            line = {"text": batch[0]} if len(batch) == 1 else {"texts": batch}
            f.write(json.dumps(line, ensure_ascii=False) + "\n")
            sizes.append(len(batch))
    return sizes


def base_url(url: str) -> str:
    """aiperf appends /v1/embeddings itself: strip it (or /v1) when given."""
    url = url.rstrip("/")
    for tail in ("/v1/embeddings", "/v1"):
        if url.endswith(tail):
            url = url[: -len(tail)]
    return url


def _stat(doc: dict[str, Any], name: str, key: str) -> float | None:
    value = doc.get(name, {}).get(key)
    return float(value) if value is not None else None


def parse_export(path: Path) -> dict[str, Any]:
    """The numbers kept from aiperf's JSON export (profile_export_aiperf.json): requests/s and
    `requests` (successful ones), request latency percentiles (ms, aiperf's own), input tokens/s
    and per request (aiperf's tokenizer), failed requests and their HTTP codes."""
    doc = json.loads(Path(path).read_text())
    codes: dict[str, int] = {}
    for e in doc.get("error_summary") or []:
        code = str((e.get("error_details") or {}).get("code"))
        codes[code] = codes.get(code, 0) + int(e.get("count", 0))
    errors = _stat(doc, "error_request_count", "avg")
    return {
        "aiperf_version": doc.get("aiperf_version"),
        "requests_per_s": _stat(doc, "request_throughput", "avg"),
        "p50_ms": _stat(doc, "request_latency", "p50"),
        "p90_ms": _stat(doc, "request_latency", "p90"),
        "p99_ms": _stat(doc, "request_latency", "p99"),
        "mean_ms": _stat(doc, "request_latency", "avg"),
        "max_ms": _stat(doc, "request_latency", "max"),
        "tokens_per_s": _stat(doc, "input_token_throughput", "avg"),  # input tokens, aiperf's count
        "tokens_per_request": _stat(doc, "input_sequence_length", "avg"),
        "requests": _stat(doc, "request_count", "avg"),
        "errors": int(errors) if errors is not None else sum(codes.values()),
        "error_codes": codes,  # HTTP status (or None) -> count
        "error_rate_pct": _stat(doc, "request_error_rate", "avg"),
        "duration_s": _stat(doc, "benchmark_duration", "avg"),
        "effective_concurrency": _stat(doc, "effective_concurrency", "avg"),
        "aiperf_cli": doc.get("run_info", {}).get("cli_command"),
    }


def run_aiperf(
    url: str,
    model: str,
    texts: Sequence[str] | Sequence[Sequence[str]],
    *,
    out_dir: Path,
    concurrency: int = 1,
    request_count: int | None = None,
    duration_s: float | None = None,
    batch_size: int = 1,
    tokenizer: str | None = None,
    warmup_requests: int = 0,
    workers_max: int | None = None,
    name: str = "aiperf",
    extra_args: Sequence[str] = (),
    timeout_s: float | None = None,
) -> dict[str, Any]:
    """One `aiperf profile` run: closed loop at `concurrency`, for `request_count` requests or
    `duration_s` seconds (or whichever ends first, both given). `texts`: see write_inputs. The
    inputs, aiperf's artifacts and its console output go under out_dir/name. `tokenizer`: a local
    model folder (default: `model` when that is a folder, else aiperf's `builtin`, which needs
    network). Returns parse_export's numbers plus the command line, texts per request and
    texts/s (when every request has the same number of texts). Raises RuntimeError when aiperf
    fails, with the end of its output."""
    if request_count is None and duration_s is None:
        raise ValueError("give request_count or duration_s")
    work = Path(out_dir) / name
    artifacts = work / "artifacts"
    if artifacts.exists():
        shutil.rmtree(artifacts)
    work.mkdir(parents=True, exist_ok=True)
    inputs = work / "inputs.jsonl"
    sizes = write_inputs(inputs, texts, batch_size)
    if tokenizer is None:
        tokenizer = model if Path(model).is_dir() else "builtin"
    env = dict(os.environ)
    if Path(tokenizer).is_dir():
        tokenizer = str(Path(tokenizer).resolve())
        env.pop("HF_HUB_OFFLINE", None)
        env.pop("TRANSFORMERS_OFFLINE", None)
    env.setdefault("COLUMNS", "160")  # aiperf's console tables, unwrapped in the log
    cmd = [*aiperf_command(env), "profile",
           "--model", model, "--url", base_url(url), "--endpoint-type", "embeddings",
           "--input-file", str(inputs.resolve()), "--custom-dataset-type", "single_turn",
           "--dataset-sampling-strategy", "sequential", "--random-seed", "0",
           "--tokenizer", tokenizer, "--concurrency", str(concurrency),
           "--artifact-dir", str(artifacts.resolve()), "--export-level", "summary",
           "--ui", "none", "--no-server-metrics", "--no-gpu-telemetry"]  # fmt: skip
    if request_count is not None:
        cmd += ["--request-count", str(request_count)]
    if duration_s is not None:
        cmd += ["--benchmark-duration", f"{duration_s:g}"]
    if warmup_requests:
        cmd += ["--warmup-request-count", str(warmup_requests)]
    if workers_max is not None:
        cmd += ["--workers-max", str(workers_max)]
    cmd += list(extra_args)
    if timeout_s is None:  # start-up ~10 s on 2 CPU cores, then the run and its 30 s grace
        timeout_s = 120 + (duration_s or 0) + (request_count or 0) / 50
    log = work / "aiperf_console.txt"
    start = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )  # its services: one process group
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            rc = None
        with contextlib.suppress(ProcessLookupError):  # any service left behind
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    wall = time.perf_counter() - start
    export = artifacts / EXPORT
    if rc != 0 or not export.exists():
        tail = log.read_text(errors="replace")[-3000:]
        why = "timed out" if rc is None else f"exited {rc}"
        raise RuntimeError(f"aiperf {why} after {wall:.0f} s ({shlex.join(cmd)}):\n{tail}")
    result = parse_export(export)
    uniform = len(set(sizes)) == 1
    rps = result["requests_per_s"]
    result.update(
        {
            "tool": "aiperf",
            "command": shlex.join(cmd),
            "concurrency": concurrency,
            "texts_per_request": sum(sizes) / len(sizes),
            "texts_per_s": rps * sizes[0] if uniform and rps is not None else None,
            "artifacts": str(artifacts),
            "wall_s": wall,
        }
    )
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--tokenizer")
    p.add_argument("--texts-file", help="one text a line (default: 64 short made-up queries)")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--duration", type=float)
    p.add_argument("--requests", type=int)
    p.add_argument("--workers-max", type=int)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    if a.texts_file:
        texts = [t for t in Path(a.texts_file).read_text().splitlines() if t.strip()]
    else:
        topics = [
            "rust borrow checker",
            "sourdough starter",
            "tide tables",
            "tax brackets",
            "lighthouse keepers",
            "jazz chords",
            "glacier retreat",
            "sql indexes",
        ]
        texts = [f"how do {topics[i % 8]} work {i}" for i in range(64)]
    install_carried()
    r = run_aiperf(
        a.url,
        a.model,
        texts,
        out_dir=a.out,
        concurrency=a.concurrency,
        request_count=a.requests,
        duration_s=a.duration,
        batch_size=a.batch_size,
        tokenizer=a.tokenizer,
        workers_max=a.workers_max,
    )
    print(json.dumps(r, indent=1))


if __name__ == "__main__":
    main()
