"""The strategy registry: parameters, validation, and `select` / `score` for every strategy.

A strategy is one StrategySpec entry of STRATEGIES: its parameters, how it scores or walks, how it picks a
batch from a pool, what it requires of a dataset, whether its scores may be cached. `select`, `score`,
the service's score cache (state.py), its checks before a select (payloads.plan_select)
and /strategies read the entry; nothing branches on a strategy's name.

| strategy            | score (larger is better)          | candidates                       | params (default) |
|---------------------|-----------------------------------|----------------------------------|------------------|
| uniform             | none: epoch permutation walk      | -                                | -                |
| history_resampling  | none: the walk, skipping solved   | -                                | -                |
| insight             | w(m) I_K (docs/methods.md §1.1)            | pool of min(ratio * B, N)        | eta 3.0, mu 0.3, k (dataset K), candidate_ratio 16 |
| dps                 | prior(2) + w_H H(prior) (METH. 2) | whole dataset (ratio None)       | entropy_weight 0.0, candidate_ratio None |
| mopps               | -(g - target)^2, g ~ Beta (1.2)   | pool                             | target 0.5, mode topk, candidate_ratio 16 |
| expected_difficulty | -(m - target)^2 (docs/methods.md §1.3)     | pool                             | target 0.5, candidate_ratio 16 |
| inverse_evidence    | 1 / n (docs/methods.md §1.3)               | pool                             | candidate_ratio 16 |
| learnability        | E[phi (1 - phi)] (docs/methods.md §7)      | pool                             | candidate_ratio 16 |
| adarft              | -|d - T| (docs/methods.md §7)              | whole dataset                    | eta 50, alpha 2, beta 0.5 (the dataset's) |
| greso               | none: the walk with skips (docs/methods.md §7)  | -                                | - |
| sec                 | none: category walks (docs/methods.md §7)  | prompts with a group             | lr 0.5 (the dataset's), tau 1.0 |

Every Beta-family score (insight, mopps, expected_difficulty, inverse_evidence, learnability) reads a
never-observed prompt's Beta as its cold prior (docs/methods.md §6, coldstart.beta_for).

Parameters marked "the dataset's" shape state that the dataset updates at every step close (SEC's Q,
AdaRFT's T), so they are fixed per dataset: set them in the dataset's `defaults`; a select that names
another value is refused (`resolve_params`). `dataset_rules` turns a dataset's defaults into the
DatasetRules its beliefs are created with.

`select` and `score` are pure functions of their arguments: every random choice comes from the
project's counter-based generator (rng.py), `stream(key, step, seed, purpose)` with purposes
"candidates" (the pool), "thompson" (MoPPS draws) and "ties" (top-k tie-breaking), so the same
(beliefs, strategy, params, batch, step, seed, key) gives the same batch in every process and with every
numpy version (tests/core/test_golden_batches.py pins a few).

MoPPS draws are keyed by prompt id, so `score` for mopps returns exactly the draws a `select` at the
same (step, seed) made for those prompts. With mode "threshold" the batch is chosen by the band
[0.3, 0.7] (select.mopps_threshold_select) and the scores returned are still -(g - target)^2.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from .coldstart import beta_for, beta_scores
from .curricula import adarft_scores, learnability_scores
from .domain import ENTROPY_WEIGHT_MAX, K_MAX
from .filter import FILTER_SETTINGS, KEEP, Filter, FilterSetting, draw, judge
from .mi import _check_ids, wmi_scores
from .rng import Stream, stream
from .scores import dps_scores, expected_difficulty_scores, inverse_evidence_scores, thompson_scores
from .select import (
    TiedScores,
    candidate_pool,
    dps_select,
    history_batch,
    mopps_threshold_select,
    topk_random_ties,
    topk_tied,
    uniform_batch,
)
from .walks import WalkError, greso_batch, sec_batch

if TYPE_CHECKING:
    from .beliefs import BeliefArrays

__all__ = [
    "FILTER_PARAMS",
    "STRATEGIES",
    "Context",
    "Param",
    "ParamError",
    "StrategySpec",
    "batch_size_problem",
    "dataset_rules",
    "resolve_filter",
    "resolve_params",
    "score",
    "select",
    "validate_filter",
    "validate_params",
]

#: Largest rollout count accepted for INSIGHT's `k`.
K_LIMIT = K_MAX


class ParamError(ValueError):
    """A strategy name or parameter is unknown or out of range; the message says what to change."""


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise ParamError(f"{name} must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ParamError(f"{name} must be finite, got {value!r}")
    return value


def _integer(name: str, value: Any) -> int:
    if isinstance(value, float | np.floating) and float(value).is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ParamError(f"{name} must be an integer, got {value!r}")
    return int(value)


def _eta(v: Any) -> float:
    v = _number("eta", v)
    if v < 0:
        raise ParamError(f"eta (width of INSIGHT's difficulty weight) must be >= 0, got {v}")
    return v


def _unit(name: str) -> Callable[[Any], float]:
    def check(v: Any) -> float:
        v = _number(name, v)
        if not 0.0 <= v <= 1.0:
            raise ParamError(f"{name} must lie in [0, 1], got {v}")
        return v

    return check


def _k(v: Any) -> int | None:
    return None if v is None else _k_value(v)


def _k_value(v: Any) -> int:
    v = _integer("k", v)
    if not 1 <= v <= K_LIMIT:
        raise ParamError(f"k (rollouts per prompt for the score) must lie in [1, {K_LIMIT}], got {v}")
    return v


#: Largest candidate_ratio: any pool this large is already the whole dataset (size <= 2^31 - 1 would
#: need a batch of 3); the bound keeps the product with batch_size an ordinary integer.
RATIO_MAX = 10**9


def _ratio(v: Any) -> int | None:
    if v is None:
        return None
    v = _integer("candidate_ratio", v)
    if not 1 <= v <= RATIO_MAX:
        raise ParamError(
            f"candidate_ratio must be an integer in [1, {RATIO_MAX:.0e}], or null for the whole dataset, got {v}"
        )
    return v


def _mode(v: Any) -> str:
    if v not in ("topk", "threshold"):
        raise ParamError(f"mode must be 'topk' or 'threshold', got {v!r}")
    return str(v)


def _entropy_weight(v: Any) -> float:
    v = _number("entropy_weight", v)
    if not -ENTROPY_WEIGHT_MAX <= v <= ENTROPY_WEIGHT_MAX:
        raise ParamError(
            f"entropy_weight must lie in [{-ENTROPY_WEIGHT_MAX:g}, {ENTROPY_WEIGHT_MAX:g}], got {v}"
        )
    return v


def _within(name: str, low: float, high: float, *, low_open: bool = False) -> Callable[[Any], float]:
    def check(v: Any) -> float:
        v = _number(name, v)
        if not ((v > low if low_open else v >= low) and v <= high):
            bound = "(" if low_open else "["
            raise ParamError(f"{name} must lie in {bound}{low:g}, {high:g}], got {v}")
        return v

    return check


def _flag(name: str) -> Callable[[Any], bool]:
    def check(v: Any) -> bool:
        if not isinstance(v, bool | np.bool_):
            raise ParamError(f"{name} must be true or false, got {v!r}")
        return bool(v)

    return check


@dataclass(frozen=True)
class Param:
    """One selection parameter: its default and a checker that returns the normalised value."""

    default: Any
    check: Callable[[Any], Any]
    help: str
    #: Shapes state the dataset updates at step close: fixed per dataset (its `defaults`), see above.
    dataset_level: bool = False


@dataclass(frozen=True)
class Context:
    """What a select or a score is keyed by besides the beliefs and the parameters: every random choice
    is `stream(key, step, seed, purpose)`; `dataset_k` is the dataset's rollouts per prompt."""

    step: int
    seed: int
    key: str
    dataset_k: int

    def stream(self, purpose: str) -> Stream:
        return stream(self.key, self.step, self.seed, purpose)


class ScoreFn(Protocol):
    """Scores (float64, in the order of `ids`; None = every prompt) under checked `params`, written into
    `out` when given and the score can (a reused buffer)."""

    def __call__(
        self,
        ba: BeliefArrays,
        ids: np.ndarray | None,
        params: dict[str, Any],
        ctx: Context,
        out: np.ndarray | None,
        /,
    ) -> np.ndarray: ...


class WalkFn(Protocol):
    """An unscored strategy's batch (int64[batch_size] distinct prompt ids); raises WalkError when the
    dataset cannot give one."""

    def __call__(
        self, ba: BeliefArrays, batch_size: int, params: dict[str, Any], ctx: Context, /
    ) -> np.ndarray: ...


class PickFn(Protocol):
    """How a batch is chosen from a candidate pool (`candidates`, None = the whole dataset, positions
    being prompt ids): k -> (the positions of the k chosen in the pool, best first; their scores). The
    pool is scored once, whatever the number of k asked for (a filtered select may ask again)."""

    def __call__(
        self,
        ba: BeliefArrays,
        candidates: np.ndarray | None,
        params: dict[str, Any],
        ctx: Context,
        ties: Stream,
        /,
    ) -> Callable[[int], tuple[np.ndarray, np.ndarray]]: ...


class WholeFn(Protocol):
    """A faster way to the same batch and scores when the pool is the whole dataset."""

    def __call__(
        self, ba: BeliefArrays, batch_size: int, params: dict[str, Any], ties: Stream, /
    ) -> tuple[np.ndarray, np.ndarray]: ...


class Requirement(Protocol):
    """What a strategy needs of a dataset beyond its beliefs: why a select of `batch_size` by strategy
    `strategy` cannot run on dataset `dataset` (a message for the client), or None when it can."""

    def __call__(self, strategy: str, ba: BeliefArrays, batch_size: int, dataset: str, /) -> str | None: ...


@dataclass(frozen=True)
class StrategySpec:
    """A strategy and everything the service needs of it, so that adding one is one entry of STRATEGIES:

    - `params`: its parameters (validate_params);
    - `walk`: an unscored strategy's batch, straight from a walk; or
    - `score`: the per-prompt scores (larger is better) that /score answers and a select ranks, with
      `pick`, how a batch is chosen from a candidate pool (None: the batch_size best scores, ties at
      random), and `whole`, a faster path to the same batch when the pool is the whole dataset;
    - `deterministic`: the scores depend on the beliefs only (no random draws), so whole-dataset scores
      may be passed back to `select` as `full_scores`;
    - `cacheable`: moreover a prompt's score moves only when a result for it arrives or the cold priors
      move (not at a step close), so the service keeps whole-dataset scores across requests and rescores
      only those prompts (state.DatasetState's score cache, for `candidate_ratio` null);
    - `requires`: what it needs of a dataset beyond its beliefs, checked before a select moves anything;
    - `unfiltered`: why a select's `filter` object does not apply to it (None: it does).

    The candidate pool is min(candidate_ratio * batch_size, N) prompts, the whole dataset for a
    strategy without a `candidate_ratio` parameter (`ratio`)."""

    name: str
    params: dict[str, Param] = field(default_factory=dict)
    walk: WalkFn | None = None
    score: ScoreFn | None = None
    pick: PickFn | None = None
    whole: WholeFn | None = None
    deterministic: bool = True
    cacheable: bool = False
    requires: Requirement | None = None
    #: Why a select's `filter` object cannot apply to this strategy (a message for the client), or None.
    unfiltered: str | None = None

    def __post_init__(self) -> None:
        if (self.walk is None) == (self.score is None):
            raise ValueError(f"strategy {self.name!r} needs exactly one of a walk and a score")
        if self.score is None and (self.pick or self.whole or self.deterministic or self.cacheable):
            raise ValueError(f"the walk {self.name!r} has no scores to pick from, rank or cache")
        if self.cacheable and not self.deterministic:
            raise ValueError(f"strategy {self.name!r}: only deterministic scores may be cached")

    @property
    def scored(self) -> bool:
        """A select returns scores, and /score answers for it."""
        return self.score is not None

    def ratio(self, params: dict[str, Any]) -> int | None:
        """The candidate ratio `params` name (else its default); None: the pool is the whole dataset."""
        param = self.params.get("candidate_ratio")
        ratio: int | None = None if param is None else params.get("candidate_ratio", param.default)
        return ratio

    def unmet(self, ba: BeliefArrays, batch_size: int, dataset: str) -> str | None:
        """Why a select of `batch_size` cannot run on the dataset `dataset` (its beliefs `ba`), or None."""
        return None if self.requires is None else self.requires(self.name, ba, batch_size, dataset)


def _declared(name: str, setting: FilterSetting) -> Callable[[Any], Any]:
    """The check of a declared setting (filter.FilterSetting): its type and its bounds."""
    if setting.type is bool:
        return _flag(name)
    b = setting.bounds
    low, high = b.get("gt", b.get("ge", -math.inf)), b.get("lt", b.get("le", math.inf))
    low_open, high_open = "gt" in b, "lt" in b
    whole = setting.type in (int, int | None)

    def check(v: Any) -> Any:
        if v is None and setting.type == int | None:
            return None
        v = _integer(name, v) if whole else _number(name, v)
        if not ((v > low if low_open else v >= low) and (v < high if high_open else v <= high)):
            span = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
            raise ParamError(f"{name} must lie in {span}, got {v}")
        return v

    return check


#: The filter's settings (docs/methods.md §9), from their declaration (filter.FILTER_SETTINGS): a select's
#: `filter` object and strategy `filter`'s parameters.
FILTER_PARAMS: dict[str, Param] = {
    name: Param(s.default, _declared(name, s), s.help) for name, s in FILTER_SETTINGS.items()
}


def validate_filter(settings: dict[str, Any] | None) -> dict[str, Any]:
    """A select's filter settings checked, defaults filled in; ParamError naming an unknown or bad one."""
    settings = dict(settings or {})
    unknown = sorted(set(settings) - set(FILTER_PARAMS))
    if unknown:
        raise ParamError(
            f"unknown filter setting(s) {', '.join(unknown)}; allowed: {', '.join(FILTER_PARAMS)}"
        )
    return {
        name: p.check(settings[name]) if name in settings else p.default for name, p in FILTER_PARAMS.items()
    }


# ---- the strategies' parts ----------------------------------------------------------------------


def _uniform_walk(ba: BeliefArrays, batch_size: int, params: dict[str, Any], ctx: Context) -> np.ndarray:
    return uniform_batch(ba.n, batch_size, ctx.step, ctx.seed, ctx.key)


def _history_walk(ba: BeliefArrays, batch_size: int, params: dict[str, Any], ctx: Context) -> np.ndarray:
    return history_batch(ba.n, batch_size, ctx.step, ctx.seed, ctx.key, ba.last_state)


def _filter_walk(ba: BeliefArrays, batch_size: int, params: dict[str, Any], ctx: Context) -> np.ndarray:
    """Uniform over the prompts the filter keeps (docs/methods.md §9): the uniform walk's window, its
    dropped prompts replaced by kept ones drawn at random."""
    window = uniform_batch(ba.n, batch_size, ctx.step, ctx.seed, ctx.key)
    return _filtered_window(ba, window, Filter.of(params, ctx.dataset_k), ctx)


def _greso_walk(ba: BeliefArrays, batch_size: int, params: dict[str, Any], ctx: Context) -> np.ndarray:
    return greso_batch(ba, batch_size, ctx.key)


def _sec_walk(ba: BeliefArrays, batch_size: int, params: dict[str, Any], ctx: Context) -> np.ndarray:
    return sec_batch(ba, batch_size, ctx.step, ctx.seed, ctx.key, params["tau"])


def _groups(strategy: str, ba: BeliefArrays, batch_size: int, dataset: str) -> str | None:
    """A group for at least batch_size prompts (SEC draws prompts by group)."""
    grouped = int(ba.shared.grouped)
    if grouped == 0:
        return (
            f"strategy {strategy} draws prompts by group and dataset {dataset!r} has none: upload groups with "
            f"PUT /datasets/{dataset}/metadata first"
        )
    if batch_size > grouped:
        return (
            f"batch_size {batch_size} is larger than the {grouped} prompts of dataset {dataset!r} that have "
            f"a group (strategy {strategy} selects only those)"
        )
    return None


def _into(out: np.ndarray | None, scores: np.ndarray) -> np.ndarray:
    if out is None:
        return scores
    out[:] = scores
    return out


# Every Beta-family score reads cold priors (coldstart.beta_scores: the stored arrays as they are when
# the dataset has no metadata).


def _insight_k(params: dict[str, Any], dataset_k: int) -> int:
    k = params["k"] if params["k"] is not None else dataset_k
    return _k_value(k)


def _insight_scores(
    ba: BeliefArrays, ids: np.ndarray | None, params: dict[str, Any], ctx: Context, out: np.ndarray | None
) -> np.ndarray:
    k, eta, mu = _insight_k(params, ctx.dataset_k), params["eta"], params["mu"]
    return beta_scores(ba, ids, lambda a, b, sub, o: wmi_scores(a, b, sub, k, eta, mu, out=o), out)


def _expected_difficulty_scores(
    ba: BeliefArrays, ids: np.ndarray | None, params: dict[str, Any], ctx: Context, out: np.ndarray | None
) -> np.ndarray:
    target = params["target"]
    return beta_scores(
        ba, ids, lambda a, b, sub, o: expected_difficulty_scores(a, b, sub, target, out=o), out
    )


def _inverse_evidence_scores(
    ba: BeliefArrays, ids: np.ndarray | None, params: dict[str, Any], ctx: Context, out: np.ndarray | None
) -> np.ndarray:
    return beta_scores(ba, ids, lambda a, b, sub, o: inverse_evidence_scores(a, b, sub, out=o), out)


def _learnability_scores(
    ba: BeliefArrays, ids: np.ndarray | None, params: dict[str, Any], ctx: Context, out: np.ndarray | None
) -> np.ndarray:
    return beta_scores(ba, ids, lambda a, b, sub, o: learnability_scores(a, b, sub, out=o), out)


def _adarft_scores(
    ba: BeliefArrays, ids: np.ndarray | None, params: dict[str, Any], ctx: Context, out: np.ndarray | None
) -> np.ndarray:
    return _into(out, adarft_scores(ba, ids))


def _dps_scores(
    ba: BeliefArrays, ids: np.ndarray | None, params: dict[str, Any], ctx: Context, out: np.ndarray | None
) -> np.ndarray:
    """DPS scores of `ids` (None: every prompt; never-observed ones score their uniform prior)."""
    weight = params["entropy_weight"]
    if ids is not None:
        ids = _check_ids(ids, ba.n)
        return _into(out, dps_scores(ba.hmm_prior_of(ids), None, weight))
    uniform = np.full((1, 3), np.float32(1.0 / 3.0), dtype=np.float32)
    scores = np.full(ba.n, dps_scores(uniform, None, weight)[0])
    m = ba.observed
    scores[ba.obs_ids[:m]] = dps_scores(ba.obs_prior[:m], None, weight)
    return _into(out, scores)


def _dps_whole(
    ba: BeliefArrays, batch_size: int, params: dict[str, Any], ties: Stream
) -> tuple[np.ndarray, np.ndarray]:
    """O(prompts ever observed): select.dps_select."""
    return dps_select(ba, batch_size, params["entropy_weight"], ties)


def _thompson(
    ba: BeliefArrays, ids: np.ndarray | None, target: float, rng: Stream
) -> tuple[np.ndarray, np.ndarray]:
    """MoPPS draws for `ids` (None: all) from the Betas of `beta_for` (cold priors), keyed by prompt id."""
    alpha, beta, sub = beta_for(ba, ids)
    if sub is None and ids is not None:  # gathered: the draws still belong to the prompt ids
        return thompson_scores(alpha, beta, None, target, rng, items=ids)
    return thompson_scores(alpha, beta, sub, target, rng)


def _mopps_scores(
    ba: BeliefArrays, ids: np.ndarray | None, params: dict[str, Any], ctx: Context, out: np.ndarray | None
) -> np.ndarray:
    return _thompson(ba, ids, params["target"], ctx.stream("thompson"))[0]


def _mopps_pick(
    ba: BeliefArrays,
    candidates: np.ndarray | None,
    params: dict[str, Any],
    ctx: Context,
    ties: Stream,
) -> Callable[[int], tuple[np.ndarray, np.ndarray]]:
    """k -> the closest draws ('topk'), or k random draws in the band (select.mopps_threshold_select);
    the draws are made once."""
    scores, draws = _thompson(ba, candidates, params["target"], ctx.stream("thompson"))

    def pick(k: int) -> tuple[np.ndarray, np.ndarray]:
        if params["mode"] == "threshold":
            pos = mopps_threshold_select(draws, None, k, ties)
        else:
            pos = topk_random_ties(scores, k, ties)
        return pos, scores[pos]

    return pick


# ---- the registry -------------------------------------------------------------------------------

#: Why greso and sec take no filter: the close advances their walks past the prompts a select handed out
#: (walks.advance_walks), and it cannot know which prompts a select's filter left out.
_WALKS_ADVANCE = (
    "strategy {} advances its walk at each step close past the prompts its selects handed out, and the "
    "close cannot know which ones a select's filter left out: select without a filter, or use another "
    "strategy (greso already skips prompts that keep coming out solved or unsolved)"
)

_RATIO_16 = Param(16, _ratio, "candidate pool = min(candidate_ratio * batch_size, N); null = whole dataset")


def _walk(name: str, walk: WalkFn, params: dict[str, Param] | None = None, **kw: Any) -> StrategySpec:
    return StrategySpec(name, params or {}, walk=walk, deterministic=False, **kw)


STRATEGIES: dict[str, StrategySpec] = {
    spec.name: spec
    for spec in (
        _walk("uniform", _uniform_walk),
        _walk("history_resampling", _history_walk),
        StrategySpec(
            "insight",
            {
                "eta": Param(3.0, _eta, "width of the difficulty weight exp(-eta (m - mu)^2)"),
                "mu": Param(0.3, _unit("mu"), "centre of the difficulty weight"),
                "k": Param(None, _k, "rollouts for I_K; null = the dataset's rollouts_per_prompt"),
                "candidate_ratio": _RATIO_16,
            },
            score=_insight_scores,
            cacheable=True,
        ),
        StrategySpec(
            "dps",
            {
                "entropy_weight": Param(0.0, _entropy_weight, "weight of the prior's entropy (nats)"),
                "candidate_ratio": Param(None, _ratio, "null = rank the whole dataset (the paper's setting)"),
            },
            score=_dps_scores,
            whole=_dps_whole,
        ),
        StrategySpec(
            "mopps",
            {
                "target": Param(0.5, _unit("target"), "success rate the Thompson draws are pulled toward"),
                "mode": Param(
                    "topk", _mode, "'topk': closest draws; 'threshold': random draws in [0.3, 0.7]"
                ),
                "candidate_ratio": _RATIO_16,
            },
            score=_mopps_scores,
            pick=_mopps_pick,
            deterministic=False,
        ),
        StrategySpec(
            "expected_difficulty",
            {"target": Param(0.5, _unit("target"), "success rate to aim at"), "candidate_ratio": _RATIO_16},
            score=_expected_difficulty_scores,
            cacheable=True,
        ),
        StrategySpec(
            "inverse_evidence", {"candidate_ratio": _RATIO_16}, score=_inverse_evidence_scores, cacheable=True
        ),
        StrategySpec("learnability", {"candidate_ratio": _RATIO_16}, score=_learnability_scores),
        StrategySpec(
            "adarft",
            {
                "eta": Param(50.0, _within("eta", 0.0, 100.0), "step of the target difficulty T", True),
                "alpha": Param(
                    2.0, _within("alpha", 0.0, 1000.0), "sensitivity of T's update to R - beta", True
                ),
                "beta": Param(0.5, _unit("beta"), "success rate T steers toward", True),
            },
            score=_adarft_scores,
        ),
        _walk("greso", _greso_walk, unfiltered=_WALKS_ADVANCE.format("greso")),
        _walk(
            "sec",
            _sec_walk,
            {
                "lr": Param(
                    0.5, _within("lr", 0.0, 1.0, low_open=True), "learning rate of the Q values", True
                ),
                "tau": Param(1.0, _within("tau", 0.0, 1e6, low_open=True), "softmax temperature over Q"),
            },
            requires=_groups,
            unfiltered=_WALKS_ADVANCE.format("sec"),
        ),
        _walk(
            "filter",
            _filter_walk,
            FILTER_PARAMS,
            unfiltered="strategy filter takes the filter's settings as its params: send them in params, "
            "not in a filter object",
        ),
    )
}

#: DatasetRules field -> (strategy, parameter) it comes from.
_RULES = {
    "sec_lr": ("sec", "lr"),
    "adarft_eta": ("adarft", "eta"),
    "adarft_alpha": ("adarft", "alpha"),
    "adarft_beta": ("adarft", "beta"),
}


def _spec(strategy: str) -> StrategySpec:
    spec = STRATEGIES.get(strategy)
    if spec is None:
        raise ParamError(f"unknown strategy {strategy!r}; choose one of {', '.join(sorted(STRATEGIES))}")
    return spec


def validate_params(strategy: str, params: dict[str, Any] | None) -> dict[str, Any]:
    """Checked parameters with defaults filled in; raises ParamError on an unknown strategy or name, or
    a bad value. Idempotent: validate_params(s, validate_params(s, p)) == validate_params(s, p)."""
    spec = _spec(strategy)
    params = dict(params or {})
    unknown = sorted(set(params) - set(spec.params))
    if unknown:
        allowed = ", ".join(spec.params) or "none"
        raise ParamError(
            f"unknown parameter(s) {', '.join(unknown)} for strategy {strategy!r}; allowed: {allowed}"
        )
    return {name: p.check(params[name]) if name in params else p.default for name, p in spec.params.items()}


def dataset_rules(defaults: dict[str, dict[str, Any]] | None) -> dict[str, float]:
    """The DatasetRules fields set by the dataset-level parameters, from a dataset's `defaults` (the
    registry's defaults where it names none); raises ParamError on a bad value."""
    defaults = defaults or {}
    out = {}
    for rule, (strategy, name) in _RULES.items():
        params = validate_params(strategy, defaults.get(strategy, {}))
        out[rule] = float(params[name])
    return out


def resolve_params(
    strategy: str, params: dict[str, Any] | None, defaults: dict[str, dict[str, Any]] | None
) -> dict[str, Any]:
    """The checked parameters a select by `strategy` runs with: the dataset's `defaults` for it, then
    `params` (validate_params). Raises ParamError also when `params` names a dataset-level parameter
    (above) with a value other than the dataset's (from its `defaults`, else the registry default)."""
    fixed = (defaults or {}).get(strategy, {})
    given = params or {}
    merged = validate_params(strategy, {**fixed, **given})
    dataset = validate_params(strategy, fixed)
    for name, param in _spec(strategy).params.items():
        if param.dataset_level and name in given and merged[name] != dataset[name]:
            raise ParamError(
                f"{strategy} parameter {name} = {merged[name]:g} differs from the dataset's {dataset[name]:g}: "
                f"it shapes state the dataset updates at every step close, so it is fixed per dataset; "
                f"create the dataset with defaults {{{strategy!r}: {{{name!r}: {merged[name]:g}}}}} to use it"
            )
    return merged


def resolve_filter(strategy: str, settings: dict[str, Any] | None) -> dict[str, Any]:
    """A select's filter settings for `strategy`, checked (validate_filter); ParamError when the strategy
    takes no filter object (StrategySpec.unfiltered) or a setting is unknown or out of range."""
    spec = _spec(strategy)
    if spec.unfiltered is not None:
        raise ParamError(spec.unfiltered)
    return validate_filter(settings)


def batch_size_problem(batch_size: Any, n: int, dataset: str | None = None) -> str | None:
    """What is wrong with `batch_size` for a dataset of `n` prompts (an integer in [1, n]), or None: the
    one rule, for `select` and for the service's plan of a select (which names the `dataset`)."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int | np.integer) or batch_size < 1:
        return f"batch_size must be an integer in [1, {n}] (the dataset size), got {batch_size!r}"
    if batch_size > n:
        if dataset is not None:
            return f"batch_size {batch_size} is larger than dataset {dataset!r} ({n} prompts)"
        return f"batch_size must be an integer in [1, {n}] (the dataset size), got {batch_size!r}"
    return None


def select(
    ba: BeliefArrays,
    *,
    strategy: str,
    params: dict[str, Any] | None,
    batch_size: int,
    step: int,
    seed: int,
    key: str,
    dataset_k: int,
    full_scores: np.ndarray | TiedScores | None = None,
    filter: dict[str, Any] | None = None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """The batch (int64[B] distinct prompt ids, best first) and its scores (float64[B], or None for the
    unscored walks) for `strategy` at `step` over the beliefs `ba` (a BeliefArrays).

    `full_scores` (float64[N], or a TiedScores over them), when given for a deterministic strategy,
    replaces recomputing the scores (the caller keeps it current); the result is identical to not
    passing it. `filter`: the settings of a select's filter (validate_filter; docs/methods.md §9), None
    for none.
    """
    spec = _spec(strategy)
    params = validate_params(strategy, params)
    n = ba.n
    problem = batch_size_problem(batch_size, n)
    if problem is not None:
        raise ParamError(problem)
    batch_size = int(batch_size)
    ctx = Context(step, seed, key, dataset_k)
    if filter is not None:
        if spec.unfiltered is not None:
            raise ParamError(spec.unfiltered)
        f = Filter.of(validate_filter(filter), dataset_k)
        return _select_filtered(ba, spec, params, batch_size, ctx, f, full_scores)
    if spec.walk is not None:
        try:
            return spec.walk(ba, batch_size, params, ctx), None
        except WalkError as exc:
            raise ParamError(str(exc)) from None
    assert spec.score is not None  # a spec has a walk or a score (StrategySpec.__post_init__)

    ratio = spec.ratio(params)
    pool_size = n if ratio is None else min(ratio * batch_size, n)
    whole = pool_size == n
    ties = ctx.stream("ties")
    if spec.whole is not None and whole:
        return spec.whole(ba, batch_size, params, ties)
    # The whole dataset: positions are prompt ids (no id array of N is built); a pool: its ids.
    candidates = None if whole else candidate_pool(n, pool_size, ctx.stream("candidates"))

    def ids_at(pos: np.ndarray) -> np.ndarray:
        return pos if candidates is None else candidates[pos]

    if spec.pick is not None:
        pos, picked = spec.pick(ba, candidates, params, ctx, ties)(batch_size)
        return ids_at(pos), picked

    if full_scores is not None and spec.deterministic:
        tied = full_scores if isinstance(full_scores, TiedScores) else None
        full_scores = np.asarray(full_scores if tied is None else tied.dense, dtype=np.float64)
        if full_scores.shape != (n,):
            raise ValueError(f"full_scores must have shape ({n},), got {full_scores.shape}")
        if tied is not None and whole:  # most prompts share one score: rank only the others
            pos = topk_tied(tied, batch_size, ties)
            return pos, full_scores[pos]
        scores = full_scores if whole else full_scores[candidates]
    else:
        scores = spec.score(ba, candidates, params, ctx, None)
    pos = topk_random_ties(scores, batch_size, ties)
    return ids_at(pos), scores[pos]


def _filtered_window(ba: BeliefArrays, window: np.ndarray, f: Filter, ctx: Context) -> np.ndarray:
    """A walk's batch under the filter (docs/methods.md §9): the kept prompts of the walk's window in walk
    order, then kept prompts drawn at random in place of the dropped ones, then the re-checks; when too
    few prompts are kept, the window's dropped ones complete it."""
    size = window.size
    rechecks = draw(ba, f, f.rechecks(size), kept=False, exclude=np.empty(0, np.int64),
                    rng=ctx.stream("filter-recheck"))  # fmt: skip
    need = size - rechecks.size
    codes = judge(ba, window, f)
    kept = window[codes == KEEP][:need]
    fill = draw(ba, f, need - kept.size, kept=True, exclude=np.concatenate([kept, rechecks]),
                rng=ctx.stream("filter-fill"))  # fmt: skip
    batch = np.concatenate([kept, fill])
    if batch.size < need:  # the window holds `size` distinct prompts: its dropped ones always suffice
        dropped = window[codes != KEEP]
        batch = np.concatenate([batch, dropped[~np.isin(dropped, rechecks)][: need - batch.size]])
    return np.concatenate([batch, rechecks])


def _select_filtered(
    ba: BeliefArrays,
    spec: StrategySpec,
    params: dict[str, Any],
    batch_size: int,
    ctx: Context,
    f: Filter,
    full_scores: np.ndarray | TiedScores | None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """`select` under the filter `f` (docs/methods.md §9). Only the prompts the strategy would hand out are
    judged: a walk's window (`_filtered_window`); a scored strategy's best 2 x B candidates (of its pool,
    drawn as without a filter, or of the whole dataset), then 8 x B, ... until B of them are kept. The
    batch is the strategy's B - r best kept candidates (completed with its best dropped ones when too few
    are kept), then the r = floor(recheck x B) re-checks, dropped prompts drawn at random."""
    if spec.walk is not None:
        try:
            window = spec.walk(ba, batch_size, params, ctx)
        except WalkError as exc:
            raise ParamError(str(exc)) from None
        return _filtered_window(ba, window, f, ctx), None
    assert spec.score is not None  # a spec has a walk or a score (StrategySpec.__post_init__)
    n = ba.n
    rechecks = draw(ba, f, f.rechecks(batch_size), kept=False, exclude=np.empty(0, np.int64),
                    rng=ctx.stream("filter-recheck"))  # fmt: skip
    need = batch_size - rechecks.size
    ratio = spec.ratio(params)
    pool_size = n if ratio is None else min(ratio * batch_size, n)
    # The whole dataset: positions are prompt ids; a pool: positions in it, drawn as without a filter.
    pool = None if pool_size == n else candidate_pool(n, pool_size, ctx.stream("candidates"))
    rank = _ranking(ba, spec, params, ctx, pool, full_scores)
    size = pool_size
    # Twice the batch costs about what the batch does (a ranking is one pass over its candidates), and
    # rarely has fewer than B kept: one ranking in the common case.
    k = min(size, 2 * need)
    while True:
        pos, ranked_scores = rank(k)
        ranked = pos if pool is None else pool[pos]
        keep = judge(ba, ranked[:need], f) == KEEP  # the best B first: most often every one is kept
        rest = ranked[need:]
        # The rest is judged only when needed (unjudged it counts as not kept, and is never used then).
        more = judge(ba, rest, f) == KEEP if not keep.all() else np.zeros(rest.size, dtype=bool)
        keep = np.concatenate([keep, more])
        if int(keep.sum()) >= need or k == size:
            break
        k = min(size, 4 * k)
    ids, scores = ranked[keep][:need], ranked_scores[keep][:need]
    if ids.size < need:  # too few kept: the best dropped ones complete the batch
        rest = ~keep & ~np.isin(ranked, rechecks)
        ids = np.concatenate([ids, ranked[rest][: need - ids.size]])
        scores = np.concatenate([scores, ranked_scores[rest][: need - scores.size]])
    if rechecks.size:
        ids = np.concatenate([ids, rechecks])
        scores = np.concatenate([scores, spec.score(ba, rechecks, params, ctx, None)])
    return ids, scores


def _ranking(
    ba: BeliefArrays,
    spec: StrategySpec,
    params: dict[str, Any],
    ctx: Context,
    pool: np.ndarray | None,
    full_scores: np.ndarray | TiedScores | None,
) -> Callable[[int], tuple[np.ndarray, np.ndarray]]:
    """k -> the strategy's k best candidates, best first, as positions (in `pool`, or prompt ids when it
    is None: the whole dataset) and their scores, by the path `select` takes without a filter; the scores
    are computed once."""
    ties = ctx.stream("ties")
    if spec.whole is not None and pool is None:
        return lambda k: spec.whole(ba, k, params, ties)  # type: ignore[misc]  # checked by the caller
    if spec.pick is not None:
        return spec.pick(ba, pool, params, ctx, ties)
    dense: np.ndarray | None = None
    if full_scores is not None and spec.deterministic:
        tied = full_scores if isinstance(full_scores, TiedScores) else None
        dense = np.asarray(full_scores if tied is None else tied.dense, dtype=np.float64)
        if dense.shape != (ba.n,):
            raise ValueError(f"full_scores must have shape ({ba.n},), got {dense.shape}")
        if tied is not None and pool is None:  # most prompts share one score: rank only the others

            def from_index(k: int) -> tuple[np.ndarray, np.ndarray]:
                assert tied is not None and dense is not None
                pos = topk_tied(tied, k, ties)
                return pos, dense[pos]

            return from_index
    assert spec.score is not None
    if dense is not None:
        scores = dense if pool is None else dense[pool]
    else:
        scores = spec.score(ba, pool, params, ctx, None)

    def from_scores(k: int) -> tuple[np.ndarray, np.ndarray]:
        pos = topk_random_ties(scores, k, ties)
        return pos, scores[pos]

    return from_scores


def score(
    ba: BeliefArrays,
    *,
    strategy: str,
    params: dict[str, Any] | None,
    ids: np.ndarray | None,
    step: int,
    seed: int,
    key: str,
    dataset_k: int,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Scores (float64, in the order of `ids`; None = every prompt) that `select` ranks by, written into
    `out` when given (a reused buffer, for the deterministic strategies). Raises ParamError for the
    unscored strategies (the walks)."""
    spec = _spec(strategy)
    params = validate_params(strategy, params)
    if spec.score is None:
        raise ParamError(f"strategy {strategy!r} walks a permutation and has no per-prompt scores")
    return spec.score(ba, ids, params, Context(step, seed, key, dataset_k), out)
