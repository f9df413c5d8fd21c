"""Replica upkeep: this process's copy of each dataset, kept in step with the store's log.

Redis is the source of truth; this process keeps a materialized `DatasetState` per dataset and, before
it answers a read, catches up by applying the log records it has not seen (one round trip when nothing
is new). Writes go to the store first (atomically with their idempotency record) and are applied by
whichever process reads next, so every replica and every restart applies the same records in the same
order and computes the same bits.

Catching up never skips a record (store.py describes the protocol): records are numbered, each batch
is read atomically with the meta hash, a record is applied only when it is the next number, and a gap
(another replica's snapshot trimmed records this process had not applied) makes it load that snapshot
and continue from its cover point. A catch-up that finds the log long (or its replay costly) starts a
snapshot in the background, paced so that large datasets are not snapshotted back to back.

Kernels never run on the event loop: they run in worker threads (numba releases the GIL), one dataset
at a time per process (an asyncio lock per dataset).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from selector_service.dataset.state import DatasetSpec, DatasetState, LogGap
from selector_service.errors import NotFound, ServiceError, Unavailable
from selector_service.replication.memory import Admit, MemoryLedger, default_budget
from selector_service.settings import Settings
from selector_service.storage.snapshot import iter_snapshot_chunks, load_snapshot_chunks
from selector_service.storage.store import LogEntry, LogView, SnapshotMissing, Store, StoreError, parse_id

log = logging.getLogger("selector_service.engine")
T = TypeVar("T")
# How often one catch-up may start over from a newer snapshot before it answers 503: each restart means
# another replica committed a snapshot and trimmed the log while this one was loading or reading.
MAX_RELOADS = 20
REPLAY_BUDGET = 2e8  # DPS prompt-updates (closes x observed prompts) we accept replaying after a restart
# A dataset's next snapshot starts no sooner than this many times its previous snapshot's duration after
# that one ended, whatever the record/replay triggers say: at 10^8 prompts a snapshot takes ~40 s and the
# replay budget alone would ask for one every 2 closes, i.e. back to back. Snapshots shorter than
# SNAPSHOT_PACING_MIN_S are not paced: they stall nothing, and small datasets keep their log short.
SNAPSHOT_PACING = 4.0
SNAPSHOT_PACING_MIN_S = 1.0
# The snapshot lock expires this long after its holder last renewed it (it renews while it writes), so
# a process killed mid-snapshot holds up the dataset's next snapshot for at most this long.
SNAPSHOT_LOCK_TTL_MS = 30_000


@dataclass
class SyncStats:
    """What the last catch-up of a dataset did (exported as metrics)."""

    records: int = 0
    seconds: float = 0.0


class Replica:
    """The datasets this process holds (`states`, one asyncio lock each), what they are charged against
    its memory budget (`memory`), and their upkeep: catching up with the log, loading snapshots, and
    writing them in the background."""

    def __init__(self, store: Store, settings: Settings) -> None:
        self.store = store
        self.settings = settings
        self.owner = uuid.uuid4().hex
        self.states: dict[str, DatasetState] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self.snapshotting: dict[str, asyncio.Task[None]] = {}
        self.snapshot_not_before: dict[str, float] = {}  # time.monotonic() per dataset (pacing)
        self.maintaining: dict[str, asyncio.Task[None]] = {}  # catch-ups started by writes (see observe)
        self.sync_stats: dict[str, SyncStats] = {}
        self.catchup_observer: Callable[[float], None] | None = None
        # Memory admission (selector_service/replication/memory.py): every dataset held or coming in is charged.
        self.memory = MemoryLedger(
            settings.memory_budget_bytes or default_budget(settings.workers), self.states
        )

    def lock(self, name: str) -> asyncio.Lock:
        """The dataset's lock: held while its state is caught up, read or changed."""
        lock = self._locks.get(name)
        if lock is None:
            lock = self._locks[name] = asyncio.Lock()
        return lock

    async def read(self, name: str, fn: Callable[[DatasetState], T]) -> T:
        """Catches up, then runs `fn(state)` in a worker thread while holding the dataset lock."""
        async with self.lock(name):
            state = await self.sync(name)
            return await asyncio.to_thread(fn, state)

    def discard(self, name: str, state: DatasetState) -> None:
        """Drops this process's state of `name` (it ran ahead of the log): the next catch-up reloads it."""
        if self.states.get(name) is state:
            self.states.pop(name, None)

    def forget(self, name: str) -> None:
        """Drops everything this process keeps of dataset `name` (deleted)."""
        self.states.pop(name, None)
        self.snapshot_not_before.pop(name, None)

    async def close(self) -> None:
        """Stops the snapshots and catch-ups running in the background."""
        tasks = [*self.snapshotting.values(), *self.maintaining.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def sync(self, name: str) -> DatasetState:
        """Brings this process's state of `name` up to the store's log. Caller holds the dataset lock.

        Applies the records after the state's cursor, batch by batch, each batch read atomically with
        the meta hash. The state is replaced by the dataset's current snapshot (and catching up goes on
        from there) when it belongs to another incarnation, or when the next record is not the next
        number (`_behind_a_trim`): a state only ever applies a contiguous prefix of the log.
        """
        try:
            return await self._sync(name)
        finally:
            self.memory.incoming.pop(name, None)  # installed, or given up

    async def _sync(self, name: str) -> DatasetState:
        t0 = time.perf_counter()
        batch = self.settings.sync_batch
        state = self.states.get(name)
        applied = reloads = 0
        while True:
            view = await self.store.read_log(name, state.cursor if state else "", batch)
            uid = view.meta.get("uid")
            if uid is None:
                self.states.pop(name, None)
                raise NotFound(f"dataset {name!r} does not exist; create it with POST /datasets")
            gap = state is None or state.spec.uid != uid or _behind_a_trim(state, view)
            if state is not None and not gap and view.entries:
                count, gap = await asyncio.to_thread(_apply_entries, state, view.entries)
                applied += count
            if gap or state is None:
                reloads += 1
                if reloads > MAX_RELOADS:
                    raise Unavailable(
                        f"dataset {name!r} could not catch up with its log: newer snapshots kept "
                        f"replacing the one being loaded ({MAX_RELOADS} times); retry later"
                    )
                state = await self._load(name, uid, view.meta)
                if state is None:  # that snapshot was replaced while it was read: read the meta again
                    state = self.states.get(name)
                continue
            if len(view.entries) < batch:
                break
        self.states[name] = state
        elapsed = time.perf_counter() - t0
        self.sync_stats[name] = SyncStats(applied, elapsed)
        if self.catchup_observer is not None:
            self.catchup_observer(elapsed)
        self._maybe_snapshot(name, state, view.meta, view.length)
        return state

    async def _load(self, name: str, uid: str, meta: dict[str, str]) -> DatasetState | None:
        """Starts from the snapshot `meta` names if it has one, else from the priors.

        None when a chunk of that snapshot is gone: a newer snapshot replaced it while it was read (the
        caller reads the meta hash again).
        """
        doc = await self.store.get_spec(name)
        if doc is None or doc.get("uid") != uid:
            raise NotFound(f"dataset {name!r} was deleted while this request ran")
        spec = DatasetSpec.from_doc(doc)
        snap = meta.get("snap")
        state = None
        # admit() runs in the decoding thread, before the snapshot's arrays are allocated.
        with self.memory.admitting(name, "load", replacing=name) as admit:
            try:
                if not snap:
                    admit(spec, [])
                    state = await asyncio.to_thread(DatasetState, spec)
                else:
                    state = await self._load_snapshot(name, uid, snap, int(meta["snap_chunks"]), admit)
                if state is not None:
                    self.memory.incoming[name] = state  # charged until sync installs it or gives it up
            except MemoryError:
                raise self.memory.out_of_memory(name, "load") from None
        return state

    async def _load_snapshot(
        self, name: str, uid: str, snap: str, count: int, admit: Admit
    ) -> DatasetState | None:
        chunks = self._snapshot_chunks(name, snap, count)
        try:
            state = await asyncio.to_thread(load_snapshot_chunks, chunks, None, admit)
        except StoreError as exc:
            if isinstance(exc, SnapshotMissing):
                current = await self.store.read_meta(name)
                if current.get("snap") != snap:
                    return None
            raise Unavailable(
                f"the belief store is missing data it needs ({exc}); check its persistence and eviction "
                "settings, or restore the dataset from an export"
            ) from exc
        except ValueError as exc:
            # Never fall back to priors silently: that would reset every posterior.
            raise Unavailable(f"snapshot {snap} of dataset {name!r} cannot be read: {exc}") from exc
        if state.spec.uid != uid:
            raise Unavailable(f"snapshot {snap} of dataset {name!r} belongs to another incarnation")
        return state

    def _snapshot_chunks(self, name: str, snap: str, count: int) -> Iterator[bytes]:
        """The chunks of snapshot `snap`, fetched one at a time on the event loop.

        Meant to be consumed in a worker thread (the streaming loader): each chunk is read from the store
        only when the loader needs it, so a load never holds more than about one chunk of compressed data.
        """
        loop = asyncio.get_running_loop()  # taken here, on the loop: fetch() runs in the worker thread
        wait_s = max(60.0, 4 * self.settings.store_timeout_s)

        def fetch() -> Iterator[bytes]:
            for index in range(count):
                coro = self.store.read_snapshot_chunk(name, snap, index)
                fut = asyncio.run_coroutine_threadsafe(coro, loop)
                try:
                    yield fut.result(timeout=wait_s)
                except concurrent.futures.TimeoutError as exc:
                    fut.cancel()
                    raise StoreError(
                        f"reading chunk {index} of snapshot {snap} took over {wait_s:.0f} s"
                    ) from exc

        return fetch()

    def _maybe_snapshot(self, name: str, state: DatasetState, meta: dict[str, str], length: int) -> None:
        if name in self.snapshotting or not state.cursor:
            return
        if time.monotonic() < self.snapshot_not_before.get(name, 0.0):
            return
        covered = meta.get("snap_covered", "")
        if covered and parse_id(state.cursor) <= parse_id(covered):
            return
        # A close updates the prompts observed so far (never-observed ones are implicit): replaying the
        # closes since the snapshot costs about closes x observed prompt-updates.
        closes = state.open_step - int(meta.get("snap_step", 0))
        replay = closes * max(state.arrays.observed, 1)
        if length < self.settings.snapshot_every_records and replay < REPLAY_BUDGET:
            return
        task = asyncio.get_running_loop().create_task(self.snapshot(name, state))
        self.snapshotting[name] = task
        task.add_done_callback(lambda _t: self.snapshotting.pop(name, None))

    async def snapshot(self, name: str, state: DatasetState) -> None:
        """Copies the state under the dataset lock, then compresses and writes it without holding it.

        The copy is compressed as a stream in worker threads and each chunk goes to the store as soon as
        it is full, so the whole compressed snapshot never exists in memory (peak: live arrays + their
        copy + about one chunk). The switch to the new snapshot stays atomic (chunks first, then one
        commit script). Whatever the outcome, when this one took at least SNAPSHOT_PACING_MIN_S, the
        next automatic snapshot of this dataset waits SNAPSHOT_PACING times its duration.
        """
        ttl_ms = SNAPSHOT_LOCK_TTL_MS
        try:
            if not await self.store.try_snapshot_lock(name, self.owner, ttl_ms):
                return
            started = time.monotonic()
            try:
                async with self.lock(name):
                    if self.states.get(name) is not state:
                        return
                    header, arrays = await asyncio.to_thread(state.copy_for_snapshot)
                if not await self.store.renew_snapshot_lock(name, self.owner, ttl_ms):
                    return  # held past its TTL while waiting for the dataset: another writer may have it
                chunks = iter_snapshot_chunks(header, arrays, self.settings.snapshot_chunk_bytes)
                del arrays  # the generator holds the copy until it is exhausted
                written = 0

                async def compressed() -> AsyncIterator[memoryview]:
                    nonlocal written
                    while (chunk := await asyncio.to_thread(next, chunks, None)) is not None:
                        written += len(chunk)
                        yield chunk
                        del chunk  # not kept alive while the next chunk is compressed

                ok = await self.store.write_snapshot(
                    name,
                    state.spec.uid,
                    header["cursor"],
                    header["seq"],
                    header["open_step"],
                    compressed(),
                    owner=self.owner,
                    lock_ttl_ms=ttl_ms,
                )
                log.info(
                    "snapshot of %s at %s (%d bytes, %.3f s, %s)",
                    name,
                    header["cursor"],
                    written,
                    time.monotonic() - started,
                    "ok" if ok else "dropped",
                )
            finally:
                ended = time.monotonic()
                if ended - started >= SNAPSHOT_PACING_MIN_S:
                    self.snapshot_not_before[name] = ended + SNAPSHOT_PACING * (ended - started)
                else:
                    self.snapshot_not_before.pop(name, None)
                await self.store.release_snapshot_lock(name, self.owner)
        except (Unavailable, OSError) as exc:
            log.warning("snapshot of %s failed, will retry later: %s", name, exc)
        except StoreError as exc:
            log.error("snapshot of %s refused: %s", name, exc)

    async def flush_snapshots(self) -> None:
        """Waits for snapshots in flight (tests and shutdown)."""
        await asyncio.gather(*list(self.snapshotting.values()), return_exceptions=True)

    async def snapshot_now(self, name: str) -> None:
        async with self.lock(name):
            state = await self.sync(name)
        await self.flush_snapshots()
        await self.snapshot(name, state)

    def catch_up_later(self, name: str) -> None:
        """Catches up with `name` in the background, which snapshots it when its log is long: a trainer
        that only observes (no select, no read in between) must not grow the log without bound."""
        if name in self.maintaining or name in self.snapshotting:
            return

        async def run() -> None:
            try:
                async with self.lock(name):
                    await self.sync(name)
            except ServiceError as exc:
                log.warning("background catch-up of %s failed: %s", name, exc.detail)

        task = asyncio.get_running_loop().create_task(run())
        self.maintaining[name] = task
        task.add_done_callback(lambda _t: self.maintaining.pop(name, None))


def _behind_a_trim(state: DatasetState, view: LogView) -> bool:
    """Whether records after the state's cursor may be missing from `view`: the next record is not the
    state's next number, or the log holds records the state has not applied yet none follows its
    cursor. (A record without a number is not a gap: applying it raises the error that names it.)"""
    if view.entries:
        number = view.entries[0][1].get("n")
        return number is not None and int(number) != state.seq + 1
    return view.seq != state.seq


def _apply_entries(state: DatasetState, entries: list[LogEntry]) -> tuple[int, bool]:
    """Applies records in order; returns (how many, whether it stopped at a gap)."""
    for count, (log_id, fields) in enumerate(entries):
        try:
            state.apply_record(log_id, fields)
        except LogGap:
            return count, True
    return len(entries), False
