"""Checkpoint tensor names as transformers reads them: the one place where a name found in a
weights file becomes the name the engine's model (and its heads) look up.

Folders saved by other tools and versions name the same tensor in several ways that
transformers still accepts when it loads them; each is undone here, by name alone (no torch):

- legacy parameter names: BERT-era checkpoints call a LayerNorm's scale and shift `gamma` and
  `beta` (transformers' "legacy" renaming: `LayerNorm.gamma` -> `LayerNorm.weight`,
  `LayerNorm.beta` -> `LayerNorm.bias`);
- the base model's prefix, present or absent: a task model (`BertForMaskedLM`,
  `Qwen3ForCausalLM`, ...) saves the encoder under its `base_model_prefix` (`bert.`,
  `roberta.`, `model.`, ...), the bare model without it; the family's row lists the prefixes
  (`Family.prefixes`) and the first one a name starts with is dropped;
- heads saved beside the encoder (`cls.predictions.*`, `lm_head.*`, `classifier.*`, a pooler)
  keep their names: the encoder never asks for them, a head reader does;
- tied weights left out: a masked-LM decoder or an `lm_head` tied to the word embeddings is not
  in the file; the head readers fall back to the embeddings (`TIED`).

A name that two spellings would both give (a file holding `bert.x` and `x`) is an error naming
both, as a folder transformers would load ambiguously.
"""

from __future__ import annotations

from collections.abc import Iterable

from embedserve.loading.family_configs import ModelLoadError

# transformers' legacy renames (`conversion_mapping`'s "legacy" entry), as name endings
LEGACY_SUFFIXES: tuple[tuple[str, str], ...] = (
    ("LayerNorm.gamma", "LayerNorm.weight"),
    ("LayerNorm.beta", "LayerNorm.bias"),
)

# A head's weight that a checkpoint may leave out because it is tied to another tensor: the
# head's name -> the names (after `canonical`) it then equals, in order.
TIED: dict[str, tuple[str, ...]] = {
    "cls.predictions.decoder.weight": ("embeddings.word_embeddings.weight",),
    "cls.predictions.decoder.bias": ("cls.predictions.bias",),
    "lm_head.weight": ("embed_tokens.weight",),
}


def canonical(name: str, prefixes: tuple[str, ...]) -> str:
    """The name the engine reads for a checkpoint's `name`: legacy suffixes renamed, the first
    of the family's base-model `prefixes` it starts with dropped."""
    for old, new in LEGACY_SUFFIXES:
        if name.endswith(old):
            name = name[: -len(old)] + new
            break
    for prefix in prefixes:
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


def canonical_names(names: Iterable[str], prefixes: tuple[str, ...], where: str) -> dict[str, str]:
    """{engine name: checkpoint name} for every name of a checkpoint; `where` (its file or
    folder) is named by the error when two checkpoint names give one engine name."""
    out: dict[str, str] = {}
    for name in names:
        ours = canonical(name, prefixes)
        if ours in out and out[ours] != name:
            raise ModelLoadError(
                f"{where}: tensors {out[ours]!r} and {name!r} are both {ours!r}; keep one"
            )
        out[ours] = name
    return out


def tied_source(name: str, present: Iterable[str]) -> str | None:
    """The tensor a tied, left-out `name` equals, among the (engine) names `present`."""
    have = set(present)
    return next((t for t in TIED.get(name, ()) if t in have), None)
