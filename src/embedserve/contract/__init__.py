"""The gateway <-> server contract, imported by both sides: the Embed RPC's messages, client stub
and server registration, from `embedserve.proto`.

The generated modules (`scripts/gen_proto.sh`) are used where the installed packages accept them.
NOTE: each refuses an installed package older than the tools that generated it (the GPU
machine's are older): under an older protobuf the messages are built at run time
(`runtime.build_messages`, same wire format), and under an older grpcio the stub and the handler
are built here from the method name and the messages' (de)serializers. No torch here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc

SERVICE_NAME = "embedserve.v1.Embedder"
EMBED_METHOD = f"/{SERVICE_NAME}/Embed"

EmbedFn = Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]

try:
    from embedserve.contract import embedserve_pb2

    EmbedRequest: Any = embedserve_pb2.EmbedRequest
    EmbedResponse: Any = embedserve_pb2.EmbedResponse
except Exception:  # protobuf too old: VersionError, or ImportError before 5.26 (no runtime_version)
    from embedserve.contract.runtime import build_messages

    EmbedRequest, EmbedResponse = build_messages()

try:  # imports embedserve_pb2 again: refused too when the messages were built at run time
    from embedserve.contract import embedserve_pb2_grpc

    generated_grpc: Any = embedserve_pb2_grpc
except Exception:  # grpcio older than the generator (RuntimeError), or the messages refused
    generated_grpc = None


def embed_handler(embed: EmbedFn) -> grpc.GenericRpcHandler:
    """A generic handler routing `Embed` calls to the coroutine `embed(request, context)`."""
    return grpc.method_handlers_generic_handler(
        SERVICE_NAME,
        {
            "Embed": grpc.unary_unary_rpc_method_handler(
                embed,
                request_deserializer=EmbedRequest.FromString,
                response_serializer=EmbedResponse.SerializeToString,
            )
        },
    )


class _Servicer:
    """The generated registration wants an object with an `Embed` method."""

    def __init__(self, embed: EmbedFn) -> None:
        self.Embed = embed


def add_embed_service(server: grpc.aio.Server, embed: EmbedFn) -> None:
    """The server side: serve `Embed` calls on `server` with the coroutine `embed`."""
    if generated_grpc is not None:
        generated_grpc.add_EmbedderServicer_to_server(_Servicer(embed), server)
    else:
        server.add_generic_rpc_handlers((embed_handler(embed),))


def embed_stub(channel: grpc.aio.Channel) -> grpc.aio.UnaryUnaryMultiCallable:
    """The client side: `await stub(request, timeout=...)` returns an EmbedResponse."""
    if generated_grpc is not None:
        return generated_grpc.EmbedderStub(channel).Embed
    return channel.unary_unary(
        EMBED_METHOD,
        request_serializer=EmbedRequest.SerializeToString,
        response_deserializer=EmbedResponse.FromString,
    )
