"""The messages built at run time (for an older protobuf) match the generated ones on the wire."""

from __future__ import annotations

from embedserve.server.proto import embedserve_pb2
from embedserve.server.rpc import build_messages


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
    assert [f.name for f in request.DESCRIPTOR.fields] == [
        f.name
        for f in embedserve_pb2.EmbedRequest.DESCRIPTOR.fields  # type: ignore[attr-defined]
    ]


FALLBACK = """
import sys, asyncio, grpc
sys.modules["embedserve.server.proto.embedserve_pb2"] = None  # as if protobuf refused it
from embedserve.server import rpc
assert rpc.EmbedRequest.DESCRIPTOR.file.name.endswith("embedserve_runtime.proto")

async def embed(request, context):
    shape = list(request.seqlens) + list(request.span_bounds)
    return rpc.EmbedResponse(embeddings=request.input_ids, shape=shape, dtype="x")

async def main():
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((rpc.embed_handler(embed),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        reply = await rpc.embed_stub(channel)(rpc.EmbedRequest(input_ids=b"ab", seqlens=[3, 4], span_bounds=[0, 2]), timeout=10)
    await server.stop(0)
    print(reply.embeddings.decode(), list(reply.shape))

asyncio.run(main())
"""


def test_the_runtime_messages_serve_a_call_when_the_generated_module_is_refused() -> None:
    import subprocess
    import sys

    run = subprocess.run(
        [sys.executable, "-c", FALLBACK], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "ab [3, 4, 0, 2]"
