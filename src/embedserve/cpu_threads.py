"""How long PyTorch's CPU threads (GNU OpenMP) spin at a barrier before they sleep.

Every operator of a forward is a parallel region; between two of them the second thread waits.
Three ways to wait, measured on 2 CPU cores (AMD EPYC Zen 5), all-MiniLM-L6-v2 at the bf16
default, one short query per call and 192 passages per call, in process, quiet and beside one
busy process (benchmarks/results/studies/cpu-neighbour-cpu2-20261202.json):

| wait | query p50 quiet | neighbour | passages tokens/s quiet | neighbour |
|---|---|---|---|---|
| sleep at once (`OMP_WAIT_POLICY=PASSIVE`) | 8.31 ms | 4.38 ms | 14,187 | 8,420 |
| spin OpenMP's default 300,000 rounds | 3.74 ms | 8.13 ms | 12,913 | 3,824 |
| spin `SPIN_COUNT` rounds (ours) | 2.26 ms | 8.13 ms | 17,532 | 4,785 |

Sleeping at once makes every operator wake the other thread through the kernel (a short query
is ~130 operators); spinning 300,000 rounds keeps a core busy for up to milliseconds after a
forward. The bounded spin bridges the microseconds between two operators of one forward and
gives the core back soon after, so it is the default. On a machine shared with other busy work,
`OMP_WAIT_POLICY=PASSIVE` is the better choice (the table's neighbour columns): set it there.

The offline API (`Embedder`, `Scorer`) sets the bounded spin on import; a server sets its own
(`apply_server`, see its NOTE). OpenMP reads it once, when torch is loaded, so it only
counts before that. A policy the user set is kept: `OMP_WAIT_POLICY` (even empty) everywhere, and
`GOMP_SPINCOUNT` alone by the offline API; a server replaces a `GOMP_SPINCOUNT` given without
`OMP_WAIT_POLICY`, since one inherited from a process that imported the offline API is the common
case and, without ACTIVE, libgomp would cap it at 100 rounds there anyway.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

# rounds of a pause instruction (~20-150 cycles each by CPU): tens to hundreds of microseconds
SPIN_COUNT = 10_000
USER_KEYS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def spin_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables to add to `environ` for the bounded spin: none when the user chose a policy."""
    if any(key in environ for key in USER_KEYS):
        return {}
    return {"GOMP_SPINCOUNT": str(SPIN_COUNT)}


# NOTE: libgomp caps the spin at 100 rounds (1,000 under OMP_WAIT_POLICY=ACTIVE) once a process
# has more OpenMP threads than cores, i.e. once two of its threads have run operators (each leads
# a team): a server builds and steps its engine on one thread (`server.engine_thread`) and spins
# SPIN_COUNT rounds; ACTIVE keeps 1,000 rather than 100 should a second team appear. 1,000 rounds
# was too short between the operators of a forward: one short query over HTTP p50 4.2-6.9 ms with
# 1,000 rounds against 3.8-5.9 ms with SPIN_COUNT, every one of 6 rounds 0.4-1.1 ms faster
# (results/studies/http-ab-cpu2-20261202-4: two servers called in turn).


# A server's spin as a time (`server_spin_rounds`). NOTE: in a server, two forwards are a round
# trip apart (an answer written, the client's next request read: ~0.2 ms), longer than SPIN_COUNT
# rounds on a CPU of short pauses (23.7 ns on Zen 5: 0.24 ms), so the second thread had gone to
# sleep and each forward woke it. 100,000 rounds there (2.4 ms) gave 722 against 601 requests/s
# at 16 clients, every round higher, one client alike (results/studies/one-process-cpu2-20261207-4);
# this 2.5 ms, 858 against 650 and one query 0.11 ms sooner (-5). A pause costs 10 to 150 cycles
# by CPU, so the spin is set as a time, in rounds of this CPU's.
SERVER_SPIN_SECONDS = 0.0025


def server_spin_rounds(pause_ns: float) -> int:
    """SERVER_SPIN_SECONDS in rounds of a pause of `pause_ns` nanoseconds (this CPU's:
    `embedserve._native.pause_ns`), never fewer than SPIN_COUNT."""
    return max(SPIN_COUNT, round(SERVER_SPIN_SECONDS * 1e9 / max(pause_ns, 1e-3)))


def server_spin_env(environ: Mapping[str, str], rounds: int = SPIN_COUNT) -> dict[str, str]:
    """The variables to add to a server's `environ` for a spin of `rounds`: none when the user
    chose a wait policy (OMP_WAIT_POLICY, even empty)."""
    if "OMP_WAIT_POLICY" in environ:
        return {}
    return {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": str(rounds)}


def apply_server(rounds: int = SPIN_COUNT) -> None:
    """`apply` for a server process (`server.main`), before it loads torch."""
    if "torch" not in sys.modules:
        os.environ.update(server_spin_env(os.environ, rounds))


def apply() -> None:
    """Set the bounded spin in this process, if torch is not loaded yet (else it is too late)."""
    if "torch" not in sys.modules:
        os.environ.update(spin_env(os.environ))


apply()
