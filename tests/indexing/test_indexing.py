"""`embedserve index` on a local Ray: vectors equal `Embedder`'s on the same records, ids kept,
bad records reported with their reasons, a second run skips what is done, and a worker killed
mid-job still leaves every record written exactly once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ray")
pq = pytest.importorskip("pyarrow.parquet")

from embedserve.indexing.job import IndexOptions, input_files, run_index  # noqa: E402
from tests.data.texts import MULTILINGUAL, QUERIES, passages  # noqa: E402

TEXTS = QUERIES + MULTILINGUAL + [p for p in passages() if len(p) < 900]


def write_jsonl(path: Path, records: list[dict]) -> Path:  # type: ignore[type-arg]
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def read_rows(out: Path) -> dict[str, np.ndarray]:
    rows: dict[str, np.ndarray] = {}
    for f in sorted(out.glob("*.parquet")):
        table = pq.read_table(f)
        for id_, vec in zip(table["id"].to_pylist(), table["vector"].to_pylist(), strict=True):
            assert id_ not in rows, f"{id_} written twice"
            rows[id_] = np.asarray(vec, dtype=np.float32)
    return rows


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("corpus")
    records = [{"id": f"a{i}", "text": TEXTS[i % len(TEXTS)]} for i in range(150)]
    records[3] = {"id": "a3", "text": ""}
    records[4] = {"id": "a4"}
    records[5] = {"id": "a5", "text": 7}
    records[6] = {"id": "a6", "text": " ".join(passages()[-3:])}  # over 256 tokens
    write_jsonl(folder / "part-a.jsonl", records)
    import pyarrow as pa

    table = pa.table(
        {
            "id": [f"b{i}" for i in range(90)],
            "text": [TEXTS[(i * 7) % len(TEXTS)] for i in range(90)],
        }
    )
    pq.write_table(table, folder / "part-b.parquet")
    return folder


def test_index_equals_embedder_reports_bad_records_and_resumes(
    corpus: Path,
    tmp_path: Path,
    minilm,  # type: ignore[no-untyped-def]
) -> None:
    out = tmp_path / "vectors"
    options = IndexOptions(
        model=str(minilm.spec.path), device="cpu", dtype="float32", batch_size=64
    )
    summary = run_index(corpus, out, options, log=lambda line: None)
    assert (summary["files"], summary["skipped"]) == (2, 0)
    assert (summary["records"], summary["errors"]) == (236, 4)
    rows = read_rows(out)
    want_ids = [f"a{i}" for i in range(150) if i not in (3, 4, 5, 6)] + [f"b{i}" for i in range(90)]
    assert sorted(rows) == sorted(want_ids)
    texts = {f"a{i}": TEXTS[i % len(TEXTS)] for i in range(150)}
    texts |= {f"b{i}": TEXTS[(i * 7) % len(TEXTS)] for i in range(90)}
    ids = sorted(rows)
    want = minilm.encode([texts[i] for i in ids])
    got = np.stack([rows[i] for i in ids])
    cos = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    assert cos.min() >= 0.99999
    table = pq.read_table(out / "part-a.parquet")
    assert set(table.column_names) == {"id", "vector", "model", "dims", "output_dtype"}
    assert set(table["dims"].to_pylist()) == {384} and set(table["output_dtype"].to_pylist()) == {
        "float32"
    }
    errors = [json.loads(line) for line in (out / "part-a.errors.jsonl").read_text().splitlines()]
    reasons = {e["id"]: e["error"] for e in errors}
    assert reasons["a3"] == "'text' is empty" and reasons["a4"] == "missing 'text'"
    assert reasons["a5"] == "'text' is int, not a string"
    assert "over this model's limit of 256" in reasons["a6"] and "--truncate" in reasons["a6"]
    # a second run finds everything done and does nothing
    again = run_index(corpus, out, options, log=lambda line: None)
    assert (again["skipped"], again["records"]) == (2, 0)
    # an input changed since: only it runs again
    write_jsonl(corpus / "part-a.jsonl", [{"id": "a0", "text": "changed"}])
    third = run_index(corpus, out, options, log=lambda line: None)
    assert (third["skipped"], third["records"]) == (1, 1)
    assert len(read_rows(out)) == 1 + 90


def test_inputs_are_checked_before_ray_starts(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no input files"):
        input_files(tmp_path / "nothing-*.jsonl")
    (tmp_path / "notes.csv").write_text("x")
    with pytest.raises(ValueError, match="no input files"):
        input_files(tmp_path)


@pytest.mark.slow
def test_a_killed_worker_still_leaves_every_record_once(tmp_path: Path, minilm_path: Path) -> None:
    corpus = tmp_path / "in"
    corpus.mkdir()
    for k in range(4):
        write_jsonl(
            corpus / f"part-{k}.jsonl",
            [{"id": f"{k}-{i}", "text": TEXTS[(i + k) % len(TEXTS)]} for i in range(600)],
        )
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "embedserve.cli.main", "index", "--input", str(corpus), "--output", str(out),
           "--model", str(minilm_path), "--device", "cpu", "--dtype", "float32", "--batch-size", "32"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killed = None
    deadline = time.time() + 240
    while killed is None and time.time() < deadline and proc.poll() is None:
        # the actor's process, once it has written some of the job
        ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
        actors = [int(line.split()[0]) for line in ps.splitlines() if "MapWorker" in line]
        if actors and (out / "_index.json").exists():
            killed = actors[0]
            os.kill(killed, signal.SIGKILL)
        time.sleep(0.2)
    stdout, stderr = proc.communicate(timeout=600)
    assert killed is not None, "no actor process was seen while the job ran"
    assert proc.returncode == 0, stderr[-3000:]
    summary = json.loads(stdout.strip().splitlines()[-1])
    rows = read_rows(out)  # asserts no id twice
    assert len(rows) == 2400 and summary["errors"] == 0


def test_record_ids_as_text() -> None:
    from embedserve.indexing.actor import id_text

    # an integer id column with a gap arrives as float64 with NaN
    assert [id_text(v) for v in (3.0, float("nan"), None, "x-1", 7, 2.5)] == [
        "3",
        "",
        "",
        "x-1",
        "7",
        "2.5",
    ]


def test_one_job_over_many_files_names_outputs_apart_and_reports_progress(
    tmp_path: Path,
    minilm,  # type: ignore[no-untyped-def]
) -> None:
    first, second, out = tmp_path / "first", tmp_path / "second", tmp_path / "out"
    first.mkdir()
    second.mkdir()
    write_jsonl(first / "part.jsonl", [{"id": f"f{i}", "text": TEXTS[i]} for i in range(20)])
    write_jsonl(first / "notext.jsonl", [{"id": f"n{i}", "body": "x"} for i in range(5)])
    (first / "empty.jsonl").write_text("")
    write_jsonl(second / "part.jsonl", [{"id": f"s{i}", "text": TEXTS[i + 1]} for i in range(7)])
    options = IndexOptions(model=str(minilm.spec.path), device="cpu", dtype="float32", batch_size=8)
    lines: list[str] = []
    summary = run_index(first, out, options, log=lines.append)
    assert (summary["files"], summary["records"], summary["errors"]) == (3, 20, 5)
    assert summary["tokens"] == sum(map(len, minilm.tokenize(TEXTS[:20])))
    assert "3/3 files, 25/25 records" in lines[-1] and "tokens/s" in lines[-1]
    reasons = (out / "notext.errors.jsonl").read_text().splitlines()
    assert [json.loads(r)["error"] for r in reasons] == ["missing 'text'"] * 5
    assert pq.read_table(out / "empty.parquet").num_rows == 0
    # another job into the same folder, with an input of the same name: a name of its own
    other = run_index(second, out, options, log=lambda line: None)
    assert other["records"] == 7
    named = sorted(p.name for p in out.glob("part*.parquet"))
    assert len(named) == 2 and "part.parquet" in named
    assert next(n for n in named if n != "part.parquet").startswith("part-")
    assert sorted(read_rows(out)) == sorted(
        [f"f{i}" for i in range(20)] + [f"s{i}" for i in range(7)]
    )
    # the first job's outputs are intact: run again, it finds everything done
    assert run_index(first, out, options, log=lambda line: None)["skipped"] == 3
    rows = read_rows(out)
    want = minilm.encode([TEXTS[i + 1] for i in range(7)])
    got = np.stack([rows[f"s{i}"] for i in range(7)])
    assert (got * want).sum(1).min() >= 0.99999
    with pytest.raises(ValueError, match="is the folder of the input"):
        run_index(first, first, options)


def test_embed_dataset_takes_options_as_fields(minilm) -> None:  # type: ignore[no-untyped-def]
    import ray

    from embedserve.indexing.job import embed_dataset

    ds = ray.data.from_items([{"id": i, "text": TEXTS[i]} for i in range(6)])
    rows = embed_dataset(
        ds, model=str(minilm.spec.path), device="cpu", dtype="float32", batch_size=4
    ).take_all()
    rows.sort(key=lambda r: int(r["id"]))
    got = np.stack([r["vector"] for r in rows])
    want = minilm.encode(TEXTS[:6])
    assert (got * want).sum(1).min() >= 0.99999
    assert [r["tokens"] for r in rows] == [len(t) for t in minilm.tokenize(TEXTS[:6])]


def test_the_driver_splits_batches_by_file_and_refuses_rows_out_of_order(tmp_path: Path) -> None:
    """`Job.consume` without Ray: batches that span files, a file with no rows between two
    others, and a file's rows arriving after it was finished (an error, not a silent mix)."""
    from embedserve.indexing.files import input_key
    from embedserve.indexing.job import Job, Progress

    inputs = [write_jsonl(tmp_path / f"{n}.jsonl", []) for n in ("a", "b", "c")]
    out = tmp_path / "out"
    out.mkdir()

    def batch(paths: list[Path], ids: list[str]) -> dict[str, np.ndarray]:
        n = len(ids)
        return {
            "id": np.array(ids, dtype=object),
            "vector": np.ones((n, 4), dtype=np.float32),
            "error": np.array([""] * n, dtype=object),
            "model": np.array(["m"] * n, dtype=object),
            "dims": np.full(n, 4, dtype=np.int32),
            "output_dtype": np.array(["float32"] * n, dtype=object),
            "tokens": np.full(n, 3, dtype=np.int64),
            "path": np.array([str(p) for p in paths], dtype=object),
        }

    names = {input_key(p): p.stem for p in inputs}
    a, _, c = inputs
    job = Job(out, {}, names, Progress(3, 0, 4, lambda line: None))
    job.consume(inputs, iter([batch([a, a], ["a0", "a1"]), batch([a, c], ["a2", "c0"])]))
    assert pq.read_table(out / "a.parquet")["id"].to_pylist() == ["a0", "a1", "a2"]
    assert pq.read_table(out / "b.parquet").num_rows == 0  # no rows: an empty output
    assert pq.read_table(out / "c.parquet")["id"].to_pylist() == ["c0"]
    assert job.progress.tokens == 12
    again = Job(out, {}, names, Progress(3, 0, 4, lambda line: None))
    with pytest.raises(RuntimeError, match="out of order"):
        again.consume(inputs, iter([batch([a, c, a], ["a0", "c0", "a1"])]))


def test_a_folder_of_text_documents_indexes_and_resumes(
    tmp_path: Path,
    minilm,  # type: ignore[no-untyped-def]
) -> None:
    """.txt and .md files: each one document (its id the file's name), with the progress,
    resume and bad-record reports of the other formats; `lines`: a record per line, an empty
    line a bad record; switching between the two is a change of options, refused."""
    docs = tmp_path / "docs"
    docs.mkdir()
    texts = {"a.txt": TEXTS[0] + "\n" + TEXTS[1], "b.md": "# title\n\n" + TEXTS[2], "c.txt": ""}
    for name, text in texts.items():
        (docs / name).write_text(text, encoding="utf-8")
    out = tmp_path / "vectors"
    options = IndexOptions(model=str(minilm.spec.path), device="cpu", dtype="float32")
    lines: list[str] = []
    summary = run_index(docs, out, options, log=lines.append)
    assert (summary["files"], summary["records"], summary["errors"]) == (3, 2, 1)
    assert any("3/3 files" in line for line in lines)
    rows = read_rows(out)
    assert sorted(rows) == ["a.txt", "b.md"]
    want = minilm.encode([texts["a.txt"], texts["b.md"]])
    np.testing.assert_allclose(np.stack([rows["a.txt"], rows["b.md"]]), want, atol=1e-5)
    errors = (out / "c.errors.jsonl").read_text().splitlines()
    assert [json.loads(e)["error"] for e in errors] == ["'text' is empty"]
    assert run_index(docs, out, options, log=lambda line: None)["skipped"] == 3
    with pytest.raises(ValueError, match="text_lines"):
        run_index(docs, out, IndexOptions(**{**options.__dict__, "lines": True}))
    by_line = tmp_path / "by-line"
    (docs / "c.txt").write_text("one\n\nthree\n", encoding="utf-8")
    summary = run_index(docs / "c.txt", by_line, IndexOptions(**{**options.__dict__, "lines": True}),
                        log=lambda line: None)  # fmt: skip
    assert (summary["records"], summary["errors"]) == (2, 1)
    table = pq.read_table(by_line / "c.parquet")
    np.testing.assert_allclose(np.asarray(table["vector"].to_pylist()),
                               minilm.encode(["one", "three"]), atol=1e-5)  # fmt: skip
