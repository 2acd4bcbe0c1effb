"""What determines the vectors of an `embedserve index` output folder, recorded with every input
in its manifest: a rerun into the same folder with any of it different would leave vectors of two
kinds side by side (a search over them compares vectors of two models), so the driver refuses it
naming the difference, or with `overwrite` replaces the outputs that differ."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from embedserve.indexing.actor import IndexOptions
from embedserve.indexing.files import write_manifest

# files of a model folder whose content is hashed (configs, tokenizer, prompts, vocabularies);
# the others (weights: gigabytes) by size and modification time, so a check costs milliseconds
CONTENT_SUFFIXES = (".json", ".txt", ".model")
LEGACY = "not recorded (written by an older embedserve)"
# what an output recorded before a field existed was made with: every file had dense vectors only
RECORDED_BEFORE: dict[str, Any] = {"outputs": ["dense"], "text_lines": False}


def _files(folder: Path) -> Iterator[Path]:
    for p in sorted(folder.rglob("*")):
        hidden = any(part.startswith(".") for part in p.relative_to(folder).parts)
        if p.is_file() and not hidden and p.suffix != ".md":  # a README is not the model
            yield p


def model_fingerprint(folder: Path) -> str:
    """A hash of a model folder: its configs' content, its weights' sizes and mtimes."""
    h = hashlib.sha1()
    for p in _files(folder):
        h.update(str(p.relative_to(folder)).encode() + b"\0")
        if p.suffix in CONTENT_SUFFIXES:
            h.update(p.read_bytes())
        else:
            st = p.stat()  # NOTE: follows a Hub snapshot's symlinks to the blobs
            h.update(f"{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def cpu_default_dtype() -> str:
    """The dtype an engine on this CPU runs when none is asked for (`engine.cpu`)."""
    import torch

    from embedserve.engine.cpu import default_dtype

    return default_dtype(torch.device("cpu"))


def vectors_identity(options: IndexOptions, gpus: int) -> dict[str, Any]:
    """Everything that decides the vectors of a job with `options` whose actors get `gpus`
    GPUs: the model folder (path and fingerprint; its prompts are in its configs), the engine's
    dtype, the head (dimensions, normalize, output dtype), the prompt and the truncation."""
    from embedserve.loading.bundled import resolve_model
    from embedserve.loading.spec import read_model_spec
    from embedserve.retrieval.results import chosen_outputs

    folder = resolve_model(options.model).resolve()
    spec = read_model_spec(folder)
    return {
        "model": str(folder),
        "model_fingerprint": model_fingerprint(folder),
        # the engine's default, on the device the actors get (`engine.Engine`): a CPU that
        # multiplies bf16 natively runs bf16 (the manifest said float32)
        "dtype": options.dtype or ("bfloat16" if gpus else cpu_default_dtype()),
        "dimensions": spec.hidden_size,
        "normalize": True,  # the actor's head always normalizes (`EmbedBatch`)
        "output_dtype": options.output_dtype,
        "prompt_name": options.prompt_name,
        "input_type": options.input_type,
        "truncate": options.truncate or None,
        "max_length": spec.max_seq_length,
        "outputs": list(chosen_outputs(options.outputs, spec.outputs)),  # a list, as in JSON
        # a .txt / .md input's records: its lines (else the file, one document)
        "text_lines": options.lines,
    }


def differences(recorded: dict[str, Any] | None, current: dict[str, Any]) -> list[str]:
    """What differs between an output's recorded identity and this run's, as text."""
    if not recorded:
        return [f"the options it was made with: {LEGACY}"]
    out = []
    for name, now in current.items():
        was = recorded.get(name, RECORDED_BEFORE.get(name))
        if was == now:
            continue
        if name == "model_fingerprint" and recorded.get("model") == current["model"]:
            out.append(f"the files of model {now!r}: changed since (fingerprint {was} -> {now})")
        elif name != "model_fingerprint":
            out.append(f"{name}: {was!r} (this run: {now!r})")
    return out


def refusal(out: Path, stale: dict[str, list[str]]) -> str:
    """The message for a rerun into `out` with other options (stale: input -> differences)."""
    key, diffs = next(iter(stale.items()))
    more = f" (and {len(stale) - 1} more inputs)" if len(stale) > 1 else ""
    return (
        f"--output {out}: holds vectors made with other options than this run's; for "
        f"{Path(key).name}{more}: " + "; ".join(diffs) + ". Pass --overwrite to re-embed them "
        "with this run's options (their outputs are replaced), or write to another folder"
    )


def drop_stale(
    out: Path, manifest: dict[str, Any], identity: dict[str, Any], overwrite: bool
) -> int:
    """Check the outputs listed in `manifest` against this run's `identity`: those made with
    other options are refused (a ValueError naming the difference), or with `overwrite` removed
    (their files and their entries, so their inputs run again); returns how many were removed."""
    stale = {k: d for k, e in manifest.items() if (d := differences(e.get("vectors"), identity))}
    if stale and not overwrite:
        raise ValueError(refusal(out, stale))
    for key in stale:
        entry = manifest.pop(key)
        for name in (entry.get("output"), entry.get("errors")):
            if isinstance(name, str) and name and Path(name).name == name:  # only its own files
                (out / name).unlink(missing_ok=True)
    if stale:
        write_manifest(out, manifest)
    return len(stale)
