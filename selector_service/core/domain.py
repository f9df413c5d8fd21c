"""The numerically safe domain of every dataset setting and selection parameter, in one place (ours).

The service refuses values outside these bounds with a 422 that names the field and its domain, and
every scoring kernel is total on every belief state reachable from inside them: no NaN, no infinity, no
exception (tests/core/test_numeric_domain.py checks the edges with property tests). A dataset setting's
bounds are named by its declaration (rlvr_selector_client/contract.py) and read here (`bounds`,
`settings_problems`): by the create body (selector_service/contract/dataset_settings.py), by
DatasetSpec.problems(), which also guards imports, and by the rules the kernels read
(shared.DatasetRules). Selection parameters are checked by strategies.validate_params.

Dataset settings

    beta_prior (alpha0, beta0)   each in [PRIOR_MIN, PRIOR_MAX] = [1e-3, 1e6]
    rollouts_per_prompt K        integer in [1, K_MAX] = [1, 1024]
    beta_decay, hmm_decay        in (0, 1]
    success_threshold            any finite number (only compared with rewards)
    size                         integer >= 1 (and the service's SELECTOR_MAX_DATASET_SIZE)
    prior_strength s             in [0, PRIOR_STRENGTH_MAX] = [0, 1e6]   (docs/methods.md §6)
    group_decay                  in (0, 1]

Metadata (docs/methods.md §6): pass rates in [0, 1] or unknown (NaN), groups in 0..65535 or -1, sample counts
behind the rates whole numbers in [1, PASS_SAMPLES_MAX] = [1, 1e6] or unknown. A cold prior
Beta(alpha0 + s p0, beta0 + s (1 - p0)), s a prompt's count or the dataset's prior_strength, then has each
parameter in [PRIOR_MIN, PRIOR_MAX + 1e6]: inside the range the Beta bounds below are argued for.

Observations: trials per result in [1, TRIALS_MAX] = [1, 1e9], 0 <= successes <= trials, rewards finite.

Selection parameters (core/strategies.py): eta finite >= 0; mu and target in [0, 1]; k integer in
[1, K_MAX]; candidate_ratio integer >= 1 or null; entropy_weight in [-ENTROPY_WEIGHT_MAX,
ENTROPY_WEIGHT_MAX] = [-1e6, 1e6]; mode 'topk' or 'threshold'.

Why these bounds, and what they make reachable:

- Beta beliefs. docs/methods.md §1's update alpha <- beta_decay alpha + (1 - beta_decay) alpha0 + S is a
  convex combination of alpha and alpha0 plus S >= 0, so alpha never falls below min(alpha0, its start) >= PRIOR_MIN (up to
  one rounding), and it grows by at most TRIALS_MAX per result: after R results of a prompt,
  alpha + beta <= 2 PRIOR_MAX + R * TRIALS_MAX, which stays below 1e300 for any log shorter than 1e290
  results. The scores are exact and stable over all of that: INSIGHT's I_K is evaluated in a form whose
  relative error is ~1e-14 K for every a, b >= PRIOR_MIN with a finite sum (mi.py; the textbook form
  loses all digits past n ~ 1e15), the Beta means and 1/n are single divisions, and the MoPPS Beta
  draws are made in log space (rng.py), so neither a huge nor a tiny parameter can overflow them.
  Below PRIOR_MIN (e.g. the 1e-320 of a subnormal prior) Beta(a, b) puts almost all its mass within
  exp(-1/a) of 0 and 1: draws underflow to exactly 0 and 1 and no score can tell prompts apart. Above
  PRIOR_MAX a prior outweighs a million rollouts, so no run could move its mean; nothing would break up
  to ~1e307, but nothing useful lies there, and a prior of 1e308 makes alpha0 + beta0 overflow (the
  reported 500s). Infinite or NaN values are refused everywhere.
- DPS beliefs. Each Dirichlet count decays toward d0 = 1 and gains at most 1 per closed step, so every
  count stays in [min(1, 1 - hmm_decay), 1 + steps] and every transition probability above 1 / (3 + 3 steps):
  the float32 state never overflows or divides by zero for any hmm_decay in (0, 1].
- Scores. INSIGHT's w(m) <= 1/4 and I_K <= ln(K + 1) for any eta >= 0 (exp(-eta d^2) only underflows
  to 0); DPS scores are prior(2) + w_H H(prior) with H <= ln 3, so |w_H| <= 1e6 keeps them far inside
  the float range (the safe bound would be ~1e308; past 1e6 prior(2) no longer matters anyway).
"""

from __future__ import annotations

__all__ = [
    "BELIEF_MAX",
    "ENTROPY_WEIGHT_MAX",
    "K_MAX",
    "MAX_GROUPS",
    "PASS_SAMPLES_MAX",
    "PRIOR_MAX",
    "PRIOR_MIN",
    "PRIOR_STRENGTH_MAX",
    "TRIALS_MAX",
    "bounds",
    "plain",
    "prior_problem",
    "setting_check",
    "settings_problems",
]

import math
from collections.abc import Callable, Mapping
from typing import Any

from rlvr_selector_client.contract import MAX_GROUPS, PASS_SAMPLES_MAX, SETTINGS, Setting

#: Smallest and largest accepted alpha0 and beta0 of a dataset's Beta prior.
PRIOR_MIN = 1e-3
PRIOR_MAX = 1e6
#: Largest rollout count K (dataset rollouts_per_prompt, INSIGHT's k).
K_MAX = 1024
#: Largest `trials` of one result.
TRIALS_MAX = 10**9
#: Largest |entropy_weight| of DPS.
ENTROPY_WEIGHT_MAX = 1e6
#: Largest prior_strength (docs/methods.md §6): a pass rate worth a million rollouts at most.
PRIOR_STRENGTH_MAX = 1e6
# The bounds of a metadata upload are the contract's, which the client checks too: groups 0..MAX_GROUPS-1
# and PASS_SAMPLES_MAX, the largest sample count behind an uploaded pass rate (docs/methods.md §6): as
# prior_strength, a rate worth a million rollouts at most, so a cold prior stays inside the range
# argued for below.
#: Largest alpha or beta (and group sum, step count) a loaded state may hold: no log of realistic length
#: reaches it (see "Beta beliefs" above), and alpha + beta of two such values is still finite.
BELIEF_MAX = 1e300


def prior_problem(prior: Any) -> str | None:
    """What is wrong with a Beta prior (alpha0, beta0), or None; the message names the field and domain."""
    try:
        values = [float(x) for x in prior]
    except (TypeError, ValueError):
        values = []
    if len(values) != 2 or not all(
        math.isfinite(x) and PRIOR_MIN <= x <= PRIOR_MAX and not isinstance(x, bool) for x in values
    ):
        return (
            f"beta_prior must be two numbers (alpha0, beta0), each in [{PRIOR_MIN:g}, {PRIOR_MAX:g}], "
            f"e.g. [1.0, 1.0]; got {list(prior) if isinstance(prior, list | tuple) else prior!r}"
        )
    return None


def plain(value: Any) -> Any:
    """A numpy scalar as the Python number it holds (so messages show 1.5, not np.float32(1.5))."""
    item = getattr(value, "item", None)
    return item() if callable(item) and getattr(value, "shape", None) == () else value


# ---- the dataset settings' bounds ---------------------------------------------------------------------
def bounds(setting: Setting) -> dict[str, Any]:
    """The setting's constraints (pydantic's names: ge, gt, le, ...), a bound named by a string read from
    this module."""
    return {
        k: globals()[v] if isinstance(v, str) and k != "pattern" else v
        for k, v in setting.constraints.items()
    }


def setting_check(setting: Setting) -> Callable[[Any], str | None] | None:
    """The function of this module the setting names as its check, or None (its constraints check it)."""
    check: Callable[[Any], str | None] | None = globals()[setting.check] if setting.check else None
    return check


def _problem(setting: Setting, value: Any) -> str | None:
    s, c = setting, bounds(setting)
    check = setting_check(s)
    if check is not None:
        return check(value)
    if s.choices:
        return None if value in s.choices else f"{s.name} {value!r} is unknown"
    if isinstance(s.default, dict):
        return None if isinstance(value, dict) else f"{s.name} must be an object"
    low = c.get("gt", c.get("ge"))
    high = c.get("le")
    if s.type is int:
        ok = (low is None or value >= low) and (high is None or value <= high)
        if ok:
            return None
        return (
            f"{s.name} {value} not in {low}..{high}"
            if high is not None
            else f"{s.name} {value} must be >= {low}"
        )
    if s.type is float:
        inside = (
            math.isfinite(value)
            and (low is None or (value > low if "gt" in c else value >= low))
            and (high is None or value <= high)
        )
        if inside:
            return None
        if low is None:
            return f"{s.name} must be finite"
        return f"{s.name} {value} not in {'(' if 'gt' in c else '['}{low:g}, {high:g}]"
    return None


def settings_problems(values: Mapping[str, Any]) -> str | None:
    """What is out of range among `values` (a setting's name -> its value as the spec holds it; a setting
    not given is not looked at), in the domain of the create body, or None."""
    bad = [p for s in SETTINGS if s.name in values and (p := _problem(s, values[s.name]))]
    return "; ".join(bad) if bad else None
