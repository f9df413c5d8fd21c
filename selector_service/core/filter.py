"""The filter (docs/methods.md §9): leave out of a batch the prompts whose belief says their next group is
almost surely all solved or all failed, the groups GRPO learns nothing from.

A prompt with Beta(a, b) belief over its success rate p is judged by the Beta-binomial predictive of a
group of k rollouts:

    P(all k succeed) = E[p^k]       = prod_{j<k} (a + j) / (a + b + j)
    P(all k fail)    = E[(1 - p)^k] = prod_{j<k} (b + j) / (a + b + j)

and dropped when the first is >= `solved` or the second >= `unsolved` (the first bound checked first).
Every factor lies in (0, 1], so each product only falls as j grows: the kernel stops as soon as it is
below its bound (a kept prompt costs a few divisions) and never overflows or loses its relative
accuracy (~k ulps) over the whole belief domain (core/domain.py: a, b in [1e-3, 1e300]).

The belief judged (`judge`): with `reprofile` (the default) the Beta every Beta-family score reads, the
posterior of an observed prompt and the cold prior of a never-observed one (coldstart.cold_beta), so
the run's outcomes move it; without, the prompt's uploaded profile alone (coldstart.profile_beta: its
pass rate with its sample count, Beta(alpha0, beta0) without a rate), a static filter.

How a select uses it (core/strategies.select): only the prompts a strategy would hand out are judged,
never the whole dataset. Re-checks (`recheck` x B of the batch, floored) are dropped prompts drawn
uniformly at random (`draw`), so a dropped prompt's belief can move again. The draws are the stream
`integers(N)` of rng.stream(key, step, seed, purpose), read in order: the first `count` distinct prompts
of the wanted class that the batch does not already hold, after at most DRAWS_PER_PROMPT x count +
DRAWS_MIN draws (fewer when the class is that rare).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numba
import numpy as np
import numpy.typing as npt

from .coldstart import _PriorSource, cold_beta, group_rates, prior_source, profile_beta
from .domain import K_MAX
from .mi import _check_ids
from .rng import Stream, bounded

if TYPE_CHECKING:
    from .beliefs import BeliefArrays

__all__ = [
    "DROP_SOLVED",
    "DROP_UNSOLVED",
    "FILTER_SETTINGS",
    "KEEP",
    "Filter",
    "FilterSetting",
    "all_probability",
    "draw",
    "judge",
    "zero_advantage_probabilities",
]


@dataclass(frozen=True)
class FilterSetting:
    """One setting of the filter: its type, default, bounds (pydantic's names: gt, ge, lt, le) and what it
    does."""

    type: Any
    default: Any
    help: str
    bounds: Mapping[str, float] = field(default_factory=dict)


#: The settings of a select's `filter` object and of strategy `filter`'s parameters, declared once
#: (docs/methods.md §9 says how the defaults were chosen): the select body's `filter` (schemas.SelectFilter),
#: strategy filter's parameters and their checks (strategies.FILTER_PARAMS) and the filter /strategies
#: lists follow from them.
FILTER_SETTINGS: dict[str, FilterSetting] = {
    "solved": FilterSetting(
        float, 0.5, "drop a prompt when P(a group of k all succeeds) >= solved", {"gt": 0, "le": 1}
    ),
    "unsolved": FilterSetting(
        float, 0.5, "drop a prompt when P(a group of k all fails) >= unsolved", {"gt": 0, "le": 1}
    ),
    "k": FilterSetting(
        int | None,
        None,
        "group size of those probabilities; null = the dataset's rollouts_per_prompt",
        {"ge": 1, "le": K_MAX},
    ),
    "recheck": FilterSetting(
        float,
        0.0,
        "share of the batch given to dropped prompts drawn at random, so that their beliefs can move",
        {"ge": 0, "lt": 1},
    ),
    "reprofile": FilterSetting(
        bool,
        True,
        "true: judge each prompt by its belief as the run's outcomes move it; false: by its uploaded pass "
        "rate and count alone (a static filter on the profile)",
    ),
}

#: What `judge` says of a prompt.
KEEP, DROP_SOLVED, DROP_UNSOLVED = 0, 1, 2

#: Random draws `draw` makes per prompt it looks for, beyond DRAWS_MIN.
DRAWS_PER_PROMPT = 64
DRAWS_MIN = 4096
#: Multiplier of the draws' hash table (Fibonacci hashing).
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@dataclass(frozen=True)
class Filter:
    """A select's filter, checked (strategies.validate_filter) and with k resolved to a group size."""

    solved: float
    unsolved: float
    k: int
    recheck: float
    reprofile: bool

    @classmethod
    def of(cls, settings: dict[str, Any], dataset_k: int) -> Filter:
        """From checked settings (every name of FILTER_SETTINGS); k None means `dataset_k`."""
        k = settings["k"] if settings["k"] is not None else dataset_k
        return cls(
            float(settings["solved"]),
            float(settings["unsolved"]),
            int(k),
            float(settings["recheck"]),
            bool(settings["reprofile"]),
        )

    def rechecks(self, batch_size: int) -> int:
        """Prompts of a batch of `batch_size` given to re-checks of dropped prompts."""
        return math.floor(self.recheck * batch_size)


@numba.njit(nogil=True, cache=True, inline="always")
def _at_least(a: float, n: float, k: int, bound: float) -> bool:
    """prod_{j<k} (a + j) / (n + j) >= bound, stopping once the (falling) product is below it."""
    prod = 1.0
    for j in range(k):
        prod *= (a + j) / (n + j)
        if prod < bound:
            return False
    return True


@numba.njit(nogil=True, cache=True)
def all_probability(a: float, n: float, k: int) -> float:
    """prod_{j<k} (a + j) / (n + j): with n = a + b, E[p^k] under Beta(a, b) (the probability that k
    rollouts all succeed); with a = b, that they all fail."""
    prod = 1.0
    for j in range(k):
        prod *= (a + j) / (n + j)
    return prod


@numba.njit(nogil=True, cache=True, inline="always")
def _code(
    src: _PriorSource,
    rates: npt.NDArray[np.float64],
    p: int | np.integer[Any],
    alpha0: float,
    beta0: float,
    prior_strength: float,
    k: int,
    solved: float,
    unsolved: float,
    reprofile: bool,
) -> int:
    """KEEP, DROP_SOLVED or DROP_UNSOLVED for prompt p (module docstring)."""
    if reprofile:
        a, b, _ = cold_beta(src, rates, p, alpha0, beta0, prior_strength)
    else:
        a, b = profile_beta(src[4], src[6], p, alpha0, beta0, prior_strength)
    n = a + b
    if _at_least(a, n, k, solved):
        return DROP_SOLVED
    if _at_least(b, n, k, unsolved):
        return DROP_UNSOLVED
    return KEEP


@numba.njit(nogil=True, cache=True)
def _judge_kernel(
    src: _PriorSource,
    rates: npt.NDArray[np.float64],
    ids: npt.NDArray[np.int64],
    alpha0: float,
    beta0: float,
    prior_strength: float,
    k: int,
    solved: float,
    unsolved: float,
    reprofile: bool,
    out: npt.NDArray[np.int8],
) -> None:
    for i in range(ids.size):
        out[i] = _code(src, rates, ids[i], alpha0, beta0, prior_strength, k, solved, unsolved, reprofile)


def judge(ba: BeliefArrays, ids: np.ndarray, f: Filter) -> np.ndarray:
    """KEEP, DROP_SOLVED or DROP_UNSOLVED (int8) for each prompt of `ids` under the filter `f`."""
    ids = _check_ids(np.asarray(ids, dtype=np.int64), ba.n)
    out = np.empty(ids.size, dtype=np.int8)
    if ids.size:
        r = ba.shared.rules
        _judge_kernel(
            prior_source(ba),
            group_rates(ba.shared),
            ids,
            r.alpha0,
            r.beta0,
            r.prior_strength,
            f.k,
            f.solved,
            f.unsolved,
            f.reprofile,
            out,
        )
    return out


@numba.njit(nogil=True, cache=True)
def _probabilities(
    alpha: npt.NDArray[np.float64],
    beta: npt.NDArray[np.float64],
    k: int,
    solved: npt.NDArray[np.float64],
    unsolved: npt.NDArray[np.float64],
) -> None:
    for i in range(alpha.size):
        n = alpha[i] + beta[i]
        solved[i] = all_probability(alpha[i], n, k)
        unsolved[i] = all_probability(beta[i], n, k)


def zero_advantage_probabilities(
    alpha: np.ndarray, beta: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """(P(all k succeed), P(all k fail)) under each Beta(alpha_i, beta_i) (float64), the quantities the
    filter compares with its bounds."""
    alpha = np.ascontiguousarray(alpha, dtype=np.float64)
    beta = np.ascontiguousarray(beta, dtype=np.float64)
    if alpha.shape != beta.shape or alpha.ndim != 1:
        raise ValueError("alpha and beta must be 1-d arrays of one length")
    solved, unsolved = np.empty_like(alpha), np.empty_like(alpha)
    _probabilities(alpha, beta, int(k), solved, unsolved)
    return solved, unsolved


@numba.njit(nogil=True, cache=True)
def _draw_kernel(
    src: _PriorSource,
    rates: npt.NDArray[np.float64],
    alpha0: float,
    beta0: float,
    prior_strength: float,
    k: int,
    solved: float,
    unsolved: float,
    reprofile: bool,
    stream_id: np.uint64,
    n: int,
    limit: int,
    kept: bool,
    exclude: npt.NDArray[np.int64],
    out: npt.NDArray[np.int64],
) -> int:
    """Fills `out` with the first distinct ids of the draws bounded(stream_id, i, n), i < limit, of the
    wanted class and outside `exclude`; returns how many. The ids met are held in an open-addressing table
    (linear probing, -1 = empty) at most half full."""
    size = 16
    while size < 2 * (exclude.size + out.size) + 16:
        size *= 2
    mask = np.uint64(size - 1)
    table = np.full(size, -1, dtype=np.int64)
    for x in exclude:
        h = (np.uint64(x) * _GOLDEN) & mask
        while table[h] != -1 and table[h] != x:
            h = (h + np.uint64(1)) & mask
        table[h] = x
    got = 0
    for i in range(limit):
        if got == out.size:
            break
        p = bounded(stream_id, i, n)
        h = (np.uint64(p) * _GOLDEN) & mask
        while table[h] != -1 and table[h] != p:
            h = (h + np.uint64(1)) & mask
        if table[h] == p:
            continue
        if (
            _code(src, rates, p, alpha0, beta0, prior_strength, k, solved, unsolved, reprofile) == KEEP
        ) != kept:
            continue
        table[h] = p
        out[got] = p
        got += 1
    return got


def draw(
    ba: BeliefArrays, f: Filter, count: int, *, kept: bool, exclude: np.ndarray, rng: Stream
) -> np.ndarray:
    """Up to `count` distinct prompts that `f` keeps (`kept`) or drops, drawn uniformly at random from the
    ids outside `exclude` (module docstring: the stream `rng.integers(N)` read in order, at most
    DRAWS_PER_PROMPT x count + DRAWS_MIN draws). int64, in the order drawn."""
    if count <= 0:
        return np.empty(0, dtype=np.int64)
    r = ba.shared.rules
    out = np.empty(count, dtype=np.int64)
    got = _draw_kernel(
        prior_source(ba),
        group_rates(ba.shared),
        r.alpha0,
        r.beta0,
        r.prior_strength,
        f.k,
        f.solved,
        f.unsolved,
        f.reprofile,
        np.uint64(rng.id),
        ba.n,
        DRAWS_PER_PROMPT * count + DRAWS_MIN,
        kept,
        np.ascontiguousarray(exclude, dtype=np.int64),
        out,
    )
    return out[:got]
