"""The offline API: `Embedder(model).encode(texts)` in-process, no server.

Tokenizes on the CPU, packs inputs into token-budget batches, runs them through the engine and
applies the output head. Results come back in input order.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from embedserve.bundled import DEFAULT_MODEL, resolve_model
from embedserve.chunking import DEFAULT_SEPARATOR, MAX_CHUNKS_PER_DOCUMENT
from embedserve.engine.batch import PackedBatch
from embedserve.engine.engine import Engine
from embedserve.outputs import apply_output, check_dimensions, check_output_dtype, min_dimensions
from embedserve.spec import read_model_spec
from embedserve.tokenization import TRUNCATE_CHOICES, TextTokenizer, Truncate

# Tokens per engine batch when the caller does not say. NOTE: on the CPU, small batches win: at
# 16k tokens the [tokens, 1536] FFN activations fall out of cache and a 2-core run took 1.8x as
# long as at 2k (measured on all-MiniLM-L6-v2). On a GPU, bigger batches fill the device.
DEFAULT_BATCH_TOKENS = {"cpu": 2048, "cuda": 16384}

DEFAULT_CONTEXTUAL_BATCH_TOKENS = 16384
INPUT_TYPES = ("query", "document")
# Qwen3-Embedding's instruction format for queries; documents take no instruction
INSTRUCTION_TEMPLATE = "Instruct: {instruction}\nQuery:"


def _is_token_ids(x: Any) -> bool:
    return isinstance(x, (list, tuple, np.ndarray)) and all(
        isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in x
    )


def plan_batches(lengths: Sequence[int], batch_tokens: int) -> Iterator[list[int]]:
    """Indices of consecutive inputs whose tokens fit `batch_tokens`; a longer one goes alone."""
    batch: list[int] = []
    used = 0
    for i, n in enumerate(lengths):
        if batch and used + n > batch_tokens:
            yield batch
            batch, used = [], 0
        batch.append(i)
        used += n
    if batch:
        yield batch


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
        attention_kind: str | None = None,
    ) -> None:
        """`attention` names the attention backend; `attention_kind` ("causal" |
        "bidirectional") overrides the folder's attention, as `pooling` overrides its pooling."""
        folder = resolve_model(model)
        self.spec = read_model_spec(folder, pooling=pooling, attention=attention_kind)
        self._offsets_tokenizer: Any = None  # loaded on first use (late chunking, windows)
        self.tokenizer = TextTokenizer(folder / "tokenizer.json", self.spec.max_seq_length)
        self.engine = Engine(self.spec, device=device, dtype=dtype, attention_backend=attention)

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
        """Token ids for each input (checked, prompts applied, truncated only when asked)."""
        if truncate not in TRUNCATE_CHOICES:
            raise ValueError(f"truncate must be False, 'end' or 'start', got {truncate!r}")
        items: list[Any] = [inputs] if isinstance(inputs, str) else list(inputs)
        if not items:
            raise ValueError("no inputs: pass at least one text or token id list")
        if all(_is_token_ids(x) and len(x) > 0 for x in items):
            return [self._check_ids(i, x, truncate) for i, x in enumerate(items)]
        for i, x in enumerate(items):
            if not isinstance(x, str):
                raise TypeError(
                    f"input {i} is {type(x).__name__}; expected a string "
                    "(or every input a non-empty list of token ids)"
                )
            if x == "":
                raise ValueError(f"input {i} is an empty string")
        text_prompt = self.prompt(prompt_name, prompt, input_type, instruction)
        texts: list[str] = [text_prompt + x for x in items]
        return self.tokenizer.encode(texts, truncate=truncate)

    def prompt(
        self,
        prompt_name: str | None = None,
        prompt: str | None = None,
        input_type: str | None = None,
        instruction: str | None = None,
    ) -> str:
        """The text put before each input.

        `instruction` gives Qwen3-Embedding's query format, `Instruct: {instruction}\nQuery:`;
        `input_type` ("query" | "document") picks the folder's prompt of that name (none when
        the folder defines none); `prompt_name` any prompt of the folder; `prompt` a literal
        text. Without any of them, the folder's default prompt, if it names one.
        """
        given = [
            name
            for name, value in (
                ("prompt", prompt),
                ("prompt_name", prompt_name),
                ("input_type", input_type),
                ("instruction", instruction),
            )
            if value is not None
        ]
        if len(given) > 1 and set(given) != {"input_type", "instruction"}:
            raise ValueError(f"pass only one of {', '.join(given)}")
        if input_type is not None and input_type not in INPUT_TYPES:
            raise ValueError(f"input_type must be 'query' or 'document', got {input_type!r}")
        if instruction is not None:
            if input_type == "document":
                raise ValueError("an instruction applies to queries; documents take none")
            if not isinstance(instruction, str) or not instruction.strip():
                raise ValueError("instruction must be a non-empty string")
            return INSTRUCTION_TEMPLATE.format(instruction=instruction)
        if input_type is not None:
            return self.spec.prompts.get(input_type, "")
        if prompt is not None:
            return prompt
        name = prompt_name if prompt_name is not None else self.spec.default_prompt_name
        if name is None:
            return ""
        if name not in self.spec.prompts:
            known = ", ".join(sorted(self.spec.prompts)) or "none"
            raise ValueError(f"unknown prompt_name {name!r}; this model's prompts: {known}")
        return self.spec.prompts[name]

    def _check_ids(self, index: int, ids: Sequence[int], truncate: Truncate) -> list[int]:
        out = [int(t) for t in ids]
        vocab = self.tokenizer.vocab_size
        bad = next((t for t in out if not 0 <= t < vocab), None)
        if bad is not None:
            raise ValueError(
                f"input {index}: token id {bad} is outside the vocabulary [0, {vocab})"
            )
        limit = self.spec.max_seq_length
        if len(out) > limit:
            if truncate is False:
                raise ValueError(
                    f"input {index} has {len(out)} tokens, over this model's limit of {limit}; "
                    "pass truncate='end' or 'start'"
                )
            out = out[:limit] if truncate == "end" else out[-limit:]
        return out

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
        truncate: Truncate | Literal["chunk"] = False,
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
        dims = self._check_dimensions(dimensions)
        output_dtype = check_output_dtype(output_dtype or self.spec.default_output_dtype, dims)
        if batch_tokens is None:
            batch_tokens = DEFAULT_BATCH_TOKENS.get(self.engine.device.type, 2048)
        if batch_tokens <= 0:
            raise ValueError(f"batch_tokens must be positive, got {batch_tokens}")
        prompts = {"prompt_name": prompt_name, "prompt": prompt}
        prompts |= {"input_type": input_type, "instruction": instruction}
        if truncate == "chunk":
            from embedserve.contextual import windows_pooled

            items = [inputs] if isinstance(inputs, str) else list(inputs)
            if not items:
                raise ValueError("no inputs: pass at least one text or token id list")
            pooled = windows_pooled(self, items, self.prompt(**prompts), batch_tokens)
        else:
            ids = self.tokenize(inputs, truncate=truncate, **prompts)
            pooled = self.embed_ids(ids, batch_tokens=batch_tokens, show_progress=show_progress)
        out = self.apply_output(pooled, dims, normalize, output_dtype)
        return out[0] if isinstance(inputs, str) else out

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
        from embedserve.contextual import contextual_pooled

        dims = self._check_dimensions(dimensions)
        output_dtype = check_output_dtype(output_dtype or self.spec.default_output_dtype, dims)
        pooled = contextual_pooled(
            self,
            documents,
            separator=separator,
            max_chunks=max_chunks,
            batch_tokens=batch_tokens or DEFAULT_CONTEXTUAL_BATCH_TOKENS,
        )
        return [self.apply_output(p, dims, normalize, output_dtype) for p in pooled]

    def apply_output(
        self, pooled: np.ndarray, dims: int, normalize: bool, output_dtype: str
    ) -> np.ndarray:
        """The head and encoding under this model's output rules (see `outputs`)."""
        return apply_output(pooled, dims, normalize, output_dtype, self.spec.output_rules)

    def _check_dimensions(self, dimensions: int | None) -> int:
        minimum = min_dimensions(self.spec.output_rules, self.spec.hidden_size)
        return check_dimensions(dimensions, self.spec.hidden_size, minimum)

    def tokenizer_with_offsets(self) -> Any:
        """The model's `tokenizers.Tokenizer` (offsets, special-token masks; no truncation)."""
        if self._offsets_tokenizer is None:
            from embedserve.contextual import offsets_tokenizer

            self._offsets_tokenizer = offsets_tokenizer(self)
        return self._offsets_tokenizer

    def embed_ids(
        self, ids: Sequence[Sequence[int]], *, batch_tokens: int, show_progress: bool = False
    ) -> np.ndarray:
        """Pooled float32 vectors [num_inputs, hidden], before the output head."""
        lengths = [len(x) for x in ids]
        out = np.empty((len(ids), self.spec.hidden_size), dtype=np.float32)
        progress = None
        if show_progress:
            from tqdm.auto import tqdm

            progress = tqdm(total=sum(lengths), unit="tok", unit_scale=True, desc="embedding")
        # Launch batch N+1 before reading batch N, so on a GPU the host work overlaps the device.
        pending: tuple[list[int], Any] | None = None
        for indices in plan_batches(lengths, batch_tokens):
            handle = self.engine.step(PackedBatch.from_token_lists([ids[i] for i in indices]))
            if pending is not None:
                self._collect(out, *pending, progress, lengths)
            pending = (indices, handle)
        if pending is not None:
            self._collect(out, *pending, progress, lengths)
        if progress is not None:
            progress.close()
        return out

    @staticmethod
    def _collect(
        out: np.ndarray, indices: list[int], handle: Any, progress: Any, lengths: list[int]
    ) -> None:
        out[indices] = handle.wait()
        if progress is not None:
            progress.update(sum(lengths[i] for i in indices))
