"""`embedserve make-checkpoint`: exact-config model folders with random weights."""

from __future__ import annotations

import argparse


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register the checkpoint subcommands."""
