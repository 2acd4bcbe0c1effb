"""The Embed RPC's names and (de)serializers, shared by the server and the gateway's client.

NOTE: handlers and stubs are built here instead of importing the generated
`embedserve_pb2_grpc`, which refuses to load under a grpcio older than the grpcio-tools that
generated it; and the messages are built at run time when the generated `embedserve_pb2` refuses
an older protobuf runtime (the GPU machine's packages are older). No torch here: the gateway
imports this module.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc

SERVICE_NAME = "embedserve.v1.Embedder"
EMBED_METHOD = f"/{SERVICE_NAME}/Embed"


def build_messages() -> tuple[Any, Any]:
    """EmbedRequest and EmbedResponse built from a descriptor at run time.

    The same messages and wire format as the committed `embedserve_pb2` (keep the two in step
    with `embedserve.proto`), for a protobuf runtime older than the one that generated it, which
    the generated module refuses to load under.
    """
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    field = descriptor_pb2.FieldDescriptorProto
    one, many = field.LABEL_OPTIONAL, field.LABEL_REPEATED
    messages = {
        "EmbedRequest": [
            ("input_ids", field.TYPE_BYTES, one),
            ("seqlens", field.TYPE_UINT32, many),
            ("dimensions", field.TYPE_UINT32, one),
            ("normalize", field.TYPE_BOOL, one),
            ("output_dtype", field.TYPE_STRING, one),
            ("span_bounds", field.TYPE_UINT32, many),
        ],
        "EmbedResponse": [
            ("embeddings", field.TYPE_BYTES, one),
            ("shape", field.TYPE_UINT32, many),
            ("dtype", field.TYPE_STRING, one),
        ],
    }
    file = descriptor_pb2.FileDescriptorProto(
        name="embedserve/server/proto/embedserve_runtime.proto",
        package="embedserve.v1",
        syntax="proto3",
    )
    for name, fields in messages.items():
        message = file.message_type.add(name=name)
        for number, (field_name, kind, label) in enumerate(fields, start=1):
            message.field.add(name=field_name, number=number, type=kind, label=label)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    request, response = (
        message_factory.GetMessageClass(pool.FindMessageTypeByName(f"embedserve.v1.{name}"))
        for name in messages
    )
    return request, response


try:
    from embedserve.server.proto import embedserve_pb2

    EmbedRequest: Any = embedserve_pb2.EmbedRequest  # type: ignore[attr-defined]
    EmbedResponse: Any = embedserve_pb2.EmbedResponse  # type: ignore[attr-defined]
except Exception:  # protobuf too old: VersionError, or ImportError before 5.26 (no runtime_version)
    EmbedRequest, EmbedResponse = build_messages()


def embed_handler(
    embed: Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]],
) -> grpc.GenericRpcHandler:
    """The server side: route `Embed` calls to the coroutine `embed(request, context)`."""
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


def embed_stub(channel: grpc.aio.Channel) -> grpc.aio.UnaryUnaryMultiCallable:
    """The client side: `await stub(request, timeout=...)` returns an EmbedResponse."""
    return channel.unary_unary(
        EMBED_METHOD,
        request_serializer=EmbedRequest.SerializeToString,
        response_deserializer=EmbedResponse.FromString,
    )
