"""Reading an HTTP request body into what the gateway acts on.

Only what is particular to HTTP is checked here: the body is a JSON object, no unknown fields (a
typo such as `dimension` is an error rather than silently ignored, as in the OpenAI API), the
model name, `encoding_format`, and the per-request count limits. Every value the offline API also
takes goes to the request core (`embedserve.core.inputs`) as it came, so both front ends give the same
answers and the same error messages; the app turns those `InputError`s into 400s in one place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from embedserve.core.chunking import MAX_CHUNKS_PER_DOCUMENT, MAX_CHUNKS_PER_REQUEST
from embedserve.core.inputs import Head, InputOptions, InputPreparer
from embedserve.gateway.errors import ApiError, bad_request
from embedserve.retrieval.results import MAX_MULTIVECTOR_VALUES

PROMPT_FIELDS = ("prompt_name", "prompt", "input_type", "instruction")
HEAD_FIELDS = ("dimensions", "normalize", "output_dtype")
# `outputs` (`gateway.output_bodies`) is read before the model is picked: here a dense-only model's
EMBEDDINGS_FIELDS = frozenset(
    {"input", "model", "encoding_format", "user", "truncate", "outputs", *PROMPT_FIELDS,
     *HEAD_FIELDS}
)  # fmt: skip
TOKENIZE_FIELDS = frozenset({"input", "model", "truncate", *PROMPT_FIELDS})
CONTEXTUAL_FIELDS = frozenset(
    {"input", "model", "encoding_format", "user", "separator", *HEAD_FIELDS}
)


MAX_TOKENS_PER_REQUEST = 300_000  # real tokens per request (`--max-tokens-per-request`)


@dataclass(frozen=True)
class Limits:
    """What one HTTP request may hold, and the schema facts `/openapi.json` publishes."""

    hidden_size: int
    max_inputs: int
    model_names: tuple[str, ...]
    min_dimensions: int = 1  # 128 under the pplx output rules (`outputs.min_dimensions`)
    default_output_dtype: str = "float32"  # the folder's native one (spec.default_output_dtype)
    max_chunks: int = MAX_CHUNKS_PER_DOCUMENT  # chunks per document (contextualized embeddings)
    max_request_chunks: int = MAX_CHUNKS_PER_REQUEST  # chunks of all its documents
    task: str = "embed"  # the model's: "embed" or "score" (spec.ModelSpec.task)
    # how it scores: bi-encoder (cosine), cross-encoder, llm-reranker; splade, bge-m3, colbert
    scoring: str = "bi-encoder"
    # what it embeds (spec.outputs): dense, sparse, multivector
    outputs: tuple[str, ...] = ("dense",)
    # its retrieval kind (spec.retrieval.kind, a row of `retrieval_kinds`); None: dense only
    retrieval: str | None = None
    multivector_dims: int = 0  # the width of each multi-vector row (0: none)
    # floats of multi-vector answer per request (--max-multivector-values)
    max_multivector_values: int = MAX_MULTIVECTOR_VALUES


@dataclass(frozen=True)
class EmbedJob:
    inputs: Any  # `input` as sent; the core checks and tokenizes it
    options: InputOptions
    head: Head
    encoding_format: str  # float | base64


@dataclass(frozen=True)
class ContextualJob:
    documents: list[list[str]]  # checked: each an ordered list of non-blank chunk strings
    separator: Any  # as sent (None: the default); the core checks it
    head: Head
    encoding_format: str

    @property
    def num_chunks(self) -> int:
        return sum(map(len, self.documents))


def check_object(body: Any, allowed: frozenset[str]) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object", code="invalid_type")
    for key in body:
        if key not in allowed:
            raise bad_request(
                f"unrecognized request argument: {key!r}", param=key, code="unknown_parameter"
            )
    return body


def optional_string(body: dict[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise bad_request(
            f"{key!r} must be a string, got {type(value).__name__}", param=key, code="invalid_type"
        )
    return value


def check_model(body: dict[str, Any], limits: Limits) -> None:
    model = optional_string(body, "model")
    if model is not None and model not in limits.model_names:
        raise ApiError(
            404,
            f"model {model!r} is not served here; available: {', '.join(limits.model_names)}",
            param="model",
            code="model_not_found",
        )


def input_value(
    body: dict[str, Any], limits: Limits, what: str = "items", key: str = "input"
) -> Any:
    """The required inputs field `key` as sent, within the per-request count."""
    value = body.get(key)
    if value is None:
        raise bad_request(f"{key!r} is required", param=key, code="missing_required_parameter")
    if isinstance(value, list) and len(value) > limits.max_inputs:
        raise bad_request(
            f"{key!r} has {len(value)} {what}, over the limit of {limits.max_inputs} per request",
            param=key,
            code="too_many_inputs",
        )
    return value


# "base64_packed": base64 of an encoded row's own little-endian bytes (int8, binary, float16,
# ...), our extension; "base64" keeps OpenAI's meaning, float32 bytes, the only one its clients
# decode (the openai package asks for base64 unless told otherwise and reads float32 from it)
ENCODING_FORMATS = ("float", "base64", "base64_packed")


def _encoding_format(body: dict[str, Any], head: Head) -> str:
    """The body's encoding ("float" or "base64", packed or not), checked against the head: a
    row that is not float32 is never sent where a client would decode float32 from it."""
    value = optional_string(body, "encoding_format") or "float"
    if value not in ENCODING_FORMATS:
        raise bad_request(
            f"'encoding_format' must be one of {', '.join(map(repr, ENCODING_FORMATS))}; "
            f"got {value!r}",
            param="encoding_format",
        )
    if value == "base64" and head.output_dtype != "float32":
        raise bad_request(
            f"output_dtype {head.output_dtype!r} cannot be sent as encoding_format 'base64': "
            "OpenAI clients decode base64 as float32 (the openai package asks for base64 unless "
            "encoding_format is given) and would read these bytes as wrong numbers; pass "
            f"encoding_format 'float' for the {head.output_dtype} values as JSON numbers, or "
            "'base64_packed' for their little-endian bytes",
            param="encoding_format",
            code="encoding_not_decodable",
        )
    return "base64" if value == "base64_packed" else value


def _head(body: dict[str, Any], inputs: InputPreparer) -> Head:
    return inputs.head(body.get("dimensions"), body.get("normalize"), body.get("output_dtype"))


def _options(body: dict[str, Any], inputs: InputPreparer) -> InputOptions:
    prompts = {key: body.get(key) for key in PROMPT_FIELDS}
    return inputs.options(truncate=body.get("truncate"), **prompts)


def embeddings_head(body: dict[str, Any], inputs: InputPreparer) -> tuple[Head, str]:
    """An embeddings body's head and `encoding_format`, checked."""
    head = _head(body, inputs)
    return head, _encoding_format(body, head)


def parse_embeddings(body: Any, limits: Limits, inputs: InputPreparer) -> EmbedJob:
    body = check_object(body, EMBEDDINGS_FIELDS)
    check_model(body, limits)
    optional_string(body, "user")
    head, encoding_format = embeddings_head(body, inputs)
    options = _options(body, inputs)
    return EmbedJob(input_value(body, limits), options, head, encoding_format)


def parse_contextual(body: Any, limits: Limits, inputs: InputPreparer) -> ContextualJob:
    """A /v1/contextualizedembeddings body (see docs/serving.md)."""
    body = check_object(body, CONTEXTUAL_FIELDS)
    check_model(body, limits)
    optional_string(body, "user")
    head = _head(body, inputs)
    encoding_format = _encoding_format(body, head)
    documents = inputs.read_documents(input_value(body, limits, "documents"), limits.max_chunks)
    job = ContextualJob(documents, body.get("separator"), head, encoding_format)
    if job.num_chunks > limits.max_request_chunks:  # before any is tokenized
        raise bad_request(
            f"'input' has {job.num_chunks} chunks in all, over the limit of "
            f"{limits.max_request_chunks} per request",
            param="input",
            code="too_many_chunks",
        )
    return job


def parse_tokenize(body: Any, limits: Limits, inputs: InputPreparer) -> tuple[Any, InputOptions]:
    """(texts, options) of a /tokenize body; `input` must be text, `truncate` not "chunk"."""
    body = check_object(body, TOKENIZE_FIELDS)
    check_model(body, limits)
    options = _options(body, inputs)
    if options.truncate == "chunk":
        raise bad_request('/tokenize takes truncate false, "end" or "start"', param="truncate")
    value = input_value(body, limits)
    texts, _ = inputs.read_inputs(value)
    if texts is None:
        raise bad_request("/tokenize takes text input", param="input", code="invalid_type")
    return value, options


def tokenize_body(tokens: list[list[int]], name: str) -> dict[str, Any]:
    """`/tokenize`'s answer: each text's token ids and count, and the usage."""
    count = sum(map(len, tokens))
    return {
        "model": name,
        "tokens": tokens,
        "num_tokens": [len(t) for t in tokens],
        "usage": {"prompt_tokens": count, "total_tokens": count},
    }
