"""Search for lost or doubled observations across replicas: seeded random schedules against a model.

Three replicas (engines with their own store connections, as in three service processes) share one
real Redis. Snapshots and trims happen all the time (a snapshot every few records) and catching up
reads a few records per round trip, so a replica's catch-up constantly interleaves with another
replica's snapshot, trim and log growth. Each schedule runs phases of concurrent clients that observe
(on time, late within max_lag, too late, retried, retried with another body), select (the open step
or ahead; some fail after their close, as any exception in the batch choice would: a 5xx that must
leave the dataset as it was), read, and kill replicas (the replica's in-flight calls are cancelled at
whatever point they reached, its memory is dropped, a fresh replica takes its place: kill -9 and a
restart). In some schedules store replies are lost: the client library sends the same script call
again (as store.connect's retry does after a connection error), and an observe sent once must still
be answered with what it applied (the ledger: `applied` answered = results acknowledged). A seeded delay
before and after every store call spreads the interleavings. Clients retry an unanswered call with the
same request id until they get an answer, as the typed client does.

After every phase, every replica and a freshly started one must hold exactly the model's beliefs,
counts and batches (tests/service/replica_model.py): nothing acknowledged is missing or counted twice.

A failure prints its seed; replay it with REPLICA_SEARCH_SEEDS=<seed>. REPLICA_SEARCH_SCHEDULES
(default 150) sets how many schedules `make test` searches; run thousands before changing the protocol.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import random
import uuid

import pytest

from selector_service.dataset.state import DatasetSpec, DatasetState
from selector_service.errors import Conflict, InvalidRequest, Unavailable
from selector_service.replication.engine import Engine
from selector_service.settings import Settings
from selector_service.storage.store import Store, connect
from tests.service.replica_model import (
    ORDER_DEPENDENT,
    ReplicaModel,
    differences,
    model_batches,
    random_results,
)

SCHEDULES = int(os.environ.get("REPLICA_SEARCH_SCHEDULES", "150"))
REPLICAS = 3

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


# Set in a client's task for the select calls that must fail after their close (the select's batch
# choice raises, in the replica's worker thread, which inherits the task's context).
_FAIL_AFTER_CLOSE = contextvars.ContextVar("fail_after_close", default=False)
_REAL_SELECT = DatasetState.select


class InjectedFailure(Exception):
    """A failure injected into a select after its step close (a 5xx in the service)."""


def _select_or_fail(self, *args, **kwargs):
    if _FAIL_AFTER_CLOSE.get():
        raise InjectedFailure("injected after the close")
    return _REAL_SELECT(self, *args, **kwargs)


@pytest.fixture(autouse=True)
def _failures_after_a_close(monkeypatch):
    monkeypatch.setattr(DatasetState, "select", _select_or_fail)


class Killed(Exception):
    """The replica a call went to was killed while the call was in flight: its outcome is unknown."""


class JitteryStore:
    """A Store whose every call waits a seeded random delay before and after (0-1 ms, often none)."""

    def __init__(self, store: Store, rng: random.Random) -> None:
        self._store = store
        self._rng = rng

    async def _pause(self) -> None:
        roll = self._rng.random()
        await asyncio.sleep(0 if roll < 0.6 else self._rng.random() * 0.001)

    def __getattr__(self, name):
        attr = getattr(self._store, name)
        if not callable(attr) or name in ("keys",):
            return attr

        async def call(*args, **kwargs):
            await self._pause()
            result = await attr(*args, **kwargs)
            await self._pause()
            return result

        return call


class Replica:
    """An engine plus the calls in flight on it, so that a kill can cancel them mid-way."""

    def __init__(self, engine: Engine, client) -> None:
        self.engine = engine
        self.client = client
        self.inflight: set[asyncio.Task] = set()
        self.dead = False

    async def call(self, coro):
        task = asyncio.ensure_future(coro)
        self.inflight.add(task)
        try:
            return await task
        except asyncio.CancelledError:
            if self.dead:
                raise Killed() from None
            raise
        finally:
            self.inflight.discard(task)

    async def kill(self) -> None:
        self.dead = True
        for task in [
            *self.inflight,
            *self.engine.replica.snapshotting.values(),
            *self.engine.replica.maintaining.values(),
        ]:
            task.cancel()
        await asyncio.gather(
            *self.inflight,
            *self.engine.replica.snapshotting.values(),
            *self.engine.replica.maintaining.values(),
            return_exceptions=True,
        )
        await self.client.aclose()


def _lossy(execute, rng: random.Random, loss: float):
    """`execute_command` of a Redis client whose script calls lose their reply with probability `loss`:
    the call runs, its reply is dropped, and the identical command is sent again (the resend's reply
    is the answer), which is what the client's retry does after a connection error."""

    async def call(*args, **options):
        if args and str(args[0]).upper() in ("EVALSHA", "EVAL") and rng.random() < loss:
            await execute(*args, **options)
        return await execute(*args, **options)

    return call


class Cluster:
    def __init__(self, url: str, prefix: str, rng: random.Random, loss: float = 0.0) -> None:
        self.url, self.prefix, self.rng = url, prefix, rng
        self.loss = loss
        self.loss_rng = random.Random(rng.random()) if loss else None
        self.settings = Settings(
            redis_url=url,
            key_prefix=prefix,
            snapshot_every_records=rng.choice([1, 2, 3, 5, 8, 13]),
            sync_batch=rng.choice([1, 2, 3, 4, 7]),
            snapshot_chunk_bytes=rng.choice([1024, 4096, 2**20]),
        )
        self.replicas: list[Replica] = []

    async def start_replica(self) -> Replica:
        client = await connect(self.url, 5.0)
        if self.loss:
            client.execute_command = _lossy(
                client.execute_command, random.Random(self.loss_rng.random()), self.loss
            )
        store = Store(client, self.prefix, 3600, self.settings.max_step_gap)
        engine = Engine(JitteryStore(store, random.Random(self.rng.random())), self.settings)
        return Replica(engine, client)

    async def start(self) -> None:
        self.replicas = [await self.start_replica() for _ in range(REPLICAS)]

    async def restart(self, index: int) -> None:
        old = self.replicas[index]
        self.replicas[index] = await self.start_replica()  # new calls go to the fresh replica
        await old.kill()

    def pick(self) -> Replica:
        return self.rng.choice(self.replicas)

    async def close(self) -> None:
        for replica in self.replicas:
            await replica.kill()


async def _answered(cluster: Cluster, make_call, sends: list | None = None):
    """Calls until a replica answers (a killed replica or an unreachable store: retry elsewhere); the
    number of sends it took is appended to `sends`."""
    for attempt in range(200):
        replica = cluster.pick()
        try:
            answer = await replica.call(make_call(replica.engine))
        except (Killed, Unavailable):
            await asyncio.sleep(0.001)
            continue
        except BaseException:  # answered with an error: counted too
            if sends is not None:
                sends.append(attempt + 1)
            raise
        if sends is not None:
            sends.append(attempt + 1)
        return answer
    raise AssertionError("no replica answered 200 times in a row")


async def _client(
    cluster: Cluster,
    model: ReplicaModel,
    name: str,
    rng: random.Random,
    tag: str,
    ops: int,
    ledger: list[int] | None = None,
):
    """One client's random calls. `ledger`: [applied answered, results sent] of new observes answered
    at their first send (the two must be equal)."""
    ledger = [0, 0] if ledger is None else ledger
    spec = model.spec
    sent: list[tuple[str, int, list]] = []  # (request id, step, results) of earlier observes
    for i in range(ops):
        roll = rng.random()
        if roll < 0.55:  # observe: new, a retry of an earlier one, or an earlier id with another body
            kind = rng.random()
            if sent and kind < 0.15:
                rid, step, results = rng.choice(sent)
            elif sent and kind < 0.22:
                rid, step, _ = rng.choice(sent)
                results = random_results(rng, spec.size, spec.rollouts_per_prompt)
            else:
                rid = f"{tag}-{i}"
                step = max(0, model.open_step + rng.choice([-3, -2, -1, -1, 0, 0, 0, 0, 1, 2]))
                results = random_results(rng, spec.size, spec.rollouts_per_prompt)
                sent.append((rid, step, results))

            def observe(engine, rid=rid, step=step, results=results):
                return engine.observe(name, step=step, request_id=rid, results=results)

            sends: list[int] = []
            try:
                applied, duplicate, lag = await _answered(cluster, observe, sends)
            except Conflict:
                continue  # step closed beyond max_lag, or the id names another body: nothing applied
            if rid == f"{tag}-{i}" and sends == [1]:  # a new request sent once: lost replies answered right
                assert (applied, duplicate) == (len(results), False), (
                    f"request {rid}, sent once, was answered applied {applied}, duplicate {duplicate}"
                )
                ledger[0] += applied
                ledger[1] += len(results)
            model.acknowledged(rid, step, lag, results)
        elif roll < 0.8:  # select: the open step, or ahead (opens it)
            step = model.open_step + rng.choice([0, 0, 0, 1, 2])
            strategy = rng.choice(["insight", "dps", "uniform", "mopps"])
            seed = rng.randint(0, 3)

            def select(engine, step=step, strategy=strategy, seed=seed):
                return engine.select(name, step=step, batch_size=3, strategy=strategy, params={}, seed=seed)

            fail = rng.random() < 0.2
            token = _FAIL_AFTER_CLOSE.set(fail)
            tries: list[int] = []
            try:
                await _answered(cluster, select, tries)
            except Conflict:
                if tries and tries[-1] > 1:  # an earlier send may have closed up to `step`
                    model.maybe_opened(step)
                continue  # another client opened a later step first
            except InjectedFailure:
                assert fail
                if tries and tries[-1] > 1:
                    model.maybe_opened(step)
                continue  # a 5xx: nothing this send did may have moved (the model opens nothing)
            finally:
                _FAIL_AFTER_CLOSE.reset(token)
            assert not fail, "a select that had to fail after its close answered"
            model.opened(step)
        elif roll < 0.97:  # read
            await _answered(cluster, lambda engine: engine.read(name, lambda st: st.open_step))
        else:  # kill -9 a replica and start a fresh one in its place
            await cluster.restart(rng.randrange(REPLICAS))


async def _check(cluster: Cluster, model: ReplicaModel, name: str, seed: int, phase: int) -> None:
    last = model.last_states()
    # The state the replicas hold among those the model allows (they differ only where an unacknowledged
    # select may have ended a close: a close over a gap rounds once, docs/methods.md §3.2).
    candidates = model.states()
    first = await cluster.replicas[0].engine.read(name, lambda st: st)
    expected = next((c for c in candidates if not differences(first, c, last)), candidates[0])
    batches = model_batches(model.spec, expected, 3)
    fresh = await cluster.start_replica()
    seen_last = seen_history = seen_streak = None
    replay = f"  (replay: REPLICA_SEARCH_SEEDS={seed})"
    try:
        for index, replica in enumerate([*cluster.replicas, fresh]):
            got = await replica.engine.read(name, lambda st: st)
            who = f"seed {seed} phase {phase} replica {index}{' (fresh)' if replica is fresh else ''}"
            diffs = differences(got, expected, last)
            assert not diffs, f"{who}: " + "; ".join(diffs) + replay
            got_batches, history = await replica.engine.read(
                name,
                lambda st: (
                    model_batches(model.spec, st, 3),
                    model_batches(model.spec, st, 3, ORDER_DEPENDENT),
                ),
            )
            assert got_batches == batches, f"{who}: batches differ from the model's" + replay
            if seen_last is None:
                seen_last, seen_history = got.arrays.last_state.copy(), history
                seen_streak = got.arrays.streak.copy()
            assert (got.arrays.last_state == seen_last).all(), f"{who}: last_state differs" + replay
            assert (got.arrays.streak == seen_streak).all(), f"{who}: streak differs" + replay
            assert history == seen_history, f"{who}: history resampling batches differ" + replay
    finally:
        await fresh.kill()


def _random_spec(name: str, rng: random.Random) -> DatasetSpec:
    return DatasetSpec(
        name=name,
        size=rng.choice([4, 7, 12]),
        rollouts_per_prompt=rng.choice([1, 2, 4]),
        hmm_decay=rng.choice([0.5, 0.7, 1.0]),
        max_lag=rng.choice([0, 0, 1, 2]),
    )


async def _reincarnate(replica: Replica, model: ReplicaModel, name: str, rng: random.Random) -> ReplicaModel:
    """Deletes and creates the dataset again with a new random spec (the model starts over), or restores
    its own export over it with import?replace (same beliefs and open step, a new uid and log). Between
    phases, so no client request straddles it; the other replicas learn of it from their next request."""
    if rng.random() < 0.5:
        await replica.engine.delete_dataset(name)
        created, spec = await replica.engine.create_dataset(_random_spec(name, rng))
        assert created
        return ReplicaModel(spec)
    blob = await replica.engine.export_dataset(name)
    spec = await replica.engine.import_dataset(name, blob, replace=True)
    model.spec = spec  # the same history under the new uid: the batches follow the new incarnation
    return model


async def _schedule(url: str, seed: int) -> None:
    rng = random.Random(seed)
    prefix = f"search{uuid.uuid4().hex[:8]}"
    # Its own stream, so that the schedules of the seeds stay what they were without lost replies.
    loss = random.Random(f"lost-replies-{seed}").choice([0.0, 0.0, 0.05, 0.2])
    cluster = Cluster(url, prefix, rng, loss)
    ledger = [0, 0]
    await cluster.start()
    name = f"s{seed}"
    spec = _random_spec(name, rng)
    try:
        created, spec = await cluster.replicas[0].engine.create_dataset(spec)
        assert created
        model = ReplicaModel(spec)
        for phase in range(rng.randint(2, 4)):
            clients = [
                _client(
                    cluster,
                    model,
                    name,
                    random.Random(rng.random()),
                    f"p{phase}c{c}",
                    rng.randint(3, 14),
                    ledger,
                )
                for c in range(rng.randint(1, 4))
            ]
            await asyncio.gather(*clients)
            assert ledger[0] == ledger[1], f"seed {seed}: answered applied {ledger[0]} of {ledger[1]} results"
            await _check(cluster, model, name, seed, phase)
            if rng.random() < 0.3:  # a new incarnation through one replica, the others still warm
                model = await _reincarnate(cluster.pick(), model, name, rng)
    finally:
        await cluster.close()
        client = await connect(url, 5.0)
        try:
            keys = [k async for k in client.scan_iter(match=f"{prefix}:*", count=1000)]
            if keys:
                await client.delete(*keys)
        finally:
            await client.aclose()


def _seeds() -> list[int]:
    chosen = os.environ.get("REPLICA_SEARCH_SEEDS")
    if chosen:
        return [int(s) for s in chosen.split(",")]
    base = int(os.environ.get("REPLICA_SEARCH_BASE", "0"))
    return list(range(base, base + SCHEDULES))


def test_replicas_never_lose_or_double_acknowledged_observations(redis_url):
    failures = []

    async def run() -> None:
        for seed in _seeds():
            try:
                await _schedule(redis_url, seed)
            except AssertionError as exc:
                failures.append(f"seed {seed}: {exc}")
                if len(failures) >= 3:
                    return

    asyncio.run(run())
    assert not failures, "\n".join(failures)


def test_a_schedule_is_checked_against_the_model(redis_url):
    """The check can fail: a replica that drops one acknowledged result differs from the model."""

    async def run() -> list[str]:
        rng = random.Random(7)
        cluster = Cluster(redis_url, f"search{uuid.uuid4().hex[:8]}", rng)
        await cluster.start()
        spec = DatasetSpec(name="probe", size=5, rollouts_per_prompt=2)
        try:
            _, spec = await cluster.replicas[0].engine.create_dataset(spec)
            model = ReplicaModel(spec)
            await _client(cluster, model, "probe", random.Random(1), "c", 12)
            assert model.acks, "the probe schedule acknowledged nothing"
            dropped = ReplicaModel(
                spec, dict(list(model.acks.items())[1:]), model.open_step, set(model.opened_steps)
            )
            got = await cluster.replicas[1].engine.read("probe", lambda st: st)
            return differences(got, dropped.state(), dropped.last_states())
        finally:
            await cluster.close()

    assert asyncio.run(run())


@pytest.mark.parametrize("bad", ["observe", "select"])
def test_invalid_requests_in_a_schedule_apply_nothing(redis_url, bad):
    """Refused calls (ahead of the step gap) leave the model's view intact."""

    async def run() -> None:
        cluster = Cluster(redis_url, f"search{uuid.uuid4().hex[:8]}", random.Random(3))
        await cluster.start()
        try:
            _, spec = await cluster.replicas[0].engine.create_dataset(DatasetSpec(name="gap", size=4))
            engine = cluster.replicas[1].engine
            far = cluster.settings.max_step_gap + 1
            with pytest.raises(InvalidRequest):
                if bad == "observe":
                    await engine.observe(
                        "gap", step=far, request_id="far", results=random_results(random.Random(0), 4, 2)
                    )
                else:
                    await engine.select("gap", step=far, batch_size=1, strategy="uniform", params={}, seed=0)
            st = await cluster.replicas[2].engine.read("gap", lambda st: st)
            assert not differences(st, ReplicaModel(spec).state(), {})
        finally:
            await cluster.close()

    asyncio.run(run())
