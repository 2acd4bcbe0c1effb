"""`embedserve serve | server | gateway`: starting the serving processes (see issue: serving stack)."""

from __future__ import annotations

import argparse


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register the serving subcommands."""
