"""Validating an embeddings / tokenize request body into what the gateway acts on.

Every field is checked for its type and range here, in one place, and a bad one becomes a 400
naming the field (`param`). Unknown fields are refused, as the OpenAI API does, so a typo such as
`dimension` is an error rather than silently ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from embedserve.chunking import MAX_CHUNKS_PER_DOCUMENT
from embedserve.gateway.errors import ApiError, bad_request
from embedserve.outputs import OUTPUT_DTYPES

EMBEDDINGS_FIELDS = frozenset(
    {
        "input",
        "model",
        "encoding_format",
        "dimensions",
        "user",
        "normalize",
        "truncate",
        "input_type",
        "output_dtype",
    }
)
TOKENIZE_FIELDS = frozenset({"input", "model", "truncate", "input_type"})
CONTEXTUAL_FIELDS = frozenset(
    {"input", "model", "encoding_format", "dimensions", "user", "normalize", "output_dtype"}
)
INPUT_TYPES = ("query", "document")


@dataclass(frozen=True)
class Limits:
    hidden_size: int
    vocab_size: int
    max_inputs: int
    model_names: tuple[str, ...]
    min_dimensions: int = 1  # 128 under the pplx output rules (`outputs.min_dimensions`)
    default_output_dtype: str = "float32"  # the folder's native one (spec.default_output_dtype)
    max_chunks: int = MAX_CHUNKS_PER_DOCUMENT  # chunks per document (contextualized embeddings)


@dataclass(frozen=True)
class EmbedJob:
    texts: list[str] | None  # exactly one of texts / token_ids is set
    token_ids: list[list[int]] | None
    encoding_format: str  # float | base64
    dimensions: int
    normalize: bool
    truncate: bool | str  # False | "end" | "start"
    input_type: str | None
    output_dtype: str

    @property
    def num_inputs(self) -> int:
        return len(self.texts if self.texts is not None else self.token_ids or [])


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_object(body: Any, allowed: frozenset[str]) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object", code="invalid_type")
    for key in body:
        if key not in allowed:
            raise bad_request(
                f"unrecognized request argument: {key!r}", param=key, code="unknown_parameter"
            )
    return body


def _optional(body: dict[str, Any], key: str, kind: type, what: str) -> Any:
    value = body.get(key)
    if value is not None and (not isinstance(value, kind) or (kind is int and not _is_int(value))):
        raise bad_request(
            f"{key!r} must be {what}, got {type(value).__name__}", param=key, code="invalid_type"
        )
    return value


def check_model(body: dict[str, Any], limits: Limits) -> None:
    model = _optional(body, "model", str, "a string")
    if model is not None and model not in limits.model_names:
        raise ApiError(
            404,
            f"model {model!r} is not served here; available: {', '.join(limits.model_names)}",
            param="model",
            code="model_not_found",
        )


def parse_input(value: Any, limits: Limits) -> tuple[list[str] | None, list[list[int]] | None]:
    """`input` as (texts, None) or (None, token id lists)."""
    if value is None:
        raise bad_request("'input' is required", param="input", code="missing_required_parameter")
    if isinstance(value, str):
        if not value:
            raise bad_request("'input' is an empty string", param="input")
        return [value], None
    if not isinstance(value, list):
        raise bad_request(
            "'input' must be a string, a list of strings, a list of token ids or a list of "
            f"lists of token ids; got {type(value).__name__}",
            param="input",
            code="invalid_type",
        )
    if not value:
        raise bad_request("'input' is an empty list", param="input")
    if len(value) > limits.max_inputs:
        raise bad_request(
            f"'input' has {len(value)} items, over the limit of {limits.max_inputs} per request",
            param="input",
            code="too_many_inputs",
        )
    first = value[0]
    if isinstance(first, str):
        for i, x in enumerate(value):
            if not isinstance(x, str):
                raise bad_request(
                    f"input[{i}] is {type(x).__name__}; every item must be a string like input[0]",
                    param="input",
                    code="invalid_type",
                )
            if not x:
                raise bad_request(f"input[{i}] is an empty string", param="input")
        return value, None
    if _is_int(first):
        return None, [_check_ids(value, limits, "input")]
    if isinstance(first, list):
        seqs = []
        for i, x in enumerate(value):
            if not isinstance(x, list):
                raise bad_request(
                    f"input[{i}] is {type(x).__name__}; every item must be a list of token ids",
                    param="input",
                    code="invalid_type",
                )
            seqs.append(_check_ids(x, limits, f"input[{i}]"))
        return None, seqs
    raise bad_request(
        f"input[0] is {type(first).__name__}; expected a string, a token id or a list of token ids",
        param="input",
        code="invalid_type",
    )


def _check_ids(ids: list[Any], limits: Limits, where: str) -> list[int]:
    if not ids:
        raise bad_request(f"{where} is an empty list of token ids", param="input")
    for t in ids:
        if not _is_int(t):
            raise bad_request(
                f"{where} must hold integer token ids only, found {type(t).__name__}",
                param="input",
                code="invalid_type",
            )
        if not 0 <= t < limits.vocab_size:
            raise bad_request(
                f"{where}: token id {t} is outside the vocabulary [0, {limits.vocab_size})",
                param="input",
                code="invalid_token_id",
            )
    return ids


def _truncate(body: dict[str, Any]) -> bool | str:
    value = body.get("truncate")
    if value is None or value is False:
        return False
    if value in ("end", "start"):
        return str(value)
    raise bad_request(
        f'\'truncate\' must be false, "end" or "start"; got {value!r}', param="truncate"
    )


def _input_type(body: dict[str, Any]) -> str | None:
    value = body.get("input_type")
    if value is not None and value not in INPUT_TYPES:
        raise bad_request(
            f'\'input_type\' must be "query" or "document"; got {value!r}', param="input_type"
        )
    return value


@dataclass(frozen=True)
class Head:
    """The output options every embedding route shares."""

    encoding_format: str  # float | base64
    dimensions: int
    normalize: bool
    output_dtype: str


def parse_head(body: dict[str, Any], limits: Limits) -> Head:
    """`encoding_format`, `dimensions`, `normalize`, `output_dtype`, with the model's defaults."""
    encoding_format = _optional(body, "encoding_format", str, "a string") or "float"
    if encoding_format not in ("float", "base64"):
        raise bad_request(
            f'\'encoding_format\' must be "float" or "base64"; got {encoding_format!r}',
            param="encoding_format",
        )
    dimensions = _optional(body, "dimensions", int, "an integer")
    if dimensions is not None and not limits.min_dimensions <= dimensions <= limits.hidden_size:
        raise bad_request(
            f"'dimensions' must be between {limits.min_dimensions} and {limits.hidden_size}; "
            f"got {dimensions}",
            param="dimensions",
        )
    dims = dimensions or limits.hidden_size
    normalize = _optional(body, "normalize", bool, "a boolean")
    output_dtype = _optional(body, "output_dtype", str, "a string") or limits.default_output_dtype
    if output_dtype not in OUTPUT_DTYPES:
        raise bad_request(
            f"'output_dtype' must be one of {', '.join(OUTPUT_DTYPES)}; got {output_dtype!r}",
            param="output_dtype",
        )
    if output_dtype in ("binary", "ubinary") and dims % 8:
        raise bad_request(
            f"output_dtype {output_dtype!r} packs 8 dimensions per byte; 'dimensions' must be "
            f"a multiple of 8, got {dims}",
            param="dimensions",
        )
    return Head(encoding_format, dims, True if normalize is None else normalize, output_dtype)


def parse_embeddings(body: Any, limits: Limits) -> EmbedJob:
    body = _check_object(body, EMBEDDINGS_FIELDS)
    check_model(body, limits)
    _optional(body, "user", str, "a string")
    head = parse_head(body, limits)
    truncate = _truncate(body)
    input_type = _input_type(body)
    texts, token_ids = parse_input(body.get("input"), limits)
    return EmbedJob(
        texts=texts,
        token_ids=token_ids,
        encoding_format=head.encoding_format,
        dimensions=head.dimensions,
        normalize=head.normalize,
        truncate=truncate,
        input_type=input_type,
        output_dtype=head.output_dtype,
    )


@dataclass(frozen=True)
class ContextualJob:
    documents: list[list[str]]  # each an ordered list of chunk strings
    head: Head

    @property
    def num_chunks(self) -> int:
        return sum(map(len, self.documents))


def parse_documents(value: Any, limits: Limits) -> list[list[str]]:
    """`input` of /v1/contextualizedembeddings: a non-empty list of documents, each a non-empty
    list of at most `max_chunks` non-blank strings."""
    if value is None:
        raise bad_request("'input' is required", param="input", code="missing_required_parameter")
    if not isinstance(value, list):
        raise bad_request(
            "'input' must be a list of documents, each a list of chunk strings; got "
            f"{type(value).__name__}",
            param="input",
            code="invalid_type",
        )
    if not value:
        raise bad_request("'input' is an empty list of documents", param="input")
    if len(value) > limits.max_inputs:
        raise bad_request(
            f"'input' has {len(value)} documents, over the limit of {limits.max_inputs} per "
            "request",
            param="input",
            code="too_many_inputs",
        )
    for d, document in enumerate(value):
        if not isinstance(document, list):
            raise bad_request(
                f"input[{d}] is {type(document).__name__}; every document must be a list of "
                "chunk strings",
                param="input",
                code="invalid_type",
            )
        if not document:
            raise bad_request(f"input[{d}] is a document with no chunks", param="input")
        if len(document) > limits.max_chunks:
            raise bad_request(
                f"input[{d}] has {len(document)} chunks, over the limit of {limits.max_chunks} "
                "per document",
                param="input",
                code="too_many_chunks",
            )
        for c, chunk in enumerate(document):
            if not isinstance(chunk, str):
                raise bad_request(
                    f"input[{d}][{c}] is {type(chunk).__name__}; every chunk must be a string",
                    param="input",
                    code="invalid_type",
                )
            if not chunk.strip():
                raise bad_request(f"input[{d}][{c}] is an empty chunk", param="input")
    return value


def parse_contextual(body: Any, limits: Limits) -> ContextualJob:
    """A /v1/contextualizedembeddings body (see docs/serving.md)."""
    body = _check_object(body, CONTEXTUAL_FIELDS)
    check_model(body, limits)
    _optional(body, "user", str, "a string")
    head = parse_head(body, limits)
    return ContextualJob(parse_documents(body.get("input"), limits), head)


def parse_tokenize(body: Any, limits: Limits) -> tuple[list[str], bool | str, str | None]:
    """(texts, truncate, input_type) of a /tokenize body; `input` must be text."""
    body = _check_object(body, TOKENIZE_FIELDS)
    check_model(body, limits)
    texts, _ = parse_input(body.get("input"), limits)
    if texts is None:
        raise bad_request("/tokenize takes text input", param="input", code="invalid_type")
    return texts, _truncate(body), _input_type(body)
