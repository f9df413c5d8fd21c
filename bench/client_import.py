"""How long importing the client package takes in a trainer's environment: a bare venv holding only the
client's wheel and what it requires. Goal: under 0.3 s.

    python bench/client_import.py [--repeats 15] [--wheel PATH] [--out bench/out/client_import.json]

Builds the client's wheel from client/ (or takes --wheel), creates a bare venv in a temporary folder
(uv when available, else `python -m venv`), installs the wheel with its dependencies, and then times,
each in a fresh interpreter, after one warm-up run that writes the bytecode caches:

- ``httpx``: ``import httpx`` alone, the one requirement, for reference;
- ``client``: ``from rlvr_selector_client import SelectorClient`` (httpx and the client);
- ``integrations``: ``import rlvr_selector_client.integrations`` (what every adapter shares: the options,
  the step sampler, request ids; an adapter then imports its framework, which is the trainer's cost);
- ``process``: a whole ``python -c "import rlvr_selector_client"`` run, wall clock, minus a bare
  ``python -c pass`` run (the interpreter's own start).

The first two are measured inside the child (``time.perf_counter`` around the import statement). Each
is reported as the median and the maximum over --repeats runs; the cold first import (bytecode written)
is reported apart, and so is the machine's load average: on a loaded machine every import is slower,
httpx's included. Prints one JSON line last.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import OUT_DIR, ROOT, add_out, emit, parser

GOAL_S = 0.3
TIMED = {
    "httpx": "import httpx",
    "client": "from rlvr_selector_client import SelectorClient",
    "integrations": "import rlvr_selector_client.integrations",
}
CHILD = "import time; t = time.perf_counter(); {statement}; print(time.perf_counter() - t)"


def build_wheel(folder: Path) -> Path:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--wheel-dir",
            str(folder),
            str(ROOT / "client"),
        ],
        check=True,
    )
    return sorted(folder.glob("rlvr_selector_client-*.whl"))[-1]


def bare_venv(folder: Path, wheel: Path) -> tuple[Path, str]:
    """A venv with the wheel and its requirements; its python and the installer used."""
    uv = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
    python = folder / "bin" / "python"
    if Path(uv).is_file():
        subprocess.run([uv, "venv", "--quiet", "--python", sys.executable, str(folder)], check=True)
        subprocess.run([uv, "pip", "install", "--quiet", "--python", str(python), str(wheel)], check=True)
        return python, "uv"
    subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", str(wheel)], check=True)
    return python, "pip"


#: The bare venv's processes run without the caller's PYTHONPATH: a path into the repository would put
#: its editable installs' metadata (and anything importable there) into the "bare" venv.
BARE_ENV = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}


def child_seconds(python: Path, statement: str) -> float:
    out = subprocess.run(
        [str(python), "-c", CHILD.format(statement=statement)],
        capture_output=True,
        text=True,
        check=True,
        cwd=python.parent,
        env=BARE_ENV,
    )
    return float(out.stdout.strip())


def process_seconds(python: Path, code: str) -> float:
    started = time.perf_counter()
    subprocess.run([str(python), "-c", code], check=True, cwd=python.parent, env=BARE_ENV)
    return time.perf_counter() - started


def summary(values: list[float]) -> dict[str, float]:
    return {"median_s": round(statistics.median(values), 4), "max_s": round(max(values), 4)}


def main() -> None:
    cli = parser(__doc__)
    cli.add_argument("--repeats", type=int, default=15, help="timed runs of each import (default 15)")
    cli.add_argument("--wheel", type=Path, help="the client wheel to install (default: built from client/)")
    add_out(cli, OUT_DIR / "client_import.json")
    args = cli.parse_args()
    with tempfile.TemporaryDirectory(prefix="client-import-") as tmp:
        wheel = args.wheel or build_wheel(Path(tmp) / "wheel")
        python, installer = bare_venv(Path(tmp) / "venv", wheel)
        freeze = subprocess.run(
            [
                str(python),
                "-c",
                "import importlib.metadata as m; print(sorted(d.metadata['Name'] for d in m.distributions()))",
            ],
            capture_output=True,
            text=True,
            check=True,
            cwd=python.parent,  # not the repository, whose editable installs' metadata would be found
            env=BARE_ENV,
        ).stdout.strip()
        cold = child_seconds(python, TIMED["client"])
        results: dict[str, Any] = {}
        for name, statement in TIMED.items():
            child_seconds(python, statement)  # warm-up
            results[name] = summary([child_seconds(python, statement) for _ in range(args.repeats)])
        bare = [process_seconds(python, "pass") for _ in range(args.repeats)]
        whole = [process_seconds(python, "import rlvr_selector_client") for _ in range(args.repeats)]
        results["process"] = summary([w - statistics.median(bare) for w in whole])
        results["interpreter_start"] = summary(bare)
    result = {
        "goal_s": GOAL_S,
        "meets_goal": results["client"]["median_s"] < GOAL_S and results["integrations"]["median_s"] < GOAL_S,
        "cold_first_import_s": round(cold, 4),
        # What the client adds to its one requirement's import (medians).
        "client_over_httpx_s": round(results["client"]["median_s"] - results["httpx"]["median_s"], 4),
        **results,
        "repeats": args.repeats,
        "installer": installer,
        "installed": json.loads(freeze.replace("'", '"')),
        "python": sys.version.split()[0],
        # Import times scale with the machine's load (a shared machine's other jobs); say what it was.
        "load_average_1min": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
    }
    for name in ("httpx", "client", "integrations", "process"):
        print(
            f"{name:>13}: median {results[name]['median_s'] * 1000:7.1f} ms, max {results[name]['max_s'] * 1000:7.1f} ms"
        )
    print(f"{'cold':>13}: {cold * 1000:7.1f} ms (bytecode written); goal {GOAL_S * 1000:.0f} ms")
    emit(result, args.out)


if __name__ == "__main__":
    main()
