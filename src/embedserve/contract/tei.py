"""TEI's gRPC messages and method table (`tei.proto`), built from its descriptor in a pool of
their own (see `scripts/tei_descriptor.py` for why not the default pool).

`message("EmbedRequest")` is the message class; `METHODS` lists every RPC with its streaming
shape, read from the descriptor, so the server registers exactly what the .proto declares.
No torch here; protobuf only (grpc is the caller's).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from embedserve.contract.tei_descriptor import SERIALIZED

PACKAGE = "tei.v1"


@dataclass(frozen=True)
class Method:
    service: str  # "Embed"
    name: str  # "EmbedStream"
    request: str  # message names, without the package
    response: str
    client_streaming: bool
    server_streaming: bool

    @property
    def path(self) -> str:
        return f"/{PACKAGE}.{self.service}/{self.name}"


@functools.cache
def _pool() -> descriptor_pool.DescriptorPool:
    pool = descriptor_pool.DescriptorPool()
    # NOTE: Add, not AddSerializedFile: the latter is missing from some older runtimes
    pool.Add(descriptor_pb2.FileDescriptorProto.FromString(SERIALIZED))
    return pool


@functools.cache
def message(name: str) -> Any:
    """The class of the message `tei.v1.<name>`."""
    return message_factory.GetMessageClass(_pool().FindMessageTypeByName(f"{PACKAGE}.{name}"))


def enum_value(enum: str, name: str) -> int:
    """The number of `name` in the enum `tei.v1.<enum>`."""
    return int(_pool().FindEnumTypeByName(f"{PACKAGE}.{enum}").values_by_name[name].number)


def _methods() -> tuple[Method, ...]:
    file = descriptor_pb2.FileDescriptorProto.FromString(SERIALIZED)
    return tuple(
        Method(
            service.name,
            m.name,
            m.input_type.rsplit(".", 1)[-1],
            m.output_type.rsplit(".", 1)[-1],
            m.client_streaming,
            m.server_streaming,
        )
        for service in file.service
        for m in service.method
    )


METHODS = _methods()
