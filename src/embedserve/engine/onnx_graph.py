"""The ONNX graph of an encoder, written from the engine's own loaded weights (no exporter, no
tracing), in the fused form ONNX Runtime's CPU kernels take (`onnx_encoder` runs it).

BERT's family (and MPNet's, the same layers with a relative position bias): per layer one
`Attention` (fused QKV, softmax over the valid keys), a MatMul and a `SkipLayerNormalization`
(bias + residual + LayerNorm), a MatMul and a `BiasGelu`, a MatMul and a `SkipLayerNormalization`.
NomicBERT: the QKV product split three ways, `RotaryEmbedding` on q and k, `MultiHeadAttention`,
then SwiGLU; no linear has a bias.

Every graph takes (input_ids, positions, token_type_ids [B, L] int64, lengths [B] int32) and
gives hidden [B, L, H] float32.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from embedserve.engine.layers.rotary import Rotary
from embedserve.engine.models.bert import BertEncoder, BertLayer
from embedserve.engine.models.modernbert import ModernBertEncoder, ModernBertLayer
from embedserve.engine.models.mpnet import MAX_DISTANCE, MPNetEncoder
from embedserve.engine.models.nomic_bert import NomicBertEncoder, NomicBertLayer
from embedserve.engine.models.qwen3 import Qwen3Encoder, Qwen3Layer

# the encoders a graph is written for: BERT's family, MPNet (BERT's layers and a relative position
# bias), NomicBERT (rotary positions, SwiGLU, no biases), ModernBERT (pre-norm, rotary, GeGLU,
# local layers) and Qwen3 (RMSNorm, per-head q / k norms, grouped-query attention, causal or not)
Graphed = BertEncoder | MPNetEncoder | NomicBertEncoder | ModernBertEncoder | Qwen3Encoder
# a score no softmax weight survives: the keys outside a ModernBERT local layer's window, or
# after the query in a causal model
FAR = -1e30

# bump when the graph written below changes: the cached files of older versions are not reused
GRAPH_VERSION = 1
OPSET = 17


def supports(model: nn.Module) -> bool:
    """Whether a graph can be written for `model`: a BERT-family encoder (or MPNet's, the
    same layers with a relative position bias) whose FFN activation is the erf or tanh GELU or
    ReLU, or a NomicBERT one, and ONNX Runtime and onnx are installed."""
    if not isinstance(model, Graphed):
        return False
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    if isinstance(model, NomicBertEncoder | ModernBertEncoder | Qwen3Encoder):
        return True
    layers = cast(list[BertLayer], model.layers)
    linears = [m for layer in layers for m in (layer.qkv, layer.out, layer.up, layer.down)]
    return all(_activation_op(layer.act) is not None for layer in layers) and all(
        m.bias is not None for m in linears
    )


def _activation_op(act: nn.Module) -> str | None:
    if isinstance(act, nn.GELU):
        return "BiasGelu" if act.approximate == "none" else "FastGelu"
    if isinstance(act, nn.ReLU):
        return "Relu"
    return None


def _graph(model: Graphed) -> Any:  # onnx.ModelProto
    """The encoder's graph: (input_ids, positions, token_type_ids [B, L] int64, lengths [B]
    int32) -> hidden [B, L, H] float32, on the model's fp32 weights. MPNet's has no token types
    (the input is there, unread) and adds its relative position bias to every layer's scores."""
    from onnx import helper, numpy_helper

    inits: list[Any] = []
    nodes: list[Any] = []

    def w(name: str, t: torch.Tensor | None, transpose: bool = False) -> str:
        if t is None:  # `supports` rules out a BERT linear without its bias
            raise ValueError(f"{name}: the graph needs every bias")
        a = t.detach().float().cpu()
        inits.append(
            numpy_helper.from_array(np.ascontiguousarray((a.T if transpose else a).numpy()), name)
        )
        return name

    def node(op: str, inputs: list[str], out: str, ms: bool = False,
             outputs: list[str] | None = None, **attrs: Any) -> str:  # fmt: skip
        """One node named `out`; its outputs `[out]` unless given ("" for one not wanted)."""
        domain = "com.microsoft" if ms else ""
        nodes.append(helper.make_node(op, inputs, outputs or [out], name=out, domain=domain,
                                      **attrs))  # fmt: skip
        return out

    x, bias = _embedded(node, w, model, helper)
    if isinstance(model, Qwen3Encoder):  # no embedding norm: the first layer's RMSNorm
        return _finished(_qwen3_layers(node, w, x, model, helper), model, nodes, inits, helper)
    norm = model.embed_norm
    x = node("LayerNormalization", [x, *_norm_params(w, "e", norm)], "e_out", axis=-1,
             epsilon=norm.eps)  # fmt: skip
    if isinstance(model, ModernBertEncoder):
        x = _modern_layers(node, w, x, model, helper)
    elif isinstance(model, NomicBertEncoder):
        caches = _rotary_caches(w, model.rotary, model.cfg.max_position_embeddings, "rope")
        for n, nomic in enumerate(cast(list[NomicBertLayer], model.layers)):
            x = _nomic_layer(node, w, f"l{n}_", x, nomic, caches)
    else:
        for n, layer in enumerate(cast(list[BertLayer], model.layers)):
            x = _bert_layer(node, w, f"l{n}_", x, layer, bias)
    return _finished(x, model, nodes, inits, helper)


def _finished(x: str, model: Graphed, nodes: list[Any], inits: list[Any], helper: Any) -> Any:
    """The model around the nodes: `x` as the output `hidden`, the signature, the opsets."""
    nodes.append(helper.make_node("Identity", [x], ["hidden"], name="hidden"))
    inputs, outputs = _signature(model.cfg.hidden_size)
    graph = helper.make_graph(nodes, "embedserve_encoder", inputs, outputs, initializer=inits)
    opsets = [helper.make_opsetid("", OPSET), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, producer_name="embedserve")


def _bert_layer(node: Any, w: Any, p: str, x: str, layer: BertLayer, bias: str) -> str:
    """One post-norm BERT layer: the fused `Attention` (QKV product, softmax over each row's
    `lengths` keys, plus MPNet's score `bias`), then the FFN, each closed by a skip norm."""
    qkv = [w(p + "qkv_w", layer.qkv.weight, True), w(p + "qkv_b", layer.qkv.bias)]
    extra = ["", bias] if bias else []  # the 5th input, a past state: none
    a = node("Attention", [x, *qkv, "lengths", *extra], p + "attn", ms=True,
             num_heads=layer.num_heads)  # fmt: skip
    x = _skip_norm(node, w, p + "attn_out", a, x, layer.out, layer.attn_norm)
    up = node("MatMul", [x, w(p + "up_w", layer.up.weight, True)], p + "up")
    h = _activated(node, w, p, up, layer)
    return _skip_norm(node, w, p + "ffn_out", h, x, layer.down, layer.ffn_norm)


def _rotary_caches(w: Any, rotary: Rotary, positions: int, name: str) -> tuple[str, str]:
    """cos and sin [P, D / 2] of every position the model takes, as `Rotary` computes them
    (float32 angles, the halves rotated as in `ops.rope`: `RotaryEmbedding`'s interleaved=0)."""
    inv_freq = rotary.inv_freq(torch.device("cpu"))
    angles = torch.arange(positions, dtype=torch.int64).float()[:, None] * inv_freq[None, :]
    return w(name + "_cos", angles.cos()), w(name + "_sin", angles.sin())


def _rotary_attention(node: Any, w: Any, p: str, x: str,
                      layer: NomicBertLayer | ModernBertLayer, caches: tuple[str, str],
                      band: str) -> str:  # fmt: skip
    """Attention before the output product: the QKV product split three ways, rotary on q and
    k, softmax over each row's `lengths` keys (and within a local layer's `band`)."""
    qkv = _linear(node, w, p + "qkv", x, layer.qkv)
    q = node("Split", [qkv], p + "q", outputs=[p + "q", p + "k", p + "v"], axis=-1)
    heads = layer.num_heads
    rotated = [node("RotaryEmbedding", [t, "positions", *caches], f"{t}_rope", ms=True,
                    num_heads=heads, interleaved=0) for t in (q, p + "k")]  # fmt: skip
    masks = ["", "lengths", *([band] if band else [])]  # the 4th input, a QKV bias: none
    return node("MultiHeadAttention", [*rotated, p + "v", *masks], p + "attn", ms=True,
                num_heads=heads)  # fmt: skip


def _nomic_layer(node: Any, w: Any, p: str, x: str, layer: NomicBertLayer,
                 caches: tuple[str, str]) -> str:  # fmt: skip
    """One NomicBERT layer (post-norm): rotary attention, the output product and its skip norm;
    then SwiGLU (gate | up in one product) and the down product's skip norm."""
    a = _rotary_attention(node, w, p, x, layer, caches, "")
    x = _skip_norm(node, w, p + "attn_out", a, x, layer.out, layer.attn_norm)
    gu = _linear(node, w, p + "gu", x, layer.gate_up)
    gate = node("Split", [gu], p + "gate", outputs=[p + "gate", p + "up"], axis=-1)
    silu = node("Mul", [gate, node("Sigmoid", [gate], p + "sig")], p + "silu")
    h = node("Mul", [silu, p + "up"], p + "swiglu")
    return _skip_norm(node, w, p + "ffn_out", h, x, layer.down, layer.mlp_norm)


def _modern_layers(node: Any, w: Any, x: str, model: ModernBertEncoder, helper: Any) -> str:
    """ModernBERT's layers (pre-norm: each norm adds the residual first and hands the sum on),
    each global or local (keys within `window` of the query: the band bias) with its own rotary
    base; GeGLU (input | gate in one product); the final norm."""
    cfg = model.cfg
    caches = {kind: _rotary_caches(w, rotary, cfg.max_position_embeddings, f"rope{int(kind)}")
              for kind, rotary in model.rotary.items()}  # fmt: skip
    band = "" if all(cfg.global_layers) else _band_bias(node, cfg.window, helper)
    h, residual = x, x
    for n, layer in enumerate(cast(list[ModernBertLayer], model.layers)):
        p, full = f"l{n}_", cfg.global_layers[n]
        if layer.attn_norm is not None:  # layer 0's input is the normed embeddings
            h, residual = _add_norm(node, w, p + "attn_norm", h, residual, layer.attn_norm)
        a = _rotary_attention(node, w, p, h, layer, caches[full], "" if full else band)
        out = _linear(node, w, p + "out", a, layer.out)
        h, residual = _add_norm(node, w, p + "mlp_norm", out, residual, layer.mlp_norm)
        ug = _linear(node, w, p + "ug", h, layer.up_gate)
        up = node("Split", [ug], p + "in", outputs=[p + "in", p + "gate"], axis=-1)
        gelu = "Gelu" if layer.approximate == "none" else "FastGelu"
        act = node(gelu, [up], p + "act", ms=True)
        h = _linear(node, w, p + "down", node("Mul", [act, p + "gate"], p + "geglu"), layer.down)
    if not model.layers:
        return node("LayerNormalization", [x, *_norm_params(w, "final", model.final_norm)],
                    "final", axis=-1, epsilon=model.final_norm.eps)  # fmt: skip
    return _add_norm(node, w, "final", h, residual, model.final_norm)[0]


def _qwen3_layers(node: Any, w: Any, x: str, model: Qwen3Encoder, helper: Any) -> str:
    """Qwen3's layers: RMSNorm (each after the first adds the residual and hands the sum on),
    the QKV product split by head counts, per-head RMSNorm of q and k, rotary, the key-value
    heads repeated for their query heads, attention (causal: the keys after each query scored
    `FAR`), the output product; RMSNorm, SwiGLU; the final RMSNorm."""
    cfg = model.cfg
    caches = _rotary_caches(w, model.rotary, cfg.max_position_embeddings, "rope")
    causal = _causal_bias(node, helper) if model.causal else ""
    h, residual = "", x
    for n, layer in enumerate(cast(list[Qwen3Layer], model.layers)):
        p = f"l{n}_"
        if n:
            h, residual = _add_rms(node, w, p + "in_norm", x, residual, layer.input_norm)
        else:
            h = _rms(node, w, p + "in_norm", x, layer.input_norm)
        a = _grouped_attention(node, w, p, h, layer, caches, causal, helper)
        out = node("MatMul", [a, w(p + "out_w", layer.out.weight, True)], p + "out")
        h, residual = _add_rms(node, w, p + "post_norm", out, residual, layer.post_attn_norm)
        gu = node("MatMul", [h, w(p + "gu_w", layer.gate_up.weight, True)], p + "gu")
        gate = node("Split", [gu], p + "gate", outputs=[p + "gate", p + "up"], axis=-1)
        silu = node("Mul", [gate, node("Sigmoid", [gate], p + "sig")], p + "silu")
        h2 = node("Mul", [silu, p + "up"], p + "swiglu")
        x = node("MatMul", [h2, w(p + "down_w", layer.down.weight, True)], p + "down")
    if not model.layers:
        return _rms(node, w, "final", x, model.norm)
    return _add_rms(node, w, "final", x, residual, model.norm)[0]


def _grouped_attention(node: Any, w: Any, p: str, h: str, layer: Qwen3Layer,
                       caches: tuple[str, str], causal: str, helper: Any) -> str:  # fmt: skip
    """Qwen3's attention before its output product, [B, L, Nq D]."""
    nq, nkv, d = layer.num_heads, layer.num_kv_heads, layer.head_dim
    qkv = _linear(node, w, p + "qkv", h, layer.qkv)
    sizes = _const(node, helper, p + "sizes", [nq * d, nkv * d, nkv * d])
    node("Split", [qkv, sizes], p + "q", outputs=[p + "q", p + "k", p + "v"], axis=-1)
    q, k = (
        node("RotaryEmbedding", [_head_rms(node, w, p + t, heads, d, norm, helper), "positions",
                                 *caches], f"{p}{t}_rope", ms=True, num_heads=heads,
             interleaved=0)
        for t, heads, norm in (("q", nq, layer.q_norm), ("k", nkv, layer.k_norm))
    )  # fmt: skip
    k, v = (_repeat_heads(node, t, nkv, nq // nkv, d, helper) for t in (k, p + "v"))
    masks = ["", "lengths", *([causal] if causal else [])]
    return node("MultiHeadAttention", [q, k, v, *masks], p + "attn", ms=True, num_heads=nq)


def _head_rms(node: Any, w: Any, x: str, heads: int, d: int, norm: nn.Module,
              helper: Any) -> str:  # fmt: skip
    """RMSNorm of each head's D values of `x` [B, L, heads D]."""
    split = node("Reshape", [x, _const(node, helper, x + "_4d", [0, 0, heads, d])], x + "_heads")
    normed = _rms(node, w, x + "_norm", split, norm)
    return node("Reshape", [normed, _const(node, helper, x + "_3d", [0, 0, heads * d])], x + "_n")


def _repeat_heads(node: Any, x: str, heads: int, times: int, d: int, helper: Any) -> str:
    """[B, L, heads D] -> [B, L, heads times D]: each key-value head once per query head of its
    group (head i of the result is head i // times of `x`, as transformers' `repeat_kv`)."""
    if times == 1:
        return x
    one = node("Reshape", [x, _const(node, helper, x + "_5d", [0, 0, heads, 1, d])], x + "_5")
    many = node("Concat", [one] * times, x + "_rep", axis=3)
    return node("Reshape", [many, _const(node, helper, x + "_3d", [0, 0, heads * times * d])],
                x + "_all")  # fmt: skip


def _rms(node: Any, w: Any, name: str, x: str, norm: nn.Module) -> str:
    return node("SimplifiedLayerNormalization", [x, w(name + "_g", norm.weight)], name,
                axis=-1, epsilon=norm.eps)  # fmt: skip


def _add_rms(node: Any, w: Any, name: str, x: str, residual: str,
             norm: nn.Module) -> tuple[str, str]:  # fmt: skip
    """(RMSNorm(x + residual), x + residual) in one `SkipSimplifiedLayerNormalization`."""
    node("SkipSimplifiedLayerNormalization", [x, residual, w(name + "_g", norm.weight)], name,
         ms=True, outputs=[name, "", "", name + "_sum"], epsilon=norm.eps)  # fmt: skip
    return name, name + "_sum"


def _linear(node: Any, w: Any, name: str, x: str, linear: nn.Module) -> str:
    """x W^T (+ b when the linear has one)."""
    y = node("MatMul", [x, w(name + "_w", linear.weight, True)], name + "_mm")
    if linear.bias is None:
        return y
    return node("Add", [y, w(name + "_b", linear.bias)], name)


def _norm_params(w: Any, name: str, norm: nn.Module) -> list[str]:
    """A LayerNorm's scale, and its bias where it has one."""
    bias = [w(name + "_beta", norm.bias)] if norm.bias is not None else []
    return [w(name + "_g", norm.weight), *bias]


def _add_norm(node: Any, w: Any, name: str, x: str, residual: str,
              norm: nn.Module) -> tuple[str, str]:  # fmt: skip
    """(LayerNorm(x + residual), x + residual) in one `SkipLayerNormalization`."""
    node("SkipLayerNormalization", [x, residual, *_norm_params(w, name, norm)], name, ms=True,
         outputs=[name, "", "", name + "_sum"], epsilon=norm.eps)  # fmt: skip
    return name, name + "_sum"


def _embedded(node: Any, w: Any, model: Graphed, helper: Any) -> tuple[str, str]:
    """The summed embeddings before their norm, and the score bias every layer's `Attention`
    adds: MPNet's by distance, or "" (none) for BERT's family, which has token types instead.
    NomicBERT's, ModernBERT's and Qwen3's have no position table (rotary in every layer)."""
    if isinstance(model, ModernBertEncoder | Qwen3Encoder):  # no token types, rotary
        return node("Gather", [w("word", model.embed.weight), "input_ids"], "e_word"), ""
    ids = node("Gather", [w("word", model.word.weight), "input_ids"], "e_word")
    if isinstance(model, NomicBertEncoder):
        typ = node("Gather", [w("token_type", model.token_type.weight), "token_type_ids"], "e_type")
        return node("Add", [ids, typ], "e_sum"), ""
    pos = node("Gather", [w("position", model.position.weight), "positions"], "e_pos")
    x = node("Add", [ids, pos], "e_sum1")
    if isinstance(model, BertEncoder):
        typ = node("Gather", [w("token_type", model.token_type.weight), "token_type_ids"], "e_type")
        return node("Add", [x, typ], "e_sum"), ""
    table = model.relative(model.distance_buckets).T  # [N, 2 * MAX_DISTANCE + 1]
    return x, _distance_bias(node, w("relative", table), helper)


def _distances(node: Any, helper: Any) -> str:
    """[L, L] int64: key - query, the padded length L read from the ids."""
    length = node("Gather", [node("Shape", ["input_ids"], "d_shape"), _const(node, helper, "d_one", [1])],
                  "d_len")  # fmt: skip
    zero, step = _const(node, helper, "d_zero", [0]), _const(node, helper, "d_step", [1])
    span = node("Range", [node("Squeeze", [zero], "d_z"), node("Squeeze", [length], "d_l"),
                          node("Squeeze", [step], "d_s")], "d_range")  # fmt: skip
    keys = node("Unsqueeze", [span, _const(node, helper, "d_ax0", [0])], "d_keys")  # [1, L]
    queries = node("Unsqueeze", [span, _const(node, helper, "d_ax1", [1])], "d_queries")  # [L, 1]
    return node("Sub", [keys, queries], "d_distance")


def _const(node: Any, helper: Any, name: str, value: list[int] | float) -> str:
    """An int64 vector, or a float32 scalar."""
    from onnx import TensorProto

    if isinstance(value, float):
        tensor = helper.make_tensor(name, TensorProto.FLOAT, [], [value])
    else:
        tensor = helper.make_tensor(name, TensorProto.INT64, [len(value)], value)
    return node("Constant", [], name, value=tensor)


def _distance_bias(node: Any, table: str, helper: Any) -> str:
    """[1, N, L, L]: MPNet's bias of each head for key - query distance: `table`'s column
    clamp(k - q, -R, R) + R (`mpnet.MAX_DISTANCE` = R)."""
    far = _const(node, helper, "b_far", [MAX_DISTANCE])
    distance = _distances(node, helper)
    clamped = node("Max", [node("Min", [distance, far], "b_min"), node("Neg", [far], "b_near")],
                   "b_clamped")  # fmt: skip
    column = node("Add", [clamped, far], "b_column")
    heads = node("Gather", [table, column], "b_heads", axis=1)  # [N, L, L]
    return node("Unsqueeze", [heads, _const(node, helper, "b_ax_batch", [0])], "attention_bias")


def _causal_bias(node: Any, helper: Any) -> str:
    """[1, 1, L, L]: 0 where the key is at or before the query, `FAR` after it."""
    after = node("Greater", [_distances(node, helper), _const(node, helper, "c_zero", [0])],
                 "c_after")  # fmt: skip
    scores = node("Where", [after, _const(node, helper, "c_far", FAR),
                            _const(node, helper, "c_near", 0.0)], "c_scores")  # fmt: skip
    return node("Unsqueeze", [scores, _const(node, helper, "c_axes", [0, 1])], "causal_bias")


def _band_bias(node: Any, window: int, helper: Any) -> str:
    """[1, 1, L, L]: 0 where |key - query| <= `window`, `FAR` elsewhere (a local layer's)."""
    outside = node("Greater", [node("Abs", [_distances(node, helper)], "w_abs"),
                               _const(node, helper, "w_window", [window])], "w_outside")  # fmt: skip
    scores = node("Where", [outside, _const(node, helper, "w_far", FAR),
                            _const(node, helper, "w_near", 0.0)], "w_scores")  # fmt: skip
    return node("Unsqueeze", [scores, _const(node, helper, "w_axes", [0, 1])], "band_bias")


def _signature(hidden_size: int) -> tuple[list[Any], list[Any]]:
    """The graph's inputs (input_ids, positions, token_type_ids [B, L] int64, lengths [B]
    int32) and its output (hidden [B, L, H] float32)."""
    from onnx import TensorProto, helper

    ints = [
        helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "length"])
        for name in ("input_ids", "positions", "token_type_ids")
    ]
    ints.append(helper.make_tensor_value_info("lengths", TensorProto.INT32, ["batch"]))
    out = helper.make_tensor_value_info(
        "hidden", TensorProto.FLOAT, ["batch", "length", hidden_size]
    )
    return ints, [out]


def _activated(node: Any, w: Any, p: str, up: str, layer: BertLayer) -> str:
    """The FFN's activation of the up product `up` plus its bias: one fused op (`BiasGelu`,
    `FastGelu`), or an Add then the `Relu`."""
    op = _activation_op(layer.act)
    if op == "Relu":
        return node(
            "Relu", [node("Add", [up, w(p + "up_b", layer.up.bias)], p + "up_b")], p + "act"
        )
    return node(str(op), [up, w(p + "up_b", layer.up.bias)], p + "act", ms=True)


def _skip_norm(node: Any, w: Any, name: str, x: str, residual: str, linear: nn.Module,
               norm: nn.LayerNorm) -> str:  # fmt: skip
    """LayerNorm(x W^T + b + residual): a MatMul, then the bias (if any), residual and norm in
    one op."""
    y = node("MatMul", [x, w(name + "_w", linear.weight, True)], name + "_mm")
    inputs = [y, residual, *_norm_params(w, name, norm)]
    if linear.bias is not None:
        inputs.append(w(name + "_b", linear.bias))
    return node("SkipLayerNormalization", inputs, name, ms=True, epsilon=norm.eps)


def write_graph(model: Graphed, path: Path) -> None:
    """Write the graph (weights as external data beside it: a large vocabulary passes protobuf's
    2 GB limit) into `path`'s folder, atomically: a concurrent start never reads half a file."""
    import onnx

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=".tmp-"))
    onnx.save_model(_graph(model), str(tmp / path.name), save_as_external_data=True,
                    all_tensors_to_one_file=True, location=path.name + ".data")  # fmt: skip
    # the data file first: the graph's presence is what says the pair is complete
    os.replace(tmp / (path.name + ".data"), path.parent / (path.name + ".data"))
    os.replace(tmp / path.name, path)
    tmp.rmdir()
