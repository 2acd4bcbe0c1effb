"""`serve --native` judges the flags the user gave, not the defaults (faults IV): the workers
counted from the cores (a container reports the host's) are not the user's error; several
engines per model (one server per visible GPU, `--replicas`) are served natively too, by server
processes behind the native front."""

from __future__ import annotations

from pathlib import Path

import pytest

from embedserve.cli import launch
from embedserve.cli.launch import ServeConfig, serve_configs
from embedserve.cli.main import build_parser
from embedserve.cli.native import why_not_native
from embedserve.cli.native_models import batch_budget
from embedserve.server.main import batch_wait_seconds


def _check(*flags: str) -> None:
    args = build_parser().parse_args(["serve", "--native", *flags])
    why = why_not_native(serve_configs(args)[1])
    if why is not None:
        raise ValueError(why)


def test_the_defaults_pass_on_a_machine_of_many_cores_and_gpus(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(launch, "visible_gpus", lambda: 4)
    _check()  # --device auto: the first GPU, one engine
    _check("--device", "cpu")
    _check("--device", "cpu", "--workers", "1", "--replicas", "1")
    _check("--step-timeout", "5", "--max-failed-steps", "2")  # the engine guard's: honoured
    _check("--metrics-port", "9100")  # the engine's metrics, as a server serves them


def test_workers_the_user_gave_are_refused() -> None:
    with pytest.raises(ValueError, match="--workers 2 was given"):
        _check("--device", "cpu", "--workers", "2")
    _check("--device", "cpu", "--replicas", "3")  # servers behind the native front


def test_every_server_and_gateway_flag_is_honoured() -> None:
    """--otlp-endpoint was the last flag refused: Ivy's requests are traced too."""
    assert _why_python("--device", "cpu", "--otlp-endpoint", "http://127.0.0.1:4318") is None


def test_the_batch_wait_is_the_servers_rule() -> None:
    """`--batch-wait-ms` is honoured (Tulip's `BatchWait`), with the server's default: 3 ms on
    the CPU, none on a GPU."""
    _check("--device", "cpu", "--batch-wait-ms", "1")  # not refused
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


def _why_python(*flags: str) -> str | None:
    args = build_parser().parse_args(["serve", *flags])
    return launch.why_python(ServeConfig.from_args(args), *serve_configs(args))


def test_serve_is_native_where_the_native_front_serves_the_flags(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No --native / --no-native: the native front where it serves the flags given, else the
    Python path, and why (said on stderr); --native where it cannot is an error."""
    assert _why_python("--device", "cpu") is None
    assert _why_python("--device", "cpu", "--metrics-port", "9100") is None
    assert _why_python("--device", "cpu", "--no-native") == "--no-native was given"
    assert "--workers 2 was given" in str(_why_python("--device", "cpu", "--workers", "2"))
    two = ("--model", "a=minilm", "--model", "b=minilm")
    assert _why_python("--device", "cpu", *two) is None  # each its own engine
    monkeypatch.setattr(launch, "visible_gpus", lambda: 4)
    assert _why_python() is None  # an engine per GPU, server processes behind the native front
    assert _why_python(*two) is None
    assert _why_python("--native") is None
    assert _why_python("--replicas", "1") is None
    assert _why_python("--replicas", "1", *two) is None


def test_a_model_of_several_cpu_replicas_is_served_natively(tmp_path: Path) -> None:
    """A models file's `replicas` on the CPU: server processes behind the native front."""
    config = tmp_path / "models.toml"
    config.write_text('[[model]]\nmodel = "minilm"\nreplicas = 2\n')
    assert _why_python("--config", str(config), "--device", "cpu") is None
    assert _why_python("--native", "--config", str(config), "--device", "cpu") is None


def test_the_choice_of_three_round_trips() -> None:
    """`--native` / `--no-native` / neither survive `to_argv` (a launcher's child gets them)."""
    for flags, value in (([], None), (["--native"], True), (["--no-native"], False)):
        serve = ServeConfig.from_args(build_parser().parse_args(["serve", *flags]))
        assert serve.native is value
        assert serve.to_argv() == flags
