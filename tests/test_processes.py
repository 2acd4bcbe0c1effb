"""The child-process helper: ready lines, a child that exits or hangs first, stop and kill."""

from __future__ import annotations

import io
import sys
import threading

import pytest

from embedserve.processes import Child

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
