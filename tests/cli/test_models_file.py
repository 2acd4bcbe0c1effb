"""`serve --config models.toml`: each model's own name, device, dtype, replicas and limits, the
keys' types and defaults those of the flags (declared once), and errors naming file and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from embedserve.cli.launch import serve_configs
from embedserve.cli.main import build_parser
from embedserve.cli.models_file import read_models_file
from embedserve.server.main import ServerConfig

TWO = """
[[model]]
name = "minilm"
model = "minilm"
device = "cpu"
max_batch_tokens = 1024
max_inputs = 64

[[model]]
name = "ranker"
model = "/models/ranker"
device = "cuda:1"
dtype = "float16"
replicas = 2
max_queued_tokens = 5000
part_tokens = 512
"""


def configs(tmp_path: Path, text: str, *flags: str):  # type: ignore[no-untyped-def]
    path = tmp_path / "models.toml"
    path.write_text(text)
    return serve_configs(build_parser().parse_args(["serve", "--config", str(path), *flags]))


def test_each_model_gets_its_own_servers_and_limits(tmp_path: Path) -> None:
    servers, gateway = configs(tmp_path, TWO, "--max-inputs", "100", "--batch-wait-ms", "2")
    assert [(s.engine.model, s.engine.device, s.engine.dtype) for s in servers] == [
        ("minilm", "cpu", None),
        ("/models/ranker", "cuda:1", "float16"),
        ("/models/ranker", "cuda:1", "float16"),
    ]
    assert [s.max_batch_tokens for s in servers] == [1024, None, None]
    assert [s.max_queued_tokens for s in servers] == [ServerConfig.max_queued_tokens, 5000, 5000]
    assert {s.batch_wait_ms for s in servers} == {2.0}  # a flag the file leaves out: every model's
    assert gateway.models == ("minilm=minilm", "ranker=/models/ranker")
    assert gateway.replicas == ("minilm=127.0.0.1:0", "ranker=127.0.0.1:0", "ranker=127.0.0.1:0")
    minilm, ranker = gateway.entries
    assert (minilm.limits["max_inputs"], ranker.limits["max_inputs"]) == (64, 100)
    assert (minilm.limits["part_tokens"], ranker.limits["part_tokens"]) == (None, 512)


def test_a_model_without_a_key_takes_the_flag_default(tmp_path: Path) -> None:
    servers, gateway = configs(tmp_path, '[[model]]\nmodel = "minilm"\n')
    (alone,) = servers
    cli_servers, cli_gateway = serve_configs(build_parser().parse_args(["serve"]))
    assert alone == cli_servers[0] and gateway.entries[0].limits == cli_gateway.entries[0].limits
    # the name defaults to the model's own, the bundled model's Hub names beside it
    assert gateway.model_names == (
        "minilm",
        "sentence-transformers/all-MiniLM-L6-v2",
        "all-MiniLM-L6-v2",
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '[[model]]\nmodel = "minilm"\nmax_batch = 4\n',
            r"\[\[model\]\] 1 \(minilm\): unknown key 'max_batch'",
        ),
        (
            '[[model]]\nmodel = "minilm"\nreplicas = "2"\n',
            r"\(minilm\): key 'replicas' must be an integer, got str '2'",
        ),
        (
            '[[model]]\nmodel = "minilm"\nmax_inputs = true\n',
            r"key 'max_inputs' must be an integer, got bool",
        ),
        ('[[model]]\nmodel = "minilm"\ndevice = 0\n', r"key 'device' must be a string, got int 0"),
        (
            '[[model]]\nname = "a"\nmodel = "minilm"\n[[model]]\nname = "a"\nmodel = "/x"\n',
            r"\[\[model\]\] 2 \(a\): name 'a' is taken by .*\[\[model\]\] 1 \(a\)",
        ),
        (
            '[[model]]\nmodel = "minilm"\n[[model]]\nmodel = "minilm"\n',
            r"\[\[model\]\] 2 \(minilm\): name 'minilm' is taken",
        ),
        ('[[model]]\nname = "a"\n', r"\[\[model\]\] 1: key 'model' .* is required"),
        (
            '[[model]]\nname = "a=b"\nmodel = "minilm"\n',
            r"\[\[model\]\] 1: key 'name' must be .* without",
        ),
        (
            'port = 80\n[[model]]\nmodel = "minilm"\n',
            r"unknown key 'port'; the file holds \[\[model\]\] tables only",
        ),
        ('[model]\nmodel = "minilm"\n', r"expected one or more \[\[model\]\] tables"),
        ("[[model]]\nmodel = minilm\n", r"not valid TOML"),
        ('[[model]]\nmodel = "minilm"\nreplicas = -1\n', r"\(minilm\): --replicas must be 0"),
        (
            '[[model]]\nmodel = "minilm"\nmax_inputs = 0\n',
            r"\(minilm\): key 'max_inputs' must be positive, got 0",
        ),
        ('[[model]]\nmodel = "minilm"\npooling = "maxx"\n', r"\(minilm\): pooling must be one of"),
    ],
)
def test_bad_files_name_the_file_the_model_and_the_key(
    tmp_path: Path, text: str, message: str
) -> None:
    with pytest.raises(ValueError, match=message) as e:
        configs(tmp_path, text)
    assert str(tmp_path / "models.toml") in str(e.value)


def test_config_and_model_flags_do_not_mix(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="names the models: leave out --model"):
        configs(tmp_path, TWO, "--model", "minilm")
    with pytest.raises(ValueError, match="cannot read it"):
        read_models_file(tmp_path / "missing.toml")


def test_the_example_in_the_docs_reads() -> None:
    """docs/serving.md's models file, as written there, is one this reader takes."""
    doc = (Path(__file__).parents[2] / "docs" / "serving.md").read_text()
    text = doc.split("```toml\n", 1)[1].split("```", 1)[0]
    names = [s.name for s in read_models_file_text(text)]
    assert names == ["minilm", "ms-marco"]


def read_models_file_text(text: str):  # type: ignore[no-untyped-def]
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
        f.write(text)
    return read_models_file(f.name)


def test_each_model_splits_requests_at_its_own_servers_batch(tmp_path: Path) -> None:
    from embedserve.cli.serve_options import with_part_tokens

    _, gateway = configs(tmp_path, TWO)  # the ranker sets part_tokens = 512 itself
    done = with_part_tokens(gateway, ["minilm", "ranker", "ranker"], [1024, 8192, 4096])
    assert done.part_tokens == 1024  # the gateway-wide value: the smallest batch
    minilm, ranker = done.entries
    assert (minilm.limits["part_tokens"], ranker.limits["part_tokens"]) == (1024, 512)
    one = serve_configs(build_parser().parse_args(["serve"]))[1]
    assert with_part_tokens(one, ["minilm"], [2048]).model_limits == ()  # one model: as before


def test_serve_bounds_calls_in_flight_only_in_front_of_gpu_servers() -> None:
    from embedserve.cli.launch import _gateway_in_front

    one = serve_configs(build_parser().parse_args(["serve"]))[1]
    ready = [{"address": "127.0.0.1:1", "max_batch_tokens": 2048}]

    def bound(gateway: object, device: str) -> int | None:
        return _gateway_in_front(gateway, [""], ["minilm"], ready, [device]).calls_in_flight  # type: ignore[arg-type]

    assert bound(one, "cpu") == 0  # a CPU server's own batching merges better
    assert bound(one, "cuda:0") is None  # the gateway's default (CALLS_IN_FLIGHT)
    given = serve_configs(build_parser().parse_args(["serve", "--calls-in-flight", "3"]))[1]
    assert bound(given, "cpu") == 3  # what the user set wins
