"""Imported by Python at start-up in each process of a test that puts this folder on PYTHONPATH
(`tests/server/faults.py`, `fault_env`): the server's engine fails when this process claims the
switch file. Nothing here runs in any other process."""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository: `tests` importable

from tests.server.faults import SWITCH_ENV, install

install(Path(os.environ[SWITCH_ENV]))
