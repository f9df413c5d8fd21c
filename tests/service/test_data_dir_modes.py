"""The embedded store's data directory is private to the user who runs the service, whatever the umask:
directories 0700, files 0600, including the files Valkey creates while it runs (the append-only file and
its rewrites) and a directory an older version left readable to everyone."""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.utils import ServiceProcess

pytestmark = pytest.mark.slow
TOKEN = "data-dir-modes-token-0123456789"


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def modes(root: Path) -> dict[str, int]:
    """Relative path -> permission bits of `root` and everything under it (links not followed)."""
    found = {".": stat.S_IMODE(root.lstat().st_mode)}
    for path in root.rglob("*"):
        found[str(path.relative_to(root))] = stat.S_IMODE(path.lstat().st_mode)
    return found


def public(root: Path) -> dict[str, str]:
    """The entries under `root` that anyone but their owner may read, write or enter."""
    return {name: oct(mode) for name, mode in modes(root).items() if mode & 0o077}


def test_every_file_of_the_store_is_private_whatever_the_umask(tmp_path, dsname):
    data = tmp_path / "data"
    with umask(0o000):  # the most permissive umask a user can have: the service must not rely on it
        svc = ServiceProcess(data_dir=str(data), env={"SELECTOR_API_TOKEN": TOKEN}).start()
    try:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        with httpx.Client(base_url=svc.url, headers=auth, timeout=60) as http:
            assert http.post("/datasets", json={"name": dsname, "size": 50}).status_code == 201
            body = {"dataset": dsname, "step": 0, "request_id": f"{dsname}-0", "results": []}
            body["results"] = [{"prompt_id": i, "successes": 1, "trials": 2} for i in range(20)]
            assert http.post("/observe", json=body).status_code == 200
        assert (data / "appendonlydir").is_dir() and any((data / "appendonlydir").iterdir())
        assert public(data) == {}
    finally:
        svc.stop()
    assert public(data) == {}


def test_a_directory_left_readable_by_an_older_version_is_made_private_at_start(tmp_path, dsname):
    data = tmp_path / "old"
    aof = data / "appendonlydir"
    aof.mkdir(parents=True, mode=0o755)
    os.chmod(data, 0o755)
    os.chmod(aof, 0o755)
    stray = data / "notes.txt"
    stray.write_text("left by an operator")
    os.chmod(stray, 0o644)
    assert public(data)  # the starting point: readable by everyone
    with umask(0o022):
        svc = ServiceProcess(data_dir=str(data)).start()
    try:
        assert public(data) == {}
        assert httpx.post(f"{svc.url}/datasets", json={"name": dsname, "size": 10}).status_code == 201
    finally:
        svc.stop()
    assert public(data) == {}
