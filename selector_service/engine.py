"""The engine: datasets' beliefs kept in step with the store, and the operations the API exposes.

Redis is the source of truth; this process keeps a materialized `DatasetState` per dataset and, before
it answers a read, catches up by applying the log records it has not seen (one round trip when nothing
is new). Writes go to the store first (atomically with their idempotency record) and are applied by
whichever process reads next, so every replica and every restart applies the same records in the same
order and computes the same bits.

Catching up never skips a record (store.py describes the protocol): records are numbered, each batch
is read atomically with the meta hash, a record is applied only when it is the next number, and a gap
(another replica's snapshot trimmed records this process had not applied) makes it load that snapshot
and continue from its cover point.

Kernels never run on the event loop: they run in worker threads (numba releases the GIL), one dataset
at a time per process (an asyncio lock per dataset).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hashlib
import json
import logging
import math
import threading
import time
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from redis.exceptions import RedisError

from selector_service.core import strategies
from selector_service.core.beliefs import _INITIAL_CAPACITY
from selector_service.core.coldstart import check_metadata
from selector_service.core.coldstart import prior_arrays as cold_betas
from selector_service.core.outcomes import outcomes_from_counts, outcomes_from_flat
from selector_service.core.rollouts import RolloutError, RolloutRequest, check_rollouts
from selector_service.errors import (
    Conflict,
    InsufficientMemory,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    ServiceError,
    Unavailable,
)
from selector_service.history import select_note
from selector_service.memory import admission_bytes, default_budget, human
from selector_service.schemas import Belief, DatasetCreate, PackedResults
from selector_service.settings import Settings
from selector_service.snapshot import (
    iter_snapshot_chunks,
    load_snapshot_chunks,
    serialize_snapshot,
)
from selector_service.state import (
    DatasetSpec,
    DatasetState,
    LogGap,
    UnnumberedRecord,
    pack_metadata,
    pack_results,
)
from selector_service.store import LogView, SnapshotMissing, Store, StoreError, parse_id

log = logging.getLogger("selector_service.engine")
T = TypeVar("T")
# How often one catch-up may start over from a newer snapshot before it answers 503: each restart means
# another replica committed a snapshot and trimmed the log while this one was loading or reading.
MAX_RELOADS = 20
INLINE_RESULTS = 4096
IMPORTED_CURSOR = "0-1"  # an imported dataset's snapshot covers "everything before its first log entry"
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
# An import's body is handed from the event loop to the decoding thread in pieces of about this size.
IMPORT_PIECE_BYTES = 1 << 20
# A select's close (Engine._close_and_run) holds the dataset's closing reservation for at most this long
# (observe and metadata writes wait meanwhile), and commits it at most this many times when the log keeps
# moving between its catch-up and its commit.
CLOSE_RESERVATION_MS = 5_000
CLOSE_ATTEMPTS = 5
# The cursor a state holds between a select's in-memory close and its commit (never seen by anyone else:
# the dataset lock is held, and the state is discarded unless the commit gives it the real log id).
PENDING_CURSOR = "pending"


@dataclass
class SyncStats:
    """What the last catch-up of a dataset did (exported as metrics)."""

    records: int = 0
    seconds: float = 0.0


class Engine:
    def __init__(self, store: Store, settings: Settings) -> None:
        self.store = store
        self.settings = settings
        self.owner = uuid.uuid4().hex
        self._states: dict[str, DatasetState] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._snapshotting: dict[str, asyncio.Task] = {}
        self._snapshot_not_before: dict[str, float] = {}  # time.monotonic() per dataset (pacing)
        self._maintaining: dict[str, asyncio.Task] = {}  # catch-ups started by writes (see observe)
        self.sync_stats: dict[str, SyncStats] = {}
        self.catchup_observer: Callable[[float], None] | None = None
        # Memory admission (selector_service/memory.py): every dataset held or coming in is charged.
        self.memory_budget = settings.memory_budget_bytes or default_budget(settings.workers)
        self._reserved: dict[object, tuple[str, int]] = {}  # admitted, not allocated yet
        self._incoming: dict[str, DatasetState] = {}  # allocated by a catch-up, not installed yet
        self._budget_lock = threading.Lock()  # admission runs on the loop and in decoding threads

    # ---- plumbing -------------------------------------------------------------------------------
    async def _io(self, coro: Awaitable[T]) -> T:
        try:
            return await coro
        except RedisError as exc:
            raise Unavailable(
                f"the belief store is unreachable ({type(exc).__name__}: {exc}); retry later"
            ) from exc
        except StoreError as exc:
            raise Unavailable(
                f"the belief store is missing data it needs ({exc}); check its persistence and eviction "
                "settings, or restore the dataset from an export"
            ) from exc

    def _lock(self, name: str) -> asyncio.Lock:
        lock = self._locks.get(name)
        if lock is None:
            lock = self._locks[name] = asyncio.Lock()
        return lock

    # ---- memory admission ---------------------------------------------------------------------
    def memory_held(self, replacing: str | None = None) -> int:
        """Bytes charged now: every dataset held (but `replacing`'s, about to be replaced), every one
        allocated and not installed yet, every admission not allocated yet."""
        states = [s for n, s in list(self._states.items()) if n != replacing]
        states += list(self._incoming.values())
        return sum(s.memory_bytes() for s in states) + sum(b for _, b in list(self._reserved.values()))

    def _admit(self, name: str, nbytes: int, action: str, replacing: str | None = None) -> object:
        """Reserves `nbytes` for dataset `name` (InsufficientMemory when they do not fit in the budget);
        returns the token `_unreserve` takes once the dataset is allocated and counted, or given up."""
        with self._budget_lock:
            held = self.memory_held(replacing)
            if held + nbytes > self.memory_budget:
                raise self._no_room(name, nbytes, held, action)
            token = object()
            self._reserved[token] = (name, nbytes)
            return token

    def _unreserve(self, token: object) -> None:
        with self._budget_lock:
            self._reserved.pop(token, None)

    def _no_room(self, name: str, nbytes: int, held: int, action: str) -> InsufficientMemory:
        after = {
            "create": "nothing was created",
            "import": "nothing was imported",
            "load": "it stays intact in the store; serve it from a replica with room for it",
        }[action]
        return InsufficientMemory(
            f"dataset {name!r} needs about {human(nbytes)} of memory in this process (43 bytes per prompt "
            f"plus 65 per observed prompt, twice: live and a snapshot's copy) and the datasets it holds "
            f"already take {human(held)} of its {human(self.memory_budget)} memory budget "
            f"(SELECTOR_MEMORY_BUDGET_BYTES); {after}. Delete datasets no longer needed, or give the "
            "service more memory and a larger SELECTOR_MEMORY_BUDGET_BYTES"
        )

    def _out_of_memory(self, name: str, action: str) -> InsufficientMemory:
        done = {
            "create": "nothing was created",
            "import": "nothing was imported",
            "load": "the store keeps it",
        }
        return InsufficientMemory(
            f"the process ran out of memory allocating dataset {name!r} ({done[action]}): its memory "
            f"budget ({human(self.memory_budget)}, SELECTOR_MEMORY_BUDGET_BYTES) is larger than what the "
            "machine or its limits (ulimit, cgroup) allow; lower it"
        )

    async def ready(self) -> bool:
        try:
            return await asyncio.wait_for(self.store.ping(), self.settings.store_timeout_s)
        except (RedisError, OSError, TimeoutError):
            return False

    async def close(self) -> None:
        tasks = [*self._snapshotting.values(), *self._maintaining.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # ---- datasets -------------------------------------------------------------------------------
    async def create_dataset(self, spec: DatasetSpec) -> tuple[bool, DatasetSpec]:
        """Returns (created, stored spec); Conflict when the name holds a different spec.

        The dataset is admitted against the memory budget and its beliefs allocated before the store
        hears of it: a create refused for memory (507) or failing to allocate leaves nothing behind.
        """
        if spec.size > self.settings.max_dataset_size:
            raise InvalidRequest(
                f"size {spec.size} exceeds this service's limit of {self.settings.max_dataset_size} prompts"
            )
        token = None
        async with self._lock(spec.name):
            try:
                held = self._states.get(spec.name)
                fresh = None
                if held is None or held.spec.fingerprint() != spec.fingerprint():
                    need = admission_bytes(spec.size, min(spec.size, _INITIAL_CAPACITY))
                    token = self._admit(spec.name, need, "create")  # held until the state is installed
                    try:
                        # Materialized now, so that the first select does not pay for allocating the arrays.
                        fresh = await asyncio.to_thread(DatasetState, spec)
                    except MemoryError:
                        raise self._out_of_memory(spec.name, "create") from None
                status, doc = await self._io(
                    self.store.create_dataset(spec.name, spec.public(), spec.fingerprint())
                )
                stored = DatasetSpec.from_doc(doc)
                if status == "conflict":
                    raise Conflict(
                        f"dataset {spec.name!r} already exists with a different spec "
                        f"({json.dumps(stored.public(), sort_keys=True)}); "
                        "use another name, or DELETE it first"
                    )
                if status == "created" and fresh is not None:
                    fresh.spec = stored
                    self._states[spec.name] = fresh
            finally:
                if token is not None:
                    self._unreserve(token)
        return status == "created", stored

    async def create_dataset_from(self, request: DatasetCreate) -> tuple[bool, DatasetSpec]:
        """POST /datasets: the spec a request asks for, its per-strategy defaults checked against each
        strategy's parameters (InvalidRequest), then `create_dataset`."""
        spec = DatasetSpec.from_request(request)
        for strategy in request.defaults:
            self.resolve_params(spec, strategy, {})
        return await self.create_dataset(spec)

    async def describe(self, name: str) -> tuple[DatasetSpec, dict[str, Any]]:
        """The dataset's spec and its summary (open step, counters, metadata coverage), caught up."""
        return await self.read(name, lambda st: (st.spec, st.summary()))

    async def list_datasets(self) -> list[str]:
        return await self._io(self.store.list_datasets())

    async def record_counts(self, names: list[str]) -> dict[str, int]:
        """How many log records each dataset has had appended (its activity, as /metrics ranks it)."""
        return await self._io(self.store.read_seqs(names))

    async def delete_dataset(self, name: str) -> None:
        async with self._lock(name):
            existed = await self._io(self.store.delete_dataset(name))
            self._states.pop(name, None)
            self._snapshot_not_before.pop(name, None)
        if not existed:
            raise NotFound(f"dataset {name!r} does not exist")

    async def spec(self, name: str) -> DatasetSpec:
        """The dataset's spec, from memory when this process has it.

        An incarnation's spec never changes, but a name can get a new incarnation (deleted and created
        again, or imported with replace) through another process: requests that check against this
        spec go through `_with_spec`, which re-reads the stored one when the check or the store refuses.
        """
        state = self._states.get(name)
        if state is not None:
            return state.spec
        stored = await self._stored_spec(name)
        if stored is None:
            raise NotFound(f"dataset {name!r} does not exist; create it with POST /datasets")
        return stored

    async def _stored_spec(self, name: str) -> DatasetSpec | None:
        doc = await self._io(self.store.get_spec(name))
        return None if doc is None else DatasetSpec.from_doc(doc)

    async def _with_spec(self, name: str, attempt: Callable[[DatasetSpec], Awaitable[T]]) -> T:
        """`attempt(spec)` with this process's spec of `name`; when it is refused in a way an outdated
        spec explains (an InvalidRequest from a check against the spec, or the store answering that
        the incarnation is gone) and the stored spec belongs to another incarnation, the state of the
        old one is dropped and `attempt` runs once more with the stored spec. A refused attempt applies
        nothing, so running it again is safe."""
        spec = await self.spec(name)
        try:
            return await attempt(spec)
        except (InvalidRequest, _Gone) as exc:
            stored = await self._stored_spec(name)
            if stored is None or stored.uid == spec.uid:
                if isinstance(exc, _Gone):
                    self._states.pop(name, None)
                    raise NotFound(f"dataset {name!r} does not exist (it may have been deleted)") from None
                raise
            self._states.pop(name, None)
        try:
            return await attempt(stored)
        except _Gone:
            self._states.pop(name, None)
            raise NotFound(f"dataset {name!r} was deleted or recreated while this request ran") from None

    # ---- catching up with the log ---------------------------------------------------------------
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
            self._incoming.pop(name, None)  # installed, or given up

    async def _sync(self, name: str) -> DatasetState:
        t0 = time.perf_counter()
        batch = self.settings.sync_batch
        state = self._states.get(name)
        applied = reloads = 0
        while True:
            view = await self._io(self.store.read_log(name, state.cursor if state else "", batch))
            uid = view.meta.get("uid")
            if uid is None:
                self._states.pop(name, None)
                raise NotFound(f"dataset {name!r} does not exist; create it with POST /datasets")
            gap = state is None or state.spec.uid != uid or _behind_a_trim(state, view)
            if not gap and view.entries:
                try:
                    count, gap = await asyncio.to_thread(_apply_entries, state, view.entries)
                except UnnumberedRecord as exc:
                    raise Unavailable(str(exc)) from exc
                applied += count
            if gap:
                reloads += 1
                if reloads > MAX_RELOADS:
                    raise Unavailable(
                        f"dataset {name!r} could not catch up with its log: newer snapshots kept "
                        f"replacing the one being loaded ({MAX_RELOADS} times); retry later"
                    )
                state = await self._load(name, uid, view.meta)
                if state is None:  # that snapshot was replaced while it was read: read the meta again
                    state = self._states.get(name)
                continue
            if len(view.entries) < batch:
                break
        self._states[name] = state
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
        doc = await self._io(self.store.get_spec(name))
        if doc is None or doc.get("uid") != uid:
            raise NotFound(f"dataset {name!r} was deleted while this request ran")
        spec = DatasetSpec.from_doc(doc)
        snap = meta.get("snap")
        tokens: list[object] = []

        def admit(spec: DatasetSpec, layout: list) -> None:  # in the decoding thread, before allocating
            need = admission_bytes(spec.size, _observed_rows(spec, layout))
            tokens.append(self._admit(name, need, "load", replacing=name))

        state = None
        try:
            if not snap:
                admit(spec, [])
                state = await asyncio.to_thread(DatasetState, spec)
            else:
                state = await self._load_snapshot(name, uid, snap, int(meta["snap_chunks"]), admit)
            if state is not None:
                self._incoming[name] = state  # charged until sync installs it or gives it up
        except MemoryError:
            raise self._out_of_memory(name, "load") from None
        finally:
            for token in tokens:
                self._unreserve(token)
        return state

    async def _load_snapshot(
        self, name: str, uid: str, snap: str, count: int, admit: Callable[[DatasetSpec, list], None]
    ) -> DatasetState | None:
        chunks = self._snapshot_chunks(name, snap, count)
        try:
            state = await self._io(asyncio.to_thread(load_snapshot_chunks, chunks, None, admit))
        except Unavailable as exc:
            if isinstance(exc.__cause__, SnapshotMissing):
                current = await self._io(self.store.read_meta(name))
                if current.get("snap") != snap:
                    return None
            raise
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
        if name in self._snapshotting or not state.cursor:
            return
        if time.monotonic() < self._snapshot_not_before.get(name, 0.0):
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
        task = asyncio.get_running_loop().create_task(self._snapshot(name, state))
        self._snapshotting[name] = task
        task.add_done_callback(lambda _t: self._snapshotting.pop(name, None))

    async def _snapshot(self, name: str, state: DatasetState) -> None:
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
                async with self._lock(name):
                    if self._states.get(name) is not state:
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
                    self._snapshot_not_before[name] = ended + SNAPSHOT_PACING * (ended - started)
                else:
                    self._snapshot_not_before.pop(name, None)
                await self.store.release_snapshot_lock(name, self.owner)
        except (RedisError, OSError) as exc:
            log.warning("snapshot of %s failed, will retry later: %s", name, exc)
        except StoreError as exc:
            log.error("snapshot of %s refused: %s", name, exc)

    async def flush_snapshots(self) -> None:
        """Waits for snapshots in flight (tests and shutdown)."""
        await asyncio.gather(*list(self._snapshotting.values()), return_exceptions=True)

    async def snapshot_now(self, name: str) -> None:
        async with self._lock(name):
            state = await self.sync(name)
        await self.flush_snapshots()
        await self._snapshot(name, state)

    # ---- backup and restore -------------------------------------------------------------------
    async def export_dataset(self, name: str) -> bytes:
        """The dataset's spec and beliefs as one compressed, checksummed blob (a snapshot)."""
        header, arrays = await self.read(name, lambda st: st.copy_for_snapshot())
        return await asyncio.to_thread(serialize_snapshot, header, arrays)

    async def import_dataset(
        self, name: str, body: bytes | AsyncIterable[bytes], replace: bool = False
    ) -> DatasetSpec:
        """Creates dataset `name` from an export: same spec and beliefs, a fresh log and uid.

        `body` is the export, whole or as the request's stream: it is decoded as it arrives (read_export:
        the header is checked first, so a body that is not an export is refused after its first piece,
        and the dataset is admitted against the memory budget before its arrays are allocated), then
        compressed again chunk by chunk into the store, and committed in one step (with `replace`, the
        dataset of that name is deleted only once the new chunks are in the store). Peak memory: the
        dataset's arrays plus about one store chunk and one body piece.
        """
        tokens: list[object] = []

        def admit(spec: DatasetSpec, layout: list) -> None:  # in the decoding thread, before allocating
            need = admission_bytes(spec.size, _observed_rows(spec, layout))
            tokens.append(self._admit(name, need, "import", replacing=name if replace else None))

        if isinstance(body, bytes | bytearray | memoryview):
            chunks: Iterable[bytes] = [bytes(body)]
        else:
            chunks = _pull_pieces(body, asyncio.get_running_loop(), IMPORT_PIECE_BYTES)
        try:
            try:
                state = await asyncio.to_thread(read_export, chunks, self.settings.max_dataset_size, admit)
            except MemoryError:
                raise self._out_of_memory(name, "import") from None
            spec = DatasetSpec.from_doc(dict(state.spec.public(), name=name, uid=uuid.uuid4().hex))
            state.spec = spec
            state.cursor = IMPORTED_CURSOR
            state.seq = 0  # the new incarnation's log starts empty: its first record is number 1
            # The state is not shared yet: its arrays are compressed in place, no copy, one chunk at a
            # time in a worker thread, each written to the store before the next is made.
            pieces = iter_snapshot_chunks(
                state.snapshot_header(), state.snapshot_arrays(), self.settings.snapshot_chunk_bytes
            )

            async def compressed() -> AsyncIterator[memoryview]:
                while (chunk := await asyncio.to_thread(next, pieces, None)) is not None:
                    yield chunk
                    del chunk

            try:
                snap_id, count = await self._io(self.store.write_import_chunks(name, compressed()))
            except MemoryError:
                raise self._out_of_memory(name, "import") from None
            committed = False
            try:
                async with self._lock(name):
                    ok = await self._io(
                        self.store.commit_import(
                            name,
                            spec.public(),
                            spec.fingerprint(),
                            spec.uid,
                            IMPORTED_CURSOR,
                            state.open_step,
                            snap_id,
                            count,
                            replace=replace,
                        )
                    )
                    committed = True
                    if replace:
                        self._states.pop(name, None)
                    if not ok:
                        raise Conflict(
                            f"dataset {name!r} already exists; import under another name or pass replace=true"
                        )
                    self._states[name] = state
            finally:
                if not committed:
                    with contextlib.suppress(RedisError, OSError):
                        await self.store.discard_chunks(name, snap_id, count)
        finally:
            for token in tokens:
                self._unreserve(token)
        return spec

    # ---- operations -----------------------------------------------------------------------------
    async def history(self, name: str, since: int, limit: int) -> tuple[list[dict[str, Any]], int, int]:
        """Rows of the closed steps >= `since` (at most `limit`), the step to ask from next and the open
        step (history.py)."""
        return await self.read(name, lambda st: (*st.history.rows(since, limit), st.open_step))

    async def read(self, name: str, fn: Callable[[DatasetState], T]) -> T:
        """Catches up, then runs `fn(state)` in a worker thread while holding the dataset lock."""
        async with self._lock(name):
            state = await self.sync(name)
            return await asyncio.to_thread(fn, state)

    async def select(
        self,
        name: str,
        *,
        step: int,
        batch_size: int,
        strategy: str,
        params: dict[str, Any],
        seed: int,
        rollouts: Any = None,
    ) -> tuple[np.ndarray, np.ndarray | None, int, np.ndarray | None]:
        """(prompt ids, scores or None, the step, rollouts per prompt or None). `rollouts`: a rollout
        budget (the API's RolloutBudget, or a core RolloutRequest), checked before anything moves; the
        counts come from the state the batch was chosen from (docs/methods.md §8)."""

        async def attempt(spec: DatasetSpec):
            _check_batch_size(name, batch_size, spec)  # first: a budget's bounds follow from batch_size
            budget = rollout_request(batch_size, rollouts)
            merged = self.resolve_params(spec, strategy, params)
            note = select_note(strategy, batch_size, _select_digest(strategy, merged, seed, batch_size))

            def check(state: DatasetState) -> None:  # on the caught-up state, before anything moves
                problem = strategies.STRATEGIES[strategy].unmet(state.arrays, batch_size, name)
                if problem is not None:
                    raise InvalidRequest(problem)

            def run(state: DatasetState):
                try:
                    ids, scores = state.select(strategy, merged, batch_size, seed)
                except strategies.ParamError as exc:
                    raise InvalidRequest(str(exc)) from None
                counts = None if budget is None else state.rollout_counts(ids, budget, seed)
                return ids, scores, state.open_step, counts

            async with self._lock(name):  # the in-memory close is seen by no one until committed
                return await self._close_and_run(name, spec, step, note, check, run)

        return await self._with_spec(name, attempt)

    async def _close_and_run(
        self,
        name: str,
        spec: DatasetSpec,
        step: int,
        note: str,
        check: Callable[[DatasetState], None],
        run: Callable[[DatasetState], T],
    ) -> T:
        """A select's step close and its answer, atomic with each other: a select that fails (any
        exception, a 4xx or a 5xx) leaves the dataset as it was, in the store and in every process.
        Caller holds the dataset lock.

        The order is: catch up with the log, apply the select's own record (the close of every step
        below `step`, or a note at the open step) to the state IN MEMORY, choose the batch (`run`), and
        only then commit that record to the store with a conditional script (`Store.commit_close`: only
        if the log still ends at the record this state applied, with the same uid and open step). So the
        store never holds the close of a select that did not answer, and the answer is computed from
        exactly the state every replica reaches by applying the committed log. On any failure after the
        in-memory close, or when the log moved meanwhile, this process's state is discarded: the next
        catch-up rebuilds it from the store (snapshot + log), so memory never runs ahead of the log; a
        moved log is retried (CLOSE_ATTEMPTS). While the close is in flight the dataset's closing
        reservation (SET NX PX, owned by a token, CLOSE_RESERVATION_MS) makes observe and metadata
        writes wait (`_until_not_busy`), so a stream of observes cannot starve a select.

        The simpler order (advance in the store first, then select) answered 5xx with the step already
        closed; a copy of the state before each close would cost the dataset's memory and a copy's time
        on every select, where this costs one more round trip (the reservation) and, on failure only, a
        rebuild.
        """
        token = uuid.uuid4().hex
        reserved = await self._reserve_close(name, token)
        try:
            for _ in range(CLOSE_ATTEMPTS):
                state = await self.sync(name)
                if state.spec.uid != spec.uid:
                    raise _Gone  # another incarnation: _with_spec looks at the stored spec
                if step < state.open_step:
                    raise Conflict(
                        f"step {step} of dataset {name!r} is closed; the open step is {state.open_step}"
                    )
                if step - state.open_step > self.settings.max_step_gap:
                    raise self._too_far_ahead(name, step, state.open_step)
                check(state)
                if step == state.open_step and state.history.counted(note):
                    # The same request (strategy, parameters, seed, batch size) was already counted at
                    # the open step (a retry, or every rank asking for the step): nothing to close and
                    # nothing new for the history, so no record; the answer is the same either way.
                    return await asyncio.to_thread(run, state)
                seq, open_step = state.seq, state.open_step
                try:
                    answer = await asyncio.to_thread(_close_in_memory_and_run, state, step, note, run)
                    res = await self._io(
                        self.store.commit_close(name, spec.uid, step, note, seq, open_step, token)
                    )
                except BaseException:
                    self._discard(name, state)
                    raise
                if res.status == "ok":
                    state.cursor = res.log_id
                    reserved = False  # the commit released it
                    return answer
                self._discard(name, state)
                if res.status == "gone":
                    raise _Gone
                if res.status == "behind":
                    raise Conflict(
                        f"step {step} of dataset {name!r} is closed; the open step is {res.open_step}"
                    )
                if res.status == "ahead":
                    raise self._too_far_ahead(name, step, res.open_step)
                if not reserved:  # "moved": the log grew between the catch-up and the commit
                    reserved = await self._reserve_close(name, token)
            raise Unavailable(
                f"dataset {name!r} kept receiving writes while this select closed its step "
                f"({CLOSE_ATTEMPTS} attempts); nothing was applied, retry"
            )
        finally:
            if reserved:
                with contextlib.suppress(RedisError, OSError, StoreError):
                    await self.store.release_close(name, token)

    def _discard(self, name: str, state: DatasetState) -> None:
        """Drops this process's state of `name` (it ran ahead of the log): the next catch-up reloads it."""
        if self._states.get(name) is state:
            self._states.pop(name, None)

    async def _reserve_close(self, name: str, token: str) -> bool:
        """Takes the closing reservation for `token`, waiting while another select holds it (at most about
        its TTL: a holder that died lets it expire). False when it could not be had: the close then goes
        ahead without it (its commit is conditional anyway), as when the store does not answer the
        reservation itself (then the catch-up that follows reports the store's state)."""
        deadline = time.monotonic() + CLOSE_RESERVATION_MS / 1000
        pause = 0.001
        while True:
            try:
                if await self.store.reserve_close(name, token, CLOSE_RESERVATION_MS):
                    return True
            except (RedisError, OSError):
                return False
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.02)

    async def _until_not_busy(self, write: Callable[[], Awaitable[Any]]) -> Any:
        """Runs a write script, sending it again while the store answers busy (a select's close holds the
        dataset's closing reservation; nothing was applied). Unavailable after about twice the
        reservation's TTL."""
        deadline = time.monotonic() + 2 * CLOSE_RESERVATION_MS / 1000
        pause = 0.001
        while True:
            res = await self._io(write())
            if res.status != "busy":
                return res
            if time.monotonic() >= deadline:
                return res
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.02)

    async def score(
        self, name: str, *, strategy: str, params: dict[str, Any], ids: np.ndarray, seed: int
    ) -> tuple[np.ndarray, int]:
        async def attempt(spec: DatasetSpec) -> tuple[np.ndarray, int]:
            check_ids(ids, spec.size)
            merged = self.resolve_params(spec, strategy, params)
            if not strategies.STRATEGIES[strategy].scored:
                raise InvalidRequest(
                    f"strategy {strategy!r} walks a permutation and has no per-prompt scores; "
                    "score with a scored strategy (e.g. insight, dps, mopps)"
                )

            def run(state: DatasetState) -> tuple[np.ndarray, int]:
                check_ids(ids, state.spec.size)  # the incarnation caught up with, not the one checked
                return state.score(strategy, merged, ids, seed), state.open_step

            return await self.read(name, run)

        return await self._with_spec(name, attempt)

    async def beliefs(self, name: str, ids: np.ndarray) -> tuple[int, list[Belief]]:
        """The open step and one Belief per id, in the order asked (ids checked against the size).

        A never-observed prompt reports its cold prior (docs/methods.md §6) and an HMM prior of (1/3, 1/3, 1/3).
        """

        def rows(state: DatasetState) -> tuple[int, list[Belief]]:
            check_ids(ids, state.spec.size)  # the incarnation caught up with, not the one checked
            a = state.arrays
            alpha, beta, rate = cold_betas(a, ids)
            hmm = a.hmm_prior_of(ids).astype(np.float64)
            columns = zip(ids, alpha, beta, a.n_obs[ids], hmm, a.group[ids], rate, strict=True)
            return state.open_step, [
                Belief(
                    prompt_id=int(i),
                    alpha=float(x),
                    beta=float(y),
                    mean=float(x / (x + y)),
                    observations=int(o),
                    hmm_prior=p.tolist(),
                    group=int(g),
                    prior_pass_rate=None if np.isnan(r) else float(r),
                )
                for i, x, y, o, p, g, r in columns
            ]

        async def attempt(spec: DatasetSpec) -> tuple[int, list[Belief]]:
            check_ids(ids, spec.size)
            return await self.read(name, rows)

        return await self._with_spec(name, attempt)

    def _busy(self, name: str) -> Unavailable:
        return Unavailable(
            f"dataset {name!r} is closing a step for a select that takes longer than usual; nothing was "
            "applied, retry"
        )

    def _too_far_ahead(self, name: str, step: int, open_step: int) -> InvalidRequest:
        return InvalidRequest(
            f"step {step} is {step - open_step} steps ahead of the open step {open_step} of dataset {name!r}; "
            f"a request may advance it by at most {self.settings.max_step_gap} steps "
            "(SELECTOR_MAX_STEP_GAP). Nothing was applied: check the step you send"
        )

    @staticmethod
    def resolve_params(spec: DatasetSpec, strategy: str, params: dict[str, Any]) -> dict[str, Any]:
        if strategy not in strategies.STRATEGIES:
            raise InvalidRequest(
                f"unknown strategy {strategy!r}; choose one of {', '.join(sorted(strategies.STRATEGIES))}"
            )
        merged = dict(spec.defaults.get(strategy, {}))
        merged.update(params)
        try:
            strategies.check_dataset_params(strategy, params, spec.defaults)
            return strategies.validate_params(strategy, merged)
        except strategies.ParamError as exc:
            raise InvalidRequest(str(exc)) from exc

    async def upload_metadata(
        self, name: str, *, offset: int, pass_rate: np.ndarray | None, group: np.ndarray | None
    ) -> dict[str, Any]:
        """Checks a metadata upload (docs/methods.md §6) against the dataset, appends it to the log as one record,
        and answers with the prompts it covers and the dataset's coverage once it is applied."""

        async def attempt(spec: DatasetSpec) -> tuple[int, int]:
            try:
                start, rates, groups = check_metadata(spec.size, offset, pass_rate, group)
            except ValueError as exc:
                raise InvalidRequest(f"{exc}; nothing was applied") from None
            count = len(rates) if rates is not None else len(groups)
            if count > INLINE_RESULTS:
                payload = await asyncio.to_thread(pack_metadata, start, rates, groups)
            else:
                payload = pack_metadata(start, rates, groups)
            res = await self._until_not_busy(lambda: self.store.append_metadata(name, spec.uid, payload))
            if res.status == "gone":
                raise _Gone
            if res.status == "busy":
                raise self._busy(name)
            return start, count

        start, count = await self._with_spec(name, attempt)
        coverage = await self.read(name, lambda st: st.coverage())
        return {"dataset": name, "offset": start, "count": count, "coverage": coverage}

    async def observe(
        self, name: str, *, step: int, request_id: str, results: Sequence[Any]
    ) -> tuple[int, bool, int]:
        """Validates a whole request, then appends it to the log atomically with its request id.

        Returns (results applied, duplicate, lag). A request id names one body: its retry is a duplicate
        (nothing applied, the first call's lag), the same id with another body, for another dataset or
        for an earlier incarnation of this one is a Conflict.
        """
        if len(results) > self.settings.max_ids_per_request:
            raise PayloadTooLarge(
                f"{len(results)} results in one request; the limit is {self.settings.max_ids_per_request}"
            )

        async def attempt(spec: DatasetSpec) -> tuple[DatasetSpec, Any]:
            if len(results) <= INLINE_RESULTS:
                payload, digest = outcome_payload(spec, step, results)  # ~0.1 ms for 256 results
            else:
                payload, digest = await asyncio.to_thread(outcome_payload, spec, step, results)
            owner, owner_uid, claimed = await self._io(self.store.claim_request(name, spec.uid, request_id))
            if owner != name:
                raise Conflict(
                    f"request_id {request_id!r} was already used for dataset {owner!r}; nothing was applied. "
                    "A request id names one request: use a new one for a new request"
                )
            if owner_uid and owner_uid != spec.uid:
                stored = await self._stored_spec(name)
                if stored is None or stored.uid != spec.uid:
                    raise _Gone  # this process's spec is outdated: _with_spec looks again
                # The id was used for an earlier incarnation (deleted and created again, or replaced by an
                # import): its results went to data that no longer exists; never credit them to this one.
                raise Conflict(
                    f"request_id {request_id!r} was used for an earlier incarnation of dataset {name!r} "
                    "(deleted and created again, or replaced by an import); nothing was applied. Use a new "
                    "request id for results of the dataset as it is now"
                )
            res = await self._until_not_busy(
                lambda: self.store.append_observe(
                    name, spec.uid, step, request_id, payload, digest, spec.max_lag
                )
            )
            if claimed and res.status in ("gone", "closed", "ahead", "busy"):  # refused: nothing applied
                await self._io(self.store.release_request(name, spec.uid, request_id))
            if res.status == "gone":
                raise _Gone
            if res.status == "busy":
                raise self._busy(name)
            return spec, res

        spec, res = await self._with_spec(name, attempt)
        if res.status == "dup":
            return 0, True, res.lag
        if res.status == "conflict":
            raise Conflict(
                f"request_id {request_id!r} was already applied with a different body (other results or "
                "step); nothing was applied. Retry with the identical body, or use a new request id"
            )
        if res.status == "ahead":
            raise self._too_far_ahead(name, step, res.open_step)
        if res.status == "closed":
            late = (
                f"; this dataset accepts results up to {spec.max_lag} steps late (max_lag)"
                if spec.max_lag
                else ""
            )
            raise Conflict(
                f"step {step} of dataset {name!r} is already closed (the open step is {res.open_step}"
                f"{late}); nothing was applied: report results for the open step or later"
            )
        if res.log_length >= self.settings.snapshot_every_records:
            self._catch_up_later(name)
        return len(results), False, res.lag

    def _catch_up_later(self, name: str) -> None:
        """Catches up with `name` in the background, which snapshots it when its log is long: a trainer
        that only observes (no select, no read in between) must not grow the log without bound."""
        if name in self._maintaining or name in self._snapshotting:
            return

        async def run() -> None:
            try:
                async with self._lock(name):
                    await self.sync(name)
            except ServiceError as exc:
                log.warning("background catch-up of %s failed: %s", name, exc.detail)

        task = asyncio.get_running_loop().create_task(run())
        self._maintaining[name] = task
        task.add_done_callback(lambda _t: self._maintaining.pop(name, None))


def _behind_a_trim(state: DatasetState, view: LogView) -> bool:
    """Whether records after the state's cursor may be missing from `view`: the next record is not the
    state's next number, the log holds records the state has not applied yet none follows its cursor,
    or (records from before numbering) the log was trimmed past the cursor."""
    if view.entries:
        number = view.entries[0][1].get("n")
        if number is not None:
            return int(number) != state.seq + 1
    elif view.seq != state.seq:
        return True
    trim = view.meta.get("trim")
    return bool(trim) and parse_id(state.cursor) < parse_id(trim)


def _apply_entries(state: DatasetState, entries: list) -> tuple[int, bool]:
    """Applies records in order; returns (how many, whether it stopped at a gap)."""
    for count, (log_id, fields) in enumerate(entries):
        try:
            state.apply_record(log_id, fields)
        except LogGap:
            return count, True
    return len(entries), False


def _close_in_memory_and_run(
    state: DatasetState, step: int, note: str, run: Callable[[DatasetState], T]
) -> T:
    """Applies a select's record (what `Store.commit_close` appends: number seq + 1, an advance to
    `step` carrying the note) to the state, then `run(state)`. Called with the dataset lock held; the
    caller discards the state if anything fails or the commit does not happen."""
    state.apply_record(PENDING_CURSOR, {"n": str(state.seq + 1), "k": "a", "s": str(step), "q": note})
    return run(state)


class _Gone(Exception):
    """The store refused a write because the dataset's incarnation it named is gone (deleted or replaced)."""


def _select_digest(strategy: str, params: dict[str, Any], seed: int, batch_size: int) -> str:
    """Names a select request in the step history: requests that give the same batch share it."""
    doc = json.dumps([strategy, params, seed, batch_size], sort_keys=True, default=str)
    return hashlib.blake2b(doc.encode(), digest_size=12).hexdigest()


def rollout_request(batch_size: int, rollouts: Any) -> RolloutRequest | None:
    """The checked rollout budget of a select (None without one): the API's RolloutBudget (budget, min,
    max, policy) or a core RolloutRequest, checked against batch_size (InvalidRequest naming the fix)."""
    if rollouts is None:
        return None
    if isinstance(rollouts, RolloutRequest):
        fields = (rollouts.budget, rollouts.min_rollouts, rollouts.max_rollouts, rollouts.policy)
    else:
        fields = (rollouts.budget, rollouts.min, rollouts.max, rollouts.policy)
    try:
        return check_rollouts(batch_size, *fields)
    except RolloutError as exc:
        raise InvalidRequest(f"{exc}; nothing was applied") from None


def _check_batch_size(name: str, batch_size: int, spec: DatasetSpec) -> None:
    if batch_size > spec.size:
        raise InvalidRequest(f"batch_size {batch_size} is larger than dataset {name!r} ({spec.size} prompts)")


def check_ids(ids: np.ndarray, size: int) -> None:
    if ids.size == 0:
        raise InvalidRequest("prompt_ids is empty: pass at least one prompt id")
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= size:
        bad = lo if lo < 0 else hi
        raise InvalidRequest(f"prompt id {bad} is out of range: ids must be in 0..{size - 1}")


def outcome_payload(spec: DatasetSpec, step: int, results: Sequence[Any]) -> tuple[bytes, str]:
    """Turns results into packed (ids, successes, trials, states), checking values against the spec, and
    the digest of the request body (dataset, step and results exactly as sent: rewards, or successes
    and trials) that a request id is bound to.

    A result is any object with the attributes `prompt_id`, `rewards`, `successes`, `trials` (the API's
    validated models; reading attributes avoids re-serializing thousands of rewards per request).
    """
    if isinstance(results, PackedResults):
        return _packed_payload(spec, step, results)
    n = len(results)
    if n == 0:
        raise InvalidRequest("results is empty: send at least one result")
    ids = np.empty(n, dtype=np.int64)
    succ = np.empty(n, dtype=np.float64)
    trials = np.empty(n, dtype=np.float64)
    states = np.empty(n, dtype=np.int8)
    reward_rows: list[int] = []
    flat: list[float] = []
    offsets = [0]
    count_rows: list[int] = []
    for i, r in enumerate(results):
        pid = r.prompt_id
        if not 0 <= pid < spec.size:
            raise InvalidRequest(
                f"results[{i}].prompt_id {pid} is out of range: ids must be in 0..{spec.size - 1}"
            )
        ids[i] = pid
        rewards = r.rewards
        if rewards is not None:
            if r.successes is not None or r.trials is not None:
                raise InvalidRequest(f"results[{i}]: send either rewards or successes + trials, not both")
            if len(rewards) == 0:
                raise InvalidRequest(f"results[{i}].rewards is empty: send one reward per rollout")
            reward_rows.append(i)
            flat.extend(rewards)
            offsets.append(len(flat))
            continue
        s, t = r.successes, r.trials
        if s is None or t is None:
            raise InvalidRequest(f"results[{i}]: send rewards, or both successes and trials")
        if not (math.isfinite(s) and math.isfinite(t)):
            raise InvalidRequest(f"results[{i}]: successes and trials must be finite")
        if t < 1 or t != int(t):
            raise InvalidRequest(f"results[{i}].trials is {t}: it must be a whole number >= 1")
        if s < 0:
            raise InvalidRequest(f"results[{i}].successes is {s}: it must be >= 0")
        if s > t:
            raise InvalidRequest(f"results[{i}]: successes ({s}) > trials ({t})")
        if spec.reward_mode == "binary" and s != int(s):
            raise InvalidRequest(
                f"results[{i}].successes is {s}: a binary-mode dataset counts whole successes "
                "(create the dataset with reward_mode 'fractional' for fractional rewards)"
            )
        succ[i], trials[i] = s, t
        count_rows.append(i)
    values = np.asarray(flat, dtype=np.float64)
    if not np.isfinite(values).all():
        bad = int(np.flatnonzero(~np.isfinite(values))[0])
        row = reward_rows[int(np.searchsorted(offsets, bad, side="right")) - 1]
        raise InvalidRequest(f"results[{row}].rewards contains {values[bad]}: rewards must be finite numbers")
    if reward_rows:
        rows = np.asarray(reward_rows, dtype=np.int64)
        rs, rt, rst = outcomes_from_flat(
            values,
            np.asarray(offsets, dtype=np.int64),
            spec.reward_mode,
            spec.success_threshold,
        )
        succ[rows], trials[rows], states[rows] = rs, rt, rst
    if count_rows:
        rows = np.asarray(count_rows, dtype=np.int64)
        states[rows] = outcomes_from_counts(succ[rows], trials[rows])
    return pack_results(ids, succ, trials, states), _body_digest(
        spec.name, step, ids, values, offsets, reward_rows, succ, trials, count_rows
    )


def _packed_payload(spec: DatasetSpec, step: int, pr: PackedResults) -> tuple[bytes, str]:
    """outcome_payload of results decoded as arrays (schemas.PackedResults): the same checks in the
    same order (the first row with a problem is named, with the first problem of that row, in the words
    of the loop above), the same payload and the same digest, in a few array passes."""
    n = len(pr)
    if n == 0:
        raise InvalidRequest("results is empty: send at least one result")
    ids, has_r, s, t = pr.ids, pr.has_rewards, pr.successes, pr.trials
    lengths = np.diff(pr.offsets)
    has_s, has_t = ~np.isnan(s), ~np.isnan(t)
    counts = ~has_r
    with np.errstate(invalid="ignore"):
        s_, t_ = np.nan_to_num(s), np.nan_to_num(t, nan=1.0)
        checks = (
            (~((ids >= 0) & (ids < spec.size)),
             lambda i: f"results[{i}].prompt_id {ids[i]} is out of range: ids must be in 0..{spec.size - 1}"),
            (has_r & (has_s | has_t),
             lambda i: f"results[{i}]: send either rewards or successes + trials, not both"),
            (has_r & (lengths == 0), lambda i: f"results[{i}].rewards is empty: send one reward per rollout"),
            (counts & ~(has_s & has_t), lambda i: f"results[{i}]: send rewards, or both successes and trials"),
            (counts & ((t_ < 1) | (t_ != np.floor(t_))),
             lambda i: f"results[{i}].trials is {int(t[i])}: it must be a whole number >= 1"),
            (counts & (s_ < 0), lambda i: f"results[{i}].successes is {s[i]}: it must be >= 0"),
            (counts & (s_ > t_), lambda i: f"results[{i}]: successes ({s[i]}) > trials ({int(t[i])})"),
            (counts & (s_ != np.floor(s_)) & (spec.reward_mode == "binary"),
             lambda i: f"results[{i}].successes is {s[i]}: a binary-mode dataset counts whole successes "
             "(create the dataset with reward_mode 'fractional' for fractional rewards)"),
        )  # fmt: skip
    bad = [(int(np.argmax(mask)), order) for order, (mask, _) in enumerate(checks) if mask.any()]
    if bad:
        row, order = min(bad)
        raise InvalidRequest(checks[order][1](row))
    values = pr.values
    reward_rows = np.flatnonzero(has_r)
    count_rows = np.flatnonzero(counts)
    offsets = np.zeros(reward_rows.size + 1, dtype=np.int64)
    np.cumsum(lengths[reward_rows], out=offsets[1:])
    if not np.isfinite(values).all():
        bad_value = int(np.flatnonzero(~np.isfinite(values))[0])
        row = int(reward_rows[int(np.searchsorted(offsets, bad_value, side="right")) - 1])
        raise InvalidRequest(
            f"results[{row}].rewards contains {values[bad_value]}: rewards must be finite numbers"
        )
    succ = np.empty(n, dtype=np.float64)
    trials = np.empty(n, dtype=np.float64)
    states = np.empty(n, dtype=np.int8)
    if reward_rows.size:
        rs, rt, rst = outcomes_from_flat(values, offsets, spec.reward_mode, spec.success_threshold)
        succ[reward_rows], trials[reward_rows], states[reward_rows] = rs, rt, rst
    if count_rows.size:
        succ[count_rows], trials[count_rows] = s[count_rows], t[count_rows]
        states[count_rows] = outcomes_from_counts(succ[count_rows], trials[count_rows])
    return pack_results(ids, succ, trials, states), _body_digest(
        spec.name, step, ids, values, offsets, reward_rows, succ, trials, count_rows
    )


def _body_digest(name, step, ids, values, offsets, reward_rows, succ, trials, count_rows) -> str:
    """blake2b of an observe body in a canonical binary form: each part length-prefixed, numbers as
    little-endian int64/float64 (so 1 and 1.0 are the same reward, as they are the same number in JSON)."""
    h = hashlib.blake2b(digest_size=16)

    def part(data: bytes) -> None:
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)

    part(name.encode())
    part(int(step).to_bytes(8, "little"))
    for arr, dtype in (
        (ids, "<i8"),
        (reward_rows, "<i8"),
        (offsets, "<i8"),
        (values, "<f8"),
        (count_rows, "<i8"),
        (succ[count_rows] if len(count_rows) else (), "<f8"),
        (trials[count_rows] if len(count_rows) else (), "<f8"),
    ):
        part(np.ascontiguousarray(arr, dtype=dtype).tobytes())
    return h.hexdigest()


def _observed_rows(spec: DatasetSpec, layout: list) -> int:
    """Rows of the observed set a snapshot's layout declares (a fresh dataset's first capacity when it
    declares none; a version 1 snapshot, converted on load, at most every prompt)."""
    for name, _dtype, shape in layout:
        if name == "obs_ids":
            return int(shape[0])
    if any(name == "hmm_d" for name, _, _ in layout):
        return spec.size
    return min(spec.size, _INITIAL_CAPACITY)


def read_export(
    chunks: Iterable[bytes],
    max_prompts: int | None,
    admit: Callable[[DatasetSpec, list], None] | None = None,
) -> DatasetState:
    """Decodes an export (POST /datasets/{name}/import) and checks it the way an import does; anything
    that is not an intact export of a valid dataset is InvalidRequest (422), naming what is wrong.

    The codec checks the header before it allocates anything (then `admit(spec, layout)` may refuse),
    the declared body size before it inflates, every checksum, and every value against the domain the
    service itself produces; the spec and its strategy defaults are then checked like a create's.
    Errors of `chunks` itself (a body too large, a client gone) and of `admit` pass through unchanged.
    """
    try:
        state = load_snapshot_chunks(chunks, max_prompts, admit)
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"not a valid dataset export: {exc}") from exc
    spec = state.spec
    problem = spec.problems()
    if problem:
        raise InvalidRequest(f"the export's dataset spec is invalid: {problem}")
    for strategy, params in spec.defaults.items():
        if not isinstance(params, dict):
            raise InvalidRequest(
                f"the export's dataset spec is invalid: defaults[{strategy!r}] is not an object of parameters"
            )
        Engine.resolve_params(spec, strategy, params)
    return state


def _pull_pieces(
    source: AsyncIterable[bytes], loop: asyncio.AbstractEventLoop, piece: int
) -> Iterator[bytes]:
    """The bytes of `source` (an async iterable on `loop`), for a worker thread: each next() runs on the
    loop until about `piece` bytes arrived (or the source ended) and hands them over. InvalidRequest when
    the source is empty; its own errors (a body over the limit, a client gone) are raised here."""
    stream = aiter(source)

    async def gather() -> bytes:
        parts, size = [], 0
        while size < piece:
            try:
                part = await anext(stream)
            except StopAsyncIteration:
                break
            parts.append(part)
            size += len(part)
        return b"".join(parts)

    first = True
    while True:
        data = asyncio.run_coroutine_threadsafe(gather(), loop).result()
        if not data:
            if first:
                raise InvalidRequest("the body is empty: send the bytes of a dataset export")
            return
        first = False
        yield data
