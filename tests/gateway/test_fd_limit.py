"""The idle-connection bound engages before the open-file limit (faults IV): under `ulimit -n
1024` the gateway raises the soft limit to the hard one and, where that still leaves too few
descriptors, lowers the bound below it with a warning, so eviction (not EMFILE) meets a flood."""

from __future__ import annotations

import json
import subprocess
import sys

from embedserve.gateway.connections import FD_RESERVE


def _fit(soft: int, hard: int, bound: int) -> dict[str, object]:
    """`fit_to_fd_limit(bound)` in a process started under the limits (soft, hard)."""
    code = (
        "import json, resource\n"
        f"resource.setrlimit(resource.RLIMIT_NOFILE, ({soft}, {hard}))\n"
        "from embedserve.gateway.connections import fit_to_fd_limit\n"
        f"bound, warning = fit_to_fd_limit({bound})\n"
        "print(json.dumps({'bound': bound, 'warning': warning,\n"
        "                  'soft': resource.getrlimit(resource.RLIMIT_NOFILE)[0]}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def test_under_ulimit_1024_the_bound_fits_below_the_limit() -> None:
    fitted = _fit(1024, 1024, 1024)
    assert fitted["bound"] == 1024 - FD_RESERVE and fitted["soft"] == 1024
    assert "open-file limit (1024)" in str(fitted["warning"])


def test_the_soft_limit_is_raised_to_the_hard_one() -> None:
    fitted = _fit(1024, 8192, 1024)
    assert fitted == {"bound": 1024, "warning": None, "soft": 8192}
