"""A float16 copy of the bundled all-MiniLM-L6-v2 folder for the GPU machine (`.carry/minilm-fp16`):
the fp32 weights (87 MiB) do not fit the device tool's 64 MiB carry beside the tree and wheels.
Every other file of the folder is copied as it is.
    .venv/bin/python benchmarks/harness/carry_minilm.py [.carry/minilm-fp16]
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from embedserve.loading.bundled import resolve_model


def main(dest: str = ".carry/minilm-fp16") -> None:
    src, out = resolve_model("minilm"), Path(dest)
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(src, out, ignore=shutil.ignore_patterns("model.safetensors", "README.md"))
    weights = load_file(src / "model.safetensors")
    save_file(
        {k: v.to(torch.float16) for k, v in weights.items()},
        out / "model.safetensors",
        metadata={"format": "pt"},
    )
    print(out, f"{sum(p.stat().st_size for p in out.rglob('*') if p.is_file()) / 2**20:.1f} MiB")


if __name__ == "__main__":
    main(*sys.argv[1:])
