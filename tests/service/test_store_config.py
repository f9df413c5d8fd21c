"""The service says so at start when the external store's own configuration breaks the durability the
docs promise (no append-only file, an eviction policy), against real Redis servers configured each way."""

from __future__ import annotations

import asyncio

import pytest

from selector_service.storage.store import connect, durability_problems
from tests.utils import RedisServer, ServiceProcess


def _problems(url: str) -> list[str]:
    async def run() -> list[str]:
        client = await connect(url, 5.0)
        try:
            return await durability_problems(client)
        finally:
            await client.aclose()

    return asyncio.run(run())


@pytest.mark.parametrize(
    ("appendonly", "policy", "expected"),
    [
        (True, "noeviction", []),
        (False, "noeviction", ["appendonly no"]),
        (True, "allkeys-lru", ["maxmemory-policy allkeys-lru"]),
        (False, "volatile-lru", ["appendonly no", "maxmemory-policy volatile-lru"]),
    ],
)
def test_the_store_configuration_is_read_back(appendonly, policy, expected):
    server = RedisServer(appendonly=appendonly, extra=["--maxmemory-policy", policy]).start()
    try:
        problems = _problems(server.url)
    finally:
        server.stop()
    assert len(problems) == len(expected), problems
    for problem, phrase in zip(problems, expected, strict=True):
        assert phrase in problem


def test_the_service_warns_at_start_and_serves():
    server = RedisServer(appendonly=False, extra=["--maxmemory-policy", "allkeys-lru"]).start()
    service = ServiceProcess(redis_url=server.url)
    try:
        service.start()
        log = service.log_tail(200)
    finally:
        service.stop()
        server.stop()
    assert "append-only file (appendonly no)" in log and "maxmemory-policy allkeys-lru" in log, log
