"""The CUDA fast path on the GPU machine: graphs replay what eager computes, padding never leaks,
lazy capture counts, LazyTensor waits for its event, BERT (real weights) and Qwen3 (0.6B config).

Run there: `PYTHONPATH=src python3 -m pytest -q -m gpu tests/engine/test_graphs_gpu.py`. The
MiniLM folder is `$EMBEDSERVE_MINILM` (a float16 copy carried to the machine) or the bundled one.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from embedserve.engine import graphs as graphs_module
from embedserve.engine.attention import RaggedLayout, attention_backends
from embedserve.engine.batch import PackedBatch
from embedserve.engine.buckets import plan_bucket
from embedserve.engine.choices import KernelChoices
from embedserve.engine.engine import Engine
from embedserve.engine.fidelity import row_cosines
from embedserve.engine.graphs import GraphConfig

pytestmark = pytest.mark.gpu

BACKENDS = attention_backends(KernelChoices())

SHAPES = [[1], [16], [63], [64], [65], [128], [7, 9], [3, 50, 11], [200, 1, 30, 64], [512],
          [100] * 10, [33] * 40, [900, 500], [1000, 1000, 300]]  # fmt: skip


def _batch(rng: np.random.Generator, seqlens: list[int], vocab: int) -> PackedBatch:
    return PackedBatch.from_token_lists([rng.integers(0, vocab, n).tolist() for n in seqlens])


def _assert_close(got: np.ndarray, want: np.ndarray, min_cos: float = 0.999) -> None:
    assert got.shape == want.shape and np.isfinite(got).all()
    cos = row_cosines(got, want)
    assert cos.min() >= min_cos, f"min cosine {cos.min():.6f} (rows {np.argsort(cos)[:3]})"


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_gqa_matches_sdpa(causal: bool) -> None:
    torch.manual_seed(0)
    lens = (5, 130, 64, 1)
    t, dev = sum(lens), torch.device("cuda")
    q = torch.randn(t, 16, 128, device=dev, dtype=torch.bfloat16)
    k, v = (torch.randn(t, 8, 128, device=dev, dtype=torch.bfloat16) for _ in range(2))
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32, device=dev)
    want = BACKENDS["sdpa_loop"](
        q.float(), k.float(), v.float(), RaggedLayout(cu, 130, lens), causal
    )
    seq_ids = torch.repeat_interleave(torch.arange(4, device=dev), torch.tensor(lens, device=dev))
    for name, layout in [
        ("varlen", RaggedLayout(cu, 256, ())),  # a bucket's bound, above the real maximum
        ("block_mask", RaggedLayout(cu, 256, (), seq_ids)),
        ("cudnn", RaggedLayout(cu, 256, (), seq_ids)),  # with the block-diagonal bias
    ]:
        got = BACKENDS[name](q, k, v, layout, causal).float()
        err = (got - want).norm() / want.norm()
        assert err < 1e-2, f"{name}: relative error {err:.2e}"


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("t", [64, 300, 4096])
def test_cudnn_dense_single_sequence_matches_sdpa(causal: bool, t: int) -> None:
    torch.manual_seed(t)
    dev = torch.device("cuda")
    q = torch.randn(t, 16, 128, device=dev, dtype=torch.bfloat16)
    k, v = (torch.randn(t, 8, 128, device=dev, dtype=torch.bfloat16) for _ in range(2))
    cu = torch.tensor([0, t], dtype=torch.int32, device=dev)
    want = BACKENDS["sdpa_loop"](q.float(), k.float(), v.float(), RaggedLayout(cu, t, (t,)), causal)
    sid = torch.zeros(t, dtype=torch.int64, device=dev)
    got = BACKENDS["cudnn"](q, k, v, RaggedLayout(cu, t, (), sid, dense=True), causal).float()
    err = (got - want).norm() / want.norm()
    assert got.shape == want.shape and err < 1e-2, f"relative error {err:.2e}"


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("n", "t"), [(257, 320), (4095, 4096)])
def test_cudnn_one_real_sequence_with_padding_matches_it_alone(
    causal: bool, n: int, t: int
) -> None:
    """A real length in a bucket (one text, then padding): no [T, T] mask, the same rows."""
    torch.manual_seed(n)
    dev = torch.device("cuda")
    q = torch.randn(t, 16, 128, device=dev, dtype=torch.bfloat16)
    k, v = (torch.randn(t, 8, 128, device=dev, dtype=torch.bfloat16) for _ in range(2))
    alone = RaggedLayout(torch.tensor([0, n], dtype=torch.int32, device=dev), n, (n,))
    want = BACKENDS["sdpa_loop"](q[:n].float(), k[:n].float(), v[:n].float(), alone, causal)
    cu = torch.tensor([0, n, t], dtype=torch.int32, device=dev)
    sid = (torch.arange(t, device=dev) >= n).long()
    got = BACKENDS["cudnn"](q, k, v, RaggedLayout(cu, t, (), sid, solo=True), causal).float()
    err = (got[:n] - want).norm() / want.norm()
    assert bool(torch.isfinite(got).all()) and err < 1e-2, f"relative error {err:.2e}"


@pytest.mark.parametrize("bias", [False, True])
def test_small_m_linear_matches_cublas_and_records_its_choice(bias: bool) -> None:
    from embedserve.engine.kernels.tuning import small_m_linear
    from embedserve.engine.stats import EngineStats

    torch.manual_seed(0)
    stats, choices = EngineStats(), KernelChoices()
    linear = small_m_linear(choices, stats)
    for m, n, k in [(64, 4096, 1024), (128, 1024, 3072), (128, 1152, 384), (512, 6144, 1024)]:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k**-0.5
        b = torch.randn(n, device="cuda", dtype=torch.bfloat16) if bias else None
        want = torch.nn.functional.linear(x.double(), w.double(), None if b is None else b.double())
        for _ in range(2):  # the first call measures, the second uses the choice
            got = linear(x, w, b)
            err = ((got.double() - want).norm() / want.norm()).item()
            assert got.shape == (m, n) and got.dtype == x.dtype and err < 1e-2, err
    assert all("cublas" in t and "chosen" in t for t in stats.gemm_timings.values())
    assert len(choices.gemm) == len(stats.gemm_timings) == 4


def test_qk_norm_rope_kernel_against_fp64() -> None:
    from embedserve.engine.kernels.qk_norm_rope import qk_norm_rope
    from embedserve.engine.ops import EAGER_OPS

    torch.manual_seed(0)
    t, nq, nk, d, dev = 300, 16, 8, 128, "cuda"
    qkv = torch.randn(t, (nq + 2 * nk) * d, device=dev, dtype=torch.bfloat16) * 3
    q, k, _ = qkv.split([nq * d, nk * d, nk * d], -1)  # strided views, as in the model
    q, k = q.view(t, nq, d), k.view(t, nk, d)
    inv = 1.0 / (1e6 ** (torch.arange(0, d, 2, device=dev).float() / d))
    angles = torch.cat([torch.arange(t, device=dev).float()[:, None] * inv] * 2, -1)[:, None, :]
    cos, sin = angles.cos().bfloat16(), angles.sin().bfloat16()
    qw, kw = (torch.rand(d, device=dev, dtype=torch.bfloat16) + 0.5 for _ in range(2))
    args = (qw, kw, cos, sin, 1e-6)
    ref = EAGER_OPS.qk_norm_rope(q.double(), k.double(), *(a.double() for a in args[:4]), 1e-6)
    eager = EAGER_OPS.qk_norm_rope(q, k, *args)
    got = qk_norm_rope(q, k, *args)
    for g, e, r in zip(got, eager, ref, strict=True):
        assert g.is_contiguous() and g.shape == r.shape
        err = ((g.double() - r).norm() / r.norm()).item()
        eager_err = ((e.double() - r).norm() / r.norm()).item()
        assert err <= 1.25 * eager_err, (err, eager_err)  # no worse than eager bf16


@pytest.fixture(scope="module")
def bert_pair(minilm_folder: Path) -> tuple[Engine, Engine]:
    fast = Engine.from_folder(minilm_folder, device="cuda", fidelity=False)
    eager = Engine.from_folder(
        minilm_folder, device="cuda", graphs=False, fuse=False, fidelity=False
    )
    return fast, eager


def test_bert_replay_equals_eager_on_fresh_inputs(bert_pair: tuple[Engine, Engine]) -> None:
    fast, eager = bert_pair
    rng = np.random.default_rng(1)
    for seqlens in SHAPES:
        seqlens = [min(n, fast.max_positions) for n in seqlens]
        for _ in range(3):  # eager hit, capture, replay: each on new token ids
            batch = _batch(rng, seqlens, fast.vocab_size)
            _assert_close(fast.step(batch).wait(), eager.step(batch).wait())
    assert fast.runner is not None
    buckets = set()
    for seqlens in SHAPES:
        plan = plan_bucket(
            [min(n, fast.max_positions) for n in seqlens], fast.runner.config, fast.max_positions
        )
        assert plan is not None
        buckets.add(plan.key)
    # one graph per bucket (shapes that share a bucket share its graph); every later hit replays
    assert fast.stats.captures == fast.runner.num_graphs == len(buckets)
    assert fast.stats.replays == 3 * len(SHAPES) - 2 * len(buckets)


def test_second_hit_captures_third_replays(minilm_folder: Path) -> None:
    engine = Engine.from_folder(minilm_folder, device="cuda", fidelity=False)
    rng = np.random.default_rng(2)
    seen = []
    for _ in range(4):
        engine.step(_batch(rng, [40, 17], engine.vocab_size)).wait()
        s = engine.stats
        seen.append((s.eager_runs, s.captures, s.replays))
    assert seen == [(1, 0, 0), (1, 1, 0), (1, 1, 1), (1, 1, 2)]
    assert engine.runner is not None and engine.runner.num_graphs == 1
    # one sequence above the largest bucket: eager, never captured
    small = Engine.from_folder(
        minilm_folder, device="cuda", fidelity=False, graphs=GraphConfig(max_tokens=256)
    )
    for _ in range(3):
        small.step(_batch(rng, [300], small.vocab_size)).wait()
    assert (small.stats.eager_runs, small.stats.captures) == (3, 0)
    # a batch above the grid whose sequences fit: split into parts the buckets hold (issue 24)
    for _ in range(3):
        small.step(_batch(rng, [200, 200], small.vocab_size)).wait()
    # 6 parts: the first eager, the second captured, then replayed (the 300s ran eagerly)
    s = small.stats
    assert (s.eager_runs, s.captures, s.replays) == (4, 1, 4) and s.split_batches >= 3


def test_padding_never_leaks(bert_pair: tuple[Engine, Engine], monkeypatch) -> None:  # type: ignore[no-untyped-def]
    fast, _ = bert_pair
    rng = np.random.default_rng(3)
    batch = _batch(rng, [37, 5, 90], fast.vocab_size)  # 132 tokens -> bucket 192, 60 padding
    for _ in range(3):
        base = fast.step(batch).wait().copy()
    stage = graphs_module.stage_inputs

    def noisy_padding(b: PackedBatch, plan, out: np.ndarray) -> None:  # type: ignore[no-untyped-def]
        stage(b, plan, out)
        t = plan.num_tokens
        out[b.num_tokens : t] = rng.integers(0, fast.vocab_size, t - b.num_tokens)

    monkeypatch.setattr(graphs_module, "stage_inputs", noisy_padding)
    for _ in range(3):
        out = fast.step(batch).wait()
        assert out.shape == (3, fast.hidden_size)  # dummy and empty rows never returned
        _assert_close(out, base, min_cos=0.99999)
    # the same sequence alone and among others (different padding, bucket, graph)
    alone = fast.step(PackedBatch.from_packed(batch.input_ids[:37], batch.seqlens[:1])).wait()
    _assert_close(alone, base[:1], min_cos=0.9995)


def test_lazy_tensor_is_not_ready_before_its_event(bert_pair: tuple[Engine, Engine]) -> None:
    fast, eager = bert_pair
    batch = _batch(np.random.default_rng(4), [128], fast.vocab_size)
    for _ in range(3):
        fast.step(batch).wait()
    torch.cuda._sleep(200_000_000)  # ~0.1 s of device time queued ahead of the step
    handle = fast.step(batch)
    assert not handle.ready()  # step() returned while the device is still busy
    out = handle.wait()
    assert handle.ready()
    _assert_close(out, eager.step(batch).wait())


def test_bert_fidelity_guard_passes_on_cuda(minilm_folder: Path) -> None:
    engine = Engine.from_folder(minilm_folder, device="cuda")
    assert engine.fidelity_cosine is not None and engine.fidelity_cosine >= 0.999
    assert engine.stats.captures >= 1 and engine.stats.replays >= 1


@pytest.fixture(scope="module")
def qwen3_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Random weights in the published Qwen3-0.6B shape, saved by transformers, bidirectional."""
    from transformers import Qwen3Config, Qwen3Model

    cfg = Qwen3Config(
        vocab_size=151669, hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, intermediate_size=3072,
        max_position_embeddings=32768, rope_theta=1_000_000, rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    )  # fmt: skip
    cfg.is_causal = False
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Qwen3Model(cfg).to(torch.bfloat16)
    folder = tmp_path_factory.mktemp("qwen3-0.6b")
    model.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("kind", ["bidirectional", "causal"])
def test_qwen3_graphs_match_eager(qwen3_folder: Path, kind: str) -> None:
    pooling = "mean" if kind == "bidirectional" else "last"
    kw: dict = {"pooling": pooling, "attention": kind}
    fast = Engine.from_folder(qwen3_folder, device="cuda", **kw)  # the guard runs here
    assert fast.fidelity_cosine is not None and fast.fidelity_cosine >= 0.999
    eager = Engine.from_folder(
        qwen3_folder, device="cuda", graphs=False, fuse=False, fidelity=False, **kw
    )
    rng = np.random.default_rng(5)
    for seqlens in [[16], [128], [100], [4095], [3, 50, 300], [512] * 3, [2000, 900]]:
        for _ in range(3):
            batch = _batch(rng, seqlens, fast.vocab_size)
            _assert_close(fast.step(batch).wait(), eager.step(batch).wait())
    assert fast.stats.replays >= 7
    # one real sequence in a bucket (16, 100, 4,095 tokens): the dense kernel ran as a candidate
    solo = {k: t for k, t in fast.stats.attention_timings.items() if k.endswith("-1")}
    assert len(solo) == 3 and all("cudnn" in t for t in solo.values()), solo


def test_a_default_bulk_encode_replays_graphs(minilm_folder: Path) -> None:
    """The default batch budget is the largest captured bucket: a bulk encode never runs a
    batch eagerly once its buckets are captured."""
    from embedserve.embedder import Embedder

    embedder = Embedder(minilm_folder, device="cuda")
    assert embedder.engine.batch_tokens == embedder.engine.runner.config.max_tokens  # type: ignore[union-attr]
    texts = [f"passage {i}: " + "words of a document " * (5 + i % 40) for i in range(600)]
    embedder.encode(texts, truncate="end")  # first sight of each bucket: eager
    embedder.encode(texts, truncate="end")  # second: captured
    stats = embedder.engine.stats
    replays, eager = stats.replays, stats.eager_runs
    embedder.encode(texts, truncate="end")
    assert stats.eager_runs == eager
    assert stats.replays > replays


@pytest.mark.parametrize("arch", ["ms-marco-minilm-l6", "qwen3-reranker-0.6b"])
def test_rerankers_on_graphs_match_eager_fp32(
    arch: str, tmp_path: Path, minilm_folder: Path
) -> None:
    """A reranker's scores through the graphs in bf16 (the score head inside them) against the
    eager fp32 engine on the same pairs, as served (after the activation): within 1e-2 (times
    the largest score when over 1)."""
    from embedserve.devtools.checkpoints import make_checkpoint
    from embedserve.embedder import run_batches
    from embedserve.scorer import Scorer

    folder = make_checkpoint(
        tmp_path / arch, arch=arch, dtype="float32", seed=2, tokenizer_from=minilm_folder
    )
    fast = Scorer(folder, device="cuda")  # the fidelity guard runs here
    assert fast.engine.fidelity_cosine is not None and fast.engine.runner is not None
    eager = Engine.from_folder(
        folder, device="cuda", dtype="float32", graphs=False, fuse=False, fidelity=False,
        attention_backend="sdpa_loop",  # FlashAttention takes no fp32
    )  # fmt: skip
    query = "how do vector databases rank documents?"
    docs = [f"document {i}: " + "vector search ranks documents by similarity " * (1 + i % 7)
            for i in range(25)]  # fmt: skip
    assert fast.pairs is not None
    prepared = fast.pairs.prepare(query, docs)
    for _ in range(3):  # eager, capture, replay
        got = fast.score(query, docs)  # the served scores: after the activation
    raw = run_batches(eager, prepared.seqs, 8192, second_segment=prepared.second_segment)[:, 0]
    want = fast.pairs.activate(raw)
    scale = max(1.0, float(np.abs(want).max()))
    assert float(np.abs(got - want).max()) <= 1e-2 * scale, (got, want)
    assert fast.engine.stats.replays >= 1


@torch.inference_mode()
def test_padded_attention_peak_memory_is_bounded_for_one_long_text_among_short_ones() -> None:
    """The issue's batch (one 384-token text among 2,600 three-token ones) at MPNet's shape:
    the unbounded mask was 9.2 GB; now every buffer is within `masks.padded_bound`."""
    from embedserve.engine.attention import masks

    seqlens = [384] + [3] * 2600
    t, heads, dim = sum(seqlens), 12, 64
    q, k, v = (torch.randn(t, heads, dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    bias = torch.randn(heads, 257, device="cuda")
    cu = torch.tensor(np.concatenate([[0], np.cumsum(seqlens)]), dtype=torch.int32, device="cuda")
    layout = RaggedLayout(cu, 384, tuple(seqlens))
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = BACKENDS["padded"](q, k, v, layout, False, None, bias)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    bound_bytes = masks.padded_bound(t, 384, heads, dim) * 2  # bf16
    assert peak <= 4 * bound_bytes < 1e9, peak  # a few buffers of the bound at once
    want = BACKENDS["sdpa_loop"](q.float(), k.float(), v.float(), layout, False, None, bias)
    assert (
        row_cosines(out.float().flatten(1).cpu().numpy(), want.flatten(1).cpu().numpy()).min()
        > 0.999
    )


def _rope_args(t: int, d: int) -> tuple[torch.Tensor, ...]:
    inv = 1.0 / (1e6 ** (torch.arange(0, d, 2, device="cuda").float() / d))
    angles = torch.cat([torch.arange(t, device="cuda").float()[:, None] * inv] * 2, -1)[:, None]
    qw, kw = (torch.rand(d, device="cuda", dtype=torch.bfloat16) + 0.5 for _ in range(2))
    return qw, kw, angles.cos().bfloat16(), angles.sin().bfloat16()


@pytest.mark.parametrize("m", [1, 100, 128, 512])
def test_epilogue_kernels_against_fp64_each_config(m: int) -> None:
    """Every config of each fused kernel, on Qwen3's and MiniLM's shapes: no worse than the
    unfused bf16 pair (product, then the chain) against an fp64 reference."""
    from embedserve.engine.kernels import epilogues, small_gemm
    from embedserve.engine.ops import EAGER_OPS

    torch.manual_seed(m)

    def check(got: tuple[torch.Tensor, ...], eager: tuple[torch.Tensor, ...], ref: tuple[torch.Tensor, ...]) -> None:  # fmt: skip
        for g, e, r in zip(got, eager, ref, strict=True):
            assert g.shape == r.shape and g.is_contiguous() and bool(torch.isfinite(g).all())
            err = ((g.double() - r).norm() / r.norm()).item()
            eager_err = ((e.double() - r).norm() / r.norm()).item()
            assert err <= 1.25 * eager_err + 1e-4, (err, eager_err)

    bf = torch.bfloat16
    x = torch.randn(m, 1024, device="cuda", dtype=bf)
    w = torch.randn(6144, 1024, device="cuda", dtype=bf) * 1024**-0.5  # gate | up
    ref = (EAGER_OPS.linear_silu_mul(x.double(), w.double()),)
    eager = (EAGER_OPS.linear_silu_mul(x, w),)
    for c in epilogues.GLU_CONFIGS:
        check((epilogues.linear_silu_mul(x, w, c),), eager, ref)
    for bias in (False, True):
        wq = torch.randn(4096, 1024, device="cuda", dtype=bf) * 1024**-0.5  # 16 + 2 × 8 heads
        b = torch.randn(4096, device="cuda", dtype=bf) if bias else None
        rest = (*_rope_args(m, 128), 1e-6)
        ref = EAGER_OPS.qkv_norm_rope(
            x.double(), wq.double(), None if b is None else b.double(), 16, 8,
            *(a.double() for a in rest[:4]), 1e-6,
        )  # fmt: skip
        eager = EAGER_OPS.qkv_norm_rope(x, wq, b, 16, 8, *rest)
        for c in epilogues.QKV_CONFIGS:
            check(epilogues.qkv_norm_rope(x, wq, b, 16, 8, *rest, c), eager, ref)
    xb = torch.randn(m, 384, device="cuda", dtype=bf)
    wb = torch.randn(1536, 384, device="cuda", dtype=bf) * 384**-0.5
    bb = torch.randn(1536, device="cuda", dtype=bf)
    for approximate in ("none", "tanh"):
        ref = (EAGER_OPS.linear_gelu(xb.double(), wb.double(), bb.double(), approximate),)
        eager = (EAGER_OPS.linear_gelu(xb, wb, bb, approximate),)
        for c in small_gemm.CONFIGS:
            if c.split_k == 1 and c.fits(1536, 384):
                check((small_gemm.linear(xb, wb, bb, c, act=approximate),), eager, ref)


def test_fused_epilogues_measure_once_and_record_their_choice() -> None:
    from embedserve.engine.kernels.tuning import fused_epilogues
    from embedserve.engine.ops import EAGER_OPS, composed
    from embedserve.engine.stats import EngineStats

    torch.manual_seed(1)
    stats, choices = EngineStats(), KernelChoices()
    chains = fused_epilogues(
        choices, stats, composed(EAGER_OPS.linear, EAGER_OPS.silu_mul, EAGER_OPS.qk_norm_rope)
    )
    bf = torch.bfloat16
    x = torch.randn(128, 1024, device="cuda", dtype=bf)
    w = torch.randn(6144, 1024, device="cuda", dtype=bf) * 1024**-0.5
    wq = torch.randn(4096, 1024, device="cuda", dtype=bf) * 1024**-0.5
    rest = (*_rope_args(128, 128), 1e-6)
    xb = torch.randn(128, 384, device="cuda", dtype=bf)
    wb = torch.randn(1536, 384, device="cuda", dtype=bf) * 384**-0.5
    bb = torch.randn(1536, device="cuda", dtype=bf)
    calls = [
        lambda: (chains["linear_silu_mul"](x, w),),
        lambda: chains["qkv_norm_rope"](x, wq, None, 16, 8, *rest),
        lambda: (chains["linear_gelu"](xb, wb, bb, "none"),),
    ]
    wants = [
        (EAGER_OPS.linear_silu_mul(x, w),),
        EAGER_OPS.qkv_norm_rope(x, wq, None, 16, 8, *rest),
        (EAGER_OPS.linear_gelu(xb, wb, bb, "none"),),
    ]
    for call, want in zip(calls, wants, strict=True):
        for _ in range(2):  # the first call measures, the second uses the choice
            for g, e in zip(call(), want, strict=True):
                err = ((g.float() - e.float()).norm() / e.float().norm()).item()
                assert g.shape == e.shape and err < 1e-2, err
    assert set(stats.gemm_timings) == {
        "128x6144x1024+silu", "128x4096x1024+qkv-norm-rope", "128x1536x384+gelu-none"
    }  # fmt: skip
    assert all("unfused" in t and "chosen" in t for t in stats.gemm_timings.values())
    assert sum(key[0] in ("silu", "qkv-norm-rope", "gelu-none") for key in choices.gemm) == 3


@pytest.mark.parametrize("epilogues", [False, True])
def test_qwen3_and_bert_with_and_without_epilogues_match_eager(
    qwen3_folder: Path, minilm_folder: Path, epilogues: bool
) -> None:
    """Both sides of the A/B: each engine passes its guard and matches the eager fp path."""
    for folder, kw in ((qwen3_folder, {"pooling": "mean", "attention": "bidirectional"}),
                       (minilm_folder, {})):  # fmt: skip
        fast = Engine.from_folder(folder, device="cuda", epilogues=epilogues, **kw)
        assert fast.fidelity_cosine is not None and fast.fidelity_cosine >= 0.999
        eager = Engine.from_folder(
            folder, device="cuda", graphs=False, fuse=False, fidelity=False, **kw
        )
        rng = np.random.default_rng(6)
        for seqlens in [[16], [128], [3, 50, 300], [512]]:
            batch = _batch(rng, seqlens, fast.vocab_size)
            for _ in range(3):
                _assert_close(fast.step(batch).wait(), eager.step(batch).wait())
        chains = ("+silu", "+qkv-norm-rope", "+gelu-none")
        fused = [k for k in fast.stats.gemm_timings if k.endswith(chains)]
        assert bool(fused) == epilogues, fast.stats.gemm_timings


def test_a_texts_vector_does_not_depend_on_its_batch_in_bf16(minilm_folder: Path) -> None:
    """Faults IV: on the GPU (bf16, graphs) a text alone and beside short, long and many other
    texts: cosine >= 0.9999 (duplicate collapsing and result caching rely on it)."""
    from embedserve.embedder import Embedder

    embedder = Embedder(minilm_folder, device="cuda")
    text = "how do vector databases rank the documents they return?"
    companions = [[], ["ok"], ["a long passage about search engines and indexes " * 8],
                  [f"query {i} about topic {i % 5}" for i in range(40)]]  # fmt: skip
    rows = []
    for others in companions:
        for _ in range(3):  # eager, capture, replay of each bucket
            got = embedder.encode([*others[:1], text, *others[1:]])
        rows.append(got[min(1, len(others))])
    assert row_cosines(np.stack(rows[1:]), np.stack([rows[0]] * 3)).min() >= 0.9999
