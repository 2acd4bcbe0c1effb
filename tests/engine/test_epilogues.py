"""The product-and-chain ops (`ops.CHAINS`) and how their fused kernels are chosen, on the CPU.

The eager chains compute exactly what the model computed before them (the product, then the
pointwise op); the choice between a fused kernel and the unfused pair (`tuning._tune_fused`)
takes a config only if it agrees with the pair and beats it by 3%. The kernels themselves run in
`tests/engine/test_graphs_gpu.py` (CUDA and Triton).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from embedserve.engine.kernels import tuning
from embedserve.engine.layers.linear import Linear
from embedserve.engine.ops import EAGER_OPS, Ops
from embedserve.engine.stats import EngineStats


def test_eager_chains_are_the_product_then_the_op() -> None:
    torch.manual_seed(0)
    t, nq, nk, d, h = 9, 4, 2, 16, 32
    x = torch.randn(t, h)
    w = torch.randn((nq + 2 * nk) * d, h)
    b = torch.randn((nq + 2 * nk) * d)
    qw, kw = torch.rand(d) + 0.5, torch.rand(d) + 0.5
    cos, sin = torch.randn(t, 1, d), torch.randn(t, 1, d)
    q, k, v = EAGER_OPS.qkv_norm_rope(x, w, b, nq, nk, qw, kw, cos, sin, 1e-6)
    wq, wk, wv = F.linear(x, w, b).split([nq * d, nk * d, nk * d], -1)
    want_q, want_k = EAGER_OPS.qk_norm_rope(
        wq.view(t, nq, d), wk.view(t, nk, d), qw, kw, cos, sin, 1e-6
    )
    assert torch.equal(q, want_q) and torch.equal(k, want_k)
    assert torch.equal(v, wv.view(t, nk, d))
    gate_up = torch.randn(12, h)
    assert torch.equal(
        EAGER_OPS.linear_silu_mul(x, gate_up), EAGER_OPS.silu_mul(F.linear(x, gate_up))
    )
    for approximate in ("none", "tanh"):
        assert torch.equal(
            EAGER_OPS.linear_gelu(x, w, b, approximate),
            F.gelu(F.linear(x, w, b), approximate=approximate),
        )


def test_linear_routes_gelu_and_silu_through_the_chains() -> None:
    """Unpacked, `Linear.activated` (GELU) and `Linear.silu_mul` call the table's chains (where
    CUDA fuses them); other activations and biased gate/up products keep the separate ops."""
    called: list[str] = []

    def spy(name: str) -> Any:
        def fn(*args: Any) -> torch.Tensor:
            called.append(name)
            return getattr(EAGER_OPS, name)(*args)

        return fn

    ops = Ops(linear_gelu=spy("linear_gelu"), linear_silu_mul=spy("linear_silu_mul"))
    layer = Linear(8, 6, ops, bias=False)
    with torch.no_grad():
        layer.weight.normal_()
    x = torch.randn(3, 8)
    assert torch.equal(layer.activated(x, nn.GELU()), F.gelu(F.linear(x, layer.weight)))
    assert torch.equal(layer.activated(x, nn.ReLU()), F.relu(F.linear(x, layer.weight)))
    assert torch.equal(layer.silu_mul(x), EAGER_OPS.silu_mul(F.linear(x, layer.weight)))
    assert called == ["linear_gelu", "linear_silu_mul"]


class _Config:
    def __init__(self, name: str, slower: float, wrong: bool = False) -> None:
        self.name, self.slower, self.wrong = name, slower, wrong


_RAN: list[float] = []  # the `slower` factor of the last call (1.0: the unfused pair)


@pytest.fixture
def timed_by_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """`_graph_us` without CUDA: a call's 'time' is the `slower` factor of what it ran."""

    def fake_graph_us(fn: Any, calls: int, replays: int = 5) -> float:
        fn(0)
        return _RAN[-1]

    monkeypatch.setattr(tuning, "_graph_us", fake_graph_us)


def _tune(configs: list[_Config]) -> tuple[Any, dict[str, Any]]:
    x = torch.randn(4, 8)
    weight = torch.randn(6, 8)

    def unfused(w: torch.Tensor) -> torch.Tensor:
        _RAN.append(1.0)
        return F.linear(x, w)

    def fused(w: torch.Tensor, c: _Config) -> torch.Tensor:
        _RAN.append(c.slower)
        y = F.linear(x, w)
        return y + 1.0 if c.wrong else y

    stats = EngineStats()
    choice = tuning._tune_fused("4x6x8+test", weight, configs, unfused, fused, stats)  # type: ignore[arg-type]
    return choice, stats.gemm_timings["4x6x8+test"]


@pytest.mark.usefixtures("timed_by_config")
def test_a_fused_config_is_taken_only_if_right_and_faster() -> None:
    fast, faster_but_wrong, slow = _Config("a", 0.5), _Config("b", 0.1, wrong=True), _Config("c", 2)
    choice, timings = _tune([slow, faster_but_wrong, fast])
    assert choice is fast and timings["chosen"] == "a"
    assert timings["unfused"] == 1.0 and timings["a"] == 0.5 and timings["c"] == 2.0
    assert str(timings["b"]).startswith("ValueError: relative error")
    # within 3% of the pair: the pair stays (the replays' noise)
    choice, timings = _tune([_Config("d", 0.98)])
    assert choice is None and timings["chosen"] == "unfused"


def test_fused_chains_run_unfused_off_cuda() -> None:
    """On the CPU (or without Triton) the chains are the unfused pair, measured nowhere."""
    from embedserve.engine.choices import KernelChoices
    from embedserve.engine.ops import _EAGER_CHAINS

    stats, choices = EngineStats(), KernelChoices()
    chains = tuning.fused_epilogues(choices, stats, _EAGER_CHAINS)
    x, w = torch.randn(5, 8), torch.randn(12, 8)
    assert torch.equal(chains["linear_silu_mul"](x, w), EAGER_OPS.linear_silu_mul(x, w))
    assert not stats.gemm_timings and not choices.gemm
