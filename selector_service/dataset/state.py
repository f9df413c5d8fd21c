"""One dataset's materialized beliefs: applying log records, closing steps. No I/O here.

A `DatasetState` is a pure function of the ordered log it has applied (and the snapshot it started
from): the same records in the same order give the same bits in every process. That is what lets
several service replicas, and a restarted one, agree without talking to each other.

Step semantics (docs/methods.md §3): a record for step s > open step c first closes c, c+1, ..., s-1
(a DPS update over every prompt each); Beta updates are applied when an observe record is applied. An
observe record for a step s < c (a late observation, accepted by the store when c - s <= max_lag,
docs/methods.md §3.1) changes no step: its Beta update applies at once and its states pool into the open step c,
as if observed at c.

`seq` counts the records applied: records are numbered 1, 2, 3, ... in the log (store.py), and
`apply_record` refuses any record whose number is not `seq + 1`, so a state is always the result of a
contiguous prefix of the log, whichever replica built it.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

import numpy as np

from selector_service.contract import dataset_settings
from selector_service.core import strategies
from selector_service.core.beliefs import BeliefArrays, apply_results
from selector_service.core.coldstart import Metadata, apply_metadata, prior_arrays
from selector_service.core.dps import CloseStats
from selector_service.core.rng import stream
from selector_service.core.rollouts import RolloutRequest
from selector_service.core.select import TiedScores, retie, tie_index
from selector_service.core.shared import DatasetRules
from selector_service.core.step_close import close_open_step
from selector_service.dataset.history import LAG_LABELS, StepHistory


class RecordKind(StrEnum):
    """The kinds of log record (the stream field ``k``; store.py's scripts append them): results of an
    observe, an advance of the open step (a select's, with its note), prompt metadata."""

    OBSERVE = "o"
    ADVANCE = "a"
    METADATA = "m"


#: The figures of a closed step that held no evidence (the steps of a gap after its first).
EMPTY_CLOSE = CloseStats(0, 0, 0, 0, 0, 0)

_RESULT_DTYPES = (("ids", "<i8"), ("successes", "<f8"), ("trials", "<f8"), ("states", "<i1"))
# Snapshot arrays of the dataset's shared state (per group, not per prompt) carry this name prefix.
SHARED_PREFIX = "shared."
# Late observations are counted by lag up to LAG_LABELS (history.py); larger lags share f"{LAG_LABELS}+".


class LogGap(Exception):
    """A log record's sequence number is not the next one: records were trimmed before this state applied
    them (reload from the snapshot that covers them), or the log is not the one this state came from."""


@dataclass(frozen=True)
class DatasetSpec(dataset_settings.DatasetSettings):
    """What a client fixed at creation: every setting, as the declaration's fields (DatasetSettings, in its
    order, with its types and defaults), then the incarnation's `uid`. The numbers the beliefs evolve by
    reach them as `rules()`, which the beliefs hold."""

    uid: str = ""

    def public(self) -> dict[str, Any]:
        doc = asdict(self)
        doc.pop("uid")
        doc["beta_prior"] = list(self.beta_prior)
        return doc

    def problems(self) -> str | None:
        """What is out of range in this spec (the same rules as POST /datasets), or None."""
        return dataset_settings.problems(self.public())

    def fingerprint(self) -> str:
        """The user-visible spec, every setting, as canonical JSON."""
        return json.dumps(self.public(), sort_keys=True)

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> DatasetSpec:
        """The spec of a stored document (the store's spec key, a snapshot header's spec), which holds
        every setting: ValueError naming those it lacks (never a default in their place)."""
        missing = [s.name for s in dataset_settings.SETTINGS if s.name not in doc]
        if missing:
            raise ValueError(f"the spec document lacks the settings {', '.join(missing)}")
        return cls(**dataset_settings.from_doc(doc), uid=doc.get("uid", ""))

    @classmethod
    def from_request(cls, request: Any) -> DatasetSpec:
        """The spec a create body (schemas.DatasetCreate) asks for (no uid yet: the store gives it)."""
        return cls(**dataset_settings.from_request(request))

    def rules(self) -> DatasetRules:
        """The constants the dataset's beliefs and shared state evolve by: its Beta prior, its decays, its
        cold start's (docs/methods.md §6) and the dataset-level parameters of §7, each under its
        setting's name."""
        return DatasetRules(
            alpha0=self.beta_prior[0],
            beta0=self.beta_prior[1],
            **{name: getattr(self, name) for name in dataset_settings.RULES},
            **strategies.dataset_rules(self.defaults),
        )


def pack_results(ids: np.ndarray, successes: np.ndarray, trials: np.ndarray, states: np.ndarray) -> bytes:
    """Packs one observe request's outcomes into a log payload: u32 count, then the four arrays."""
    n = len(ids)
    parts = [struct.pack("<I", n)]
    for (_, dtype), arr in zip(_RESULT_DTYPES, (ids, successes, trials, states), strict=True):
        parts.append(np.ascontiguousarray(arr, dtype=dtype).tobytes())
    return b"".join(parts)


#: A metadata record's head: offset, which arrays follow (flags), whether groups follow, count. The flags
#: byte was a plain "pass rates follow" 0/1 before sample counts existed, so every earlier record reads
#: the same: bit 0 pass rates, bit 1 sample counts, bit 2 the counts are profiling rollouts.
_METADATA_HEAD = struct.Struct("<QBBI")
#: Bytes of that head: a raw upload is read in after this much room (metadata_head).
METADATA_HEAD_BYTES = _METADATA_HEAD.size
_HAS_RATE, _HAS_SAMPLES, _PROFILE = 1, 2, 4


def pack_metadata(meta: Metadata) -> bytes:
    """Packs a checked metadata upload (coldstart.check_metadata) into a log payload: the head, then the
    pass rates (float32 LE), the groups (int32 LE) and the sample counts (int32 LE), each when given."""
    flags = (
        (_HAS_RATE if meta.pass_rate is not None else 0)
        | (_HAS_SAMPLES if meta.pass_samples is not None else 0)
        | (_PROFILE if meta.profile else 0)
    )
    parts = [_METADATA_HEAD.pack(meta.offset, flags, meta.group is not None, meta.length)]
    for arr, dtype in ((meta.pass_rate, "<f4"), (meta.group, "<i4"), (meta.pass_samples, "<i4")):
        if arr is not None:
            parts.append(np.ascontiguousarray(arr, dtype=dtype).tobytes())
    return b"".join(parts)


def metadata_head(offset: int, count: int, field: str, profile: bool) -> bytes:
    """The head of the payload of a one-array upload (`field` = pass_rate, group or pass_samples) of
    `count` prompts: followed by the array's `4 count` little-endian bytes, it is what `pack_metadata`
    makes of that upload, so a raw body can be read straight into the record it becomes."""
    flags = {"pass_rate": _HAS_RATE, "group": 0, "pass_samples": _HAS_SAMPLES}[field]
    flags |= _PROFILE if profile else 0
    return _METADATA_HEAD.pack(offset, flags, field == "group", count)


def unpack_metadata(payload: bytes | bytearray | memoryview) -> Metadata:
    offset, flags, has_group, count = _METADATA_HEAD.unpack_from(payload, 0)
    if flags & ~(_HAS_RATE | _HAS_SAMPLES | _PROFILE) or has_group not in (0, 1):
        raise ValueError(f"metadata payload head has unknown flags {flags:#x}, {has_group:#x}")
    at = _METADATA_HEAD.size
    arrays: list[np.ndarray | None] = []
    for given, dtype, native in (
        (flags & _HAS_RATE, "<f4", np.float32),
        (has_group, "<i4", np.int32),
        (flags & _HAS_SAMPLES, "<i4", np.int32),
    ):
        if given:
            arrays.append(
                np.frombuffer(payload, dtype=dtype, count=count, offset=at).astype(native, copy=False)
            )
            at += 4 * count
        else:
            arrays.append(None)
    if at != len(payload):
        raise ValueError(f"metadata payload has {len(payload)} bytes, expected {at}")
    rate, group, samples = arrays
    return Metadata(offset, rate, group, samples, bool(flags & _PROFILE))


def unpack_results(payload: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    (n,) = struct.unpack_from("<I", payload, 0)
    offset, out = 4, []
    for _, dtype in _RESULT_DTYPES:
        dt = np.dtype(dtype)
        out.append(np.frombuffer(payload, dtype=dt, count=n, offset=offset).astype(dt.newbyteorder("=")))
        offset += n * dt.itemsize
    if offset != len(payload):
        raise ValueError(f"log payload has {len(payload)} bytes, expected {offset}")
    return out[0], out[1], out[2], out[3]


class _ScoreCache:
    """Whole-dataset scores of one cacheable strategy (StrategySpec.cacheable: INSIGHT, expected
    difficulty, inverse evidence) with candidate_ratio null: one float64[N] buffer per dataset and
    strategy, kept across requests and rescored only where beliefs changed (in place, or wholly in place
    once a quarter of the prompts changed), so a full pass allocates nothing per request.

    `tied` indexes where the scores differ from their common value (every never-observed prompt without
    a cold prior has the same score), so that a select reads only those (select.topk_tied); None when no
    value is common enough to be worth it."""

    #: Drop the index once more than this share of the prompts differ from the common value: past it the
    #: index (8 bytes per odd prompt) outgrows half the buffer it spares reading. Up to it the index is
    #: the faster one (N = 10^6, 40% differing: a /select 6.0 ms with it, 11.8 ms without).
    MAX_ODD_SHARE = 0.5

    def __init__(self, scores: np.ndarray, cold_version: int = 0) -> None:
        self.scores = scores
        self.cold_version = cold_version
        self.pending: list[np.ndarray] = []
        self.pending_count = 0
        self.tied: TiedScores | None = None
        self.reindex()

    def reindex(self) -> None:
        """Builds the index from the whole buffer (O(N): after scoring every prompt)."""
        self.tied = tie_index(self.scores, int(self.MAX_ODD_SHARE * self.scores.size))

    def changed(self, ids: np.ndarray) -> None:
        """The buffer was rescored at `ids` (ascending, distinct)."""
        if self.tied is not None:
            tied = retie(self.tied, ids)
            self.tied = tied if tied.odd.size <= self.MAX_ODD_SHARE * self.scores.size else None

    def view(self) -> np.ndarray | TiedScores:
        """What select ranks: the index when there is one, else the buffer."""
        return self.tied if self.tied is not None else self.scores


class DatasetState:
    """In-memory beliefs of one dataset plus the position in the log they reflect."""

    MAX_CACHES = 2

    def __init__(self, spec: DatasetSpec, arrays: BeliefArrays | None = None) -> None:
        self.spec = spec
        if arrays is None:
            arrays = BeliefArrays.new(spec.size, **asdict(spec.rules()))  # alpha0, beta0 and the rest
        self.arrays = arrays
        self.open_step = 0
        self.cursor = ""  # id of the last log record applied ("" = none)
        self.seq = 0  # sequence number of the last log record applied (0 = none)
        self.results = 0
        self.results_by_lag: dict[int, int] = {}  # observe results applied, by lag (docs/methods.md §3.1)
        self.rollouts = 0.0
        self.steps_closed = 0
        self.closes_since_snapshot = 0
        self.last_close: CloseStats | None = None
        self.history = StepHistory()  # one row per closed step (history.py)
        self._caches: dict[tuple[str, tuple[tuple[str, Any], ...]], _ScoreCache] = {}
        self._spare_buffer: np.ndarray | None = None

    # ---- applying the log -----------------------------------------------------------------------
    def apply_record(self, log_id: str, fields: Mapping[str, bytes | str] | Mapping[bytes, bytes]) -> None:
        """Applies one log entry (already known to be newer than `cursor`).

        Raises LogGap, changing nothing, when the record's sequence number is not `seq + 1`, and
        ValueError, changing nothing, when it has none (every record of the key layout store.LAYOUT
        carries one).
        """
        get = {(k.decode() if isinstance(k, bytes) else k): v for k, v in fields.items()}
        if "n" not in get:
            raise ValueError(
                f"log record {log_id} has no sequence number: not a record this service's key layout holds"
            )
        number = int(get["n"])
        if number != self.seq + 1:
            raise LogGap(f"record {log_id} is number {number}; this state applied up to {self.seq}")
        kind = get["k"].decode() if isinstance(get["k"], bytes) else get["k"]
        if kind not in tuple(RecordKind):
            raise ValueError(f"unknown log record kind {kind!r} at {log_id}")
        step = int(get["s"])
        outcomes = metadata = None
        if kind in (RecordKind.OBSERVE, RecordKind.METADATA):
            payload = get["p"]
            assert isinstance(payload, bytes), "a payload is packed bytes (pack_results, pack_metadata)"
            outcomes = unpack_results(payload) if kind == RecordKind.OBSERVE else None
            metadata = unpack_metadata(payload) if kind == RecordKind.METADATA else None
        # A select's note (its strategy, batch size and request digest) on the record of its step: every
        # advance carries one (store.py's _CLOSE).
        note = StepHistory.parse_note(get.get("q", b"")) if kind == RecordKind.ADVANCE else None
        self.close_until(step)
        if note is not None:
            self.history.select(*note)
        if metadata is not None:
            # Checked again (the engine checked before appending): a log record is applied whole or
            # raises before changing anything.
            apply_metadata(self.arrays, *metadata)  # offset, pass_rate, group, pass_samples, profile
        if outcomes is not None:
            ids, succ, trials, states = outcomes
            # A record filed at the open step for results selected earlier names that step ('e', the
            # store's _OBSERVE): its lag counts from there.
            evidence = int(get["e"]) if get.get("e") else step
            lag = min(self.open_step - evidence, LAG_LABELS)
            self.apply_outcomes(ids, succ, trials, states, lag)
            self.results_by_lag[lag] = self.results_by_lag.get(lag, 0) + len(ids)
        self.cursor = log_id
        self.seq = number

    def apply_outcomes(
        self, ids: np.ndarray, succ: np.ndarray, trials: np.ndarray, states: np.ndarray, lag: int = 0
    ) -> None:
        self.history.observe(self.arrays, ids, succ, trials, lag)  # before the beliefs move
        apply_results(self.arrays, ids, succ, trials, states)  # by the spec's rules, which the beliefs hold
        self.results += len(ids)
        self.rollouts += float(trials.sum())
        for cache in self._caches.values():
            cache.pending.append(ids)
            cache.pending_count += len(ids)

    def close_until(self, step: int) -> None:
        """Closes every open step below `step` (the walks' positions, the shared state of docs/methods.md §6
        and 7, then a DPS update over the observed set; core.close_open_step), a gap of several steps in
        one pass (the steps after the open one hold no evidence); each closed step gets its history row."""
        gap = step - self.open_step
        if gap < 1:
            return
        counts = self.arrays.shared.step_counts.copy()  # the close resets them
        self.last_close = close_open_step(self.arrays, key=self.spec.name, steps=gap)
        totals = (self.profile_rollouts(), self.rollouts + self.profile_rollouts())
        self.history.close(self.open_step, counts, self.last_close, self.arrays.observed, *totals)
        for empty in range(self.open_step + 1, step):
            self.history.close(empty, np.zeros_like(counts), EMPTY_CLOSE, self.arrays.observed, *totals)
        self.open_step = step
        self.steps_closed += gap
        self.closes_since_snapshot += gap

    # ---- selection ------------------------------------------------------------------------------
    def _full_scores(self, strategy: str, params: dict[str, Any]) -> np.ndarray | TiedScores | None:
        spec = strategies.STRATEGIES.get(strategy)  # an unknown one: strategies.select says so
        if spec is None or not spec.cacheable or spec.ratio(params) is not None:
            return None
        key = (strategy, tuple(sorted(params.items())))
        cache = self._caches.pop(key, None)
        n = self.spec.size
        # Cold priors that moved since the cache was filled change every never-observed prompt's score:
        # the cache starts over (in its own buffer).
        cold = self.arrays.shared.cold_version
        if cache is not None and cache.cold_version != cold:
            self._spare_buffer, cache = cache.scores, None
        if cache is None:
            spare = self._spare_buffer
            buffer = spare if spare is not None else np.empty(n, dtype=np.float64)
            self._spare_buffer = None
            cache = _ScoreCache(self.score(strategy, params, None, seed=0, out=buffer), cold)
        elif cache.pending_count > n // 4:  # rescore the whole set in place, no new allocation
            self.score(strategy, params, None, seed=0, out=cache.scores)
            cache.pending, cache.pending_count = [], 0
            cache.reindex()
        elif cache.pending:
            ids = np.unique(np.concatenate(cache.pending))
            cache.scores[ids] = self.score(strategy, params, ids, seed=0)
            cache.pending, cache.pending_count = [], 0
            cache.changed(ids)
        self._caches[key] = cache
        while len(self._caches) > self.MAX_CACHES:  # the evicted buffer serves the next new cache
            self._spare_buffer = self._caches.pop(next(iter(self._caches))).scores
        return cache.view()

    def select(
        self,
        strategy: str,
        params: dict[str, Any],
        batch_size: int,
        seed: int,
        filter: dict[str, Any] | None = None,
    ) -> tuple[np.ndarray, np.ndarray | None]:
        full = self._full_scores(strategy, params)
        return strategies.select(
            self.arrays,
            strategy=strategy,
            params=params,
            batch_size=batch_size,
            step=self.open_step,
            seed=seed,
            key=self.spec.name,
            dataset_k=self.spec.rollouts_per_prompt,
            full_scores=full,
            filter=filter,
        )

    def rollout_counts(self, ids: np.ndarray, request: RolloutRequest, seed: int) -> np.ndarray:
        """Rollouts per prompt of `ids` (a batch this state selected) under `request`, from each prompt's
        Beta belief now (the cold prior for a never-observed one), with the ties of the stream
        (dataset, open step, seed, "rollouts"): docs/methods.md §8."""
        alpha, beta, _ = prior_arrays(self.arrays, ids)
        return request.allocate(
            alpha, beta, ids, rng=stream(self.spec.name, self.open_step, seed, "rollouts")
        )

    def score(
        self,
        strategy: str,
        params: dict[str, Any],
        ids: np.ndarray | None,
        seed: int,
        out: np.ndarray | None = None,
    ) -> np.ndarray:
        """The scores of `ids` (None = every prompt) at the open step (strategies.score), written into
        `out` when given."""
        return strategies.score(
            self.arrays,
            strategy=strategy,
            params=params,
            ids=ids,
            step=self.open_step,
            seed=seed,
            key=self.spec.name,
            dataset_k=self.spec.rollouts_per_prompt,
            out=out,
        )

    # ---- memory ---------------------------------------------------------------------------------
    def memory_bytes(self) -> int:
        """What this dataset is charged against the process's memory budget (selector_service/replication/memory.py):
        its arrays twice (live, and the copy a snapshot or an export takes) and its score caches."""
        held = list(self._caches.values())  # a copy: a select in another thread may change the dict
        caches = [c.scores for c in held] + [c.tied.odd for c in held if c.tied is not None]
        if self._spare_buffer is not None:
            caches.append(self._spare_buffer)
        return 2 * self.arrays.nbytes + sum(arr.nbytes for arr in caches)

    # ---- summaries ------------------------------------------------------------------------------
    def prompts_observed(self) -> int:
        return self.arrays.observed

    def summary(self) -> dict[str, Any]:
        lc = self.last_close
        return {
            "open_step": self.open_step,
            "observations": self.results,
            "rollouts": round(self.rollouts),
            "prompts_observed": self.prompts_observed(),
            "steps_closed": self.steps_closed,
            "last_step_partial_share": (lc.partial / lc.observed) if lc and lc.observed else None,
            "last_step_dps_accuracy": (lc.correct / lc.observed) if lc and lc.observed else None,
            **self.coverage(),
            "profile_rollouts": self.profile_rollouts(),
            "total_rollouts": self.total_rollouts(),
        }

    def coverage(self) -> dict[str, int]:
        """Metadata coverage (docs/methods.md §6): prompts with a pass rate, with a group, groups in use, and
        prompts whose pass rate has a sample count."""
        sh = self.arrays.shared
        return {
            "prompts_with_pass_rate": int(sh.pass_rate_known),
            "prompts_with_group": int(sh.grouped),
            "groups": int(np.count_nonzero(sh.group_size)),
            "prompts_with_pass_samples": int(sh.pass_samples_known),
        }

    def profile_rollouts(self) -> int:
        """Rollouts spent profiling the prompts: the sample counts uploaded as profiled (docs/api.md section 2)."""
        return int(self.arrays.shared.profile_rollouts)

    def total_rollouts(self) -> int:
        """Every rollout of the run: those observed plus the profiling ones."""
        return round(self.rollouts) + self.profile_rollouts()

    # ---- snapshots ------------------------------------------------------------------------------
    def snapshot_header(self) -> dict[str, Any]:
        """The state's part of a snapshot header; the codec (snapshot.py) adds the format version and the
        arrays' layout when it writes one."""
        return {
            "spec": dict(self.spec.public(), uid=self.spec.uid),
            "open_step": self.open_step,
            "cursor": self.cursor,
            "seq": self.seq,
            "results": self.results,
            "results_by_lag": {str(k): v for k, v in sorted(self.results_by_lag.items())},
            "rollouts": self.rollouts,
            "steps_closed": self.steps_closed,
            "last_close": list(self.last_close) if self.last_close else None,
            "shared": self.arrays.shared.header(),
            "history": self.history.header(),
        }

    def snapshot_arrays(self) -> dict[str, np.ndarray]:
        """The live arrays a snapshot holds: every per-prompt field, then the shared per-group arrays."""
        arrays = dict(self.arrays.arrays())
        for name, arr in self.arrays.shared.group_arrays().items():
            arrays[SHARED_PREFIX + name] = arr
        arrays.update(self.history.arrays())
        return arrays

    def copy_for_snapshot(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """A consistent copy (header + arrays) that can be serialized while the live state moves on."""
        # order="K": the column-major observed set is copied as it is held (the writer emits row-major bytes)
        return self.snapshot_header(), {k: v.copy(order="K") for k, v in self.snapshot_arrays().items()}
