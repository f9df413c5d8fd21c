"""What to run for a run of a given shape: one rule, shared by `selector-service replay`, the trainer and
the adapters, so that they recommend the same thing.

    from rlvr_selector_client.recommend import Known, recommend
    rec = recommend(pool_size=20_000, epochs=3.8, batch_size=256, known=Known.profile(16))
    rec.arm          # "insight+profile": the name `selector-service replay` gives that configuration
    rec.strategy, rec.params, rec.prior_strength, rec.upload_pass_rates, rec.why

The inputs are the run's shape (prompts in its pool, how many times it goes over them, prompts per step)
and what is known per prompt before it is tried: nothing, a pass rate the dataset ships (from another
model, free), or a profile of n samples per prompt with the starting policy (paid for in rollouts).

The rule is data: `RULES`, the first row that matches wins, each row carrying the measurement behind it
(docs/strategies.md). It is provisional: the decision table of docs/strategies.md replaces its rows as
the comparison against a pass-rate filter at equal total rollouts is measured. Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["RATE_PARAMS", "RULES", "Known", "Recommendation", "Rule", "recommend"]

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
    """A row of the decision table: when it applies, what to run, and the measurement behind it."""

    known: tuple[KnownKind, ...]
    strategy: str
    #: The run goes over its pool at least this many times (None: any).
    min_epochs: float | None
    evidence: str
    #: Upload the known rates (PUT /datasets/{name}/metadata) with prior_strength = their samples.
    rates: bool = False


#: The provisional decision table, most specific first.
RULES: tuple[Rule, ...] = (
    Rule(
        known=("rate", "profile"),
        strategy="insight",
        min_epochs=None,
        rates=True,
        evidence="with each prompt's pass rate from 16 samples uploaded at prior_strength 16 and mu 0.5, "
        "INSIGHT gained 0.9 +- 0.1 points held-out over uniform in 10 of 10 seeds with 1.97x fewer rollouts "
        "(bench/learning.py --regime best; docs/strategies.md)",
    ),
    Rule(
        known=("nothing",),
        strategy="insight",
        min_epochs=2.0,
        evidence="prompts seen again and again: INSIGHT learns each one's pass rate from the run's own "
        "outcomes (1.6x fewer steps than uniform in the small toy world; docs/strategies.md)",
    ),
    Rule(
        known=("nothing",),
        strategy="uniform",
        min_epochs=None,
        evidence="a pool the run visits about once, nothing known per prompt: no strategy has anything to "
        "go on (INSIGHT never reached uniform's accuracy at 200k prompts without metadata; "
        "docs/strategies.md)",
    ),
)


@dataclass(frozen=True)
class Recommendation:
    """What to run: `strategy` with `params`; with `upload_pass_rates`, the dataset is created with
    `prior_strength` and the rates uploaded. `arm` is the name `selector-service replay` reports it
    under (``NAME+profile`` when the rates come from a profile or a shipped file)."""

    strategy: str
    params: dict[str, Any] = field(default_factory=dict)
    upload_pass_rates: bool = False
    prior_strength: float | None = None
    why: str = ""

    @property
    def arm(self) -> str:
        return f"{self.strategy}+profile" if self.upload_pass_rates else self.strategy


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
        params = dict(RATE_PARAMS.get(rule.strategy, {})) if rule.rates else {}
        strength = (known.samples or DEFAULT_RATE_SAMPLES) if rule.rates else None
        return Recommendation(rule.strategy, params, rule.rates, strength, rule.evidence)
    raise AssertionError(f"no rule matches {known}")  # the table ends with a row for every kind
