"""A select's step close is atomic with its answer (docs/api.md POST /select): a select that fails after
the close (injected here: the batch choice, the close itself or the rollout counts raise) leaves the
dataset exactly as it was, in the store (open step, log, sequence number) and in the process that ran it
(a following select answers what a fresh dataset with the same history answers); observe writes wait
while a close is in flight; a close whose log moved is retried; a resent commit is recognised.

Engines with their own store connections on the real Redis, as the replica search uses them.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import uuid
from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest
import redis.asyncio as aioredis

from selector_service.contract.schemas import RolloutBudget
from selector_service.dataset.state import DatasetSpec, DatasetState
from selector_service.errors import Conflict, InvalidRequest
from selector_service.replication import engine as engine_mod
from selector_service.replication.engine import Engine
from selector_service.settings import Settings
from selector_service.storage.store import Store, connect

SIZE = 40


class Injected(RuntimeError):
    """The failure a test injects after the close."""


@contextlib.asynccontextmanager
async def engine(url: str, prefix: str | None = None, cleanup: bool = True):
    prefix = prefix or f"atomic{uuid.uuid4().hex[:8]}"
    client = await connect(url, 5.0)
    store = Store(client, prefix, 3600)
    eng = Engine(store, Settings(redis_url=url, key_prefix=prefix))
    try:
        yield eng
    finally:
        await eng.close()
        keys = [k async for k in client.scan_iter(match=f"{prefix}:*", count=1000)] if cleanup else []
        if keys:
            await client.delete(*keys)
        await client.aclose()


def results(step: int) -> list:
    rng = np.random.default_rng(step)
    return [
        SimpleNamespace(prompt_id=int(i), rewards=None, successes=int(rng.integers(0, 5)), trials=4)
        for i in rng.choice(SIZE, 12, replace=False)
    ]


async def history(eng: Engine, name: str, steps: int) -> None:
    """Steps 0..steps-1, each with a select and its observations (step `steps` is left open)."""
    for step in range(steps):
        await eng.select(name, step=step, batch_size=8, strategy="insight", params={}, seed=step)
        await eng.observe(name, step=step, request_id=f"{name}-{step}", results=results(step))


async def store_view(eng: Engine, name: str) -> tuple:
    r: aioredis.Redis = eng.store.r
    meta = await eng.store.read_meta(name)
    return meta["open_step"], meta["seq"], await r.xlen(eng.store.keys.log(name))


async def answer(eng: Engine, name: str, step: int) -> tuple:
    ids, scores, at, counts = await eng.select(
        name,
        step=step,
        batch_size=8,
        strategy="insight",
        params={},
        seed=5,
        rollouts=RolloutBudget(budget=40, min=2, max=8, policy="posterior"),
    )
    hist = await eng.history(name, 0, 100)
    return ids.tolist(), scores.tolist() if scores is not None else None, at, counts.tolist(), hist


def fail_select(monkeypatch):
    def boom(self, *args, **kwargs):
        raise Injected("select")

    monkeypatch.setattr(DatasetState, "select", boom)


def fail_close(monkeypatch):
    real = DatasetState.close_until

    def boom(self, step):
        if step > self.open_step:
            raise Injected("close")
        return real(self, step)

    monkeypatch.setattr(DatasetState, "close_until", boom)


def fail_counts(monkeypatch):
    def boom(self, *args, **kwargs):
        raise Injected("rollout counts")

    monkeypatch.setattr(DatasetState, "rollout_counts", boom)


@pytest.mark.parametrize(
    ("inject", "target"),
    [
        (fail_select, "ahead"),
        (fail_close, "ahead"),
        (fail_counts, "ahead"),
        (fail_select, "open"),  # a select at the open step closes nothing but counts in the history
        (fail_counts, "open"),
    ],
)
def test_a_failure_after_the_close_leaves_the_dataset_as_it_was(redis_url, monkeypatch, inject, target):
    name = "atomic"

    async def run() -> None:
        async with engine(redis_url) as eng, engine(redis_url) as fresh:
            spec = DatasetSpec(name=name, size=SIZE, rollouts_per_prompt=4)
            await eng.create_dataset(spec)
            await fresh.create_dataset(spec)
            await history(eng, name, 2)
            await history(fresh, name, 2)
            before = await store_view(eng, name)
            step = 3 if target == "ahead" else 1
            with monkeypatch.context() as patch:
                inject(patch)
                for _ in range(3):  # each used to close one more step (0 -> 1 -> 2 -> 5 in the issue)
                    with pytest.raises(Injected):
                        await answer(eng, name, step)
                    assert await store_view(eng, name) == before
            assert (await eng.describe(name))[1]["open_step"] == 1
            # The same process, another replica and a fresh dataset with the same history agree.
            got = await answer(eng, name, step)
            want = await answer(fresh, name, step)
            assert got == want
            async with engine(redis_url, eng.store.keys.prefix.rsplit(":", 1)[0], cleanup=False) as other:
                assert (await other.read(name, lambda st: (st.open_step, st.seq))) == (
                    step,
                    int(before[1]) + 1,
                )

    asyncio.run(run())


def test_observes_wait_while_a_close_is_in_flight(redis_url):
    name = "atomic-wait"

    async def run() -> None:
        async with engine(redis_url) as eng:
            await eng.create_dataset(DatasetSpec(name=name, size=SIZE))
            assert await eng.store.reserve_close(name, "other", 5_000)
            pending = asyncio.ensure_future(eng.observe(name, step=0, request_id="w", results=results(0)))
            await asyncio.sleep(0.2)
            assert not pending.done() and (await store_view(eng, name))[1] == "0"  # refused busy, waiting
            await eng.store.release_close(name, "other")
            assert (await pending)[:2] == (12, False)
            assert (await store_view(eng, name))[1] == "1"

    asyncio.run(run())


def test_a_close_whose_log_moved_is_retried_from_the_store(redis_url, monkeypatch):
    """An observe lands between the catch-up and the commit (the reservation had expired): the commit
    is refused, the state rebuilt from the store and the select answered from the log as it is."""
    name = "atomic-moved"

    async def run_direct() -> None:
        async with engine(redis_url) as eng, engine(redis_url) as fresh:
            spec = DatasetSpec(name=name, size=SIZE)
            for e in (eng, fresh):
                await e.create_dataset(spec)
                await history(e, name, 1)
            real = DatasetState.select
            loop = asyncio.get_running_loop()
            calls = []

            def select(self, *args, **kwargs):
                calls.append(1)
                if len(calls) == 1:  # another replica's observe, after this one's reservation expired
                    asyncio.run_coroutine_threadsafe(sneak(), loop).result()
                return real(self, *args, **kwargs)

            async def sneak() -> None:
                await eng.store.r.delete(eng.store.keys.closing(name))
                async with engine(redis_url, eng.store.keys.prefix.rsplit(":", 1)[0], cleanup=False) as other:
                    await other.observe(name, step=0, request_id="late", results=results(9))

            monkeypatch.setattr(DatasetState, "select", select)
            got = await answer(eng, name, 1)
            monkeypatch.undo()
            assert len(calls) >= 2  # the first choice was thrown away with its state
            await fresh.observe(name, step=0, request_id="late", results=results(9))
            assert got == await answer(fresh, name, 1)

    asyncio.run(run_direct())


def test_a_resent_commit_answers_what_the_first_applied(redis_url):
    name = "atomic-resend"

    async def run() -> None:
        async with engine(redis_url) as eng:
            _, spec = await eng.create_dataset(DatasetSpec(name=name, size=SIZE))
            first = await eng.store.commit_close(name, spec.uid, 1, "dps 4 00ff", 0, 0, "tok")
            again = await eng.store.commit_close(name, spec.uid, 1, "dps 4 00ff", 0, 0, "tok")
            other = await eng.store.commit_close(name, spec.uid, 1, "dps 4 00ff", 0, 0, "tok2")
            assert first.status == "ok" and (again.status, again.log_id) == ("ok", first.log_id)
            assert other.status == "moved"
            assert await store_view(eng, name) == ("1", "1", 1)

    asyncio.run(run())


def test_a_select_already_counted_at_the_open_step_writes_nothing(redis_url):
    """Every rank of a trainer (or a retry) sending the same select at the open step: the first one's
    note counts it in the history, the others append no record and get the same answer, on any replica."""
    name = "atomic-counted"

    async def run() -> None:
        async with engine(redis_url) as eng:
            await eng.create_dataset(DatasetSpec(name=name, size=SIZE, rollouts_per_prompt=4))
            await history(eng, name, 2)  # step 1 open, its first select (seed 1) counted
            first = await answer(eng, name, 1)  # another request (seed 5): counted, one record
            counted = await store_view(eng, name)
            assert await answer(eng, name, 1) == first
            assert await store_view(eng, name) == counted
            async with engine(redis_url, eng.store.keys.prefix.rsplit(":", 1)[0], cleanup=False) as other:
                assert await answer(other, name, 1) == first
                assert await store_view(other, name) == counted
            await eng.select(name, step=1, batch_size=8, strategy="insight", params={}, seed=6)
            assert int((await store_view(eng, name))[1]) == int(counted[1]) + 1  # a new request: one record
            await eng.select(name, step=2, batch_size=8, strategy="insight", params={}, seed=2)
            rows = (await eng.history(name, 0, 10))["rows"]
            assert [(r["step"], r["selects"]) for r in rows] == [(0, 1), (1, 3)]

    asyncio.run(run())


@pytest.mark.parametrize("step", [10**12, 1 + 1_001, 0])
def test_a_select_that_will_be_refused_is_refused_before_any_work(redis_url, monkeypatch, step):
    """A step further ahead than SELECTOR_MAX_STEP_GAP (422), or one already closed (409), is refused by
    a replica that does not hold the dataset from the store's open step alone: no snapshot loaded, no
    closing reservation taken (a select at step 10**12 used to load the whole dataset first)."""
    name = f"atomic-far-{step}"

    async def run() -> None:
        async with engine(redis_url) as eng:
            await eng.create_dataset(DatasetSpec(name=name, size=SIZE))
            await history(eng, name, 2)  # open step 1
            prefix = eng.store.keys.prefix.rsplit(":", 1)[0]
            async with engine(redis_url, prefix, cleanup=False) as other:
                work: list[str] = []

                async def no_sync(name: str):
                    work.append("sync")
                    raise AssertionError("loaded the dataset for a select it refuses")

                async def no_reservation(name: str, token: str, ttl_ms: int) -> bool:
                    work.append("reserve")
                    return True

                monkeypatch.setattr(other.replica, "sync", no_sync)
                monkeypatch.setattr(other.store, "reserve_close", no_reservation)
                with pytest.raises((InvalidRequest, Conflict)) as refused:
                    await other.select(name, step=step, batch_size=4, strategy="uniform", params={}, seed=0)
                assert re.search(r"open step (is )?1\b", str(refused.value)), refused.value
                assert work == [] and not other.replica.states
                monkeypatch.undo()
                done = await other.select(name, step=3, batch_size=4, strategy="uniform", params={}, seed=0)
                assert done[2] == 3

    asyncio.run(run())


@pytest.mark.parametrize("seed", range(4))
def test_a_slow_close_is_not_starved_by_a_stream_of_observes(redis_url, monkeypatch, seed):
    """A select whose close takes several times the closing reservation's TTL (a delay injected into the
    close), on one replica, while another replica sends an observe every few ms: the select answers,
    every observe is applied exactly once (late ones within max_lag), nothing is refused or lost. Seeded
    schedules (the delay, the gap, the pace, the prompts) against a reference count of each prompt's
    results, read back by a third replica."""
    rng = np.random.default_rng(seed)
    name = f"atomic-starve-{seed}"
    ttl_ms = 500
    delay = float(rng.uniform(2.5, 4)) * ttl_ms / 1000
    gap = int(rng.integers(1, 4))
    monkeypatch.setattr(engine_mod, "CLOSE_RESERVATION_MS", ttl_ms)
    real = engine_mod._close_in_memory_and_run

    def slow(*args, **kwargs):
        time.sleep(delay)  # in the select's worker thread: the event loop (renewals, observes) runs on
        return real(*args, **kwargs)

    monkeypatch.setattr(engine_mod, "_close_in_memory_and_run", slow)
    sent: Counter[int] = Counter()

    async def run() -> None:
        async with engine(redis_url) as eng:
            await eng.create_dataset(DatasetSpec(name=name, size=SIZE, max_lag=gap))
            await history(eng, name, 1)  # open step 0
            prefix = eng.store.keys.prefix.rsplit(":", 1)[0]
            async with engine(redis_url, prefix, cleanup=False) as other:
                done = asyncio.Event()

                async def stream() -> list[tuple]:
                    acks, k = [], 0
                    while not done.is_set() or k < 5:
                        ids = rng.choice(SIZE, int(rng.integers(1, 5)), replace=False)
                        body = [
                            SimpleNamespace(prompt_id=int(i), rewards=[1, 0], successes=None, trials=None)
                            for i in ids
                        ]
                        acks.append(
                            await other.observe(name, step=0, request_id=f"{name}-s{k}", results=body)
                        )
                        sent.update(int(i) for i in ids)
                        k += 1
                        await asyncio.sleep(float(rng.uniform(0.005, 0.03)))
                    return acks

                streaming = asyncio.ensure_future(stream())
                await asyncio.sleep(0.05)
                try:
                    got = await eng.select(
                        name, step=gap, batch_size=4, strategy="uniform", params={}, seed=seed
                    )
                finally:
                    done.set()
                    acks = await streaming
                assert got[2] == gap, f"seed {seed}"
                assert all(a[0] > 0 and not a[1] and a[2] <= gap for a in acks), f"seed {seed}: {acks}"
                assert any(a[2] == gap for a in acks), f"seed {seed}: no observe came during the close"
            async with engine(redis_url, prefix, cleanup=False) as reader:
                ids = np.array(sorted(sent), dtype=np.int64)
                _, rows = await reader.beliefs(name, ids)
                base = {b.prompt_id: 0 for b in rows}
                for r in results(0):  # history(): step 0's observe
                    base[r.prompt_id] = base.get(r.prompt_id, 0) + 1
                counts = {b.prompt_id: b.observations - base.get(b.prompt_id, 0) for b in rows}
                assert counts == dict(sent), f"seed {seed}: results lost or counted twice"
                assert (await reader.describe(name))[1]["open_step"] == gap, f"seed {seed}"

    asyncio.run(asyncio.wait_for(run(), 120))
