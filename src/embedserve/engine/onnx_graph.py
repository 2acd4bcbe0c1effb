"""The ONNX graph of an encoder, written from the engine's own loaded weights (no exporter, no
tracing), in the fused form ONNX Runtime's CPU kernels take (`onnx_encoder` runs it).

BERT's family (and MPNet's, the same layers with a relative position bias) is written here: per
layer one `Attention` (fused QKV, softmax over the valid keys), a MatMul and a
`SkipLayerNormalization` (bias + residual + LayerNorm), a MatMul and a `BiasGelu`, a MatMul and a
`SkipLayerNormalization`. The rotary families' layers (NomicBERT, ModernBERT, Qwen3) are
`onnx_rotary`'s; the pieces both use, `onnx_nodes`'.

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

from embedserve.engine import onnx_nodes as on
from embedserve.engine import onnx_rotary
from embedserve.engine.models.bert import BertEncoder, BertLayer
from embedserve.engine.models.gemma3 import Gemma3Encoder
from embedserve.engine.models.modernbert import ModernBertEncoder
from embedserve.engine.models.mpnet import MPNetEncoder
from embedserve.engine.models.nomic_bert import NomicBertEncoder
from embedserve.engine.models.qwen3 import Qwen3Encoder

# the encoders a graph is written for: BERT's family, MPNet (BERT's layers and a relative position
# bias), NomicBERT (rotary positions, SwiGLU, no biases), ModernBERT (pre-norm, rotary, GeGLU,
# local layers), Qwen3 (RMSNorm, per-head q / k norms, grouped-query attention, causal or not)
# and Gemma 3 (Qwen3's pieces with four norms a layer, local layers and GeGLU)
Graphed = (
    BertEncoder | MPNetEncoder | NomicBertEncoder | ModernBertEncoder | Qwen3Encoder | Gemma3Encoder
)

# bump when the graph written below changes: the cached files of older versions are not reused,
# and the remembered start-up choices (`cpu_paths.choice_key` hashes this) are measured anew.
# 2: every family has a graph, so a folder whose choice was made without ONNX Runtime retimes it
GRAPH_VERSION = 2
OPSET = 17
# the IR version the graph is saved with: onnx >= 1.18 writes IR 11 by default, which the oldest
# onnxruntime pyproject.toml allows (1.20, IR 10 at most) refuses to load
IR_VERSION = 10


def supports(model: nn.Module) -> bool:
    """Whether a graph can be written for `model`: a BERT-family encoder (or MPNet's, the
    same layers with a relative position bias) whose FFN activation is the erf or tanh GELU or
    ReLU, or a rotary family's (NomicBERT, ModernBERT, Qwen3, Gemma 3), and ONNX Runtime and
    onnx are installed."""
    if not isinstance(model, Graphed):
        return False
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    if isinstance(model, NomicBertEncoder | ModernBertEncoder | Qwen3Encoder | Gemma3Encoder):
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
    # the decoder families have no embedding norm: their first layer's RMSNorm takes the sum
    if isinstance(model, Qwen3Encoder):
        return _finished(onnx_rotary.qwen3_layers(node, w, x, model, helper), model, nodes, inits,
                         helper)  # fmt: skip
    if isinstance(model, Gemma3Encoder):
        return _finished(onnx_rotary.gemma3_layers(node, w, x, model, helper), model, nodes, inits,
                         helper)  # fmt: skip
    norm = model.embed_norm
    x = node("LayerNormalization", [x, *on.norm_params(w, "e", norm)], "e_out", axis=-1,
             epsilon=norm.eps)  # fmt: skip
    if isinstance(model, ModernBertEncoder):
        x = onnx_rotary.modern_layers(node, w, x, model, helper)
    elif isinstance(model, NomicBertEncoder):
        x = onnx_rotary.nomic_layers(node, w, x, model)
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
    model_proto = helper.make_model(graph, opset_imports=opsets, producer_name="embedserve")
    model_proto.ir_version = IR_VERSION
    return model_proto


def _bert_layer(node: Any, w: Any, p: str, x: str, layer: BertLayer, bias: str) -> str:
    """One post-norm BERT layer: the fused `Attention` (QKV product, softmax over each row's
    `lengths` keys, plus MPNet's score `bias`), then the FFN, each closed by a skip norm."""
    qkv = [w(p + "qkv_w", layer.qkv.weight, True), w(p + "qkv_b", layer.qkv.bias)]
    extra = ["", bias] if bias else []  # the 5th input, a past state: none
    a = node("Attention", [x, *qkv, "lengths", *extra], p + "attn", ms=True,
             num_heads=layer.num_heads)  # fmt: skip
    x = on.skip_norm(node, w, p + "attn_out", a, x, layer.out, layer.attn_norm)
    up = node("MatMul", [x, w(p + "up_w", layer.up.weight, True)], p + "up")
    h = _activated(node, w, p, up, layer)
    return on.skip_norm(node, w, p + "ffn_out", h, x, layer.down, layer.ffn_norm)


def _embedded(node: Any, w: Any, model: Graphed, helper: Any) -> tuple[str, str]:
    """The summed embeddings before their norm, and the score bias every layer's `Attention`
    adds: MPNet's by distance, or "" (none) for BERT's family, which has token types instead.
    NomicBERT's, ModernBERT's and Qwen3's have no position table (rotary in every layer)."""
    if isinstance(model, ModernBertEncoder | Qwen3Encoder | Gemma3Encoder):  # rotary, no types
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
    return x, on.distance_bias(node, w("relative", table), helper)


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
