"""Reading checkpoint tensors from a model folder (safetensors, single or sharded, else
transformers' `pytorch_model.bin` through `torch.load(weights_only=True)`) under the names the
engine reads (`loading.tensor_names`), and the Hugging Face decoder layout the decoder families
share, mapped into the fused one. At start-up the engine reads through one `FolderWeights`: the
checkpoint once, for the model, its fidelity reference and the heads that take tensors from it."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from embedserve.loading.family_configs import Gemma3Config, Qwen3Config
from embedserve.loading.spec import ModelLoadError, ModelSpec
from embedserve.loading.tensor_names import canonical, canonical_names

WEIGHT_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# pickled state dicts, read as transformers reads them: `torch.load(weights_only=True)`, whose
# unpickler builds tensors and plain containers only and refuses any other object (no code runs)
BIN_FILE = "pytorch_model.bin"
BIN_INDEX_FILE = "pytorch_model.bin.index.json"
# in transformers' order of preference
WEIGHT_LAYOUTS = (WEIGHT_FILE, INDEX_FILE, BIN_FILE, BIN_INDEX_FILE)


class Checkpoint(dict[str, torch.Tensor]):
    """A checkpoint's tensors by the names the engine reads (`loading.tensor_names`), and for
    each the file it came from and its name there, so an error names both."""

    def __init__(self, where: Path) -> None:
        super().__init__()
        self.where = where  # the weights file, or the index of the shards
        self.origin: dict[str, tuple[Path, str]] = {}  # engine name -> (file, checkpoint name)

    def add(self, file: Path, tensors: dict[str, torch.Tensor], prefixes: tuple[str, ...]) -> None:
        for ours, theirs in canonical_names(tensors, prefixes, str(file)).items():
            if ours in self.origin:
                raise ModelLoadError(
                    f"{file}: tensor {theirs!r} is also in {self.origin[ours][0]}; keep one"
                )
            self[ours] = tensors[theirs]
            self.origin[ours] = (file, theirs)

    def subset(self, names: list[str]) -> Checkpoint:
        """The named tensors it holds (the same tensors, not copies), with their origins."""
        out = Checkpoint(self.where)
        for name in names:
            if name in self and name not in out:
                out[name], out.origin[name] = self[name], self.origin[name]
        return out


def weight_files(folder: Path) -> tuple[Path, list[Path]]:
    """(the file that names the weights, the files holding them): `model.safetensors`, else
    its index's shards, else `pytorch_model.bin`, else its index's shards (transformers' order);
    an error saying what was expected and what was found otherwise."""
    for layout in WEIGHT_LAYOUTS:
        path = folder / layout
        if not path.exists():
            continue
        if not layout.endswith(".index.json"):
            return path, [path]
        try:
            weight_map: dict[str, str] = json.loads(path.read_text())["weight_map"]
        except (KeyError, TypeError, json.JSONDecodeError) as e:
            raise ModelLoadError(f"{path}: expected JSON with a 'weight_map' ({e})") from None
        shards = [folder / s for s in sorted(set(weight_map.values()))]
        for shard in shards:
            if not shard.exists():
                raise ModelLoadError(f"{shard}: shard named in {layout} not found")
        return path, shards
    raise ModelLoadError(
        f"{folder}: no weights; expected {', '.join(WEIGHT_LAYOUTS[:-1])} or "
        f"{WEIGHT_LAYOUTS[-1]}{_pickled(folder)}"
    )


def load_weights_file(path: Path) -> dict[str, torch.Tensor]:
    """One weights file: safetensors, or a pickled state dict through `torch.load(...,
    weights_only=True)` (memory-mapped where the file's format allows)."""
    if path.suffix == ".safetensors":
        return load_file(str(path))
    try:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError:  # the legacy (pre-zip) format cannot be memory-mapped
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # an UnpicklingError for anything but tensors and containers
        raise ModelLoadError(
            f"{path}: not a plain tensor file, refused ({type(e).__name__}: "
            f"{str(e).splitlines()[0][:200]}); pickles are read with torch.load(weights_only=True) "
            "only (SECURITY.md)"
        ) from None
    if not isinstance(state, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()
    ):
        raise ModelLoadError(f"{path}: expected a state dict of named tensors")
    return dict(state)


def read_state_dict(folder: Path, prefixes: tuple[str, ...] = ()) -> Checkpoint:
    """All tensors of the checkpoint in `folder`, by the names the engine reads (the family's
    base-model `prefixes` dropped, legacy names renamed: `loading.tensor_names`)."""
    where, files = weight_files(folder)
    out = Checkpoint(where)
    for file in files:
        out.add(file, load_weights_file(file), prefixes)
    return out


def _pickled(folder: Path) -> str:
    """What to say of other pickled files in `folder` (`*.pt`, a `.bin` of another name): only
    transformers' file names are read, so the way to convert one, or nothing when none."""
    found = sorted(p.name for p in folder.glob("*.bin")) + sorted(
        p.name for p in folder.glob("*.pt")
    )
    if not found:
        return ""
    return (
        f" (found {', '.join(found)}: only {BIN_FILE} is read as a pickle; convert with: "
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


def read_dense_tensors(folder: Path) -> Checkpoint:
    """A sentence-transformers Dense module's tensors (`model.safetensors`, or the
    `pytorch_model.bin` older versions wrote)."""
    for name in (WEIGHT_FILE, BIN_FILE):
        if (folder / name).exists():
            out = Checkpoint(folder / name)
            out.add(folder / name, load_weights_file(folder / name), ())
            return out
    raise ModelLoadError(
        f"{folder}: no Dense weights; expected {WEIGHT_FILE} or {BIN_FILE}{_pickled(folder)}"
    )


def read_tensors(folder: Path, names: list[str], prefixes: tuple[str, ...] = ()) -> Checkpoint:
    """Only the named tensors (engine names) that the checkpoint holds (a score head's few), not
    all of them: safetensors are opened lazily; a pickled checkpoint is read whole."""
    where, files = weight_files(folder)
    out = Checkpoint(where)
    wanted = set(names)
    for file in files:
        if file.suffix != ".safetensors":
            tensors = load_weights_file(file)
            out.add(file, {k: v for k, v in tensors.items() if canonical(k, prefixes) in wanted},
                    prefixes)  # fmt: skip
            continue
        with safe_open(str(file), framework="pt") as f:
            keys = [k for k in f.keys() if canonical(k, prefixes) in wanted]  # noqa: SIM118
            out.add(file, {k: f.get_tensor(k) for k in keys}, prefixes)
    return out


class FolderWeights:
    """A model folder's weights as one engine's start-up reads them, each file once: the
    checkpoint, whole for the model (its fidelity reference shares the same tensors), and a
    head's few tensors of it (a score head, SPLADE's masked-LM head) from what is read, else
    alone; a sentence-transformers Dense module's folder. The engine drops it once built."""

    def __init__(self, spec: ModelSpec) -> None:
        self.folder, self.prefixes = spec.path, spec.family_row.prefixes
        self._checkpoint: Checkpoint | None = None

    def checkpoint(self) -> Checkpoint:
        """All of the checkpoint's tensors (`read_state_dict`), read at the first call."""
        if self._checkpoint is None:
            self._checkpoint = read_state_dict(self.folder, self.prefixes)
        return self._checkpoint

    def tensors(self, names: list[str]) -> Checkpoint:
        """The named tensors the checkpoint holds: from the checkpoint read whole if it is,
        else only those (`read_tensors`)."""
        if self._checkpoint is None:
            return read_tensors(self.folder, names, self.prefixes)
        return self._checkpoint.subset(names)

    def dense(self, sub: str) -> Checkpoint:
        """The tensors of the Dense module in the folder's `sub` (`read_dense_tensors`)."""
        return read_dense_tensors(self.folder / sub)


def take(
    tensors: dict[str, torch.Tensor], name: str, shape: tuple[int, ...], source: Path
) -> torch.Tensor:
    """One tensor by (engine) name, checked against the shape the config implies; an error names
    the file and the tensor's name there."""
    t = tensors.get(name)
    if t is None:
        where = tensors.where if isinstance(tensors, Checkpoint) else source
        raise ModelLoadError(f"{where}: missing tensor {name!r} (expected shape {list(shape)})")
    if tuple(t.shape) != shape:
        file, theirs = tensors.origin[name] if isinstance(tensors, Checkpoint) else (source, name)
        raise ModelLoadError(
            f"{file}: tensor {theirs!r} has shape {list(t.shape)}, expected {list(shape)} "
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
