"""The domain of a loaded belief state: what the service itself can ever produce (docs/numerics.md).

A snapshot is checksummed, but a checksum only says the bytes are the ones the writer wrote: an export
crafted with the codec itself carries valid digests over any values at all. `check_beliefs` checks every
per-prompt array, the observed set and the shared state against the ranges the update rules can reach
(core/domain.py argues them), so that a loaded state is one the service could have built itself and
every kernel is total on it. Each violation raises ValueError naming the field, the first offending
index and its value. The checks are single passes over the arrays (numba, no temporaries the size of
the dataset), a small share of a load's decompression.

    alpha, beta     finite, >= the prior alpha0 / beta0 (up to rounding), <= BELIEF_MAX
    last_state      0 (none yet) .. 3 (SOLVED); 0 exactly when n_obs = 0
    n_obs           >= 0; > 0 exactly for prompts with a slot in the observed set
    hmm_slot        -1 or a slot; the slot map and obs_ids are a bijection (BeliefArrays.from_arrays)
    pass_rate       [0, 1] or NaN; pass_rate_known = the number of known ones
    group           -1 .. n_groups - 1 (< MAX_GROUPS); grouped and group_size = the counts per group
    prior_p0        [0, 1] or NaN
    streak          [-STREAK_MAX, STREAK_MAX]
    pass_samples    -1 (unknown) or 1 .. PASS_SAMPLES_MAX; pass_samples_known = the number of counts
    profiled        0 or 1, 1 only beside a count; profile_rollouts = the sum of the profiled counts
    prior_n         -1 (prior_strength) or 1 .. PASS_SAMPLES_MAX, -1 for a prompt never observed
    obs_d           Dirichlet counts: finite, > 0
    obs_prior/prev  probabilities: each in [0, 1], each row summing to 1 (float32 rounding allowed)
    obs_state       0 .. 3
    group sums      finite, 0 <= S_g <= T_g
    sec_q           [0, 1] (a decayed mean of mean |advantage| values, each in [0, 1))
    sec_pos         [0, POSITION_MAX]
    step_adv(_n)    0 <= step_adv <= step_adv_n (each result adds less than 1)
    step_counts     finite, >= 0; all-solved, all-failed <= results; successes <= trials
    greso_pos       [0, POSITION_MAX]; p_easy, p_hard in [0.05, 0.95]; adarft_t in [0, 100]
"""

from __future__ import annotations

import math
from typing import Any

import numba
import numpy as np
import numpy.typing as npt

from .beliefs import STREAK_MAX, BeliefArrays
from .curricula import GRESO_P_MAX, GRESO_P_MIN
from .domain import BELIEF_MAX, MAX_GROUPS, PASS_SAMPLES_MAX, plain
from .outcomes import SOLVED, UNOBSERVED

__all__ = ["POSITION_MAX", "check_beliefs"]

#: Walk positions (GRESO's, SEC's per group) are int64 counters; a position near 2^63 would overflow.
POSITION_MAX = 2**62
#: Relative slack for values the update rules keep inside a bound up to a few roundings.
_ROUNDING = 1e-9
#: How far a float32 probability row may sum from 1 (three values rounded to float32 once each).
_ROW_SUM_TOLERANCE = 1e-4
_BLOCK = 4096


@numba.njit(nogil=True, cache=True)
def _first_outside(
    values: npt.NDArray[np.number[Any]],
    lo: float | np.number[Any],
    hi: float | np.number[Any],
    allow_nan: bool,
) -> int:
    """Index of the first value not in [lo, hi] (NaN counts as outside unless allow_nan), or -1.

    Blocks of _BLOCK values are counted without branches (the loop vectorizes); only a block with a bad
    value is walked again to find it.
    """
    n = values.size
    for start in range(0, n, _BLOCK):
        stop = min(start + _BLOCK, n)
        bad: int | np.int32 = 0
        for i in range(start, stop):
            x = values[i]
            bad += np.int32(not ((x >= lo) & (x <= hi) | (allow_nan & (x != x))))
        if bad:
            for i in range(start, stop):
                x = values[i]
                if not ((x >= lo) & (x <= hi) | (allow_nan & (x != x))):
                    return i
    return -1


@numba.njit(nogil=True, cache=True)
def _row_is_bad(rows: npt.NDArray[np.float32], i: int, tolerance: float) -> bool:
    a, b, c = rows[i, 0], rows[i, 1], rows[i, 2]
    inside = (a >= 0) & (a <= 1) & (b >= 0) & (b <= 1) & (c >= 0) & (c <= 1)
    total = np.float64(a) + np.float64(b) + np.float64(c)
    return not (inside & (abs(total - 1.0) <= tolerance))


@numba.njit(nogil=True, cache=True)
def _first_bad_row(rows: npt.NDArray[np.float32], tolerance: float) -> int:
    """Index of the first row of `rows` (m x 3) that is not a probability vector (each value in [0, 1],
    the sum within `tolerance` of 1; NaN fails both), or -1. Blocks counted branch-free first."""
    m = rows.shape[0]
    for start in range(0, m, _BLOCK):
        stop = min(start + _BLOCK, m)
        bad: int | np.int32 = 0
        for i in range(start, stop):
            bad += np.int32(_row_is_bad(rows, i, tolerance))
        if bad:
            for i in range(start, stop):
                if _row_is_bad(rows, i, tolerance):
                    return i
    return -1


@numba.njit(nogil=True, cache=True)
def _group_counts(group: npt.NDArray[np.int32], n_groups: int) -> npt.NDArray[np.int64]:
    """Prompts per group (int64[n_groups]); `group` already checked to lie in -1..n_groups-1."""
    counts = np.zeros(n_groups, dtype=np.int64)
    for i in range(group.size):
        g = group[i]
        if g >= 0:
            counts[g] += 1
    return counts


@numba.njit(nogil=True, cache=True)
def _first_unpaired(
    n_obs: npt.NDArray[np.int32],
    last_state: npt.NDArray[np.int8],
    streak: npt.NDArray[np.int16],
    slot: npt.NDArray[np.int32],
) -> int:
    """Index of the first prompt whose n_obs > 0, last_state != 0 and slot >= 0 disagree (a prompt
    never observed has none of them and no streak), or -1."""
    for i in range(n_obs.size):
        seen = n_obs[i] > 0
        if (last_state[i] != 0) != seen or (slot[i] >= 0) != seen or (not seen and streak[i] != 0):
            return i
    return -1


@numba.njit(nogil=True, cache=True)
def _first_equal(values: npt.NDArray[np.int32], value: int) -> int:
    for i in range(values.size):
        if values[i] == value:
            return i
    return -1


@numba.njit(nogil=True, cache=True)
def _first_profiled_without_count(profiled: npt.NDArray[np.int8], samples: npt.NDArray[np.int32]) -> int:
    for i in range(profiled.size):
        if profiled[i] != 0 and samples[i] < 1:
            return i
    return -1


@numba.njit(nogil=True, cache=True)
def _first_frozen_unobserved(prior_n: npt.NDArray[np.int32], n_obs: npt.NDArray[np.int32]) -> int:
    for i in range(prior_n.size):
        if prior_n[i] != -1 and n_obs[i] == 0:
            return i
    return -1


def _range(
    name: str,
    values: np.ndarray,
    lo: float | np.floating[Any],
    hi: float | np.floating[Any],
    *,
    allow_nan: bool = False,
) -> None:
    flat = values.reshape(-1)
    kind = values.dtype.type  # bounds in the array's own type: compared without conversions
    i = int(_first_outside(flat, kind(lo), kind(hi), allow_nan))
    if i >= 0:
        where = ", ".join(map(str, np.unravel_index(i, values.shape)))
        extra = " or NaN (unknown)" if allow_nan else ""
        raise ValueError(f"{name}[{where}] = {flat[i].item()!r} is outside [{lo:g}, {hi:g}]{extra}")


def _check_prompts(ba: BeliefArrays) -> None:
    rules = ba.shared.rules
    for name, floor in (("alpha", rules.alpha0), ("beta", rules.beta0)):
        _range(f"belief array {name!r}", getattr(ba, name), floor * (1.0 - _ROUNDING), BELIEF_MAX)
    _range("belief array 'last_state'", ba.last_state, UNOBSERVED, SOLVED)
    _range("belief array 'n_obs'", ba.n_obs, 0, np.iinfo(np.int32).max)
    _range("belief array 'streak'", ba.streak, -STREAK_MAX, STREAK_MAX)
    _range("belief array 'pass_rate'", ba.pass_rate, 0.0, 1.0, allow_nan=True)
    _range("belief array 'prior_p0'", ba.prior_p0, 0.0, 1.0, allow_nan=True)
    _range("belief array 'group'", ba.group, -1, min(ba.shared.n_groups, MAX_GROUPS) - 1)
    for name in ("pass_samples", "prior_n"):
        _range(f"belief array {name!r}", getattr(ba, name), -1, PASS_SAMPLES_MAX)
        i = int(_first_equal(getattr(ba, name), 0))
        if i >= 0:
            raise ValueError(f"belief array {name!r}[{i}] = 0: a sample count is >= 1 (-1 = none)")
    _range("belief array 'profiled'", ba.profiled, 0, 1)
    i = int(_first_profiled_without_count(ba.profiled, ba.pass_samples))
    if i >= 0:
        raise ValueError(f"belief array 'profiled'[{i}] = 1 beside no sample count (pass_samples -1)")
    i = int(_first_frozen_unobserved(ba.prior_n, ba.n_obs))
    if i >= 0:
        raise ValueError(f"belief array 'prior_n'[{i}] = {int(ba.prior_n[i])} for a prompt never observed")
    i = int(_first_unpaired(ba.n_obs, ba.last_state, ba.streak, ba.hmm_slot))
    if i >= 0:
        raise ValueError(
            f"belief arrays disagree on whether prompt {i} was observed: n_obs {int(ba.n_obs[i])}, "
            f"last_state {int(ba.last_state[i])}, hmm_slot {int(ba.hmm_slot[i])}, streak {int(ba.streak[i])}"
        )


def _check_observed(ba: BeliefArrays) -> None:
    view = ba.observed_view()
    _range("belief array 'obs_d'", view["obs_d"], np.finfo(np.float32).tiny, np.finfo(np.float32).max)
    for name in ("obs_prior", "obs_prev"):
        i = int(_first_bad_row(view[name], _ROW_SUM_TOLERANCE))
        if i >= 0:
            raise ValueError(
                f"belief array {name!r}[{i}] = {view[name][i].tolist()} is not a DPS belief over three "
                "states (each in [0, 1], summing to 1)"
            )
    _range("belief array 'obs_state'", view["obs_state"], UNOBSERVED, SOLVED)


def _check_shared(ba: BeliefArrays) -> None:
    sh = ba.shared
    for name in ("pass_rate_known", "grouped", "greso_pos", "pass_samples_known", "profile_rollouts"):
        value = getattr(sh, name)
        if isinstance(value, bool) or not isinstance(value, int | np.integer):
            raise ValueError(f"shared state {name!r} = {plain(value)!r} is not an integer")
    known = int(np.count_nonzero(~np.isnan(ba.pass_rate)))
    if sh.pass_rate_known != known:
        raise ValueError(
            f"shared state 'pass_rate_known' = {sh.pass_rate_known}, but {known} prompts have a pass rate"
        )
    counted = int(np.count_nonzero(ba.pass_samples >= 1))
    if sh.pass_samples_known != counted:
        raise ValueError(
            f"shared state 'pass_samples_known' = {sh.pass_samples_known}, but {counted} prompts have a count"
        )
    spent = int(ba.pass_samples[(ba.profiled != 0) & (ba.pass_samples >= 1)].sum(dtype=np.int64))
    if sh.profile_rollouts != spent:
        raise ValueError(
            f"shared state 'profile_rollouts' = {sh.profile_rollouts}, but the profiled counts sum to {spent}"
        )
    if not 0 <= sh.greso_pos <= POSITION_MAX:
        raise ValueError(f"shared state 'greso_pos' = {sh.greso_pos} is outside [0, {POSITION_MAX}]")
    for name, lo, hi in (("p_easy", GRESO_P_MIN, GRESO_P_MAX), ("p_hard", GRESO_P_MIN, GRESO_P_MAX),
                         ("adarft_t", 0.0, 100.0)):  # fmt: skip
        value = getattr(sh, name)
        if not (isinstance(value, float) and lo <= value <= hi):
            raise ValueError(f"shared state {name!r} = {plain(value)!r} is outside [{lo:g}, {hi:g}]")
    counts = sh.step_counts
    _range("shared state 'step_counts'", counts, 0.0, BELIEF_MAX)
    if counts[1] > counts[0] or counts[2] > counts[0] or counts[3] > counts[4]:
        raise ValueError(
            f"shared state 'step_counts' = {counts.tolist()}: all-solved and all-failed results must "
            "not exceed the results, nor successes the trials"
        )
    sizes = _group_counts(ba.group, sh.n_groups)
    grouped = int(sizes.sum())
    if sh.grouped != grouped:
        raise ValueError(f"shared state 'grouped' = {sh.grouped}, but {grouped} prompts have a group")
    if not sh.n_groups:
        return
    bad = np.flatnonzero(sizes != sh.group_size)
    if bad.size:
        g = int(bad[0])
        raise ValueError(
            f"shared state 'group_size'[{g}] = {int(sh.group_size[g])}, but {int(sizes[g])} prompts are in group {g}"
        )
    _range("shared state 'group_trials'", sh.group_trials, 0.0, BELIEF_MAX)
    _range("shared state 'group_successes'", sh.group_successes, 0.0, BELIEF_MAX)
    bad = np.flatnonzero(~(sh.group_successes <= sh.group_trials))
    if bad.size:
        g = int(bad[0])
        raise ValueError(
            f"shared state 'group_successes'[{g}] = {plain(sh.group_successes[g])!r} exceeds its trials "
            f"{plain(sh.group_trials[g])!r}"
        )
    _range("shared state 'sec_q'", sh.sec_q, 0.0, 1.0 + _ROUNDING)
    _range("shared state 'sec_pos'", sh.sec_pos, 0, POSITION_MAX)
    _range("shared state 'step_adv_n'", sh.step_adv_n, 0, np.iinfo(np.int64).max)
    _range("shared state 'step_adv'", sh.step_adv, 0.0, BELIEF_MAX)
    bad = np.flatnonzero(~(sh.step_adv <= sh.step_adv_n * (1.0 + 1e-6)))
    if bad.size:
        g = int(bad[0])
        raise ValueError(
            f"shared state 'step_adv'[{g}] = {plain(sh.step_adv[g])!r} exceeds its {int(sh.step_adv_n[g])} results "
            "(each adds a mean |advantage| below 1)"
        )


def check_beliefs(ba: BeliefArrays) -> None:
    """Raises ValueError, naming the field, when any part of `ba` lies outside what the service can produce
    (module docstring). The observed set's bijection with the slot map is BeliefArrays.from_arrays'."""
    _check_prompts(ba)
    _check_observed(ba)
    _check_shared(ba)
    if not math.isfinite(ba.d0) or ba.d0 <= 0:
        raise ValueError(f"the Dirichlet prior count d0 = {ba.d0!r} must be finite and > 0")
