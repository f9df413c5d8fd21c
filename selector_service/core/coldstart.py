"""Cold start (docs/methods.md §6): per-prompt metadata, group rates, cold priors and priors frozen at a prompt's
first observation.

Per-prompt metadata (BeliefArrays fields, set by `apply_metadata`, a log record in the service):

    pass_rate     f32[N]  a reference model's pass rate in [0, 1]; NaN = unknown
    pass_samples  i32[N]  the samples that rate was measured from, 1..PASS_SAMPLES_MAX; NO_SAMPLES (-1) =
                          unknown (the rate then weighs the dataset's prior_strength)
    profiled      i8[N]   1: those samples were rolled out for this run (profiling rollouts), 0: shipped
    group         i32[N]  category 0..MAX_GROUPS-1; NO_GROUP (-1) = none

and per prompt, at its first observation, `prior_p0` (f64[N]) and `prior_n` (i32[N]) freeze the prior
pass rate its Beta prior is built from (NaN: none, the plain Beta(alpha0, beta0)) and the samples it
weighs (NO_SAMPLES: the dataset's prior_strength).

With alpha0, beta0 the dataset's Beta prior, s its `prior_strength`, gamma its `group_decay`:

    S_g, T_g   decayed sums of the successes and trials of every result of a prompt of group g
               (added when the result is applied, multiplied by gamma at every step close)
    m_g        (alpha0 + S_g) / (alpha0 + beta0 + T_g)                       group rate
    p0_i       pass_rate_i if known, else m_g of its group if it has one, else none
    s_i        pass_samples_i when pass_rate_i is known and has a count, else s
    cold prior Beta(alpha0 + s_i p0_i, beta0 + s_i (1 - p0_i)); Beta(alpha0, beta0) without p0_i

So a rate r measured from n samples is the posterior of n samples, r n of them successes, from the
dataset's prior: 3/8 and 30/80 have the same mean and differ in weight. A never-observed prompt's Beta is
its cold prior, computed when it is scored (`beta_for`), so it costs no state until the prompt is
observed. At the first observation the cold prior is frozen into `prior_p0` and `prior_n`, and
(alpha0_i, beta0_i) = (alpha0 + s_i p0_i, beta0 + s_i (1 - p0_i)) replace (alpha0, beta0) in the Beta
update (beliefs.apply_results): results are applied in request order, so a frozen prior sees the group
sums of every result before it, earlier results of the same request included.

Profiling (docs/api.md section 2): the dataset's profiling rollouts are the sum of pass_samples_i over
the prompts whose count was uploaded as profiled (`SharedState.profile_rollouts`, kept by
`apply_metadata`): an upload sets each prompt's count and flag, so sending it again changes nothing.

The group sums and the metadata counts live in the dataset's SharedState (shared.py), beside the rules
(alpha0, beta0, s, gamma) they are read with.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numba
import numpy as np
import numpy.typing as npt
from numba import prange

from ._parallel import CHUNK, PARALLEL_MIN, launch
from .beliefs import NO_GROUP, NO_SAMPLES, BeliefArrays
from .domain import MAX_GROUPS, PASS_SAMPLES_MAX, plain
from .mi import _check_ids
from .shared import SharedState

#: A Beta score function of scores.py / mi.py: (alpha, beta, ids or None, out or None) -> float64 scores.
ScoreFn = Callable[[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None], np.ndarray]
#: The per-prompt arrays the prior kernel reads: alpha, beta, n_obs, prior_p0, pass_rate, group,
#: pass_samples.
_PriorSource = tuple[
    npt.NDArray[np.float64],
    npt.NDArray[np.float64],
    npt.NDArray[np.int32],
    npt.NDArray[np.float64],
    npt.NDArray[np.float32],
    npt.NDArray[np.int32],
    npt.NDArray[np.int32],
]
#: ... and those the live pass-rate kernel reads: alpha, beta, n_obs, pass_rate, group.
_LiveSource = tuple[
    npt.NDArray[np.float64],
    npt.NDArray[np.float64],
    npt.NDArray[np.int32],
    npt.NDArray[np.float32],
    npt.NDArray[np.int32],
]

__all__ = [
    "apply_metadata",
    "beta_for",
    "beta_scores",
    "group_rates",
    "group_statistics",
    "has_cold_priors",
    "live_pass_rates",
    "prior_arrays",
    "prior_pass_rates",
]


def has_cold_priors(shared: SharedState) -> bool:
    """True when some never-observed prompt may have a prior other than Beta(alpha0, beta0)."""
    return shared.pass_rate_known > 0 or shared.grouped > 0


def group_rates(shared: SharedState) -> np.ndarray:
    """m_g = (alpha0 + S_g) / (alpha0 + beta0 + T_g) for every group (float64[n_groups])."""
    r = shared.rules
    return (r.alpha0 + shared.group_successes) / (r.alpha0 + r.beta0 + shared.group_trials)


# ---------------------------------------------------------------- metadata


def _check_offset(offset: Any, length: int, n: int) -> int:
    if isinstance(offset, bool) or not isinstance(offset, int | np.integer) or offset < 0:
        raise ValueError(f"offset must be an integer >= 0, got {offset!r}")
    if int(offset) + length > n:
        raise ValueError(
            f"metadata for prompts {offset}..{int(offset) + length - 1} runs past the dataset's last "
            f"prompt id {n - 1}"
        )
    return int(offset)


def _check_samples(raw_in: Any) -> np.ndarray:
    """int32 sample counts (NO_SAMPLES = unknown) from integers (-1 = unknown) or floats (NaN = unknown)
    with whole values; ValueError naming the first bad index."""
    raw = np.asarray(raw_in)
    if raw.ndim != 1 or not (np.issubdtype(raw.dtype, np.integer) or np.issubdtype(raw.dtype, np.floating)):
        raise ValueError(
            f"pass_samples must be a 1-d array of whole numbers, got dtype {raw.dtype}, shape {raw.shape}"
        )
    if np.issubdtype(raw.dtype, np.floating):
        with np.errstate(invalid="ignore"):
            unknown = np.isnan(raw)
            whole = unknown | ((raw == np.floor(raw)) & (np.abs(raw) <= PASS_SAMPLES_MAX))
        known = ~unknown
        values = np.where(unknown, NO_SAMPLES, np.where(whole, raw, 0)).astype(np.int64)
        bad = ~whole | (known & (values < 1))
    else:
        values = raw.astype(np.int64, copy=False)
        bad = (values != NO_SAMPLES) & ((values < 1) | (values > PASS_SAMPLES_MAX))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"pass_samples[{i}] = {plain(raw[i])!r}: a sample count is a whole number in 1..{PASS_SAMPLES_MAX} "
            f"({NO_SAMPLES} or null = unknown)"
        )
    return np.ascontiguousarray(values, dtype=np.int32)


class Metadata(NamedTuple):
    """A checked metadata upload (check_metadata): the prompts offset..offset+length-1, the arrays given
    (None: not sent), and whether its sample counts are profiling rollouts of this run."""

    offset: int
    pass_rate: np.ndarray | None
    group: np.ndarray | None
    pass_samples: np.ndarray | None = None
    profile: bool = False

    @property
    def length(self) -> int:
        given = next(a for a in (self.pass_rate, self.group, self.pass_samples) if a is not None)
        return int(given.size)


def check_metadata(
    n: int,
    offset: Any,
    pass_rate: np.ndarray | None,
    group: np.ndarray | None,
    pass_samples: np.ndarray | None = None,
    profile: bool = False,
) -> Metadata:
    """The validated upload (float32 pass rates, int32 groups, int32 sample counts) for prompts
    offset..offset+len-1 of a dataset of n prompts; raises ValueError saying what is out of range, naming
    the array and its first bad index. Pass rates: [0, 1] or NaN (unknown); groups: 0..MAX_GROUPS-1 or
    NO_GROUP; sample counts: whole numbers in 1..PASS_SAMPLES_MAX or NO_SAMPLES (NaN in a float array).
    The arrays given have one length; `profile` needs sample counts."""
    if pass_rate is None and group is None and pass_samples is None:
        raise ValueError("metadata needs pass_rate, pass_samples, group, or several of them")
    if not isinstance(profile, bool | np.bool_):
        raise ValueError(f"profile must be true or false, got {profile!r}")
    if profile and pass_samples is None:
        raise ValueError(
            "profile is true but pass_samples is missing: profile counts the samples behind the rates, "
            "send them as pass_samples"
        )
    lengths: dict[str, int] = {}
    if pass_rate is not None:
        raw = np.asarray(pass_rate)
        if raw.ndim != 1 or not (
            np.issubdtype(raw.dtype, np.floating) or np.issubdtype(raw.dtype, np.integer)
        ):
            raise ValueError(
                f"pass_rate must be a 1-d array of numbers, got dtype {raw.dtype}, shape {raw.shape}"
            )
        with np.errstate(invalid="ignore", over="ignore"):
            pass_rate = np.ascontiguousarray(raw, dtype=np.float32)
        # A float64 outside float32's range becomes inf: refused below like any other out-of-range value.
        known = ~np.isnan(pass_rate)
        bad = known & ~((pass_rate >= 0.0) & (pass_rate <= 1.0))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(
                f"pass_rate[{i}] = {plain(raw[i])!r}: pass rates must lie in [0, 1] (NaN/null = unknown)"
            )
        lengths["pass_rate"] = pass_rate.size
    if pass_samples is not None:
        pass_samples = _check_samples(pass_samples)
        lengths["pass_samples"] = pass_samples.size
    if group is not None:
        raw = np.asarray(group)
        if raw.ndim != 1 or not np.issubdtype(raw.dtype, np.integer):
            raise ValueError(f"group must be a 1-d integer array, got dtype {raw.dtype}, shape {raw.shape}")
        bad = (raw < NO_GROUP) | (raw >= MAX_GROUPS)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(
                f"group[{i}] = {int(raw[i])}: groups must lie in 0..{MAX_GROUPS - 1} ({NO_GROUP} = none)"
            )
        group = np.ascontiguousarray(raw, dtype=np.int32)
        lengths["group"] = group.size
    if len(set(lengths.values())) != 1:
        sizes = " and ".join(f"{name} {size}" for name, size in lengths.items())
        raise ValueError(f"the arrays differ in length ({sizes}): send one per prompt in each")
    length = next(iter(lengths.values()))
    if not length:
        raise ValueError("metadata arrays are empty: send at least one prompt's values")
    return Metadata(_check_offset(offset, length, n), pass_rate, group, pass_samples, bool(profile))


def apply_metadata(
    ba: BeliefArrays,
    offset: int,
    pass_rate: np.ndarray | None,
    group: np.ndarray | None,
    pass_samples: np.ndarray | None = None,
    profile: bool = False,
) -> None:
    """Sets the pass rates, sample counts (with whether they are profiling rollouts) and/or groups of
    prompts offset..offset+len-1 of `ba` (a BeliefArrays).

    Validates first (check_metadata); on error nothing changes. Frozen priors of prompts already observed
    are kept (docs/methods.md §6: a prior is frozen at the first observation). A group upload restarts SEC's
    per-category walks (ours: their member lists changed).
    """
    meta = check_metadata(ba.n, offset, pass_rate, group, pass_samples, profile)
    offset, pass_rate, group, pass_samples = meta.offset, meta.pass_rate, meta.group, meta.pass_samples
    sh = ba.shared
    if pass_rate is not None:
        end = offset + pass_rate.size
        old_known = int(np.count_nonzero(~np.isnan(ba.pass_rate[offset:end])))
        ba.pass_rate[offset:end] = pass_rate
        sh.pass_rate_known += int(np.count_nonzero(~np.isnan(pass_rate))) - old_known
    if pass_samples is not None:
        end = offset + pass_samples.size
        old, old_flag = ba.pass_samples[offset:end], ba.profiled[offset:end]
        counted = pass_samples >= 1
        sh.pass_samples_known += int(np.count_nonzero(counted)) - int(np.count_nonzero(old >= 1))
        old_cost = int(old[(old_flag != 0) & (old >= 1)].sum(dtype=np.int64))
        new_cost = int(pass_samples[counted].sum(dtype=np.int64)) if meta.profile else 0
        sh.profile_rollouts += new_cost - old_cost
        ba.pass_samples[offset:end] = pass_samples
        ba.profiled[offset:end] = counted if meta.profile else 0
    if group is not None:
        end = offset + group.size
        top = int(group.max())
        sh.grow(top + 1)
        old = ba.group[offset:end]
        old_in = old[old >= 0]
        new_in = group[group >= 0]
        sh.group_size -= np.bincount(old_in, minlength=sh.n_groups)[: sh.n_groups]
        sh.group_size += np.bincount(new_in, minlength=sh.n_groups)[: sh.n_groups]
        sh.grouped += int(new_in.size) - int(old_in.size)
        ba.group[offset:end] = group
        sh.sec_pos[:] = 0
        sh.members_cache = None
    sh.cold_version += 1


# ---------------------------------------------------------------- cold and frozen priors


@numba.njit(nogil=True, cache=True, inline="always")
def _live_p0(
    pass_rate: npt.NDArray[np.float32],
    group: npt.NDArray[np.int32],
    rates: npt.NDArray[np.float64],
    p: int | np.integer[Any],
) -> float:
    """p0 of docs/methods.md §6 now: the pass rate if known, else the group's rate, else NaN."""
    p0 = np.float64(pass_rate[p])
    if np.isnan(p0):
        g = group[p]
        if g >= 0:
            p0 = rates[g]
    return p0


@numba.njit(nogil=True, cache=True, inline="always")
def _live_strength(
    pass_rate: npt.NDArray[np.float32],
    pass_samples: npt.NDArray[np.int32],
    p: int | np.integer[Any],
    prior_strength: float,
) -> float:
    """s_i of docs/methods.md §6 now: the prompt's sample count when its pass rate is known and has one,
    else the dataset's prior_strength s (a group's rate always weighs s)."""
    n = pass_samples[p]
    if n >= 1 and not np.isnan(pass_rate[p]):
        return np.float64(n)
    return prior_strength


@numba.njit(nogil=True, cache=True, inline="always")
def cold_beta(
    src: _PriorSource,
    rates: npt.NDArray[np.float64],
    p: int | np.integer[Any],
    alpha0: float,
    beta0: float,
    prior_strength: float,
) -> tuple[float, float, float]:
    """(alpha, beta, p0) of prompt p as every Beta-family score reads it: its posterior and frozen p0 once
    observed, else its cold prior and live p0 (NaN: none)."""
    alpha, beta, n_obs, prior_p0, pass_rate, group, pass_samples = src
    if n_obs[p] > 0:
        return alpha[p], beta[p], prior_p0[p]
    p0 = _live_p0(pass_rate, group, rates, p)
    if np.isnan(p0):
        return alpha0, beta0, p0
    si = _live_strength(pass_rate, pass_samples, p, prior_strength)
    return alpha0 + si * p0, beta0 + si * (1.0 - p0), p0


@numba.njit(nogil=True, cache=True, inline="always")
def profile_beta(
    pass_rate: npt.NDArray[np.float32],
    pass_samples: npt.NDArray[np.int32],
    p: int | np.integer[Any],
    alpha0: float,
    beta0: float,
    prior_strength: float,
) -> tuple[float, float]:
    """The Beta of prompt p's uploaded profile alone (its pass rate and count; Beta(alpha0, beta0) without a
    rate), whatever was observed: what a static filter judges (docs/methods.md §9)."""
    r = np.float64(pass_rate[p])
    if np.isnan(r):
        return alpha0, beta0
    si = _live_strength(pass_rate, pass_samples, p, prior_strength)
    return alpha0 + si * r, beta0 + si * (1.0 - r)


@numba.njit(nogil=True, cache=True)
def _beta_range(
    src: _PriorSource,
    rates: npt.NDArray[np.float64],
    ids: npt.NDArray[np.int64],
    use_all: bool,
    alpha0: float,
    beta0: float,
    prior_strength: float,
    out_a: npt.NDArray[np.float64],
    out_b: npt.NDArray[np.float64],
    out_p0: npt.NDArray[np.float64],
    lo: int,
    hi: int,
) -> None:
    """Beta and prior p0 of prompts lo..hi-1 (cold_beta); src = (alpha, beta, n_obs, prior_p0,
    pass_rate, group, pass_samples)."""
    for i in range(lo, hi):
        p = i if use_all else ids[i]
        out_a[i], out_b[i], out_p0[i] = cold_beta(src, rates, p, alpha0, beta0, prior_strength)


@numba.njit(nogil=True, cache=True)
def _beta_serial(
    src: _PriorSource,
    rates: npt.NDArray[np.float64],
    ids: npt.NDArray[np.int64],
    use_all: bool,
    alpha0: float,
    beta0: float,
    prior_strength: float,
    out_a: npt.NDArray[np.float64],
    out_b: npt.NDArray[np.float64],
    out_p0: npt.NDArray[np.float64],
) -> None:
    _beta_range(src, rates, ids, use_all, alpha0, beta0, prior_strength, out_a, out_b, out_p0, 0, out_a.size)


@numba.njit(nogil=True, cache=True, parallel=True)
def _beta_parallel(
    src: _PriorSource,
    rates: npt.NDArray[np.float64],
    ids: npt.NDArray[np.int64],
    use_all: bool,
    alpha0: float,
    beta0: float,
    prior_strength: float,
    out_a: npt.NDArray[np.float64],
    out_b: npt.NDArray[np.float64],
    out_p0: npt.NDArray[np.float64],
) -> None:
    m = out_a.size
    for c in prange((m + CHUNK - 1) // CHUNK):
        lo = c * CHUNK
        _beta_range(
            src,
            rates,
            ids,
            use_all,
            alpha0,
            beta0,
            prior_strength,
            out_a,
            out_b,
            out_p0,
            lo,
            min(m, lo + CHUNK),
        )


def prior_source(ba: BeliefArrays) -> _PriorSource:
    """The per-prompt arrays `cold_beta` reads, in its order."""
    return (ba.alpha, ba.beta, ba.n_obs, ba.prior_p0, ba.pass_rate, ba.group, ba.pass_samples)


def _ids(ids: np.ndarray | None, n: int) -> tuple[np.ndarray, bool]:
    """The checked ids (mi._check_ids) and whether every prompt is meant (ids None)."""
    return _check_ids(ids, n), ids is None


def prior_arrays(ba: BeliefArrays, ids: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(alpha, beta, p0) per prompt of `ids` (None: all): the posterior of an observed prompt and the
    frozen p0 its prior was built from; a never-observed prompt's cold prior and its live p0 (NaN: none)."""
    ids, use_all = _ids(ids, ba.n)
    m = ba.n if use_all else ids.size
    out_a, out_b, out_p0 = np.empty(m), np.empty(m), np.empty(m)
    r = ba.shared.rules
    src = prior_source(ba)
    args = (
        src,
        group_rates(ba.shared),
        ids,
        use_all,
        r.alpha0,
        r.beta0,
        r.prior_strength,
        out_a,
        out_b,
        out_p0,
    )
    launch(_beta_serial, _beta_parallel, m, *args, threshold=PARALLEL_MIN)
    return out_a, out_b, out_p0


#: Prompts gathered at a time by `beta_scores` when it scores the whole dataset.
SCORE_CHUNK = 1 << 16


def beta_scores(
    ba: BeliefArrays, ids: np.ndarray | None, score_fn: ScoreFn, out: np.ndarray | None = None
) -> np.ndarray:
    """score_fn(alpha, beta, ids, out) over the Betas of `beta_for`, for `ids` (None: every prompt),
    written into `out` when given. For ids=None without cold priors the prior is scored once
    (_scores_around_the_prior); with cold priors the dataset is gathered and scored SCORE_CHUNK prompts
    at a time, so the only whole-dataset allocation is the result (8 bytes per prompt, none with `out`)."""
    if ids is None and not has_cold_priors(ba.shared):
        return _scores_around_the_prior(ba, score_fn, out)
    if ids is not None or ba.n <= SCORE_CHUNK:
        alpha, beta, sub = beta_for(ba, ids)
        return score_fn(alpha, beta, sub, out)
    if out is None:
        out = np.empty(ba.n)
    for lo in range(0, ba.n, SCORE_CHUNK):
        hi = min(lo + SCORE_CHUNK, ba.n)
        a, b, _ = prior_arrays(ba, np.arange(lo, hi, dtype=np.int64))
        score_fn(a, b, None, out[lo:hi])
    return out


def _scores_around_the_prior(ba: BeliefArrays, score_fn: ScoreFn, out: np.ndarray | None) -> np.ndarray:
    """Every prompt's score without cold priors, where most prompts still hold Beta(alpha0, beta0) (never
    observed): the prior's score computed once and written everywhere, then the others' scores. The same
    values as scoring every prompt (the score kernels are elementwise), for a pass of comparisons instead
    of N evaluations of the score: INSIGHT over 10^7 prompts, 256 observed, 0.024 s instead of 1.0 s."""
    alpha0, beta0 = ba.shared.rules.alpha0, ba.shared.rules.beta0
    others = np.flatnonzero((ba.alpha != alpha0) | (ba.beta != beta0))
    if others.size > ba.n // 2:
        return score_fn(ba.alpha, ba.beta, None, out)
    if out is None:
        out = np.empty(ba.n)
    out.fill(score_fn(np.array([alpha0]), np.array([beta0]), None, None)[0])
    if others.size:
        out[others] = score_fn(ba.alpha, ba.beta, others, None)
    return out


def beta_for(ba: BeliefArrays, ids: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The Beta every score uses, as (alpha, beta, ids) for the Beta score functions.

    Without metadata the stored arrays already are every prompt's Beta (a never-observed prompt holds
    Beta(alpha0, beta0)): returns (ba.alpha, ba.beta, ids) untouched, no copy. Otherwise returns the
    posteriors of observed prompts and the cold priors of the others gathered in the order of `ids`
    (None: every prompt), and None for ids.
    """
    if not has_cold_priors(ba.shared):
        return ba.alpha, ba.beta, ids
    a, b, _ = prior_arrays(ba, ids)
    return a, b, None


def prior_pass_rates(ba: BeliefArrays, ids: np.ndarray | None) -> np.ndarray:
    """The p0 each prompt's Beta prior is built from (float64, NaN = none): frozen at the first
    observation for observed prompts, the live p0 (pass rate, else group rate) for the others."""
    return prior_arrays(ba, ids)[2]


@numba.njit(nogil=True, cache=True)
def _live_kernel(
    src: _LiveSource,
    rates: npt.NDArray[np.float64],
    ids: npt.NDArray[np.int64],
    use_all: bool,
    alpha0: float,
    beta0: float,
    to_score: bool,
    target: float,
    out: npt.NDArray[np.float64],
) -> None:
    alpha, beta, n_obs, pass_rate, group = src
    for i in range(out.size):
        p = i if use_all else ids[i]
        p0 = _live_p0(pass_rate, group, rates, p)
        if np.isnan(p0):  # no metadata: the posterior mean (the cold prior's mean when never observed)
            p0 = alpha[p] / (alpha[p] + beta[p]) if n_obs[p] > 0 else alpha0 / (alpha0 + beta0)
        out[i] = -abs(100.0 * (1.0 - p0) - target) if to_score else p0


def live_pass_rates(ba: BeliefArrays, ids: np.ndarray | None, target: float | None = None) -> np.ndarray:
    """Per prompt (float64, in the order of `ids`; None = all): its pass rate if known, else its group's
    rate m_g, else its posterior mean (AdaRFT's difficulty source, docs/methods.md §7). With `target` T, returns
    AdaRFT's score -|100 (1 - p) - T| instead, computed in the same pass."""
    ids, use_all = _ids(ids, ba.n)
    out = np.empty(ba.n if use_all else ids.size)
    r = ba.shared.rules
    src = (ba.alpha, ba.beta, ba.n_obs, ba.pass_rate, ba.group)
    score = target is not None
    _live_kernel(
        src, group_rates(ba.shared), ids, use_all, r.alpha0, r.beta0, score, float(target or 0.0), out
    )
    return out


def _posterior_means(
    alpha: np.ndarray, beta: np.ndarray, ids: np.ndarray | None, out: np.ndarray | None
) -> np.ndarray:
    a, b = (alpha, beta) if ids is None else (alpha[ids], beta[ids])
    if out is None:
        means: np.ndarray = a / (a + b)
        return means
    np.divide(a, a + b, out=out)
    return out


def group_statistics(ba: BeliefArrays) -> dict[str, np.ndarray]:
    """Per group with at least one prompt (for monitoring): `group` ids, `size` (prompts), `observed_share`
    (share of them observed at least once), `posterior_mean` (mean over them of alpha / (alpha + beta),
    cold priors included) and `rate` (m_g). Empty arrays without groups. O(N)."""
    sh = ba.shared
    live = np.flatnonzero(sh.group_size > 0)
    if live.size == 0:
        empty = np.zeros(0)
        return {"group": live, "size": live, "observed_share": empty, "posterior_mean": empty, "rate": empty}
    grouped = ba.group >= 0
    groups = ba.group[grouped]
    counts = np.bincount(groups, minlength=sh.n_groups)
    observed = np.bincount(groups, weights=(ba.n_obs[grouped] > 0), minlength=sh.n_groups)
    means = beta_scores(ba, None, _posterior_means)[grouped]
    mean_sum = np.bincount(groups, weights=means, minlength=sh.n_groups)
    return {
        "group": live,
        "size": counts[live],
        "observed_share": observed[live] / counts[live],
        "posterior_mean": mean_sum[live] / counts[live],
        "rate": group_rates(sh)[live],
    }
