"""The pieces of the ONNX graphs `onnx_graph` writes: products, norms (LayerNorm and RMSNorm,
alone or with the residual added first), rotary tables, score biases by key - query distance
(MPNet's, a local window, a causal mask) and the key-value heads of grouped-query attention.

Each takes the writer's `node(op, inputs, out, ...)` and `w(name, tensor)` (an initializer) and
returns the name of what it adds.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import nn

from embedserve.engine.layers.norms import GemmaNorm
from embedserve.engine.layers.rotary import Rotary
from embedserve.engine.models.mpnet import MAX_DISTANCE

# a score no softmax weight survives: the keys outside a local layer's window, or after the
# query in a causal model
FAR = -1e30


def rotary_caches(w: Any, rotary: Rotary, positions: int, name: str) -> tuple[str, str]:
    """cos and sin [P, D / 2] of every position the model takes, as `Rotary` computes them
    (float32 angles, the halves rotated as in `ops.rope`: `RotaryEmbedding`'s interleaved=0)."""
    inv_freq = rotary.inv_freq(torch.device("cpu"))
    angles = torch.arange(positions, dtype=torch.int64).float()[:, None] * inv_freq[None, :]
    return w(name + "_cos", angles.cos()), w(name + "_sin", angles.sin())


def rotary_tables(
    w: Any, rotary: dict[bool, Rotary], positions: int
) -> dict[bool, tuple[str, str]]:
    """`rotary_caches` of a model with a rotary base per layer kind (True: global layers)."""
    return {kind: rotary_caches(w, r, positions, f"rope{int(kind)}") for kind, r in rotary.items()}


def glu(node: Any, w: Any, p: str, x: str, gate_up: nn.Module, act: str) -> str:
    """A gated MLP's product before the down one: act(gate) x up, from one product of
    (gate | up); `act` "silu" (SwiGLU), or ONNX Runtime's "Gelu" / "FastGelu" (GeGLU)."""
    gu = linear(node, w, p + "gu", x, gate_up)
    gate = node("Split", [gu], p + "gate", outputs=[p + "gate", p + "up"], axis=-1)
    if act == "silu":
        a = node("Mul", [gate, node("Sigmoid", [gate], p + "sig")], p + "act")
    else:
        a = node(act, [gate], p + "act", ms=True)
    return node("Mul", [a, p + "up"], p + "glu")


def gelu_op(approximate: str) -> str:
    """ONNX Runtime's GELU for an `F.gelu` approximation ("none": erf, "tanh")."""
    return "Gelu" if approximate == "none" else "FastGelu"


def head_rms(node: Any, w: Any, x: str, heads: int, d: int, norm: nn.Module,
             helper: Any) -> str:  # fmt: skip
    """RMSNorm of each head's D values of `x` [B, L, heads D]."""
    split = node("Reshape", [x, const(node, helper, x + "_4d", [0, 0, heads, d])], x + "_heads")
    normed = rms(node, w, x + "_norm", split, norm)
    return node("Reshape", [normed, const(node, helper, x + "_3d", [0, 0, heads * d])], x + "_n")


def repeat_heads(node: Any, x: str, heads: int, times: int, d: int, helper: Any) -> str:
    """[B, L, heads D] -> [B, L, heads times D]: each key-value head once per query head of its
    group (head i of the result is head i // times of `x`, as transformers' `repeat_kv`)."""
    if times == 1:
        return x
    one = node("Reshape", [x, const(node, helper, x + "_5d", [0, 0, heads, 1, d])], x + "_5")
    many = node("Concat", [one] * times, x + "_rep", axis=3)
    return node("Reshape", [many, const(node, helper, x + "_3d", [0, 0, heads * times * d])],
                x + "_all")  # fmt: skip


def rms(node: Any, w: Any, name: str, x: str, norm: nn.Module) -> str:
    return node("SimplifiedLayerNormalization", [x, w(name + "_g", rms_scale(norm))], name,
                axis=-1, epsilon=norm.eps)  # fmt: skip


def rms_scale(norm: nn.Module) -> torch.Tensor:
    """An RMSNorm's scale: its weight, or 1 + weight for Gemma's (in float32, as transformers)."""
    weight = cast(torch.Tensor, norm.weight).detach().float()
    return weight + 1.0 if isinstance(norm, GemmaNorm) else weight


def add_rms(node: Any, w: Any, name: str, x: str, residual: str,
            norm: nn.Module) -> tuple[str, str]:  # fmt: skip
    """(RMSNorm(x + residual), x + residual) in one `SkipSimplifiedLayerNormalization`."""
    node("SkipSimplifiedLayerNormalization", [x, residual, w(name + "_g", rms_scale(norm))], name,
         ms=True, outputs=[name, "", "", name + "_sum"], epsilon=norm.eps)  # fmt: skip
    return name, name + "_sum"


def linear(node: Any, w: Any, name: str, x: str, linear: nn.Module) -> str:
    """x W^T (+ b when the linear has one)."""
    y = node("MatMul", [x, w(name + "_w", linear.weight, True)], name + "_mm")
    if linear.bias is None:
        return y
    return node("Add", [y, w(name + "_b", linear.bias)], name)


def norm_params(w: Any, name: str, norm: nn.Module) -> list[str]:
    """A LayerNorm's scale, and its bias where it has one."""
    bias = [w(name + "_beta", norm.bias)] if norm.bias is not None else []
    return [w(name + "_g", norm.weight), *bias]


def add_norm(node: Any, w: Any, name: str, x: str, residual: str,
             norm: nn.Module) -> tuple[str, str]:  # fmt: skip
    """(LayerNorm(x + residual), x + residual) in one `SkipLayerNormalization`."""
    node("SkipLayerNormalization", [x, residual, *norm_params(w, name, norm)], name, ms=True,
         outputs=[name, "", "", name + "_sum"], epsilon=norm.eps)  # fmt: skip
    return name, name + "_sum"


def distances(node: Any, helper: Any) -> str:
    """[L, L] int64: key - query, the padded length L read from the ids."""
    length = node("Gather", [node("Shape", ["input_ids"], "d_shape"), const(node, helper, "d_one", [1])],
                  "d_len")  # fmt: skip
    zero, step = const(node, helper, "d_zero", [0]), const(node, helper, "d_step", [1])
    span = node("Range", [node("Squeeze", [zero], "d_z"), node("Squeeze", [length], "d_l"),
                          node("Squeeze", [step], "d_s")], "d_range")  # fmt: skip
    keys = node("Unsqueeze", [span, const(node, helper, "d_ax0", [0])], "d_keys")  # [1, L]
    queries = node("Unsqueeze", [span, const(node, helper, "d_ax1", [1])], "d_queries")  # [L, 1]
    return node("Sub", [keys, queries], "d_distance")


def const(node: Any, helper: Any, name: str, value: list[int] | float) -> str:
    """An int64 vector, or a float32 scalar."""
    from onnx import TensorProto

    if isinstance(value, float):
        tensor = helper.make_tensor(name, TensorProto.FLOAT, [], [value])
    else:
        tensor = helper.make_tensor(name, TensorProto.INT64, [len(value)], value)
    return node("Constant", [], name, value=tensor)


def distance_bias(node: Any, table: str, helper: Any) -> str:
    """[1, N, L, L]: MPNet's bias of each head for key - query distance: `table`'s column
    clamp(k - q, -R, R) + R (`mpnet.MAX_DISTANCE` = R)."""
    far = const(node, helper, "b_far", [MAX_DISTANCE])
    distance = distances(node, helper)
    clamped = node("Max", [node("Min", [distance, far], "b_min"), node("Neg", [far], "b_near")],
                   "b_clamped")  # fmt: skip
    column = node("Add", [clamped, far], "b_column")
    heads = node("Gather", [table, column], "b_heads", axis=1)  # [N, L, L]
    return node("Unsqueeze", [heads, const(node, helper, "b_ax_batch", [0])], "attention_bias")


def causal_bias(node: Any, helper: Any) -> str:
    """[1, 1, L, L]: 0 where the key is at or before the query, `FAR` after it."""
    after = node("Greater", [distances(node, helper), const(node, helper, "c_zero", [0])],
                 "c_after")  # fmt: skip
    scores = node("Where", [after, const(node, helper, "c_far", FAR),
                            const(node, helper, "c_near", 0.0)], "c_scores")  # fmt: skip
    return node("Unsqueeze", [scores, const(node, helper, "c_axes", [0, 1])], "causal_bias")


def band_bias(node: Any, window: int, helper: Any) -> str:
    """[1, 1, L, L]: 0 where |key - query| <= `window`, `FAR` elsewhere (a local layer's)."""
    outside = node("Greater", [node("Abs", [distances(node, helper)], "w_abs"),
                               const(node, helper, "w_window", [window])], "w_outside")  # fmt: skip
    scores = node("Where", [outside, const(node, helper, "w_far", FAR),
                            const(node, helper, "w_near", 0.0)], "w_scores")  # fmt: skip
    return node("Unsqueeze", [scores, const(node, helper, "w_axes", [0, 1])], "band_bias")


def skip_norm(node: Any, w: Any, name: str, x: str, residual: str, linear: nn.Module,
              norm: nn.LayerNorm) -> str:  # fmt: skip
    """LayerNorm(x W^T + b + residual): a MatMul, then the bias (if any), residual and norm in
    one op."""
    y = node("MatMul", [x, w(name + "_w", linear.weight, True)], name + "_mm")
    inputs = [y, residual, *norm_params(w, name, norm)]
    if linear.bias is not None:
        inputs.append(w(name + "_b", linear.bias))
    return node("SkipLayerNormalization", inputs, name, ms=True, epsilon=norm.eps)
