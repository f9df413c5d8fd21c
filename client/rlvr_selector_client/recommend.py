"""What to run for a run of a given shape: one rule, shared by `selector-service replay`, the trainer and
the adapters, so that they recommend the same thing.

    from rlvr_selector_client.recommend import Known, recommend
    rec = recommend(pool_size=200_000, epochs=0.5, batch_size=256, known=Known.profile(16))
    rec.arm          # "insight+profile": the name `selector-service replay` gives that configuration
    rec.strategy, rec.params, rec.prior_strength, rec.upload_pass_rates, rec.why

The inputs are the run's shape (prompts in its pool, how many times it goes over them, prompts per step)
and what is known per prompt before it is tried: nothing, a pass rate the dataset ships (from another
model, free), or a profile of n samples per prompt with the starting policy (paid for in rollouts).

The rule is data: `RULES`, the first row that matches wins, each row carrying what it bought at equal
total rollouts (profiling counted) and the benchmark that measured it; `decision_table()` renders it as
the table docs/strategies.md and README show.

`static_filter_params` gives the settings of the service's filter that make it the offline filter teams
run on a profile: keep exactly the prompts whose profiled rate is strictly between 0 and 1. Standard
library only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "RATE_PARAMS",
    "RULES",
    "Known",
    "Recommendation",
    "Rule",
    "decision_table",
    "recommend",
    "static_filter_params",
]

KnownKind = Literal["nothing", "rate", "profile"]

#: A pass rate whose sample count is unknown weighs as this many samples (the trainer's default for
#: reference rates, docs/strategies.md "Starting cold").
DEFAULT_RATE_SAMPLES = 16.0
#: Parameters a strategy gets when every prompt carries a pass rate: INSIGHT centred at even odds
#: (docs/strategies.md "The best regime": mu 0.5 gained 0.9 points held-out where the paper's 0.3 gained
#: nothing).
RATE_PARAMS: dict[str, dict[str, Any]] = {"insight": {"mu": 0.5}}


@dataclass(frozen=True)
class Known:
    """What is known about each prompt before the run tries it."""

    kind: KnownKind = "nothing"
    #: Samples behind each pass rate (None: unknown, for a shipped rate).
    samples: float | None = None

    @classmethod
    def nothing(cls) -> Known:
        return cls("nothing")

    @classmethod
    def rate(cls, samples: float | None = None) -> Known:
        """A pass rate per prompt shipped with the dataset (measured with another model)."""
        return cls("rate", samples)

    @classmethod
    def profile(cls, samples: float) -> Known:
        """A profile: each prompt's pass rate from `samples` rollouts of the starting policy."""
        return cls("profile", samples)

    def __post_init__(self) -> None:
        if self.kind not in ("nothing", "rate", "profile"):
            raise ValueError(f"Known.kind is 'nothing', 'rate' or 'profile', not {self.kind!r}")
        if self.samples is not None and not self.samples > 0:
            raise ValueError(f"Known.samples must be > 0, got {self.samples}")
        if self.kind == "profile" and self.samples is None:
            raise ValueError("a profile says how many samples each rate was measured from")


@dataclass(frozen=True)
class Rule:
    """A row of the decision table: when it applies, what to run, what it bought and where that was
    measured (every figure at equal total rollouts, profiling counted)."""

    known: tuple[KnownKind, ...]
    strategy: str
    #: The run goes over its pool at least / fewer than this many times (None: any).
    min_epochs: float | None
    max_epochs: float | None
    #: The run's shape in words, what is known per prompt in words, and what the row runs in words.
    when: str
    knowing: str
    runs: str
    #: What it bought, measured, and the command that measured it.
    buys: str
    evidence: str
    #: Upload the known rates (PUT /datasets/{name}/metadata) with prior_strength = their samples.
    rates: bool = False
    #: A select's filter object to send with every select (None: none).
    select_filter: dict[str, Any] | None = None


#: The decision table (docs/strategies.md, "What to run"), the first row that matches wins.
RULES: tuple[Rule, ...] = (
    Rule(
        known=("rate", "profile"),
        strategy="insight",
        min_epochs=None,
        max_epochs=2.0,
        rates=True,
        when="a pool larger than the run visits (each prompt seen fewer than twice)",
        knowing="a pass rate per prompt",
        runs="`insight`, the rates uploaded with their sample counts (`mu` 0.5)",
        buys="+0.9 ± 0.1 held-out points over uniform in 10 of 10 seeds, 1.97x fewer rollouts to uniform's "
        "final; an offline filter on the same rates did as well (+1.0 ± 0.2, 1.44x). The rates were the "
        "starting policy's own and free there: profiling 20,000 prompts x 16 would cost 4.2x the run",
        evidence="bench/learning.py --regime best (20,000 prompts, 76,800 rollouts)",
    ),
    Rule(
        known=("nothing", "rate", "profile"),
        strategy="uniform",
        min_epochs=2.0,
        max_epochs=None,
        when="a pool the run goes over twice or more, pass rates moving as it learns",
        knowing="anything",
        runs="`uniform` (skip the profile)",
        buys="uniform gained 2.0 ± 0.2 held-out points; the offline filter on a profile of 8 samples (16,000 "
        "rollouts, counted) ended 0.25 ± 0.30 below it (as good, within noise, for its profile's cost), the filter "
        "re-profiled from the run 0.50 ± 0.25 below, the filter without a profile 0.37 ± 0.18 below, and a filter "
        "on every prompt's exact current pass rate, free (the ceiling), 0.18 ± 0.11 below, though 1.28 ± 0.23x "
        "sooner at uniform's final; uniform reached the offline filter's final with 1.4-1.7x fewer rollouts",
        evidence="bench/learning.py --regime epochs (2,000 prompts x 12 visits, 192,000 rollouts, 5 seeds)",
    ),
    Rule(
        known=("nothing",),
        strategy="uniform",
        min_epochs=None,
        max_epochs=None,
        when="a pool larger than the run visits",
        knowing="nothing",
        runs="`uniform`",
        buys="no strategy has anything to go on: none gained held-out accuracy over uniform with only each "
        "prompt's coarse kind known, and INSIGHT never reached uniform's accuracy at 200,000 prompts without "
        "metadata",
        evidence="bench/learning.py --regime kinds; bench/toy_world.py",
    ),
)


def decision_table() -> str:
    """`RULES` as the Markdown table docs/strategies.md and README show."""
    lines = [
        "| your run | known per prompt | run | what it bought (equal total rollouts, profiling counted) | measured by |",
        "|---|---|---|---|---|",
    ]
    for rule in RULES:
        lines.append(f"| {rule.when} | {rule.knowing} | {rule.runs} | {rule.buys} | `{rule.evidence}` |")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Recommendation:
    """What to run: `strategy` with `params` (and a select's `select_filter` when not None); with
    `upload_pass_rates`, the dataset is created with `prior_strength` and the rates uploaded. `arm` is
    the name `selector-service replay` reports it under (``NAME+profile`` when the rates come from a
    profile or a shipped file, ``+filter`` with a filter)."""

    strategy: str
    params: dict[str, Any] = field(default_factory=dict)
    upload_pass_rates: bool = False
    prior_strength: float | None = None
    why: str = ""
    select_filter: dict[str, Any] | None = None
    #: The row's run, in words (its `Rule.when`).
    when: str = ""

    @property
    def arm(self) -> str:
        name = f"{self.strategy}+profile" if self.upload_pass_rates else self.strategy
        return name + ("+filter" if self.select_filter is not None else "")


def _check_shape(pool_size: int, epochs: float, batch_size: int) -> None:
    if isinstance(pool_size, bool) or int(pool_size) != pool_size or pool_size < 1:
        raise ValueError(f"pool_size must be a whole number >= 1, got {pool_size!r}")
    if isinstance(batch_size, bool) or int(batch_size) != batch_size or batch_size < 1:
        raise ValueError(f"batch_size must be a whole number >= 1, got {batch_size!r}")
    if not epochs > 0:
        raise ValueError(f"epochs must be > 0, got {epochs!r}")


def recommend(pool_size: int, epochs: float, batch_size: int, known: Known | None = None) -> Recommendation:
    """The configuration `RULES` gives a run over `pool_size` prompts that goes `epochs` times over them
    (fractions allowed: 0.3 when it sees 30% of its pool) with `batch_size` prompts per step, knowing
    `known` about each prompt (default nothing)."""
    _check_shape(pool_size, epochs, batch_size)
    known = known or Known.nothing()
    for rule in RULES:
        if known.kind not in rule.known:
            continue
        if rule.min_epochs is not None and epochs < rule.min_epochs:
            continue
        if rule.max_epochs is not None and epochs >= rule.max_epochs:
            continue
        params = dict(RATE_PARAMS.get(rule.strategy, {})) if rule.rates else {}
        strength = (known.samples or DEFAULT_RATE_SAMPLES) if rule.rates else None
        why = f"{rule.when}, {rule.knowing} known: {rule.buys} ({rule.evidence})"
        chosen = None if rule.select_filter is None else dict(rule.select_filter)
        return Recommendation(rule.strategy, params, rule.rates, strength, why, chosen, rule.when)
    raise AssertionError(f"no rule matches {known}")  # the table ends with a row for every kind


#: The largest group size the service's filter takes as its ``k`` (selector_service/core/domain.py K_MAX).
FILTER_K_MAX = 1024


def _all_probability(successes: float, failures: float, k: int) -> float:
    """P(k rollouts all succeed) under Beta(successes, failures): prod_{j<k} (a + j) / (a + b + j), the
    filter's test (docs/methods.md §9)."""
    prod = 1.0
    for j in range(k):
        prod *= (successes + j) / (successes + failures + j)
    return prod


def _apart(below: float, above: float) -> bool:
    """`above` exceeds `below` by more than the service's rounding can move either: it stores rates as
    float32 (a relative error of 6e-8 per sample, up to k-fold in a product of k factors)."""
    return above > below * (1.0 + 1e-3)


def static_filter_params(
    samples: int | Iterable[int], beta_prior: tuple[float, float] = (1.0, 1.0)
) -> dict[str, Any]:
    """The settings of the service's filter (strategy ``filter``'s params, or a select's ``filter``
    object; docs/api.md, "Select with a filter") that keep exactly the prompts whose uploaded rate from
    `samples` samples (one count, or every count the profile holds) is strictly between 0 and 1, judging
    the upload alone (``reprofile`` false): the offline filter teams run, on the service.

    A rate s/n weighs as Beta(a0 + s, b0 + n - s) (`beta_prior` = (a0, b0), the dataset's, by default the
    service's (1, 1)). With ``k`` = 1 the filter's probabilities are those Beta means, and each bound sits
    between the all-solved (all-failed) mean and that of n - 1 successes (failures): half a sample below
    the first for a single count of 2 or more. When the counts spread too widely for one bound at k = 1 (a bound that
    lies between n/n and (n-1)/n for every n), the smallest k that separates them is used. A prompt
    without a rate is kept. ValueError when no k up to the service's largest separates the counts, or a
    count is not a whole number >= 1."""
    counts = sorted({samples} if isinstance(samples, int) else set(samples))
    if not counts or any(isinstance(n, bool) or int(n) != n or n < 1 for n in counts):
        raise ValueError(f"samples must be whole numbers >= 1, got {samples!r}")
    a0, b0 = (float(x) for x in beta_prior)
    if not (math.isfinite(a0) and math.isfinite(b0) and a0 > 0 and b0 > 0):
        raise ValueError(f"beta_prior must be two positive numbers, got {beta_prior!r}")
    low, high = counts[0], counts[-1]
    for k in range(1, FILTER_K_MAX + 1):
        # Solved: the all-solved probability of n/n must reach the bound for every n, those of (n-1)/n and
        # of a prompt without a rate (Beta(a0, b0)) stay below it. Each rises with n (the Beta moves right),
        # so the fewest and the most samples decide.
        solved = (
            max(_all_probability(a0 + high - 1, b0 + 1, k), _all_probability(a0, b0, k)),
            _all_probability(a0 + low, b0, k),
        )
        unsolved = (
            max(_all_probability(b0 + high - 1, a0 + 1, k), _all_probability(b0, a0, k)),
            _all_probability(b0 + low, a0, k),
        )
        if _apart(*solved) and _apart(*unsolved):
            return {
                "reprofile": False,
                "k": k,
                "solved": (solved[0] + solved[1]) / 2,
                "unsolved": (unsolved[0] + unsolved[1]) / 2,
            }
    raise ValueError(
        f"profiles of {counts[0]} to {counts[-1]} samples per prompt: no bounds of the service's filter keep "
        "exactly the prompts strictly between 0 and 1 for all of them (profile every prompt with about as "
        "many samples)"
    )
