"""Snapshots keep the log short and leave nothing behind: the lock of a writer that died expires soon,
orphaned chunks are removed by the next commit, and a trainer that only observes still gets snapshots."""

from __future__ import annotations

import asyncio
import uuid
from types import SimpleNamespace

import pytest

from selector_service.dataset.state import DatasetSpec
from selector_service.replication import replica as replica_module
from selector_service.replication.engine import Engine
from selector_service.settings import Settings
from selector_service.storage.store import Store, connect


def _result(pid: int):
    return SimpleNamespace(prompt_id=pid, rewards=None, successes=1, trials=2)


async def _engine(url: str, **settings) -> tuple[Engine, object]:
    prefix = f"upkeep{uuid.uuid4().hex[:8]}"
    client = await connect(url, 5.0)
    return Engine(Store(client, prefix, 3600), Settings(redis_url=url, key_prefix=prefix, **settings)), client


async def _chunk_keys(client, engine: Engine, name: str) -> list[str]:
    pattern = f"{engine.settings.key_prefix}:v1:{{{name}}}:snap:*"
    return sorted([k.decode() async for k in client.scan_iter(match=pattern, count=1000)])


def test_a_dead_writers_chunks_are_removed_by_the_next_commit(redis_url):
    async def run():
        engine, client = await _engine(redis_url, snapshot_every_records=10**6, snapshot_chunk_bytes=1024)
        store = engine.store
        try:
            await engine.create_dataset(DatasetSpec(name="o", size=2000))
            await engine.observe(
                "o", step=0, request_id="o-1", results=[_result(i) for i in range(0, 2000, 7)]
            )
            # a writer that registered its snapshot and wrote two chunks, then died
            await client.sadd(store.keys.snapw("o"), "deadwriter")
            for i in range(2):
                await client.set(store.keys.snap_chunk("o", "deadwriter", i), b"x" * 10)
            await engine.snapshot_now("o")
            first = await _chunk_keys(client, engine, "o")
            assert first and not any("deadwriter" in k for k in first)
            meta = await store.read_meta("o")
            assert len(first) == int(meta["snap_chunks"]) > 1  # only the current snapshot's chunks
            await engine.observe("o", step=0, request_id="o-2", results=[_result(1)])
            await engine.snapshot_now("o")
            second = await _chunk_keys(client, engine, "o")
            meta2 = await store.read_meta("o")
            assert meta2["snap"] != meta["snap"] and all(meta2["snap"] in k for k in second)
            assert await client.scard(store.keys.snapw("o")) == 0
        finally:
            await engine.close()
            await client.aclose()

    asyncio.run(run())


def test_a_writer_that_lost_the_lock_does_not_commit(redis_url):
    async def run():
        engine, client = await _engine(redis_url)
        store = engine.store
        try:
            _, spec = await engine.create_dataset(DatasetSpec(name="l", size=5))
            await engine.observe("l", step=0, request_id="l-1", results=[_result(1)])
            view = await store.read_log("l", "", 10)
            assert await store.try_snapshot_lock("l", "me", 30_000)
            await client.set(store.keys.snaplock("l"), "someone-else")  # the lock expired and was taken

            async def chunks():
                yield b"chunk"

            ok = await store.write_snapshot("l", spec.uid, view.entries[-1][0], 1, 0, chunks(), "me", 30_000)
            assert ok is False
            assert "snap" not in await store.read_meta("l")
            assert await _chunk_keys(client, engine, "l") == []
        finally:
            await engine.close()
            await client.aclose()

    asyncio.run(run())


def test_the_lock_is_renewed_while_a_slow_snapshot_is_written(redis_url, monkeypatch):
    async def run():
        engine, client = await _engine(redis_url)
        store = engine.store
        try:
            _, spec = await engine.create_dataset(DatasetSpec(name="r", size=5))
            await engine.observe("r", step=0, request_id="r-1", results=[_result(1)])
            view = await store.read_log("r", "", 10)
            ttl_ms = 300
            assert await store.try_snapshot_lock("r", "me", ttl_ms)

            async def slow_chunks():
                for _ in range(8):  # 0.8 s of writing against a 0.3 s lock
                    await asyncio.sleep(0.1)
                    yield b"chunk"

            ok = await store.write_snapshot(
                "r", spec.uid, view.entries[-1][0], 1, 0, slow_chunks(), "me", ttl_ms
            )
            assert ok is True
        finally:
            await engine.close()
            await client.aclose()

    asyncio.run(run())


def test_a_killed_writer_holds_the_lock_for_at_most_its_ttl():
    assert replica_module.SNAPSHOT_LOCK_TTL_MS <= 60_000


@pytest.mark.parametrize("threshold", [3, 7])
def test_observe_only_traffic_is_snapshotted(redis_url, threshold):
    """No select and no read: the writes alone keep the log bounded."""

    async def run():
        engine, client = await _engine(redis_url, snapshot_every_records=threshold)
        try:
            await engine.create_dataset(DatasetSpec(name="w", size=5))
            for i in range(5 * threshold):
                await engine.observe("w", step=0, request_id=f"w-{i}", results=[_result(i % 5)])
                await asyncio.gather(
                    *engine.replica.maintaining.values(), *engine.replica.snapshotting.values()
                )
            meta = await engine.store.read_meta("w")
            assert meta.get("snap"), "no snapshot was written"
            length = (await engine.store.read_log("w", "", 1)).length
            assert length <= threshold + 1, length
        finally:
            await engine.close()
            await client.aclose()

    asyncio.run(run())
