"""FAULT INJECTION, for tests only: an engine whose every step fails, in a real server process.

The end-to-end tests need a replica that breaks the way a GPU with a sticky error does (every
batch fails, the process lives) under a real `embedserve serve`, whose restarted replica must
then serve normally. The product holds no hook for it: a test puts `FAULT_SITE` on PYTHONPATH
(`fault_env`), so each process it starts imports `fault_site/sitecustomize.py` at start-up,
which wraps `embedserve.server.main._build_engine` when that module is imported: the engine
fails once built, warmed up and measured, as a device that breaks while serving. The switch is a
file, claimed once: the first server process that finds it removes it and fails every engine
step from then on (RuntimeError "fault injection: ..."); the others, and every later one (its
replacement included), serve as usual.
"""

from __future__ import annotations

import dataclasses
import importlib.abc
import importlib.util
import os
import sys
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType
from typing import Any

FAULT_SITE = Path(__file__).resolve().parent / "fault_site"
SWITCH_ENV = "EMBEDSERVE_TEST_FAIL_STEPS"  # the switch file's path, read by fault_site alone
WRAPPED = "embedserve.server.main"


class FailingEngine:
    """`engine` with every `step` raising; everything else is the engine's own."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine
        self.failed_steps = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def seam(self) -> Any:
        """The engine's record with this `step` (the one the server runs)."""
        return dataclasses.replace(self._engine.seam(), step=self.step)

    def step(self, batch: Any) -> Any:
        self.failed_steps += 1
        raise RuntimeError(f"fault injection: engine step {self.failed_steps} fails")


def inject_faults(engine: Any, switch: Path) -> Any:
    """`engine`, or a `FailingEngine` around it when this process claims the file `switch`."""
    try:
        switch.unlink()  # one process alone succeeds: that one is the faulty replica
    except FileNotFoundError:
        return engine
    return FailingEngine(engine)


def wrap_build_engine(module: ModuleType, switch: Path) -> None:
    """`module._build_engine` (the server's, `server.main`: an engine and its batch budget) with
    `inject_faults` on its engine."""
    build: Callable[..., tuple[Any, Any]] = module._build_engine

    def build_faulty(config: Any) -> tuple[Any, Any]:
        engine, budget = build(config)
        return inject_faults(engine, switch), budget

    module._build_engine = build_faulty


class _WrapOnImport(importlib.abc.MetaPathFinder):
    """Finds `server.main` as Python would, and wraps its `_build_engine` once it has run."""

    def __init__(self, switch: Path) -> None:
        self.switch = switch

    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if name != WRAPPED:
            return None
        sys.meta_path.remove(self)  # once; and the look-up below must not find this finder
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        loader: Any = spec.loader
        run = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            wrap_build_engine(module, self.switch)

        loader.exec_module = exec_module
        return spec


def install(switch: Path) -> None:
    """Wraps the server's `_build_engine` in this process when `server.main` is imported."""
    if WRAPPED in sys.modules:
        wrap_build_engine(sys.modules[WRAPPED], switch)
    else:
        sys.meta_path.insert(0, _WrapOnImport(switch))


def fault_env(switch: Path) -> dict[str, str]:
    """The environment under which the processes a test starts claim `switch` (see above)."""
    path = os.pathsep.join(p for p in (str(FAULT_SITE), os.environ.get("PYTHONPATH")) if p)
    return {"PYTHONPATH": path, SWITCH_ENV: str(switch)}
