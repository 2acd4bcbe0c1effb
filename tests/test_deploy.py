"""The Kubernetes manifests under deploy/kubernetes: every resource valid against the Kubernetes
schemas (strict: no unknown fields), offline, with `kubernetes-validate`; every container's
command line one that `embedserve` itself accepts, and the probes on the ports it serves."""

from __future__ import annotations

from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")
kv = pytest.importorskip("kubernetes_validate")

from embedserve.cli.main import build_parser  # noqa: E402

DEPLOY = Path(__file__).resolve().parents[1] / "deploy" / "kubernetes"
KUBERNETES = "1.30.0"  # the oldest release these manifests are checked against, and the newest
MANIFESTS = sorted(DEPLOY.glob("*.yaml"))
# the two-model example: its own folder (`kubectl apply -f` it beside the volume and secret)
TWO_MODELS = sorted((DEPLOY / "two-models").glob("*.yaml"))


def resources(manifests: list[Path] = MANIFESTS) -> list[tuple[str, dict]]:  # type: ignore[type-arg]
    out = []
    for path in manifests:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                out.append((path.name, doc))
    return out


def containers(kind: str) -> list[dict]:  # type: ignore[type-arg]
    return [
        c
        for _, doc in resources()
        if doc["kind"] == "Deployment" and doc["metadata"]["name"] == f"embedserve-{kind}"
        for c in doc["spec"]["template"]["spec"]["containers"]
    ]


def test_there_are_manifests() -> None:
    kinds = {(doc["kind"], doc["metadata"]["name"]) for _, doc in resources()}
    assert {("Deployment", "embedserve-server"), ("Deployment", "embedserve-gateway")} <= kinds
    assert ("Service", "embedserve-servers") in kinds and ("Service", "embedserve") in kinds


@pytest.mark.parametrize("version", [KUBERNETES, "1.37.0"])
def test_every_resource_is_valid(version: str) -> None:
    for name, doc in resources(MANIFESTS + TWO_MODELS):
        try:
            kv.validate(doc, version, strict=True)
        except kv.ValidationError as e:
            raise AssertionError(f"{name}: {doc['kind']} {doc['metadata']['name']}: {e}") from None


def test_a_broken_manifest_is_caught() -> None:
    _, doc = next(r for r in resources() if r[1]["kind"] == "Deployment")
    broken = {**doc, "spec": {**doc["spec"], "replicas": "two"}}
    with pytest.raises(kv.ValidationError):
        kv.validate(broken, KUBERNETES, strict=True)


@pytest.mark.parametrize("kind", ["server", "gateway"])
def test_container_commands_are_real_embedserve_command_lines(kind: str) -> None:
    from embedserve.gateway.main import GatewayConfig
    from embedserve.server.main import ServerConfig

    (container,) = containers(kind)
    argv = container["args"]
    assert argv[0] == "embedserve" and argv[1] == kind
    args = build_parser().parse_args(argv[1:])
    config = (ServerConfig if kind == "server" else GatewayConfig).from_args(args)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    if kind == "server":
        assert config.port == ports["grpc"] == container["readinessProbe"]["grpc"]["port"]
        assert config.host == "0.0.0.0" and config.link_secret_file is not None
    else:
        assert config.port == ports["http"]
        assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
        (replica,) = config.replicas
        assert replica == "dns:embedserve-servers:50051"  # the headless Service


def test_two_models_one_gateway_each_models_servers_behind_their_own_service() -> None:
    from embedserve.gateway.main import GatewayConfig
    from embedserve.server.main import ServerConfig

    docs = [doc for _, doc in resources(TWO_MODELS)]
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    assert set(deployments) == {"embedserve-embedder", "embedserve-reranker", "embedserve-gateway"}
    for model in ("embedder", "reranker"):
        pods = deployments[f"embedserve-{model}"]["spec"]["template"]
        (container,) = pods["spec"]["containers"]
        config = ServerConfig.from_args(build_parser().parse_args(container["args"][1:]))
        assert config.engine.model == f"/models/{model}"
        assert container["readinessProbe"]["grpc"]["port"] == config.port
        service = services[f"embedserve-{model}"]["spec"]
        assert service["clusterIP"] == "None"  # headless: every ready pod's address
        assert service["selector"].items() <= pods["metadata"]["labels"].items()
        other = "reranker" if model == "embedder" else "embedder"
        assert service["selector"]["embedserve.dev/model"] != other  # one model's pods only
    (gateway,) = deployments["embedserve-gateway"]["spec"]["template"]["spec"]["containers"]
    config = GatewayConfig.from_args(build_parser().parse_args(gateway["args"][1:]))
    embedder, reranker = config.entries
    assert embedder.replicas == ("dns:embedserve-embedder:50051",)
    assert reranker.replicas == ("dns:embedserve-reranker:50051",)
    assert (
        reranker.limits["max_inputs"] == 256 and embedder.limits["max_inputs"] == config.max_inputs
    )
    assert gateway["startupProbe"]["httpGet"]["path"] == "/ready"
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/health"
