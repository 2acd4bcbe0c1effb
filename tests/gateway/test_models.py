"""Which served model a request goes to (`gateway.models`) and the models from the gateway's
flags (`gateway.served`)."""

from __future__ import annotations

import asyncio
import json

import pytest

from embedserve.gateway.errors import ApiError
from embedserve.gateway.models import ANY, EMBED, SCORE, ServedModel, ServedModels, split_named
from embedserve.gateway.openapi import MODEL_LIST
from embedserve.gateway.requests import Limits
from embedserve.gateway.served import model_entries
from tests.e2e.test_openapi_exact import validate


def served(*models: tuple[str, str]) -> ServedModels:
    return ServedModels(
        [
            ServedModel(Limits(384, 8, (name,), task=task), lambda: None)  # type: ignore[arg-type,return-value]
            for name, task in models
        ]
    )


TWO = served(("minilm", "embed"), ("ms-marco", "score"))


def error(models: ServedModels, body: object, task: str) -> ApiError:
    with pytest.raises(ApiError) as e:
        models.pick(body, task)
    return e.value


def test_model_picks_and_the_only_model_of_a_task_is_the_default() -> None:
    assert TWO.pick({"model": "ms-marco"}, SCORE).name == "ms-marco"
    assert TWO.pick({"model": "minilm"}, SCORE).name == "minilm"  # by cosine
    assert TWO.pick({}, EMBED).name == "minilm"
    assert TWO.pick({}, SCORE).name == "ms-marco"
    assert TWO.pick("not an object", EMBED).name == "minilm"  # the request check says why


def test_wrong_task_unknown_and_ambiguous() -> None:
    e = error(TWO, {"model": "ms-marco"}, EMBED)
    assert (e.status, e.code) == (400, "wrong_model_task") and "embed: minilm" in e.message
    e = error(TWO, {"model": "gpt"}, EMBED)
    assert (e.status, e.code) == (404, "model_not_found")
    assert "available: minilm, ms-marco" in e.message
    e = error(TWO, {}, ANY)
    assert e.status == 400 and e.param == "model" and "minilm, ms-marco" in e.message
    e = error(served(("a", "embed"), ("b", "embed")), {}, EMBED)
    assert e.status == 400 and "'model' is required, one of a, b" in e.message
    assert error(TWO, {"model": 3}, EMBED).code == "invalid_type"


def test_one_model_takes_every_request_as_before() -> None:
    one = served(("minilm", "embed"))
    assert one.pick({"model": "anything"}, EMBED).name == "minilm"  # the request check 404s
    e = error(served(("ms-marco", "score")), {}, EMBED)
    assert e.code == "wrong_model_task" and "use /v1/rerank" in e.message


def test_embedding_routes_pick_models_that_have_the_outputs_asked() -> None:
    def model(name: str, *outputs: str) -> ServedModel:
        return ServedModel(Limits(64, 8, (name,), outputs=outputs), lambda: None)  # type: ignore[arg-type,return-value]

    three = ServedModels([model("splade", "sparse"), model("m3", "dense", "sparse", "multivector"),
                          model("colbert", "multivector")])  # fmt: skip
    assert three.pick({}, EMBED).name == "m3"  # the only one with dense vectors
    assert three.pick({}, EMBED, ("multivector", "dense")).name == "m3"
    assert three.pick({"model": "colbert"}, EMBED, ("multivector",)).name == "colbert"
    with pytest.raises(ApiError) as e:
        three.pick({"model": "colbert"}, EMBED, ("sparse",))
    assert (e.value.status, e.value.code, e.value.param) == (400, "output_not_available", "outputs")
    assert "no sparse output; its outputs are multivector" in e.value.message
    assert "models with them: splade, m3" in e.value.message
    assert "'model' is required, one of splade, m3" in error_of(three, {}, ("sparse",)).message
    alone = ServedModels([model("splade", "sparse")])
    assert "no dense output; its outputs are sparse" in error_of(alone, {}, None).message
    assert alone.models[0].describe()["dimensions"] is None
    assert alone.models[0].describe()["outputs"] == ["sparse"]


def error_of(models: ServedModels, body: object, outputs: tuple[str, ...] | None) -> ApiError:
    with pytest.raises(ApiError) as e:
        models.pick(body, EMBED, outputs)
    return e.value


def test_ready_names_the_models_not_started() -> None:
    assert TWO.not_ready() == ["minilm", "ms-marco"]


def test_split_named_leaves_paths_and_addresses_whole() -> None:
    assert split_named("ms-marco=/m") == ("ms-marco", "/m")
    assert split_named("/a=b/m") == (None, "/a=b/m")
    assert split_named("dns:x:1") == (None, "dns:x:1")
    assert split_named("e=dns:x:1") == ("e", "dns:x:1")


def test_entries_from_flags() -> None:
    (one,) = model_entries(["minilm"], ["m", "alias"], ["127.0.0.1:1", "127.0.0.1:2"])
    assert one.names == ("m", "alias") and one.replicas == ("127.0.0.1:1", "127.0.0.1:2")
    a, b = model_entries(["minilm", "r=/x"], [], ["minilm=h:1", "r=h:2", "r=h:3"])
    hub = ("sentence-transformers/all-MiniLM-L6-v2", "all-MiniLM-L6-v2")
    assert (a.names, a.model, a.replicas) == (("minilm", *hub), "minilm", ("h:1",))
    assert (b.names, b.model, b.replicas) == (("r",), "/x", ("h:2", "h:3"))
    with pytest.raises(ValueError, match="names its model"):
        model_entries(["minilm", "r=/x"], [], ["h:1"])
    with pytest.raises(ValueError, match="no model is served as 'q'"):
        model_entries(["minilm", "r=/x"], [], ["q=h:1"])
    with pytest.raises(ValueError, match="'r' has no --replica"):
        model_entries(["minilm", "r=/x"], [], ["minilm=h:1"])
    with pytest.raises(ValueError, match="same served name"):
        model_entries(["a=minilm", "a=/x"], [], ["a=h:1"])
    with pytest.raises(ValueError, match="--served-model-name"):
        model_entries(["minilm", "r=/x"], ["n"], ["minilm=h:1", "r=h:2"])


def test_the_bundled_model_answers_to_its_hub_names_unless_another_model_has_one() -> None:
    (one,) = model_entries(["minilm"], [], ["h:1"])
    assert one.names == ("minilm", "sentence-transformers/all-MiniLM-L6-v2", "all-MiniLM-L6-v2")
    assert one.names[0] == "minilm"  # the name reported (/v1/models, answers)
    a, b = model_entries(
        ["minilm", "all-MiniLM-L6-v2=/x"], [], ["minilm=h:1", "all-MiniLM-L6-v2=h:2"]
    )
    assert a.names == ("minilm", "sentence-transformers/all-MiniLM-L6-v2")
    assert b.names == ("all-MiniLM-L6-v2",)
    (own,) = model_entries(["minilm=minilm"], [], ["h:1"])  # as `serve` names it
    assert own.names == one.names
    (named,) = model_entries(["m=minilm"], [], ["h:1"])  # another name given: that name only
    assert named.names == ("m",)
    (served,) = model_entries(["minilm"], ["m"], ["h:1"])
    assert served.names == ("m",)


def test_a_model_sets_its_own_limits_the_others_keep_the_gateway_wide_ones() -> None:
    defaults = {"max_inputs": 100, "max_tokens_per_request": 900, "part_tokens": None}
    flags = (["minilm", "r=/x"], [], ["minilm=h:1", "r=h:2"])
    a, b = model_entries(*flags, ["r:max_inputs=4", "r:part_tokens=512"], defaults)
    assert a.limits == defaults
    assert b.limits == {"max_inputs": 4, "max_tokens_per_request": 900, "part_tokens": 512}
    for given, message in [
        ("r=4", "expected NAME:KEY=VALUE"),
        ("q:max_inputs=4", "no model is served as 'q'"),
        ("r:max_batch=4", "'max_batch' is not a per-model limit"),
        ("r:max_inputs=four", "max_inputs must be a positive integer, got 'four'"),
        ("r:max_inputs=0", "max_inputs must be a positive integer, got 0"),
    ]:
        with pytest.raises(ValueError, match=f"--model-limit {given}: {message}"):
            model_entries(*flags, [given], defaults)


def test_v1_models_states_each_models_own_limits() -> None:
    from embedserve.gateway.main import GatewayConfig, build_app

    config = GatewayConfig(
        models=("a=minilm", "b=minilm"),
        replicas=("a=127.0.0.1:1", "b=127.0.0.1:2"),
        max_inputs=64,
        model_limits=("b:max_inputs=4", "b:max_tokens_per_request=1000"),
    )
    app = build_app(config)
    status, _, payload = asyncio.run(app.models(b""))
    listed = json.loads(payload)
    # the answer is what the OpenAPI document says it is (the e2e test's validator)
    assert status == 200 and validate(listed, MODEL_LIST) == []
    a, b = (m["limits"] for m in listed["data"])
    # dense models: no multi-vector answer, so no bound on one (None)
    chunks = {
        "max_chunks_per_document": config.max_chunks_per_document,
        "max_multivector_values": None,
    }
    assert a == {
        "max_inputs": 64,
        "max_tokens_per_request": config.max_tokens_per_request,
        **chunks,
    }
    assert b == {"max_inputs": 4, "max_tokens_per_request": 1000, **chunks}
    assert GatewayConfig.from_args(_parse_gateway(config.to_argv())) == config


def _parse_gateway(argv: list[str]):  # type: ignore[no-untyped-def]
    import argparse

    from embedserve.gateway.main import GatewayConfig

    parser = argparse.ArgumentParser()
    GatewayConfig.add_arguments(parser)
    return parser.parse_args(argv)


def test_a_default_model_per_task_takes_requests_that_name_none() -> None:
    """`--default-model`: the routes and clients that cannot name a model (TEI's, the Hub's
    InferenceClient) reach one when several could answer."""
    models = [("a", "embed"), ("b", "embed"), ("r1", "score"), ("r2", "score")]
    plain = served(*models)
    assert "--default-model embed=NAME" in error(plain, {}, EMBED).message
    assert "--default-model NAME" in error(plain, {}, ANY).message
    chosen = ServedModels(plain.models, ["b", "score=r2"])
    assert chosen.pick({}, EMBED).name == "b"
    assert chosen.pick({}, ANY).name == "b" and chosen.first.name == "b"
    assert chosen.pick({}, SCORE).name == "r2"  # its own task's default, not b by cosine
    assert chosen.pick({"model": "a"}, EMBED).name == "a"  # a named model still wins
    by_cosine = ServedModels(plain.models, ["score=a"])
    assert by_cosine.pick({}, SCORE).name == "a"
    # the same picks as places, for the native front (`Gateway.set_unnamed`); none: the route
    # answers why
    assert (chosen.unnamed(EMBED, ("dense",)), chosen.unnamed(SCORE)) == (1, 3)
    assert (plain.unnamed(EMBED, ("dense",)), plain.unnamed(SCORE)) == (None, None)
    assert TWO.unnamed(EMBED, ("dense",)) == 0 and TWO.unnamed(EMBED, ("sparse",)) is None
    for bad in ("nope", "rank=a", "embed=r1", "classify=a"):
        with pytest.raises(ValueError, match="--default-model"):
            ServedModels(plain.models, [bad])


@pytest.mark.parametrize(
    ("body", "task"),
    [
        ({"inputs": "a text", "model": "minilm"}, "embed"),
        ({"query": "q", "texts": ["a"], "model": "ms-marco"}, "score"),
        ({"query": "q", "texts": ["a"]}, "score"),  # no model: the default (the first) model's
        ({"inputs": "a text", "model": ["not", "a", "name"]}, "score"),
    ],
)
def test_post_root_follows_the_bodys_model(body: dict[str, object], task: str) -> None:
    """Faults IV: `POST /` with several models took the first model's task whatever the body
    named; a TEI embed body for the embedder landed in the reranker's parser."""
    from types import SimpleNamespace

    from embedserve.gateway.dropin import DropInRoutes

    routed: list[str] = []

    async def handler(name: str, body: bytes) -> tuple[int, str, bytes]:
        routed.append(name)
        return 200, "application/json", b"{}"

    reranker_first = served(("ms-marco", "score"), ("minilm", "embed"))
    app = SimpleNamespace(served=reranker_first, max_json_strings=100, max_json_values=1000)
    routes = DropInRoutes(app, lambda b: handler("score", b))  # type: ignore[arg-type]
    routes.root_tasks = {t: (lambda b, t=t: handler(t, b)) for t in ("embed", "score")}  # type: ignore[misc]
    asyncio.run(routes.root(json.dumps(body).encode()))
    assert routed == [task]
