"""What else the machine is doing: load average, CPU used by a process tree or by everything
outside this run, resident memory; and waiting for an idle machine before a measurement."""

from __future__ import annotations

import os
import time
from pathlib import Path

from embedserve.processes import descendants

T0 = [time.monotonic()]  # `say`'s origin: reset by a script when its measured run begins


def say(message: str) -> None:
    """A progress line stamped with the seconds since T0."""
    print(f"[{time.monotonic() - T0[0]:4.0f} s] {message}", flush=True)


def load1() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def rss_mb(pids: set[int]) -> float:
    """Resident memory of `pids` together, MiB (processes gone meanwhile count 0)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        except (OSError, StopIteration):
            continue
    return total / 1024


def cpu_seconds(pid: int, reaped: bool = False, below: bool = True) -> float:
    """User + system CPU time of `pid` and every live process below it (`reaped`: and of the
    children they have waited for, e.g. finished client processes; `below` False: `pid`'s own)."""
    total = 0
    for p in {pid, *(descendants(pid) if below else ())}:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += sum(int(x) for x in fields[11 : 15 if reaped else 13])
        except (OSError, IndexError, ValueError):
            continue
    return total / os.sysconf("SC_CLK_TCK")


def thread_seconds(pid: int) -> dict[int, tuple[str, float]]:
    """Each live thread of `pid`: its name ("loop" for the main thread; the server names its
    own: `processes.name_os_thread`) and its user + system CPU seconds so far."""
    out: dict[int, tuple[str, float]] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:  # the process is gone
        return out
    tick = os.sysconf("SC_CLK_TCK")
    for tid in map(int, tids):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue
        name = "loop" if tid == pid else stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat.rsplit(")", 1)[1].split()
        out[tid] = (name, (int(fields[11]) + int(fields[12])) / tick)
    return out


def thread_cores(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]], seconds: float
) -> dict[str, float]:
    """Cores used per thread name between two `thread_seconds` snapshots, over `seconds`:
    threads alive at both only (one that ended in between is not counted, none goes negative)."""
    out: dict[str, float] = {}
    for tid, (name, used) in after.items():
        if tid in before:
            out[name] = out.get(name, 0.0) + (used - before[tid][1]) / seconds
    return out


class CpuMeter:
    """From its creation: cores' worth of CPU used by processes outside this run (all busy time
    in /proc/stat less this run's, finished clients included) and stolen by the hypervisor."""

    def __init__(self) -> None:
        self.t, self.busy, self.steal, self.ours = self._read()

    @staticmethod
    def _read() -> tuple[float, float, float, float]:
        f = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        tick = os.sysconf("SC_CLK_TCK")
        busy = (f[0] + f[1] + f[2] + f[5] + f[6]) / tick  # user nice system irq softirq
        return time.monotonic(), busy, f[7] / tick, cpu_seconds(os.getpid(), reaped=True)

    def busy_cores(self) -> float:
        """Cores' worth of CPU busy since creation, everything on the machine (this run too)."""
        t, busy, _, _ = self._read()
        return (busy - self.busy) / (t - self.t)

    def cores(self) -> tuple[float, float]:
        t, busy, steal, ours = self._read()
        dt = t - self.t
        return max(0.0, (busy - self.busy) - (ours - self.ours)) / dt, (steal - self.steal) / dt


def others_cpu(seconds: float = 4.0) -> float:
    """Cores' worth of CPU used over the next `seconds` by processes outside this run."""
    meter = CpuMeter()
    time.sleep(seconds)
    return meter.cores()[0]


def wait_idle(threshold: float, allowed: float) -> tuple[float, float, float]:
    """Until the 1-minute load average is below `threshold`, at most `allowed` seconds:
    (load before, seconds waited, load after)."""
    w0, before = time.monotonic(), load1()
    last_said = w0
    while load1() >= threshold and time.monotonic() - w0 < allowed:
        time.sleep(2.0)
        if time.monotonic() - last_said > 30:
            last_said = time.monotonic()
            say(f"  waiting for load < {threshold}: {load1():.2f}")
    return before, time.monotonic() - w0, load1()
