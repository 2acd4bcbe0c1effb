"""text-embeddings-inference's HTTP API: its request bodies read into our jobs, and its answers.

- `POST /embed`: `inputs` (a string, strings, token ids or lists of them), `normalize` (true),
  `truncate` (false) with `truncation_direction` (`Right` cuts the end off, `Left` the
  beginning), `prompt_name`, `dimensions`; answers one float list per input, always a batch.
- `POST /embed_all`: the same but `dimensions` (`normalize` is taken and ignored, as TEI does);
  per input, one row per token (special tokens included): the final hidden states, raw.
- `POST /similarity`: `inputs: {source_sentence, sentences}` and the options of `/embed` that
  apply to a cosine (at the top level or in `parameters`); one cosine per sentence.
- `POST /decode`: `ids` (one list of token ids, or several), `skip_special_tokens` (true);
  one text per list.
- `GET /info`: the model and the limits, in TEI's shape.

As with the other shapes, only what is particular to HTTP is checked here; the values go to the
request core as sent, so the messages are the offline API's.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from embedserve.core.inputs import InputPreparer
from embedserve.gateway.errors import bad_request
from embedserve.gateway.requests import EmbedJob, Limits, check_object, input_value
from embedserve.gateway.scoring import flag, tei_truncate

TRUNCATION_FIELDS = ("truncate", "truncation_direction", "prompt_name")
EMBED_FIELDS = frozenset({"inputs", "normalize", "dimensions", *TRUNCATION_FIELDS})
# NOTE: `normalize` is taken and ignored, as TEI does (tei-client sends it): token states are raw
EMBED_ALL_FIELDS = frozenset({"inputs", "normalize", *TRUNCATION_FIELDS})
SIMILARITY_FIELDS = frozenset({"inputs", "parameters", "dimensions", *TRUNCATION_FIELDS})
SIMILARITY_INPUT_FIELDS = frozenset({"source_sentence", "sentences"})
DECODE_FIELDS = frozenset({"ids", "skip_special_tokens"})
try:  # NOTE: not `embedserve.__version__`: the package's __init__ imports the engine
    VERSION = metadata.version("embedserve")
except metadata.PackageNotFoundError:  # run from a source tree that was never installed
    VERSION = "unknown"
# TEI's pooling names for ours (tei-client checks them against its list)
TEI_POOLING = {"mean": "mean", "cls": "cls", "last": "last_token"}


def parse_embed(body: Any, limits: Limits, inputs: InputPreparer) -> EmbedJob:
    """`/embed` (and `POST /` for an embedding model): float vectors, whatever the folder's
    native output (TEI has no other encodings)."""
    body = check_object(body, EMBED_FIELDS)
    options = inputs.options(truncate=tei_truncate(body), prompt_name=body.get("prompt_name"))
    head = inputs.head(body.get("dimensions"), body.get("normalize"), "float32")
    return EmbedJob(input_value(body, limits, key="inputs"), options, head, "float")


def parse_embed_all(body: Any, limits: Limits, inputs: InputPreparer) -> EmbedJob:
    """`/embed_all`: the head is unused (token rows come back raw)."""
    body = check_object(body, EMBED_ALL_FIELDS)
    flag(body, "normalize")  # a bool or null, like /embed's
    options = inputs.options(truncate=tei_truncate(body), prompt_name=body.get("prompt_name"))
    return EmbedJob(
        input_value(body, limits, key="inputs"),
        options,
        inputs.head(None, False, "float32"),
        "float",
    )


def parse_similarity(body: Any, limits: Limits, inputs: InputPreparer) -> EmbedJob:
    """`/similarity`: one job of the source sentence first, then the sentences."""
    body = check_object(body, SIMILARITY_FIELDS)
    options = dict(body)
    nested = body.get("parameters")
    if nested is not None:  # huggingface_hub sends `parameters` (its empty object, often)
        for key, value in check_object(nested, frozenset(TRUNCATION_FIELDS)).items():
            if options.get(key) is not None:
                raise bad_request(f"{key!r} is given twice", param=key, code="conflict")
            options[key] = value
    pair = input_value(body, limits, key="inputs")
    if not isinstance(pair, dict):
        raise bad_request(
            "'inputs' must be an object {source_sentence, sentences}",
            param="inputs",
            code="invalid_type",
        )
    check_object(pair, SIMILARITY_INPUT_FIELDS)
    source, sentences = pair.get("source_sentence"), pair.get("sentences")
    if not isinstance(source, str):
        raise bad_request(
            "inputs.source_sentence must be a string", param="source_sentence", code="invalid_type"
        )
    if not isinstance(sentences, list) or not sentences:
        raise bad_request(
            "inputs.sentences must be a non-empty list of strings",
            param="sentences",
            code="invalid_type",
        )
    if len(sentences) + 1 > limits.max_inputs:
        raise bad_request(
            f"inputs.sentences has {len(sentences)} items, over the limit of "
            f"{limits.max_inputs - 1} (with the source sentence, {limits.max_inputs})",
            param="sentences",
            code="too_many_inputs",
        )
    truncate = tei_truncate(options)
    prompt = inputs.options(truncate=truncate, prompt_name=options.get("prompt_name"))
    head = inputs.head(body.get("dimensions"), True, "float32")
    return EmbedJob([source, *sentences], prompt, head, "float")


def cosines(vectors: np.ndarray) -> list[float]:
    """The cosine of the first row (unit vectors) with each of the others."""
    return [float(x) for x in vectors[1:] @ vectors[0]]


def parse_decode(body: Any, vocab_size: int) -> tuple[list[list[int]], bool]:
    """(lists of token ids, skip_special_tokens) of a `/decode` body."""
    body = check_object(body, DECODE_FIELDS)
    ids = body.get("ids")
    if ids is None:
        raise bad_request("'ids' is required", param="ids", code="missing_required_parameter")
    batch = ids if isinstance(ids, list) and ids and isinstance(ids[0], list) else [ids]
    for i, seq in enumerate(batch):
        if not isinstance(seq, list) or not seq:
            raise bad_request(
                "'ids' must be a non-empty list of token ids, or a list of them",
                param="ids",
                code="invalid_type",
            )
        for token in seq:
            if not isinstance(token, int) or isinstance(token, bool):
                raise bad_request(
                    f"ids[{i}] holds {token!r}, not a token id", param="ids", code="invalid_type"
                )
            if not 0 <= token < vocab_size:
                raise bad_request(
                    f"token id {token} is outside this model's vocabulary (0 … {vocab_size - 1})",
                    param="ids",
                    code="invalid_token_id",
                )
    skip = body.get("skip_special_tokens")
    return batch, True if skip is None else flag(body, "skip_special_tokens")


@functools.lru_cache(maxsize=4)
def _decoder(path: Path) -> Tokenizer:
    # NOTE: a tokenizer of its own, loaded on the first /decode: the request core's tokenizers
    # are set up for encoding (truncation, padding) and are not ours to reach into
    return Tokenizer.from_file(str(path))


def decode(folder: Path, batch: list[list[int]], skip_special_tokens: bool) -> list[str]:
    tokenizer = _decoder(folder / "tokenizer.json")
    return list(tokenizer.decode_batch(batch, skip_special_tokens=skip_special_tokens))


@dataclass(frozen=True)
class InfoFacts:
    """What `/info` reports that the request limits do not hold."""

    pooling: str  # ours: mean, cls, last
    max_input_length: int
    max_batch_tokens: int  # tokens per server call (--part-tokens)
    tokenization_workers: int
    labels: tuple[str, ...] = ()  # a classifier's, in id order


def info_body(model: str, limits: Limits, facts: InfoFacts) -> dict[str, Any]:
    """TEI's `/info`. `model_dtype` is "auto": the servers choose it per device (their
    `--dtype`), and a gateway in front of several does not know theirs."""
    if limits.task == "embed":
        model_type: dict[str, Any] = {
            "embedding": {"pooling": TEI_POOLING.get(facts.pooling, facts.pooling)}
        }
    elif limits.task == "classify" and facts.labels:  # TEI's classifier: its labels
        id2label = {str(i): label for i, label in enumerate(facts.labels)}
        label2id = {label: i for i, label in enumerate(facts.labels)}
        model_type = {"classifier": {"id2label": id2label, "label2id": label2id}}
    else:  # TEI reports a reranker's one label
        model_type = {"reranker": {"id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}}}
    return {
        "model_id": model,
        "model_sha": None,
        "model_dtype": "auto",
        "model_type": model_type,
        "max_concurrent_requests": None,
        "max_input_length": facts.max_input_length,
        "max_batch_tokens": facts.max_batch_tokens,
        "max_batch_requests": None,
        "max_client_batch_size": limits.max_inputs,
        "auto_truncate": False,
        "tokenization_workers": facts.tokenization_workers,
        "version": VERSION,
        "sha": None,
        "docker_label": None,
    }


def token_rows(states: list[np.ndarray]) -> list[np.ndarray]:
    """`/embed_all`'s answer: per input, its [tokens, width] rows (orjson writes them whole)."""
    return [np.ascontiguousarray(s, dtype=np.float32) for s in states]


def is_similarity(body: Any) -> bool:
    """`POST /` on an embedding model: a sentence-similarity body (`inputs` an object), which
    `huggingface_hub.InferenceClient.sentence_similarity` posts there, rather than `/embed`'s."""
    return isinstance(body, dict) and isinstance(body.get("inputs"), dict)
