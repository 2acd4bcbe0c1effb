"""A child process we start, wait for until it is ready, and stop: one helper for `embedserve
serve`, the benchmarks and the end-to-end tests.

A child tells us it is ready in a small JSON file (`write_ready` there, `Child.wait_ready` here):
its address and budgets as values, not a log line to parse, so the human log can say anything.
The child runs in its own session (a terminal's Ctrl-C reaches only us, and we stop children in
order), gets SIGTERM when we die (Linux), and has its output read line by line on a thread: kept
for `wait_for` and, when asked, relayed to one of our streams. `stop()` sends the child SIGTERM (a
server or a gateway then drains) and kills it and every process below it if it outlives the
timeout. A child that calls `exit_with_parent` also ends itself, and everything below it, a
grace period after we die without stopping it (SIGTERM alone does not end a stuck process).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO, TypeVar

T = TypeVar("T")

# The file a child writes its ready record to (`write_ready`), named by the parent (`Child`).
READY_FILE_ENV = "EMBEDSERVE_READY_FILE"
# The pid of the `Child`'s parent, for `exit_with_parent`: set only by `Child`, so a process
# started by hand (whose shell may go) never ends itself.
PARENT_PID_ENV = "EMBEDSERVE_PARENT_PID"
# How long a start may take to build its engine and answer (a server's ready record, the
# gateway workers' first /health): a Qwen3 graph's first write and a CPU path's timing on
# two cores take minutes, and a start killed midway may be halfway through writing a cache
START_TIMEOUT_S = 600.0


def say(message: str, *, err: bool = False) -> None:
    """Print a status line, flushed; never raise.

    NOTE: our output is often a pipe read by the process that started us. When that process is
    killed, printing raises BrokenPipeError: in a signal handler that stopped a gateway from
    signalling its workers, which then held the port forever (an orphan). Saying nothing must
    never stop a shutdown.
    """
    stream = sys.stderr if err else sys.stdout
    # a broken pipe, a closed stream, or a signal handler's line landing while the main thread
    # was writing to the same stream (RuntimeError: reentrant call)
    with contextlib.suppress(OSError, ValueError, RuntimeError):
        # NOTE: one write with its newline: `print` writes the two apart, and on a pipe shared
        # with the gateway's workers (unbuffered) another process's line landed between them,
        # so a reader of the ready line took "45761replica" for the port (a CI run, 2026-12-04)
        stream.write(message + "\n")
        stream.flush()


def set_on_signal(event: threading.Event) -> Callable[[int, Any], None]:
    """A signal handler that sets `event`.

    NOTE: a handler runs on the main thread between two bytecodes, perhaps while that thread
    holds the event's lock (inside `event.wait`, or inside an earlier handler's `set`): setting
    it there blocks on that lock for ever. `serve` hung so after two SIGTERMs in quick
    succession (its `timeout` wrapper and `pkill` both sent one), its servers orphaned. So the
    handler takes no lock: a thread sets the event."""

    def handler(signum: int, frame: Any) -> None:
        if not event.is_set():  # reads a flag, no lock
            threading.Thread(target=event.set, name="signal", daemon=True).start()

    return handler


def name_os_thread(name: str) -> None:
    """Linux: the calling thread's name as `top -H`, `ps -L` and /proc show it (15 bytes at
    most). Python names its threads for itself only, so every thread of a server read "python"
    and its per-thread CPU could not be told apart (issue 38's host-path budget)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except OSError:
        pass


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


# How long past its drain a process that `serve` started (a server, the gateway, the native
# process) waits, once `serve` is gone, before it kills itself and its workers.
ORPHAN_GRACE_SECONDS = 10.0


def exit_with_parent(grace: float) -> bool:
    """Started by a `Child`: once that parent is gone, give SIGTERM's drain `grace` seconds,
    then SIGKILL every process below us and ourselves. False (nothing armed) otherwise.

    NOTE: `set_parent_death_signal` sends SIGTERM only: a gateway whose worker's event loop was
    stuck drained forever, and after `serve` was killed the supervisor and its worker lived on
    at 100% of a core, holding the port. The watch is a thread polling our parent pid, so it
    works while the main thread is busy (not while a C call holds the GIL).
    """
    parent = os.environ.pop(PARENT_PID_ENV, None)
    if parent is None or not parent.isdigit() or int(parent) != os.getppid():
        return False

    def watch() -> None:
        while os.getppid() == int(parent):
            time.sleep(0.2)
        time.sleep(grace)
        say(f"embedserve: the launcher is gone and {grace:g} s passed: exiting", err=True)
        kill_tree(os.getpid())
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
    return True


def write_ready(record: dict[str, Any]) -> None:
    """Tell the process that started us we are ready: `record` (JSON values) in the file it
    named in $EMBEDSERVE_READY_FILE; nothing when it named none (started by hand).

    Written to a temporary file and renamed over the name, so the parent never reads half a
    record. The variable is dropped once used: a process we start is not the one being waited on.
    """
    path = os.environ.pop(READY_FILE_ENV, None)
    if not path:
        return
    partial = f"{path}.{os.getpid()}.partial"
    with open(partial, "w") as f:
        json.dump(record, f)
    os.replace(partial, path)


# `serve`'s restarts of one server process (or of `--native`'s one process) in a minute
MAX_RESTARTS_PER_MINUTE = 3


class Restarts:
    """A child's restarts within the last minute: one more is allowed while they are at most
    `per_minute` (a child that keeps exiting cannot run, and is not started for ever)."""

    def __init__(self, per_minute: int = MAX_RESTARTS_PER_MINUTE) -> None:
        self.per_minute = per_minute
        self._times: list[float] = []

    def allow(self) -> bool:
        """Counts a restart now; whether it may go ahead."""
        now = time.monotonic()
        self._times = [t for t in self._times if now - t < 60] + [now]
        return len(self._times) <= self.per_minute


class Child:
    """A started command; `wait_ready()` waits for its ready record (`write_ready`),
    `wait_for(pattern)` for an output line that matches."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        name: str | None = None,
        relay: TextIO | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        """`env`: variables added to ours for it."""
        self.argv = list(argv)
        self.name = name or os.path.basename(self.argv[0])
        self.relay = relay
        self.lines: list[str] = []  # every output line so far, until `forget_output()`
        self._keep = True
        self._exited = False
        self._changed = threading.Condition()
        ready_dir = Path(tempfile.mkdtemp(prefix="embedserve-ready-"))
        self.ready_file = ready_dir / "ready.json"
        # gone once read or stopped, else when this object goes or the interpreter exits: a
        # child only waited for by its output (or that exited on its own) left one behind
        self._forget_ready_file = weakref.finalize(
            self, shutil.rmtree, ready_dir, ignore_errors=True
        )
        env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}  # lines as printed
        env[READY_FILE_ENV] = str(self.ready_file)  # ours, not one our own parent gave us
        env[PARENT_PID_ENV] = str(os.getpid())  # for `exit_with_parent`
        self.proc = subprocess.Popen(
            self.argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            env=env,
            start_new_session=True,
            preexec_fn=set_parent_death_signal,
        )
        threading.Thread(target=self._read, daemon=True, name=f"output-{self.name}").start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if self.relay is not None:
                try:
                    self.relay.write(line)
                    self.relay.flush()
                except (OSError, ValueError):  # our terminal or pipe went away
                    # NOTE: keep reading: a reader that died left the child blocked on a full
                    # pipe (a gateway hung inside a log call)
                    self.relay = None
            with self._changed:
                if self._keep:
                    self.lines.append(line)
                    self._changed.notify_all()
        with self._changed:
            self._exited = True
            self._changed.notify_all()

    def wait_ready(
        self, timeout: float = 120.0, *, cancel: threading.Event | None = None
    ) -> dict[str, Any]:
        """The record the child wrote with `write_ready` once it was ready.

        RuntimeError if the child exits first, TimeoutError after `timeout` seconds,
        KeyboardInterrupt soon after `cancel` is set.
        """

        def written() -> dict[str, Any] | None:
            try:
                record: dict[str, Any] = json.loads(self.ready_file.read_text())
            except FileNotFoundError:
                return None
            return record

        # the file comes with no output line to wake us: look again every 50 ms
        record = self._wait(written, "being ready", "was not ready", timeout, cancel, poll=0.05)
        self._forget_ready_file()
        return record

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
        i = start

        def matched() -> re.Match[str] | None:
            nonlocal i
            while i < len(self.lines):
                if m := regex.search(self.lines[i]):
                    return m
                i += 1
            return None

        shown = f"printing {regex.pattern!r}"
        return self._wait(matched, shown, f"did not print {regex.pattern!r}", timeout, cancel)

    def _wait(
        self,
        found: Callable[[], T | None],
        before: str,
        did_not: str,
        timeout: float,
        cancel: threading.Event | None,
        poll: float | None = None,
    ) -> T:
        """`found()` once it is not None, looked at on every output line (and every `poll` s)."""
        deadline = time.monotonic() + timeout
        if cancel is not None:
            poll = min(poll or 0.1, 0.1)
        with self._changed:
            while True:
                if (result := found()) is not None:
                    return result
                if self._exited:
                    raise RuntimeError(
                        f"{self.name} exited (code {self._exit_code()}) before {before}"
                        + self._output_for_errors()
                    )
                if cancel is not None and cancel.is_set():
                    raise KeyboardInterrupt
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"{self.name} {did_not} within {timeout:g} s" + self._output_for_errors()
                    )
                self._changed.wait(left if poll is None else min(left, poll))

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
        finally:
            self._forget_ready_file()

    def kill(self) -> None:
        """SIGKILL of the child, its whole process group (it leads it) and every process below
        it (a gateway's workers lead process groups of their own): no drain, no goodbye."""
        if self.proc.poll() is None:
            kill_tree(self.proc.pid)
            with contextlib.suppress(ProcessLookupError):  # exited meanwhile
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self._forget_ready_file()


def kill_tree(pid: int) -> None:
    """SIGKILL of every process below `pid` (not `pid` itself), found before any is killed: a
    killed parent's children are handed to init and could no longer be found under it."""
    for below in descendants(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(below, signal.SIGKILL)


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
