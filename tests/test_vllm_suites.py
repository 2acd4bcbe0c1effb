"""The vLLM suites' fixes that a CPU can check (benchmarks/peers, issue 42): the cross-encoder
reference applies a sigmoid only where the checkpoint declares one, both servers are asked for
the name they serve (NAME=FOLDER), and the bundle keeps the packages vLLM 0.22.0 imports."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

PEERS = Path(__file__).resolve().parents[1] / "benchmarks" / "peers"


def _load(name: str) -> ModuleType:
    pytest.importorskip("packaging")
    spec = importlib.util.spec_from_file_location(name, PEERS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_the_reference_sigmoid_only_where_declared(tmp_path: Path) -> None:
    suites = _load("vllm_suites")
    from embedserve.devtools.checkpoints import make_checkpoint

    # the ms-marco shape the suite makes declares Identity: raw logits, as both servers return
    folder = make_checkpoint(tmp_path / "ce", arch="ms-marco-minilm-l6", dtype="float32")
    assert not suites.declares_sigmoid(folder)
    config = json.loads((folder / "config.json").read_text())
    config.pop("sbert_ce_default_activation_function", None)
    config["sentence_transformers"] = {"activation_fn": "torch.nn.modules.activation.Sigmoid"}
    (folder / "config.json").write_text(json.dumps(config))
    assert suites.declares_sigmoid(folder)


def test_servers_are_asked_for_the_names_they_serve() -> None:
    """embedserve serves `--model FOLDER` under the folder's name; the suites ask for "m" and
    "minilm", so they pass NAME=FOLDER (the gateway's own parser reads it back)."""
    from embedserve.gateway.models import split_named

    text = (PEERS / "vllm_suites.py").read_text()
    assert 'serve("--model", f"m={folder}"' in text
    assert 'serve("--model", f"minilm={models[\'minilm\']}"' in text
    assert split_named("m=/tmp/vllm-suites-models/ms-marco-minilm-l6") == (
        "m",
        "/tmp/vllm-suites-models/ms-marco-minilm-l6",
    )


def test_the_bundle_keeps_flashinfer_and_tvm_ffi() -> None:
    resolve = _load("vllm_resolve")
    assert "flashinfer-python" not in resolve.DROP and "apache-tvm-ffi" not in resolve.DROP
    assert "flashinfer-cubin" in resolve.DROP


def test_the_peer_wheels_pin_grpcio_health_checking_to_the_images_grpcio() -> None:
    """1.84.2's generated modules refuse grpcio 1.84.0, the image's (image_packages.txt lists
    grpcio without a version; KINDS.md's reading is 1.84.0)."""
    text = (PEERS / "peer_wheels.sh").read_text()
    assert "GRPCIO=${GRPCIO:-1.84.0}" in text
    assert '"grpcio-health-checking==$GRPCIO"' in text


def test_result_files_are_named_by_the_card_not_its_memory() -> None:
    suites = _load("vllm_suites")
    assert suites.gpu_slug("NVIDIA H100 80GB HBM3") == "h100"
    assert suites.gpu_slug("NVIDIA H200") == "h200"
    assert suites.gpu_slug("NVIDIA A100-SXM4-80GB") == "a100"
    assert suites.gpu_slug("Some Card") == "card"  # no model word: the last word, as before
