"""The replica protocol's rules one by one, on the real Redis: numbered records, gaps, snapshots that
are not the prefix they claim."""

from __future__ import annotations

import asyncio
import uuid
from types import SimpleNamespace

import numpy as np
import pytest

from selector_service.dataset.state import DatasetSpec, DatasetState, LogGap, pack_results
from selector_service.replication.engine import Engine
from selector_service.settings import Settings
from selector_service.storage.store import Store, StoreError, connect


def _result(pid: int, s: int = 1, t: int = 2):
    return SimpleNamespace(prompt_id=pid, rewards=None, successes=s, trials=t)


async def _engines(url: str, n: int = 2, prefix: str | None = None, **settings):
    prefix = prefix or f"proto{uuid.uuid4().hex[:8]}"
    cfg = Settings(redis_url=url, key_prefix=prefix, **settings)
    out = []
    for _ in range(n):
        client = await connect(url, 5.0)
        out.append((Engine(Store(client, prefix, 3600), cfg), client))
    return out


async def _close(engines) -> None:
    for engine, client in engines:
        await engine.close()
        await client.aclose()


def test_records_are_numbered_and_a_state_refuses_a_gap():
    state = DatasetState(DatasetSpec(name="g", size=3))
    payload = pack_results(np.array([0]), np.array([1.0]), np.array([2.0]), np.array([2]))
    state.apply_record("1-0", {"n": b"1", "k": b"o", "s": b"0", "p": payload})
    with pytest.raises(LogGap):
        state.apply_record("3-0", {"n": b"3", "k": b"o", "s": b"0", "p": payload})
    assert (state.seq, state.results, state.cursor) == (1, 1, "1-0")  # the refused record changed nothing
    with pytest.raises(ValueError, match="no sequence number"):  # no record of this layout lacks one
        state.apply_record("4-0", {"k": b"o", "s": b"0", "p": payload})
    assert (state.seq, state.results, state.cursor) == (1, 1, "1-0")


def test_a_replica_behind_a_trim_loads_the_snapshot_instead_of_skipping(redis_url):
    """The reported loss, forced: B catches up two records per read, and A's snapshot commits and trims
    the log right after B's first read. B must notice the gap and load A's snapshot."""

    async def run():
        (a, ca), (b, cb) = await _engines(redis_url, 2, sync_batch=2, snapshot_every_records=1000)
        try:
            await a.create_dataset(DatasetSpec(name="d", size=5))
            await b.read("d", lambda st: None)  # B holds the dataset at its start
            for i in range(12):
                await a.observe("d", step=0, request_id=f"r{i}", results=[_result(i % 5)])
            reads = 0
            read_log = b.store.read_log

            async def read_then_trim(*args, **kwargs):
                nonlocal reads
                view = await read_log(*args, **kwargs)
                reads += 1
                if reads == 1:
                    await a.snapshot_now("d")  # covers all 12 records, trims all but the last
                return view

            b.store.read_log = read_then_trim
            got = await b.read("d", lambda st: (st.results, st.seq, st.arrays.n_obs.tolist()))
            assert got == (12, 12, [3, 3, 2, 2, 2])
            assert reads >= 3  # the first batch, the one that met the gap, the one after the reload
        finally:
            await _close([(a, ca), (b, cb)])

    asyncio.run(run())


def test_a_snapshot_that_is_not_the_prefix_it_claims_is_never_committed(redis_url):
    async def run():
        ((engine, client),) = await _engines(redis_url, 1)
        store = engine.store
        try:
            _, spec = await engine.create_dataset(DatasetSpec(name="m", size=3))
            for i in range(3):
                await engine.observe("m", step=0, request_id=f"m{i}", results=[_result(i)])
            view = await store.read_log("m", "", 10)
            last_id = view.entries[-1][0]

            async def chunks():
                yield b"not a snapshot"

            assert await store.try_snapshot_lock("m", "me", 30_000)
            with pytest.raises(StoreError, match="claims record number 2"):
                await store.write_snapshot("m", spec.uid, last_id, 2, 0, chunks(), "me", 30_000)
            assert "snap" not in await store.read_meta("m")
            assert (await store.read_log("m", "", 10)).length == 3  # nothing trimmed
        finally:
            await _close([(engine, client)])

    asyncio.run(run())
