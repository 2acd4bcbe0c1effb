"""The child-process helper: ready records and lines, a child that exits or hangs first, stop and
kill."""

from __future__ import annotations

import io
import os
import sys
import threading
from pathlib import Path

import pytest

from embedserve.processes import READY_FILE_ENV, Child, write_ready

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
