"""The wire codec: what a gateway encodes is what a server decodes, both directions, and the
head travels as what it is (a checked head, or the raw flag)."""

from __future__ import annotations

import numpy as np
import pytest

from embedserve.contract import EmbedRequest, EmbedResponse
from embedserve.contract.codec import (
    WireError,
    decode_outputs_response,
    decode_request,
    decode_response,
    encode_outputs_response,
    encode_request,
    encode_response,
    encode_responses,
)
from embedserve.core.budget import shift_spans
from embedserve.core.head import Head
from embedserve.errors import InputError


def over_the_wire(request: object) -> object:
    return EmbedRequest.FromString(request.SerializeToString())  # type: ignore[attr-defined]


def test_a_request_round_trips_with_its_head() -> None:
    head = Head(64, True, "int8")
    sent = encode_request([[101, 7, 102], [101, 102]], head, second_segment=[2, 0])
    got = decode_request(over_the_wire(sent), 384)
    assert got.input_ids.tolist() == [101, 7, 102, 101, 102]
    assert got.seqlens.tolist() == [3, 2]
    assert got.second_segment.tolist() == [2, 0]
    assert got.spans is None
    assert got.head == head
    assert not sent.raw


def test_one_sequence_packs_like_many() -> None:
    one = encode_request([[5, 6, 7]], None)
    many = encode_request([[5], [6, 7]], None)
    assert one.input_ids == many.input_ids == np.array([5, 6, 7], dtype="<i4").tobytes()


def test_a_raw_request_sends_no_head_and_decodes_to_none() -> None:
    sent = encode_request([[1, 2]], None)
    assert sent.raw
    assert (sent.dimensions, sent.normalize, sent.output_dtype) == (0, False, "")
    assert decode_request(over_the_wire(sent), 1).head is None


def test_an_older_gateways_stand_in_for_raw_rows_still_decodes() -> None:
    """Before the raw flag, raw rows were asked for as every dimension, unnormalized float32."""
    old = EmbedRequest(input_ids=b"\x01\0\0\0", seqlens=[1], output_dtype="float32")
    head = decode_request(old, 384, "pplx").head
    assert head == Head(384, False, "float32", "pplx")
    pooled = np.random.default_rng(0).standard_normal((1, 384)).astype(np.float32)
    # what that head answers is exactly what a raw request is answered
    assert encode_response(pooled, head) == encode_response(pooled, None)


def test_a_raw_request_with_a_head_is_refused() -> None:
    bad = EmbedRequest(input_ids=b"\x01\0\0\0", seqlens=[1], raw=True, dimensions=8)
    with pytest.raises(ValueError, match="raw request"):
        decode_request(bad, 384)


def test_the_head_is_checked_against_the_model() -> None:
    sent = encode_request([[1]], Head(512, True, "float32"))
    with pytest.raises(InputError, match="between 1 and 384"):
        decode_request(sent, 384)


def test_spans_round_trip_as_pairs() -> None:
    spans = shift_spans([[(1, 3), (2, 4)], [(1, 2)]], [5, 3])  # the second document's, moved 5
    assert spans.tolist() == [[1, 3], [2, 4], [6, 7]]
    sent = encode_request([[9] * 5, [8] * 3], Head(8, False, "float32"), spans=spans)
    assert list(sent.span_bounds) == [1, 3, 2, 4, 6, 7]
    got = decode_request(over_the_wire(sent), 8)
    assert got.spans is not None and got.spans.dtype == np.int64
    assert got.spans.tolist() == spans.tolist()


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"input_ids": b"\x01\0\0", "seqlens": [1]}, "whole number of int32s"),
        ({"input_ids": b"\x01\0\0\0", "seqlens": [1], "span_bounds": [0, 1, 0]}, "pairs"),
    ],
)
def test_malformed_requests_are_refused(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        decode_request(EmbedRequest(**fields), 8)


@pytest.mark.parametrize(
    "head", [Head(4, True, "float32"), Head(8, False, "binary"), Head(6, False, "float16"), None]
)
def test_an_answer_round_trips(head: Head | None) -> None:
    pooled = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)
    expected = pooled if head is None else head.apply(pooled)
    sent = encode_response(pooled, head)
    got = decode_response(EmbedResponse.FromString(sent.SerializeToString()), 3)
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)


def test_an_answer_of_the_wrong_shape_is_a_wire_error() -> None:
    sent = encode_response(np.zeros((2, 4), dtype=np.float32), None)
    with pytest.raises(WireError, match=r"replica answered shape \(2, 4\) for 3 rows"):
        decode_response(sent, 3)


def test_outputs_round_trip_compactly_per_sequence() -> None:
    sent = encode_request([[101, 7, 102], [101, 102]], Head(4, True, "float32"),
                          outputs=["sparse", "multivector"], query=True, visible=[2, 2])  # fmt: skip
    got = decode_request(over_the_wire(sent), 4)
    assert (got.outputs, got.query, got.visible) == (("sparse", "multivector"), True, (2, 2))
    assert decode_request(over_the_wire(encode_request([[1]], None)), 4).outputs == ()
    dense = np.array([[3.0, 4.0, 0, 0], [0, 0, 0, 2.0]], np.float32)
    vectors = np.arange(12, dtype=np.float32).reshape(3, 4)
    response = encode_outputs_response(
        Head(2, True, "float32"), dense,
        (np.array([2, 1]), np.array([5, 9, 7]), np.array([0.5, 1.5, 2.5])),
        (np.array([1, 2]), vectors),
    )  # fmt: skip
    wire = EmbedResponse.FromString(response.SerializeToString())
    # ids as int32 and values as float32: 12 + 12 bytes for three entries, never a vocabulary row
    assert len(wire.sparse_indices) == len(wire.sparse_values) == 12
    out = decode_outputs_response(wire, 2, ("dense", "sparse", "multivector"))
    assert out.dense is not None  # the head applied: truncated to 2, normalized
    np.testing.assert_allclose(out.dense, [[0.6, 0.8], [0.0, 0.0]], rtol=1e-6)
    assert out.sparse == [{"indices": [5, 9], "values": [0.5, 1.5]},
                          {"indices": [7], "values": [2.5]}]  # fmt: skip
    assert out.multivector is not None
    assert [m.tolist() for m in out.multivector] == [vectors[:1].tolist(), vectors[1:].tolist()]
    with pytest.raises(WireError, match="for 3 rows"):
        decode_outputs_response(wire, 3, ("sparse",))
    with pytest.raises(WireError, match="for 3 rows"):
        decode_outputs_response(wire, 3, ("multivector",))


@pytest.mark.parametrize("dtype", ["float32", "float16", "int8", "uint8", "binary", "ubinary"])
@pytest.mark.parametrize("rules", ["generic", "pplx"])
def test_a_shared_head_applied_once_gives_each_request_its_own_bytes(
    dtype: str, rules: str
) -> None:
    """A merged batch's answers (`encode_responses`) hold, byte for byte, what each request's
    rows give alone, whether the head is shared (applied once) or not (per request)."""
    rng = np.random.default_rng(0)
    pooled = rng.standard_normal((9, 64)).astype(np.float32) * 3
    counts = [1, 3, 1, 4]
    shared = Head(48, True, dtype, rules)
    starts = np.cumsum([0, *counts])
    for heads in ([shared] * 4, [shared, Head(64, False, "float32"), None, shared]):
        answers = encode_responses(pooled, heads, counts)
        alone = [
            encode_response(pooled[a:b], h)
            for a, b, h in zip(starts[:-1], starts[1:], heads, strict=True)
        ]
        assert [r.SerializeToString() for r in answers] == [r.SerializeToString() for r in alone]
    with pytest.raises(RuntimeError, match="rows"):
        encode_responses(pooled[:8], [shared] * 4, counts)
