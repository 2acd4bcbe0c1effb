"""Folders as other tools save them load equal to the reference library (fp32, CPU).

Every family of the registry is saved the ways users make folders: transformers' own
`save_pretrained` of the bare model and of a task model (the encoder under its base-model
prefix, a head beside it, tied weights left out), sentence-transformers' `save` (SparseEncoder's
for SPLADE), and a `pytorch_model.bin` with the legacy `LayerNorm.gamma` / `beta` names that
transformers still reads. Each folder must give the reference's vectors (cosine >= 0.99999; the
same sparse terms), the reference being sentence-transformers (or FlagEmbedding for bge-m3) on
the folder `make-checkpoint` wrote. A folder transformers refuses is refused with the tensor
and the file named. PyLate's own save of a ColBERT folder: `test_pylate_save_equals_pylate`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from embedserve.devtools.checkpoints import make_checkpoint
from embedserve.devtools.pylate_env import env_folder
from embedserve.embedder import Embedder
from embedserve.engine.weights import read_state_dict
from embedserve.loading.bundled import resolve_model
from embedserve.loading.spec import ModelLoadError, read_model_spec
from tests.engine.test_sparse_multivector import cosines

transformers = pytest.importorskip("transformers")
st = pytest.importorskip("sentence_transformers")

TEXTS = [
    "what is a vector database?",
    "Zürich, 東京 and São Paulo: cities (and punctuation!) in one line...",
    " ".join(["a passage of some length about sparse and dense retrieval"] * 8),
]
MIN_COSINE = 0.99999
# family -> (make-checkpoint arch or bundled name, its task model class, extra make options)
DENSE = {
    "bert": ("minilm", "BertForMaskedLM", {}),
    "xlm-roberta": ("xlm-roberta-tiny", "XLMRobertaForMaskedLM", {}),
    "mpnet": ("mpnet-tiny", "MPNetForMaskedLM", {}),
    "nomic-bert": ("nomic-bert-tiny", "NomicBertForMaskedLM", {}),
    "modernbert": ("modernbert-tiny", "ModernBertForMaskedLM", {}),
    "gemma3": ("gemma3-tiny", "Gemma3ForCausalLM", {}),
    "qwen3": ("qwen3-tiny", "Qwen3ForCausalLM", {"attention": "bidirectional"}),
}
SAVES = ("bare", "task", "sentence-transformers", "legacy-bin")


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The folder of each family, as `make-checkpoint` writes it (MiniLM: the bundled one)."""
    root = tmp_path_factory.mktemp("sources")
    out = {}
    for family, (arch, _, options) in DENSE.items():
        if arch == "minilm":
            out[family] = resolve_model(arch)
        else:
            out[family] = make_checkpoint(
                root / arch, arch=arch, dtype="float32", seed=21, **options
            )
    for arch in ("splade-minilm-l6", "bge-m3-tiny", "answerai-colbert-small-v1"):
        out[arch] = make_checkpoint(root / arch, arch=arch, dtype="float32", seed=21)
    return out


def copy_without_weights(src: Path, out: Path) -> Path:
    """The folder's configs, tokenizer and modules, without the encoder's weights."""
    skip = shutil.ignore_patterns("model.safetensors", "model.safetensors.index.json",
                                  "model-*.safetensors")  # fmt: skip

    def ignore(folder: str, names: list[str]) -> set[str]:
        return skip(folder, names) if Path(folder) == src else set()

    shutil.copytree(src, out, ignore=ignore)
    return out


def legacy_bin(folder: Path) -> None:
    """The folder's weights as transformers' old pickled file under the legacy names."""
    weights = folder / "model.safetensors"
    tensors = load_file(str(weights))
    renamed = {
        k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
        for k, v in tensors.items()
    }  # fmt: skip
    weights.unlink()
    torch.save(renamed, folder / "pytorch_model.bin")


def save(src: Path, out: Path, how: str, task_class: str) -> Path:
    """`src` saved one of SAVES' ways into `out`."""
    if how == "sentence-transformers":
        st.SentenceTransformer(str(src), device="cpu").save(str(out))
        return out
    copy_without_weights(src, out)
    cls = transformers.AutoModel if how == "bare" else getattr(transformers, task_class)
    cls.from_pretrained(src, dtype=torch.float32).save_pretrained(out)
    if how == "legacy-bin":
        legacy_bin(out)
    return out


@pytest.fixture(scope="module")
def references(sources: dict[str, Path]) -> dict[str, np.ndarray]:
    """sentence-transformers' vectors on each family's own folder."""
    return {
        family: st.SentenceTransformer(str(sources[family]), device="cpu").encode(TEXTS)
        for family in DENSE
    }


@pytest.mark.parametrize("how", SAVES)
@pytest.mark.parametrize("family", list(DENSE))
def test_dense_folder_saved_by_other_tools_equals_the_reference(
    family: str,
    how: str,
    sources: dict[str, Path],
    references: dict[str, np.ndarray],
    tmp_path: Path,
) -> None:
    folder = save(sources[family], tmp_path / family, how, DENSE[family][1])
    assert read_model_spec(folder).family == family
    # float32 whatever the folder's native output (the Qwen3 one is pplx-embed's int8)
    got = Embedder(folder, device="cpu", dtype="float32").encode(TEXTS, output_dtype="float32")
    assert cosines(got, references[family]).min() >= MIN_COSINE
    # transformers itself reads the folder to the same vectors (the layout is one it accepts)
    theirs = st.SentenceTransformer(str(folder), device="cpu").encode(TEXTS)
    assert cosines(theirs, references[family]).min() >= MIN_COSINE


def test_the_saves_have_the_layouts_they_are_for(sources: dict[str, Path], tmp_path: Path) -> None:
    """The task save puts the prefix and a head in the file and leaves the tied decoder out;
    the legacy save has gamma/beta names in a pickle."""
    src = sources["bert"]
    task = save(src, tmp_path / "task", "task", "BertForMaskedLM")
    names = set(load_file(str(task / "model.safetensors")))
    assert "bert.embeddings.word_embeddings.weight" in names
    assert "cls.predictions.transform.dense.weight" in names
    assert "cls.predictions.decoder.weight" not in names  # tied to the word embeddings
    old = save(src, tmp_path / "old", "legacy-bin", "BertForMaskedLM")
    pickled = torch.load(old / "pytorch_model.bin", weights_only=True)
    assert "bert.embeddings.LayerNorm.gamma" in pickled and not (old / "model.safetensors").exists()


# -- sparse and multi-vector ----------------------------------------------------------------


def sparse_rows(embedder: Embedder) -> list[dict[str, list]]:
    out = embedder.encode_outputs(TEXTS, outputs="sparse").sparse
    assert out is not None
    return list(out)


@pytest.mark.parametrize("how", ["sparse-encoder", "task", "legacy-bin"])
def test_splade_saved_by_other_tools_gives_the_same_terms(
    how: str, sources: dict[str, Path], tmp_path: Path
) -> None:
    src = sources["splade-minilm-l6"]
    reference = st.SparseEncoder(str(src), device="cpu")
    want = reference.encode(TEXTS, convert_to_tensor=True).to_dense().numpy()
    if how == "sparse-encoder":
        folder = tmp_path / "saved"
        reference.save(str(folder))
    else:
        folder = save(src, tmp_path / "saved", how, "BertForMaskedLM")
    for row, vec in zip(want, sparse_rows(Embedder(folder, device="cpu", dtype="float32")),
                        strict=True):  # fmt: skip
        nz = np.flatnonzero(row)
        assert vec["indices"] == nz.tolist()
        np.testing.assert_allclose(vec["values"], row[nz], rtol=1e-5, atol=1e-6)


def test_bge_m3_encoder_saved_by_transformers_equals_flagembedding(
    sources: dict[str, Path], tmp_path: Path
) -> None:
    from embedserve.devtools.references import flag_m3_embedder

    try:
        model_class = flag_m3_embedder()
    except ModuleNotFoundError:
        pytest.skip("FlagEmbedding is not installed")
    src = sources["bge-m3-tiny"]
    folder = save(src, tmp_path / "m3", "legacy-bin", "XLMRobertaForMaskedLM")
    ref = model_class(str(src), use_fp16=False, devices="cpu").encode(
        TEXTS, return_dense=True, return_sparse=True, return_colbert_vecs=True
    )
    ours = Embedder(folder, device="cpu", dtype="float32").encode_outputs(
        TEXTS, outputs=("dense", "sparse", "multivector")
    )
    assert ours.dense is not None and ours.sparse is not None and ours.multivector is not None
    assert cosines(ours.dense, np.asarray(ref["dense_vecs"])).min() >= MIN_COSINE
    for mine, theirs in zip(ours.sparse, ref["lexical_weights"], strict=True):
        assert sorted(mine["indices"]) == sorted(int(k) for k in theirs)
    for mine, theirs in zip(ours.multivector, ref["colbert_vecs"], strict=True):
        assert cosines(mine, np.asarray(theirs)).min() >= MIN_COSINE


PYLATE_SAVE = """
import json, sys
import numpy as np
from pylate import models
src, out, texts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
model = models.ColBERT(src, device="cpu")
model.save(out)
vectors = model.encode(texts, is_query=False, batch_size=4)
np.savez(out + ".npz", **{str(i): np.asarray(v, np.float32) for i, v in enumerate(vectors)})
"""


def run_in_pylate_env(script: str, *args: str) -> None:
    """`script` under PyLate's reference environment (its sentence-transformers 5.3 and
    transformers 5.3: other versions than the project's), or a skip without it."""
    pylate_env = env_folder(Path(__file__).parents[2])
    if not (pylate_env / "pylate").exists():
        pytest.skip(
            f"PyLate's reference environment is missing ({pylate_env}): build it with "
            "`python -m embedserve.devtools.pylate_env` (README.md, Development)"
        )
    env = {**os.environ, "PYTHONPATH": str(pylate_env)}
    done = subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.slow  # PyLate in a subprocess of its own environment: ~20 s on 2 cores
def test_pylate_save_equals_pylate(sources: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "pylate-saved"
    run_in_pylate_env(PYLATE_SAVE, str(sources["answerai-colbert-small-v1"]), str(out),
                      json.dumps(TEXTS))  # fmt: skip
    want = np.load(str(out) + ".npz")
    ours = Embedder(out, device="cpu", dtype="float32").encode_outputs(
        TEXTS, input_type="document", truncate="end"
    )
    assert ours.multivector is not None
    for i, mine in enumerate(ours.multivector):
        assert mine.shape == want[str(i)].shape
        assert cosines(mine, want[str(i)]).min() >= MIN_COSINE


ST5_SAVE = """
import json, sys
import numpy as np
from sentence_transformers import SentenceTransformer, SparseEncoder
kind, src, out, texts = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
cls = SparseEncoder if kind == "sparse" else SentenceTransformer
cls(src, device="cpu").save(out)
# the saved folder as that version reads it back (NOTE: transformers 5.3 saves a bidirectional
# Gemma 3's sliding_window already halved, so its folder differs from the one it read)
got = cls(out, device="cpu").encode(texts, convert_to_tensor=kind == "sparse")
np.save(out + ".npy", got.to_dense().numpy() if kind == "sparse" else got)
"""


@pytest.mark.slow  # sentence-transformers 5.3 in a subprocess: ~20 s on 2 cores each
@pytest.mark.parametrize("source", ["splade-minilm-l6", "gemma3", "mpnet"])
def test_sentence_transformers_5_saves_equal_their_vectors(
    source: str, sources: dict[str, Path], tmp_path: Path
) -> None:
    """Folders saved by another sentence-transformers and transformers (5.3, PyLate's
    environment) than the project's: a SparseEncoder's and two SentenceTransformers' (Dense
    modules, relative position bias) give that version's own vectors on the folder."""
    out = tmp_path / "st5"
    kind = "sparse" if source.startswith("splade") else "dense"
    run_in_pylate_env(ST5_SAVE, kind, str(sources[source]), str(out), json.dumps(TEXTS))
    want = np.load(str(out) + ".npy")
    ours = Embedder(out, device="cpu", dtype="float32")
    if kind == "dense":
        got = ours.encode(TEXTS, output_dtype="float32")
        assert cosines(got, want).min() >= MIN_COSINE
        return
    for row, vec in zip(want, sparse_rows(ours), strict=True):
        nz = np.flatnonzero(row)
        assert vec["indices"] == nz.tolist()
        np.testing.assert_allclose(vec["values"], row[nz], rtol=1e-5, atol=1e-6)


# -- refused -----------------------------------------------------------------------------------


def test_a_folder_transformers_refuses_names_the_tensor_and_the_file(
    sources: dict[str, Path], tmp_path: Path
) -> None:
    folder = save(sources["bert"], tmp_path / "bad", "task", "BertForMaskedLM")
    weights = folder / "model.safetensors"
    tensors = load_file(str(weights))
    bad = "bert.encoder.layer.1.attention.self.query.weight"
    tensors[bad] = tensors[bad][:, :-1].contiguous()  # a column short
    save_file(tensors, str(weights), metadata={"format": "pt"})
    with pytest.raises(Exception, match="mismatched_sizes|size mismatch"):
        transformers.AutoModel.from_pretrained(folder)
    with pytest.raises(ModelLoadError) as err:
        Embedder(folder, device="cpu", dtype="float32")
    assert str(weights) in str(err.value) and repr(bad) in str(err.value)
    # a tensor missing from every file: the weights file is named, and the tensor
    del tensors[bad]
    save_file(tensors, str(weights), metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match=r"model\.safetensors: missing tensor 'encoder"):
        Embedder(folder, device="cpu", dtype="float32")


def test_one_tensor_under_two_names_is_refused(sources: dict[str, Path], tmp_path: Path) -> None:
    folder = copy_without_weights(sources["bert"], tmp_path / "twice")
    tensors = load_file(str(sources["bert"] / "model.safetensors"))
    name = "embeddings.word_embeddings.weight"
    tensors["bert." + name] = tensors[name].clone()
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(
        ModelLoadError, match=r"'bert\.embeddings\..*' and 'embeddings\..*' are both"
    ):
        read_state_dict(folder, ("bert.",))
