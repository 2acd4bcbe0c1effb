"""The child-process helper: ready records and lines, a child that exits or hangs first, stop and
kill."""

from __future__ import annotations

import gc
import io
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from embedserve.processes import (
    PARENT_PID_ENV,
    READY_FILE_ENV,
    Child,
    alive,
    exit_with_parent,
    say,
    set_on_signal,
    write_ready,
)

PYTHON = [sys.executable, "-c"]


def test_waits_for_a_ready_line_relays_output_and_stops_with_sigterm() -> None:
    code = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: (print('draining'), sys.exit(3)))\n"
        "print('warming up'); print('ready on 127.0.0.1:5'); time.sleep(60)\n"
    )
    relay = io.StringIO()
    child = Child([*PYTHON, code], name="toy", relay=relay)
    m = child.wait_for(r"ready on (\S+):(\d+)", 30)
    assert m.groups() == ("127.0.0.1", "5")
    assert child.wait_for("warming", 1).group(0) == "warming"
    with pytest.raises(TimeoutError, match="toy did not print 'never'"):
        child.wait_for("never", 0.2, start=2)
    assert child.stop(30) == 3
    assert "warming up\nready on 127.0.0.1:5\n" in relay.getvalue()


def test_a_child_that_exits_first_is_an_error_with_its_output() -> None:
    child = Child([*PYTHON, "print('bad flag'); raise SystemExit(2)"], name="toy")
    with pytest.raises(RuntimeError, match=r"toy exited \(code 2\) before printing 'ready'"):
        child.wait_for("ready", 30)
    assert child.lines == ["bad flag\n"]


def test_cancel_and_kill() -> None:
    code = (
        "import signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ignoring'); time.sleep(60)\n"
    )
    child = Child([*PYTHON, code])
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(KeyboardInterrupt):
        child.wait_for("never", 30, cancel=cancel)
    child.wait_for("ignoring", 30)
    assert child.stop(0.5) == -9  # SIGTERM ignored: killed
    child.forget_output()
    assert child.lines == []


def test_a_child_tells_its_parent_it_is_ready_in_a_record() -> None:
    code = (
        "import time\n"
        "from embedserve.processes import write_ready\n"
        "print('warming up', flush=True); time.sleep(0.3)\n"
        "write_ready({'address': '127.0.0.1:5', 'max_batch_tokens': 2048}); time.sleep(60)\n"
    )
    child = Child([*PYTHON, code], name="toy")
    assert child.wait_ready(30) == {"address": "127.0.0.1:5", "max_batch_tokens": 2048}
    assert not child.ready_file.exists()  # read once, then removed
    assert child.wait_for("warming", 1)  # the human log is still there
    child.stop(5)
    assert not child.ready_file.parent.exists()


def test_a_child_never_waited_ready_leaves_no_folder_behind() -> None:
    child = Child([*PYTHON, "print('done')"], name="toy")
    child.wait_for("done", 30)
    folder = child.ready_file.parent
    assert folder.exists()
    child.proc.wait(30)
    del child  # its reader thread holds it until the output ends
    deadline = time.monotonic() + 10
    while folder.exists() and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.05)
    assert not folder.exists()
    code = (
        "from embedserve.processes import Child\n"
        "import sys\n"
        "c = Child([sys.executable, '-c', 'pass'])\n"
        "print(c.ready_file.parent)\n"
    )
    out = subprocess.run([*PYTHON, code], capture_output=True, text=True, timeout=60, check=True)
    assert not Path(out.stdout.strip()).exists()  # removed when the interpreter exits


def test_a_child_that_exits_before_it_is_ready_is_an_error() -> None:
    child = Child([*PYTHON, "print('bad flag'); raise SystemExit(2)"], name="toy")
    with pytest.raises(RuntimeError, match=r"toy exited \(code 2\) before being ready"):
        child.wait_ready(30)
    hung = Child([*PYTHON, "import time; time.sleep(60)"], name="hung")
    with pytest.raises(TimeoutError, match="hung was not ready within 0.2 s"):
        hung.wait_ready(0.2)
    hung.stop(5)


def test_write_ready_writes_the_named_file_whole_and_only_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_ready({"url": "nowhere"})  # no parent waiting: nothing to do
    path = tmp_path / "ready.json"
    monkeypatch.setenv(READY_FILE_ENV, str(path))
    write_ready({"url": "http://127.0.0.1:8000"})
    assert path.read_text() == '{"url": "http://127.0.0.1:8000"}'
    assert list(path.parent.iterdir()) == [path]  # no partial file left behind
    assert READY_FILE_ENV not in os.environ  # a process we start next is not waited on


# A process that ignores SIGTERM (a stuck event loop) with a child of its own that leads its own
# process group and ignores SIGTERM too (a gateway worker); prints both pids.
STUCK_TREE = (
    "import os, signal, subprocess, sys, time\n"
    "from embedserve.processes import exit_with_parent\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "armed = exit_with_parent(float(sys.argv[1]))\n"
    "code = 'import os, signal, time; os.setpgrp(); signal.signal(signal.SIGTERM, signal.SIG_IGN);"
    " time.sleep(60)'\n"
    "worker = subprocess.Popen([sys.executable, '-c', code])\n"
    "print('pids', os.getpid(), worker.pid, armed, flush=True); time.sleep(60)\n"
)


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(map(alive, pids)):
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def test_stop_kills_a_stuck_child_and_the_process_groups_below_it() -> None:
    child = Child([*PYTHON, STUCK_TREE, "60"], name="stuck")
    pids = [int(p) for p in child.wait_for(r"pids (\d+) (\d+)", 30).groups()]
    start = time.monotonic()
    child.stop(timeout=0.5)
    assert time.monotonic() - start < 5
    assert wait_gone(pids, 5) == []  # the worker in its own process group too


def test_a_stuck_child_ends_itself_and_its_workers_a_grace_after_its_launcher_dies() -> None:
    # the launcher (`serve`) starts the stuck tree as a Child, then is killed with SIGKILL
    launcher = (
        "import sys, time\n"
        "from embedserve.processes import Child\n"
        f"c = Child([sys.executable, '-c', {STUCK_TREE!r}, '0.5'], relay=sys.stdout)\n"
        "time.sleep(60)\n"
    )
    top = Child([*PYTHON, launcher], name="launcher")
    m = top.wait_for(r"pids (\d+) (\d+) (\w+)", 30)
    assert m.group(3) == "True"  # armed: started by a Child
    pids = [int(m.group(1)), int(m.group(2))]
    os.kill(top.proc.pid, signal.SIGKILL)
    top.proc.wait(5)
    assert alive(pids[0])  # SIGTERM (the parent-death signal) alone did not end it...
    assert wait_gone(pids, 5) == []  # ...the watch did, 0.5 s later, its worker first


def test_a_process_started_by_hand_never_ends_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PARENT_PID_ENV, raising=False)
    assert exit_with_parent(0.1) is False
    # not our parent: an inherited, stale value (pid 1 is ours when our launcher went away)
    monkeypatch.setenv(PARENT_PID_ENV, "1" if os.getppid() != 1 else "2")
    assert exit_with_parent(0.1) is False


def test_a_relay_that_cannot_write_never_blocks_the_child() -> None:
    """The terminal `serve` relays to went away: the reader thread died on the write error and
    the child blocked on a full pipe (a gateway hung inside a log call)."""

    class Gone(io.StringIO):
        def write(self, s: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

    child = Child(
        [sys.executable, "-c", "import sys\nfor i in range(20000): print('x' * 100, i)"],
        relay=Gone(),
    )
    try:
        assert child.proc.wait(30) == 0  # 2 MB of output: far past a pipe's 64 KB
    finally:
        child.stop(1)


def test_a_status_line_is_one_write_with_its_newline(monkeypatch: pytest.MonkeyPatch) -> None:
    """`say` hands the line and its newline to the stream at once: on a pipe shared with other
    processes, a write of under PIPE_BUF bytes is never split by another's (the ready line
    once read "…:45761replica": a worker's log line had landed between `print`'s two writes)."""
    writes: list[str] = []

    class Stream(io.StringIO):
        def write(self, text: str) -> int:
            writes.append(text)
            return len(text)

    monkeypatch.setattr(sys, "stdout", Stream())
    say("embedserve: serving minilm at http://127.0.0.1:45761")
    assert writes == ["embedserve: serving minilm at http://127.0.0.1:45761\n"]


def test_a_signal_sets_the_event_without_its_lock() -> None:
    event = threading.Event()
    handler = set_on_signal(event)
    with event._cond:  # held by this thread, as inside `event.wait` when the signal lands
        handler(signal.SIGTERM, None)  # returns: blocking here was the hang
        assert not event.is_set()
    assert event.wait(5)


SIGNALLED = """
import signal, sys, threading
from embedserve.processes import set_on_signal
stop = threading.Event()
signal.signal(signal.SIGTERM, set_on_signal(stop))
print("waiting", flush=True)
while not stop.wait(0.0001):  # the main thread in and out of the event's lock
    pass
print("stopped", flush=True)
"""


def test_many_quick_signals_stop_a_process_waiting_on_the_event() -> None:
    # `lambda signum, frame: stop.set()` as the handler hung here in 2 of 4 runs
    child = Child([*PYTHON, SIGNALLED])
    try:
        child.wait_for("waiting", timeout=30)
        for _ in range(50):
            child.signal(signal.SIGTERM)
        child.wait_for("stopped", timeout=10)
        assert child.proc.wait(10) == 0
    finally:
        child.stop(1)  # a hung child is killed, not left behind
