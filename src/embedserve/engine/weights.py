"""Reading checkpoint tensors from a model folder (single or sharded safetensors), and the
Hugging Face decoder layout the decoder families share, mapped into the fused one."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from embedserve.loading.family_configs import Gemma3Config, Qwen3Config
from embedserve.loading.spec import ModelLoadError

WEIGHT_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def read_state_dict(folder: Path) -> dict[str, torch.Tensor]:
    """All tensors of the checkpoint in `folder`, by their checkpoint names."""
    single = folder / WEIGHT_FILE
    index = folder / INDEX_FILE
    if single.exists():
        return load_file(str(single))
    if index.exists():
        try:
            weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        except (KeyError, json.JSONDecodeError) as e:
            raise ModelLoadError(f"{index}: expected JSON with a 'weight_map' ({e})") from None
        tensors: dict[str, torch.Tensor] = {}
        for shard in sorted(set(weight_map.values())):
            shard_path = folder / shard
            if not shard_path.exists():
                raise ModelLoadError(f"{shard_path}: shard named in {INDEX_FILE} not found")
            tensors.update(load_file(str(shard_path)))
        return tensors
    raise ModelLoadError(
        f"{folder}: no weights; expected {WEIGHT_FILE} or {INDEX_FILE}{_pickled(folder)}"
    )


def _pickled(folder: Path) -> str:
    """What to say of pickled weights in `folder`: they are never read (a pickle can run code
    when loaded), so the way to convert one, or nothing when there are none."""
    found = sorted(p.name for p in folder.glob("*.bin")) + sorted(
        p.name for p in folder.glob("*.pt")
    )
    if not found:
        return ""
    return (
        f" (found {', '.join(found)}: pickled weights are refused; convert with: "
        f"{convert_command(folder / found[0])})"
    )


def convert_command(pickled: Path) -> str:
    """One shell line that turns a pickled state dict into `model.safetensors` beside it."""
    out = pickled.with_name(WEIGHT_FILE)
    return (
        'python -c "import torch, safetensors.torch as st; '
        f"st.save_file({{k: v.contiguous().clone() for k, v in torch.load('{pickled}', "
        f"weights_only=True).items()}}, '{out}')\""
    )


def read_dense_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """A sentence-transformers Dense module's tensors, from its `model.safetensors` only."""
    single = folder / WEIGHT_FILE
    if single.exists():
        return load_file(str(single))
    raise ModelLoadError(f"{folder}: no Dense weights; expected {WEIGHT_FILE}{_pickled(folder)}")


def read_tensors(folder: Path, names: list[str]) -> dict[str, torch.Tensor]:
    """Only the named tensors that the checkpoint holds (a score head's few), not all of them."""
    single, index = folder / WEIGHT_FILE, folder / INDEX_FILE
    if single.exists():
        where = dict.fromkeys(names, WEIGHT_FILE)
    elif index.exists():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        where = {n: weight_map[n] for n in names if n in weight_map}
    else:
        read_state_dict(folder)  # raises with what was found instead
        return {}
    out: dict[str, torch.Tensor] = {}
    for file in sorted(set(where.values())):
        with safe_open(str(folder / file), framework="pt") as f:
            keys = set(f.keys())
            for name in names:
                if where.get(name) == file and name in keys:
                    out[name] = f.get_tensor(name)
    return out


def strip_prefix(
    tensors: dict[str, torch.Tensor], prefixes: tuple[str, ...]
) -> dict[str, torch.Tensor]:
    """Drop a wrapper prefix ('bert.', 'model.') so task heads and bare models load alike."""
    out: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        for p in prefixes:
            if name.startswith(p):
                name = name[len(p) :]
                break
        out[name] = t
    return out


def take(
    tensors: dict[str, torch.Tensor], name: str, shape: tuple[int, ...], source: Path
) -> torch.Tensor:
    """One tensor by name, checked against the shape the config implies."""
    t = tensors.get(name)
    if t is None:
        raise ModelLoadError(f"{source}: missing tensor {name!r} (expected shape {list(shape)})")
    if tuple(t.shape) != shape:
        raise ModelLoadError(
            f"{source}: tensor {name!r} has shape {list(t.shape)}, expected {list(shape)} "
            "from config.json"
        )
    return t


def decoder_checkpoint(
    tensors: dict[str, torch.Tensor],
    cfg: Gemma3Config | Qwen3Config,
    norms: dict[str, str],
    source: Path,
    *,
    qkv_bias: bool = False,
) -> dict[str, torch.Tensor]:
    """A Hugging Face decoder checkpoint (Qwen3's and Gemma 3's names: `embed_tokens`, `norm`,
    per layer `self_attn.{q,k,v,o}_proj`, `q_norm`, `k_norm`, `mlp.{gate,up,down}_proj`; any
    `lm_head` is ignored) under our names: Q, K, V fused into `qkv`, gate and up into `gate_up`.
    `norms`: our name -> theirs of each layer's [H] norms."""
    h, d, i = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    nq, nkv = cfg.num_heads * d, cfg.num_kv_heads * d
    new: dict[str, torch.Tensor] = {
        "embed.weight": take(tensors, "embed_tokens.weight", (cfg.vocab_size, h), source),
        "norm.weight": take(tensors, "norm.weight", (h,), source),
    }

    def cat(prefix: str, parts: dict[str, int], kind: str, cols: tuple[int, ...]) -> torch.Tensor:
        return torch.cat(
            [
                take(tensors, f"{prefix}{w}.{kind}", (rows, *cols), source)
                for w, rows in parts.items()
            ]
        )

    for n in range(cfg.num_layers):
        p, a, m = f"layers.{n}.", f"layers.{n}.self_attn.", f"layers.{n}.mlp."
        qkv = {"q_proj": nq, "k_proj": nkv, "v_proj": nkv}
        new[p + "qkv.weight"] = cat(a, qkv, "weight", (h,))
        if qkv_bias:
            new[p + "qkv.bias"] = cat(a, qkv, "bias", ())
        new[p + "q_norm.weight"] = take(tensors, a + "q_norm.weight", (d,), source)
        new[p + "k_norm.weight"] = take(tensors, a + "k_norm.weight", (d,), source)
        new[p + "out.weight"] = take(tensors, a + "o_proj.weight", (h, nq), source)
        for ours, theirs in norms.items():
            new[f"{p}{ours}.weight"] = take(tensors, f"{p}{theirs}.weight", (h,), source)
        new[p + "gate_up.weight"] = cat(m, {"gate_proj": i, "up_proj": i}, "weight", (h,))
        new[p + "down.weight"] = take(tensors, m + "down_proj.weight", (h, i), source)
    return new
