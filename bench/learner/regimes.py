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
    #: Upload each prompt's pass rate under the starting policy, estimated from this many samples (0:
    #: none), as a reference model's pass rates come with a dataset (docs/methods.md §6).
    reference_samples: int = 0
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
#: difficulty-annotated dataset carries, each prompt's pass rate under the starting policy from 16
#: samples, and what `trainer-client train` then does: a prior that weighs it as the 16 samples it is,
#: and INSIGHT centred where a group is most likely mixed (mu 0.5; trainer_client/cli.py).
BEST = WITH_KINDS.with_(
    name="best",
    about="as kinds, plus each prompt's pass rate from 16 samples of the starting policy (prior_strength 16, "
    "INSIGHT's mu 0.5)",
    reference_samples=16,
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

#: The strategies a comparison can run: name -> (the trainer's --strategy, uses a rollout budget).
STRATEGIES: dict[str, tuple[str, bool]] = {
    "uniform": ("uniform", False),
    "insight": ("insight", False),
    "dps": ("dps", False),
    "mopps": ("mopps", False),
    "expected_difficulty": ("expected_difficulty", False),
    "dynamic_sampling": ("dynamic_sampling", False),
    "insight_budget": ("insight", True),
    "oracle": ("oracle", False),
}
ALL = tuple(STRATEGIES)
