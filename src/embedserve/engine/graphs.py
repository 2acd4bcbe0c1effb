"""Whole-model CUDA graphs, one per bucket, captured lazily.

A batch is padded up to a bucket (`buckets`: its token count, sequence count and longest sequence
rounded up, the padding in dummy sequences after the real ones).

The first hit of a bucket runs eagerly (padded, through the same code: this is where
`torch.compile` compiles), the second captures one graph from token ids to pooled vectors, every
later hit replays it. Batches above the largest bucket return None here and run eagerly.

A runner `per_token` captures a forward that returns one row per token (the encoder's hidden
states, for the sparse and multi-vector heads): the real tokens' rows are the first T of the
bucket's (the padding's dummy sequences come after them), and every bucket writes its rows into
one buffer of the largest bucket's size, so the graphs hold no [T, H] output each.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from embedserve.engine.attention import (
    CAPTURE_SAFE,
    MASKED,
    AttentionFn,
    RaggedLayout,
    attention_backends,
    graph_candidates,
)
from embedserve.engine.attention.masks import MAX_MASK_TOKENS
from embedserve.engine.batch import PackedBatch
from embedserve.engine.buckets import (
    SMALL_TOKENS,
    BucketPlan,
    plan_bucket,
    stage_inputs,
    token_bucket,
)
from embedserve.engine.choices import KernelChoices
from embedserve.engine.stats import EngineStats
from embedserve.loading.spec import ModelSpec

# (input_ids [T], positions [T], token_type_ids [T], seq_ids [T], layout, attend) -> [S, H] fp32
# (per token: [T, H] in the model's dtype)
Forward = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, RaggedLayout, AttentionFn],
    torch.Tensor,
]


@dataclass(frozen=True)
class GraphConfig:
    max_tokens: int = 8192  # largest captured token bucket; larger batches run eagerly
    max_seqs: int = 256  # largest sequence bucket (a power of two)
    # attention backends timed against each other when a bucket is captured; the fastest is kept
    attention: tuple[str, ...] = ("varlen", "block_mask", "cudnn")
    # block_mask (and cudnn, unless the bucket holds one real sequence) materialize a [T, T] mask
    # and do T² work: only candidates up to here (above `MAX_MASK_TOKENS` they would run
    # `padded`'s bounded form anyway, named or not)
    max_block_mask_tokens: int = MAX_MASK_TOKENS
    # (num_tokens, num_seqs) batches captured at start-up; off by default
    warmup: tuple[tuple[int, int], ...] = ()
    staging_slots: int = 4  # pinned input buffers in flight before the host waits

    def __post_init__(self) -> None:
        if (
            self.max_tokens < 64
            or token_bucket(self.max_tokens, self.max_tokens) != self.max_tokens
        ):
            raise ValueError(
                f"max_tokens must be a multiple of 64 up to {SMALL_TOKENS} and of 256 above, "
                f"got {self.max_tokens}"
            )
        if self.max_seqs < 2 or self.max_seqs & (self.max_seqs - 1):
            raise ValueError(f"max_seqs must be a power of two of at least 2, got {self.max_seqs}")
        unknown = [a for a in self.attention if a not in CAPTURE_SAFE]
        if not self.attention or unknown:
            raise ValueError(
                f"graph attention candidates must be among {', '.join(CAPTURE_SAFE)}, "
                f"got {self.attention}"
            )
        if self.staging_slots < 1:
            raise ValueError("staging_slots must be at least 1")


log = logging.getLogger(__name__)

# a candidate attention backend must agree with the first (the reference) on every real row
CANDIDATE_MIN_COSINE = 0.999


def _min_row_cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    cos = torch.nn.functional.cosine_similarity(a, b, dim=-1, eps=1e-12)
    return float(cos.min()) if bool(torch.isfinite(a).all()) else float("nan")


class Graph(Protocol):
    def capture(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor: ...
    def replay(self) -> None: ...
    def time_ms(self, reps: int) -> float: ...


def cuda_graphs(device: torch.device) -> Callable[[], Graph]:
    """A maker of CudaGraphs sharing one memory pool and one capture stream: every runner given
    it allocates its graphs' scratch from the same pool (graphs never replay concurrently)."""
    pool = torch.cuda.graph_pool_handle()
    stream = torch.cuda.Stream(device)
    return lambda: CudaGraph(pool, stream)


class CudaGraph:
    """One captured forward; every CudaGraph of a runner allocates from one shared pool."""

    def __init__(self, pool: Any, stream: torch.cuda.Stream) -> None:
        self._graph = torch.cuda.CUDAGraph()
        self._pool = pool
        self._stream = stream

    def capture(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        self._stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self._stream):
            fn()  # warm-up on the capture stream: workspaces and lazy inits happen outside
        # NOTE: "thread_local": the process may hold other engines (`serve` natively, several
        # models) whose threads launch and wait on their own streams meanwhile; in the default
        # "global" mode any such call fails this capture or theirs ("operation not permitted
        # when stream is capturing", two models on one H100). Nothing of theirs touches this
        # capture stream or its pool.
        with torch.cuda.graph(
            self._graph, pool=self._pool, stream=self._stream, capture_error_mode="thread_local"
        ):
            out = fn()
        torch.cuda.current_stream().wait_stream(self._stream)
        return out

    def replay(self) -> None:
        self._graph.replay()

    def time_ms(self, reps: int) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self.replay()
        start.record()
        for _ in range(reps):
            self.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / reps


class EagerGraph:
    """A stand-in for CPU tests: 'replay' runs the captured function again into the same output."""

    def __init__(self) -> None:
        self._fn: Callable[[], torch.Tensor] | None = None
        self._out: torch.Tensor | None = None

    def capture(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        self._fn, self._out = fn, fn()
        return self._out

    def replay(self) -> None:
        assert self._fn is not None and self._out is not None, "replay before capture"
        self._out.copy_(self._fn())

    def time_ms(self, reps: int) -> float:
        t0 = time.perf_counter()
        for _ in range(reps):
            self.replay()
        return (time.perf_counter() - t0) * 1e3 / reps


@dataclass
class _Bucket:
    plan: BucketPlan
    static: torch.Tensor  # [plan.staged_size] int64 on the device: the graph's input buffer
    hits: int = 0
    graph: Graph | None = None
    # [plan.num_seqs, H] fp32 (per token: [plan.num_tokens, H]), written by each replay
    output: torch.Tensor | None = None
    eager_only: bool = False  # its capture failed: every hit runs eagerly


class GraphRunner:
    """Owns the buckets: their static input buffers, their graphs and the pad-to-bucket rule.
    The attention backend each bucket's graph was captured with goes to `choices.attention`.
    `make_graph` (default: `cuda_graphs`, a pool of its own) is public as `self.make_graph`, for
    a second runner to share the pool; `per_token`: see the module's docstring."""

    def __init__(
        self,
        forward: Forward,
        *,
        device: torch.device,
        config: GraphConfig,
        stats: EngineStats,
        choices: KernelChoices,
        max_positions: int,
        make_graph: Callable[[], Graph] | None = None,
        per_token: bool = False,
    ) -> None:
        self._forward = forward
        self.device = device
        self.config = config
        self.stats = stats
        self.choices = choices
        self._backends = attention_backends(choices)
        self.max_positions = max_positions
        self._buckets: dict[str, _Bucket] = {}
        if make_graph is None:
            if device.type != "cuda":
                raise ValueError("CUDA graphs need a CUDA device (pass make_graph to test on CPU)")
            make_graph = cuda_graphs(device)
        self.make_graph = make_graph
        self.per_token = per_token
        # per token: the rows of every bucket, [max_tokens, H], allocated by the first (eager)
        # run, outside any graph's pool
        self._token_rows: torch.Tensor | None = None
        self._pinned = device.type == "cuda"
        self._slots: list[tuple[torch.Tensor, np.ndarray, torch.cuda.Event | None]] = []
        self._next_slot = 0
        # (tokens, longest, sequences) -> plan: the plan depends on nothing else
        self._plans: dict[tuple[int, int, int], BucketPlan | None] = {}

    def _plan(self, batch: PackedBatch) -> BucketPlan | None:
        key = (batch.num_tokens, batch.max_seqlen, batch.num_seqs)
        try:
            return self._plans[key]
        except KeyError:
            plan = plan_bucket(batch.seqlens, self.config, self.max_positions)
            if len(self._plans) < 65536:
                self._plans[key] = plan
            return plan

    @property
    def num_graphs(self) -> int:
        return sum(b.graph is not None for b in self._buckets.values())

    def run(self, batch: PackedBatch) -> torch.Tensor | None:
        """Pooled [batch.num_seqs, H] fp32 on the device (per token: the real tokens' rows
        [batch.num_tokens, H]), or None when no bucket holds the batch.

        NOTE: the result is a view of the bucket's output buffer, valid until the next step on
        this stream: copy it (LazyTensor does) before running another batch.
        """
        plan = self._plan(batch)
        if plan is None:
            return None
        bucket = self._buckets.get(plan.key)
        if bucket is None:
            static = torch.empty(plan.staged_size, dtype=torch.int64, device=self.device)
            bucket = self._buckets[plan.key] = _Bucket(plan, static)
        bucket.hits += 1
        rows = batch.num_tokens if self.per_token else batch.num_seqs
        # NOTE: stage with this batch's plan: batches sharing a bucket differ in their padding
        self._stage(batch, plan, bucket.static)
        self.stats.real_tokens += batch.num_tokens
        self.stats.padding_tokens += plan.num_tokens - batch.num_tokens
        if bucket.graph is not None:
            bucket.graph.replay()
            self.stats.replays += 1
        elif bucket.hits == 1 or bucket.eager_only:
            t0 = time.perf_counter()
            bucket.output = self._run_static(bucket, self._candidates(plan)[0])
            self.stats.eager_runs += 1
            if bucket.hits == 1:
                self.stats.first_run_seconds += time.perf_counter() - t0
        else:
            try:
                self._capture(bucket, rows)
            except Exception as e:
                self._give_up_capture(bucket, e)
        assert bucket.output is not None
        return bucket.output[:rows]

    def warm_up(self) -> None:
        """Capture the configured (num_tokens, num_seqs) buckets now instead of on first use."""
        for num_tokens, num_seqs in self.config.warmup:
            if not 0 < num_seqs <= num_tokens:
                raise ValueError(f"warm-up bucket ({num_tokens}, {num_seqs}) is not a batch")
            lens = np.full(num_seqs, num_tokens // num_seqs, dtype=np.int32)
            lens[: num_tokens % num_seqs] += 1
            lens = np.minimum(lens, self.max_positions)
            batch = PackedBatch.from_packed(np.zeros(int(lens.sum()), np.int64), lens)
            for _ in range(2):
                self.run(batch)

    def _candidates(self, plan: BucketPlan) -> tuple[str, ...]:
        names = tuple(
            a
            for a in self.config.attention
            if a not in MASKED
            or plan.num_tokens <= self.config.max_block_mask_tokens
            # one real sequence: a [T] key mask at most (a model with a window or a score bias
            # still builds [T, T] there: its sequences are bounded by its positions)
            or (a == "cudnn" and plan.solo)
        )
        return names or self.config.attention[:1]

    def _stage(self, batch: PackedBatch, plan: BucketPlan, static: torch.Tensor) -> None:
        size = plan.staged_size
        if not self._pinned:
            staged = np.empty(size, dtype=np.int64)
            stage_inputs(batch, plan, staged)
            static.copy_(torch.from_numpy(staged))
            return
        # A ring of pinned buffers: the copy from slot i must have left before slot i is
        # rewritten, and the host waits only when every slot is still in flight.
        if len(self._slots) < self.config.staging_slots:
            capacity = 4 * self.config.max_tokens + self.config.max_seqs + 1
            pinned = torch.empty(capacity, dtype=torch.int64, pin_memory=True)
            self._slots.append((pinned, pinned.numpy(), None))
        index = self._next_slot % len(self._slots)
        self._next_slot += 1
        host, host_np, event = self._slots[index]
        if event is not None:
            event.synchronize()
        stage_inputs(batch, plan, host_np)
        static.copy_(host[:size], non_blocking=True)
        if event is None:
            event = torch.cuda.Event()
        event.record()  # NOTE: an event may be recorded again once it has been waited on
        self._slots[index] = (host, host_np, event)

    def _run_static(self, bucket: _Bucket, attention: str) -> torch.Tensor:
        """The padded forward reading only the bucket's static buffer (what a graph captures)."""
        plan, static = bucket.plan, bucket.static
        t = plan.num_tokens
        ids, pos, types, seq_ids = (static[i * t : (i + 1) * t] for i in range(4))
        cu_seqlens = static[4 * t :].to(torch.int32)
        # the masks are built once per forward, on first use (`attention.masks`)
        layout = RaggedLayout(
            cu_seqlens, plan.max_seqlen, (), seq_ids, dense=plan.dense, solo=plan.solo
        )
        out = self._forward(ids, pos, types, seq_ids, layout, self._backends[attention])
        return self._into_token_rows(out) if self.per_token else out

    def _into_token_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """A bucket's per-token rows copied into the runner's one buffer (a view of its first
        rows): one [max_tokens, H] for every bucket, not one output per captured bucket."""
        if self._token_rows is None:
            # NOTE: never inside a capture (it would come from the graphs' pool): a runner's
            # first run of any bucket is eager
            self._token_rows = rows.new_empty((self.config.max_tokens, *rows.shape[1:]))
        out = self._token_rows[: rows.shape[0]]
        out.copy_(rows)
        return out

    def _give_up_capture(self, bucket: _Bucket, error: Exception) -> None:
        """A bucket whose capture failed runs eagerly from now on: its first hit ran eagerly,
        so this batch does too, and no later hit pays for (or fails on) another capture."""
        bucket.eager_only = True
        bucket.graph = None
        self.stats.capture_failures += 1
        log.warning(
            "CUDA graph capture failed for bucket %s; it runs eagerly from now on (%s: %s)",
            bucket.plan.key,
            type(error).__name__,
            str(error)[:300],
        )
        bucket.output = self._run_static(bucket, self._candidates(bucket.plan)[0])
        self.stats.eager_runs += 1

    def _capture(self, bucket: _Bucket, real_rows: int) -> None:
        """Capture one graph per attention candidate, keep the fastest whose output agrees with
        the first candidate's (a candidate that fails to run or disagrees is dropped and its error
        recorded in `stats.attention_errors`)."""
        t0 = time.perf_counter()
        timings: dict[str, float] = {}
        errors: dict[str, str] = {}
        best: tuple[float, str, Graph, torch.Tensor] | None = None
        reference: torch.Tensor | None = None
        candidates = self._candidates(bucket.plan)
        for i, name in enumerate(candidates):
            graph = self.make_graph()
            try:
                output = graph.capture(lambda name=name: self._run_static(bucket, name))  # type: ignore[misc]
                graph.replay()
                if len(candidates) > 1:
                    got = output[:real_rows].float().clone()
                    if reference is None:
                        reference = got
                    else:
                        cos = _min_row_cosine(got, reference)
                        if not cos >= CANDIDATE_MIN_COSINE:
                            raise ValueError(f"disagrees with {candidates[0]}: cosine {cos:.6f}")
                ms = graph.time_ms(reps=5) if len(candidates) > 1 else 0.0
            except Exception as e:  # a candidate this bucket cannot use
                if i == 0:
                    raise
                errors[name] = f"{type(e).__name__}: {e}"[:300]
                continue
            timings[name] = round(ms, 4)
            if best is None or ms < best[0]:
                best = (ms, name, graph, output)
        assert best is not None
        _, chosen, bucket.graph, bucket.output = best
        self.choices.attention[bucket.plan.key] = chosen
        bucket.graph.replay()  # this step's result (capturing computes nothing)
        self.stats.captures += 1
        self.stats.capture_seconds += time.perf_counter() - t0
        if len(candidates) > 1:
            self.stats.attention_timings[bucket.plan.key] = timings
        if errors:
            self.stats.attention_errors[bucket.plan.key] = errors

    def replay_ms(self, batch: PackedBatch, reps: int = 20) -> float | None:
        """Device ms of one replay of the graph that holds `batch` (None if not captured yet):
        the forward alone, without the host work of a step."""
        plan = self._plan(batch)
        bucket = self._buckets.get(plan.key) if plan is not None else None
        if bucket is None or bucket.graph is None:
            return None
        return bucket.graph.time_ms(reps)

    def attention_choice(self) -> dict[str, str]:
        """Bucket key -> the attention backend its graph was captured with."""
        return dict(self.choices.attention)


def graph_config(
    spec: ModelSpec, config: GraphConfig, attention_backend: str | None
) -> GraphConfig:
    """The graph attention candidates for this model: its family's kernels (MPNet's, whose score
    bias FlashAttention cannot take), a named backend alone, or the configured ones
    (`attention.graph_candidates`)."""
    candidates = graph_candidates(spec.family_row, config.attention, attention_backend)
    return dataclasses.replace(config, attention=candidates)
