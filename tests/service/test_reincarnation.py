"""A dataset deleted and created again, or restored with import?replace=true, through one replica: every
other replica (and worker) answers for the new incarnation at once, as if it had never seen the old one.

Each case warms replica B on the old incarnation, changes the dataset through replica A, then sends B
each kind of request once: no false 404, no 422 against the old size, no 500."""

from __future__ import annotations

import uuid

import httpx
import pytest

from tests.utils import ServiceProcess


@pytest.fixture(scope="module")
def replicas(redis_url: str):
    prefix = f"reinc-{uuid.uuid4().hex[:8]}"
    procs = [ServiceProcess(redis_url=redis_url, prefix=prefix).start() for _ in range(2)]
    clients = [httpx.Client(base_url=p.url, timeout=60) for p in procs]
    yield clients
    for client in clients:
        client.close()
    for proc in procs:
        proc.stop()


def _warm(b: httpx.Client, name: str) -> None:
    """B caches the incarnation: its beliefs, a select and an observe."""
    assert b.get(f"/datasets/{name}/beliefs", params={"ids": "0"}).status_code == 200
    assert b.post("/select", json={"dataset": name, "step": 0, "batch_size": 2}).status_code == 200
    body = {
        "dataset": name,
        "step": 0,
        "request_id": f"w-{uuid.uuid4().hex}",
        "results": [{"prompt_id": 1, "successes": 1, "trials": 4}],
    }
    assert b.post("/observe", json=body).status_code == 200


def _recreate(a: httpx.Client, name: str, size: int, how: str) -> None:
    if how == "delete+create":
        assert a.delete(f"/datasets/{name}").status_code == 204
        assert a.post("/datasets", json={"name": name, "size": size}).status_code == 201
    else:  # restore another dataset's export over it
        donor = f"{name}-donor"
        assert a.post("/datasets", json={"name": donor, "size": size}).status_code == 201
        blob = a.get(f"/datasets/{donor}/export").content
        r = a.post(
            f"/datasets/{name}/import",
            params={"replace": "true"},
            content=blob,
            headers={"content-type": "application/octet-stream"},
        )
        assert r.status_code == 201, r.text


def _first_request(b: httpx.Client, name: str, kind: str, old_size: int, new_size: int) -> None:
    """The first request B gets after the change, checked against the new incarnation."""
    last = new_size - 1
    if kind == "beliefs":
        r = b.get(f"/datasets/{name}/beliefs", params={"ids": f"1,{last}"})
        assert r.status_code == 200, r.text
        assert r.json()["beliefs"][0]["observations"] == 0  # the old incarnation's result is not there
    elif kind == "beliefs-old-id":  # an id only the old incarnation had: 422 against the new size
        r = b.get(f"/datasets/{name}/beliefs", params={"ids": str(old_size - 1)})
        assert r.status_code == 422, r.text
    elif kind == "score":
        r = b.post("/score", json={"dataset": name, "strategy": "insight", "prompt_ids": [last]})
        assert r.status_code == 200, r.text
    elif kind == "select":
        r = b.post("/select", json={"dataset": name, "step": 0, "batch_size": new_size})
        assert r.status_code == 200, r.text
        assert sorted(r.json()["prompt_ids"]) == list(range(new_size))
    elif kind == "metadata":
        r = b.put(f"/datasets/{name}/metadata", json={"offset": 0, "pass_rate": [0.5] * new_size})
        assert r.status_code == 200, r.text
    elif kind == "observe":
        body = {
            "dataset": name,
            "step": 0,
            "request_id": f"o-{uuid.uuid4().hex}",
            "results": [{"prompt_id": last, "successes": 2, "trials": 4}],
        }
        r = b.post("/observe", json=body)
        assert r.status_code == 200 and r.json()["applied"] == 1, r.text
    else:
        raise AssertionError(kind)


KINDS = ["beliefs", "beliefs-old-id", "score", "select", "metadata", "observe"]


CASES = [
    (old, new, how, kind)
    for old, new in [(10, 10), (10, 50), (50, 10)]
    for how in ["delete+create", "import-replace"]
    for kind in KINDS
    if kind != "beliefs-old-id" or new < old  # only a shrink leaves ids the new incarnation lacks
]


@pytest.mark.parametrize("old_size,new_size,how,kind", CASES)
def test_other_replica_serves_the_new_incarnation(replicas, old_size, new_size, how, kind):
    a, b = replicas
    name = f"re-{uuid.uuid4().hex[:10]}"
    assert a.post("/datasets", json={"name": name, "size": old_size}).status_code == 201
    _warm(b, name)
    _recreate(a, name, new_size, how)
    _first_request(b, name, kind, old_size, new_size)
    # Then everything else works on B, and A sees what B applied to the new incarnation.
    for other in KINDS:
        if other != kind and (other != "beliefs-old-id" or new_size < old_size):
            _first_request(b, name, other, old_size, new_size)
    assert a.get(f"/datasets/{name}").json()["summary"]["observations"] == 1  # B's one observe


@pytest.mark.parametrize("how", ["delete+create", "import-replace"])
@pytest.mark.parametrize("retry_on", ["A", "B"])
def test_a_retry_from_an_earlier_incarnation_is_refused_and_applies_nothing(replicas, how, retry_on):
    # A trainer's late retry after an operator reset must not credit the old run's results to the new
    # dataset: 409, nothing applied, on the replica that made the change and on one still warm on the old.
    a, b = replicas
    name = f"rr-{uuid.uuid4().hex[:10]}"
    assert a.post("/datasets", json={"name": name, "size": 10}).status_code == 201
    _warm(b, name)
    body = {
        "dataset": name,
        "step": 0,
        "request_id": f"old-{uuid.uuid4().hex}",
        "results": [{"prompt_id": 3, "successes": 1, "trials": 4}],
    }
    assert b.post("/observe", json=body).json()["applied"] == 1
    _recreate(a, name, 10, how)
    client = a if retry_on == "A" else b
    r = client.post("/observe", json=body)
    assert r.status_code == 409, r.text
    assert "earlier incarnation" in r.json()["detail"]
    for replica in (a, b):
        assert replica.get(f"/datasets/{name}").json()["summary"]["observations"] == 0
        beliefs = replica.get(f"/datasets/{name}/beliefs", params={"ids": "3"}).json()["beliefs"]
        assert beliefs[0]["observations"] == 0
    # A new id for the same results is applied once, and its retry is a duplicate.
    fresh = dict(body, request_id=f"new-{uuid.uuid4().hex}")
    assert client.post("/observe", json=fresh).json() == {"applied": 1, "duplicate": False, "lag": 0}
    assert a.post("/observe", json=fresh).json()["duplicate"] is True
