"""Configs own their flags: parse -> config -> argv -> the same config; defaults declared once."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from embedserve.cli.launch import (
    SERVE_GATEWAY_FIXED,
    SERVE_SERVER_FIXED,
    ServeConfig,
    serve_configs,
)
from embedserve.cli.main import build_parser
from embedserve.gateway.main import GatewayConfig
from embedserve.options import EngineOptions
from embedserve.server.main import ServerConfig
from embedserve.server.scheduler import SchedulerConfig


def parse(config: type, argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(exit_on_error=False)
    config.add_arguments(parser)  # type: ignore[attr-defined]
    return parser.parse_args(argv)


def test_server_flags_round_trip_through_argv() -> None:
    args = parse(
        ServerConfig,
        [
            *("--model", "/m", "--device", "cuda:1", "--dtype", "float16"),
            *("--pooling", "last", "--attention", "causal", "--attention-backend", "varlen"),
            *("--port", "0", "--max-batch-tokens", "4096", "--batch-wait-ms", "0.5"),
            *("--metrics-port", "9100", "--drain-seconds", "5"),
        ],
    )
    config = ServerConfig.from_args(args)
    assert config.engine == EngineOptions(
        model="/m",
        device="cuda:1",
        dtype="float16",
        pooling="last",
        attention="causal",
        attention_backend="varlen",
    )
    assert (config.port, config.batch_wait_ms, config.metrics_port) == (0, 0.5, 9100)
    assert config.scheduler(8192) == SchedulerConfig(4096, SchedulerConfig.max_queued_tokens)
    assert ServerConfig.from_args(parse(ServerConfig, config.to_argv())) == config
    assert ServerConfig().to_argv() == []  # defaults are not repeated on a command line


def test_gateway_flags_round_trip_through_argv() -> None:
    argv = ["--replica", "a:1", "--replica", "b:2", "--served-model-name", "x", "--workers", "2"]
    config = GatewayConfig.from_args(parse(GatewayConfig, argv))
    assert config.replicas == ("a:1", "b:2")
    assert config.served_model_names == ("x",)
    assert config.to_argv() == argv
    with pytest.raises(SystemExit):  # the required --replica
        parse(GatewayConfig, [])


def test_part_tokens_keeps_its_old_name_chunk_tokens_as_a_deprecated_alias(
    capsys: pytest.CaptureFixture[str],
) -> None:
    new = GatewayConfig.from_args(parse(GatewayConfig, ["--replica", "a:1", "--part-tokens", "64"]))
    assert capsys.readouterr().err == ""
    old = GatewayConfig.from_args(
        parse(GatewayConfig, ["--replica", "a:1", "--chunk-tokens", "64"])
    )
    assert "--chunk-tokens is deprecated; use --part-tokens" in capsys.readouterr().err
    assert old == new and new.part_tokens == 64
    assert new.to_argv() == ["--replica", "a:1", "--part-tokens", "64"]  # the new name out


def test_the_batch_budget_defaults_to_the_engines() -> None:
    server = ServerConfig()
    assert server.scheduler(8192) == SchedulerConfig(8192, SchedulerConfig.max_queued_tokens)
    assert server.scheduler(2048).max_batch_tokens == 2048


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: EngineOptions(attention="sideways"), "attention must be one of causal"),
        (lambda: EngineOptions(pooling="max"), "pooling must be one of mean, cls, last"),
        (lambda: ServerConfig(port=70000), r"port must be in \[0, 65535\]"),
        (lambda: ServerConfig(max_batch_tokens=0), "max_batch_tokens"),
        (lambda: ServerConfig(batch_wait_ms=-1), "batch_wait_ms must be >= 0"),
        (lambda: ServerConfig(max_multivector_values=0), "max_multivector_values must be positive"),
        (lambda: GatewayConfig(replicas=()), "at least one --replica"),
        (lambda: GatewayConfig(replicas=("nohost",)), "HOST:PORT"),
        (lambda: GatewayConfig(replicas=("a:1",), part_tokens=0), "part_tokens must be positive"),
        (lambda: ServeConfig(num_replicas=-1), "--replicas must be 0"),
    ],
)
def test_configs_refuse_bad_values(make: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()  # type: ignore[operator]


def test_serve_shares_one_flag_set_between_its_servers_and_gateway() -> None:
    args = build_parser().parse_args(
        [
            *("serve", "--model", "/m", "--port", "9000", "--host", "0.0.0.0", "--device", "cpu"),
            *("--drain-seconds", "7", "--replicas", "2", "--attention", "bidirectional"),
            *("--max-inputs", "10", "--max-queued-tokens", "5000", "--metrics-port", "9100"),
        ]
    )
    servers, gateway = serve_configs(args)
    # --host / --port are the gateway's; the servers listen on 127.0.0.1, any free port
    assert (gateway.host, gateway.port, gateway.max_inputs) == ("0.0.0.0", 9000, 10)
    assert gateway.replicas == ("127.0.0.1:0", "127.0.0.1:0")
    assert gateway.model == "/m" and gateway.drain_seconds == 7
    assert [s.to_argv() for s in servers] == [
        [
            *("--model", "/m", "--device", "cpu", "--attention", "bidirectional"),
            *("--port", "0", "--max-queued-tokens", "5000", "--metrics-port", str(port)),
            *("--drain-seconds", "7.0"),
        ]
        for port in (9100, 9101)
    ]
    assert set(SERVE_SERVER_FIXED) <= {f.name for f in dataclasses.fields(ServerConfig)}
    assert set(SERVE_GATEWAY_FIXED) <= {f.name for f in dataclasses.fields(GatewayConfig)}


def test_serve_gives_its_servers_the_gateways_multivector_bound() -> None:
    """One --max-multivector-values bounds both: the gateway's requests and each server's
    calls (a gateway's bound above its servers' would make them refuse what it let through)."""
    flags = ["serve", "--model", "/m", "--device", "cpu", "--max-multivector-values", "4096"]
    servers, gateway = serve_configs(build_parser().parse_args(flags))
    assert gateway.max_multivector_values == 4096
    assert [s.max_multivector_values for s in servers] == [4096]
    assert servers[0].to_argv()[-2:] == ["--max-multivector-values", "4096"]
    server = ServerConfig.from_args(parse(ServerConfig, ["--max-multivector-values", "64"]))
    assert server.max_multivector_values == 64


def test_serve_starts_one_server_per_visible_gpu_by_default(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from embedserve.cli import launch

    def configs(*flags: str):  # type: ignore[no-untyped-def]
        return serve_configs(build_parser().parse_args(["serve", "--model", "/m", *flags]))

    monkeypatch.setattr(launch, "visible_gpus", lambda: 0)
    servers, gateway = configs()  # a CPU machine: one server
    assert [s.engine.device for s in servers] == ["cpu"] and len(gateway.replicas) == 1
    monkeypatch.setattr(launch, "visible_gpus", lambda: 2)
    servers, gateway = configs()
    assert [s.engine.device for s in servers] == ["cuda:0", "cuda:1"]
    assert len(gateway.replicas) == 2
    servers, _ = configs("--replicas", "3")  # more than the GPUs: round-robin
    assert [s.engine.device for s in servers] == ["cuda:0", "cuda:1", "cuda:0"]
    servers, _ = configs("--device", "cuda:1")  # a named device: one server on it
    assert [s.engine.device for s in servers] == ["cuda:1"]
    with pytest.raises(ValueError, match="--replicas must be 0"):
        configs("--replicas", "-1")


def test_embed_serve_and_server_take_the_same_engine_flags() -> None:
    engine = ["--model", "/m", "--attention", "causal", "--attention-backend", "sdpa_loop"]
    for command in (["embed", "x"], ["serve"], ["server"]):
        args = build_parser().parse_args([*command, *engine])
        assert EngineOptions.from_args(args) == EngineOptions(
            model="/m", attention="causal", attention_backend="sdpa_loop"
        )
