"""PyLate's reference environment: `python -m embedserve.devtools.pylate_env [FOLDER]`.

PyLate 1.6 (ColBERT's reference) pins sentence-transformers 5.3.0 and transformers <= 5.3, and
under the project's sentence-transformers 6 its folder loading is bypassed (the markers and
lengths fall back to PyLate's defaults), so it cannot share the project's environment. It runs
instead from a `pip install --no-deps --target` folder put first on PYTHONPATH, over the project
environment's torch, numpy, safetensors and the rest (no torch is installed here: an unpinned one
would pull a multi-GB CUDA build). The ColBERT parity test
(tests/engine/test_sparse_multivector.py) and the retrieval CPU benchmark
(benchmarks/suites/retrieval_cpu.py) read it; CI builds it (.ci/run, ~15 s, 131 MB).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

# the versions PyLate 1.6.0 takes, as a set that imports together; its other requirements
# (fast-plaid, fastkmeans, ujson, ninja, accelerate) serve indexing and training, not
# `models.ColBERT.encode`
PINS = (
    "pylate==1.6.0",
    "sentence-transformers==5.3.0",
    "transformers==5.3.0",
    "huggingface-hub==1.3.0",
    "tokenizers==0.22.2",
    "datasets==4.4.1",
)
DEFAULT_FOLDER = ".venv/pylate-ref"  # under the repository root
ENV_VAR = "EMBEDSERVE_PYLATE_ENV"  # another folder


def env_folder(root: Path) -> Path:
    """The reference environment's folder for the repository at `root`."""
    return Path(os.environ.get(ENV_VAR) or root / DEFAULT_FOLDER)


def build(folder: Path) -> None:
    """Install PINS into `folder` and check that PyLate's model class imports from it."""
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(folder)]
    subprocess.run([*pip, "--upgrade", *PINS], check=True)
    env = {**os.environ, "PYTHONPATH": str(folder)}
    probe = "import pylate, sentence_transformers as st; from pylate import models; print(st.__version__)"
    subprocess.run([sys.executable, "-c", probe], check=True, env=env)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    folder = Path(args[0]) if args else env_folder(Path.cwd())
    build(folder)
    print(f"PyLate's reference environment: {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
