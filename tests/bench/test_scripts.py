"""Every benchmark script and module imports, and every script answers --help: a moved or renamed name
breaks `make bench` here instead of an hour into a run."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODULES = sorted(
    ".".join(p.relative_to(ROOT).with_suffix("").parts)
    for p in (ROOT / "bench").rglob("*.py")
    if p.name != "__init__.py" and "out" not in p.relative_to(ROOT).parts
)
SCRIPTS = sorted(p.name for p in (ROOT / "bench").glob("*.py") if "__main__" in p.read_text())


@pytest.mark.parametrize("module", MODULES)
def test_bench_module_imports(module: str) -> None:
    importlib.import_module(module)


def test_run_all_lists_only_scripts_that_exist() -> None:
    run_all = importlib.import_module("bench.run_all")
    text = Path(run_all.__file__).read_text()
    named = {word for word in text.replace('"', " ").split() if word.endswith(".py")}
    missing = {name for name in named if not (ROOT / "bench" / Path(name).name).exists()}
    assert not missing, f"bench/run_all.py names scripts that do not exist: {missing}"


@pytest.mark.parametrize("script", SCRIPTS)
def test_bench_script_answers_help(script: str) -> None:
    proc = subprocess.run(
        [sys.executable, f"bench/{script}", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "usage" in proc.stdout.lower()


def test_bench_service_runs_a_small_dataset(tmp_path: Path) -> None:
    """A real service (embedded store), a small dataset with half of it observed first: every request
    of the table is timed, so is a rollout budget of every policy, and the JSON line names the store and
    the share observed."""
    out = tmp_path / "service.json"
    args = ["--n", "3000", "--batch", "16", "--steps", "4", "--observed", "0.5", "--create-n", "0"]
    args += ["--rollouts-batch", "64", "--rollouts-budget", "512", "--rollouts-steps", "3"]
    proc = subprocess.run(
        [sys.executable, "bench/bench_service.py", *args, "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["store"] == "embedded-valkey" and result["observed"] == 0.5
    for key in ("observe", "select_insight", "select_dps_close"):
        assert result[f"{key}_p50_ms"] > 0 and result[f"{key}_ratio"] > 0
    for policy in ("posterior", "knapsack", "variance", "uniform"):  # the rollout budget's cost
        assert result[f"allocate_{policy}_ms"] > 0 and result[f"select_budget_{policy}_ratio"] > 0
    assert json.loads(out.read_text()) == result
