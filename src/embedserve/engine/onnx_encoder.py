"""A BERT-family encoder run by ONNX Runtime on the CPU: one session call per forward.

Eager PyTorch pays a dispatch for each of a forward's ~130 operators, and its small-row products
run 2-4x below the CPU's matrix rate (issue 39: a [12 x 384] x [384 x 1536] fp32 product took
286 us through `F.linear`, 178 us through oneDNN on a prepacked weight, 132 us as an ONNX Runtime
MatMul+Add on an AVX2 Zen 3). ONNX Runtime runs the whole graph in C++ with its MLAS products.

The graph is written here from the engine's own loaded weights (no exporter, no tracing), in the
fused form ONNX Runtime's CPU kernels take: per layer one `Attention` (fused QKV, softmax over the
valid keys), a MatMul and a `SkipLayerNormalization` (bias + residual + LayerNorm), a MatMul and a
`BiasGelu`, a MatMul and a `SkipLayerNormalization`. It is saved once per model folder under the
cache (`cache_path`), keyed by the folder's weight files, and loaded from there on later starts.

The engine's batches are packed; the graph takes padded [B, L] rows: a lone sequence is one row
with no padding, several are grouped by length (`length_groups`) so that padding stays small.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from embedserve.engine.attention import AttentionFn, RaggedLayout
from embedserve.engine.models.base import PackedEncoder
from embedserve.engine.models.bert import BertEncoder, BertLayer
from embedserve.engine.models.mpnet import MAX_DISTANCE, MPNetEncoder
from embedserve.engine.models.nomic_bert import NomicBertEncoder, NomicBertLayer
from embedserve.engine.retrieval import VisibleKeys

# the encoders a graph is written for: BERT's family, MPNet (BERT's layers and a relative position
# bias) and NomicBERT (rotary positions, SwiGLU, no biases)
Graphed = BertEncoder | MPNetEncoder | NomicBertEncoder

# bump when the graph written below changes: the cached files of older versions are not reused
GRAPH_VERSION = 1
OPSET = 17
# a group of sequences padded to its longest may hold at most this many padded tokens per real one
MAX_PADDING = 1.25
# tokens per session call (padded): past this a batch's groups are run one after another.
# NOTE: small calls keep a layer's activations in cache ([512, 1,536] fp32: 3 MB): 300 passages
# in 2,048-token batches on a 2-core Zen 2, 35.0 texts/s at 4,096, 36.0 at 1,024, 41.1 at 512,
# 39.0 at 256 (45.2 / 40.6 at 512 / 4,096 with the batches sorted by length; ad-hoc probe)
MAX_GROUP_TOKENS = 512


def supports(model: nn.Module) -> bool:
    """Whether `onnx_encoder` can write `model`'s graph: a BERT-family encoder (or MPNet's, the
    same layers with a relative position bias) whose FFN activation is the erf or tanh GELU or
    ReLU, or a NomicBERT one, and ONNX Runtime and onnx are installed."""
    if not isinstance(model, Graphed):
        return False
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    if isinstance(model, NomicBertEncoder):
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


def cache_path(folder: Path, cache_dir: Path | None = None) -> Path:
    """Where the graph of the model in `folder` is kept: keyed by the folder's resolved path and
    its weight files' names, sizes and modification times (a changed checkpoint writes anew)."""
    folder = folder.resolve()
    h = hashlib.sha256(f"{GRAPH_VERSION}|{folder}".encode())
    for f in sorted(folder.glob("*.safetensors")) + sorted(folder.glob("*.bin")):
        st = f.stat()
        h.update(f"|{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return (cache_dir or cache_root() / "onnx") / h.hexdigest()[:24] / "model.onnx"


def cache_root() -> Path:
    """embedserve's folder of the user's cache ($XDG_CACHE_HOME, else ~/.cache)."""
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "embedserve"


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

    def node(op: str, inputs: list[str], out: str, ms: bool = False, parts: int = 1,
             **attrs: Any) -> str:  # fmt: skip
        """One node; a `Split` into `parts` equal pieces names them out, out_1, out_2, ..."""
        domain = "com.microsoft" if ms else ""
        outs = [out] + [f"{out}_{i}" for i in range(1, parts)]
        nodes.append(helper.make_node(op, inputs, outs, name=out, domain=domain, **attrs))
        return out

    x, bias = _embedded(node, w, model, helper)
    norm = model.embed_norm
    x = node("LayerNormalization", [x, w("e_g", norm.weight), w("e_b", norm.bias)], "e_out",
             axis=-1, epsilon=norm.eps)  # fmt: skip
    if isinstance(model, NomicBertEncoder):
        caches = _rotary_caches(w, model)
        for n, nomic in enumerate(cast(list[NomicBertLayer], model.layers)):
            x = _nomic_layer(node, w, f"l{n}_", x, nomic, caches)
    else:
        for n, layer in enumerate(cast(list[BertLayer], model.layers)):
            x = _bert_layer(node, w, f"l{n}_", x, layer, bias)
    nodes.append(helper.make_node("Identity", [x], ["hidden"], name="hidden"))
    inputs, outputs = _signature(model.cfg.hidden_size)
    graph = helper.make_graph(nodes, "embedserve_bert", inputs, outputs, initializer=inits)
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


def _rotary_caches(w: Any, model: NomicBertEncoder) -> tuple[str, str]:
    """cos and sin [P, D / 2] of every position the model takes, as `Rotary` computes them
    (float32 angles, the halves rotated as in `ops.rope`: `RotaryEmbedding`'s interleaved=0)."""
    inv_freq = model.rotary.inv_freq(torch.device("cpu"))
    positions = torch.arange(model.cfg.max_position_embeddings, dtype=torch.int64).float()
    angles = positions[:, None] * inv_freq[None, :]
    return w("rope_cos", angles.cos()), w("rope_sin", angles.sin())


def _nomic_layer(node: Any, w: Any, p: str, x: str, layer: NomicBertLayer,
                 caches: tuple[str, str]) -> str:  # fmt: skip
    """One NomicBERT layer: the QKV product split three ways, rotary on q and k, attention over
    each row's `lengths` keys, the output product and its skip norm; then SwiGLU (gate | up in
    one product) and the down product's skip norm. No linear has a bias."""
    qkv = node("MatMul", [x, w(p + "qkv_w", layer.qkv.weight, True)], p + "qkv")
    q = node("Split", [qkv], p + "q", parts=3, axis=-1)
    k, v = q + "_1", q + "_2"
    heads = layer.num_heads
    rotated = [node("RotaryEmbedding", [t, "positions", *caches], f"{t}_rope", ms=True,
                    num_heads=heads, interleaved=0) for t in (q, k)]  # fmt: skip
    a = node("MultiHeadAttention", [*rotated, v, "", "lengths"], p + "attn", ms=True,
             num_heads=heads)  # fmt: skip
    x = _skip_norm(node, w, p + "attn_out", a, x, layer.out, layer.attn_norm)
    gate = node("Split", [node("MatMul", [x, w(p + "gu_w", layer.gate_up.weight, True)],
                               p + "gu")], p + "gate", parts=2, axis=-1)  # fmt: skip
    silu = node("Mul", [gate, node("Sigmoid", [gate], p + "sig")], p + "silu")
    h = node("Mul", [silu, gate + "_1"], p + "swiglu")
    return _skip_norm(node, w, p + "ffn_out", h, x, layer.down, layer.mlp_norm)


def _embedded(node: Any, w: Any, model: Graphed, helper: Any) -> tuple[str, str]:
    """The summed embeddings before their norm, and the score bias every layer's `Attention`
    adds: MPNet's by distance, or "" (none) for BERT's family, which has token types instead.
    NomicBERT's have no position table (rotary in every layer)."""
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


def _distance_bias(node: Any, table: str, helper: Any) -> str:
    """[1, N, L, L]: MPNet's bias of each head for key - query distance, the padded length L
    read from the ids: `table`'s column clamp(k - q, -R, R) + R (`mpnet.MAX_DISTANCE` = R)."""
    from onnx import TensorProto

    def const(name: str, value: list[int]) -> str:
        tensor = helper.make_tensor(name, TensorProto.INT64, [len(value)], value)
        return node("Constant", [], name, value=tensor)

    length = node("Gather", [node("Shape", ["input_ids"], "b_shape"), const("b_one", [1])],
                  "b_len")  # fmt: skip
    zero, step = const("b_zero", [0]), const("b_step", [1])
    span = node("Range", [node("Squeeze", [zero], "b_z"), node("Squeeze", [length], "b_l"),
                          node("Squeeze", [step], "b_s")], "b_range")  # fmt: skip
    keys = node("Unsqueeze", [span, const("b_ax0", [0])], "b_keys")  # [1, L]
    queries = node("Unsqueeze", [span, const("b_ax1", [1])], "b_queries")  # [L, 1]
    far = const("b_far", [MAX_DISTANCE])
    distance = node("Sub", [keys, queries], "b_distance")
    clamped = node("Max", [node("Min", [distance, far], "b_min"), node("Neg", [far], "b_near")],
                   "b_clamped")  # fmt: skip
    column = node("Add", [clamped, far], "b_column")
    heads = node("Gather", [table, column], "b_heads", axis=1)  # [N, L, L]
    return node("Unsqueeze", [heads, const("b_ax_batch", [0])], "attention_bias")


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
    inputs = [y, residual, w(name + "_g", norm.weight), w(name + "_beta", norm.bias)]
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


def length_groups(seqlens: Sequence[int]) -> list[list[int]]:
    """Sequence indices in groups run as one padded [B, L] call each: sorted by length, longest
    first, a group closed when padding to its longest would exceed `MAX_PADDING` times its real
    tokens or `MAX_GROUP_TOKENS` in all."""
    order = sorted(range(len(seqlens)), key=lambda i: -seqlens[i])
    groups: list[list[int]] = []
    real = 0
    for i in order:
        if groups:
            g = groups[-1]
            longest = seqlens[g[0]]
            padded = longest * (len(g) + 1)
            if padded <= MAX_PADDING * (real + seqlens[i]) and padded <= MAX_GROUP_TOKENS:
                g.append(i)
                real += seqlens[i]
                continue
        groups.append([i])
        real = seqlens[i]
    return groups


class OnnxEncoder(nn.Module):
    """The model's forward (packed ids -> hidden [T, H] float32) through an ONNX Runtime session;
    a stand-in for the `PackedEncoder` it was written from. The graph holds its own attention:
    of the attention argument only a `VisibleKeys` limit is read, as the keys each row's
    `Attention` sees (its `lengths` input)."""

    def __init__(self, model: PackedEncoder, path: Path, num_threads: int) -> None:
        super().__init__()
        import onnxruntime as ort

        if not isinstance(model, Graphed):
            raise ValueError(f"no ONNX graph for {type(model).__name__}")
        if not path.exists():
            write_graph(model, path)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = num_threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # NOTE: ONNX Runtime's threads spin after a run; the pooling that follows runs on
        # PyTorch's OpenMP threads, which then wait for a core (on 2 cores, 6 ms instead of
        # microseconds for one query's pooling, measured on a loaded Zen 3)
        opts.add_session_config_entry("session.force_spinning_stop", "1")
        self.session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        # RoBERTa's table starts after the padding index; rotary positions start at 0
        self.position_offset = int(getattr(model.cfg, "position_offset", 0))
        self.path = path
        # what the session's copy of the weights holds (it has no torch parameters to count)
        self.weight_bytes = sum(t.numel() * t.element_size() for t in model.parameters())

    def forward(
        self,
        input_ids: torch.Tensor,  # [T]
        positions: torch.Tensor,  # [T]
        token_type_ids: torch.Tensor,  # [T]
        layout: RaggedLayout,
        attend: AttentionFn,
    ) -> torch.Tensor:  # [T, H]
        arrays = [t.numpy() for t in (input_ids, positions + self.position_offset, token_type_ids)]
        seqlens = layout.seqlens
        # each row's attended keys: all its tokens, or a query expansion's leading ones
        keys = attend.visible if isinstance(attend, VisibleKeys) else seqlens
        if len(seqlens) == 1:  # a lone sequence: one row, nothing to pad
            out = self._run([a[None] for a in arrays], np.array(keys, dtype=np.int32))
            return torch.from_numpy(out[0])
        starts = np.concatenate([[0], np.cumsum(seqlens)])
        hidden = torch.empty((len(input_ids), self.hidden_size), dtype=torch.float32)
        for group in length_groups(seqlens):
            longest = seqlens[group[0]]
            padded = [np.zeros((len(group), longest), dtype=np.int64) for _ in arrays]
            for row, i in enumerate(group):
                for src, dst in zip(arrays, padded, strict=True):
                    dst[row, : seqlens[i]] = src[starts[i] : starts[i + 1]]
            lengths = np.array([keys[i] for i in group], dtype=np.int32)
            out = self._run(padded, lengths)
            for row, i in enumerate(group):
                hidden[starts[i] : starts[i + 1]] = torch.from_numpy(out[row, : seqlens[i]])
        return hidden

    @property
    def hidden_size(self) -> int:
        return int(self.session.get_outputs()[0].shape[-1])

    def _run(self, arrays: list[np.ndarray], lengths: np.ndarray) -> np.ndarray:
        feed = dict(zip(("input_ids", "positions", "token_type_ids"), arrays, strict=True))
        feed["lengths"] = lengths
        return self.session.run(["hidden"], feed)[0]  # [B, L, H]
