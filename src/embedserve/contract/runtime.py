"""The contract's two messages built from a descriptor at run time, for an older protobuf.

NOTE: the generated `embedserve_pb2` refuses to load under a protobuf runtime older than the one
that generated it (the GPU machine's is older). These are the same messages, field for field, on
the same wire format: keep them in step with `embedserve.proto` (tests/contract checks the two
agree).
"""

from __future__ import annotations

from typing import Any

# name -> [(field, type, repeated)], field numbers in order from 1, as in embedserve.proto
MESSAGES: dict[str, list[tuple[str, str, bool]]] = {
    "EmbedRequest": [
        ("input_ids", "bytes", False),
        ("seqlens", "uint32", True),
        ("dimensions", "uint32", False),
        ("normalize", "bool", False),
        ("output_dtype", "string", False),
        ("span_bounds", "uint32", True),
        ("second_segment", "uint32", True),
        ("raw", "bool", False),
        ("traceparent", "string", False),
        ("request_id", "string", False),
        ("outputs", "string", True),
        ("query", "bool", False),
        ("visible_tokens", "uint32", True),
        ("lane", "uint32", False),
    ],
    "EmbedResponse": [
        ("embeddings", "bytes", False),
        ("shape", "uint32", True),
        ("dtype", "string", False),
        ("sparse_counts", "uint32", True),
        ("sparse_indices", "bytes", False),
        ("sparse_values", "bytes", False),
        ("vector_counts", "uint32", True),
        ("vectors", "bytes", False),
        ("vector_dims", "uint32", False),
        ("queue_seconds", "double", False),
        ("inference_seconds", "double", False),
    ],
}


def build_messages() -> tuple[Any, Any]:
    """EmbedRequest and EmbedResponse classes from a run-time descriptor."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    field = descriptor_pb2.FieldDescriptorProto
    types = {
        "bytes": field.TYPE_BYTES,
        "uint32": field.TYPE_UINT32,
        "bool": field.TYPE_BOOL,
        "string": field.TYPE_STRING,
        "double": field.TYPE_DOUBLE,
    }
    file = descriptor_pb2.FileDescriptorProto(
        name="embedserve/contract/embedserve_runtime.proto",
        package="embedserve.v1",
        syntax="proto3",
    )
    for name, fields in MESSAGES.items():
        message = file.message_type.add(name=name)
        for number, (field_name, kind, repeated) in enumerate(fields, start=1):
            label = field.LABEL_REPEATED if repeated else field.LABEL_OPTIONAL
            message.field.add(name=field_name, number=number, type=types[kind], label=label)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    request, response = (
        message_factory.GetMessageClass(pool.FindMessageTypeByName(f"embedserve.v1.{name}"))
        for name in MESSAGES
    )
    return request, response
