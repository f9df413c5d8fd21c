"""Replicas, restarts, kill -9, snapshots and the embedded store: nothing acknowledged is lost or doubled."""

from __future__ import annotations

import random
import tempfile

import httpx
import pytest

from tests.utils import RedisServer, ServiceProcess

pytestmark = pytest.mark.slow


def _workload(url: str, name: str, steps: int, seed: int, size: int = 200, tag: str = "w") -> list[dict]:
    """select -> observe per step with several strategies; returns every request it sent."""
    rng = random.Random(seed)
    sent = []
    with httpx.Client(base_url=url, timeout=30) as c:
        for step in range(steps):
            strategy = ["insight", "dps", "mopps", "uniform"][step % 4]
            sel = c.post(
                "/select", json={"dataset": name, "step": step, "batch_size": 16, "strategy": strategy}
            )
            assert sel.status_code == 200, sel.text
            results = [
                {"prompt_id": p, "rewards": [float(rng.random() < 0.4) for _ in range(8)]}
                for p in sel.json()["prompt_ids"]
            ]
            body = {"dataset": name, "step": step, "request_id": f"{tag}-{step}", "results": results}
            assert c.post("/observe", json=body).json()["applied"] == 16
            sent.append(body)
    return sent


def _state(url: str, name: str, size: int = 200) -> tuple:
    with httpx.Client(base_url=url, timeout=60) as c:
        b = c.get(f"/datasets/{name}/beliefs", params={"ids": ",".join(map(str, range(size)))}).json()
        sel = c.post(
            "/select",
            json={"dataset": name, "step": b["open_step"], "batch_size": 20, "strategy": "dps", "seed": 9},
        ).json()
        ins = c.post(
            "/select",
            json={
                "dataset": name,
                "step": b["open_step"],
                "batch_size": 20,
                "strategy": "insight",
                "params": {"candidate_ratio": None},
            },
        ).json()
        summary = c.get(f"/datasets/{name}").json()["summary"]
    return b, sel["prompt_ids"], ins["prompt_ids"], summary


def test_two_replicas_agree(redis_url, dsname):
    a = ServiceProcess(redis_url=redis_url).start()
    b = ServiceProcess(redis_url=redis_url, prefix=a.prefix).start()
    try:
        httpx.post(
            f"{a.url}/datasets", json={"name": dsname, "size": 200, "hmm_decay": 0.5}
        ).raise_for_status()
        # alternate the writer: each replica must see the other's acknowledged writes
        rng = random.Random(1)
        for step in range(12):
            writer, reader = (a, b) if step % 2 else (b, a)
            sel_w = httpx.post(
                f"{writer.url}/select",
                json={"dataset": dsname, "step": step, "batch_size": 16, "strategy": "dps", "seed": step},
            ).json()
            sel_r = httpx.post(
                f"{reader.url}/select",
                json={"dataset": dsname, "step": step, "batch_size": 16, "strategy": "dps", "seed": step},
            ).json()
            assert sel_w["prompt_ids"] == sel_r["prompt_ids"]
            results = [
                {"prompt_id": p, "successes": rng.randint(0, 8), "trials": 8} for p in sel_w["prompt_ids"]
            ]
            ack = httpx.post(
                f"{writer.url}/observe",
                json={"dataset": dsname, "step": step, "request_id": f"s{step}", "results": results},
            ).json()
            assert ack["applied"] == 16
            # the other replica sees it at once, and a retry through it is a duplicate
            again = httpx.post(
                f"{reader.url}/observe",
                json={"dataset": dsname, "step": step, "request_id": f"s{step}", "results": results},
            ).json()
            assert again == {"applied": 0, "duplicate": True, "lag": 0}
            assert httpx.get(f"{reader.url}/datasets/{dsname}").json()["summary"]["observations"] == 16 * (
                step + 1
            )
        assert _state(a.url, dsname) == _state(b.url, dsname)
    finally:
        a.stop()
        b.stop()


def test_kill9_and_restart_on_same_redis(redis_url, dsname):
    svc = ServiceProcess(redis_url=redis_url, env={"SELECTOR_SNAPSHOT_EVERY_RECORDS": "7"}).start()
    httpx.post(f"{svc.url}/datasets", json={"name": dsname, "size": 200}).raise_for_status()
    sent = _workload(svc.url, dsname, steps=20, seed=2)
    before = _state(svc.url, dsname)
    svc.kill()  # SIGKILL
    again = ServiceProcess(redis_url=redis_url, prefix=svc.prefix).start()
    try:
        assert _state(again.url, dsname) == before
        # retrying every acknowledged request after the restart applies nothing
        for body in sent:
            assert httpx.post(f"{again.url}/observe", json=body).json() == {
                "applied": 0,
                "duplicate": True,
                "lag": 0,
            }
        assert _state(again.url, dsname) == before
        assert before[3]["observations"] == 20 * 16
    finally:
        again.stop()


def test_snapshots_bound_the_log_and_restore_exactly(redis_url, dsname):
    import redis as redis_lib

    env = {"SELECTOR_SNAPSHOT_EVERY_RECORDS": "10"}
    svc = ServiceProcess(redis_url=redis_url, env=env).start()
    try:
        httpx.post(f"{svc.url}/datasets", json={"name": dsname, "size": 200}).raise_for_status()
        _workload(svc.url, dsname, steps=40, seed=3)
        before = _state(svc.url, dsname)
        r = redis_lib.Redis.from_url(redis_url)
        log_key = f"{svc.prefix}:v1:{{{dsname}}}:log"
        meta = {k.decode(): v.decode() for k, v in r.hgetall(f"{svc.prefix}:v1:{{{dsname}}}:meta").items()}
        assert meta.get("snap"), "no snapshot was written"
        assert r.xlen(log_key) < 40  # 40 observes + 40 advances were written; the log was trimmed
        # a fresh process starting from the snapshot + the log tail computes the same bits
        fresh = ServiceProcess(redis_url=redis_url, prefix=svc.prefix).start()
        try:
            assert _state(fresh.url, dsname) == before
        finally:
            fresh.stop()
    finally:
        svc.stop()


def test_embedded_store_survives_kill9(dsname):
    data = tempfile.mkdtemp(prefix="rlvr-embedded-")
    svc = ServiceProcess(data_dir=data).start()
    assert "embedded Valkey" in svc.output()
    httpx.post(f"{svc.url}/datasets", json={"name": dsname, "size": 200}).raise_for_status()
    sent = _workload(svc.url, dsname, steps=10, seed=4)
    before = _state(svc.url, dsname)
    svc.kill()
    again = ServiceProcess(data_dir=data, prefix=svc.prefix).start()
    try:
        assert _state(again.url, dsname) == before
        assert httpx.post(f"{again.url}/observe", json=sent[-1]).json()["duplicate"] is True
        # a second service on the same data dir is refused with a clear message
        with pytest.raises(RuntimeError, match="another selector-service is using"):
            ServiceProcess(data_dir=data).start(timeout_s=30)
    finally:
        again.stop()


def test_unreachable_store_exits_with_message():
    dead = RedisServer()  # never started: nothing listens on its port
    svc = ServiceProcess(redis_url=dead.url)
    with pytest.raises(RuntimeError):
        svc.start(timeout_s=30)
    assert svc.proc is not None and svc.proc.returncode == 2
    assert "cannot reach the store" in svc.output()


def test_redis_outage_gives_503_and_recovers(dsname):
    server = RedisServer(appendonly=True).start()
    svc = ServiceProcess(redis_url=server.url, env={"SELECTOR_STORE_TIMEOUT_S": "1"}).start()
    try:
        httpx.post(f"{svc.url}/datasets", json={"name": dsname, "size": 50}).raise_for_status()
        _workload(svc.url, dsname, steps=3, seed=5, size=50)
        before = _state(svc.url, dsname, size=50)
        server.stop()
        with httpx.Client(base_url=svc.url, timeout=15) as c:
            r = c.post("/select", json={"dataset": dsname, "step": 3, "batch_size": 4, "strategy": "insight"})
            assert r.status_code == 503 and "unreachable" in r.json()["detail"]
            r = c.post(
                "/observe",
                json={
                    "dataset": dsname,
                    "step": 3,
                    "request_id": "x",
                    "results": [{"prompt_id": 1, "successes": 1, "trials": 2}],
                },
            )
            assert r.status_code == 503
            assert c.get("/readyz").status_code == 503
            assert c.get("/healthz").status_code == 200
        server.start()  # same port, same append-only file
        with httpx.Client(base_url=svc.url, timeout=15) as c:
            for _ in range(100):
                if c.get("/readyz").status_code == 200:
                    break
            assert c.get("/readyz").status_code == 200
        assert _state(svc.url, dsname, size=50) == before
    finally:
        svc.stop()
        server.stop()


def test_restart_restores_a_snapshot_of_many_small_chunks(redis_url, dsname):
    import redis as redis_lib

    env = {"SELECTOR_SNAPSHOT_EVERY_RECORDS": "10", "SELECTOR_SNAPSHOT_CHUNK_BYTES": "1024"}
    svc = ServiceProcess(redis_url=redis_url, env=env).start()
    try:
        httpx.post(f"{svc.url}/datasets", json={"name": dsname, "size": 2000}).raise_for_status()
        _workload(svc.url, dsname, steps=24, seed=6, size=2000)
        before = _state(svc.url, dsname, size=2000)
        meta_key = f"{svc.prefix}:v1:{{{dsname}}}:meta"
        meta = {
            k.decode(): v.decode() for k, v in redis_lib.Redis.from_url(redis_url).hgetall(meta_key).items()
        }
        assert meta.get("snap"), "no snapshot was written"
        assert int(meta["snap_chunks"]) > 1, "the snapshot was not split into chunks"
    finally:
        svc.kill()  # SIGKILL: the restart must rebuild from the chunked snapshot + the log tail
    again = ServiceProcess(redis_url=redis_url, prefix=svc.prefix, env=env).start()
    try:
        assert _state(again.url, dsname, size=2000) == before
    finally:
        again.stop()
