"""The bucket rule, the dummy-sequence padding and the runner's lifecycle, on the CPU.

On the CPU a stand-in graph re-runs the captured function into the same output buffer, so the
runner's logic (static buffers, padding, eager → capture → replay) is exercised without CUDA.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from embedserve.engine.attention import attention_backends
from embedserve.engine.batch import PackedBatch
from embedserve.engine.buckets import (
    plan_bucket,
    seq_bucket,
    seqlen_bucket,
    short_query_batches,
    stage_inputs,
    token_bucket,
)
from embedserve.engine.choices import KernelChoices
from embedserve.engine.engine import Engine
from embedserve.engine.graphs import EagerGraph, GraphConfig, GraphRunner

BACKENDS = attention_backends(KernelChoices())


def test_token_buckets_step_by_64_then_256() -> None:
    assert token_bucket(1, 8192) == 64
    assert token_bucket(64, 8192) == 64
    assert token_bucket(65, 8192) == 128
    assert token_bucket(1000, 8192) == 1024
    assert token_bucket(1024, 8192) == 1024
    assert token_bucket(1025, 8192) == 1280
    assert token_bucket(4096, 8192) == 4096
    assert token_bucket(4097, 8192) == 4352
    assert token_bucket(8192, 8192) == 8192
    assert token_bucket(8193, 8192) is None  # above the largest bucket: eager


def test_seq_and_seqlen_buckets() -> None:
    assert [seq_bucket(n, 256) for n in (1, 2, 3, 4, 5, 100, 256)] == [2, 2, 4, 4, 8, 128, 256]
    assert seq_bucket(257, 256) is None
    assert seqlen_bucket(1, 64) == 64
    assert seqlen_bucket(65, 128) == 128
    assert seqlen_bucket(65, 1024) == 128
    assert seqlen_bucket(300, 4096) == 512
    assert seqlen_bucket(300, 320) == 320  # never above the token bucket


def test_config_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="max_tokens"):
        GraphConfig(max_tokens=1100)
    with pytest.raises(ValueError, match="max_seqs"):
        GraphConfig(max_seqs=100)
    with pytest.raises(ValueError, match="attention"):
        GraphConfig(attention=("sdpa_loop",))


@pytest.mark.parametrize(
    "seqlens",
    [(1,), (17,), (64,), (128,), (5, 77, 300), (511, 1), (900, 900), (3000,), tuple(range(1, 41))],
)
def test_plan_pads_into_dummy_sequences_within_bounds(seqlens: tuple[int, ...]) -> None:
    config = GraphConfig()
    plan = plan_bucket(np.array(seqlens), config, max_positions=512)
    assert plan is not None
    total = sum(seqlens)
    assert plan.num_tokens == token_bucket(total, config.max_tokens)
    assert total + sum(plan.pad_seqlens) == plan.num_tokens
    assert all(0 < n <= min(plan.max_seqlen, 512) for n in plan.pad_seqlens)
    assert max(seqlens) <= plan.max_seqlen <= plan.num_tokens
    assert plan.num_seqs >= len(seqlens) + len(plan.pad_seqlens)


def test_plan_is_none_above_the_largest_buckets() -> None:
    config = GraphConfig(max_tokens=1024, max_seqs=8)
    assert plan_bucket(np.array([600, 600]), config, 512) is None
    assert plan_bucket(np.ones(9, dtype=np.int32), config, 512) is None


def test_stage_inputs_layout() -> None:
    batch = PackedBatch.from_token_lists([[5, 6, 7], [8, 9]])
    plan = plan_bucket(batch.seqlens, GraphConfig(), max_positions=512)
    assert plan is not None and plan.num_tokens == 64 and plan.num_seqs == 4
    out = np.full(plan.staged_size, -1, dtype=np.int64)
    stage_inputs(batch, plan, out)
    t = plan.num_tokens
    ids, pos, types, sids, cu = (
        out[:t],
        out[t : 2 * t],
        out[2 * t : 3 * t],
        out[3 * t : 4 * t],
        out[4 * t :],
    )
    assert (out != -1).all()  # every element written
    assert ids[:5].tolist() == [5, 6, 7, 8, 9] and (ids[5:] == 0).all()
    assert pos[:5].tolist() == [0, 1, 2, 0, 1] and pos[5:].tolist() == list(range(59))
    assert sids[:5].tolist() == [0, 0, 0, 1, 1] and (sids[5:] == 2).all()
    assert (types == 0).all()
    assert cu.tolist() == [0, 3, 5, 64, 64]  # real, real, dummy, empty


def _bert_engine(minilm_path) -> Engine:  # type: ignore[no-untyped-def]
    return Engine.from_folder(minilm_path, device="cpu", dtype="float32")


def _runner(engine: Engine, config: GraphConfig | None = None) -> GraphRunner:
    return GraphRunner(
        engine._forward,
        device=torch.device("cpu"),
        config=config or GraphConfig(attention=("block_mask",)),
        stats=engine.stats,
        choices=KernelChoices(),
        max_positions=engine.max_positions,
        make_graph=EagerGraph,
    )


def _random_batch(rng: np.random.Generator, seqlens: list[int], vocab: int) -> PackedBatch:
    return PackedBatch.from_token_lists([rng.integers(0, vocab, n).tolist() for n in seqlens])


def test_cpu_engine_has_no_runner_and_stays_eager(minilm_path) -> None:  # type: ignore[no-untyped-def]
    engine = _bert_engine(minilm_path)
    assert engine.runner is None and engine.fidelity_cosine is None
    batch = PackedBatch.from_token_lists([[101, 2023, 102], [101, 102]])
    out = engine.step(batch)
    assert out.ready() and out.wait().shape == (2, engine.hidden_size)
    assert engine.stats.captures == 0 and engine.stats.replays == 0


@torch.inference_mode()
def test_runner_lifecycle_and_padding_never_leaks(minilm_path) -> None:  # type: ignore[no-untyped-def]
    engine = _bert_engine(minilm_path)
    runner = _runner(engine)
    stats = engine.stats
    rng = np.random.default_rng(0)
    shapes = [[7], [3, 50, 11], [128], [200, 1, 30, 64]]
    for seqlens in shapes:
        before = (stats.eager_runs, stats.captures, stats.replays)
        results = []
        for hit in range(3):
            batch = _random_batch(rng, seqlens, engine.vocab_size)  # fresh ids every hit
            got = runner.run(batch)
            assert got is not None and got.shape == (len(seqlens), engine.hidden_size)
            want = engine.step(batch).wait()  # unpadded eager, no runner on the CPU
            torch.testing.assert_close(got, torch.from_numpy(want), atol=2e-5, rtol=1e-4)
            results.append(got.clone())
            counts = (stats.eager_runs, stats.captures, stats.replays)
            expected = [(1, 0, 0), (1, 1, 0), (1, 1, 1)][hit]
            assert tuple(c - b for c, b in zip(counts, before, strict=True)) == expected
        assert not torch.equal(results[1], results[2])  # the replay read the new inputs
    assert runner.num_graphs == len(shapes)
    assert stats.padding_tokens > 0 and stats.real_tokens == 3 * sum(map(sum, shapes))


@torch.inference_mode()
def test_batches_sharing_a_bucket_are_padded_by_their_own_plan(minilm_path) -> None:  # type: ignore[no-untyped-def]
    engine = _bert_engine(minilm_path)
    runner = _runner(engine)
    rng = np.random.default_rng(5)
    # all in bucket t64-s4-l64, with 61, 16 and 2 padding tokens: stale padding from an earlier
    # batch must never be read as part of a later one
    for seqlens in ([1, 1, 1], [40, 8], [50, 12], [30, 2, 20], [1, 1, 1]):
        batch = _random_batch(rng, seqlens, engine.vocab_size)
        got = runner.run(batch)
        assert got is not None
        want = torch.from_numpy(engine.step(batch).wait())
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
    assert runner.num_graphs == 1 and engine.stats.replays == 3


@torch.inference_mode()
def test_runner_picks_attention_by_timing_and_records_it(minilm_path) -> None:  # type: ignore[no-untyped-def]
    engine = _bert_engine(minilm_path)
    runner = _runner(engine, GraphConfig(attention=("block_mask", "block_mask")))
    batch = _random_batch(np.random.default_rng(1), [20, 30], engine.vocab_size)
    for _ in range(2):
        runner.run(batch)
    ((key, timings),) = engine.stats.attention_timings.items()
    assert key == "t64-s4-l64" and set(timings) == {"block_mask"} and timings["block_mask"] > 0
    assert runner.attention_choice() == {key: "block_mask"} == runner.choices.attention


@torch.inference_mode()
def test_block_mask_with_device_seq_ids_equals_per_sequence_attention() -> None:
    from embedserve.engine.attention import RaggedLayout

    torch.manual_seed(0)
    lens = (5, 9, 2)
    t = sum(lens)
    q, k, v = torch.randn(t, 4, 8), torch.randn(t, 2, 8), torch.randn(t, 2, 8)
    cu = torch.tensor([0, 5, 14, 16], dtype=torch.int32)
    seq_ids = torch.repeat_interleave(torch.arange(3), torch.tensor(lens))
    for causal in (False, True):
        want = BACKENDS["sdpa_loop"](q, k, v, RaggedLayout(cu, 9, lens), causal)
        got = BACKENDS["block_mask"](q, k, v, RaggedLayout(cu, 64, (), seq_ids), causal)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_warm_up_captures_configured_buckets(minilm_path) -> None:  # type: ignore[no-untyped-def]
    engine = _bert_engine(minilm_path)
    runner = _runner(engine, GraphConfig(attention=("block_mask",), warmup=((128, 1), (256, 4))))
    with torch.inference_mode():
        runner.warm_up()
    assert runner.num_graphs == 2 and engine.stats.captures == 2


def test_a_server_warms_the_graphs_that_short_query_batches_meet(minilm_path) -> None:  # type: ignore[no-untyped-def]
    """`serve` on a GPU captures at start-up the buckets of batches of up to N short queries:
    each once (eager run, then capture), and later batches of that traffic only replay."""
    from embedserve.server.warmup import warm_up_graphs

    engine = _bert_engine(minilm_path)
    assert warm_up_graphs(engine, 16) == 0  # no graphs on the CPU: nothing to warm
    engine.runner = _runner(engine)  # the CPU stand-in of the CUDA graphs
    warmed = warm_up_graphs(engine, 16)
    assert warmed == len(short_query_batches(16, engine.runner.config, engine.max_positions))
    assert engine.runner.num_graphs == engine.stats.captures == engine.stats.eager_runs == warmed
    rng = np.random.default_rng(1)
    for _ in range(40):  # one to 16 queries of 5 to 20 tokens
        seqlens = rng.integers(5, 21, int(rng.integers(1, 17))).tolist()
        engine.step(_random_batch(rng, seqlens, engine.vocab_size)).wait()
    assert engine.stats.captures == engine.stats.eager_runs == warmed
    assert engine.stats.replays >= 40


def test_short_query_batches_are_one_per_bucket_and_cover_random_traffic() -> None:
    config = GraphConfig()
    batches = short_query_batches(64, config, 512)
    keys = [plan_bucket(b, config, 512).key for b in batches]  # type: ignore[union-attr]
    assert len(keys) == len(set(keys)) and all(len(b) <= 64 for b in batches)
    rng = np.random.default_rng(0)
    for _ in range(2000):
        seqlens = rng.integers(5, 21, int(rng.integers(1, 65)))
        assert plan_bucket(seqlens, config, 512).key in keys  # type: ignore[union-attr]


def test_dense_plan_only_for_one_sequence_filling_the_bucket_solo_for_any_one_sequence() -> None:
    config = GraphConfig()
    dense = plan_bucket(np.array([128]), config, 512)
    assert dense is not None and dense.dense and dense.solo and dense.key == "t128-s2-l128-d"
    solo = plan_bucket(np.array([100]), config, 512)
    assert solo is not None and solo.solo and not solo.dense and solo.key == "t128-s2-l128-1"
    for seqlens, key in (([64, 64], "t128-s2-l64"), ([127, 1], "t128-s2-l128")):
        plan = plan_bucket(np.array(seqlens), config, 512)
        assert plan is not None and not plan.dense and not plan.solo and plan.key == key


@torch.inference_mode()
@pytest.mark.parametrize("causal", [False, True])
def test_cudnn_backend_dense_and_masked_equal_per_sequence_attention(causal: bool) -> None:
    """On the CPU the cudnn backend is plain SDPA: its mask logic is what is tested here."""
    from embedserve.engine.attention import RaggedLayout

    torch.manual_seed(1)
    lens = (5, 9, 2, 48)  # the last one stands for a dummy padding sequence
    t = sum(lens)
    q, k, v = torch.randn(t, 4, 8), torch.randn(t, 2, 8), torch.randn(t, 2, 8)
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32)
    seq_ids = torch.repeat_interleave(torch.arange(len(lens)), torch.tensor(lens))
    want = BACKENDS["sdpa_loop"](q, k, v, RaggedLayout(cu, 48, lens), causal)
    layout = RaggedLayout(cu, 64, (), seq_ids, mask=seq_ids[:, None] == seq_ids[None, :])
    for _ in range(2):  # the second call reuses the bias cached in the layout
        got = BACKENDS["cudnn"](q, k, v, layout, causal)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    one = torch.tensor([0, t], dtype=torch.int32)
    want = BACKENDS["sdpa_loop"](q, k, v, RaggedLayout(one, t, (t,)), causal)
    dense = RaggedLayout(one, t, (), torch.zeros(t, dtype=torch.int64), dense=True, solo=True)
    torch.testing.assert_close(BACKENDS["cudnn"](q, k, v, dense, causal), want)
    # one real sequence of 14 tokens, then padding (two dummy sequences): its rows equal it alone
    n, solo_ids = 14, torch.tensor([0] * 14 + [1] * 30 + [2] * 20)
    cu = torch.tensor([0, 14, 44, 64], dtype=torch.int32)
    alone = BACKENDS["sdpa_loop"](
        q[:n], k[:n], v[:n], RaggedLayout(one.clamp(max=n), n, (n,)), causal
    )
    solo = RaggedLayout(cu, 64, (), solo_ids, solo=True)
    got = BACKENDS["cudnn"](q, k, v, solo, causal)
    torch.testing.assert_close(got[:n], alone, atol=1e-5, rtol=1e-5)
    assert bool(torch.isfinite(got).all())  # padding rows are never read, but never NaN either


@torch.inference_mode()
def test_runner_with_cudnn_candidate_matches_eager_dense_padded_and_many(minilm_path) -> None:  # type: ignore[no-untyped-def]
    engine = _bert_engine(minilm_path)
    runner = _runner(engine, GraphConfig(attention=("block_mask", "cudnn")))
    rng = np.random.default_rng(7)
    for seqlens in ([128], [7], [100], [3, 50, 11], [64]):
        for _ in range(3):
            batch = _random_batch(rng, seqlens, engine.vocab_size)
            got = runner.run(batch)
            assert got is not None
            want = torch.from_numpy(engine.step(batch).wait())
            torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
    keys = set(engine.stats.attention_timings)
    assert {
        "t128-s2-l128-d",
        "t64-s2-l64-d",
        "t64-s2-l64-1",
        "t128-s2-l128-1",
        "t64-s4-l64",
    } <= keys
    assert all(set(t) == {"block_mask", "cudnn"} for t in engine.stats.attention_timings.values())
    assert not engine.stats.attention_errors


@torch.inference_mode()
def test_candidates_that_fail_or_disagree_are_dropped_and_recorded(
    minilm_path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    from embedserve.engine import graphs as graphs_module

    def broken(*args):  # type: ignore[no-untyped-def]
        raise RuntimeError("no kernel for this shape")

    def wrong(q, k, v, layout, causal, window=None, bias=None):  # type: ignore[no-untyped-def]
        return torch.zeros_like(q) + 1.0

    def with_cudnn(fake):  # type: ignore[no-untyped-def]
        return lambda choices: {**attention_backends(choices), "cudnn": fake}

    engine = _bert_engine(minilm_path)
    rng = np.random.default_rng(8)
    for fake, reason in ((broken, "no kernel"), (wrong, "disagrees")):
        monkeypatch.setattr(graphs_module, "attention_backends", with_cudnn(fake))
        engine.stats.attention_errors.clear()
        runner = _runner(engine, GraphConfig(attention=("block_mask", "cudnn")))
        batch = _random_batch(rng, [30, 20], engine.vocab_size)
        for _ in range(3):
            got = runner.run(batch)
            assert got is not None
            want = torch.from_numpy(engine.step(batch).wait())
            torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
        assert runner.attention_choice() == {"t64-s4-l64": "block_mask"}
        ((key, errors),) = engine.stats.attention_errors.items()
        assert key == "t64-s4-l64" and reason in errors["cudnn"]


def test_linear_computes_through_its_ops_table_with_nn_linear_keys() -> None:
    from dataclasses import replace

    from embedserve.engine.layers.linear import Linear
    from embedserve.engine.ops import EAGER_OPS

    torch.manual_seed(0)
    ref = torch.nn.Linear(8, 16)
    calls = []

    def counting(x, w, b):  # type: ignore[no-untyped-def]
        calls.append((tuple(w.shape), b is not None))
        return EAGER_OPS.linear(x, w, b)

    ops = replace(EAGER_OPS, linear=counting)
    layers = [Linear(8, 16, ops), Linear(8, 16, ops, bias=False)]
    for layer in layers:
        layer.load_state_dict(
            {k: v for k, v in ref.state_dict().items() if k in dict(layer.named_parameters())}
        )
    x = torch.randn(5, 8)
    torch.testing.assert_close(layers[0](x), ref(x))
    torch.testing.assert_close(layers[1](x), x @ ref.weight.T)
    assert calls == [((16, 8), True), ((16, 8), False)]
    assert set(layers[0].state_dict()) == set(ref.state_dict()) == {"weight", "bias"}
    assert set(layers[1].state_dict()) == {"weight"}


@torch.inference_mode()
def test_model_gets_its_ops_at_construction(minilm_path) -> None:  # type: ignore[no-untyped-def]
    """Every pointwise chain and matrix product of the model goes through the table it was
    built with: no nn.Linear left to patch."""
    from dataclasses import fields, replace

    from embedserve.engine.attention import RaggedLayout
    from embedserve.engine.models import build_model
    from embedserve.engine.ops import EAGER_OPS, Ops

    counts: dict[str, int] = {}

    def counted(name):  # type: ignore[no-untyped-def]
        def call(*args):  # type: ignore[no-untyped-def]
            counts[name] = counts.get(name, 0) + 1
            return getattr(EAGER_OPS, name)(*args)

        return call

    engine = _bert_engine(minilm_path)
    model = build_model(
        engine.spec, replace(EAGER_OPS, **{f.name: counted(f.name) for f in fields(Ops)})
    )
    assert not any(type(m) is torch.nn.Linear for m in model.modules())
    batch = PackedBatch.from_token_lists([[101, 2023, 102], [101, 102]])
    ids, pos, types = (
        torch.from_numpy(a) for a in (batch.input_ids, batch.positions, batch.token_type_ids)
    )
    layout = RaggedLayout(torch.from_numpy(batch.cu_seqlens), 3, (3, 2))
    got = model(ids, pos, types, layout, engine.attend)
    torch.testing.assert_close(got, engine.model(ids, pos, types, layout, engine.attend))
    num_layers = len(engine.model.layers)
    # the up-projection and its GELU are one chain (`ops.linear_gelu`: one kernel on CUDA)
    assert counts == {"bert_embed": 1, "linear": 3 * num_layers, "linear_gelu": num_layers,
                      "add_layer_norm": 2 * num_layers}  # fmt: skip


class _FailingGraph(EagerGraph):
    """A capture that raises, as CUDA's does when a kernel cannot be captured or memory is out."""

    attempts = 0

    def capture(self, fn):  # type: ignore[no-untyped-def]
        type(self).attempts += 1
        raise RuntimeError("operation not permitted when stream is capturing")


@torch.inference_mode()
def test_a_bucket_whose_capture_fails_runs_eagerly_from_then_on(minilm_path, caplog) -> None:  # type: ignore[no-untyped-def]
    engine = _bert_engine(minilm_path)
    runner = GraphRunner(
        engine._forward,
        device=torch.device("cpu"),
        config=GraphConfig(attention=("block_mask",)),
        stats=engine.stats,
        choices=KernelChoices(),
        max_positions=engine.max_positions,
        make_graph=_FailingGraph,
    )
    rng = np.random.default_rng(9)
    _FailingGraph.attempts = 0
    with caplog.at_level("WARNING", logger="embedserve.engine.graphs"):
        for _ in range(5):
            batch = _random_batch(rng, [12, 30], engine.vocab_size)
            got = runner.run(batch)  # every hit answers: the first eagerly, then never a capture
            assert got is not None
            want = torch.from_numpy(engine.step(batch).wait())
            torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
    assert _FailingGraph.attempts == 1  # captured once, never retried
    stats = engine.stats
    assert (stats.capture_failures, stats.captures, stats.replays, stats.eager_runs) == (1, 0, 0, 5)
    assert runner.num_graphs == 0
    warnings = [r for r in caplog.records if "capture failed" in r.getMessage()]
    assert len(warnings) == 1 and "t64-s4-l64" in warnings[0].getMessage()


def test_capture_failures_are_a_server_metric() -> None:
    from embedserve.engine.stats import EngineStats
    from embedserve.server.metrics import ENGINE_COUNTERS

    names = {field: name for field, name, _ in ENGINE_COUNTERS}
    assert names["capture_failures"] == "embedserve_engine_capture_failures"
    assert EngineStats().capture_failures == 0


def test_grid_parts_cover_the_batch_in_order_each_in_a_bucket() -> None:
    from embedserve.engine.buckets import grid_parts

    config = GraphConfig(max_tokens=256, max_seqs=8)
    rng = np.random.default_rng(4)
    seqlens = np.concatenate([rng.integers(1, 60, 40), [300], [1] * 30]).astype(np.int32)
    parts = grid_parts(seqlens, config, max_positions=512)
    assert parts[0][0] == 0 and parts[-1][1] == len(seqlens)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(parts))
    for start, stop in parts:
        plan = plan_bucket(seqlens[start:stop], config, 512)
        # only a sequence longer than the largest bucket is left outside the grid, alone
        assert plan is not None or (stop - start == 1 and seqlens[start] > 256)


@torch.inference_mode()
def test_a_batch_above_the_grid_is_split_in_the_step(minilm_path) -> None:  # type: ignore[no-untyped-def]
    """No forward sees more tokens than the largest bucket (but a sequence longer than it,
    alone); the rows equal the unsplit eager run."""
    engine = _bert_engine(minilm_path)
    want_engine = _bert_engine(minilm_path)
    seen: list[int] = []
    forward = engine._forward

    def recording(ids, *rest):  # type: ignore[no-untyped-def]
        seen.append(int(ids.shape[0]))
        return forward(ids, *rest)

    engine._forward = recording  # type: ignore[method-assign]
    engine.runner = _runner(
        engine, GraphConfig(max_tokens=256, max_seqs=8, attention=("block_mask",))
    )
    rng = np.random.default_rng(6)
    seqlens = [*rng.integers(1, 60, 30).tolist(), 400, *([2] * 20)]
    batch = _random_batch(rng, seqlens, engine.vocab_size)
    for _ in range(3):  # eager first hits, then captures, then replays
        seen.clear()
        got = engine.step(batch).wait()
        want = want_engine.step(batch).wait()
        np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-4)
        assert max(n for n in seen if n != 400) <= 256 and seen.count(400) == 1
    assert engine.stats.split_batches == 3 and engine.stats.replays > 0
