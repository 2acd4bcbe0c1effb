"""The CPU's float32 executors, and the start-up choice between them by measurement.

A CPU without native bf16 (AVX2 Zen 2/3, Intel before Sapphire Rapids) runs float32. Three ways
to run the same weights (issue 39):

- **onnx**: the whole encoder in one ONNX Runtime session call (`onnx_encoder`), BERT family;
- **packed**: the eager forward with each weight prepacked once for oneDNN (`layers.linear`);
- **eager**: the eager forward through `F.linear`: the reference every other is checked against.

Which is fastest depends on the CPU (its vector width, its caches, how oneDNN and MLAS block for
it), so the engine measures the available ones at start-up on one short query and a few
passages, the paths in turn (a shared machine's speed drifts), holds each to the float32
fidelity guard (cosine >= `MIN_COSINE` to the eager reference on the guard's probes; one that
fails is dropped, the next one stands) and keeps the fastest (`choose`). A sparse or multi-vector
model serves per-token hidden rows through its heads, not the pooled CLS row: each path's outputs
are held to the guard too (`TokenOutputs`), as a document and as a query (whose expansion tokens
a ColBERT folder may hide from the others' attention, which ONNX Runtime's graph cannot). The choice is
remembered per machine and model folder in the user's cache, so a later start only checks it.
An explicit path (`cpu_path=`, `--cpu-path`) is served as asked, still checked. The choice is
printed in the server's ready line and exported in its metrics.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from embedserve.engine.batch import PackedBatch
from embedserve.engine.fidelity import (
    FidelityError,
    Probe,
    check_fidelity,
    check_outputs_fidelity,
)
from embedserve.engine.layers.linear import Linear, can_pack_fp32
from embedserve.engine.models.base import PackedEncoder
from embedserve.loading.spec import ModelSpec

if TYPE_CHECKING:
    from embedserve.engine.retrieval import BatchOutputs

log = logging.getLogger(__name__)

# the order they are tried in: a path that fails the guard hands over to the next one
PATHS = ("onnx", "packed", "eager")
# a float32 path's least cosine to the eager float32 reference (the guard)
MIN_COSINE = 0.99999
# what the choice is timed on: one short query, and a few passages (one batch)
QUERY_TOKENS = 12
PASSAGE_TOKENS = (160, 128, 96, 64)
# rounds of the paths in turn, each round one passage batch and `QUERY_CALLS` short queries each
ROUNDS, QUERY_CALLS = 3, 8
SEED = 39

Run = Callable[[nn.Module, PackedBatch], np.ndarray]  # the engine's step on a given model
Served = dict[tuple[int, bool], "BatchOutputs"]  # the reference's outputs by (batch, as a query)


@dataclass(frozen=True)
class TokenOutputs:
    """What a sparse or multi-vector model serves, for the guard: `run(model, batch, query)`,
    the engine's `encode_outputs` of every output on `model` (a query's keys as `query_keys`
    hides them), and the vocabulary (a sparse vector's width)."""

    run: Callable[[nn.Module, PackedBatch, bool], BatchOutputs]
    vocab_size: int


def query_keys(spec: ModelSpec, batch: PackedBatch) -> tuple[int, ...] | None:
    """The keys a query of `spec` attends to in the guard's `batch`: each sequence's last
    quarter hidden, as a ColBERT folder that does not attend to its query expansion hides those
    tokens (`visible_keys`); None (every key) for any other model."""
    colbert = spec.retrieval.colbert if spec.retrieval is not None else None
    if colbert is None or not colbert.expansion or colbert.attend_to_expansion:
        return None
    return tuple(max(1, n - n // 4) for n in batch.seqlens.tolist())


@dataclass(frozen=True)
class PathTiming:
    path: str
    query_ms: float  # p50 of one short query's step
    passages_ms: float  # the faster of the passage batch's steps
    cosine: float  # least cosine to the eager reference over the guard's probes


@dataclass
class CpuChoice:
    """What the engine chose and why: every path measured, every path dropped with the reason."""

    path: str
    measured: list[PathTiming] = field(default_factory=list)
    dropped: dict[str, str] = field(default_factory=dict)
    cosine: float | None = None  # the served path's least cosine to the eager reference
    remembered: bool = False  # the path this machine measured fastest at an earlier start
    seconds: float = 0.0  # spent choosing (building, checking and timing the paths)

    def describe(self) -> str:
        """One line: "onnx (query 3.05 ms, 4 passages 61.2 ms; packed 4.10 / 70.3; ...)"."""
        if self.remembered:
            return f"{self.path} (measured fastest at an earlier start, checked in {self.seconds:.1f} s)"
        parts = [f"{t.path} {t.query_ms:.2f} / {t.passages_ms:.1f}" for t in self.measured]
        dropped = [f"{p}: {why}" for p, why in self.dropped.items()]
        inner = "; ".join(parts + dropped)
        return (
            f"{self.path} (query / {len(PASSAGE_TOKENS)} passages ms: {inner}; "
            f"chosen in {self.seconds:.1f} s)"
        )


class OneTorchThread:
    """A forward's torch operators on one thread, while ONNX Runtime runs the encoder on its own:
    what is left to torch (pooling, heads) is a few small operators, and on 2 cores PyTorch's
    second OpenMP thread waits for a core that ONNX Runtime's threads hold (one query's pooling
    `index_add_` 4-6 ms at two threads, 0.1 ms at one, a loaded Zen 3). Reusable."""

    def __enter__(self) -> None:
        self.threads = torch.get_num_threads()
        torch.set_num_threads(1)

    def __exit__(self, *exc: object) -> None:
        torch.set_num_threads(self.threads)


def forward_context(model: nn.Module) -> AbstractContextManager[Any]:
    """What a forward through `model` runs inside: `OneTorchThread` for the ONNX executor."""
    from embedserve.engine.onnx_encoder import OnnxEncoder

    return OneTorchThread() if isinstance(model, OnnxEncoder) else nullcontext()


def timing_batches(vocab_size: int, max_positions: int) -> tuple[PackedBatch, PackedBatch]:
    """(one short query, a few passages): fixed ids over the vocabulary, as the guard's probes."""
    rng = np.random.default_rng(SEED)

    def batch(lens: tuple[int, ...]) -> PackedBatch:
        seqs = [rng.integers(0, vocab_size, size=min(n, max_positions)).tolist() for n in lens]
        return PackedBatch.from_token_lists(seqs)

    return batch((QUERY_TOKENS,)), batch(PASSAGE_TOKENS)


def available(model: PackedEncoder) -> list[str]:
    """The paths `model` can take here, in `PATHS` order."""
    from embedserve.engine import onnx_encoder

    can = {"onnx": onnx_encoder.supports(model), "packed": can_pack_fp32(), "eager": True}
    return [p for p in PATHS if can[p]]


def choose(
    model: PackedEncoder,
    folder: str,
    run: Run,
    probes: list[Probe],
    timing: tuple[PackedBatch, PackedBatch],
    asked: str | None = None,
    outputs: TokenOutputs | None = None,
) -> tuple[nn.Module, CpuChoice]:
    """The float32 executor to serve `model` (eager fp32, loaded from `folder`) with, and the
    record of the choice. `asked`: one path, served if it passes the guard (else FidelityError);
    None: the path this machine measured fastest for this folder before (`remembered`), checked,
    else every available path checked and timed, the fastest kept (`_fastest`) and
    remembered. `outputs`: a sparse or multi-vector model's, checked as well."""
    if asked is not None:
        return _choose(model, folder, run, probes, timing, asked, outputs)
    key = choice_key(folder)
    earlier = remembered(key)
    if earlier is not None and earlier in available(model):
        try:
            served, choice = _choose(model, folder, run, probes, timing, earlier, outputs)
        except FidelityError:
            pass  # measured again below
        else:
            choice.remembered = True
            return served, choice
    served, choice = _choose(model, folder, run, probes, timing, None, outputs)
    remember(key, choice.path)
    return served, choice


def choice_key(folder: str) -> str:
    """What a remembered choice holds for: the folder's weights (`onnx_encoder.cache_path`), the
    CPU (model name, flags), the threads and the libraries' versions."""
    import platform

    from embedserve.engine.cpu import _cpu_flags
    from embedserve.engine.onnx_encoder import cache_path

    try:
        import onnxruntime

        ort_version = onnxruntime.__version__
    except ImportError:
        ort_version = "none"
    cpu = platform.processor()
    with contextlib.suppress(OSError):
        text = Path("/proc/cpuinfo").read_text()
        cpu = next((ln for ln in text.splitlines() if ln.startswith("model name")), cpu)
    parts = [str(cache_path(Path(folder)).parent.name), cpu, " ".join(sorted(_cpu_flags())),
             str(torch.get_num_threads()), torch.__version__, ort_version]  # fmt: skip
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:24]


def _choices_file() -> Path:
    from embedserve.engine.onnx_encoder import cache_root

    return cache_root() / "cpu-paths.json"


def remembered(key: str) -> str | None:
    """The path chosen under `key` before, if any (an unreadable file counts as none)."""
    try:
        got = json.loads(_choices_file().read_text()).get(key)
    except (OSError, ValueError, AttributeError):
        return None
    return got if got in PATHS else None


def remember(key: str, path: str) -> None:
    """Keep `path` as the choice under `key` (written atomically; a read-only cache is skipped)."""
    file = _choices_file()
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        try:
            kept = json.loads(file.read_text())
        except (OSError, ValueError):
            kept = {}
        kept = kept if isinstance(kept, dict) else {}
        kept[key] = path
        tmp = file.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(kept, indent=1))
        os.replace(tmp, file)
    except OSError as err:
        log.warning("cpu path not remembered (%s): measured again at the next start", err)


def _choose(
    model: PackedEncoder,
    folder: str,
    run: Run,
    probes: list[Probe],
    timing: tuple[PackedBatch, PackedBatch],
    asked: str | None,
    outputs: TokenOutputs | None,
) -> tuple[nn.Module, CpuChoice]:
    start = time.perf_counter()
    paths = [asked] if asked else available(model)
    expected = {id(p.batch): run(model, p.batch) for p in probes}  # the eager reference's rows
    served: Served = {}  # and its outputs, when it has any
    if outputs is not None:
        served = {(id(p.batch), q): outputs.run(model, p.batch, q) for p in probes
                  for q in (False, True)}  # fmt: skip
    choice = CpuChoice(path="eager")
    built: dict[str, nn.Module] = {}
    cosines: dict[str, float] = {}
    for path in sorted(paths, key=lambda p: p != "eager"):  # eager first: packing mutates `model`
        candidate = _build(path, model, folder)
        try:
            cosines[path] = (
                1.0 if path == "eager"
                else _guard(candidate, run, expected, probes, outputs, served)
            )  # fmt: skip
        except FidelityError as err:
            for layer in _linears(model):
                layer.forget_packed()
            if asked:
                raise
            choice.dropped[path] = str(err).split(":", 1)[-1].strip()
            continue
        built[path] = candidate
    if not asked:
        choice.measured = _measure(built, model, run, timing, cosines)
    choice.path = asked or _fastest(choice.measured)
    choice.cosine = cosines[choice.path]
    for layer in _linears(model):
        if choice.path == "packed":
            layer.use_packed(True)
            layer.drop_weight()  # the packed copy alone from now on
        else:
            layer.forget_packed()
    choice.seconds = time.perf_counter() - start
    return built[choice.path], choice


def _guard(
    candidate: nn.Module,
    run: Run,
    expected: dict[int, np.ndarray],
    probes: list[Probe],
    outputs: TokenOutputs | None = None,
    served: Served | None = None,
) -> float:
    """The candidate's least cosine to the eager reference's rows (`expected`, by probe batch)
    over the guard's probes, and with `outputs` to its dense rows, sparse vectors and token
    vectors (`served`, by probe batch and side); FidelityError under `MIN_COSINE`."""

    def fast(batch: PackedBatch) -> np.ndarray:
        return run(candidate, batch)

    def reference(batch: PackedBatch) -> np.ndarray:
        return expected[id(batch)]

    worst = check_fidelity(fast, reference, probes, min_cosine=MIN_COSINE, runs=1)
    if outputs is None or served is None:
        return worst
    # the pooled CLS row says nothing of the other tokens' rows, which the heads serve
    for query in (False, True):
        named = [Probe(f"{p.name} as a query" if query else p.name, p.batch) for p in probes]
        worst = min(worst, check_outputs_fidelity(
            lambda b, q=query: outputs.run(candidate, b, q),  # type: ignore[misc]
            lambda b, q=query: served[(id(b), q)],  # type: ignore[misc]
            named, outputs.vocab_size, min_cosine=MIN_COSINE, runs=1,
        ))  # fmt: skip
    return worst


def _fastest(measured: list[PathTiming]) -> str:
    """The path whose query and passage times, each over the best of its column, multiply to the
    least: one path for every batch (two would keep two thread pools spinning on the cores)."""
    best_q = min(t.query_ms for t in measured)
    best_p = min(t.passages_ms for t in measured)
    return min(measured, key=lambda t: (t.query_ms / best_q) * (t.passages_ms / best_p)).path


def _build(path: str, model: PackedEncoder, folder: str) -> nn.Module:
    if path == "onnx":
        from pathlib import Path

        from embedserve.engine.onnx_encoder import OnnxEncoder, cache_path

        return OnnxEncoder(model, cache_path(Path(folder)), torch.get_num_threads())
    if path == "packed":
        for layer in _linears(model):
            layer.pack(keep_weight=True)  # unpacked again if another path wins
    elif path != "eager":
        raise ValueError(f"cpu path {path!r} is not one of {', '.join(PATHS)}")
    return model


def _use_packed(model: PackedEncoder, on: bool) -> None:
    """ "packed" and "eager" are one module: its linears on their packed weights or not."""
    for layer in _linears(model):
        layer.use_packed(on)


def _linears(model: nn.Module) -> list[Linear]:
    return [m for m in model.modules() if isinstance(m, Linear)]


def _measure(
    built: dict[str, nn.Module],
    model: PackedEncoder,
    run: Run,
    timing: tuple[PackedBatch, PackedBatch],
    cosines: dict[str, float],
) -> list[PathTiming]:
    """Each path's short-query p50 and passage-batch median, the paths timed in turn, round after
    round (a shared machine's speed drifts over seconds: each path samples the same ones)."""
    query, passages = timing
    times: dict[str, tuple[list[float], list[float]]] = {p: ([], []) for p in built}
    for round_ in range(ROUNDS):
        for path, candidate in built.items():
            _use_packed(model, path == "packed")
            for _ in range(3 if round_ == 0 else 1):  # the first calls warm up
                run(candidate, query)
            for _ in range(QUERY_CALLS):
                t = time.perf_counter()
                run(candidate, query)
                times[path][0].append(time.perf_counter() - t)
            if round_ == 0:
                run(candidate, passages)
            t = time.perf_counter()
            run(candidate, passages)
            times[path][1].append(time.perf_counter() - t)
    return [
        PathTiming(p, float(np.median(q)) * 1e3, float(np.median(b)) * 1e3, cosines[p])
        for p, (q, b) in times.items()
    ]
