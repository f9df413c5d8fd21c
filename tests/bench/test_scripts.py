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


def test_bench_limits_runs_small_cases(tmp_path: Path) -> None:
    """A real service per case, small sizes: every case answers as the bounds say and the JSON line
    carries the memory and /healthz figures of each."""
    out = tmp_path / "limits.json"
    args = ["--observe-results", "8000", "--magic-mib", "8", "--import-n", "2e4", "--create-n", "1e5",
            "--datasets", "12", "--head-timeout-s", "1"]  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "bench/bench_limits.py", *args, "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [c["answer"] for c in result["observe"]] == [200]
    assert result["import_bad_magic"][0]["answer"] == 422 and result["import"]["answer"] == 201
    assert result["headers"]["one_8mib_line"]["answer"] in (
        "closed",
        "HTTP/1.1 431 Request Header Fields Too Large",
    )
    assert result["headers"]["trickling_300"]["open_after_timeout"] == 0
    assert result["create_over_budget"] == {**result["create_over_budget"], "answer": 507, "created": False}
    assert result["metrics"]["datasets"] == 12 and result["metrics"]["scrape_lines"] > 0
    assert result["worst_healthz_ms"] is not None and result["worst_peak_over_body_observe"] > 0
    assert json.loads(out.read_text()) == result


def test_client_import_times_the_client_in_a_bare_venv(tmp_path: Path) -> None:
    """The client's wheel in a venv of its own: the JSON line has every import's time, and the venv held
    the client and what httpx requires, nothing of the service."""
    out = tmp_path / "client_import.json"
    proc = subprocess.run(
        [sys.executable, "bench/client_import.py", "--repeats", "1", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    for name in ("httpx", "client", "integrations", "process"):
        assert result[name]["median_s"] > 0
    assert result["goal_s"] == 0.3 and isinstance(result["meets_goal"], bool)
    assert "rlvr-selector-client" in result["installed"] and "httpx" in result["installed"]
    assert not {"rlvr-selector", "numpy", "numba", "fastapi", "pydantic"} & set(result["installed"])
    assert json.loads(out.read_text()) == result
