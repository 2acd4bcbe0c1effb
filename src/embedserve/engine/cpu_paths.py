"""The CPU's float32 executors, and the start-up choice between them by measurement.

A CPU without native bf16 (AVX2 Zen 2/3, Intel before Sapphire Rapids) runs float32. Three ways
to run the same weights (issue 39):

- **onnx**: the whole encoder in one ONNX Runtime session call (`onnx_encoder`), BERT family;
- **packed**: the eager forward with each weight prepacked once for oneDNN (`layers.linear`);
- **eager**: the eager forward through `F.linear`: the reference every other is checked against.

Which is fastest depends on the CPU (its vector width, its caches, how oneDNN and MLAS block for
it) and on the batch: on an AVX2 Zen 3 the choice took ONNX Runtime (the fastest on a short
query), which then ran a 500-passage corpus at 5.8 texts/s where eager ran 11.9
(`latency-cpu2-avx2-peers-20261203-3`). So the engine measures the available paths at start-up
on batches from one short query to a few passages, in turn (a shared machine's speed drifts),
holds each to the float32 fidelity guard (cosine >= `MIN_COSINE` to the eager reference on the
guard's probes; one that fails is dropped, the next one stands) and keeps the fastest
(`choose`), or, where ONNX Runtime wins the small batches and a torch path the large ones, both
(`cpu_executors.SizeSplit`: batches up to a measured number of tokens through ONNX Runtime, larger ones
through the torch path). A sparse or multi-vector model serves per-token hidden rows through its
heads, not the pooled CLS row: each path's outputs are held to the guard too (`TokenOutputs`), as
a document and as a query (whose expansion tokens a ColBERT folder may hide from the others'
attention, which ONNX Runtime's graph cannot). The choice is remembered per machine and model folder in the user's
cache, so a later start only checks it. An explicit path (`cpu_path=`, `--cpu-path`) is served
as asked, still checked. The choice is printed in the server's ready line and exported in its
metrics.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from embedserve.engine.batch import PackedBatch
from embedserve.engine.cpu_executors import SizeSplit
from embedserve.engine.cpu_timing import (
    QUERY_TOKENS,
    TIMING_SHAPES,
    Neighbours,
    Run,
    measure,
)
from embedserve.engine.fidelity import (
    FidelityError,
    Probe,
    check_fidelity,
    check_outputs_fidelity,
)
from embedserve.engine.layers.linear import Linear, can_pack_fp32
from embedserve.engine.models.base import PackedEncoder
from embedserve.loading import cache_root
from embedserve.loading.spec import ModelSpec

if TYPE_CHECKING:
    from embedserve.engine.retrieval import BatchOutputs

log = logging.getLogger(__name__)

# the order they are tried in: a path that fails the guard hands over to the next one
PATHS = ("onnx", "packed", "eager")
# a float32 path's least cosine to the eager float32 reference (the guard)
MIN_COSINE = 0.99999

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
    passages_ms: float  # the median of the passage batch's steps
    cosine: float  # least cosine to the eager reference over the guard's probes
    # the median step of each of `TIMING_SHAPES`' batches (the first and last are the above)
    by_shape: tuple[float, ...] = ()


@dataclass
class CpuChoice:
    """What the engine chose and why: every path measured, every path dropped with the reason."""

    path: str
    measured: list[PathTiming] = field(default_factory=list)
    dropped: dict[str, str] = field(default_factory=dict)
    cosine: float | None = None  # the served path's least cosine to the eager reference
    remembered: bool = False  # the path this machine measured fastest at an earlier start
    seconds: float = 0.0  # spent choosing (building, checking and timing the paths)
    # a split ("onnx+packed", "onnx+eager"): the most tokens of a batch ONNX Runtime runs
    split_tokens: int | None = None
    # the cores other processes kept busy while the paths were timed, when over
    # `cpu_timing.CONTENDED_CORES` (the choice is then not remembered)
    contended_cores: float | None = None

    @property
    def name(self) -> str:
        """What is remembered: the path, and a split's point ("onnx+packed@192")."""
        return self.path if self.split_tokens is None else f"{self.path}@{self.split_tokens}"

    def describe(self) -> str:
        """One line: "onnx (query / 16 queries / 4 passages ms: onnx 3.05 / 9.1 / 61.2; ...)"."""
        where = "" if self.split_tokens is None else f" onnx up to {self.split_tokens} tokens,"
        if self.remembered:
            return f"{self.path} ({where} measured fastest at an earlier start, checked in {self.seconds:.1f} s)"
        parts = [f"{t.path} " + " / ".join(f"{ms:.2f}" for ms in t.by_shape) for t in self.measured]
        dropped = [f"{p}: {why}" for p, why in self.dropped.items()]
        inner = "; ".join(parts + dropped)
        shapes = " / ".join(_shape_name(shape) for shape in TIMING_SHAPES)
        return f"{self.path} ({where} {shapes} ms: {inner}; chosen in {self.seconds:.1f} s)"


def _shape_name(shape: tuple[int, ...]) -> str:
    if shape == (QUERY_TOKENS,):
        return "query"
    return f"{len(shape)} " + ("queries" if set(shape) == {QUERY_TOKENS} else "passages")


def available(model: PackedEncoder) -> list[str]:
    """The paths `model` can take here, in `PATHS` order."""
    from embedserve.engine import onnx_graph

    can = {"onnx": onnx_graph.supports(model), "packed": can_pack_fp32(), "eager": True}
    return [p for p in PATHS if can[p]]


def choose(
    model: PackedEncoder,
    folder: str,
    run: Run,
    probes: list[Probe],
    timing: tuple[PackedBatch, ...],
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
    if earlier is not None and set(plan(earlier)[0]) <= set(available(model)):
        try:
            served, choice = _choose(model, folder, run, probes, timing, earlier, outputs)
        except FidelityError:
            pass  # measured again below
        else:
            choice.remembered = True
            return served, choice
    served, choice = _choose(model, folder, run, probes, timing, None, outputs)
    if choice.contended_cores is None:
        remember(key, choice.name)
    else:  # not this machine's quiet figure: measured again at the next start
        log.warning(
            "cpu path %s measured while other processes kept %.1f cores busy: not remembered",
            choice.name,
            choice.contended_cores,
        )
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
    return cache_root() / "cpu-paths.json"


def plan(name: str) -> tuple[list[str], int | None]:
    """A choice's paths and split point: "packed" -> (["packed"], None), "onnx+packed@192" ->
    (["onnx", "packed"], 192); ValueError for anything else."""
    paths, _, tokens = name.partition("@")
    parts = paths.split("+")
    if not set(parts) <= set(PATHS) or (len(parts) == 2) != bool(tokens) or len(parts) > 2:
        raise ValueError(f"no cpu path {name!r}")
    if tokens and (parts[0] != "onnx" or parts[1] == "onnx" or not tokens.isdigit()):
        raise ValueError(f"no cpu path {name!r}")
    return parts, int(tokens) if tokens else None


def remembered(key: str) -> str | None:
    """The choice made under `key` before (`CpuChoice.name`), if any (an unreadable file or
    an unknown name counts as none)."""
    try:
        got = json.loads(_choices_file().read_text()).get(key)
        plan(got)
    except (OSError, ValueError, AttributeError, TypeError):
        return None
    return str(got)


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
    timing: tuple[PackedBatch, ...],
    asked: str | None,
    outputs: TokenOutputs | None,
) -> tuple[nn.Module, CpuChoice]:
    start = time.perf_counter()
    paths = plan(asked)[0] if asked else available(model)
    expected = {id(p.batch): run(model, p.batch) for p in probes}  # the eager reference's rows
    served: Served = {}  # and its outputs, when it has any
    if outputs is not None:
        served = {(id(p.batch), q): outputs.run(model, p.batch, q) for p in probes
                  for q in (False, True)}  # fmt: skip
    choice = CpuChoice(path="eager")
    built: dict[str, nn.Module] = {}
    cosines: dict[str, float] = {}
    for path in sorted(paths, key=lambda p: p != "eager"):  # eager first: packing mutates `model`
        candidate = _built(path, model, folder, choice, asked is not None)
        if candidate is None:
            continue
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
    if asked:
        choice.path, choice.split_tokens = asked.partition("@")[0], plan(asked)[1]
    else:
        with Neighbours() as neighbours:
            ms = measure(built, run, timing, lambda path: _use_packed(model, path == "packed"))
        choice.contended_cores = neighbours.cores if neighbours.contended else None
        choice.measured = [PathTiming(p, t[0], t[-1], cosines[p], t) for p, t in ms.items()]
        choice.path, choice.split_tokens = _fastest_plan(choice.measured)
    parts = choice.path.split("+")
    choice.cosine = min(cosines[p] for p in parts)
    for layer in _linears(model):
        if "packed" in parts:
            layer.use_packed(True)
            layer.drop_weight()  # the packed copy alone from now on
        else:
            layer.forget_packed()
    choice.seconds = time.perf_counter() - start
    if choice.split_tokens is None:
        return built[choice.path], choice
    return SizeSplit(built["onnx"], built[parts[1]], choice.split_tokens), choice


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
    least."""
    best_q = min(t.query_ms for t in measured)
    best_p = min(t.passages_ms for t in measured)
    return min(measured, key=lambda t: (t.query_ms / best_q) * (t.passages_ms / best_p)).path


def _fastest_plan(measured: list[PathTiming]) -> tuple[str, int | None]:
    """`_fastest`'s path, or a split where that scores better: ONNX Runtime up to the largest
    timed batch it still runs faster than the torch path of the fastest passages (every
    smaller one too), that path above. (path, split tokens or None)."""
    single = _fastest(measured)
    by_path = {t.path: t for t in measured}
    torch_paths = [t for t in measured if t.path != "onnx"]
    if "onnx" not in by_path or not torch_paths:
        return single, None
    onnx, large = by_path["onnx"], min(torch_paths, key=lambda t: t.passages_ms)
    tokens = 0
    for shape, small_ms, large_ms in zip(TIMING_SHAPES, onnx.by_shape, large.by_shape, strict=True):
        if small_ms >= large_ms:
            break
        tokens = sum(shape)
    if tokens == 0 or tokens == sum(TIMING_SHAPES[-1]):
        return single, None  # one path wins every batch, or ONNX Runtime does
    best_q = min(t.query_ms for t in measured)
    best_p = min(t.passages_ms for t in measured)
    single_t = by_path[single]
    split_score = (onnx.query_ms / best_q) * (large.passages_ms / best_p)
    if split_score >= (single_t.query_ms / best_q) * (single_t.passages_ms / best_p):
        return single, None
    return f"onnx+{large.path}", tokens


def _built(
    path: str, model: PackedEncoder, folder: str, choice: CpuChoice, asked: bool
) -> nn.Module | None:
    """`path`'s module, or None (the reason in `choice.dropped`) when it cannot be built and
    another path can serve. NOTE: a read-only or full cache, an onnx whose IR this onnxruntime
    cannot load, a half-deleted cache: the next path serves, as when a path fails the guard."""
    try:
        return _build(path, model, folder)
    except Exception as err:  # onnx and onnxruntime raise types of their own
        if asked or path == "eager":
            raise
        log.warning("cpu path %s could not be built, the next path serves: %s", path, err)
        choice.dropped[path] = f"not built: {type(err).__name__}: {err}"
        return None


def _build(path: str, model: PackedEncoder, folder: str) -> nn.Module:
    if path == "onnx":
        from pathlib import Path

        from embedserve.engine.onnx_encoder import OnnxEncoder

        return OnnxEncoder(model, Path(folder), torch.get_num_threads())
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
