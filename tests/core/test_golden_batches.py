"""Golden batches: a selection outcome that changes is a visible, deliberate change.

Every strategy (and MoPPS' threshold mode) at a few (step, seed) pairs over a small dataset with a few
observed steps. The batches depend only on the project's code (the counter-based generator of rng.py,
the kernels) and the log: not on numpy's, numba's or Python's version, nor on the process. When a change
of the selection code moves one of these on purpose, say so in the commit and update the table from
`python -m tests.core.test_golden_batches`.
"""

from __future__ import annotations

import numpy as np
import pytest

from selector_service.core import BeliefArrays, apply_results, close_step, outcomes_from_counts, select

N = 200
CASES = [
    ("uniform", {}),
    ("history_resampling", {}),
    ("insight", {}),
    ("insight", {"candidate_ratio": None, "eta": 1.0, "k": 4}),
    ("dps", {}),
    ("dps", {"entropy_weight": 0.3, "candidate_ratio": 8}),
    ("mopps", {}),
    ("mopps", {"mode": "threshold", "candidate_ratio": None}),
    ("expected_difficulty", {"target": 0.4}),
    ("inverse_evidence", {"candidate_ratio": 2}),
]
POINTS = [(3, 0), (3, 7), (11, 2**40 + 3)]


def beliefs() -> BeliefArrays:
    """Three observed steps of fixed results (no randomness), decays 0.8 (Beta) and 0.7 (DPS)."""
    ba = BeliefArrays.new(N, 1.0, 1.0)
    for step in range(3):
        ids = np.arange(step * 37, step * 37 + 60, dtype=np.int64) % N
        trials = np.full(ids.size, 8.0)
        successes = ((ids * 5 + step * 3) % 9).astype(np.float64)
        apply_results(ba, ids, successes, trials, outcomes_from_counts(successes, trials), 0.8, 1.0, 1.0)
        close_step(ba, 0.7)
    return ba


def batch(ba: BeliefArrays, strategy: str, params: dict, step: int, seed: int) -> list[int]:
    ids, _ = select(
        ba, strategy=strategy, params=params, batch_size=12, step=step, seed=seed, key="golden", dataset_k=8
    )
    return ids.tolist()


GOLDEN: dict[tuple[int, tuple[int, int]], list[int]] = {
    (0, (3, 0)): [19, 5, 50, 117, 102, 21, 178, 3, 42, 62, 99, 22],  # uniform {}
    (0, (3, 7)): [185, 131, 177, 30, 5, 143, 154, 3, 189, 178, 46, 77],  # uniform {}
    (0, (11, 1099511627779)): [133, 39, 78, 30, 19, 75, 152, 85, 44, 34, 192, 20],  # uniform {}
    (1, (3, 0)): [19, 5, 50, 117, 102, 21, 178, 3, 42, 62, 99, 22],  # history_resampling {}
    (1, (3, 7)): [185, 131, 177, 30, 5, 143, 154, 3, 189, 178, 77, 125],  # history_resampling {}
    (1, (11, 1099511627779)): [133, 39, 78, 30, 19, 75, 152, 44, 192, 20, 158, 189],  # history_resampling {}
    (2, (3, 0)): [175, 199, 189, 164, 142, 174, 194, 165, 186, 171, 183, 198],  # insight {}
    (2, (3, 7)): [155, 191, 194, 175, 173, 198, 162, 157, 148, 136, 164, 147],  # insight {}
    (2, (11, 1099511627779)): [136, 152, 148, 190, 166, 157, 192, 187, 176, 179, 145, 198],  # insight {}
    (3, (3, 0)): [
        154,
        177,
        181,
        158,
        150,
        138,
        160,
        169,
        149,
        189,
        134,
        183,
    ],  # insight {'candidate_ratio': None, 'eta': 1.0, 'k': 4}
    (3, (3, 7)): [
        156,
        149,
        135,
        164,
        174,
        196,
        140,
        147,
        170,
        173,
        192,
        145,
    ],  # insight {'candidate_ratio': None, 'eta': 1.0, 'k': 4}
    (3, (11, 1099511627779)): [
        161,
        192,
        160,
        189,
        181,
        183,
        198,
        157,
        136,
        149,
        193,
        187,
    ],  # insight {'candidate_ratio': None, 'eta': 1.0, 'k': 4}
    (4, (3, 0)): [92, 80, 81, 89, 77, 86, 74, 83, 88, 90, 79, 95],  # dps {}
    (4, (3, 7)): [88, 74, 90, 83, 89, 81, 79, 77, 80, 92, 86, 95],  # dps {}
    (4, (11, 1099511627779)): [90, 74, 81, 89, 88, 77, 95, 79, 80, 83, 86, 92],  # dps {}
    (5, (3, 0)): [
        79,
        77,
        95,
        81,
        92,
        38,
        126,
        101,
        124,
        118,
        125,
        104,
    ],  # dps {'entropy_weight': 0.3, 'candidate_ratio': 8}
    (5, (3, 7)): [
        88,
        81,
        86,
        92,
        77,
        38,
        51,
        41,
        49,
        59,
        53,
        42,
    ],  # dps {'entropy_weight': 0.3, 'candidate_ratio': 8}
    (5, (11, 1099511627779)): [
        90,
        77,
        86,
        74,
        83,
        80,
        92,
        38,
        50,
        58,
        49,
        42,
    ],  # dps {'entropy_weight': 0.3, 'candidate_ratio': 8}
    (6, (3, 0)): [183, 130, 108, 41, 82, 153, 172, 59, 43, 122, 42, 186],  # mopps {}
    (6, (3, 7)): [109, 26, 125, 190, 22, 86, 92, 40, 118, 151, 115, 152],  # mopps {}
    (6, (11, 1099511627779)): [57, 83, 6, 176, 13, 181, 78, 15, 107, 91, 189, 42],  # mopps {}
    (7, (3, 0)): [
        97,
        82,
        74,
        1,
        131,
        79,
        96,
        67,
        108,
        59,
        139,
        42,
    ],  # mopps {'mode': 'threshold', 'candidate_ratio': None}
    (7, (3, 7)): [
        28,
        106,
        58,
        57,
        8,
        83,
        53,
        102,
        82,
        175,
        151,
        10,
    ],  # mopps {'mode': 'threshold', 'candidate_ratio': None}
    (7, (11, 1099511627779)): [
        176,
        71,
        24,
        14,
        192,
        131,
        89,
        28,
        35,
        45,
        51,
        92,
    ],  # mopps {'mode': 'threshold', 'candidate_ratio': None}
    (8, (3, 0)): [24, 102, 72, 111, 6, 63, 129, 120, 33, 15, 48, 57],  # expected_difficulty {'target': 0.4}
    (8, (3, 7)): [72, 63, 102, 33, 120, 15, 111, 6, 24, 129, 57, 78],  # expected_difficulty {'target': 0.4}
    (8, (11, 1099511627779)): [
        15,
        102,
        129,
        6,
        33,
        120,
        63,
        111,
        24,
        72,
        57,
        39,
    ],  # expected_difficulty {'target': 0.4}
    (9, (3, 0)): [
        182,
        187,
        141,
        178,
        190,
        145,
        138,
        29,
        119,
        34,
        105,
        67,
    ],  # inverse_evidence {'candidate_ratio': 2}
    (9, (3, 7)): [
        191,
        168,
        199,
        178,
        135,
        193,
        179,
        169,
        147,
        70,
        105,
        27,
    ],  # inverse_evidence {'candidate_ratio': 2}
    (9, (11, 1099511627779)): [
        173,
        187,
        156,
        162,
        180,
        163,
        144,
        149,
        147,
        9,
        116,
        14,
    ],  # inverse_evidence {'candidate_ratio': 2}
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
