"""The rules for several models on one machine (`embedserve.memory`), on stated numbers: the
sum checked against a GPU's free memory before the next model loads, the cores shared."""

from __future__ import annotations

import pytest

from embedserve.cli import gpu_memory, launch
from embedserve.cli.main import build_parser
from embedserve.memory import GIB, ModelMemory, check_fits, cpu_thread_shares

A = ModelMemory("minilm", "cuda:0", 2 * GIB, GIB, GIB)  # 4 GiB in all
B = ModelMemory("ms-marco", "cuda:0", 3 * GIB, 0, 2 * GIB)  # 5 GiB


def test_a_model_fits_when_the_sum_does() -> None:
    check_fits("cuda:0", 9 * GIB, [A], B)  # 4 + 5 = 9: exactly fits
    check_fits("cuda:0", 5 * GIB, [], B)


def test_the_error_names_the_model_that_does_not_fit_and_by_how_much() -> None:
    with pytest.raises(ValueError) as e:
        check_fits("cuda:0", 8 * GIB, [A], B)
    message = str(e.value)
    assert message.startswith("model 'ms-marco' does not fit on cuda:0: it needs 5.00 GiB")
    assert "weights 3.00 GiB, workspace 0.00 GiB, batches 2.00 GiB" in message
    assert "beside 'minilm' (4.00 GiB) the models need 9.00 GiB of the 8.00 GiB free" in message
    assert "1.00 GiB short" in message and "max_batch_tokens" in message


def test_a_statement_survives_its_ready_record() -> None:
    assert ModelMemory.from_dict(A.as_dict()) == A and A.as_dict()["total_bytes"] == 4 * GIB


@pytest.mark.parametrize(
    ("cores", "stated", "shares"),
    [
        (2, [None, None], [1, 1]),  # the 2-core machine, two models: one thread each
        (16, [None, None, None], [5, 5, 5]),
        (2, [None, None, None], [1, 1, 1]),  # never below one
        (16, [4, None, None], [4, 6, 6]),  # a server's own count kept, the rest shared
        (4, [4, None], [4, 1]),
    ],
)
def test_cores_are_shared_among_the_cpu_servers(cores: int, stated: list, shares: list) -> None:  # type: ignore[type-arg]
    assert cpu_thread_shares(cores, stated) == shares


def test_serve_gives_each_models_cpu_server_its_share(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launch.os, "cpu_count", lambda: 8)
    flags = ["serve", "--model", "minilm", "--model", "r=/x", "--device", "cpu"]
    servers, _ = launch.serve_configs(build_parser().parse_args(flags))
    assert [s.cpu_threads for s in servers] == [4, 4]
    servers, _ = launch.serve_configs(build_parser().parse_args([*flags, "--replicas", "2"]))
    assert [s.cpu_threads for s in servers] == [2, 2, 2, 2]
    servers, _ = launch.serve_configs(build_parser().parse_args([*flags[:3], "--device", "cpu"]))
    assert [s.cpu_threads for s in servers] == [None]  # one model: torch's default, as before


def ready(memory: ModelMemory, free: int, reserved: int) -> dict:  # type: ignore[type-arg]
    return {"memory": memory.as_dict(), "free_bytes": free, "reserved_bytes": reserved}


def test_serve_checks_the_next_model_before_it_loads(minilm_path) -> None:  # type: ignore[no-untyped-def]
    """`launch.check_memory` on the stated records of the servers already on the GPU (no GPU
    needed: the numbers are the records' and the next model's folder's)."""
    from embedserve.options import EngineOptions
    from embedserve.server.main import ServerConfig

    config = ServerConfig(EngineOptions(model=str(minilm_path), device="cuda:0", dtype="float32"))
    from embedserve.engine.memory import estimate
    from embedserve.loading.spec import read_model_spec

    need = estimate(read_model_spec(minilm_path), "e", "cuda:0", "float32", 8192).total_bytes
    loaded = ModelMemory("/folder/of/r", "cuda:0", GIB, GIB // 2, GIB // 2)
    # free without it: the reading (1 GiB) plus its reserved (1.5 GiB); it states 2 GiB
    room = ready(loaded, GIB, 3 * GIB // 2)
    fits = 3 * GIB // 2 + GIB - 2 * GIB
    assert need < fits
    gpu_memory.check_memory(config, "e", [("r", room)])
    tight = ready(loaded, GIB + need - fits - 1, 3 * GIB // 2)  # one byte short
    with pytest.raises(
        ValueError, match=r"model 'e' does not fit on cuda:0: .*beside 'r' \(2.00 GiB\)"
    ):
        gpu_memory.check_memory(config, "e", [("r", tight)])
    gpu_memory.check_memory(config, "e", [])  # the first model on the GPU: nothing to check beside
    on_cpu = ServerConfig(EngineOptions(model=str(minilm_path), device="cpu"))
    gpu_memory.check_memory(on_cpu, "e", [("r", tight)])  # the CPU: no memory check


def test_servers_on_other_gpus_are_not_counted() -> None:
    from embedserve.options import EngineOptions
    from embedserve.server.main import ServerConfig

    assert gpu_memory.same_gpu("cuda:0", ServerConfig(EngineOptions(device="cuda")))
    assert not gpu_memory.same_gpu("cuda:1", ServerConfig(EngineOptions(device="cuda:0")))
    assert not gpu_memory.same_gpu("cpu", ServerConfig(EngineOptions(device="cpu")))


class FakeChild:
    """A started server as `start_servers` sees it: its ready record."""

    def __init__(self, record: dict) -> None:  # type: ignore[type-arg]
        self.record = record

    def wait_ready(self, timeout: float, cancel: object = None) -> dict:  # type: ignore[type-arg]
        return self.record

    def forget_output(self) -> None:
        pass


def test_with_gpus_a_model_starts_only_once_the_others_there_are_ready_and_it_fits(
    minilm_path,  # type: ignore[no-untyped-def]
) -> None:
    import threading

    from embedserve.options import EngineOptions
    from embedserve.server.main import ServerConfig

    def on(device: str) -> ServerConfig:
        return ServerConfig(EngineOptions(model=str(minilm_path), device=device))

    first = ModelMemory("/m", "cuda:0", GIB, GIB, GIB)
    record = {"address": "127.0.0.1:1", "max_batch_tokens": 8192, **ready(first, GIB, 2 * GIB)}
    started: list[int] = []

    def start(i: int) -> FakeChild:
        started.append(i)
        return FakeChild(record)

    configs, names = [on("cuda:0"), on("cuda:0"), on("cuda:1")], ["a", "a", "b"]
    # b is on another GPU: nothing beside it there, it starts
    readies = launch.start_servers(configs, names, start, threading.Event(), [])
    assert started == [0, 1, 2] and len(readies) == 3
    started.clear()
    # b on the GPU of a's two servers, 3 GiB each stated, 1 + 2 + 2 GiB free without them
    configs[2] = on("cuda:0")
    with pytest.raises(
        ValueError, match=r"model 'b' does not fit on cuda:0: .*beside 'a' \(3.00 GiB\), 'a'"
    ):
        launch.start_servers(configs, names, start, threading.Event(), [])
    assert started == [0, 1]  # b's server never started
