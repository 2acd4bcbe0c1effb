"""`embedserve embed`, `embedserve rerank` and `embedserve models`: the offline commands, with
the input files they read (.txt, .jsonl) and the vector files they write (.npy, .parquet)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from functools import partial
from pathlib import Path
from typing import Any

from embedserve.cli.embed_inputs import (
    Records,
    check_input,
    named_where,
    read_inputs,
    read_texts,
)
from embedserve.core.head import OUTPUT_DTYPES
from embedserve.errors import InputError, InputTooLong
from embedserve.options import EngineOptions
from embedserve.processes import say
from embedserve.retrieval.results import DEFAULT_OUTPUTS_RULE


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register embed, rerank and models."""
    _add_embed(sub)
    _add_rerank(sub)
    _add_models(sub)


def _add_embed(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("embed", help="embed texts given as arguments or a file, offline")
    _add_embed_io(p)
    EngineOptions.add_arguments(p)
    _add_embed_outputs(p)
    p.set_defaults(run=_run_embed)


def _add_embed_io(p: argparse.ArgumentParser) -> None:
    """`embed`'s texts: given as arguments or read from files, and where the vectors go."""
    p.add_argument("texts", nargs="*", help="texts to embed; printed as JSON")
    p.add_argument(
        "--input",
        type=Path,
        help="a .txt (one text per line) or .jsonl ({'text': ...}) file, or a folder or glob of "
        ".txt / .md files (each one document, its id its name; see --lines) and .jsonl files",
    )
    p.add_argument(
        "--lines",
        action="store_true",
        help="with a folder or glob: each .txt / .md file holds one text per line, as a single "
        ".txt file does",
    )
    p.add_argument("--output", type=Path, help="where to write vectors: .npy or .parquet")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --output file")
    p.add_argument(
        "--skip-empty",
        action="store_true",
        help="leave out empty and whitespace-only lines and documents of --input (reported) "
        "instead of failing; every other line is one row",
    )


def _add_embed_outputs(p: argparse.ArgumentParser) -> None:
    """What `embed` returns for each text (the head, truncation, prompt, outputs), and its batch."""
    p.add_argument("--dimensions", type=int, default=None, help="truncate to this many dimensions")
    p.add_argument("--no-normalize", action="store_true", help="return un-normalized vectors")
    p.add_argument(
        "--output-dtype",
        default=None,
        choices=OUTPUT_DTYPES,
        help="default: the model's native output (float32 unless its folder declares one)",
    )
    p.add_argument(
        "--truncate",
        default=None,
        choices=["end", "start", "chunk"],
        help="over-long inputs, instead of failing: end (keep the beginning), start (keep the "
        "end and the prompt) or chunk (embed windows, averaged by content tokens)",
    )
    p.add_argument(
        "--prompt-name", default=None, help="a prompt the model folder defines (e.g. query)"
    )
    p.add_argument(
        "--input-type",
        default=None,
        choices=["query", "document"],
        help="query or document: the folder's prompt of that name, or ColBERT's query/document "
        "markers (default: documents)",
    )
    p.add_argument(
        "--outputs",
        default=None,
        help="a comma-separated list of dense, sparse, multivector (what the model has): sparse "
        "as sparse_indices/sparse_values list columns, multivector as a list of vectors per row "
        f"(.parquet or JSON; .npy holds dense only). Default: {DEFAULT_OUTPUTS_RULE}",
    )
    p.add_argument(
        "--batch-tokens",
        type=int,
        default=None,
        help="tokens per engine batch (default: the engine's largest CUDA-graph bucket, 8192, on a GPU; 2048 on the CPU)",
    )


def write_vectors(path: Path, vectors: object, ids: list[Any] | None = None) -> None:
    """.npy: the vectors, row i for input i; .parquet: an `id` column (the records' ids, else
    0, 1, ...) beside the `embedding` column."""
    import numpy as np

    arr = np.asarray(vectors)
    if path.suffix == ".npy":
        np.save(path, arr)
    elif path.suffix == ".parquet":
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:
            raise ValueError(
                "writing .parquet needs pyarrow: pip install 'embedserve[parquet]'"
            ) from None
        from embedserve.cli.embed_outputs import DENSE_COLUMN, parquet_ids

        column = pa.FixedSizeListArray.from_arrays(pa.array(arr.reshape(-1)), arr.shape[1])
        id_values = parquet_ids(ids, len(arr))
        pq.write_table(pa.table({"id": pa.array(id_values), DENSE_COLUMN: column}), path)
    else:
        raise ValueError(f"--output must end in .npy or .parquet, got {path.name!r}")


def check_output(path: Path, overwrite: bool) -> None:
    """Everything about `--output` that can fail, checked before any work (an hour of
    embedding must not end in "no such folder")."""
    if path.suffix not in (".npy", ".parquet"):
        raise ValueError(f"--output must end in .npy or .parquet, got {path.name!r}")
    if path.is_dir():
        raise ValueError(
            f"--output {path} is a folder; give a file name ending in .npy or .parquet"
        )
    if path.exists() and not overwrite:
        raise ValueError(f"{path} exists; pass --overwrite to replace it")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise ValueError(f"--output {path}: the folder {folder} does not exist; create it first")
    if not os.access(folder, os.W_OK):
        raise ValueError(f"--output {path}: the folder {folder} is not writable")
    if path.suffix == ".parquet":
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise ValueError(
                "writing .parquet needs pyarrow: pip install 'embedserve[parquet]' (or write .npy)"
            ) from None


def _embed_records(args: argparse.Namespace) -> Records:
    """`embed`'s texts (arguments or --input), with its files checked before anything loads."""
    if bool(args.texts) == bool(args.input):
        raise ValueError("give texts as arguments or --input FILE (one of the two)")
    if args.input is not None:
        check_input(args.input)
    if args.output is not None:
        check_output(args.output, args.overwrite)
    records = (
        read_inputs(args.input, skip_empty=args.skip_empty, lines=args.lines)
        if args.input
        else Records(list(range(len(args.texts))), list(args.texts))
    )
    if records.skipped:
        say(
            f"embedserve embed: skipped {len(records.skipped)} empty "
            f"{'lines' if args.input.is_file() else 'texts'}: {records.skipped}",
            err=True,
        )
    return records


def _write_or_print(vectors: Any, records: Records, args: argparse.Namespace) -> None:
    """Dense vectors (a NumPy array) to --output, else as JSON on standard output."""
    if args.output is not None:
        write_vectors(args.output, vectors, records.ids)
        print(
            f"wrote {vectors.shape[0]} vectors of {vectors.shape[1]} to {args.output}",
            file=sys.stderr,
        )
    else:
        if vectors.dtype.kind != "f" and args.output_dtype is None:  # not what one expects
            say(
                f"embedserve embed: this model's native output is {vectors.dtype.name} (its "
                "folder's embedserve.json); pass --output-dtype float32 for floats",
                err=True,
            )
        json.dump({"model": str(args.model), "embeddings": vectors.tolist()}, sys.stdout)
        sys.stdout.write("\n")


def _run_embed(args: argparse.Namespace) -> int:
    records = _embed_records(args)
    texts = records.texts
    from embedserve.cli.embed_outputs import check_outputs_file, run_outputs
    from embedserve.embedder import Embedder
    from embedserve.loading.bundled import resolve_model
    from embedserve.loading.spec import read_model_spec
    from embedserve.retrieval.results import parse_outputs

    options = EngineOptions.from_args(args)
    # the outputs and the file they go to, checked before the model loads
    outputs = parse_outputs(args.outputs, read_model_spec(resolve_model(options.model)).outputs)
    check_outputs_file(args.output, outputs)
    embedder = Embedder(
        options.model,
        device=options.device,
        dtype=options.dtype,
        cpu_path=options.cpu_path,
        pooling=options.pooling,
        attention=options.attention,
        attention_backend=options.attention_backend,
    )
    try:
        if outputs != ("dense",):
            encode = partial(embedder.encode_outputs, outputs=outputs, **encode_options(args))
            return run_outputs(encode, texts, records.ids, embedder.multivector_dims, args)
        vectors = embed_texts(embedder, texts, args)
    except InputTooLong as e:  # the advice in this command's terms
        raise ValueError(
            f"{named_where(e.where, records, args)} has {e.num_tokens} tokens, over this model's "
            f"limit of {e.max_length}; shorten it or pass --truncate end (keep the beginning) or "
            "--truncate start (keep the end)"
        ) from None
    except InputError as e:  # the file and line, not the position among every file's texts
        raise ValueError(named_where(e.message, records, args)) from None
    _write_or_print(vectors, records, args)
    return 0


def _add_rerank(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "rerank",
        help="score documents against a query, offline (a reranker, or an embedding model's "
        "cosine)",
    )
    p.add_argument("documents", nargs="*", help="documents to rank; results printed as JSON")
    p.add_argument("--query", required=True, help="the query")
    p.add_argument("--input", type=Path, help="documents from a .txt (one per line) or .jsonl file")
    p.add_argument("--top-n", type=int, default=None, help="print only the best N")
    p.add_argument(
        "--truncate",
        default=None,
        choices=["end", "start"],
        help="cut an over-long document (never the query) instead of failing",
    )
    p.add_argument("--instruction", default=None, help="an LLM reranker's instruction")
    p.add_argument("--raw", action="store_true", help="a reranker's logits, not its activation")
    EngineOptions.add_arguments(p)
    p.set_defaults(run=_run_rerank)


def _run_rerank(args: argparse.Namespace) -> int:
    if bool(args.documents) == bool(args.input):
        raise ValueError("give documents as arguments or --input FILE (one of the two)")
    options = EngineOptions.from_args(args)
    if options.pooling or options.attention:
        raise ValueError("--pooling and --attention do not apply to rerank")
    if args.input is not None:
        check_input(args.input)
    docs = read_texts(args.input) if args.input else list(args.documents)
    from embedserve.scorer import Scorer

    scorer = Scorer(
        options.model,
        device=options.device,
        dtype=options.dtype,
        attention_backend=options.attention_backend,
    )
    ranked = scorer.rerank(
        args.query,
        docs,
        top_n=args.top_n,
        truncate=args.truncate or False,
        instruction=args.instruction,
        raw=args.raw,
    )
    results = [
        {"index": r.index, "relevance_score": r.relevance_score, "document": r.document}
        for r in ranked
    ]
    json.dump({"model": str(options.model), "scoring": scorer.kind, "results": results}, sys.stdout)
    sys.stdout.write("\n")
    return 0


def encode_options(args: argparse.Namespace) -> dict[str, Any]:
    """The flags of `embed` as the keywords of `Embedder.encode` and `.encode_outputs`."""
    return {
        "prompt_name": args.prompt_name,
        "input_type": args.input_type,
        "dimensions": args.dimensions,
        "normalize": not args.no_normalize,
        "output_dtype": args.output_dtype,
        "truncate": args.truncate or False,
        "batch_tokens": args.batch_tokens,
    }


def embed_texts(embedder: Any, texts: list[str], args: argparse.Namespace) -> Any:
    return embedder.encode(texts, **encode_options(args), show_progress=args.output is not None)


def _add_models(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "models",
        help="the supported model families: architectures, tasks, attention, pooling",
        description="The model families embedserve runs with its own model code, as a Markdown "
        "table (the same as in docs/models.md). A folder or Hub id of one of these architectures "
        "loads with --model; `embedserve make-checkpoint --arch` writes one with random weights.",
    )
    p.set_defaults(run=_run_models)


def _run_models(args: argparse.Namespace) -> int:
    from embedserve.loading.families import models_table

    print(models_table())
    return 0
