"""The layers of the rotary families in ONNX graphs (`onnx_graph` writes the rest): NomicBERT,
ModernBERT, Qwen3 and Gemma 3 (EmbeddingGemma), their attention through `RotaryEmbedding` and
`MultiHeadAttention`."""

from __future__ import annotations

import math
from typing import Any, cast

import torch

from embedserve.engine import onnx_nodes as on
from embedserve.engine.models.gemma3 import Gemma3Encoder, Gemma3Layer
from embedserve.engine.models.modernbert import ModernBertEncoder, ModernBertLayer
from embedserve.engine.models.nomic_bert import NomicBertEncoder, NomicBertLayer
from embedserve.engine.models.qwen3 import Qwen3Encoder, Qwen3Layer


def rotary_attention(node: Any, w: Any, p: str, x: str,
                     layer: NomicBertLayer | ModernBertLayer, caches: tuple[str, str],
                     band: str) -> str:  # fmt: skip
    """Attention before the output product: the QKV product split three ways, rotary on q and
    k, softmax over each row's `lengths` keys (and within a local layer's `band`)."""
    qkv = on.linear(node, w, p + "qkv", x, layer.qkv)
    q = node("Split", [qkv], p + "q", outputs=[p + "q", p + "k", p + "v"], axis=-1)
    heads = layer.num_heads
    rotated = [node("RotaryEmbedding", [t, "positions", *caches], f"{t}_rope", ms=True,
                    num_heads=heads, interleaved=0) for t in (q, p + "k")]  # fmt: skip
    masks = ["", "lengths", *([band] if band else [])]  # the 4th input, a QKV bias: none
    return node("MultiHeadAttention", [*rotated, p + "v", *masks], p + "attn", ms=True,
                num_heads=heads)  # fmt: skip


def nomic_layers(node: Any, w: Any, x: str, model: NomicBertEncoder) -> str:
    """NomicBERT's layers (post-norm): rotary attention, the output product and its skip norm;
    then SwiGLU and the down product's skip norm."""
    caches = on.rotary_caches(w, model.rotary, model.cfg.max_position_embeddings, "rope")
    for n, layer in enumerate(cast(list[NomicBertLayer], model.layers)):
        p = f"l{n}_"
        a = rotary_attention(node, w, p, x, layer, caches, "")
        x = on.skip_norm(node, w, p + "attn_out", a, x, layer.out, layer.attn_norm)
        h = on.glu(node, w, p, x, layer.gate_up, "silu")
        x = on.skip_norm(node, w, p + "ffn_out", h, x, layer.down, layer.mlp_norm)
    return x


def modern_layers(node: Any, w: Any, x: str, model: ModernBertEncoder, helper: Any) -> str:
    """ModernBERT's layers (pre-norm: each norm adds the residual first and hands the sum on),
    each global or local (keys within `window` of the query: the band bias) with its own rotary
    base; GeGLU (input | gate in one product); the final norm."""
    cfg = model.cfg
    caches = on.rotary_tables(w, model.rotary, cfg.max_position_embeddings)
    band = "" if all(cfg.global_layers) else on.band_bias(node, cfg.window, helper)
    h, residual = x, x
    for n, layer in enumerate(cast(list[ModernBertLayer], model.layers)):
        p, full = f"l{n}_", cfg.global_layers[n]
        if layer.attn_norm is not None:  # layer 0's input is the normed embeddings
            h, residual = on.add_norm(node, w, p + "attn_norm", h, residual, layer.attn_norm)
        a = rotary_attention(node, w, p, h, layer, caches[full], "" if full else band)
        out = on.linear(node, w, p + "out", a, layer.out)
        h, residual = on.add_norm(node, w, p + "mlp_norm", out, residual, layer.mlp_norm)
        # Wi is (input | gate), the input activated: `glu`'s (gate | up) order, other names
        geglu = on.glu(node, w, p, h, layer.up_gate, on.gelu_op(layer.approximate))
        h = on.linear(node, w, p + "down", geglu, layer.down)
    if not model.layers:
        return node("LayerNormalization", [x, *on.norm_params(w, "final", model.final_norm)],
                    "final", axis=-1, epsilon=model.final_norm.eps)  # fmt: skip
    return on.add_norm(node, w, "final", h, residual, model.final_norm)[0]


def qwen3_layers(node: Any, w: Any, x: str, model: Qwen3Encoder, helper: Any) -> str:
    """Qwen3's layers: RMSNorm (each after the first adds the residual and hands the sum on),
    the QKV product split by head counts, per-head RMSNorm of q and k, rotary, the key-value
    heads repeated for their query heads, attention (causal: the keys after each query scored
    `FAR`), the output product; RMSNorm, SwiGLU; the final RMSNorm."""
    cfg = model.cfg
    caches = on.rotary_caches(w, model.rotary, cfg.max_position_embeddings, "rope")
    causal = on.causal_bias(node, helper) if model.causal else ""
    h, residual = "", x
    for n, layer in enumerate(cast(list[Qwen3Layer], model.layers)):
        p = f"l{n}_"
        if n:
            h, residual = on.add_rms(node, w, p + "in_norm", x, residual, layer.input_norm)
        else:
            h = on.rms(node, w, p + "in_norm", x, layer.input_norm)
        a = grouped_attention(node, w, p, h, layer, caches, causal, helper)
        out = on.linear(node, w, p + "out", a, layer.out)
        h, residual = on.add_rms(node, w, p + "post_norm", out, residual, layer.post_attn_norm)
        x = on.linear(node, w, p + "down", on.glu(node, w, p, h, layer.gate_up, "silu"),
                      layer.down)  # fmt: skip
    if not model.layers:
        return on.rms(node, w, "final", x, model.norm)
    return on.add_rms(node, w, "final", x, residual, model.norm)[0]


def grouped_attention(node: Any, w: Any, p: str, h: str, layer: Qwen3Layer | Gemma3Layer,
                      caches: tuple[str, str], bias: str, helper: Any,
                      scale: float | None = None) -> str:  # fmt: skip
    """Grouped-query attention before its output product, [B, L, Nq D]: per-head q / k norms,
    rotary, the scores scaled by `scale` (default D^-0.5) plus `bias` (a mask) if any."""
    nq, nkv, d = layer.num_heads, layer.num_kv_heads, layer.head_dim
    qkv = on.linear(node, w, p + "qkv", h, layer.qkv)
    sizes = on.const(node, helper, p + "sizes", [nq * d, nkv * d, nkv * d])
    node("Split", [qkv, sizes], p + "q", outputs=[p + "q", p + "k", p + "v"], axis=-1)
    q, k = (
        node("RotaryEmbedding", [on.head_rms(node, w, p + t, heads, d, norm, helper), "positions",
                                 *caches], f"{p}{t}_rope", ms=True, num_heads=heads,
             interleaved=0)
        for t, heads, norm in (("q", nq, layer.q_norm), ("k", nkv, layer.k_norm))
    )  # fmt: skip
    k, v = (on.repeat_heads(node, t, nkv, nq // nkv, d, helper) for t in (k, p + "v"))
    masks = ["", "lengths", *([bias] if bias else [])]
    scaled = {} if scale is None else {"scale": scale}
    return node("MultiHeadAttention", [q, k, v, *masks], p + "attn", ms=True, num_heads=nq,
                **scaled)  # fmt: skip


def gemma3_layers(node: Any, w: Any, x: str, model: Gemma3Encoder, helper: Any) -> str:
    """EmbeddingGemma's layers: the embeddings scaled by sqrt(hidden) (rounded to float32, as
    the eager path); per layer RMSNorms (scale 1 + weight) before and after attention and the
    MLP, grouped-query attention (scores scaled by query_pre_attn_scalar^-0.5; local layers
    within the window) with each layer kind's rotary base, GeGLU; the final RMSNorm."""
    cfg = model.cfg
    root = float(torch.tensor(math.sqrt(cfg.hidden_size), dtype=torch.float32))
    x = node("Mul", [x, on.const(node, helper, "e_root", root)], "e_scaled")
    layers = cast(list[Gemma3Layer], model.layers)
    if not layers:
        return on.rms(node, w, "final", x, model.norm)
    caches = on.rotary_tables(w, model.rotary, cfg.max_position_embeddings)
    band = "" if all(cfg.global_layers) else on.band_bias(node, cfg.window, helper)
    h, residual = on.rms(node, w, "l0_in_norm", x, layers[0].input_norm), x
    for n, layer in enumerate(layers):
        p, full = f"l{n}_", cfg.global_layers[n]
        a = grouped_attention(node, w, p, h, layer, caches[full], "" if full else band, helper,
                              scale=cfg.query_pre_attn_scalar**-0.5)  # fmt: skip
        out = on.linear(node, w, p + "out", a, layer.out)
        post = on.rms(node, w, p + "post_attn", out, layer.post_attn_norm)
        h, residual = on.add_rms(node, w, p + "pre_mlp", post, residual, layer.pre_mlp_norm)
        geglu = on.glu(node, w, p, h, layer.gate_up, on.gelu_op(layer.approximate))
        down = on.linear(node, w, p + "down", geglu, layer.down)
        post = on.rms(node, w, p + "post_mlp", down, layer.post_mlp_norm)
        following = layers[n + 1].input_norm if n + 1 < len(layers) else model.norm
        h, residual = on.add_rms(node, w, f"l{n + 1}_in_norm", post, residual, following)
    return h
