"""Per-prompt beliefs of one dataset (`BeliefArrays`) and the Beta update (METHODS 1, with METHODS 6).

Every belief family is kept at once, from one observation stream, in flat arrays (100 bytes per prompt):

    alpha, beta   f64[N]    Beta(alpha, beta) over the prompt's success rate, once observed (a never-
                            observed prompt holds Beta(alpha0, beta0); its cold prior is computed when
                            scored, coldstart.beta_for)
    hmm_d         f32[N,9]  DPS Dirichlet counts; D(i, j) at [p, 3*i + j], column-stochastic:
                            P(i, j) = D(i, j) / sum_i D(i, j) = probability of moving from state j to i
    hmm_prior     f32[N,3]  DPS belief for the open step (unsolved, partially solved, solved)
    hmm_prev      f32[N,3]  DPS prev_post: the posterior of the previous step
    step_state    i8[N]     pooled state observed at the open step (0 = not observed yet)
    last_state    i8[N]     state of the latest result (history resampling)
    n_obs         i32[N]    results received
    pass_rate     f32[N]    metadata: a reference pass rate, NaN = unknown (METHODS 6)
    group         i32[N]    metadata: group 0..65535, -1 = none (METHODS 6)
    prior_p0      f64[N]    prior pass rate frozen at the first observation, NaN = none (METHODS 6)
    streak        i16[N]    trailing run of all-solved (+z) or all-failed (-z) results (GRESO, METHODS 7)

Beta update (METHODS 1 and 6), one result (S successes out of `trials`) after another, in order; at a
prompt's first result its cold prior is frozen into (alpha0_i, beta0_i) (coldstart module docstring):

    alpha <- lam * alpha + (1 - lam) * alpha0_i + S
    beta  <- lam * beta  + (1 - lam) * beta0_i  + (trials - S)

`apply_results` also pools the step state (outcomes.combine_state), sets last_state, the streak and
n_obs, adds the result to its group's sums, and counts it in the open step's statistics (SharedState).
The DPS update runs when a step closes (dps.close_step, re-exported here with the scores).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numba
import numpy as np

from .coldstart import DatasetRules, SharedState
from .dps import CloseStats, close_step
from .mi import mutual_information, wmi_scores, wmi_weight
from .outcomes import PARTIAL, SOLVED, UNOBSERVED, UNSOLVED, combine_state
from .scores import dps_scores, expected_difficulty_scores, inverse_evidence_scores, thompson_scores

__all__ = [
    "BeliefArrays",
    "CloseStats",
    "apply_results",
    "close_step",
    "dps_scores",
    "expected_difficulty_scores",
    "inverse_evidence_scores",
    "mutual_information",
    "thompson_scores",
    "wmi_scores",
    "wmi_weight",
]

#: name -> (dtype, shape after the prompt axis) of every BeliefArrays field, in snapshot order.
FIELDS: dict[str, tuple[np.dtype, tuple[int, ...]]] = {
    "alpha": (np.dtype(np.float64), ()),
    "beta": (np.dtype(np.float64), ()),
    "hmm_d": (np.dtype(np.float32), (9,)),
    "hmm_prior": (np.dtype(np.float32), (3,)),
    "hmm_prev": (np.dtype(np.float32), (3,)),
    "step_state": (np.dtype(np.int8), ()),
    "last_state": (np.dtype(np.int8), ()),
    "n_obs": (np.dtype(np.int32), ()),
    "pass_rate": (np.dtype(np.float32), ()),
    "group": (np.dtype(np.int32), ()),
    "prior_p0": (np.dtype(np.float64), ()),
    "streak": (np.dtype(np.int16), ()),
}

#: Value of each field for a prompt nothing is known about (BeliefArrays.new); None = computed.
_FRESH: dict[str, float | None] = {
    "alpha": None,
    "beta": None,
    "hmm_d": None,
    "hmm_prior": 1.0 / 3.0,
    "hmm_prev": 1.0 / 3.0,
    "step_state": 0,
    "last_state": 0,
    "n_obs": 0,
    "pass_rate": float("nan"),
    "group": -1,
    "prior_p0": float("nan"),
    "streak": 0,
}
#: Saturation of the streak counter.
STREAK_MAX = 32_767


@dataclass(eq=False, repr=False)
class BeliefArrays:
    """The beliefs of one dataset of N prompts (ids 0..N-1): the per-prompt arrays of FIELDS, and the
    dataset's SharedState (group sums and strategy state, coldstart module)."""

    alpha: np.ndarray
    beta: np.ndarray
    hmm_d: np.ndarray
    hmm_prior: np.ndarray
    hmm_prev: np.ndarray
    step_state: np.ndarray
    last_state: np.ndarray
    n_obs: np.ndarray
    pass_rate: np.ndarray
    group: np.ndarray
    prior_p0: np.ndarray
    streak: np.ndarray
    shared: SharedState = field(default_factory=SharedState)

    @classmethod
    def new(
        cls, n: int, alpha0: float = 1.0, beta0: float = 1.0, d0: float = 1.0, **rules: float
    ) -> BeliefArrays:
        """Priors of METHODS 1, 2 and 6: Beta(alpha0, beta0); D = D0 = d0 * ones; prior = prev = 1/3;
        no metadata. `rules`: the other DatasetRules fields (prior_strength, group_decay, ...)."""
        if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 1:
            raise ValueError(f"a dataset needs n >= 1 prompts, got {n!r}")
        _check_prior(alpha0, beta0)
        if not (math.isfinite(d0) and d0 > 0):
            raise ValueError(f"d0 (Dirichlet prior count) must be finite and > 0, got {d0!r}")
        n = int(n)
        fresh = dict(_FRESH, alpha=alpha0, beta=beta0, hmm_d=d0)
        arrays = {
            name: np.full((n, *shape), fresh[name], dtype=dtype) for name, (dtype, shape) in FIELDS.items()
        }
        return cls(**arrays, shared=SharedState(rules=DatasetRules(float(alpha0), float(beta0), **rules)))

    def __repr__(self) -> str:
        return f"BeliefArrays(n={self.n}, observed={int(np.count_nonzero(self.n_obs))})"

    @property
    def n(self) -> int:
        """Number of prompts."""
        return int(self.alpha.shape[0])

    @property
    def nbytes_per_prompt(self) -> int:
        """Bytes of belief state per prompt, all families and the metadata together (100)."""
        return sum(dtype.itemsize * math.prod(shape) for dtype, shape in FIELDS.values())

    def arrays(self) -> dict[str, np.ndarray]:
        """name -> array (the live arrays, not copies), in a stable order; the inverse of `from_arrays`."""
        return {name: getattr(self, name) for name in FIELDS}

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], shared: SharedState | None = None) -> BeliefArrays:
        """Rebuilds beliefs from `arrays()` output (e.g. a snapshot) and the dataset's shared state
        (default: a fresh one, Beta(1, 1) rules). Copies only arrays that are not already C-contiguous,
        writable and of the right dtype; raises ValueError on a missing field or a wrong shape."""
        missing = set(FIELDS) - set(arrays)
        unknown = set(arrays) - set(FIELDS)
        if missing or unknown:
            raise ValueError(f"belief arrays: missing {sorted(missing)}, unknown {sorted(unknown)}")
        n = len(arrays["alpha"])
        typed = {}
        for name, (dtype, shape) in FIELDS.items():
            arr = np.asarray(arrays[name])
            if arr.shape != (n, *shape):
                raise ValueError(f"belief array {name!r} has shape {arr.shape}, expected {(n, *shape)}")
            typed[name] = np.require(arr, dtype=dtype, requirements=["C", "W", "A"])
        return cls(**typed, shared=shared if shared is not None else SharedState())

    def copy(self) -> BeliefArrays:
        """A deep copy."""
        return BeliefArrays(
            **{name: arr.copy() for name, arr in self.arrays().items()}, shared=self.shared.copy()
        )


def _check_prior(alpha0: float, beta0: float) -> None:
    if not (math.isfinite(alpha0) and math.isfinite(beta0) and alpha0 > 0 and beta0 > 0):
        raise ValueError(
            f"the Beta prior (alpha0, beta0) must be finite and > 0, got ({alpha0!r}, {beta0!r})"
        )


def _check_decay(lam: float, name: str = "lam") -> float:
    if not (math.isfinite(lam) and 0.0 <= lam <= 1.0):
        raise ValueError(f"{name} (forgetting factor) must lie in [0, 1], got {lam!r}")
    return float(lam)


@numba.njit(nogil=True, cache=True, inline="always")
def mean_abs_advantage(s, t):
    """SEC's |advantage| of one group from its S successes in t binary rollouts (METHODS 7):
    mean_i |r_i - mean(r)| / (std(r, ddof=1) + 1e-6) with S ones and t - S zeros; 0 for t < 2 (ours:
    one rollout has no spread)."""
    if t < 2.0:
        return 0.0
    p = s / t
    var = p * (1.0 - p)
    return 2.0 * var / (math.sqrt(t * var / (t - 1.0)) + 1e-6)


@numba.njit(nogil=True, cache=True)
def _apply_kernel(
    alpha, beta, step_state, last_state, n_obs, pass_rate, group, prior_p0, streak,
    gs, gt, adv, adv_n, counts, ids, successes, trials, states, lam, a0, b0, strength,
):  # fmt: skip
    for r in range(ids.size):
        p = ids[r]
        s = successes[r]
        t = trials[r]
        g = group[p]
        if n_obs[p] == 0:
            # METHODS 6: freeze the cold prior, from the group sums of every result applied before this one.
            p0 = np.float64(pass_rate[p])
            if np.isnan(p0) and g >= 0:
                p0 = (a0 + gs[g]) / (a0 + b0 + gt[g])
            prior_p0[p] = p0
            if np.isnan(p0):
                alpha[p] = a0
                beta[p] = b0
            else:
                alpha[p] = a0 + strength * p0
                beta[p] = b0 + strength * (1.0 - p0)
        p0 = prior_p0[p]
        if np.isnan(p0):
            ai = a0
            bi = b0
        else:
            ai = a0 + strength * p0
            bi = b0 + strength * (1.0 - p0)
        alpha[p] = lam * alpha[p] + (1.0 - lam) * ai + s
        beta[p] = lam * beta[p] + (1.0 - lam) * bi + (t - s)
        st = states[r]
        step_state[p] = combine_state(step_state[p], st)
        last_state[p] = st
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


def apply_results(
    ba: BeliefArrays,
    ids: np.ndarray,
    successes: np.ndarray,
    trials: np.ndarray,
    states: np.ndarray,
    lam: float,
    alpha0: float,
    beta0: float,
) -> None:
    """Applies m results in order (a prompt may appear several times): the Beta update of METHODS 1 with
    the frozen priors of METHODS 6, step-state pooling, last_state, streak, n_obs, group sums and the
    open step's statistics. `alpha0`, `beta0` must be the prior `ba` was created with. Validates
    everything first; on error nothing changes."""
    lam = _check_decay(lam, "beta_decay")
    _check_prior(alpha0, beta0)
    rules = ba.shared.rules
    if (float(alpha0), float(beta0)) != (rules.alpha0, rules.beta0):
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
    sh = ba.shared
    _apply_kernel(
        ba.alpha, ba.beta, ba.step_state, ba.last_state, ba.n_obs, ba.pass_rate, ba.group, ba.prior_p0,
        ba.streak, sh.group_successes, sh.group_trials, sh.step_adv, sh.step_adv_n, sh.step_counts,
        ids, successes, trials, states.astype(np.int8, copy=False), lam, rules.alpha0, rules.beta0,
        rules.prior_strength,
    )  # fmt: skip
    if sh.grouped:
        sh.cold_version += 1
