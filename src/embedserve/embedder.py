"""The offline API: `Embedder(model).encode(texts)` in-process, no server.

Tokenizes on the CPU, packs inputs into token-budget batches, runs them through the engine and
applies the output head. Results come back in input order.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

import embedserve.cpu_threads  # noqa: F401  (how torch's CPU threads wait: before torch loads)
from embedserve.core.budget import by_length_groups, in_input_order, split_in_input_order
from embedserve.core.chunking import DEFAULT_SEPARATOR, MAX_CHUNKS_PER_DOCUMENT, packed_spans
from embedserve.core.duplicates import unique_sequences
from embedserve.core.head import Head
from embedserve.core.inputs import InputOptions, InputPreparer, PreparedInputs, Truncate
from embedserve.core.tokenization import TextTokenizer
from embedserve.engine.batch import PackedBatch
from embedserve.engine.engine import Engine
from embedserve.errors import InputError
from embedserve.loading.bundled import DEFAULT_MODEL, resolve_model
from embedserve.loading.spec import ModelLoadError, read_model_spec
from embedserve.retrieval.inputs import ColbertInputs, prepare_outputs
from embedserve.retrieval.results import (
    MAX_MULTIVECTOR_VALUES,
    EncodedOutputs,
    SparseVector,
    check_multivector_size,
    check_outputs,
)

# Texts per piece when tokenizing overlaps the engine (a list of more texts than this, on CUDA).
# NOTE: measured on the H200 host (benchmarks/host_path_gpu.py): 1,000 passages took 17.6 ms to
# tokenize and 10.7 ms in the engine, one after the other; tokenizing runs in Rust threads with
# the GIL released, so piece k+1 is tokenized while the engine works on piece k.
OVERLAP_PIECE_TEXTS = 256


class Embedder:
    """Embed texts (or token ids) with a local model folder or a bundled model name.

    >>> Embedder("minilm").encode(["a query", "a document"]).shape
    (2, 384)
    """

    def __init__(
        self,
        model: str | Path = DEFAULT_MODEL,
        *,
        device: str | None = "auto",
        dtype: str | None = None,
        pooling: str | None = None,
        attention: str | None = None,
        attention_backend: str | None = None,
        cpu_path: str | None = None,
    ) -> None:
        """`attention` ("causal" | "bidirectional") overrides the folder's attention, as
        `pooling` overrides its pooling; `attention_backend` names the attention kernels;
        `cpu_path` a float32 CPU's executor (`engine.cpu_paths`; default: measured when the
        dtype is float32 by default; "auto" measures it for `dtype="float32"` too)."""
        folder = resolve_model(model)
        self.spec = read_model_spec(folder, pooling=pooling, attention=attention)
        if self.spec.task != "embed":
            raise ModelLoadError(
                f"{folder}: a scoring model ({self.spec.architecture}), not an embedding model; "
                "score with embedserve.scorer.Scorer (or add embedserve.json with "
                '{"task": "embed"} to embed with it)'
            )
        self.tokenizer = TextTokenizer(folder / "tokenizer.json", self.spec.max_seq_length)
        self.inputs = InputPreparer(self.spec, self.tokenizer)
        self.engine = Engine(
            self.spec,
            device=device,
            dtype=dtype,
            attention_backend=attention_backend,
            cpu_path=cpu_path,
        )
        # tokenize long lists piece by piece on a thread while the engine runs the piece before;
        # not on the CPU, where the tokenizer's threads would take the model's cores
        self.overlap_tokenizing = self.engine.device.type == "cuda"
        retrieval = self.spec.retrieval
        self.colbert = (
            ColbertInputs(retrieval.colbert, folder / "tokenizer.json")
            if retrieval is not None and retrieval.colbert is not None
            else None
        )

    @property
    def dimensions(self) -> int:
        return self.spec.hidden_size

    def tokenize(
        self,
        inputs: str | Sequence[str] | Sequence[Sequence[int]],
        *,
        prompt_name: str | None = None,
        prompt: str | None = None,
        input_type: str | None = None,
        instruction: str | None = None,
        truncate: Truncate = False,
    ) -> list[list[int]]:
        """The token id sequences the engine would run for `inputs` (prompts applied, checked,
        truncated only when asked; with truncate="chunk", every window of every input)."""
        options = self.inputs.options(
            prompt_name=prompt_name,
            prompt=prompt,
            input_type=input_type,
            instruction=instruction,
            truncate=truncate,
        )
        return self.inputs.prepare(inputs, options).seqs

    def prompt(
        self,
        prompt_name: str | None = None,
        prompt: str | None = None,
        input_type: str | None = None,
        instruction: str | None = None,
    ) -> str:
        """The text put before each input (see `inputs.InputPreparer.prompt`)."""
        return self.inputs.prompt(prompt_name, prompt, input_type, instruction)

    def encode(
        self,
        inputs: str | Sequence[str] | Sequence[Sequence[int]],
        *,
        prompt_name: str | None = None,
        prompt: str | None = None,
        input_type: str | None = None,
        instruction: str | None = None,
        dimensions: int | None = None,
        normalize: bool = True,
        output_dtype: str | None = None,
        truncate: Truncate = False,
        batch_tokens: int | None = None,
        show_progress: bool = False,
    ) -> np.ndarray:
        """Embeddings [num_inputs, dimensions] (1-D for a single string), in input order.

        Prompts: see `prompt`. `output_dtype` defaults to the folder's native output (float32
        unless it declares one); int8 and binary follow the folder's output rules (`outputs`).
        `truncate="chunk"`: an input over the model's limit is embedded as consecutive windows
        (each with the input's special and prompt tokens) whose pooled vectors are averaged,
        weighted by content tokens, before the head; "end" / "start" cut it; False refuses it.
        """
        if "dense" not in self.spec.outputs:
            raise InputError(
                f"this model ({self.spec.family}) has no dense output; its outputs are "
                f"{', '.join(self.spec.outputs)}: use encode_outputs",
                param="outputs",
            )
        head = self.inputs.head(dimensions, normalize, output_dtype)
        options = self.inputs.options(
            prompt_name=prompt_name,
            prompt=prompt,
            input_type=input_type,
            instruction=instruction,
            truncate=truncate,
        )
        return self.encode_checked(
            inputs, options, head, batch_tokens=batch_tokens, show_progress=show_progress
        )

    def encode_outputs(
        self,
        inputs: str | Sequence[str] | Sequence[Sequence[int]],
        *,
        outputs: str | Sequence[str] | None = None,
        input_type: str | None = None,
        prompt_name: str | None = None,
        prompt: str | None = None,
        dimensions: int | None = None,
        normalize: bool = True,
        output_dtype: str | None = None,
        truncate: Truncate = False,
        batch_tokens: int | None = None,
        max_multivector_values: int = MAX_MULTIVECTOR_VALUES,
    ) -> EncodedOutputs:
        """Dense, sparse and/or multi-vector outputs (`outputs`, default: all the model has,
        `spec.outputs`) of every input from one forward per batch, in input order (a single
        string is a list of one); see `retrieval.results`. `dimensions`, `normalize` and
        `output_dtype` apply to the dense vectors. ColBERT: `input_type="query"` encodes
        queries (marker, expansion to the query length), otherwise documents. An answer over
        `max_multivector_values` floats is an InputError before the model runs."""
        asked = check_outputs(outputs, self.spec.outputs)
        head = self.inputs.head(dimensions, normalize, output_dtype)
        prepared = prepare_outputs(
            self.inputs, self.colbert, inputs, input_type=input_type,
            prompt_name=prompt_name, prompt=prompt, truncate=truncate,
        )  # fmt: skip
        if "multivector" in asked:
            check_multivector_size(prepared.vectors, self.multivector_dims, max_multivector_values)
        budget = self._batch_tokens(batch_tokens)
        return _outputs_by_batch(
            self.engine, prepared.seqs, asked, head, budget,
            query=prepared.query, visible=prepared.visible,
        )  # fmt: skip

    @property
    def multivector_dims(self) -> int:
        """The width of each multi-vector row (0 for a model without them)."""
        heads = self.engine.retrieval
        return heads.multivector_dims if heads is not None else 0

    def encode_checked(
        self,
        inputs: str | Sequence[str] | Sequence[Sequence[int]],
        options: InputOptions,
        head: Head,
        *,
        batch_tokens: int | None = None,
        show_progress: bool = False,
    ) -> np.ndarray:
        """`encode` with options and a head the request core checked already
        (`InputPreparer.options` and `.head`): what a plan of the core (`pairs.plan_cosine`)
        hands over."""
        batch_tokens = self._batch_tokens(batch_tokens)
        pieces = self._overlap_pieces(inputs)
        if pieces is not None:
            pooled = self._encode_overlapped(inputs, pieces, options, batch_tokens, show_progress)
            return head.apply(pooled)
        prepared = self.inputs.prepare(inputs, options)
        pooled = self.embed_ids(
            prepared.seqs, batch_tokens=batch_tokens, show_progress=show_progress
        )
        out = head.apply(prepared.combine(pooled))
        return out[0] if prepared.single else out

    def _overlap_pieces(self, inputs: Any) -> list[Sequence[str]] | None:
        """Pieces of a long list of texts whose tokenizing can overlap the engine, or None."""
        n = OVERLAP_PIECE_TEXTS
        if (
            not self.overlap_tokenizing
            or not isinstance(inputs, (list, tuple))
            or len(inputs) <= n
            or not all(isinstance(x, str) for x in inputs)
        ):
            return None
        return [inputs[i : i + n] for i in range(0, len(inputs), n)]

    def _encode_overlapped(
        self,
        inputs: Any,  # the whole input, for its errors
        pieces: list[Sequence[str]],
        options: InputOptions,
        batch_tokens: int,
        show_progress: bool,
    ) -> np.ndarray:
        """Pooled rows of every input (windows combined), tokenizing piece k+1 on a thread
        while the engine runs piece k."""
        rows: list[np.ndarray] = []
        # the bar's total grows as pieces are tokenized
        progress = _progress_bar(None) if show_progress else None
        with ThreadPoolExecutor(1, thread_name_prefix="tokenize") as pool:
            ahead: Future[PreparedInputs] = pool.submit(self.inputs.prepare, pieces[0], options)
            for k in range(len(pieces)):
                try:
                    prepared = ahead.result()
                except InputError:
                    # raised again by one pass over the whole input: its index is the caller's
                    self.inputs.prepare(inputs, options)
                    raise
                if k + 1 < len(pieces):
                    ahead = pool.submit(self.inputs.prepare, pieces[k + 1], options)
                if progress is not None:
                    progress.total = (progress.total or 0) + sum(map(len, prepared.seqs))
                    progress.refresh()
                rows.append(prepared.combine(self._embed(prepared.seqs, batch_tokens, progress)))
        if progress is not None:
            progress.close()
        return np.concatenate(rows)

    def encode_contextual(
        self,
        documents: Sequence[Sequence[str]],
        *,
        separator: str = DEFAULT_SEPARATOR,
        dimensions: int | None = None,
        normalize: bool = True,
        output_dtype: str | None = None,
        max_chunks: int = MAX_CHUNKS_PER_DOCUMENT,
        batch_tokens: int | None = None,
    ) -> list[np.ndarray]:
        """Late chunking: per document (an ordered list of chunk strings), [num_chunks, dims].

        The chunks are joined with `separator` and the document is embedded once as a whole;
        each chunk's vector is the mean of the final hidden states over its tokens, found from
        the tokenizer's character offsets (see `chunking`), then the usual head. A document over
        the model's limit is an error (InputTooLong); so are empty documents and chunks.
        """
        head = self.inputs.head(dimensions, normalize, output_dtype)
        plans = self.inputs.plan_documents(
            self.inputs.read_documents(documents, max_chunks), separator
        )
        budget = self._batch_tokens(batch_tokens)
        rows: list[np.ndarray] = []
        # whole documents in token-budget batches cut as `run_batches` cuts them, one row per
        # chunk span
        groups = by_length_groups([len(p.ids) for p in plans], budget)
        for group in groups:
            batch_plans = [plans[d] for d in group]
            batch = PackedBatch.from_token_lists([p.ids for p in batch_plans])
            rows.append(self.engine.embed_spans(batch, packed_spans(batch_plans)))
        chunks = [len(p.spans) for p in plans]
        return split_in_input_order(head.apply(np.concatenate(rows)), chunks, groups)

    def _batch_tokens(self, batch_tokens: int | None) -> int:
        if batch_tokens is None:  # what reaches the CUDA graphs (see `Engine.batch_tokens`)
            return self.engine.batch_tokens
        if isinstance(batch_tokens, bool) or not isinstance(batch_tokens, int) or batch_tokens <= 0:
            raise ValueError(f"batch_tokens must be a positive integer, got {batch_tokens!r}")
        return batch_tokens

    def embed_ids(
        self, ids: Sequence[Sequence[int]], *, batch_tokens: int, show_progress: bool = False
    ) -> np.ndarray:
        """Pooled float32 vectors [num_inputs, hidden], before the output head."""
        progress = _progress_bar(sum(map(len, ids))) if show_progress else None
        try:
            return self._embed(ids, batch_tokens, progress)
        finally:
            if progress is not None:
                progress.close()

    def _embed(self, ids: Sequence[Sequence[int]], batch_tokens: int, progress: Any) -> np.ndarray:
        unique, back = unique_sequences(ids)  # each distinct sequence once (`core.duplicates`)
        if back is None:
            return run_batches(self.engine, ids, batch_tokens, progress)
        if progress is not None:  # the copies' tokens are done as their originals are
            progress.update(sum(map(len, ids)) - sum(map(len, unique)))
        return run_batches(self.engine, unique, batch_tokens, progress)[back]


def run_batches(
    engine: Engine,
    seqs: Sequence[Sequence[int]],
    batch_tokens: int,
    progress: Any = None,
    second_segment: Sequence[int] | None = None,
) -> np.ndarray:
    """The engine's rows [len(seqs), width] for sequences in token-budget batches, the rows in
    the sequences' order. `second_segment`: per sequence, where token type 1 begins (pairs; 0:
    none).

    NOTE: the batches are cut from the sequences sorted by length (`by_length_groups`), so
    an executor that pads pads little."""
    out = np.empty((len(seqs), engine.output_width), dtype=np.float32)
    # Launch batch N+1 before reading batch N, so on a GPU the host work overlaps the device.
    pending: tuple[np.ndarray, Any, int] | None = None
    for members in by_length_groups([len(x) for x in seqs], batch_tokens):
        batch = PackedBatch.from_token_lists(
            [seqs[i] for i in members],
            None if second_segment is None else [second_segment[i] for i in members],
        )
        handle = engine.step(batch)
        if pending is not None:
            _collect(out, *pending, progress)
        pending = (members, handle, batch.num_tokens)
    if pending is not None:
        _collect(out, *pending, progress)
    return out


def _collect(
    out: np.ndarray, members: np.ndarray, handle: Any, num_tokens: int, progress: Any
) -> None:
    out[members] = handle.wait()
    if progress is not None:
        progress.update(num_tokens)


def _progress_bar(total: int | None) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="tok", unit_scale=True, desc="embedding")


def _outputs_by_batch(
    engine: Engine,
    seqs: Sequence[Sequence[int]],
    outputs: tuple[str, ...],
    head: Head,
    batch_tokens: int,
    *,
    query: bool = False,
    visible: Sequence[int] | None = None,
) -> EncodedOutputs:
    """`outputs` of every sequence through `Engine.encode_outputs`, token-budget batches of
    one forward each for every output asked for, cut from the sequences sorted by length as
    `run_batches` cuts them, the outputs in input order; `visible`: per sequence, its attended
    leading tokens."""
    groups = by_length_groups([len(s) for s in seqs], batch_tokens)
    dense: list[np.ndarray] = []
    sparse: dict[int, SparseVector] = {}  # by input index
    vectors: dict[int, np.ndarray] = {}
    for members in groups:
        batch = PackedBatch.from_token_lists([seqs[i] for i in members])
        keys = None if visible is None else tuple(visible[i] for i in members)
        out = engine.encode_outputs(batch, outputs, query=query, visible_keys=keys)
        if out.dense is not None:
            dense.append(out.dense)
        for row, i in enumerate(members):
            if out.sparse is not None:
                idx, val = out.sparse.row(row)
                sparse[i] = {"indices": idx.tolist(), "values": val.tolist()}
            if out.multivector is not None:
                vectors[i] = out.multivector.row(row)
    return EncodedOutputs(
        dense=head.apply(in_input_order(np.concatenate(dense), groups))
        if "dense" in outputs
        else None,
        sparse=[sparse[i] for i in range(len(seqs))] if "sparse" in outputs else None,
        multivector=[vectors[i] for i in range(len(seqs))] if "multivector" in outputs else None,
        tokens=[len(s) for s in seqs],
    )
