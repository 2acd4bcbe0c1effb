"""The OpenAPI document says what the server accepts, and the answers match its schemas: a bounded
property-style run against a real `embedserve serve` (the bundled embedding model).

For every POST route of /openapi.json, cases are derived from its request schema: the required
fields alone; each optional field as null, as each of its enum values and its default; each
constraint just broken (an empty string or list, a blank string where the schema wants text, a
value outside an enum or a range, a wrong type, an unknown field). A body the schema accepts must
get 200 and an answer that matches the response schema; one it refuses must get a 4xx in the
OpenAI error shape. A small validator for the part of JSON Schema the document uses is here.
"""

from __future__ import annotations

import copy
import http.client
import json
import re
from typing import Any
from urllib.parse import urlparse

import pytest

pytestmark = pytest.mark.slow

# a valid value per property name, where the schema alone does not give one
EXAMPLES: dict[Any, Any] = {
    "input": "a short text",
    "query": "a query",
    "documents": ["a document", {"text": "another"}],
    "texts": ["a document", "another"],
    "text_1": "a query",
    "text_2": ["a document", "another"],
    "instruction": "find the passage",
    "prompt": "text: ",
    "user": "someone",
    "separator": " | ",
    "dimensions": 64,
    "top_n": 1,
    ("/v1/contextualizedembeddings", "input"): [["a chunk", "another chunk"], ["one more"]],
    "ids": [101, 7592, 102],  # the bundled model's [CLS] hello [SEP]
    ("/similarity", "inputs"): {"source_sentence": "a query", "sentences": ["a document"]},
    "parameters": {"truncate": True},
    "outputs": ["dense"],
}
# constraints the schema cannot state, left out of the generated cases (with why)
SCHEMA_CANNOT_SAY = {
    ("/v1/embeddings", "prompt_name"),  # the model's prompt names (this one has none)
    ("/tokenize", "prompt_name"),
    *((path, "prompt_name") for path in ("/", "/embed", "/embed_all", "/similarity")),
    # an instruction template (this model has none: a 400, docs/serving.md)
    *((path, "instruction") for path in ("/v1/embeddings", "/v1/rerank", "/v1/score", "/tokenize")),
    # bge-m3's score weights: the model's kind (this one is a dense embedder)
    ("/v1/rerank", "weights"),
    ("/v1/score", "weights"),
}


def validate(value: Any, schema: dict[str, Any], where: str = "$") -> list[str]:
    """What is wrong with `value` under `schema` (the subset of JSON Schema the document uses)."""
    if value is None:
        return [] if schema.get("nullable") else [f"{where}: null not allowed"]
    if "oneOf" in schema:
        fits = [s for s in schema["oneOf"] if not validate(value, s, where)]
        return [] if len(fits) >= 1 else [f"{where}: matches none of oneOf"]
    errors: list[str] = []
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{where}: {value!r} not in {schema['enum']}")
    kind = schema.get("type")
    types = {"string": str, "integer": int, "number": (int, float), "boolean": bool,
             "array": list, "object": dict}  # fmt: skip
    if kind is not None:
        ok = isinstance(value, types[kind]) and not (
            kind in ("integer", "number") and isinstance(value, bool)
        )
        if not ok:
            return [f"{where}: {type(value).__name__} is not {kind}"]
    if isinstance(value, str):
        if len(value) < schema.get("minLength", 0):
            errors.append(f"{where}: shorter than {schema['minLength']}")
        if "pattern" in schema and not re.search(schema["pattern"], value):
            errors.append(f"{where}: does not match {schema['pattern']}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append(f"{where}: below {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            errors.append(f"{where}: above {schema['maximum']}")
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            errors.append(f"{where}: fewer than {schema['minItems']} items")
        if len(value) > schema.get("maxItems", len(value)):
            errors.append(f"{where}: more than {schema['maxItems']} items")
        for i, item in enumerate(value):
            errors += validate(item, schema.get("items", {}), f"{where}[{i}]")
    if isinstance(value, dict):
        props = schema.get("properties", {})
        for key in schema.get("required", ()):
            if key not in value:
                errors.append(f"{where}: missing {key}")
        for key, item in value.items():
            if key in props:
                errors += validate(item, props[key], f"{where}.{key}")
            elif schema.get("additionalProperties") is False:
                errors.append(f"{where}: unknown {key}")
    return errors


def example(name: str, schema: dict[str, Any], path: str = "") -> Any:
    for key in ((path, name), name):
        if key in EXAMPLES:
            return copy.deepcopy(EXAMPLES[key])
    if "default" in schema:
        return schema["default"]
    if "enum" in schema:
        return schema["enum"][0]
    if "oneOf" in schema:
        return example(name, schema["oneOf"][0])
    return {"string": "x", "integer": 1, "boolean": True, "number": 1.0}[schema["type"]]


def broken(schema: dict[str, Any]) -> list[Any]:
    """Values that break one constraint of `schema` each."""
    out: list[Any] = [{"not": "this"}] if schema.get("type") != "object" else ["a string"]
    alternatives = schema.get("oneOf", [schema])
    for s in alternatives:
        if s.get("type") == "string" and s.get("minLength"):
            out.append("")
        if s.get("pattern") == r"\S":
            out.append("   ")
        if s.get("type") == "array" and s.get("minItems"):
            out.append([])
        if "maximum" in s:
            out.append(s["maximum"] + 1)
        if "minimum" in s:
            out.append(s["minimum"] - 1)
    if "enum" in schema:
        out.append("not-one-of-them")
    # a value some alternative accepts is not a break
    return [v for v in out if validate(v, schema)]


def cases(doc: dict[str, Any]) -> list[tuple[str, str, dict[str, Any], bool]]:
    """(path, label, body, schema accepts it)."""
    out = []
    for path, item in doc["paths"].items():
        if "post" not in item:
            continue
        schema = item["post"]["requestBody"]["content"]["application/json"]["schema"]
        props, required = schema["properties"], schema.get("required", [])
        base = {k: example(k, props[k], path) for k in required}
        out.append((path, "required only", base, True))
        out.append((path, "unknown field", {**base, "typo_field": 1}, False))
        for name, prop in props.items():
            if (path, name) in SCHEMA_CANNOT_SAY or name == "model":
                continue
            if name not in required:
                out.append((path, f"{name}=null", {**base, name: None}, True))
                for v in prop.get("enum", []):
                    out.append((path, f"{name}={v!r}", {**base, name: v}, True))
                value = example(name, prop, path)
                out.append((path, f"{name} example", {**base, name: value}, True))
            for v in broken(prop):
                out.append((path, f"{name}={json.dumps(v)[:30]}", {**base, name: v}, False))
    return out


@pytest.fixture(scope="module")
def document(each_served: str) -> dict[str, Any]:
    return get_json(each_served, "/openapi.json")


def get_json(url: str, path: str) -> Any:
    parts = urlparse(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    conn.request("GET", path)
    return json.loads(conn.getresponse().read())


def post(url: str, path: str, body: Any) -> tuple[int, Any]:
    parts = urlparse(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        reply = conn.getresponse()
        return reply.status, json.loads(reply.read())
    finally:
        conn.close()


def test_the_server_does_what_its_openapi_document_says(
    each_served: str, document: dict[str, Any]
) -> None:
    all_cases = cases(document)
    assert len(all_cases) > 150, len(all_cases)
    wrong = []
    for path, label, body, accepted in all_cases:
        # the generator's own view must agree with the validator's
        schema = document["paths"][path]["post"]["requestBody"]["content"]["application/json"]
        assert (not validate(body, schema["schema"])) == accepted, (path, label, body)
        status, reply = post(each_served, path, body)
        if accepted and status != 200:
            wrong.append(f"{path} {label}: the schema accepts it, the server said {status} {reply}")
        elif not accepted and not (400 <= status < 500 and "error" in reply):
            wrong.append(f"{path} {label}: the schema refuses it, the server said {status}")
        elif accepted:
            response = document["paths"][path]["post"]["responses"]["200"]["content"]
            problems = validate(reply, response["application/json"]["schema"])
            if problems:
                wrong.append(f"{path} {label}: the answer breaks its schema: {problems[:3]}")
    assert not wrong, "\n".join(wrong)
