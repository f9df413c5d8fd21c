"""The engine: the operations the API exposes, on datasets kept in step with the store.

The Engine is the one object routes, metrics and tests talk to. What it stands on lives beside it:
replica.py keeps this process's state of each dataset caught up with the store's log and snapshots it,
payloads.py checks requests and packs them into log records, backup.py exports and imports datasets.
Every write goes to the store first (atomically with its idempotency record) and is applied by
whichever process reads next (replica.py), so every replica and every restart computes the same bits.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

import numpy as np

from selector_service.contract.schemas import Belief, DatasetCreate, RolloutBudget
from selector_service.core import strategies
from selector_service.core.coldstart import check_metadata
from selector_service.core.coldstart import prior_arrays as cold_betas
from selector_service.dataset.state import DatasetSpec, DatasetState, RecordKind, metadata_head, pack_metadata
from selector_service.errors import (
    Conflict,
    DatasetGone,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    Unavailable,
)
from selector_service.replication import backup
from selector_service.replication.payloads import (
    SelectPlan,
    check_ids,
    outcome_payload,
    plan_select,
    resolve_params,
    with_evidence_step,
)
from selector_service.replication.replica import Replica, SyncStats
from selector_service.settings import Settings
from selector_service.storage.store import CreateStatus, Store, WriteResult, WriteStatus

T = TypeVar("T")
#: What a select answers: prompt ids, their scores (None for a walk), the step, rollouts per prompt.
SelectAnswer = tuple[np.ndarray, np.ndarray | None, int, np.ndarray | None]
INLINE_RESULTS = 4096
# A select's close (Engine._close_and_select) holds the dataset's closing reservation for at most this long
# (observe and metadata writes wait meanwhile), and commits it at most this many times when the log keeps
# moving between its catch-up and its commit.
CLOSE_RESERVATION_MS = 5_000
CLOSE_ATTEMPTS = 5
#: A close renews its reservation (every third of CLOSE_RESERVATION_MS) for at most this long; writes and
#: other selects wait for a reservation as long as it is held. A closer that stops renewing (its process
#: died or froze) lets it lapse within CLOSE_RESERVATION_MS.
CLOSE_RENEW_LIMIT_S = 600.0
# The cursor a state holds between a select's in-memory close and its commit (never seen by anyone else:
# the dataset lock is held, and the state is discarded unless the commit gives it the real log id).
PENDING_CURSOR = "pending"


class Engine:
    """The service's operations on its datasets (what routes, metrics and tests call), over the store
    and this process's replica of the datasets."""

    def __init__(self, store: Store, settings: Settings) -> None:
        self.store = store
        self.settings = settings
        self.replica = Replica(store, settings)

    # ---- plumbing -------------------------------------------------------------------------------
    @property
    def sync_stats(self) -> dict[str, SyncStats]:
        """What the last catch-up of each dataset did (exported as metrics)."""
        return self.replica.sync_stats

    @property
    def catchup_observer(self) -> Callable[[float], None] | None:
        """Called with the seconds of each catch-up (a metrics histogram)."""
        return self.replica.catchup_observer

    @catchup_observer.setter
    def catchup_observer(self, observer: Callable[[float], None] | None) -> None:
        self.replica.catchup_observer = observer

    @property
    def memory_budget(self) -> int:
        """Bytes this process may spend on datasets (SELECTOR_MEMORY_BUDGET_BYTES, or automatic)."""
        return self.replica.memory.budget

    def memory_held(self, replacing: str | None = None) -> int:
        """Bytes charged now against the memory budget (memory.MemoryLedger.charged)."""
        return self.replica.memory.charged(replacing)

    async def ready(self) -> bool:
        try:
            return await asyncio.wait_for(self.store.ping(), self.settings.store_timeout_s)
        except (Unavailable, OSError, TimeoutError):
            return False

    async def close(self) -> None:
        await self.replica.close()

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
        # A fresh dataset is admitted like a loaded one (layout []: its first capacity); the reservation
        # is held until the state is installed.
        async with self.replica.lock(spec.name):
            with self.replica.memory.admitting(spec.name, "create") as admit:
                held = self.replica.states.get(spec.name)
                fresh = None
                if held is None or held.spec.fingerprint() != spec.fingerprint():
                    admit(spec, [])
                    try:
                        # Materialized now, so that the first select does not pay for allocating the arrays.
                        fresh = await asyncio.to_thread(DatasetState, spec)
                    except MemoryError:
                        raise self.replica.memory.out_of_memory(spec.name, "create") from None
                status, doc = await self.store.create_dataset(spec.name, spec.public(), spec.fingerprint())
                stored = DatasetSpec.from_doc(doc)
                if status is CreateStatus.CONFLICT:
                    raise Conflict(
                        f"dataset {spec.name!r} already exists with a different spec "
                        f"({json.dumps(stored.public(), sort_keys=True)}); "
                        "use another name, or DELETE it first"
                    )
                if status is CreateStatus.CREATED and fresh is not None:
                    fresh.spec = stored
                    self.replica.states[spec.name] = fresh
        return status is CreateStatus.CREATED, stored

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
        return await self.store.list_datasets()

    async def record_counts(self, names: list[str]) -> dict[str, int]:
        """How many log records each dataset has had appended (its activity, as /metrics ranks it)."""
        return await self.store.read_seqs(names)

    async def delete_dataset(self, name: str) -> None:
        async with self.replica.lock(name):
            existed = await self.store.delete_dataset(name)
            self.replica.forget(name)
        if not existed:
            raise NotFound(f"dataset {name!r} does not exist")

    async def spec(self, name: str) -> DatasetSpec:
        """The dataset's spec, from memory when this process has it.

        An incarnation's spec never changes, but a name can get a new incarnation (deleted and created
        again, or imported with replace) through another process: requests that check against this
        spec go through `_with_spec`, which re-reads the stored one when the check or the store refuses.
        """
        state = self.replica.states.get(name)
        if state is not None:
            return state.spec
        stored = await self._stored_spec(name)
        if stored is None:
            raise NotFound(f"dataset {name!r} does not exist; create it with POST /datasets")
        return stored

    async def _stored_spec(self, name: str) -> DatasetSpec | None:
        doc = await self.store.get_spec(name)
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
        except (InvalidRequest, DatasetGone) as exc:
            stored = await self._stored_spec(name)
            if stored is None or stored.uid == spec.uid:
                if isinstance(exc, DatasetGone):
                    self.replica.states.pop(name, None)
                    raise NotFound(f"dataset {name!r} does not exist (it may have been deleted)") from None
                raise
            self.replica.states.pop(name, None)
        try:
            return await attempt(stored)
        except DatasetGone:
            self.replica.states.pop(name, None)
            raise NotFound(f"dataset {name!r} was deleted or recreated while this request ran") from None

    # ---- replica upkeep (replica.py) --------------------------------------------------------------
    async def sync(self, name: str) -> DatasetState:
        """Brings this process's state of `name` up to the store's log (Replica.sync). Caller holds the
        dataset lock."""
        return await self.replica.sync(name)

    async def flush_snapshots(self) -> None:
        """Waits for snapshots in flight (tests and shutdown)."""
        await self.replica.flush_snapshots()

    async def snapshot_now(self, name: str) -> None:
        await self.replica.snapshot_now(name)

    # ---- backup and restore (backup.py) -----------------------------------------------------------
    async def export_dataset(self, name: str) -> bytes:
        """The dataset's spec and beliefs as one compressed, checksummed blob (a snapshot)."""
        return await backup.export_dataset(self.replica, name)

    async def import_dataset(
        self, name: str, body: bytes | AsyncIterable[bytes], replace: bool = False
    ) -> DatasetSpec:
        """Creates dataset `name` from an export: same spec and beliefs, a fresh log and uid
        (backup.import_dataset)."""
        return await backup.import_dataset(self.replica, name, body, replace)

    # ---- operations -----------------------------------------------------------------------------
    async def history(self, name: str, since: int, limit: int) -> dict[str, Any]:
        """Rows of the closed steps >= `since` (at most `limit`), the step to ask from next (`next`), the
        open step and the dataset's profiling and total rollouts now (history.py)."""

        def read(st: DatasetState) -> dict[str, Any]:
            rows, after = st.history.rows(since, limit)
            return {
                "rows": rows,
                "next": after,
                "open_step": st.open_step,
                "profile_rollouts": st.profile_rollouts(),
                "total_rollouts": st.total_rollouts(),
            }

        return await self.read(name, read)

    async def read(self, name: str, fn: Callable[[DatasetState], T]) -> T:
        """Catches up, then runs `fn(state)` in a worker thread while holding the dataset lock."""
        return await self.replica.read(name, fn)

    async def select(
        self,
        name: str,
        *,
        step: int,
        batch_size: int,
        strategy: str,
        params: dict[str, Any],
        seed: int,
        rollouts: RolloutBudget | None = None,
        filter: dict[str, Any] | None = None,
    ) -> SelectAnswer:
        """(prompt ids, scores or None, the step, rollouts per prompt or None). `rollouts`: a rollout
        budget, whose counts come from the state the batch was chosen from (docs/methods.md §8); `filter`:
        the settings of a select's filter (docs/methods.md §9).

        The request is planned against the spec (payloads.plan_select) before anything moves; a retry
        on a recreated dataset (`_with_spec`) plans it again against the new spec, so every check that
        the spec decides holds for the incarnation the plan runs on (`_close_and_select` refuses any
        other)."""

        async def attempt(spec: DatasetSpec) -> SelectAnswer:
            plan = plan_select(
                spec,
                step=step,
                batch_size=batch_size,
                strategy=strategy,
                params=params,
                seed=seed,
                rollouts=rollouts,
                filter=filter,
            )
            await self._refuse_out_of_reach(plan)
            async with self.replica.lock(name):  # the in-memory close is seen by no one until committed
                return await self._close_and_select(plan)

        return await self._with_spec(name, attempt)

    async def _close_and_select(self, plan: SelectPlan) -> SelectAnswer:
        """A select's step close and its answer, atomic with each other: a select that fails (any
        exception, a 4xx or a 5xx) leaves the dataset as it was, in the store and in every process.
        Caller holds the dataset lock.

        The order is: catch up with the log, apply the select's own record (the close of every step
        below the plan's step, or a note at the open step) to the state IN MEMORY, choose the batch
        (`_run_plan`), and only then commit that record to the store with a conditional script
        (`Store.commit_close`: only if the log still ends at the record this state applied, with the
        same uid and open step). So the store never holds the close of a select that did not answer,
        and the answer is computed from exactly the state every replica reaches by applying the
        committed log. On any failure after the
        in-memory close, or when the log moved meanwhile, this process's state is discarded: the next
        catch-up rebuilds it from the store (snapshot + log), so memory never runs ahead of the log; a
        moved log is retried (CLOSE_ATTEMPTS). While the close is in flight the dataset's closing
        reservation (SET NX PX, owned by a token, CLOSE_RESERVATION_MS) makes observe and metadata
        writes wait (`_until_not_busy`), so a stream of observes cannot starve a select; the close
        renews it while it works (`_renew_close`), so this holds for a close of any length.

        The simpler order (advance in the store first, then select) answered 5xx with the step already
        closed; a copy of the state before each close would cost the dataset's memory and a copy's time
        on every select, where this costs one more round trip (the reservation) and, on failure only, a
        rebuild.
        """
        name, step, note = plan.name, plan.step, plan.note
        token = uuid.uuid4().hex
        reserved = await self._reserve_close(name, token)
        renewing = asyncio.ensure_future(self._renew_close(name, token))
        try:
            for _ in range(CLOSE_ATTEMPTS):
                state = await self.sync(name)
                if state.spec.uid != plan.uid:
                    raise DatasetGone(name)  # another incarnation: _with_spec plans it again
                if step < state.open_step:
                    raise Conflict(
                        f"step {step} of dataset {name!r} is closed; the open step is {state.open_step}"
                    )
                if step - state.open_step > self.settings.max_step_gap:
                    raise self._too_far_ahead(name, step, state.open_step)
                problem = strategies.STRATEGIES[plan.strategy].unmet(state.arrays, plan.batch_size, name)
                if problem is not None:  # on the caught-up state, before anything moves
                    raise InvalidRequest(problem)
                if step == state.open_step and state.history.counted(note):
                    # The same request (strategy, parameters, seed, batch size) was already counted at
                    # the open step (a retry, or every rank asking for the step): nothing to close and
                    # nothing new for the history, so no record; the answer is the same either way.
                    return await asyncio.to_thread(_run_plan, state, plan)
                seq, open_step = state.seq, state.open_step
                try:
                    answer = await asyncio.to_thread(_close_in_memory_and_run, state, plan)
                    res = await self.store.commit_close(name, plan.uid, step, note, seq, open_step, token)
                except BaseException:
                    self.replica.discard(name, state)
                    raise
                if res.status is WriteStatus.OK:
                    state.cursor = res.log_id
                    reserved = False  # the commit released it
                    return answer
                self.replica.discard(name, state)
                if res.status is WriteStatus.BEHIND:
                    raise Conflict(
                        f"step {step} of dataset {name!r} is closed; the open step is {res.open_step}"
                    )
                if res.status is WriteStatus.AHEAD:
                    raise self._too_far_ahead(name, step, res.open_step)
                if not reserved:  # "moved": the log grew between the catch-up and the commit
                    reserved = await self._reserve_close(name, token)
            raise Unavailable(
                f"dataset {name!r} kept receiving writes while this select closed its step "
                f"({CLOSE_ATTEMPTS} attempts); nothing was applied, retry"
            )
        finally:
            renewing.cancel()
            await asyncio.wait([renewing])  # gone before the release: it renews nothing after it
            if reserved:
                with contextlib.suppress(Unavailable, OSError):
                    await self.store.release_close(name, token)

    async def _refuse_out_of_reach(self, plan: SelectPlan) -> None:
        """Refuses a select step that the close would refuse (closed: 409; further ahead than
        max_step_gap: 422) from the store's open step alone, before the dataset lock, the closing
        reservation or a load: a replica that does not hold the dataset would otherwise load all of it
        to refuse a step of 10**12. The open step only grows, so a held state's open step is a lower
        bound: a step within the gap of it needs no round trip; anything else reads the meta hash (one
        HGETALL). What this lets through is checked again against the caught-up state."""
        name, step = plan.name, plan.step
        held = self.replica.states.get(name)
        reach = self.settings.max_step_gap
        if held is not None and held.spec.uid == plan.uid and 0 <= step - held.open_step <= reach:
            return
        meta = await self.store.read_meta(name)
        if meta.get("uid") != plan.uid:  # gone or another incarnation: the usual path says which
            return
        open_step = int(meta.get("open_step", "0"))
        if step < open_step:
            raise Conflict(f"step {step} of dataset {name!r} is closed; the open step is {open_step}")
        if step - open_step > self.settings.max_step_gap:
            raise self._too_far_ahead(name, step, open_step)

    async def _renew_close(self, name: str, token: str) -> None:
        """Keeps the closing reservation of `token` alive while its close works (cancelled when the close
        ends), so that a close longer than the reservation's TTL is not overtaken by the writes that it
        holds back, and then retried until it gives up. A renewal while `token` does not hold it (before
        the reservation was had again after a moved log, or after the commit released it) does nothing."""
        deadline = time.monotonic() + CLOSE_RENEW_LIMIT_S
        while time.monotonic() < deadline:
            await asyncio.sleep(CLOSE_RESERVATION_MS / 3000)
            with contextlib.suppress(Unavailable, OSError):
                await self.store.renew_close(name, token, CLOSE_RESERVATION_MS)

    async def _reserve_close(self, name: str, token: str) -> bool:
        """Takes the closing reservation for `token`, waiting while another select holds it (as long as
        its holder renews it, CLOSE_RENEW_LIMIT_S at most: a holder that died lets it expire). False
        when it could not be had: the close then goes ahead without it (its commit is conditional
        anyway), as when the store does not answer the reservation itself (then the catch-up that
        follows reports the store's state)."""
        async for _ in _backing_off(CLOSE_RENEW_LIMIT_S + CLOSE_RESERVATION_MS / 1000):
            try:
                if await self.store.reserve_close(name, token, CLOSE_RESERVATION_MS):
                    return True
            except (Unavailable, OSError):
                return False
        return False

    async def _until_not_busy(self, write: Callable[[], Awaitable[WriteResult]]) -> WriteResult:
        """Runs a write script, sending it again while the store answers busy (a select's close holds the
        dataset's closing reservation; nothing was applied): as long as the close renews it, so that no
        close, however long, is overtaken by the writes it holds back. Busy (the caller's 503) only past
        CLOSE_RENEW_LIMIT_S and a TTL."""
        async for _ in _backing_off(CLOSE_RENEW_LIMIT_S + CLOSE_RESERVATION_MS / 1000):
            res = await write()
            if res.status is not WriteStatus.BUSY:
                break
        return res

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

    resolve_params = staticmethod(resolve_params)

    async def upload_metadata(
        self,
        name: str,
        *,
        offset: int,
        pass_rate: np.ndarray | None,
        group: np.ndarray | None,
        pass_samples: np.ndarray | None = None,
        profile: bool = False,
    ) -> dict[str, Any]:
        """Checks a metadata upload (docs/methods.md §6) against the dataset, appends it to the log as one
        record, and answers with the prompts it covers and the dataset's coverage once it is applied."""
        start, count = await self.append_metadata(
            name, offset=offset, pass_rate=pass_rate, group=group, pass_samples=pass_samples, profile=profile
        )
        return await self.metadata_answer(name, start, count)

    async def append_metadata(
        self,
        name: str,
        *,
        offset: int,
        pass_rate: np.ndarray | None = None,
        group: np.ndarray | None = None,
        pass_samples: np.ndarray | None = None,
        profile: bool = False,
        record: bytearray | None = None,
    ) -> tuple[int, int]:
        """Checks a metadata upload against the dataset and appends it to the log as one record; returns
        (offset, count). InvalidRequest naming the array and index of a bad value, nothing applied.

        `record`: a raw upload of one array read into a buffer laid out as its record (room for the head
        of state.metadata_head, then the array's bytes, of which the array given is a view): the head is
        written into it and the buffer itself is appended, so the upload is never copied."""

        async def attempt(spec: DatasetSpec) -> tuple[int, int]:
            try:
                meta = check_metadata(spec.size, offset, pass_rate, group, pass_samples, profile)
            except ValueError as exc:
                raise InvalidRequest(f"{exc}; nothing was applied") from None
            payload: bytes | memoryview
            if record is not None:
                field = next(
                    name
                    for name, arr in (
                        ("pass_rate", pass_rate),
                        ("group", group),
                        ("pass_samples", pass_samples),
                    )
                    if arr is not None
                )
                head = metadata_head(meta.offset, meta.length, field, meta.profile)
                record[: len(head)] = head
                payload = memoryview(record)
            elif meta.length > INLINE_RESULTS:
                payload = await asyncio.to_thread(pack_metadata, meta)
            else:
                payload = pack_metadata(meta)
            res = await self._until_not_busy(lambda: self.store.append_metadata(name, spec.uid, payload))
            if res.status is WriteStatus.BUSY:
                raise self._busy(name)
            return meta.offset, meta.length

        return await self._with_spec(name, attempt)

    async def metadata_answer(self, name: str, offset: int, count: int) -> dict[str, Any]:
        """The answer of a metadata upload: its prompts, and the dataset's coverage and profiling rollouts
        once the log is applied up to it."""
        coverage, profiled = await self.read(name, lambda st: (st.coverage(), st.profile_rollouts()))
        return {
            "dataset": name,
            "offset": offset,
            "count": count,
            "coverage": coverage,
            "profile_rollouts": profiled,
        }

    async def observe(
        self,
        name: str,
        *,
        step: int,
        request_id: str,
        results: Sequence[Any],
        selected_step: int | None = None,
        call: str | None = None,
    ) -> tuple[int, bool, int]:
        """Validates a whole request, then appends it to the log atomically with its request id.

        Returns (results applied, duplicate, lag). A request id names one body: its retry is a duplicate
        (nothing applied, the first call's lag), the same id with another body, for another dataset or
        for an earlier incarnation of this one is a Conflict. `call` (the client's Selector-Call id, the
        same on every attempt of one call) is the call token the request id is stored with, so a retry
        of a call whose first attempt was applied is answered with what it applied, not as a duplicate. With `selected_step` (the step the results'
        prompts were selected at, <= step) a step closed more than max_lag steps ago is filed at the open
        step instead of refused, and the lag counts from `selected_step` (the store's _OBSERVE).
        """
        if len(results) > self.settings.max_ids_per_request:
            raise PayloadTooLarge(
                f"{len(results)} results in one request; the limit is {self.settings.max_ids_per_request}"
            )
        if selected_step is not None and selected_step > step:
            raise InvalidRequest(
                f"selected_step {selected_step} is after step {step}: send the step the prompts were selected "
                "at as selected_step, and a step at or after it as step. Nothing was applied"
            )

        async def attempt(spec: DatasetSpec) -> tuple[DatasetSpec, WriteResult]:
            if len(results) <= INLINE_RESULTS:
                payload, digest = outcome_payload(spec, step, results)  # ~0.1 ms for 256 results
            else:
                payload, digest = await asyncio.to_thread(outcome_payload, spec, step, results)
            digest = with_evidence_step(digest, selected_step)
            owner, owner_uid, claimed = await self.store.claim_request(name, spec.uid, request_id)
            if owner != name:
                raise Conflict(
                    f"request_id {request_id!r} was already used for dataset {owner!r}; nothing was applied. "
                    "A request id names one request: use a new one for a new request"
                )
            if owner_uid and owner_uid != spec.uid:
                stored = await self._stored_spec(name)
                if stored is None or stored.uid != spec.uid:
                    raise DatasetGone(name)  # this process's spec is outdated: _with_spec looks again
                # The id was used for an earlier incarnation (deleted and created again, or replaced by an
                # import): its results went to data that no longer exists; never credit them to this one.
                raise Conflict(
                    f"request_id {request_id!r} was used for an earlier incarnation of dataset {name!r} "
                    "(deleted and created again, or replaced by an import); nothing was applied. Use a new "
                    "request id for results of the dataset as it is now"
                )
            try:
                res = await self._until_not_busy(
                    lambda: self.store.append_observe(
                        name, spec.uid, step, request_id, payload, digest, spec.max_lag, selected_step, call
                    )
                )
            except DatasetGone:
                if claimed:  # refused: nothing applied
                    await self.store.release_request(name, spec.uid, request_id)
                raise
            if claimed and res.status.refused:
                await self.store.release_request(name, spec.uid, request_id)
            if res.status is WriteStatus.BUSY:
                raise self._busy(name)
            return spec, res

        spec, res = await self._with_spec(name, attempt)
        if res.status is WriteStatus.DUP:
            return 0, True, res.lag
        if res.status is WriteStatus.CONFLICT:
            raise Conflict(
                f"request_id {request_id!r} was already applied with a different body (other results or "
                "step); nothing was applied. Retry with the identical body, or use a new request id"
            )
        if res.status is WriteStatus.AHEAD:
            raise self._too_far_ahead(name, step, res.open_step)
        if res.status is WriteStatus.CLOSED:
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
            self.replica.catch_up_later(name)
        return len(results), False, res.lag


async def _backing_off(seconds: float) -> AsyncIterator[None]:
    """Yields at once, then again after pauses doubling from 1 ms to 20 ms (100 ms once a reservation's
    TTL has passed: a long close, whose waiters should not flood the store), until `seconds` have
    passed: the pace of a request that waits for a select's close (its reservation, or a write answered
    busy)."""
    start = time.monotonic()
    pause = 0.001
    while True:
        yield
        now = time.monotonic()
        if now >= start + seconds:
            return
        await asyncio.sleep(pause)
        pause = min(pause * 2, 0.02 if now - start < CLOSE_RESERVATION_MS / 1000 else 0.1)


def _close_in_memory_and_run(state: DatasetState, plan: SelectPlan) -> SelectAnswer:
    """Applies a select's record (what `Store.commit_close` appends: number seq + 1, an advance to the
    plan's step carrying its note) to the state, then runs the plan. Called with the dataset lock held;
    the caller discards the state if anything fails or the commit does not happen."""
    state.apply_record(
        PENDING_CURSOR,
        {"n": str(state.seq + 1), "k": RecordKind.ADVANCE, "s": str(plan.step), "q": plan.note},
    )
    return _run_plan(state, plan)


def _run_plan(state: DatasetState, plan: SelectPlan) -> SelectAnswer:
    """The answer of a select planned for this state's incarnation, at its open step."""
    try:
        ids, scores = state.select(plan.strategy, plan.params, plan.batch_size, plan.seed, plan.filter)
    except strategies.ParamError as exc:  # a walk that cannot fill the batch (WalkError) says why
        raise InvalidRequest(str(exc)) from None
    counts = None if plan.rollouts is None else state.rollout_counts(ids, plan.rollouts, plan.seed)
    return ids, scores, state.open_step, counts
