"""Selection numerics of rlvr-selector (docs/methods.md §0-2 and the selection primitives).

Pure numerics: numpy, numba and math only; nothing here knows about Redis, HTTP or metrics. Every
fast kernel is `numba.njit(nogil=True, cache=True)` behind a checked wrapper (the wrappers are the API),
has a slow float64 twin in tests/core/naive.py, and runs without fastmath so the same inputs give the same
bits in every process. Parallel kernels are launched under `PARALLEL_LOCK` (see _parallel.py), so
wrappers may be called from many threads at once.

Modules: outcomes (rewards -> successes, trials, states), shared (a dataset's constants, DatasetRules,
and the SharedState it keeps beside its per-prompt arrays), beliefs (BeliefArrays: per-prompt arrays
and the observed set that holds DPS state; the Beta update), coldstart (docs/methods.md §6: metadata, group
rates, cold and frozen priors), dps (DPS step close over the observed set),
mi (INSIGHT's weighted mutual information), scores (MoPPS, baselines, DPS score), curricula (docs/methods.md §7:
learnability, AdaRFT), step_close (a step's close: walks, the shared state, then DPS; `close_open_step`), walks (GRESO's and SEC's walks
and their positions), special (numba digamma), rng (the counter-based generator behind every random
choice), select (pools, top-k with random ties, DPS over the whole dataset, epoch walks), domain (the
accepted range of every setting and parameter), strategies (registry, validation, select / score),
rollouts (docs/methods.md §8: how many rollouts each selected prompt gets under a step's budget;
`allocate_rollouts(alpha, beta, ids, *, budget, min_rollouts, max_rollouts, policy, rng)`).

A step closes with `close_open_step` (walk positions, shared state, then DPS); `close_step` alone is
the DPS update.
"""

from ._parallel import PARALLEL_LOCK
from .beliefs import NO_GROUP, BeliefArrays, apply_results
from .coldstart import (
    apply_metadata,
    beta_for,
    check_metadata,
    group_rates,
    prior_pass_rates,
)
from .domain import MAX_GROUPS
from .dps import CloseStats, close_step
from .mi import K_MAX, mutual_information, wmi_scores, wmi_weight
from .outcomes import (
    PARTIAL,
    REWARD_MODES,
    SOLVED,
    UNOBSERVED,
    UNSOLVED,
    combine_state,
    outcomes_from_counts,
    outcomes_from_flat,
    outcomes_from_rewards,
)
from .rng import Stream, stream
from .rollouts import (
    DEFAULT_ROLLOUT_POLICY,
    ROLLOUT_POLICIES,
    RolloutError,
    RolloutRequest,
    allocate_gains,
    allocate_rollouts,
    check_rollouts,
    gain_table,
    mixed_probability,
)
from .scores import dps_scores, expected_difficulty_scores, inverse_evidence_scores, thompson_scores
from .select import (
    candidate_pool,
    epoch_permutation,
    history_batch,
    mopps_threshold_select,
    topk_random_ties,
    uniform_batch,
)
from .shared import DatasetRules, SharedState
from .special import digamma, digamma_array
from .step_close import close_open_step
from .strategies import STRATEGIES, ParamError, StrategySpec, score, select, validate_params

__all__ = [
    "DEFAULT_ROLLOUT_POLICY",
    "K_MAX",
    "MAX_GROUPS",
    "NO_GROUP",
    "PARALLEL_LOCK",
    "PARTIAL",
    "REWARD_MODES",
    "ROLLOUT_POLICIES",
    "SOLVED",
    "STRATEGIES",
    "UNOBSERVED",
    "UNSOLVED",
    "BeliefArrays",
    "CloseStats",
    "DatasetRules",
    "ParamError",
    "RolloutError",
    "RolloutRequest",
    "SharedState",
    "StrategySpec",
    "Stream",
    "allocate_gains",
    "allocate_rollouts",
    "apply_metadata",
    "apply_results",
    "beta_for",
    "candidate_pool",
    "check_metadata",
    "check_rollouts",
    "close_open_step",
    "close_step",
    "combine_state",
    "digamma",
    "digamma_array",
    "dps_scores",
    "epoch_permutation",
    "expected_difficulty_scores",
    "gain_table",
    "group_rates",
    "history_batch",
    "inverse_evidence_scores",
    "mixed_probability",
    "mopps_threshold_select",
    "mutual_information",
    "outcomes_from_counts",
    "outcomes_from_flat",
    "outcomes_from_rewards",
    "prior_pass_rates",
    "score",
    "select",
    "stream",
    "thompson_scores",
    "topk_random_ties",
    "uniform_batch",
    "validate_params",
    "wmi_scores",
    "wmi_weight",
]
