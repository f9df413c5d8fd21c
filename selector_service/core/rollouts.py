"""Rollout allocation: how many rollouts each selected prompt gets under a step's budget (docs/methods.md §8).

A select may carry a rollout budget: `budget` rollouts in all over its B prompts, each prompt between
`min_rollouts` and `max_rollouts`. A policy values each prompt's count n by a function V_i(n) of its Beta
belief Beta(alpha_i, beta_i) (the cold prior of docs/methods.md §6 for a prompt never observed), and the
counts maximise sum_i V_i(n_i) subject to sum_i n_i = budget and min <= n_i <= max:

    uniform    V_i(n) = 0: budget // B each, the remainder to prompts chosen by the seeded generator
    knapsack   Knapsack RL (arXiv 2509.25849): V(n) = (1 - p^n - q^n) p q^2 at the point estimate
               p = alpha / (alpha + beta), q = 1 - p
    variance   VIP (arXiv 2602.01601): V(n) = -(p q / (n - 1) + gamma n ln p), p the posterior mean
               clipped to [1e-6, 1 - 1e-6], gamma = 7e-4; V(1) = -inf (RLOO needs two rollouts)
    posterior  (ours) V(n) = E[1 - p^n - q^n] under Beta(alpha, beta), the probability that a group of
               n is mixed (value "mixed", the default), or the posterior expectation of Knapsack RL's
               value, E[(1 - p^n - q^n) p q^2] (value "knapsack"); exact Beta moments

How the counts are found (ours). Write g_i(n) = V_i(n + 1) - V_i(n), the gain of the (n+1)-th rollout.
Every value above is concave in n: g_i is non-increasing (docs/methods.md §8 proves it for each). For
separable concave values under one budget, taking the R = budget - B * min largest gains
{g_i(n): min <= n < max} is optimal (the greedy marginal allocation, exact here, no dynamic program
needed): any other choice swaps a taken gain for one no larger. The kernels:

1. `gain_table`: g_i(min + j) for j = 0..L-1 (L = min(max - min, R)) from recurrences with + - * /
   only (plus one log per prompt for VIP), then a running minimum along each row, so rounding can never
   make a row increase (it changes a value only where the computed gains broke monotonicity by a
   rounding error). Levels at or past R are never needed: a prompt takes at most R gains.
2. `allocate_gains`: the R-th largest gain b (bisection on the 64-bit order keys of the floats, with a
   binary search per row: rows are non-increasing), every gain > b taken, then the gains equal to b in
   the tie order: lower count first (the step to n + 1 before the step to n + 2, of any prompt), then
   the prompt with the larger seeded key `rng.bits_at(prompt ids)`, then the lower prompt id, then
   the earlier position. The tie order is a total order, and it keeps each prompt's taken gains a prefix
   of its row, so the counts are well defined.

So every count lies in [min, max], the counts sum to `budget` exactly, and they are a function of the
beliefs, the prompt ids, the request and the stream (dataset, step, seed): no float tie is broken by
accident, and nothing depends on the numpy version (numba kernels, IEEE arithmetic without fastmath; VIP's
ln p is the platform's log, as rng.py's draws are). `uniform` takes the same tie order with every gain
equal, which is budget // B each and the remainder to the prompts with the largest keys.

Memory: the gain table holds B * L float64 (L as above); a request with B * L > TABLE_MAX is refused
(`check_rollouts`), `uniform` needs no table.

The API (everything below takes and returns numpy arrays, one entry per selected prompt):

    check_rollouts(batch_size, budget, min_rollouts=1, max_rollouts=None, policy="posterior")
        -> RolloutRequest, or RolloutError naming the fix
    RolloutRequest.allocate(alpha, beta, ids, *, rng, value="mixed") -> int64 counts (checked already)
    allocate_rollouts(alpha, beta, ids, *, budget, min_rollouts, max_rollouts, policy, rng, value="mixed")
        -> int64 counts: check_rollouts, then allocate
    gain_table(alpha, beta, *, min_rollouts, levels, policy, value="mixed") -> float64[B, levels]
    allocate_gains(gains, *, budget, min_rollouts, tie_keys, ids) -> int64 counts
    mixed_probability(alpha, beta, n)      E[1 - p^n - q^n] under Beta(alpha, beta), exact
    knapsack_value(p, n)                   Knapsack RL's (1 - p^n - q^n) p q^2 at a point p
    vip_objective(p, n)                    VIP's p q / (n - 1) + gamma n ln p (clipped p; to minimise)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numba
import numpy as np
import numpy.typing as npt

from rlvr_selector_client.contract import DEFAULT_ROLLOUT_POLICY, ROLLOUT_POLICIES, rollout_problems

from .domain import K_MAX
from .rng import Stream

__all__ = [
    "DEFAULT_ROLLOUT_POLICY",
    "POSTERIOR_VALUES",
    "ROLLOUT_POLICIES",
    "ROLLOUT_POLICY_HELP",
    "TABLE_MAX",
    "VIP_CLIP",
    "VIP_GAMMA",
    "RolloutError",
    "RolloutRequest",
    "allocate_gains",
    "allocate_rollouts",
    "check_rollouts",
    "gain_table",
    "knapsack_value",
    "mixed_probability",
    "vip_objective",
]

#: What each policy of the contract's ROLLOUT_POLICIES maximises, in their order.
ROLLOUT_POLICY_HELP: dict[str, str] = {
    "posterior": "each prompt's probability that its group is mixed, E[1 - p^n - (1-p)^n] under its Beta "
    "belief (cold prior for a never-observed prompt): greedy on the exact marginal gains",
    "knapsack": "Knapsack RL's value (1 - p^n - (1-p)^n) p (1-p)^2 at the posterior mean p",
    "variance": "VIP: minimises sum p(1-p)/(n-1) + 7e-4 n ln p at the posterior mean p (clipped to "
    "[1e-6, 1 - 1e-6]); every prompt gets 2 before any gets 3 when the budget allows",
    "uniform": "budget // batch_size each; the remainder to prompts drawn by the seeded generator",
}
#: The values `posterior` can maximise: the mixed-group probability (the default) or Knapsack RL's value.
POSTERIOR_VALUES = ("mixed", "knapsack")
#: Most gains one allocation holds (B * min(max - min, budget - B * min) float64: 32 MiB).
TABLE_MAX = 1 << 22
#: VIP's per-rollout weight gamma (RLOO rule) and the clip of its success rates.
VIP_GAMMA = 7e-4
VIP_CLIP = 1e-6

_UNIFORM, _KNAPSACK, _VARIANCE, _POSTERIOR = range(4)
_CODES = {"uniform": _UNIFORM, "knapsack": _KNAPSACK, "variance": _VARIANCE, "posterior": _POSTERIOR}
_MIXED, _KNAPSACK_VALUE = range(2)


class RolloutError(ValueError):
    """A rollout budget that cannot be served; the message names the field and the fix."""


@dataclass(frozen=True)
class RolloutRequest:
    """A checked rollout budget: `budget` rollouts over a batch, each prompt in [min_rollouts, max_rollouts]."""

    budget: int
    min_rollouts: int
    max_rollouts: int
    policy: str

    def levels(self, batch_size: int) -> int:
        """Columns of the gain table: the steps above min_rollouts that one prompt can take."""
        return min(self.max_rollouts - self.min_rollouts, self.budget - batch_size * self.min_rollouts)

    def allocate(
        self, alpha: np.ndarray, beta: np.ndarray, ids: np.ndarray, *, rng: Stream, value: str = "mixed"
    ) -> np.ndarray:
        """Rollouts per prompt (int64[B], in the order of `ids`) of a batch of the size this request was
        checked for (check_rollouts), from the prompts' Beta beliefs (alpha[i], beta[i]). `rng` seeds
        the tie keys (`rng.bits_at(ids)`; the service passes stream(dataset, step, seed, "rollouts")).
        `value` chooses what `posterior` maximises: "mixed" (the probability of a mixed group) or
        "knapsack" (the posterior expectation of Knapsack RL's value)."""
        alpha, beta = _beta_arrays(alpha, beta)
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        if ids.shape != alpha.shape:
            raise ValueError("ids must have one entry per prompt (alpha's length)")
        if not isinstance(rng, Stream):
            raise TypeError("rng must be a core.rng.Stream, e.g. stream(dataset, step, seed, 'rollouts')")
        if ids.size and int(ids.min()) < 0:
            raise ValueError("ids must be >= 0")
        value_code = _value_code(value)
        tie_keys = rng.bits_at(ids)
        if self.policy == "uniform":
            return _uniform_counts(ids.size, self.budget, tie_keys, ids)
        levels = self.levels(ids.size)
        if levels == 0:  # min == max, or the budget is batch x min: every prompt gets min
            return np.full(ids.size, self.min_rollouts, dtype=np.int64)
        if self.budget == ids.size * self.max_rollouts:
            return np.full(ids.size, self.max_rollouts, dtype=np.int64)
        gains = np.empty((ids.size, levels), dtype=np.float64)
        _gains_kernel(
            alpha,
            beta,
            self.min_rollouts,
            levels,
            _CODES[self.policy],
            value_code,
            VIP_GAMMA,
            VIP_CLIP,
            gains,
        )
        return allocate_gains(
            gains, budget=self.budget, min_rollouts=self.min_rollouts, tie_keys=tie_keys, ids=ids
        )


def _whole(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise RolloutError(f"rollouts.{name} must be an integer, got {value!r}")
    return int(value)


def check_rollouts(
    batch_size: int,
    budget: int,
    min_rollouts: int = 1,
    max_rollouts: int | None = None,
    policy: str = DEFAULT_ROLLOUT_POLICY,
) -> RolloutRequest:
    """The checked request for a batch of `batch_size` prompts (max_rollouts None: the K limit, K_MAX);
    raises RolloutError with a message that says what to change."""
    batch_size = _whole("batch_size", batch_size)
    budget = _whole("budget", budget)
    lo = _whole("min", min_rollouts)
    hi = K_MAX if max_rollouts is None else _whole("max", max_rollouts)
    if policy not in ROLLOUT_POLICIES:
        raise RolloutError(f"unknown rollout policy {policy!r}; choose one of {', '.join(ROLLOUT_POLICIES)}")
    if batch_size < 1:
        raise RolloutError(f"batch_size must be >= 1, got {batch_size}")
    broken = rollout_problems(budget, lo, hi, batch_size, limit=K_MAX)
    if broken:
        raise RolloutError(
            {
                "min": f"rollouts.min is {lo}: every prompt needs at least 1 rollout (min >= 1)",
                "limit": f"rollouts.max is {hi}: it must be at most the K limit {K_MAX}",
                "order": f"rollouts.min ({lo}) is above rollouts.max ({hi}): lower min or raise max",
                "below": f"rollouts.budget {budget} is below batch_size x min = {batch_size} x {lo} = "
                f"{batch_size * lo}: raise the budget to at least {batch_size * lo}, or lower min or batch_size",
                "above": f"rollouts.budget {budget} is above batch_size x max = {batch_size} x {hi} = "
                f"{batch_size * hi}: lower the budget to at most {batch_size * hi}, or raise max (at most "
                f"{K_MAX}) or batch_size",
            }[broken[0]]
        )
    request = RolloutRequest(budget, lo, hi, policy)
    levels = request.levels(batch_size)
    if policy != "uniform" and batch_size * levels > TABLE_MAX:
        raise RolloutError(
            f"rollouts: batch_size x min(max - min, budget - batch_size x min) = {batch_size} x {levels} = "
            f"{batch_size * levels} marginal gains, over the {TABLE_MAX} one allocation holds: lower max, "
            "batch_size or the budget, or use policy uniform"
        )
    return request


# ---------------------------------------------------------------- gains (numba)


@numba.njit(nogil=True, cache=True)
def _gains_kernel(
    alpha: npt.NDArray[np.float64],
    beta: npt.NDArray[np.float64],
    lo: int,
    levels: int,
    policy: int,
    value: int,
    gamma: float,
    clip: float,
    out: npt.NDArray[np.float64],
) -> None:
    """out[i, j] = g_i(lo + j), the gain of the (lo + j + 1)-th rollout of prompt i, then a running
    minimum along each row. Moments from rising-factorial ratios: E[p^n] = prod_{k<n} (a+k)/(s+k)."""
    for i in range(alpha.size):
        a = alpha[i]
        b = beta[i]
        s = a + b
        if policy == _KNAPSACK:
            p = a / s
            q = b / s
            w = p * q * q
            pn = 1.0
            qn = 1.0
            for _ in range(lo):
                pn *= p
                qn *= q
            for j in range(levels):
                out[i, j] = w * (pn * q + qn * p)  # V(n+1) - V(n) = w (p^n q + q^n p)
                pn *= p
                qn *= q
        elif policy == _VARIANCE:
            p = a / s
            q = b / s  # not 1 - p: near p = 1 that would lose q's digits, and ln p with them
            if p < clip:
                p, q = clip, 1.0 - clip
            elif q < clip:
                p, q = 1.0 - clip, clip
            var = p * q
            # VIP's per-rollout term gamma ln p: <= 0, a bonus that grows with the difficulty
            cost = gamma * (math.log(p) if p < 0.5 else math.log1p(-q))
            for j in range(levels):
                n = np.float64(lo + j)
                out[i, j] = math.inf if n < 2.0 else var / (n * (n - 1.0)) - cost
        elif policy == _POSTERIOR:
            pn = 1.0  # E[p^n]
            qn = 1.0  # E[q^n]
            for k in range(lo):
                pn *= (a + k) / (s + k)
                qn *= (b + k) / (s + k)
            for j in range(levels):
                n = np.float64(lo + j)
                if value == _MIXED:
                    # E[p^n q] + E[q^n p] = (E[p^n] b + E[q^n] a) / (s + n)
                    g = pn * (b / (s + n)) + qn * (a / (s + n))
                else:
                    # E[p^(n+1) q^3] + E[p^2 q^(n+2)], every factor a ratio <= 1 (no overflow)
                    p1 = pn * ((a + n) / (s + n))
                    t1 = p1 * (b / (s + n + 1.0)) * ((b + 1.0) / (s + n + 2.0)) * ((b + 2.0) / (s + n + 3.0))
                    q2 = qn * ((b + n) / (s + n)) * ((b + n + 1.0) / (s + n + 1.0))
                    t2 = q2 * (a / (s + n + 2.0)) * ((a + 1.0) / (s + n + 3.0))
                    g = t1 + t2
                out[i, j] = g
                pn *= (a + n) / (s + n)
                qn *= (b + n) / (s + n)
        else:
            for j in range(levels):
                out[i, j] = 0.0
        for j in range(1, levels):
            if out[i, j] > out[i, j - 1]:
                out[i, j] = out[i, j - 1]


def _beta_arrays(alpha: npt.ArrayLike, beta: npt.ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    alpha = np.ascontiguousarray(alpha, dtype=np.float64)
    beta = np.ascontiguousarray(beta, dtype=np.float64)
    if alpha.ndim != 1 or alpha.shape != beta.shape:
        raise ValueError("alpha and beta must be 1-d arrays of one length")
    with np.errstate(over="ignore", invalid="ignore"):
        if alpha.size and not (np.all(alpha > 0) and np.all(beta > 0) and np.all(np.isfinite(alpha + beta))):
            raise ValueError("Beta parameters must be > 0 with a finite sum")
    return alpha, beta


def _policy_code(policy: str) -> int:
    code = _CODES.get(policy)
    if code is None:
        raise RolloutError(f"unknown rollout policy {policy!r}; choose one of {', '.join(ROLLOUT_POLICIES)}")
    return code


def _value_code(value: str) -> int:
    if value not in POSTERIOR_VALUES:
        raise ValueError(f"value must be one of {POSTERIOR_VALUES}, got {value!r}")
    return _MIXED if value == "mixed" else _KNAPSACK_VALUE


def gain_table(
    alpha: np.ndarray,
    beta: np.ndarray,
    *,
    min_rollouts: int,
    levels: int,
    policy: str = DEFAULT_ROLLOUT_POLICY,
    value: str = "mixed",
) -> np.ndarray:
    """float64[B, levels]: row i holds g_i(min_rollouts + j) = V_i(min_rollouts + j + 1) - V_i(min_rollouts
    + j) for j = 0..levels-1, made non-increasing by a running minimum (module docstring). `value`
    chooses what `posterior` maximises ("mixed" or "knapsack")."""
    alpha, beta = _beta_arrays(alpha, beta)
    if not (isinstance(min_rollouts, int | np.integer) and 1 <= min_rollouts <= K_MAX):
        raise ValueError(f"min_rollouts must be an integer in [1, {K_MAX}], got {min_rollouts!r}")
    if not (isinstance(levels, int | np.integer) and 0 <= levels <= K_MAX - min_rollouts):
        raise ValueError(f"levels must be an integer in [0, {K_MAX - min_rollouts}], got {levels!r}")
    out = np.empty((alpha.size, int(levels)), dtype=np.float64)
    _gains_kernel(
        alpha,
        beta,
        int(min_rollouts),
        int(levels),
        _policy_code(policy),
        _value_code(value),
        VIP_GAMMA,
        VIP_CLIP,
        out,
    )
    return out


# ---------------------------------------------------------------- the R largest gains (numba)

_SIGN = np.uint64(1 << 63)
_ONE = np.uint64(1)
_TWO = np.uint64(2)
_ZERO_KEY = _SIGN  # the key of +0.0 (and of -0.0)


@numba.njit(nogil=True, cache=True, inline="always")
def _key_of(bits: np.uint64) -> np.uint64:
    """uint64 that sorts like the float64 with these bits (NaN excluded); -0.0 is keyed as +0.0."""
    if bits == _SIGN:  # -0.0
        return _ZERO_KEY
    if bits & _SIGN:
        return ~bits
    return bits | _SIGN


@numba.njit(nogil=True, cache=True, inline="always")
def _bits_of(key: np.uint64) -> np.uint64:
    """The bits of the float64 whose key this is (the inverse of _key_of, +0.0 for the zero key)."""
    if key & _SIGN:
        return key ^ _SIGN
    return ~key


@numba.njit(nogil=True, cache=True)
def _count_ge(gains: npt.NDArray[np.float64], x: float) -> int:
    """Gains >= x over rows that are non-increasing: a binary search per row."""
    total = 0
    width = gains.shape[1]
    for i in range(gains.shape[0]):
        lo = 0
        hi = width
        while lo < hi:  # first column whose gain is < x
            mid = (lo + hi) // 2
            if gains[i, mid] >= x:
                lo = mid + 1
            else:
                hi = mid
        total += lo
    return total


@numba.njit(nogil=True, cache=True)
def _kth_largest(gains: npt.NDArray[np.float64], r: int) -> float:
    """The r-th largest gain (1 <= r <= gains.size, rows non-increasing, no NaN): the largest t with
    at least r gains >= t, by bisection over the order keys of the floats (at most 64 rounds)."""
    buf = np.empty(1, dtype=np.float64)
    ubuf = buf.view(np.uint64)
    width = gains.shape[1]
    top = gains[0, 0]
    bottom = gains[0, width - 1]
    for i in range(1, gains.shape[0]):
        top = max(top, gains[i, 0])
        bottom = min(bottom, gains[i, width - 1])
    buf[0] = bottom
    lo = _key_of(ubuf[0])
    buf[0] = top
    hi = _key_of(ubuf[0])
    while lo < hi:  # invariant: at least r gains >= value(lo), fewer than r gains > value(hi)
        mid = lo + (hi - lo + _ONE) // _TWO
        ubuf[0] = _bits_of(mid)
        if _count_ge(gains, buf[0]) >= r:
            lo = mid
        else:
            hi = mid - _ONE
    ubuf[0] = _bits_of(lo)
    kth: float = buf[0]
    return kth


@numba.njit(nogil=True, cache=True)
def _split_at(
    gains: npt.NDArray[np.float64], b: float, above: npt.NDArray[np.int64], tied: npt.NDArray[np.int64]
) -> None:
    """Per row: gains > b (a prefix) and gains == b (the run right after it)."""
    width = gains.shape[1]
    for i in range(gains.shape[0]):
        j = 0
        while j < width and gains[i, j] > b:
            j += 1
        above[i] = j
        while j < width and gains[i, j] == b:
            j += 1
        tied[i] = j - above[i]


def _tie_order(candidates: np.ndarray, tie_keys: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """`candidates` (positions) in the tie order: larger key first, then lower id, then lower position."""
    order: np.ndarray = candidates[np.lexsort((candidates, ids[candidates], ~tie_keys[candidates]))]
    return order


def _check_counts(name: str, batch: int, budget: object, min_rollouts: object) -> tuple[int, int]:
    budget, lo = _whole("budget", budget), _whole("min", min_rollouts)
    if lo < 1 or budget < batch * lo:
        raise ValueError(f"{name}: budget {budget} below batch x min = {batch} x {lo}, or min < 1")
    return budget, lo


def allocate_gains(
    gains: np.ndarray, *, budget: int, min_rollouts: int, tie_keys: np.ndarray, ids: np.ndarray
) -> np.ndarray:
    """Counts (int64[B]) from a gain table (`gain_table`: rows non-increasing, no NaN): min_rollouts
    each plus the R = budget - B * min_rollouts largest gains in the tie order of the module docstring.
    R must not exceed the table's size. `tie_keys` (uint64[B]) and `ids` (int64[B]) order equal gains."""
    gains = np.ascontiguousarray(gains, dtype=np.float64)
    if gains.ndim != 2:
        raise ValueError("gains must be a 2-d array (one row per prompt)")
    batch, width = gains.shape
    budget, lo = _check_counts("allocate_gains", batch, budget, min_rollouts)
    tie_keys = np.ascontiguousarray(tie_keys, dtype=np.uint64)
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    if tie_keys.shape != (batch,) or ids.shape != (batch,):
        raise ValueError(f"tie_keys and ids must have one entry per row ({batch})")
    r = budget - batch * lo
    counts = np.full(batch, lo, dtype=np.int64)
    if r == 0:
        return counts
    if r > batch * width:
        raise ValueError(f"the budget needs {r} gains above min_rollouts; the table holds {batch * width}")
    if np.isnan(gains).any():
        raise ValueError("gains contain NaN")
    b = _kth_largest(gains, r)
    above = np.empty(batch, dtype=np.int64)
    tied = np.empty(batch, dtype=np.int64)
    _split_at(gains, b, above, tied)
    need = r - int(above.sum())  # 1 <= need <= tied.sum(), since b is the r-th largest
    # Tied gains sit at levels above[i] .. above[i] + tied[i] - 1; take them level by level.
    has = tied > 0
    steps = np.zeros(width + 1, dtype=np.int64)  # +1 where a prompt's run of ties starts, -1 past its end
    np.add.at(steps, above[has], 1)
    np.add.at(steps, above[has] + tied[has], -1)
    cumulative = np.cumsum(np.cumsum(steps[:width]))  # tied gains at levels <= l
    level = int(np.searchsorted(cumulative, need))  # the level where the need is met
    before = int(cumulative[level - 1]) if level else 0
    counts += above + np.clip(level - above, 0, tied)
    at_level = np.flatnonzero(has & (above <= level) & (level < above + tied))
    chosen = _tie_order(at_level, tie_keys, ids)[: need - before]
    counts[chosen] += 1
    return counts


def _uniform_counts(batch: int, budget: int, tie_keys: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """budget // batch each, one more for the budget % batch prompts first in the tie order."""
    counts = np.full(batch, budget // batch, dtype=np.int64)
    rest = budget % batch
    if rest:
        counts[_tie_order(np.arange(batch), tie_keys, ids)[:rest]] += 1
    return counts


def allocate_rollouts(
    alpha: np.ndarray,
    beta: np.ndarray,
    ids: np.ndarray,
    *,
    budget: int,
    min_rollouts: int = 1,
    max_rollouts: int = K_MAX,
    policy: str = DEFAULT_ROLLOUT_POLICY,
    rng: Stream,
    value: str = "mixed",
) -> np.ndarray:
    """Rollouts per prompt (int64[B], in the order of `ids`) for B prompts with Beta beliefs (alpha[i],
    beta[i]) and prompt ids `ids` (distinct in a select; any int64 here), under `budget` rollouts in all,
    each in [min_rollouts, max_rollouts], by `policy` (module docstring): RolloutRequest.allocate of the
    request check_rollouts makes of them (RolloutError when it refuses it)."""
    request = check_rollouts(np.size(ids), budget, min_rollouts, max_rollouts, policy)
    return request.allocate(alpha, beta, ids, rng=rng, value=value)


# ---------------------------------------------------------------- the values themselves


def mixed_probability(alpha: np.ndarray, beta: np.ndarray, n: np.ndarray) -> np.ndarray:
    """E[1 - p^n - (1-p)^n] under Beta(alpha, beta), per prompt: the probability that a group of n
    rollouts has both a success and a failure (float64; n integers in [1, K_MAX]). The sum of the gains
    g(1) .. g(n-1) of `posterior` (a group of one is never mixed), so it is exactly what that policy
    maximises, without cancellation; O(n) per prompt and no table, for any number of prompts."""
    alpha, beta = _beta_arrays(alpha, beta)
    n = np.ascontiguousarray(n, dtype=np.int64)
    if n.shape != alpha.shape or (n.size and (int(n.min()) < 1 or int(n.max()) > K_MAX)):
        raise ValueError(f"n must hold one integer in [1, {K_MAX}] per prompt")
    out = np.empty(alpha.size, dtype=np.float64)
    _mixed_kernel(alpha, beta, n, out)
    return out


@numba.njit(nogil=True, cache=True)
def _mixed_kernel(
    alpha: npt.NDArray[np.float64],
    beta: npt.NDArray[np.float64],
    counts: npt.NDArray[np.int64],
    out: npt.NDArray[np.float64],
) -> None:
    """out[i] = g(1) + ... + g(counts[i] - 1), the mixed-group gains of `posterior` (no running minimum:
    the exact values), summed in order."""
    for i in range(alpha.size):
        a = alpha[i]
        b = beta[i]
        s = a + b
        pn = a / s  # E[p^1]
        qn = b / s
        total = 0.0
        for j in range(counts[i] - 1):
            m = np.float64(1 + j)
            total += pn * (b / (s + m)) + qn * (a / (s + m))
            pn *= (a + m) / (s + m)
            qn *= (b + m) / (s + m)
        out[i] = total


def knapsack_value(p: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Knapsack RL's value of n rollouts at success rate p: (1 - p^n - (1-p)^n) p (1-p)^2 (float64)."""
    p = np.asarray(p, dtype=np.float64)
    n = np.asarray(n, dtype=np.float64)
    q = 1.0 - p
    value: np.ndarray = (1.0 - p**n - q**n) * p * q * q
    return value


def vip_objective(p: np.ndarray, n: np.ndarray) -> np.ndarray:
    """VIP's objective term (RLOO rule) for n rollouts at success rate p, to be minimised:
    p q / (n - 1) + gamma n ln p with p clipped to [1e-6, 1 - 1e-6] (float64; +inf at n = 1)."""
    p = np.clip(np.asarray(p, dtype=np.float64), VIP_CLIP, 1.0 - VIP_CLIP)
    n = np.asarray(n, dtype=np.float64)
    with np.errstate(divide="ignore"):
        variance = np.where(n > 1, p * (1.0 - p) / np.maximum(n - 1.0, 0.0), np.inf)
    objective: np.ndarray = variance + VIP_GAMMA * n * np.log(p)
    return objective
