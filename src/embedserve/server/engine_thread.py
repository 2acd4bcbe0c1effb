"""The one thread that builds a server's engine and then runs its every step.

NOTE: on the CPU, each thread that runs PyTorch operators leads an OpenMP team of its own, and
once a process has more OpenMP threads than cores libgomp cuts the spin between two operators to
1,000 rounds (`cpu_threads`), too short on 2 cores (Zen 5): a short query's forward then lets the
second thread sleep between operators. A server whose engine was built (fidelity check, warm-up)
on one thread and stepped on another, or stepped on two, had two teams: a lone client's short
query over HTTP was 1.1-2.0 ms slower once the server had served a burst of concurrent requests
than before it; built and stepped on this one thread, within 0.2 ms either way, and 0.07-0.17 ms
slower than the earlier server's fresh state, whose lone small requests ran on the event loop's
thread without crossing threads (6 rounds, the four servers called in turn:
results/studies/http-ab-cpu2-20261202-5)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from embedserve.processes import name_os_thread

T = TypeVar("T")


class EngineThread:
    """A daemon thread (named "engine") running the callables submitted to it, in order."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None]
        self._jobs = queue.SimpleQueue()
        threading.Thread(target=self._run, name="engine", daemon=True).start()

    def submit(self, work: Callable[[], T]) -> Future[T]:
        done: Future[T] = Future()
        self._jobs.put((done, work))
        return done

    def close(self) -> None:
        """End the thread once the work submitted before is done."""
        self._jobs.put(None)

    def _run(self) -> None:
        name_os_thread("es-engine")
        while (job := self._jobs.get()) is not None:
            done, work = job
            if not done.set_running_or_notify_cancel():
                continue
            try:
                done.set_result(work())
            except BaseException as e:  # the caller's to handle, through the future
                done.set_exception(e)
