"""The close of a step (docs/methods.md §3.2, §6, §7): the walks' positions, the dataset's shared state,
then DPS, in that order (`close_open_step`); a gap of steps without results in one pass.

At each step close (`close_shared`, before the DPS close, which resets the step states the walks read):

    GRESO    easy share = all-solved results / results of the step; p_easy -= 0.01 if it is >= 0.25/3,
             else += 0.01; p_hard likewise with all-failed results and 0.25 * 2/3; both clipped to
             [0.05, 0.95]. A step without results leaves them (ours: no evidence).
    AdaRFT   T <- clip(T + eta tanh(alpha (R - beta)), 0, 100), R = successes / trials of the step's
             results; a step without results leaves T (ours).
    SEC      r_g = mean over g's results at the step of their mean |advantage| (0 when none);
             Q_g <- (1 - lr) Q_g + lr r_g for every category.
    groups   S_g, T_g multiplied by group_decay (docs/methods.md §6).

then the open step's statistics are reset. The rules (sec_lr, adarft_eta / _alpha / _beta, group_decay)
are the dataset's (shared.DatasetRules): they shape state that every replica derives from the log.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from .curricula import GRESO_EASY_TARGET, GRESO_HARD_TARGET, GRESO_P_MAX, GRESO_P_MIN, GRESO_STEP
from .dps import CloseStats, close_step
from .shared import STEP_EASY, STEP_HARD, STEP_RESULTS, STEP_SUCCESSES, STEP_TRIALS
from .walks import advance_walks

if TYPE_CHECKING:
    from .beliefs import BeliefArrays

__all__ = ["close_open_step", "close_shared", "close_shared_empty"]


def _step_adapt(p: float, share: float, target: float) -> float:
    p = p - GRESO_STEP if share >= target else p + GRESO_STEP
    return min(max(p, GRESO_P_MIN), GRESO_P_MAX)


def close_shared(ba: BeliefArrays) -> None:
    """Closes the open step of `ba.shared` (module docstring), in place. Walk positions are advanced by
    walks.advance_walks, which must run before this (and before the DPS close)."""
    sh = ba.shared
    rules = sh.rules
    counts = sh.step_counts
    results = counts[STEP_RESULTS]
    if results > 0:
        sh.p_easy = _step_adapt(sh.p_easy, counts[STEP_EASY] / results, GRESO_EASY_TARGET)
        sh.p_hard = _step_adapt(sh.p_hard, counts[STEP_HARD] / results, GRESO_HARD_TARGET)
    if counts[STEP_TRIALS] > 0:
        r = counts[STEP_SUCCESSES] / counts[STEP_TRIALS]
        t = sh.adarft_t + rules.adarft_eta * math.tanh(rules.adarft_alpha * (r - rules.adarft_beta))
        sh.adarft_t = min(max(t, 0.0), 100.0)
    if sh.n_groups:
        r_g = np.divide(sh.step_adv, sh.step_adv_n, out=np.zeros(sh.n_groups), where=sh.step_adv_n > 0)
        sh.sec_q = (1.0 - rules.sec_lr) * sh.sec_q + rules.sec_lr * r_g
        if rules.group_decay != 1.0 and (sh.group_trials.any() or sh.group_successes.any()):
            sh.group_successes *= rules.group_decay
            sh.group_trials *= rules.group_decay
            if sh.grouped:
                sh.cold_version += 1
        sh.step_adv[:] = 0.0
        sh.step_adv_n[:] = 0
    counts[:] = 0.0


def close_shared_empty(ba: BeliefArrays, steps: int) -> None:
    """Closes `steps` steps of `ba.shared` that had no results, in closed form (close_shared with zero
    counts, `steps` times): GRESO's and AdaRFT's adaptations stay where they are, SEC's values decay by
    (1 - lr)^steps and the group counts by group_decay^steps."""
    sh = ba.shared
    rules = sh.rules
    if steps < 1 or not sh.n_groups:
        return
    sh.sec_q *= (1.0 - rules.sec_lr) ** steps
    if rules.group_decay != 1.0 and (sh.group_trials.any() or sh.group_successes.any()):
        factor = rules.group_decay**steps
        sh.group_successes *= factor
        sh.group_trials *= factor
        if sh.grouped:
            sh.cold_version += 1


def close_open_step(
    ba: BeliefArrays, *, key: str, hmm_decay: float | None = None, d0: float | None = None, steps: int = 1
) -> CloseStats:
    """Closes the open step of `ba` completely, in the order that matters: the walks' positions (they
    read the step states), the shared state (group decay, GRESO / AdaRFT / SEC adaptations), then DPS
    (which resets the step states). `key` names the dataset's random streams (the walks'); the constants
    are the dataset's (ba.shared.rules), `hmm_decay` and `d0` as in dps.close_step. ``steps > 1`` also closes the ``steps - 1`` steps after
    the open one, which hold no evidence, at the cost of one close: the walks do not move at a step
    without results, the shared state's empty steps have a closed form (close_shared_empty), and DPS
    walks each prompt through them in one pass (dps.close_step)."""
    hmm_decay = ba.shared.rules.decay("hmm_decay", hmm_decay)  # checked before anything moves
    advance_walks(ba, key)
    close_shared(ba)
    close_shared_empty(ba, steps - 1)
    return close_step(ba, hmm_decay, d0, steps)
