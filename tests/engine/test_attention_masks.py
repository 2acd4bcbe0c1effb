"""Sliding windows and distance biases on every SDPA backend (CPU), against attention written
out in float64 per sequence: the masks the GPU graphs use (block-diagonal, solo with padding,
dense) are built by the same code here."""

from __future__ import annotations

import pytest
import torch

from embedserve.engine.attention import RaggedLayout, attention_backends, distance_bias
from embedserve.engine.choices import KernelChoices

BACKENDS = attention_backends(KernelChoices())


def reference(q, k, v, lens, causal, window, bias):  # type: ignore[no-untyped-def]
    out, start = [], 0
    for n in lens:
        qs, ks, vs = (t[start : start + n].double().transpose(0, 1) for t in (q, k, v))
        scores = qs @ ks.transpose(1, 2) / q.shape[-1] ** 0.5  # [N, n, n]
        i = torch.arange(n)
        d = i[None, :] - i[:, None]  # key - query
        keep = torch.ones(n, n, dtype=torch.bool)
        if window is not None:
            keep &= d.abs() <= window
        if causal:
            keep &= d <= 0
        if bias is not None:
            scores = scores + distance_bias(bias.double(), n)
        scores = scores.masked_fill(~keep, float("-inf"))
        out.append((scores.softmax(-1) @ vs).transpose(0, 1))
        start += n
    return torch.cat(out)


def layout(lens: list[int], **flags):  # type: ignore[no-untyped-def]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    seq_ids = torch.repeat_interleave(torch.arange(len(lens)), torch.tensor(lens))
    return RaggedLayout(cu, max(lens), tuple(lens), seq_ids, **flags)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("window", "with_bias"), [(4, False), (None, True), (3, True)])
@pytest.mark.parametrize("name", ["sdpa_loop", "block_mask", "padded", "cudnn"])
def test_windows_and_biases_match_the_written_out_attention(
    name: str, causal: bool, window: int | None, with_bias: bool
) -> None:
    torch.manual_seed(0)
    lens = [5, 40, 1, 13]
    t = sum(lens)
    q, k, v = (torch.randn(t, 4, 16) for _ in range(3))
    bias = torch.randn(4, 2 * 6 + 1) if with_bias else None  # distances clamped to +-6
    want = reference(q, k, v, lens, causal, window, bias)
    got = BACKENDS[name](q, k, v, layout(lens), causal, window, bias)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("window", "with_bias"), [(4, False), (None, True), (2, True)])
def test_one_real_sequence_with_padding_and_dense(window: int | None, with_bias: bool) -> None:
    """The graph layouts of one text: `solo` (padding after it) and `dense` (no padding)."""
    torch.manual_seed(1)
    n, t = 23, 32
    q, k, v = (torch.randn(t, 4, 16) for _ in range(3))
    bias = torch.randn(4, 9) if with_bias else None
    want = reference(q[:n], k[:n], v[:n], [n], False, window, bias)
    solo = layout([n, t - n], solo=True)
    got = BACKENDS["cudnn"](q, k, v, solo, False, window, bias)[:n]
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
    dense_want = reference(q, k, v, [t], False, window, bias)
    dense = layout([t], solo=True, dense=True)
    got = BACKENDS["cudnn"](q, k, v, dense, False, window, bias)
    torch.testing.assert_close(got.double(), dense_want, atol=1e-5, rtol=1e-5)


def test_flash_refuses_a_bias() -> None:
    q = torch.randn(4, 2, 8)
    with pytest.raises(ValueError, match="no score bias"):
        BACKENDS["varlen"](q, q, q, layout([4]), False, None, torch.zeros(2, 3))


def test_padded_in_a_graph_layout() -> None:
    """As a bucket hands it over: a bound above the longest sequence, dummy and empty
    sequences after the real ones."""
    torch.manual_seed(2)
    lens = [5, 40, 13]
    t = 64
    q, k, v = (torch.randn(t, 4, 16) for _ in range(3))
    bias = torch.randn(4, 2 * 6 + 1)
    want = reference(q[:58], k[:58], v[:58], lens, False, 3, bias)
    cu = torch.tensor([0, 5, 45, 58, 64, 64, 64, 64], dtype=torch.int32)  # a dummy, then empty
    seq_ids = torch.repeat_interleave(torch.arange(7), cu[1:] - cu[:-1])
    bucket = RaggedLayout(cu, 64, (), seq_ids)
    got = BACKENDS["padded"](q, k, v, bucket, False, 3, bias)
    assert bool(torch.isfinite(got).all())
    torch.testing.assert_close(got[:58].double(), want, atol=1e-5, rtol=1e-5)


def test_a_model_with_a_score_bias_never_gets_flash_attention(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from embedserve.devtools.checkpoints import make_checkpoint
    from embedserve.engine.engine import Engine

    folder = make_checkpoint(tmp_path / "m", arch="mpnet-tiny", dtype="float32", seed=1)
    with pytest.raises(ValueError, match="score bias"):
        Engine.from_folder(folder, device="cpu", dtype="float32", attention_backend="varlen")
    # its graphs try the padded backend first, the masked ones after (here on the CPU
    # stand-in for CUDA graphs): eager hit, capture, replay all equal the eager engine
    from embedserve.engine.batch import PackedBatch
    from embedserve.engine.choices import KernelChoices
    from embedserve.engine.graphs import EagerGraph, GraphConfig, GraphRunner, graph_config

    engine = Engine.from_folder(folder, device="cpu", dtype="float32")
    config = graph_config(engine.spec, GraphConfig(max_tokens=512), None)
    assert config.attention == ("padded", "cudnn", "block_mask")
    runner = GraphRunner(
        engine._forward,
        device=torch.device("cpu"),
        config=config,
        stats=engine.stats,
        choices=KernelChoices(),
        max_positions=engine.max_positions,
        make_graph=EagerGraph,
    )
    rng = torch.Generator().manual_seed(0)
    batch = PackedBatch.from_token_lists(
        [torch.randint(5, 30000, (n,), generator=rng).tolist() for n in (7, 90, 33)]
    )
    want = torch.from_numpy(engine.step(batch).wait())
    for _ in range(3):
        got = runner.run(batch)
        assert got is not None
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    assert set(runner.attention_choice().values()) <= {"padded", "cudnn", "block_mask"}


@pytest.mark.parametrize("name", ["sdpa_loop", "block_mask", "padded", "cudnn"])
def test_masks_are_built_once_per_forward(name: str) -> None:
    """Every layer of a forward attends with the masks the first one built (`attention.masks`)."""
    torch.manual_seed(3)
    lens = [5, 40, 1, 13]
    t = sum(lens)
    q, k, v = (torch.randn(t, 4, 16) for _ in range(3))
    bias = torch.randn(4, 13)
    shared = layout(lens)
    first = BACKENDS[name](q, k, v, shared, True, 4, bias)
    built = dict(shared.cache)
    assert built  # the first layer built its masks
    again = BACKENDS[name](q, k, v, shared, True, 4, bias)
    assert shared.cache.keys() == built.keys()
    assert all(shared.cache[key] is mask for key, mask in built.items())
    torch.testing.assert_close(again, first, atol=0, rtol=0)


def test_each_backend_is_one_record() -> None:
    from embedserve.engine.attention import BACKENDS as RECORDS
    from embedserve.engine.attention import CAPTURE_SAFE, MASKED

    assert CAPTURE_SAFE == ("varlen", "block_mask", "padded", "cudnn")
    assert MASKED == ("block_mask", "cudnn")
    assert [n for n, b in RECORDS.items() if not b.takes_bias] == ["varlen"]
    assert [n for n, b in RECORDS.items() if b.cuda_only] == ["varlen"]


def test_the_family_row_picks_a_models_kernels() -> None:
    """MPNet's row names its kernels (its score bias FlashAttention cannot take); BERT's none."""
    from embedserve.engine.attention import graph_candidates, model_backend
    from embedserve.loading.families import FAMILY_BY_NAME

    mpnet, bert = FAMILY_BY_NAME["mpnet"], FAMILY_BY_NAME["bert"]
    configured = ("varlen", "block_mask", "cudnn")
    assert graph_candidates(mpnet, configured, None) == ("padded", "cudnn", "block_mask")
    assert graph_candidates(mpnet, ("varlen",), "padded") == ("padded",)
    assert graph_candidates(mpnet, configured, "cudnn") == ("cudnn",)
    assert graph_candidates(bert, configured, None) == configured
    assert graph_candidates(bert, configured, "padded") == ("padded",)
    cpu, choices = torch.device("cpu"), KernelChoices()
    with pytest.raises(ValueError, match="mpnet models add a score bias varlen cannot take"):
        model_backend(mpnet, "varlen", cpu, choices)
    with pytest.raises(ValueError, match="needs a CUDA device"):
        model_backend(bert, "varlen", cpu, choices)
    q = torch.randn(6, 2, 8)
    lay = layout([6])
    want = BACKENDS["sdpa_loop"](q, q, q, lay, False)
    torch.testing.assert_close(model_backend(mpnet, None, cpu, choices)(q, q, q, lay, False), want)


def test_a_window_mask_of_8192_tokens_builds_no_int64_square() -> None:
    """|j - i| <= window on an int64 [n, n] and its abs: ~1.1 GB for one 8,192-token ModernBERT
    text on the CPU. Measured in a fresh process: the peak grows by the bool masks only."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    probe = (
        "import json, resource, torch\n"
        "from embedserve.engine.attention.masks import allowed\n"
        "small = allowed(50, torch.device('cpu'), False, 7, None)\n"
        "i = torch.arange(50)\n"
        "assert torch.equal(small, (i[None, :] - i[:, None]).abs() <= 7)\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "keep = allowed(8192, torch.device('cpu'), True, 64, None)\n"
        "after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "print(json.dumps({'grew_mb': (after - before) / 1024, 'kept': int(keep.sum())}))\n"
    )
    src = str(Path(__file__).resolve().parents[2] / "src")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          env={"PYTHONPATH": src, "PATH": "/usr/bin:/bin"}, check=True, timeout=120)  # fmt: skip
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["kept"] == sum(min(i, 64) + 1 for i in range(8192))
    assert out["grew_mb"] < 400, out  # bool [n, n] masks are 64 MB each
