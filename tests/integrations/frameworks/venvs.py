"""One cached virtualenv per trainer framework, for the tests that drive the frameworks' real code.

verl, AReaL and OpenRLHF do not install beside this project's pins (nor beside each other: verl 0.7 needs
numpy < 2, verl 0.9 numpy >= 2 and transformers < 5.11, AReaL transformers <= 5.3), and their full
dependency sets pull GPU stacks (vLLM, flash-attn, DeepSpeed) that cannot run here. Each venv therefore
gets the framework itself with ``--no-deps``, the CPU build of torch, and the packages its data path
really imports, listed in ``pins/<name>.txt`` (one pip requirement per line; a line ``--no-deps PKG``
is not needed: every line is installed with ``--no-deps``).

The venvs live outside the work tree, under ``$RLVR_FRAMEWORK_VENVS`` (default
``~/.cache/rlvr-selector/venvs``), in a folder named after the framework and a hash of its pins, the
torch pin and the Python version: a rerun (or CI on the same machine) reuses them, and changing a pin
builds a new one. A venv is complete once its ``.complete`` stamp exists; a failed build leaves no stamp
and raises `VenvError` with pip's output.

Usage: ``python tests/integrations/frameworks/venvs.py [NAME ...]`` builds the named venvs (all by default) and
prints one JSON line per venv with the seconds it took (0 when cached).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
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


def _pip(python: Path, args: list[str], log: list[str]) -> None:
    cmd = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    # pip's index warnings about local mirror folders that do not exist are noise.
    out = "\n".join(
        line
        for line in (proc.stdout + proc.stderr).splitlines()
        if "is ignored: it is neither a file nor a directory" not in line
    )
    log.append(f"$ {' '.join(cmd)}\n{out}")
    if proc.returncode != 0:
        raise VenvError(f"pip failed (exit {proc.returncode}) installing {' '.join(args)}:\n{out[-6000:]}")


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
    subprocess.run([sys.executable, "-m", "venv", str(target)], check=True)
    log: list[str] = []
    try:
        # The CPU torch first, alone: a requirement that admits torch must find it installed, or pip
        # would fetch a multi-GB CUDA build.
        _pip(python, [TORCH_PIN], log)
        _pip(python, ["--no-deps", *requirements(name)], log)
    except VenvError:
        (target / "build.log").write_text("\n".join(log))
        raise
    (target / "build.log").write_text("\n".join(log))
    (target / ".complete").write_text(json.dumps({"seconds": round(time.monotonic() - started, 1)}))
    return python, time.monotonic() - started


def main(argv: list[str]) -> int:
    names = argv or NAMES
    failed = False
    for name in names:
        try:
            python, seconds = ensure(name)
            print(json.dumps({"venv": name, "path": str(python.parent.parent), "build_s": round(seconds, 1)}))
        except VenvError as exc:
            failed = True
            print(json.dumps({"venv": name, "error": str(exc)[-2000:]}))
        sys.stdout.flush()
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
