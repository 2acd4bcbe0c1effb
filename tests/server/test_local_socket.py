"""The local socket lives in this user's private folder: nobody else can reach it or take its name,
and a folder of that name we cannot trust is never used."""

from __future__ import annotations

import asyncio
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

import pytest

from embedserve.contract.local import local_socket_for, socket_dir, socket_path
from embedserve.server.local import serve_local


@pytest.fixture
def tmp_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_the_socket_is_in_a_folder_of_ours_that_only_we_can_enter(tmp_dir: Path) -> None:
    path = socket_path(4321)
    assert path is not None and path.parent.parent == tmp_dir
    info = os.lstat(path.parent)
    assert info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) == 0o700
    assert socket_path(4321) == path  # the same name each time: a gateway finds it by the port


@pytest.mark.parametrize("kind", ["open to others", "a link", "a file"])
def test_a_folder_name_we_cannot_trust_is_not_used(tmp_dir: Path, kind: str) -> None:
    name = tmp_dir / f"embedserve-{os.getuid()}"
    if kind == "open to others":
        name.mkdir(mode=0o777)
        name.chmod(0o777)
    elif kind == "a link":
        elsewhere = tmp_dir / "elsewhere"
        elsewhere.mkdir(mode=0o700)
        name.symlink_to(elsewhere)
    else:
        name.touch()
    assert socket_dir() is None and socket_path(4321) is None
    assert local_socket_for("127.0.0.1:4321") is None  # the gateway calls over gRPC then


def test_a_stale_socket_of_ours_is_replaced_and_removed_on_stop(tmp_dir: Path) -> None:
    path = socket_path(4322)
    assert path is not None
    path.touch()  # left by a server that was killed

    async def answer(request: Any) -> Any:
        raise AssertionError("not called")

    async def main() -> None:
        local = await serve_local(path, answer)
        assert stat.S_ISSOCK(os.lstat(path).st_mode)
        assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600
        assert local_socket_for("127.0.0.1:4322") == path
        await local.stop(0)
        assert not path.exists()

    asyncio.run(main())
