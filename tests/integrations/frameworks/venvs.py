"""One cached virtualenv per trainer framework, for the tests that drive the frameworks' real code.

verl, AReaL and OpenRLHF do not install beside this project's pins (nor beside each other: verl 0.7 needs
numpy < 2, verl 0.9 numpy >= 2 and transformers < 5.11, AReaL transformers <= 5.3), and their full
dependency sets pull GPU stacks (vLLM, flash-attn, DeepSpeed) that cannot run here. Each venv therefore
gets the framework itself with ``--no-deps``, the CPU build of torch, and the packages its data path
really imports, listed in ``pins/<name>.txt`` (one pip requirement per line; a line ``--no-deps PKG``
is not needed: every line is installed with ``--no-deps``).

Builds use `uv` (``uv pip install --python <venv python>``; the ``uv`` package is in the test extra)
when it is importable or on PATH, with pip's own settings carried over (its find-links, extra indexes
that exist and certificate), and fall back to pip otherwise. `ensure_all` builds several venvs at once,
one thread each: the downloads and unpacking overlap instead of running one after the other.

The venvs live outside the work tree, under ``$RLVR_FRAMEWORK_VENVS`` (default
``~/.cache/rlvr-selector/venvs``), in a folder named after the framework and a hash of its pins, the
torch pin and the Python version: a rerun (or CI on the same machine) reuses them, and changing a pin
builds a new one. A venv is complete once its ``.complete`` stamp exists; a failed build leaves no stamp
and raises `VenvError` with pip's output.

Usage: ``python tests/integrations/frameworks/venvs.py [NAME ...]`` builds the named venvs (all by default, at the
same time) and prints one JSON line per venv with the seconds it took (0 when cached), then the total.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path

HERE = Path(__file__).resolve().parent
PINS = HERE / "pins"
TORCH_PIN = os.environ.get("TORCH_PIN", "torch==2.13.0")
NAMES = sorted(p.stem for p in PINS.glob("*.txt"))


class VenvError(RuntimeError):
    """A framework venv could not be built; the message holds pip's output."""


def cache_root() -> Path:
    return Path(os.environ.get("RLVR_FRAMEWORK_VENVS", Path.home() / ".cache" / "rlvr-selector" / "venvs"))


def requirements(name: str) -> list[str]:
    path = PINS / f"{name}.txt"
    if not path.exists():
        raise VenvError(f"no pins for framework {name!r}; known: {', '.join(NAMES)}")
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]


def venv_dir(name: str) -> Path:
    digest = hashlib.sha256()
    digest.update("\n".join(requirements(name)).encode())
    digest.update(TORCH_PIN.encode())
    digest.update(f"{sys.version_info.major}.{sys.version_info.minor}".encode())
    return cache_root() / f"{name}-{digest.hexdigest()[:12]}"


@cache
def uv_binary() -> str | None:
    """The uv executable: the one the ``uv`` package put beside this Python, else one on PATH; None when
    neither (pip is used).

    Not `uv.find_uv_bin()`: it reads `sysconfig`, whose first initialisation is not thread-safe, and the
    venvs are built from several threads at once (a concurrent first call saw EXE as None)."""
    if os.environ.get("RLVR_VENVS_NO_UV"):
        return None
    beside = Path(sys.executable).parent / "uv"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("uv")


@cache
def _pip_settings() -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """pip's configured find-links, extra indexes and certificate, as uv arguments and environment.

    uv does not read pip.conf; without these it would miss wheels only pip's configuration points at
    (a local CPU torch, say). Index folders that do not exist are left out, as pip ignores them."""
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
    )
    values: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        key, _, raw = line.partition("=")
        values[key.split(".", 1)[-1]] = raw.strip().strip("'\"")
    args: list[str] = []
    for key, flag in (
        ("index-url", "--index-url"),
        ("extra-index-url", "--extra-index-url"),
        ("find-links", "--find-links"),
    ):
        for location in shlex.split(values.get(key, "")):
            is_local = "://" not in location or location.startswith("file://")
            if is_local and not Path(location.removeprefix("file://")).exists():
                continue
            args += [flag, location]
    env: list[tuple[str, str]] = []
    cert = values.get("cert") or os.environ.get("PIP_CERT")
    if cert and not os.environ.get("SSL_CERT_FILE"):
        env.append(("SSL_CERT_FILE", cert))
    return tuple(args), tuple(env)


def _run(cmd: list[str], log: list[str], what: str, env: dict[str, str] | None = None) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    # pip's index warnings about local mirror folders that do not exist are noise.
    out = "\n".join(
        line
        for line in (proc.stdout + proc.stderr).splitlines()
        if "is ignored: it is neither a file nor a directory" not in line
    )
    log.append(f"$ {' '.join(cmd)}\n{out}")
    if proc.returncode != 0:
        tool = "uv pip" if "uv" in Path(cmd[0]).name else "pip"
        raise VenvError(f"{tool} failed (exit {proc.returncode}) installing {what}:\n{out[-6000:]}")


def _install(python: Path, args: list[str], log: list[str]) -> None:
    uv = uv_binary()
    if uv is None:
        cmd = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", *args]
        _run(cmd, log, " ".join(args))
        return
    extra, env_pairs = _pip_settings()
    env = dict(os.environ, **dict(env_pairs))
    # pip picks the best version across all its indexes; uv's default stops at the first index that
    # knows the package.
    cmd = [uv, "pip", "install", "--python", str(python), "--index-strategy", "unsafe-best-match"]
    _run([*cmd, *extra, *args], log, " ".join(args), env)


def _create(target: Path, log: list[str]) -> None:
    uv = uv_binary()
    if uv is None:
        cmd = [sys.executable, "-m", "venv", str(target)]
    else:
        cmd = [uv, "venv", "--quiet", "--python", sys.executable, str(target)]
    _run(cmd, log, f"the virtualenv {target}")


def ensure(name: str) -> tuple[Path, float]:
    """The venv's python, built if needed, and the seconds the build took (0.0 when cached)."""
    target = venv_dir(name)
    python = target / "bin" / "python"
    if (target / ".complete").exists():
        return python, 0.0
    started = time.monotonic()
    if target.exists():
        shutil.rmtree(target)  # a build that died half-way
    target.parent.mkdir(parents=True, exist_ok=True)
    log: list[str] = []
    try:
        _create(target, log)
        # The CPU torch first, alone: a requirement that admits torch must find it installed, or the
        # installer would fetch a multi-GB CUDA build.
        _install(python, [TORCH_PIN], log)
        _install(python, ["--no-deps", *requirements(name)], log)
    except VenvError:
        target.mkdir(parents=True, exist_ok=True)
        (target / "build.log").write_text("\n".join(log))
        raise
    (target / "build.log").write_text("\n".join(log))
    (target / ".complete").write_text(json.dumps({"seconds": round(time.monotonic() - started, 1)}))
    return python, time.monotonic() - started


_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


def ensure_locked(name: str) -> tuple[Path, float]:
    """`ensure`, serialised per venv within this process (a test may ask while `ensure_all` builds)."""
    with _LOCKS_GUARD:
        lock = _LOCKS.setdefault(name, threading.Lock())
    with lock:
        return ensure(name)


def ensure_all(names: list[str] | None = None) -> dict[str, tuple[Path, float] | VenvError]:
    """Build the named venvs (all by default) concurrently; each name maps to `ensure`'s result or the
    `VenvError` its build raised."""
    names = list(names or NAMES)
    out: dict[str, tuple[Path, float] | VenvError] = {}

    def build(name: str) -> None:
        try:
            out[name] = ensure_locked(name)
        except VenvError as exc:
            out[name] = exc

    uv_binary()  # resolved once, before the threads
    with ThreadPoolExecutor(max_workers=max(1, len(names))) as pool:
        list(pool.map(build, names))
    return {name: out[name] for name in names}


def main(argv: list[str]) -> int:
    started = time.monotonic()
    failed = False
    for name, result in ensure_all(argv or NAMES).items():
        if isinstance(result, VenvError):
            failed = True
            print(json.dumps({"venv": name, "error": str(result)[-2000:]}))
        else:
            python, seconds = result
            print(json.dumps({"venv": name, "path": str(python.parent.parent), "build_s": round(seconds, 1)}))
        sys.stdout.flush()
    print(
        json.dumps(
            {"total_s": round(time.monotonic() - started, 1), "installer": "uv" if uv_binary() else "pip"}
        )
    )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
