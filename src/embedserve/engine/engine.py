"""The engine: one model on one device, running packed batches.

`step()` launches a batch and returns a `LazyTensor` of pooled vectors without waiting for the
device; the head (truncate, normalize, encode) is applied per request by `outputs`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
from torch import nn

from embedserve.engine import cpu_paths, cpu_timing, prefix_fold
from embedserve.engine.attention import (
    CAPTURE_SAFE,
    AttentionFn,
    RaggedLayout,
    model_backend,
)
from embedserve.engine.batch import PackedBatch, check_spans
from embedserve.engine.choices import KernelChoices
from embedserve.engine.cpu_executors import forward_context, host_pooled
from embedserve.engine.eager import eager_run, engine_fidelity
from embedserve.engine.fidelity import FidelityError, make_probes
from embedserve.engine.graphs import GraphConfig, GraphRunner, graph_config
from embedserve.engine.grid_split import run_parts
from embedserve.engine.layers.linear import Linear, can_pack, pack_linears
from embedserve.engine.lazy import LazyTensor
from embedserve.engine.models import build_model
from embedserve.engine.models.base import PackedEncoder
from embedserve.engine.ops import EAGER_OPS, compile_limits, compiled_ops
from embedserve.engine.placement import DTYPES, resolve_device, resolve_dtype
from embedserve.engine.pooler.dense import build_dense
from embedserve.engine.pooler.score_heads import build_score_head
from embedserve.engine.pooler.spans import pool_spans
from embedserve.engine.retrieval import BatchOutputs, VisibleKeys, build_retrieval
from embedserve.engine.seam import EngineSeam, engine_seam
from embedserve.engine.stats import EngineStats
from embedserve.engine.weights import FolderWeights
from embedserve.loading.spec import ModelSpec, read_model_spec

log = logging.getLogger(__name__)

# NOTE: on the CPU, small batches win: at 16k tokens the [tokens, 1536] FFN activations fall out
# of cache and a 2-core run took 1.8x as long as at 2k (measured on all-MiniLM-L6-v2).
CPU_BATCH_TOKENS = 2048


class Engine:
    _threads_for = staticmethod(forward_context(None))  # a forward's torch threads, by its tokens
    # a batch's shared prefixes computed once (`prefix_fold`); off until the start-up checks,
    # which run the plain forward, are done (`_can_fold`)
    fold_prefixes = False

    def __init__(
        self,
        spec: ModelSpec,
        *,
        device: str | None = "auto",
        dtype: str | None = None,
        attention_backend: str | None = None,
        graphs: GraphConfig | bool | None = None,
        fuse: bool | None = None,
        fidelity: bool | None = None,
        cpu_path: str | None = None,
        epilogues: bool = True,
    ) -> None:
        """`graphs`, `fuse` and `fidelity` default to on with CUDA and off on the CPU. With `fuse`,
        `epilogues` lets a product and the chain after it run as one kernel where that measured
        faster (`ops.CHAINS`; off: two kernels, for A/B measurements). `graphs` may be a
        GraphConfig. `dtype` defaults to bf16 on CUDA and on a CPU with native bf16
        (`cpu.native_bf16`), else fp32; a CPU's default bf16 is held to the fidelity guard
        and falls back to fp32 if it fails. A CPU's default fp32 runs the fastest of the float32
        executors measured at start-up (`cpu_paths`); `cpu_path` names one ("onnx", "packed",
        "eager"; float32 only), an asked-for `dtype="float32"` alone runs the eager reference
        path, and with `cpu_path="auto"` the measured choice (on a bf16 CPU too).
        `attention_backend` names the attention kernel (`attention.BACKEND_NAMES`); by default
        the device's, and with graphs the fastest candidate per bucket."""
        self.spec = spec
        self.device = resolve_device(device)
        dtype_name, asked_path = resolve_dtype(self.device, dtype, cpu_path)
        self.dtype = DTYPES[dtype_name]
        self.vocab_size, self.max_positions = spec.vocab_size, spec.max_position_embeddings
        on_cuda = self.device.type == "cuda"
        self.stats = EngineStats()
        # NOTE: one step at a time: the graphs' static inputs, output buffers and staging ring
        # are shared by every caller, so two threads (an `Embedder` used from both) would read
        # each other's vectors. Held from staging to the queued copy-out of the result.
        self._lock = threading.Lock()
        # what this engine measured on its device: attention per bucket, GEMM kernel per shape,
        # whether cuDNN takes grouped heads; filled in as shapes are first seen
        self.choices = KernelChoices()
        # the named backend, else the family's own on CUDA (MPNet's padded), else the device's
        self.attend: AttentionFn = model_backend(spec.family_row, attention_backend, self.device,
                                                 self.choices)  # fmt: skip
        fused = on_cuda if fuse is None else fuse
        self._build_ops(fused, epilogues)  # the ops first: the model calls them for every chain
        # a CPU's bf16 chosen by default (not asked for) is checked, and may fall back to fp32
        cpu_default = not on_cuda and dtype is None and self.dtype != torch.float32
        check = (on_cuda or cpu_default) if fidelity is None else fidelity
        reference = self._build_modules(fused, check)
        self.runner = self._graph_runner(graphs, attention_backend)
        # the heads' hidden states through graphs of their own (`encode_outputs`)
        self.token_runner = self._token_runner(self.runner)
        self.fidelity_cosine: float | None = None
        if reference is not None:
            self.fidelity_cosine = self._check_fidelity(reference, fall_back=cpu_default)
        # a CPU's float32 by default or with "auto" (or a named executor): the fastest that
        # passes the guard (a default bf16 the guard refused serves eager fp32, as it says)
        self.cpu_choice: cpu_paths.CpuChoice | None = None
        chosen = dtype_name == "float32" and (dtype is None or cpu_path == "auto")
        if not (on_cuda or fused) and (asked_path or chosen):
            self._choose_cpu_path(cpu_path if asked_path else None)
        self.fold_prefixes = self._can_fold()

    def _can_fold(self) -> bool:
        """A causal model pooled by its last token, whose forward is torch's (ONNX Runtime's
        graph has its own attention), on the CPU: on a GPU a folded batch runs eagerly, not
        through its bucket's graph, unmeasured yet (`benchmarks/fold_gpu.sh`; set
        `fold_prefixes` to try it)."""
        return (
            self.device.type == "cpu"
            and self.spec.attention == "causal"
            and self.spec.pooling == "last"
            and self.retrieval is None
            and "onnx" not in (self.cpu_path or "").split("+")
        )

    def _build_ops(self, fused: bool, epilogues: bool) -> None:
        """The ops table the model computes through (compiled with `fused`, else eager), and
        what every forward runs inside: the compile limits (and `_threads_for`)."""
        self.ops = (
            compiled_ops(self.choices, self.stats, epilogues=epilogues) if fused else EAGER_OPS
        )
        self._around_forward: contextlib.AbstractContextManager[Any] = (
            compile_limits() if fused else contextlib.nullcontext()
        )

    def _build_modules(self, fused: bool, check: bool) -> PackedEncoder | None:
        """The forward (`model`: a `PackedEncoder` in this engine's dtype, or later the CPU
        executor standing in for it, `cpu_paths`), the heads, and with `check` the fidelity
        reference the forward is held to (fp32, eager ops): the folder read once for all
        (`weights.FolderWeights`), the reference on the same tensors as the model."""
        weights = FolderWeights(self.spec)
        reference = build_model(self.spec, EAGER_OPS, weights).to(self.device) if check else None
        model = build_model(self.spec, self.ops, weights)
        self.model: nn.Module = model.to(self.device, self.dtype)
        # a CPU's bf16 products on weights packed once for oneDNN, not reordered at every call
        # (`layers.linear`); how many layers, for the tests and the start-up line
        self.packed_linears = (
            pack_linears(self.model) if not fused and can_pack(self.device, self.dtype) else 0
        )
        self._build_heads(weights)
        return reference

    def _build_heads(self, weights: FolderWeights) -> None:
        """What follows the encoder, in float32 on the device: a scoring model's head after
        pooling (`pooler.score_heads`; None to embed), a sentence-transformers folder's Dense
        modules (None if none), and a sparse / multi-vector layout's heads (`retrieval`; None
        if dense only)."""
        self.score_head = _on(build_score_head(self.spec, weights), self.device)
        self.dense = _on(build_dense(self.spec, weights), self.device)
        # what follows pooling on the device: the Dense modules or the score head (never both)
        self.after_pooling = self.score_head if self.score_head is not None else self.dense
        self.retrieval = _on(build_retrieval(self.spec, weights), self.device)

    def _choose_cpu_path(self, asked: str | None) -> None:
        """Serve the float32 executor `cpu_paths.choose` picks (or `asked`), and say which."""
        model = self.model
        assert isinstance(model, PackedEncoder)
        # a sparse / multi-vector model serves per-token rows through its heads: checked too
        outputs = (
            cpu_paths.TokenOutputs(self._outputs_on, self.vocab_size) if self.retrieval else None
        )
        sizes, folder = (self.vocab_size, self.max_positions), str(self.spec.path)
        self.model, self.cpu_choice = cpu_paths.choose(
            model, folder, self._run_on, make_probes(*sizes), cpu_timing.timing_batches(*sizes),
            asked, outputs,
        )  # fmt: skip
        self._threads_for = forward_context(self.model)
        if "packed" in self.cpu_choice.path.split("+"):
            self.packed_linears = sum(isinstance(m, Linear) for m in model.modules())
        self.fidelity_cosine = self.cpu_choice.cosine
        log.info("cpu path: %s", self.cpu_choice.describe())

    @contextlib.contextmanager
    def _serving(self, model: nn.Module) -> Iterator[None]:
        """`model` in place of the served one (the start-up choice's checks and measurements)."""
        kept = self.model, self._threads_for
        self.model, self._threads_for = model, forward_context(model)
        try:
            yield
        finally:
            self.model, self._threads_for = kept

    def _run_on(self, model: nn.Module, batch: PackedBatch) -> np.ndarray:
        with self._serving(model):
            return self.step(batch).wait().copy()

    def _outputs_on(self, model: nn.Module, batch: PackedBatch, query: bool) -> BatchOutputs:
        assert self.retrieval is not None
        keys = cpu_paths.query_keys(self.spec, batch) if query else None
        with self._serving(model):
            return self.encode_outputs(batch, self.retrieval.spec.outputs, query=query,
                                       visible_keys=keys)  # fmt: skip

    @property
    def cpu_path(self) -> str | None:
        """How the CPU runs the forward: "onnx", "packed", "eager" or a split ("onnx+packed");
        None on CUDA."""
        if self.device.type != "cpu":
            return None
        if self.cpu_choice is not None:
            return self.cpu_choice.path
        return "packed" if self.packed_linears else "eager"

    def _graph_runner(
        self, graphs: GraphConfig | bool | None, attention_backend: str | None
    ) -> GraphRunner | None:
        """The CUDA-graph runner of this engine's forward, warmed up; None to run eagerly."""
        if graphs is None:
            # an explicitly named backend that a graph cannot hold (sdpa_loop) means eager
            graphs = self.device.type == "cuda" and (
                attention_backend in (None, "auto") or attention_backend in CAPTURE_SAFE
            )
        if graphs is False:
            return None
        config = graph_config(
            self.spec, graphs if isinstance(graphs, GraphConfig) else GraphConfig(),
            attention_backend,
        )  # fmt: skip
        runner = GraphRunner(self._forward, config=config, **self._runner_context())
        runner.warm_up()
        return runner

    def _token_runner(self, runner: GraphRunner | None) -> GraphRunner | None:
        """For a sparse or multi-vector model with graphs: the forward to hidden states, per
        bucket, sharing `runner`'s memory pool, configuration, counters and kernel choices (a
        bucket key both runners capture records the attention of the later capture); else
        None."""
        if runner is None or self.retrieval is None:
            return None
        tokens = GraphRunner(self._hidden, config=runner.config, make_graph=runner.make_graph,
                             per_token=True, **self._runner_context())  # fmt: skip
        tokens.warm_up()
        return tokens

    def _runner_context(self) -> dict[str, Any]:
        """What both graph runners share of this engine (device, counters, kernel choices)."""
        return {"device": self.device, "stats": self.stats, "choices": self.choices,
                "max_positions": self.spec.max_position_embeddings}  # fmt: skip

    @classmethod
    def from_folder(
        cls,
        folder: str | Path,
        *,
        pooling: str | None = None,
        attention: str | None = None,
        **kwargs: Any,
    ) -> Engine:
        """`pooling` and `attention` ("causal" | "bidirectional") override the folder's; the
        other keywords go to `Engine` (`attention_backend` names the attention kernel)."""
        spec = read_model_spec(folder, pooling=pooling, attention=attention)
        return cls(spec, **kwargs)

    def _check_fidelity(self, reference: PackedEncoder, *, fall_back: bool) -> float | None:
        """The guard's least cosine against `reference` (the eager fp32 model,
        `eager.engine_fidelity`). When it fails: raise, or with `fall_back` serve the reference
        itself (None: nothing left to check)."""
        try:
            return engine_fidelity(self, reference)
        except FidelityError as err:
            if not fall_back:
                raise
            log.warning("%s: %s; serving float32, the reference, instead", self.dtype_name, err)
            self.model, self.dtype = reference, torch.float32
            return None

    def seam(self) -> EngineSeam:
        """What a server needs of this engine, in one record (`engine.seam`)."""
        return engine_seam(self)

    @property
    def dtype_name(self) -> str:
        """The dtype the model runs in, as `--dtype` names it ("bfloat16", "float32")."""
        return str(self.dtype).removeprefix("torch.")

    @property
    def batch_tokens(self) -> int:
        """Tokens per batch this engine runs best: on CUDA its largest captured bucket (a larger
        batch would run eagerly, without a graph), on the CPU `CPU_BATCH_TOKENS`."""
        return self.runner.config.max_tokens if self.runner is not None else CPU_BATCH_TOKENS

    @property
    def hidden_size(self) -> int:
        return self.spec.hidden_size

    @property
    def output_width(self) -> int:
        """Columns of each row `step()` returns: the hidden size, or 1 for a scoring model."""
        return self.spec.output_width

    def check(self, batch: PackedBatch) -> None:
        """Reject a batch the model cannot run, before it reaches the device.

        NOTE: an out-of-range id on CUDA is a device-side assert that kills the process, so this
        check is what keeps one bad request from taking the server down.
        """
        if batch.num_tokens and (
            int(batch.input_ids.min()) < 0 or int(batch.input_ids.max()) >= self.vocab_size
        ):
            raise ValueError(f"token ids must be in [0, {self.vocab_size})")
        if batch.max_seqlen > self.max_positions:
            raise ValueError(
                f"a sequence of {batch.max_seqlen} tokens exceeds the model's "
                f"{self.max_positions} positions"
            )
        if int(batch.token_type_ids.max(initial=0)) >= self.spec.type_vocab_size:
            raise ValueError(f"token type ids must be below {self.spec.type_vocab_size}")

    def _forward(
        self,
        input_ids: torch.Tensor,  # [T]
        positions: torch.Tensor,  # [T]
        token_type_ids: torch.Tensor,  # [T]
        seq_ids: torch.Tensor,  # [T]
        layout: RaggedLayout,
        attend: AttentionFn,
    ) -> torch.Tensor:  # [S, H] float32
        with self._around_forward, self._threads_for(len(input_ids)):
            hidden = self.model(input_ids, positions, token_type_ids, layout, attend)
            pooled = self.ops.pool(hidden, layout.cu_seqlens, seq_ids, self.spec.pooling)
            return pooled if self.after_pooling is None else self.after_pooling(pooled)

    def _hidden(
        self,
        input_ids: torch.Tensor,  # [T]
        positions: torch.Tensor,  # [T]
        token_type_ids: torch.Tensor,  # [T]
        seq_ids: torch.Tensor,  # [T], unused: no pooling
        layout: RaggedLayout,
        attend: AttentionFn,
    ) -> torch.Tensor:  # [T, H]: the forward without pooling
        with self._around_forward, self._threads_for(len(input_ids)):
            return self.model(input_ids, positions, token_type_ids, layout, attend)

    def step(self, batch: PackedBatch) -> LazyTensor:
        """Run one packed batch; pooled float32 rows [S, H] (a scoring model: raw scores [S, 1])
        arrive in the handle. With CUDA the batch is padded to a bucket, its graph replayed
        (`graphs`) and the copy to the host queued behind it: this returns without waiting."""
        self.check(batch)
        pooling, attend = self.spec.pooling, self.attend
        with self._lock:
            fold = prefix_fold.plan(batch) if self.fold_prefixes else None
            if fold is not None:  # eagerly: a folded packing is no bucket's
                tokens = len(fold.input_ids)
                with torch.inference_mode(), self._around_forward, self._threads_for(tokens):
                    folded = prefix_fold.run(fold, self.model, self.device, self.after_pooling)
                    return LazyTensor.from_device(folded)
            if self.runner is None:  # ONNX Runtime's rows pooled on the host: no torch at all
                rows = host_pooled(self.model, batch, pooling, attend, self.after_pooling)
                if rows is not None:
                    return LazyTensor(rows)
            with torch.inference_mode():
                if self.runner is None:
                    out = eager_run(self._forward, batch, self.device, attend)
                elif (pooled := self.runner.run(batch)) is not None:
                    out = pooled
                else:
                    out = run_parts(batch, self.runner, self._forward, attend)
                return LazyTensor.from_device(out)

    @torch.inference_mode()
    def embed_spans(self, batch: PackedBatch, spans: np.ndarray) -> np.ndarray:
        """Late chunking: run `batch` through the model and mean-pool (fp32) each span.

        `spans` is [K, 2] int64 `[start, end)` into the packed tokens, each inside one sequence
        (they may overlap); returns [K, H] float32. Runs eagerly, outside the graphs: documents
        are long and few, so launches do not dominate. Waits for the device.
        """
        if self.score_head is not None:
            raise ValueError("a scoring model does not pool spans (late chunking embeds)")
        self.check(batch)
        spans = check_spans(spans, batch)
        with self._lock:  # the compile context and the kernel choices are shared too
            hidden = eager_run(self._hidden, batch, self.device, self.attend)
            spans_dev = torch.from_numpy(spans).to(self.device, non_blocking=True)
            pooled = pool_spans(hidden, spans_dev)
            return (pooled if self.dense is None else self.dense(pooled)).cpu().numpy()

    @torch.inference_mode()
    def encode_outputs(
        self,
        batch: PackedBatch,
        outputs: tuple[str, ...],
        *,
        query: bool = False,
        visible_keys: tuple[int, ...] | None = None,
    ) -> BatchOutputs:
        """Dense, sparse and/or multi-vector outputs of a sparse or multi-vector model from one
        forward (`retrieval`). `query`: a ColBERT query (every token kept); `visible_keys`: per
        sequence, how many of its first tokens are attended to (query expansion). Waits for the
        device.

        With graphs (CUDA) the encoder runs as `step` does, padded to a bucket and replayed
        (`token_runner`), and the heads run eagerly on the real tokens' hidden rows: they hold
        host syncs (SPLADE's blocks, the kept tokens, the non-zero entries), and the layers are
        where launches dominate. A batch with a key cut short by `visible_keys` runs eagerly:
        the graphs' attention has no per-sequence key limit."""
        if self.retrieval is None:
            raise ValueError(f"{self.spec.path}: a dense-only model; use step()")
        self.check(batch)
        with self._lock:  # the graphs' buffers, the compile context and the kernel choices
            hidden = self._hidden_rows(batch, visible_keys)
            # NOTE: inside the lock: `hidden` may be the token runner's buffer, rewritten by
            # the next batch
            return self.retrieval.of_batch(hidden, batch, outputs, query, self._threads_for)

    def _hidden_rows(
        self, batch: PackedBatch, visible_keys: tuple[int, ...] | None
    ) -> torch.Tensor:  # [T, H]
        """The encoder's hidden states of the batch's tokens: through the token graphs, or
        eagerly (no graphs: the CPU; a query expansion's `visible_keys`)."""
        runner = self.token_runner
        # every key visible is the ordinary attention, which the graphs hold
        cut = visible_keys is not None and tuple(visible_keys) != tuple(batch.seqlens.tolist())
        if runner is None or cut:
            if runner is not None:
                self.stats.eager_runs += 1
            attend: AttentionFn = self.attend if visible_keys is None else VisibleKeys(visible_keys)
            return eager_run(self._hidden, batch, self.device, attend)
        hidden = runner.run(batch)
        return hidden if hidden is not None else run_parts(batch, runner, self._hidden, self.attend)


M = TypeVar("M", bound=nn.Module)


def _on(module: M | None, device: torch.device) -> M | None:
    return module.to(device) if module is not None else None
