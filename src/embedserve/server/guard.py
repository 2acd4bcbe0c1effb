"""When an engine can no longer serve: a failure counter and a watchdog on stuck steps.

After a sticky CUDA error every batch fails while the process lives on, and a hung device never
answers at all; either way the health check said SERVING, `serve` never restarted the process,
and a replica that fails fast drew the traffic (it has the fewest outstanding tokens). The
service reports each batch's outcome here and marks the span of each batch on the engine
(`begin` / `end`); `on_fatal(reason)` is called once, from the thread that found it, when

- `max_failures` batches in a row failed (a failure the client caused, a ValueError, is not the
  engine's and does not count; a success resets the count),
- one error is of a kind the process cannot recover from (`unrecoverable`: a CUDA error poisons
  the context for good), or
- a batch has been on the engine for more than `step_timeout` seconds (the watchdog thread).

The server then answers NOT_SERVING and exits non-zero (`server.main`), and `serve` restarts it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from embedserve.processes import name_os_thread

log = logging.getLogger("embedserve.server")

# Defaults of `--max-failed-steps` and `--step-timeout`.
MAX_FAILED_STEPS = 5
# NOTE: the first batch of a new shape on a GPU may capture a CUDA graph or compile fused ops:
# seconds, tens at worst; a CPU batch at the largest budget takes a few seconds on 2 cores.
STEP_TIMEOUT_SECONDS = 120.0

# Texts of errors after which the device (and so the process) cannot serve again: a CUDA error
# is sticky, every later call on the context fails with it. Out-of-memory is not among them:
# the next, smaller batch may well fit (and the failure counter still catches it if not).
UNRECOVERABLE_MARKERS = (
    "CUDA error",
    "cudaError",
    "CUBLAS_STATUS",
    "CUDNN_STATUS",
    "device-side assert",
    "illegal memory access",
    "AcceleratorError",
)


def unrecoverable(error: BaseException) -> bool:
    """An error that leaves the device unusable for this process (see UNRECOVERABLE_MARKERS)."""
    text = f"{type(error).__name__}: {error}"
    return "out of memory" not in text and any(m in text for m in UNRECOVERABLE_MARKERS)


class EngineGuard:
    def __init__(
        self,
        on_fatal: Callable[[str], None],
        *,
        max_failures: int = MAX_FAILED_STEPS,
        step_timeout: float = STEP_TIMEOUT_SECONDS,
    ) -> None:
        if max_failures < 1:
            raise ValueError(f"max_failures must be >= 1, got {max_failures}")
        if step_timeout <= 0:
            raise ValueError(f"step_timeout must be > 0 seconds, got {step_timeout}")
        self.on_fatal = on_fatal
        self.max_failures = max_failures
        self.step_timeout = step_timeout
        self.consecutive_failures = 0
        self.fatal: str | None = None  # the reason, once found
        self._lock = threading.Lock()
        # batches on the engine: a key of each -> when it was taken (time.perf_counter)
        self._on_engine: dict[int, float] = {}
        self._stop = threading.Event()
        self._watchdog: threading.Thread | None = None

    def begin(self, key: int, since: float) -> None:
        """A batch is on the engine from `since` (perf_counter) until `end(key)`."""
        self._on_engine[key] = since  # NOTE: one dict store: no lock on the hot path

    def end(self, key: int) -> None:
        self._on_engine.pop(key, None)

    def succeeded(self) -> None:
        self.consecutive_failures = 0

    def failed(self, error: BaseException) -> None:
        """A batch failed with `error`; a client's bad input (ValueError) is not counted."""
        if isinstance(error, ValueError):
            return
        with self._lock:
            self.consecutive_failures += 1
            count = self.consecutive_failures
        if unrecoverable(error):
            self._trip(f"unrecoverable engine error: {type(error).__name__}: {error}")
        elif count >= self.max_failures:
            self._trip(f"{count} engine steps failed in a row (last: {type(error).__name__})")

    def start(self) -> None:
        self._watchdog = threading.Thread(target=self._watch, name="engine-watchdog", daemon=True)
        self._watchdog.start()

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        name_os_thread("es-watchdog")
        # a stuck step is found within a quarter of the bound (at most a second) after it
        tick = min(self.step_timeout / 4, 1.0)
        while not self._stop.wait(tick):
            now = time.perf_counter()
            oldest = min(self._on_engine.copy().values(), default=now)
            if now - oldest > self.step_timeout:
                self._trip(
                    f"an engine step has not returned in {now - oldest:.1f} s "
                    f"(--step-timeout {self.step_timeout:g})"
                )
                return

    def _trip(self, reason: str) -> None:
        with self._lock:
            if self.fatal is not None:
                return
            self.fatal = reason
        log.error("embedserve server: the engine cannot serve: %s", reason)
        self.on_fatal(reason)
