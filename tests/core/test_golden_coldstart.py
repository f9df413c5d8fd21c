"""Golden batches of cold start and of the strategies of docs/methods.md §7: a selection outcome that changes is a
visible, deliberate change (as tests/core/test_golden_batches.py, over a dataset with metadata).

The dataset: 200 prompts, pass rates for a third, groups 0..4 for four fifths, three observed steps
closed with `close_open_step` (so GRESO's and SEC's positions, p_easy / p_hard, SEC's Q and AdaRFT's T
have moved). When a change moves one of these on purpose, say so in the commit and update the table from
`python -m tests.core.test_golden_coldstart`.
"""

from __future__ import annotations

import numpy as np
import pytest

from selector_service.core import (
    BeliefArrays,
    apply_metadata,
    apply_results,
    close_open_step,
    outcomes_from_counts,
)
from tests.core.test_golden_batches import batch  # the same selection call as the other golden table

N = 200
CASES = [
    ("insight", {}),
    ("mopps", {}),
    ("learnability", {}),
    ("adarft", {}),
    ("greso", {}),
    ("sec", {}),
    ("sec", {"tau": 0.002}),  # Q differs by ~0.005 between groups: a sharp policy
]
POINTS = [(3, 0), (3, 7)]


def beliefs() -> BeliefArrays:
    """Fixed metadata and results (no randomness), beta decay 0.8, group decay 0.9, hmm decay 0.7."""
    ba = BeliefArrays.new(N, 1.0, 1.0, prior_strength=2.0, group_decay=0.9)
    ids = np.arange(N)
    rates = np.where(ids % 3 == 0, (ids % 10) / 10.0, np.nan)
    groups = np.where(ids % 5 == 4, -1, ids % 5).astype(np.int32)
    apply_metadata(ba, 0, rates, groups)
    for step in range(3):
        observed = np.arange(step * 37, step * 37 + 60, dtype=np.int64) % N
        trials = np.full(observed.size, 8.0)
        successes = ((observed * 5 + step * 3) % 9).astype(np.float64)
        apply_results(ba, observed, successes, trials, outcomes_from_counts(successes, trials), 0.8, 1.0, 1.0)
        close_open_step(ba, hmm_decay=0.7, key="golden")
    return ba


GOLDEN: dict[tuple[int, tuple[int, int]], list[int]] = {
    (0, (3, 0)): [199, 164, 194, 169, 149, 134, 179, 139, 184, 154, 153, 183],  # insight {}
    (0, (3, 7)): [184, 194, 199, 134, 149, 139, 179, 164, 154, 183, 153, 144],  # insight {}
    (1, (3, 0)): [186, 41, 90, 43, 60, 30, 172, 82, 108, 59, 122, 4],  # mopps {}
    (1, (3, 7)): [81, 109, 40, 39, 92, 190, 115, 42, 152, 86, 151, 17],  # mopps {}
    (2, (3, 0)): [90, 81, 51, 40, 58, 88, 42, 80, 41, 50, 89, 59],  # learnability {}
    (2, (3, 7)): [90, 51, 81, 40, 88, 42, 80, 41, 50, 49, 59, 89],  # learnability {}
    (3, (3, 0)): [64, 34, 129, 9, 189, 39, 69, 99, 159, 18, 138, 108],  # adarft {}
    (3, (3, 7)): [34, 64, 99, 159, 69, 39, 9, 189, 129, 18, 168, 138],  # adarft {}
    (4, (3, 0)): [142, 88, 129, 52, 176, 0, 79, 150, 181, 55, 90, 131],  # greso {}
    (4, (3, 7)): [142, 88, 129, 52, 176, 0, 79, 150, 181, 55, 90, 131],  # greso {}
    (5, (3, 0)): [26, 96, 165, 16, 46, 156, 180, 167, 72, 48, 85, 40],  # sec {}
    (5, (3, 7)): [167, 72, 52, 26, 165, 180, 96, 16, 48, 46, 156, 157],  # sec {}
    (6, (3, 0)): [165, 180, 85, 40, 25, 130, 45, 35, 145, 48, 55, 60],  # sec {'tau': 0.002}
    (6, (3, 7)): [26, 165, 96, 180, 85, 40, 25, 130, 16, 45, 35, 46],  # sec {'tau': 0.002}
}


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("point", POINTS)
def test_golden_batch(case, point):
    strategy, params = CASES[case]
    assert batch(beliefs(), strategy, params, *point) == GOLDEN[(case, point)], (strategy, params, point)


if __name__ == "__main__":  # prints the table to paste above
    ba = beliefs()
    print("GOLDEN: dict[tuple[int, tuple[int, int]], list[int]] = {")
    for case, (strategy, params) in enumerate(CASES):
        for point in POINTS:
            print(f"    ({case}, {point}): {batch(ba, strategy, params, *point)},  # {strategy} {params}")
    print("}")
