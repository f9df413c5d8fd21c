"""Faults a days-long training run meets: the service killed with SIGKILL while several trainers stream
observations, the store stopped, frozen or restarted. Nothing acknowledged may be lost or counted twice,
the service must say clearly (503) that its store is away instead of failing (500) or hanging, and it
must recover by itself. The typed client (rlvr_selector_client.client) must ride out an outage that its
retry budget covers and raise ServiceUnavailable when it does not.

Real processes throughout: the service in a subprocess, a private redis-server (or the embedded Valkey)
that the tests stop, SIGSTOP and restart.
"""

from __future__ import annotations

import random
import shutil
import signal
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field

import httpx
import pytest
import redis

from rlvr_selector_client.client import Result, SelectorClient, ServiceUnavailable
from tests.utils import RedisServer, ServiceProcess, free_port

pytestmark = pytest.mark.slow

STORE_TIMEOUT_S = 1.0
# Generous bound for one answer while the store is away; exceeding it is a hang, not slowness.
ANSWER_BOUND_S = 10 * STORE_TIMEOUT_S


# ---- kill -9 during concurrent observe streams ----------------------------------------------------
@dataclass
class Ledger:
    """What the service acknowledged, per prompt: the state the store must hold exactly once."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    successes: Counter = field(default_factory=Counter)
    failures: Counter = field(default_factory=Counter)
    results: Counter = field(default_factory=Counter)
    acked: int = 0
    duplicates: int = 0
    retries: int = 0

    def record(self, results: list[Result], duplicate: bool) -> None:
        with self.lock:
            self.acked += 1
            self.duplicates += duplicate
            for r in results:
                self.successes[r.prompt_id] += r.successes
                self.failures[r.prompt_id] += r.trials - r.successes
                self.results[r.prompt_id] += 1


def _trainer(url: str, name: str, tag: str, requests: int, size: int, ledger: Ledger, errors: list) -> None:
    """One trainer: `requests` observes, each retried with its own request id until acknowledged."""
    rng = random.Random(tag)
    try:
        with SelectorClient(url, timeout=5.0, retries=2, backoff=0.05) as client:
            for i in range(requests):
                results = [
                    Result(prompt_id=p, successes=rng.randint(0, 8), trials=8)
                    for p in rng.sample(range(size), 8)
                ]
                while True:
                    try:
                        ack = client.observe(name, step=0, results=results, request_id=f"{tag}-{i}")
                        break
                    except ServiceUnavailable:
                        with ledger.lock:
                            ledger.retries += 1
                        time.sleep(0.1)
                assert ack.applied in (0, len(results)) and ack.duplicate == (ack.applied == 0)
                ledger.record(results, ack.duplicate)
    except BaseException as exc:  # surfaced by the test thread
        errors.append(exc)


def _wait_for_acks(ledger: Ledger, count: int, threads: list[threading.Thread]) -> None:
    while ledger.acked < count and any(t.is_alive() for t in threads):
        time.sleep(0.01)


def _check_exactly_once(url: str, name: str, size: int, ledger: Ledger) -> None:
    with httpx.Client(base_url=url, timeout=60) as c:
        beliefs = c.get(f"/datasets/{name}/beliefs", params={"ids": ",".join(map(str, range(size)))}).json()
        summary = c.get(f"/datasets/{name}").json()["summary"]
    for b in beliefs["beliefs"]:
        p = b["prompt_id"]
        assert (b["alpha"], b["beta"], b["observations"]) == (
            1.0 + ledger.successes[p],
            1.0 + ledger.failures[p],
            ledger.results[p],
        ), f"prompt {p}"
    total = sum(ledger.results.values())
    assert summary["observations"] == total
    assert summary["rollouts"] == 8 * total
    assert summary["prompts_observed"] == len(ledger.results)


@pytest.mark.parametrize("store", ["redis", "embedded"])
def test_kill9_during_concurrent_observes_loses_and_doubles_nothing(redis_url, store, record_property):
    """4 trainers stream observes; the service is SIGKILLed twice and restarted on the same store and
    port. Every trainer retries with the same request id until acknowledged, so afterwards the store
    must hold each request exactly once: per prompt, alpha/beta/observations equal the ledger."""
    size, trainers, requests = 300, 4, 40
    name = f"kill-{uuid.uuid4().hex[:8]}"
    port = free_port()
    kwargs = (
        {"redis_url": redis_url} if store == "redis" else {"data_dir": tempfile.mkdtemp(prefix="rlvr-kill-")}
    )
    svc = ServiceProcess(port=port, **kwargs).start()
    prefix = svc.prefix
    httpx.post(f"{svc.url}/datasets", json={"name": name, "size": size}, timeout=30).raise_for_status()
    ledger, errors = Ledger(), []
    threads = [
        threading.Thread(target=_trainer, args=(svc.url, name, f"t{i}", requests, size, ledger, errors))
        for i in range(trainers)
    ]
    for t in threads:
        t.start()
    try:
        for kill_at in (trainers * requests // 4, trainers * requests // 2):
            _wait_for_acks(ledger, kill_at, threads)
            svc.kill(signal.SIGKILL)
            time.sleep(0.5)  # trainers meet a dead port for a while
            svc = ServiceProcess(port=port, prefix=prefix, **kwargs).start()
        for t in threads:
            t.join(timeout=300)
        assert not errors, errors
        assert not any(t.is_alive() for t in threads)
        assert ledger.acked == trainers * requests
        assert ledger.retries > 0, "no request met the outage: the kill came too late to test anything"
        _check_exactly_once(svc.url, name, size, ledger)
        for key in ("acked", "duplicates", "retries"):
            record_property(key, getattr(ledger, key))
        # and a clean restart rebuilds the same state from the store alone
        svc.stop()
        svc = ServiceProcess(port=port, prefix=prefix, **kwargs).start()
        _check_exactly_once(svc.url, name, size, ledger)
    finally:
        httpx.delete(f"{svc.url}/datasets/{name}", timeout=30)
        svc.stop()
        if "data_dir" in kwargs:
            shutil.rmtree(kwargs["data_dir"], ignore_errors=True)


# ---- the store away: stopped, frozen, restarted ---------------------------------------------------
@pytest.fixture
def outage():
    """A private Redis with an append-only file and a service on it that gives the store 1 s per call."""
    server = RedisServer(appendonly=True).start()
    svc = ServiceProcess(redis_url=server.url, env={"SELECTOR_STORE_TIMEOUT_S": str(STORE_TIMEOUT_S)}).start()
    name = f"out-{uuid.uuid4().hex[:8]}"
    with httpx.Client(base_url=svc.url, timeout=30) as c:
        c.post("/datasets", json={"name": name, "size": 50}).raise_for_status()
        for step in range(3):
            ids = c.post("/select", json={"dataset": name, "step": step, "batch_size": 10}).json()[
                "prompt_ids"
            ]
            results = [{"prompt_id": p, "successes": (p + step) % 4, "trials": 4} for p in ids]
            body = {"dataset": name, "step": step, "request_id": f"pre-{step}", "results": results}
            c.post("/observe", json=body).raise_for_status()
    yield server, svc, name
    svc.stop()
    server.stop()
    shutil.rmtree(server.dir, ignore_errors=True)


def _snapshot(url: str, name: str) -> tuple:
    with httpx.Client(base_url=url, timeout=30) as c:
        beliefs = c.get(f"/datasets/{name}/beliefs", params={"ids": ",".join(map(str, range(50)))})
        summary = c.get(f"/datasets/{name}")
        assert beliefs.status_code == 200 and summary.status_code == 200, (beliefs.text, summary.text)
        return beliefs.json(), summary.json()["summary"]


def _data_requests(name: str) -> list[tuple[str, str, dict | None]]:
    observe = {
        "dataset": name,
        "step": 3,
        "request_id": "during-outage",
        "results": [{"prompt_id": 1, "successes": 1, "trials": 2}],
    }
    return [
        ("POST", "/select", {"dataset": name, "step": 3, "batch_size": 4}),
        ("POST", "/observe", observe),
        ("GET", f"/datasets/{name}/beliefs?ids=1,2", None),
        ("POST", "/score", {"dataset": name, "strategy": "insight", "prompt_ids": [1]}),
        ("GET", f"/datasets/{name}", None),
        ("GET", "/datasets", None),
        ("GET", f"/datasets/{name}/export", None),
        ("POST", "/datasets", {"name": f"{name}-new", "size": 5}),
    ]


def _expect_503_everywhere(url: str, name: str) -> float:
    """Every data endpoint answers 503 with a message that says what is wrong; returns the slowest answer."""
    slowest = 0.0
    with httpx.Client(base_url=url, timeout=ANSWER_BOUND_S) as c:
        for method, path, body in _data_requests(name):
            t0 = time.perf_counter()
            r = c.request(method, path, json=body)
            slowest = max(slowest, time.perf_counter() - t0)
            assert r.status_code == 503, f"{method} {path}: {r.status_code} {r.text}"
            detail = r.json()["detail"]
            assert "belief store is unreachable" in detail and "retry later" in detail, detail
        ready = c.get("/readyz")
        assert ready.status_code == 503 and ready.json()["status"] == "not ready"
        assert c.get("/healthz").status_code == 200
        assert c.get("/metrics").status_code == 200  # without the dataset gauges
    return slowest


def _wait_ready(url: str, limit_s: float = 60.0) -> None:
    deadline = time.monotonic() + limit_s
    with httpx.Client(base_url=url, timeout=ANSWER_BOUND_S) as c:
        while c.get("/readyz").status_code != 200:
            assert time.monotonic() < deadline, "the service did not become ready after the store came back"
            time.sleep(0.1)


def test_store_stopped_gives_503_then_recovers(outage, record_property):
    server, svc, name = outage
    before = _snapshot(svc.url, name)
    server.stop()
    slowest = _expect_503_everywhere(svc.url, name)
    record_property("slowest_503_s_store_down", round(slowest, 3))
    server.start()  # same port, same append-only file
    _wait_ready(svc.url)
    assert _snapshot(svc.url, name) == before  # the refused observe was not applied
    with httpx.Client(base_url=svc.url, timeout=30) as c:
        for method, path, body in _data_requests(name):
            r = c.request(method, path, json=body)
            assert r.status_code in (200, 201), f"{method} {path} after recovery: {r.status_code} {r.text}"


def test_store_frozen_gives_503_within_the_timeout_then_recovers(outage, record_property):
    """A frozen store (SIGSTOP: connections open, no replies) is the case that could hang a request."""
    server, svc, name = outage
    before = _snapshot(svc.url, name)
    server.proc.send_signal(signal.SIGSTOP)
    try:
        slowest = _expect_503_everywhere(svc.url, name)
        # several trainers at once on one dataset: each must still get its answer
        with httpx.Client(base_url=svc.url, timeout=ANSWER_BOUND_S * 2) as c:
            times, statuses, lock = [], [], threading.Lock()

            def read() -> None:
                t0 = time.perf_counter()
                r = c.get(f"/datasets/{name}/beliefs", params={"ids": "1"})
                with lock:
                    times.append(time.perf_counter() - t0)
                    statuses.append(r.status_code)

            readers = [threading.Thread(target=read) for _ in range(4)]
            for t in readers:
                t.start()
            for t in readers:
                t.join()
        assert statuses == [503] * 4
        record_property("slowest_503_s_store_frozen", round(slowest, 3))
        record_property("slowest_of_4_concurrent_503_s_store_frozen", round(max(times), 3))
    finally:
        server.proc.send_signal(signal.SIGCONT)
    _wait_ready(svc.url)
    # The observe sent while frozen may have reached Redis before the service gave up on it (a 503 means
    # "outcome unknown"): retrying it with the same request id applies it at most once.
    retry = {
        "dataset": name,
        "step": 3,
        "request_id": "during-outage",
        "results": [{"prompt_id": 1, "successes": 1, "trials": 2}],
    }
    with httpx.Client(base_url=svc.url, timeout=30) as c:
        assert c.post("/observe", json=retry).status_code == 200
        assert c.post("/observe", json=retry).json() == {"applied": 0, "duplicate": True, "lag": 0}
    after_beliefs, after_summary = _snapshot(svc.url, name)
    assert after_summary["observations"] == before[1]["observations"] + 1
    b1 = next(b for b in after_beliefs["beliefs"] if b["prompt_id"] == 1)
    b1_before = next(b for b in before[0]["beliefs"] if b["prompt_id"] == 1)
    assert (b1["alpha"], b1["beta"]) == (b1_before["alpha"] + 1, b1_before["beta"] + 1)


def test_client_rides_out_an_outage_its_budget_covers(outage):
    server, svc, name = outage
    before = _snapshot(svc.url, name)[1]["observations"]
    results = [Result(prompt_id=p, successes=1, trials=2) for p in range(5)]
    outcome: dict = {}

    def send() -> None:
        # backoff 0.25 s doubling, capped at 8 s: 0.25 + 0.5 + 1 + 2 + 4 + 8 s ~ 16 s of retries
        with SelectorClient(svc.url, timeout=ANSWER_BOUND_S, retries=6, backoff=0.25) as client:
            try:
                outcome["ack"] = client.observe(name, step=3, results=results, request_id="patient")
            except Exception as exc:
                outcome["error"] = exc

    server.stop()
    sender = threading.Thread(target=send)
    sender.start()
    time.sleep(3.0)  # the outage: the client meets 503s and keeps retrying
    assert sender.is_alive(), f"the client gave up or finished during the outage: {outcome}"
    server.start()
    sender.join(timeout=60)
    assert "error" not in outcome, outcome.get("error")
    assert outcome["ack"].applied == 5
    assert _snapshot(svc.url, name)[1]["observations"] == before + 5


def test_client_raises_service_unavailable_when_the_outage_outlasts_its_budget(outage):
    server, svc, name = outage
    before = _snapshot(svc.url, name)[1]["observations"]
    server.stop()
    try:
        with (
            SelectorClient(svc.url, timeout=ANSWER_BOUND_S, retries=2, backoff=0.1) as client,
            pytest.raises(ServiceUnavailable) as err,
        ):
            client.observe(name, step=3, results=[Result(prompt_id=1, rewards=[1, 0])], request_id="hasty")
        assert err.value.status == 503
        assert "unreachable" in str(err.value)
    finally:
        server.start()
    _wait_ready(svc.url)
    assert _snapshot(svc.url, name)[1]["observations"] == before


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_store_restart_with_append_only_file_keeps_beliefs(outage, how):
    """Redis restarted (cleanly, or killed: appendfsync always) under a running service: same beliefs,
    and the same service process carries on without a restart of its own."""
    server, svc, name = outage
    before = _snapshot(svc.url, name)
    server.stop(how)
    server.start()
    _wait_ready(svc.url)
    assert _snapshot(svc.url, name) == before
    # a fresh service process, which must rebuild everything from the store, agrees
    fresh = ServiceProcess(redis_url=server.url, prefix=svc.prefix).start()
    try:
        assert _snapshot(fresh.url, name) == before
    finally:
        fresh.stop()


def test_store_restart_without_persistence_is_a_404_not_a_silent_reset():
    """Redis without persistence loses everything on restart. The service must not keep serving (or
    rebuild from priors) a dataset the store no longer has: the trainer gets a clear 404."""
    server = RedisServer(appendonly=False).start()
    svc = ServiceProcess(redis_url=server.url).start()
    name = f"vol-{uuid.uuid4().hex[:8]}"
    try:
        with httpx.Client(base_url=svc.url, timeout=30) as c:
            c.post("/datasets", json={"name": name, "size": 20}).raise_for_status()
            body = {
                "dataset": name,
                "step": 0,
                "request_id": "r",
                "results": [{"prompt_id": 1, "rewards": [1]}],
            }
            c.post("/observe", json=body).raise_for_status()
            server.stop()
            server.start()
            _wait_ready(svc.url)
            r = c.get(f"/datasets/{name}/beliefs", params={"ids": "1"})
            assert r.status_code == 404 and "does not exist" in r.json()["detail"]
            assert c.post("/observe", json=body).status_code == 404
    finally:
        svc.stop()
        server.stop()
        shutil.rmtree(server.dir, ignore_errors=True)


def test_lost_snapshot_chunk_is_a_clear_503_never_a_reset(outage):
    """A snapshot chunk gone from the store (evicted, deleted by hand) must not be papered over with
    priors or answered with a 500: a fresh process refuses the dataset with a 503 that names it."""
    server, svc, name = outage
    with httpx.Client(base_url=svc.url, timeout=30) as c:
        c.post("/datasets", json={"name": f"{name}-s", "size": 30}).raise_for_status()
    snapshotting = ServiceProcess(
        redis_url=server.url, prefix=svc.prefix, env={"SELECTOR_SNAPSHOT_EVERY_RECORDS": "3"}
    ).start()
    client = redis.Redis.from_url(server.url)
    try:
        meta_key = f"{svc.prefix}:v1:{{{name}-s}}:meta"
        with httpx.Client(base_url=snapshotting.url, timeout=30) as c:
            for step in range(20):
                body = {
                    "dataset": f"{name}-s",
                    "step": step,
                    "request_id": f"s{step}",
                    "results": [{"prompt_id": step, "successes": 1, "trials": 2}],
                }
                c.post("/observe", json=body).raise_for_status()
                c.get(f"/datasets/{name}-s").raise_for_status()  # snapshots are taken when a read catches up
                if client.hget(meta_key, "snap"):
                    break
                time.sleep(0.1)
    finally:
        snapshotting.stop()  # before choosing the chunk to delete: no snapshot may replace it after
    snap = client.hget(meta_key, "snap")
    assert snap, "no snapshot was written"
    client.delete(f"{svc.prefix}:v1:{{{name}-s}}:snap:{snap.decode()}:0")
    fresh = ServiceProcess(redis_url=server.url, prefix=svc.prefix).start()
    try:
        r = httpx.get(f"{fresh.url}/datasets/{name}-s/beliefs", params={"ids": "1"}, timeout=30)
        assert r.status_code == 503, r.text
        assert "missing chunk 0" in r.json()["detail"]
    finally:
        fresh.stop()
        client.close()


def test_metrics_answer_quickly_while_the_store_is_frozen(outage):
    """A scrape must not wait out the store timeout per dataset: Prometheus would mark every replica
    down exactly when it is needed. The gauges keep their last figures meanwhile."""
    server, svc, name = outage
    with httpx.Client(base_url=svc.url, timeout=ANSWER_BOUND_S) as c:
        assert f'selector_dataset_open_step{{dataset="{name}"}} 2.0' in c.get("/metrics").text
        server.proc.send_signal(signal.SIGSTOP)
        try:
            for _ in range(3):
                t0 = time.perf_counter()
                r = c.get("/metrics")
                elapsed = time.perf_counter() - t0
                assert r.status_code == 200 and elapsed < 3.0, elapsed  # the wait is 1 s; a hang is >= 5
                assert f'selector_dataset_open_step{{dataset="{name}"}} 2.0' in r.text
        finally:
            server.proc.send_signal(signal.SIGCONT)


def test_the_first_request_after_a_store_restart_succeeds(outage):
    """Pooled connections the restarted server closed are checked before use, not failed on."""
    server, svc, name = outage
    server.stop()
    server.start()
    time.sleep(2.5)  # the service's pooled connections are now idle and dead
    with httpx.Client(base_url=svc.url, timeout=30) as c:
        r = c.get(f"/datasets/{name}/beliefs", params={"ids": "1"})
        assert r.status_code == 200, r.text
        body = {
            "dataset": name,
            "step": 3,
            "request_id": f"{name}-after",
            "results": [{"prompt_id": 1, "rewards": [1]}],
        }
        assert c.post("/observe", json=body).status_code == 200
