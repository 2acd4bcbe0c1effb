"""The gateway -> server link secret: calls without it are UNAUTHENTICATED (health stays open),
a server bound wider than loopback needs it (or --insecure-link), the unix socket is 0600."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from embedserve.contract import add_embed_service, embed_stub
from embedserve.contract.secret import LinkSecretInterceptor, call_metadata, read_secret
from embedserve.server.main import ServerConfig
from tests.server.test_service import FakeEngine, req, seam

SECRET = "a-link-secret-of-some-length"


def test_calls_need_the_secret_and_health_does_not() -> None:
    from embedserve.server.scheduler import SchedulerConfig
    from embedserve.server.service import EmbedService

    async def main() -> None:
        service = EmbedService(seam(FakeEngine()), SchedulerConfig(64, 1024))
        server = grpc.aio.server(interceptors=[LinkSecretInterceptor(SECRET)])
        add_embed_service(server, service.embed)
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await service.start()
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = embed_stub(channel)
                for metadata in ((), call_metadata("wrong-secret-wrong-secret")):
                    with pytest.raises(grpc.aio.AioRpcError) as refused:
                        await stub(req([1, 2]), timeout=5, metadata=metadata)
                    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
                reply: Any = await stub(req([1, 2]), timeout=5, metadata=call_metadata(SECRET))
                assert list(reply.shape) == [1, 8]
                check = health_pb2_grpc.HealthStub(channel).Check
                assert (await check(health_pb2.HealthCheckRequest(), timeout=5)) is not None
            # the gateway's replicas send it on their gRPC calls
            from embedserve.gateway.errors import ApiError
            from embedserve.gateway.replicas import ReplicaPool

            for secret, ok in ((SECRET, True), (None, False)):
                pool = ReplicaPool([f"127.0.0.1:{port}"], secret=secret, health_interval=0.05)
                await pool.start()
                try:
                    for _ in range(100):  # until a health check has passed
                        if pool.num_healthy:
                            break
                        await asyncio.sleep(0.02)
                    if ok:
                        assert list((await pool.embed(req([3, 4]), 2)).shape) == [1, 8]
                    else:
                        with pytest.raises(ApiError, match="UNAUTHENTICATED"):
                            await pool.embed(req([3, 4]), 2)
                finally:
                    await pool.close()
        finally:
            await server.stop(0)
            await service.stop()

    asyncio.run(main())


def test_a_server_bound_wide_needs_a_secret(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--link-secret-file PATH"):
        ServerConfig(host="0.0.0.0")
    assert ServerConfig(host="0.0.0.0", insecure_link=True).insecure_link
    secret_file = tmp_path / "secret"
    secret_file.write_text("short\n")
    assert ServerConfig(host="0.0.0.0", link_secret_file=str(secret_file))
    with pytest.raises(ValueError, match="at least 16 characters"):
        read_secret(str(secret_file))
    secret_file.write_text(SECRET + "\n")
    assert read_secret(str(secret_file)) == SECRET


def test_the_local_socket_is_the_users_alone(tmp_path: Path) -> None:
    from embedserve.server.local import serve_local

    async def main() -> None:
        path = tmp_path / "s.sock"

        async def answer(request: Any) -> Any:
            raise AssertionError("no call is made")

        local = await serve_local(path, answer)
        try:
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        finally:
            local.server.close()

    asyncio.run(main())
