"""The contract: the generated modules where the packages accept them, and the fallbacks (messages
built at run time for an older protobuf, stub and handler built by hand for an older grpcio) agree
with them on the wire and serve a call."""

from __future__ import annotations

import subprocess
import sys

import pytest

from embedserve import contract
from embedserve.contract import embedserve_pb2
from embedserve.contract.runtime import build_messages


def test_the_generated_modules_are_used_here() -> None:
    assert contract.EmbedRequest is embedserve_pb2.EmbedRequest  # type: ignore[attr-defined]
    assert contract.generated_grpc is not None


def test_runtime_messages_match_the_generated_ones() -> None:
    request, response = build_messages()
    fields = {
        "input_ids": b"\x01\x00\x00\x00\x02\x00\x00\x00",
        "seqlens": [1, 1],
        "dimensions": 64,
        "normalize": True,
        "output_dtype": "int8",
        "span_bounds": [0, 1, 1, 2, 0, 2],
    }
    generated = embedserve_pb2.EmbedRequest(**fields)  # type: ignore[attr-defined]
    assert list(request(**fields).span_bounds) == [0, 1, 1, 2, 0, 2]
    built = request(**fields)
    assert built.SerializeToString() == generated.SerializeToString()
    assert embedserve_pb2.EmbedRequest.FromString(built.SerializeToString()) == generated  # type: ignore[attr-defined]
    out = {"embeddings": b"\x00" * 16, "shape": [2, 8], "dtype": "int8"}
    assert (
        response(**out).SerializeToString()
        == embedserve_pb2.EmbedResponse(**out).SerializeToString()  # type: ignore[attr-defined]
    )
    for built_type, generated_type in (
        (request, embedserve_pb2.EmbedRequest),  # type: ignore[attr-defined]
        (response, embedserve_pb2.EmbedResponse),  # type: ignore[attr-defined]
    ):
        assert [(f.name, f.number, f.type) for f in built_type.DESCRIPTOR.fields] == [
            (f.name, f.number, f.type) for f in generated_type.DESCRIPTOR.fields
        ]


CALL = """
import sys, asyncio, grpc
for name in sys.argv[1:]:
    sys.modules[name] = None  # as if the installed package refused the generated module
from embedserve import contract
runtime = contract.EmbedRequest.DESCRIPTOR.file.name.endswith("embedserve_runtime.proto")

async def embed(request, context):
    shape = list(request.seqlens) + list(request.span_bounds)
    return contract.EmbedResponse(embeddings=request.input_ids, shape=shape, dtype="x")

async def main():
    server = grpc.aio.server()
    contract.add_embed_service(server, embed)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        request = contract.EmbedRequest(input_ids=b"ab", seqlens=[3, 4], span_bounds=[0, 2])
        reply = await contract.embed_stub(channel)(request, timeout=10)
    await server.stop(0)
    print(runtime, contract.generated_grpc is not None, reply.embeddings.decode(), list(reply.shape))

asyncio.run(main())
"""


@pytest.mark.parametrize(
    ("refused", "expected"),
    [
        ((), "False True"),  # both generated modules
        (("embedserve.contract.embedserve_pb2_grpc",), "False False"),  # grpcio too old
        (("embedserve.contract.embedserve_pb2",), "True False"),  # protobuf too old
    ],
)
def test_a_call_is_served_whichever_generated_modules_load(
    refused: tuple[str, ...], expected: str
) -> None:
    run = subprocess.run(
        [sys.executable, "-c", CALL, *refused], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == f"{expected} ab [3, 4, 0, 2]"
