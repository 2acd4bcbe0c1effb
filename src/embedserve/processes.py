"""A child process we start, watch for a ready line and stop: one helper for `embedserve serve`,
the benchmarks and the end-to-end tests.

The child runs in its own session (a terminal's Ctrl-C reaches only us, and we stop children in
order), gets SIGTERM when we die (Linux), and has its output read line by line on a thread: kept
for `wait_for` and, when asked, relayed to one of our streams. `stop()` sends the child SIGTERM (a
server or a gateway then drains) and kills its whole process group if it outlives the timeout.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import TextIO


def say(message: str, *, err: bool = False) -> None:
    """Print a status line, flushed; never raise.

    NOTE: our output is often a pipe read by the process that started us. When that process is
    killed, printing raises BrokenPipeError: in a signal handler that stopped a gateway from
    signalling its workers, which then held the port forever (an orphan). Saying nothing must
    never stop a shutdown.
    """
    stream = sys.stderr if err else sys.stdout
    with contextlib.suppress(OSError, ValueError):  # a broken pipe, or a closed stream
        print(message, file=stream, flush=True)


def set_parent_death_signal() -> None:
    """Linux: this process gets SIGTERM when its parent dies, so no child outlives its launcher.

    NOTE: the kernel ties this to the *thread* that started the child: start children from a
    thread that lives as long as they should (the main thread).
    """
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class Child:
    """A started command; `wait_for(pattern)` waits for an output line that matches."""

    def __init__(
        self, argv: Sequence[str], *, name: str | None = None, relay: TextIO | None = None
    ) -> None:
        self.argv = list(argv)
        self.name = name or os.path.basename(self.argv[0])
        self.relay = relay
        self.lines: list[str] = []  # every output line so far, until `forget_output()`
        self._keep = True
        self._exited = False
        self._changed = threading.Condition()
        self.proc = subprocess.Popen(
            self.argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},  # lines as they are printed
            start_new_session=True,
            preexec_fn=set_parent_death_signal,
        )
        threading.Thread(target=self._read, daemon=True, name=f"output-{self.name}").start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if self.relay is not None:
                self.relay.write(line)
                self.relay.flush()
            with self._changed:
                if self._keep:
                    self.lines.append(line)
                    self._changed.notify_all()
        with self._changed:
            self._exited = True
            self._changed.notify_all()

    def wait_for(
        self,
        pattern: str | re.Pattern[str],
        timeout: float = 120.0,
        *,
        start: int = 0,
        cancel: threading.Event | None = None,
    ) -> re.Match[str]:
        """The first output line from index `start` on that matches `pattern`.

        RuntimeError if the child's output ends first, TimeoutError after `timeout` seconds,
        KeyboardInterrupt soon after `cancel` is set.
        """
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        i = start
        with self._changed:
            while True:
                while i < len(self.lines):
                    if m := regex.search(self.lines[i]):
                        return m
                    i += 1
                if self._exited:
                    raise RuntimeError(
                        f"{self.name} exited (code {self._exit_code()}) before printing "
                        f"{regex.pattern!r}" + self._output_for_errors()
                    )
                if cancel is not None and cancel.is_set():
                    raise KeyboardInterrupt
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"{self.name} did not print {regex.pattern!r} within {timeout:g} s"
                        + self._output_for_errors()
                    )
                self._changed.wait(min(left, 0.1) if cancel is not None else left)

    def _exit_code(self) -> int | None:
        try:
            return self.proc.wait(5)
        except subprocess.TimeoutExpired:
            return None

    def _output_for_errors(self) -> str:
        # relayed output was shown already
        return "" if self.relay is not None else ":\n" + "".join(self.lines)

    def forget_output(self) -> None:
        """Stop keeping output lines (a long-lived child's are relayed, not held)."""
        with self._changed:
            self._keep = False
            self.lines.clear()

    def signal(self, sig: int) -> None:
        """Send `sig` to the child alone (a server or gateway stops its own children in order)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, then SIGKILL of the whole process group if the child does not exit in time."""
        self.signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL of the child's whole process group (it leads it): no drain, no goodbye."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):  # exited meanwhile
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def descendants(pid: int) -> set[int]:
    """Every live process below `pid` (Linux, from /proc): what must be gone after it is."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.add(child)
            todo.append(child)
    return out


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (Linux, from /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
