"""The client package as a trainer's environment gets it: its wheel, built once per test session from
client/, installed WITH its dependencies (as `pip install rlvr-selector-client` would) into a venv.

`install` records the venv's packages before and after and says what the install changed: a package
that was already there and has another version (or is gone) afterwards means the client would move a
trainer's pins. The framework drivers then import the client from the venv's site-packages, not from the
repository (client/ is not on their path).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import threading
from functools import cache
from pathlib import Path
from typing import Any

from tests.integrations.frameworks import venvs

ROOT = Path(__file__).resolve().parents[3]
DISTRIBUTION = "rlvr-selector-client"


def _canonical(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(".", "-")


@cache
def wheel() -> Path:
    """The client's wheel, built from client/ without dependencies (`make dist` builds the same)."""
    return build_wheel(ROOT / "client")


def build_wheel(source: Path) -> Path:
    """The wheel of the distribution whose pyproject.toml is in `source`, built without dependencies."""
    out = Path(tempfile.mkdtemp(prefix="rlvr-wheel-"))
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--wheel-dir", str(out), str(source)],
        capture_output=True,
        text=True,
    )
    built = sorted(out.glob("*.whl"))
    if proc.returncode != 0 or len(built) != 1:
        raise venvs.VenvError(
            f"building the wheel of {source} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
        )
    return built[0]


def freeze(python: Path) -> dict[str, str]:
    """{distribution: version} of what is installed in the venv of `python`."""
    uv = venvs.uv_binary()
    if uv is None:
        cmd = [str(python), "-m", "pip", "freeze", "--all", "--disable-pip-version-check"]
    else:
        cmd = [uv, "pip", "freeze", "--python", str(python)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
    out: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, version = line.partition("==")
        if not sep:  # `name @ file:///...`
            name, _, version = line.partition(" @ ")
        out[_canonical(name)] = version.strip()
    return out


def install(python: Path) -> dict[str, Any]:
    """Installs the client wheel with its dependencies into the venv of `python` (replacing an earlier
    build of it) and returns what moved: ``changed`` {name: [before, after]} for packages that were there
    before (the client itself aside), ``added`` {name: version}."""
    before = freeze(python)
    log: list[str] = []
    if venvs.uv_binary() is None:
        subprocess.run(
            [str(python), "-m", "pip", "uninstall", "-q", "-y", DISTRIBUTION],
            capture_output=True,
            check=False,
        )
        venvs._install(python, [str(wheel())], log)
    else:
        venvs._install(python, ["--reinstall-package", DISTRIBUTION, str(wheel())], log)
    after = freeze(python)
    changed = {
        name: [version, after.get(name)]
        for name, version in before.items()
        if name != DISTRIBUTION and after.get(name) != version
    }
    added = {name: version for name, version in after.items() if name not in before}
    return {"changed": changed, "added": added, "log": "\n".join(log)}


_DONE: dict[Path, dict[str, Any]] = {}
_LOCK = threading.Lock()


def ensure_installed(python: Path) -> dict[str, Any]:
    """`install`, once per venv and test session."""
    with _LOCK:
        if python not in _DONE:
            _DONE[python] = install(python)
        return _DONE[python]
