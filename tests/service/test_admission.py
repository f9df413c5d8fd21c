"""Memory admission and the streamed import: a dataset that would not fit in a process's memory budget
is refused with 507 before anything of it exists (not listed, no key in the store), whether it is
created, imported or loaded by a replica that does not hold it yet; an allocation that fails anyway
(an address-space limit below the budget) is a 507 too, never a dataset half created; and an import is
checked as its body arrives, so a body that is not an export is refused before the client has sent it."""

from __future__ import annotations

import socket
import time
import urllib.parse

import httpx
import pytest
import redis

from selector_service.replication.memory import admission_bytes
from tests.utils import ServiceProcess

pytestmark = pytest.mark.slow

BUDGET = 200 * 2**20
SIZE = 2_000_000  # admitted at about 164 MiB: one fits in BUDGET, two do not


def keys_of(redis_url: str, prefix: str, name: str) -> list[bytes]:
    return list(redis.Redis.from_url(redis_url).scan_iter(match=f"{prefix}:*{name}*", count=1000))


@pytest.fixture(scope="module")
def small(start_service):
    return start_service(SELECTOR_MEMORY_BUDGET_BYTES=str(BUDGET))


@pytest.fixture
def client(small):
    with httpx.Client(base_url=small.url, timeout=120) as http:
        yield http


def refused_for_memory(r: httpx.Response) -> None:
    assert r.status_code == 507, r.text
    assert "SELECTOR_MEMORY_BUDGET_BYTES" in r.json()["detail"]
    assert "200.0 MiB" in r.json()["detail"]  # the budget itself, in words


def test_the_charge_is_the_documented_footprint():
    assert admission_bytes(10**6, 0) == 2 * 52 * 10**6
    assert admission_bytes(10**6, 10**6) == 2 * 117 * 10**6


def test_a_create_over_the_budget_is_507_and_nothing_exists(client, small, redis_url, dsname):
    r = client.post("/datasets", json={"name": dsname, "size": 3 * SIZE})
    refused_for_memory(r)
    assert "nothing was created" in r.json()["detail"]
    assert dsname not in client.get("/datasets").json()["datasets"]
    assert client.get(f"/datasets/{dsname}").status_code == 404
    assert keys_of(redis_url, small.prefix, dsname) == []
    # the retry is refused the same way, not answered "created: false"
    refused_for_memory(client.post("/datasets", json={"name": dsname, "size": 3 * SIZE}))


def test_datasets_held_count_until_deleted(client, small, redis_url, dsname):
    first, second = f"{dsname}-a", f"{dsname}-b"
    assert client.post("/datasets", json={"name": first, "size": SIZE}).status_code == 201
    try:
        refused_for_memory(client.post("/datasets", json={"name": second, "size": SIZE}))
        assert second not in client.get("/datasets").json()["datasets"]
        assert keys_of(redis_url, small.prefix, second) == []
        # a retried create of what the process holds is no new charge
        assert client.post("/datasets", json={"name": first, "size": SIZE}).status_code == 200
    finally:
        assert client.delete(f"/datasets/{first}").status_code == 204
    assert client.post("/datasets", json={"name": second, "size": SIZE}).status_code == 201
    assert client.delete(f"/datasets/{second}").status_code == 204


def test_an_import_over_the_budget_is_507_and_a_replace_is_charged_once(client, small, redis_url, dsname):
    assert client.post("/datasets", json={"name": dsname, "size": SIZE}).status_code == 201
    try:
        blob = client.get(f"/datasets/{dsname}/export").content
        other = f"{dsname}-copy"
        r = client.post(f"/datasets/{other}/import", content=blob)
        refused_for_memory(r)
        assert "nothing was imported" in r.json()["detail"]
        assert client.get(f"/datasets/{other}").status_code == 404
        assert keys_of(redis_url, small.prefix, other) == []
        # replacing the dataset it holds: the old one's charge goes with it
        r = client.post(f"/datasets/{dsname}/import", params={"replace": "true"}, content=blob)
        assert r.status_code == 201, r.text
        assert client.get(f"/datasets/{dsname}").json()["size"] == SIZE
    finally:
        client.delete(f"/datasets/{dsname}")


def test_a_replica_that_cannot_hold_a_dataset_says_so_and_the_dataset_is_intact(
    start_service, small, client, dsname
):
    """A dataset created through a replica with room is refused by one without (507 naming its budget)
    at its first request there; the store keeps it whole and the first replica serves it on."""
    big = ServiceProcess(redis_url=small.redis_url, prefix=small.prefix).start()
    try:
        with httpx.Client(base_url=big.url, timeout=120) as other:
            assert other.post("/datasets", json={"name": dsname, "size": 3 * SIZE}).status_code == 201
            observe = {"dataset": dsname, "step": 0, "request_id": f"{dsname}-0",
                       "results": [{"prompt_id": 5, "successes": 1, "trials": 2}]}  # fmt: skip
            assert other.post("/observe", json=observe).status_code == 200
            r = client.get(f"/datasets/{dsname}")
            refused_for_memory(r)
            assert "intact in the store" in r.json()["detail"]
            sel = {"dataset": dsname, "step": 1, "batch_size": 4}
            refused_for_memory(client.post("/select", json=sel))
            assert other.get(f"/datasets/{dsname}").json()["summary"]["observations"] == 1
            assert other.post("/select", json=sel).status_code == 200
            assert other.delete(f"/datasets/{dsname}").status_code == 204
    finally:
        big.stop()


class LimitedService(ServiceProcess):
    """The service under an address-space limit (`prlimit --as`), as `ulimit -v` sets it."""

    def __init__(self, limit: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.limit = limit

    def command(self) -> list[str]:
        return ["prlimit", f"--as={self.limit}", *super().command()]


def test_an_allocation_that_fails_is_507_and_creates_nothing(redis_url, dsname):
    """With a budget larger than an address-space limit lets it have, a large create fails to allocate:
    507, not listed, no key in the store, and the service goes on serving."""
    probe = ServiceProcess(redis_url=redis_url).start()
    try:
        with open(f"/proc/{probe.proc.pid}/status") as status:
            vm = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
    finally:
        probe.stop()
    limit = vm + 1024 * 2**20  # the started service's own address space and 1 GiB more
    svc = LimitedService(limit, redis_url=redis_url, env={"SELECTOR_MEMORY_BUDGET_BYTES": str(64 * 2**30)})
    svc.start()
    try:
        with httpx.Client(base_url=svc.url, timeout=120) as http:
            for attempt in range(3):
                r = http.post("/datasets", json={"name": dsname, "size": 50_000_000})  # 2.15 GB of arrays
                assert r.status_code == 507, (attempt, r.text)
                assert (
                    "ran out of memory" in r.json()["detail"] and "nothing was created" in r.json()["detail"]
                )
                assert dsname not in http.get("/datasets").json()["datasets"]
                assert http.get(f"/datasets/{dsname}").status_code == 404
            assert keys_of(redis_url, svc.prefix, dsname) == []
            assert http.post("/datasets", json={"name": dsname, "size": 1000}).status_code == 201
            assert http.get("/healthz").status_code == 200
    finally:
        svc.stop()


def test_an_import_that_is_not_an_export_is_refused_before_its_body_is_sent(small):
    """The declared body is 512 MiB; after its first 2 MiB (wrong magic bytes) the 422 is already
    there, and the connection is usable for nothing else than that answer."""
    url = urllib.parse.urlparse(small.url)
    with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
        head = (
            f"POST /datasets/never-sent/import HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
            f"Content-Length: {512 * 2**20}\r\n\r\n"
        )
        sock.sendall(head.encode() + b"NOTSNAPSHOT" + b"\0" * (2 * 2**20))
        sock.settimeout(30)
        started, answer = time.monotonic(), b""
        while b"\r\n\r\n" not in answer and time.monotonic() - started < 30:
            part = sock.recv(65536)
            if not part:
                break
            answer += part
    assert answer.startswith(b"HTTP/1.1 422"), answer[:200]
    assert (
        b"not an rlvr-selector snapshot" in answer or b"bad magic" in answer or answer.endswith(b"\r\n\r\n")
    )
