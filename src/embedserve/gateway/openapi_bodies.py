"""The request bodies of our own routes, field by field (`openapi_types.Field`): names, types,
defaults, and the limits of the gateway's `Limits`. `gateway.openapi` publishes them."""

from __future__ import annotations

from embedserve.core.head import OUTPUT_DTYPES
from embedserve.core.inputs import INPUT_TYPES
from embedserve.gateway.openapi_types import (
    Field,
    Schema,
    array,
    body,
    boolean,
    choice,
    fields,
    integer,
    number,
    obj,
    one_of,
    string,
)
from embedserve.gateway.requests import ENCODING_FORMATS, Limits
from embedserve.gateway.scoring import RERANK_TRUNCATE

# a string with something in it: blank queries, documents and chunks are refused
NOT_BLANK = string(min_length=1, pattern=r"\S")
TEXT = string(min_length=1)
PAIR_TRUNCATE = (False, "end", "start")  # `truncate` of a route that scores pairs
OUTPUTS = (
    "embedserve's extension for sparse and multi-vector models (SPLADE, bge-m3, ColBERT; "
    "/v1/models lists each model's outputs; those of the models served are listed here): any of "
    "dense (`embedding`), sparse (`sparse`: {indices, values}) and multivector (`multivector`: "
    "one vector per token), from one forward; encoding_format and output_dtype apply to the "
    'vectors, dimensions to the dense one. ColBERT: input_type "query" encodes queries. '
    "Default: dense only"
)
M3_WEIGHTS = (  # bge-m3's score weights (`retrieval.scores.late_plan`)
    "bge-m3 only: the (dense, sparse, colbert) weights of its score (FlagEmbedding's "
    "weights_for_different_modes; default 1, 1, 1). A ColBERT model scores by MaxSim, a SPLADE "
    "model by the sparse dot product"
)


def texts(max_items: int | None = None) -> Schema:
    return array(TEXT, min_items=1, max_items=max_items)


def token_ids(limits: Limits) -> tuple[Schema, Schema]:
    """One input's token ids, and a batch of them."""
    ids = array(integer(minimum=0), min_items=1)
    return ids, array(ids, min_items=1, max_items=limits.max_inputs)


def model_name(limits: Limits) -> Schema:
    return string(enum=limits.model_names)


def documents(limits: Limits) -> Schema:
    document = one_of(NOT_BLANK, obj(Field("text", NOT_BLANK, required=True)))
    return array(document, min_items=1, max_items=limits.max_inputs)


def weights() -> Schema:
    return array(number(minimum=0), min_items=3, max_items=3, description=M3_WEIGHTS)


def embeddings_request(limits: Limits) -> Schema:
    return body(
        Field("input", one_of(TEXT, texts(limits.max_inputs), *token_ids(limits)), required=True),
        Field("model", model_name(limits)),
        Field("encoding_format", string(enum=ENCODING_FORMATS)),
        Field("dimensions", integer(minimum=limits.min_dimensions, maximum=limits.hidden_size)),
        Field("user", string()),
        Field("normalize", boolean(default=True)),
        Field("truncate", choice(False, "end", "start", "chunk", default=False)),
        Field("input_type", string(enum=INPUT_TYPES)),
        Field("instruction", string(min_length=1,
                                    description="a query instruction (Qwen3-Embedding's format)")),
        Field("prompt_name", string(description="one of the model's prompts")),
        Field("prompt", string(description="a literal text put before each input")),
        Field("output_dtype", string(enum=OUTPUT_DTYPES, default=limits.default_output_dtype)),
        Field("outputs", array(string(enum=limits.outputs), min_items=1, description=OUTPUTS)),
    )  # fmt: skip


def contextual_request(limits: Limits, embeddings: Schema) -> Schema:
    """The output options are the embeddings endpoint's own (`embeddings`)."""
    chunks = array(NOT_BLANK, min_items=1, max_items=limits.max_chunks,
                   description="one document: its chunks in order (joined with `separator`)")  # fmt: skip
    head = ("model", "encoding_format", "dimensions", "user", "normalize", "output_dtype")
    return body(
        Field("input", array(chunks, min_items=1, max_items=limits.max_inputs), required=True),
        Field("separator", string(default=" ")),
        *fields(embeddings, *head),
    )


def tokenize_request(embeddings: Schema) -> Schema:
    prompts = fields(embeddings, "input_type", "instruction", "prompt_name", "prompt")
    return body(
        Field("input", one_of(TEXT, texts()), required=True),
        Field("model", string()),
        Field("truncate", choice(*PAIR_TRUNCATE)),
        *prompts,
    )


def rerank_request(limits: Limits) -> Schema:
    return body(
        Field("query", NOT_BLANK, required=True),
        Field("documents", documents(limits), required=True),
        Field("top_n", integer(minimum=1)),
        Field("return_documents", boolean(default=False)),
        Field("truncate", choice(*PAIR_TRUNCATE, default=RERANK_TRUNCATE)),
        Field("instruction", string(min_length=1)),
        Field("model", model_name(limits)),
        Field("weights", weights()),
    )


def tei_rerank_request(limits: Limits) -> Schema:
    return body(
        Field("query", NOT_BLANK, required=True),
        Field("texts", {**documents(limits), "items": NOT_BLANK}, required=True),
        Field("raw_scores", boolean(default=False)),
        Field("return_text", boolean(default=False)),
        Field("truncate", boolean(default=False)),
        Field("truncation_direction", choice("Right", "Left", default="Right")),
        Field("model", model_name(limits)),
    )


def score_request(limits: Limits) -> Schema:
    one_or_many = one_of(TEXT, texts(limits.max_inputs))
    return body(
        Field("text_1", one_or_many, required=True),
        Field("text_2", one_or_many, required=True),
        Field("truncate", choice(*PAIR_TRUNCATE)),
        Field("instruction", string(min_length=1)),
        Field("model", model_name(limits)),
        Field("user", string()),
        Field("weights", weights()),
    )
