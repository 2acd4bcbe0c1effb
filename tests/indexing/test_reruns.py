"""A rerun of `embedserve index` into a folder made with other options (model, dtype, output
dtype, prompt, truncation) is refused naming the difference, or with `overwrite` re-embeds; and
a record appended while a file is being read is embedded by the next run."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ray")
pq = pytest.importorskip("pyarrow.parquet")

from embedserve.indexing.files import MANIFEST, input_key, is_done, read_manifest  # noqa: E402
from embedserve.indexing.identity import vectors_identity  # noqa: E402
from embedserve.indexing.job import IndexOptions, Job, Progress, run_index  # noqa: E402
from tests.indexing.test_indexing import TEXTS, read_rows, write_jsonl  # noqa: E402


def batch_of(path: Path, ids: list[str]) -> dict[str, np.ndarray]:
    n = len(ids)
    return {
        "id": np.array(ids, dtype=object),
        "vector": np.ones((n, 4), dtype=np.float32),
        "error": np.array([""] * n, dtype=object),
        "model": np.array(["m"] * n, dtype=object),
        "dims": np.full(n, 4, dtype=np.int32),
        "output_dtype": np.array(["float32"] * n, dtype=object),
        "tokens": np.full(n, 3, dtype=np.int64),
        "path": np.array([str(path)] * n, dtype=object),
    }


def done_folder(tmp_path: Path, options: IndexOptions) -> tuple[Path, Path]:
    """An input and an output folder listing it as done with `options`, written by the driver
    without Ray (so that the checks before Ray starts are tested quickly)."""
    corpus, out = tmp_path / "in", tmp_path / "out"
    corpus.mkdir(parents=True)
    out.mkdir()
    path = write_jsonl(corpus / "part.jsonl", [{"id": "r0", "text": "x"}])
    job = Job(out, {}, {input_key(path): "part"}, Progress(1, 0, 1, lambda line: None),
              vectors_identity(options, 0))  # fmt: skip
    job.consume([path], iter([batch_of(path, ["r0"])]))
    return corpus, out


def test_a_rerun_with_other_options_is_refused_naming_the_difference(
    tmp_path: Path, minilm_path: Path
) -> None:
    # float32 asked for: a native-bf16 CPU's default is bf16, and bf16 is the change tried below
    base = IndexOptions(model=str(minilm_path), device="cpu", dtype="float32")
    corpus, out = done_folder(tmp_path, base)
    assert run_index(corpus, out, base, log=lambda line: None)["skipped"] == 1  # same: resumes
    other = tmp_path / "other-model"  # the same files at another path: another model folder
    other.mkdir()
    for f in minilm_path.iterdir():
        (other / f.name).symlink_to(f)
    cases = {
        "dtype: 'float32' (this run: 'bfloat16')": {"dtype": "bfloat16"},
        f"model: {str(minilm_path)!r} (this run: {str(other)!r})": {"model": str(other)},
        "output_dtype: 'float32' (this run: 'int8')": {"output_dtype": "int8"},
        "input_type: None (this run: 'query')": {"input_type": "query"},
        "truncate: None (this run: 'end')": {"truncate": "end"},
        "prompt_name: None (this run: 'query')": {"prompt_name": "query"},
    }
    for named, change in cases.items():
        options = replace(base, **change)
        with pytest.raises(ValueError, match="--overwrite") as e:
            run_index(corpus, out, options, log=lambda line: None)
        assert named in str(e.value) and "part.jsonl" in str(e.value)
    # the model's files changed in place (a config edited): the same path, another model
    (other / "config.json").unlink()
    config = json.loads((minilm_path / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "layer_norm_eps": 1e-6}))
    done_folder(tmp_path / "again", IndexOptions(model=str(other), device="cpu"))
    edited = json.loads((other / "config.json").read_text()) | {"layer_norm_eps": 1e-5}
    (other / "config.json").write_text(json.dumps(edited))
    with pytest.raises(ValueError, match="the files of model .* changed since"):
        run_index(tmp_path / "again" / "in", tmp_path / "again" / "out",
                  IndexOptions(model=str(other), device="cpu"), log=lambda line: None)  # fmt: skip
    # a manifest of an older embedserve (no options recorded) is not trusted either
    manifest = read_manifest(out)
    for entry in manifest.values():
        del entry["vectors"]
    (out / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="not recorded"):
        run_index(corpus, out, base, log=lambda line: None)


def test_the_input_fingerprint_is_the_one_before_the_file_was_read(tmp_path: Path) -> None:
    """A record appended after the job read the file but before it wrote the output: the
    manifest holds the file as it was read, so the next run does it again."""
    out = tmp_path / "out"
    out.mkdir()
    path = write_jsonl(tmp_path / "part.jsonl", [{"id": "r0", "text": "x"}])

    def batches():  # the rows the Dataset read; then a writer appends to the file
        yield batch_of(path, ["r0"])
        with path.open("a") as f:
            f.write(json.dumps({"id": "r1", "text": "appended"}) + "\n")

    job = Job(out, {}, {input_key(path): "part"}, Progress(1, 0, 1, lambda line: None))
    job.consume([path], batches())
    entry = read_manifest(out)[input_key(path)]
    assert entry["records"] == 1 and not is_done(out, entry, path)


def test_overwrite_re_embeds_and_a_record_appended_mid_job_is_embedded_next_run(
    tmp_path: Path,
    minilm,  # type: ignore[no-untyped-def]
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import embedserve.indexing.job as job_module

    corpus, out = tmp_path / "in", tmp_path / "out"
    corpus.mkdir()
    path = write_jsonl(corpus / "part.jsonl", [{"id": f"r{i}", "text": TEXTS[i]} for i in range(5)])
    real = job_module.embed_dataset

    class AppendingWhileRead:  # the Dataset of the job, and a writer appending as it is read
        def __init__(self, ds: object) -> None:
            self.ds = ds

        def iter_batches(self, **kwargs: object):  # type: ignore[no-untyped-def]
            for i, b in enumerate(self.ds.iter_batches(**kwargs)):  # type: ignore[attr-defined]
                if i == 0:
                    with path.open("a") as f:
                        f.write(json.dumps({"id": "r5", "text": TEXTS[5]}) + "\n")
                yield b

    monkeypatch.setattr(job_module, "embed_dataset", lambda d, o: AppendingWhileRead(real(d, o)))
    # float32 asked for (as `minilm`): the machine's default may be bf16, the change tried below
    options = IndexOptions(model=str(minilm.spec.path), device="cpu", dtype="float32", batch_size=2)
    assert run_index(corpus, out, options, log=lambda line: None)["records"] == 5
    monkeypatch.setattr(job_module, "embed_dataset", real)
    again = run_index(corpus, out, options, log=lambda line: None)
    assert (again["skipped"], again["records"]) == (0, 6)
    rows = read_rows(out)
    assert sorted(rows) == [f"r{i}" for i in range(6)]
    got = np.stack([rows[f"r{i}"] for i in range(6)])
    assert (got * minilm.encode(TEXTS[:6])).sum(1).min() > 0.9999
    # another dtype into the same folder: refused, then with overwrite embedded again with it
    bf16 = replace(options, dtype="bfloat16")
    with pytest.raises(ValueError, match="dtype"):
        run_index(corpus, out, bf16, log=lambda line: None)
    third = run_index(corpus, out, bf16, log=lambda line: None, overwrite=True)
    assert (third["skipped"], third["records"]) == (0, 6)
    assert read_manifest(out)[input_key(path)]["vectors"]["dtype"] == "bfloat16"
    assert sorted(read_rows(out)) == [f"r{i}" for i in range(6)]
    assert run_index(corpus, out, bf16, log=lambda line: None)["skipped"] == 1
    assert pq.read_table(out / "part.parquet").num_rows == 6
