"""The request core for scoring: a query and its documents, checked into one sequence per pair.

Every front end that scores (`Scorer`, the gateway's rerank and score routes, `embedserve
rerank`) hands the caller's values to one `PairPreparer`. No torch: the gateway runs this.

- Cross-encoders (`spec.ScoreSpec.kind == "classifier"`): the tokenizer's pair template,
  `[CLS] query [SEP] document [SEP]`, token type 1 from the document on (XLM-RoBERTa:
  `<s> query </s></s> document </s>`, no token types).
- LLM rerankers (`"yes_no"`): Qwen3-Reranker's prompt, the system line, then
  `<Instruct>: {instruction}\\n<Query>: {query}\\n<Document>: {document}`, then the assistant
  suffix; no special tokens of the tokenizer's own.

A query or document with no token of its own after the tokenizer's normalization ("\\u0000",
whitespace for WordPiece) is refused as "" is, as the embedding path refuses it
(`tokenization.no_token_of_its_own`). An over-long pair is an error naming the document, unless `truncate` is "end" (keep the
document's beginning) or "start" (keep its end). The query is never cut: a query too long to
pair with even one document token is an error.

An embedding model scores too, as a bi-encoder (`plan_cosine`): the query and the documents are
embedded apart, each with its prompt, and scored by the cosine of their vectors. `scoring_kind`
names which of the three a model is. Its errors name what the caller sent (`named`): the request
core embeds the query and the documents as inputs, and would name them `input[i]`.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from embedserve.core.head import Head
from embedserve.core.inputs import InputOptions, InputPreparer
from embedserve.core.tokenization import TextTokenizer, no_token_of_its_own
from embedserve.errors import InputError, InputTooLong, InputTypeError, shown
from embedserve.loading.spec import ModelSpec

# Qwen3-Reranker's prompt, as its model card gives it
RERANK_SYSTEM = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query "
    'and the Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n'
    "<|im_start|>user\n"
)
RERANK_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
RERANK_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
RERANK_BODY = "<Instruct>: {instruction}\n<Query>: {query}\n<Document>: "

# How a model scores: cosine of its embeddings, or one forward per pair (`spec.ScoreSpec.kind`)
SCORING_KINDS = ("bi-encoder", "cross-encoder", "llm-reranker")

PAIR_TRUNCATE_ADVICE = (
    'shorten it or pass truncate "end" (keep the document\'s beginning) or "start" (keep its '
    "end); the query is never cut"
)


@dataclass(frozen=True)
class Fields:
    """What a request called its query and documents, so that an error names what the caller
    sent: `query` and `documents` (Cohere, Jina, the offline API), TEI's `query` and `texts`,
    vLLM's `text_1` and `text_2`. `first`: where this group's documents begin in the request's
    list (vLLM's pairs go in groups of one `text_1`); `listed`: the query is `text_1[first]`."""

    query: str = "query"
    documents: str = "documents"
    first: int = 0
    listed: bool = False

    @property
    def query_name(self) -> str:
        return f"{self.query}[{self.first}]" if self.listed else self.query

    def document(self, i: int) -> str:
        return f"{self.documents}[{self.first + i}]"


@dataclass(frozen=True)
class PreparedPairs:
    """One token sequence per (query, document) pair, in document order."""

    seqs: list[list[int]]
    # per pair, the offset where token type 1 (the document) begins; 0: one segment only
    second_segment: list[int]


def read_text(value: Any, param: str) -> str:
    """A non-empty string, or an InputError naming `param`."""
    if not isinstance(value, str):
        raise InputTypeError(
            f"{param} must be a string, got {type(value).__name__}", param=param.split("[")[0]
        )
    if not value.strip():
        raise InputError(f"{param} is an empty string", param=param.split("[")[0])
    return value


def read_documents(documents: Any, param: str = "documents") -> list[str]:
    """A non-empty list of documents, each a string or an object with a "text" string."""
    if isinstance(documents, str) or not isinstance(documents, (list, tuple)):
        raise InputTypeError(
            f"{param} must be a list of strings, got {type(documents).__name__}", param=param
        )
    if not documents:
        raise InputError(f"{param} is an empty list; pass at least one document", param=param)
    out = []
    for i, doc in enumerate(documents):
        if isinstance(doc, dict):
            if set(doc) - {"text"} or "text" not in doc:
                raise InputError(
                    f'{param}[{i}] must be a string or {{"text": string}}', param=param
                )
            doc = doc["text"]
        out.append(read_text(doc, f"{param}[{i}]"))
    return out


class PairPreparer:
    """One scoring model's request core: pairs, their checks and truncation, the activation."""

    def __init__(self, spec: ModelSpec, tokenizer: TextTokenizer) -> None:
        if spec.score is None and spec.labels is None:
            raise ValueError(f"{spec.path}: not a scoring model")
        self.spec = spec
        # a sequence classifier pairs as a cross-encoder does (`core.classify`); its labels'
        # activation is its own, so `activate` is a scoring model's only
        self.score = spec.score
        self.kind = spec.score.kind if spec.score is not None else "classifier"
        self.tokenizer = tokenizer
        self.max_length = spec.max_seq_length

    def activate(self, raw: np.ndarray) -> np.ndarray:
        """Raw scores (logits) -> the model's relevance scores (its activation), float32."""
        assert self.score is not None, "a classifier's labels activate its logits"
        return np.asarray(self.score.activate(np.asarray(raw).reshape(-1)))

    def prepare(
        self,
        query: Any,
        documents: Any,
        *,
        truncate: Any = False,
        instruction: Any = None,
        fields: Fields = Fields(),
    ) -> PreparedPairs:
        """One checked sequence per pair (see the module docstring); errors name `fields`."""
        query = read_text(query, fields.query_name)
        docs = read_documents(documents, fields.documents)
        if truncate is None:
            truncate = False
        if truncate not in (False, "end", "start"):
            raise InputError(
                f'truncate must be false, "end" or "start" for scoring; got {shown(truncate)}',
                param="truncate",
            )
        if self.kind == "classifier":
            if instruction is not None:
                raise InputError(
                    "instruction applies to LLM rerankers; this model is a cross-encoder",
                    param="instruction",
                )
            return self._cross_encoder(query, docs, truncate, fields)
        if instruction is None:
            instruction = RERANK_INSTRUCTION
        instruction = read_text(instruction, "instruction")
        return self._yes_no(query, docs, truncate, instruction, fields)

    def _too_long(self, where: str, n: int, truncate: Any) -> None:
        if truncate is False:
            raise InputTooLong(
                f"the pair of the query and {where}",
                n,
                self.max_length,
                PAIR_TRUNCATE_ADVICE,
            )

    def _query_too_long(self, n: int) -> InputError:
        return InputError(
            f"the query takes {n} of this model's {self.max_length} tokens with the special "
            "tokens, leaving no room for a document; shorten it (a query is never truncated)",
            param="query",
            code="context_length_exceeded",
        )

    def _cross_encoder(
        self, query: str, docs: list[str], truncate: Any, fields: Fields
    ) -> PreparedPairs:
        """Each pair as the tokenizer's pair template joins the two texts tokenized apart (the
        package's pair encoding, id for id: tests/native/test_tokenizer_parity.py), tokenized
        and joined natively (`native/src/ivy/pairs.rs`: the one rule, Ivy's scoring routes'
        too); the first problem in document order is the error."""
        if self.tokenizer.pair_template is None:
            raise InputError(f"{self.spec.path}: the tokenizer has no pair template")
        pairs = self.tokenizer.pairs(query, docs, self.max_length, truncate or None)
        if pairs is None:
            raise _empty(fields.query_name)
        seqs, seconds = [], []
        # token type 1 from the document on, for models with segment embeddings (BERT); an
        # XLM-RoBERTa pair (`<s> q </s></s> d </s>`) is all type 0
        typed = self.spec.type_vocab_size > 1
        for i, (joined, ids, n) in enumerate(pairs):
            if joined == "empty":
                raise _empty(fields.document(i))
            if joined == "too_long":
                self._too_long(fields.document(i), n, truncate)
            if joined == "query_too_long":
                raise self._query_too_long(n)
            seqs.append(ids)
            seconds.append(n if typed else 0)
        return PreparedPairs(seqs, seconds)

    def _yes_no(
        self, query: str, docs: list[str], truncate: Any, instruction: str, fields: Fields
    ) -> PreparedPairs:
        limit = self.max_length
        prompt = RERANK_BODY.format(instruction=instruction, query=query)  # before each document
        system = self.tokenizer.encode_plain(RERANK_SYSTEM)
        suffix = self.tokenizer.encode_plain(RERANK_SUFFIX)
        bodies = self.tokenizer.encode_plain_batch([prompt + d for d in docs])
        self._refuse_empty(query, docs, prompt, bodies, fields)
        room = limit - len(system) - len(suffix)
        seqs = []
        for i, body in enumerate(bodies):
            n = len(system) + len(body) + len(suffix)
            if n > limit:
                self._too_long(fields.document(i), n, truncate)
                # NOTE: "end" cuts the joint text's tokens, as Qwen3-Reranker's own code does;
                # "start" keeps the query part whole and the document's last tokens
                query_part = self.tokenizer.encode_plain(prompt.rstrip(" "))
                if len(query_part) >= room:
                    raise self._query_too_long(len(system) + len(query_part) + len(suffix))
                if truncate == "end":
                    body = body[:room]
                else:
                    doc = self.tokenizer.encode_plain(" " + docs[i])
                    body = query_part + doc[len(doc) - (room - len(query_part)) :]
            seqs.append(system + body + suffix)
        return PreparedPairs(seqs, [0] * len(seqs))

    def _refuse_empty(
        self, query: str, docs: list[str], prompt: str, bodies: list[list[int]], fields: Fields
    ) -> None:
        """An LLM reranker's query or document with no token of its own, inside the prompt: a
        body no longer than the prompt's tokens may hold a short document merged into its last
        token, so that document is tokenized alone (as `first_without_tokens` does)."""
        if not self.tokenizer.encode_plain(query):
            raise _empty(fields.query_name)
        base = len(self.tokenizer.encode_plain(prompt))
        for i, body in enumerate(bodies):
            if len(body) <= base and not self.tokenizer.encode_plain(docs[i]):
                raise _empty(fields.document(i))


def _empty(where: str) -> InputError:
    """`where` has no token of its own; the parameter is its field (`texts[2]`: `texts`)."""
    return no_token_of_its_own(where, param=where.split("[")[0])


def check_top_n(top_n: Any) -> int | None:
    """`top_n` of a rerank: None (all) or a positive integer."""
    if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n <= 0):
        raise InputError(f"top_n must be a positive integer, got {shown(top_n)}", param="top_n")
    return top_n


def ranked(scores: np.ndarray, top_n: int | None = None) -> list[int]:
    """Indices by descending score, ties in input order; the first `top_n` (None: all)."""
    return [int(i) for i in np.argsort(-np.asarray(scores), kind="stable")[:top_n]]


def cosine_scores(query: np.ndarray, documents: np.ndarray) -> np.ndarray:
    """Cosine of one query vector [H] against each document vector [N, H] (bi-encoder scoring)."""
    q = np.asarray(query, dtype=np.float64).reshape(-1)
    d = np.asarray(documents, dtype=np.float64)
    den = np.maximum(np.linalg.norm(d, axis=1) * np.linalg.norm(q), 1e-300)
    return (d @ q / den).astype(np.float32)


def scoring_kind(spec: ModelSpec) -> str:
    """Which of `SCORING_KINDS` a model is (what `Scorer.kind` and the gateway report)."""
    if spec.score is None:
        return "bi-encoder"
    return "cross-encoder" if spec.score.kind == "classifier" else "llm-reranker"


@dataclass(frozen=True)
class CosinePlan:
    """A bi-encoder's scoring of documents for one query: what to embed, how, and the scores.

    The query is embedded with the folder's query prompt (or Qwen3's `instruction` format), the
    documents with its document prompt, both as unit float32 vectors whatever the folder's
    native output; the caller runs the two embeddings (in process or through servers) and
    hands their rows to `scores`.
    """

    query: str
    documents: list[str]
    query_options: InputOptions
    document_options: InputOptions
    head: Head

    def scores(self, query_rows: np.ndarray, document_rows: np.ndarray) -> np.ndarray:
        """[N] float32: the one query row [1, H] against each document row [N, H]."""
        return cosine_scores(query_rows[0], document_rows)


def plan_cosine(
    inputs: InputPreparer,
    query: Any,
    documents: Any,
    *,
    truncate: Any,
    instruction: Any,
    fields: Fields = Fields(),
) -> CosinePlan:
    """The checked plan of a bi-encoder's scores (see `CosinePlan`)."""
    query = read_text(query, fields.query_name)  # as a reranker's pairs check it
    docs = read_documents(documents, fields.documents)
    return CosinePlan(
        query,
        docs,
        inputs.options(input_type="query", instruction=instruction, truncate=truncate),
        inputs.options(input_type="document", truncate=truncate),
        inputs.head(normalize=True, output_dtype="float32"),
    )


def text_names(fields: Sequence[Fields], counts: Sequence[int]) -> tuple[list[str], list[str]]:
    """What the caller called a bi-encoder's queries (one per group) and its documents (each
    group's `counts[g]`, in order), as the two input lists it embeds (`named`)."""
    documents = [f.document(i) for f, n in zip(fields, counts, strict=True) for i in range(n)]
    return [f.query_name for f in fields], documents


_INPUT = re.compile(r"input(?:\[(\d+)\])?(?![\w\[])")  # how the request core names a text


@contextlib.contextmanager
def named(names: Sequence[str]) -> Iterator[None]:
    """The request core's errors about its `input[i]` while it prepares texts the caller sent
    under other names (a bi-encoder's query and documents, embedded as input lists) raised
    naming `names[i]` (`documents[3]`, TEI's `texts[3]`, `query`), its field the parameter: the
    caller never sent an `input`. Errors about other parameters pass as they are."""
    try:
        yield
    except InputError as e:
        if e.param != "input":
            raise
        raise renamed(e, names) from None


def renamed(error: InputError, names: Sequence[str]) -> InputError:
    """`error` (of the same class, code and figures) naming `names` for `input[i]` (`named`)."""
    match = _INPUT.match(error.message)
    where = names[int(match.group(1) or 0)] if match else names[0]
    message = where + error.message[match.end() :] if match else error.message
    out = type(error).__new__(type(error), message)
    out.__dict__.update(vars(error), message=message, param=where.split("[")[0])
    if "where" in vars(error):  # an over-long text's (`InputTooLong`, `TooManyTokens`)
        out.__dict__["where"] = where
    return out
