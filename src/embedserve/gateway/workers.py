"""The gateway's worker processes, kept running: a dead one is started again with a backoff."""

from __future__ import annotations

import multiprocessing
import multiprocessing.process
import os
import signal
import socket
import time
from collections.abc import Callable
from typing import Any

from embedserve.gateway.metrics import MULTIPROCESS_DIR
from embedserve.processes import say

MAX_RESTARTS_PER_MINUTE = 5  # worker restarts, all workers together
MAX_BACKOFF_SECONDS = 10.0


class Workers:
    """The gateway's worker processes on one listening socket; a worker that dies is started
    again after a backoff (0.5 s, doubling to `MAX_BACKOFF_SECONDS`), as `serve` restarts a
    dead server: one worker's crash must not stop the gateway. More than
    `MAX_RESTARTS_PER_MINUTE` in a minute is a worker that cannot run: `keep` says False.
    Each started worker reports the restarts so far in the `worker_restarts` metric."""

    def __init__(self, config: Any, sock: socket.socket, target: Callable[..., None]) -> None:
        """`target(config, sock, restarts)` runs one worker (`gateway.main.run_worker`)."""
        self.config, self.sock, self.target = config, sock, target
        self.ctx = multiprocessing.get_context("spawn")
        self.restarts = 0
        self.recent: list[float] = []  # restart times in the last minute
        self.due: dict[int, float] = {}  # a dead worker's slot -> when it starts again
        self.processes = [self._start(i) for i in range(config.workers)]

    def _start(self, i: int) -> multiprocessing.process.BaseProcess:
        process = self.ctx.Process(
            target=self.target,
            args=(self.config, self.sock, self.restarts),
            name=f"gateway-{i}",
            daemon=False,
        )
        process.start()
        return process

    def keep(self) -> bool:
        """Start again each dead worker whose backoff has passed; False past the restart cap."""
        now = time.monotonic()
        for i, process in enumerate(self.processes):
            if process.is_alive() or process.exitcode is None:
                continue
            if i not in self.due:
                _forget_live_metrics(process.pid)
                self.recent = [t for t in self.recent if now - t < 60] + [now]
                if len(self.recent) > MAX_RESTARTS_PER_MINUTE:
                    return False
                backoff = min(0.5 * 2 ** (len(self.recent) - 1), MAX_BACKOFF_SECONDS)
                self.due[i] = now + backoff
                say(
                    f"embedserve gateway: worker {process.name} exited ({process.exitcode}); "
                    f"restarting in {backoff:g} s",
                    err=True,
                )
            elif now >= self.due[i]:
                del self.due[i]
                self.restarts += 1
                self.processes[i] = self._start(i)
        return True

    def alive(self) -> bool:
        return any(p.is_alive() for p in self.processes) or bool(self.due)

    def signal(self, signum: int) -> None:
        """`signum` to each live worker (SIGHUP: reopen logs); a stop goes through `Stop`."""
        for p in self.processes:
            if p.pid is not None and p.is_alive():
                os.kill(p.pid, signum)

    def join(self, timeout: float) -> None:
        for p in self.processes:
            p.join(timeout)

    def exited_cleanly(self) -> bool:
        return all(p.exitcode == 0 for p in self.processes)


def _forget_live_metrics(pid: int | None) -> None:
    """A dead worker's "live" gauges out of /metrics (prometheus multiprocess mode keeps its
    last value otherwise: `replica_outstanding_tokens` summed a dead worker's tokens for ever)."""
    directory = os.environ.get(MULTIPROCESS_DIR)
    if pid is None or not directory:
        return
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(pid, directory)


# a stop signal this long after the first is a second ask (kill now); sooner, the same one
AGAIN_AFTER_S = 1.0


class Stop:
    """SIGTERM / Ctrl-C as a request the supervisor's loop finishes (`carry_out`, each turn).
    The handler (`ask`) counts it and signals the live workers at once (the drain starts with
    the signal), touching nothing of the restarts. NOTE: a handler that also cleared the
    restarts could run while a worker was being started again: the new one was never signalled
    (the supervisor then waited for ever, a second signal ignored) or the restart's bookkeeping
    raised KeyError; the loop now clears them and signals a worker started meanwhile. Each live
    worker is sent SIGTERM once; past `grace` seconds, or at a second signal, what is left is
    killed."""

    def __init__(self, workers: Workers, grace: float) -> None:
        self.workers, self.grace = workers, grace
        self.asked = 0
        self.deadline: float | None = None  # the grace's end, from the first signal
        self.signalled: set[int] = set()
        self._restarts_cleared = False
        self._first = 0.0  # when the first stop came

    def ask(self, signum: int, frame: object) -> None:
        now = time.monotonic()
        if self.deadline is None:
            self.deadline = now + self.grace
            self._first = now
        # NOTE: one stop often arrives twice at once (Ctrl-C reaches the whole process group and
        # `serve` forwards a SIGTERM too): only a signal `AGAIN_AFTER_S` later is a second ask
        elif now - self._first < AGAIN_AFTER_S:
            return
        self.asked += 1
        self._signal(kill=self.asked > 1)

    def carry_out(self) -> bool:
        """Signal what the requests so far call for; True once a stop has been asked."""
        if not self.asked or self.deadline is None:
            return False
        if not self._restarts_cleared:
            say("embedserve gateway: draining")
            self._restarts_cleared = True
            self.workers.due.clear()  # a worker waiting for its restart is not started again
        self._signal(kill=self.asked > 1 or time.monotonic() > self.deadline)
        return True

    def _signal(self, kill: bool) -> None:
        for p in self.workers.processes:
            if p.pid is None or not p.is_alive():
                continue
            if kill:
                os.kill(p.pid, signal.SIGKILL)
            elif p.pid not in self.signalled:
                os.kill(p.pid, signal.SIGTERM)
                self.signalled.add(p.pid)
