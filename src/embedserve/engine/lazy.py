"""LazyTensor: the result of one engine step, ready now or later.

On CUDA it owns a page-locked host buffer, the asynchronous device-to-host copy into it and the
event recorded after that copy, so the caller can queue the next batch before this one finishes.
On the CPU the result is complete when `step()` returns.
"""

from __future__ import annotations

import numpy as np
import torch


class LazyTensor:
    def __init__(
        self, host: torch.Tensor | np.ndarray, event: torch.cuda.Event | None = None
    ) -> None:
        # [S, H] float32; pinned when `event` is set; NumPy where the rows never were torch's
        # (ONNX Runtime's, pooled on the host: no tensor wrapped only to be unwrapped)
        self._host = host
        self._event = event

    @classmethod
    def from_device(cls, result: torch.Tensor) -> LazyTensor:
        """Start the copy of `result` to the host and return without waiting for it."""
        if result.device.type != "cuda":
            # a copy: the result may be a view of a buffer the next step rewrites (a bucket's
            # output, with the CPU stand-in graphs of the tests)
            return cls(result.detach().clone())
        host = torch.empty(result.shape, dtype=result.dtype, pin_memory=True)
        host.copy_(result, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return cls(host, event)

    def ready(self) -> bool:
        """True once the values can be read without blocking."""
        return self._event is None or self._event.query()

    def wait(self) -> np.ndarray:
        """Block until the copy is done; the values as a NumPy array."""
        if self._event is not None:
            self._event.synchronize()
        return self._host if isinstance(self._host, np.ndarray) else self._host.numpy()
