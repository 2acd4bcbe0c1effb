"""The request core: what a caller asks for, checked into token-id sequences and an output head.

Every front end (`Embedder`, the HTTP gateway, the CLI) hands the caller's values, as they came,
to one `InputPreparer` and gets back `PreparedInputs` (the sequences the engine runs) and a `Head`
(what to do with the pooled vectors), or an `InputError` whose message does not depend on the
front end. No torch: the gateway runs this.

- inputs: a string, a list of strings, a list of token ids, or a list of token id lists;
- prompts: `prompt`, `prompt_name`, `input_type` (`query` / `document`), `instruction`. On a
  model without prompts (all-MiniLM-L6-v2): `prompt_name` and `instruction` are a 400 naming
  the option, `input_type` adds nothing (Cohere's clients always send one; docs/serving.md);
- `truncate`: False (an over-long input is an error), "end", "start", or "chunk" (embed
  consecutive windows and average them, weighted by content tokens; see `chunking`);
- the head: `dimensions`, `normalize`, `output_dtype` under the model's output rules;
- late chunking: documents as lists of chunk strings (`plan_documents`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from embedserve.core.chunking import (
    DEFAULT_SEPARATOR,
    MAX_CHUNKS_PER_DOCUMENT,
    DocumentPlan,
    join_chunks,
    plan_document,
    split_windows,
)
from embedserve.core.head import Head, check_head
from embedserve.core.tokenization import TextTokenizer, no_token_of_its_own
from embedserve.errors import TRUNCATE_ADVICE, InputError, InputTooLong, InputTypeError, shown
from embedserve.loading.spec import ModelSpec

Truncate = Literal[False, "end", "start", "chunk"]
INPUT_TYPES = ("query", "document")
# Qwen3-Embedding's instruction format for queries; documents take no instruction
INSTRUCTION_TEMPLATE = "Instruct: {instruction}\nQuery:"


@dataclass(frozen=True)
class InputOptions:
    """How inputs become sequences: the text put before each one, and the truncation rule."""

    prompt: str = ""
    truncate: Truncate = False


@dataclass(frozen=True)
class PreparedInputs:
    """Checked sequences for the engine, and how their pooled rows become one row per input."""

    seqs: list[list[int]]
    single: bool  # the caller passed one string (or one flat list of ids): answer one vector
    # truncate="chunk" only: sequences (windows) per input, and each window's weight
    windows_per_input: list[int] | None = None
    window_weights: list[int] | None = None

    def model_side_head(self, head: Head) -> Head | None:
        """The head whoever runs the model applies: the request's own, or None (the raw pooled
        rows) when windows must be averaged before it; `finish` does the rest."""
        return head if self.windows_per_input is None else None

    def finish(self, rows: np.ndarray, head: Head) -> np.ndarray:
        """The answer [num_inputs, width] from the rows returned under `model_side_head(head)`."""
        return rows if self.windows_per_input is None else head.apply(self.combine(rows))

    def combine(self, pooled: np.ndarray) -> np.ndarray:
        """[num_seqs, hidden] pooled rows -> [num_inputs, hidden]: windows averaged."""
        if self.windows_per_input is None:
            return pooled
        weights = np.asarray(self.window_weights, dtype=np.float64)[:, None]
        firsts = np.cumsum([0, *self.windows_per_input[:-1]])  # each input's first window
        sums = np.add.reduceat(pooled * weights, firsts, axis=0)
        return (sums / np.add.reduceat(weights, firsts, axis=0)).astype(np.float32)


def _is_sequence(x: Any) -> bool:
    return isinstance(x, (list, tuple, np.ndarray))


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _check_prompt_choice(values: dict[str, Any]) -> None:
    """The ways a request may choose its prompt (`InputPreparer.prompt`'s arguments, in order):
    each given one a string, one at most (an instruction goes with an input_type), and an
    input_type one of INPUT_TYPES."""
    given = {name: value for name, value in values.items() if value is not None}
    for name, value in given.items():
        if not isinstance(value, str):
            raise InputTypeError(f"{name} must be a string, got {type(value).__name__}", param=name)
    if len(given) > 1 and set(given) != {"input_type", "instruction"}:
        raise InputError(
            f"pass only one of {', '.join(given)}", param=list(given)[1], code="conflict"
        )
    input_type = given.get("input_type")
    if input_type is not None and input_type not in INPUT_TYPES:
        raise InputError(
            f'input_type must be "query" or "document"; got {shown(input_type)}',
            param="input_type",
        )


class InputPreparer:
    """One model's request core: prompts, tokenization, checks, truncation, windows, heads."""

    def __init__(self, spec: ModelSpec, tokenizer: TextTokenizer) -> None:
        self.spec = spec
        self.tokenizer = tokenizer
        self.vocab_size = tokenizer.vocab_size
        self.max_length = spec.max_seq_length

    # -- the output head ------------------------------------------------------------------

    def head(self, dimensions: Any = None, normalize: Any = True, output_dtype: Any = None) -> Head:
        """A checked head for this model; `None` for a value means the model's default."""
        spec = self.spec
        return check_head(
            spec.hidden_size,
            spec.output_rules,
            dimensions,
            normalize,
            spec.default_output_dtype if output_dtype is None else output_dtype,
        )

    # -- prompts and truncation -------------------------------------------------------------

    @property
    def takes_instruction(self) -> bool:
        """Whether `instruction` applies: the folder's query prompt is in the instruction
        format (Qwen3-Embedding's `Instruct: …\nQuery:`)."""
        head, _, tail = INSTRUCTION_TEMPLATE.partition("{instruction}")
        query = self.spec.prompts.get("query", "")
        return query.startswith(head) and query.rstrip().endswith(tail.rstrip())

    def options(
        self,
        *,
        prompt_name: Any = None,
        prompt: Any = None,
        input_type: Any = None,
        instruction: Any = None,
        truncate: Any = False,
    ) -> InputOptions:
        """Checked options; the prompt resolved to its text (see `prompt`)."""
        if truncate is None:
            truncate = False
        if truncate is not False and truncate not in ("end", "start", "chunk"):
            raise InputError(
                f'truncate must be false, "end", "start" or "chunk"; got {shown(truncate)}',
                param="truncate",
            )
        return InputOptions(self.prompt(prompt_name, prompt, input_type, instruction), truncate)

    def prompt(
        self,
        prompt_name: Any = None,
        prompt: Any = None,
        input_type: Any = None,
        instruction: Any = None,
    ) -> str:
        """The text put before each input. `instruction` gives Qwen3-Embedding's query format, `Instruct: {instruction}\\nQuery:`;
        `input_type` ("query" | "document") picks the folder's prompt of that name (none when
        the folder defines none); `prompt_name` any prompt of the folder; `prompt` a literal
        text. Without any of them, the folder's default prompt, if it names one.
        """
        _check_prompt_choice(
            {"prompt": prompt, "prompt_name": prompt_name, "input_type": input_type,
             "instruction": instruction}
        )  # fmt: skip
        if instruction is not None:
            return self._instruction_prompt(instruction, input_type)
        if input_type is not None:
            return self.spec.prompts.get(input_type, "")
        if prompt is not None:
            return str(prompt)
        return self._named_prompt(prompt_name)

    def _instruction_prompt(self, instruction: str, input_type: str | None) -> str:
        """Qwen3-Embedding's query format around `instruction`, where the folder's query prompt
        has that form."""
        if not self.takes_instruction:
            raise InputError(
                "this model has no instruction template (its folder's query prompt is not "
                f"{INSTRUCTION_TEMPLATE.format(instruction='…')!r}): drop instruction, or "
                "pass a literal prompt",
                param="instruction",
            )
        if input_type == "document":
            raise InputError(
                "an instruction applies to queries; documents take none",
                param="instruction",
                code="conflict",
            )
        if not instruction.strip():
            raise InputError("instruction must be a non-empty string", param="instruction")
        return INSTRUCTION_TEMPLATE.format(instruction=instruction)

    def _named_prompt(self, prompt_name: str | None) -> str:
        """The folder's prompt of that name, else its default prompt's, else none."""
        chosen = prompt_name if prompt_name is not None else self.spec.default_prompt_name
        if chosen is None:
            return ""
        if not self.spec.prompts:
            raise InputError(
                f"prompt_name {chosen!r}: this model has no prompts (its folder names none)",
                param="prompt_name",
            )
        if chosen not in self.spec.prompts:
            known = ", ".join(sorted(self.spec.prompts))
            raise InputError(
                f"unknown prompt_name {chosen!r}; this model's prompts: {known}",
                param="prompt_name",
            )
        return str(self.spec.prompts[chosen])

    # -- inputs -----------------------------------------------------------------------------

    def prepare(self, inputs: Any, options: InputOptions | None = None) -> PreparedInputs:
        """Checked token-id sequences for `inputs` (see the module docstring)."""
        options = options or InputOptions()
        single = isinstance(inputs, str) or (
            _is_sequence(inputs) and len(inputs) > 0 and _is_int(inputs[0])
        )
        texts, id_lists = self.read_inputs(inputs)
        if texts is not None:
            return self._prepare_texts(texts, options, single)
        assert id_lists is not None
        return self._prepare_ids(id_lists, options.truncate, single)

    def read_inputs(self, inputs: Any) -> tuple[list[str] | None, list[list[int]] | None]:
        """`inputs` as (texts, None) or (None, token id lists), every item checked."""
        if isinstance(inputs, str):
            if not inputs:
                raise InputError("input is an empty string")
            return [inputs], None
        if not _is_sequence(inputs):
            raise InputTypeError(
                "input must be a string, a list of strings, a list of token ids or a list of "
                f"lists of token ids; got {type(inputs).__name__}"
            )
        if len(inputs) == 0:
            raise InputError("input is an empty list; pass at least one text or token id list")
        first = inputs[0]
        if isinstance(first, str):
            for i, x in enumerate(inputs):
                if not isinstance(x, str):
                    raise InputTypeError(
                        f"input[{i}] is {type(x).__name__}; every item must be a string like "
                        "input[0]"
                    )
                if not x:
                    raise InputError(f"input[{i}] is an empty string")
            return list(inputs), None
        if _is_int(first):
            return None, [self._check_ids(inputs, "input")]
        if _is_sequence(first):
            seqs = []
            for i, x in enumerate(inputs):
                if not _is_sequence(x):
                    raise InputTypeError(
                        f"input[{i}] is {type(x).__name__}; every item must be a list of token "
                        "ids like input[0]"
                    )
                seqs.append(self._check_ids(x, f"input[{i}]"))
            return None, seqs
        raise InputTypeError(
            f"input[0] is {type(first).__name__}; expected a string, a token id or a list of "
            "token ids"
        )

    def _check_ids(self, ids: Sequence[Any], where: str) -> list[int]:
        if len(ids) == 0:
            raise InputError(f"{where} is an empty list of token ids")
        for t in ids:
            if isinstance(t, float) and abs(t) >= 2**63:
                # NOTE: a JSON integer past 64 bits reaches us as a float (orjson's reading)
                raise InputError(
                    f"{where}: token id {t:.0f} is outside the vocabulary [0, {self.vocab_size})",
                    code="invalid_token_id",
                )
            if not _is_int(t):
                raise InputTypeError(
                    f"{where} must hold integer token ids only, found {type(t).__name__}"
                )
            if not 0 <= t < self.vocab_size:
                raise InputError(
                    f"{where}: token id {t} is outside the vocabulary [0, {self.vocab_size})",
                    code="invalid_token_id",
                )
        return [int(t) for t in ids]

    def _prepare_ids(
        self, seqs: list[list[int]], truncate: Truncate, single: bool
    ) -> PreparedInputs:
        limit = self.max_length
        if truncate == "chunk":  # no special tokens are known for ids: plain windows
            windows = [[ids[j : j + limit] for j in range(0, len(ids), limit)] for ids in seqs]
            return PreparedInputs(
                [w for ws in windows for w in ws],
                single,
                [len(ws) for ws in windows],
                [len(w) for ws in windows for w in ws],
            )
        out = []
        for i, ids in enumerate(seqs):
            if len(ids) > limit:
                if truncate is False:
                    where = "input" if single else f"input[{i}]"
                    raise InputTooLong(where, len(ids), limit, TRUNCATE_ADVICE)
                ids = ids[:limit] if truncate == "end" else ids[-limit:]
            out.append(ids)
        return PreparedInputs(out, single)

    def _prepare_texts(
        self, texts: list[str], options: InputOptions, single: bool
    ) -> PreparedInputs:
        if options.truncate != "chunk":
            ids = self.tokenizer.encode(texts, truncate=options.truncate, prompt=options.prompt)
            self._refuse_empty(texts, ids, options.prompt, single)
            return PreparedInputs(ids, single)
        prompted = [options.prompt + t for t in texts] if options.prompt else texts
        limit = self.max_length
        prompt_ids = self.tokenizer.encode_plain(options.prompt) if options.prompt else []
        wholes = self.tokenizer.encode_with_offsets(prompted)
        self._refuse_empty(texts, [w.ids for w in wholes], options.prompt, single)
        too_long = [i for i, whole in enumerate(wholes) if len(whole.ids) > limit]
        # an over-long text is cut into windows of its own tokens (without the prompt: see
        # `chunking.split_windows`), all of them tokenized in one batch
        alone = dict(
            zip(
                too_long,
                self.tokenizer.encode_with_offsets([texts[i] for i in too_long]),
                strict=True,
            )
        )
        seqs: list[list[int]] = []
        counts: list[int] = []
        weights: list[int] = []
        for i, whole in enumerate(wholes):
            if i not in alone:  # as truncate=False would embed it
                seqs.append(list(whole.ids))
                counts.append(1)
                weights.append(1)
                continue
            windows, overhead = split_windows(alone[i], prompt_ids, limit)
            seqs += windows
            counts.append(len(windows))
            weights += [len(w) - overhead for w in windows]
        return PreparedInputs(seqs, single, counts, weights)

    def _refuse_empty(
        self, texts: list[str], seqs: list[list[int]], prompt: str, single: bool
    ) -> None:
        refuse_empty(self.tokenizer, texts, seqs, prompt, single=single)

    # -- late chunking --------------------------------------------------------------------

    def plan_documents(
        self, documents: list[list[str]], separator: Any = None
    ) -> list[DocumentPlan]:
        """Each document (chunk strings, as `read_documents` checked them) joined with
        `separator` (None: `DEFAULT_SEPARATOR`) and tokenized once, with its chunks' token spans
        from the tokenizer's offsets (`chunking.plan_document`)."""
        if separator is None:
            separator = DEFAULT_SEPARATOR
        if not isinstance(separator, str):
            raise InputTypeError(
                f"separator must be a string, got {type(separator).__name__}", param="separator"
            )
        joined = [join_chunks(chunks, separator) for chunks in documents]
        # NOTE: a long document over the limit is refused from a piece of it (a 14 MB one cost
        # 22 s tokenized whole)
        self.tokenizer.check_fits([text for text, _ in joined])
        encodings = self.tokenizer.encode_with_offsets([text for text, _ in joined])
        plans = []
        for d, (encoding, (_, ranges)) in enumerate(zip(encodings, joined, strict=True)):
            if len(encoding.ids) > self.max_length:
                raise InputTooLong(
                    f"input[{d}]",
                    len(encoding.ids),
                    self.max_length,
                    "split it into several documents",
                )
            try:
                plans.append(plan_document(encoding, ranges))
            except ValueError as e:  # a chunk of characters the tokenizer drops
                raise InputError(f"input[{d}]: {e}") from None
        return plans

    @staticmethod
    def read_documents(
        documents: Any, max_chunks: int = MAX_CHUNKS_PER_DOCUMENT
    ) -> list[list[str]]:
        """Documents as a non-empty list of non-empty lists of non-blank strings."""
        if isinstance(documents, str) or not _is_sequence(documents):
            raise InputTypeError(
                "input must be a list of documents, each a list of chunk strings; got "
                f"{type(documents).__name__}"
            )
        if len(documents) == 0:
            raise InputError("input is an empty list of documents")
        for d, document in enumerate(documents):
            if isinstance(document, str) or not _is_sequence(document):
                raise InputTypeError(
                    f"input[{d}] is {type(document).__name__}; every document must be a list "
                    "of chunk strings"
                )
            if len(document) == 0:
                raise InputError(f"input[{d}] is a document with no chunks")
            if len(document) > max_chunks:
                raise InputError(
                    f"input[{d}] has {len(document)} chunks, over the limit of {max_chunks} per "
                    "document",
                    code="too_many_chunks",
                )
            for c, chunk in enumerate(document):
                if not isinstance(chunk, str):
                    raise InputTypeError(
                        f"input[{d}][{c}] is {type(chunk).__name__}; every chunk must be a string"
                    )
                if not chunk.strip():
                    raise InputError(f"input[{d}][{c}] is an empty chunk")
        return [list(d) for d in documents]


def refuse_empty(
    tokenizer: TextTokenizer,
    texts: Sequence[str],
    seqs: Sequence[Sequence[int]],
    prompt: str = "",
    *,
    single: bool = False,
) -> None:
    """A text with no token of its own in its ids `seqs[i]` ("\\u0000", "  ") is refused as ""
    is: its vector would be the empty text's (issue 40 item 7)."""
    i = tokenizer.first_without_tokens(texts, seqs, prompt)
    if i is not None:
        raise no_token_of_its_own("input" if single else f"input[{i}]")
