"""How `serve` runs the flags given (`launch.serve_mode`): natively for any of them (several
engines per model, one server per visible GPU or `--replicas`, by server processes behind the
native front), the Python path only when asked; the native path's batch rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from embedserve.cli import launch
from embedserve.cli.launch import serve_configs
from embedserve.cli.main import build_parser
from embedserve.cli.native_models import batch_budget
from embedserve.gateway.main import GatewayConfig
from embedserve.server.main import batch_wait_seconds


def _mode(*flags: str) -> str:
    args = build_parser().parse_args(["serve", *flags])
    return launch.serve_mode(*serve_configs(args))


def test_serve_is_native_for_any_flags_and_the_python_path_only_when_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An engine per model: one process; several engines for a model (`--replicas`, a GPU
    each): server processes behind the native front; `--no-native`: the Python path."""
    for flags in [(), ("--workers", "2"), ("--metrics-port", "9100"),
                  ("--otlp-endpoint", "http://127.0.0.1:4318"), ("--native",),
                  ("--step-timeout", "5", "--max-failed-steps", "2")]:  # fmt: skip
        assert _mode("--device", "cpu", *flags) == launch.ONE_PROCESS, flags
    two = ("--model", "a=minilm", "--model", "b=minilm")
    assert _mode("--device", "cpu", *two) == launch.ONE_PROCESS  # each its own engine
    assert _mode("--device", "cpu", "--replicas", "3") == launch.NATIVE_FRONT
    assert _mode("--device", "cpu", "--no-native") == launch.PYTHON
    assert _mode("--device", "cpu", "--replicas", "3", "--no-native") == launch.PYTHON
    monkeypatch.setattr(launch, "visible_gpus", lambda: 4)
    assert _mode() == launch.NATIVE_FRONT  # an engine per GPU
    assert _mode(*two) == launch.NATIVE_FRONT
    assert _mode("--replicas", "1") == launch.ONE_PROCESS
    assert _mode("--replicas", "1", *two) == launch.ONE_PROCESS


def test_a_model_of_several_cpu_replicas_is_served_by_the_native_front(tmp_path: Path) -> None:
    config = tmp_path / "models.toml"
    config.write_text('[[model]]\nmodel = "minilm"\nreplicas = 2\n')
    assert _mode("--config", str(config), "--device", "cpu") == launch.NATIVE_FRONT


def test_the_batch_wait_is_the_servers_rule() -> None:
    """`--batch-wait-ms` is honoured (Tulip's `BatchWait`), with the server's default: 3 ms on
    the CPU, none on a GPU."""
    assert _mode("--device", "cpu", "--batch-wait-ms", "1") == launch.ONE_PROCESS
    args = build_parser().parse_args(["serve", "--native", "--batch-wait-ms", "1.5"])
    server = serve_configs(args)[0][0]
    assert batch_wait_seconds(server, on_cpu=True) == batch_wait_seconds(server, on_cpu=False)
    assert batch_wait_seconds(server, on_cpu=True) == pytest.approx(0.0015)
    default = serve_configs(build_parser().parse_args(["serve", "--native"]))[0][0]
    assert batch_wait_seconds(default, on_cpu=True) == pytest.approx(0.003)
    assert batch_wait_seconds(default, on_cpu=False) == 0.0


def test_the_batch_budget_is_the_flags_when_given() -> None:
    args = build_parser().parse_args(["serve", "--native", "--max-batch-tokens", "1024"])
    server = serve_configs(args)[0][0]
    assert batch_budget(server, measured=None, engine_tokens=8192) == 1024
    default = serve_configs(build_parser().parse_args(["serve", "--native"]))[0][0]
    assert batch_budget(default, measured=2048, engine_tokens=8192) == 2048
    assert batch_budget(default, measured=None, engine_tokens=8192) == 8192


def test_the_choice_of_three_round_trips() -> None:
    """`--native` / `--no-native` / neither survive `to_argv` (`serve`'s gateway process gets
    them)."""
    for flags, value in (([], None), (["--native"], True), (["--no-native"], False)):
        gateway = serve_configs(build_parser().parse_args(["serve", *flags]))[1]
        assert gateway.native is value
        again = build_parser().parse_args(["gateway", "--replica", "h:1", *gateway.to_argv()])
        assert GatewayConfig.from_args(again).native is value
