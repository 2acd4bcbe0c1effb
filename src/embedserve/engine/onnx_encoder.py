"""An encoder run by ONNX Runtime on the CPU (the families `onnx_graph` writes): one session call
per forward.

Eager PyTorch pays a dispatch for each of a forward's ~130 operators, and its small-row products
run 2-4x below the CPU's matrix rate (issue 39: a [12 x 384] x [384 x 1536] fp32 product took
286 us through `F.linear`, 178 us through oneDNN on a prepacked weight, 132 us as an ONNX Runtime
MatMul+Add on an AVX2 Zen 3). ONNX Runtime runs the whole graph in C++ with its MLAS products.

The graph is written from the engine's own loaded weights (`onnx_graph`), saved once per model
folder under the cache (`cache_path`), keyed by the folder's weight files, and loaded from there
on later starts. Writing one removes the graphs no key names any more (`prune_stale`).

The engine's batches are packed; the graph takes padded [B, L] rows: a lone sequence is one row
with no padding, several are grouped by length (`length_groups`) so that padding stays small.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import logging
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from embedserve.engine.attention import AttentionFn, RaggedLayout
from embedserve.engine.batch import PackedBatch
from embedserve.engine.models.base import PackedEncoder
from embedserve.engine.onnx_graph import GRAPH_VERSION, Graphed, write_graph
from embedserve.engine.pooler.pooling import pool_host
from embedserve.engine.retrieval import VisibleKeys
from embedserve.loading import cache_root
from embedserve.loading.spec import PoolingMethod

log = logging.getLogger(__name__)

# a group of sequences padded to its longest may hold at most this many padded tokens per real one
MAX_PADDING = 1.25
# tokens per session call (padded): past this a batch's groups are run one after another.
# NOTE: small calls keep a layer's activations in cache ([512, 1,536] fp32: 3 MB): 300 passages
# in 2,048-token batches on a 2-core Zen 2, 35.0 texts/s at 4,096, 36.0 at 1,024, 41.1 at 512,
# 39.0 at 256 (45.2 / 40.6 at 512 / 4,096 with the batches sorted by length; ad-hoc probe)
MAX_GROUP_TOKENS = 512
# a forward whose longest sequence passes this runs through the torch module instead: ONNX
# Runtime's attention holds every head's [L, L] scores (a 32k-token Qwen3 text: 16 x 32k^2 fp32,
# 64 GiB), the torch path's CPU attention does not (BERT's family never reaches it: 512 at most).
# NOTE: at 2,048, 16 heads' scores are 256 MiB; ONNX Runtime was still the faster there
# (nomic-embed-text-v1.5's config on a 2-core Zen 2, one text of ~500 / 1,000 / 2,000 tokens:
# 705 / 1,624 / 3,843 ms against packed 862 / 1,903 / 4,301; ad hoc)
LONGEST_ROW = 2048
SOURCE = "source.json"  # beside each graph: the folder it was written from, for `prune_stale`


def _versions() -> str:
    """The writer's and the runner's versions: a graph one onnx wrote that this onnxruntime
    cannot load must not be found again under the same key after either is changed."""
    from importlib.metadata import PackageNotFoundError, version

    found = []
    for name in ("onnx", "onnxruntime"):
        try:
            found.append(f"{name}={version(name)}")
        except PackageNotFoundError:
            found.append(f"{name}=none")
    return ",".join(found)


def cache_path(folder: Path, cache_dir: Path | None = None) -> Path:
    """Where the graph of the model in `folder` is kept: keyed by the folder's resolved path, its
    `config.json`, its weight files' names, sizes and modification times (a changed checkpoint
    writes anew) and the onnx / onnxruntime versions. OSError where the folder cannot be read
    (a weight file behind a broken link)."""
    folder = folder.resolve()
    h = hashlib.sha256(f"{GRAPH_VERSION}|{_versions()}|{folder}".encode())
    config = folder / "config.json"
    if config.is_file():
        h.update(hashlib.sha256(config.read_bytes()).digest())
    for f in sorted(folder.glob("*.safetensors")) + sorted(folder.glob("*.bin")):
        st = f.stat()
        h.update(f"|{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return (cache_dir or cache_root() / "onnx") / h.hexdigest()[:24] / "model.onnx"


def prune_stale(root: Path) -> int:
    """Remove the graphs under `root` that no key of today names: their folder is gone or cannot
    be read, or its weights, config or `GRAPH_VERSION` changed (each new checkpoint in a folder
    would otherwise keep the old graph: Qwen3-0.6B's is 2.4 GB); and what a write killed midway
    left (`.tmp-*` folders, entries that never got their record) after `ABANDONED_S`. Whatever
    another process or the user removes meanwhile is skipped. Returns the bytes freed."""
    freed = 0
    try:
        entries = list(root.iterdir())
    except OSError:
        return 0
    for entry in entries:
        try:
            if _stale(entry, root):
                freed += sum(f.stat().st_size for f in entry.iterdir() if f.is_file())
                shutil.rmtree(entry, ignore_errors=True)
        except OSError:
            continue  # removed by another start meanwhile, or not ours to read
    return freed


# a write in progress is left alone for this long: no graph takes a day to write
ABANDONED_S = 24 * 3600


def _stale(entry: Path, root: Path) -> bool:
    if not entry.is_dir():
        return False
    try:
        folder = Path(json.loads((entry / SOURCE).read_text())["folder"])
    except FileNotFoundError:
        # being written (a `.tmp-*` folder, or a graph whose record comes next), or a write that
        # was killed: only the second is old
        return time.time() - entry.stat().st_mtime > ABANDONED_S
    except (OSError, ValueError, KeyError, TypeError):
        return False
    try:
        return not folder.is_dir() or cache_path(folder, root).parent != entry
    except OSError:
        return True  # the folder's weights cannot be read (a broken link): no start can use it


def _graph_file(model: Graphed, folder: Path) -> Path:
    """The graph's file: from the cache, written there first if missing; where the cache cannot
    be written (a read-only or full disk, `HOME=/nonexistent`), into a private folder that goes
    when the process ends. OSError if neither can be written."""
    path = cache_path(folder)
    if path.exists():
        return path
    try:
        write_graph(model, path)
        (path.parent / SOURCE).write_text(json.dumps({"folder": str(folder.resolve())}))
    except OSError as err:
        log.warning("ONNX graph not cached (%s): written for this process only", err)
        private = Path(tempfile.mkdtemp(prefix="embedserve-onnx-"))
        atexit.register(shutil.rmtree, private, True)
        path = private / path.name
        write_graph(model, path)
        return path
    if freed := prune_stale(path.parent.parent):
        log.info("removed stale ONNX graphs from %s: %.1f MB", path.parent.parent, freed / 1e6)
    return path


def length_groups(seqlens: Sequence[int]) -> list[list[int]]:
    """Sequence indices in groups run as one padded [B, L] call each: sorted by length, longest
    first, a group closed when padding to its longest would exceed `MAX_PADDING` times its real
    tokens or `MAX_GROUP_TOKENS` in all."""
    order = sorted(range(len(seqlens)), key=lambda i: -seqlens[i])
    groups: list[list[int]] = []
    real = 0
    for i in order:
        if groups:
            g = groups[-1]
            longest = seqlens[g[0]]
            padded = longest * (len(g) + 1)
            if padded <= MAX_PADDING * (real + seqlens[i]) and padded <= MAX_GROUP_TOKENS:
                g.append(i)
                real += seqlens[i]
                continue
        groups.append([i])
        real = seqlens[i]
    return groups


def session(path: Path, num_threads: int) -> Any:  # an onnxruntime.InferenceSession
    """A CPU session of a graph with the engine's settings: one call's operators in order on
    `num_threads` threads."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = num_threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # NOTE: ONNX Runtime's threads spin after a run; torch operators that follow it (a head,
    # per-token outputs) run on PyTorch's OpenMP threads, which then wait for a core (on 2
    # cores, 6 ms instead of microseconds for one query's pooling, measured on a loaded Zen 3)
    opts.add_session_config_entry("session.force_spinning_stop", "1")
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


class OnnxEncoder(nn.Module):
    """The model's forward (packed ids -> hidden [T, H] float32) through an ONNX Runtime session;
    a stand-in for the `PackedEncoder` it was written from. The graph holds its own attention:
    of the attention argument only a `VisibleKeys` limit is read, as the keys each row's
    `Attention` sees (its `lengths` input). A forward with a sequence over `LONGEST_ROW` tokens
    runs through the torch module it was written from, on the session's threads."""

    def __init__(self, model: PackedEncoder, folder: Path, num_threads: int) -> None:
        super().__init__()
        if not isinstance(model, Graphed):
            raise ValueError(f"no ONNX graph for {type(model).__name__}")
        path = _graph_file(model, folder)
        self.session = session(path, num_threads)
        # RoBERTa's table starts after the padding index; rotary positions start at 0
        self.position_offset = int(getattr(model.cfg, "position_offset", 0))
        self.path, self.num_threads = path, num_threads
        # not a submodule: its weights are the engine's own (packed or not), not this copy's
        self._torch = [model]
        # what the session's copy of the weights holds (it has no torch parameters to count)
        self.weight_bytes = sum(t.numel() * t.element_size() for t in model.parameters())

    def forward(
        self,
        input_ids: torch.Tensor,  # [T]
        positions: torch.Tensor,  # [T]
        token_type_ids: torch.Tensor,  # [T]
        layout: RaggedLayout,
        attend: AttentionFn,
    ) -> torch.Tensor:  # [T, H]
        seqlens = layout.seqlens
        if max(seqlens) > LONGEST_ROW:
            threads = torch.get_num_threads()  # one inside the engine's `OneTorchThread`
            torch.set_num_threads(self.num_threads)
            try:
                return self._torch[0](input_ids, positions, token_type_ids, layout, attend)
            finally:
                torch.set_num_threads(threads)
        # each row's attended keys: all its tokens, or a query expansion's leading ones
        keys = attend.visible if isinstance(attend, VisibleKeys) else seqlens
        ids, at, types = (t.numpy() for t in (input_ids, positions, token_type_ids))
        return torch.from_numpy(self._hidden(ids, at, types, seqlens, keys))

    def pooled(
        self, batch: PackedBatch, method: PoolingMethod, attend: AttentionFn
    ) -> np.ndarray | None:
        """The batch's pooled rows [S, H] float32 without a torch operator, the same bits as the
        torch path's (`pooling.pool_host`); None where that path must run (a sequence over
        `LONGEST_ROW`).

        NOTE: the run streams the weights through the caches, and every operator after it runs
        cold (~30 us each for torch's on a 2-core Zen 2): the torch path's ~15 operators around
        one short query's run cost 0.4-0.6 ms more than warm."""
        seqlens = batch.seqlens.tolist()
        if max(seqlens) > LONGEST_ROW or min(seqlens) == 0:
            return None
        keys = attend.visible if isinstance(attend, VisibleKeys) else seqlens
        hidden = self._hidden(batch.input_ids, batch.positions, batch.token_type_ids, seqlens, keys)
        return pool_host(hidden, batch.cu_seqlens, method)

    def _hidden(
        self,
        input_ids: np.ndarray,
        positions: np.ndarray,
        token_type_ids: np.ndarray,
        seqlens: Sequence[int],
        keys: Sequence[int],
    ) -> np.ndarray:  # [T, H] float32
        arrays = [input_ids, positions + self.position_offset, token_type_ids]
        if len(seqlens) == 1:  # a lone sequence: one row, nothing to pad
            return self._run([a[None] for a in arrays], np.array(keys, dtype=np.int32))[0]
        starts = np.concatenate([[0], np.cumsum(seqlens)])
        hidden = np.empty((len(input_ids), self.hidden_size), dtype=np.float32)
        for group in length_groups(seqlens):
            longest = seqlens[group[0]]
            padded = [np.zeros((len(group), longest), dtype=np.int64) for _ in arrays]
            for row, i in enumerate(group):
                for src, dst in zip(arrays, padded, strict=True):
                    dst[row, : seqlens[i]] = src[starts[i] : starts[i + 1]]
            lengths = np.array([keys[i] for i in group], dtype=np.int32)
            out = self._run(padded, lengths)
            for row, i in enumerate(group):
                hidden[starts[i] : starts[i + 1]] = out[row, : seqlens[i]]
        return hidden

    @property
    def hidden_size(self) -> int:
        return int(self.session.get_outputs()[0].shape[-1])

    def _run(self, arrays: list[np.ndarray], lengths: np.ndarray) -> np.ndarray:
        feed = dict(zip(("input_ids", "positions", "token_type_ids"), arrays, strict=True))
        feed["lengths"] = lengths
        return self.session.run(["hidden"], feed)[0]  # [B, L, H]
