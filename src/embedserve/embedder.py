"""The offline API: `Embedder(model).encode(texts)` in-process, no server.

Tokenizes on the CPU, packs inputs into token-budget batches, runs them through the engine and
applies the output head. Results come back in input order.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from embedserve.budget import budget_groups, split_rows
from embedserve.bundled import DEFAULT_MODEL, resolve_model
from embedserve.chunking import DEFAULT_SEPARATOR, MAX_CHUNKS_PER_DOCUMENT, packed_spans
from embedserve.engine.batch import PackedBatch
from embedserve.engine.engine import Engine
from embedserve.inputs import InputPreparer, Truncate
from embedserve.spec import read_model_spec
from embedserve.tokenization import TextTokenizer

# Texts tokenized per slice while the engine runs the previous slice (see `encode`): large enough
# for the tokenizer's own parallelism and a few engine batches, small enough to start soon.
PREPARE_SLICE_INPUTS = 256


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
    ) -> None:
        """`attention` ("causal" | "bidirectional") overrides the folder's attention, as
        `pooling` overrides its pooling; `attention_backend` names the attention kernels."""
        folder = resolve_model(model)
        self.spec = read_model_spec(folder, pooling=pooling, attention=attention)
        self.tokenizer = TextTokenizer(folder / "tokenizer.json", self.spec.max_seq_length)
        self.inputs = InputPreparer(self.spec, self.tokenizer)
        self.engine = Engine(
            self.spec, device=device, dtype=dtype, attention_backend=attention_backend
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
        head = self.inputs.head(dimensions, normalize, output_dtype)
        options = self.inputs.options(
            prompt_name=prompt_name,
            prompt=prompt,
            input_type=input_type,
            instruction=instruction,
            truncate=truncate,
        )
        batch_tokens = self._batch_tokens(batch_tokens)
        slices = self.inputs.prepare_slices(inputs, options, slice_inputs=PREPARE_SLICE_INPUTS)
        progress = None
        if show_progress:
            from tqdm.auto import tqdm

            total = 1 if isinstance(inputs, str) else len(inputs)
            progress = tqdm(total=total, unit="input", unit_scale=True, desc="embedding")
        outs, single = [], False
        # Tokenize slice k+1 on a thread while the engine runs slice k: the tokenizer and the
        # device wait both release the GIL. NOTE: one slice at a time, in order.
        with ThreadPoolExecutor(1, thread_name_prefix="tokenize") as tokenizing:
            upcoming = tokenizing.submit(next, slices, None)
            while (prepared := upcoming.result()) is not None:
                upcoming = tokenizing.submit(next, slices, None)
                single = prepared.single
                pooled = self.embed_ids(prepared.seqs, batch_tokens=batch_tokens)
                outs.append(head.apply(prepared.combine(pooled)))
                if progress is not None:
                    progress.update(len(outs[-1]))
        if progress is not None:
            progress.close()
        out = outs[0] if len(outs) == 1 else np.concatenate(outs)
        return out[0] if single else out

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
        out: list[np.ndarray] = []
        # whole documents back to back in token-budget batches, one row per chunk span
        for group in budget_groups([len(p.ids) for p in plans], budget):
            batch_plans = [plans[d] for d in group]
            batch = PackedBatch.from_token_lists([p.ids for p in batch_plans])
            spans = np.asarray(packed_spans(batch_plans), dtype=np.int64)
            rows = self.engine.embed_spans(batch, spans)
            out += split_rows(head.apply(rows), [len(p.spans) for p in batch_plans])
        return out

    def _batch_tokens(self, batch_tokens: int | None) -> int:
        if batch_tokens is None:  # what reaches the CUDA graphs (see `Engine.batch_tokens`)
            return self.engine.batch_tokens
        if isinstance(batch_tokens, bool) or not isinstance(batch_tokens, int) or batch_tokens <= 0:
            raise ValueError(f"batch_tokens must be a positive integer, got {batch_tokens!r}")
        return batch_tokens

    def embed_ids(self, ids: Sequence[Sequence[int]], *, batch_tokens: int) -> np.ndarray:
        """Pooled float32 vectors [num_inputs, hidden], before the output head."""
        lengths = [len(x) for x in ids]
        out = np.empty((len(ids), self.spec.hidden_size), dtype=np.float32)
        # Launch batch N+1 before reading batch N, so on a GPU the host work overlaps the device.
        pending: tuple[range, Any] | None = None
        for group in budget_groups(lengths, batch_tokens):
            handle = self.engine.step(PackedBatch.from_token_lists([ids[i] for i in group]))
            if pending is not None:
                out[pending[0].start : pending[0].stop] = pending[1].wait()
            pending = (group, handle)
        if pending is not None:
            out[pending[0].start : pending[0].stop] = pending[1].wait()
        return out
