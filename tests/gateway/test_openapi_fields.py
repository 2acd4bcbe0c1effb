"""Each request body `/openapi.json` publishes names the fields its route's parser accepts, no
more and no fewer: the document is built from field lists, the parsers check their own sets."""

from __future__ import annotations

import json

from embedserve.gateway import classify, cohere, output_bodies, requests, scoring, tei
from tests.gateway.test_openapi_snapshot import CLASSIFIER, M3, served_document

ACCEPTED = {
    "/v1/embeddings": requests.EMBEDDINGS_FIELDS,
    "/v1/contextualizedembeddings": requests.CONTEXTUAL_FIELDS,
    "/tokenize": requests.TOKENIZE_FIELDS,
    "/v1/rerank": scoring.RERANK_FIELDS,
    "/rerank": scoring.TEI_RERANK_FIELDS,
    "/v1/score": scoring.SCORE_FIELDS,
    "/predict": classify.PREDICT_FIELDS,
    "/classify": classify.CLASSIFY_FIELDS,
    "/embed": tei.EMBED_FIELDS,
    "/embed_all": tei.EMBED_ALL_FIELDS,
    "/embed_sparse": output_bodies.EMBED_SPARSE_FIELDS,
    "/similarity": tei.SIMILARITY_FIELDS,
    "/decode": tei.DECODE_FIELDS,
    # Cohere v2 also takes `inputs` (content lists) in place of `texts`; the document shows
    # `texts` only, as Cohere's own reference leads with it
    "/v2/embed": cohere.EMBED_FIELDS - {"inputs"},
    "/v2/rerank": cohere.RERANK_FIELDS,
}


def test_every_published_request_names_the_fields_its_route_accepts() -> None:
    paths = {
        **json.loads(served_document([M3]))["paths"],
        **json.loads(served_document([CLASSIFIER]))["paths"],
    }
    bodies = {
        path: item["post"]["requestBody"]["content"]["application/json"]["schema"]
        for path, item in paths.items()
        if "requestBody" in item.get("post", {})
    }
    assert set(bodies) == set(ACCEPTED) | {"/"}
    for path, accepted in ACCEPTED.items():
        assert set(bodies[path]["properties"]) == accepted, path
        assert bodies[path]["additionalProperties"] is False, path
