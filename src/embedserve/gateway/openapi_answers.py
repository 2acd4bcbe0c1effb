"""The answers' schemas of our own routes (what `gateway.pipeline`, `gateway.scoring` and
`gateway.models` send), and the error object every route shares."""

from __future__ import annotations

from typing import Any

from embedserve.gateway.openapi_types import Schema, array, integer, number, string

INT, NAME = integer(), string()
NULLABLE_INT = {"type": "integer", "nullable": True}
INDEX = integer(minimum=0)
LIST = string(enum=["list"])
VECTOR = {"oneOf": [array(number()), string()]}  # floats, or base64
ERROR = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "message": NAME,
                "type": NAME,
                "param": {"type": "string", "nullable": True},
                "code": {"type": "string", "nullable": True},
            },
            "required": ["message", "type", "param", "code"],
        }
    },
}


def record(properties: dict[str, Any], required: list[str] | None = None) -> Schema:
    """An answer's object: its properties (`required`: those always sent)."""
    out: Schema = {"type": "object"}
    if required is not None:
        out["required"] = required
    out["properties"] = properties
    return out


# /v1/models (`gateway.models.ServedModel.describe`): OpenAI's fields, then what each model does
# here and its own limits (a model's `--model-limit` / models-file values, else the gateway's)
MODEL_LIST = record({"object": LIST, "data": array(record({
    "id": NAME, "object": string(enum=["model"]), "created": INT, "owned_by": NAME, "task": NAME,
    "scoring": {"type": "string", "nullable": True}, "aliases": array(NAME),
    "dimensions": NULLABLE_INT, "min_dimensions": NULLABLE_INT, "outputs": array(NAME),
    "limits": record({"max_inputs": INT, "max_tokens_per_request": NULLABLE_INT,
                      "max_chunks_per_document": INT})},
    ["id", "object", "task", "limits"]))}, ["object", "data"])  # fmt: skip


def embeddings_answer() -> tuple[Schema, Schema]:
    """One embedding's schema, and the embeddings answer's (a list of them, with usage)."""
    sparse = {"type": "object",
              "description": "with outputs [sparse]: ascending token ids, their weights (> 0)",
              "required": ["indices", "values"],
              "properties": {"indices": array(INDEX), "values": array(number())}}  # fmt: skip
    multivector = {"type": "array",
                   "description": "with outputs [multivector]: one unit vector per token",
                   "items": VECTOR}  # fmt: skip
    embedding = record({"object": string(enum=["embedding"]), "index": INT, "embedding": VECTOR,
                        "sparse": sparse, "multivector": multivector})  # fmt: skip
    usage = record({"prompt_tokens": INT, "total_tokens": INT})
    answer = record({"object": LIST, "data": array(embedding), "model": NAME, "usage": usage})
    return embedding, answer


def contextual_answer(embedding: Schema, usage: Schema) -> Schema:
    document = record({"object": LIST, "index": INT, "data": array(embedding)})
    return record({"object": LIST, "data": array(document), "model": NAME, "usage": usage})


def rerank_answer(usage: Schema) -> Schema:
    document = record({"text": NAME})
    result = record({"index": INDEX, "relevance_score": number(), "document": document},
                    ["index", "relevance_score"])  # fmt: skip
    return record({"id": NAME, "model": NAME, "results": array(result), "usage": usage},
                  ["id", "model", "results", "usage"])  # fmt: skip


def tei_rerank_answer() -> Schema:
    result = record({"index": INDEX, "score": number(), "text": NAME}, ["index", "score"])
    return array(result)


def score_answer(usage: Schema) -> Schema:
    item = record({"index": INDEX, "object": string(enum=["score"]), "score": number()},
                  ["index", "object", "score"])  # fmt: skip
    return record(
        {"id": NAME, "object": LIST, "created": INT, "model": NAME, "data": array(item),
         "usage": usage},
        ["id", "object", "created", "model", "data", "usage"],
    )  # fmt: skip
