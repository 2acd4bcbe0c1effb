"""`tei.proto`: the descriptor the gateway loads is the .proto's, and it speaks the wire of a
TEI client's own generated stubs (tei-client's): the same services, methods, streaming shapes,
messages, field names, numbers and types. Both load in one process (our pool is our own)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

from embedserve.contract import tei
from embedserve.contract.tei_descriptor import SERIALIZED

ROOT = Path(__file__).resolve().parents[2]


def _file(serialized: bytes) -> descriptor_pb2.FileDescriptorProto:
    return descriptor_pb2.FileDescriptorProto.FromString(serialized)


def test_the_checked_in_descriptor_is_the_protos() -> None:
    pytest.importorskip("grpc_tools")
    spec = importlib.util.spec_from_file_location(
        "tei_descriptor", ROOT / "scripts" / "tei_descriptor.py"
    )
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    text = (ROOT / "src" / "embedserve" / "contract" / "tei_descriptor.py").read_text()
    assert script.module_text() == text, "run scripts/gen_proto.sh after editing tei.proto"


def _shape(file: descriptor_pb2.FileDescriptorProto) -> tuple[dict, dict, dict]:
    messages = {
        m.name: {
            f.name: (f.number, f.type, f.label, f.type_name.rsplit(".", 1)[-1]) for f in m.field
        }
        for m in file.message_type
    }
    enums = {e.name: {v.name: v.number for v in e.value} for e in file.enum_type}
    services = {
        (s.name, m.name): (m.input_type, m.output_type, m.client_streaming, m.server_streaming)
        for s in file.service
        for m in s.method
    }
    return messages, enums, services


def test_the_wire_is_a_tei_clients() -> None:
    stubs = pytest.importorskip("tei_client.stubs.tei_pb2")
    theirs = descriptor_pb2.FileDescriptorProto()
    stubs.DESCRIPTOR.CopyToProto(theirs)
    ours = _file(SERIALIZED)
    assert ours.package == theirs.package == "tei.v1"
    our_messages, our_enums, our_services = _shape(ours)
    their_messages, their_enums, their_services = _shape(theirs)
    assert our_services == their_services
    assert our_enums == their_enums
    assert set(our_messages) == set(their_messages)
    for name, fields in their_messages.items():
        for field, shape in fields.items():
            assert our_messages[name][field] == shape, (name, field)
    # what TEI added since tei-client's copy: EmbedRequest.dimensions (field 6)
    extra = {(n, f) for n, fs in our_messages.items() for f in fs if f not in their_messages[n]}
    assert extra == {("EmbedRequest", "dimensions")}
    assert our_messages["EmbedRequest"]["dimensions"][0] == 6


def test_our_messages_read_a_tei_clients_bytes() -> None:
    stubs = pytest.importorskip("tei_client.stubs.tei_pb2")
    sent = stubs.EmbedRequest(
        inputs="hello", truncate=True, truncation_direction=1, prompt_name="q"
    )
    got = tei.message("EmbedRequest").FromString(sent.SerializeToString())
    assert (got.inputs, got.truncate, got.truncation_direction, got.prompt_name) == (
        "hello",
        True,
        1,
        "q",
    )
    assert not got.HasField("normalize") and not got.HasField("dimensions")
    assert "tei_client.stubs.tei_pb2" in sys.modules  # both loaded in this process, no clash


def test_the_method_table_has_every_rpc() -> None:
    paths = {m.path: (m.client_streaming, m.server_streaming) for m in tei.METHODS}
    assert len(paths) == 17
    assert paths["/tei.v1.Embed/EmbedStream"] == (True, True)
    assert paths["/tei.v1.Rerank/RerankStream"] == (True, False)
    assert paths["/tei.v1.Info/Info"] == (False, False)
    assert tei.enum_value("TruncationDirection", "TRUNCATION_DIRECTION_LEFT") == 1
