"""The OpenMP wait policy the offline API sets before torch loads (`embedserve.cpu_threads`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from embedserve.cpu_threads import SPIN_COUNT, spin_env


def test_a_bounded_spin_when_the_user_chose_nothing() -> None:
    assert spin_env({"PATH": "/bin"}) == {"GOMP_SPINCOUNT": str(SPIN_COUNT)}


def test_a_policy_the_user_set_is_kept_even_empty() -> None:
    for env in ({"OMP_WAIT_POLICY": "PASSIVE"}, {"GOMP_SPINCOUNT": "5"}, {"OMP_WAIT_POLICY": ""}):
        assert spin_env(env) == {}


def _policy_after_import(env: dict[str, str]) -> dict[str, str | None]:
    code = (
        "import os, json, embedserve.embedder, torch; "
        "print(json.dumps({k: os.environ.get(k) for k in ('OMP_WAIT_POLICY', 'GOMP_SPINCOUNT')}))"
    )
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    out = subprocess.run(
        [sys.executable, "-c", code], env=base | env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_importing_the_offline_api_sets_it_before_torch_loads() -> None:
    assert _policy_after_import({}) == {"OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": str(SPIN_COUNT)}
    assert _policy_after_import({"OMP_WAIT_POLICY": "ACTIVE"}) == {
        "OMP_WAIT_POLICY": "ACTIVE",
        "GOMP_SPINCOUNT": None,
    }


def test_a_server_spins_a_bounded_count_under_active_unless_the_user_chose() -> None:
    from embedserve.cpu_threads import server_spin_env

    # ACTIVE: libgomp's cap on the spin once a process has more OpenMP threads than cores
    assert server_spin_env({}) == {
        "OMP_WAIT_POLICY": "ACTIVE",
        "GOMP_SPINCOUNT": str(SPIN_COUNT),
    }
    assert server_spin_env({"GOMP_SPINCOUNT": "100"})["GOMP_SPINCOUNT"] == str(SPIN_COUNT)
    assert server_spin_env({"OMP_WAIT_POLICY": "PASSIVE"}) == {}
    assert server_spin_env({"OMP_WAIT_POLICY": ""}) == {}  # empty: OpenMP's own default


def test_a_servers_spin_is_a_time_in_rounds_of_this_cpus_pause() -> None:
    """`SERVER_SPIN_SECONDS` in rounds of the measured pause: a CPU of short pauses spins more
    rounds, one of long pauses fewer, never fewer than the offline API's `SPIN_COUNT`."""
    from embedserve._native import pause_ns
    from embedserve.cpu_threads import SERVER_SPIN_SECONDS, server_spin_env, server_spin_rounds

    assert server_spin_rounds(25.0) == round(SERVER_SPIN_SECONDS * 1e9 / 25.0)
    assert server_spin_rounds(10.0) == 2 * server_spin_rounds(20.0)
    assert server_spin_rounds(1e6) == SPIN_COUNT
    assert server_spin_env({}, 123_456)["GOMP_SPINCOUNT"] == "123456"
    measured = pause_ns(rounds=1000, runs=2)
    assert 0.0 < measured < 10_000.0  # nanoseconds: a pause is a few to a few hundred
