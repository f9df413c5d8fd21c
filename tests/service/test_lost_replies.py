"""Lost store replies (issue 22 item 6): a script call that ran but whose reply never came back is sent
again by the client library (store.connect); the service must recognise its own first attempt and
answer what it applied. A real service behind a proxy that loses replies (tests/service/store_proxy.py).
"""

from __future__ import annotations

import random
import urllib.parse
import uuid

import httpx
import pytest
import redis

from tests.service.store_proxy import StoreProxy
from tests.utils import ServiceProcess

pytestmark = pytest.mark.slow
SIZE = 500


@pytest.fixture
def lossy(redis_url):
    up = urllib.parse.urlparse(redis_url)
    proxy = StoreProxy(up.hostname or "127.0.0.1", up.port or 6379, seed=3)
    db = (up.path or "/0").lstrip("/") or "0"
    svc = ServiceProcess(redis_url=f"redis://127.0.0.1:{proxy.port}/{db}").start()
    try:
        yield proxy, svc
    finally:
        svc.stop()
        proxy.close()


def _send(http: httpx.Client, path: str, body: dict, method: str = "post") -> tuple[httpx.Response, bool]:
    """The response, and whether it came at the first send (a 503 is sent again, as a client does)."""
    for attempt in range(20):
        r = getattr(http, method)(path, json=body)
        if r.status_code != 503:
            return r, attempt == 0
    raise AssertionError(f"{path}: 503 twenty times in a row: {r.text}")


def test_observes_sent_once_are_answered_with_what_they_applied(lossy):
    proxy, svc = lossy
    name = f"lost-{uuid.uuid4().hex[:8]}"
    rng = random.Random(0)
    with httpx.Client(base_url=svc.url, timeout=60) as http:
        assert http.post("/datasets", json={"name": name, "size": SIZE}).status_code == 201
        proxy.loss = 0.08
        undercounted, ledger, once = [], 0, 0
        for i in range(300):
            results = [
                {"prompt_id": p, "successes": rng.randint(0, 4), "trials": 4}
                for p in rng.sample(range(SIZE), rng.randint(1, 6))
            ]
            r, first = _send(
                http, "/observe", {"dataset": name, "step": 0, "request_id": f"r{i}", "results": results}
            )
            assert r.status_code == 200, r.text
            doc = r.json()
            if first:
                once += 1
                if (doc["applied"], doc["duplicate"]) != (len(results), False):
                    undercounted.append((i, doc))
                ledger += doc["applied"]
            else:  # the client resent after a 503: a duplicate answer means an earlier send applied it
                ledger += len(results) if doc["duplicate"] else doc["applied"]
        proxy.loss = 0.0
        assert proxy.lost > 10 and once > 250  # the proxy did lose replies to requests sent once
        assert not undercounted, f"{len(undercounted)} of {once} answered as duplicates: {undercounted[:3]}"
        assert ledger == http.get(f"/datasets/{name}").json()["summary"]["observations"]


def test_creates_metadata_and_selects_resent_by_the_store_client_answer_their_first_send(lossy, redis_url):
    proxy, svc = lossy
    with httpx.Client(base_url=svc.url, timeout=60) as http:
        names = []
        for i in range(6):
            name = f"lost-{uuid.uuid4().hex[:8]}-{i}"
            proxy.loss = 0.2
            r, first = _send(http, "/datasets", {"name": name, "size": 30})
            proxy.loss = 0.0
            if first:
                assert r.status_code == 201 and r.json()["created"] is True, r.text
            names.append(name)
        name = names[0]
        selects = 0
        resent_metadata = 0  # metadata calls whose two store sends were both lost: 503, sent again
        for step in range(8):
            proxy.loss = 0.2
            r, first = _send(http, f"/datasets/{name}/metadata", {"group": [step % 3] * 30}, method="put")
            assert r.status_code == 200, r.text
            resent_metadata += not first
            r, _ = _send(http, "/select", {"dataset": name, "step": step, "batch_size": 4, "strategy": "dps"})
            proxy.loss = 0.0
            assert r.status_code == 200, r.text
            selects += 1
        assert proxy.lost > 3
        rows = http.get(f"/datasets/{name}/history").json()["rows"]
        assert sum(row["selects"] for row in rows) == selects - 1  # step 7 is open
        assert http.get(f"/datasets/{name}").json()["summary"]["open_step"] == 7
        # Nothing the service resent itself is appended twice: one record per select, one per metadata
        # call, but for a metadata call the client sent again after a 503 (it carries no request id, so
        # its second send appends the same arrays again, which sets the same priors).
        store = redis.Redis.from_url(redis_url)
        log = [fields for _, fields in store.xrange(f"{svc.prefix}:v1:{{{name}}}:log")]
        assert sum(f[b"k"] == b"a" for f in log) == 8
        assert 8 <= sum(f[b"k"] == b"m" for f in log) <= 8 + resent_metadata
        assert int(store.hget(f"{svc.prefix}:v1:{{{name}}}:meta", "seq")) == len(log)
