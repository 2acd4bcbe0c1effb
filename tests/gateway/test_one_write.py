"""A response's status line and headers leave with its body in one write (`connections._OneWrite`):
one send and one wake-up of the client per answer; a write nothing follows still leaves."""

from __future__ import annotations

import asyncio

from embedserve.gateway.connections import _OneWrite


class Recorded:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str) -> str:
        return f"info {name}"


HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"


def test_headers_and_body_are_one_write() -> None:
    async def answer() -> list[bytes]:
        real = Recorded()
        one = _OneWrite(real)
        one.write(HEAD)
        one.write(b"{}")
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        return real.writes

    assert asyncio.run(answer()) == [HEAD + b"{}"]


def test_headers_alone_leave_at_the_end_of_the_turn_and_on_close() -> None:
    async def head_only() -> tuple[list[bytes], list[bytes]]:
        real = Recorded()
        one = _OneWrite(real)
        one.write(HEAD)  # a HEAD answer: no body follows
        held = list(real.writes)
        await asyncio.sleep(0)
        return held, real.writes

    assert asyncio.run(head_only()) == ([], [HEAD])

    async def closed() -> Recorded:
        real = Recorded()
        one = _OneWrite(real)
        one.write(HEAD)
        one.close()
        await asyncio.sleep(0)  # the turn's flush finds nothing left to send
        return real

    real = asyncio.run(closed())
    assert real.writes == [HEAD] and real.closed


def test_a_streamed_body_and_the_rest_of_the_transport_pass_through() -> None:
    async def streamed() -> tuple[list[bytes], str]:
        real = Recorded()
        one = _OneWrite(real)
        one.write(HEAD)
        one.write(b"part 1")
        one.write(b"part 2")
        return real.writes, one.get_extra_info("peername")

    writes, info = asyncio.run(streamed())
    assert writes == [HEAD + b"part 1", b"part 2"] and info == "info peername"
