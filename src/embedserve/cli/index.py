"""`embedserve index`: the command line of the corpus job of `embedserve.indexing.job`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register index."""
    from embedserve.indexing.job import IndexOptions as D  # the defaults, declared there once

    p = sub.add_parser(
        "index",
        help="embed a corpus of jsonl / Parquet / text files into Parquet with Ray Data "
        "(resumable)",
        description="Each input file's records (an id and a text field) are embedded on a pool "
        "of Ray actors and written to OUTPUT/<name>.parquet (id, vector, model, dims, "
        "output_dtype; with --outputs, sparse_indices / sparse_values and multivector); records that cannot be embedded go to <name>.errors.jsonl with the "
        "reason. A second run skips the inputs already done, and refuses an OUTPUT made with "
        "other options (see --overwrite). Needs: pip install "
        "'embedserve[ray]'.",
    )
    _add_input_flags(p, D)
    _add_output_flags(p, D)
    _add_job_flags(p, D)
    p.set_defaults(run=_run_index)


def _add_input_flags(p: argparse.ArgumentParser, D: Any) -> None:
    """Where the records are, which fields they embed, and how a text becomes its input."""
    p.add_argument(
        "--input",
        required=True,
        help="a .jsonl / .json / .parquet / .txt / .md file, a folder of them, or a glob (a "
        ".txt or .md file is one document, its id the file's name; see --lines)",
    )
    p.add_argument(
        "--lines",
        action="store_true",
        help="a .txt / .md input holds one record per line (an empty line is a bad record)",
    )
    p.add_argument(
        "--output", required=True, type=Path, help="the folder to write Parquet files to"
    )
    p.add_argument(
        "--model",
        default=D.model,
        help=f"model folder, bundled name or Hub id (default: {D.model})",
    )
    p.add_argument(
        "--id-field", default=D.id_field, help=f"the records' id field (default: {D.id_field})"
    )
    p.add_argument(
        "--text-field",
        default=D.text_field,
        help=f"the records' text field (default: {D.text_field})",
    )
    p.add_argument("--prompt-name", default=None, help="a prompt of the model folder")
    p.add_argument(
        "--input-type", default=None, choices=["query", "document"], help="query or document prompt"
    )
    p.add_argument(
        "--truncate",
        default=None,
        choices=["end", "start"],
        help="cut over-long texts (default: they are errors, recorded with their id)",
    )


def _add_job_flags(p: argparse.ArgumentParser, D: Any) -> None:
    """How the job runs: its engine, its actors and its Ray, what it does with bad records and
    with an OUTPUT made otherwise."""
    p.add_argument(
        "--device", default=D.device, help="auto (a GPU per actor when there are GPUs), cpu, cuda"
    )
    p.add_argument(
        "--dtype",
        default=D.dtype,
        choices=["float32", "bfloat16", "float16"],
        help="the engine's dtype (default: float32 on the CPU, bfloat16 on a GPU)",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=D.batch_size,
        help=f"records per actor call (default: {D.batch_size})",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        help="actors (default: one per GPU, else one on the CPU using every core)",
    )
    p.add_argument(
        "--ray-address",
        default=None,
        help="a running Ray cluster (default: a local Ray for the job)",
    )
    p.add_argument("--fail-fast", action="store_true", help="stop at the first bad record")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="when OUTPUT holds vectors made with other options (model, dtype, prompt, "
        "truncation, output dtype), replace them (default: refuse, naming the difference)",
    )
    p.add_argument(
        "--verbose", action="store_true", help="show Ray's own logs and Ray Data's progress bars"
    )


def _add_output_flags(p: argparse.ArgumentParser, D: Any) -> None:
    """What each record's row holds: the dense dtype and which outputs."""
    from embedserve.retrieval.results import DEFAULT_OUTPUTS_RULE

    p.add_argument(
        "--output-dtype",
        default=D.output_dtype,
        choices=["float32", "int8", "uint8", "binary", "ubinary"],
    )
    p.add_argument(
        "--outputs",
        default=None,
        help="a comma-separated list of dense, sparse, multivector (what the model has): "
        f"columns vector, sparse_indices + sparse_values, multivector. Default: {DEFAULT_OUTPUTS_RULE}",
    )


def _run_index(args: argparse.Namespace) -> int:
    from embedserve.indexing.job import IndexOptions, run_index
    from embedserve.retrieval.results import split_outputs

    if args.batch_size <= 0 or (args.workers is not None and args.workers <= 0):
        raise ValueError("--batch-size and --workers must be positive")
    options = IndexOptions(
        model=args.model,
        id_field=args.id_field,
        text_field=args.text_field,
        prompt_name=args.prompt_name,
        input_type=args.input_type,
        truncate=args.truncate or False,
        output_dtype=args.output_dtype,
        outputs=split_outputs(args.outputs),
        device=args.device,
        dtype=args.dtype,
        batch_size=args.batch_size,
        workers=args.workers,
        fail_fast=args.fail_fast,
        lines=args.lines,
    )
    summary = run_index(
        args.input,
        args.output,
        options,
        ray_address=args.ray_address,
        overwrite=args.overwrite,
        verbose=args.verbose,
    )
    print(json.dumps(summary))
    return 0
