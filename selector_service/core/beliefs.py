"""Per-prompt beliefs of one dataset (`BeliefArrays`) and the Beta update (docs/methods.md §1, with docs/methods.md §6).

Every belief family is kept at once, from one observation stream. Arrays over all N prompts (FIELDS,
52 bytes per prompt):

    alpha, beta   f64[N]    Beta(alpha, beta) over the prompt's success rate, once observed (a never-
                            observed prompt holds Beta(alpha0, beta0); its cold prior is computed when
                            scored, coldstart.beta_for)
    last_state    i8[N]     state of the latest result (history resampling; 0 = none yet)
    n_obs         i32[N]    results received, saturating at N_OBS_MAX = 2^31 - 1 (never wraps)
    hmm_slot      i32[N]    the prompt's row in the observed set below, -1 = never observed
    pass_rate     f32[N]    metadata: a reference pass rate, NaN = unknown (docs/methods.md §6)
    group         i32[N]    metadata: group 0..65535, -1 = none (docs/methods.md §6)
    prior_p0      f64[N]    prior pass rate frozen at the first observation, NaN = none (docs/methods.md §6)
    streak        i16[N]    trailing run of all-solved (+z) or all-failed (-z) results (GRESO, docs/methods.md §7)
    pass_samples  i32[N]    metadata: the samples behind the pass rate, -1 = unknown (docs/methods.md §6)
    profiled      i8[N]     metadata: 1 when those samples were rolled out for this run (profiling)
    prior_n       i32[N]    the samples the prior weighs, frozen with prior_p0; -1 = prior_strength

DPS state only for prompts that have ever been observed (OBSERVED_FIELDS, 65 bytes per observed
prompt), in an append-only set in order of first observation in the log (slot s = the s-th prompt ever
observed). Every replica applies the same log in the same order, so every replica builds the same
slots; the step close walks the rows in slot order, one contiguous pass:

    obs_ids       i32[M]    the prompt id of each slot
    obs_d         f32[M,9]  DPS Dirichlet counts; D(i, j) at [s, 3*i + j], column-stochastic:
                            P(i, j) = D(i, j) / sum_i D(i, j) = probability of moving from state j to i
    obs_prior     f32[M,3]  DPS belief for the open step (unsolved, partially solved, solved)
    obs_prev      f32[M,3]  DPS prev_post: the posterior of the previous step
    obs_state     i8[M]     pooled state observed at the open step (0 = not observed yet)

obs_d, obs_prior and obs_prev are held column-major (COLUMN_FIELDS): same shapes and values, but each
column is contiguous, so the close and the DPS select stream a few float32 columns and vectorize.

A never-observed prompt is implicit and exact: with D0 = d0 * ones, the unobserved update leaves D at D0
and the prior and prev at (1/3, 1/3, 1/3) (docs/methods.md §2; dps.py shows it holds bit for bit in float32), so
it reports D0 and 1/3 (`hmm_rows`, `dense_hmm`) and costs only its 52 bytes. Memory: 52 bytes per
prompt plus 65 per observed prompt, 117 when every prompt is observed (budget 128; the observed set's
capacity grows by half as needed and never beyond N). The dataset's SharedState (group sums, strategy
state; shared.py) adds a few dozen bytes per group.

Beta update (docs/methods.md §1 and 6), one result (S successes out of `trials`) after another, in order; at a
prompt's first result its cold prior is frozen into (alpha0_i, beta0_i) (coldstart module docstring):

    alpha <- beta_decay * alpha + (1 - beta_decay) * alpha0_i + S
    beta  <- beta_decay * beta  + (1 - beta_decay) * beta0_i  + (trials - S)

with the dataset's constants (shared.DatasetRules).

`apply_results` also gives a prompt its slot at its first result, pools the step state
(outcomes.combine_state), sets last_state, the streak and n_obs, adds the result to its group's sums, and
counts it in the open step's statistics (SharedState). The DPS update runs when a step closes
(dps.close_step; step_close.close_open_step closes a whole step).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

import numba
import numpy as np
import numpy.typing as npt

from .outcomes import PARTIAL, SOLVED, UNOBSERVED, UNSOLVED, combine_state
from .shared import DatasetRules, SharedState

__all__ = [
    "FIELDS",
    "NO_GROUP",
    "NO_SAMPLES",
    "OBSERVED_FIELDS",
    "BeliefArrays",
    "apply_results",
]

#: name -> (dtype, shape after the prompt axis) of every array over all N prompts, in snapshot order.
#: The single list of per-prompt arrays: a new per-prompt field is added here (and to BeliefArrays).
FIELDS: dict[str, tuple[np.dtype, tuple[int, ...]]] = {
    "alpha": (np.dtype(np.float64), ()),
    "beta": (np.dtype(np.float64), ()),
    "last_state": (np.dtype(np.int8), ()),
    "n_obs": (np.dtype(np.int32), ()),
    "hmm_slot": (np.dtype(np.int32), ()),
    "pass_rate": (np.dtype(np.float32), ()),
    "group": (np.dtype(np.int32), ()),
    "prior_p0": (np.dtype(np.float64), ()),
    "streak": (np.dtype(np.int16), ()),
    "pass_samples": (np.dtype(np.int32), ()),
    "profiled": (np.dtype(np.int8), ()),
    "prior_n": (np.dtype(np.int32), ()),
}

#: `group` value of a prompt without a group.
NO_GROUP = -1
#: `pass_samples` (and frozen `prior_n`) value of a rate without a sample count: it weighs prior_strength.
NO_SAMPLES = -1

#: Per-prompt fields of cold start (docs/methods.md §6, 7), and their value for a prompt nothing is known
#: about (no metadata, no runs).
METADATA_FIELDS: dict[str, float] = {
    "pass_rate": math.nan,
    "group": NO_GROUP,
    "prior_p0": math.nan,
    "streak": 0,
    "pass_samples": NO_SAMPLES,
    "profiled": 0,
    "prior_n": NO_SAMPLES,
}
#: Saturation of the streak counter.
STREAK_MAX = 32_767
#: n_obs stops here instead of wrapping to a negative count (which would read as "never observed").
N_OBS_MAX = 2**31 - 1

#: name -> (dtype, shape after the slot axis) of every array over the observed set, in snapshot order.
OBSERVED_FIELDS: dict[str, tuple[np.dtype, tuple[int, ...]]] = {
    "obs_ids": (np.dtype(np.int32), ()),
    "obs_d": (np.dtype(np.float32), (9,)),
    "obs_prior": (np.dtype(np.float32), (3,)),
    "obs_prev": (np.dtype(np.float32), (3,)),
    "obs_state": (np.dtype(np.int8), ()),
}

#: Observed-set arrays held column-major (Fortran order): each column, e.g. D(0, 0) of every observed
#: prompt, is contiguous, so the close and the DPS select walk a few contiguous float32 streams that
#: their loops vectorize over. Their shape and values, and so their snapshot bytes (row-major, as
#: np.ascontiguousarray gives them), are the same as row-major arrays would have.
COLUMN_FIELDS = ("obs_d", "obs_prior", "obs_prev")

#: A dataset's prompt ids fit the int32 slot map and id list.
MAX_PROMPTS = 2**31 - 2
#: The uniform DPS belief of a never-observed prompt, as stored.
UNIFORM = np.float32(1.0 / 3.0)
_INITIAL_CAPACITY = 1024


def _field_bytes(fields: dict[str, tuple[np.dtype, tuple[int, ...]]]) -> int:
    return sum(dtype.itemsize * math.prod(shape) for dtype, shape in fields.values())


@dataclass(eq=False, repr=False)
class BeliefArrays:
    """The beliefs of one dataset of N prompts (ids 0..N-1): the FIELDS arrays over every prompt and the
    OBSERVED_FIELDS arrays, allocated to a capacity, whose first `observed` rows are live."""

    alpha: np.ndarray
    beta: np.ndarray
    last_state: np.ndarray
    n_obs: np.ndarray
    hmm_slot: np.ndarray
    pass_rate: np.ndarray
    group: np.ndarray
    prior_p0: np.ndarray
    streak: np.ndarray
    pass_samples: np.ndarray
    profiled: np.ndarray
    prior_n: np.ndarray
    obs_ids: np.ndarray
    obs_d: np.ndarray
    obs_prior: np.ndarray
    obs_prev: np.ndarray
    obs_state: np.ndarray
    observed: int = 0
    d0: float = 1.0
    #: The dataset's state beside the per-prompt arrays (group sums, strategy state; shared.py).
    shared: SharedState = field(default_factory=SharedState)

    def __post_init__(self) -> None:
        for name in COLUMN_FIELDS:  # column-major storage (COLUMN_FIELDS), whoever built the arrays
            arr = getattr(self, name)
            if not arr.flags.f_contiguous:
                setattr(self, name, np.asfortranarray(arr))

    @classmethod
    def new(
        cls, n: int, alpha0: float = 1.0, beta0: float = 1.0, d0: float = 1.0, **rules: Any
    ) -> BeliefArrays:
        """Priors of docs/methods.md §1, 2 and 6: Beta(alpha0, beta0); every prompt never observed (D = D0 = d0 *
        ones, prior = prev = 1/3, implicit); no metadata. `rules`: the other DatasetRules fields
        (beta_decay, hmm_decay, prior_strength, group_decay, ...)."""
        if isinstance(n, bool) or not isinstance(n, int | np.integer) or not 1 <= n <= MAX_PROMPTS:
            raise ValueError(f"a dataset needs 1 <= n <= {MAX_PROMPTS} prompts, got {n!r}")
        _check_d0(d0)
        fixed = DatasetRules(float(alpha0), float(beta0), **rules)
        n = int(n)
        arrays = {**_fresh_metadata(n), **_observed_arrays(min(n, _INITIAL_CAPACITY))}
        ba = cls(
            alpha=np.full(n, alpha0, dtype=np.float64),
            beta=np.full(n, beta0, dtype=np.float64),
            last_state=np.zeros(n, dtype=np.int8),
            n_obs=np.zeros(n, dtype=np.int32),
            hmm_slot=np.full(n, -1, dtype=np.int32),
            # mypy matches a **dict against every parameter, also the non-array ones given by name here
            **arrays,  # type: ignore[arg-type]
            d0=float(d0),
            shared=SharedState(rules=fixed),
        )
        return ba

    def __repr__(self) -> str:
        return f"BeliefArrays(n={self.n}, observed={self.observed})"

    @property
    def n(self) -> int:
        """Number of prompts."""
        return int(self.alpha.shape[0])

    @property
    def capacity(self) -> int:
        """Rows allocated for the observed set."""
        return int(self.obs_ids.shape[0])

    # ---- memory -----------------------------------------------------------------------------------
    @staticmethod
    def bytes_per_prompt(observed_share: float = 1.0) -> float:
        """Bytes of belief state per prompt when `observed_share` of the prompts have been observed
        (52 + 65 * share; 117 when every prompt is; capacity slack not counted)."""
        return _field_bytes(FIELDS) + observed_share * _field_bytes(OBSERVED_FIELDS)

    @property
    def nbytes_per_prompt(self) -> int:
        """Bytes per prompt in the worst case, every prompt observed (117; budget 128)."""
        return _field_bytes(FIELDS) + _field_bytes(OBSERVED_FIELDS)

    @property
    def nbytes(self) -> int:
        """Bytes held now (both groups of arrays, the observed set at its capacity)."""
        return sum(getattr(self, name).nbytes for name in (*FIELDS, *OBSERVED_FIELDS))

    # ---- the observed set -------------------------------------------------------------------------
    def reserve(self, count: int) -> None:
        """Makes room for `count` observed prompts (grows by at least half, never beyond N)."""
        if count <= self.capacity:
            return
        new_cap = min(self.n, max(count, self.capacity + self.capacity // 2, _INITIAL_CAPACITY))
        grown = _observed_arrays(new_cap)
        m = self.observed
        for name in OBSERVED_FIELDS:
            grown[name][:m] = getattr(self, name)[:m]
            setattr(self, name, grown[name])

    def observed_columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(D f32[9, capacity], prior f32[3, capacity], prev f32[3, capacity]): the C-contiguous
        transposes of obs_d, obs_prior, obs_prev (views; columns < `observed` are live), for kernels."""
        return self.obs_d.T, self.obs_prior.T, self.obs_prev.T

    def observed_view(self) -> dict[str, np.ndarray]:
        """name -> the live rows (views) of the OBSERVED_FIELDS arrays."""
        m = self.observed
        return {name: getattr(self, name)[:m] for name in OBSERVED_FIELDS}

    def hmm_rows(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(D f32[m, 9], prior f32[m, 3], prev f32[m, 3], step state i8[m]) of prompts `ids`, never-observed
        ones at (D0, 1/3, 1/3, 0): what the dense layout would hold."""
        ids = np.asarray(ids, dtype=np.int64)
        slots = self.hmm_slot[ids]
        seen = slots >= 0
        d = np.full((ids.size, 9), np.float32(self.d0), dtype=np.float32)
        prior = np.full((ids.size, 3), UNIFORM, dtype=np.float32)
        prev = np.full((ids.size, 3), UNIFORM, dtype=np.float32)
        state = np.zeros(ids.size, dtype=np.int8)
        rows = slots[seen]
        d[seen], prior[seen], prev[seen] = self.obs_d[rows], self.obs_prior[rows], self.obs_prev[rows]
        state[seen] = self.obs_state[rows]
        return d, prior, prev, state

    def hmm_prior_of(self, ids: np.ndarray) -> np.ndarray:
        """DPS priors f32[m, 3] of prompts `ids` ((1/3, 1/3, 1/3) for never-observed ones)."""
        return self.hmm_rows(ids)[1]

    def dense_hmm(self) -> dict[str, np.ndarray]:
        """The DPS state of every prompt in the dense layout: hmm_d f32[N, 9], hmm_prior, hmm_prev f32[N, 3],
        step_state i8[N] (O(N) memory: for tests and tools, not for serving)."""
        d, prior, prev, state = self.hmm_rows(np.arange(self.n))
        return {"hmm_d": d, "hmm_prior": prior, "hmm_prev": prev, "step_state": state}

    def predicted_state_counts(self) -> np.ndarray:
        """Prompts (f64[3]) per most likely state of their DPS prior; a prompt whose prior ties between
        states counts equally toward each of them (a never-observed prompt: a third to each)."""
        prior = self.observed_view()["obs_prior"]
        top = prior == prior.max(axis=1, keepdims=True)
        counts: np.ndarray = (top / top.sum(axis=1, keepdims=True)).sum(axis=0)
        return counts + (self.n - self.observed) / 3.0

    # ---- snapshots --------------------------------------------------------------------------------
    def arrays(self) -> dict[str, np.ndarray]:
        """name -> array (live arrays and views of the live rows, not copies), FIELDS then
        OBSERVED_FIELDS; the inverse of `from_arrays`."""
        return {**{name: getattr(self, name) for name in FIELDS}, **self.observed_view()}

    def canonical_arrays(self) -> dict[str, np.ndarray]:
        """`arrays()` with the observed set in prompt-id order and the slot map renumbered to match
        (copies). Two beliefs that applied the same results per step, in whatever order within a step,
        have the same canonical arrays; the raw ones keep each prompt where its first result put it."""
        view = self.observed_view()
        order = np.argsort(view["obs_ids"], kind="stable")
        out = {name: getattr(self, name).copy() for name in FIELDS}
        out.update({name: arr[order] for name, arr in view.items()})
        slot = np.full(self.n, -1, dtype=np.int32)
        slot[out["obs_ids"]] = np.arange(order.size, dtype=np.int32)
        out["hmm_slot"] = slot
        return out

    @staticmethod
    def check_layout(layout: dict[str, tuple[np.dtype, tuple[int, ...]]], n: int) -> None:
        """Checks the names, dtypes and shapes of a snapshot's arrays (as declared in its header) before
        anything is allocated: FIELDS with n rows and OBSERVED_FIELDS with one row count m <= n. Raises
        ValueError."""
        names = set(layout)
        expected = set(FIELDS) | set(OBSERVED_FIELDS)
        missing, unknown = expected - names, names - expected
        if missing or unknown:
            raise ValueError(f"belief arrays: missing {sorted(missing)}, unknown {sorted(unknown)}")
        m = layout["obs_ids"][1][0] if layout["obs_ids"][1] else -1
        if not 0 <= m <= n:
            raise ValueError(f"the observed set has {m} rows; the dataset has {n} prompts")
        for group, rows in ((FIELDS, n), (OBSERVED_FIELDS, m)):
            for name, (dtype, shape) in group.items():
                if name not in layout:
                    continue
                got_dtype, got_shape = layout[name]
                if np.dtype(got_dtype) != dtype or tuple(got_shape) != (rows, *shape):
                    raise ValueError(
                        f"belief array {name!r} is {np.dtype(got_dtype)}{tuple(got_shape)}, "
                        f"expected {dtype}{(rows, *shape)}"
                    )

    @classmethod
    def from_arrays(
        cls, arrays: dict[str, np.ndarray], d0: float = 1.0, shared: SharedState | None = None
    ) -> BeliefArrays:
        """Rebuilds beliefs from `arrays()` output (e.g. a snapshot) and the dataset's shared state
        (default: a fresh one, Beta(1, 1) rules). Copies only arrays that are not already contiguous
        (COLUMN_FIELDS column-major, the rest row-major), writable and of the right dtype. Raises
        ValueError on a missing field, a wrong shape, or an observed set that does not match the slot
        map."""
        missing = (set(FIELDS) | set(OBSERVED_FIELDS)) - set(arrays)
        unknown = set(arrays) - set(FIELDS) - set(OBSERVED_FIELDS)
        if missing or unknown:
            raise ValueError(f"belief arrays: missing {sorted(missing)}, unknown {sorted(unknown)}")
        n = len(arrays["alpha"])
        m = len(arrays["obs_ids"])
        fields = {}
        for group, rows in ((FIELDS, n), (OBSERVED_FIELDS, m)):
            for name, (dtype, shape) in group.items():
                arr = np.asarray(arrays[name])
                if arr.shape != (rows, *shape):
                    raise ValueError(
                        f"belief array {name!r} has shape {arr.shape}, expected {(rows, *shape)}"
                    )
                order: Literal["F", "C"] = "F" if name in COLUMN_FIELDS else "C"
                fields[name] = np.require(arr, dtype=dtype, requirements=[order, "W", "A"])
        if not 1 <= n <= MAX_PROMPTS:
            raise ValueError(f"a dataset needs 1 <= n <= {MAX_PROMPTS} prompts, got {n}")
        _check_d0(d0)
        ba = cls(**fields, observed=m, d0=float(d0), shared=shared if shared is not None else SharedState())
        ba._check_observed_set()
        top = int(ba.group.max())
        if top >= ba.shared.n_groups or int(ba.group.min()) < -1:
            raise ValueError(f"groups reach {top} but the shared state has {ba.shared.n_groups} groups")
        return ba

    def _check_observed_set(self) -> None:
        """The kernels index by slot and id without bounds checks: slots and ids must be a bijection."""
        m, n = self.observed, self.n
        ids, slot = self.obs_ids[:m], self.hmm_slot
        if m and (int(ids.min()) < 0 or int(ids.max()) >= n):
            raise ValueError("observed set: a prompt id is out of range")
        if int(slot.min()) < -1 or int(slot.max()) >= m or int(np.count_nonzero(slot >= 0)) != m:
            raise ValueError("observed set: the slot map does not match the observed prompts")
        if m and not np.array_equal(slot[ids], np.arange(m, dtype=np.int32)):
            raise ValueError("observed set: the slot map does not match the observed prompts")

    def copy(self) -> BeliefArrays:
        """A deep copy (the observed set trimmed to its live rows)."""
        arrays = {name: arr.copy(order="K") for name, arr in self.arrays().items()}
        return BeliefArrays.from_arrays(arrays, self.d0, self.shared.copy())

    def observed_at_step(self, ids: np.ndarray) -> np.ndarray:
        """bool per prompt of `ids`: whether it has a result at the open step (its pooled step state)."""
        slots = self.hmm_slot[np.asarray(ids, dtype=np.int64)]
        seen = slots >= 0
        out = np.zeros(slots.size, dtype=bool)
        out[seen] = self.obs_state[slots[seen]] != 0
        return out


def _fresh_metadata(n: int) -> dict[str, np.ndarray]:
    return {name: np.full(n, METADATA_FIELDS[name], dtype=FIELDS[name][0]) for name in METADATA_FIELDS}


def _observed_arrays(capacity: int) -> dict[str, np.ndarray]:
    return {
        name: np.zeros((capacity, *shape), dtype=dtype, order="F" if name in COLUMN_FIELDS else "C")
        for name, (dtype, shape) in OBSERVED_FIELDS.items()
    }


def _check_d0(d0: float) -> None:
    if not (isinstance(d0, int | float | np.floating) and math.isfinite(d0) and d0 > 0):
        raise ValueError(f"d0 (Dirichlet prior count) must be finite and > 0, got {d0!r}")


@numba.njit(nogil=True, cache=True, inline="always")
def mean_abs_advantage(s: float, t: float) -> float:
    """SEC's |advantage| of one group from its S successes in t binary rollouts (docs/methods.md §7):
    mean_i |r_i - mean(r)| / (std(r, ddof=1) + 1e-6) with S ones and t - S zeros; 0 for t < 2 (ours:
    one rollout has no spread)."""
    if t < 2.0:
        return 0.0
    p = s / t
    var = p * (1.0 - p)
    return 2.0 * var / (math.sqrt(t * var / (t - 1.0)) + 1e-6)


@numba.njit(nogil=True, cache=True)
def _apply_kernel(
    alpha: npt.NDArray[np.float64],
    beta: npt.NDArray[np.float64],
    last_state: npt.NDArray[np.int8],
    n_obs: npt.NDArray[np.int32],
    slot_of: npt.NDArray[np.int32],
    obs_ids: npt.NDArray[np.int32],
    obs_d: npt.NDArray[np.float32],
    obs_prior: npt.NDArray[np.float32],
    obs_prev: npt.NDArray[np.float32],
    obs_state: npt.NDArray[np.int8],
    observed: int,
    d0: float,
    meta: tuple[
        npt.NDArray[np.float32],
        npt.NDArray[np.int32],
        npt.NDArray[np.float64],
        npt.NDArray[np.int16],
        npt.NDArray[np.int32],
        npt.NDArray[np.int32],
    ],
    gs: npt.NDArray[np.float64],
    gt: npt.NDArray[np.float64],
    adv: npt.NDArray[np.float64],
    adv_n: npt.NDArray[np.int64],
    counts: npt.NDArray[np.float64],
    ids: npt.NDArray[np.int64],
    successes: npt.NDArray[np.float64],
    trials: npt.NDArray[np.float64],
    states: npt.NDArray[np.int8],
    beta_decay: float,
    alpha0: float,
    beta0: float,
    prior_strength: float,
) -> int:
    """Applies the results in order; returns the new size of the observed set (the caller has reserved
    room for every prompt seen for the first time). meta = (pass_rate, group, prior_p0, streak,
    pass_samples, prior_n)."""
    pass_rate, group, prior_p0, streak, pass_samples, prior_n = meta
    d0_32 = np.float32(d0)
    third = np.float32(1.0 / 3.0)
    for r in range(ids.size):
        p = ids[r]
        s = successes[r]
        t = trials[r]
        g = group[p]
        if n_obs[p] == 0:
            # docs/methods.md §6: freeze the cold prior, from the group sums of every result applied before
            # this one; a known pass rate weighs its own sample count when it has one.
            p0 = np.float64(pass_rate[p])
            prior_n[p] = pass_samples[p] if (pass_samples[p] >= 1 and not np.isnan(p0)) else NO_SAMPLES
            if np.isnan(p0) and g >= 0:
                p0 = (alpha0 + gs[g]) / (alpha0 + beta0 + gt[g])
            prior_p0[p] = p0
        p0 = prior_p0[p]
        if np.isnan(p0):
            ai = alpha0
            bi = beta0
        else:
            si = np.float64(prior_n[p]) if prior_n[p] >= 1 else prior_strength
            ai = alpha0 + si * p0
            bi = beta0 + si * (1.0 - p0)
        if n_obs[p] == 0:
            alpha[p] = ai
            beta[p] = bi
        alpha[p] = beta_decay * alpha[p] + (1.0 - beta_decay) * ai + s
        beta[p] = beta_decay * beta[p] + (1.0 - beta_decay) * bi + (t - s)
        slot = slot_of[p]
        if slot < 0:
            slot = observed
            observed += 1
            slot_of[p] = slot
            obs_ids[slot] = p
            for q in range(9):
                obs_d[slot, q] = d0_32
            for q in range(3):
                obs_prior[slot, q] = third
                obs_prev[slot, q] = third
            obs_state[slot] = 0
        st = states[r]
        obs_state[slot] = combine_state(obs_state[slot], st)
        last_state[p] = st
        if n_obs[p] < N_OBS_MAX:
            n_obs[p] += 1
        z = streak[p]
        if st == SOLVED:
            streak[p] = min(max(z, 0) + 1, STREAK_MAX)
        elif st == UNSOLVED:
            streak[p] = max(min(z, 0) - 1, -STREAK_MAX)
        else:
            streak[p] = 0
        if g >= 0:
            gs[g] += s
            gt[g] += t
            adv[g] += mean_abs_advantage(s, t)
            adv_n[g] += 1
        counts[0] += 1.0
        if st == SOLVED:
            counts[1] += 1.0
        elif st == UNSOLVED:
            counts[2] += 1.0
        counts[3] += s
        counts[4] += t
    return observed


def apply_results(
    ba: BeliefArrays,
    ids: np.ndarray,
    successes: np.ndarray,
    trials: np.ndarray,
    states: np.ndarray,
    beta_decay: float | None = None,
    alpha0: float | None = None,
    beta0: float | None = None,
) -> None:
    """Applies m results in order (a prompt may appear several times): the Beta update of docs/methods.md §1 with
    the frozen priors of docs/methods.md §6, a slot in the observed set at a prompt's first result, step-state
    pooling, last_state, streak, n_obs, group sums and the open step's statistics.

    The constants are the dataset's (ba.shared.rules): its Beta prior, prior_strength and beta_decay.
    `beta_decay` names the decay where the rules leave it open, and may repeat the dataset's
    (DatasetRules.decay); `alpha0`, `beta0`, when given, must be the prior `ba` was created with.
    Validates everything first; on error nothing changes."""
    rules = ba.shared.rules
    beta_decay = rules.decay("beta_decay", beta_decay)
    if (alpha0, beta0) != (None, None) and (alpha0, beta0) != (rules.alpha0, rules.beta0):
        raise ValueError(
            f"the beliefs were created with the Beta prior ({rules.alpha0}, {rules.beta0}), "
            f"not ({alpha0}, {beta0})"
        )
    ids = np.ascontiguousarray(ids)
    if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"ids must be a 1-d integer array, got dtype {ids.dtype}, shape {ids.shape}")
    ids = ids.astype(np.int64, copy=False)
    m = ids.size
    successes = np.ascontiguousarray(successes, dtype=np.float64)
    trials = np.ascontiguousarray(trials, dtype=np.float64)
    states = np.ascontiguousarray(states)
    if successes.shape != (m,) or trials.shape != (m,) or states.shape != (m,):
        raise ValueError("ids, successes, trials and states must be 1-d arrays of one length")
    if m == 0:
        return
    if int(ids.min()) < 0 or int(ids.max()) >= ba.n:
        raise ValueError(f"prompt ids must lie in [0, {ba.n}); got [{int(ids.min())}, {int(ids.max())}]")
    if not (np.all(np.isfinite(successes)) and np.all(np.isfinite(trials))):
        raise ValueError("successes and trials must be finite")
    if np.any(trials <= 0) or np.any(successes < 0) or np.any(successes > trials):
        raise ValueError("each result needs trials > 0 and 0 <= successes <= trials")
    if np.any((states < UNSOLVED) | (states > SOLVED)):
        raise ValueError(
            f"states must be {UNSOLVED}, {PARTIAL} or {SOLVED} (not {UNOBSERVED}) for every result"
        )
    new = np.unique(ids[ba.hmm_slot[ids] < 0]).size
    ba.reserve(ba.observed + new)
    sh = ba.shared
    ba.observed = int(
        _apply_kernel(
            ba.alpha, ba.beta, ba.last_state, ba.n_obs, ba.hmm_slot, ba.obs_ids, ba.obs_d, ba.obs_prior,
            ba.obs_prev, ba.obs_state, ba.observed, ba.d0,
            (ba.pass_rate, ba.group, ba.prior_p0, ba.streak, ba.pass_samples, ba.prior_n),
            sh.group_successes, sh.group_trials, sh.step_adv, sh.step_adv_n, sh.step_counts,
            ids, successes, trials, states.astype(np.int8, copy=False), beta_decay, rules.alpha0,
            rules.beta0, rules.prior_strength,
        )
    )  # fmt: skip
    if sh.grouped:
        sh.cold_version += 1
