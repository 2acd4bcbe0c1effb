"""The API key file: one key per line, blank lines and comments (indented or not) skipped."""

from __future__ import annotations

from pathlib import Path

import pytest

from embedserve.gateway.auth import KeyRing, read_key_file


def test_key_file_skips_blank_lines_and_comments_however_indented(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("# rotated 2026-12-01\n  key-one  \n\n   # an indented note\n\tkey-two\n")
    assert read_key_file(path) == {b"key-one", b"key-two"}


def test_key_file_of_comments_only_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("  # x\n# y\n")
    with pytest.raises(ValueError, match="no keys in it"):
        read_key_file(path)


def test_reload_keeps_the_keys_in_force_when_the_file_breaks(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("old\n")
    ring = KeyRing(["fixed"], str(path))
    assert ring() == {b"fixed", b"old"}
    path.write_text("  # only a comment now\n")
    ring.reload()
    assert ring() == {b"fixed", b"old"}
    path.write_text("new\n")
    ring.reload()
    assert ring() == {b"fixed", b"new"}
