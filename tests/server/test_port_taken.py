"""A server on a port already taken fails at start with a clear error; it never shares the
port (grpc's default) nor takes over the first server's unix socket (issue 40, item 11)."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from embedserve.options import EngineOptions
from embedserve.server.main import PortTaken, ServerConfig, _grpc_server, check_port


class NoService:
    async def embed(self, request: Any, context: Any) -> Any:
        raise AssertionError("never called")


def test_a_taken_port_is_a_clear_error_before_and_at_the_bind() -> None:
    async def main() -> None:
        first = grpc.aio.server()  # grpc's default: it would share the port
        port = first.add_insecure_port("127.0.0.1:0")
        await first.start()
        try:
            with pytest.raises(PortTaken, match=f"127.0.0.1:{port}: the port is in use"):
                check_port("127.0.0.1", port)  # before any model loads
            config = ServerConfig(EngineOptions(model="minilm"), host="127.0.0.1", port=port)
            with pytest.raises(PortTaken):
                _grpc_server(config, NoService())  # type: ignore[arg-type]
        finally:
            await first.stop(0)

    asyncio.run(main())
