"""Named settings of the learning benchmark (``--regime NAME``) and the strategies it compares.

A regime fixes everything but the strategy and the seed: the policy and its pre-training, the pool and
its composition, the step's shape (B prompts x K rollouts), the rollout budget of the whole run, the
update's settings, the evaluation, and what the service is told about the prompts. Every strategy of a
comparison spends the same rollouts (``steps x B x K``); Dynamic Sampling, which rolls out more per step,
runs fewer steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from bench.learner.policy import ModelSpec


@dataclass(frozen=True)
class Arm:
    """One configuration a comparison runs: the trainer's ``--strategy`` with its parameters, a select
    ``filter`` object (docs/api.md, "Select with a filter"; None: none), a profile of the regime's
    ``profile_samples`` per prompt first (counted), and a rollout budget per step or not."""

    strategy: str
    params: dict[str, Any] = field(default_factory=dict)
    select_filter: dict[str, Any] | None = None
    profile: bool = False
    budgeted: bool = False

    @classmethod
    def parse(cls, text: str) -> Arm:
        """An arm from JSON: ``{"strategy": "insight", "params": {...}, "filter": {...}, "profile": true}``."""
        import json

        spec = json.loads(text)
        if not isinstance(spec, dict) or "strategy" not in spec:
            raise ValueError(f"an arm is a JSON object with a 'strategy', got {text!r}")
        unknown = set(spec) - {"strategy", "params", "filter", "profile", "budgeted"}
        if unknown:
            raise ValueError(f"an arm has no field {sorted(unknown)[0]!r}")
        return cls(spec["strategy"], dict(spec.get("params") or {}), spec.get("filter"),
                   bool(spec.get("profile", False)), bool(spec.get("budgeted", False)))  # fmt: skip

    def describe(self, profile_samples: int) -> dict[str, Any]:
        return {"strategy": self.strategy, "params": self.params, "filter": self.select_filter,
                "profile": profile_samples if self.profile else 0}  # fmt: skip


@dataclass(frozen=True)
class Regime:
    name: str
    about: str
    model: ModelSpec = field(default_factory=ModelSpec)
    #: Prompts the run trains on, and the held-out prompts accuracy is measured on (same distribution).
    pool_size: int = 2000
    heldout_size: int = 500
    #: None: problems as the family draws them. Else the pool's shares by the pre-trained policy's pass
    #: rate p0: ``{"hopeless": s0, "solved": s1}`` (p0 < 0.01, p0 > 0.99; the rest in between), drawn from
    #: a larger set of candidates. The held-out set has the same composition.
    composition: dict[str, float] | None = None
    #: None, or the pool's shares by the pre-trained policy's pass rate p0 in the bins of round(8 p0)
    #: (nine shares, 0/8 to 8/8), drawn like a composition: a pool whose histogram is a real run's.
    histogram: tuple[float, ...] | None = None
    batch_size: int = 32
    rollouts: int = 8
    steps: int = 300
    lr: float = 1e-4
    #: Optimizer steps over which the learning rate rises linearly to ``lr`` (0: none).
    warmup_steps: int = 0
    loss_norm: str = "token"
    scale_by_std: bool = True
    temperature: float = 1.0
    #: Evaluate every this many steps' worth of rollouts (B x K x eval_every).
    eval_every: int = 15
    #: Upload each prompt's kind (operator and digit counts) as its group (docs/strategies.md "Starting cold").
    metadata: bool = False
    #: Upload each prompt's pass rate under a reference model, estimated from this many samples (0:
    #: none), as a reference model's pass rates come with a dataset (docs/methods.md §6): free, so they
    #: must not be the policy's own starting rates, which a run would pay for as a profile.
    reference_samples: int = 0
    #: The reference model: the same recipe pre-trained with another seed (None: the policy itself, how
    #: the best regime's table in docs/strategies.md was measured before this rule).
    reference_model: ModelSpec | None = None
    #: Dataset settings the run's dataset is created with (e.g. ``{"prior_strength": 20}``; empty: defaults).
    dataset: dict[str, Any] = field(default_factory=dict)
    #: Strategy parameters sent with every select, by strategy name (empty: the service's defaults).
    params: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: insight_budget: the step's B x K rollouts shared out per prompt in [min, max] by this policy.
    budget_min: int = 2
    budget_max: int = 32
    budget_policy: str = "posterior"
    #: The oracle picks its batch among this many times B prompts drawn at random at every step, by their
    #: exact current pass rates (None: the whole pool).
    oracle_candidates: int | None = 16
    ds_oversample: int = 3
    ds_max_rounds: int = 4
    #: The oracle's rule. "top": the B best of its candidates by the probability of a mixed group (it
    #: returns to the same prompts and can memorise them). "filter": uniform without repeats over the
    #: prompts whose exact current pass rate makes a mixed group at least `oracle_mixed` likely, the
    #: rates refreshed over the whole pool every `eval_every` steps: the filter with free, exact, fresh
    #: rates, the ceiling of the filter family.
    oracle_rule: str = "top"
    oracle_mixed: float = 0.5
    #: Samples per prompt of the profile an arm with ``profile=True`` takes of the starting policy before
    #: its first step, counted in its rollouts (bench/learner/run.py).
    profile_samples: int = 8

    def with_(self, **changes: Any) -> Regime:
        return replace(self, **changes)

    @property
    def rollout_budget(self) -> int:
        """Rollouts every strategy of the comparison spends."""
        return self.steps * self.batch_size * self.rollouts


BASE = Regime(
    "base", "the issue's starting point: 2,000 prompts as the family draws them, B = 32, K = 8, lr 1e-4"
)

#: Many more prompts than a run visits (20,000 for 9,600 visits), so what the policy learns must carry over
#: to prompts it has not trained on, and the service told each prompt's kind (as a dataset's level or
#: source would tell it), since most prompts are never observed before they are chosen
#: (docs/strategies.md, "Results: a real learner on the CPU").
WITH_KINDS = BASE.with_(
    name="kinds",
    about="20,000 prompts (each seen about half a time), their kinds uploaded as groups, B = 32, K = 8, lr 1e-4",
    pool_size=20000,
    metadata=True,
)

#: Where selection buys the most held-out accuracy found: the kinds regime plus what a
#: difficulty-annotated dataset carries, each prompt's pass rate from 16 samples of another model (the
#: same recipe pre-trained with another seed), and what `trainer-client train` then does: a prior that weighs it as the 16 samples it is,
#: and INSIGHT centred where a group is most likely mixed (mu 0.5; trainer_client/cli.py).
BEST = WITH_KINDS.with_(
    name="best",
    about="as kinds, plus each prompt's pass rate from 16 samples of a reference model (prior_strength 16, "
    "INSIGHT's mu 0.5)",
    reference_samples=16,
    reference_model=ModelSpec(pretrain_seed=1),
    dataset={"prior_strength": 16.0},
    params={"insight": {"mu": 0.5}},
)

REGIMES: dict[str, Regime] = {
    r.name: r
    for r in (
        BASE,
        WITH_KINDS,
        BEST,
        BASE.with_(name="smoke", about="the whole pipeline at a toy size (seconds)", pool_size=64, heldout_size=32,
                   batch_size=4, rollouts=4, steps=3, eval_every=1,
                   model=ModelSpec(hidden=32, layers=1, heads=2, ffn=64, pretrain_steps=20, pretrain_batch=16)),
    )
}  # fmt: skip

#: Epoch 0 of the One-Shot-RLVR trace (../shared/data/one-shot-rlvr: Qwen2.5-Math-1.5B on 1,209 DSR-sub
#: prompts, K = 8): the share of prompts at each accuracy 0/8 .. 8/8, and the class transitions between
#: consecutive epochs over its 44 epochs (rows: unsolved, mixed, solved at K = 8).
TRACE_HISTOGRAM = (0.363, 0.125, 0.085, 0.075, 0.060, 0.063, 0.073, 0.079, 0.076)
TRACE_TRANSITIONS = ((0.787, 0.213, 0.0), (0.127, 0.779, 0.094), (0.0, 0.270, 0.730))
TRACE_POOL_PASS_RATE = (0.335, 0.470)

#: A run that goes over its pool many times while the pass rates move as in a real run: the pool drawn
#: to the trace's starting histogram, twelve epochs of 2,000 prompts, a learning rate (5e-5) at which
#: uniform's held-out accuracy rises over the whole run (docs/strategies.md, "When pass rates move").
#: Arms that profile take 8 samples per prompt (16,000 rollouts, counted).
EPOCHS = BASE.with_(
    name="epochs",
    about="2,000 prompts drawn to a real run's pass-rate histogram, visited 12 times (B = 32, K = 8, "
    "lr 5e-5); profiles of 8 samples counted",
    histogram=TRACE_HISTOGRAM,
    steps=750,
    lr=5e-5,
    eval_every=25,
    oracle_rule="filter",
    profile_samples=8,
)

REGIMES["epochs"] = EPOCHS
REGIMES["epochs-smoke"] = EPOCHS.with_(
    name="epochs-smoke", about="the epochs regime's pipeline at a toy size (seconds)", pool_size=64,
    heldout_size=32, batch_size=8, rollouts=4, steps=24, eval_every=8, profile_samples=2, histogram=None,
    model=ModelSpec(hidden=32, layers=1, heads=2, ffn=64, pretrain_steps=20, pretrain_batch=16),
)  # fmt: skip


def _static_filter(samples: int) -> dict[str, Any]:
    from rlvr_selector_client.recommend import static_filter_params

    return static_filter_params(samples)


#: The arms a comparison can run by name. ``filter``: the offline filter teams run (a profile, then
#: uniform over the prompts profiled strictly between 0 and 1, judged by the profile alone);
#: ``filter_reprofile``: the same profile, the service's filter judging each prompt by the run's
#: outcomes as they come (strategy ``filter`` at its defaults); ``filter_cold``: that filter without a
#: profile; ``recommended``: what the decision table says for the regime (`recommended`).
ARMS: dict[str, Arm] = {
    "uniform": Arm("uniform"),
    "insight": Arm("insight"),
    "dps": Arm("dps"),
    "mopps": Arm("mopps"),
    "expected_difficulty": Arm("expected_difficulty"),
    "dynamic_sampling": Arm("dynamic_sampling"),
    "insight_budget": Arm("insight", budgeted=True),
    "oracle": Arm("oracle"),
    "filter": Arm("filter", profile=True),  # params: static_filter_params(profile samples), at run time
    "filter_reprofile": Arm("filter", profile=True),
    "filter_cold": Arm("filter"),
}
STATIC_FILTER_ARMS = frozenset({"filter"})
ALL = (*ARMS, "recommended")


def recommended(regime: Regime) -> Arm:
    """What the decision table (rlvr_selector_client.recommend) says to run for the regime's shape: its
    pool, how many times its budget goes over it, its batch, and what it uploads per prompt."""
    from rlvr_selector_client.recommend import Known, recommend

    epochs = regime.rollout_budget / (regime.rollouts * regime.pool_size)
    known = Known.rate(regime.reference_samples) if regime.reference_samples else Known.nothing()
    rec = recommend(regime.pool_size, epochs, regime.batch_size, known)
    return Arm(rec.strategy, dict(rec.params), rec.select_filter)


def arm_of(regime: Regime, name: str, extra: dict[str, Arm] | None = None) -> Arm:
    """The arm a comparison runs under `name` in `regime` (``--arm NAME=JSON`` arms in `extra`)."""
    if extra and name in extra:
        return extra[name]
    if name == "recommended":
        return recommended(regime)
    arm = ARMS[name]
    if name in STATIC_FILTER_ARMS:
        return replace(arm, params=_static_filter(regime.profile_samples))
    return arm
