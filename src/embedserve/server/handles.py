"""The result handles of the Embed service's own making: one computed already (span pooling and
outputs run to completion on the engine thread), and asking any handle whether it is ready. What
the service needs of an engine is one record, `engine.seam.EngineSeam`."""

from __future__ import annotations

from typing import Any

from embedserve.engine.seam import ResultHandle


class Ready:
    """A result already computed (span pooling and outputs run to completion on the engine
    thread)."""

    def __init__(self, rows: Any) -> None:
        self.rows = rows

    def ready(self) -> bool:
        return True

    def wait(self) -> Any:
        return self.rows


def is_ready(handle: ResultHandle) -> bool:
    try:
        return handle.ready()
    except Exception:
        return False  # `_finish` asks again (`wait`) and fails the batch
