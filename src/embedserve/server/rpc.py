"""The Embed RPC's names and (de)serializers, shared by the server and the gateway's client.

NOTE: handlers and stubs are built here from the generated messages instead of importing the
generated `embedserve_pb2_grpc`, which refuses to load under a grpcio older than the grpcio-tools
that generated it; the messages module only needs a recent enough protobuf. No torch here: the
gateway imports this module.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from embedserve.server.proto import embedserve_pb2

pb: Any = embedserve_pb2  # generated without type stubs

SERVICE_NAME = "embedserve.v1.Embedder"
EMBED_METHOD = f"/{SERVICE_NAME}/Embed"

EmbedRequest = pb.EmbedRequest
EmbedResponse = pb.EmbedResponse


def embed_handler(
    embed: Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]],
) -> grpc.GenericRpcHandler:
    """The server side: route `Embed` calls to the coroutine `embed(request, context)`."""
    return grpc.method_handlers_generic_handler(
        SERVICE_NAME,
        {
            "Embed": grpc.unary_unary_rpc_method_handler(
                embed,
                request_deserializer=pb.EmbedRequest.FromString,
                response_serializer=pb.EmbedResponse.SerializeToString,
            )
        },
    )


def embed_stub(channel: grpc.aio.Channel) -> grpc.aio.UnaryUnaryMultiCallable:
    """The client side: `await stub(request, timeout=...)` returns an EmbedResponse."""
    return channel.unary_unary(
        EMBED_METHOD,
        request_serializer=pb.EmbedRequest.SerializeToString,
        response_deserializer=pb.EmbedResponse.FromString,
    )
