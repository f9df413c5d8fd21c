"""Per-prompt beliefs of one dataset (`BeliefArrays`) and the Beta update (METHODS 1).

Every belief family is kept at once, from one observation stream, in flat arrays (82 bytes per prompt):

    alpha, beta   f64[N]    Beta(alpha, beta) over the prompt's success rate, prior (alpha0, beta0)
    hmm_d         f32[N,9]  DPS Dirichlet counts; D(i, j) at [p, 3*i + j], column-stochastic:
                            P(i, j) = D(i, j) / sum_i D(i, j) = probability of moving from state j to i
    hmm_prior     f32[N,3]  DPS belief for the open step (unsolved, partially solved, solved)
    hmm_prev      f32[N,3]  DPS prev_post: the posterior of the previous step
    step_state    i8[N]     pooled state observed at the open step (0 = not observed yet)
    last_state    i8[N]     state of the latest result (history resampling)
    n_obs         i32[N]    results received

Beta update (METHODS 1), one result (S successes out of `trials`) after another, in order:

    alpha <- lam * alpha + (1 - lam) * alpha0 + S
    beta  <- lam * beta  + (1 - lam) * beta0  + (trials - S)

`apply_results` also pools the step state (outcomes.combine_state), sets last_state and counts the
result. The DPS update runs when a step closes (dps.close_step, re-exported here with the scores).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numba
import numpy as np

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
}


@dataclass(eq=False, repr=False)
class BeliefArrays:
    """The beliefs of one dataset of N prompts (ids 0..N-1); a plain container of numpy arrays."""

    alpha: np.ndarray
    beta: np.ndarray
    hmm_d: np.ndarray
    hmm_prior: np.ndarray
    hmm_prev: np.ndarray
    step_state: np.ndarray
    last_state: np.ndarray
    n_obs: np.ndarray

    @classmethod
    def new(cls, n: int, alpha0: float = 1.0, beta0: float = 1.0, d0: float = 1.0) -> BeliefArrays:
        """Priors of METHODS 1 and 2: Beta(alpha0, beta0); D = D0 = d0 * ones; prior = prev = 1/3."""
        if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 1:
            raise ValueError(f"a dataset needs n >= 1 prompts, got {n!r}")
        _check_prior(alpha0, beta0)
        if not (math.isfinite(d0) and d0 > 0):
            raise ValueError(f"d0 (Dirichlet prior count) must be finite and > 0, got {d0!r}")
        n = int(n)
        return cls(
            alpha=np.full(n, alpha0, dtype=np.float64),
            beta=np.full(n, beta0, dtype=np.float64),
            hmm_d=np.full((n, 9), d0, dtype=np.float32),
            hmm_prior=np.full((n, 3), 1.0 / 3.0, dtype=np.float32),
            hmm_prev=np.full((n, 3), 1.0 / 3.0, dtype=np.float32),
            step_state=np.zeros(n, dtype=np.int8),
            last_state=np.zeros(n, dtype=np.int8),
            n_obs=np.zeros(n, dtype=np.int32),
        )

    def __repr__(self) -> str:
        return f"BeliefArrays(n={self.n}, observed={int(np.count_nonzero(self.n_obs))})"

    @property
    def n(self) -> int:
        """Number of prompts."""
        return int(self.alpha.shape[0])

    @property
    def nbytes_per_prompt(self) -> int:
        """Bytes of belief state per prompt, all families together (82)."""
        return sum(dtype.itemsize * math.prod(shape) for dtype, shape in FIELDS.values())

    def arrays(self) -> dict[str, np.ndarray]:
        """name -> array (the live arrays, not copies), in a stable order; the inverse of `from_arrays`."""
        return {name: getattr(self, name) for name in FIELDS}

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> BeliefArrays:
        """Rebuilds beliefs from `arrays()` output (e.g. a snapshot). Copies only arrays that are not
        already C-contiguous, writable and of the right dtype; raises ValueError on a missing field or
        a wrong shape."""
        missing = set(FIELDS) - set(arrays)
        unknown = set(arrays) - set(FIELDS)
        if missing or unknown:
            raise ValueError(f"belief arrays: missing {sorted(missing)}, unknown {sorted(unknown)}")
        n = len(arrays["alpha"])
        fields = {}
        for name, (dtype, shape) in FIELDS.items():
            arr = np.asarray(arrays[name])
            if arr.shape != (n, *shape):
                raise ValueError(f"belief array {name!r} has shape {arr.shape}, expected {(n, *shape)}")
            fields[name] = np.require(arr, dtype=dtype, requirements=["C", "W", "A"])
        return cls(**fields)

    def copy(self) -> BeliefArrays:
        """A deep copy."""
        return BeliefArrays(**{name: arr.copy() for name, arr in self.arrays().items()})


def _check_prior(alpha0: float, beta0: float) -> None:
    if not (math.isfinite(alpha0) and math.isfinite(beta0) and alpha0 > 0 and beta0 > 0):
        raise ValueError(
            f"the Beta prior (alpha0, beta0) must be finite and > 0, got ({alpha0!r}, {beta0!r})"
        )


def _check_decay(lam: float, name: str = "lam") -> float:
    if not (math.isfinite(lam) and 0.0 <= lam <= 1.0):
        raise ValueError(f"{name} (forgetting factor) must lie in [0, 1], got {lam!r}")
    return float(lam)


@numba.njit(nogil=True, cache=True)
def _apply_kernel(alpha, beta, step_state, last_state, n_obs, ids, successes, trials, states, lam, a0, b0):
    keep_a = (1.0 - lam) * a0
    keep_b = (1.0 - lam) * b0
    for r in range(ids.size):
        p = ids[r]
        s = successes[r]
        alpha[p] = lam * alpha[p] + keep_a + s
        beta[p] = lam * beta[p] + keep_b + (trials[r] - s)
        step_state[p] = combine_state(step_state[p], states[r])
        last_state[p] = states[r]
        n_obs[p] += 1


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
    """Applies m results in order (a prompt may appear several times): the Beta update of METHODS 1,
    step-state pooling, last_state and n_obs. Validates everything first; on error nothing changes."""
    lam = _check_decay(lam, "beta_decay")
    _check_prior(alpha0, beta0)
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
    _apply_kernel(
        ba.alpha,
        ba.beta,
        ba.step_state,
        ba.last_state,
        ba.n_obs,
        ids,
        successes,
        trials,
        states.astype(np.int8, copy=False),
        lam,
        float(alpha0),
        float(beta0),
    )
