"""A client generated from the served OpenAPI document (openapi-python-client, as a user would generate
one) drives a real service end to end: its modules are named by the routers' tags and its functions by
the operation ids, and every call it makes is answered as docs/api.md says."""

from __future__ import annotations

import importlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from selector_service.server.app import create_app

TOKEN = "generated-client-token"
OPERATIONS = {
    "datasets": {
        "createDataset", "listDatasets", "getDataset", "deleteDataset", "exportDataset", "importDataset",
        "getBeliefs", "putMetadata", "putMetadataArray", "getHistory",
    },
    "selection": {"select", "observe", "listStrategies", "score"},
    "ops": {"healthz", "readyz", "metrics"},
}  # fmt: skip


def _operations(doc: dict) -> list[dict]:
    return [op for item in doc["paths"].values() for op in item.values() if isinstance(op, dict)]


def test_every_operation_has_a_short_id_and_its_routers_tag():
    doc = create_app().openapi()
    found: dict[str, set[str]] = {}
    for op in _operations(doc):
        assert len(op.get("tags", [])) == 1, op.get("operationId")
        found.setdefault(op["tags"][0], set()).add(op["operationId"])
    assert found == OPERATIONS


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory):
    if shutil.which("openapi-python-client", path=str(Path(sys.executable).parent)) is None:
        pytest.skip("openapi-python-client is not installed (make venv installs it)")
    root = tmp_path_factory.mktemp("generated")
    spec = root / "openapi.json"
    spec.write_text(json.dumps(create_app().openapi()))
    bindir = str(Path(sys.executable).parent)
    proc = subprocess.run(
        [f"{bindir}/openapi-python-client", "generate", "--path", str(spec), "--meta", "none",
         "--output-path", str(root / "rlvr_generated")],
        capture_output=True, text=True, timeout=300, env={"PATH": bindir, "HOME": str(root)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Unable to" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr  # a piece it skipped
    sys.path.insert(0, str(root))
    try:
        yield importlib.import_module("rlvr_generated")
    finally:
        sys.path.remove(str(root))
        for name in [m for m in sys.modules if m == "rlvr_generated" or m.startswith("rlvr_generated.")]:
            del sys.modules[name]


def test_the_modules_follow_the_tags_and_the_functions_the_ids(generated):
    api = Path(generated.__file__).parent / "api"
    modules = {
        d.name: {f.stem for f in d.glob("*.py") if f.stem != "__init__"} for d in api.iterdir() if d.is_dir()
    }
    snake = {"createDataset": "create_dataset", "listDatasets": "list_datasets", "getDataset": "get_dataset",
             "deleteDataset": "delete_dataset", "exportDataset": "export_dataset", "importDataset": "import_dataset",
             "getBeliefs": "get_beliefs", "putMetadata": "put_metadata", "putMetadataArray": "put_metadata_array",
             "getHistory": "get_history", "listStrategies": "list_strategies"}  # fmt: skip
    assert modules == {tag: {snake.get(op, op) for op in ops} for tag, ops in OPERATIONS.items()}


def test_a_generated_client_trains_three_steps_against_a_real_service(generated, start_service, dsname):
    svc = start_service(SELECTOR_API_TOKEN=TOKEN)
    ds = importlib.import_module("rlvr_generated.api.datasets")
    sel = importlib.import_module("rlvr_generated.api.selection")
    models = importlib.import_module("rlvr_generated.models")
    for mod in ("create_dataset", "get_dataset", "get_history", "delete_dataset"):
        importlib.import_module(f"rlvr_generated.api.datasets.{mod}")
    for mod in ("select", "observe", "list_strategies"):
        importlib.import_module(f"rlvr_generated.api.selection.{mod}")
    client = generated.AuthenticatedClient(base_url=svc.url, token=TOKEN)
    outsider = generated.AuthenticatedClient(base_url=svc.url, token="wrong")

    refused = ds.get_dataset.sync_detailed(dsname, client=outsider)
    assert refused.status_code == 403 and refused.parsed.detail == "wrong bearer token"

    info = ds.create_dataset.sync(
        client=client, body=models.DatasetCreate(name=dsname, size=50, rollouts_per_prompt=4)
    )
    assert isinstance(info, models.DatasetInfo) and info.created and info.size == 50
    names = {s.name for s in sel.list_strategies.sync(client=client).strategies}
    assert {"insight", "dps", "uniform"} <= names

    rewards: dict[int, list[float]] = {}
    for step in range(3):
        body = models.SelectRequest(
            dataset=dsname, step=step, batch_size=8, strategy="insight", seed=step,
            rollouts=models.RolloutBudget(budget=40, min_=2, max_=8),
        )  # fmt: skip
        answer = sel.select.sync(client=client, body=body)
        assert isinstance(answer, models.SelectResponse), answer
        assert len(answer.prompt_ids) == 8 and sum(answer.rollouts) == 40
        results = []
        for pid, n in zip(answer.prompt_ids, answer.rollouts, strict=True):
            rewards[pid] = [float((pid + j) % 3 == 0) for j in range(n)]
            results.append(models.Result(prompt_id=pid, rewards=rewards[pid]))
        request = models.ObserveRequest(dataset=dsname, step=step, request_id=f"gen-{step}", results=results)
        done = sel.observe.sync(client=client, body=request)
        assert isinstance(done, models.ObserveResponse) and done.applied == 8, done
    sel.select.sync(client=client, body=models.SelectRequest(dataset=dsname, step=3, batch_size=1))

    history = ds.get_history.sync(dsname, client=client)
    assert [row.step for row in history.rows] == [0, 1, 2]
    assert [row.rollouts for row in history.rows] == [40, 40, 40]
    # the same answers over plain HTTP: the generated models carry what the service sent
    plain = httpx.get(f"{svc.url}/datasets/{dsname}/history", headers={"Authorization": f"Bearer {TOKEN}"})
    assert [r["mean_reward"] for r in plain.json()["rows"]] == [row.mean_reward for row in history.rows]
    assert ds.delete_dataset.sync_detailed(dsname, client=client).status_code == 204
    assert ds.get_dataset.sync_detailed(dsname, client=client).status_code == 404
